/*
 * bench_ledger.c — durable ledger claims per second on SQLite and on
 * PostgreSQL, each beside its own floor measured on the same database in
 * the same run: a bare loop of single-row `INSERT ... ON CONFLICT DO
 * NOTHING` statements, each its own durable transaction.
 *
 * Figures (one JSON line each, then a line for a person), per backend:
 *   bare_insert   the floor: autocommit single-row inserts, through the
 *                 backend's own client, with the store's durability
 *                 (SQLite WAL + synchronous=FULL; PostgreSQL
 *                 synchronous_commit=on).
 *   claim         lg_store_claim of a new key: one durable claim. The bar
 *                 (issue 3): SQLite at 70% or more of bare_insert.
 *   claim_commit  lg_store_claim + lg_store_commit: a whole operation.
 *                 It is two durable writes by design — the claim must be
 *                 on disk before the side effect runs, the outcome after —
 *                 so its floor is half of bare_insert; the line gives both
 *                 ratios (to bare_insert and to that two-write floor).
 * The three loops are interleaved, ROUNDS times, and each figure is the
 * median of its rounds, so that a disk that slows down during the run
 * does not favour one of them.
 *
 * SQLite runs on a file in a new folder under $TMPDIR (or /tmp).
 * PostgreSQL runs on $LG_PG_URL when it is set; else the benchmark
 * re-runs itself under tests/pg/with-postgres.sh (a throwaway server with
 * fsync on); when no server can be had its figures are SKIPPED (said so).
 *
 * Usage: bench_ledger [--quick] [--ops N] [--only sqlite|postgres]
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

#define BENCH_NAME "bench_ledger"
#include "bench_store.h"

#define BAR_SQLITE_CLAIM_RATIO 0.70
#define ROUNDS 5

static long ops = 1000;
static const char *fp = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* ---- the store loops ---- */

static double store_claims(lg_store_t *s, const char *tag, int round) {
  lg_claim_t c;
  lg_error_t err = {0};
  char key[64];
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    snprintf(key, sizeof key, "%s-claim-%d-%ld", tag, round, i);
    if (lg_store_claim(s, key, fp, "bench", 60000, wall_ms(), &c, &err)) die("claim", &err);
    if (c.outcome != LG_CLAIM_CLAIMED) die("claim: not claimed", NULL);
  }
  return (double)ops / (now_s() - t0);
}

static double store_cycles(lg_store_t *s, const char *tag, int round) {
  lg_claim_t c;
  lg_error_t err = {0};
  char key[64];
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    snprintf(key, sizeof key, "%s-cycle-%d-%ld", tag, round, i);
    if (lg_store_claim(s, key, fp, "bench", 60000, wall_ms(), &c, &err)) die("claim", &err);
    if (c.outcome != LG_CLAIM_CLAIMED) die("claim: not claimed", NULL);
    if (lg_store_commit(s, key, "{\"ok\":true}", 11, NULL, wall_ms(), &err)) die("commit", &err);
  }
  return (double)ops / (now_s() - t0);
}

/* ---- the floors ---- */

static double sqlite_bare(sqlite3 *db, sqlite3_stmt *st, int round) {
  char key[64];
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    snprintf(key, sizeof key, "bare-%d-%ld", round, i);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) {
      fprintf(stderr, "bench_ledger: bare insert: %s\n", sqlite3_errmsg(db));
      exit(1);
    }
    sqlite3_reset(st);
  }
  return (double)ops / (now_s() - t0);
}

static double pg_bare(PGconn *c, int round) {
  char key[64];
  double t0 = now_s();
  for (long i = 0; i < ops; i++) {
    snprintf(key, sizeof key, "bare-%d-%ld", round, i);
    const char *v[1] = {key};
    PGresult *r = PQexecPrepared(c, "bare", 1, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      fprintf(stderr, "bench_ledger: bare insert: %s", PQresultErrorMessage(r));
      exit(1);
    }
    PQclear(r);
  }
  return (double)ops / (now_s() - t0);
}

/* ---- reporting ---- */

static void report(const char *backend, double bare, double claim, double cycle, int gate) {
  double rc = claim / bare, ry = cycle / bare, r2 = cycle / (bare / 2);
  const char *st = !gate ? "info" : rc >= BAR_SQLITE_CLAIM_RATIO ? "ok" : "BELOW BAR";
  printf("{\"bench\":\"ledger\",\"backend\":\"%s\",\"figure\":\"bare_insert\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f}\n",
         backend, ops, ROUNDS, bare);
  printf("{\"bench\":\"ledger\",\"backend\":\"%s\",\"figure\":\"claim\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f,\"bare_insert_per_s\":%.0f,\"ratio\":%.3f",
         backend, ops, ROUNDS, claim, bare, rc);
  if (gate) printf(",\"bar_ratio\":%.2f", BAR_SQLITE_CLAIM_RATIO);
  printf(",\"status\":\"%s\"}\n", st);
  printf("{\"bench\":\"ledger\",\"backend\":\"%s\",\"figure\":\"claim_commit\",\"ops\":%ld,"
         "\"rounds\":%d,\"per_s\":%.0f,\"bare_insert_per_s\":%.0f,\"ratio\":%.3f,"
         "\"ratio_to_two_write_floor\":%.3f}\n",
         backend, ops, ROUNDS, cycle, bare, ry, r2);
  printf("%-8s bare INSERT ON CONFLICT DO NOTHING %8.0f /s   (floor)\n", backend, bare);
  printf("%-8s durable claim                      %8.0f /s   %5.1f%% of the floor%s\n", backend,
         claim, 100 * rc,
         gate ? (rc >= BAR_SQLITE_CLAIM_RATIO ? "  (bar 70%: ok)" : "  (bar 70%: BELOW BAR)")
              : "");
  printf("%-8s claim + commit                     %8.0f /s   %5.1f%% of the floor, %5.1f%% of "
         "two bare writes\n",
         backend, cycle, 100 * ry, 100 * r2);
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
  snprintf(path, sizeof path, "%s/ledger.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(url, NULL, &err);
  if (!s) die("opening the SQLite store", &err);
  /* The floor, on the same file, with the store's settings. */
  sqlite3 *db;
  sqlite3_stmt *st;
  if (sqlite3_open(path, &db) != SQLITE_OK ||
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                   "CREATE TABLE bench_bare (k TEXT PRIMARY KEY)",
                   NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO bench_bare (k) VALUES (?1) ON CONFLICT DO NOTHING", -1,
                         &st, NULL) != SQLITE_OK) {
    fprintf(stderr, "bench_ledger: sqlite: %s\n", sqlite3_errmsg(db));
    exit(1);
  }
  double b[ROUNDS], c[ROUNDS], y[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    b[r] = sqlite_bare(db, st, r);
    c[r] = store_claims(s, "sq", r);
    y[r] = store_cycles(s, "sq", r);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  lg_store_close(s);
  report("sqlite", median(b, ROUNDS), median(c, ROUNDS), median(y, ROUNDS), 1);
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
  const char *conninfo = strncmp(url, "postgres:", 9) || !strncmp(url, "postgres://", 11)
                             ? url
                             : url + 9;
  PGconn *c = PQconnectdb(conninfo);
  if (PQstatus(c) != CONNECTION_OK) {
    fprintf(stderr, "bench_ledger: postgres: %s", PQerrorMessage(c));
    exit(1);
  }
  PGresult *r = PQexec(c, "SET synchronous_commit = on; SET client_min_messages = warning;"
                          "DROP TABLE IF EXISTS bench_bare;"
                          "CREATE TABLE bench_bare (k TEXT PRIMARY KEY)");
  PQclear(r);
  r = PQprepare(c, "bare", "INSERT INTO bench_bare (k) VALUES ($1) ON CONFLICT DO NOTHING", 1,
                NULL);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) {
    fprintf(stderr, "bench_ledger: postgres: %s", PQresultErrorMessage(r));
    exit(1);
  }
  PQclear(r);
  char tag[32];
  snprintf(tag, sizeof tag, "pg%lld", (long long)wall_ms());
  double b[ROUNDS], cl[ROUNDS], y[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    b[i] = pg_bare(c, i);
    cl[i] = store_claims(s, tag, i);
    y[i] = store_cycles(s, tag, i);
  }
  r = PQexec(c, "DROP TABLE bench_bare");
  PQclear(r);
  PQfinish(c);
  lg_store_close(s);
  report("postgres", median(b, ROUNDS), median(cl, ROUNDS), median(y, ROUNDS), 0);
}

int main(int argc, char **argv) {
  return bench_store_main(argc, argv, &ops, bench_sqlite, bench_pg);
}
