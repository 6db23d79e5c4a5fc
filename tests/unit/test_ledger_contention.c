/*
 * test_ledger_contention.c — exactly one winner under contention.
 *
 * 16 processes (fork: each its own connection, as separate workers or
 * servers would be) claim the same key at the same moment, round after
 * round: in every round exactly one gets `claimed` and every other one
 * `in_progress` or `replay`, never an error. A second test has 4 processes
 * increment a counter kept in one run's record through lg_store_with_run,
 * read-modify-write without any lock of their own: no increment is lost,
 * so decisions for one run serialize as one worker's would.
 *
 * Backends: sqlite (a file in a temporary folder) by default; postgres
 * when registered by tests/pg/. memory: is private to a process, so it is
 * covered by 16 threads sharing one handle instead.
 *
 * The start of each round is a byte written to each child's own pipe, so
 * that all children are blocked in read() and wake together; results come
 * back as fixed-size records on one pipe (atomic below PIPE_BUF).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "store_test_util.h"

#define WORKERS 16
#define ROUNDS 30
#define FP "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"

static const char *backend;
static int total_in_progress, total_replay; /* over the rounds, for the log */

typedef struct rec {
  int round;   /* which round */
  int worker;  /* which worker */
  int rc;      /* lg_store_claim's return */
  int outcome; /* lg_claim_outcome_t */
} rec_t;

/* One worker's claim in one round; the winner commits its result, after a
 * short pause in odd rounds so that the others see in_progress then. */
static rec_t claim_once(lg_store_t *s, int round, int worker) {
  char key[32], run[32];
  snprintf(key, sizeof key, "round-%d", round);
  snprintf(run, sizeof run, "worker-%d", worker);
  lg_claim_t c = {0};
  lg_error_t err = {0};
  rec_t r = {round, worker, 0, 0};
  r.rc = lg_store_claim(s, key, FP, run, 30000, lgt_now_ms(), &c, &err);
  r.outcome = c.outcome;
  if (r.rc) fprintf(stderr, "worker %d round %d: %s: %s\n", worker, round,
                    lg_err_name(r.rc), err.message);
  lg_claim_clear(&c);
  if (!r.rc && r.outcome == LG_CLAIM_CLAIMED) {
    if (round % 2) lgt_sleep_ms(3);
    int rc = lg_store_commit(s, key, "{\"done\":true}", 13, NULL, lgt_now_ms(), &err);
    if (rc) {
      fprintf(stderr, "worker %d commit: %s\n", worker, err.message);
      r.rc = rc;
    }
  }
  return r;
}

/* Checks one round's records: one winner, the rest in_progress/replay. */
static void tally(const rec_t *recs, int n, int round) {
  int claimed = 0, in_progress = 0, replay = 0;
  for (int i = 0; i < n; i++) {
    assert_int_equal(recs[i].round, round);
    assert_int_equal(recs[i].rc, 0);
    switch (recs[i].outcome) {
    case LG_CLAIM_CLAIMED: claimed++; break;
    case LG_CLAIM_IN_PROGRESS: in_progress++; break;
    case LG_CLAIM_REPLAY: replay++; break;
    default: fail_msg("round %d: worker %d got %s", round, recs[i].worker,
                      lg_claim_outcome_name(recs[i].outcome));
    }
  }
  if (claimed != 1) fail_msg("round %d: %d winners", round, claimed);
  total_in_progress += in_progress;
  total_replay += replay;
  assert_int_equal(claimed + in_progress + replay, n);
}

static void write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(3);
    b += w;
    n -= (size_t)w;
  }
}

static int read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static void reap(pid_t *pids, int n) {
  for (int i = 0; i < n; i++) {
    int st = 0;
    if (pids[i] <= 0) continue;
    waitpid(pids[i], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      fail_msg("worker %d ended badly (status %d)", i, st);
  }
}

static void test_one_winner_processes(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_close(lgt_open(url, NULL)); /* create the schema first */
  int go[WORKERS][2], res[2];
  pid_t pids[WORKERS];
  assert_int_equal(pipe(res), 0);
  for (int w = 0; w < WORKERS; w++) {
    assert_int_equal(pipe(go[w]), 0);
    pids[w] = fork();
    assert_true(pids[w] >= 0);
    if (pids[w] == 0) {
      close(res[0]);
      lg_store_t *s = lgt_open(url, NULL);
      for (int r = 0; r < ROUNDS; r++) {
        char b;
        if (read_all(go[w][0], &b, 1)) _exit(4);
        rec_t rec = claim_once(s, r, w);
        write_all(res[1], &rec, sizeof rec);
      }
      lg_store_close(s);
      _exit(0);
    }
    close(go[w][0]);
  }
  close(res[1]);
  int64_t t0 = lgt_now_ms();
  total_in_progress = total_replay = 0;
  for (int r = 0; r < ROUNDS; r++) {
    for (int w = 0; w < WORKERS; w++) write_all(go[w][1], "g", 1);
    rec_t recs[WORKERS];
    for (int i = 0; i < WORKERS; i++)
      if (read_all(res[0], &recs[i], sizeof recs[i])) fail_msg("a worker died in round %d", r);
    tally(recs, WORKERS, r);
  }
  for (int w = 0; w < WORKERS; w++) close(go[w][1]);
  close(res[0]);
  reap(pids, WORKERS);
  printf("%s: %d rounds x %d processes: one winner each round; the others %d in_progress, "
         "%d replay (%lld ms)\n",
         backend, ROUNDS, WORKERS, total_in_progress, total_replay,
         (long long)(lgt_now_ms() - t0));
}

/* memory: threads on one handle. */
typedef struct th {
  lg_store_t *s;
  int worker;
  pthread_barrier_t *bar;
  rec_t recs[ROUNDS];
} th_t;

static void *thread_main(void *arg) {
  th_t *t = arg;
  for (int r = 0; r < ROUNDS; r++) {
    pthread_barrier_wait(t->bar);
    t->recs[r] = claim_once(t->s, r, t->worker);
  }
  return NULL;
}

static void test_one_winner_threads(void **state) {
  (void)state;
  lg_store_t *s = lgt_open(lgt_fresh_url(backend), NULL);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, WORKERS);
  static th_t th[WORKERS];
  pthread_t tid[WORKERS];
  for (int w = 0; w < WORKERS; w++) {
    th[w] = (th_t){.s = s, .worker = w, .bar = &bar};
    assert_int_equal(pthread_create(&tid[w], NULL, thread_main, &th[w]), 0);
  }
  for (int w = 0; w < WORKERS; w++) pthread_join(tid[w], NULL);
  for (int r = 0; r < ROUNDS; r++) {
    rec_t recs[WORKERS];
    for (int w = 0; w < WORKERS; w++) recs[w] = th[w].recs[r];
    tally(recs, WORKERS, r);
  }
  pthread_barrier_destroy(&bar);
  lg_store_close(s);
}

/* ---- decisions for one run serialize ---- */

#define RUN_WORKERS 4
#define RUN_STEPS 25

static int bump(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud;
  long n = strtol(rec->envelope_json, NULL, 10);
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", n + 1);
  lg_run_record_t r = *rec;
  r.envelope_json = buf;
  /* Widen the window between the read and the write. */
  if (n % 3 == 0) lgt_sleep_ms(1);
  return lg_store_run_put(s, &r, NULL);
}

static void test_run_decisions_serialize(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_t *s = lgt_open(url, NULL);
  lg_run_record_t rec = {.run_id = "shared-run", .envelope_json = "0", .created_ms = 1,
                         .updated_ms = 1};
  assert_int_equal(lg_store_run_create(s, &rec, NULL), 0);
  if (!strcmp(backend, "memory")) {
    for (int i = 0; i < RUN_WORKERS * RUN_STEPS; i++)
      assert_int_equal(lg_store_with_run(s, "shared-run", bump, NULL, NULL), 0);
  } else {
    lg_store_close(s);
    pid_t pids[RUN_WORKERS];
    for (int w = 0; w < RUN_WORKERS; w++) {
      pids[w] = fork();
      assert_true(pids[w] >= 0);
      if (pids[w] == 0) {
        lg_store_t *cs = lgt_open(url, NULL);
        for (int i = 0; i < RUN_STEPS; i++) {
          lg_error_t err = {0};
          int rc;
          while ((rc = lg_store_with_run(cs, "shared-run", bump, NULL, &err)) == LG_EBUSY) {
          }
          if (rc) {
            fprintf(stderr, "with_run: %s\n", err.message);
            _exit(5);
          }
        }
        lg_store_close(cs);
        _exit(0);
      }
    }
    reap(pids, RUN_WORKERS);
    s = lgt_open(url, NULL);
  }
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "shared-run", &got, NULL), 0);
  assert_int_equal(strtol(got.envelope_json, NULL, 10), RUN_WORKERS * RUN_STEPS);
  lg_run_record_clear(&got);
  lg_store_close(s);
}

int main(void) {
  const struct CMUnitTest procs[] = {
      cmocka_unit_test(test_one_winner_processes),
      cmocka_unit_test(test_run_decisions_serialize),
  };
  const struct CMUnitTest threads[] = {
      cmocka_unit_test(test_one_winner_threads),
      cmocka_unit_test(test_run_decisions_serialize),
  };
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char group[64];
    backend = names[i];
    snprintf(group, sizeof group, "ledger contention: %s", backend);
    if (!strcmp(backend, "memory"))
      failed += cmocka_run_group_tests_name(group, threads, NULL, NULL);
    else
      failed += cmocka_run_group_tests_name(group, procs, NULL, NULL);
  }
  return failed ? 1 : 0;
}
