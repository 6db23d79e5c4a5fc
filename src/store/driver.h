/*
 * driver.h — what a database driver gives the store: a connection,
 * transactions, prepared statements with bind / step / column, error
 * translation to lg_error_t, and the durability settings. The schema
 * (schema.c) and every query and row function (store_sql.c) are written
 * once over it; a driver knows SQL only as text to prepare.
 *
 * The differences between databases that the queries must know are named
 * in one place, the dialect (lg__dialect_t), and what the rules may rely
 * on is said by capability flags (LG__CAP_*), never by a scheme's name.
 *
 * A statement is one entry of store_sql.c's query table, by its index:
 * the driver prepares every entry once at open (SQLite's statements are
 * cached with SQLITE_PREPARE_PERSISTENT: parsing them again for each
 * decision was most of the cost of a write) and hands the same one back
 * each time. Values bound are borrowed until the statement is reset.
 */
#ifndef LG_STORE_DRIVER_H
#define LG_STORE_DRIVER_H

#include "../util/internal.h"

typedef struct lg__stmt lg__stmt_t; /* a driver's prepared statement */

/* What step() answers besides a negative LG_E* code. */
enum { LG__DONE = 0, LG__ROW = 1 };

/* Capabilities. */
enum {
  /* One writer at a time on the database, had from the first statement of
   * a transaction on (SQLite's BEGIN IMMEDIATE): a transaction sees no
   * other writer, so what it read stays true until it ends. Decisions go
   * through a group commit (src/store/group.c). */
  LG__CAP_SINGLE_WRITER = 1 << 0,
  /* Rows read with `lock` are locked for the rest of the transaction
   * (SELECT ... FOR UPDATE), which is what serializes writers. */
  LG__CAP_ROW_LOCKS = 1 << 1,
  /* data_version() tells whether anyone else committed since this
   * connection did: rows written here may be kept (the run cache). */
  LG__CAP_DATA_VERSION = 1 << 2,
};

/* The dialects' differences, for the schema and the queries. */
enum { LG__D_SQLITE, LG__D_POSTGRES, LG__DIALECTS };
typedef struct lg__dialect {
  int id;                    /* LG__D_*: which text of a migration or query */
  char placeholder;          /* '?' (?1, ?2 ...) or '$' ($1, $2 ...) */
  const char *for_update;    /* appended to a locking read: "" or " FOR UPDATE" */
  const char *table_exists;  /* SQL with one result: > 0 when lg_schema_version exists */
  const char *now_ms;        /* SQL expression: the database's clock in ms */
  const char *migrate_begin; /* opens the transaction that migrates, serialized
                                against other processes doing the same */
  int trace_tail;            /* lg_runs has trace_tail (SQLite's schema 5) */
} lg__dialect_t;

extern const lg__dialect_t lg__dialect_sqlite;
extern const lg__dialect_t lg__dialect_pg;

typedef struct lg__driver {
  const char *name;               /* for messages */
  const lg__dialect_t *dialect;
  unsigned caps;                  /* LG__CAP_* */

  /* Connects to `arg` (the URL after its scheme) and sets s->conn. */
  int (*open)(lg_store_t *s, const char *arg, lg_error_t *err);
  void (*close)(lg_store_t *s); /* rolls back what is open */
  /* Prepares the query table (n entries; NULL entries are left out) on
   * the connection; keeps `sql` for connections opened later (readers). */
  int (*prepare)(lg_store_t *s, const char *const *sql, int n, lg_error_t *err);
  /* Runs SQL without parameters or rows (schema scripts). */
  int (*exec)(lg_store_t *s, const char *sql, lg_error_t *err);
  /* Runs SQL that answers one integer. */
  int (*query_int)(lg_store_t *s, const char *sql, int64_t *out, lg_error_t *err);

  /* Transactions (store.h: kinds, nesting, upgrade). */
  int (*begin)(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err);
  int (*end)(lg_store_t *s, int commit, int nested, lg_error_t *err);
  int (*in_txn)(lg_store_t *s); /* a transaction of begin() is open on the writer */

  /* Statements: the prepared entry `which` (one that was prepared), or
   * NULL with err filled. */
  lg__stmt_t *(*stmt)(lg_store_t *s, int which, lg_error_t *err);
  void (*bind_null)(lg__stmt_t *st, int i);
  void (*bind_i64)(lg__stmt_t *st, int i, int64_t v);
  void (*bind_text)(lg__stmt_t *st, int i, const char *v, size_t n); /* NULL: SQL NULL */
  void (*bind_blob)(lg__stmt_t *st, int i, const void *v, size_t n); /* NULL: SQL NULL */
  /* LG__ROW, LG__DONE, or a negative code with err filled ("what" names
   * the operation in the message). A write outside a transaction is
   * durable (a ledger write). */
  int (*step)(lg_store_t *s, lg__stmt_t *st, const char *what, lg_error_t *err);
  int64_t (*changes)(lg_store_t *s, lg__stmt_t *st); /* rows the last step changed */
  void (*reset)(lg__stmt_t *st); /* and clears the bindings */
  int (*ncols)(lg__stmt_t *st);
  int (*col_null)(lg__stmt_t *st, int i);
  int64_t (*col_i64)(lg__stmt_t *st, int i); /* NULL reads 0 */
  const char *(*col_text)(lg__stmt_t *st, int i, size_t *len); /* NULL for SQL NULL */

  /* Optional (NULL: none). */
  unsigned (*data_version)(lg_store_t *s);     /* LG__CAP_DATA_VERSION */
  /* store.h's reader: a connection of the calling thread's for reads. */
  int (*reader)(lg_store_t *s, int on, lg_error_t *err);
  /* Whether the calling thread reads through the reader now; set to
   * `on` (a list's callback may write: not through the reader). */
  int (*reading)(lg_store_t *s, int set, int on);
  /* Opens (on) or ends (off) a read-only snapshot on the connection in use
   * when no transaction is open there; *opened says whether it did. */
  int (*snapshot)(lg_store_t *s, int on, int *opened, lg_error_t *err);
  int (*write_probe)(lg_store_t *s, int64_t now_ms, lg_error_t *err);
  /* Sends a bound statement ahead of its step. want 0: a write whose
   * result nobody reads — in batch mode held back until the next
   * statement or the commit, else run now — and reset. want 1: its result
   * is read later by step(); it goes out, in one round trip, with the
   * first statement stepped. NULL: statements run when stepped. */
  int (*send)(lg_store_t *s, lg__stmt_t *st, int want, lg_error_t *err);
  /* store.h's batch: the next outermost transaction may be sent late. */
  int (*batch)(lg_store_t *s);
} lg__driver_t;

extern const lg__driver_t lg__driver_sqlite;        /* sqlite:PATH */
extern const lg__driver_t lg__driver_sqlite_memory; /* memory: */
extern const lg__driver_t lg__driver_pg;            /* postgres:CONNINFO */

/* The schema (schema.c): creates or migrates the database of an open
 * driver to lg__store_schema_target, under the dialect's migrate_begin. */
int lg__schema_migrate(lg_store_t *s, lg_error_t *err);
int lg__schema_read_version(lg_store_t *s, int *version, lg_error_t *err);

#endif
