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
static atomic_int got, unstored, failed;

static void *racer(void *ud) {
  (void)ud;
  lg__gw_job_t j;
  memset(&j, 0, sizeof j);
  lg__gw_ctx_t cx = {.gw = srv->gw, .srv = srv, .j = &j};
  for (int k = 0; k < ROUNDS; k++) {
    char id[32];
    snprintf(id, sizeof id, "together-%d", k);
    pthread_barrier_wait(&bar);
    lg_error_t err;
    memset(&err, 0, sizeof err);
    lg__gw_run_t *r = lg__gw_run_get(&cx, id, NULL, NULL, &err);
    if (!r) {
      atomic_fetch_add(&failed, 1);
      continue;
    }
    atomic_fetch_add(&got, 1);
    if (!r->unborn || !r->birth_policy) atomic_fetch_add(&unstored, 1);
    lg__gw_run_unlock(srv->gw, r);
  }
  return NULL;
}

static void new_run_together(void **state) {
  (void)state;
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
  assert_int_equal(pthread_barrier_init(&bar, NULL, THREADS), 0);
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, racer, NULL), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&bar);
  printf("# %d runs got, %d of them neither stored nor to be stored, %d failed\n", atomic_load(&got),
         atomic_load(&unstored), atomic_load(&failed));
  assert_int_equal(atomic_load(&failed), 0);
  assert_int_equal(atomic_load(&got), THREADS * ROUNDS);
  assert_int_equal(atomic_load(&unstored), 0);
  assert_int_equal(lg_server_shutdown(srv, 2000), 0);
  lg_server_free(srv);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_run_together),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
