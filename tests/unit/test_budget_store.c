/*
 * test_budget_store.c — shared budgets, one suite for every backend
 * (memory:, a SQLite file, and PostgreSQL when registered by tests/pg/):
 * set / get / list / reset; reservations over several scopes, all or none;
 * refusals by scope kind (402 key_limit, 403 workspace_budget, 402
 * scope_budget, 429 in_flight_budget with Retry-After); TTL expiry that
 * releases a hold at its instant and a late settlement; settlement above
 * the reservation; bad input that changes nothing (checked by reading the
 * whole store before and after); periods that roll over at the right
 * instant with reservations in flight across the boundary; purge; the
 * spend gate of a run's model calls (lg_budget_model / lg_budget_usage),
 * inside lg_store_with_run too; injected faults that roll back; and, for
 * the durable backends, restart and the migration of a version-3 store.
 * Times are fixed numbers: the clock is never read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "server/server.h" /* the refusal as the server answers it */
#include "store/store.h"
#include "store_test_util.h"

#define USD 1000000LL /* micro-dollars */
#define SEC 1000LL
#define DAY (86400 * SEC)
#define FP1 "1111111111111111111111111111111111111111111111111111111111111111"

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

static int64_t T0; /* 2025-03-14T10:00:00Z, a Friday */

static int durable(void) { return strcmp(lgt_backend, "memory") != 0; }

static int setup(void **state) {
  *state = lgt_open(lgt_fresh_url(lgt_backend), NULL);
  return 0;
}

static int teardown(void **state) {
  lg_store_close(*state);
  return 0;
}

static lg_budget_t set(lg_store_t *s, const char *scope, int64_t limit, lg_budget_period_t p,
                       int64_t mif, int64_t now) {
  lg_error_t err = {0};
  lg_budget_t b;
  int rc = lg_budget_set(s, scope, limit, p, mif, now, &b, &err);
  if (rc) fail_msg("set %s: %s: %s", scope, lg_err_name(rc), err.message);
  return b;
}

static lg_budget_t get(lg_store_t *s, const char *scope, int64_t now) {
  lg_error_t err = {0};
  lg_budget_t b;
  int rc = lg_budget_get(s, scope, now, &b, &err);
  if (rc) fail_msg("get %s: %s: %s", scope, lg_err_name(rc), err.message);
  return b;
}

static int reserve(lg_store_t *s, const char *const *scopes, size_t n, int64_t amount,
                   int64_t ttl, int64_t now, lg_budget_reservation_t *out,
                   lg_budget_refusal_t *why, lg_error_t *err) {
  lg_budget_request_t req = {.scopes = scopes, .nscopes = n, .amount_micro = amount,
                             .ttl_ms = ttl};
  return lg_budget_reserve(s, &req, now, out, why, err);
}

/* Reserves on one scope and expects success. */
static lg_budget_reservation_t hold(lg_store_t *s, const char *scope, int64_t amount, int64_t ttl,
                                    int64_t now) {
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  lg_error_t err = {0};
  const char *sc[1] = {scope};
  int rc = reserve(s, sc, 1, amount, ttl, now, &r, &why, &err);
  if (rc == LG_BUDGET_REFUSED) fail_msg("reserve on %s refused: %s", scope, why.message);
  if (rc) fail_msg("reserve on %s: %s: %s", scope, lg_err_name(rc), err.message);
  return r;
}

static void settle(lg_store_t *s, const char *id, int64_t actual, int64_t now) {
  lg_error_t err = {0};
  int rc = lg_budget_settle(s, id, actual, now, NULL, &err);
  if (rc) fail_msg("settle %s: %s: %s", id, lg_err_name(rc), err.message);
}

/* The budgets a listing gave. */
typedef struct listed {
  int n;
  lg_budget_t v[16];
} listed_t;

static int snap_one(void *ud, const lg_budget_t *b) {
  listed_t *x = ud;
  if (x->n < 16) x->v[x->n++] = *b;
  return 0;
}

/* ------------------------------------------------------------------ */

static void test_set_get_list(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg_budget_t b = set(s, "key:alice", 25 * USD, LG_PERIOD_DAILY, 2 * USD, T0);
  assert_string_equal(b.scope, "key:alice");
  assert_int_equal(b.limit_micro, 25 * USD);
  assert_int_equal(b.period, LG_PERIOD_DAILY);
  assert_int_equal(b.max_in_flight_micro, 2 * USD);
  assert_int_equal(b.spent_micro, 0);
  assert_int_equal(b.reserved_micro, 0);
  assert_int_equal(b.period_start_ms, utc(2025, 3, 14, 0, 0, 0));
  assert_int_equal(b.resets_at_ms, utc(2025, 3, 15, 0, 0, 0));
  assert_int_equal(b.next_expiry_ms, -1);
  assert_int_equal(lg_budget_remaining(&b), 25 * USD);
  b = get(s, "key:alice", T0 + 1);
  assert_int_equal(b.limit_micro, 25 * USD);
  assert_int_equal(b.created_ms, T0);
  char *j = lg_budget_to_json(&b);
  assert_string_equal(j, "{\"scope\":\"key:alice\",\"limit_usd\":25,\"period\":\"daily\","
                         "\"spent_usd\":0,\"reserved_usd\":0,"
                         "\"resets_at\":\"2025-03-15T00:00:00.000Z\",\"max_in_flight_usd\":2,"
                         "\"remaining_usd\":25,\"open_reservations\":0}");
  lg_free(j);
  /* Changing the limit keeps what was spent. */
  lg_budget_reservation_t r = hold(s, "key:alice", 1 * USD, 60 * SEC, T0 + 2);
  settle(s, r.id, 700000, T0 + 3);
  b = set(s, "key:alice", 30 * USD, LG_PERIOD_DAILY, -1, T0 + 4);
  assert_int_equal(b.spent_micro, 700000);
  assert_int_equal(b.max_in_flight_micro, -1);
  assert_int_equal(b.created_ms, T0);
  assert_int_equal(b.updated_ms, T0 + 4);
  /* period none: no reset, resets_at null. */
  b = set(s, "team:ml", 500000, LG_PERIOD_NONE, -1, T0);
  assert_int_equal(b.resets_at_ms, -1);
  assert_int_equal(b.period_start_ms, 0);
  j = lg_budget_to_json(&b);
  assert_non_null(strstr(j, "\"resets_at\":null"));
  assert_non_null(strstr(j, "\"max_in_flight_usd\":null"));
  lg_free(j);
  set(s, "Zed", 1, LG_PERIOD_WEEKLY, -1, T0);
  set(s, "workspace:acme", 1, LG_PERIOD_MONTHLY, -1, T0);
  set(s, "équipe", 1, LG_PERIOD_MONTHLY, -1, T0);
  /* list: by scope, byte order (upper case first, UTF-8 last). */
  listed_t names = {0};
  assert_int_equal(lg_budget_list(s, T0, snap_one, &names, &err), 0);
  const char *want[] = {"Zed", "key:alice", "team:ml", "workspace:acme", "équipe"};
  assert_int_equal(names.n, 5);
  for (int i = 0; i < 5; i++) assert_string_equal(names.v[i].scope, want[i]);
  /* Errors. */
  assert_int_equal(lg_budget_get(s, "key:nobody", T0, &b, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "key:nobody"));
  assert_true(err.source[0] != 0); /* the store is named */
  assert_int_equal(lg_budget_set(s, "key:x", -1, LG_PERIOD_DAILY, -1, T0, NULL, &err), LG_EINVAL);
  assert_string_equal(err.field, "limit_usd");
  assert_int_equal(lg_budget_set(s, "key:x", LG_BUDGET_MAX_MICRO + 1, LG_PERIOD_DAILY, -1, T0,
                                 NULL, &err),
                   LG_ERANGE);
  assert_int_equal(lg_budget_set(s, "", 1, LG_PERIOD_DAILY, -1, T0, NULL, &err), LG_EINVAL);
  assert_int_equal(lg_budget_set(s, "key:x", 1, (lg_budget_period_t)7, -1, T0, NULL, &err),
                   LG_EINVAL);
  assert_int_equal(lg_budget_get(s, "key:x", T0, &b, &err), LG_ENOTFOUND);
}

static void test_reserve_settle(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 3 * USD, 30 * SEC, T0);
  assert_int_equal(strlen(r.id), 36);
  assert_memory_equal(r.id, "rsv_", 4);
  assert_int_equal(r.amount_micro, 3 * USD);
  assert_int_equal(r.expires_ms, T0 + 30 * SEC);
  char *j = lg__budget_reservation_json(&r);
  assert_non_null(strstr(j, "\"expires_at\":\"2025-03-14T10:00:30.000Z\""));
  lg_free(j);
  lg_budget_t b = get(s, "key:a", T0 + 1);
  assert_int_equal(b.reserved_micro, 3 * USD);
  assert_int_equal(b.open_reservations, 1);
  assert_int_equal(b.next_expiry_ms, T0 + 30 * SEC);
  assert_int_equal(lg_budget_remaining(&b), 7 * USD);
  lg_budget_reservation_t r2 = hold(s, "key:a", 7 * USD, 30 * SEC, T0 + 2); /* exactly fits */
  lg_budget_settlement_t st;
  assert_int_equal(lg_budget_settle(s, r.id, 2500000, T0 + 3, &st, &err), 0);
  assert_string_equal(st.id, r.id);
  assert_int_equal(st.reserved_micro, 3 * USD);
  assert_int_equal(st.actual_micro, 2500000);
  assert_int_equal(st.late, 0);
  assert_int_equal(st.nscopes, 1);
  assert_int_equal(st.scopes[0].spent_micro, 2500000);
  assert_int_equal(st.scopes[0].reserved_micro, 7 * USD);
  j = lg__budget_settlement_json(&st);
  assert_non_null(strstr(j, "\"actual_usd\":2.5,\"late\":false,\"capped\":false,\"scopes\":[{\"scope\":\"key:a\""));
  lg_free(j);
  lg_budget_settlement_clear(&st);
  b = get(s, "key:a", T0 + 4);
  assert_int_equal(b.spent_micro, 2500000);
  assert_int_equal(b.reserved_micro, 7 * USD);
  /* actual 0 releases a call that was not made. */
  settle(s, r2.id, 0, T0 + 5);
  b = get(s, "key:a", T0 + 6);
  assert_int_equal(b.reserved_micro, 0);
  assert_int_equal(b.spent_micro, 2500000);
  assert_int_equal(b.open_reservations, 0);
  /* A zero amount is a valid reservation (a free model). */
  lg_budget_reservation_t z = hold(s, "key:a", 0, 0, T0 + 7);
  assert_int_equal(z.expires_ms, T0 + 7 + LG_BUDGET_DEFAULT_TTL_MS);
  settle(s, z.id, 0, T0 + 8);
}

static void test_all_or_none(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  set(s, "workspace:w", 1 * USD, LG_PERIOD_MONTHLY, -1, T0);
  set(s, "team:t", 5 * USD, LG_PERIOD_NONE, -1, T0);
  const char *sc[3] = {"key:a", "workspace:w", "team:t"};
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  assert_int_equal(reserve(s, sc, 3, 2 * USD, 0, T0, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(lg__http_refusal_status(&why), 403);
  assert_string_equal(why.type, "budget_exceeded");
  assert_string_equal(why.limit_source, "workspace_budget");
  assert_string_equal(why.scope, "workspace:w");
  assert_int_equal(why.remaining_micro, 1 * USD);
  assert_int_equal(why.requested_micro, 2 * USD);
  assert_int_equal(why.resets_at_ms, utc(2025, 4, 1, 0, 0, 0));
  assert_int_equal(why.retry_after_s, 0);
  assert_non_null(strstr(why.message, "workspace:w"));
  char *j = lg__http_refusal_json(&why);
  assert_non_null(strstr(j, "{\"error\":{\"code\":403,\"type\":\"budget_exceeded\""));
  assert_non_null(strstr(j, "\"metadata\":{\"limit_source\":\"workspace_budget\",\"scope\":"
                            "\"workspace:w\",\"remaining_usd\":1,\"requested_usd\":2,"
                            "\"resets_at\":\"2025-04-01T00:00:00.000Z\"}"));
  lg_free(j);
  /* None of the scopes holds anything. */
  for (int i = 0; i < 3; i++) assert_int_equal(get(s, sc[i], T0).reserved_micro, 0);
  /* What fits everywhere holds everywhere, and settles everywhere. */
  assert_int_equal(reserve(s, sc, 3, 600000, 0, T0, &r, &why, &err), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(get(s, sc[i], T0).reserved_micro, 600000);
  lg_budget_settlement_t st;
  assert_int_equal(lg_budget_settle(s, r.id, 400000, T0 + 1, &st, &err), 0);
  assert_int_equal(st.nscopes, 3);
  for (size_t i = 0; i < st.nscopes; i++) {
    assert_int_equal(st.scopes[i].spent_micro, 400000);
    assert_int_equal(st.scopes[i].reserved_micro, 0);
  }
  /* by name: key:a, team:t, workspace:w */
  assert_string_equal(st.scopes[0].scope, "key:a");
  assert_string_equal(st.scopes[2].scope, "workspace:w");
  lg_budget_settlement_clear(&st);
}

static void test_refusal_kinds(void **state) {
  lg_store_t *s = *state;
  static const struct {
    const char *scope;
    int status;
    const char *source;
  } k[] = {{"key:k", 402, "key_limit"},
           {"workspace:w", 403, "workspace_budget"},
           {"team:t", 402, "scope_budget"},
           {"customer:c", 402, "scope_budget"},
           {"nightly-batch", 402, "scope_budget"}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    set(s, k[i].scope, 1 * USD, LG_PERIOD_WEEKLY, -1, T0);
    lg_budget_reservation_t r;
    lg_budget_refusal_t why;
    lg_error_t err = {0};
    const char *sc[1] = {k[i].scope};
    assert_int_equal(reserve(s, sc, 1, 1 * USD + 1, 0, T0, &r, &why, &err), LG_BUDGET_REFUSED);
    assert_int_equal(lg__http_refusal_status(&why), k[i].status);
    assert_string_equal(why.limit_source, k[i].source);
    assert_string_equal(why.type, "budget_exceeded");
    assert_int_equal(why.resets_at_ms, utc(2025, 3, 17, 0, 0, 0)); /* next Monday */
    assert_int_equal(why.kind, lg_budget_scope_kind(k[i].scope));
  }
}

static void test_in_flight(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 100 * USD, LG_PERIOD_DAILY, 1 * USD, T0);
  lg_budget_reservation_t r1 = hold(s, "key:a", 600000, 10 * SEC, T0);
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  const char *sc[1] = {"key:a"};
  assert_int_equal(reserve(s, sc, 1, 600000, 0, T0 + 1, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(lg__http_refusal_status(&why), 429);
  assert_string_equal(why.type, "rate_limited");
  assert_string_equal(why.limit_source, "in_flight_budget");
  assert_int_equal(why.retry_after_s, 10); /* the first hold runs out in 9.999 s */
  assert_int_equal(why.remaining_micro, 400000);
  char *j = lg__http_refusal_json(&why);
  assert_non_null(strstr(j, "\"code\":429,\"type\":\"rate_limited\""));
  assert_non_null(strstr(j, "\"retry_after_s\":10"));
  lg_free(j);
  assert_int_equal(reserve(s, sc, 1, 600000, 0, T0 + 9500, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(why.retry_after_s, 1); /* at least 1 */
  /* More than the cap alone: waiting cannot help, so not a 429. */
  assert_int_equal(reserve(s, sc, 1, 2 * USD, 0, T0 + 2, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(lg__http_refusal_status(&why), 402);
  assert_string_equal(why.limit_source, "in_flight_budget");
  assert_non_null(strstr(why.message, "never fit"));
  /* The limit is checked before the in-flight cap. */
  set(s, "key:b", 1 * USD, LG_PERIOD_DAILY, 500000, T0);
  hold(s, "key:b", 400000, 10 * SEC, T0);
  const char *sb[1] = {"key:b"};
  assert_int_equal(reserve(s, sb, 1, 700000, 0, T0, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(lg__http_refusal_status(&why), 402);
  assert_string_equal(why.limit_source, "key_limit");
  /* Once the first settles, the second fits. */
  settle(s, r1.id, 500000, T0 + 3);
  assert_int_equal(reserve(s, sc, 1, 600000, 0, T0 + 4, &r, &why, &err), 0);
  /* And once its hold runs out, too. */
  assert_int_equal(reserve(s, sc, 1, 600000, 0, T0 + 5, &r, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(reserve(s, sc, 1, 600000, 0, T0 + 4 + LG_BUDGET_DEFAULT_TTL_MS, &r, &why,
                           &err),
                   0);
}

static void test_ttl_expiry(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "team:t", 5 * USD, LG_PERIOD_NONE, -1, T0);
  lg_budget_reservation_t r = hold(s, "team:t", 5 * USD, 1000, T0);
  lg_budget_reservation_t x;
  lg_budget_refusal_t why;
  const char *sc[1] = {"team:t"};
  assert_int_equal(reserve(s, sc, 1, 1, 0, T0 + 999, &x, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(get(s, "team:t", T0 + 999).reserved_micro, 5 * USD);
  /* At its expiry, to the millisecond, the hold is gone: no sweeper. */
  lg_budget_t b = get(s, "team:t", T0 + 1000);
  assert_int_equal(b.reserved_micro, 0);
  assert_int_equal(b.open_reservations, 0);
  assert_int_equal(b.next_expiry_ms, -1);
  lg_budget_reservation_t r2 = hold(s, "team:t", 5 * USD, 60 * SEC, T0 + 1000);
  /* The first one settles late: the money was spent, so it counts, and
   * the budget may pass its limit by that much. */
  lg_budget_settlement_t st;
  assert_int_equal(lg_budget_settle(s, r.id, 2 * USD, T0 + 2000, &st, &err), 0);
  assert_int_equal(st.late, 1);
  assert_int_equal(st.scopes[0].spent_micro, 2 * USD);
  assert_int_equal(st.scopes[0].reserved_micro, 5 * USD);
  lg_budget_settlement_clear(&st);
  b = get(s, "team:t", T0 + 2001);
  assert_int_equal(b.spent_micro + b.reserved_micro, 7 * USD);
  assert_int_equal(lg_budget_remaining(&b), 0);
  settle(s, r2.id, 1 * USD, T0 + 3000);
  assert_int_equal(get(s, "team:t", T0 + 3001).spent_micro, 3 * USD);
}

/* Two writers whose clocks disagree: one (ahead) releases a hold it sees
 * expired; the other (behind) settles that reservation believing it
 * still holds. The hold leaves the counters once, not twice. */
static void test_clock_skew(void **state) {
  lg_store_t *s = *state;
  set(s, "key:a", 10 * USD, LG_PERIOD_NONE, -1, T0);
  lg_budget_reservation_t a = hold(s, "key:a", 2 * USD, 1000, T0);
  lg_budget_reservation_t b = hold(s, "key:a", 3 * USD, 60 * SEC, T0);
  /* The writer ahead, at T0 + 5 s: a has expired; it reserves 1 USD. */
  lg_budget_reservation_t c = hold(s, "key:a", 1 * USD, 60 * SEC, T0 + 5000);
  lg_budget_t x = get(s, "key:a", T0 + 5000);
  assert_int_equal(x.reserved_micro, 4 * USD);
  assert_int_equal(x.open_reservations, 2);
  /* The writer behind, at T0 + 10 ms, settles a: it is charged, and the
   * holds of b and c stay whole. */
  settle(s, a.id, 1 * USD, T0 + 10);
  x = get(s, "key:a", T0 + 5001);
  assert_int_equal(x.spent_micro, 1 * USD);
  assert_int_equal(x.reserved_micro, 4 * USD);
  assert_int_equal(x.open_reservations, 2);
  settle(s, b.id, 1 * USD, T0 + 6000);
  settle(s, c.id, 1 * USD, T0 + 6001);
  x = get(s, "key:a", T0 + 6002);
  assert_int_equal(x.reserved_micro, 0);
  assert_int_equal(x.open_reservations, 0);
  assert_int_equal(x.spent_micro, 3 * USD);
}

static void test_settle_above_reservation(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 2 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 1 * USD, 0, T0);
  /* The provider charged more than the worst case: recorded as spent. */
  settle(s, r.id, 3 * USD, T0 + 1);
  lg_budget_t b = get(s, "key:a", T0 + 2);
  assert_int_equal(b.spent_micro, 3 * USD);
  assert_int_equal(lg_budget_remaining(&b), 0);
  lg_budget_reservation_t x;
  lg_budget_refusal_t why;
  const char *sc[1] = {"key:a"};
  assert_int_equal(reserve(s, sc, 1, 0, 0, T0 + 3, &x, &why, &err), LG_BUDGET_REFUSED);
  assert_int_equal(why.remaining_micro, 0);
  /* Reset: spent back to 0, the limit stays. */
  b = (lg_budget_t){0};
  assert_int_equal(lg_budget_reset(s, "key:a", T0 + 4, &b, &err), 0);
  assert_int_equal(b.spent_micro, 0);
  assert_int_equal(b.limit_micro, 2 * USD);
  assert_int_equal(reserve(s, sc, 1, 2 * USD, 0, T0 + 5, &x, &why, &err), 0);
}

static void test_reset_keeps_reservations(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_MONTHLY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 4 * USD, 60 * SEC, T0);
  lg_budget_reservation_t r2 = hold(s, "key:a", 1 * USD, 60 * SEC, T0);
  settle(s, r2.id, 1 * USD, T0 + 1);
  lg_budget_t b;
  assert_int_equal(lg_budget_reset(s, "key:a", T0 + 2, &b, &err), 0);
  assert_int_equal(b.spent_micro, 0);
  assert_int_equal(b.reserved_micro, 4 * USD);
  settle(s, r.id, 3 * USD, T0 + 3);
  assert_int_equal(get(s, "key:a", T0 + 4).spent_micro, 3 * USD);
  assert_int_equal(lg_budget_reset(s, "key:nobody", T0, &b, &err), LG_ENOTFOUND);
}

/* ---- bad input: a clear error, and the store exactly as it was ---- */

typedef struct snapshot {
  char text[8192];
} snapshot_t;

static int snap_cb(void *ud, const lg_budget_t *b) {
  snapshot_t *x = ud;
  char *j = lg_budget_to_json(b);
  size_t n = strlen(x->text);
  snprintf(x->text + n, sizeof x->text - n, "%s|%lld\n", j, (long long)b->next_expiry_ms);
  lg_free(j);
  return 0;
}

static snapshot_t snap(lg_store_t *s, int64_t now) {
  snapshot_t x = {{0}};
  assert_int_equal(lg_budget_list(s, now, snap_cb, &x, NULL), 0);
  return x;
}

#define UNCHANGED(s, before, now)                                                 \
  do {                                                                            \
    snapshot_t after_ = snap(s, now);                                             \
    assert_string_equal((before).text, after_.text);                              \
  } while (0)

static void test_bad_input(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, 5 * USD, T0);
  set(s, "team:t", 10 * USD, LG_PERIOD_NONE, -1, T0);
  lg_budget_reservation_t open1 = hold(s, "key:a", 1 * USD, 60 * SEC, T0);
  lg_budget_reservation_t done = hold(s, "team:t", 1 * USD, 60 * SEC, T0);
  settle(s, done.id, 500000, T0 + 1);
  const int64_t now = T0 + 2;
  snapshot_t before = snap(s, now);
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  const char *one[1] = {"key:a"};
  const char *two[2] = {"key:a", "team:t"};
  const char *dup[3] = {"key:a", "team:t", "key:a"};
  const char *unknown[2] = {"key:a", "key:ghost"};
  const char *badname[2] = {"key:a", "bad\nname"};
  const char *many[LG_BUDGET_MAX_SCOPES + 1];
  for (int i = 0; i <= LG_BUDGET_MAX_SCOPES; i++) many[i] = "key:a";

  assert_int_equal(reserve(s, one, 1, -1, 0, now, &r, &why, &err), LG_EINVAL);
  assert_string_equal(err.field, "amount_usd");
  assert_int_equal(reserve(s, one, 1, LG_BUDGET_MAX_MICRO + 1, 0, now, &r, &why, &err), LG_ERANGE);
  int64_t m;
  assert_int_equal(lg_budget_usd_to_micro(NAN, &m, "amount_usd", &err), LG_EINVAL);
  assert_int_equal(lg_budget_usd_to_micro(INFINITY, &m, "amount_usd", &err), LG_EINVAL);
  assert_int_equal(reserve(s, one, 0, 1, 0, now, &r, &why, &err), LG_EINVAL);
  assert_non_null(strstr(err.message, "no scope"));
  assert_int_equal(reserve(s, NULL, 1, 1, 0, now, &r, &why, &err), LG_EINVAL);
  assert_int_equal(reserve(s, dup, 3, 1, 0, now, &r, &why, &err), LG_EINVAL);
  assert_string_equal(err.field, "scopes[2]");
  assert_non_null(strstr(err.message, "twice"));
  assert_int_equal(reserve(s, many, LG_BUDGET_MAX_SCOPES + 1, 1, 0, now, &r, &why, &err),
                   LG_EINVAL);
  assert_int_equal(reserve(s, unknown, 2, 1, 0, now, &r, &why, &err), LG_ENOTFOUND);
  assert_string_equal(err.field, "scopes[1]");
  assert_non_null(strstr(err.message, "key:ghost"));
  assert_int_equal(reserve(s, badname, 2, 1, 0, now, &r, &why, &err), LG_EINVAL);
  assert_string_equal(err.field, "scopes[1]");
  assert_int_equal(reserve(s, two, 2, 1, LG_BUDGET_MAX_TTL_MS + 1, now, &r, &why, &err),
                   LG_EINVAL);
  assert_string_equal(err.field, "ttl_ms");
  assert_int_equal(lg_budget_reserve(s, NULL, now, &r, &why, &err), LG_EINVAL);
  /* settlement */
  assert_int_equal(lg_budget_settle(s, "rsv_00000000000000000000000000000000", 1, now, NULL, &err),
                   LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "rsv_00000000000000000000000000000000"));
  assert_int_equal(lg_budget_settle(s, "", 1, now, NULL, &err), LG_EINVAL);
  assert_int_equal(lg_budget_settle(s, NULL, 1, now, NULL, &err), LG_EINVAL);
  assert_int_equal(lg_budget_settle(s, "x-way-too-long-to-be-a-reservation-id-at-all", 1, now, NULL,
                                    &err),
                   LG_ENOTFOUND);
  assert_int_equal(lg_budget_settle(s, open1.id, -5, now, NULL, &err), LG_EINVAL);
  assert_string_equal(err.field, "actual_usd");
  assert_int_equal(lg_budget_settle(s, open1.id, LG_BUDGET_MAX_MICRO + 1, now, NULL, &err),
                   LG_ERANGE);
  lg_budget_settlement_t st;
  assert_int_equal(lg_budget_settle(s, done.id, 1, now, &st, &err), LG_ECONFLICT);
  assert_non_null(strstr(err.message, "already settled"));
  assert_int_equal(st.nscopes, 0);
  assert_null(st.scopes);
  /* set with bad values */
  assert_int_equal(lg_budget_set(s, "key:a", 1, LG_PERIOD_DAILY, LG_BUDGET_MAX_MICRO + 1, now,
                                 NULL, &err),
                   LG_ERANGE);
  assert_string_equal(err.field, "max_in_flight_usd");
  UNCHANGED(s, before, now);
  /* ... and the reservation still settles normally. */
  settle(s, open1.id, 1, now + 1);
}

/* ---- periods ---- */

static void test_period_rollover_daily(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 4 * USD, DAY, T0);
  settle(s, r.id, 3 * USD, T0 + 1);
  int64_t midnight = utc(2025, 3, 15, 0, 0, 0);
  assert_int_equal(get(s, "key:a", midnight - 1).spent_micro, 3 * USD);
  /* A call in flight across midnight: reserved at 23:59, settled at
   * 00:02. Its hold counts in the new day; so does its cost. */
  lg_budget_reservation_t across = hold(s, "key:a", 5 * USD, 10 * 60 * SEC, midnight - 60 * SEC);
  lg_budget_t b = get(s, "key:a", midnight);
  assert_int_equal(b.spent_micro, 0); /* at the instant, without a write */
  assert_int_equal(b.reserved_micro, 5 * USD);
  assert_int_equal(b.period_start_ms, midnight);
  assert_int_equal(b.resets_at_ms, midnight + DAY);
  lg_budget_reservation_t x;
  lg_budget_refusal_t why;
  const char *sc[1] = {"key:a"};
  assert_int_equal(reserve(s, sc, 1, 6 * USD, 0, midnight + 60 * SEC, &x, &why, &err),
                   LG_BUDGET_REFUSED);
  assert_int_equal(why.resets_at_ms, midnight + DAY);
  settle(s, across.id, 4 * USD, midnight + 120 * SEC);
  b = get(s, "key:a", midnight + 121 * SEC);
  assert_int_equal(b.spent_micro, 4 * USD);
  assert_int_equal(b.reserved_micro, 0);
  /* The day after, untouched: spent 0 again. */
  assert_int_equal(get(s, "key:a", midnight + DAY).spent_micro, 0);
}

static void test_period_rollover_weekly_monthly(void **state) {
  lg_store_t *s = *state;
  /* Weekly: Sunday 2025-03-16 23:59:59.999 still counts; Monday resets. */
  set(s, "team:w", 10 * USD, LG_PERIOD_WEEKLY, -1, T0);
  lg_budget_reservation_t r = hold(s, "team:w", 2 * USD, 0, T0);
  settle(s, r.id, 2 * USD, T0 + 1);
  int64_t monday = utc(2025, 3, 17, 0, 0, 0);
  assert_int_equal(get(s, "team:w", monday - 1).spent_micro, 2 * USD);
  assert_int_equal(get(s, "team:w", monday).spent_micro, 0);
  /* A write after the reset keeps the new week. */
  r = hold(s, "team:w", 1 * USD, 0, monday + 5);
  settle(s, r.id, 1 * USD, monday + 6);
  assert_int_equal(get(s, "team:w", monday + 7).spent_micro, 1 * USD);
  assert_int_equal(get(s, "team:w", monday + 7 * DAY - 1).spent_micro, 1 * USD);
  /* Monthly across a leap February and a year end. */
  int64_t feb29 = utc(2024, 2, 29, 23, 59, 59) + 999;
  set(s, "customer:c", 10 * USD, LG_PERIOD_MONTHLY, -1, utc(2024, 2, 3, 0, 0, 0));
  r = hold(s, "customer:c", 1 * USD, 0, feb29 - 5);
  settle(s, r.id, 1 * USD, feb29);
  lg_budget_t b = get(s, "customer:c", feb29);
  assert_int_equal(b.spent_micro, 1 * USD);
  assert_int_equal(b.resets_at_ms, utc(2024, 3, 1, 0, 0, 0));
  assert_int_equal(get(s, "customer:c", feb29 + 1).spent_micro, 0);
  int64_t dec31 = utc(2024, 12, 31, 12, 0, 0);
  r = hold(s, "customer:c", 1 * USD, 0, dec31);
  settle(s, r.id, 2 * USD, dec31 + 1);
  b = get(s, "customer:c", utc(2025, 1, 1, 0, 0, 0) - 1);
  assert_int_equal(b.spent_micro, 2 * USD);
  assert_int_equal(b.resets_at_ms, utc(2025, 1, 1, 0, 0, 0));
  b = get(s, "customer:c", utc(2025, 1, 1, 0, 0, 0));
  assert_int_equal(b.spent_micro, 0);
  assert_int_equal(b.resets_at_ms, utc(2025, 2, 1, 0, 0, 0));
  /* Changing the period keeps the spent, in the new period of now. */
  r = hold(s, "team:w", 1 * USD, 0, monday + 10);
  settle(s, r.id, 1 * USD, monday + 11);
  b = set(s, "team:w", 10 * USD, LG_PERIOD_MONTHLY, -1, monday + 12);
  assert_int_equal(b.spent_micro, 2 * USD);
  assert_int_equal(b.period_start_ms, utc(2025, 3, 1, 0, 0, 0));
  assert_int_equal(b.resets_at_ms, utc(2025, 4, 1, 0, 0, 0));
}

static void test_purge(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_NONE, -1, T0);
  lg_budget_reservation_t expired = hold(s, "key:a", 1 * USD, 1000, T0);
  lg_budget_reservation_t settled = hold(s, "key:a", 1 * USD, 1000, T0);
  lg_budget_reservation_t live = hold(s, "key:a", 1 * USD, DAY, T0 + 2000);
  settle(s, settled.id, 1, T0 + 1);
  int64_t purged = -1;
  /* Nothing is older than a day yet. */
  assert_int_equal(lg_budget_purge(s, -1, T0 + 2000, &purged, &err), 0);
  assert_int_equal(purged, 0);
  assert_int_equal(get(s, "key:a", T0 + 2000).reserved_micro, 1 * USD); /* the live one */
  /* A day after their TTL, the expired and the settled are forgotten. */
  assert_int_equal(lg_budget_purge(s, -1, T0 + 1000 + DAY, &purged, &err), 0);
  assert_int_equal(purged, 2);
  assert_int_equal(lg_budget_settle(s, expired.id, 1, T0 + 1001 + DAY, NULL, &err), LG_ENOTFOUND);
  assert_int_equal(lg_budget_settle(s, settled.id, 1, T0 + 1001 + DAY, NULL, &err), LG_ENOTFOUND);
  lg_budget_t b = get(s, "key:a", T0 + 1001 + DAY);
  assert_int_equal(b.reserved_micro, 1 * USD);
  assert_int_equal(b.spent_micro, 1);
  settle(s, live.id, 2, T0 + 1002 + DAY);
  assert_int_equal(lg_budget_purge(s, 0, T0 + 11 * DAY, &purged, &err), 0);
  assert_int_equal(purged, 1);
}

/* ---- the spend gate of a run ---- */

static const char *PRICES = "{\"models\": {\"m\": {\"input_usd_per_mtok\": 1000, "
                            "\"output_usd_per_mtok\": 2000}}}";

typedef struct gate_ctx {
  lg_prices_t *prices;
  lg_model_call_t m;
  int64_t now;
  lg_decision_t d;
  lg_budget_gate_t g;
  int rc;
  lg_counters_t c;
  lg_error_t err;
} gate_ctx_t;

/* A model call decided under the run's lock, as the server does. */
static int gate_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  gate_ctx_t *x = ud;
  lg_run_t *run = NULL;
  int rc = lg_store_run_load(s, rec->run_id, NULL, &run, &x->err);
  if (rc) return rc;
  x->rc = lg_budget_model(s, x->prices, run, &x->m, 0, x->now, &x->d, &x->g, &x->err);
  lg_run_counters(run, &x->c);
  rc = x->rc < 0 ? x->rc : lg_store_run_save(s, run, x->now, &x->err);
  lg_run_free(run);
  return rc;
}

static void test_model_gate(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg_prices_t *pr = lg_prices_parse(PRICES, strlen(PRICES), "prices", &err);
  assert_non_null(pr);
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  set(s, "workspace:w", 100 * USD, LG_PERIOD_MONTHLY, 5 * USD, T0);
  const char *sc[2] = {"key:a", "workspace:w"};
  const char *ghost[2] = {"key:a", "key:ghost"};
  assert_int_equal(lg_budget_run_scopes_set(s, "run-1", ghost, 2, &err), LG_ENOTFOUND);
  assert_string_equal(err.field, "scopes[1]");
  assert_int_equal(lg_budget_scopes_check(s, ghost, 2, &err), LG_ENOTFOUND);
  assert_string_equal(err.field, "scopes[1]");
  assert_int_equal(lg_budget_scopes_check(s, sc, 2, &err), 0);
  const char *twice[2] = {"key:a", "key:a"};
  assert_int_equal(lg_budget_scopes_check(s, twice, 2, &err), LG_EINVAL);
  assert_int_equal(lg_budget_scopes_check(s, sc, 0, &err), LG_EINVAL);
  assert_int_equal(lg_budget_run_scopes_set(s, "run-1", sc, 2, &err), 0);
  char *json = NULL;
  assert_int_equal(lg_budget_run_scopes(s, "run-1", &json, &err), 0);
  assert_string_equal(json, "[\"key:a\",\"workspace:w\"]");
  lg_free(json);
  assert_int_equal(lg_budget_run_scopes(s, "run-none", &json, &err), 0);
  assert_string_equal(json, "[]");
  lg_free(json);

  lg_run_t *run = lg_run_new("run-1", NULL, NULL, NULL, NULL, &err);
  assert_non_null(run);
  /* 1000 in + 1000 out: 1 + 2 = 3 USD worst. */
  lg_model_call_t m = {.model = "m", .input_tokens = 1000, .max_tokens = 1000,
                       .output_tokens = -1, .cost_nusd = -1, .t_ms = 1};
  lg_decision_t d;
  lg_budget_gate_t g;
  assert_int_equal(lg_budget_model(s, pr, run, &m, 60 * SEC, T0, &d, &g, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  assert_int_equal(g.worst_nusd, 3000000000LL);
  assert_memory_equal(g.reservation_id, "rsv_", 4);
  assert_int_equal(get(s, "key:a", T0).reserved_micro, 3 * USD);
  assert_int_equal(get(s, "workspace:w", T0).reserved_micro, 3 * USD);
  int64_t first = d.reservation;
  /* The second: the workspace's in-flight cap (5) would be passed: 429,
   * and the run is as it was. */
  lg_counters_t before, after;
  lg_run_counters(run, &before);
  m.t_ms = 2;
  assert_int_equal(lg_budget_model(s, pr, run, &m, 60 * SEC, T0 + 1, &d, &g, &err),
                   LG_BUDGET_REFUSED);
  assert_int_equal(g.refused, 1);
  assert_int_equal(lg__http_refusal_status(&g.refusal), 429);
  assert_string_equal(g.refusal.scope, "workspace:w");
  assert_false(lg_run_stopped(run));
  lg_run_counters(run, &after);
  assert_int_equal(after.model_calls, before.model_calls);
  assert_int_equal(get(s, "key:a", T0 + 1).reserved_micro, 3 * USD);
  /* Usage without a cost: priced from the tokens (1000 in, 250 out: 1.5). */
  int64_t actual = 0;
  assert_int_equal(lg_budget_usage(s, pr, run, first, 1000, 250, -1, 3, T0 + 2, &actual, &err), 0);
  assert_int_equal(actual, 1500000000LL);
  assert_int_equal(get(s, "key:a", T0 + 2).spent_micro, 1500000);
  assert_int_equal(get(s, "workspace:w", T0 + 2).spent_micro, 1500000);
  assert_int_equal(get(s, "key:a", T0 + 2).reserved_micro, 0);
  lg_run_counters(run, &after);
  assert_int_equal(after.cost_nusd, 1500000000LL);
  assert_int_equal(lg_budget_usage(s, pr, run, first, 1, 1, 1, 4, T0 + 3, NULL, &err),
                   LG_ENOTFOUND);
  /* Calls until the key's limit (10) refuses: 1.5 + 3 + 3 + 3 = 10.5 > 10
   * at the fourth, so three more go through, each settled at its worst
   * through "oldest open" (reservation 0) with the client's cost. */
  int let = 0;
  for (int i = 0; i < 5 && !lg_run_stopped(run); i++) {
    m.t_ms = 10 + i;
    int rc = lg_budget_model(s, pr, run, &m, 60 * SEC, T0 + 10 + i, &d, &g, &err);
    assert_int_equal(rc, 0);
    if (d.action != LG_ACT_EXECUTE) break;
    let++;
    assert_int_equal(lg_budget_usage(s, pr, run, 0, 1000, 1000, 3000000000LL, 20 + i,
                                     T0 + 20 + i, NULL, &err),
                     0);
  }
  assert_int_equal(let, 2); /* 1.5 + 3 + 3 = 7.5; the next would reach 10.5 */
  assert_true(lg_run_stopped(run));
  assert_int_equal(d.action, LG_ACT_STOP);
  assert_int_equal(d.reason, LG_R_BUDGET_EXCEEDED);
  assert_int_equal(g.refused, 1);
  assert_int_equal(lg__http_refusal_status(&g.refusal), 402);
  assert_string_equal(g.refusal.limit_source, "key_limit");
  assert_non_null(strstr(d.message ? d.message : "", "key:a"));
  lg_budget_t b = get(s, "key:a", T0 + 100);
  assert_int_equal(b.spent_micro, 7500000);
  assert_int_equal(b.reserved_micro, 0);
  lg_run_free(run);

  /* An engine cap refuses: the shared reservation is undone. */
  const char *pol = "{\"limits\": {\"max_model_calls\": 1}}";
  lg_policy_t *p = lg_policy_parse(pol, strlen(pol), NULL, &err);
  set(s, "team:big", 1000 * USD, LG_PERIOD_NONE, -1, T0);
  const char *big[1] = {"team:big"};
  assert_int_equal(lg_budget_run_scopes_set(s, "run-2", big, 1, &err), 0);
  run = lg_run_new("run-2", NULL, p, NULL, NULL, &err);
  m.t_ms = 1;
  assert_int_equal(lg_budget_model(s, pr, run, &m, 60 * SEC, T0 + 200, &d, &g, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  int64_t reserved = get(s, "team:big", T0 + 200).reserved_micro;
  assert_int_equal(reserved, 3 * USD);
  m.t_ms = 2;
  assert_int_equal(lg_budget_model(s, pr, run, &m, 60 * SEC, T0 + 201, &d, &g, &err), 0);
  assert_int_equal(d.action, LG_ACT_STOP);
  assert_int_equal(d.reason, LG_R_MODEL_CALL_CAP);
  assert_string_equal(g.reservation_id, "");
  assert_int_equal(get(s, "team:big", T0 + 201).reserved_micro, reserved);
  /* A model with no price and no cost, for a run with scopes: refused,
   * naming it; nothing reserved. */
  lg_run_free(run);
  run = lg_run_new("run-2", NULL, NULL, NULL, NULL, &err);
  lg_model_call_t unk = m;
  unk.model = "mystery";
  assert_int_equal(lg_budget_model(s, pr, run, &unk, 0, T0 + 300, &d, &g, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "mystery"));
  assert_int_equal(get(s, "team:big", T0 + 300).reserved_micro, reserved);
  lg_run_free(run);
  lg_policy_free(p);

  /* Inside lg_store_with_run: the reservation joins the run's
   * transaction. */
  const char *one[1] = {"workspace:w"};
  assert_int_equal(lg_budget_run_scopes_set(s, "run-3", one, 1, &err), 0);
  run = lg_run_new("run-3", NULL, NULL, NULL, NULL, &err);
  assert_int_equal(lg_store_run_save(s, run, T0, &err), 0);
  lg_run_free(run);
  gate_ctx_t x = {.prices = pr, .m = m, .now = T0 + 400};
  int64_t r0 = get(s, "workspace:w", T0 + 400).reserved_micro;
  assert_int_equal(lg_store_with_run(s, "run-3", gate_locked, &x, &err), 0);
  assert_int_equal(x.rc, 0);
  assert_int_equal(x.d.action, LG_ACT_EXECUTE);
  assert_int_equal(get(s, "workspace:w", T0 + 400).reserved_micro, r0 + 3 * USD);
  assert_int_equal(x.c.model_calls, 1);
  /* The next one passes the in-flight cap of 5: nothing changes. */
  x.now = T0 + 401;
  assert_int_equal(lg_store_with_run(s, "run-3", gate_locked, &x, &err), 0);
  assert_int_equal(x.rc, LG_BUDGET_REFUSED);
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "run-3", &rec, &err), 0);
  run = lg_run_load(rec.state, rec.state_len, NULL, NULL, &err);
  lg_run_record_clear(&rec);
  assert_non_null(run);
  lg_counters_t c3;
  lg_run_counters(run, &c3);
  assert_int_equal(c3.model_calls, 1);
  lg_run_free(run);
  assert_int_equal(lg_budget_run_scopes_set(s, "run-3", NULL, 0, &err), 0);
  assert_int_equal(lg_budget_run_scopes(s, "run-3", &json, &err), 0);
  assert_string_equal(json, "[]");
  lg_free(json);
  lg_prices_free(pr);
}

/* ---- faults ---- */

static const char *fault_point;
static int fault_hook(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  (void)s;
  return fault_point && !strcmp(point, fault_point) ? LG_ESTORE : 0;
}

static void test_faults_roll_back(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 2 * USD, 0, T0);
  snapshot_t before = snap(s, T0 + 1);
  lg__store_set_fault(s, fault_hook, NULL);
  fault_point = "budget.reserve.before_commit";
  lg_budget_reservation_t x;
  lg_budget_refusal_t why;
  const char *sc[1] = {"key:a"};
  assert_int_equal(reserve(s, sc, 1, 1 * USD, 0, T0 + 1, &x, &why, &err), LG_ESTORE);
  UNCHANGED(s, before, T0 + 1);
  fault_point = "budget.settle.before_commit";
  assert_int_equal(lg_budget_settle(s, r.id, 1 * USD, T0 + 1, NULL, &err), LG_ESTORE);
  UNCHANGED(s, before, T0 + 1);
  fault_point = "budget.set.before_commit";
  assert_int_equal(lg_budget_set(s, "key:a", 1, LG_PERIOD_NONE, -1, T0 + 1, NULL, &err), LG_ESTORE);
  UNCHANGED(s, before, T0 + 1);
  lg__store_set_fault(s, NULL, NULL);
  fault_point = NULL;
  settle(s, r.id, 1 * USD, T0 + 2);
  assert_int_equal(get(s, "key:a", T0 + 3).spent_micro, 1 * USD);
}

/* ---- durable backends ---- */

static void test_restart(void **state) {
  lg_store_t *s = *state;
  set(s, "key:a", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 2 * USD, 60 * SEC, T0);
  lg_budget_reservation_t r2 = hold(s, "key:a", 1 * USD, 60 * SEC, T0);
  settle(s, r2.id, 500000, T0 + 1);
  lg_store_close(s);
  *state = s = lgt_open(lgt_url, NULL);
  lg_budget_t b = get(s, "key:a", T0 + 2);
  assert_int_equal(b.reserved_micro, 2 * USD);
  assert_int_equal(b.spent_micro, 500000);
  lg_error_t err = {0};
  assert_int_equal(lg_budget_settle(s, r2.id, 1, T0 + 3, NULL, &err), LG_ECONFLICT);
  settle(s, r.id, 2 * USD, T0 + 4);
  assert_int_equal(get(s, "key:a", T0 + 5).spent_micro, 2500000);
}

/* An agent settles a reservation with actual_usd 999999999 to lock a
 * shared budget for everyone: a bounded settlement charges at most the
 * reservation, says so, and keeps what was asked; an operator's settles
 * in full. */
static void test_settle_bounded(void **state) {
  lg_store_t *s = *state;
  set(s, "key:shared", 10 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:shared", 1 * USD, 0, T0);
  lg_budget_settlement_t st;
  lg_error_t err = {0};
  assert_int_equal(lg_budget_settle_bounded(s, r.id, 999999999 * USD, T0 + 1, &st, &err), 0);
  assert_int_equal(st.capped, 1);
  assert_true(st.actual_micro == 1 * USD);
  assert_true(st.asked_micro == 999999999 * USD);
  char *j = lg__budget_settlement_json(&st);
  assert_non_null(strstr(j, "\"capped\":true,\"asked_usd\":999999999"));
  lg_free(j);
  lg_budget_settlement_clear(&st);
  lg_budget_t b = get(s, "key:shared", T0 + 2);
  assert_true(b.spent_micro == 1 * USD); /* the budget still has room for others */
  /* The row keeps what was asked. */
  assert_int_equal(lg_budget_settle(s, r.id, 1, T0 + 2, NULL, &err), LG_ECONFLICT);
  assert_non_null(strstr(err.message, "bounded: 999999999 USD asked"));
  lg_budget_reservation_t r2 = hold(s, "key:shared", 2 * USD, 0, T0 + 3);
  /* Within the bound: charged as asked, not capped. */
  assert_int_equal(lg_budget_settle_bounded(s, r2.id, USD / 2, T0 + 4, &st, &err), 0);
  assert_int_equal(st.capped, 0);
  assert_true(st.actual_micro == USD / 2);
  lg_budget_settlement_clear(&st);
  /* An operator's settlement above the reservation is charged in full. */
  lg_budget_reservation_t r3 = hold(s, "key:shared", 1 * USD, 0, T0 + 5);
  assert_int_equal(lg_budget_settle(s, r3.id, 3 * USD, T0 + 6, &st, &err), 0);
  assert_int_equal(st.capped, 0);
  assert_true(st.actual_micro == 3 * USD);
  lg_budget_settlement_clear(&st);
  assert_true(get(s, "key:shared", T0 + 7).spent_micro == 1 * USD + USD / 2 + 3 * USD);
}

static void test_migration_from_v3(void **state) {
  lg_store_close(*state);
  *state = NULL;
  lgt_fresh_url(lgt_backend);
  /* A store as release 3 wrote it: ledger, runs, deny rules. */
  lg__store_schema_target = 3;
  lg_store_t *s = lgt_open(lgt_url, NULL);
  lg__store_schema_target = LG_STORE_SCHEMA_VERSION;
  int v = 0;
  assert_int_equal(lg_store_schema_version(s, &v, NULL), 0);
  assert_int_equal(v, 3);
  lg_claim_t c = {0};
  lg_error_t err = {0};
  assert_int_equal(lg_store_claim(s, "v3-key", FP1, NULL, 100, T0, &c, &err), 0);
  assert_int_equal(lg_store_commit(s, "v3-key", "\"from v3\"", 9, NULL, T0 + 1, &err), 0);
  lg_store_close(s);
  /* This release migrates it to the newest version and keeps what was there. */
  *state = s = lgt_open(lgt_url, NULL);
  assert_int_equal(lg_store_schema_version(s, &v, NULL), 0);
  assert_int_equal(v, LG_STORE_SCHEMA_VERSION);
  assert_int_equal(lg_store_claim(s, "v3-key", FP1, NULL, 100, T0 + 2, &c, &err), 0);
  assert_int_equal(c.outcome, LG_CLAIM_REPLAY);
  assert_string_equal(c.result, "\"from v3\"");
  lg_claim_clear(&c);
  set(s, "key:a", 1 * USD, LG_PERIOD_DAILY, -1, T0);
  lg_budget_reservation_t r = hold(s, "key:a", 1 * USD, 0, T0);
  settle(s, r.id, 1, T0 + 1);
  assert_int_equal(get(s, "key:a", T0 + 2).spent_micro, 1);
  /* And opening again is a no-op. */
  lg_store_close(s);
  *state = s = lgt_open(lgt_url, NULL);
  assert_int_equal(get(s, "key:a", T0 + 2).spent_micro, 1);
}

/* ------------------------------------------------------------------ */

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  T0 = utc(2025, 3, 14, 10, 0, 0);
  const struct CMUnitTest tests[] = {
      T(test_set_get_list),
      T(test_reserve_settle),
      T(test_settle_bounded),
      T(test_all_or_none),
      T(test_refusal_kinds),
      T(test_in_flight),
      T(test_ttl_expiry),
      T(test_clock_skew),
      T(test_settle_above_reservation),
      T(test_reset_keeps_reservations),
      T(test_bad_input),
      T(test_period_rollover_daily),
      T(test_period_rollover_weekly_monthly),
      T(test_purge),
      T(test_model_gate),
      T(test_faults_roll_back),
  };
  /* The durable backends only. */
  const struct CMUnitTest durable_tests[] = {
      T(test_restart),
      T(test_migration_from_v3),
  };
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char group[64];
    lgt_backend = names[i];
    snprintf(group, sizeof group, "budget store: %s", names[i]);
    failed += cmocka_run_group_tests_name(group, tests, NULL, NULL);
    if (durable()) {
      snprintf(group, sizeof group, "budget store (durable): %s", names[i]);
      failed += cmocka_run_group_tests_name(group, durable_tests, NULL, NULL);
    }
  }
  return failed ? 1 : 0;
}
