/*
 * store_sql.c — the store's rows, written once over a driver (driver.h):
 * every query of every table, and the row functions (lg__sql_*, store.h)
 * that read and write them. sqlite: and memory: run them over the SQLite
 * driver, postgres: over the libpq one.
 *
 * To add a table: its migration in schema.c; its queries in the table
 * below (Q_*) and its row functions here, declared in store.h; its cases
 * in tests/unit/test_store_conformance.c, which runs every store.
 *
 * A query is written once, with SQLite's numbered parameters (?1, ?2 ...)
 * that the dialect turns into its own, and "{FOR UPDATE}" where a locking
 * read takes its row lock; where the databases must differ (types that
 * PostgreSQL must be told, SQLite's trace tail, PostgreSQL's lazy scan of
 * hold rows) the entry has a text per dialect.
 *
 * What the rules may rely on is asked of the driver's capabilities, never
 * of its name: the run cache and the "no deny rule" shortcut need one
 * writer at a time (LG__CAP_SINGLE_WRITER, and LG__CAP_DATA_VERSION for
 * the cache); locking reads are FOR UPDATE only with LG__CAP_ROW_LOCKS.
 *
 * Listing copies the rows, then calls back (list_rows): the callback may
 * use the store, even write to it, which a statement still stepping would
 * not allow.
 */
#include "driver.h"
#include "store.h"

#include <stdio.h>

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
  Q_RUN_INSERT_EV,
  Q_RUN_UPDATE,
  Q_RUN_TOUCH,
  Q_RUN_LIST,
  Q_DENY_PUT,
  Q_DENY_GET,
  Q_DENY_ANY,
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
  Q_EV_TAIL,
  Q_RUN_TOUCH_EV,
  Q_EV_APPEND,
  Q_EV_READ,
  Q_EV_READ_TAIL,
  Q_KEY_INSERT,
  Q_KEY_READ,
  Q_KEY_UPDATE,
  Q_KEY_LIST,
  Q_KEY_RATE,
  Q_KEY_RATE_READ,
  Q_KEY_SPENT,
  Q_GWKEY_PUT,
  Q_GWKEY_GET,
  Q_PURGE_PICK,
  Q_PURGE_RUN,
  Q_PURGE_EVENTS,
  Q_PURGE_DENY,
  Q_PURGE_GWKEYS,
  Q__N
};

/* A query: one text for every dialect, or one per dialect (by[id]; NULL:
 * not used with that dialect). */
typedef struct query {
  const char *sql;
  const char *by[LG__DIALECTS];
} query_t;

#define OP_COLS_V1                                                                      \
  "request_fp, run_id, state, result, operation_id, lease_until_ms, created_ms, updated_ms"
#define OP_COLS OP_COLS_V1 ", claim_token, resolved_by, resolved_ms, freed"
#define RUN_COLS                                                                        \
  "run_id, grp, status, terminal_reason, policy, state, envelope, created_ms, updated_ms"
#define RESV_COLS                                                                       \
  "id, amount_micro, scopes, run_id, run_seq, model, state, actual_micro, created_ms,"  \
  " expires_ms, settled_ms, asked_micro"
#define BUD_STORED                                                                      \
  "b.scope, b.limit_micro, b.period, b.max_in_flight_micro, b.period_start_ms,"         \
  " b.spent_micro, b.reserved_micro, b.holds, b.next_expiry_ms, b.created_ms,"           \
  " b.updated_ms"

/* What the hold rows of a scope say as of ?2 (fill_bud's columns 11 to 14).
 *
 * SQLite: always, joined to the stored columns (its deletes leave no dead
 * rows behind, so reading it costs little). PostgreSQL: only when the
 * row's next_expiry_ms has come — hold rows come and go with every
 * reservation, their dead versions stay until vacuum, and a scan per
 * reservation would grow slower with the traffic; with the row lock, in a
 * statement of its own that starts once the lock is had (Q_HOLD_STATS: a
 * statement that waited for the lock would read them from its older
 * snapshot). */
#define SQ_BUD_COLS                                                                     \
  BUD_STORED ", COALESCE(e.lsum, 0), COALESCE(e.lcount, 0), e.lmin, COALESCE(e.ecount, 0)"
#define SQ_HOLD_STATS                                                                   \
  "(SELECT scope, SUM(CASE WHEN expires_ms > ?2 THEN amount_micro END) AS lsum,"        \
  " COUNT(CASE WHEN expires_ms > ?2 THEN 1 END) AS lcount,"                              \
  " MIN(CASE WHEN expires_ms > ?2 THEN expires_ms END) AS lmin,"                         \
  " COUNT(CASE WHEN expires_ms <= ?2 THEN 1 END) AS ecount FROM lg_budget_holds"
#define PG_HOLD_AGG                                                                     \
  "COALESCE(SUM(CASE WHEN h.expires_ms > ?2 THEN h.amount_micro END), 0)::bigint,"      \
  " COUNT(CASE WHEN h.expires_ms > ?2 THEN 1 END),"                                     \
  " MIN(CASE WHEN h.expires_ms > ?2 THEN h.expires_ms END),"                            \
  " COUNT(CASE WHEN h.expires_ms <= ?2 THEN 1 END)"
#define PG_HOLDS_LATERAL                                                                \
  " LEFT JOIN LATERAL (SELECT " PG_HOLD_AGG " FROM lg_budget_holds h"                  \
  " WHERE h.scope = b.scope AND b.next_expiry_ms >= 0 AND b.next_expiry_ms <= ?2) e ON true"

#define KEY_COLS                                                                        \
  "id, hash, name, limit_micro, limit_reset, workspace, include_byok, rate_per_min,"    \
  " models, byok, disabled, created_ms, rotated_ms, updated_ms"
/* The start of a key's rate window as of ?2: a new one when a minute has
 * passed since the stored one began. */
#define KEY_NEW_WINDOW "rl_start_ms <= CAST(?2 AS BIGINT) - 60000"

#define SQ LG__D_SQLITE
#define PG LG__D_POSTGRES

static const query_t queries[Q__N] = {
    [Q_OP_READ] = {.sql = "SELECT " OP_COLS " FROM lg_operations WHERE key = ?1"},
    [Q_OP_READ_LOCK] = {.sql = "SELECT " OP_COLS " FROM lg_operations WHERE key = ?1{FOR UPDATE}"},
    [Q_OP_INSERT] = {.sql = "INSERT INTO lg_operations (key, " OP_COLS ")"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
                     " ON CONFLICT (key) DO NOTHING"},
    [Q_OP_UPDATE] = {.sql = "UPDATE lg_operations SET request_fp = ?2, run_id = ?3, state = ?4,"
                     " result = ?5, operation_id = ?6, lease_until_ms = ?7, created_ms = ?8,"
                     " updated_ms = ?9, claim_token = ?10, resolved_by = ?11, resolved_ms = ?12,"
                     " freed = ?13 WHERE key = ?1"},
    [Q_OP_DELETE] = {.sql = "DELETE FROM lg_operations WHERE key = ?1"},
    [Q_OP_PURGE] = {.sql = "DELETE FROM lg_operations WHERE state <> 'pending' AND updated_ms <= ?1"},
    [Q_OP_SETTLE] = {.sql = "UPDATE lg_operations SET state = ?2, result = ?3, operation_id = ?4,"
                     " updated_ms = ?5 WHERE key = ?1 AND state = 'pending'"},
    [Q_OP_DROP_PENDING] = {.sql = "DELETE FROM lg_operations WHERE key = ?1 AND state = 'pending'"},
    [Q_RUN_READ] = {.sql = "SELECT " RUN_COLS " FROM lg_runs WHERE run_id = ?1"},
    [Q_RUN_READ_LOCK] = {.sql = "SELECT " RUN_COLS " FROM lg_runs WHERE run_id = ?1{FOR UPDATE}"},
    [Q_RUN_INSERT] = {.sql = "INSERT INTO lg_runs (" RUN_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                      " ON CONFLICT (run_id) DO NOTHING"},
    /* Q_RUN_INSERT with the run's first trace lines in its tail (SQLite):
     * the row is written once. */
    [Q_RUN_INSERT_EV] = {.by = {[SQ] = "INSERT INTO lg_runs (" RUN_COLS ", trace_tail)"
                                       " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                                       " ON CONFLICT (run_id) DO NOTHING"}},
    /* PostgreSQL must know the type of every parameter: ?8 (created_ms,
     * which an UPDATE keeps) is named for that. */
    [Q_RUN_UPDATE] = {.by = {[SQ] = "UPDATE lg_runs SET grp = ?2, status = ?3, terminal_reason = ?4,"
                                     " policy = ?5, state = ?6, envelope = ?7, updated_ms = ?9"
                                     " WHERE run_id = ?1",
                             [PG] = "UPDATE lg_runs SET grp = ?2, status = ?3, terminal_reason = ?4,"
                                    " policy = ?5, state = ?6, envelope = ?7, updated_ms = ?9"
                                    " WHERE run_id = ?1 AND ?8::bigint IS NOT NULL"}},
    /* The usual decision: only the state moved. Setting no indexed column
     * leaves SQLite's indexes alone (it rewrites an index entry whenever
     * an UPDATE sets one of its columns, even to the same value), so a
     * commit writes one page per run and not two. PostgreSQL writes a
     * new row version either way: there it is Q_RUN_UPDATE. */
    [Q_RUN_TOUCH] = {.by = {[SQ] = "UPDATE lg_runs SET state = ?6, updated_ms = ?9 WHERE run_id = ?1"
                                   " AND grp IS ?2 AND status = ?3 AND terminal_reason IS ?4"
                                   " AND policy IS ?5 AND envelope IS ?7",
                            [PG] = "UPDATE lg_runs SET grp = ?2, status = ?3, terminal_reason = ?4,"
                                   " policy = ?5, state = ?6, envelope = ?7, updated_ms = ?9"
                                   " WHERE run_id = ?1 AND ?8::bigint IS NOT NULL"}},
    /* the policy and state only when asked (?5): a listed run's counters */
    [Q_RUN_LIST] = {.by = {[SQ] = "SELECT run_id, grp, status, terminal_reason,"
                                  " CASE WHEN ?5 THEN policy END, CASE WHEN ?5 THEN state END, envelope,"
                                  " created_ms, updated_ms FROM lg_runs"
                                  " WHERE (?1 IS NULL OR status = ?1)"
                                  " AND (?2 IS NULL OR terminal_reason = ?2)"
                                  " AND (?3 IS NULL OR grp = ?3)"
                                  " ORDER BY created_ms DESC, seq DESC LIMIT COALESCE(?4, -1)",
                           [PG] = "SELECT run_id, grp, status, terminal_reason,"
                                  " CASE WHEN ?5::bigint = 1 THEN policy END,"
                                  " CASE WHEN ?5::bigint = 1 THEN state END, envelope, created_ms,"
                                  " updated_ms FROM lg_runs"
                                  " WHERE (?1::text IS NULL OR status = ?1)"
                                  " AND (?2::text IS NULL OR terminal_reason = ?2)"
                                  " AND (?3::text IS NULL OR grp = ?3)"
                                  " ORDER BY created_ms DESC, seq DESC LIMIT ?4::bigint"}},
    [Q_DENY_PUT] = {.sql = "INSERT INTO lg_deny (scope, id, reason, created_ms) VALUES (?1, ?2, ?3, ?4)"
                    " ON CONFLICT (scope, id) DO UPDATE SET reason = excluded.reason,"
                    " created_ms = excluded.created_ms"},
    /* Two lookups of the primary key merged in scope order: an OR of the
     * two would collect rowids and sort them in a temporary b-tree. */
    [Q_DENY_GET] = {.sql = "SELECT reason, scope FROM lg_deny WHERE scope = 1 AND id = ?1"
                    " UNION ALL SELECT reason, scope FROM lg_deny WHERE scope = 2 AND id = ?2"
                    " ORDER BY 2 LIMIT 1"},
    [Q_DENY_ANY] = {.sql = "SELECT 1 FROM lg_deny LIMIT 1"},
    /* A key another conversation had too goes to the latest (gateway.c,
     * key_put). */
    [Q_GWKEY_PUT] = {.sql = "INSERT INTO lg_gateway_keys (key, run_id, data, created_ms)"
                     " VALUES (?1, ?2, ?3, ?4) ON CONFLICT (key) DO UPDATE SET"
                     " run_id = excluded.run_id, data = excluded.data,"
                     " created_ms = excluded.created_ms"},
    [Q_GWKEY_GET] = {.sql = "SELECT run_id, data FROM lg_gateway_keys WHERE key = ?1"},
    /* Purging runs (lg_store_purge_runs): the next runs not updated since
     * ?1, oldest first from the cursor (?2, ?3) on, along the index of
     * schema 3 (a run updated since is passed over, not read again); each
     * deleted with what is its alone, unless it was written meanwhile or
     * holds an open reservation (its budget's hold is settled or expires
     * first); then the conversation keys of runs no longer stored. */
    [Q_PURGE_PICK] = {.sql = "SELECT run_id, created_ms, seq FROM lg_runs"
                      " WHERE created_ms <= ?1 AND updated_ms <= ?1"
                      " AND (created_ms > ?2 OR (created_ms = ?2 AND seq > ?3))"
                      " ORDER BY created_ms, seq LIMIT ?4"},
    [Q_PURGE_RUN] = {.sql = "DELETE FROM lg_runs WHERE run_id = ?1 AND updated_ms <= ?2"
                     " AND NOT EXISTS (SELECT 1 FROM lg_budget_reservations"
                     " WHERE run_id = ?1 AND state = 'open')"},
    [Q_PURGE_EVENTS] = {.sql = "DELETE FROM lg_events WHERE run_id = ?1"},
    [Q_PURGE_DENY] = {.sql = "DELETE FROM lg_deny WHERE scope = 1 AND id = ?1"},
    [Q_PURGE_GWKEYS] = {.sql = "DELETE FROM lg_gateway_keys WHERE created_ms <= ?1 AND NOT EXISTS"
                        " (SELECT 1 FROM lg_runs WHERE lg_runs.run_id = lg_gateway_keys.run_id)"},
    /* One statement, one snapshot: a read without the lock. */
    [Q_BUD_READ] = {.by = {[SQ] = "SELECT " SQ_BUD_COLS " FROM lg_budgets b LEFT JOIN " SQ_HOLD_STATS
                                  " WHERE scope = ?1 GROUP BY scope) e ON e.scope = b.scope"
                                  " WHERE b.scope = ?1",
                           [PG] = "SELECT " BUD_STORED ", e.* FROM lg_budgets b" PG_HOLDS_LATERAL
                                  " WHERE b.scope = ?1"}},
    /* With the row lock (LG__CAP_ROW_LOCKS): the row, then its holds. */
    [Q_BUD_LOCK] = {.by = {[PG] = "SELECT " BUD_STORED " FROM lg_budgets b WHERE b.scope = ?1"
                                  " FOR UPDATE"}},
    [Q_HOLD_STATS] = {.by = {[PG] = "SELECT " PG_HOLD_AGG " FROM lg_budget_holds h WHERE h.scope = ?1"
                                    " AND EXISTS (SELECT 1 FROM lg_budgets b WHERE b.scope = ?1"
                                    " AND b.next_expiry_ms >= 0 AND b.next_expiry_ms <= ?2)"}},
    [Q_BUD_PUT] = {.sql = "INSERT INTO lg_budgets (scope, limit_micro, period, max_in_flight_micro,"
                   " period_start_ms, spent_micro, reserved_micro, holds, next_expiry_ms,"
                   " created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
                   " ON CONFLICT (scope) DO UPDATE SET"
                   " limit_micro = excluded.limit_micro, period = excluded.period,"
                   " max_in_flight_micro = excluded.max_in_flight_micro,"
                   " period_start_ms = excluded.period_start_ms,"
                   " spent_micro = excluded.spent_micro, reserved_micro = excluded.reserved_micro,"
                   " holds = excluded.holds, next_expiry_ms = excluded.next_expiry_ms,"
                   " updated_ms = excluded.updated_ms"},
    [Q_BUD_LIST] = {.by = {[SQ] = "SELECT " SQ_BUD_COLS " FROM lg_budgets b LEFT JOIN " SQ_HOLD_STATS
                                  " WHERE ?1 IS NULL GROUP BY scope) e ON e.scope = b.scope"
                                  " ORDER BY b.scope",
                           [PG] = "SELECT " BUD_STORED ", e.* FROM lg_budgets b" PG_HOLDS_LATERAL
                                  " WHERE ?1::text IS NULL ORDER BY b.scope"}},
    [Q_HOLD_PUT] = {.sql = "INSERT INTO lg_budget_holds (scope, reservation_id, amount_micro, expires_ms)"
                    " VALUES (?1, ?2, ?3, ?4)"},
    [Q_HOLD_DROP] = {.sql = "DELETE FROM lg_budget_holds WHERE scope = ?1 AND reservation_id = ?2"},
    [Q_HOLDS_EXPIRE] = {.sql = "DELETE FROM lg_budget_holds WHERE scope = ?1 AND expires_ms <= ?2"},
    /* An id that exists is a unique key's conflict: LG_ECONFLICT. */
    [Q_RESV_INSERT] = {.sql = "INSERT INTO lg_budget_reservations (" RESV_COLS ")"
                       " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"},
    [Q_RESV_READ] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations WHERE id = ?1"},
    [Q_RESV_READ_LOCK] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations WHERE id = ?1"
                          "{FOR UPDATE}"},
    /* the open one: a run purged and made again under its id starts its
     * seqs over, beside the old run's settled rows */
    [Q_RESV_OF_RUN] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                       " WHERE run_id = ?1 AND run_seq = ?2 AND state = 'open'"},
    [Q_RESV_OF_RUN_LOCK] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                            " WHERE run_id = ?1 AND run_seq = ?2 AND state = 'open'{FOR UPDATE}"},
    [Q_RESV_OLDEST_OF_RUN] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                              " WHERE run_id = ?1 AND state = 'open' ORDER BY run_seq LIMIT 1"},
    [Q_RESV_OLDEST_OF_RUN_LOCK] = {.sql = "SELECT " RESV_COLS " FROM lg_budget_reservations"
                                   " WHERE run_id = ?1 AND state = 'open' ORDER BY run_seq"
                                   " LIMIT 1{FOR UPDATE}"},
    [Q_RESV_UPDATE] = {.sql = "UPDATE lg_budget_reservations SET amount_micro = ?2, scopes = ?3,"
                       " run_id = ?4, run_seq = ?5, model = ?6, state = ?7, actual_micro = ?8,"
                       " created_ms = ?9, expires_ms = ?10, settled_ms = ?11, asked_micro = ?12"
                       " WHERE id = ?1"},
    [Q_RESV_PURGE] = {.sql = "DELETE FROM lg_budget_reservations WHERE expires_ms <= ?1"},
    [Q_RUNSCOPES_PUT] = {.sql = "INSERT INTO lg_budget_run_scopes (run_id, scopes) VALUES (?1, ?2)"
                         " ON CONFLICT (run_id) DO UPDATE SET scopes = excluded.scopes"},
    [Q_RUNSCOPES_DEL] = {.sql = "DELETE FROM lg_budget_run_scopes WHERE run_id = ?1"},
    [Q_RUNSCOPES_GET] = {.sql = "SELECT scopes FROM lg_budget_run_scopes WHERE run_id = ?1"},
    /* A run's trace. SQLite (dialect trace_tail): the newest lines in the
     * run's own row, moved to lg_events in blocks by schema 5's trigger;
     * PostgreSQL: a row of lg_events per append. The run's row lock (or
     * its uncommitted insert) orders the appends of one run, so MAX(n) + 1
     * cannot be taken twice. */
    [Q_EV_TAIL] = {.by = {[SQ] = "UPDATE lg_runs SET trace_tail = COALESCE(trace_tail, '') || ?2"
                                 " WHERE run_id = ?1"}},
    /* Q_RUN_TOUCH and Q_EV_TAIL in one: the row is written once. */
    [Q_RUN_TOUCH_EV] = {.by = {[SQ] = "UPDATE lg_runs SET state = ?6, updated_ms = ?9,"
                                      " trace_tail = COALESCE(trace_tail, '') || ?10"
                                      " WHERE run_id = ?1 AND grp IS ?2 AND status = ?3"
                                      " AND terminal_reason IS ?4 AND policy IS ?5"
                                      " AND envelope IS ?7"}},
    [Q_EV_APPEND] = {.sql = "INSERT INTO lg_events (run_id, n, lines)"
                     " SELECT ?1, COALESCE(MAX(n), 0) + 1, ?2 FROM lg_events WHERE run_id = ?1"},
    [Q_EV_READ] = {.sql = "SELECT lines FROM lg_events WHERE run_id = ?1 ORDER BY n"},
    [Q_EV_READ_TAIL] = {.by = {[SQ] = "SELECT trace_tail FROM lg_runs WHERE run_id = ?1"}},
    [Q_KEY_INSERT] = {.sql = "INSERT INTO lg_keys (" KEY_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,"
                      " ?9, ?10, ?11, ?12, ?13, ?14) ON CONFLICT DO NOTHING"},
    [Q_KEY_READ] = {.sql = "SELECT " KEY_COLS " FROM lg_keys WHERE hash = ?1 OR id = ?1"
                    " ORDER BY hash = ?1 DESC LIMIT 1"},
    [Q_KEY_UPDATE] = {.sql = "UPDATE lg_keys SET hash = ?2, name = ?3, limit_micro = ?4, limit_reset = ?5,"
                      " workspace = ?6, include_byok = ?7, rate_per_min = ?8, models = ?9,"
                      " byok = ?10, disabled = ?11, rotated_ms = ?13, updated_ms = ?14"
                      " WHERE id = ?1 AND CAST(?12 AS BIGINT) IS NOT NULL"},
    [Q_KEY_LIST] = {.sql = "SELECT " KEY_COLS " FROM lg_keys ORDER BY created_ms, id"},
    /* One statement: counting and checking cannot interleave with
     * another replica's. */
    [Q_KEY_RATE] = {.sql = "UPDATE lg_keys SET"
                    " rl_count = CASE WHEN " KEY_NEW_WINDOW " THEN 1 ELSE rl_count + 1 END,"
                    " rl_start_ms = CASE WHEN " KEY_NEW_WINDOW " THEN CAST(?2 AS BIGINT)"
                    " ELSE rl_start_ms END"
                    " WHERE id = ?1 AND (" KEY_NEW_WINDOW " OR rl_count < CAST(?3 AS BIGINT))"},
    [Q_KEY_RATE_READ] = {.sql = "SELECT rl_start_ms FROM lg_keys WHERE id = ?1"},
    [Q_KEY_SPENT] = {.sql = "SELECT CAST(COALESCE(SUM(actual_micro), 0) AS BIGINT)"
                     " FROM lg_budget_reservations WHERE state = 'settled'"
                     " AND settled_ms >= CAST(?2 AS BIGINT)"
                     " AND ('\n' || scopes || '\n') LIKE ('%\n' || CAST(?1 AS TEXT) || '\n%')"},
};

/* The ledger's statements as schema 1 to 5 had them, for a store opened at
 * an old version (only the migration tests do that): the same first
 * parameters, without those of schema 6 (bind_op binds no more; a
 * missing column reads as NULL, see fill_op). */
static const char *const legacy_op_queries[] = {
    [Q_OP_READ] = "SELECT " OP_COLS_V1 " FROM lg_operations WHERE key = ?1",
    [Q_OP_READ_LOCK] = "SELECT " OP_COLS_V1 " FROM lg_operations WHERE key = ?1{FOR UPDATE}",
    [Q_OP_INSERT] = "INSERT INTO lg_operations (key, " OP_COLS_V1 ")"
                    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (key) DO NOTHING",
    [Q_OP_UPDATE] = "UPDATE lg_operations SET request_fp = ?2, run_id = ?3, state = ?4,"
                    " result = ?5, operation_id = ?6, lease_until_ms = ?7, created_ms = ?8,"
                    " updated_ms = ?9 WHERE key = ?1",
};

#undef SQ
#undef PG


/* The run cache: rows of runs read or written in this connection's
 * transactions, by run_id (direct-mapped: a run takes the slot of its
 * hash). See "the run cache" below. */
#define CACHE_SLOTS 512

typedef struct rows {
  char *sql[Q__N];         /* the text prepared, in the driver's dialect */
  int old_schema;          /* opened at a schema before 6 (tests) */
  int deny_empty;          /* in the open transaction: 1 lg_deny is empty, 0 not, -1 unknown */
  int cache_valid;         /* the run cache is the database as of data version cache_version */
  unsigned cache_version;  /* the driver's data_version() then */
  lg_run_record_t cache[CACHE_SLOTS]; /* run_id NULL in an empty slot */
} rows_t;

/* ---- statements ---- */

#define DRV (s->drv)

/* The prepared statement, or NULL with err filled when the schema lacks
 * it (a store opened at an old version for a migration test) or the
 * dialect has no such query. */
static lg__stmt_t *stmt(lg_store_t *s, int which, lg_error_t *err) {
  if (!((rows_t *)s->impl)->sql[which]) {
    lg__err(err, LG_ESTORE, NULL, -1, "the store was opened at an old schema version");
    return NULL;
  }
  return DRV->stmt(s, which, err);
}

static void bind_text(lg_store_t *s, lg__stmt_t *st, int i, const char *v) {
  DRV->bind_text(st, i, v, v ? strlen(v) : 0);
}

/* A column as a new string (NULL for SQL NULL); *ok 0 on out-of-memory. */
static char *col_str(lg_store_t *s, lg__stmt_t *st, int i, size_t *len, int *ok) {
  size_t n = 0;
  const char *p = DRV->col_text(st, i, &n);
  if (len) *len = p ? n : 0;
  if (!p) return NULL;
  char *r = lg__strndup(p, n);
  if (!r) *ok = 0;
  return r;
}

/* Runs a statement that returns no rows; *changes gets the rows changed.
 * Resets it whatever happens. Without `changes` the driver may send it
 * later, with the next statement or the commit (driver.h: send). */
static int run(lg_store_t *s, lg__stmt_t *st, int64_t *changes, lg_error_t *err) {
  if (!changes && DRV->send) return DRV->send(s, st, 0, err);
  int rc = DRV->step(s, st, "write", err);
  if (rc >= 0) {
    if (changes) *changes = DRV->changes(s, st);
    rc = 0;
  }
  DRV->reset(st);
  return rc;
}

/* Steps a statement that returns at most one row into *out with fill():
 * *found, and 0 or an error. Resets it. */
typedef int (*fill_fn)(lg_store_t *s, lg__stmt_t *st, void *out);

static int one(lg_store_t *s, lg__stmt_t *st, const char *what, fill_fn fill, void *out,
               int *found, lg_error_t *err) {
  int rc = DRV->step(s, st, what, err), ret = 0;
  *found = 0;
  if (rc == LG__ROW) {
    *found = 1;
    if (fill(s, st, out)) {
      *found = 0;
      ret = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  } else if (rc < 0) {
    ret = rc;
  }
  DRV->reset(st);
  return ret;
}

/* The "copy rows, then call back" listing: steps st to the end, filling
 * an array of `size`-byte rows, then calls cb on each, newest-read order
 * kept, outside the reader (the callback may write), and clears them. */
static int list_rows(lg_store_t *s, lg__stmt_t *st, const char *what, size_t size, fill_fn fill,
                     void (*clear)(void *), int (*cb)(void *ud, const void *row), void *ud,
                     lg_error_t *err) {
  char *all = NULL;
  size_t n = 0, cap = 0;
  int rc, out = 0;
  while ((rc = DRV->step(s, st, what, err)) == LG__ROW) {
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      char *a = lg__realloc(all, nc * size);
      if (!a) {
        out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
        break;
      }
      all = a;
      cap = nc;
    }
    if (fill(s, st, all + n * size)) {
      out = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
    n++;
  }
  if (!out && rc < 0) out = rc;
  DRV->reset(st);
  int was = DRV->reading ? DRV->reading(s, 1, 0) : 0;
  for (size_t i = 0; i < n && !out; i++) out = cb(ud, all + i * size);
  if (was) DRV->reading(s, 1, 1);
  for (size_t i = 0; i < n; i++) clear(all + i * size);
  lg__free(all);
  return out;
}

/* The statement of a read, the locking one (FOR UPDATE) when the rows
 * must stay as read until the transaction ends and the database locks
 * rows (LG__CAP_ROW_LOCKS; with one writer at a time, the transaction
 * holds the whole database already). */
static lg__stmt_t *read_stmt(lg_store_t *s, int which, int locking, int lock, lg_error_t *err) {
  return stmt(s, lock && (DRV->caps & LG__CAP_ROW_LOCKS) ? locking : which, err);
}

/* ---- opening ---- */

/* The SQL of query `which` in the driver's dialect (new). */
static char *dialect_sql(const lg__dialect_t *d, const char *sql) {
  lg__buf_t b = {0};
  for (const char *p = sql; *p; p++) {
    if (*p == '?' && p[1] >= '0' && p[1] <= '9') {
      lg__buf_putc(&b, d->placeholder);
    } else if (*p == '{' && !strncmp(p, "{FOR UPDATE}", 12)) {
      lg__buf_puts(&b, d->for_update);
      p += 11;
    } else {
      lg__buf_putc(&b, *p);
    }
  }
  return lg__buf_steal(&b, NULL);
}

static void rows_free(lg_store_t *s) {
  rows_t *r = s->impl;
  if (!r) return;
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (r->cache[i].run_id) lg_run_record_clear(&r->cache[i]);
  for (int i = 0; i < Q__N; i++) lg__free(r->sql[i]);
  lg__free(r);
  s->impl = NULL;
}

int lg__sql_open(lg_store_t *s, const char *arg, lg_error_t *err) {
  rows_t *r = lg__calloc(1, sizeof *r);
  if (!r) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  s->impl = r;
  r->deny_empty = -1;
  int rc = DRV->open(s, arg, err);
  if (rc) {
    rows_free(s);
    return rc;
  }
  if ((rc = lg__schema_migrate(s, err))) goto fail;
  /* An old schema written for a migration test: the ledger only, as it
   * was then. */
  int target = lg__store_schema_target;
  r->old_schema = target < 6;
  for (int i = 0; i < Q__N; i++) {
    int ledger = i >= Q_OP_READ && i <= Q_OP_DROP_PENDING;
    if (target != LG_STORE_SCHEMA_VERSION && !ledger) continue;
    const char *text = r->old_schema &&
                               (size_t)i < sizeof legacy_op_queries / sizeof *legacy_op_queries &&
                               legacy_op_queries[i]
                           ? legacy_op_queries[i]
                           : queries[i].sql ? queries[i].sql
                                            : queries[i].by[DRV->dialect->id];
    if (!text) continue; /* not used with this dialect */
    if (!(r->sql[i] = dialect_sql(DRV->dialect, text))) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      goto fail;
    }
  }
  if ((rc = DRV->prepare(s, (const char *const *)r->sql, Q__N, err))) goto fail;
  return 0;
fail:
  DRV->close(s);
  rows_free(s);
  return rc;
}

void lg__sql_close(lg_store_t *s) {
  if (s->conn) DRV->close(s);
  rows_free(s);
}

int lg__sql_schema_version(lg_store_t *s, int *version, lg_error_t *err) {
  return lg__schema_read_version(s, version, err);
}

/* ---- the run cache ----
 *
 * A decision reads its run's row and writes it back, and the server's
 * committer makes tens of thousands a second, each run's after the
 * previous one: keeping the rows it wrote saves reading them again (the
 * SELECT was a sixth of the committer's time). The cache serves reads only
 * inside this connection's write transactions on a store with one writer
 * at a time (LG__CAP_SINGLE_WRITER: no other writer until it ends), and
 * only while it is the database: the driver's data version
 * (LG__CAP_DATA_VERSION) moves with every commit, this connection's and
 * any other's, in this process or another. The version seen after this
 * connection's own commit is kept; when a transaction begins at another
 * version, someone else wrote, and the cache is emptied. A rollback (of
 * the transaction or of a savepoint) empties it too, as it may hold rows
 * that are undone. Writes outside a transaction do not touch it (their
 * commit moves the version). */

enum { CACHE_CAPS = LG__CAP_SINGLE_WRITER | LG__CAP_DATA_VERSION };

static int cache_on(lg_store_t *s) { return (DRV->caps & CACHE_CAPS) == CACHE_CAPS; }

static void cache_clear(rows_t *r) {
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (r->cache[i].run_id) lg_run_record_clear(&r->cache[i]);
}

/* At the start of a transaction: empties the cache unless nobody else
 * has committed since this connection did. */
static void cache_check(lg_store_t *s) {
  rows_t *r = s->impl;
  unsigned v = DRV->data_version(s);
  if (!r->cache_valid || v != r->cache_version) {
    cache_clear(r);
    r->cache_version = v;
    r->cache_valid = 1;
  }
}

static lg_run_record_t *cache_slot(rows_t *r, const char *run_id) {
  return &r->cache[lg__hash_str(run_id) % CACHE_SLOTS];
}

/* The cached row of run_id, or NULL. */
static const lg_run_record_t *cache_get(lg_store_t *s, const char *run_id) {
  rows_t *r = s->impl;
  if (!r->cache_valid || !DRV->in_txn(s)) return NULL;
  lg_run_record_t *c = cache_slot(r, run_id);
  return c->run_id && !strcmp(c->run_id, run_id) ? c : NULL;
}

/* rec is run_id's row now (read or written in this transaction). */
static void cache_put(lg_store_t *s, const lg_run_record_t *rec) {
  rows_t *r = s->impl;
  if (!r->cache_valid || !DRV->in_txn(s)) return;
  lg_run_record_t *c = cache_slot(r, rec->run_id);
  lg_run_record_clear(c);
  if (lg__run_record_copy(c, rec)) r->cache_valid = 0; /* out of memory: forget it all */
}

/* rec was written over run_id's row, which keeps its created_ms (an
 * UPDATE never sets it): known only when the row is cached already. */
static void cache_update(lg_store_t *s, const lg_run_record_t *rec) {
  const lg_run_record_t *old = cache_get(s, rec->run_id);
  if (!old) return;
  lg_run_record_t r = *rec;
  r.created_ms = old->created_ms;
  cache_put(s, &r);
}

/* run_id's row changed in a way not known here. */
static void cache_drop(lg_store_t *s, const char *run_id) {
  rows_t *r = s->impl;
  lg_run_record_t *c = cache_slot(r, run_id);
  if (c->run_id && !strcmp(c->run_id, run_id)) lg_run_record_clear(c);
}

/* ---- transactions ---- */

int lg__sql_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  rows_t *r = s->impl;
  int rc = DRV->begin(s, kind, nested, upgrade, err);
  if (rc || nested) return rc;
  r->deny_empty = -1;
  if (cache_on(s)) cache_check(s);
  return 0;
}

int lg__sql_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  rows_t *r = s->impl;
  if (!commit) r->cache_valid = 0; /* it may hold what is undone now */
  int rc = DRV->end(s, commit, nested, err);
  if (!nested && commit) {
    if (rc) r->cache_valid = 0;
    else if (r->cache_valid) r->cache_version = DRV->data_version ? DRV->data_version(s) : 0;
  }
  return rc;
}

/* ---- ledger rows ---- */

/* The stored names of the ledger's states, the reservations' and the
 * budgets' periods (lg_budget_period_t order). */
static const char *state_name(int st) {
  return st == LG__OP_COMMITTED ? "committed" : st == LG__OP_FAILED ? "failed" : "pending";
}
static int state_of(const char *v, size_t n) {
  if (!v) return 0;
  if (n == 9 && !memcmp(v, "committed", 9)) return LG__OP_COMMITTED;
  if (n == 6 && !memcmp(v, "failed", 6)) return LG__OP_FAILED;
  return LG__OP_PENDING;
}
static const char *const period_names[] = {"none", "daily", "weekly", "monthly"};
static int period_of(const char *v, size_t n) {
  for (int i = 0; i < 4; i++)
    if (v && strlen(period_names[i]) == n && !memcmp(v, period_names[i], n)) return i;
  return 0;
}
static int text_is(lg_store_t *s, lg__stmt_t *st, int i, const char *want) {
  size_t n = 0;
  const char *v = DRV->col_text(st, i, &n);
  return v && n == strlen(want) && !memcmp(v, want, n);
}

static int fill_op(lg_store_t *s, lg__stmt_t *st, void *out) {
  lg__op_row_t *row = out; /* key set by the caller */
  int ok = 1;
  size_t n = 0;
  row->request_fp = col_str(s, st, 0, NULL, &ok);
  row->run_id = col_str(s, st, 1, NULL, &ok);
  const char *state = DRV->col_text(st, 2, &n);
  row->state = state_of(state, n);
  row->result = col_str(s, st, 3, &row->result_len, &ok);
  row->operation_id = col_str(s, st, 4, NULL, &ok);
  row->lease_until_ms = DRV->col_i64(st, 5);
  row->created_ms = DRV->col_i64(st, 6);
  row->updated_ms = DRV->col_i64(st, 7);
  if (DRV->ncols(st) > 8) { /* schema 6 */
    row->claim_token = col_str(s, st, 8, NULL, &ok);
    row->resolved_by = col_str(s, st, 9, NULL, &ok);
    row->resolved_ms = DRV->col_i64(st, 10);
    row->freed = (int)DRV->col_i64(st, 11);
  }
  if (!ok || !row->key || !row->request_fp) {
    lg__op_row_clear(row);
    return LG_ENOMEM;
  }
  return 0;
}

int lg__sql_op_read(lg_store_t *s, const char *key, int lock, lg__op_row_t *row, int *found,
                     lg_error_t *err) {
  lg__stmt_t *st = read_stmt(s, Q_OP_READ, Q_OP_READ_LOCK, lock, err);
  *found = 0;
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, key);
  lg__op_row_t got = {.key = lg__strdup(key)};
  int rc = one(s, st, "reading the ledger", fill_op, &got, found, err);
  if (*found) *row = got;
  else lg__op_row_clear(&got);
  return rc;
}

static void bind_op(lg_store_t *s, lg__stmt_t *st, const lg__op_row_t *r) {
  bind_text(s, st, 1, r->key);
  bind_text(s, st, 2, r->request_fp);
  bind_text(s, st, 3, r->run_id);
  bind_text(s, st, 4, state_name(r->state));
  DRV->bind_blob(st, 5, r->result, r->result_len);
  bind_text(s, st, 6, r->operation_id);
  DRV->bind_i64(st, 7, r->lease_until_ms);
  DRV->bind_i64(st, 8, r->created_ms);
  DRV->bind_i64(st, 9, r->updated_ms);
  rows_t *rw = s->impl;
  if (rw->old_schema) return; /* the legacy statements have 9 parameters */
  bind_text(s, st, 10, r->claim_token);
  bind_text(s, st, 11, r->resolved_by);
  DRV->bind_i64(st, 12, r->resolved_ms);
  DRV->bind_i64(st, 13, r->freed);
}

int lg__sql_op_insert(lg_store_t *s, const lg__op_row_t *row, int *inserted, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_OP_INSERT, err);
  int64_t changes = 0;
  *inserted = 0;
  if (!st) return LG_ESTORE;
  bind_op(s, st, row);
  int rc = run(s, st, &changes, err);
  *inserted = !rc && changes > 0;
  return rc;
}

int lg__sql_op_update(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_OP_UPDATE, err);
  if (!st) return LG_ESTORE;
  bind_op(s, st, row);
  return run(s, st, NULL, err);
}

int lg__sql_op_delete(lg_store_t *s, const char *key, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_OP_DELETE, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, key);
  return run(s, st, NULL, err);
}

int lg__sql_op_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_OP_PURGE, err);
  *purged = 0;
  if (!st) return LG_ESTORE;
  DRV->bind_i64(st, 1, before_ms);
  return run(s, st, purged, err);
}

int lg__sql_op_settle(lg_store_t *s, const char *key, int state, const char *result,
                       size_t result_len, const char *operation_id, int64_t now_ms,
                       int *changed, lg_error_t *err) {
  int64_t n = 0;
  *changed = 0;
  lg__stmt_t *st = stmt(s, state ? Q_OP_SETTLE : Q_OP_DROP_PENDING, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, key);
  if (state) {
    bind_text(s, st, 2, state_name(state));
    DRV->bind_blob(st, 3, result, result_len);
    bind_text(s, st, 4, operation_id);
    DRV->bind_i64(st, 5, now_ms);
  }
  int rc = run(s, st, &n, err);
  *changed = !rc && n > 0;
  return rc;
}

/* ---- runs ---- */

static int fill_run(lg_store_t *s, lg__stmt_t *st, void *out) {
  lg_run_record_t *rec = out;
  int ok = 1;
  memset(rec, 0, sizeof *rec);
  rec->run_id = col_str(s, st, 0, NULL, &ok);
  rec->group = col_str(s, st, 1, NULL, &ok);
  rec->stopped = text_is(s, st, 2, "stopped");
  rec->terminal_reason = col_str(s, st, 3, NULL, &ok);
  rec->policy_json = col_str(s, st, 4, NULL, &ok);
  rec->state = col_str(s, st, 5, &rec->state_len, &ok);
  rec->envelope_json = col_str(s, st, 6, NULL, &ok);
  rec->created_ms = DRV->col_i64(st, 7);
  rec->updated_ms = DRV->col_i64(st, 8);
  if (!ok || !rec->run_id) {
    lg_run_record_clear(rec);
    return LG_ENOMEM;
  }
  return 0;
}

int lg__sql_run_read(lg_store_t *s, const char *run_id, int lock, lg_run_record_t *rec,
                      int *found, lg_error_t *err) {
  *found = 0;
  const lg_run_record_t *hit = cache_get(s, run_id);
  if (hit) {
    *found = 1;
    return lg__run_record_copy(rec, hit) ? lg__err(err, LG_ENOMEM, NULL, -1, "out of memory") : 0;
  }
  lg__stmt_t *st = read_stmt(s, Q_RUN_READ, Q_RUN_READ_LOCK, lock, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  int rc = one(s, st, "reading a run", fill_run, rec, found, err);
  if (*found) cache_put(s, rec);
  return rc;
}

static void bind_run(lg_store_t *s, lg__stmt_t *st, const lg_run_record_t *r) {
  bind_text(s, st, 1, r->run_id);
  bind_text(s, st, 2, r->group);
  bind_text(s, st, 3, r->stopped ? "stopped" : "active");
  bind_text(s, st, 4, r->terminal_reason);
  bind_text(s, st, 5, r->policy_json);
  DRV->bind_blob(st, 6, r->state, r->state_len);
  bind_text(s, st, 7, r->envelope_json);
  DRV->bind_i64(st, 8, r->created_ms);
  DRV->bind_i64(st, 9, r->updated_ms);
}

int lg__sql_run_insert(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                       size_t len, int *inserted, lg_error_t *err) {
  int64_t changes = 0;
  *inserted = 0;
  int tail = len && DRV->dialect->trace_tail;
  lg__stmt_t *st = stmt(s, tail ? Q_RUN_INSERT_EV : Q_RUN_INSERT, err);
  if (!st) return LG_ESTORE;
  bind_run(s, st, rec);
  if (tail) DRV->bind_text(st, 10, lines, len);
  int rc = run(s, st, &changes, err);
  *inserted = !rc && changes > 0;
  if (*inserted) cache_put(s, rec);
  else cache_drop(s, rec->run_id);
  if (!rc && *inserted && len && !tail) rc = lg__sql_ev_append(s, rec->run_id, lines, len, err);
  return rc;
}

/* The usual decision changes only the state (Q_RUN_TOUCH, and with the
 * trace lines Q_RUN_TOUCH_EV): when that changed nothing, something else
 * changed too (or there is no row), and Q_RUN_UPDATE writes it all. */
static int run_write(lg_store_t *s, int touch, const lg_run_record_t *rec, const char *lines,
                     size_t len, int *updated, int *with_lines, lg_error_t *err) {
  int64_t changes = 0;
  *updated = 0;
  lg__stmt_t *st = stmt(s, touch, err);
  if (!st) return LG_ESTORE;
  bind_run(s, st, rec);
  if (lines) DRV->bind_text(st, 10, lines, len);
  int rc = run(s, st, &changes, err);
  *with_lines = lines != NULL;
  if (!rc && !changes) {
    *with_lines = 0;
    if (!(st = stmt(s, Q_RUN_UPDATE, err))) return LG_ESTORE;
    bind_run(s, st, rec);
    rc = run(s, st, &changes, err);
  }
  *updated = !rc && changes > 0;
  if (*updated) cache_update(s, rec);
  else cache_drop(s, rec->run_id);
  return rc;
}

int lg__sql_run_update(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                        lg_error_t *err) {
  int with_lines;
  return run_write(s, Q_RUN_TOUCH, rec, NULL, 0, updated, &with_lines, err);
}

static int run_cb(void *ud, const void *row) {
  const struct {
    lg_store_run_cb cb;
    void *ud;
  } *x = ud;
  return x->cb(x->ud, row);
}

static void clear_run(void *row) { lg_run_record_clear(row); }

int lg__sql_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb, void *ud,
                      lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_RUN_LIST, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, f->status);
  bind_text(s, st, 2, f->reason);
  bind_text(s, st, 3, f->group);
  if (f->limit) DRV->bind_i64(st, 4, (int64_t)f->limit);
  else DRV->bind_null(st, 4);
  DRV->bind_i64(st, 5, f->with_state ? 1 : 0);
  struct {
    lg_store_run_cb cb;
    void *ud;
  } x = {cb, ud};
  return list_rows(s, st, "listing runs", sizeof(lg_run_record_t), fill_run, clear_run, run_cb,
                   &x, err);
}

/* ---- deny rules ---- */

int lg__sql_deny_put(lg_store_t *s, int scope, const char *id, const char *reason,
                      int64_t now_ms, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_DENY_PUT, err);
  if (!st) return LG_ESTORE;
  ((rows_t *)s->impl)->deny_empty = 0;
  DRV->bind_i64(st, 1, scope);
  bind_text(s, st, 2, id);
  bind_text(s, st, 3, reason);
  DRV->bind_i64(st, 4, now_ms);
  return run(s, st, NULL, err);
}

/* Whether lg_deny has no row, as of the open transaction, asked once per
 * transaction of a store with one writer at a time (which no other writer
 * changes while it is open): the server's committer checks the kill
 * switch for every decision of a group commit, and there is seldom a rule
 * at all. Outside a transaction (each statement its own snapshot), never
 * known. */
static int deny_none(lg_store_t *s, int *none, lg_error_t *err) {
  rows_t *r = s->impl;
  *none = 0;
  if (!(DRV->caps & LG__CAP_SINGLE_WRITER) || !DRV->in_txn(s)) return 0;
  if (r->deny_empty < 0) {
    lg__stmt_t *st = stmt(s, Q_DENY_ANY, err);
    if (!st) return LG_ESTORE;
    int rc = DRV->step(s, st, "reading deny rules", err);
    DRV->reset(st);
    if (rc < 0) return rc;
    r->deny_empty = rc == LG__DONE;
  }
  *none = r->deny_empty;
  return 0;
}

static int fill_str(lg_store_t *s, lg__stmt_t *st, void *out) {
  int ok = 1;
  *(char **)out = col_str(s, st, 0, NULL, &ok);
  return ok ? 0 : LG_ENOMEM;
}

int lg__sql_deny_get(lg_store_t *s, const char *run_id, const char *group, int *found,
                      char **reason, lg_error_t *err) {
  *found = 0;
  *reason = NULL;
  int none, rc = deny_none(s, &none, err);
  if (rc || none) return rc;
  lg__stmt_t *st = stmt(s, Q_DENY_GET, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  bind_text(s, st, 2, group);
  return one(s, st, "reading deny rules", fill_str, reason, found, err);
}

/* ---- the gateway's conversation keys ---- */

int lg__store_gw_key_put(lg_store_t *s, const char *key, const char *run_id, const char *data,
                         int64_t now_ms, lg_error_t *err) {
  lg__store_lock(s);
  lg__stmt_t *st = stmt(s, Q_GWKEY_PUT, err);
  int rc = LG_ESTORE;
  if (st) {
    bind_text(s, st, 1, key);
    bind_text(s, st, 2, run_id);
    bind_text(s, st, 3, data);
    DRV->bind_i64(st, 4, now_ms);
    rc = run(s, st, NULL, err);
  }
  lg__store_unlock(s);
  return rc;
}

typedef struct gw_key_row {
  char *run_id, *data;
} gw_key_row_t;

static int fill_gw_key(lg_store_t *s, lg__stmt_t *st, void *out) {
  gw_key_row_t *k = out;
  int ok = 1;
  k->run_id = col_str(s, st, 0, NULL, &ok);
  k->data = col_str(s, st, 1, NULL, &ok);
  return ok ? 0 : LG_ENOMEM;
}

int lg__store_gw_key_get(lg_store_t *s, const char *key, char **run_id, char **data,
                         lg_error_t *err) {
  gw_key_row_t k = {NULL, NULL};
  lg__store_lock(s);
  lg__stmt_t *st = stmt(s, Q_GWKEY_GET, err);
  int found, rc = LG_ESTORE;
  if (st) {
    bind_text(s, st, 1, key);
    rc = one(s, st, "reading a conversation key", fill_gw_key, &k, &found, err);
  }
  lg__store_unlock(s);
  if (rc) { /* a row half read (out of memory) */
    lg__free(k.run_id);
    lg__free(k.data);
    k.run_id = k.data = NULL;
  }
  *run_id = k.run_id;
  if (data) *data = k.data;
  else lg__free(k.data);
  return rc;
}

/* ---- purging runs ---- */

typedef struct purge_pick {
  char *run_id;
  int64_t created_ms, seq;
} purge_pick_t;

static int fill_pick(lg_store_t *s, lg__stmt_t *st, void *out) {
  purge_pick_t *p = out;
  int ok = 1;
  p->run_id = col_str(s, st, 0, NULL, &ok);
  p->created_ms = DRV->col_i64(st, 1);
  p->seq = DRV->col_i64(st, 2);
  return ok && p->run_id ? 0 : LG_ENOMEM;
}
static void clear_pick(void *row) { lg__free(((purge_pick_t *)row)->run_id); }

typedef struct purge_batch {
  lg_store_t *s;
  int64_t before_ms, n, picked;
  lg__store_purge_cursor_t *at;
  lg_error_t *err;
} purge_batch_t;

static int del_by_id(lg_store_t *s, int q, const char *run_id, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, q, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  return run(s, st, NULL, err);
}

/* One picked run: deleted, with its trace, its kill switch and its
 * budget scopes, unless it changed since it was picked. */
static int purge_one(void *ud, const void *row) {
  purge_batch_t *b = ud;
  const purge_pick_t *p = row;
  lg_store_t *s = b->s;
  b->picked++;
  b->at->created_ms = p->created_ms;
  b->at->seq = p->seq;
  lg__stmt_t *st = stmt(s, Q_PURGE_RUN, b->err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, p->run_id);
  DRV->bind_i64(st, 2, b->before_ms);
  int64_t gone = 0;
  int rc = run(s, st, &gone, b->err);
  if (rc || !gone) return rc;
  cache_drop(s, p->run_id);
  b->n++;
  if ((rc = del_by_id(s, Q_PURGE_EVENTS, p->run_id, b->err)) ||
      (rc = del_by_id(s, Q_PURGE_DENY, p->run_id, b->err)))
    return rc;
  return del_by_id(s, Q_RUNSCOPES_DEL, p->run_id, b->err);
}

int lg__sql_runs_purge(lg_store_t *s, int64_t before_ms, lg__store_purge_cursor_t *at, int limit,
                       int64_t *purged, int *more, lg_error_t *err) {
  *purged = 0;
  *more = 0;
  lg__stmt_t *st = stmt(s, Q_PURGE_PICK, err);
  if (!st) return LG_ESTORE;
  DRV->bind_i64(st, 1, before_ms);
  DRV->bind_i64(st, 2, at->created_ms);
  DRV->bind_i64(st, 3, at->seq);
  DRV->bind_i64(st, 4, limit);
  purge_batch_t b = {s, before_ms, 0, 0, at, err};
  int rc = list_rows(s, st, "picking runs to purge", sizeof(purge_pick_t), fill_pick, clear_pick,
                     purge_one, &b, err);
  *purged = b.n;
  *more = !rc && b.picked == limit;
  return rc;
}

int lg__sql_gw_keys_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_PURGE_GWKEYS, err);
  *purged = 0;
  if (!st) return LG_ESTORE;
  DRV->bind_i64(st, 1, before_ms);
  return run(s, st, purged, err);
}

/* ---- budgets ---- */

/* The stored columns of a budget (BUD_STORED). */
static int bud_stored(lg_store_t *s, lg__stmt_t *st, lg__bud_row_t *r) {
  int ok = 1;
  size_t n = 0;
  memset(r, 0, sizeof *r);
  r->scope = col_str(s, st, 0, NULL, &ok);
  r->limit_micro = DRV->col_i64(st, 1);
  const char *period = DRV->col_text(st, 2, &n);
  r->period = period_of(period, n);
  r->max_in_flight_micro = DRV->col_null(st, 3) ? -1 : DRV->col_i64(st, 3);
  r->period_start_ms = DRV->col_i64(st, 4);
  r->spent_micro = DRV->col_i64(st, 5);
  r->reserved_micro = DRV->col_i64(st, 6);
  r->holds = DRV->col_i64(st, 7);
  r->next_expiry_ms = DRV->col_i64(st, 8);
  r->created_ms = DRV->col_i64(st, 9);
  r->updated_ms = DRV->col_i64(st, 10);
  r->live_min_expiry_ms = -1;
  if (!ok || !r->scope) {
    lg__bud_row_clear(r);
    return LG_ENOMEM;
  }
  return 0;
}

/* What the hold rows say, from column `col` on (NULLs: no scan made). */
static void hold_agg(lg_store_t *s, lg__stmt_t *st, int col, lg__bud_row_t *r) {
  r->live_micro = DRV->col_i64(st, col);
  r->live_holds = DRV->col_i64(st, col + 1);
  r->live_min_expiry_ms = DRV->col_null(st, col + 2) ? -1 : DRV->col_i64(st, col + 2);
  r->expired_holds = DRV->col_i64(st, col + 3);
}

/* A row of Q_BUD_READ or Q_BUD_LIST: the stored columns, then the holds. */
static int fill_bud(lg_store_t *s, lg__stmt_t *st, void *out) {
  int rc = bud_stored(s, st, out);
  if (!rc) hold_agg(s, st, 11, out);
  return rc;
}

static int fill_bud_stored(lg_store_t *s, lg__stmt_t *st, void *out) {
  return bud_stored(s, st, out);
}

/* With the row lock (LG__CAP_ROW_LOCKS): the row, its holds, and with
 * drop_id the delete of that hold, sent in one round trip. */
static int bud_lock(lg_store_t *s, const char *scope, int64_t now_ms, const char *drop_id,
                    lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err) {
  lg__stmt_t *lk = stmt(s, Q_BUD_LOCK, err), *hs = stmt(s, Q_HOLD_STATS, err);
  lg__stmt_t *dr = drop_id ? stmt(s, Q_HOLD_DROP, err) : NULL;
  if (!lk || !hs || (drop_id && !dr)) return LG_ESTORE;
  bind_text(s, lk, 1, scope);
  bind_text(s, hs, 1, scope);
  DRV->bind_i64(hs, 2, now_ms);
  if (dr) {
    bind_text(s, dr, 1, scope);
    bind_text(s, dr, 2, drop_id);
  }
  int rc = DRV->send(s, lk, 1, err);
  if (!rc) rc = DRV->send(s, hs, 1, err);
  if (!rc && dr) rc = DRV->send(s, dr, 1, err);
  if (!rc) rc = one(s, lk, "locking a budget", fill_bud_stored, row, found, err);
  if (!rc && *found) {
    int r = DRV->step(s, hs, "reading a budget's holds", err);
    if (r == LG__ROW) hold_agg(s, hs, 0, row);
    if (r >= 0 && dr) r = DRV->step(s, dr, "dropping a hold", err);
    if (r >= 0 && dr) *dropped = DRV->changes(s, dr) > 0;
    if (r < 0) {
      rc = r;
      lg__bud_row_clear(row);
      *found = 0;
    }
  }
  DRV->reset(lk);
  DRV->reset(hs);
  if (dr) DRV->reset(dr);
  return rc;
}

int lg__sql_bud_read(lg_store_t *s, const char *scope, int lock, int64_t now_ms,
                      lg__bud_row_t *row, int *found, lg_error_t *err) {
  *found = 0;
  if (lock && (DRV->caps & LG__CAP_ROW_LOCKS)) {
    int dropped = 0;
    return bud_lock(s, scope, now_ms, NULL, row, found, &dropped, err);
  }
  lg__stmt_t *st = stmt(s, Q_BUD_READ, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, scope);
  DRV->bind_i64(st, 2, now_ms);
  return one(s, st, "reading a budget", fill_bud, row, found, err);
}

int lg__sql_bud_read_drop(lg_store_t *s, const char *scope, int64_t now_ms, const char *id,
                           lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err) {
  *dropped = 0;
  if (DRV->caps & LG__CAP_ROW_LOCKS) return bud_lock(s, scope, now_ms, id, row, found, dropped, err);
  int rc = lg__sql_bud_read(s, scope, 1, now_ms, row, found, err);
  if (rc || !*found) return rc;
  int64_t n = 0;
  lg__stmt_t *st = stmt(s, Q_HOLD_DROP, err);
  if (!st) rc = LG_ESTORE;
  if (!rc) {
    bind_text(s, st, 1, scope);
    bind_text(s, st, 2, id);
    rc = run(s, st, &n, err);
  }
  if (rc) {
    lg__bud_row_clear(row);
    *found = 0;
  }
  *dropped = n > 0;
  return rc;
}

int lg__sql_bud_put(lg_store_t *s, const lg__bud_row_t *r, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_BUD_PUT, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, r->scope);
  DRV->bind_i64(st, 2, r->limit_micro);
  bind_text(s, st, 3, period_names[r->period & 3]);
  if (r->max_in_flight_micro >= 0) DRV->bind_i64(st, 4, r->max_in_flight_micro);
  else DRV->bind_null(st, 4);
  DRV->bind_i64(st, 5, r->period_start_ms);
  DRV->bind_i64(st, 6, r->spent_micro);
  DRV->bind_i64(st, 7, r->reserved_micro);
  DRV->bind_i64(st, 8, r->holds);
  DRV->bind_i64(st, 9, r->next_expiry_ms);
  DRV->bind_i64(st, 10, r->created_ms);
  DRV->bind_i64(st, 11, r->updated_ms);
  return run(s, st, NULL, err);
}

static void clear_bud(void *row) { lg__bud_row_clear(row); }

static int bud_cb(void *ud, const void *row) {
  const struct {
    int (*cb)(void *, const lg__bud_row_t *);
    void *ud;
  } *x = ud;
  return x->cb(x->ud, row);
}

int lg__sql_bud_list(lg_store_t *s, int64_t now_ms, int (*cb)(void *, const lg__bud_row_t *),
                      void *ud, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_BUD_LIST, err);
  if (!st) return LG_ESTORE;
  DRV->bind_null(st, 1);
  DRV->bind_i64(st, 2, now_ms);
  struct {
    int (*cb)(void *, const lg__bud_row_t *);
    void *ud;
  } x = {cb, ud};
  return list_rows(s, st, "listing budgets", sizeof(lg__bud_row_t), fill_bud, clear_bud, bud_cb,
                   &x, err);
}

int lg__sql_hold_put(lg_store_t *s, const char *scope, const char *id, int64_t amount,
                      int64_t expires_ms, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_HOLD_PUT, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, scope);
  bind_text(s, st, 2, id);
  DRV->bind_i64(st, 3, amount);
  DRV->bind_i64(st, 4, expires_ms);
  return run(s, st, NULL, err);
}

int lg__sql_holds_expire(lg_store_t *s, const char *scope, int64_t now_ms, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_HOLDS_EXPIRE, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, scope);
  DRV->bind_i64(st, 2, now_ms);
  return run(s, st, NULL, err);
}

static void bind_resv(lg_store_t *s, lg__stmt_t *st, const lg__resv_row_t *r) {
  bind_text(s, st, 1, r->id);
  DRV->bind_i64(st, 2, r->amount_micro);
  bind_text(s, st, 3, r->scopes);
  bind_text(s, st, 4, r->run_id);
  DRV->bind_i64(st, 5, r->run_seq);
  bind_text(s, st, 6, r->model);
  bind_text(s, st, 7, r->settled ? "settled" : "open");
  DRV->bind_i64(st, 8, r->actual_micro);
  DRV->bind_i64(st, 9, r->created_ms);
  DRV->bind_i64(st, 10, r->expires_ms);
  DRV->bind_i64(st, 11, r->settled_ms);
  DRV->bind_i64(st, 12, r->asked_micro);
}

int lg__sql_resv_insert(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_RESV_INSERT, err);
  if (!st) return LG_ESTORE;
  bind_resv(s, st, r);
  int rc = run(s, st, NULL, err);
  if (rc == LG_ECONFLICT)
    rc = lg__err(err, LG_ECONFLICT, "reservation_id", -1, "reservation \"%s\" exists already",
                 r->id);
  return rc;
}

static int fill_resv(lg_store_t *s, lg__stmt_t *st, void *out) {
  lg__resv_row_t *row = out;
  int ok = 1;
  memset(row, 0, sizeof *row);
  row->id = col_str(s, st, 0, NULL, &ok);
  row->amount_micro = DRV->col_i64(st, 1);
  row->scopes = col_str(s, st, 2, NULL, &ok);
  row->run_id = col_str(s, st, 3, NULL, &ok);
  row->run_seq = DRV->col_i64(st, 4);
  row->model = col_str(s, st, 5, NULL, &ok);
  row->settled = text_is(s, st, 6, "settled");
  row->actual_micro = DRV->col_i64(st, 7);
  row->created_ms = DRV->col_i64(st, 8);
  row->expires_ms = DRV->col_i64(st, 9);
  row->settled_ms = DRV->col_i64(st, 10);
  row->asked_micro = DRV->col_i64(st, 11);
  if (!ok || !row->id || !row->scopes) {
    lg__resv_row_clear(row);
    return LG_ENOMEM;
  }
  return 0;
}

int lg__sql_resv_read(lg_store_t *s, const char *id, int lock, lg__resv_row_t *row,
                       int *found, lg_error_t *err) {
  *found = 0;
  lg__stmt_t *st = read_stmt(s, Q_RESV_READ, Q_RESV_READ_LOCK, lock, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, id);
  return one(s, st, "reading a reservation", fill_resv, row, found, err);
}

int lg__sql_resv_of_run(lg_store_t *s, const char *run_id, int64_t run_seq, int lock,
                         lg__resv_row_t *row, int *found, lg_error_t *err) {
  *found = 0;
  lg__stmt_t *st = run_seq > 0
                       ? read_stmt(s, Q_RESV_OF_RUN, Q_RESV_OF_RUN_LOCK, lock, err)
                       : read_stmt(s, Q_RESV_OLDEST_OF_RUN, Q_RESV_OLDEST_OF_RUN_LOCK, lock, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  if (run_seq > 0) DRV->bind_i64(st, 2, run_seq);
  return one(s, st, "reading a reservation", fill_resv, row, found, err);
}

int lg__sql_resv_update(lg_store_t *s, const lg__resv_row_t *r, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_RESV_UPDATE, err);
  if (!st) return LG_ESTORE;
  bind_resv(s, st, r);
  return run(s, st, NULL, err);
}

int lg__sql_resv_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_RESV_PURGE, err);
  *purged = 0;
  if (!st) return LG_ESTORE;
  DRV->bind_i64(st, 1, before_ms);
  return run(s, st, purged, err);
}

int lg__sql_runscopes_put(lg_store_t *s, const char *run_id, const char *scopes,
                           lg_error_t *err) {
  int put = scopes && *scopes;
  lg__stmt_t *st = stmt(s, put ? Q_RUNSCOPES_PUT : Q_RUNSCOPES_DEL, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  if (put) bind_text(s, st, 2, scopes);
  return run(s, st, NULL, err);
}

int lg__sql_runscopes_get(lg_store_t *s, const char *run_id, char **scopes, int *found,
                           lg_error_t *err) {
  *found = 0;
  *scopes = NULL;
  lg__stmt_t *st = stmt(s, Q_RUNSCOPES_GET, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  return one(s, st, "reading a run's scopes", fill_str, scopes, found, err);
}

/* ---- trace lines ---- */

int lg__sql_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                       lg_error_t *err) {
  int64_t changes = 0;
  int rc;
  lg__stmt_t *st;
  if (DRV->dialect->trace_tail) { /* onto the run's tail */
    if (!(st = stmt(s, Q_EV_TAIL, err))) return LG_ESTORE;
    bind_text(s, st, 1, run_id);
    DRV->bind_text(st, 2, lines, len);
    if ((rc = run(s, st, &changes, err)) || changes) return rc;
  }
  /* No run row (or no tail): the lines go straight to lg_events. */
  if (!(st = stmt(s, Q_EV_APPEND, err))) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  DRV->bind_text(st, 2, lines, len);
  return run(s, st, NULL, err);
}

/* The usual decision: the state and the trace tail in one UPDATE (the
 * lg_runs_trace_tail trigger moves a long tail to lg_events). */
int lg__sql_run_update_ev(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                           size_t len, int *updated, lg_error_t *err) {
  int with_lines = 0;
  int tail = DRV->dialect->trace_tail;
  int rc = run_write(s, tail ? Q_RUN_TOUCH_EV : Q_RUN_TOUCH, rec, tail ? lines : NULL, len,
                     updated, &with_lines, err);
  if (rc || !*updated || with_lines) return rc;
  return lg__sql_ev_append(s, rec->run_id, lines, len, err);
}

/* Appends the text of column 0 of every row of `which` (bound to run_id). */
static int read_texts(lg_store_t *s, int which, const char *run_id, lg__buf_t *out,
                      lg_error_t *err) {
  lg__stmt_t *st = stmt(s, which, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, run_id);
  int rc, ret = 0;
  while ((rc = DRV->step(s, st, "reading a run's trace", err)) == LG__ROW) {
    size_t n = 0;
    const char *v = DRV->col_text(st, 0, &n);
    if (n > 0 && lg__buf_append(out, v, n)) {
      ret = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      break;
    }
  }
  if (!ret && rc < 0) ret = rc;
  DRV->reset(st);
  return ret;
}

int lg__sql_ev_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err) {
  int tail = DRV->dialect->trace_tail;
  /* The blocks, then the tail, from one snapshot: a writer in another
   * process may move the tail into a block in between. */
  int opened = 0;
  int rc = tail && DRV->snapshot ? DRV->snapshot(s, 1, &opened, err) : 0;
  if (rc) return rc;
  size_t at = out->len;
  rc = read_texts(s, Q_EV_READ, run_id, out, err);
  if (!rc && tail) rc = read_texts(s, Q_EV_READ_TAIL, run_id, out, err);
  if (opened) {
    lg_error_t scratch;
    int crc = DRV->snapshot(s, 0, &opened, rc ? &scratch : err);
    if (!rc) rc = crc;
  }
  if (rc && out->data) out->data[out->len = at] = 0;
  return rc;
}

/* ---- what the driver answers for ---- */

int lg__sql_reader(lg_store_t *s, int on, lg_error_t *err) {
  return DRV->reader ? DRV->reader(s, on, err) : LG_ESTATE;
}

int lg__sql_write_probe(lg_store_t *s, int64_t now_ms, lg_error_t *err) {
  return DRV->write_probe ? DRV->write_probe(s, now_ms, err) : 0;
}

int lg__sql_batch(lg_store_t *s) { return DRV->batch ? DRV->batch(s) : 0; }

/* ---- keys ---- */

static void bind_opt_i64(lg_store_t *s, lg__stmt_t *st, int i, int64_t v) {
  if (v < 0) DRV->bind_null(st, i);
  else DRV->bind_i64(st, i, v);
}

static void bind_key(lg_store_t *s, lg__stmt_t *st, const lg__key_row_t *r) {
  bind_text(s, st, 1, r->id);
  bind_text(s, st, 2, r->hash);
  bind_text(s, st, 3, r->name);
  bind_opt_i64(s, st, 4, r->limit_micro);
  bind_text(s, st, 5, period_names[(unsigned)r->reset < 4 ? r->reset : 0]);
  bind_text(s, st, 6, r->workspace);
  DRV->bind_i64(st, 7, r->include_byok ? 1 : 0);
  bind_opt_i64(s, st, 8, r->rate_per_min);
  bind_text(s, st, 9, r->models);
  bind_text(s, st, 10, r->byok);
  DRV->bind_i64(st, 11, r->disabled ? 1 : 0);
  DRV->bind_i64(st, 12, r->created_ms);
  DRV->bind_i64(st, 13, r->rotated_ms);
  DRV->bind_i64(st, 14, r->updated_ms);
}

static int fill_key(lg_store_t *s, lg__stmt_t *st, void *out) {
  lg__key_row_t *r = out;
  int ok = 1;
  memset(r, 0, sizeof *r);
  size_t n = 0;
  r->id = col_str(s, st, 0, NULL, &ok);
  r->hash = col_str(s, st, 1, NULL, &ok);
  r->name = col_str(s, st, 2, NULL, &ok);
  r->limit_micro = DRV->col_null(st, 3) ? -1 : DRV->col_i64(st, 3);
  const char *p = DRV->col_text(st, 4, &n);
  r->reset = p ? period_of(p, n) : 0;
  if (r->reset < 0) r->reset = 0;
  r->workspace = col_str(s, st, 5, NULL, &ok);
  r->include_byok = DRV->col_i64(st, 6) != 0;
  r->rate_per_min = DRV->col_null(st, 7) ? -1 : DRV->col_i64(st, 7);
  r->models = col_str(s, st, 8, NULL, &ok);
  r->byok = col_str(s, st, 9, NULL, &ok);
  r->disabled = DRV->col_i64(st, 10) != 0;
  r->created_ms = DRV->col_i64(st, 11);
  r->rotated_ms = DRV->col_i64(st, 12);
  r->updated_ms = DRV->col_i64(st, 13);
  if (!ok) lg__key_row_clear(r);
  return ok ? 0 : -1;
}

int lg__sql_key_insert(lg_store_t *s, const lg__key_row_t *row, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_KEY_INSERT, err);
  if (!st) return LG_ESTORE;
  bind_key(s, st, row);
  int64_t n = 0;
  int rc = run(s, st, &n, err);
  if (!rc && !n) rc = lg__err(err, LG_ECONFLICT, "key", -1, "a key with this id or hash exists");
  return rc;
}

int lg__sql_key_read(lg_store_t *s, const char *ref, lg__key_row_t *row, int *found,
                     lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_KEY_READ, err);
  *found = 0;
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, ref);
  return one(s, st, "reading a key", fill_key, row, found, err);
}

int lg__sql_key_update(lg_store_t *s, const lg__key_row_t *row, int *updated, lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_KEY_UPDATE, err);
  *updated = 0;
  if (!st) return LG_ESTORE;
  bind_key(s, st, row);
  int64_t n = 0;
  int rc = run(s, st, &n, err);
  *updated = n > 0;
  return rc;
}

static void clear_key(void *row) { lg__key_row_clear(row); }

static int key_cb(void *ud, const void *row) {
  const struct {
    int (*cb)(void *, const lg__key_row_t *);
    void *ud;
  } *x = ud;
  return x->cb(x->ud, row);
}

int lg__sql_key_list(lg_store_t *s, int (*cb)(void *, const lg__key_row_t *), void *ud,
                     lg_error_t *err) {
  lg__stmt_t *st = stmt(s, Q_KEY_LIST, err);
  if (!st) return LG_ESTORE;
  struct {
    int (*cb)(void *, const lg__key_row_t *);
    void *ud;
  } x = {cb, ud};
  return list_rows(s, st, "listing keys", sizeof(lg__key_row_t), fill_key, clear_key, key_cb, &x,
                   err);
}

static int fill_i64(lg_store_t *s, lg__stmt_t *st, void *out) {
  *(int64_t *)out = DRV->col_i64(st, 0);
  return 0;
}

int lg__sql_key_rate(lg_store_t *s, const char *id, int64_t limit, int64_t now_ms, int *allowed,
                     int64_t *window_start_ms, lg_error_t *err) {
  *allowed = 0;
  *window_start_ms = now_ms;
  lg__stmt_t *st = stmt(s, Q_KEY_RATE, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, id);
  DRV->bind_i64(st, 2, now_ms);
  DRV->bind_i64(st, 3, limit);
  int64_t n = 0;
  int rc = run(s, st, &n, err);
  if (rc) return rc;
  *allowed = n > 0;
  if (!(st = stmt(s, Q_KEY_RATE_READ, err))) return LG_ESTORE;
  bind_text(s, st, 1, id);
  int found = 0;
  return one(s, st, "reading a key's rate window", fill_i64, window_start_ms, &found, err);
}

int lg__sql_key_spent_since(lg_store_t *s, const char *scope, int64_t since_ms, int64_t *micro,
                            lg_error_t *err) {
  *micro = 0;
  lg__stmt_t *st = stmt(s, Q_KEY_SPENT, err);
  if (!st) return LG_ESTORE;
  bind_text(s, st, 1, scope);
  DRV->bind_i64(st, 2, since_ms);
  int found = 0;
  return one(s, st, "reading a key's spend", fill_i64, micro, &found, err);
}
