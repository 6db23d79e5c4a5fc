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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
      {"{\"name\":\"x\",\"colour\":1}", "colour"},
      {"{\"name\":\"x\",\"\":1}", "\"\""}, /* a member named "" is named so (fuzz_keys) */
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


/* ---- provider keys at rest (src/budget/seal.c) ---- */

static const unsigned char SECRET_A[32] = "0123456789abcdef0123456789abcdef";
static const unsigned char SECRET_B[32] = "fedcba9876543210fedcba9876543210";

static void test_seal_open(void **state) {
  (void)state;
  lg_error_t e = {0};
  unsigned char ka[32], kb[32];
  memcpy(ka, SECRET_A, 32);
  memcpy(kb, SECRET_B, 32);
  char *sealed = NULL, *plain = NULL;
  assert_int_equal(lg__byok_seal(ka, "id1", "openai", "sk-provider-1234", &sealed, &e), 0);
  assert_true(lg__byok_is_sealed(sealed));
  assert_null(strstr(sealed, "sk-provider"));
  assert_int_equal(lg__byok_open(ka, "id1", "openai", sealed, &plain, &e), 0);
  assert_string_equal(plain, "sk-provider-1234");
  lg_free(plain);
  /* Sealed twice: another nonce, another text. */
  char *again = NULL;
  assert_int_equal(lg__byok_seal(ka, "id1", "openai", "sk-provider-1234", &again, &e), 0);
  assert_string_not_equal(again, sealed);
  lg_free(again);
  /* Another secret, key, upstream: none opens, none gives bytes. */
  assert_int_equal(lg__byok_open(kb, "id1", "openai", sealed, &plain, &e), LG_EPERM);
  assert_null(plain);
  assert_int_equal(lg__byok_open(ka, "id2", "openai", sealed, &plain, &e), LG_EPERM);
  assert_int_equal(lg__byok_open(ka, "id1", "anthropic", sealed, &plain, &e), LG_EPERM);
  /* Not sealed at all, shorter than the prefix: refused, nothing read past
   * its end (ASan) */
  char *shorty = strdup("x");
  assert_int_equal(lg__byok_open(ka, "id1", "openai", shorty, &plain, &e), LG_EPERM);
  free(shorty);
  /* Every character of the ciphertext changed in turn: refused each time. */
  size_t pre = strlen(LG__BYOK_SEALED), n = strlen(sealed);
  for (size_t i = pre; i < n; i++) {
    char *t = strdup(sealed);
    if (t[i] == '=') {
      free(t);
      continue;
    }
    /* The top bit of the character's six: always a bit of the bytes (the
     * last character's low bits may be padding, which decodes the same). */
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *at = strchr(b64, t[i]);
    assert_non_null(at);
    t[i] = b64[(at - b64) ^ 0x20];
    memset(&e, 0, sizeof e);
    int rc = lg__byok_open(ka, "id1", "openai", t, &plain, &e);
    if (rc != LG_EPERM) fail_msg("a change at %zu of %s opened (%d): %s", i, t, rc, plain);
    assert_null(plain);
    free(t);
  }
  assert_int_equal(lg__byok_open(ka, "id1", "openai", "lgenc:v1:AAAA", &plain, &e), LG_EPERM);
  assert_int_equal(lg__byok_open(ka, "id1", "openai", "lgenc:v1:", &plain, &e), LG_EPERM);
  lg_free(sealed);
}

static char *tmp_file(const void *data, size_t n) {
  char *path = strdup("/tmp/lg_secret_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, data, n), (ssize_t)n);
  close(fd);
  return path;
}

static void test_secret_file(void **state) {
  (void)state;
  lg_error_t e = {0};
  unsigned char got[32];
  char *raw = tmp_file(SECRET_A, 32);
  assert_int_equal(lg_key_secret_load(raw, got, &e), 0);
  assert_memory_equal(got, SECRET_A, 32);
  const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
  char *hx = tmp_file(hex, strlen(hex));
  assert_int_equal(lg_key_secret_load(hx, got, &e), 0);
  assert_int_equal(got[1], 0x11);
  assert_int_equal(got[31], 0xff);
  char *bad = tmp_file("short\n", 6);
  assert_int_equal(lg_key_secret_load(bad, got, &e), LG_EINVAL);
  assert_string_equal(e.source, bad); /* the error names the file */
  assert_non_null(strstr(e.message, "32 random bytes or 64 hex digits"));
  memset(&e, 0, sizeof e);
  assert_int_equal(lg_key_secret_load("/nonexistent/secret", got, &e), LG_EIO);
  assert_string_equal(e.source, "/nonexistent/secret");
  unlink(raw), unlink(hx), unlink(bad);
  free(raw), free(hx), free(bad);
}

/* A key written with a secret: its row holds no clear copy, another
 * handle with the same secret opens it, another secret or none is a clear
 * error naming the key; a key written without a secret is "clear". */
static void test_byok_at_rest(void **state) {
  (void)state;
  char dir[] = "/tmp/lg_byok_XXXXXX", url[200], db[128];
  assert_non_null(mkdtemp(dir));
  snprintf(db, sizeof db, "%s/k.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", db);
  lg_error_t e = {0};
  lg_store_t *s = lg_store_open(url, NULL, &e);
  assert_non_null(s);
  lg_key_set_secret(s, SECRET_A);
  assert_true(lg_key_has_secret(s));
  char *out = NULL;
  const char *body = "{\"name\":\"own\",\"byok\":{\"openai\":\"sk-provider-XYZ-0001\"}}";
  json_t *k = MUST(lg_key_create(s, body, strlen(body), MON, &out, &e));
  assert_string_equal(json_string_value(json_object_get(k, "byok_at_rest")), "encrypted");
  char hash[80];
  snprintf(hash, sizeof hash, "%s", json_string_value(json_object_get(k, "hash")));
  json_decref(k);
  /* An update that leaves byok alone keeps it sealed; rotation too. */
  body = "{\"limit_usd\":3}";
  k = MUST(lg_key_update(s, hash, body, strlen(body), MON, &out, &e));
  assert_string_equal(json_string_value(json_object_get(k, "byok_at_rest")), "encrypted");
  json_decref(k);
  lg_store_close(s);

  /* The store's bytes (the file and its WAL) hold no clear copy. */
  const char *suffix[] = {"", "-wal"};
  for (int i = 0; i < 2; i++) {
    char f[160];
    snprintf(f, sizeof f, "%s%s", db, suffix[i]);
    FILE *fp = fopen(f, "rb");
    if (!fp) continue;
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    for (size_t j = 0; j + 12 <= n; j++)
      if (!memcmp(buf + j, "sk-provider-", 12)) fail_msg("%s holds the provider key in clear", f);
  }

  /* Another handle (a replica) with the same secret reads it back. */
  lg_store_t *r = lg_store_open(url, NULL, &e);
  lg_key_set_secret(r, SECRET_A);
  lg__key_row_t row;
  memset(&row, 0, sizeof row);
  k = MUST(lg_key_show(r, hash, MON, &out, &e));
  const char *id = json_string_value(json_object_get(k, "id"));
  char rid[80];
  snprintf(rid, sizeof rid, "%s", id);
  json_decref(k);
  int found = 0;
  assert_int_equal(lg__sql_key_read(r, rid, &row, &found, &e), 0);
  assert_true(found);
  assert_null(strstr(row.byok, "sk-provider"));
  char *pk = NULL;
  assert_int_equal(lg__key_byok(r, &row, "openai", &pk, &e), 0);
  assert_string_equal(pk, "sk-provider-XYZ-0001");
  lg_free(pk);
  assert_int_equal(lg__key_byok(r, &row, "anthropic", &pk, &e), 0); /* none for it */
  assert_null(pk);
  /* Another secret: refused, naming the key and the upstream. */
  lg_key_set_secret(r, SECRET_B);
  memset(&e, 0, sizeof e);
  assert_int_equal(lg__key_byok(r, &row, "openai", &pk, &e), LG_EPERM);
  assert_null(pk);
  assert_non_null(strstr(e.message, "\"own\""));
  assert_non_null(strstr(e.message, "\"openai\""));
  assert_non_null(strstr(e.message, "does not open"));
  /* No secret: refused too, saying so. */
  lg_key_set_secret(r, NULL);
  memset(&e, 0, sizeof e);
  assert_int_equal(lg__key_byok(r, &row, "openai", &pk, &e), LG_EPERM);
  assert_non_null(strstr(e.message, "no secret"));
  lg__key_row_clear(&row);
  /* Written without a secret: in clear, and the key says so. */
  body = "{\"name\":\"plain\",\"byok\":{\"openai\":\"sk-plain\"}}";
  k = MUST(lg_key_create(r, body, strlen(body), MON, &out, &e));
  assert_string_equal(json_string_value(json_object_get(k, "byok_at_rest")), "clear");
  json_decref(k);
  body = "{\"name\":\"none\"}";
  k = MUST(lg_key_create(r, body, strlen(body), MON, &out, &e));
  assert_true(json_is_null(json_object_get(k, "byok_at_rest")));
  json_decref(k);
  /* A provider key that looks sealed is refused at the door. */
  body = "{\"name\":\"x\",\"byok\":{\"openai\":\"lgenc:v1:AAAA\"}}";
  assert_int_equal(lg_key_create(r, body, strlen(body), MON, &out, &e), LG_EINVAL);
  assert_string_equal(e.field, "byok.openai");
  lg_store_close(r);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resets),
      cmocka_unit_test(test_rate_window),
      cmocka_unit_test(test_field_errors),
      cmocka_unit_test(test_seal_open),
      cmocka_unit_test(test_secret_file),
      cmocka_unit_test(test_byok_at_rest),
  };
  return cmocka_run_group_tests_name("keys", tests, NULL, NULL);
}
