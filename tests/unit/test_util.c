/*
 * test_util.c — the small things the library has once (src/util/): the
 * one USD conversion and its rounding rule at the boundaries, the one
 * USD formatter, the one hex encoder and the one source of random ids;
 * and that the front ends that read amounts (budgets, policies, traces)
 * all round the same way; that an error's message and field are what
 * snprintf would write, without printf for %s formats; and that a file's
 * refused setting is found by its path for the error's line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loopguard.h"
#include "util/internal.h"

/* units of 10^-decimals USD, or the error code. */
static int64_t units(double usd, int decimals, int *rc) {
  int64_t v = -12345;
  *rc = lg__usd_to_units(usd, decimals, &v);
  return v;
}

static void test_usd_to_micro_boundaries(void **state) {
  (void)state;
  int rc;
  assert_int_equal(units(0, LG__USD_MICRO, &rc), 0);
  assert_int_equal(rc, 0);
  assert_int_equal(units(-0.0, LG__USD_MICRO, &rc), 0);
  assert_int_equal(rc, 0);
  assert_int_equal(units(0.000001, LG__USD_MICRO, &rc), 1); /* 1 micro-USD */
  assert_int_equal(units(0.000002, LG__USD_MICRO, &rc), 2);
  /* Half a micro-dollar, as written: up, though its double is a little
   * less than 5e-7. */
  assert_int_equal(units(0.0000005, LG__USD_MICRO, &rc), 1);
  assert_int_equal(rc, 0);
  assert_int_equal(units(0.0000015, LG__USD_MICRO, &rc), 2);
  assert_int_equal(units(0.0000025, LG__USD_MICRO, &rc), 3); /* a half up, not to even */
  /* Halves whose product by 10^6 falls below the half (llround(x * 1e6)
   * gives 124, 244): the written decimal decides. */
  assert_int_equal(units(0.0001245, LG__USD_MICRO, &rc), 125);
  assert_int_equal(units(0.0002445, LG__USD_MICRO, &rc), 245);
  assert_int_equal(units(0.0004955, LG__USD_MICRO, &rc), 496);
  assert_int_equal(units(0.00000049, LG__USD_MICRO, &rc), 0);
  assert_int_equal(units(0.00000051, LG__USD_MICRO, &rc), 1);
  assert_int_equal(units(0.000000001, LG__USD_MICRO, &rc), 0);
  assert_int_equal(units(0.1 + 0.2, LG__USD_MICRO, &rc), 300000); /* 0.30000000000000004 */
  assert_int_equal(units(25, LG__USD_MICRO, &rc), 25000000);
  assert_int_equal(units(1.005, LG__USD_MICRO, &rc), 1005000);
  /* Huge: the budgets' largest amount, and past what int64_t holds. */
  assert_int_equal(units(1e9, LG__USD_MICRO, &rc), 1000000000000000LL);
  assert_int_equal(rc, 0);
  assert_int_equal(units(9.2e12, LG__USD_MICRO, &rc), 9200000000000000000LL);
  assert_int_equal(rc, 0);
  units(9.3e12, LG__USD_MICRO, &rc);
  assert_int_equal(rc, LG_ERANGE);
  units(1e300, LG__USD_MICRO, &rc);
  assert_int_equal(rc, LG_ERANGE);
  /* Refused: negative, not a number, infinite; *out untouched. */
  assert_int_equal(units(-0.000001, LG__USD_MICRO, &rc), -12345);
  assert_int_equal(rc, LG_EINVAL);
  units(-1e9, LG__USD_MICRO, &rc);
  assert_int_equal(rc, LG_EINVAL);
  units(NAN, LG__USD_MICRO, &rc);
  assert_int_equal(rc, LG_EINVAL);
  units(INFINITY, LG__USD_MICRO, &rc);
  assert_int_equal(rc, LG_EINVAL);
}

static void test_usd_to_nano_boundaries(void **state) {
  (void)state;
  int rc;
  assert_int_equal(units(0.000000001, LG__USD_NANO, &rc), 1);
  assert_int_equal(units(0.0000000005, LG__USD_NANO, &rc), 1);
  assert_int_equal(units(0.0000000075, LG__USD_NANO, &rc), 8); /* llround(x * 1e9): 7 */
  assert_int_equal(units(0.0000001235, LG__USD_NANO, &rc), 124);
  assert_int_equal(units(0.00000000049, LG__USD_NANO, &rc), 0);
  assert_int_equal(units(0.0000000015, LG__USD_NANO, &rc), 2);
  assert_int_equal(units(0.000042, LG__USD_NANO, &rc), 42000);
  assert_int_equal(units(123.456789012, LG__USD_NANO, &rc), 123456789012LL);
  assert_int_equal(units(9e9, LG__USD_NANO, &rc), 9000000000000000000LL); /* policies' cap */
  assert_int_equal(rc, 0);
  units(9.3e9, LG__USD_NANO, &rc);
  assert_int_equal(rc, LG_ERANGE);
  /* Every whole number of nano-dollars below 1e6 reads back as itself
   * after lg_usd_format (what a trace writes, replay reads). */
  for (int64_t n = 0; n < 1000000; n += 997) {
    char t[LG_USD_TEXT_MAX];
    lg_usd_format(n, t);
    assert_int_equal(units(strtod(t, NULL), LG__USD_NANO, &rc), n);
  }
}

/* The public conversion and every front end round the same way. */
static void test_front_ends_round_alike(void **state) {
  (void)state;
  int64_t micro = -1;
  lg_error_t err = {0};
  assert_int_equal(lg_budget_usd_to_micro(0.0000005, &micro, "limit_usd", &err), 0);
  assert_int_equal(micro, 1);
  assert_int_equal(lg_budget_usd_to_micro(-0.5, &micro, "limit_usd", &err), LG_EINVAL);
  assert_string_equal(err.field, "limit_usd");
  assert_non_null(strstr(err.message, "negative"));
  assert_int_equal(lg_budget_usd_to_micro(LG_BUDGET_MAX_USD * 2, &micro, "limit_usd", &err),
                   LG_ERANGE);
  /* A policy's max_cost_usd of half a nano-dollar is one. */
  const char *pj = "{\"limits\":{\"max_cost_usd\":0.0000000005}}";
  lg_policy_t *p = lg_policy_parse(pj, strlen(pj), "<test>", &err);
  assert_non_null(p);
  char *back = lg_policy_to_json(p);
  assert_non_null(strstr(back, "\"max_cost_usd\":0.000000001"));
  lg_free(back);
  lg_policy_free(p);
  const char *neg = "{\"limits\":{\"max_cost_usd\":-1}}";
  assert_null(lg_policy_parse(neg, strlen(neg), "<test>", &err));
  assert_int_equal(err.code, LG_EPOLICY);
  /* A price of half a micro-dollar per million tokens is one. */
  const char *prj = "{\"models\":{\"m\":{\"input_usd_per_mtok\":0.0000005,\"output_usd_per_mtok\":1}}}";
  lg_prices_t *pr = lg_prices_parse(prj, strlen(prj), "<test>", &err);
  assert_non_null(pr);
  lg_price_t price;
  assert_int_equal(lg_prices_lookup(pr, "m", &price, &err), 0);
  assert_int_equal(price.input_per_mtok, 1);
  assert_int_equal(price.output_per_mtok, 1000000);
  lg_prices_free(pr);
}

static void test_usd_format(void **state) {
  (void)state;
  char t[LG_USD_TEXT_MAX];
  assert_string_equal(lg_usd_format(0, t), "0");
  assert_string_equal(lg_usd_format(1, t), "0.000000001");
  assert_string_equal(lg_usd_format(1000, t), "0.000001");
  assert_string_equal(lg_usd_format(42000, t), "0.000042");
  assert_string_equal(lg_usd_format(25000000000LL, t), "25");
  assert_string_equal(lg_usd_format(1500000000LL, t), "1.5");
  assert_string_equal(lg_usd_format(-1500000000LL, t), "-1.5");
  assert_string_equal(lg_usd_format(INT64_MAX, t), "9223372036.854775807");
  assert_string_equal(lg_usd_format(INT64_MIN, t), "-9223372036.854775808");
}

/* An amount read, written and read again is the same nano-dollars: what a
 * policy prints reads back to a policy that prints the same (fuzz_policy
 * found 7696436.90071892547409925 moving by one when the shortest
 * decimal was looked for in 15 and 17 digits only). Up to 1e9 USD. */
static void test_usd_round_trip(void **state) {
  (void)state;
  const double seen[] = {7696436.90071892547409925, 9000000.0000000013, 0.1, 1e9, 123456.123456789};
  uint64_t r = 0x9E3779B97F4A7C15ULL;
  char t[LG_USD_TEXT_MAX];
  for (int i = 0; i < 200000; i++) {
    double usd;
    if (i < (int)(sizeof seen / sizeof *seen)) {
      usd = seen[i];
    } else { /* 1e-9 .. 1e9, every magnitude alike */
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      usd = pow(10.0, (double)(r % 18000) / 1000.0 - 9.0);
    }
    int64_t n = -1, n2 = -1;
    assert_int_equal(lg__usd_to_units(usd, 9, &n), 0);
    lg_usd_format(n, t);
    assert_int_equal(lg__usd_to_units(strtod(t, NULL), 9, &n2), 0);
    if (n2 != n) fail_msg("%.17g: %lld nano-dollars, written %s, read back as %lld", usd, (long long)n, t, (long long)n2);
  }
}

/* lg__buf_i64 writes what printf's %lld does, lg__buf_json_key ,"k": */
/* The line of the field an error names, in the text it came from. */
static long line_of(const char *json, const char *field) {
  lg_error_t e = {0};
  e.line = 99; /* a stale line is replaced */
  snprintf(e.field, sizeof e.field, "%s", field);
  lg__err_json_line(&e, json, strlen(json));
  return e.line;
}

static void test_err_json_line(void **state) {
  (void)state;
  static const char doc[] =
      "{\n"
      "  \"a\": {\"b\": 1,\n"
      "    \"c\": [10,\n"
      "      {\"d\": \"x\\\"y\"},\n"
      "      [1, 2]]},\n"
      "  \"gpt-4\": {\"in\": 1},\n"
      "  \"gpt-4.1\": {\n"
      "    \"in\": 2},\n"
      "  \"\\u00e9t\\u00e9\": {\"x\": \"s\\n,]}\"},\n"
      "  \"\\ud83d\\ude00\": 1,\n"
      "  \"r\": [\n"
      "    {\"up\": 1},\n"
      "    {\"up\":\n"
      "       2}]\n"
      "}\n";
  assert_int_equal(line_of(doc, "a"), 2);
  assert_int_equal(line_of(doc, "a.b"), 2);
  assert_int_equal(line_of(doc, "a.c"), 3);
  assert_int_equal(line_of(doc, "a.c.0"), 3);
  assert_int_equal(line_of(doc, "a.c.1"), 4);
  assert_int_equal(line_of(doc, "a.c.1.d"), 4);
  assert_int_equal(line_of(doc, "a.c.2.1"), 5);
  assert_int_equal(line_of(doc, "a.c[2][1]"), 5);
  /* A key with dots: the first key that fits the path and leads to the
   * rest of it. */
  assert_int_equal(line_of(doc, "gpt-4.in"), 6);
  assert_int_equal(line_of(doc, "gpt-4.1.in"), 8);
  assert_int_equal(line_of(doc, "gpt-4.1"), 7);
  /* Escaped keys are compared decoded; a string's ",]}" is not structure. */
  assert_int_equal(line_of(doc, "\xc3\xa9t\xc3\xa9.x"), 9);
  assert_int_equal(line_of(doc, "\xf0\x9f\x98\x80"), 10);
  assert_int_equal(line_of(doc, "r[1].up"), 13);
  assert_int_equal(line_of(doc, "r.1.up"), 13);
  assert_int_equal(line_of(doc, "r[0].up"), 12);
  /* Not there: no line rather than a wrong one. */
  assert_int_equal(line_of(doc, "a.z"), 0);
  assert_int_equal(line_of(doc, "a.c.3"), 0);
  assert_int_equal(line_of(doc, "a.b.c"), 0);
  assert_int_equal(line_of(doc, "r[x]"), 0);
  assert_int_equal(line_of(doc, "gpt"), 0);
  assert_int_equal(line_of(doc, ""), 0);
  /* Cut text ends the walk without reading past it. */
  for (size_t n = 0; n < sizeof doc - 1; n++) {
    lg_error_t e = {0};
    snprintf(e.field, sizeof e.field, "r[1].up");
    lg__err_json_line(&e, doc, n);
    if (e.line != 0 && e.line != 13) fail_msg("cut at %zu: line %ld", n, e.line);
  }
  lg__err_json_line(NULL, doc, sizeof doc - 1);
}

static void test_buf_numbers_and_keys(void **state) {
  (void)state;
  const int64_t v[] = {0, 1, -1, 9, 10, -10, 99, 100, 1234567890123LL, -987654321,
                       INT64_MAX, INT64_MIN, INT64_MIN + 1, (int64_t)UINT32_MAX};
  lg__buf_t b = {0};
  char want[64];
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    b.len = 0;
    assert_int_equal(lg__buf_i64(&b, v[i]), 0);
    snprintf(want, sizeof want, "%lld", (long long)v[i]);
    assert_string_equal(b.data, want);
  }
  b.len = 0;
  lg__buf_putc(&b, '{');
  lg__buf_json_key(&b, "t_ms");
  lg__buf_i64(&b, 42);
  lg__buf_json_kv(&b, "tool", "a\"b");
  lg__buf_json_kv(&b, "none", NULL);
  assert_string_equal(b.data, "{,\"t_ms\":42,\"tool\":\"a\\\"b\"");
  lg__buf_free(&b);
}

static void test_hex_and_random_ids(void **state) {
  (void)state;
  const unsigned char b[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xff};
  char h[13];
  lg__hex(b, sizeof b, h);
  assert_string_equal(h, "00017f80abff");
  lg__hex(b, 0, h);
  assert_string_equal(h, "");
  /* Every byte value, at lengths and offsets around the 16 bytes the
   * conversion takes at a time (the rest one by one), and back. */
  unsigned char all[259], back[260];
  char ah[2 * 259 + 1];
  for (int k = 0; k < 259; k++) all[k] = (unsigned char)(k * 7 + 3);
  for (size_t n = 0; n <= sizeof all; n += n < 40 ? 1 : 37) {
    for (size_t off = 0; off < 3 && off + n <= sizeof all; off++) {
      lg__hex(all + off, n, ah);
      assert_int_equal(strlen(ah), 2 * n);
      for (size_t k = 0; k < n; k++) {
        assert_int_equal(ah[2 * k], lg__hex_digits[all[off + k] >> 4]);
        assert_int_equal(ah[2 * k + 1], lg__hex_digits[all[off + k] & 15]);
      }
      memset(back, 0xAA, sizeof back);
      lg__unhex(ah, n, back);
      assert_memory_equal(back, all + off, n);
      assert_int_equal(back[n], 0xAA); /* nothing written past n bytes */
    }
  }
  /* The digits' values, and 0xFF for every other byte. */
  for (int ch = 0; ch < 256; ch++) {
    const char *at = ch ? strchr(lg__hex_digits, ch) : NULL;
    assert_int_equal(lg__hex_value[ch], at ? (int)(at - lg__hex_digits) : 0xFF);
  }
  char a[40], c[40];
  lg_error_t err = {0};
  assert_int_equal(lg__random_id("rsv_", 16, a, sizeof a, "a test id", &err), 0);
  assert_int_equal(lg__random_id("rsv_", 16, c, sizeof c, "a test id", &err), 0);
  assert_int_equal(strlen(a), 4 + 32);
  assert_memory_equal(a, "rsv_", 4);
  assert_int_equal(strspn(a + 4, "0123456789abcdef"), 32);
  assert_string_not_equal(a, c); /* 128 random bits twice: never the same */
  /* No room: refused, naming what it was for. */
  assert_int_equal(lg__random_id("rsv_", 16, a, 36, "a test id", &err), LG_EINVAL);
  assert_non_null(strstr(err.message, "a test id"));
}

/* snprintf's text, truncation and all (vsnprintf: no truncation warning,
 * which is what is tested). */
static void want_of(char *out, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out, cap, fmt, ap);
  va_end(ap);
}
static const char *or_empty(const char *s) { return s ? s : ""; }

/* lg__err against snprintf with the same format and arguments. */
#define SAME_AS_SNPRINTF(fld, ...)                                                            \
  do {                                                                                      \
    lg_error_t e_;                                                                          \
    char want_[sizeof e_.message];                                                          \
    memset(&e_, 'x', sizeof e_);                                                            \
    assert_int_equal(lg__err(&e_, LG_EINVAL, fld, 3, __VA_ARGS__), LG_EINVAL);           \
    want_of(want_, sizeof want_, __VA_ARGS__);                                              \
    assert_string_equal(e_.message, want_);                                                 \
    want_of(want_, sizeof e_.field, "%s", or_empty(fld));                                   \
    assert_string_equal(e_.field, want_);                                                   \
    assert_int_equal(e_.code, LG_EINVAL);                                                   \
    assert_int_equal(e_.offset, 3);                                                         \
  } while (0)

static void test_err_messages(void **state) {
  (void)state;
  char big[1000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  SAME_AS_SNPRINTF("call_id", "no executed call \"%s\" is waiting for a result", "call_1");
  SAME_AS_SNPRINTF(NULL, "no executed call is waiting for a result%s", "");
  SAME_AS_SNPRINTF("", "plain text, no directive");
  SAME_AS_SNPRINTF("f", "100%% sure: %s and %s", "one", "two");
  SAME_AS_SNPRINTF("f", "%s", big);                    /* truncated as snprintf truncates */
  SAME_AS_SNPRINTF(big, "%s%s%s", big + 500, "b", big); /* the field too */
  SAME_AS_SNPRINTF("f", "%d of %s", 7, "ten");          /* other directives: printf's */
  SAME_AS_SNPRINTF("f", "%.3s|%5s", "abcdef", "x");
  assert_int_equal(lg__err(NULL, LG_ENOMEM, NULL, -1, "%s", "no error to fill"), LG_ENOMEM);
}

/* What an answer to a client says of an error: its sentence without its
 * source (a store's URL), and without libpq's words (a host, a socket's
 * path), which the log keeps (lg_error_format). */
static void test_error_public(void **state) {
  (void)state;
  char buf[600], full[1100];
  lg_error_t e = {0};
  assert_string_equal(lg__error_public(NULL, LG_ESTORE, buf, sizeof buf), lg_strerror(LG_ESTORE));
  assert_string_equal(lg__error_public(&e, LG_EBUSY, buf, sizeof buf), lg_strerror(LG_EBUSY));
  lg__err(&e, LG_ESTORE, NULL, -1, "reading a run: disk I/O error");
  lg__err_where(&e, "sqlite:/srv/lg/secret-name.db", 0);
  assert_string_equal(lg__error_public(&e, LG_ESTORE, buf, sizeof buf), "reading a run: disk I/O error");
  assert_non_null(strstr(lg_error_format(&e, full, sizeof full), "secret-name.db"));
  memset(&e, 0, sizeof e);
  lg__err(&e, LG_ESTORE, NULL, -1,
          "reconnecting: the connection to PostgreSQL was lost" LG__ERR_DETAIL
          "connection to server at \"db.internal\" (10.0.0.5), port 5432 failed)");
  lg__err_where(&e, "postgres:host=db.internal dbname=lg user=lg", 0);
  const char *pub = lg__error_public(&e, LG_ESTORE, buf, sizeof buf);
  assert_string_equal(pub, "reconnecting: the connection to PostgreSQL was lost (the server's log has "
                           "the detail)");
  assert_ptr_equal(pub, buf);
  lg_error_format(&e, full, sizeof full);
  assert_non_null(strstr(full, "dbname=lg"));
  assert_non_null(strstr(full, "(libpq: connection to server at \"db.internal\""));
  /* the field it is about stays in front (docs/server.md "Errors") */
  memset(&e, 0, sizeof e);
  lg__err(&e, LG_EINVAL, "request_fingerprint", -1, "longer than 256 bytes");
  lg__err_where(&e, "sqlite:/srv/lg/secret-name.db", 3);
  assert_string_equal(lg__error_public(&e, LG_EINVAL, buf, sizeof buf),
                      "request_fingerprint: longer than 256 bytes");
  /* a buffer too small: cut, never overrun */
  memset(&e, 0, sizeof e);
  lg__err(&e, LG_ESTORE, NULL, -1, "reconnecting: lost" LG__ERR_DETAIL "x)");
  char small[12];
  assert_string_equal(lg__error_public(&e, LG_ESTORE, small, sizeof small), "reconnectin");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_err_messages),
      cmocka_unit_test(test_error_public),
      cmocka_unit_test(test_usd_to_micro_boundaries),
      cmocka_unit_test(test_usd_to_nano_boundaries),
      cmocka_unit_test(test_front_ends_round_alike),
      cmocka_unit_test(test_usd_format),
      cmocka_unit_test(test_usd_round_trip),
      cmocka_unit_test(test_hex_and_random_ids),
      cmocka_unit_test(test_buf_numbers_and_keys),
      cmocka_unit_test(test_err_json_line),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
