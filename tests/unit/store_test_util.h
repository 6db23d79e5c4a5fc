/*
 * store_test_util.h — what the store tests share: which backends to run
 * (LG_STORE_BACKENDS, default "memory,sqlite"; the PostgreSQL registrations
 * of tests/pg/ set "postgres" and LG_PG_URL), a fresh empty store URL for
 * each test (a new SQLite file in a temporary folder; the PostgreSQL test
 * database emptied), and small helpers. Header-only: each test program is
 * one file plus this.
 *
 * A backend asked for but not reachable is a failure under CI=true and a
 * loud SKIP (exit 77, which CTest counts as skipped) otherwise.
 */
#ifndef LG_STORE_TEST_UTIL_H
#define LG_STORE_TEST_UTIL_H

#include <dirent.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loopguard.h"

#define LGT_MAX_BACKENDS 3

static char lgt_dir[256];      /* temporary folder of this process */
static int lgt_seq;            /* numbers the SQLite files */
static __attribute__((unused)) const char *lgt_backend; /* the backend tested */
static char lgt_url[1024];     /* the URL of the current test's store */

static __attribute__((unused)) int64_t lgt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static __attribute__((unused)) void lgt_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void lgt_rmdir(void) {
  if (!lgt_dir[0]) return;
  DIR *d = opendir(lgt_dir);
  if (d) {
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
        snprintf(p, sizeof p, "%s/%s", lgt_dir, e->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(lgt_dir);
  lgt_dir[0] = 0;
}

static pid_t lgt_owner; /* only the process that made the folder removes it */

static void lgt_cleanup(void) {
  if (getpid() == lgt_owner) lgt_rmdir();
}

static const char *lgt_tmpdir(void) {
  if (!lgt_dir[0]) {
    snprintf(lgt_dir, sizeof lgt_dir, "/tmp/lgstore.XXXXXX");
    if (!mkdtemp(lgt_dir)) {
      perror("mkdtemp");
      exit(1);
    }
    lgt_owner = getpid();
    atexit(lgt_cleanup);
  }
  return lgt_dir;
}

/* The conninfo of the PostgreSQL test database (LG_PG_URL without its
 * "postgres:"), or NULL. */
static const char *lgt_pg_conninfo(void) {
  const char *u = getenv("LG_PG_URL");
  if (!u || !*u) return NULL;
  return strncmp(u, "postgres:", 9) ? u : u + 9;
}

static void lgt_quiet(void *arg, const char *msg) {
  (void)arg;
  (void)msg;
}

/* Runs SQL on the test database directly (setup, and faults). Returns 0. */
static __attribute__((unused)) int lgt_pg_exec(const char *sql) {
  PGconn *c = PQconnectdb(lgt_pg_conninfo());
  if (PQstatus(c) != CONNECTION_OK) {
    fprintf(stderr, "cannot connect to the test database: %s", PQerrorMessage(c));
    PQfinish(c);
    return -1;
  }
  PQsetNoticeProcessor(c, lgt_quiet, NULL);
  PGresult *r = PQexec(c, sql);
  int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
  if (!ok) fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  PQfinish(c);
  return ok ? 0 : -1;
}

/* Parses LG_STORE_BACKENDS (else `dflt`) into names[]; checks that each
 * can be had. */
static __attribute__((unused)) int lgt_backends(const char *names[LGT_MAX_BACKENDS], const char *dflt) {
  static char buf[128];
  const char *env = getenv("LG_STORE_BACKENDS");
  snprintf(buf, sizeof buf, "%s", env && *env ? env : dflt);
  int n = 0;
  for (char *tok = strtok(buf, ","); tok && n < LGT_MAX_BACKENDS; tok = strtok(NULL, ",")) {
    if (!strcmp(tok, "postgres") && !lgt_pg_conninfo()) {
      const char *ci = getenv("CI");
      if (ci && !strcmp(ci, "true")) {
        fprintf(stderr, "FAIL: postgres asked for but LG_PG_URL is not set (run through tests/pg/with-postgres.sh)\n");
        exit(1);
      }
      fprintf(stderr, "\n*** SKIP: postgres backend: LG_PG_URL is not set ***\n\n");
      exit(77);
    }
    names[n++] = tok;
  }
  return n;
}

/* A URL for a new, empty store of `backend` (static buffer). */
static __attribute__((unused)) const char *lgt_fresh_url(const char *backend) {
  if (!strcmp(backend, "memory")) {
    snprintf(lgt_url, sizeof lgt_url, "memory:");
  } else if (!strcmp(backend, "sqlite")) {
    snprintf(lgt_url, sizeof lgt_url, "sqlite:%s/store%d.db", lgt_tmpdir(), ++lgt_seq);
  } else {
    if (lgt_pg_exec("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")) exit(1);
    snprintf(lgt_url, sizeof lgt_url, "postgres:%s", lgt_pg_conninfo());
  }
  return lgt_url;
}

/* Opens a store or fails the program with the error. */
static __attribute__((unused)) lg_store_t *lgt_open(const char *url, const lg_store_options_t *o) {
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(url, o, &err);
  if (!s) {
    char msg[1024];
    fprintf(stderr, "cannot open %s: %s\n", url, lg_error_format(&err, msg, sizeof msg));
    exit(1);
  }
  return s;
}

#endif
