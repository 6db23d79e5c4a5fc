/*
 * store.h — the plug-in interface of the stores, and what the store and
 * ledger modules share.
 *
 * A backend is a versioned table of function pointers (lg__store_vtab_t),
 * like SQLite's VFS: a newer table keeps the older one as its prefix, and
 * `version` says how much of it is there. The table offers rows and
 * transactions only — read a ledger row, insert one if absent, update,
 * delete; read, insert, update runs; write and read deny rules — and the
 * semantics (who wins a claim, what replays, what counts as expired) live
 * once, in src/ledger/ledger.c and src/store/store.c, over any backend. So
 * the same rules hold for memory:, sqlite: and postgres:, and the
 * conformance suite checks that they do.
 *
 * Transactions: begin(kind) opens one, or a savepoint when one is already
 * open (depth > 0). LG__TXN_LEDGER is durable at commit (SQLite
 * synchronous=FULL, PostgreSQL synchronous_commit=on); LG__TXN_RUN is
 * durable against a crash of the process only (synchronous=NORMAL,
 * synchronous_commit=off). A ledger savepoint inside a run transaction
 * upgrades the whole transaction to durable. Outside any transaction each
 * row function is one atomic, durable statement of its own.
 *
 * The generic layer (store.c) holds the handle's recursive lock around
 * every call into a backend, so backends never see two threads at once.
 */
#ifndef LG_STORE_H
#define LG_STORE_H

#include "../util/internal.h"

#include <pthread.h>

typedef struct lg__store_vtab lg__store_vtab_t;

/* Kinds of transaction. */
enum { LG__TXN_RUN = 1, LG__TXN_LEDGER = 2 };

/* Ledger row states as stored (the lease decides in_progress versus
 * unknown_outcome when the row is read). */
enum { LG__OP_PENDING = 1, LG__OP_COMMITTED = 2, LG__OP_FAILED = 3 };

/* Scopes of deny rules. */
enum { LG__DENY_RUN = 1, LG__DENY_GROUP = 2 };

/* One ledger row. Backends fill it with new strings (lg__op_row_clear). */
typedef struct lg__op_row {
  char *key;              /* the idempotency key */
  char *request_fp;       /* fingerprint of the claim */
  char *run_id;           /* may be NULL */
  int state;              /* LG__OP_* */
  char *result;           /* committed result JSON, or NULL */
  size_t result_len;      /* bytes of result */
  char *operation_id;     /* may be NULL */
  int64_t lease_until_ms; /* end of the claim's lease */
  int64_t created_ms;     /* when it was claimed */
  int64_t updated_ms;     /* its last change */
} lg__op_row_t;

void lg__op_row_clear(lg__op_row_t *r);

/* The handle. */
struct lg_store {
  const lg__store_vtab_t *vt; /* the backend */
  void *impl;                 /* the backend's own state */
  char *name;                 /* URL with the password hidden */
  lg_store_options_t opts;    /* with the defaults filled in */
  pthread_mutex_t mu;         /* recursive: held around backend calls */
  int depth;                  /* open transactions and savepoints */
  int outer_kind;             /* LG__TXN_* of the outermost one */
  int in_with_run;            /* inside lg_store_with_run's callback */
  lg_ledger_t ledger;         /* what lg_store_ledger() hands out */
};

/* The backend table, version 1. Every function returns 0 or a negative
 * LG_E* code with err filled (backend codes never leave the backend). */
struct lg__store_vtab {
  int version;        /* 1 */
  const char *scheme; /* "memory", "sqlite", "postgres" */

  /* Opens the backend for `arg` (the URL after "scheme:"), creating or
   * migrating the schema; sets s->impl. */
  int (*open)(lg_store_t *s, const char *arg, lg_error_t *err);
  /* Releases everything (rolls back what is open). */
  void (*close)(lg_store_t *s);
  /* The schema version stored. */
  int (*schema_version)(lg_store_t *s, int *version, lg_error_t *err);

  /* Transactions: see the top of the file. `nested` is s->depth > 0;
   * `upgrade` asks a nested LEDGER savepoint to make the outer RUN
   * transaction durable. */
  int (*begin)(lg_store_t *s, int kind, int nested, int upgrade,
               lg_error_t *err);
  int (*end)(lg_store_t *s, int commit, int nested, lg_error_t *err);

  /* Ledger rows. op_read fills *found and, when found, *row; `lock` takes
   * the row lock for the rest of the transaction (PostgreSQL FOR UPDATE).
   * op_insert inserts when the key is absent (*inserted 1) and does
   * nothing when present (*inserted 0). op_update replaces every field of
   * an existing row; op_delete removes one. op_purge deletes COMMITTED
   * and FAILED rows with updated_ms <= before_ms. */
  int (*op_read)(lg_store_t *s, const char *key, int lock, lg__op_row_t *row,
                 int *found, lg_error_t *err);
  int (*op_insert)(lg_store_t *s, const lg__op_row_t *row, int *inserted,
                   lg_error_t *err);
  int (*op_update)(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err);
  int (*op_delete)(lg_store_t *s, const char *key, lg_error_t *err);
  int (*op_purge)(lg_store_t *s, int64_t before_ms, int64_t *purged,
                  lg_error_t *err);
  /* Settles a PENDING row in one statement: to COMMITTED (with result and
   * operation_id) or FAILED, or deletes it (state 0); updated_ms = now_ms.
   * *changed 0 when the key is absent or not PENDING (nothing done). */
  int (*op_settle)(lg_store_t *s, const char *key, int state, const char *result,
                   size_t result_len, const char *operation_id, int64_t now_ms,
                   int *changed, lg_error_t *err);

  /* Runs. run_read as op_read (lock: FOR UPDATE). run_insert as
   * op_insert. run_update replaces an existing run's fields except
   * created_ms (*updated 0 when there is none). run_list calls cb newest
   * first without policy_json and state. */
  int (*run_read)(lg_store_t *s, const char *run_id, int lock,
                  lg_run_record_t *rec, int *found, lg_error_t *err);
  int (*run_insert)(lg_store_t *s, const lg_run_record_t *rec, int *inserted,
                    lg_error_t *err);
  int (*run_update)(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                    lg_error_t *err);
  int (*run_list)(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb,
                  void *ud, lg_error_t *err);

  /* Deny rules: deny_put inserts or replaces (scope, id); deny_get finds
   * the rule for the run or, when group is not NULL, its group (the run's
   * own first): *found, and *reason (new, may be NULL). */
  int (*deny_put)(lg_store_t *s, int scope, const char *id,
                  const char *reason, int64_t now_ms, lg_error_t *err);
  int (*deny_get)(lg_store_t *s, const char *run_id, const char *group,
                  int *found, char **reason, lg_error_t *err);
};

extern const lg__store_vtab_t lg__store_memory;
extern const lg__store_vtab_t lg__store_sqlite;
extern const lg__store_vtab_t lg__store_pg;

/* Transactions through the generic layer (keeps depth and kind). */
int lg__store_begin(lg_store_t *s, int kind, lg_error_t *err);
int lg__store_end(lg_store_t *s, int commit, lg_error_t *err);
void lg__store_lock(lg_store_t *s);
void lg__store_unlock(lg_store_t *s);

/* Fault injection for tests (STYLE.md: "inject I/O faults through an
 * overridable table"). When set, backends call it at named points — e.g.
 * "sqlite.claim.before_commit", "pg.claim.before_insert" — and fail there
 * with the code it returns when that is not 0. The PostgreSQL tests use it
 * to kill the backend's connection in the middle of a claim. Not
 * thread-safe; tests only. */
typedef int (*lg__store_fault_fn)(void *ud, lg_store_t *s, const char *point);
extern lg__store_fault_fn lg__store_fault;
extern void *lg__store_fault_ud;
static inline int lg__store_fault_at(lg_store_t *s, const char *point, lg_error_t *err) {
  int rc = lg__store_fault ? lg__store_fault(lg__store_fault_ud, s, point) : 0;
  return rc ? lg__err(err, rc, NULL, -1, "injected fault at %s", point) : 0;
}

/* Writes a deny rule (store.c); scope LG__DENY_*. */
int lg__store_deny(lg_store_t *s, int scope, const char *id, const char *reason,
                   int64_t now_ms, lg_error_t *err);

/* The schema version that opening a store migrates to: the newest one
 * (LG_STORE_SCHEMA_VERSION) unless a test lowers it to write an old store
 * and check that a newer release migrates it. */
extern int lg__store_schema_target;

/* The server process of a postgres: store's connection (tests: to kill
 * it from another connection). */
int lg__store_pg_backend_pid(lg_store_t *s);

/* Formats now_ms as RFC 3339 UTC with milliseconds into buf[32]. */
void lg__store_time(int64_t ms, char buf[32]);

/* Copies a record's fields into new strings (out is overwritten). */
int lg__run_record_copy(lg_run_record_t *out, const lg_run_record_t *in);

#endif
