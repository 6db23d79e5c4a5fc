/*
 * test_json_quote.c — lg__buf_json_str (src/util/util.c), the one JSON
 * string writer of every trace line, answer and log line: against the
 * escaping rules written out plainly here, for every byte value, random
 * strings of every length up to 3,000 bytes (through the buffer's growth,
 * appended to what the buffer holds), and strings of escapes only (six
 * bytes out for one in). The bytes must not move: replay compares trace
 * lines byte for byte. And lg__buf_json, the writer of whole values
 * (lg__json_text), against json_dumps(JSON_COMPACT | JSON_ENCODE_ANY) on
 * the values where a writer can go wrong: reals of every form, the
 * integers' ends, UTF-8, empty containers, member order, a string that is
 * not UTF-8 (refused by both). And lg__buf_json_with (an object with some
 * members ours, the gateway's stream chunks) against json_dumps of a copy
 * of the object changed by json_object_set_new and json_object_del, as
 * its comment promises.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/internal.h"

/* The rules: \" \\ \b \f \n \r \t, \u00xx (lowercase) for the other
 * controls, every other byte as it is. */
static void reference(lg__buf_t *b, const unsigned char *s, size_t n) {
  lg__buf_putc(b, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    switch (c) {
    case '"': lg__buf_puts(b, "\\\""); break;
    case '\\': lg__buf_puts(b, "\\\\"); break;
    case '\b': lg__buf_puts(b, "\\b"); break;
    case '\f': lg__buf_puts(b, "\\f"); break;
    case '\n': lg__buf_puts(b, "\\n"); break;
    case '\r': lg__buf_puts(b, "\\r"); break;
    case '\t': lg__buf_puts(b, "\\t"); break;
    default:
      if (c < 0x20) lg__buf_printf(b, "\\u%04x", c);
      else lg__buf_putc(b, (char)c);
    }
  }
  lg__buf_putc(b, '"');
}

static void check(const unsigned char *s, size_t n, const char *prefix) {
  lg__buf_t got = {0}, want = {0};
  lg__buf_puts(&got, prefix);
  lg__buf_puts(&want, prefix);
  assert_int_equal(lg__buf_json_str(&got, (const char *)s, n), 0);
  reference(&want, s, n);
  assert_int_equal(got.len, want.len);
  assert_memory_equal(got.data, want.data, want.len);
  assert_int_equal(got.data[got.len], 0); /* NUL-terminated, as every buffer */
  lg__buf_free(&got);
  lg__buf_free(&want);
}

static void test_every_byte(void **state) {
  (void)state;
  unsigned char all[256];
  for (int i = 0; i < 256; i++) {
    all[i] = (unsigned char)i;
    check(all + i, 1, "");
  }
  check(all, 256, "");
  check(all, 0, "x");
}

static void test_random_strings(void **state) {
  (void)state;
  unsigned seed = 12345;
  unsigned char s[3000];
  for (size_t n = 0; n <= sizeof s; n += 1 + n / 16) {
    for (int round = 0; round < 4; round++) {
      for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = seed >> 16;
        /* mostly plain text, some quotes and controls, some UTF-8 bytes */
        s[i] = r % 10 == 0 ? (unsigned char)"\"\\\n\t\x01\x1f"[r / 10 % 6] : (unsigned char)(r % 10 == 1 ? 0x80 + r / 10 % 0x80 : 'a' + r / 10 % 26);
      }
      check(s, n, round & 1 ? "{\"k\":" : "");
    }
  }
}

static void test_escapes_only(void **state) {
  (void)state;
  unsigned char s[2000];
  memset(s, 0x01, sizeof s); /* six bytes out for each */
  for (size_t n = 0; n <= sizeof s; n += 37) check(s, n, "");
  memset(s, '"', sizeof s);
  check(s, sizeof s, "prefix");
}

static void same_as_dumps(json_t *v) {
  char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  assert_non_null(want);
  lg__buf_t got = {0};
  assert_int_equal(lg__buf_json(&got, v), 0);
  assert_string_equal(got.data, want);
  free(want);
  lg__buf_free(&got);
  json_decref(v);
}

static void test_values_as_jansson(void **state) {
  (void)state;
  const double reals[] = {0.1, 7.0, -7.0, 1e20, 1e21, 1e-5, 1.5e-7, -0.0, 123456789012345678.0,
                          1.5e300, 5e-324, 2.2250738585072014e-308, 0.30000000000000004, 100.0, 3.0e-10};
  for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) same_as_dumps(json_real(reals[i]));
  same_as_dumps(json_integer(INT64_MAX));
  same_as_dumps(json_integer(INT64_MIN));
  same_as_dumps(json_integer(0));
  same_as_dumps(json_string("h\u00e9llo \u65e5\u672c \U0001F600 \"q\" \\ \n\t/"));
  same_as_dumps(json_true());
  same_as_dumps(json_null());
  same_as_dumps(json_loads("{\"z\":1,\"a\":[],\"m\":{},\"k\":[1,2.5,{\"x\":[null,false,true]}],\"\u00e9\":\"v\"}", 0, NULL));
  same_as_dumps(json_loads("[[],[[]],{},{\"\":\"\"}]", 0, NULL));
  /* a control character: in capitals, as json_dumps (the trace's strings
   * are lowercase: lg__buf_json_str) */
  same_as_dumps(json_string("\x1f\x0b"));
  lg__buf_t b = {0};
  json_t *c = json_string("\x1f");
  assert_int_equal(lg__buf_json(&b, c), 0);
  assert_string_equal(b.data, "\"\\u001F\"");
  json_decref(c);
  lg__buf_free(&b);
  /* not UTF-8: refused, as json_dumps refuses it */
  json_t *bad = json_stringn_nocheck("\xff\xfe", 2);
  assert_null(json_dumps(bad, JSON_COMPACT | JSON_ENCODE_ANY));
  assert_int_equal(lg__buf_json(&b, bad), LG_EINVAL);
  json_decref(bad);
  lg__buf_free(&b);
}

/* lg__buf_json_with(o, keys, vals) against json_dumps of a shallow copy
 * of o with each key set to its value (json_object_set_new, in the order
 * of keys) or, for a NULL value, deleted. */
static void same_as_changed_copy(const char *obj, const char *const *keys, const char *const *vals, size_t n) {
  json_t *o = obj ? json_loads(obj, 0, NULL) : NULL;
  assert_true(!obj || o);
  json_t *cp = o ? json_copy(o) : json_object();
  for (size_t i = 0; i < n; i++)
    if (vals[i]) json_object_set_new(cp, keys[i], json_loads(vals[i], JSON_DECODE_ANY, NULL));
    else json_object_del(cp, keys[i]);
  char *want = json_dumps(cp, JSON_COMPACT);
  lg__buf_t got = {0};
  lg__buf_puts(&got, "data: ");
  assert_int_equal(lg__buf_json_with(&got, o, keys, vals, n), 0);
  assert_string_equal(got.data + 6, want);
  free(want);
  lg__buf_free(&got);
  json_decref(cp);
  json_decref(o);
}

static void test_object_with_members_of_ours(void **state) {
  (void)state;
  const char *chunk = "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0}],"
                      "\"model\":\"m\",\"usage\":{\"total_tokens\":3},\"x_\\u00e9\":[1.5,null]}";
  const char *const cu[2] = {"choices", "usage"};
  const char *const replaced[2] = {"[{\"index\":0,\"delta\":{}}]", NULL}; /* in place; usage out */
  same_as_changed_copy(chunk, cu, replaced, 2);
  const char *const both[2] = {"[]", "{\"prompt_tokens\":1}"};
  same_as_changed_copy(chunk, cu, both, 2);
  /* members the object lacks: after its own, in the order of keys */
  same_as_changed_copy("{\"id\":\"c1\",\"model\":\"m\"}", cu, both, 2);
  same_as_changed_copy("{\"id\":\"c1\"}", cu, replaced, 2);
  /* no object: only ours; nothing at all: {} */
  same_as_changed_copy(NULL, cu, both, 2);
  const char *const none[2] = {NULL, NULL};
  same_as_changed_copy(NULL, cu, none, 2);
  same_as_changed_copy("{\"usage\":1}", cu, none, 2);
  /* a call renumbered: index in its place, or last */
  const char *const ix[1] = {"index"}, *const two[1] = {"2"};
  same_as_changed_copy("{\"id\":\"a\",\"index\":7,\"function\":{\"name\":\"f\"}}", ix, two, 1);
  same_as_changed_copy("{\"id\":\"a\",\"type\":\"function\"}", ix, two, 1);
  /* no keys of ours: lg__buf_json itself */
  same_as_changed_copy(chunk, NULL, NULL, 0);
  /* a value of the object's that cannot be written fails the whole */
  json_t *bad = json_object();
  json_object_set_new(bad, "s", json_stringn_nocheck("\xff", 1));
  lg__buf_t b = {0};
  assert_int_equal(lg__buf_json_with(&b, bad, cu, both, 2), LG_EINVAL);
  const char *many[33] = {0};
  assert_int_equal(lg__buf_json_with(&b, NULL, many, many, 33), LG_EINVAL); /* over 32 keys */
  lg__buf_free(&b);
  json_decref(bad);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_byte),
      cmocka_unit_test(test_random_strings),
      cmocka_unit_test(test_escapes_only),
      cmocka_unit_test(test_values_as_jansson),
      cmocka_unit_test(test_object_with_members_of_ours),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
