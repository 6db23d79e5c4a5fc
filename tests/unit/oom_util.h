/*
 * oom_util.h — failing the Nth allocation of the library, for the store
 * and budget out-of-memory tests (docs/internals/style.md: "failing allocation N, then
 * N+1, ..."). Include after <cmocka.h> and store_test_util.h.
 *
 * oom_run_all(backend, scenario) installs counting hooks with
 * lg_set_allocator and runs scenario(url) on a fresh store of `backend`
 * with allocation 1 failing, then 2, ... until a run in which nothing
 * failed; after each run every allocation made through the hooks must
 * have been freed. fail_at says which allocation fails (for messages).
 */
#ifndef LG_TEST_OOM_UTIL_H
#define LG_TEST_OOM_UTIL_H

#include <stdio.h>
#include <stdlib.h>

static long fail_at;   /* the allocation that fails (1-based), 0 none */
static long count;     /* allocations so far */
static long live;      /* allocated and not freed */
static int failed_one; /* the failure happened in this run */

static void *t_malloc(size_t n) {
  if (fail_at && ++count == fail_at) {
    failed_one = 1;
    return NULL;
  }
  void *p = malloc(n);
  if (p) live++;
  return p;
}
static void *t_realloc(void *p, size_t n) {
  if (fail_at && ++count == fail_at) {
    failed_one = 1;
    return NULL;
  }
  void *q = realloc(p, n);
  if (q && !p) live++;
  return q;
}
static void t_free(void *p) {
  if (p) live--;
  free(p);
}

/* Returns how many allocations the scenario makes when none fails. */
static long oom_run_all(const char *backend, void (*scenario)(const char *url)) {
  long n;
  lg_set_allocator(t_malloc, t_realloc, t_free);
  for (n = 1;; n++) {
    const char *url = lgt_fresh_url(backend);
    fail_at = n;
    count = 0;
    live = 0;
    failed_one = 0;
    scenario(url);
    if (live != 0)
      fail_msg("%s: %ld allocations leaked when allocation %ld failed", backend, live, n);
    if (!failed_one) break; /* the scenario ran without reaching allocation n */
  }
  fail_at = 0;
  lg_set_allocator(NULL, NULL, NULL);
  return n - 1;
}

#endif
