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
  Q__N
};

#define OP_COLS                                                                        \
  "request_fp, run_id, state, result, operation_id, lease_until_ms, created_ms, updated_ms"
#define RUN_COLS                                                                       \
  "run_id, grp, status, terminal_reason, policy, state, envelope, created_ms, updated_ms"

static const struct {
  const char *sql;
  int nparams;
} queries[Q__N] = {
    [Q_OP_READ] = {"SELECT " OP_COLS " FROM lg_operations WHERE key = $1", 1},
    [Q_OP_READ_LOCK] = {"SELECT " OP_COLS " FROM lg_operations WHERE key = $1 FOR UPDATE", 1},
    [Q_OP_INSERT] = {"INSERT INTO lg_operations (key, " OP_COLS ")"
                     " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (key) DO NOTHING",
                     9},
    [Q_OP_UPDATE] = {"UPDATE lg_operations SET request_fp = $2, run_id = $3, state = $4,"
                     " result = $5, operation_id = $6, lease_until_ms = $7, created_ms = $8,"
                     " updated_ms = $9 WHERE key = $1",
                     9},
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
};

typedef struct pg {
  PGconn *conn;   /* the connection */
  int prepared;   /* the statements exist on this connection */
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
static int pg_cmd(lg_store_t *s, const char *sql, lg_error_t *err) {
  pg_t *p = s->impl;
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

/* Prepares the statements; a store opened at an old schema version (a
 * migration test) has the ledger's only. */
static int prepare_all(lg_store_t *s, lg_error_t *err) {
  pg_t *p = s->impl;
  int n = lg__store_schema_target == LG_STORE_SCHEMA_VERSION ? Q__N : Q_OP_DROP_PENDING + 1;
  for (int i = 0; i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "lg_q%d", i);
    PGresult *res = PQprepare(p->conn, name, queries[i].sql, queries[i].nparams, NULL);
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
static int pg_run(lg_store_t *s, int which, const char *const *vals, const int *lens,
                  PGresult **out, lg_error_t *err) {
  pg_t *p = s->impl;
  int n = queries[which].nparams;
  int formats[9] = {0}, lengths[9] = {0};
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
  if (nested)
    return pg_cmd(s, upgrade ? "SAVEPOINT lg_sp; SET LOCAL synchronous_commit = on"
                             : "SAVEPOINT lg_sp",
                  err);
  int rc = ensure(s, err);
  if (rc) return rc;
  return pg_cmd(s, kind == LG__TXN_RUN ? "BEGIN; SET LOCAL synchronous_commit = off" : "BEGIN",
                err);
}

static int p_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  pg_t *p = s->impl;
  if (nested)
    return pg_cmd(s, commit ? "RELEASE SAVEPOINT lg_sp"
                            : "ROLLBACK TO SAVEPOINT lg_sp; RELEASE SAVEPOINT lg_sp",
                  err);
  if (!commit) {
    if (PQstatus(p->conn) != CONNECTION_OK) return 0; /* the server rolled it back */
    return pg_cmd(s, "ROLLBACK", err);
  }
  PGresult *res = PQexec(p->conn, "COMMIT");
  int rc = 0;
  if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) {
    rc = pg_fail(s, res, "COMMIT", err);
  } else if (strcmp(PQcmdStatus(res), "COMMIT")) {
    /* An aborted transaction "commits" as ROLLBACK. */
    rc = lg__err(err, LG_ESTORE, NULL, -1, "the transaction was rolled back by PostgreSQL");
  }
  PQclear(res);
  return rc;
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
    if (!ok || !row->key || !row->request_fp) {
      lg__op_row_clear(row);
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  }
  PQclear(res);
  return rc;
}

/* Parameters of an op row: 9 values, their lengths (binary for result). */
typedef struct op_params {
  const char *vals[9];
  int lens[9];
  char lease[24], created[24], updated[24];
} op_params_t;

static void op_params(op_params_t *p, const lg__op_row_t *r) {
  snprintf(p->lease, sizeof p->lease, "%lld", (long long)r->lease_until_ms);
  snprintf(p->created, sizeof p->created, "%lld", (long long)r->created_ms);
  snprintf(p->updated, sizeof p->updated, "%lld", (long long)r->updated_ms);
  const char *v[9] = {r->key,    r->request_fp, r->run_id,  state_name(r->state), r->result,
                      r->operation_id, p->lease,  p->created, p->updated};
  for (int i = 0; i < 9; i++) {
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

int lg__store_pg_backend_pid(lg_store_t *s) {
  pg_t *p = s->impl;
  return p && p->conn ? PQbackendPID(p->conn) : 0;
}

const lg__store_vtab_t lg__store_pg = {
    .version = 1,
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
};
