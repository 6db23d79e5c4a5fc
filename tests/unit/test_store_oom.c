/*
 * test_store_oom.c — out of memory at every allocation of the store and
 * the ledger (docs/internals/style.md: "failing allocation N, then N+1, ...").
 *
 * A scenario — open, claim, peek, commit, fail, show, save and read runs,
 * list them, decide under lg_store_with_run, cancel — runs again and again
 * with the Nth allocation of the library failing, N = 1, 2, ... until a run
 * in which nothing failed. Each call must answer 0 or LG_ENOMEM (never
 * crash, never another error), and once the store is closed every byte
 * allocated through lg_set_allocator's hooks must be freed again. The
 * durable backends are included: SQLite's own memory is its own, but every
 * allocation of ours around it is failed in turn.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store_test_util.h"
#include "oom_util.h"

#define FP "5555555555555555555555555555555555555555555555555555555555555555"


/* Every call answers 0, LG_ENOMEM, or (after an earlier failure left
 * something out) one of the answers that follow from that. */
#define OK_OR(expr, also)                                                           \
  do {                                                                              \
    int rc_ = (expr);                                                               \
    int ok_ = rc_ == 0 || rc_ == LG_ENOMEM || rc_ == (also);                        \
    if (!ok_) fail_msg("%s: %s at allocation %ld", #expr, lg_err_name(rc_), fail_at); \
  } while (0)
#define OK_OR_OOM(expr) OK_OR(expr, LG_ENOMEM)

static int decide(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud;
  lg_claim_t c = {0};
  int rc = lg_store_claim(s, "in-run", FP, rec->run_id, 1000, 5, &c, NULL);
  lg_claim_clear(&c);
  if (rc) return rc;
  lg_run_record_t r = *rec;
  r.updated_ms = 6;
  return lg_store_run_put(s, &r, NULL);
}

static int count_cb(void *ud, const lg_run_record_t *rec) {
  (void)rec;
  (*(int *)ud)++;
  return 0;
}

static void scenario(const char *url) {
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(url, NULL, &err);
  if (!s) {
    if (err.code != LG_ENOMEM) fail_msg("open: %s (%s)", lg_err_name(err.code), err.message);
    return;
  }
  lg_claim_t c = {0};
  OK_OR_OOM(lg_store_claim(s, "a", FP, "r", 1000, 1, &c, NULL));
  lg_claim_clear(&c);
  OK_OR_OOM(lg_store_peek(s, "a", FP, 2, &c, NULL));
  lg_claim_clear(&c);
  OK_OR(lg_store_commit(s, "a", "{\"x\":1}", 7, "op", 3, NULL), LG_ENOTFOUND);
  OK_OR_OOM(lg_store_claim(s, "a", FP, "r", 1000, 4, &c, NULL));
  lg_claim_clear(&c);
  OK_OR_OOM(lg_store_claim(s, "b", FP, NULL, 1000, 1, &c, NULL));
  lg_claim_clear(&c);
  OK_OR(lg_store_fail(s, "b", 0, 2, NULL), LG_ENOTFOUND);
  lg_operation_t op;
  OK_OR(lg_store_operation(s, "a", 5, &op, NULL), LG_ENOTFOUND);
  char *j = lg_operation_to_json(&op);
  lg_free(j);
  lg_operation_clear(&op);
  int64_t n;
  OK_OR_OOM(lg_store_purge(s, 0, 10, &n, NULL));
  lg_run_record_t rec = {.run_id = "run", .group = "g", .policy_json = "{}", .state = "xyz",
                         .state_len = 3, .envelope_json = "{}", .created_ms = 1,
                         .updated_ms = 1};
  OK_OR_OOM(lg_store_run_create(s, &rec, NULL));
  OK_OR_OOM(lg_store_run_put(s, &rec, NULL));
  lg_run_record_t got;
  OK_OR(lg_store_run_get(s, "run", &got, NULL), LG_ENOTFOUND);
  j = lg_run_record_to_json(&got);
  lg_free(j);
  lg_run_record_clear(&got);
  int listed = 0;
  OK_OR_OOM(lg_store_run_list(s, NULL, count_cb, &listed, NULL));
  OK_OR(lg_store_with_run(s, "run", decide, NULL, NULL), LG_ENOTFOUND);
  OK_OR_OOM(lg_store_cancel_run(s, "later", "why", 7, NULL));
  char *reason = NULL;
  int d = lg_store_denied(s, "later", "g", &reason, NULL);
  if (d < 0 && d != LG_ENOMEM) fail_msg("denied: %s", lg_err_name(d));
  lg_free(reason);
  char *ids = NULL;
  OK_OR(lg_store_cancel_group(s, "g", NULL, 8, &ids, NULL), LG_ESTATE);
  lg_free(ids);
  lg_ledger_t *at = lg_store_ledger_new(s, 100);
  lg_ledger_free(at);
  lg_store_close(s);
}

static void run_all(const char *backend) {
  long n = oom_run_all(backend, scenario);
  printf("%s: the scenario survived each of its %ld allocations failing\n", backend, n);
}

static void test_memory(void **state) {
  (void)state;
  run_all("memory");
}
static void test_sqlite(void **state) {
  (void)state;
  run_all("sqlite");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_sqlite),
  };
  return cmocka_run_group_tests_name("store out of memory", tests, NULL, NULL);
}
