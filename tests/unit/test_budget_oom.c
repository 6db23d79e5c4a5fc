/*
 * test_budget_oom.c — out of memory at every allocation of the spend
 * gate (docs/internals/style.md: "failing allocation N, then N+1, ...").
 *
 * A scenario — parse a price file, a price book, set budgets, reserve over
 * two scopes, settle, read, list, reset, store a run's scopes, decide a
 * model call through lg_budget_model and settle it through
 * lg_budget_usage, purge, and every JSON form — runs again and again with
 * the Nth allocation of the library (and of jansson) failing, N = 1, 2,
 * ... until a run in which nothing failed. Every call must answer 0,
 * LG_ENOMEM, or what follows from an earlier call having failed (a budget
 * that was not set is LG_ENOTFOUND, ...), never crash; and once everything
 * is freed and the store closed, every byte allocated through
 * lg_set_allocator's hooks is freed again. Backends: memory and sqlite.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/server.h" /* the refusal as the server answers it */
#include "store_test_util.h"
#include "oom_util.h"


/* 0, LG_ENOMEM, or one of the answers allowed after an earlier failure. */
#define OK_OR(expr, a, b)                                                              \
  do {                                                                                 \
    int rc_ = (expr);                                                                  \
    if (!(rc_ == 0 || rc_ == LG_ENOMEM || rc_ == (a) || rc_ == (b)))                   \
      fail_msg("%s: %s at allocation %ld", #expr, lg_err_name(rc_), fail_at);          \
  } while (0)

static const char *PRICES = "{\"models\": {\"m\": {\"input_usd_per_mtok\": 1, "
                            "\"output_usd_per_mtok\": 2}, \"n\": {\"input_usd_per_mtok\": 3, "
                            "\"output_usd_per_mtok\": 4}}, \"default_max_tokens\": 100}";

static int count_cb(void *ud, const lg_budget_t *b) {
  char *j = lg_budget_to_json(b);
  lg_free(j);
  (*(int *)ud)++;
  return 0;
}

static void scenario(const char *url) {
  lg_error_t err = {0};
  lg_prices_t *pr = lg_prices_parse(PRICES, strlen(PRICES), "p", &err);
  if (!pr && err.code != LG_ENOMEM) fail_msg("prices: %s", err.message);
  int64_t n;
  if (pr) OK_OR(lg_prices_worst_case(pr, "m", 10, -1, &n, NULL), 0, 0);
  lg_price_book_t *book = lg_price_book_new(NULL, NULL);
  if (book) {
    lg_price_book_set(book, pr);
    lg_prices_t *cur = lg_price_book_get(book);
    lg_prices_free(cur);
    lg_price_book_free(book);
  }
  lg_store_t *s = lg_store_open(url, NULL, &err);
  if (!s) {
    if (err.code != LG_ENOMEM) fail_msg("open: %s (%s)", lg_err_name(err.code), err.message);
    lg_prices_free(pr);
    return;
  }
  lg_budget_t b;
  OK_OR(lg_budget_set(s, "key:a", 10000000, LG_PERIOD_DAILY, -1, 1000, &b, NULL), 0, 0);
  OK_OR(lg_budget_set(s, "team:t", 10000000, LG_PERIOD_NONE, 5000000, 1000, NULL, NULL), 0, 0);
  const char *sc[2] = {"key:a", "team:t"};
  lg_budget_request_t req = {.scopes = sc, .nscopes = 2, .amount_micro = 1000, .ttl_ms = 5000,
                             .run_id = "r", .model = "m"};
  lg_budget_reservation_t r;
  memset(&r, 0, sizeof r);
  lg_budget_refusal_t why;
  int rc = lg_budget_reserve(s, &req, 1001, &r, &why, NULL);
  OK_OR(rc, LG_ENOTFOUND, 0);
  char *j = rc ? NULL : lg__budget_reservation_json(&r);
  lg_free(j);
  lg_budget_settlement_t st;
  OK_OR(lg_budget_settle(s, rc ? "rsv_none" : r.id, 500, 1002, &st, NULL), LG_ENOTFOUND, 0);
  j = lg__budget_settlement_json(&st);
  lg_free(j);
  lg_budget_settlement_clear(&st);
  OK_OR(lg_budget_get(s, "key:a", 1003, &b, NULL), LG_ENOTFOUND, 0);
  j = lg_budget_to_json(&b);
  lg_free(j);
  int listed = 0;
  OK_OR(lg_budget_list(s, 1004, count_cb, &listed, NULL), 0, 0);
  OK_OR(lg_budget_reset(s, "key:a", 1005, &b, NULL), LG_ENOTFOUND, 0);
  /* A refusal and its JSON. */
  req.amount_micro = 20000000;
  rc = lg_budget_reserve(s, &req, 1006, &r, &why, NULL);
  OK_OR(rc, LG_ENOTFOUND, LG_BUDGET_REFUSED);
  if (rc == LG_BUDGET_REFUSED) {
    j = lg__http_refusal_json(&why);
    lg_free(j);
    j = lg__budget_refusal_metadata_json(&why);
    lg_free(j);
  }
  /* The gate of a run. */
  OK_OR(lg_budget_run_scopes_set(s, "r", sc, 2, NULL), LG_ENOTFOUND, 0);
  j = NULL;
  OK_OR(lg_budget_run_scopes(s, "r", &j, NULL), 0, 0);
  lg_free(j);
  lg_run_t *run = lg_run_new("r", NULL, NULL, NULL, NULL, NULL);
  if (run) {
    lg_model_call_t m = {.model = "m", .input_tokens = 10, .max_tokens = 10, .output_tokens = -1,
                         .cost_nusd = -1, .t_ms = 1};
    lg_decision_t d;
    lg_budget_gate_t g;
    rc = lg_budget_model(s, pr, run, &m, 1000, 1010, &d, &g, NULL);
    OK_OR(rc, LG_ENOTFOUND, LG_BUDGET_REFUSED);
    if (!rc && d.action == LG_ACT_EXECUTE)
      OK_OR(lg_budget_usage(s, pr, run, d.reservation, 10, 5, -1, 2, 1011, NULL, NULL), 0, 0);
    lg_run_free(run);
  }
  OK_OR(lg_budget_purge(s, 0, 100000, &n, NULL), 0, 0);
  lg_store_close(s);
  lg_prices_free(pr);
}

static void run_all(const char *backend) {
  long n = oom_run_all(backend, scenario);
  printf("%s: the budget scenario survived each of its %ld allocations failing\n", backend, n);
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
  return cmocka_run_group_tests_name("budget out of memory", tests, NULL, NULL);
}
