/*
 * store_sqlite.c — the sqlite:PATH backend: one file in WAL mode that
 * several processes may share.
 *
 * Durability follows the kind of data. The connection's default is
 * synchronous=FULL, so every ledger claim, commit and fail — a statement
 * of its own, or a BEGIN IMMEDIATE transaction — is on disk before it is
 * acknowledged. A run transaction switches to synchronous=NORMAL (the WAL
 * is not synced at its commit: a crash of the process loses nothing, a
 * power cut may lose the last decisions' counters) and back to FULL after
 * it. SQLite does not let the level change inside a transaction, so when a
 * ledger savepoint joined a run transaction the WAL is synced by hand right
 * after its COMMIT (wal_sync), before the call returns: a claim made during
 * a decision is as durable as one made on its own.
 *
 * Writers serialize on BEGIN IMMEDIATE (the database's write lock), which
 * is what makes one claim win and what serializes two decisions for a run.
 * A lock not had within busy_timeout_ms is LG_EBUSY. SQLite's result codes
 * stop here: callers see LG_EBUSY, LG_ENOMEM or LG_ESTORE with SQLite's own
 * message.
 *
 * The schema is created and migrated on open, inside BEGIN IMMEDIATE, so
 * that two processes opening one new file do not both create it. The
 * version table lg_schema_version has a row per migration applied.
 */
#include "store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* The migrations, in order: migration i takes the schema from version i to
 * i + 1. Never edit one that was released; add a new one. */
static const char *const migrations[] = {
    /* 1: the idempotency ledger. */
    ("CREATE TABLE lg_operations ("
    "  key TEXT PRIMARY KEY,"
    "  request_fp TEXT NOT NULL,"
    "  run_id TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('pending','committed','failed')),"
    "  result BLOB,"
    "  operation_id TEXT,"
    "  lease_until_ms INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL);"
    "CREATE INDEX lg_operations_finished ON lg_operations(updated_ms)"
    "  WHERE state <> 'pending';"),
    /* 2: run state and the kill switch. */
    ("CREATE TABLE lg_runs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  run_id TEXT NOT NULL UNIQUE,"
    "  grp TEXT,"
    "  status TEXT NOT NULL CHECK (status IN ('active','stopped')),"
    "  terminal_reason TEXT,"
    "  policy TEXT,"
    "  state BLOB,"
    "  envelope TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL);"
    "CREATE TABLE lg_deny ("
    "  scope INTEGER NOT NULL,"
    "  id TEXT NOT NULL,"
    "  reason TEXT,"
    "  created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (scope, id));"),
    /* 3: listing runs newest first, by group. */
    ("CREATE INDEX lg_runs_created ON lg_runs(created_ms DESC, seq DESC);"
    "CREATE INDEX lg_runs_group ON lg_runs(grp, status);"),
    /* 4: shared budgets (the spend gate): budgets, reservations, the holds
     * of open reservations on each scope, and the scopes of runs. */
    ("CREATE TABLE lg_budgets ("
    "  scope TEXT PRIMARY KEY,"
    "  limit_micro INTEGER NOT NULL,"
    "  period TEXT NOT NULL CHECK (period IN ('none','daily','weekly','monthly')),"
    "  max_in_flight_micro INTEGER,"
    "  period_start_ms INTEGER NOT NULL,"
    "  spent_micro INTEGER NOT NULL,"
    "  reserved_micro INTEGER NOT NULL,"
    "  holds INTEGER NOT NULL,"
    "  next_expiry_ms INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL);"
    "CREATE TABLE lg_budget_reservations ("
    "  id TEXT PRIMARY KEY,"
    "  amount_micro INTEGER NOT NULL,"
    "  scopes TEXT NOT NULL,"
    "  run_id TEXT,"
    "  run_seq INTEGER NOT NULL,"
    "  model TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('open','settled')),"
    "  actual_micro INTEGER NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL,"
    "  settled_ms INTEGER NOT NULL);"
    "CREATE INDEX lg_budget_reservations_run ON lg_budget_reservations(run_id, run_seq)"
    "  WHERE run_id IS NOT NULL;"
    "CREATE INDEX lg_budget_reservations_expiry ON lg_budget_reservations(expires_ms);"
    "CREATE TABLE lg_budget_holds ("
    "  scope TEXT NOT NULL,"
    "  reservation_id TEXT NOT NULL,"
    "  amount_micro INTEGER NOT NULL,"
    "  expires_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (scope, reservation_id)) WITHOUT ROWID;"
    "CREATE TABLE lg_budget_run_scopes ("
    "  run_id TEXT PRIMARY KEY,"
    "  scopes TEXT NOT NULL);"),
    /* 5: each run's trace-v1 lines, written with the decision they record
     * (GET /v1/runs/{id}/trace): the newest in the run's own row
     * (trace_tail), whose page the decision writes anyway, and older ones
     * moved out by the trigger in blocks of about 1.5 KB to lg_events,
     * clustered by run. A row per line would double the pages a commit
     * writes; reading the tail's length back (RETURNING) to move it here
     * cost a sixth of bench_server's throughput, the trigger nothing that
     * bench_server can tell from noise. */
    ("ALTER TABLE lg_runs ADD COLUMN trace_tail TEXT;"
    "CREATE TABLE lg_events ("
    "  run_id TEXT NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  lines TEXT NOT NULL,"
    "  PRIMARY KEY (run_id, n)) WITHOUT ROWID;"
    "CREATE TRIGGER lg_runs_trace_tail AFTER UPDATE OF trace_tail ON lg_runs"
    "  WHEN length(CAST(NEW.trace_tail AS BLOB)) >= 1536 BEGIN"
    "  INSERT INTO lg_events (run_id, n, lines)"
    "    SELECT NEW.run_id, COALESCE(MAX(n), 0) + 1, NEW.trace_tail FROM lg_events"
    "    WHERE run_id = NEW.run_id;"
    "  UPDATE lg_runs SET trace_tail = NULL WHERE seq = NEW.seq;"
    "  END;"),
};

_Static_assert(sizeof migrations / sizeof migrations[0] == LG_STORE_SCHEMA_VERSION,
               "one migration per schema version");

enum {
  Q_OP_READ,
  Q_OP_INSERT,
  Q_OP_UPDATE,
  Q_OP_DELETE,
  Q_OP_PURGE,
  Q_OP_SETTLE,
  Q_OP_DROP_PENDING,
  Q_RUN_READ,
  Q_RUN_INSERT,
  Q_RUN_UPDATE,
  Q_RUN_TOUCH,
  Q_RUN_LIST,
  Q_DENY_PUT,
  Q_DENY_GET,
  Q_DENY_ANY,
  Q_BUD_READ,
  Q_BUD_PUT,
  Q_BUD_LIST,
  Q_HOLD_PUT,
  Q_HOLD_DROP,
  Q_HOLDS_EXPIRE,
  Q_RESV_INSERT,
  Q_RESV_READ,
  Q_RESV_OF_RUN,
  Q_RESV_OLDEST_OF_RUN,
  Q_RESV_UPDATE,
  Q_RESV_PURGE,
  Q_RUNSCOPES_PUT,
  Q_RUNSCOPES_DEL,
  Q_RUNSCOPES_GET,
  Q_EV_TAIL,
  Q_RUN_TOUCH_EV,
  Q_EV_APPEND,
  Q_EV_READ,
  Q_EV_READ_TAIL,
  Q__N
};

/* The stored budget columns, then what the hold rows say as of ?2 (the
 * rules use it only when next_expiry_ms <= ?2; SQLite's deletes leave no
 * dead rows behind, so reading it always costs little). */
#define BUD_COLS                                                                        \
  "b.scope, b.limit_micro, b.period, b.max_in_flight_micro, b.period_start_ms,"         \
  " b.spent_micro, b.reserved_micro, b.holds, b.next_expiry_ms, b.created_ms,"           \
  " b.updated_ms, COALESCE(e.lsum, 0), COALESCE(e.lcount, 0), e.lmin, COALESCE(e.ecount, 0)"
#define HOLD_STATS                                                                      \
  "(SELECT scope, SUM(CASE WHEN expires_ms > ?2 THEN amount_micro END) AS lsum,"        \
  " COUNT(CASE WHEN expires_ms > ?2 THEN 1 END) AS lcount,"                              \
  " MIN(CASE WHEN expires_ms > ?2 THEN expires_ms END) AS lmin,"                         \
  " COUNT(CASE WHEN expires_ms <= ?2 THEN 1 END) AS ecount FROM lg_budget_holds"
#define RESV_COLS                                                                       \
  "id, amount_micro, scopes, run_id, run_seq, model, state, actual_micro, created_ms,"  \
  " expires_ms, settled_ms"

static const char *const queries[Q__N] = {
    [Q_OP_READ] = "SELECT request_fp, run_id, state, result, operation_id, lease_until_ms,"
                  " created_ms, updated_ms FROM lg_operations WHERE key = ?1",
    [Q_OP_INSERT] = "INSERT INTO lg_operations (key, request_fp, run_id, state, result,"
                    " operation_id, lease_until_ms, created_ms, updated_ms)"
                    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (key) DO NOTHING",
    [Q_OP_UPDATE] = "UPDATE lg_operations SET request_fp = ?2, run_id = ?3, state = ?4,"
                    " result = ?5, operation_id = ?6, lease_until_ms = ?7, created_ms = ?8,"
                    " updated_ms = ?9 WHERE key = ?1",
    [Q_OP_DELETE] = "DELETE FROM lg_operations WHERE key = ?1",
    [Q_OP_PURGE] = "DELETE FROM lg_operations WHERE state <> 'pending' AND updated_ms <= ?1",
    [Q_OP_SETTLE] = "UPDATE lg_operations SET state = ?2, result = ?3, operation_id = ?4,"
                    " updated_ms = ?5 WHERE key = ?1 AND state = 'pending'",
    [Q_OP_DROP_PENDING] = "DELETE FROM lg_operations WHERE key = ?1 AND state = 'pending'",
    [Q_RUN_READ] = "SELECT run_id, grp, status, terminal_reason, policy, state, envelope,"
                   " created_ms, updated_ms FROM lg_runs WHERE run_id = ?1",
    [Q_RUN_INSERT] = "INSERT INTO lg_runs (run_id, grp, status, terminal_reason, policy, state,"
                     " envelope, created_ms, updated_ms)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (run_id) DO NOTHING",
    [Q_RUN_UPDATE] = "UPDATE lg_runs SET grp = ?2, status = ?3, terminal_reason = ?4,"
                     " policy = ?5, state = ?6, envelope = ?7, updated_ms = ?9"
                     " WHERE run_id = ?1",
    /* The usual decision: only the state moved. Setting no indexed column
     * leaves the indexes alone (SQLite rewrites an index entry whenever
     * an UPDATE sets one of its columns, even to the same value), so a
     * commit writes one page per run and not two. */
    [Q_RUN_TOUCH] = "UPDATE lg_runs SET state = ?6, updated_ms = ?9 WHERE run_id = ?1"
                    " AND grp IS ?2 AND status = ?3 AND terminal_reason IS ?4 AND policy IS ?5"
                    " AND envelope IS ?7",
    [Q_RUN_LIST] = "SELECT run_id, grp, status, terminal_reason, NULL, NULL, envelope,"
                   " created_ms, updated_ms FROM lg_runs"
                   " WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR terminal_reason = ?2)"
                   " AND (?3 IS NULL OR grp = ?3)"
                   " ORDER BY created_ms DESC, seq DESC LIMIT ?4",
    [Q_DENY_PUT] = "INSERT INTO lg_deny (scope, id, reason, created_ms) VALUES (?1, ?2, ?3, ?4)"
                   " ON CONFLICT (scope, id) DO UPDATE SET reason = excluded.reason,"
                   " created_ms = excluded.created_ms",
    /* Two lookups of the primary key merged in scope order: an OR of the
     * two would collect rowids and sort them in a temporary b-tree. */
    [Q_DENY_GET] = "SELECT reason, scope FROM lg_deny WHERE scope = 1 AND id = ?1"
                   " UNION ALL SELECT reason, scope FROM lg_deny WHERE scope = 2 AND id = ?2"
                   " ORDER BY 2 LIMIT 1",
    [Q_DENY_ANY] = "SELECT 1 FROM lg_deny LIMIT 1",
    [Q_BUD_READ] = "SELECT " BUD_COLS " FROM lg_budgets b LEFT JOIN " HOLD_STATS
                   " WHERE scope = ?1 GROUP BY scope) e ON e.scope = b.scope WHERE b.scope = ?1",
    [Q_BUD_PUT] = "INSERT INTO lg_budgets (scope, limit_micro, period, max_in_flight_micro,"
                  " period_start_ms, spent_micro, reserved_micro, holds, next_expiry_ms,"
                  " created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
                  " ON CONFLICT (scope) DO UPDATE SET"
                  " limit_micro = excluded.limit_micro, period = excluded.period,"
                  " max_in_flight_micro = excluded.max_in_flight_micro,"
                  " period_start_ms = excluded.period_start_ms,"
                  " spent_micro = excluded.spent_micro, reserved_micro = excluded.reserved_micro,"
                  " holds = excluded.holds, next_expiry_ms = excluded.next_expiry_ms,"
                  " updated_ms = excluded.updated_ms",
    [Q_BUD_LIST] = "SELECT " BUD_COLS " FROM lg_budgets b LEFT JOIN " HOLD_STATS
                   " WHERE ?1 IS NULL GROUP BY scope) e ON e.scope = b.scope ORDER BY b.scope",
    [Q_HOLD_PUT] = "INSERT INTO lg_budget_holds (scope, reservation_id, amount_micro, expires_ms)"
                   " VALUES (?1, ?2, ?3, ?4)",
    [Q_HOLD_DROP] = "DELETE FROM lg_budget_holds WHERE scope = ?1 AND reservation_id = ?2",
    [Q_HOLDS_EXPIRE] = "DELETE FROM lg_budget_holds WHERE scope = ?1 AND expires_ms <= ?2",
    [Q_RESV_INSERT] = "INSERT INTO lg_budget_reservations (" RESV_COLS ")"
                      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [Q_RESV_READ] = "SELECT " RESV_COLS " FROM lg_budget_reservations WHERE id = ?1",
    [Q_RESV_OF_RUN] = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                      " WHERE run_id = ?1 AND run_seq = ?2",
    [Q_RESV_OLDEST_OF_RUN] = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                             " WHERE run_id = ?1 AND state = 'open' ORDER BY run_seq LIMIT 1",
    [Q_RESV_UPDATE] = "UPDATE lg_budget_reservations SET amount_micro = ?2, scopes = ?3,"
                      " run_id = ?4, run_seq = ?5, model = ?6, state = ?7, actual_micro = ?8,"
                      " created_ms = ?9, expires_ms = ?10, settled_ms = ?11 WHERE id = ?1",
    [Q_RESV_PURGE] = "DELETE FROM lg_budget_reservations WHERE expires_ms <= ?1",
    [Q_RUNSCOPES_PUT] = "INSERT INTO lg_budget_run_scopes (run_id, scopes) VALUES (?1, ?2)"
                        " ON CONFLICT (run_id) DO UPDATE SET scopes = excluded.scopes",
    [Q_RUNSCOPES_DEL] = "DELETE FROM lg_budget_run_scopes WHERE run_id = ?1",
    [Q_EV_TAIL] = "UPDATE lg_runs SET trace_tail = COALESCE(trace_tail, '') || ?2"
                  " WHERE run_id = ?1",
    /* Q_RUN_TOUCH and Q_EV_TAIL in one: the row is written once. */
    [Q_RUN_TOUCH_EV] = "UPDATE lg_runs SET state = ?6, updated_ms = ?9,"
                       " trace_tail = COALESCE(trace_tail, '') || ?10 WHERE run_id = ?1"
                       " AND grp IS ?2 AND status = ?3 AND terminal_reason IS ?4 AND policy IS ?5"
                       " AND envelope IS ?7",
    [Q_EV_APPEND] = "INSERT INTO lg_events (run_id, n, lines)"
                    " SELECT ?1, COALESCE(MAX(n), 0) + 1, ?2 FROM lg_events WHERE run_id = ?1",
    [Q_EV_READ] = "SELECT lines FROM lg_events WHERE run_id = ?1 ORDER BY n",
    [Q_EV_READ_TAIL] = "SELECT trace_tail FROM lg_runs WHERE run_id = ?1",
    [Q_RUNSCOPES_GET] = "SELECT scopes FROM lg_budget_run_scopes WHERE run_id = ?1",
};

/* Transaction control, run for every decision (a savepoint each, a
 * transaction for each group commit): prepared on first use, not parsed
 * again every time as sqlite3_exec() would. */
enum { C_BEGIN, C_BEGIN_READ, C_COMMIT, C_ROLLBACK, C_SAVEPOINT, C_RELEASE, C_ROLLBACK_TO, C_SYNC_NORMAL, C_SYNC_FULL, C__N };
static const char *const ctl_sql[C__N] = {
    [C_BEGIN] = "BEGIN IMMEDIATE",
    [C_BEGIN_READ] = "BEGIN",
    [C_COMMIT] = "COMMIT",
    [C_ROLLBACK] = "ROLLBACK",
    [C_SAVEPOINT] = "SAVEPOINT lg_sp",
    [C_RELEASE] = "RELEASE lg_sp",
    [C_ROLLBACK_TO] = "ROLLBACK TO lg_sp",
    [C_SYNC_NORMAL] = "PRAGMA synchronous=NORMAL",
    [C_SYNC_FULL] = "PRAGMA synchronous=FULL",
};

/* The run cache: rows of runs read or written in this connection's
 * transactions, by run_id (direct-mapped: a run takes the slot of its
 * hash). See "the run cache" below. */
#define CACHE_SLOTS 512

typedef struct sq {
  sqlite3 *db;             /* the connection */
  sqlite3_stmt *q[Q__N];   /* prepared once */
  sqlite3_stmt *ctl[C__N]; /* prepared on first use */
  int sync;                /* the synchronous level set now: 1 NORMAL, 2 FULL */
  int need_sync;           /* a ledger write joined this run transaction */
  int deny_empty;          /* in the open transaction: 1 lg_deny is empty, 0 not, -1 unknown */
  int in_txn;              /* a transaction of s_begin is open */
  int cache_valid;         /* the run cache is the database as of data version cache_version */
  unsigned cache_version;  /* SQLITE_FCNTL_DATA_VERSION then */
  lg_run_record_t cache[CACHE_SLOTS]; /* run_id NULL in an empty slot */
} sq_t;

/* Translates an SQLite result code at the edge. */
static int sq_fail(lg_store_t *s, int rc, const char *what, lg_error_t *err) {
  sq_t *q = s->impl;
  int prim = rc & 0xff;
  int code = prim == SQLITE_BUSY || prim == SQLITE_LOCKED ? LG_EBUSY
             : prim == SQLITE_NOMEM                       ? LG_ENOMEM
                                                          : LG_ESTORE;
  const char *msg = q && q->db ? sqlite3_errmsg(q->db) : sqlite3_errstr(rc);
  if (code == LG_EBUSY)
    return lg__err(err, code, NULL, -1, "%s: the database is locked by another writer (%s)",
                   what, msg);
  return lg__err(err, code, NULL, -1, "%s: %s", what, msg);
}

static int sq_exec(lg_store_t *s, const char *sql, lg_error_t *err) {
  sq_t *q = s->impl;
  int rc = sqlite3_exec(q->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? 0 : sq_fail(s, rc, sql, err);
}

/* Runs transaction control statement `which`. */
static int sq_ctl(lg_store_t *s, int which, lg_error_t *err) {
  sq_t *q = s->impl;
  int rc = SQLITE_OK;
  if (!q->ctl[which]) rc = sqlite3_prepare_v2(q->db, ctl_sql[which], -1, &q->ctl[which], NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(q->ctl[which]);
    int reset = sqlite3_reset(q->ctl[which]);
    rc = rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : reset != SQLITE_OK ? reset : rc;
  }
  return rc == SQLITE_OK ? 0 : sq_fail(s, rc, ctl_sql[which], err);
}

static void finalize_all(sq_t *q) {
  for (int i = 0; i < Q__N; i++) sqlite3_finalize(q->q[i]);
  for (int i = 0; i < C__N; i++) sqlite3_finalize(q->ctl[i]);
}

static int set_sync(lg_store_t *s, int level, lg_error_t *err) {
  sq_t *q = s->impl;
  if (q->sync == level) return 0;
  int rc = sq_ctl(s, level == 2 ? C_SYNC_FULL : C_SYNC_NORMAL, err);
  if (!rc) q->sync = level;
  return rc;
}

/* The statement, or NULL with err filled when the schema lacks its table
 * (only a store opened at an old version for a migration test). */
static sqlite3_stmt *stmt(lg_store_t *s, int which, lg_error_t *err) {
  sq_t *q = s->impl;
  if (!q->q[which])
    lg__err(err, LG_ESTORE, NULL, -1, "the store was opened at an old schema version");
  return q->q[which];
}

static void bind_text(sqlite3_stmt *st, int i, const char *v) {
  if (v) sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, i);
}

static void bind_blob(sqlite3_stmt *st, int i, const char *v, size_t n) {
  if (v) sqlite3_bind_blob64(st, i, v, n, SQLITE_STATIC);
  else sqlite3_bind_null(st, i);
}

/* A column as a new string (NULL for SQL NULL); *ok 0 on out-of-memory. */
static char *col_str(sqlite3_stmt *st, int i, size_t *len, int *ok) {
  if (sqlite3_column_type(st, i) == SQLITE_NULL) {
    if (len) *len = 0;
    return NULL;
  }
  const void *p = sqlite3_column_blob(st, i);
  size_t n = (size_t)sqlite3_column_bytes(st, i);
  char *r = lg__strndup(p ? p : "", n);
  if (!r) *ok = 0;
  if (len) *len = n;
  return r;
}

/* Runs a prepared statement that returns no rows; *changes gets the rows
 * changed. Resets it whatever happens. */
static int run_stmt(lg_store_t *s, int which, int *changes, lg_error_t *err) {
  sq_t *q = s->impl;
  sqlite3_stmt *st = q->q[which];
  /* A write outside a transaction is a ledger write: durable. */
  int out = sqlite3_get_autocommit(q->db) ? set_sync(s, 2, err) : 0;
  if (out) {
    sqlite3_clear_bindings(st);
    return out;
  }
  int rc = sqlite3_step(st);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) out = sq_fail(s, rc, "write", err);
  else if (changes) *changes = sqlite3_changes(q->db);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

/* ---- opening and the schema ---- */

static int read_version(lg_store_t *s, int *version, lg_error_t *err) {
  sq_t *q = s->impl;
  sqlite3_stmt *st = NULL;
  *version = 0;
  int rc = sqlite3_prepare_v2(q->db, "SELECT COALESCE(MAX(version), 0) FROM lg_schema_version",
                              -1, &st, NULL);
  if (rc != SQLITE_OK) {
    /* No version table yet: a new file. */
    if (strstr(sqlite3_errmsg(q->db), "no such table")) return 0;
    return sq_fail(s, rc, "reading the schema version", err);
  }
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *version = sqlite3_column_int(st, 0);
  int out = rc == SQLITE_ROW ? 0 : sq_fail(s, rc, "reading the schema version", err);
  sqlite3_finalize(st);
  return out;
}

static int migrate(lg_store_t *s, lg_error_t *err) {
  int target = lg__store_schema_target;
  int version = 0;
  int rc = read_version(s, &version, err);
  if (rc) return rc;
  if (version == target) return 0;
  if ((rc = sq_exec(s, "BEGIN IMMEDIATE", err))) return rc;
  rc = sq_exec(s,
               "CREATE TABLE IF NOT EXISTS lg_schema_version ("
               "  version INTEGER PRIMARY KEY, applied_ms INTEGER NOT NULL)",
               err);
  if (!rc) rc = read_version(s, &version, err); /* again, under the lock */
  if (!rc && version > LG_STORE_SCHEMA_VERSION)
    rc = lg__err(err, LG_ESTORE, NULL, -1,
                 "the database has schema version %d, newer than this release's %d: "
                 "use a newer loopguard",
                 version, LG_STORE_SCHEMA_VERSION);
  for (int v = version; !rc && v < target; v++) {
    char sql[160];
    rc = sq_exec(s, migrations[v], err);
    snprintf(sql, sizeof sql,
             "INSERT INTO lg_schema_version (version, applied_ms)"
             " VALUES (%d, CAST(strftime('%%s','now') AS INTEGER) * 1000)",
             v + 1);
    if (!rc) rc = sq_exec(s, sql, err);
  }
  if (rc) {
    sq_exec(s, "ROLLBACK", NULL);
    return rc;
  }
  return sq_exec(s, "COMMIT", err);
}

/* ---- the run cache ----
 *
 * A decision reads its run's row and writes it back, and the server's
 * committer makes tens of thousands a second, each run's after the
 * previous one: keeping the rows it wrote saves reading them again (the
 * SELECT was a sixth of the committer's time). The cache serves reads only
 * inside this connection's write transactions (BEGIN IMMEDIATE: no other
 * writer until it ends), and only while it is the database: SQLite's data
 * version (SQLITE_FCNTL_DATA_VERSION) moves with every commit, this
 * connection's and any other's, in this process or another. The version
 * seen after this connection's own commit is kept; when a transaction
 * begins at another version, someone else wrote, and the cache is
 * emptied. A rollback (of the transaction or of a savepoint) empties it
 * too, as it may hold rows that are undone. Writes outside a transaction
 * do not touch it (their commit moves the version). */

static unsigned data_version(sq_t *q) {
  unsigned v = 0;
  if (sqlite3_file_control(q->db, "main", SQLITE_FCNTL_DATA_VERSION, &v) != SQLITE_OK) return 0;
  return v;
}

static void cache_clear(sq_t *q) {
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (q->cache[i].run_id) lg_run_record_clear(&q->cache[i]);
}

/* At the start of a transaction: empties the cache unless nobody else
 * has committed since this connection did. */
static void cache_check(sq_t *q) {
  unsigned v = data_version(q);
  if (!q->cache_valid || v != q->cache_version) {
    cache_clear(q);
    q->cache_version = v;
    q->cache_valid = 1;
  }
}

/* After this connection's commit: the cache is the database as of now. */
static void cache_committed(sq_t *q) {
  if (q->cache_valid) q->cache_version = data_version(q);
}

static lg_run_record_t *cache_slot(sq_t *q, const char *run_id) {
  return &q->cache[lg__hash_str(run_id) % CACHE_SLOTS];
}

/* The cached row of run_id, or NULL. */
static const lg_run_record_t *cache_get(sq_t *q, const char *run_id) {
  if (!q->in_txn || !q->cache_valid) return NULL;
  lg_run_record_t *r = cache_slot(q, run_id);
  return r->run_id && !strcmp(r->run_id, run_id) ? r : NULL;
}

/* rec is run_id's row now (read or written in this transaction). */
static void cache_put(sq_t *q, const lg_run_record_t *rec) {
  if (!q->in_txn || !q->cache_valid) return;
  lg_run_record_t *r = cache_slot(q, rec->run_id);
  lg_run_record_clear(r);
  if (lg__run_record_copy(r, rec)) q->cache_valid = 0; /* out of memory: forget it all */
}

/* rec was written over run_id's row, which keeps its created_ms (an
 * UPDATE never sets it): known only when the row is cached already. */
static void cache_update(sq_t *q, const lg_run_record_t *rec) {
  const lg_run_record_t *old = cache_get(q, rec->run_id);
  if (!old) return;
  lg_run_record_t r = *rec;
  r.created_ms = old->created_ms;
  cache_put(q, &r);
}

/* run_id's row changed in a way not known here. */
static void cache_drop(sq_t *q, const char *run_id) {
  lg_run_record_t *r = cache_slot(q, run_id);
  if (r->run_id && !strcmp(r->run_id, run_id)) lg_run_record_clear(r);
}

static int s_open(lg_store_t *s, const char *path, lg_error_t *err) {
  if (!path || !*path)
    return lg__err(err, LG_EINVAL, "url", -1, "sqlite: needs a file name (sqlite:PATH)");
  sq_t *q = lg__calloc(1, sizeof *q);
  if (!q) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  s->impl = q;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX;
  if (!s->opts.no_create) flags |= SQLITE_OPEN_CREATE;
  int rc = sqlite3_open_v2(path, &q->db, flags, NULL);
  /* Without SQLITE_OPEN_CREATE a missing file is SQLITE_CANTOPEN; say
   * "not found" only when it really is not there (not for a permission). */
  if (rc == SQLITE_CANTOPEN && s->opts.no_create && access(path, F_OK) != 0 && errno == ENOENT) {
    rc = lg__err(err, LG_ENOTFOUND, "url", -1, "no store at %s", path);
    goto fail;
  }
  if (rc != SQLITE_OK) {
    rc = sq_fail(s, rc, "opening the database", err);
    goto fail;
  }
  sqlite3_extended_result_codes(q->db, 1);
  sqlite3_busy_timeout(q->db, s->opts.busy_timeout_ms);
  /* Switching to WAL needs a moment of exclusive access, and SQLite does
   * not always wait for it through the busy handler: retry until the
   * busy timeout is spent. */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(q->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    int wal = rc == SQLITE_ROW &&
              !sqlite3_stricmp((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    if (wal) break;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long waited = (long)((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    if ((rc & 0xff) != SQLITE_BUSY || waited >= s->opts.busy_timeout_ms) {
      rc = rc == SQLITE_ROW ? lg__err(err, LG_ESTORE, NULL, -1,
                                      "the database cannot use WAL mode (is it on a "
                                      "network file system or read-only?)")
                            : sq_fail(s, rc, "switching to WAL mode", err);
      goto fail;
    }
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  q->sync = 0;
  q->deny_empty = -1;
  if ((rc = set_sync(s, 2, err))) goto fail;
  if ((rc = migrate(s, err))) goto fail;
  if (lg__store_schema_target == LG_STORE_SCHEMA_VERSION) {
    for (int i = 0; i < Q__N; i++) {
      rc = sqlite3_prepare_v3(q->db, queries[i], -1, SQLITE_PREPARE_PERSISTENT, &q->q[i], NULL);
      if (rc != SQLITE_OK) {
        rc = sq_fail(s, rc, "preparing a statement", err);
        goto fail;
      }
    }
  } else {
    /* An old schema written for a migration test: only the ledger. */
    for (int i = Q_OP_READ; i <= Q_OP_DROP_PENDING; i++) {
      rc = sqlite3_prepare_v3(q->db, queries[i], -1, SQLITE_PREPARE_PERSISTENT, &q->q[i], NULL);
      if (rc != SQLITE_OK) {
        rc = sq_fail(s, rc, "preparing a statement", err);
        goto fail;
      }
    }
  }
  return 0;
fail:
  finalize_all(q);
  sqlite3_close(q->db);
  lg__free(q);
  s->impl = NULL;
  return rc;
}

static void s_close(lg_store_t *s) {
  sq_t *q = s->impl;
  if (!q) return;
  if (!sqlite3_get_autocommit(q->db)) sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
  cache_clear(q);
  finalize_all(q);
  sqlite3_close(q->db);
  lg__free(q);
  s->impl = NULL;
}

static int s_schema_version(lg_store_t *s, int *version, lg_error_t *err) {
  return read_version(s, version, err);
}

/* ---- transactions ---- */

/* Makes the WAL durable now: what synchronous=FULL does at a commit. A
 * run transaction runs at NORMAL, and SQLite does not allow changing the
 * level inside a transaction; when a ledger write joined one, this is
 * called right after its COMMIT, before anything is acknowledged. */
static int wal_sync(lg_store_t *s, lg_error_t *err) {
  sq_t *q = s->impl;
  sqlite3_file *wal = NULL;
  int rc = sqlite3_file_control(q->db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal);
  if (rc != SQLITE_OK || !wal || !wal->pMethods) return sq_fail(s, rc, "finding the WAL", err);
  rc = wal->pMethods->xSync(wal, SQLITE_SYNC_NORMAL);
  return rc == SQLITE_OK ? 0 : sq_fail(s, rc, "syncing the WAL", err);
}

static int s_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  sq_t *q = s->impl;
  int rc;
  if (nested) {
    if (upgrade) q->need_sync = 1;
    return sq_ctl(s, C_SAVEPOINT, err);
  }
  q->need_sync = 0;
  q->deny_empty = -1;
  if ((rc = set_sync(s, kind == LG__TXN_RUN ? 1 : 2, err))) return rc;
  if ((rc = lg__store_fault_at(s, "sqlite.begin", err))) return rc;
  if ((rc = sq_ctl(s, C_BEGIN, err))) return rc;
  q->in_txn = 1;
  cache_check(q);
  return 0;
}

static int s_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  sq_t *q = s->impl;
  int rc;
  if (nested) {
    if (!commit) q->cache_valid = 0; /* it may hold what is undone now */
    if (!commit && (rc = sq_ctl(s, C_ROLLBACK_TO, err))) return rc;
    return sq_ctl(s, C_RELEASE, err);
  }
  q->in_txn = 0;
  if (commit) {
    rc = sq_ctl(s, C_COMMIT, err);
    if (rc && !sqlite3_get_autocommit(q->db)) sq_ctl(s, C_ROLLBACK, NULL);
    if (rc) q->cache_valid = 0;
    else cache_committed(q);
    if (!rc && q->need_sync && q->sync != 2) rc = wal_sync(s, err);
  } else {
    q->cache_valid = 0;
    rc = sqlite3_get_autocommit(q->db) ? 0 : sq_ctl(s, C_ROLLBACK, err);
  }
  q->need_sync = 0;
  /* synchronous stays as this transaction set it: the server's committer
   * runs one run transaction after another, and setting it is a PRAGMA
   * that SQLite parses again every time. The next ledger transaction, or
   * write outside a transaction (run_stmt), sets it back to FULL. */
  return rc;
}

/* ---- ledger rows ---- */

static const char *state_name(int st) {
  return st == LG__OP_COMMITTED ? "committed" : st == LG__OP_FAILED ? "failed" : "pending";
}
static int state_of(const char *s) {
  return !s ? 0 : !strcmp(s, "committed") ? LG__OP_COMMITTED
                  : !strcmp(s, "failed")  ? LG__OP_FAILED
                                          : LG__OP_PENDING;
}

static int s_op_read(lg_store_t *s, const char *key, int lock, lg__op_row_t *row, int *found,
                     lg_error_t *err) {
  (void)lock; /* a transaction here already holds the write lock */
  sq_t *q = s->impl;
  sqlite3_stmt *st = q->q[Q_OP_READ];
  bind_text(st, 1, key);
  int rc = sqlite3_step(st);
  int out = 0, ok = 1;
  *found = 0;
  if (rc == SQLITE_ROW) {
    *found = 1;
    memset(row, 0, sizeof *row);
    row->key = lg__strdup(key);
    if (!row->key) ok = 0;
    row->request_fp = col_str(st, 0, NULL, &ok);
    row->run_id = col_str(st, 1, NULL, &ok);
    row->state = state_of((const char *)sqlite3_column_text(st, 2));
    row->result = col_str(st, 3, &row->result_len, &ok);
    row->operation_id = col_str(st, 4, NULL, &ok);
    row->lease_until_ms = sqlite3_column_int64(st, 5);
    row->created_ms = sqlite3_column_int64(st, 6);
    row->updated_ms = sqlite3_column_int64(st, 7);
    if (!row->request_fp) ok = 0;
    if (!ok) {
      lg__op_row_clear(row);
      out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading the ledger", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

static void bind_op(sqlite3_stmt *st, const lg__op_row_t *r) {
  bind_text(st, 1, r->key);
  bind_text(st, 2, r->request_fp);
  bind_text(st, 3, r->run_id);
  bind_text(st, 4, state_name(r->state));
  bind_blob(st, 5, r->result, r->result_len);
  bind_text(st, 6, r->operation_id);
  sqlite3_bind_int64(st, 7, r->lease_until_ms);
  sqlite3_bind_int64(st, 8, r->created_ms);
  sqlite3_bind_int64(st, 9, r->updated_ms);
}

static int s_op_insert(lg_store_t *s, const lg__op_row_t *row, int *inserted, lg_error_t *err) {
  sq_t *q = s->impl;
  int changes = 0;
  bind_op(q->q[Q_OP_INSERT], row);
  int rc = run_stmt(s, Q_OP_INSERT, &changes, err);
  *inserted = !rc && changes > 0;
  return rc;
}

static int s_op_update(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err) {
  sq_t *q = s->impl;
  bind_op(q->q[Q_OP_UPDATE], row);
  return run_stmt(s, Q_OP_UPDATE, NULL, err);
}

static int s_op_delete(lg_store_t *s, const char *key, lg_error_t *err) {
  sq_t *q = s->impl;
  bind_text(q->q[Q_OP_DELETE], 1, key);
  return run_stmt(s, Q_OP_DELETE, NULL, err);
}

static int s_op_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  sq_t *q = s->impl;
  int changes = 0;
  sqlite3_bind_int64(q->q[Q_OP_PURGE], 1, before_ms);
  int rc = run_stmt(s, Q_OP_PURGE, &changes, err);
  *purged = rc ? 0 : changes;
  return rc;
}

static int s_op_settle(lg_store_t *s, const char *key, int state, const char *result,
                       size_t result_len, const char *operation_id, int64_t now_ms,
                       int *changed, lg_error_t *err) {
  sq_t *q = s->impl;
  *changed = 0;
  if (!state) {
    bind_text(q->q[Q_OP_DROP_PENDING], 1, key);
    return run_stmt(s, Q_OP_DROP_PENDING, changed, err);
  }
  sqlite3_stmt *st = q->q[Q_OP_SETTLE];
  bind_text(st, 1, key);
  bind_text(st, 2, state_name(state));
  bind_blob(st, 3, result, result_len);
  bind_text(st, 4, operation_id);
  sqlite3_bind_int64(st, 5, now_ms);
  return run_stmt(s, Q_OP_SETTLE, changed, err);
}

/* ---- runs ---- */

static int read_run_row(sqlite3_stmt *st, lg_run_record_t *rec) {
  int ok = 1;
  memset(rec, 0, sizeof *rec);
  rec->run_id = col_str(st, 0, NULL, &ok);
  rec->group = col_str(st, 1, NULL, &ok);
  const char *status = (const char *)sqlite3_column_text(st, 2);
  rec->stopped = status && !strcmp(status, "stopped");
  rec->terminal_reason = col_str(st, 3, NULL, &ok);
  rec->policy_json = col_str(st, 4, NULL, &ok);
  rec->state = col_str(st, 5, &rec->state_len, &ok);
  rec->envelope_json = col_str(st, 6, NULL, &ok);
  rec->created_ms = sqlite3_column_int64(st, 7);
  rec->updated_ms = sqlite3_column_int64(st, 8);
  if (!ok || !rec->run_id) {
    lg_run_record_clear(rec);
    return LG_ENOMEM;
  }
  return 0;
}

static int s_run_read(lg_store_t *s, const char *run_id, int lock, lg_run_record_t *rec,
                      int *found, lg_error_t *err) {
  (void)lock;
  sq_t *q = s->impl;
  *found = 0;
  const lg_run_record_t *hit = cache_get(q, run_id);
  if (hit) {
    *found = 1;
    return lg__run_record_copy(rec, hit) ? lg__err(err, LG_ENOMEM, NULL, -1, "out of memory") : 0;
  }
  sqlite3_stmt *st = stmt(s, Q_RUN_READ, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  int rc = sqlite3_step(st);
  int out = 0;
  if (rc == SQLITE_ROW) {
    *found = 1;
    if (read_run_row(st, rec)) out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    else cache_put(q, rec);
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading a run", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

static void bind_run(sqlite3_stmt *st, const lg_run_record_t *r) {
  bind_text(st, 1, r->run_id);
  bind_text(st, 2, r->group);
  bind_text(st, 3, r->stopped ? "stopped" : "active");
  bind_text(st, 4, r->terminal_reason);
  bind_text(st, 5, r->policy_json);
  bind_blob(st, 6, r->state, r->state_len);
  bind_text(st, 7, r->envelope_json);
  sqlite3_bind_int64(st, 8, r->created_ms);
  sqlite3_bind_int64(st, 9, r->updated_ms);
}

static int s_run_insert(lg_store_t *s, const lg_run_record_t *rec, int *inserted,
                        lg_error_t *err) {
  sq_t *q = s->impl;
  int changes = 0;
  if (!stmt(s, Q_RUN_INSERT, err)) return LG_ESTORE;
  bind_run(q->q[Q_RUN_INSERT], rec);
  int rc = run_stmt(s, Q_RUN_INSERT, &changes, err);
  *inserted = !rc && changes > 0;
  if (*inserted) cache_put(q, rec);
  else cache_drop(q, rec->run_id);
  return rc;
}

static int s_run_update(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                        lg_error_t *err) {
  sq_t *q = s->impl;
  int changes = 0;
  if (!stmt(s, Q_RUN_TOUCH, err) || !stmt(s, Q_RUN_UPDATE, err)) return LG_ESTORE;
  bind_run(q->q[Q_RUN_TOUCH], rec);
  int rc = run_stmt(s, Q_RUN_TOUCH, &changes, err);
  if (!rc && changes == 0) { /* something else changed too (or no row) */
    bind_run(q->q[Q_RUN_UPDATE], rec);
    rc = run_stmt(s, Q_RUN_UPDATE, &changes, err);
  }
  *updated = !rc && changes > 0;
  if (*updated) cache_update(q, rec);
  else cache_drop(q, rec->run_id);
  return rc;
}

static int s_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb, void *ud,
                      lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_RUN_LIST, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, f->status);
  bind_text(st, 2, f->reason);
  bind_text(st, 3, f->group);
  sqlite3_bind_int64(st, 4, f->limit ? (sqlite3_int64)f->limit : -1);
  /* Read everything first: the callback may write to the store. */
  lg_run_record_t *all = NULL;
  size_t n = 0, cap = 0;
  int rc, out = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      lg_run_record_t *a = lg__realloc(all, nc * sizeof *a);
      if (!a) {
        out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
        break;
      }
      all = a;
      cap = nc;
    }
    if (read_run_row(st, &all[n])) {
      out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
    n++;
  }
  if (!out && rc != SQLITE_DONE) out = sq_fail(s, rc, "listing runs", err);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  for (size_t i = 0; i < n && !out; i++) out = cb(ud, &all[i]);
  for (size_t i = 0; i < n; i++) lg_run_record_clear(&all[i]);
  lg__free(all);
  return out;
}

/* ---- deny rules ---- */

static int s_deny_put(lg_store_t *s, int scope, const char *id, const char *reason,
                      int64_t now_ms, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_DENY_PUT, err);
  if (!st) return LG_ESTORE;
  ((sq_t *)s->impl)->deny_empty = 0;
  sqlite3_bind_int(st, 1, scope);
  bind_text(st, 2, id);
  bind_text(st, 3, reason);
  sqlite3_bind_int64(st, 4, now_ms);
  return run_stmt(s, Q_DENY_PUT, NULL, err);
}

/* Whether lg_deny has no row, as of the open transaction, asked once per
 * transaction: the server's committer checks the kill switch for every
 * decision of a group commit, and there is seldom a rule at all. Outside
 * a transaction (each statement its own snapshot), never known. */
static int deny_none(lg_store_t *s, int *none, lg_error_t *err) {
  sq_t *q = s->impl;
  *none = 0;
  if (!q->in_txn) return 0;
  if (q->deny_empty < 0) {
    sqlite3_stmt *st = stmt(s, Q_DENY_ANY, err);
    if (!st) return LG_ESTORE;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return sq_fail(s, rc, "reading deny rules", err);
    q->deny_empty = rc == SQLITE_DONE;
  }
  *none = q->deny_empty;
  return 0;
}

static int s_deny_get(lg_store_t *s, const char *run_id, const char *group, int *found,
                      char **reason, lg_error_t *err) {
  *found = 0;
  *reason = NULL;
  int none, rc = deny_none(s, &none, err);
  if (rc || none) return rc;
  sqlite3_stmt *st = stmt(s, Q_DENY_GET, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  bind_text(st, 2, group);
  rc = sqlite3_step(st);
  int out = 0, ok = 1;
  if (rc == SQLITE_ROW) {
    *found = 1;
    *reason = col_str(st, 0, NULL, &ok);
    if (!ok) out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading deny rules", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

/* ---- budgets ---- */

static const char *const period_names[] = {"none", "daily", "weekly", "monthly"};

static int period_of(const char *v) {
  for (int i = 0; i < 4; i++)
    if (v && !strcmp(v, period_names[i])) return i;
  return 0;
}

/* Reads a row of BUD_COLS. */
static int read_bud_row(sqlite3_stmt *st, lg__bud_row_t *r) {
  int ok = 1;
  memset(r, 0, sizeof *r);
  r->scope = col_str(st, 0, NULL, &ok);
  r->limit_micro = sqlite3_column_int64(st, 1);
  r->period = period_of((const char *)sqlite3_column_text(st, 2));
  r->max_in_flight_micro =
      sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 3);
  r->period_start_ms = sqlite3_column_int64(st, 4);
  r->spent_micro = sqlite3_column_int64(st, 5);
  r->reserved_micro = sqlite3_column_int64(st, 6);
  r->holds = sqlite3_column_int64(st, 7);
  r->next_expiry_ms = sqlite3_column_int64(st, 8);
  r->created_ms = sqlite3_column_int64(st, 9);
  r->updated_ms = sqlite3_column_int64(st, 10);
  r->live_micro = sqlite3_column_int64(st, 11);
  r->live_holds = sqlite3_column_int64(st, 12);
  r->live_min_expiry_ms =
      sqlite3_column_type(st, 13) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 13);
  r->expired_holds = sqlite3_column_int64(st, 14);
  if (!ok || !r->scope) {
    lg__bud_row_clear(r);
    return LG_ENOMEM;
  }
  return 0;
}

static int s_bud_read(lg_store_t *s, const char *scope, int lock, int64_t now_ms,
                      lg__bud_row_t *row, int *found, lg_error_t *err) {
  (void)lock; /* a transaction here already holds the write lock */
  sqlite3_stmt *st = stmt(s, Q_BUD_READ, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, scope);
  sqlite3_bind_int64(st, 2, now_ms);
  int rc = sqlite3_step(st), out = 0;
  *found = 0;
  if (rc == SQLITE_ROW) {
    *found = 1;
    if (read_bud_row(st, row)) out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading a budget", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

static int s_bud_read_drop(lg_store_t *s, const char *scope, int64_t now_ms, const char *id,
                           lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err) {
  *dropped = 0;
  int rc = s_bud_read(s, scope, 1, now_ms, row, found, err);
  if (rc || !*found) return rc;
  sqlite3_stmt *st = stmt(s, Q_HOLD_DROP, err);
  if (!st) rc = LG_ESTORE;
  if (!rc) {
    bind_text(st, 1, scope);
    bind_text(st, 2, id);
    rc = run_stmt(s, Q_HOLD_DROP, dropped, err);
  }
  if (rc) {
    lg__bud_row_clear(row);
    *found = 0;
  }
  *dropped = *dropped > 0;
  return rc;
}

static int s_bud_put(lg_store_t *s, const lg__bud_row_t *r, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_BUD_PUT, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, r->scope);
  sqlite3_bind_int64(st, 2, r->limit_micro);
  bind_text(st, 3, period_names[r->period & 3]);
  if (r->max_in_flight_micro >= 0) sqlite3_bind_int64(st, 4, r->max_in_flight_micro);
  else sqlite3_bind_null(st, 4);
  sqlite3_bind_int64(st, 5, r->period_start_ms);
  sqlite3_bind_int64(st, 6, r->spent_micro);
  sqlite3_bind_int64(st, 7, r->reserved_micro);
  sqlite3_bind_int64(st, 8, r->holds);
  sqlite3_bind_int64(st, 9, r->next_expiry_ms);
  sqlite3_bind_int64(st, 10, r->created_ms);
  sqlite3_bind_int64(st, 11, r->updated_ms);
  return run_stmt(s, Q_BUD_PUT, NULL, err);
}

static int s_bud_list(lg_store_t *s, int64_t now_ms, int (*cb)(void *, const lg__bud_row_t *),
                      void *ud, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_BUD_LIST, err);
  if (!st) return LG_ESTORE;
  sqlite3_bind_null(st, 1);
  sqlite3_bind_int64(st, 2, now_ms);
  /* Read everything first: the callback may use the store. */
  lg__bud_row_t *all = NULL;
  size_t n = 0, cap = 0;
  int rc, out = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      lg__bud_row_t *a = lg__realloc(all, nc * sizeof *a);
      if (!a) {
        out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
        break;
      }
      all = a;
      cap = nc;
    }
    if (read_bud_row(st, &all[n])) {
      out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
    n++;
  }
  if (!out && rc != SQLITE_DONE) out = sq_fail(s, rc, "listing budgets", err);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  for (size_t i = 0; i < n && !out; i++) out = cb(ud, &all[i]);
  for (size_t i = 0; i < n; i++) lg__bud_row_clear(&all[i]);
  lg__free(all);
  return out;
}

static int s_hold_put(lg_store_t *s, const char *scope, const char *id, int64_t amount,
                      int64_t expires_ms, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_HOLD_PUT, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, scope);
  bind_text(st, 2, id);
  sqlite3_bind_int64(st, 3, amount);
  sqlite3_bind_int64(st, 4, expires_ms);
  return run_stmt(s, Q_HOLD_PUT, NULL, err);
}

static int s_holds_expire(lg_store_t *s, const char *scope, int64_t now_ms, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_HOLDS_EXPIRE, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, scope);
  sqlite3_bind_int64(st, 2, now_ms);
  return run_stmt(s, Q_HOLDS_EXPIRE, NULL, err);
}

static void bind_resv(sqlite3_stmt *st, const lg__resv_row_t *r) {
  bind_text(st, 1, r->id);
  sqlite3_bind_int64(st, 2, r->amount_micro);
  bind_text(st, 3, r->scopes);
  bind_text(st, 4, r->run_id);
  sqlite3_bind_int64(st, 5, r->run_seq);
  bind_text(st, 6, r->model);
  bind_text(st, 7, r->settled ? "settled" : "open");
  sqlite3_bind_int64(st, 8, r->actual_micro);
  sqlite3_bind_int64(st, 9, r->created_ms);
  sqlite3_bind_int64(st, 10, r->expires_ms);
  sqlite3_bind_int64(st, 11, r->settled_ms);
}

static int s_resv_insert(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_RESV_INSERT, err);
  if (!st) return LG_ESTORE;
  bind_resv(st, r);
  int rc = sqlite3_step(st), out = 0;
  if ((rc & 0xff) == SQLITE_CONSTRAINT)
    out = lg__err(err, LG_ECONFLICT, "reservation_id", -1, "reservation \"%s\" exists already",
                  r->id);
  else if (rc != SQLITE_DONE)
    out = sq_fail(s, rc, "writing a reservation", err);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

/* Steps a SELECT of RESV_COLS into *row. */
static int read_resv(lg_store_t *s, int which, lg__resv_row_t *row, int *found, lg_error_t *err) {
  sqlite3_stmt *st = s ? ((sq_t *)s->impl)->q[which] : NULL;
  int rc = sqlite3_step(st), out = 0, ok = 1;
  *found = 0;
  if (rc == SQLITE_ROW) {
    *found = 1;
    memset(row, 0, sizeof *row);
    row->id = col_str(st, 0, NULL, &ok);
    row->amount_micro = sqlite3_column_int64(st, 1);
    row->scopes = col_str(st, 2, NULL, &ok);
    row->run_id = col_str(st, 3, NULL, &ok);
    row->run_seq = sqlite3_column_int64(st, 4);
    row->model = col_str(st, 5, NULL, &ok);
    const char *state = (const char *)sqlite3_column_text(st, 6);
    row->settled = state && !strcmp(state, "settled");
    row->actual_micro = sqlite3_column_int64(st, 7);
    row->created_ms = sqlite3_column_int64(st, 8);
    row->expires_ms = sqlite3_column_int64(st, 9);
    row->settled_ms = sqlite3_column_int64(st, 10);
    if (!ok || !row->id || !row->scopes) {
      lg__resv_row_clear(row);
      out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading a reservation", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

static int s_resv_read(lg_store_t *s, const char *id, int lock, lg__resv_row_t *row,
                       int *found, lg_error_t *err) {
  (void)lock;
  sqlite3_stmt *st = stmt(s, Q_RESV_READ, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, id);
  return read_resv(s, Q_RESV_READ, row, found, err);
}

static int s_resv_of_run(lg_store_t *s, const char *run_id, int64_t run_seq, int lock,
                         lg__resv_row_t *row, int *found, lg_error_t *err) {
  (void)lock;
  int which = run_seq > 0 ? Q_RESV_OF_RUN : Q_RESV_OLDEST_OF_RUN;
  sqlite3_stmt *st = stmt(s, which, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  if (run_seq > 0) sqlite3_bind_int64(st, 2, run_seq);
  return read_resv(s, which, row, found, err);
}

static int s_resv_update(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_RESV_UPDATE, err);
  if (!st) return LG_ESTORE;
  bind_resv(st, r);
  return run_stmt(s, Q_RESV_UPDATE, NULL, err);
}

static int s_resv_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_RESV_PURGE, err);
  int changes = 0;
  if (!st) return LG_ESTORE;
  sqlite3_bind_int64(st, 1, before_ms);
  int rc = run_stmt(s, Q_RESV_PURGE, &changes, err);
  *purged = rc ? 0 : changes;
  return rc;
}

static int s_runscopes_put(lg_store_t *s, const char *run_id, const char *scopes,
                           lg_error_t *err) {
  int which = scopes && *scopes ? Q_RUNSCOPES_PUT : Q_RUNSCOPES_DEL;
  sqlite3_stmt *st = stmt(s, which, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  if (which == Q_RUNSCOPES_PUT) bind_text(st, 2, scopes);
  return run_stmt(s, which, NULL, err);
}

static int s_runscopes_get(lg_store_t *s, const char *run_id, char **scopes, int *found,
                           lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, Q_RUNSCOPES_GET, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  int rc = sqlite3_step(st), out = 0, ok = 1;
  *found = 0;
  *scopes = NULL;
  if (rc == SQLITE_ROW) {
    *found = 1;
    *scopes = col_str(st, 0, NULL, &ok);
    if (!ok) out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (rc != SQLITE_DONE) {
    out = sq_fail(s, rc, "reading a run's scopes", err);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return out;
}

static int s_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                       lg_error_t *err);

/* The usual decision: the state and the trace tail in one UPDATE (the
 * lg_runs_trace_tail trigger moves a long tail to lg_events). */
static int s_run_update_ev(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                           size_t len, int *updated, lg_error_t *err) {
  sq_t *q = s->impl;
  *updated = 0;
  sqlite3_stmt *st = stmt(s, Q_RUN_TOUCH_EV, err);
  if (!st) return LG_ESTORE;
  bind_run(st, rec);
  sqlite3_bind_text64(st, 10, lines, len, SQLITE_STATIC, SQLITE_UTF8);
  int changes = 0;
  int rc = run_stmt(s, Q_RUN_TOUCH_EV, &changes, err);
  if (rc || changes) {
    *updated = !rc && changes > 0;
    if (*updated) cache_update(q, rec);
    else cache_drop(q, rec->run_id);
    return rc;
  }
  /* Something else changed too (or there is no row): in two steps. */
  bind_run(q->q[Q_RUN_UPDATE], rec);
  if ((rc = run_stmt(s, Q_RUN_UPDATE, &changes, err)) || !changes) {
    cache_drop(q, rec->run_id);
    return rc;
  }
  *updated = 1;
  cache_update(q, rec);
  return s_ev_append(s, rec->run_id, lines, len, err);
}

static int s_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                       lg_error_t *err) {
  sq_t *q = s->impl;
  sqlite3_stmt *st = stmt(s, Q_EV_TAIL, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  sqlite3_bind_text64(st, 2, lines, len, SQLITE_STATIC, SQLITE_UTF8);
  int changes = 0;
  int rc = run_stmt(s, Q_EV_TAIL, &changes, err);
  if (rc || changes) return rc;
  /* No run row: the lines go straight to lg_events. */
  bind_text(q->q[Q_EV_APPEND], 1, run_id);
  sqlite3_bind_text64(q->q[Q_EV_APPEND], 2, lines, len, SQLITE_STATIC, SQLITE_UTF8);
  return run_stmt(s, Q_EV_APPEND, NULL, err);
}

/* Appends the text of column 0 of every row of `which` (bound to run_id). */
static int read_texts(lg_store_t *s, int which, const char *run_id, lg__buf_t *out,
                      lg_error_t *err) {
  sqlite3_stmt *st = stmt(s, which, err);
  if (!st) return LG_ESTORE;
  bind_text(st, 1, run_id);
  int rc, ret = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    const void *v = sqlite3_column_blob(st, 0);
    int n = sqlite3_column_bytes(st, 0);
    if (n > 0 && lg__buf_append(out, v, (size_t)n)) {
      ret = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
  }
  if (!ret && rc != SQLITE_DONE) ret = sq_fail(s, rc, "reading a run's trace", err);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return ret;
}

static int s_ev_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err) {
  sq_t *q = s->impl;
  /* The chunks, then the tail, from one snapshot: a writer in another
   * process may move the tail into a chunk in between. */
  int own = sqlite3_get_autocommit(q->db);
  int rc = own ? sq_ctl(s, C_BEGIN_READ, err) : 0;
  if (rc) return rc;
  size_t at = out->len;
  rc = read_texts(s, Q_EV_READ, run_id, out, err);
  if (!rc) rc = read_texts(s, Q_EV_READ_TAIL, run_id, out, err);
  if (own) {
    lg_error_t scratch;
    int crc = sq_ctl(s, C_COMMIT, rc ? &scratch : err);
    if (!rc) rc = crc;
  }
  if (rc && out->data) out->data[out->len = at] = 0;
  return rc;
}

void lg__store_sqlite_autocheckpoint(lg_store_t *s, int pages) {
  if (!s || s->vt != &lg__store_sqlite || !s->impl) return;
  sq_t *q = s->impl;
  lg__store_lock(s);
  sqlite3_wal_autocheckpoint(q->db, pages);
  lg__store_unlock(s);
}

int lg__store_sqlite_synchronous(lg_store_t *s) {
  if (!s || s->vt != &lg__store_sqlite || !s->impl) return -1;
  sq_t *q = s->impl;
  sqlite3_stmt *st = NULL;
  lg__store_lock(s);
  int level = -1;
  if (sqlite3_prepare_v2(q->db, "PRAGMA synchronous", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    level = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  lg__store_unlock(s);
  return level;
}

const lg__store_vtab_t lg__store_sqlite = {
    .version = 3,
    .scheme = "sqlite",
    .open = s_open,
    .close = s_close,
    .schema_version = s_schema_version,
    .begin = s_begin,
    .end = s_end,
    .op_read = s_op_read,
    .op_insert = s_op_insert,
    .op_update = s_op_update,
    .op_delete = s_op_delete,
    .op_purge = s_op_purge,
    .op_settle = s_op_settle,
    .run_read = s_run_read,
    .run_insert = s_run_insert,
    .run_update = s_run_update,
    .run_list = s_run_list,
    .deny_put = s_deny_put,
    .deny_get = s_deny_get,
    .bud_read = s_bud_read,
    .bud_read_drop = s_bud_read_drop,
    .bud_put = s_bud_put,
    .bud_list = s_bud_list,
    .hold_put = s_hold_put,
    .holds_expire = s_holds_expire,
    .resv_insert = s_resv_insert,
    .resv_read = s_resv_read,
    .resv_of_run = s_resv_of_run,
    .resv_update = s_resv_update,
    .resv_purge = s_resv_purge,
    .runscopes_put = s_runscopes_put,
    .runscopes_get = s_runscopes_get,
    .ev_append = s_ev_append,
    .ev_read = s_ev_read,
    .run_update_ev = s_run_update_ev,
};
