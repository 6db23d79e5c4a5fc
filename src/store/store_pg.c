/*
 * store_pg.c — the postgres:CONNINFO backend (libpq), for several servers
 * on several machines sharing one database.
 *
 * A claim rests on the primary key of lg_operations: the first statement is
 * INSERT ... ON CONFLICT (key) DO NOTHING, in autocommit, so of any number
 * of concurrent claimants exactly one inserts and wins; PostgreSQL makes
 * the others wait for that insert to commit or roll back. Only a key that
 * is already there is read again, in a transaction, with SELECT ... FOR
 * UPDATE. A decision for a run is one transaction that starts by locking
 * the run's row (SELECT ... FOR UPDATE), so two servers deciding for one
 * run serialize there. lock_timeout is the store's busy_timeout_ms: a lock
 * not had in time is SQLSTATE 55P03, which becomes LG_EBUSY.
 *
 * Durability: ledger statements and transactions commit with the
 * session's synchronous_commit (on). A run transaction sets it off for
 * itself (SET LOCAL): its commit returns before the WAL is flushed, which
 * a crash of our process cannot lose; a ledger savepoint inside it sets it
 * back on, so a claim made during a decision is still durable.
 *
 * A dropped connection fails the call in progress with LG_ESTORE (nothing
 * half-written: PostgreSQL rolls back the open transaction) and is
 * re-established at the start of the next call. SQLSTATEs and libpq's
 * statuses stop here.
 *
 * Parameters are sent as text except byte strings (binary); results come
 * back in binary form (bigint as 8 bytes, big-endian).
 */
#include "store.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>

/* The migrations, in order (see store_sqlite.c): never edit a released
 * one. */
static const char *const migrations[] = {
    /* 1: the idempotency ledger. */
    ("CREATE TABLE lg_operations ("
    "  key TEXT PRIMARY KEY,"
    "  request_fp TEXT NOT NULL,"
    "  run_id TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('pending','committed','failed')),"
    "  result BYTEA,"
    "  operation_id TEXT,"
    "  lease_until_ms BIGINT NOT NULL,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL);"
    "CREATE INDEX lg_operations_finished ON lg_operations(updated_ms)"
    "  WHERE state <> 'pending';"),
    /* 2: run state and the kill switch. */
    ("CREATE TABLE lg_runs ("
    "  seq BIGSERIAL NOT NULL,"
    "  run_id TEXT PRIMARY KEY,"
    "  grp TEXT,"
    "  status TEXT NOT NULL CHECK (status IN ('active','stopped')),"
    "  terminal_reason TEXT,"
    "  policy TEXT,"
    "  state BYTEA,"
    "  envelope TEXT,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL);"
    "CREATE TABLE lg_deny ("
    "  scope SMALLINT NOT NULL,"
    "  id TEXT NOT NULL,"
    "  reason TEXT,"
    "  created_ms BIGINT NOT NULL,"
    "  PRIMARY KEY (scope, id));"),
    /* 3: listing runs newest first, by group. */
    ("CREATE INDEX lg_runs_created ON lg_runs(created_ms DESC, seq DESC);"
    "CREATE INDEX lg_runs_group ON lg_runs(grp, status);"),
    /* 4: shared budgets (the spend gate): budgets, reservations, the holds
     * of open reservations on each scope, and the scopes of runs. Scopes
     * compare byte-wise (COLLATE "C"), like the other backends. */
    ("CREATE TABLE lg_budgets ("
    "  scope TEXT COLLATE \"C\" PRIMARY KEY,"
    "  limit_micro BIGINT NOT NULL,"
    "  period TEXT NOT NULL CHECK (period IN ('none','daily','weekly','monthly')),"
    "  max_in_flight_micro BIGINT,"
    "  period_start_ms BIGINT NOT NULL,"
    "  spent_micro BIGINT NOT NULL,"
    "  reserved_micro BIGINT NOT NULL,"
    "  holds BIGINT NOT NULL,"
    "  next_expiry_ms BIGINT NOT NULL,"
    "  created_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL);"
    "CREATE TABLE lg_budget_reservations ("
    "  id TEXT PRIMARY KEY,"
    "  amount_micro BIGINT NOT NULL,"
    "  scopes TEXT NOT NULL,"
    "  run_id TEXT,"
    "  run_seq BIGINT NOT NULL,"
    "  model TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('open','settled')),"
    "  actual_micro BIGINT NOT NULL,"
    "  created_ms BIGINT NOT NULL,"
    "  expires_ms BIGINT NOT NULL,"
    "  settled_ms BIGINT NOT NULL);"
    "CREATE INDEX lg_budget_reservations_run ON lg_budget_reservations(run_id, run_seq)"
    "  WHERE run_id IS NOT NULL;"
    "CREATE INDEX lg_budget_reservations_expiry ON lg_budget_reservations(expires_ms);"
    "CREATE TABLE lg_budget_holds ("
    "  scope TEXT COLLATE \"C\" NOT NULL,"
    "  reservation_id TEXT NOT NULL,"
    "  amount_micro BIGINT NOT NULL,"
    "  expires_ms BIGINT NOT NULL,"
    "  PRIMARY KEY (scope, reservation_id));"
    "CREATE TABLE lg_budget_run_scopes ("
    "  run_id TEXT PRIMARY KEY,"
    "  scopes TEXT NOT NULL);"),
    /* 5: each run's trace-v1 lines, written with the decision they record
     * (GET /v1/runs/{id}/trace). */
    ("CREATE TABLE lg_events ("
    "  run_id TEXT NOT NULL,"
    "  n BIGINT NOT NULL,"
    "  lines TEXT NOT NULL,"
    "  PRIMARY KEY (run_id, n));"),
    /* 6: who may undo what (see store_sqlite.c). */
    ("ALTER TABLE lg_operations ADD COLUMN claim_token TEXT,"
    "  ADD COLUMN resolved_by TEXT,"
    "  ADD COLUMN resolved_ms BIGINT NOT NULL DEFAULT 0,"
    "  ADD COLUMN freed INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE lg_budget_reservations ADD COLUMN asked_micro BIGINT NOT NULL DEFAULT -1;"),
};
_Static_assert(sizeof migrations / sizeof migrations[0] == LG_STORE_SCHEMA_VERSION,
               "one migration per schema version");

/* Arbitrary constant: the advisory lock that serializes migrations. */
#define SCHEMA_LOCK "7160823011"

enum {
  Q_OP_READ,
  Q_OP_READ_LOCK,
  Q_OP_INSERT,
  Q_OP_UPDATE,
  Q_OP_DELETE,
  Q_OP_PURGE,
  Q_OP_SETTLE,
  Q_OP_DROP_PENDING,
  Q_RUN_READ,
  Q_RUN_READ_LOCK,
  Q_RUN_INSERT,
  Q_RUN_UPDATE,
  Q_RUN_LIST,
  Q_DENY_PUT,
  Q_DENY_GET,
  Q_BUD_READ,
  Q_BUD_LOCK,
  Q_HOLD_STATS,
  Q_BUD_PUT,
  Q_BUD_LIST,
  Q_HOLD_PUT,
  Q_HOLD_DROP,
  Q_HOLDS_EXPIRE,
  Q_RESV_INSERT,
  Q_RESV_READ,
  Q_RESV_READ_LOCK,
  Q_RESV_OF_RUN,
  Q_RESV_OF_RUN_LOCK,
  Q_RESV_OLDEST_OF_RUN,
  Q_RESV_OLDEST_OF_RUN_LOCK,
  Q_RESV_UPDATE,
  Q_RESV_PURGE,
  Q_RUNSCOPES_PUT,
  Q_RUNSCOPES_DEL,
  Q_RUNSCOPES_GET,
  Q_EV_APPEND,
  Q_EV_READ,
  Q__N
};

#define MAX_PARAMS 13

/* What the hold rows of a scope say as of $2 — read only when the row's
 * next_expiry_ms has come (a one-time filter: otherwise the scan is not
 * run at all). Hold rows come and go with every reservation; their dead
 * versions stay in the table until vacuum, so a scan per reservation
 * would grow slower with the traffic. */
#define HOLD_AGG                                                                       \
  "COALESCE(SUM(CASE WHEN h.expires_ms > $2 THEN h.amount_micro END), 0)::bigint,"      \
  " COUNT(CASE WHEN h.expires_ms > $2 THEN 1 END),"                                     \
  " MIN(CASE WHEN h.expires_ms > $2 THEN h.expires_ms END),"                            \
  " COUNT(CASE WHEN h.expires_ms <= $2 THEN 1 END)"
#define BUD_STORED                                                                     \
  "b.scope, b.limit_micro, b.period, b.max_in_flight_micro, b.period_start_ms,"        \
  " b.spent_micro, b.reserved_micro, b.holds, b.next_expiry_ms, b.created_ms,"         \
  " b.updated_ms"
#define HOLDS_LATERAL                                                                  \
  " LEFT JOIN LATERAL (SELECT " HOLD_AGG " FROM lg_budget_holds h WHERE h.scope = b.scope" \
  " AND b.next_expiry_ms >= 0 AND b.next_expiry_ms <= $2) e ON true"
#define RESV_COLS                                                                      \
  "id, amount_micro, scopes, run_id, run_seq, model, state, actual_micro, created_ms," \
  " expires_ms, settled_ms, asked_micro"

#define OP_COLS_V1                                                                     \
  "request_fp, run_id, state, result, operation_id, lease_until_ms, created_ms, updated_ms"
#define OP_COLS OP_COLS_V1 ", claim_token, resolved_by, resolved_ms, freed"
#define RUN_COLS                                                                       \
  "run_id, grp, status, terminal_reason, policy, state, envelope, created_ms, updated_ms"

static const struct {
  const char *sql;
  int nparams;
} queries[Q__N] = {
    [Q_OP_READ] = {"SELECT " OP_COLS " FROM lg_operations WHERE key = $1", 1},
    [Q_OP_READ_LOCK] = {"SELECT " OP_COLS " FROM lg_operations WHERE key = $1 FOR UPDATE", 1},
    [Q_OP_INSERT] = {"INSERT INTO lg_operations (key, " OP_COLS ")"
                     " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
                     " ON CONFLICT (key) DO NOTHING",
                     13},
    [Q_OP_UPDATE] = {"UPDATE lg_operations SET request_fp = $2, run_id = $3, state = $4,"
                     " result = $5, operation_id = $6, lease_until_ms = $7, created_ms = $8,"
                     " updated_ms = $9, claim_token = $10, resolved_by = $11, resolved_ms = $12,"
                     " freed = $13 WHERE key = $1",
                     13},
    [Q_OP_DELETE] = {"DELETE FROM lg_operations WHERE key = $1", 1},
    [Q_OP_PURGE] = {"DELETE FROM lg_operations WHERE state <> 'pending' AND updated_ms <= $1",
                    1},
    [Q_OP_SETTLE] = {"UPDATE lg_operations SET state = $2, result = $3, operation_id = $4,"
                     " updated_ms = $5 WHERE key = $1 AND state = 'pending'",
                     5},
    [Q_OP_DROP_PENDING] = {"DELETE FROM lg_operations WHERE key = $1 AND state = 'pending'", 1},
    [Q_RUN_READ] = {"SELECT " RUN_COLS " FROM lg_runs WHERE run_id = $1", 1},
    [Q_RUN_READ_LOCK] = {"SELECT " RUN_COLS " FROM lg_runs WHERE run_id = $1 FOR UPDATE", 1},
    [Q_RUN_INSERT] = {"INSERT INTO lg_runs (" RUN_COLS ")"
                      " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                      " ON CONFLICT (run_id) DO NOTHING",
                      9},
    [Q_RUN_UPDATE] = {"UPDATE lg_runs SET grp = $2, status = $3, terminal_reason = $4,"
                      " policy = $5, state = $6, envelope = $7, updated_ms = $9"
                      " WHERE run_id = $1 AND $8::bigint IS NOT NULL",
                      9},
    [Q_RUN_LIST] = {"SELECT run_id, grp, status, terminal_reason, NULL::text, NULL::bytea,"
                    " envelope, created_ms, updated_ms FROM lg_runs"
                    " WHERE ($1::text IS NULL OR status = $1)"
                    " AND ($2::text IS NULL OR terminal_reason = $2)"
                    " AND ($3::text IS NULL OR grp = $3)"
                    " ORDER BY created_ms DESC, seq DESC LIMIT $4::bigint",
                    4},
    [Q_DENY_PUT] = {"INSERT INTO lg_deny (scope, id, reason, created_ms) VALUES ($1, $2, $3, $4)"
                    " ON CONFLICT (scope, id) DO UPDATE SET reason = excluded.reason,"
                    " created_ms = excluded.created_ms",
                    4},
    [Q_DENY_GET] = {"SELECT reason FROM lg_deny WHERE (scope = 1 AND id = $1)"
                    " OR (scope = 2 AND id = $2::text) ORDER BY scope LIMIT 1",
                    2},
    /* One statement, one snapshot: for reads without the lock. */
    [Q_BUD_READ] = {"SELECT " BUD_STORED ", e.* FROM lg_budgets b" HOLDS_LATERAL
                    " WHERE b.scope = $1",
                    2},
    /* With the lock: the row first, then the hold rows in a statement that
     * starts once the lock is had (a statement that waited for the lock
     * would read them from its older snapshot). */
    [Q_BUD_LOCK] = {"SELECT " BUD_STORED " FROM lg_budgets b WHERE b.scope = $1 FOR UPDATE", 1},
    [Q_HOLD_STATS] = {"SELECT " HOLD_AGG " FROM lg_budget_holds h WHERE h.scope = $1"
                      " AND EXISTS (SELECT 1 FROM lg_budgets b WHERE b.scope = $1"
                      " AND b.next_expiry_ms >= 0 AND b.next_expiry_ms <= $2)",
                      2},
    [Q_BUD_PUT] = {"INSERT INTO lg_budgets (scope, limit_micro, period, max_in_flight_micro,"
                   " period_start_ms, spent_micro, reserved_micro, holds, next_expiry_ms,"
                   " created_ms, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                   " ON CONFLICT (scope) DO UPDATE SET"
                   " limit_micro = excluded.limit_micro, period = excluded.period,"
                   " max_in_flight_micro = excluded.max_in_flight_micro,"
                   " period_start_ms = excluded.period_start_ms,"
                   " spent_micro = excluded.spent_micro, reserved_micro = excluded.reserved_micro,"
                   " holds = excluded.holds, next_expiry_ms = excluded.next_expiry_ms,"
                   " updated_ms = excluded.updated_ms",
                   11},
    [Q_BUD_LIST] = {"SELECT " BUD_STORED ", e.* FROM lg_budgets b" HOLDS_LATERAL
                    " WHERE $1::text IS NULL ORDER BY b.scope",
                    2},
    [Q_HOLD_PUT] = {"INSERT INTO lg_budget_holds (scope, reservation_id, amount_micro, expires_ms)"
                    " VALUES ($1, $2, $3, $4)",
                    4},
    [Q_HOLD_DROP] = {"DELETE FROM lg_budget_holds WHERE scope = $1 AND reservation_id = $2", 2},
    [Q_HOLDS_EXPIRE] = {"DELETE FROM lg_budget_holds WHERE scope = $1 AND expires_ms <= $2", 2},
    [Q_RESV_INSERT] = {"INSERT INTO lg_budget_reservations (" RESV_COLS ")"
                       " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
                       " ON CONFLICT (id) DO NOTHING",
                       12},
    [Q_RESV_READ] = {"SELECT " RESV_COLS " FROM lg_budget_reservations WHERE id = $1", 1},
    [Q_RESV_READ_LOCK] = {"SELECT " RESV_COLS " FROM lg_budget_reservations WHERE id = $1"
                          " FOR UPDATE",
                          1},
    [Q_RESV_OF_RUN] = {"SELECT " RESV_COLS " FROM lg_budget_reservations"
                       " WHERE run_id = $1 AND run_seq = $2",
                       2},
    [Q_RESV_OF_RUN_LOCK] = {"SELECT " RESV_COLS " FROM lg_budget_reservations"
                            " WHERE run_id = $1 AND run_seq = $2 FOR UPDATE",
                            2},
    [Q_RESV_OLDEST_OF_RUN] = {"SELECT " RESV_COLS " FROM lg_budget_reservations"
                              " WHERE run_id = $1 AND state = 'open' ORDER BY run_seq LIMIT 1",
                              1},
    [Q_RESV_OLDEST_OF_RUN_LOCK] = {"SELECT " RESV_COLS " FROM lg_budget_reservations"
                                   " WHERE run_id = $1 AND state = 'open' ORDER BY run_seq"
                                   " LIMIT 1 FOR UPDATE",
                                   1},
    [Q_RESV_UPDATE] = {"UPDATE lg_budget_reservations SET amount_micro = $2, scopes = $3,"
                       " run_id = $4, run_seq = $5, model = $6, state = $7, actual_micro = $8,"
                       " created_ms = $9, expires_ms = $10, settled_ms = $11, asked_micro = $12"
                       " WHERE id = $1",
                       12},
    [Q_RESV_PURGE] = {"DELETE FROM lg_budget_reservations WHERE expires_ms <= $1", 1},
    [Q_RUNSCOPES_PUT] = {"INSERT INTO lg_budget_run_scopes (run_id, scopes) VALUES ($1, $2)"
                         " ON CONFLICT (run_id) DO UPDATE SET scopes = excluded.scopes",
                         2},
    [Q_RUNSCOPES_DEL] = {"DELETE FROM lg_budget_run_scopes WHERE run_id = $1", 1},
    [Q_RUNSCOPES_GET] = {"SELECT scopes FROM lg_budget_run_scopes WHERE run_id = $1", 1},
    /* The run's row lock (or its uncommitted insert) orders the appends
     * of one run, so MAX(n) + 1 cannot be taken twice. */
    [Q_EV_APPEND] = {"INSERT INTO lg_events (run_id, n, lines)"
                     " SELECT $1, COALESCE(MAX(n), 0) + 1, $2 FROM lg_events WHERE run_id = $1",
                     2},
    [Q_EV_READ] = {"SELECT lines FROM lg_events WHERE run_id = $1 ORDER BY n", 1},
};

/* A write held back until the next read or the commit (batch mode). */
typedef struct qwrite {
  int which;                /* the prepared statement */
  char *vals[MAX_PARAMS];   /* its parameters (new; NULL for SQL NULL) */
  int lens[MAX_PARAMS];     /* binary lengths, or -1: text */
  int insert_check;         /* 0 rows inserted is a conflict (vals[0] the id) */
} qwrite_t;

typedef struct pg {
  PGconn *conn;      /* the connection */
  int prepared;      /* the statements exist on this connection */
  int old_schema;    /* opened at a schema before 6 (migration tests): the
                        ledger's legacy statements */
  /* Batch mode (vtab->batch, asked for by the budget module before an
   * outermost transaction): BEGIN and the writes that follow wait, and go
   * out in one pipeline with the next read — or with the COMMIT — so that
   * a reservation costs two round trips instead of six. Nothing changes in
   * what is executed or in which order, only when it is sent. */
  int batch;         /* the current outermost transaction is batched */
  int begin_pending; /* its BEGIN has not been sent yet */
  qwrite_t *q;       /* writes not sent yet, in order */
  int nq, capq;
} pg_t;

static void no_notices(void *arg, const char *msg) {
  (void)arg;
  (void)msg;
}

/* Copies libpq's message without its trailing newline. */
static void trim_msg(char *out, size_t size, const char *msg) {
  snprintf(out, size, "%s", msg && *msg ? msg : "unknown error");
  size_t n = strlen(out);
  while (n && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = 0;
}

/* Translates a failed result (or a connection failure when res is NULL). */
static int pg_fail(lg_store_t *s, PGresult *res, const char *what, lg_error_t *err) {
  pg_t *p = s->impl;
  char msg[400];
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  int lost = !p->conn || PQstatus(p->conn) != CONNECTION_OK;
  trim_msg(msg, sizeof msg, res ? PQresultErrorMessage(res) : NULL);
  if ((!res || !*PQresultErrorMessage(res)) && p->conn)
    trim_msg(msg, sizeof msg, PQerrorMessage(p->conn));
  if (lost)
    return lg__err(err, LG_ESTORE, NULL, -1, "%s: the connection to PostgreSQL was lost (%s)",
                   what, msg);
  int code = LG_ESTORE;
  if (state && (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
                !strcmp(state, "55P03") || !strcmp(state, "57014") ||
                !strcmp(state, "53300")))
    code = LG_EBUSY;
  return lg__err(err, code, NULL, -1, "%s: %s%s%s%s", what, msg, state ? " (SQLSTATE " : "",
                 state ? state : "", state ? ")" : "");
}

/* Runs a simple command (no parameters, no rows wanted). */
static int flush_pending(lg_store_t *s, lg_error_t *err);

static int pg_cmd(lg_store_t *s, const char *sql, lg_error_t *err) {
  pg_t *p = s->impl;
  if (p->begin_pending || p->nq) {
    int rc = flush_pending(s, err);
    if (rc) return rc;
  }
  PGresult *res = PQexec(p->conn, sql);
  int st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : pg_fail(s, res, sql, err);
  PQclear(res);
  return rc;
}

static int session_setup(lg_store_t *s, lg_error_t *err) {
  pg_t *p = s->impl;
  char sql[160];
  PQsetNoticeProcessor(p->conn, no_notices, NULL);
  /* lock_timeout 0 would mean "wait for ever": "do not wait" is 1 ms. */
  int ms = s->opts.busy_timeout_ms > 0 ? s->opts.busy_timeout_ms : 1;
  snprintf(sql, sizeof sql,
           "SET lock_timeout = %d; SET synchronous_commit = on; SET client_min_messages = warning",
           ms);
  p->prepared = 0;
  return pg_cmd(s, sql, err);
}

/* The ledger's statements as schema 1 to 5 had them, for a store opened at
 * an old version (only the migration tests do that): the same first
 * parameters, without those of schema 6 (a missing column reads as NULL,
 * see op_read). */
static const struct {
  const char *sql;
  int nparams;
} legacy_op[] = {
    [Q_OP_READ] = {"SELECT " OP_COLS_V1 " FROM lg_operations WHERE key = $1", 1},
    [Q_OP_READ_LOCK] = {"SELECT " OP_COLS_V1 " FROM lg_operations WHERE key = $1 FOR UPDATE", 1},
    [Q_OP_INSERT] = {"INSERT INTO lg_operations (key, " OP_COLS_V1 ")"
                     " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key) DO NOTHING",
                     9},
    [Q_OP_UPDATE] = {"UPDATE lg_operations SET request_fp = $2, run_id = $3, state = $4,"
                     " result = $5, operation_id = $6, lease_until_ms = $7, created_ms = $8,"
                     " updated_ms = $9 WHERE key = $1",
                     9},
};

static int legacy(const pg_t *p, int which) {
  return p->old_schema && (size_t)which < sizeof legacy_op / sizeof *legacy_op &&
         legacy_op[which].sql;
}
static const char *sql_of(const pg_t *p, int which) {
  return legacy(p, which) ? legacy_op[which].sql : queries[which].sql;
}
static int np_of(const pg_t *p, int which) {
  return legacy(p, which) ? legacy_op[which].nparams : queries[which].nparams;
}

/* Prepares the statements; a store opened at an old schema version (a
 * migration test) has the ledger's only. */
static int prepare_all(lg_store_t *s, lg_error_t *err) {
  pg_t *p = s->impl;
  int n = lg__store_schema_target == LG_STORE_SCHEMA_VERSION ? Q__N : Q_OP_DROP_PENDING + 1;
  if (!p->prepared && !p->old_schema) p->old_schema = lg__store_schema_target < 6;
  for (int i = 0; i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "lg_q%d", i);
    PGresult *res = PQprepare(p->conn, name, sql_of(p, i), np_of(p, i), NULL);
    int ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    int rc = ok ? 0 : pg_fail(s, res, "preparing a statement", err);
    PQclear(res);
    if (rc) return rc;
  }
  p->prepared = 1;
  return 0;
}

/* Makes sure the connection is up before a call that starts outside a
 * transaction: a connection lost by an earlier call is re-established. */
static int ensure(lg_store_t *s, lg_error_t *err) {
  pg_t *p = s->impl;
  if (PQstatus(p->conn) == CONNECTION_OK && p->prepared) return 0;
  if (s->depth > 0)
    return lg__err(err, LG_ESTORE, NULL, -1,
                   "the connection to PostgreSQL was lost in the middle of a transaction");
  if (PQstatus(p->conn) != CONNECTION_OK) {
    PQreset(p->conn);
    if (PQstatus(p->conn) != CONNECTION_OK) return pg_fail(s, NULL, "reconnecting", err);
  }
  int rc = session_setup(s, err);
  if (!rc) rc = prepare_all(s, err);
  return rc;
}

/* Runs prepared statement `which` with text parameters (vals[i] NULL for
 * SQL NULL) except those with lens[i] >= 0, sent as binary bytes. On
 * success *out holds the result (PQclear) with binary columns. */
/* ---- pipelines (batch mode) ---- */

/* One statement of a pipeline. */
typedef struct item {
  const char *sql;          /* a simple command without parameters, or NULL */
  int which;                /* else this prepared statement */
  const char *const *vals;  /* its parameters */
  const int *lens;          /* binary lengths (or NULL / -1: text) */
  int want;                 /* out[want] receives the result, -1: checked only */
  int insert_check;         /* 0 rows changed is a conflict on vals[0] */
} item_t;

static void q_free(qwrite_t *w) {
  for (int i = 0; i < MAX_PARAMS; i++) lg__free(w->vals[i]);
}

static void q_clear(pg_t *p) {
  for (int i = 0; i < p->nq; i++) q_free(&p->q[i]);
  p->nq = 0;
}

/* Sends the items in one pipeline and reads every result. Returns 0, or
 * the first failure (the statements after it were not run); results in
 * out[] only on success. */
static int pipeline(lg_store_t *s, const item_t *it, int n, PGresult **out, lg_error_t *err) {
  pg_t *p = s->impl;
  int rc = 0, sent = 0;
  for (int i = 0; i < n; i++)
    if (it[i].want >= 0) out[it[i].want] = NULL;
  if (PQenterPipelineMode(p->conn) != 1) return pg_fail(s, NULL, "starting a pipeline", err);
  for (; sent < n; sent++) {
    const item_t *x = &it[sent];
    int ok;
    if (x->sql) {
      ok = PQsendQueryParams(p->conn, x->sql, 0, NULL, NULL, NULL, NULL, 1);
    } else {
      int np = np_of(p, x->which);
      int formats[MAX_PARAMS] = {0}, lengths[MAX_PARAMS] = {0};
      for (int k = 0; k < np; k++)
        if (x->lens && x->lens[k] >= 0) {
          formats[k] = 1;
          lengths[k] = x->lens[k];
        }
      char name[16];
      snprintf(name, sizeof name, "lg_q%d", x->which);
      ok = PQsendQueryPrepared(p->conn, name, np, x->vals, lengths, formats, 1);
    }
    if (!ok) {
      rc = pg_fail(s, NULL, "sending a statement", err);
      break;
    }
  }
  if (PQpipelineSync(p->conn) != 1 && !rc) rc = pg_fail(s, NULL, "sending a pipeline", err);
  /* Read what was sent: one result and a NULL per statement, then the sync. */
  for (int i = 0; i < sent; i++) {
    PGresult *res = PQgetResult(p->conn);
    if (!res) {
      if (!rc) rc = pg_fail(s, NULL, "reading a pipeline", err);
      break;
    }
    int st = PQresultStatus(res);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
      if (!rc && it[i].insert_check && atoi(PQcmdTuples(res)) == 0)
        rc = lg__err(err, LG_ECONFLICT, "reservation_id", -1, "reservation \"%s\" exists already",
                     it[i].vals[0]);
      if (!rc && it[i].want >= 0) {
        out[it[i].want] = res;
        res = NULL;
      }
    } else if (!rc) {
      rc = pg_fail(s, st == PGRES_PIPELINE_ABORTED ? NULL : res, "statement", err);
    }
    PQclear(res);
    while ((res = PQgetResult(p->conn))) PQclear(res);
  }
  for (;;) {
    PGresult *res = PQgetResult(p->conn);
    if (!res) break;
    int st = PQresultStatus(res);
    PQclear(res);
    if (st == PGRES_PIPELINE_SYNC) break;
  }
  if (PQexitPipelineMode(p->conn) != 1 && !rc) rc = pg_fail(s, NULL, "ending a pipeline", err);
  if (rc)
    for (int i = 0; i < n; i++)
      if (it[i].want >= 0) {
        PQclear(out[it[i].want]);
        out[it[i].want] = NULL;
      }
  return rc;
}

/* The items that wait (BEGIN, held-back writes) at the head of it[]; the
 * caller adds its own after them. Returns how many. */
static int pending_items(pg_t *p, item_t *it) {
  int n = 0;
  if (p->begin_pending) it[n++] = (item_t){.sql = "BEGIN", .want = -1};
  for (int i = 0; i < p->nq; i++)
    it[n++] = (item_t){.which = p->q[i].which, .vals = (const char *const *)p->q[i].vals,
                       .lens = p->q[i].lens, .want = -1, .insert_check = p->q[i].insert_check};
  return n;
}

/* Runs the items that wait, alone, plus `tail` (may be NULL). After it
 * nothing waits, whatever happened. */
static int run_with_pending(lg_store_t *s, const item_t *tail, int ntail, PGresult **out,
                            lg_error_t *err) {
  pg_t *p = s->impl;
  item_t *it = lg__calloc((size_t)(p->nq + ntail + 1), sizeof *it);
  if (!it) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  int n = pending_items(p, it);
  for (int i = 0; i < ntail; i++) it[n++] = tail[i];
  int rc = pipeline(s, it, n, out, err);
  lg__free(it);
  p->begin_pending = 0;
  q_clear(p);
  return rc;
}

static int flush_pending(lg_store_t *s, lg_error_t *err) {
  return run_with_pending(s, NULL, 0, NULL, err);
}

/* Holds a write back (batch mode). Copies the parameters. */
static int q_push(lg_store_t *s, int which, const char *const *vals, const int *lens,
                  int insert_check, lg_error_t *err) {
  pg_t *p = s->impl;
  if (p->nq == p->capq) {
    int cap = p->capq ? p->capq * 2 : 16;
    qwrite_t *q = lg__realloc(p->q, (size_t)cap * sizeof *q);
    if (!q) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    p->q = q;
    p->capq = cap;
  }
  qwrite_t *w = &p->q[p->nq];
  memset(w, 0, sizeof *w);
  w->which = which;
  w->insert_check = insert_check;
  for (int i = 0; i < np_of(p, which); i++) {
    w->lens[i] = lens ? lens[i] : -1;
    if (!vals[i]) continue;
    size_t len = w->lens[i] >= 0 ? (size_t)w->lens[i] : strlen(vals[i]);
    if (!(w->vals[i] = lg__strndup(vals[i], len))) {
      q_free(w);
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  }
  p->nq++;
  return 0;
}

/* A write: held back in batch mode, else run now. */
static int pg_write(lg_store_t *s, int which, const char *const *vals, const int *lens,
                    int insert_check, int *changed, lg_error_t *err);

static int pg_run(lg_store_t *s, int which, const char *const *vals, const int *lens,
                  PGresult **out, lg_error_t *err) {
  pg_t *p = s->impl;
  if (p->begin_pending || p->nq) {
    item_t me = {.which = which, .vals = vals, .lens = lens, .want = 0};
    *out = NULL;
    return run_with_pending(s, &me, 1, out, err);
  }
  int n = np_of(p, which);
  int formats[MAX_PARAMS] = {0}, lengths[MAX_PARAMS] = {0};
  *out = NULL;
  int rc = ensure(s, err);
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    if (lens && lens[i] >= 0) {
      formats[i] = 1;
      lengths[i] = lens[i];
    }
  }
  char name[16];
  snprintf(name, sizeof name, "lg_q%d", which);
  PGresult *res = PQexecPrepared(p->conn, name, n, vals, lengths, formats, 1);
  int st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    rc = pg_fail(s, res, "statement", err);
    PQclear(res);
    return rc;
  }
  *out = res;
  return 0;
}

static int pg_write(lg_store_t *s, int which, const char *const *vals, const int *lens,
                    int insert_check, int *changed, lg_error_t *err) {
  pg_t *p = s->impl;
  if (changed) *changed = 1;
  if (p->batch && s->depth > 0) return q_push(s, which, vals, lens, insert_check, err);
  PGresult *res;
  int rc = pg_run(s, which, vals, lens, &res, err);
  if (rc) return rc;
  int n = atoi(PQcmdTuples(res));
  if (changed) *changed = n;
  if (insert_check && n == 0)
    rc = lg__err(err, LG_ECONFLICT, "reservation_id", -1, "reservation \"%s\" exists already",
                 vals[0]);
  PQclear(res);
  return rc;
}

static int64_t col_i64(PGresult *r, int row, int col) {
  if (PQgetisnull(r, row, col)) return 0;
  const unsigned char *v = (const unsigned char *)PQgetvalue(r, row, col);
  int len = PQgetlength(r, row, col);
  uint64_t x = 0;
  for (int i = 0; i < len; i++) x = (x << 8) | v[i];
  if (len == 4) return (int32_t)(uint32_t)x;
  if (len == 2) return (int16_t)(uint16_t)x;
  return (int64_t)x;
}

static char *col_str(PGresult *r, int row, int col, size_t *len, int *ok) {
  if (len) *len = 0;
  if (PQgetisnull(r, row, col)) return NULL;
  size_t n = (size_t)PQgetlength(r, row, col);
  char *v = lg__strndup(PQgetvalue(r, row, col), n);
  if (!v) *ok = 0;
  if (len) *len = n;
  return v;
}

static int rows_changed(PGresult *r) { return atoi(PQcmdTuples(r)); }

/* ---- opening and the schema ---- */

static int read_version(lg_store_t *s, int *version, lg_error_t *err) {
  pg_t *p = s->impl;
  *version = 0;
  PGresult *res = PQexecParams(p->conn,
                               "SELECT CASE WHEN to_regclass('lg_schema_version') IS NULL"
                               " THEN -1 ELSE 0 END",
                               0, NULL, NULL, NULL, NULL, 0);
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
    int rc = pg_fail(s, res, "reading the schema version", err);
    PQclear(res);
    return rc;
  }
  int missing = atoi(PQgetvalue(res, 0, 0)) < 0;
  PQclear(res);
  if (missing) return 0;
  res = PQexec(p->conn, "SELECT COALESCE(MAX(version), 0) FROM lg_schema_version");
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
    int rc = pg_fail(s, res, "reading the schema version", err);
    PQclear(res);
    return rc;
  }
  *version = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return 0;
}

static int migrate(lg_store_t *s, lg_error_t *err) {
  int target = lg__store_schema_target;
  int version = 0;
  int rc = read_version(s, &version, err);
  if (rc) return rc;
  if (version == target) return 0;
  rc = pg_cmd(s,
              "BEGIN; SELECT pg_advisory_xact_lock(" SCHEMA_LOCK ");"
              "CREATE TABLE IF NOT EXISTS lg_schema_version ("
              "  version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL)",
              err);
  if (rc) goto fail;
  if ((rc = read_version(s, &version, err))) goto fail; /* again, under the lock */
  if (version > LG_STORE_SCHEMA_VERSION) {
    rc = lg__err(err, LG_ESTORE, NULL, -1,
                 "the database has schema version %d, newer than this release's %d: "
                 "use a newer loopguard",
                 version, LG_STORE_SCHEMA_VERSION);
    goto fail;
  }
  for (int v = version; v < target; v++) {
    char sql[200];
    if ((rc = pg_cmd(s, migrations[v], err))) goto fail;
    snprintf(sql, sizeof sql,
             "INSERT INTO lg_schema_version (version, applied_ms)"
             " VALUES (%d, (extract(epoch FROM now()) * 1000)::bigint)",
             v + 1);
    if ((rc = pg_cmd(s, sql, err))) goto fail;
  }
  return pg_cmd(s, "COMMIT", err);
fail:
  pg_cmd(s, "ROLLBACK", NULL);
  return rc;
}

static int p_open(lg_store_t *s, const char *conninfo, lg_error_t *err) {
  pg_t *p = lg__calloc(1, sizeof *p);
  if (!p) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  s->impl = p;
  int rc;
  p->conn = PQconnectdb(conninfo ? conninfo : "");
  if (!p->conn) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory connecting to PostgreSQL");
    goto fail;
  }
  if (PQstatus(p->conn) != CONNECTION_OK) {
    char msg[400];
    trim_msg(msg, sizeof msg, PQerrorMessage(p->conn));
    rc = lg__err(err, LG_ESTORE, NULL, -1, "cannot connect to PostgreSQL: %s", msg);
    goto fail;
  }
  if ((rc = session_setup(s, err))) goto fail;
  if ((rc = migrate(s, err))) goto fail;
  if ((rc = prepare_all(s, err))) goto fail;
  return 0;
fail:
  PQfinish(p->conn);
  lg__free(p);
  s->impl = NULL;
  return rc;
}

static void p_close(lg_store_t *s) {
  pg_t *p = s->impl;
  if (!p) return;
  q_clear(p);
  lg__free(p->q);
  PQfinish(p->conn); /* an open transaction is rolled back by the server */
  lg__free(p);
  s->impl = NULL;
}

static int p_schema_version(lg_store_t *s, int *version, lg_error_t *err) {
  int rc = ensure(s, err);
  return rc ? rc : read_version(s, version, err);
}

/* ---- transactions ---- */

static int p_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  pg_t *p = s->impl;
  if (nested)
    return pg_cmd(s, upgrade ? "SAVEPOINT lg_sp; SET LOCAL synchronous_commit = on"
                             : "SAVEPOINT lg_sp",
                  err);
  int rc = ensure(s, err);
  if (rc) {
    p->batch = 0;
    return rc;
  }
  if (p->batch && kind == LG__TXN_LEDGER) {
    p->begin_pending = 1; /* sent with the first statement */
    return 0;
  }
  p->batch = 0;
  /* synchronous_commit stays on (the session's) unless the store was
   * opened relaxed: with it off, a crash of PostgreSQL lost decisions that
   * had been answered (pg_ctl restart -m immediate under load). Group
   * commit (commit_delay, or many connections flushing together) keeps
   * the cost down. */
  int relaxed = kind == LG__TXN_RUN && s->opts.durability == LG_STORE_RELAXED;
  return pg_cmd(s, relaxed ? "BEGIN; SET LOCAL synchronous_commit = off" : "BEGIN", err);
}

/* Checks a COMMIT's result: an aborted transaction "commits" as ROLLBACK. */
static int commit_result(lg_store_t *s, PGresult *res, lg_error_t *err) {
  if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) return pg_fail(s, res, "COMMIT", err);
  if (strcmp(PQcmdStatus(res), "COMMIT"))
    return lg__err(err, LG_ESTORE, NULL, -1, "the transaction was rolled back by PostgreSQL");
  return 0;
}

static int p_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  pg_t *p = s->impl;
  if (nested) {
    if (!commit) q_clear(p); /* writes held back since the savepoint: never sent */
    return pg_cmd(s, commit ? "RELEASE SAVEPOINT lg_sp"
                            : "ROLLBACK TO SAVEPOINT lg_sp; RELEASE SAVEPOINT lg_sp",
                  err);
  }
  int was_pending = p->begin_pending;
  p->batch = 0;
  if (!commit) {
    p->begin_pending = 0;
    q_clear(p);
    if (was_pending) return 0; /* nothing was sent */
    if (PQstatus(p->conn) != CONNECTION_OK) return 0; /* the server rolled it back */
    return pg_cmd(s, "ROLLBACK", err);
  }
  if (was_pending || p->nq) {
    if (was_pending && !p->nq) {
      p->begin_pending = 0; /* an empty transaction: nothing to send */
      return 0;
    }
    /* BEGIN (if it waited), the writes held back and the COMMIT, at once. */
    PGresult *out[1] = {NULL};
    item_t commit_item = {.sql = "COMMIT", .want = 0};
    int rc = run_with_pending(s, &commit_item, 1, out, err);
    if (!rc) rc = commit_result(s, out[0], err);
    PQclear(out[0]);
    if (rc && PQstatus(p->conn) == CONNECTION_OK && PQtransactionStatus(p->conn) != PQTRANS_IDLE) {
      PGresult *r = PQexec(p->conn, "ROLLBACK");
      PQclear(r);
    }
    return rc;
  }
  PGresult *res = PQexec(p->conn, "COMMIT");
  int rc = commit_result(s, res, err);
  PQclear(res);
  return rc;
}

static int p_batch(lg_store_t *s) {
  pg_t *p = s->impl;
  if (s->depth == 0) p->batch = 1;
  return 0;
}

/* ---- ledger rows ---- */

static const char *state_name(int st) {
  return st == LG__OP_COMMITTED ? "committed" : st == LG__OP_FAILED ? "failed" : "pending";
}
static int state_of(const char *v, int len) {
  if (len == 9 && !memcmp(v, "committed", 9)) return LG__OP_COMMITTED;
  if (len == 6 && !memcmp(v, "failed", 6)) return LG__OP_FAILED;
  return LG__OP_PENDING;
}

static int p_op_read(lg_store_t *s, const char *key, int lock, lg__op_row_t *row, int *found,
                     lg_error_t *err) {
  PGresult *res;
  const char *vals[1] = {key};
  *found = 0;
  int rc = pg_run(s, lock ? Q_OP_READ_LOCK : Q_OP_READ, vals, NULL, &res, err);
  if (rc) return rc;
  if (PQntuples(res) > 0) {
    int ok = 1;
    *found = 1;
    memset(row, 0, sizeof *row);
    row->key = lg__strdup(key);
    row->request_fp = col_str(res, 0, 0, NULL, &ok);
    row->run_id = col_str(res, 0, 1, NULL, &ok);
    row->state = state_of(PQgetvalue(res, 0, 2), PQgetlength(res, 0, 2));
    row->result = col_str(res, 0, 3, &row->result_len, &ok);
    row->operation_id = col_str(res, 0, 4, NULL, &ok);
    row->lease_until_ms = col_i64(res, 0, 5);
    row->created_ms = col_i64(res, 0, 6);
    row->updated_ms = col_i64(res, 0, 7);
    if (PQnfields(res) > 8) { /* schema 6 */
      row->claim_token = col_str(res, 0, 8, NULL, &ok);
      row->resolved_by = col_str(res, 0, 9, NULL, &ok);
      row->resolved_ms = col_i64(res, 0, 10);
      row->freed = (int)col_i64(res, 0, 11);
    }
    if (!ok || !row->key || !row->request_fp) {
      lg__op_row_clear(row);
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  }
  PQclear(res);
  return rc;
}

/* Parameters of an op row: 13 values, their lengths (binary for result). */
typedef struct op_params {
  const char *vals[13];
  int lens[13];
  char lease[24], created[24], updated[24], resolved[24], freed[4];
} op_params_t;

static void op_params(op_params_t *p, const lg__op_row_t *r) {
  snprintf(p->lease, sizeof p->lease, "%lld", (long long)r->lease_until_ms);
  snprintf(p->created, sizeof p->created, "%lld", (long long)r->created_ms);
  snprintf(p->updated, sizeof p->updated, "%lld", (long long)r->updated_ms);
  snprintf(p->resolved, sizeof p->resolved, "%lld", (long long)r->resolved_ms);
  snprintf(p->freed, sizeof p->freed, "%d", r->freed ? 1 : 0);
  const char *v[13] = {r->key,    r->request_fp, r->run_id,  state_name(r->state), r->result,
                       r->operation_id, p->lease,  p->created, p->updated, r->claim_token,
                       r->resolved_by, p->resolved, p->freed};
  for (int i = 0; i < 13; i++) {
    p->vals[i] = v[i];
    p->lens[i] = -1;
  }
  p->lens[4] = r->result ? (int)r->result_len : -1;
}

static int p_op_insert(lg_store_t *s, const lg__op_row_t *row, int *inserted, lg_error_t *err) {
  op_params_t pp;
  PGresult *res;
  op_params(&pp, row);
  *inserted = 0;
  int rc = pg_run(s, Q_OP_INSERT, pp.vals, pp.lens, &res, err);
  if (rc) return rc;
  *inserted = rows_changed(res) > 0;
  PQclear(res);
  return 0;
}

static int p_op_update(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err) {
  op_params_t pp;
  PGresult *res;
  op_params(&pp, row);
  int rc = pg_run(s, Q_OP_UPDATE, pp.vals, pp.lens, &res, err);
  PQclear(res);
  return rc;
}

static int p_op_delete(lg_store_t *s, const char *key, lg_error_t *err) {
  PGresult *res;
  const char *vals[1] = {key};
  int rc = pg_run(s, Q_OP_DELETE, vals, NULL, &res, err);
  PQclear(res);
  return rc;
}

static int p_op_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  PGresult *res;
  char b[24];
  snprintf(b, sizeof b, "%lld", (long long)before_ms);
  const char *vals[1] = {b};
  *purged = 0;
  int rc = pg_run(s, Q_OP_PURGE, vals, NULL, &res, err);
  if (rc) return rc;
  *purged = rows_changed(res);
  PQclear(res);
  return 0;
}

static int p_op_settle(lg_store_t *s, const char *key, int state, const char *result,
                       size_t result_len, const char *operation_id, int64_t now_ms,
                       int *changed, lg_error_t *err) {
  PGresult *res;
  int rc;
  *changed = 0;
  if (!state) {
    const char *vals[1] = {key};
    rc = pg_run(s, Q_OP_DROP_PENDING, vals, NULL, &res, err);
  } else {
    char now[24];
    snprintf(now, sizeof now, "%lld", (long long)now_ms);
    const char *vals[5] = {key, state_name(state), result, operation_id, now};
    int lens[5] = {-1, -1, result ? (int)result_len : -1, -1, -1};
    rc = pg_run(s, Q_OP_SETTLE, vals, lens, &res, err);
  }
  if (rc) return rc;
  *changed = rows_changed(res) > 0;
  PQclear(res);
  return 0;
}

/* ---- runs ---- */

static int read_run_row(PGresult *r, int i, lg_run_record_t *rec) {
  int ok = 1;
  memset(rec, 0, sizeof *rec);
  rec->run_id = col_str(r, i, 0, NULL, &ok);
  rec->group = col_str(r, i, 1, NULL, &ok);
  rec->stopped = PQgetlength(r, i, 2) == 7 && !memcmp(PQgetvalue(r, i, 2), "stopped", 7);
  rec->terminal_reason = col_str(r, i, 3, NULL, &ok);
  rec->policy_json = col_str(r, i, 4, NULL, &ok);
  rec->state = col_str(r, i, 5, &rec->state_len, &ok);
  rec->envelope_json = col_str(r, i, 6, NULL, &ok);
  rec->created_ms = col_i64(r, i, 7);
  rec->updated_ms = col_i64(r, i, 8);
  if (!ok || !rec->run_id) {
    lg_run_record_clear(rec);
    return LG_ENOMEM;
  }
  return 0;
}

static int p_run_read(lg_store_t *s, const char *run_id, int lock, lg_run_record_t *rec,
                      int *found, lg_error_t *err) {
  PGresult *res;
  const char *vals[1] = {run_id};
  *found = 0;
  int rc = pg_run(s, lock ? Q_RUN_READ_LOCK : Q_RUN_READ, vals, NULL, &res, err);
  if (rc) return rc;
  if (PQntuples(res) > 0) {
    *found = 1;
    if (read_run_row(res, 0, rec)) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  PQclear(res);
  return rc;
}

typedef struct run_params {
  const char *vals[9];
  int lens[9];
  char created[24], updated[24];
} run_params_t;

static void run_params(run_params_t *p, const lg_run_record_t *r) {
  snprintf(p->created, sizeof p->created, "%lld", (long long)r->created_ms);
  snprintf(p->updated, sizeof p->updated, "%lld", (long long)r->updated_ms);
  const char *v[9] = {r->run_id,      r->group, r->stopped ? "stopped" : "active",
                      r->terminal_reason, r->policy_json, r->state,
                      r->envelope_json,   p->created,     p->updated};
  for (int i = 0; i < 9; i++) {
    p->vals[i] = v[i];
    p->lens[i] = -1;
  }
  p->lens[5] = r->state ? (int)r->state_len : -1;
}

static int p_run_insert(lg_store_t *s, const lg_run_record_t *rec, int *inserted,
                        lg_error_t *err) {
  run_params_t rp;
  PGresult *res;
  run_params(&rp, rec);
  *inserted = 0;
  int rc = pg_run(s, Q_RUN_INSERT, rp.vals, rp.lens, &res, err);
  if (rc) return rc;
  *inserted = rows_changed(res) > 0;
  PQclear(res);
  return 0;
}

static int p_run_update(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                        lg_error_t *err) {
  run_params_t rp;
  PGresult *res;
  run_params(&rp, rec);
  *updated = 0;
  int rc = pg_run(s, Q_RUN_UPDATE, rp.vals, rp.lens, &res, err);
  if (rc) return rc;
  *updated = rows_changed(res) > 0;
  PQclear(res);
  return 0;
}

static int p_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb, void *ud,
                      lg_error_t *err) {
  PGresult *res;
  char lim[24];
  snprintf(lim, sizeof lim, "%zu", f->limit);
  const char *vals[4] = {f->status, f->reason, f->group, f->limit ? lim : NULL};
  int rc = pg_run(s, Q_RUN_LIST, vals, NULL, &res, err);
  if (rc) return rc;
  int n = PQntuples(res);
  /* Copy everything first: the callback may use the connection. */
  lg_run_record_t *all = lg__calloc((size_t)n + 1, sizeof *all);
  if (!all) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  int got = 0;
  for (; !rc && got < n; got++)
    if (read_run_row(res, got, &all[got])) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
  PQclear(res);
  for (int i = 0; i < got && !rc; i++) rc = cb(ud, &all[i]);
  for (int i = 0; i < got; i++) lg_run_record_clear(&all[i]);
  lg__free(all);
  return rc;
}

/* ---- deny rules ---- */

static int p_deny_put(lg_store_t *s, int scope, const char *id, const char *reason,
                      int64_t now_ms, lg_error_t *err) {
  PGresult *res;
  char sc[8], now[24];
  snprintf(sc, sizeof sc, "%d", scope);
  snprintf(now, sizeof now, "%lld", (long long)now_ms);
  const char *vals[4] = {sc, id, reason, now};
  int rc = pg_run(s, Q_DENY_PUT, vals, NULL, &res, err);
  PQclear(res);
  return rc;
}

static int p_deny_get(lg_store_t *s, const char *run_id, const char *group, int *found,
                      char **reason, lg_error_t *err) {
  PGresult *res;
  const char *vals[2] = {run_id, group};
  *found = 0;
  *reason = NULL;
  int rc = pg_run(s, Q_DENY_GET, vals, NULL, &res, err);
  if (rc) return rc;
  if (PQntuples(res) > 0) {
    int ok = 1;
    *found = 1;
    *reason = col_str(res, 0, 0, NULL, &ok);
    if (!ok) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  PQclear(res);
  return rc;
}

/* ---- budgets ---- */

static const char *const period_names[] = {"none", "daily", "weekly", "monthly"};

static int period_of(const char *v, int len) {
  for (int i = 0; i < 4; i++)
    if ((int)strlen(period_names[i]) == len && !memcmp(v, period_names[i], (size_t)len)) return i;
  return 0;
}

static int64_t col_i64_or(PGresult *r, int row, int col, int64_t dflt) {
  return PQgetisnull(r, row, col) ? dflt : col_i64(r, row, col);
}

/* Reads the stored columns (BUD_STORED) of a result row. */
static int read_bud_stored(PGresult *r, int i, lg__bud_row_t *b) {
  int ok = 1;
  memset(b, 0, sizeof *b);
  b->scope = col_str(r, i, 0, NULL, &ok);
  b->limit_micro = col_i64(r, i, 1);
  b->period = period_of(PQgetvalue(r, i, 2), PQgetlength(r, i, 2));
  b->max_in_flight_micro = col_i64_or(r, i, 3, -1);
  b->period_start_ms = col_i64(r, i, 4);
  b->spent_micro = col_i64(r, i, 5);
  b->reserved_micro = col_i64(r, i, 6);
  b->holds = col_i64(r, i, 7);
  b->next_expiry_ms = col_i64(r, i, 8);
  b->created_ms = col_i64(r, i, 9);
  b->updated_ms = col_i64(r, i, 10);
  b->live_min_expiry_ms = -1;
  if (!ok || !b->scope) {
    lg__bud_row_clear(b);
    return LG_ENOMEM;
  }
  return 0;
}

/* HOLD_AGG's four columns from `col` (NULLs when the scan was skipped). */
static void read_hold_agg(PGresult *r, int i, int col, lg__bud_row_t *b) {
  b->live_micro = col_i64_or(r, i, col, 0);
  b->live_holds = col_i64_or(r, i, col + 1, 0);
  b->live_min_expiry_ms = col_i64_or(r, i, col + 2, -1);
  b->expired_holds = col_i64_or(r, i, col + 3, 0);
}

static int p_bud_read(lg_store_t *s, const char *scope, int lock, int64_t now_ms,
                      lg__bud_row_t *row, int *found, lg_error_t *err) {
  PGresult *res;
  char now[24];
  snprintf(now, sizeof now, "%lld", (long long)now_ms);
  const char *vals[2] = {scope, now};
  *found = 0;
  if (!lock) {
    int rc = pg_run(s, Q_BUD_READ, vals, NULL, &res, err);
    if (rc) return rc;
    if (PQntuples(res) > 0) {
      if (read_bud_stored(res, 0, row)) {
        PQclear(res);
        return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      }
      *found = 1;
      read_hold_agg(res, 0, 11, row);
    }
    PQclear(res);
    return 0;
  }
  /* The lock, then the holds: two statements, one round trip (a pipeline
   * runs them in order, so the second starts once the lock is had), with
   * whatever waits in batch mode in front of them. */
  int rc = ensure(s, err);
  if (rc) return rc;
  PGresult *out[2] = {NULL, NULL};
  item_t it[2] = {{.which = Q_BUD_LOCK, .vals = vals, .want = 0},
                  {.which = Q_HOLD_STATS, .vals = vals, .want = 1}};
  if ((rc = run_with_pending(s, it, 2, out, err))) return rc;
  if (PQntuples(out[0]) > 0) {
    if (read_bud_stored(out[0], 0, row)) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    } else {
      *found = 1;
      read_hold_agg(out[1], 0, 0, row);
    }
  }
  PQclear(out[0]);
  PQclear(out[1]);
  return rc;
}

/* The lock, the hold rows and the delete of one hold: one round trip. */
static int p_bud_read_drop(lg_store_t *s, const char *scope, int64_t now_ms, const char *id,
                           lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err) {
  char now[24];
  snprintf(now, sizeof now, "%lld", (long long)now_ms);
  const char *vals[2] = {scope, now};
  const char *dvals[2] = {scope, id};
  *found = *dropped = 0;
  int rc = ensure(s, err);
  if (rc) return rc;
  PGresult *out[3] = {NULL, NULL, NULL};
  item_t it[3] = {{.which = Q_BUD_LOCK, .vals = vals, .want = 0},
                  {.which = Q_HOLD_STATS, .vals = vals, .want = 1},
                  {.which = Q_HOLD_DROP, .vals = dvals, .want = 2}};
  if ((rc = run_with_pending(s, it, 3, out, err))) return rc;
  if (PQntuples(out[0]) > 0) {
    if (read_bud_stored(out[0], 0, row)) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    } else {
      *found = 1;
      read_hold_agg(out[1], 0, 0, row);
      *dropped = atoi(PQcmdTuples(out[2])) > 0;
    }
  }
  for (int i = 0; i < 3; i++) PQclear(out[i]);
  return rc;
}

static int p_bud_put(lg_store_t *s, const lg__bud_row_t *b, lg_error_t *err) {
  char lim[24], mif[24], ps[24], sp[24], rs[24], ho[24], ne[24], cr[24], up[24];
  snprintf(lim, sizeof lim, "%lld", (long long)b->limit_micro);
  snprintf(mif, sizeof mif, "%lld", (long long)b->max_in_flight_micro);
  snprintf(ps, sizeof ps, "%lld", (long long)b->period_start_ms);
  snprintf(sp, sizeof sp, "%lld", (long long)b->spent_micro);
  snprintf(rs, sizeof rs, "%lld", (long long)b->reserved_micro);
  snprintf(ho, sizeof ho, "%lld", (long long)b->holds);
  snprintf(ne, sizeof ne, "%lld", (long long)b->next_expiry_ms);
  snprintf(cr, sizeof cr, "%lld", (long long)b->created_ms);
  snprintf(up, sizeof up, "%lld", (long long)b->updated_ms);
  const char *vals[11] = {b->scope, lim, period_names[b->period & 3],
                          b->max_in_flight_micro >= 0 ? mif : NULL, ps, sp, rs, ho, ne, cr, up};
  return pg_write(s, Q_BUD_PUT, vals, NULL, 0, NULL, err);
}

static int p_bud_list(lg_store_t *s, int64_t now_ms, int (*cb)(void *, const lg__bud_row_t *),
                      void *ud, lg_error_t *err) {
  PGresult *res;
  char now[24];
  snprintf(now, sizeof now, "%lld", (long long)now_ms);
  const char *vals[2] = {NULL, now};
  int rc = pg_run(s, Q_BUD_LIST, vals, NULL, &res, err);
  if (rc) return rc;
  int n = PQntuples(res);
  lg__bud_row_t *all = lg__calloc((size_t)n + 1, sizeof *all);
  if (!all) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  int got = 0;
  for (; !rc && got < n; got++) {
    if (read_bud_stored(res, got, &all[got])) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
    read_hold_agg(res, got, 11, &all[got]);
  }
  PQclear(res);
  for (int i = 0; i < got && !rc; i++) rc = cb(ud, &all[i]);
  for (int i = 0; i < got; i++) lg__bud_row_clear(&all[i]);
  lg__free(all);
  return rc;
}

/* Runs a write whose result is not wanted (held back in batch mode). */
static int pg_do(lg_store_t *s, int which, const char *const *vals, lg_error_t *err) {
  return pg_write(s, which, vals, NULL, 0, NULL, err);
}

static int p_hold_put(lg_store_t *s, const char *scope, const char *id, int64_t amount,
                      int64_t expires_ms, lg_error_t *err) {
  char a[24], e[24];
  snprintf(a, sizeof a, "%lld", (long long)amount);
  snprintf(e, sizeof e, "%lld", (long long)expires_ms);
  const char *vals[4] = {scope, id, a, e};
  return pg_do(s, Q_HOLD_PUT, vals, err);
}

static int p_holds_expire(lg_store_t *s, const char *scope, int64_t now_ms, lg_error_t *err) {
  char now[24];
  snprintf(now, sizeof now, "%lld", (long long)now_ms);
  const char *vals[2] = {scope, now};
  return pg_do(s, Q_HOLDS_EXPIRE, vals, err);
}

/* Parameters of a reservation row. */
typedef struct resv_params {
  const char *vals[12];
  char amount[24], seq[24], actual[24], created[24], expires[24], settled[24], asked[24];
} resv_params_t;

static void resv_params(resv_params_t *p, const lg__resv_row_t *r) {
  snprintf(p->amount, sizeof p->amount, "%lld", (long long)r->amount_micro);
  snprintf(p->seq, sizeof p->seq, "%lld", (long long)r->run_seq);
  snprintf(p->actual, sizeof p->actual, "%lld", (long long)r->actual_micro);
  snprintf(p->created, sizeof p->created, "%lld", (long long)r->created_ms);
  snprintf(p->expires, sizeof p->expires, "%lld", (long long)r->expires_ms);
  snprintf(p->settled, sizeof p->settled, "%lld", (long long)r->settled_ms);
  snprintf(p->asked, sizeof p->asked, "%lld", (long long)r->asked_micro);
  const char *v[12] = {r->id,       r->amount_micro >= 0 ? p->amount : "0", r->scopes,
                       r->run_id,   p->seq,    r->model, r->settled ? "settled" : "open",
                       p->actual,   p->created, p->expires, p->settled, p->asked};
  memcpy(p->vals, v, sizeof v);
}

static int p_resv_insert(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  resv_params_t rp;
  resv_params(&rp, r);
  /* In batch mode a conflict is found at the commit, which then fails. */
  return pg_write(s, Q_RESV_INSERT, rp.vals, NULL, 1, NULL, err);
}

static int read_resv(lg_store_t *s, int which, const char *const *vals, lg__resv_row_t *row,
                     int *found, lg_error_t *err) {
  PGresult *res;
  *found = 0;
  int rc = pg_run(s, which, vals, NULL, &res, err);
  if (rc) return rc;
  if (PQntuples(res) > 0) {
    int ok = 1;
    memset(row, 0, sizeof *row);
    row->id = col_str(res, 0, 0, NULL, &ok);
    row->amount_micro = col_i64(res, 0, 1);
    row->scopes = col_str(res, 0, 2, NULL, &ok);
    row->run_id = col_str(res, 0, 3, NULL, &ok);
    row->run_seq = col_i64(res, 0, 4);
    row->model = col_str(res, 0, 5, NULL, &ok);
    row->settled = PQgetlength(res, 0, 6) == 7 && !memcmp(PQgetvalue(res, 0, 6), "settled", 7);
    row->actual_micro = col_i64(res, 0, 7);
    row->created_ms = col_i64(res, 0, 8);
    row->expires_ms = col_i64(res, 0, 9);
    row->settled_ms = col_i64(res, 0, 10);
    row->asked_micro = col_i64(res, 0, 11);
    if (!ok || !row->id || !row->scopes) {
      lg__resv_row_clear(row);
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    } else {
      *found = 1;
    }
  }
  PQclear(res);
  return rc;
}

static int p_resv_read(lg_store_t *s, const char *id, int lock, lg__resv_row_t *row,
                       int *found, lg_error_t *err) {
  const char *vals[1] = {id};
  return read_resv(s, lock ? Q_RESV_READ_LOCK : Q_RESV_READ, vals, row, found, err);
}

static int p_resv_of_run(lg_store_t *s, const char *run_id, int64_t run_seq, int lock,
                         lg__resv_row_t *row, int *found, lg_error_t *err) {
  char seq[24];
  snprintf(seq, sizeof seq, "%lld", (long long)run_seq);
  const char *vals[2] = {run_id, seq};
  int which = run_seq > 0 ? (lock ? Q_RESV_OF_RUN_LOCK : Q_RESV_OF_RUN)
                          : (lock ? Q_RESV_OLDEST_OF_RUN_LOCK : Q_RESV_OLDEST_OF_RUN);
  return read_resv(s, which, vals, row, found, err);
}

static int p_resv_update(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  resv_params_t rp;
  resv_params(&rp, r);
  return pg_do(s, Q_RESV_UPDATE, rp.vals, err);
}

static int p_resv_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  PGresult *res;
  char b[24];
  snprintf(b, sizeof b, "%lld", (long long)before_ms);
  const char *vals[1] = {b};
  *purged = 0;
  int rc = pg_run(s, Q_RESV_PURGE, vals, NULL, &res, err);
  if (rc) return rc;
  *purged = rows_changed(res);
  PQclear(res);
  return 0;
}

static int p_runscopes_put(lg_store_t *s, const char *run_id, const char *scopes,
                           lg_error_t *err) {
  const char *vals[2] = {run_id, scopes};
  return pg_do(s, scopes && *scopes ? Q_RUNSCOPES_PUT : Q_RUNSCOPES_DEL, vals, err);
}

static int p_runscopes_get(lg_store_t *s, const char *run_id, char **scopes, int *found,
                           lg_error_t *err) {
  PGresult *res;
  const char *vals[1] = {run_id};
  *found = 0;
  *scopes = NULL;
  int rc = pg_run(s, Q_RUNSCOPES_GET, vals, NULL, &res, err);
  if (rc) return rc;
  if (PQntuples(res) > 0) {
    int ok = 1;
    *found = 1;
    *scopes = col_str(res, 0, 0, NULL, &ok);
    if (!ok) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  PQclear(res);
  return rc;
}

static int p_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                       lg_error_t *err) {
  if (len > INT32_MAX) return lg__err(err, LG_EINVAL, NULL, -1, "trace lines too long");
  const char *vals[2] = {run_id, lines};
  int lens[2] = {-1, (int)len}; /* text sent as its bytes: no NUL needed */
  return pg_write(s, Q_EV_APPEND, vals, lens, 0, NULL, err);
}

static int p_ev_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err) {
  PGresult *res;
  const char *vals[1] = {run_id};
  int rc = pg_run(s, Q_EV_READ, vals, NULL, &res, err);
  if (rc) return rc;
  for (int i = 0, n = PQntuples(res); i < n && !rc; i++)
    if (lg__buf_append(out, PQgetvalue(res, i, 0), (size_t)PQgetlength(res, i, 0)))
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  PQclear(res);
  return rc;
}

int lg__store_pg_backend_pid(lg_store_t *s) {
  pg_t *p = s->impl;
  return p && p->conn ? PQbackendPID(p->conn) : 0;
}

const lg__store_vtab_t lg__store_pg = {
    .version = 3,
    .scheme = "postgres",
    .open = p_open,
    .close = p_close,
    .schema_version = p_schema_version,
    .begin = p_begin,
    .end = p_end,
    .op_read = p_op_read,
    .op_insert = p_op_insert,
    .op_update = p_op_update,
    .op_delete = p_op_delete,
    .op_purge = p_op_purge,
    .op_settle = p_op_settle,
    .run_read = p_run_read,
    .run_insert = p_run_insert,
    .run_update = p_run_update,
    .run_list = p_run_list,
    .deny_put = p_deny_put,
    .deny_get = p_deny_get,
    .bud_read = p_bud_read,
    .bud_read_drop = p_bud_read_drop,
    .bud_put = p_bud_put,
    .bud_list = p_bud_list,
    .hold_put = p_hold_put,
    .holds_expire = p_holds_expire,
    .resv_insert = p_resv_insert,
    .resv_read = p_resv_read,
    .resv_of_run = p_resv_of_run,
    .resv_update = p_resv_update,
    .resv_purge = p_resv_purge,
    .runscopes_put = p_runscopes_put,
    .runscopes_get = p_runscopes_get,
    .batch = p_batch,
    .ev_append = p_ev_append,
    .ev_read = p_ev_read,
};
