/*
 * test_group.c — the group commit's waited-for run (lg__batcher_run,
 * src/store/group.c), which the gateway's workers use for every step:
 *
 * - on an idle committer, the job runs on the caller's own thread (no
 *   hand-over, which cost a gateway request two thread wake-ups a step)
 *   and its result comes back;
 * - while the committer is busy, the job is queued and runs on the
 *   committer, in its next batch, after the batch in progress;
 * - a caller that parks (lg__park: a gateway fiber, which has other
 *   work) while another thread runs a batch on its own thread is not
 *   handed to the committer: that thread runs the parked job too, once
 *   its own batch is committed, and wakes the caller from there;
 * - many threads running and submitting jobs at once, parked callers
 *   among them, never run two batches at the same time (a counter bumped
 *   without a lock of its own loses nothing) and every job is run exactly
 *   once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/group.h"
#include "store/store.h"
#include "util/internal.h"

static lg_store_t *open_store(void) {
  lg_error_t e;
  memset(&e, 0, sizeof e);
  lg_store_t *s = lg_store_open("memory:", NULL, &e);
  assert_non_null(s);
  return s;
}

/* ---- where a job runs ---- */

typedef struct where {
  pthread_t th;   /* the thread that ran it */
  int ran;        /* times run */
  sem_t *hold;    /* not NULL: wait for it first (keeps the committer busy) */
  sem_t *started; /* not NULL: posted on start */
  int rc;         /* returned */
} where_t;

static int where_write(void *ud, lg_store_t *s, lg_error_t *err) {
  (void)s;
  where_t *w = ud;
  if (w->started) sem_post(w->started);
  if (w->hold) sem_wait(w->hold);
  w->th = pthread_self();
  w->ran++;
  if (w->rc) return lg__err(err, w->rc, "test", -1, "the job's own error");
  return 0;
}

static void noop_done(lg__job_t *j) { (void)j; }

static void test_idle_runs_on_the_caller(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg__batcher_t *b = lg__batcher_new(s, 0);
  assert_non_null(b);
  where_t w = {0};
  lg__job_t j = {.write = where_write, .ud = &w};
  lg__batcher_run(b, &j);
  assert_int_equal(j.rc, 0);
  assert_int_equal(w.ran, 1);
  assert_true(pthread_equal(w.th, pthread_self()));
  /* an error of the job comes back with its detail */
  where_t w2 = {.rc = LG_EINVAL};
  lg__job_t j2 = {.write = where_write, .ud = &w2};
  lg__batcher_run(b, &j2);
  assert_int_equal(j2.rc, LG_EINVAL);
  assert_non_null(strstr(j2.err.message, "the job's own error"));
  uint64_t batches, jobs;
  lg__batcher_stats(b, &batches, &jobs);
  assert_int_equal(batches, 2);
  assert_int_equal(jobs, 2);
  lg__batcher_free(b);
  lg_store_close(s);
}

/* A park whose "fiber" is the calling thread itself, stopped on a
 * semaphore: what the store sees of a gateway fiber. */
typedef struct sem_parked {
  sem_t sem;
  atomic_int waits, wakes;
  pthread_t waker;
} sem_parked_t;
static _Thread_local sem_parked_t *tl_parked;
static void *sp_self(void) { return tl_parked; }
static void sp_wait(void *who) {
  sem_parked_t *p = who;
  atomic_fetch_add(&p->waits, 1);
  sem_wait(&p->sem);
}
static void sp_wake(void *who) {
  sem_parked_t *p = who;
  p->waker = pthread_self();
  atomic_fetch_add(&p->wakes, 1);
  sem_post(&p->sem);
}
static const lg__park_t sem_park = {sp_self, sp_wait, sp_wake};

/* A thread that runs one job (parking, with park set). */
typedef struct runner {
  lg__batcher_t *b;
  lg__job_t *j;
  sem_parked_t *park;
  pthread_t th;
  atomic_int returned;
} runner_t;

static void *run_thread(void *arg) {
  runner_t *r = arg;
  r->th = pthread_self();
  if (r->park) {
    tl_parked = r->park;
    lg__set_park(&sem_park);
  }
  lg__batcher_run(r->b, r->j);
  lg__set_park(NULL);
  atomic_store(&r->returned, 1);
  return NULL;
}

static void test_busy_queues_behind_the_batch(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg__batcher_t *b = lg__batcher_new(s, 0);
  assert_non_null(b);
  sem_t hold, started;
  sem_init(&hold, 0, 0);
  sem_init(&started, 0, 0);
  where_t first = {.hold = &hold, .started = &started};
  lg__job_t j1 = {.write = where_write, .ud = &first, .done = noop_done};
  lg__batcher_submit(b, &j1);
  sem_wait(&started); /* the committer is inside j1's batch */

  where_t second = {0};
  lg__job_t j2 = {.write = where_write, .ud = &second};
  runner_t r = {.b = b, .j = &j2};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, run_thread, &r), 0);
  usleep(50 * 1000);
  assert_int_equal(second.ran, 0); /* waits: not run beside the batch */
  assert_int_equal(atomic_load(&r.returned), 0);
  sem_post(&hold);
  pthread_join(th, NULL);
  assert_int_equal(first.ran, 1);
  assert_int_equal(second.ran, 1);
  assert_int_equal(j2.rc, 0);
  /* queued, so the committer ran it, not the waiting thread */
  assert_true(pthread_equal(second.th, first.th));
  assert_false(pthread_equal(second.th, th));
  lg__batcher_free(b);
  lg_store_close(s);
  sem_destroy(&hold);
  sem_destroy(&started);
}

/* ---- parked callers ---- */

static void test_parked_runs_on_the_batch_thread(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg__batcher_t *b = lg__batcher_new(s, 0);
  assert_non_null(b);
  sem_t hold, started;
  sem_init(&hold, 0, 0);
  sem_init(&started, 0, 0);
  /* The committer waiting for work first: a committer thread that starts
   * late (a loaded machine) finds the parked job queued and takes it
   * before its first wait. A job of its own, then time to go back. */
  sem_t warm;
  sem_init(&warm, 0, 0);
  where_t w0 = {.started = &warm};
  lg__job_t j0 = {.write = where_write, .ud = &w0, .done = noop_done};
  lg__batcher_submit(b, &j0);
  sem_wait(&warm);
  usleep(50 * 1000);
  assert_int_equal(w0.ran, 1);
  sem_destroy(&warm);
  /* A thread runs its own batch (the committer idle), and holds it. */
  where_t first = {.hold = &hold, .started = &started};
  lg__job_t j1 = {.write = where_write, .ud = &first};
  runner_t a = {.b = b, .j = &j1};
  pthread_t ta, tb;
  assert_int_equal(pthread_create(&ta, NULL, run_thread, &a), 0);
  sem_wait(&started);
  /* A caller that parks: queued behind it, not run, not blocked on a lock. */
  where_t second = {0};
  lg__job_t j2 = {.write = where_write, .ud = &second};
  sem_parked_t pk = {0};
  sem_init(&pk.sem, 0, 0);
  runner_t pr = {.b = b, .j = &j2, .park = &pk};
  assert_int_equal(pthread_create(&tb, NULL, run_thread, &pr), 0);
  for (int i = 0; i < 2000 && !atomic_load(&pk.waits); i++) usleep(1000);
  assert_int_equal(atomic_load(&pk.waits), 1); /* it parked */
  usleep(20 * 1000);
  assert_int_equal(second.ran, 0);
  assert_int_equal(atomic_load(&pk.wakes), 0);
  sem_post(&hold);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  assert_int_equal(first.ran, 1);
  assert_int_equal(second.ran, 1);
  assert_int_equal(j1.rc, 0);
  assert_int_equal(j2.rc, 0);
  /* run by the thread that held the batch, which woke the caller */
  assert_true(pthread_equal(second.th, a.th));
  assert_true(pthread_equal(pk.waker, a.th));
  assert_int_equal(atomic_load(&pk.wakes), 1);
  uint64_t batches, jobs;
  lg__batcher_stats(b, &batches, &jobs);
  assert_int_equal(batches, 3); /* the committer's, the holder's, the parked one run by it */
  assert_int_equal(jobs, 3);
  lg__batcher_free(b);
  lg_store_close(s);
  sem_destroy(&hold);
  sem_destroy(&started);
  sem_destroy(&pk.sem);
}

/* ---- many at once ---- */

enum { THREADS = 4, EACH = 400 };

static long counter; /* bumped by jobs only: the batches' exclusion guards it */

static int bump_write(void *ud, lg_store_t *s, lg_error_t *err) {
  (void)s;
  (void)err;
  long v = counter;
  if (((uintptr_t)ud & 7) == 0) sched_yield(); /* widen the window */
  counter = v + 1;
  return 0;
}

static atomic_int submitted_done;
static void count_done(lg__job_t *j) {
  (void)j;
  atomic_fetch_add(&submitted_done, 1);
}

typedef struct hammer {
  lg__batcher_t *b;
  int submit; /* 1: lg__batcher_submit (as the HTTP thread), else run */
  int park;   /* run, parking while another thread's batch runs */
  sem_parked_t p;
  lg__job_t jobs[EACH];
} hammer_t;

static void *hammer_thread(void *arg) {
  hammer_t *h = arg;
  if (h->park) {
    tl_parked = &h->p;
    lg__set_park(&sem_park);
  }
  for (int i = 0; i < EACH; i++) {
    lg__job_t *j = &h->jobs[i];
    memset(j, 0, sizeof *j);
    j->write = bump_write;
    j->ud = (void *)(uintptr_t)i;
    if (h->submit) {
      j->done = count_done;
      lg__batcher_submit(h->b, j);
    } else {
      lg__batcher_run(h->b, j);
      assert_int_equal(j->rc, 0);
    }
  }
  return NULL;
}

static void test_many_threads(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg__batcher_t *b = lg__batcher_new(s, 0);
  assert_non_null(b);
  counter = 0;
  atomic_store(&submitted_done, 0);
  static hammer_t h[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    h[i].b = b;
    h[i].submit = i == 0;
    h[i].park = i >= 2;
    sem_init(&h[i].p.sem, 0, 0);
    assert_int_equal(pthread_create(&th[i], NULL, hammer_thread, &h[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 2; i < THREADS; i++) { /* each park was woken once, no more */
    assert_int_equal(atomic_load(&h[i].p.waits), atomic_load(&h[i].p.wakes));
    sem_destroy(&h[i].p.sem);
  }
  lg__batcher_stop(b); /* the submitted ones are all decided by now */
  assert_int_equal(atomic_load(&submitted_done), EACH);
  assert_int_equal(counter, THREADS * EACH);
  uint64_t batches, jobs;
  lg__batcher_stats(b, &batches, &jobs);
  assert_int_equal(jobs, THREADS * EACH);
  assert_true(batches <= jobs);
  lg__batcher_free(b);
  lg_store_close(s);
}

/* ---- a job alone: the batch's transaction is its own ---- */

/* fn: the run's envelope set to env, then fail_with. */
typedef struct env_put {
  const char *env;
  int fail_with;
} env_put_t;

static int env_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  env_put_t *p = ud;
  lg_run_record_t r = *rec;
  r.envelope_json = (char *)p->env;
  int rc = lg_store_run_put(s, &r, NULL);
  return rc ? rc : p->fail_with;
}

static void expect_env(lg_store_t *s, const char *id, const char *want) {
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, id, &got, NULL), 0);
  assert_string_equal(got.envelope_json, want);
  lg_run_record_clear(&got);
}

/* A write of two store calls, not whole: the first run's envelope set,
 * then a decision for the second that fails, which it lets go. */
typedef struct lenient {
  env_put_t put;
  int inner_rc;
} lenient_t;

static int lenient_write(void *ud, lg_store_t *s, lg_error_t *err) {
  lenient_t *l = ud;
  lg_run_record_t r;
  int rc = lg_store_run_get(s, "one", &r, err);
  if (rc) return rc;
  free(r.envelope_json);
  r.envelope_json = lg__strdup("[\"kept\"]");
  rc = lg_store_run_put(s, &r, err);
  lg_run_record_clear(&r);
  if (rc) return rc;
  l->inner_rc = lg_store_with_run(s, "two", env_fn, &l->put, NULL);
  return 0;
}

static int whole_write(void *ud, lg_store_t *s, lg_error_t *err) {
  return lg_store_with_run(s, "one", env_fn, ud, err);
}

static void test_alone_undone_whole(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  for (int i = 0; i < 2; i++) {
    lg_run_record_t r = {.run_id = (char *)(i ? "two" : "one"), .envelope_json = (char *)"[0]",
                         .created_ms = 1, .updated_ms = 1};
    assert_int_equal(lg_store_run_create(s, &r, NULL), 0);
  }
  lg__batcher_t *b = lg__batcher_new(s, 0);
  assert_non_null(b);
  /* a decision alone that fails after its write: the write is undone */
  env_put_t p = {"[1]", LG_ECONFLICT};
  lg__job_t j = {.run_id = "one", .fn = env_fn, .ud = &p};
  lg__batcher_run(b, &j);
  assert_int_equal(j.rc, LG_ECONFLICT);
  expect_env(s, "one", "[0]");
  /* and one that does not: kept */
  p.fail_with = 0;
  j = (lg__job_t){.run_id = "one", .fn = env_fn, .ud = &p};
  lg__batcher_run(b, &j);
  assert_int_equal(j.rc, 0);
  expect_env(s, "one", "[1]");
  /* a whole write that fails: undone */
  env_put_t p2 = {"[2]", LG_EINVAL};
  j = (lg__job_t){.write = whole_write, .ud = &p2, .whole = 1};
  lg__batcher_run(b, &j);
  assert_int_equal(j.rc, LG_EINVAL);
  expect_env(s, "one", "[1]");
  /* a write that is not whole goes on after a decision of it fails: that
   * decision is undone alone, the write's other call kept */
  lenient_t l = {.put = {"[\"lost\"]", LG_ECONFLICT}};
  j = (lg__job_t){.write = lenient_write, .ud = &l};
  lg__batcher_run(b, &j);
  assert_int_equal(j.rc, 0);
  assert_int_equal(l.inner_rc, LG_ECONFLICT);
  expect_env(s, "one", "[\"kept\"]");
  expect_env(s, "two", "[0]");
  lg__batcher_free(b);
  lg_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idle_runs_on_the_caller),
      cmocka_unit_test(test_busy_queues_behind_the_batch),
      cmocka_unit_test(test_parked_runs_on_the_batch_thread),
      cmocka_unit_test(test_many_threads),
      cmocka_unit_test(test_alone_undone_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
