/*
 * test_budget.c — the spend gate's parts that need no store: amounts and
 * their conversions, periods (daily, weekly from Monday, monthly with
 * every month length, leap years and year ends, checked against libc's
 * calendar over many instants), scope kinds, price files (parsing, errors
 * naming the field, the worst case and the cost to the pico-dollar, the
 * default price, fail-closed lookups), the price book's atomic reload
 * under concurrent readers, the refusal's error object, the engine's
 * per-run caps with several model calls in flight at once, and the
 * replayed billing incident (seed002) under a cost cap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loopguard.h"
#include "server/server.h" /* the refusal as the server answers it */

#define DAY 86400000LL

/* Epoch ms of a UTC civil time, through libc (the test's oracle). */
static int64_t utc(int y, int mo, int d, int h, int mi, int s) {
  struct tm tm = {0};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return (int64_t)timegm(&tm) * 1000;
}

/* ------------------------------------------------------------------ */
/* Amounts.                                                             */

static void test_amounts(void **state) {
  (void)state;
  int64_t m = -1;
  lg_error_t err = {0};
  assert_int_equal(lg_budget_usd_to_micro(0.1, &m, "x", &err), 0);
  assert_int_equal(m, 100000);
  assert_int_equal(lg_budget_usd_to_micro(0.000042, &m, "x", &err), 0);
  assert_int_equal(m, 42);
  assert_int_equal(lg_budget_usd_to_micro(25, &m, "x", &err), 0);
  assert_int_equal(m, 25000000);
  assert_int_equal(lg_budget_usd_to_micro(0, &m, "x", &err), 0);
  assert_int_equal(m, 0);
  m = 7;
  assert_int_equal(lg_budget_usd_to_micro(NAN, &m, "limit_usd", &err), LG_EINVAL);
  assert_string_equal(err.field, "limit_usd");
  assert_int_equal(m, 7);
  assert_int_equal(lg_budget_usd_to_micro(INFINITY, &m, "x", &err), LG_EINVAL);
  assert_int_equal(lg_budget_usd_to_micro(-INFINITY, &m, "x", &err), LG_EINVAL);
  assert_int_equal(lg_budget_usd_to_micro(-0.01, &m, "x", &err), LG_EINVAL);
  assert_non_null(strstr(err.message, "negative"));
  assert_int_equal(lg_budget_usd_to_micro(2e9, &m, "x", &err), LG_ERANGE);
  assert_int_equal(m, 7);
  /* nano -> micro rounds up: a hold never covers less than decided. */
  assert_int_equal(lg_budget_nusd_to_micro(0), 0);
  assert_int_equal(lg_budget_nusd_to_micro(-5), 0);
  assert_int_equal(lg_budget_nusd_to_micro(1), 1);
  assert_int_equal(lg_budget_nusd_to_micro(1000), 1);
  assert_int_equal(lg_budget_nusd_to_micro(1001), 2);
  assert_int_equal(lg_budget_micro_to_nusd(42), 42000);
  assert_int_equal(lg_budget_micro_to_nusd(INT64_MAX / 10), INT64_MAX);
  assert_int_equal(LG_BUDGET_MAX_MICRO, (int64_t)(LG_BUDGET_MAX_USD * 1e6));
}

/* ------------------------------------------------------------------ */
/* Periods.                                                             */

static void bounds(lg_budget_period_t p, int64_t now, int64_t *s, int64_t *e) {
  assert_int_equal(lg_budget_period_bounds(p, now, s, e), 0);
}

static void test_period_daily(void **state) {
  (void)state;
  int64_t s, e;
  int64_t midnight = utc(2025, 3, 14, 0, 0, 0);
  bounds(LG_PERIOD_DAILY, midnight, &s, &e); /* the instant itself is the new day */
  assert_int_equal(s, midnight);
  assert_int_equal(e, midnight + DAY);
  bounds(LG_PERIOD_DAILY, midnight - 1, &s, &e);
  assert_int_equal(s, midnight - DAY);
  assert_int_equal(e, midnight);
  bounds(LG_PERIOD_DAILY, midnight + DAY - 1, &s, &e);
  assert_int_equal(s, midnight);
  /* Before 1970 too. */
  bounds(LG_PERIOD_DAILY, -1, &s, &e);
  assert_int_equal(s, -DAY);
  assert_int_equal(e, 0);
  bounds(LG_PERIOD_NONE, midnight, &s, &e);
  assert_int_equal(s, 0);
  assert_int_equal(e, -1);
  assert_int_equal(lg_budget_period_bounds((lg_budget_period_t)9, 0, &s, &e), LG_EINVAL);
}

static void test_period_weekly(void **state) {
  (void)state;
  int64_t s, e;
  /* 2024-01-01 was a Monday. */
  int64_t mon = utc(2024, 1, 1, 0, 0, 0);
  bounds(LG_PERIOD_WEEKLY, mon, &s, &e);
  assert_int_equal(s, mon);
  assert_int_equal(e, mon + 7 * DAY);
  bounds(LG_PERIOD_WEEKLY, mon + 7 * DAY - 1, &s, &e); /* Sunday 23:59:59.999 */
  assert_int_equal(s, mon);
  bounds(LG_PERIOD_WEEKLY, mon - 1, &s, &e); /* Sunday 2023-12-31 */
  assert_int_equal(s, utc(2023, 12, 25, 0, 0, 0));
  assert_int_equal(e, mon);
  /* A week across the year end: Tuesday 2024-12-31 is in the week of
   * Monday 2024-12-30, which ends on Monday 2025-01-06. */
  bounds(LG_PERIOD_WEEKLY, utc(2024, 12, 31, 12, 0, 0), &s, &e);
  assert_int_equal(s, utc(2024, 12, 30, 0, 0, 0));
  assert_int_equal(e, utc(2025, 1, 6, 0, 0, 0));
  /* 1970-01-01 was a Thursday: its week began on Monday 1969-12-29. */
  bounds(LG_PERIOD_WEEKLY, 0, &s, &e);
  assert_int_equal(s, -3 * DAY);
}

static void test_period_monthly(void **state) {
  (void)state;
  int64_t s, e;
  static const int lens[2][12] = {{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31},
                                   {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}};
  for (int y = 2023; y <= 2024; y++)
    for (int mo = 1; mo <= 12; mo++) {
      int64_t first = utc(y, mo, 1, 0, 0, 0);
      int len = lens[y - 2023][mo - 1];
      bounds(LG_PERIOD_MONTHLY, first + 17 * 3600 * 1000LL, &s, &e);
      assert_int_equal(s, first);
      assert_int_equal(e - s, len * DAY);
      bounds(LG_PERIOD_MONTHLY, e - 1, &s, &e); /* the last millisecond */
      assert_int_equal(s, first);
    }
  /* Leap years: 2000 (divisible by 400) is one, 2100 is not. */
  bounds(LG_PERIOD_MONTHLY, utc(2000, 2, 29, 23, 59, 59), &s, &e);
  assert_int_equal(e, utc(2000, 3, 1, 0, 0, 0));
  assert_int_equal(e - s, 29 * DAY);
  bounds(LG_PERIOD_MONTHLY, utc(2100, 2, 28, 23, 0, 0), &s, &e);
  assert_int_equal(e - s, 28 * DAY);
  /* The year end. */
  bounds(LG_PERIOD_MONTHLY, utc(2024, 12, 31, 23, 59, 59) + 999, &s, &e);
  assert_int_equal(s, utc(2024, 12, 1, 0, 0, 0));
  assert_int_equal(e, utc(2025, 1, 1, 0, 0, 0));
  bounds(LG_PERIOD_MONTHLY, utc(2025, 1, 1, 0, 0, 0), &s, &e);
  assert_int_equal(s, utc(2025, 1, 1, 0, 0, 0));
}

/* Every kind of period against libc's calendar at many instants from 1901
 * to 2399, and each boundary: the end of one period is the start of the
 * next and belongs to it. */
static void test_period_against_libc(void **state) {
  (void)state;
  uint64_t x = 88172645463325252ull;
  int64_t lo = utc(1901, 1, 1, 0, 0, 0), hi = utc(2399, 12, 1, 0, 0, 0);
  for (int i = 0; i < 200000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int64_t now = lo + (int64_t)(x % (uint64_t)(hi - lo));
    time_t t = (time_t)(now >= 0 ? now / 1000 : (now - 999) / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    int64_t day0 = utc(tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, 0, 0, 0);
    int64_t s, e;
    bounds(LG_PERIOD_DAILY, now, &s, &e);
    assert_int_equal(s, day0);
    bounds(LG_PERIOD_WEEKLY, now, &s, &e);
    int back = (tm.tm_wday + 6) % 7; /* days since Monday */
    assert_int_equal(s, day0 - back * DAY);
    assert_int_equal(e, s + 7 * DAY);
    bounds(LG_PERIOD_MONTHLY, now, &s, &e);
    assert_int_equal(s, utc(tm.tm_year + 1900, tm.tm_mon + 1, 1, 0, 0, 0));
    int ny = tm.tm_mon == 11 ? tm.tm_year + 1901 : tm.tm_year + 1900;
    int nm = tm.tm_mon == 11 ? 1 : tm.tm_mon + 2;
    assert_int_equal(e, utc(ny, nm, 1, 0, 0, 0));
    int64_t s2, e2;
    bounds(LG_PERIOD_MONTHLY, e, &s2, &e2);
    assert_int_equal(s2, e);
    bounds(LG_PERIOD_MONTHLY, e - 1, &s2, &e2);
    assert_int_equal(s2, s);
  }
}

static void test_period_names(void **state) {
  (void)state;
  lg_budget_period_t p;
  lg_error_t err = {0};
  const char *names[] = {"none", "daily", "weekly", "monthly"};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(lg_budget_period_parse(names[i], &p, &err), 0);
    assert_int_equal(p, i);
    assert_string_equal(lg_budget_period_name(p), names[i]);
  }
  assert_int_equal(lg_budget_period_parse("hourly", &p, &err), LG_EINVAL);
  assert_non_null(strstr(err.message, "hourly"));
  assert_int_equal(lg_budget_period_parse(NULL, &p, &err), LG_EINVAL);
}

/* ------------------------------------------------------------------ */
/* Scopes.                                                              */

static void test_scopes(void **state) {
  (void)state;
  assert_int_equal(lg_budget_scope_kind("key:sk-1"), LG_SCOPE_KEY);
  assert_int_equal(lg_budget_scope_kind("workspace:acme"), LG_SCOPE_WORKSPACE);
  assert_int_equal(lg_budget_scope_kind("team:ml"), LG_SCOPE_OTHER);
  assert_int_equal(lg_budget_scope_kind("customer:7"), LG_SCOPE_OTHER);
  assert_int_equal(lg_budget_scope_kind("nightly"), LG_SCOPE_OTHER);
  assert_int_equal(lg_budget_scope_kind("keys:x"), LG_SCOPE_OTHER);
  lg_error_t err = {0};
  assert_int_equal(lg_budget_scope_check("team:ml", &err), 0);
  assert_int_equal(lg_budget_scope_check("équipe:été", &err), 0);
  assert_int_equal(lg_budget_scope_check("", &err), LG_EINVAL);
  assert_int_equal(lg_budget_scope_check(NULL, &err), LG_EINVAL);
  assert_int_equal(lg_budget_scope_check("a\nb", &err), LG_EINVAL);
  assert_int_equal(lg_budget_scope_check("bad\xff", &err), LG_EINVAL);
  char big[LG_BUDGET_SCOPE_MAX + 2];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  assert_int_equal(lg_budget_scope_check(big, &err), LG_EINVAL);
  big[LG_BUDGET_SCOPE_MAX] = 0;
  assert_int_equal(lg_budget_scope_check(big, &err), 0);
}

/* ------------------------------------------------------------------ */
/* Prices.                                                              */

static const char *PRICES =
    "{\"version\": 1,\n"
    " \"models\": {\n"
    "   \"openai/gpt-4o\": {\"input_usd_per_mtok\": 2.5, \"output_usd_per_mtok\": 10,\n"
    "                     \"cached_input_usd_per_mtok\": 1.25},\n"
    "   \"mini\": {\"input_usd_per_mtok\": 0.15, \"output_usd_per_mtok\": 0.6,\n"
    "              \"max_output_tokens\": 16384},\n"
    "   \"free\": {\"input_usd_per_mtok\": 0, \"output_usd_per_mtok\": 0},\n"
    "   \"tiny\": {\"input_usd_per_mtok\": 0.0001, \"output_usd_per_mtok\": 0.0001}\n"
    " },\n"
    " \"default_max_tokens\": 4096}\n";

static lg_prices_t *parse(const char *json, lg_error_t *err) {
  return lg_prices_parse(json, strlen(json), "prices.json", err);
}

static void test_prices_worst_case(void **state) {
  (void)state;
  lg_error_t err = {0};
  lg_prices_t *p = parse(PRICES, &err);
  assert_non_null(p);
  assert_int_equal(lg_prices_count(p), 4);
  assert_string_equal(lg_prices_source(p), "prices.json");
  int64_t n = -1;
  /* 1000 in at 2.5 $/M = 0.0025 USD; 500 out at 10 $/M = 0.005 USD:
   * 0.0075 USD = 7,500,000 nUSD. */
  assert_int_equal(lg_prices_worst_case(p, "openai/gpt-4o", 1000, 500, &n, &err), 0);
  assert_int_equal(n, 7500000);
  /* 1 token at 0.15 $/M = 150 nUSD; sub-nano costs round up: 1 token at
   * 0.0001 $/M = 0.1 nUSD -> 1. */
  assert_int_equal(lg_prices_worst_case(p, "mini", 1, 0, &n, &err), 0);
  assert_int_equal(n, 150);
  assert_int_equal(lg_prices_worst_case(p, "tiny", 1, 0, &n, &err), 0);
  assert_int_equal(n, 1);
  assert_int_equal(lg_prices_worst_case(p, "tiny", 10001, 10000, &n, &err), 0);
  assert_int_equal(n, 2001); /* 2,000,100 pUSD */
  /* max_tokens absent: the model's own max_output_tokens. */
  assert_int_equal(lg_prices_worst_case(p, "mini", 0, -1, &n, &err), 0);
  assert_int_equal(n, (16384LL * 600000 + 999) / 1000);
  /* ... else the file's default_max_tokens. */
  assert_int_equal(lg_prices_worst_case(p, "openai/gpt-4o", 0, -1, &n, &err), 0);
  assert_int_equal(n, 4096LL * 10000000 / 1000);
  assert_int_equal(lg_prices_worst_case(p, "free", 100000, 100000, &n, &err), 0);
  assert_int_equal(n, 0);
  /* No price: fail closed, naming the model and the file. */
  n = 123;
  assert_int_equal(lg_prices_worst_case(p, "claude-x", 10, 10, &n, &err), LG_ENOTFOUND);
  assert_int_equal(n, 123);
  assert_string_equal(err.field, "model");
  assert_non_null(strstr(err.message, "\"claude-x\""));
  assert_non_null(strstr(err.message, "prices.json"));
  assert_int_equal(lg_prices_worst_case(p, NULL, 10, 10, &n, &err), LG_ENOTFOUND);
  assert_int_equal(lg_prices_worst_case(NULL, "mini", 10, 10, &n, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "no price file"));
  assert_int_equal(lg_prices_worst_case(p, "mini", -1, 10, &n, &err), LG_EINVAL);
  assert_string_equal(err.field, "input_tokens");
  assert_int_equal(lg_prices_worst_case(p, "mini", 10000000000000LL, 10, &n, &err), LG_ERANGE);
  lg_prices_free(p);

  /* No default_max_tokens and no max_output_tokens: no bound, refused. */
  p = parse("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 2}}}",
            &err);
  assert_non_null(p);
  assert_int_equal(lg_prices_worst_case(p, "m", 10, -1, &n, &err), LG_EINVAL);
  assert_string_equal(err.field, "max_tokens");
  assert_int_equal(lg_prices_worst_case(p, "m", 10, 20, &n, &err), 0);
  assert_int_equal(n, 10000 + 40000);
  lg_prices_free(p);

  /* A default price covers every model not listed; attachment_tokens, the
   * most an image or a file of a request costs (the gateway's worst case) */
  p = parse("{\"models\": {\"seeing\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 1, "
            "\"attachment_tokens\": 1600}}, \"default\": {\"input_usd_per_mtok\": 3, "
            "\"output_usd_per_mtok\": 15}, \"default_max_tokens\": 1000}",
            &err);
  assert_non_null(p);
  lg_price_t pr;
  assert_int_equal(lg_prices_lookup(p, "seeing", &pr, &err), 0);
  assert_int_equal(pr.attachment_tokens, 1600);
  assert_int_equal(lg_prices_lookup(p, "anything", &pr, &err), 0);
  assert_int_equal(pr.is_default, 1);
  assert_int_equal(pr.input_per_mtok, 3000000);
  assert_int_equal(pr.cached_input_per_mtok, 3000000);
  assert_int_equal(pr.attachment_tokens, -1); /* none given */
  assert_int_equal(lg_prices_worst_case(p, "anything", 1000000, -1, &n, &err), 0);
  assert_int_equal(n, 3000000000LL + 15000000LL);
  lg_prices_free(p);
}

static void test_prices_cost(void **state) {
  (void)state;
  lg_error_t err = {0};
  lg_prices_t *p = parse(PRICES, &err);
  int64_t n;
  /* 1000 input of which 400 cached, 200 output: 600*2.5 + 400*1.25 + 200*10
   * = 1500 + 500 + 2000 = 4000 pUSD per... in nUSD: 4000 * 1000 / 1000. */
  assert_int_equal(lg_prices_cost(p, "openai/gpt-4o", 1000, 400, 200, &n, &err), 0);
  assert_int_equal(n, 600 * 2500 + 400 * 1250 + 200 * 10000);
  assert_int_equal(lg_prices_cost(p, "openai/gpt-4o", 10, 11, 0, &n, &err), LG_EINVAL);
  assert_string_equal(err.field, "cached_input_tokens");
  assert_int_equal(lg_prices_cost(p, "nope", 1, 0, 1, &n, &err), LG_ENOTFOUND);
  lg_prices_free(p);
}

static void expect_bad(const char *json, int code, const char *field, const char *text) {
  lg_error_t err = {0};
  lg_prices_t *p = parse(json, &err);
  if (p) fail_msg("accepted: %s", json);
  assert_int_equal(err.code, code);
  if (field) assert_string_equal(err.field, field);
  if (text && !strstr(err.message, text)) fail_msg("'%s' not in '%s'", text, err.message);
  assert_string_equal(err.source, "prices.json");
}

static void test_prices_errors(void **state) {
  (void)state;
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtk\": 2}}}",
             LG_EINVAL, "models.m.output_usd_per_mtk", "unknown field");
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1}}}", LG_EINVAL, "models.m",
             "output_usd_per_mtok is missing");
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": -1, \"output_usd_per_mtok\": 2}}}",
             LG_EINVAL, "models.m.input_usd_per_mtok", "non-negative");
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": \"1\", \"output_usd_per_mtok\": 2}}}",
             LG_EINVAL, "models.m.input_usd_per_mtok", "number");
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1e300, \"output_usd_per_mtok\": 2}}}",
             LG_ERANGE, "models.m.input_usd_per_mtok", NULL);
  expect_bad("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 2, "
             "\"attachment_tokens\": 0}}}",
             LG_EINVAL, "models.m.attachment_tokens", "whole number of tokens");
  expect_bad("{\"models\": {}, \"defualt\": {}}", LG_EINVAL, "defualt", "unknown field");
  expect_bad("{\"modles\": {}}", LG_EINVAL, "models", "missing");
  expect_bad("{\"models\": []}", LG_EINVAL, "models", NULL);
  expect_bad("{\"models\": {}, \"default_max_tokens\": 0}", LG_EINVAL, "default_max_tokens", NULL);
  expect_bad("{\"models\": {}, \"default_max_tokens\": 1.5}", LG_EINVAL, "default_max_tokens",
             NULL);
  expect_bad("{\"models\": {}, \"version\": 2}", LG_EINVAL, "version", NULL);
  expect_bad("[]", LG_EINVAL, NULL, "JSON object");
  expect_bad("{\"models\": {\"m\": {}, \"m\": {}}}", LG_EPARSE, NULL, "duplicate");
  lg_error_t err = {0};
  assert_null(parse("{\"models\": {\n  \"m\": {,\n}}", &err));
  assert_int_equal(err.code, LG_EPARSE);
  assert_int_equal(err.line, 2);
  /* A refused setting: the line of its field, a model name with dots. */
  err = (lg_error_t){0};
  assert_null(parse("{\"models\": {\n  \"gpt-4\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 2},"
                    "\n  \"gpt-4.1\": {\"input_usd_per_mtok\": 1,\n    \"output_usd_per_mtok\": -2}}}",
                    &err));
  assert_string_equal(err.field, "models.gpt-4.1.output_usd_per_mtok");
  assert_int_equal(err.line, 4);
  char msg[512];
  assert_non_null(strstr(lg_error_format(&err, msg, sizeof msg),
                         "prices.json:4: models.gpt-4.1.output_usd_per_mtok: "));
  assert_null(lg_prices_load_file("/nonexistent/prices.json", &err));
  assert_int_equal(err.code, LG_EIO);
  assert_string_equal(err.source, "/nonexistent/prices.json");
  lg_prices_free(NULL);
}

/* The book: a reload swaps the table for later readers; a reader keeps
 * its table; a bad file keeps the old table in use. */
static char book_path[64];
static volatile int book_stop;

static void write_prices(const char *path, double input) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"models\": {\"m\": {\"input_usd_per_mtok\": %g, \"output_usd_per_mtok\": 1}},"
          " \"default_max_tokens\": 10}\n",
          input);
  fclose(f);
}

static void *book_reader(void *arg) {
  lg_price_book_t *b = arg;
  long reads = 0;
  while (!book_stop) {
    lg_prices_t *p = lg_price_book_get(b);
    lg_price_t pr;
    if (!p || lg_prices_lookup(p, "m", &pr, NULL)) abort();
    /* Each table is whole: its input price is one of those written. */
    if (pr.input_per_mtok != 1000000 && pr.input_per_mtok != 2000000) abort();
    lg_prices_free(p);
    reads++;
  }
  return (void *)reads;
}

static void test_price_book(void **state) {
  (void)state;
  snprintf(book_path, sizeof book_path, "/tmp/lgprices.%d.json", (int)getpid());
  write_prices(book_path, 1);
  lg_error_t err = {0};
  lg_price_book_t *b = lg_price_book_new(book_path, &err);
  assert_non_null(b);
  lg_prices_t *old = lg_price_book_get(b);
  write_prices(book_path, 2);
  assert_int_equal(lg_price_book_reload(b, &err), 0);
  lg_prices_t *cur = lg_price_book_get(b);
  lg_price_t pr;
  assert_int_equal(lg_prices_lookup(old, "m", &pr, NULL), 0);
  assert_int_equal(pr.input_per_mtok, 1000000); /* the old reference still reads */
  assert_int_equal(lg_prices_lookup(cur, "m", &pr, NULL), 0);
  assert_int_equal(pr.input_per_mtok, 2000000);
  lg_prices_free(old);
  lg_prices_free(cur);
  /* A broken file: the reload fails, says where, and the table stays. */
  FILE *f = fopen(book_path, "w");
  fputs("{\"models\": {\"m\": {\"input_usd_per_mtok\": 1,}}}", f);
  fclose(f);
  assert_int_equal(lg_price_book_reload(b, &err), LG_EPARSE);
  assert_string_equal(err.source, book_path);
  cur = lg_price_book_get(b);
  assert_int_equal(lg_prices_lookup(cur, "m", &pr, NULL), 0);
  assert_int_equal(pr.input_per_mtok, 2000000);
  lg_prices_free(cur);
  /* Readers on 4 threads while the file is reloaded 300 times. */
  pthread_t th[4];
  book_stop = 0;
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, book_reader, b), 0);
  for (int i = 0; i < 300; i++) {
    write_prices(book_path, i % 2 ? 1 : 2);
    assert_int_equal(lg_price_book_reload(b, &err), 0);
  }
  book_stop = 1;
  long reads = 0;
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    reads += (long)r;
  }
  assert_true(reads > 0);
  lg_price_book_set(b, NULL);
  assert_null(lg_price_book_get(b));
  lg_price_book_free(b);
  unlink(book_path);
  /* A book without a file is empty and cannot reload. */
  b = lg_price_book_new(NULL, &err);
  assert_non_null(b);
  assert_null(lg_price_book_get(b));
  assert_int_equal(lg_price_book_reload(b, &err), LG_ESTATE);
  lg_price_book_free(b);
  assert_null(lg_price_book_new("/nonexistent/p.json", &err));
  assert_int_equal(err.code, LG_EIO);
  lg_price_book_free(NULL);
}

/* ------------------------------------------------------------------ */
/* The refusal's error object.                                          */

static void test_refusal_json(void **state) {
  (void)state;
  lg_budget_refusal_t r = {0};
  r.type = "budget_exceeded";
  r.limit_source = "key_limit";
  snprintf(r.scope, sizeof r.scope, "key:a\"b");
  r.remaining_micro = 500000;
  r.requested_micro = 750000;
  r.resets_at_ms = utc(2025, 3, 1, 0, 0, 0);
  snprintf(r.message, sizeof r.message, "no");
  char *j = lg__http_refusal_json(&r);
  assert_string_equal(j, "{\"error\":{\"code\":402,\"type\":\"budget_exceeded\",\"message\":\"no\","
                         "\"metadata\":{\"limit_source\":\"key_limit\",\"scope\":\"key:a\\\"b\","
                         "\"remaining_usd\":0.5,\"requested_usd\":0.75,"
                         "\"resets_at\":\"2025-03-01T00:00:00.000Z\"}}}");
  lg_free(j);
  r.type = "rate_limited";
  r.limit_source = "in_flight_budget";
  r.resets_at_ms = -1;
  r.retry_after_s = 12;
  j = lg__budget_refusal_metadata_json(&r);
  assert_string_equal(j, "{\"limit_source\":\"in_flight_budget\",\"scope\":\"key:a\\\"b\","
                         "\"remaining_usd\":0.5,\"requested_usd\":0.75,\"resets_at\":null,"
                         "\"retry_after_s\":12}");
  lg_free(j);
  /* Every output parses as JSON. */
  j = lg__http_refusal_json(&r);
  json_error_t je;
  json_t *v = json_loads(j, JSON_REJECT_DUPLICATES, &je);
  assert_non_null(v);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(v, "error"), "code")), 429);
  json_decref(v);
  lg_free(j);
}

/* ------------------------------------------------------------------ */
/* Per-run caps with several model calls in flight at once.              */

/* One run with a cost cap: model calls are let through while others are
 * still open, and settle in random order with an actual cost at most
 * their worst case. At every moment what is settled plus what is held
 * stays within the cap; the call that is refused is one whose worst case
 * would have passed it; the settled total never passes the cap. */
static void test_run_cap_parallel(void **state) {
  (void)state;
  uint64_t x = 0x9e3779b97f4a7c15ull;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
  long refused = 0, let = 0, max_open = 0;
  for (int round = 0; round < 300; round++) {
    int64_t cap_nusd = 1000000 + (int64_t)(RND() % 5000000); /* 0.001 to 0.006 USD */
    char pol[128];
    snprintf(pol, sizeof pol, "{\"limits\": {\"max_cost_usd\": %.9f, \"max_model_calls\": null}}",
             (double)cap_nusd / 1e9);
    lg_error_t err = {0};
    lg_policy_t *p = lg_policy_parse(pol, strlen(pol), NULL, &err);
    assert_non_null(p);
    lg_run_t *run = lg_run_new("caps", NULL, p, NULL, NULL, &err);
    assert_non_null(run);
    int64_t open_id[32], open_worst[32];
    int nopen = 0;
    int64_t held = 0, settled = 0, t = 0;
    for (int step = 0; step < 400 && !lg_run_stopped(run); step++) {
      int settle = nopen && (nopen >= 8 || RND() % 3 == 0);
      if (settle) {
        int k = (int)(RND() % (uint64_t)nopen);
        int64_t actual = (int64_t)(RND() % (uint64_t)(open_worst[k] + 1));
        assert_int_equal(lg_run_usage(run, open_id[k], 10, 10, actual, ++t), 0);
        held -= open_worst[k];
        settled += actual;
        open_id[k] = open_id[nopen - 1];
        open_worst[k] = open_worst[nopen - 1];
        nopen--;
      } else {
        int64_t worst = 1 + (int64_t)(RND() % 400000);
        lg_model_call_t m = {.model = "m", .input_tokens = 10, .max_tokens = 10,
                             .output_tokens = -1, .cost_nusd = worst, .t_ms = ++t};
        lg_decision_t d;
        assert_int_equal(lg_run_model(run, &m, &d, &err), 0);
        if (d.action == LG_ACT_EXECUTE) {
          let++;
          open_id[nopen] = d.reservation;
          open_worst[nopen++] = worst;
          held += worst;
          if (nopen > max_open) max_open = nopen;
        } else {
          assert_int_equal(d.action, LG_ACT_STOP);
          assert_int_equal(d.reason, LG_R_COST_CAP);
          assert_true(settled + held + worst > cap_nusd); /* refused only when it would pass */
          refused++;
        }
      }
      assert_true(settled + held <= cap_nusd);
      lg_counters_t c;
      lg_run_counters(run, &c);
      assert_int_equal(c.cost_nusd, settled);
    }
    /* The calls still open settle after the stop, at their worst. */
    for (int k = 0; k < nopen; k++) {
      assert_int_equal(lg_run_usage(run, open_id[k], 1, 1, open_worst[k], ++t), 0);
      settled += open_worst[k];
    }
    assert_true(settled <= cap_nusd);
    lg_counters_t c;
    lg_run_counters(run, &c);
    assert_int_equal(c.cost_nusd, settled);
    lg_run_free(run);
    lg_policy_free(p);
  }
  assert_true(refused > 100); /* the cap was reached in most rounds */
  assert_true(max_open >= 8); /* with 8 calls in flight at once */
  printf("run caps: %ld calls let through, %ld refused at the cap, up to %ld in flight\n", let,
         refused, max_open);
#undef RND
}

/* The same through the gate: the worst case comes from the price table
 * (input at the input price + max_tokens at the output price). */
static void test_run_cap_priced(void **state) {
  (void)state;
  lg_error_t err = {0};
  lg_prices_t *pr = parse(PRICES, &err);
  const char *pol = "{\"limits\": {\"max_cost_usd\": 0.06}}";
  lg_policy_t *p = lg_policy_parse(pol, strlen(pol), NULL, &err);
  lg_run_t *run = lg_run_new("priced", NULL, p, NULL, NULL, &err);
  /* Each call: 1000 in, 1000 max out on gpt-4o: 0.0025 + 0.01 = 0.0125 USD
   * worst; four fit in 0.06, the fifth does not while they are open. */
  lg_model_call_t m = {.model = "openai/gpt-4o", .input_tokens = 1000, .max_tokens = 1000,
                       .output_tokens = -1, .cost_nusd = -1};
  lg_decision_t d;
  lg_budget_gate_t g;
  int64_t ids[4];
  for (int i = 0; i < 4; i++) {
    m.t_ms = i;
    assert_int_equal(lg_budget_model(NULL, pr, run, &m, 0, 0, &d, &g, &err), 0);
    assert_int_equal(d.action, LG_ACT_EXECUTE);
    assert_int_equal(g.worst_nusd, 12500000);
    assert_string_equal(g.reservation_id, "");
    ids[i] = d.reservation;
  }
  /* A model with no price: refused with an error naming it (the run has a
   * cost cap, so a cost is needed), and the run does not change. */
  lg_model_call_t unk = m;
  unk.model = "mystery-1";
  assert_int_equal(lg_budget_model(NULL, pr, run, &unk, 0, 0, &d, &g, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "mystery-1"));
  assert_false(lg_run_stopped(run));
  /* The client's own cost is taken when the model has no price. */
  unk.cost_nusd = 1;
  unk.t_ms = 5;
  assert_int_equal(lg_budget_model(NULL, pr, run, &unk, 0, 0, &d, &g, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  assert_int_equal(g.worst_nusd, 1);
  assert_int_equal(lg_budget_usage(NULL, pr, run, d.reservation, 1, 1, -1, 6, 0, NULL, &err), 0);
  /* The fifth gpt-4o call would pass the cap while four are open. */
  m.t_ms = 7;
  assert_int_equal(lg_budget_model(NULL, pr, run, &m, 0, 0, &d, &g, &err), 0);
  assert_int_equal(d.action, LG_ACT_STOP);
  assert_int_equal(d.reason, LG_R_COST_CAP);
  /* Usage without a cost: priced from the tokens when the model is known
   * to the reservation (here it is not: no store), else the worst case. */
  int64_t actual = 0;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(lg_budget_usage(NULL, pr, run, ids[i], 1000, 100, i == 0 ? 3000000 : -1, 8,
                                     0, &actual, &err),
                     0);
    assert_int_equal(actual, i == 0 ? 3000000 : 12500000);
  }
  assert_int_equal(lg_budget_usage(NULL, pr, run, ids[0], 1, 1, 1, 9, 0, NULL, &err), LG_ENOTFOUND);
  lg_counters_t c;
  lg_run_counters(run, &c);
  assert_true(c.cost_nusd <= 60000000);
  lg_run_free(run);
  lg_policy_free(p);
  lg_prices_free(pr);
}

/* ------------------------------------------------------------------ */
/* The billing incident, replayed with a cost cap.                       */

typedef struct replay_ctx {
  lg_replay_summary_t sum;
  char env[64];
  int got;
} replay_ctx_t;

static int on_replay(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  replay_ctx_t *x = ud;
  (void)ev;
  if (sum) {
    x->sum = *sum;
    snprintf(x->env, sizeof x->env, "%s", sum->terminal_reason ? sum->terminal_reason : "");
    x->sum.terminal_reason = x->env;
    x->got = 1;
  }
  return 0;
}

/* The cost (USD) of the model event on `line` of the file, or -1. */
static double model_cost_at(const char *path, long line) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char buf[4096];
  double cost = -1;
  for (long n = 1; fgets(buf, sizeof buf, f); n++) {
    if (n != line) continue;
    json_t *v = json_loads(buf, 0, NULL);
    assert_non_null(v);
    assert_string_equal(json_string_value(json_object_get(v, "type")), "model");
    cost = json_number_value(json_object_get(v, "cost"));
    json_decref(v);
    break;
  }
  fclose(f);
  return cost;
}

static replay_ctx_t replay(const char *path, const char *policy_json) {
  lg_error_t err = {0};
  lg_policy_t *p = lg_policy_parse(policy_json, strlen(policy_json), "override", &err);
  assert_non_null(p);
  replay_ctx_t x = {0};
  int rc = lg_replay_file(path, p, on_replay, &x, &err);
  if (rc) fail_msg("replay: %s", err.message);
  lg_policy_free(p);
  assert_true(x.got);
  return x;
}

static void test_seed002_cost_cap(void **state) {
  (void)state;
  const char *data = getenv("LG_TEST_DATA");
  char path[1024];
  snprintf(path, sizeof path, "%s/fixtures/seed002-billing.jsonl", data ? data : "tests/data");
  const double cap = 0.0005;

  /* The cap alone (the brief's override): the repeat ladder stops this
   * incident long before its cost gets near the cap — within the cap. */
  replay_ctx_t a = replay(path, "{\"limits\":{\"max_cost_usd\":0.0005}}");
  assert_string_equal(a.sum.terminal_reason, "same_call_repeat");
  assert_true((double)a.sum.cost_nusd / 1e9 <= cap);

  /* With the ladder and the failure streak off the loop would go on; the
   * cost cap stops it before the first model call that would cross it. */
  replay_ctx_t b = replay(path, "{\"limits\":{\"max_cost_usd\":0.0005},"
                                "\"repeat\":{\"observe\":false,\"block\":false,\"stop\":false},"
                                "\"failure_streak\":0}");
  assert_string_equal(b.sum.terminal_reason, "cost_cap");
  int64_t cap_nusd = 500000;
  assert_true(b.sum.cost_nusd <= cap_nusd);
  double next = model_cost_at(path, b.sum.stopped_at_line); /* the model line refused */
  assert_true(next > 0);
  int64_t next_nusd = (int64_t)llround(next * 1e9);
  assert_true(b.sum.cost_nusd + next_nusd > cap_nusd);
  assert_true(b.sum.model_calls >= 10);
  printf("seed002 with max_cost_usd 0.0005: stopped at line %ld after %lld model calls, %.6f USD; "
         "the next would have cost %.6f more\n",
         b.sum.stopped_at_line, (long long)b.sum.model_calls, (double)b.sum.cost_nusd / 1e9, next);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_amounts),
      cmocka_unit_test(test_period_daily),
      cmocka_unit_test(test_period_weekly),
      cmocka_unit_test(test_period_monthly),
      cmocka_unit_test(test_period_against_libc),
      cmocka_unit_test(test_period_names),
      cmocka_unit_test(test_scopes),
      cmocka_unit_test(test_prices_worst_case),
      cmocka_unit_test(test_prices_cost),
      cmocka_unit_test(test_prices_errors),
      cmocka_unit_test(test_price_book),
      cmocka_unit_test(test_refusal_json),
      cmocka_unit_test(test_run_cap_parallel),
      cmocka_unit_test(test_run_cap_priced),
      cmocka_unit_test(test_seed002_cost_cap),
  };
  return cmocka_run_group_tests_name("budget", tests, NULL, NULL);
}
