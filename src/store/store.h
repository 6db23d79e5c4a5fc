/*
 * store.h — the store's rows (store_sql.c), and what the store, ledger and
 * budget modules share.
 *
 * The row functions (lg__sql_*) offer rows and transactions only — read a
 * ledger row, insert one if absent, update, delete; read, insert, update
 * runs; write and read deny rules, budgets, holds, reservations, trace
 * lines — and the semantics (who wins a claim, what replays, what counts
 * as expired) live once, in src/ledger/ledger.c, src/budget/budget.c and
 * src/store/store.c. They are written once over a driver (driver.h): the
 * SQLite driver for sqlite: and memory:, the libpq one for postgres:. So
 * the same rules hold for every store, and the conformance suite checks
 * that they do.
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
 * every call of a row function, so a driver never sees two threads at
 * once (except through its reader, below).
 */
#ifndef LG_STORE_H
#define LG_STORE_H

#include "../util/internal.h"

#include <pthread.h>

typedef int (*lg__store_fault_fn)(void *ud, lg_store_t *s, const char *point);

/* Kinds of transaction. */
enum { LG__TXN_RUN = 1, LG__TXN_LEDGER = 2 };

/* Ledger row states as stored (the lease decides in_progress versus
 * unknown_outcome when the row is read). */
enum { LG__OP_PENDING = LG_OP_IN_PROGRESS, LG__OP_COMMITTED = LG_OP_COMMITTED, LG__OP_FAILED = LG_OP_FAILED };

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
  /* schema 6: */
  char *claim_token;      /* the claimant's token ("ct_" + 32 hex), NULL for
                             a claim made before schema 6 */
  char *resolved_by;      /* an operator's outcome: who recorded it, or NULL */
  int64_t resolved_ms;    /* ... and when (0: not an operator's) */
  int freed;              /* FAILED row kept only as the record of an
                             operator's retryable failure: the key is free */
} lg__op_row_t;

void lg__op_row_clear(lg__op_row_t *r);

/* One budget row (version 2 of the table). The stored fields are what
 * bud_put writes. What a scope holds is kept as counters in the row
 * (reserved_micro, holds), changed only under the row's lock, together
 * with next_expiry_ms: no later than the expiry of any hold of the scope
 * still in the holds table (-1: none is). The hold rows themselves are
 * only looked at when next_expiry_ms <= now — when some hold may have
 * expired: then bud_read also reports, from the hold rows, what is still
 * live and how many have expired (a backend may report them always; the
 * rules use them only then, to recompute the counters). Owns `scope` (lg__bud_row_clear). */
typedef struct lg__bud_row {
  char *scope;                 /* the scope's name */
  int64_t limit_micro;         /* limit per period */
  int period;                  /* lg_budget_period_t */
  int64_t max_in_flight_micro; /* -1: none */
  int64_t period_start_ms;     /* the period `spent_micro` belongs to */
  int64_t spent_micro;         /* settled in that period */
  int64_t reserved_micro;      /* sum of the holds in the holds table */
  int64_t holds;               /* how many */
  int64_t next_expiry_ms;      /* <= every one of their expiries; -1 none */
  int64_t created_ms;
  int64_t updated_ms;
  /* read from the hold rows at the reader's now_ms, not stored: */
  int64_t live_micro;          /* sum of the holds with expires_ms > now */
  int64_t live_holds;          /* how many */
  int64_t live_min_expiry_ms;  /* the earliest of their expiries, -1 none */
  int64_t expired_holds;       /* hold rows with expires_ms <= now */
} lg__bud_row_t;

void lg__bud_row_clear(lg__bud_row_t *r);

/* One key row (gateway-v1 "Keys"; the rules in src/budget/keys.c).
 * Strings are new (lg__key_row_clear). */
typedef struct lg__key_row {
  char *id;               /* stable: the hash of the first secret */
  char *hash;             /* SHA-256 (hex) of the current secret */
  char *name;
  int64_t limit_micro;    /* -1: no limit */
  int reset;              /* lg_budget_period_t */
  char *workspace;        /* or NULL */
  int include_byok;
  int64_t rate_per_min;   /* -1: none */
  char *models;           /* a JSON array of model names, or NULL: any */
  char *byok;             /* a JSON object {UPSTREAM: PROVIDER_KEY}, or NULL */
  int disabled;
  int64_t created_ms, rotated_ms, updated_ms;
} lg__key_row_t;

void lg__key_row_clear(lg__key_row_t *r);

/* One reservation row. Strings are new (lg__resv_row_clear). */
typedef struct lg__resv_row {
  char *id;             /* "rsv_" + 32 hex */
  int64_t amount_micro; /* held on every scope */
  char *scopes;         /* the scopes, sorted, separated by '\n' */
  char *run_id;         /* or NULL */
  int64_t run_seq;      /* the engine's reservation number, 0 none */
  char *model;          /* or NULL */
  int settled;          /* 0 open, 1 settled */
  int64_t actual_micro; /* settled: what was charged */
  int64_t created_ms;
  int64_t expires_ms;   /* the hold ends here */
  int64_t settled_ms;   /* settled: when; else 0 */
  /* schema 6: */
  int64_t asked_micro;  /* settled above what the settler may charge: what
                           it asked (actual_micro is what was charged);
                           -1: charged as asked */
} lg__resv_row_t;

void lg__resv_row_clear(lg__resv_row_t *r);

/* The handle. */
struct lg_store {
  const struct lg__driver *drv; /* the database's driver (driver.h) */
  void *conn;                 /* the driver's connection */
  void *impl;                 /* store_sql.c's own state (the run cache) */
  const char *scheme;         /* "memory", "sqlite", "postgres" */
  lg__store_fault_fn fault;   /* the test's fault hook (lg__store_set_fault), or NULL */
  void *fault_ud;
  char *name;                 /* URL with the password hidden */
  lg_store_options_t opts;    /* with the defaults filled in */
  pthread_mutex_t mu;         /* recursive: held around backend calls */
  int depth;                  /* open transactions and savepoints */
  int outer_kind;             /* LG__TXN_* of the outermost one */
  int in_with_run;            /* inside lg_store_with_run's callback */
  struct lg__store_born *born; /* the run lg__store_with_run_born has not written yet */
  int alone;                  /* the batch's only job runs (group.c): its
                                 first lg_store_with_run needs no savepoint */
  lg_ledger_t ledger;         /* what lg_store_ledger() hands out */
  unsigned char key_secret[32]; /* the AES key of provider keys at rest
                                   (lg_key_set_secret, src/budget/seal.c) */
  int has_key_secret;
  int query_timeout_ms;       /* PostgreSQL: how long a call waits for the server's
                                 answer once the store is open (0: for ever);
                                 driver_pg.c */
  int deadline_ms;            /* a shorter wait for a while (lg__store_deadline), 0: none */
  const char *deadline_why;   /* what set it: named by a call that outlives it */
};

/* A postgres: store's deadline for each answer of the server, unless the
 * URL's query_timeout_ms says otherwise (docs/store.md). */
#define LG__STORE_DEFAULT_QUERY_TIMEOUT_MS 60000

/* The row functions (store_sql.c). Every one returns 0 or a negative LG_E*
 * code with err filled (a database's codes never leave its driver). */

/* Opens s->drv for `arg` (the URL after "scheme:"), creating or migrating
 * the schema (schema.c), and prepares every query. */
int lg__sql_open(lg_store_t *s, const char *arg, lg_error_t *err);
/* Releases everything (rolls back what is open). */
void lg__sql_close(lg_store_t *s);
/* The schema version stored. */
int lg__sql_schema_version(lg_store_t *s, int *version, lg_error_t *err);

/* Transactions: see the top of the file. `nested` is s->depth > 0;
 * `upgrade` asks a nested LEDGER savepoint to make the outer RUN
 * transaction durable. */
int lg__sql_begin(lg_store_t *s, int kind, int nested, int upgrade,
                  lg_error_t *err);
int lg__sql_end(lg_store_t *s, int commit, int nested, lg_error_t *err);

/* Ledger rows. op_read fills *found and, when found, *row; `lock` takes
 * the row lock for the rest of the transaction (PostgreSQL FOR UPDATE).
 * op_insert inserts when the key is absent (*inserted 1) and does
 * nothing when present (*inserted 0). op_update replaces every field of
 * an existing row; op_delete removes one. op_purge deletes COMMITTED
 * and FAILED rows with updated_ms <= before_ms. */
int lg__sql_op_read(lg_store_t *s, const char *key, int lock, lg__op_row_t *row,
                    int *found, lg_error_t *err);
int lg__sql_op_insert(lg_store_t *s, const lg__op_row_t *row, int *inserted,
                      lg_error_t *err);
int lg__sql_op_update(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err);
int lg__sql_op_delete(lg_store_t *s, const char *key, lg_error_t *err);
int lg__sql_op_purge(lg_store_t *s, int64_t before_ms, int64_t *purged,
                     lg_error_t *err);
/* Settles a PENDING row in one statement: to COMMITTED (with result and
 * operation_id) or FAILED, or deletes it (state 0); updated_ms = now_ms.
 * *changed 0 when the key is absent or not PENDING (nothing done). */
int lg__sql_op_settle(lg_store_t *s, const char *key, int state, const char *result,
                      size_t result_len, const char *operation_id, int64_t now_ms,
                      int *changed, lg_error_t *err);

/* Runs. run_read as op_read (lock: FOR UPDATE). run_insert as
 * op_insert, with the run's first trace lines (len 0: none) when it
 * inserted. run_update replaces an existing run's fields except
 * created_ms (*updated 0 when there is none). run_list calls cb newest
 * first without policy_json and state. */
int lg__sql_run_read(lg_store_t *s, const char *run_id, int lock,
                     lg_run_record_t *rec, int *found, lg_error_t *err);
int lg__sql_run_insert(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                       size_t len, int *inserted, lg_error_t *err);
int lg__sql_run_update(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                       lg_error_t *err);
int lg__sql_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb,
                     void *ud, lg_error_t *err);

/* The gateway's conversation keys (lg_gateway_keys): gw_key_put names
 * key's run, with data (text, or NULL) beside it (a key another
 * conversation had goes to the latest); gw_key_get reads them (*run_id
 * and *data new, or NULL: *run_id NULL when the key is not stored; data
 * may be NULL when not wanted). Each its own statement, under the store's
 * lock. */
int lg__store_gw_key_put(lg_store_t *s, const char *key, const char *run_id, const char *data,
                         int64_t now_ms, lg_error_t *err);
int lg__store_gw_key_get(lg_store_t *s, const char *key, char **run_id, char **data,
                         lg_error_t *err);

/* Purging runs (lg_store_purge_runs), a batch at a time inside the
 * caller's transaction: runs_purge picks up to `limit` runs not updated
 * after before_ms, oldest first after *at (moved past them), and deletes
 * each with its trace lines, its kill switch and its budget scopes unless
 * it was written since or holds an open reservation: *purged deleted,
 * *more 1 when there may be more to pick. gw_keys_purge deletes the
 * conversation keys created by before_ms whose run is not stored. */
typedef struct lg__store_purge_cursor {
  int64_t created_ms, seq;
} lg__store_purge_cursor_t;
int lg__sql_runs_purge(lg_store_t *s, int64_t before_ms, lg__store_purge_cursor_t *at, int limit,
                       int64_t *purged, int *more, lg_error_t *err);
int lg__sql_gw_keys_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err);

/* Deny rules: deny_put inserts or replaces (scope, id); deny_get finds
 * the rule for the run or, when group is not NULL, its group (the run's
 * own first): *found, and *reason (new, may be NULL). */
int lg__sql_deny_put(lg_store_t *s, int scope, const char *id,
                     const char *reason, int64_t now_ms, lg_error_t *err);
int lg__sql_deny_get(lg_store_t *s, const char *run_id, const char *group,
                     int *found, char **reason, lg_error_t *err);

/* ---- budgets (src/budget/budget.c writes the rules) ----
 *
 * bud_read fills *row (the stored fields and, when next_expiry_ms <=
 * now_ms, what the hold rows say: see lg__bud_row_t) and *found; `lock`
 * takes the budget's row lock for the rest of the transaction
 * (PostgreSQL FOR UPDATE; the hold rows are then read by a statement
 * that starts once the lock is had, so it sees everything the previous
 * holder committed). A read without the lock is one snapshot. bud_put
 * inserts or replaces the stored fields (created_ms kept when the row
 * exists). bud_list calls cb for every budget, by scope in byte order,
 * from one snapshot. */
int lg__sql_bud_read(lg_store_t *s, const char *scope, int lock, int64_t now_ms,
                     lg__bud_row_t *row, int *found, lg_error_t *err);
/* bud_read with the lock, then (after the hold rows were read) deletes
 * the hold (scope, drop_id): *dropped 1 when it was there. A settlement
 * needs to know: a hold that another writer released already (its
 * clock said it had expired) must not leave the counters twice. */
int lg__sql_bud_read_drop(lg_store_t *s, const char *scope, int64_t now_ms, const char *drop_id,
                          lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err);
int lg__sql_bud_put(lg_store_t *s, const lg__bud_row_t *row, lg_error_t *err);
int lg__sql_bud_list(lg_store_t *s, int64_t now_ms,
                     int (*cb)(void *ud, const lg__bud_row_t *row), void *ud,
                     lg_error_t *err);
/* Hold rows: one per (scope, reservation) while it holds. Only a holder
 * of the scope's row lock writes them, and changes the row's counters
 * with them (a settlement deletes its hold through bud_read_drop).
 * holds_expire deletes the scope's holds with expires_ms <= now_ms. */
int lg__sql_hold_put(lg_store_t *s, const char *scope, const char *id, int64_t amount_micro,
                     int64_t expires_ms, lg_error_t *err);
int lg__sql_holds_expire(lg_store_t *s, const char *scope, int64_t now_ms, lg_error_t *err);
/* Reservations. resv_insert: LG_ECONFLICT when the id exists. resv_read
 * by id, resv_of_run by (run_id, run_seq) — run_seq 0: the open one of
 * the run with the lowest run_seq —, `lock` as bud_read. resv_update
 * replaces every field of an existing row. resv_purge deletes the rows
 * with expires_ms <= before_ms. */
int lg__sql_resv_insert(lg_store_t *s, const lg__resv_row_t *row, lg_error_t *err);
int lg__sql_resv_read(lg_store_t *s, const char *id, int lock, lg__resv_row_t *row, int *found,
                      lg_error_t *err);
int lg__sql_resv_of_run(lg_store_t *s, const char *run_id, int64_t run_seq, int lock,
                        lg__resv_row_t *row, int *found, lg_error_t *err);
int lg__sql_resv_update(lg_store_t *s, const lg__resv_row_t *row, lg_error_t *err);
int lg__sql_resv_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err);
/* The scopes of a run ('\n'-separated; NULL or "" deletes). */
int lg__sql_runscopes_put(lg_store_t *s, const char *run_id, const char *scopes,
                          lg_error_t *err);
int lg__sql_runscopes_get(lg_store_t *s, const char *run_id, char **scopes, int *found,
                          lg_error_t *err);
/* ---- keys (src/budget/keys.c writes the rules) ----
 * key_insert: LG_ECONFLICT when the id or hash exists. key_read finds a
 * key by its id or its current hash. key_update replaces every field but
 * id and created_ms (*updated 0: no such key). key_list calls cb for
 * every key by created_ms. key_rate counts one request in the key's
 * window of a minute, atomically: *allowed 0 (nothing counted) when
 * `limit` were passed; *window_start_ms the window's start either way.
 * key_spent_since: what the settled reservations covering `scope` charged
 * from since_ms on (those the budget purge has not forgotten). */
int lg__sql_key_insert(lg_store_t *s, const lg__key_row_t *row, lg_error_t *err);
int lg__sql_key_read(lg_store_t *s, const char *ref, lg__key_row_t *row, int *found,
                     lg_error_t *err);
int lg__sql_key_update(lg_store_t *s, const lg__key_row_t *row, int *updated, lg_error_t *err);
int lg__sql_key_list(lg_store_t *s, int (*cb)(void *ud, const lg__key_row_t *row), void *ud,
                     lg_error_t *err);
int lg__sql_key_rate(lg_store_t *s, const char *id, int64_t limit, int64_t now_ms, int *allowed,
                     int64_t *window_start_ms, lg_error_t *err);
int lg__sql_key_spent_since(lg_store_t *s, const char *scope, int64_t since_ms, int64_t *micro,
                            lg_error_t *err);

/* Called before an outermost transaction that only reads to decide and
 * then writes: the driver may delay its
 * BEGIN and the writes until the next read or the commit, and send them
 * together (PostgreSQL: one pipeline), to save round trips. What runs,
 * and in which order, does not change; a write's error may then surface
 * at the next read or at the commit, and fails the transaction there. */
int lg__sql_batch(lg_store_t *s);

/* ---- each run's trace-v1 lines ----
 *
 * ev_append adds a block of lines (each ending in '\n') after the run's
 * others, as one row; the caller holds the run (its row lock, or the
 * transaction that inserts it), so appends of one run never race.
 * ev_read appends every block of the run, in order, to *out. */
int lg__sql_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                      lg_error_t *err);
int lg__sql_ev_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err);
/* run_update, then ev_append, in one go where the schema allows (SQLite:
 * one UPDATE of the run's row and its trace tail), as a decision writes
 * them. *updated 0 (and no line written) when the run
 * has no row. */
int lg__sql_run_update_ev(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                          size_t len, int *updated, lg_error_t *err);

/* ---- reads that do not wait for writes ----
 *
 * Only when the driver has a reader (s->drv->reader; else reads take the
 * handle's lock, lg__store_read_begin). reader(s, 1) gives the
 * calling thread a connection of its own for reads (op_read, run_read,
 * run_list, bud_read, bud_list, schema_version), until reader(s, 0):
 * reads outside any transaction of this handle, which must not wait
 * behind a write that holds or waits for the handle (lg__store_read_begin).
 * Called without the handle's lock. */
int lg__sql_reader(lg_store_t *s, int on, lg_error_t *err);
/* Whether a write could proceed now (a driver without a probe: 0, the
 * store counts as writable when it answers), without waiting long and without
 * the handle's lock: 0, or LG_EBUSY / LG_ESTORE with err->message a
 * reason fit for an unauthenticated /healthz (no URL, no path). */
int lg__sql_write_probe(lg_store_t *s, int64_t now_ms, lg_error_t *err);


/* Transactions through the generic layer (keeps depth and kind). */
int lg__store_begin(lg_store_t *s, int kind, lg_error_t *err);
int lg__store_end(lg_store_t *s, int commit, lg_error_t *err);
void lg__store_lock(lg_store_t *s);
void lg__store_unlock(lg_store_t *s);
/* Around a read outside the caller's own transaction: the backend's
 * reader when it has one (1), else the handle's lock (0), which is also
 * what a thread inside its own transaction on the handle gets (its reads
 * must see its writes). End with lg__store_read_end(s, what begin gave). */
int lg__store_read_begin(lg_store_t *s);
void lg__store_read_end(lg_store_t *s, int reader);

/* Fault injection for tests (docs/internals/style.md: "inject I/O faults
 * through an overridable table"). A hook set on a handle is called at
 * named points — e.g. "claim.before_commit", "sqlite.begin" — and the
 * call fails there with the code it returns when that is not 0. The
 * PostgreSQL tests use it to kill the handle's connection in the middle of
 * a claim. fn NULL removes it. Tests only; not thread-safe with calls on
 * the handle. */
void lg__store_set_fault(lg_store_t *s, lg__store_fault_fn fn, void *ud);
static inline int lg__store_fault_at(lg_store_t *s, const char *point, lg_error_t *err) {
  int rc = s->fault ? s->fault(s->fault_ud, s, point) : 0;
  return rc ? lg__err(err, rc, NULL, -1, "injected fault at %s", point) : 0;
}

/* lg_store_with_run for a run that may not be stored yet: when it is not,
 * fn sees born->rec (its record in memory), and the row is written once,
 * with born's lines (its creation's) before the first save's, by that save
 * (lg__store_run_put_events) or after fn when fn saved nothing; nothing
 * when fn fails. born->created says which. The write lock the transaction
 * holds from its read on (SQLite's) keeps another writer from storing the
 * run in between; on a store without it (PostgreSQL), create the row
 * first (lg__step_create). */
typedef struct lg__store_born {
  const lg_run_record_t *rec;
  const char *lines;
  size_t len;
  int created;
} lg__store_born_t;
int lg__store_with_run_born(lg_store_t *s, lg__store_born_t *born, lg_store_run_fn fn, void *ud,
                            lg_error_t *err);

/* lg_store_run_create with the run's first trace lines (len 0: none),
 * written with its row. */
int lg__store_run_create_ev(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                            size_t len, lg_error_t *err);
/* A run's trace-v1 lines (store.c, over ev_append and ev_read): append
 * inside the transaction that writes the decision they record; read
 * appends them to *out. */
int lg__store_events_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                            lg_error_t *err);
int lg__store_events_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err);
/* lg_store_run_put and then the run's new trace lines (len 0: none), as a
 * decision writes them: in one statement where the backend can. */
int lg__store_run_put_events(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                             size_t len, lg_error_t *err);

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

/* A sqlite: store whose WAL another connection checkpoints (the server's
 * checkpointer thread): its own commits checkpoint only past `pages` WAL
 * pages, a guard, so that no commit waits on the database file's fsync.
 * No-op on other stores. */
void lg__store_sqlite_autocheckpoint(lg_store_t *s, int pages);

/* The synchronous level (PRAGMA synchronous: 1 NORMAL, 2 FULL) a sqlite:
 * store's connection is at now, read from SQLite (tests); -1 on other
 * stores. */
int lg__store_sqlite_synchronous(lg_store_t *s);
/* The bytes the page cache of a sqlite: or memory: store holds
 * (SQLITE_DBSTATUS_CACHE_USED), or -1 on another store. memory: keeps its
 * database in SQLite's memdb, beside a cache as small as a file's: a
 * cache holding the whole database made every commit that truncates it
 * walk every page (milliseconds at 100,000 runs). */
int64_t lg__store_sqlite_cache_bytes(lg_store_t *s);

/* The file of a sqlite: store (for a connection of its own, such as the
 * checkpointer's); NULL for other stores. */
const char *lg__store_sqlite_path(const lg_store_t *s);


/* Copies a record's fields into new strings (out is overwritten). */
int lg__run_record_copy(lg_run_record_t *out, const lg_run_record_t *in);

#endif
