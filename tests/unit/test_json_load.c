/*
 * test_json_load.c — lg__json_load (src/server/json_load.c) against
 * jansson's json_loadb, which it stands in for: whatever the fast reader
 * takes must be the tree json_loadb gives (the same text when dumped,
 * types, member order, a repeated key's last value), and what it does not
 * take goes to json_loadb, errors included. Cases written out, then a
 * few hundred thousand random mutations of them (a quarter under ASan:
 * sanitized.h); and the gateway
 * benchmark's bodies, which the fast reader must take (else it would be
 * no faster).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "lazy_check.h"
#include "sanitized.h"

static char *dump(const json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

static size_t count_reals(const json_t *v) {
  size_t n = json_is_real(v);
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) n += count_reals(json_array_get(v, i));
  const char *k;
  json_t *x;
  if (json_is_object(v)) json_object_foreach((json_t *)v, k, x) n += count_reals(x);
  return n;
}

/* 1 when the fast reader took s (and then it agrees with json_loadb),
 * with jansson's flags 0 or JSON_REJECT_DUPLICATES (the sidecar's). */
static int agree_flags(const char *s, size_t n, size_t flags) {
  size_t rf = 0, rl = 0;
  json_t *f = lg__json_load_fast(s, n, flags, &rf);
  json_error_t je, jl;
  json_t *j = json_loadb(s, n, flags, &je);
  if (f) {
    if (!j) fail_msg("taken, but jansson refuses it (%s): %.*s", je.text, (int)n, s);
    char *a = dump(f), *b = dump(j);
    if (strcmp(a, b) || !json_equal(f, j)) fail_msg("not the same tree for %.*s:\n%s\n%s", (int)n, s, a, b);
    free(a);
    free(b);
  }
  /* what the gateway and the sidecar call: json_loadb's answer either
   * way, its error too */
  json_t *l = flags ? lg__json_load_flags(s, n, flags, &jl, &rl) : lg__json_load(s, n, &jl, &rl);
  assert_int_equal(l != NULL, j != NULL);
  if (l && j) assert_true(json_equal(l, j));
  if (!l && !j) {
    assert_string_equal(jl.text, je.text);
    assert_int_equal(jl.position, je.position);
  }
  /* the reals read: never fewer than jansson's tree holds (more when a
   * repeated key replaced one) */
  if (f) assert_true(rf >= count_reals(j));
  if (l) assert_true(rl >= count_reals(j));
  /* the gateway's lazy read of a member (its conversation): the same */
  for (int k = 0; !flags && k < 2; k++) { /* and again with its own read as the prefix */
    lg__json_prefix_t *pre = NULL;
    const char *bad = lazy_disagrees_after(s, n, k ? "messages" : "a", j, NULL, &pre);
    if (!bad) bad = lazy_disagrees_after(s, n, k ? "messages" : "a", j, pre, NULL);
    lg__json_prefix_free(pre);
    if (bad) fail_msg("lazy \"%s\": %s: %.*s", k ? "messages" : "a", bad, (int)n, s);
  }
  json_decref(l);
  json_decref(f);
  json_decref(j);
  return f != NULL;
}

/* agree_flags with both flags (json_loadb's answer either way); 1 when
 * the fast reader took s without them. */
static int agree(const char *s, size_t n) {
  agree_flags(s, n, JSON_REJECT_DUPLICATES);
  return agree_flags(s, n, 0);
}

static const char *taken[] = {
    "{}",
    "[]",
    " \t\r\n{ \"a\" : 1 , \"b\":[true,false,null] }\n",
    "{\"n\":-0,\"i\":123456789012345678,\"m\":-123456789012345678,\"z\":0}",
    "{\"r\":0.7,\"e\":1e2,\"E\":-1.5E-3,\"p\":2e+10,\"t\":1e-400}",
    "{\"s\":\"caf\\u00e9 \\/ \\\" \\\\ \\b\\f\\n\\r\\t\",\"u\":\"\\ud83d\\ude00\",\"x\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
    "{\"k\\u0041y\":1,\"kAy\":2}",          /* a repeated key, one spelled with an escape */
    "{\"a\":1,\"b\":2,\"a\":3}",             /* the last value, in the first place */
    "[[[[[[[[[[\"deep\"]]]]]]]]]]",
    "{\"long key with escape \\u00e9 ........................................................"
    "...........................................................................\":true}",
    "[\"\",\"\\u0001\",\"\\uffff\",\"\xef\xbf\xbf\"]",
    /* the gateway's conversations, read lazily (lazy_check.h) */
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"tool\","
    "\"type\":7,\"content\":\"{\\\"a\\\":1}\"},null,[1,{\"role\":\"x\"}],\"s\",{}],\"a\":[{\"role\":1}]}",
    "{\"messages\":[{\"role\":\"tool\",\"ro\\u006ce\":\"user\"},{\"role\":\"a\\\"b\"},"
    "{\"role\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"type\":\"t\",\"type\":\"u\"}]}",
    "{\"messages\":[{\"role\":\"user\"}],\"messages\":\"now a string\"}",
    "{\"messages\":\"a string\",\"messages\":[{\"role\":\"assistant\",\"role\":null}]}",
    "{\"messages\":[],\"a\":[],\"b\":{\"messages\":[{\"role\":\"deeper\"}]}}",
};

/* What the fast reader must leave to jansson (which may take it or not). */
static const char *left[] = {
    "", " ", "1", "\"s\"", "null", "{", "[", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[01]",
    "[1.]", "[.5]", "[1e]", "[-]", "[+1]", "[1]x", "{} {}", "[\"\\u0000\"]", "[\"\\ud800\"]",
    "[\"\\udc00\"]", "[\"\\ud800\\u0041\"]", "[\"\\x\"]", "[\"\\u12\"]", "[\"a\tb\"]",
    "[\"\xc0\x80\"]", "[\"\xed\xa0\x80\"]", "[\"\xf4\x90\x80\x80\"]", "[\"\xe0\x80\x80\"]",
    "[\"\xf0\x80\x80\x80\"]", "[\"\xff\"]", "[\"\xc3\"]", "[1234567890123456789]",
    "[9223372036854775808]", "[1e400]", "[-1e400]", "[tru]", "[nul]", "{\"\\u0000\":1}",
    "[\"unterminated", "\xef\xbb\xbf{}",
};

static void cases(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof taken / sizeof *taken; i++)
    if (!agree(taken[i], strlen(taken[i]))) fail_msg("not taken: %s", taken[i]);
  for (size_t i = 0; i < sizeof left / sizeof *left; i++)
    if (agree(left[i], strlen(left[i]))) fail_msg("taken: %s", left[i]);
  /* JSON_REJECT_DUPLICATES: a repeated key, at any depth, however it is
   * spelled, is left to jansson, which refuses it in its own words; the
   * same texts are taken without the flag. */
  static const char *dups[] = {
      "{\"a\":1,\"a\":1}", "{\"k\\u0041y\":1,\"kAy\":2}", "[{\"x\":{\"y\":[1,{\"z\":0,\"z\":0}]}}]",
      "{\"a\":{},\"b\":[],\"a\":\"s\"}"};
  for (size_t i = 0; i < sizeof dups / sizeof *dups; i++) {
    if (agree_flags(dups[i], strlen(dups[i]), JSON_REJECT_DUPLICATES))
      fail_msg("taken with a repeated key: %s", dups[i]);
    if (!agree_flags(dups[i], strlen(dups[i]), 0)) fail_msg("not taken: %s", dups[i]);
    json_error_t je;
    json_t *v = lg__json_load_flags(dups[i], strlen(dups[i]), JSON_REJECT_DUPLICATES, &je, NULL);
    assert_null(v);
    assert_non_null(strstr(je.text, "duplicate"));
  }
  const char *nested = "{\"a\":1,\"b\":{\"a\":2}}"; /* the same key in two objects */
  assert_int_equal(agree_flags(nested, strlen(nested), JSON_REJECT_DUPLICATES), 1);
  /* a NUL byte inside the buffer */
  assert_int_equal(agree("[\"a\0b\"]", 7), 0);
  /* deeper than the fast reader goes: jansson's */
  char deep[2 * 300 + 1];
  memset(deep, '[', 300);
  memset(deep + 300, ']', 300);
  assert_int_equal(agree(deep, 600), 0);
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* A conversation read after the one before it: the elements of the first
 * are taken, not checked again, only when the text starts with its bytes;
 * the tree is jansson's either way, the reals counted too. */
static void prefix_reuse(void **state) {
  (void)state;
  const char *first = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                      "{\"role\":\"assistant\",\"x\":0.5}],\"stream\":false}";
  const char *next[] = {
      /* the conversation so far and one message more: two taken */
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
      "{\"role\":\"assistant\",\"x\":0.5},{\"role\":\"tool\",\"y\":1.5}],\"stream\":true}",
      /* the same */
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
      "{\"role\":\"assistant\",\"x\":0.5}],\"stream\":false}",
      /* an edit inside the prefix: none taken */
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"ho\"},"
      "{\"role\":\"assistant\",\"x\":0.5},{\"role\":\"tool\"}]}",
      /* the prefix, then garbage: refused as jansson refuses it */
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
      "{\"role\":\"assistant\",\"x\":0.5},{\"role\":\"tool\",}]}",
      /* the prefix cut short */
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
  };
  static const size_t taken_n[] = {2, 2, 0, 0, 0};
  lg__json_lazy_t lz;
  memset(&lz, 0, sizeof lz);
  json_t *v = lg__json_load_lazy(first, strlen(first), "messages", &lz, NULL, NULL);
  assert_non_null(lz.arr);
  assert_null(lg__json_prefix_of(&lz, strlen(first))); /* more than it may hold */
  lg__json_prefix_t *pre = lg__json_prefix_of(&lz, SIZE_MAX);
  assert_non_null(pre);
  assert_true(lg__json_prefix_size(pre) > strlen(first) - 20);
  assert_int_equal(pre->n, 2);
  assert_int_equal(pre->reals, 1);
  json_decref(v);
  lg__json_lazy_free(&lz);
  for (size_t i = 0; i < sizeof next / sizeof *next; i++) {
    json_t *j = json_loadb(next[i], strlen(next[i]), 0, NULL);
    const char *bad = lazy_disagrees_after(next[i], strlen(next[i]), "messages", j, pre, NULL);
    if (bad) fail_msg("%s: %s", bad, next[i]);
    memset(&lz, 0, sizeof lz);
    lz.prefix = pre;
    size_t r = 0;
    v = lg__json_load_lazy(next[i], strlen(next[i]), "messages", &lz, NULL, &r);
    assert_int_equal(lz.reused, taken_n[i]);
    if (v) assert_int_equal(r, count_reals(j));
    json_decref(v);
    json_decref(j);
    lg__json_lazy_free(&lz);
  }
  lg__json_prefix_free(pre);
}

static void reals(void **state) {
  (void)state;
  const char *t = "{\"a\":[0.7,1,-2e3,\"1.5\",{\"b\":1E-2}],\"c\":true}";
  size_t r = 99;
  json_t *v = lg__json_load(t, strlen(t), NULL, &r);
  assert_non_null(v);
  assert_int_equal(r, 3);
  json_decref(v);
  const char *bom = "\xef\xbb\xbf[0.5]"; /* left to jansson, which refuses it: no count */
  r = 99;
  assert_null(lg__json_load(bom, strlen(bom), NULL, &r));
  assert_int_equal(r, 99);
}

static void mutations(void **state) {
  (void)state;
  static const char alphabet[] = "{}[]\",:\\u0123456789abcdefABCDEF.eE+- \t\ntrufalsn\xc3\xa9\xed\xf0\x80\xbf";
  char buf[512];
  size_t took = 0;
  for (int round = 0; round < 300000 / LG_TEST_SLOW; round++) { /* 10 s; 40 s under ASan */
    const char *seed = taken[next() % (sizeof taken / sizeof *taken)];
    size_t n = strlen(seed);
    memcpy(buf, seed, n);
    int edits = 1 + (int)(next() % 3);
    for (int e = 0; e < edits && n < sizeof buf - 1; e++) {
      size_t at = n ? next() % n : 0;
      char ch = alphabet[next() % (sizeof alphabet - 1)];
      switch (next() % 3) {
      case 0: buf[at] = ch; break; /* replace */
      case 1:                      /* insert */
        memmove(buf + at + 1, buf + at, n - at);
        buf[at] = ch;
        n++;
        break;
      default: /* delete */
        if (n) {
          memmove(buf + at, buf + at + 1, n - at - 1);
          n--;
        }
      }
    }
    took += (size_t)agree(buf, n);
    /* an agent's next request: the seed read before, its prefix given */
    for (int k = 0; k < 2; k++) {
      const char *member = k ? "messages" : "a";
      lg__json_prefix_t *pre = NULL;
      json_t *js = json_loadb(seed, strlen(seed), 0, NULL), *jb = json_loadb(buf, n, 0, NULL);
      const char *bad = lazy_disagrees_after(seed, strlen(seed), member, js, NULL, &pre);
      if (!bad) bad = lazy_disagrees_after(buf, n, member, jb, pre, NULL);
      if (bad) fail_msg("lazy \"%s\" after %s: %s: %.*s", member, seed, bad, (int)n, buf);
      lg__json_prefix_free(pre);
      json_decref(js);
      json_decref(jb);
    }
  }
  assert_true(took > 1000); /* the mutations are not all refused */
}

static char *slurp_body(const char *size, const char *stream) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 '%s/bench/gateway/body.py' %s %s", getenv("LG_SOURCE_DIR"), size, stream);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  static char out[16384];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  assert_int_equal(pclose(p), 0);
  return out;
}

static void bench_bodies(void **state) {
  (void)state;
  if (!getenv("LG_SOURCE_DIR")) skip();
  const char *sizes[] = {"1024", "8192"};
  for (int i = 0; i < 2; i++)
    for (int st = 0; st < 2; st++) {
      const char *b = slurp_body(sizes[i], st ? "1" : "0");
      assert_true(agree(b, strlen(b)));
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cases),
      cmocka_unit_test(reals),
      cmocka_unit_test(prefix_reuse),
      cmocka_unit_test(mutations),
      cmocka_unit_test(bench_bodies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
