/*
 * bench_budget.c — shared-budget reservations per second on SQLite and on
 * PostgreSQL, each beside its own floor measured on the same database in
 * the same run: a bare loop of single-row `UPDATE` statements, each its
 * own durable transaction (what the cheapest possible "spend counter"
 * costs on that database).
 *
 * Figures (one JSON line each, then a line for a person), per backend:
 *   bare_update        the floor: autocommit single-row UPDATEs through the
 *                      backend's own client, with the store's durability
 *                      (SQLite WAL + synchronous=FULL; PostgreSQL
 *                      synchronous_commit=on).
 *   reserve_settle     lg_budget_reserve + lg_budget_settle on one scope: a
 *                      whole model call's spend gate. It is two durable
 *                      transactions by design — the hold must be on disk
 *                      before the call is made, the cost after — so its
 *                      floor is half of bare_update; the line gives both
 *                      ratios (to bare_update and to that two-write floor).
 *   reserve            the reserve half alone (timed inside the same loop).
 *   reserve_settle_3   the same over three scopes at once (key, workspace,
 *                      team), all or none.
 * The loops are interleaved, ROUNDS times, and each figure is the median of
 * its rounds, so that a disk that slows down during the run does not
 * favour one of them.
 *
 * SQLite runs on a file in a new folder under $TMPDIR (or /tmp).
 * PostgreSQL runs on $LG_PG_URL when it is set; else the benchmark re-runs
 * itself under tests/pg/with-postgres.sh (a throwaway server with fsync
 * on); when no server can be had its figures are SKIPPED (said so).
 *
 * Usage: bench_budget [--quick] [--ops N] [--only sqlite|postgres]
 * Exit status: 0 whatever the figures; 1 when a call failed.
 */
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "bench_budget"
#include "bench_store.h"

#define ROUNDS 5

static long ops = 1000;

/* ---- the store loops ---- */

static const char *one_scope[1] = {"key:bench"};
static const char *three_scopes[3] = {"key:bench", "workspace:bench", "team:bench"};

static void setup_budgets(lg_store_t *s) {
  lg_error_t err = {0};
  for (int i = 0; i < 3; i++)
    if (lg_budget_set(s, three_scopes[i], LG_BUDGET_MAX_MICRO, LG_PERIOD_NONE, -1, wall_ms(), NULL,
                      &err))
      die("set", &err);
}

/* reserve + settle cycles per second over `scopes`; *reserve_per_s gets
 * the rate of the reserve calls alone. */
static double cycles(lg_store_t *s, const char *const *scopes, size_t n, double *reserve_per_s) {
  lg_error_t err = {0};
  lg_budget_request_t req = {.scopes = scopes, .nscopes = n, .ttl_ms = 60000};
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  double in_reserve = 0;
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    req.amount_micro = 1000 + i % 1000;
    double a = now_s();
    int rc = lg_budget_reserve(s, &req, wall_ms(), &r, &why, &err);
    in_reserve += now_s() - a;
    if (rc == LG_BUDGET_REFUSED) die("reserve refused", NULL);
    if (rc) die("reserve", &err);
    if (lg_budget_settle(s, r.id, 500, wall_ms(), NULL, &err)) die("settle", &err);
  }
  double total = now_s() - t0;
  if (reserve_per_s) *reserve_per_s = (double)ops / in_reserve;
  return (double)ops / total;
}

/* ---- the floors ---- */

static double sqlite_bare(sqlite3 *db, sqlite3_stmt *st) {
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    if (sqlite3_step(st) != SQLITE_DONE) {
      fprintf(stderr, "bench_budget: bare update: %s\n", sqlite3_errmsg(db));
      exit(1);
    }
    sqlite3_reset(st);
  }
  return (double)ops / (now_s() - t0);
}

static double pg_bare(PGconn *c) {
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    PGresult *r = PQexecPrepared(c, "bare", 0, NULL, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      fprintf(stderr, "bench_budget: bare update: %s", PQresultErrorMessage(r));
      exit(1);
    }
    PQclear(r);
  }
  return (double)ops / (now_s() - t0);
}

/* ---- reporting ---- */

static void report(const char *backend, double bare, double cyc, double res, double cyc3) {
  double r = cyc / bare, r2 = cyc / (bare / 2), rr = res / bare, r3 = cyc3 / (bare / 2);
  printf("{\"bench\":\"budget\",\"backend\":\"%s\",\"figure\":\"bare_update\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f}\n",
         backend, ops, ROUNDS, bare);
  printf("{\"bench\":\"budget\",\"backend\":\"%s\",\"figure\":\"reserve_settle\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f,\"bare_update_per_s\":%.0f,\"ratio\":%.3f,"
         "\"ratio_to_two_write_floor\":%.3f}\n",
         backend, ops, ROUNDS, cyc, bare, r, r2);
  printf("{\"bench\":\"budget\",\"backend\":\"%s\",\"figure\":\"reserve\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f,\"bare_update_per_s\":%.0f,\"ratio\":%.3f}\n",
         backend, ops, ROUNDS, res, bare, rr);
  printf("{\"bench\":\"budget\",\"backend\":\"%s\",\"figure\":\"reserve_settle_3_scopes\","
         "\"ops\":%ld,\"rounds\":%d,\"per_s\":%.0f,\"bare_update_per_s\":%.0f,\"ratio\":%.3f,"
         "\"ratio_to_two_write_floor\":%.3f}\n",
         backend, ops, ROUNDS, cyc3, bare, cyc3 / bare, r3);
  printf("%-8s bare single-row UPDATE, durable    %8.0f /s   (floor)\n", backend, bare);
  printf("%-8s reserve + settle (1 scope)         %8.0f /s   %5.1f%% of the floor, %5.1f%% of "
         "two bare writes\n",
         backend, cyc, 100 * r, 100 * r2);
  printf("%-8s   of which reserve alone           %8.0f /s   %5.1f%% of the floor\n", backend, res,
         100 * rr);
  printf("%-8s reserve + settle (3 scopes)        %8.0f /s   %5.1f%% of the floor, %5.1f%% of "
         "two bare writes\n",
         backend, cyc3, 100 * cyc3 / bare, 100 * r3);
  fflush(stdout);
}

/* ---- backends ---- */

static void bench_sqlite(void) {
  char dir[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/lgbench.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(1);
  }
  char path[300], url[320];
  snprintf(path, sizeof path, "%s/budget.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(url, NULL, &err);
  if (!s) die("opening the SQLite store", &err);
  setup_budgets(s);
  /* The floor, on the same file, with the store's settings. */
  sqlite3 *db;
  sqlite3_stmt *st;
  if (sqlite3_open(path, &db) != SQLITE_OK ||
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                   "CREATE TABLE bench_floor (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);"
                   "INSERT INTO bench_floor VALUES (1, 0)",
                   NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "UPDATE bench_floor SET v = v + 1 WHERE k = 1", -1, &st, NULL) !=
          SQLITE_OK) {
    fprintf(stderr, "bench_budget: sqlite: %s\n", sqlite3_errmsg(db));
    exit(1);
  }
  sqlite3_busy_timeout(db, 5000);
  double b[ROUNDS], c[ROUNDS], r[ROUNDS], c3[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    b[i] = sqlite_bare(db, st);
    c[i] = cycles(s, one_scope, 1, &r[i]);
    c3[i] = cycles(s, three_scopes, 3, NULL);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  lg_store_close(s);
  report("sqlite", median(b, ROUNDS), median(c, ROUNDS), median(r, ROUNDS), median(c3, ROUNDS));
  char f[400];
  const char *sfx[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(f, sizeof f, "%s%s", path, sfx[i]);
    unlink(f);
  }
  rmdir(dir);
}

static void bench_pg(const char *url) {
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(url, NULL, &err);
  if (!s) die("opening the PostgreSQL store", &err);
  setup_budgets(s);
  const char *conninfo = strncmp(url, "postgres:", 9) || !strncmp(url, "postgres://", 11)
                             ? url
                             : url + 9;
  PGconn *c = PQconnectdb(conninfo);
  if (PQstatus(c) != CONNECTION_OK) {
    fprintf(stderr, "bench_budget: postgres: %s", PQerrorMessage(c));
    exit(1);
  }
  PGresult *r = PQexec(c, "SET synchronous_commit = on; SET client_min_messages = warning;"
                          "DROP TABLE IF EXISTS bench_floor;"
                          "CREATE TABLE bench_floor (k INTEGER PRIMARY KEY, v BIGINT NOT NULL);"
                          "INSERT INTO bench_floor VALUES (1, 0)");
  PQclear(r);
  r = PQprepare(c, "bare", "UPDATE bench_floor SET v = v + 1 WHERE k = 1", 0, NULL);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) {
    fprintf(stderr, "bench_budget: postgres: %s", PQresultErrorMessage(r));
    exit(1);
  }
  PQclear(r);
  double b[ROUNDS], cy[ROUNDS], rs[ROUNDS], c3[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    b[i] = pg_bare(c);
    cy[i] = cycles(s, one_scope, 1, &rs[i]);
    c3[i] = cycles(s, three_scopes, 3, NULL);
  }
  r = PQexec(c, "DROP TABLE bench_floor");
  PQclear(r);
  PQfinish(c);
  lg_store_close(s);
  report("postgres", median(b, ROUNDS), median(cy, ROUNDS), median(rs, ROUNDS),
         median(c3, ROUNDS));
}

int main(int argc, char **argv) {
  return bench_store_main(argc, argv, &ops, bench_sqlite, bench_pg);
}
