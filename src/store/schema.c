/*
 * schema.c — the store's schema, written once: the migrations in order
 * (migration i takes the database from version i to i + 1) and the one
 * runner that applies them on open.
 *
 * The version table lg_schema_version has a row per migration applied.
 * Opening a store reads its version and, when it is behind, takes the
 * dialect's migration lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: an
 * advisory lock in the transaction), reads the version again under it —
 * two processes opening one new database do not both create it — and
 * applies what is missing in that one transaction. A database newer than
 * this release is refused, never written.
 *
 * Never edit a migration that was released; add one. A migration has one
 * text for every dialect (TEXT, BIGINT and the SQL both databases share)
 * or, where they must differ, one per dialect (LG__D_SQLITE,
 * LG__D_POSTGRES). Migrations 1 to 6 were released separately for each
 * backend and differ in their types and in how lg_runs keeps the trace
 * (SQLite: a tail column and a trigger).
 */
#include "driver.h"
#include "store.h"

#include <stdio.h>

typedef struct migration {
  const char *all;              /* for every dialect, or NULL */
  const char *by[LG__DIALECTS]; /* else by lg__dialect_t.id */
} migration_t;

static const migration_t migrations[] = {
    /* 1: the idempotency ledger. */
    {.by = {[LG__D_SQLITE] = ("CREATE TABLE lg_operations ("
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
            [LG__D_POSTGRES] = ("CREATE TABLE lg_operations ("
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
    "  WHERE state <> 'pending';")}},
    /* 2: run state and the kill switch. */
    {.by = {[LG__D_SQLITE] = ("CREATE TABLE lg_runs ("
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
            [LG__D_POSTGRES] = ("CREATE TABLE lg_runs ("
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
    "  PRIMARY KEY (scope, id));")}},
    /* 3: listing runs newest first, by group. */
    {.all = ("CREATE INDEX lg_runs_created ON lg_runs(created_ms DESC, seq DESC);"
    "CREATE INDEX lg_runs_group ON lg_runs(grp, status);")},
    /* 4: shared budgets (the spend gate): budgets, reservations, the holds
     * of open reservations on each scope, and the scopes of runs. Scopes
     * compare byte-wise (PostgreSQL: COLLATE "C"), as SQLite's do. */
    {.by = {[LG__D_SQLITE] = ("CREATE TABLE lg_budgets ("
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
            [LG__D_POSTGRES] = ("CREATE TABLE lg_budgets ("
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
    "  scopes TEXT NOT NULL);")}},
    /* 5: each run's trace-v1 lines, written with the decision they record
     * (GET /v1/runs/{id}/trace): the newest in the run's own row
     * (trace_tail), whose page the decision writes anyway, and older ones
     * moved out by the trigger in blocks of about 1.5 KB to lg_events,
     * clustered by run. A row per line would double the pages a commit
     * writes; reading the tail's length back (RETURNING) to move it here
     * cost a sixth of bench_server's throughput, the trigger nothing that
     * bench_server can tell from noise. */
    {.by = {[LG__D_SQLITE] = ("ALTER TABLE lg_runs ADD COLUMN trace_tail TEXT;"
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
            [LG__D_POSTGRES] = ("CREATE TABLE lg_events ("
    "  run_id TEXT NOT NULL,"
    "  n BIGINT NOT NULL,"
    "  lines TEXT NOT NULL,"
    "  PRIMARY KEY (run_id, n));")}},
    /* 6: who may undo what (issue "Hardening"). A claim's token, which
     * commit and fail from an agent must present; an operator's outcome
     * recorded with who and when; a key an operator freed kept as a
     * FAILED row marked freed (it counts as free) so that the record
     * stays visible; a settlement above what its settler may charge,
     * with what was asked. */
    {.by = {[LG__D_SQLITE] = ("ALTER TABLE lg_operations ADD COLUMN claim_token TEXT;"
    "ALTER TABLE lg_operations ADD COLUMN resolved_by TEXT;"
    "ALTER TABLE lg_operations ADD COLUMN resolved_ms INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE lg_operations ADD COLUMN freed INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE lg_budget_reservations ADD COLUMN asked_micro INTEGER NOT NULL DEFAULT -1;"),
            [LG__D_POSTGRES] = ("ALTER TABLE lg_operations ADD COLUMN claim_token TEXT,"
    "  ADD COLUMN resolved_by TEXT,"
    "  ADD COLUMN resolved_ms BIGINT NOT NULL DEFAULT 0,"
    "  ADD COLUMN freed INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE lg_budget_reservations ADD COLUMN asked_micro BIGINT NOT NULL DEFAULT -1;")}},
    /* 7: keys with spend limits (gateway-v1, "Keys"). A key's stable id
     * (the hash of its first secret: its budget scope is key:ID) and the
     * SHA-256 of its current secret; the limit itself is the budget row
     * of key:ID, not a column here. The rate limit's fixed window of one
     * minute (rl_start_ms, rl_count) is counted in the row, so that every
     * replica counts the same requests. */
    {.all = ("CREATE TABLE lg_keys ("
    "  id TEXT PRIMARY KEY,"
    "  hash TEXT NOT NULL UNIQUE,"
    "  name TEXT NOT NULL,"
    "  limit_micro BIGINT,"
    "  limit_reset TEXT NOT NULL CHECK (limit_reset IN ('none','daily','weekly','monthly')),"
    "  workspace TEXT,"
    "  include_byok INTEGER NOT NULL,"
    "  rate_per_min BIGINT,"
    "  models TEXT,"
    "  byok TEXT,"
    "  disabled INTEGER NOT NULL,"
    "  created_ms BIGINT NOT NULL,"
    "  rotated_ms BIGINT NOT NULL,"
    "  updated_ms BIGINT NOT NULL,"
    "  rl_start_ms BIGINT NOT NULL DEFAULT 0,"
    "  rl_count BIGINT NOT NULL DEFAULT 0);")},
    /* 8: the gateway's conversation keys (gateway-v1, "Which run a
     * request belongs to"): a derived run found by its conversation's
     * start, or by a Responses id, on every replica of the store and after
     * a restart, not only in the process that answered it; with `data`,
     * what a key needs besides its run (an answer the gateway made itself:
     * what to send upstream for a request continuing from it). */
    {.all = ("CREATE TABLE lg_gateway_keys ("
    "  key TEXT PRIMARY KEY,"
    "  run_id TEXT NOT NULL,"
    "  data TEXT,"
    "  created_ms BIGINT NOT NULL);")},
};

_Static_assert(sizeof migrations / sizeof migrations[0] == LG_STORE_SCHEMA_VERSION,
               "one migration per schema version");

int lg__schema_read_version(lg_store_t *s, int *version, lg_error_t *err) {
  const lg__dialect_t *d = s->drv->dialect;
  int64_t n = 0;
  *version = 0;
  int rc = s->drv->query_int(s, d->table_exists, &n, err);
  if (rc || !n) return rc; /* no version table yet: a new database */
  rc = s->drv->query_int(s, "SELECT COALESCE(MAX(version), 0) FROM lg_schema_version", &n, err);
  if (!rc) *version = (int)n;
  return rc;
}

int lg__schema_migrate(lg_store_t *s, lg_error_t *err) {
  const lg__driver_t *drv = s->drv;
  const lg__dialect_t *d = drv->dialect;
  int target = lg__store_schema_target;
  int version = 0;
  int rc = lg__schema_read_version(s, &version, err);
  if (rc) return rc;
  if (version == target) return 0;
  if ((rc = drv->exec(s, d->migrate_begin, err))) return rc;
  rc = drv->exec(s,
                 "CREATE TABLE IF NOT EXISTS lg_schema_version ("
                 "  version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL)",
                 err);
  if (!rc) rc = lg__schema_read_version(s, &version, err); /* again, under the lock */
  if (!rc && version > LG_STORE_SCHEMA_VERSION)
    rc = lg__err(err, LG_ESTORE, NULL, -1,
                 "the database has schema version %d, newer than this release's %d: "
                 "use a newer loopguard",
                 version, LG_STORE_SCHEMA_VERSION);
  for (int v = version; !rc && v < target; v++) {
    const char *sql = migrations[v].all ? migrations[v].all : migrations[v].by[d->id];
    char ins[200];
    snprintf(ins, sizeof ins,
             "INSERT INTO lg_schema_version (version, applied_ms) VALUES (%d, %s)", v + 1,
             d->now_ms);
    rc = drv->exec(s, sql, err);
    if (!rc) rc = drv->exec(s, ins, err);
  }
  if (rc) {
    drv->exec(s, "ROLLBACK", NULL);
    return rc;
  }
  return drv->exec(s, "COMMIT", err);
}
