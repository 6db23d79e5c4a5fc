/*
 * test_keys.c — loopguard keys (src/budget/keys.c) with a simulated clock:
 * the key's limit is its budget key:ID, whose period resets at 00:00 UTC
 * (daily), on Monday (weekly) and on the 1st (monthly); usage today, this
 * week and this month are what was settled since each boundary; rotation
 * keeps the id and the spend and refuses the old secret; disable refuses
 * at once; the rate window of a minute; the fields' errors name the field.
 * On memory: (one handle); the store rows themselves are in
 * test_store_conformance for every store.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "budget/budget.h"
#include "loopguard.h"
#include "store/store.h"

/* Monday 2026-11-30 10:00:00 UTC. */
#define MON 1796032800000LL
#define DAY 86400000LL

/* The answer of a call that must succeed: MUST(lg_key_show(..., &out, &e)). */
#define MUST(call) must((call), &out, &e)
static json_t *must(int rc, char **out, const lg_error_t *e) {
  if (rc) fail_msg("%s: %s", lg_err_name(rc), e->message);
  json_t *j = json_loads(*out, 0, NULL);
  lg_free(*out);
  *out = NULL;
  assert_non_null(j);
  return j;
}

static double num(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  if (!json_is_number(v)) fail_msg("%s is not a number", k);
  return json_number_value(v);
}

/* Spends `micro` on the key's scope at now (a reservation settled). */
static void spend(lg_store_t *s, const char *scope, int64_t micro, int64_t now) {
  const char *sc[] = {scope};
  lg_budget_request_t rq = {.scopes = sc, .nscopes = 1, .amount_micro = micro};
  lg_budget_reservation_t rv;
  lg_error_t e = {0};
  assert_int_equal(lg_budget_reserve(s, &rq, now, &rv, NULL, &e), 0);
  assert_int_equal(lg_budget_settle(s, rv.id, micro, now, NULL, &e), 0);
}

static void test_resets(void **state) {
  (void)state;
  lg_error_t e = {0};
  lg_store_t *s = lg_store_open("memory:", NULL, &e);
  assert_non_null(s);
  char *out = NULL;
  const char *body = "{\"name\":\"d\",\"limit_usd\":1,\"limit_reset\":\"daily\"}";
  json_t *k = MUST(lg_key_create(s, body, strlen(body), MON, &out, &e));
  char secret[128], hash[80], scope[LG_BUDGET_SCOPE_MAX + 1];
  snprintf(secret, sizeof secret, "%s", json_string_value(json_object_get(k, "key")));
  snprintf(hash, sizeof hash, "%s", json_string_value(json_object_get(k, "hash")));
  snprintf(scope, sizeof scope, "%s", json_string_value(json_object_get(k, "scope")));
  assert_string_equal(json_string_value(json_object_get(k, "resets_at")), "2026-12-01T00:00:00.000Z");
  json_decref(k);

  spend(s, scope, 400000, MON);            /* Monday 10:00 */
  spend(s, scope, 100000, MON + 13 * 3600000LL); /* Monday 23:00 */
  json_t *v = MUST(lg_key_show(s, hash, MON + 13 * 3600000LL, &out, &e));
  assert_true(num(v, "usage_usd") == 0.5 && num(v, "limit_remaining_usd") == 0.5);
  assert_true(num(v, "usage_daily_usd") == 0.5 && num(v, "usage_weekly_usd") == 0.5);
  assert_true(num(v, "usage_monthly_usd") == 0.5);
  json_decref(v);
  /* Tuesday 1 December, 00:00 UTC: a new day and a new month; the week
   * goes on. A millisecond before, still Monday. */
  v = MUST(lg_key_show(s, hash, MON + 14 * 3600000LL - 1, &out, &e));
  assert_true(num(v, "usage_usd") == 0.5 && num(v, "usage_daily_usd") == 0.5);
  json_decref(v);
  v = MUST(lg_key_show(s, hash, MON + 14 * 3600000LL, &out, &e));
  assert_true(num(v, "usage_usd") == 0 && num(v, "limit_remaining_usd") == 1);
  assert_true(num(v, "usage_daily_usd") == 0 && num(v, "usage_monthly_usd") == 0);
  assert_true(num(v, "usage_weekly_usd") == 0.5);
  json_decref(v);

  /* Weekly: spent Monday, still counted on Sunday, gone the next Monday. */
  body = "{\"name\":\"w\",\"limit_usd\":1,\"limit_reset\":\"weekly\"}";
  k = MUST(lg_key_create(s, body, strlen(body), MON, &out, &e));
  const char *wsecret = json_string_value(json_object_get(k, "key"));
  spend(s, json_string_value(json_object_get(k, "scope")), 300000, MON);
  v = MUST(lg_key_self(s, wsecret, MON + 6 * DAY + 13 * 3600000LL, &out, &e));
  assert_true(num(v, "usage_usd") == 0.3); /* Sunday 23:00 */
  assert_true(num(v, "usage_daily_usd") == 0);
  json_decref(v);
  v = MUST(lg_key_self(s, wsecret, MON + 7 * DAY - 10 * 3600000LL, &out, &e));
  assert_true(num(v, "usage_usd") == 0 && num(v, "usage_weekly_usd") == 0); /* Monday 00:00 */
  json_decref(v);
  json_decref(k);

  /* Rotation: a new hash, the same id and spend; the old secret refused. */
  v = MUST(lg_key_rotate(s, hash, MON + 13 * 3600000LL, &out, &e)); /* Monday 23:00 */
  char secret2[128];
  snprintf(secret2, sizeof secret2, "%s", json_string_value(json_object_get(v, "key")));
  assert_string_not_equal(json_string_value(json_object_get(v, "hash")), hash);
  assert_string_equal(json_string_value(json_object_get(v, "id")), hash);
  assert_true(num(v, "usage_usd") == 0.5);
  json_decref(v);
  assert_int_equal(lg_key_self(s, secret, MON + DAY, &out, &e), LG_EPERM);
  assert_non_null(strstr(e.message, "unknown"));
  v = MUST(lg_key_self(s, secret2, MON + DAY, &out, &e));
  json_decref(v);
  body = "{\"disabled\":true}";
  v = MUST(lg_key_update(s, hash, body, strlen(body), MON + DAY, &out, &e));
  json_decref(v);
  assert_int_equal(lg_key_self(s, secret2, MON + DAY, &out, &e), LG_EPERM);
  assert_non_null(strstr(e.message, "disabled"));
  assert_int_equal(lg_key_self(s, "sk-not-ours", MON, &out, &e), LG_EPERM);
  lg_store_close(s);
}

static void test_rate_window(void **state) {
  (void)state;
  lg_error_t e = {0};
  lg_store_t *s = lg_store_open("memory:", NULL, &e);
  char *out = NULL;
  const char *body = "{\"name\":\"r\",\"rate_limit_per_min\":3}";
  json_t *k = MUST(lg_key_create(s, body, strlen(body), MON, &out, &e));
  const char *secret = json_string_value(json_object_get(k, "key"));
  lg__key_row_t r;
  assert_int_equal(lg__key_auth(s, secret, strlen(secret), &r, &e), 0);
  int64_t retry = 0;
  for (int i = 0; i < 3; i++) assert_int_equal(lg__key_rate(s, &r, MON + i * 1000, &retry, &e), 0);
  assert_int_equal(lg__key_rate(s, &r, MON + 20000, &retry, &e), LG_BUDGET_REFUSED);
  assert_int_equal(retry, 40); /* the window began at MON */
  assert_int_equal(lg__key_rate(s, &r, MON + 60000, &retry, &e), 0); /* a new minute */
  lg__key_row_clear(&r);
  json_decref(k);
  lg_store_close(s);
}

static void test_field_errors(void **state) {
  (void)state;
  lg_error_t e = {0};
  lg_store_t *s = lg_store_open("memory:", NULL, &e);
  static const struct {
    const char *body, *field;
  } cases[] = {
      {"{}", "name"},
      {"{\"name\":\"\"}", "name"},
      {"{\"name\":\"x\",\"limit_usd\":\"5\"}", "limit_usd"},
      {"{\"name\":\"x\",\"limit_usd\":-1}", "limit_usd"},
      {"{\"name\":\"x\",\"limit_reset\":\"daily\"}", "limit_reset"}, /* no limit */
      {"{\"name\":\"x\",\"models\":[\"a\",3]}", "models[1]"},
      {"{\"name\":\"x\",\"byok\":{\"u\":1}}", "byok.u"},
      {"{\"name\":\"x\",\"disabled\":true}", "disabled"}, /* not at creation */
      {"{\"name\":\"x\",\"workspace\":\"a\\u0001b\"}", "workspace"},
      {"{\"name\":\"x\",\"include_byok_in_limit\":1}", "include_byok_in_limit"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL;
    memset(&e, 0, sizeof e);
    int rc = lg_key_create(s, cases[i].body, strlen(cases[i].body), MON, &out, &e);
    if (rc != LG_EINVAL || strcmp(e.field, cases[i].field))
      fail_msg("%s: %s field \"%s\", wanted LG_EINVAL \"%s\"", cases[i].body, lg_err_name(rc),
               e.field, cases[i].field);
    assert_null(out);
  }
  char *out = NULL;
  assert_int_equal(lg_key_create(s, "{nope", 5, MON, &out, &e), LG_EPARSE);
  assert_int_equal(lg_key_show(s, "nope", MON, &out, &e), LG_ENOTFOUND);
  lg_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resets),
      cmocka_unit_test(test_rate_window),
      cmocka_unit_test(test_field_errors),
  };
  return cmocka_run_group_tests_name("keys", tests, NULL, NULL);
}
