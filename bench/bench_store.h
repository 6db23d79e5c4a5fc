/*
 * bench_store.h — what bench_ledger and bench_budget share: the clocks,
 * the median of rounds, dying with a store's error, and main(): the options (--quick, --ops N, --only sqlite|postgres, and
 * LG_BENCH_QUICK=1), the SQLite figures, then the PostgreSQL ones on
 * $LG_PG_URL, else on a throwaway server started by
 * tests/pg/with-postgres.sh (fsync on; the benchmark re-runs itself under
 * it), else a SKIPPED line. Exit status: 0 whatever the figures, 1 when
 * the PostgreSQL run failed, 2 bad usage.
 */
#ifndef LG_BENCH_STORE_H
#define LG_BENCH_STORE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loopguard.h"

#ifndef BENCH_NAME
#error "define BENCH_NAME (the program's name, for messages) before including bench_store.h"
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, const lg_error_t *err) {
  char buf[1024];
  fprintf(stderr, BENCH_NAME ": %s: %s\n", what, err ? lg_error_format(err, buf, sizeof buf) : "");
  exit(1);
}

static int bench_store_main(int argc, char **argv, long *ops, void (*run_sqlite)(void),
                            void (*run_pg)(const char *url)) {
  const char *name = BENCH_NAME;
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) *ops = 200;
    else if (!strcmp(argv[i], "--ops") && i + 1 < argc) *ops = atol(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--quick] [--ops N] [--only sqlite|postgres]\n", name);
      return 2;
    }
  }
  const char *q = getenv("LG_BENCH_QUICK");
  if (q && !strcmp(q, "1")) *ops = 200;
  if (*ops < 10) *ops = 10;
  if (!only || !strcmp(only, "sqlite")) run_sqlite();
  if (only && strcmp(only, "postgres")) return 0;
  const char *pg = getenv("LG_PG_URL");
  if (pg && *pg) {
    run_pg(pg);
    return 0;
  }
#ifdef LG_PG_HARNESS
  if (access(LG_PG_HARNESS, R_OK) == 0) {
    /* A throwaway server for this benchmark alone, with fsync on. */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "LG_PG_FSYNC=on CI= bash '%s' '%s' --only postgres --ops %ld",
             LG_PG_HARNESS, argv[0], *ops);
    fflush(stdout);
    int rc = system(cmd);
    if (rc == 0) return 0;
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
      printf("postgres figures SKIPPED: no PostgreSQL server could be started\n");
      return 0;
    }
    fprintf(stderr, "%s: the PostgreSQL run failed (status %d)\n", name, rc);
    return 1;
  }
#endif
  printf("postgres figures SKIPPED: set LG_PG_URL (or run from a source tree with "
         "tests/pg/with-postgres.sh)\n");
  return 0;
}

#endif
