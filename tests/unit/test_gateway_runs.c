/*
 * test_gateway_runs.c — the gateway's table of runs (gateway.c,
 * lg__gw_run_get) under requests of one new run that arrive together.
 *
 * A request that names a run the gateway has not seen creates it in the
 * table; the run is written to the store with its first step (on_store,
 * "unborn"). Until session 35 the creator published the run in the table
 * first and marked it unborn only after taking the run's lock: a request
 * on another thread that found it in between took the lock first, saw a
 * run that was neither stored nor to be stored, and its step failed with
 * "no run in the store" (a 500; gateway_mutate met it once in a few
 * runs). Here several threads ask for each of many new runs at once (a
 * barrier each round) and nothing steps them: every run a request gets
 * must still be to be stored, with the policy it is to be stored with.
 * The race is a matter of timing, so the rounds are many; on the old code
 * this failed in every run on the development machine.
 *
 * The same for a conversation without X-Loopguard-Run, found by a key (a
 * Responses conversation's id, its first answer's): requests that come
 * together with its first must go on in one run, not one each (the key
 * was put in the table after the run, outside the table's lock).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "gateway/gw.h"
#include "loopguard.h"
#include "server/server.h"

#define THREADS 4
#define ROUNDS 20000

static lg_server_t *srv;
static pthread_barrier_t bar;
static int by_key; /* the runs named by a conversation's key, not an id */
static atomic_int got, unstored, failed, split;
static char ids[THREADS][40]; /* the run each thread got this round */

static void *racer(void *ud) {
  int me = (int)(intptr_t)ud;
  lg__gw_job_t j;
  memset(&j, 0, sizeof j);
  lg__gw_ctx_t cx = {.gw = srv->gw, .srv = srv, .j = &j};
  for (int k = 0; k < ROUNDS; k++) {
    char name[40];
    snprintf(name, sizeof name, by_key ? "conv:together-%d" : "together-%d", k);
    pthread_barrier_wait(&bar);
    lg_error_t err;
    memset(&err, 0, sizeof err);
    lg__gw_run_t *r = lg__gw_run_get(&cx, by_key ? NULL : name, by_key ? name : NULL, NULL, NULL, &err);
    ids[me][0] = 0;
    if (!r) {
      atomic_fetch_add(&failed, 1);
    } else {
      atomic_fetch_add(&got, 1);
      if (!r->unborn || !r->birth_policy) atomic_fetch_add(&unstored, 1);
      snprintf(ids[me], sizeof ids[me], "%s", r->id);
      lg__gw_run_unlock(srv->gw, r);
    }
    pthread_barrier_wait(&bar);
    if (me == 0)
      for (int i = 1; i < THREADS; i++)
        if (strcmp(ids[i], ids[0])) {
          atomic_fetch_add(&split, 1);
          break;
        }
    pthread_barrier_wait(&bar); /* ids read before the next round writes them */
  }
  return NULL;
}

static void start_gateway(void) {
  /* never asked: nothing here steps a run */
  const char *ups[] = {"http://127.0.0.1:9/v1"};
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.listen = "127.0.0.1:0";
  o.store_url = "memory:";
  o.log_path = "/dev/null";
  o.upstreams = ups;
  o.nupstreams = 1;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  srv = lg_server_start(&o, &err);
  if (!srv) {
    char buf[1024];
    fail_msg("lg_server_start: %s", lg_error_format(&err, buf, sizeof buf));
  }
  assert_non_null(srv->gw);
}

static void stop_gateway(void) {
  assert_int_equal(lg_server_shutdown(srv, 2000), 0);
  lg_server_free(srv);
  srv = NULL;
}

/* THREADS racers together, ROUNDS new runs; what they got must agree. */
static void together(int key) {
  start_gateway();
  by_key = key;
  atomic_store(&got, 0);
  atomic_store(&unstored, 0);
  atomic_store(&failed, 0);
  atomic_store(&split, 0);
  assert_int_equal(pthread_barrier_init(&bar, NULL, THREADS), 0);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&th[i], NULL, racer, (void *)(intptr_t)i), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  printf("# %d runs got, %d of them neither stored nor to be stored; %d of %d rounds split into "
         "several runs; %d failed\n",
         atomic_load(&got), atomic_load(&unstored), atomic_load(&split), ROUNDS, atomic_load(&failed));
  assert_int_equal(atomic_load(&failed), 0);
  assert_int_equal(atomic_load(&got), THREADS * ROUNDS);
  assert_int_equal(atomic_load(&unstored), 0);
  assert_int_equal(atomic_load(&split), 0);
  stop_gateway();
}

static void new_run_together(void **state) {
  (void)state;
  together(0);
}

static void same_conversation_together(void **state) {
  (void)state;
  together(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_run_together),
      cmocka_unit_test(same_conversation_together),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
