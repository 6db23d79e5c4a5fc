/*
 * test_canon.c — the canonicaliser and the call fingerprint (lg_canon_*).
 *
 * Organised from the outside in: first the cross-port vectors of
 * tests/data/vectors/openrouter-doom-loop-fingerprints.json, read at run
 * time and reproduced byte for byte; then the RFC 8785 / ECMAScript rules
 * one by one (numbers, strings, UTF-8, key order, duplicate keys,
 * white space, syntax errors with their byte offsets, nesting depth); last
 * the loop keys of a policy (field selection and normalizers).
 *
 * The vector file cannot be loaded with jansson — it holds the lone
 * surrogate escape "\ud800", which jansson rejects — so a small scanner
 * below walks it: string fields are decoded, and the raw text of each
 * "keyMaterial" value is handed to the canonicaliser as it stands.
 *
 * Every expected output below was checked against what ECMAScript's
 * JSON.stringify / Number::toString give for the same value, except the
 * one deliberate difference of docs/engine.md#fingerprints (exact digits in [2^53, 1e21)).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loopguard.h"

static lg_canon_t *C; /* shared by every test; created in main */

/* ------------------------------------------------------------------ */
/* Helpers.                                                            */

#define S(lit) lit, sizeof(lit) - 1 /* a literal and its length (NULs ok) */

/* Prints bytes readably for failure messages (static buffer). */
static const char *show(const char *s, size_t n) {
  static char buf[4][512];
  static int which;
  char *b = buf[which++ & 3];
  size_t w = 0;
  for (size_t i = 0; i < n && w + 8 < sizeof buf[0]; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= 0x20 && ch < 0x7f && ch != '\\')
      b[w++] = (char)ch;
    else
      w += (size_t)snprintf(b + w, sizeof buf[0] - w, "\\x%02x", ch);
  }
  b[w] = 0;
  return b;
}

/* Canonicalises `in`, expects exactly `want`, and checks that the
 * canonical form is a fixed point (canonicalising it again changes
 * nothing). */
static void canon_eq(const char *in, size_t inlen, const char *want, size_t wantlen,
                     int line) {
  const char *out = NULL;
  size_t olen = 0;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_canon_json(C, in, inlen, &out, &olen, &err);
  if (rc != 0)
    fail_msg("line %d: input [%s]: %s (%s at offset %ld)", line, show(in, inlen),
             lg_err_name(rc), err.message, err.offset);
  if (olen != wantlen || memcmp(out, want, wantlen) != 0)
    fail_msg("line %d: input [%s]\n  got  [%s]\n  want [%s]", line, show(in, inlen),
             show(out, olen), show(want, wantlen));
  char *copy = malloc(olen + 1);
  assert_non_null(copy);
  memcpy(copy, out, olen);
  rc = lg_canon_json(C, copy, olen, &out, &olen, &err);
  if (rc != 0 || olen != wantlen || memcmp(out, want, wantlen) != 0)
    fail_msg("line %d: canonical form [%s] is not a fixed point", line,
             show(want, wantlen));
  free(copy);
}
#define CANON_EQ(in, want) canon_eq(S(in), S(want), __LINE__)

/* Expects lg_canon_json to fail with `code` at byte `offset`. */
static void canon_err(const char *in, size_t inlen, int code, long offset, int line) {
  const char *out = NULL;
  size_t olen = 0;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -99;
  int rc = lg_canon_json(C, in, inlen, &out, &olen, &err);
  if (rc != code || err.code != code || err.offset != offset)
    fail_msg("line %d: input [%s]: got %s (err.code %s) at offset %ld (\"%s\"), want "
             "%s at offset %ld",
             line, show(in, inlen), lg_err_name(rc), lg_err_name(err.code), err.offset,
             err.message, lg_err_name(code), offset);
  if (!err.message[0]) fail_msg("line %d: error without a message", line);
}
#define CANON_ERR(in, code, off) canon_err(S(in), code, off, __LINE__)

/* SHA-256 hex of a + "\n" + b, computed with lg_canon_sha256_hex over
 * one buffer: the fingerprint construction written out independently. */
static void sha_tool_km(const char *tool, const char *km, size_t kml, char hex[LG_FP_HEX]) {
  size_t tl = strlen(tool);
  char *buf = malloc(tl + 1 + kml + 1);
  assert_non_null(buf);
  memcpy(buf, tool, tl);
  buf[tl] = '\n';
  memcpy(buf + tl + 1, km, kml);
  assert_int_equal(lg_canon_sha256_hex(C, buf, tl + 1 + kml, hex), 0);
  free(buf);
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  size_t r;
  while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) free(b);
      b = nb;
    }
  }
  fclose(f);
  if (b) b[n < cap ? n : cap - 1] = 0;
  *len = n;
  return b;
}

/* ------------------------------------------------------------------ */
/* A small scanner for the vector file.                                */

typedef struct scan {
  const char *s; /* the whole file */
  size_t n;      /* its length */
  size_t i;      /* read position */
} scan_t;

static void sc_ws(scan_t *x) {
  while (x->i < x->n && (x->s[x->i] == ' ' || x->s[x->i] == '\t' ||
                         x->s[x->i] == '\n' || x->s[x->i] == '\r'))
    x->i++;
}

static bool sc_char(scan_t *x, char ch) {
  sc_ws(x);
  if (x->i < x->n && x->s[x->i] == ch) {
    x->i++;
    return true;
  }
  return false;
}

static void put_cp(char *d, size_t *w, unsigned cp) {
  if (cp < 0x80) {
    d[(*w)++] = (char)cp;
  } else if (cp < 0x800) {
    d[(*w)++] = (char)(0xC0 | (cp >> 6));
    d[(*w)++] = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    d[(*w)++] = (char)(0xE0 | (cp >> 12));
    d[(*w)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[(*w)++] = (char)(0x80 | (cp & 0x3F));
  } else {
    d[(*w)++] = (char)(0xF0 | (cp >> 18));
    d[(*w)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[(*w)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[(*w)++] = (char)(0x80 | (cp & 0x3F));
  }
}

static bool hex4(const char *s, unsigned *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    char ch = s[k];
    unsigned h = ch >= '0' && ch <= '9'   ? (unsigned)(ch - '0')
                 : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a' + 10)
                 : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A' + 10)
                                          : 99u;
    if (h > 15) return false;
    *v = *v << 4 | h;
  }
  return true;
}

/* Decodes the JSON string at the read position into a new NUL-terminated
 * UTF-8 string (malloc), or NULL if it is malformed. */
static char *sc_string(scan_t *x) {
  sc_ws(x);
  if (x->i >= x->n || x->s[x->i] != '"') return NULL;
  x->i++;
  char *d = malloc(x->n - x->i + 1);
  size_t w = 0;
  while (d && x->i < x->n && x->s[x->i] != '"') {
    char ch = x->s[x->i++];
    if (ch != '\\') {
      d[w++] = ch;
      continue;
    }
    if (x->i >= x->n) break;
    char e = x->s[x->i++];
    unsigned cp;
    switch (e) {
    case '"': case '\\': case '/': d[w++] = e; continue;
    case 'b': d[w++] = '\b'; continue;
    case 'f': d[w++] = '\f'; continue;
    case 'n': d[w++] = '\n'; continue;
    case 'r': d[w++] = '\r'; continue;
    case 't': d[w++] = '\t'; continue;
    case 'u':
      if (x->n - x->i < 4 || !hex4(x->s + x->i, &cp)) goto bad;
      x->i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && x->n - x->i >= 6 && x->s[x->i] == '\\' &&
          x->s[x->i + 1] == 'u') {
        unsigned lo;
        if (hex4(x->s + x->i + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          x->i += 6;
        }
      }
      put_cp(d, &w, cp);
      continue;
    default: goto bad;
    }
  }
  if (!d || x->i >= x->n) goto bad;
  x->i++; /* the closing quote */
  d[w] = 0;
  return d;
bad:
  free(d);
  return NULL;
}

/* Skips one JSON value (it is not validated beyond its structure). */
static bool sc_skip(scan_t *x, int depth) {
  sc_ws(x);
  if (x->i >= x->n || depth > 200) return false;
  char ch = x->s[x->i];
  if (ch == '"') {
    char *s = sc_string(x);
    free(s);
    return s != NULL;
  }
  if (ch == '{' || ch == '[') {
    char close = ch == '{' ? '}' : ']';
    x->i++;
    if (sc_char(x, close)) return true;
    do {
      if (ch == '{') {
        char *k = sc_string(x);
        free(k);
        if (!k || !sc_char(x, ':')) return false;
      }
      if (!sc_skip(x, depth + 1)) return false;
    } while (sc_char(x, ','));
    return sc_char(x, close);
  }
  size_t start = x->i;
  while (x->i < x->n && (strchr("+-.eE", x->s[x->i]) || (x->s[x->i] >= '0' && x->s[x->i] <= '9') ||
                         (x->s[x->i] >= 'a' && x->s[x->i] <= 'z')))
    x->i++;
  return x->i > start;
}

typedef struct vec {
  char *name;       /* decoded "name" */
  char *tool;       /* decoded "toolName", NULL for key-material vectors */
  char *jcs;        /* decoded "jcs": the expected canonical bytes */
  char *fp;         /* decoded "fingerprint" */
  const char *km;   /* raw text of "keyMaterial" in the file */
  size_t km_len;
} vec_t;

static void free_vecs(vec_t *v, int n) {
  for (int i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].tool);
    free(v[i].jcs);
    free(v[i].fp);
  }
}

/* Reads the array `which` of the top-level object into v[0..max). */
static int read_vectors(const char *file, size_t len, const char *which, vec_t *v, int max) {
  scan_t x = {file, len, 0};
  int n = 0;
  if (!sc_char(&x, '{')) fail_msg("vector file: not an object");
  do {
    char *key = sc_string(&x);
    if (!key || !sc_char(&x, ':')) fail_msg("vector file: bad member near byte %zu", x.i);
    if (strcmp(key, which) != 0) {
      free(key);
      if (!sc_skip(&x, 0)) fail_msg("vector file: bad value near byte %zu", x.i);
      continue;
    }
    free(key);
    if (!sc_char(&x, '[')) fail_msg("vector file: %s is not an array", which);
    if (sc_char(&x, ']')) break;
    do {
      if (n == max) fail_msg("vector file: more than %d vectors in %s", max, which);
      vec_t *e = &v[n++];
      memset(e, 0, sizeof *e);
      if (!sc_char(&x, '{')) fail_msg("vector file: vector %d is not an object", n);
      do {
        char *k = sc_string(&x);
        if (!k || !sc_char(&x, ':')) fail_msg("vector file: bad member near byte %zu", x.i);
        char **slot = !strcmp(k, "name")          ? &e->name
                      : !strcmp(k, "toolName")    ? &e->tool
                      : !strcmp(k, "jcs")         ? &e->jcs
                      : !strcmp(k, "fingerprint") ? &e->fp
                                                  : NULL;
        if (slot) {
          if (*slot) fail_msg("vector file: %s twice in vector %d", k, n);
          if (!(*slot = sc_string(&x))) fail_msg("vector file: bad %s in vector %d", k, n);
        } else if (!strcmp(k, "keyMaterial")) {
          sc_ws(&x);
          size_t start = x.i;
          if (!sc_skip(&x, 0)) fail_msg("vector file: bad keyMaterial in vector %d", n);
          e->km = file + start;
          e->km_len = x.i - start;
        } else if (!sc_skip(&x, 0)) {
          fail_msg("vector file: bad %s in vector %d", k, n);
        }
        free(k);
      } while (sc_char(&x, ','));
      if (!sc_char(&x, '}')) fail_msg("vector file: vector %d not closed", n);
    } while (sc_char(&x, ','));
    if (!sc_char(&x, ']')) fail_msg("vector file: %s not closed", which);
  } while (sc_char(&x, ','));
  return n;
}

static size_t count_occurrences(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* ------------------------------------------------------------------ */
/* The cross-port vectors.                                             */

static void test_vectors(void **state) {
  (void)state;
  const char *dir = getenv("LG_TEST_DATA");
  if (!dir) fail_msg("LG_TEST_DATA is not set");
  char path[1024];
  snprintf(path, sizeof path, "%s/vectors/openrouter-doom-loop-fingerprints.json", dir);
  size_t len = 0;
  char *file = read_file(path, &len);
  if (!file) fail_msg("cannot read %s", path);

  vec_t tv[256], kv[256];
  int nt = read_vectors(file, len, "toolCallVectors", tv, 256);
  int nk = read_vectors(file, len, "keyMaterialVectors", kv, 256);
  assert_true(nt > 0);
  assert_true(nk > 0);
  /* The scanner found every vector there is. */
  assert_int_equal((size_t)(nt + nk), count_occurrences(file, "\"keyMaterial\":"));

  for (int i = 0; i < nt; i++) {
    vec_t *v = &tv[i];
    if (!v->name || !v->tool || !v->jcs || !v->fp || !v->km)
      fail_msg("tool-call vector %d lacks a field", i);
    char hex[LG_FP_HEX], hex2[LG_FP_HEX];
    const char *km = NULL;
    size_t kml = 0;
    lg_error_t err;
    memset(&err, 0, sizeof err);
    int rc = lg_canon_fingerprint(C, NULL, v->tool, v->km, v->km_len, hex, &km, &kml, &err);
    if (rc) fail_msg("vector \"%s\": %s: %s", v->name, lg_err_name(rc), err.message);
    if (kml != strlen(v->jcs) || memcmp(km, v->jcs, kml) != 0)
      fail_msg("vector \"%s\": key material\n  got  [%s]\n  want [%s]", v->name,
               show(km, kml), show(v->jcs, strlen(v->jcs)));
    if (strcmp(hex, v->fp) != 0)
      fail_msg("vector \"%s\": fingerprint %s, want %s", v->name, hex, v->fp);
    /* The construction, written out: sha256(tool + "\n" + jcs). */
    sha_tool_km(v->tool, v->jcs, strlen(v->jcs), hex2);
    assert_string_equal(hex2, v->fp);
    /* lg_canon_json gives the same canonical bytes. */
    const char *out;
    size_t olen;
    assert_int_equal(lg_canon_json(C, v->km, v->km_len, &out, &olen, NULL), 0);
    assert_int_equal(olen, strlen(v->jcs));
    assert_memory_equal(out, v->jcs, olen);
  }
  for (int i = 0; i < nk; i++) {
    vec_t *v = &kv[i];
    if (!v->name || !v->jcs || !v->fp || !v->km)
      fail_msg("key-material vector %d lacks a field", i);
    const char *out;
    size_t olen;
    lg_error_t err;
    memset(&err, 0, sizeof err);
    int rc = lg_canon_json(C, v->km, v->km_len, &out, &olen, &err);
    if (rc) fail_msg("vector \"%s\": %s: %s", v->name, lg_err_name(rc), err.message);
    if (olen != strlen(v->jcs) || memcmp(out, v->jcs, olen) != 0)
      fail_msg("vector \"%s\": got [%s] want [%s]", v->name, show(out, olen), v->jcs);
    char *copy = malloc(olen + 1);
    assert_non_null(copy);
    memcpy(copy, out, olen);
    char hex[LG_FP_HEX];
    assert_int_equal(lg_canon_sha256_hex(C, copy, olen, hex), 0);
    free(copy);
    if (strcmp(hex, v->fp) != 0)
      fail_msg("vector \"%s\": sha256 %s, want %s", v->name, hex, v->fp);
  }
  free_vecs(tv, nt);
  free_vecs(kv, nk);
  free(file);
}

/* ------------------------------------------------------------------ */
/* Numbers: ECMAScript Number::toString, exact digits in [2^53, 1e21).  */

static void test_numbers(void **state) {
  (void)state;
  /* One value, many spellings. */
  CANON_EQ("1", "1");
  CANON_EQ("1.0", "1");
  CANON_EQ("1e0", "1");
  CANON_EQ("1E0", "1");
  CANON_EQ("10e-1", "1");
  CANON_EQ("0.1e1", "1");
  CANON_EQ("1.000000000000000000000000000000000000000000000000000000000000000000000", "1");
  CANON_EQ("[1,1.0,1e0,100e-2]", "[1,1,1,1]");
  /* Zero, whatever its sign or form. */
  CANON_EQ("0", "0");
  CANON_EQ("-0", "0");
  CANON_EQ("-0.0", "0");
  CANON_EQ("0e10", "0");
  CANON_EQ("-0E-5", "0");
  CANON_EQ("0.000", "0");
  /* Plain decimals and the switch to exponent form. */
  CANON_EQ("0.1", "0.1");
  CANON_EQ("-1.5", "-1.5");
  CANON_EQ("100", "100");
  CANON_EQ("1e2", "100");
  CANON_EQ("1E+2", "100");
  CANON_EQ("4.50", "4.5");
  CANON_EQ("2e-3", "0.002");
  CANON_EQ("0.000001", "0.000001");
  CANON_EQ("1e-6", "0.000001");
  CANON_EQ("1e-7", "1e-7");
  CANON_EQ("0.0000001", "1e-7");
  CANON_EQ("1.5e-7", "1.5e-7");
  CANON_EQ("123e-20", "1.23e-18");
  CANON_EQ("0.000000000000000000000000001", "1e-27");
  CANON_EQ("1e21", "1e+21");
  CANON_EQ("1000000000000000000000", "1e+21");
  CANON_EQ("1E30", "1e+30");
  CANON_EQ("1.5e300", "1.5e+300");
  CANON_EQ("-1.5E+300", "-1.5e+300");
  /* The extremes of a double. */
  CANON_EQ("5e-324", "5e-324");
  CANON_EQ("4.9406564584124654e-324", "5e-324");
  CANON_EQ("1.7976931348623157e308", "1.7976931348623157e+308");
  CANON_EQ("2.2250738585072014e-308", "2.2250738585072014e-308");
  CANON_EQ("1e-400", "0"); /* underflows to zero, as Number("1e-400") */
  /* More than 15 significant digits: rounded to the nearest double, then
   * its shortest round-trip digits. */
  CANON_EQ("0.30000000000000004", "0.30000000000000004");
  CANON_EQ("3.141592653589793238", "3.141592653589793");
  CANON_EQ("333333333.33333329", "333333333.3333333");
  CANON_EQ("0.1000000000000000055511151231257827", "0.1");
  CANON_EQ("123456789.123456789123", "123456789.12345679");
  /* Just above a power of two the shortest digits are not the correctly
   * rounded ones: 2^-1017 and 2^-1000 (ECMAScript gives these). */
  CANON_EQ("7.1202363472230444e-307", "7.120236347223045e-307");
  CANON_EQ("9.3326361850321887899e-302", "9.332636185032189e-302");
  /* Integers: below 2^53 they are exact anyway. */
  CANON_EQ("9007199254740991", "9007199254740991");
  CANON_EQ("-9007199254740991", "-9007199254740991");
  CANON_EQ("9007199254740992", "9007199254740992"); /* exactly 2^53 */
  /* From 2^53 to 1e21 every digit is kept (docs/engine.md#fingerprints); JCS would give
   * 9007199254740992, 12345678901234567000, -98765432109876540000. */
  CANON_EQ("9007199254740993", "9007199254740993");
  CANON_EQ("12345678901234567890", "12345678901234567890");
  CANON_EQ("-98765432109876543210", "-98765432109876543210");
  CANON_EQ("999999999999999999999", "999999999999999999999");
  CANON_EQ("9.007199254740993e15", "9007199254740993");
  CANON_EQ("12345678901234567890e0", "12345678901234567890");
  CANON_EQ("1234567890123456789.0", "1234567890123456789");
  CANON_EQ("9007199254740993.5", "9007199254740993.5");
  CANON_EQ("1e20", "100000000000000000000");
  CANON_EQ("1e16", "10000000000000000");
  CANON_EQ("[9007199254740993,9007199254740992]", "[9007199254740993,9007199254740992]");
  /* Two customer ids stay two. */
  {
    const char *a, *b;
    size_t al, bl;
    char ha[LG_FP_HEX], hb[LG_FP_HEX];
    assert_int_equal(lg_canon_fingerprint(C, NULL, "t", S("{\"id\":9007199254740993}"), ha, &a,
                                          &al, NULL),
                     0);
    assert_int_equal(lg_canon_fingerprint(C, NULL, "t", S("{\"id\":9007199254740992}"), hb, &b,
                                          &bl, NULL),
                     0);
    assert_string_not_equal(ha, hb);
  }
  /* Out of range. */
  CANON_ERR("1e400", LG_ERANGE, 0);
  CANON_ERR("-1e400", LG_ERANGE, 0);
  CANON_ERR("1.7976931348623159e308", LG_ERANGE, 0);
  CANON_ERR("[1,2e999]", LG_ERANGE, 3);
  CANON_ERR("{\"a\":1E400}", LG_ERANGE, 5);
  /* Grammar. */
  CANON_ERR("01", LG_EPARSE, 1);
  CANON_ERR("-01", LG_EPARSE, 2);
  CANON_ERR("[00]", LG_EPARSE, 2);
  CANON_ERR("-", LG_EPARSE, 1);
  CANON_ERR("1.", LG_EPARSE, 2);
  CANON_ERR("1.e5", LG_EPARSE, 2);
  CANON_ERR(".5", LG_EPARSE, 0);
  CANON_ERR("+1", LG_EPARSE, 0);
  CANON_ERR("1e", LG_EPARSE, 2);
  CANON_ERR("1e+", LG_EPARSE, 3);
  CANON_ERR("0x10", LG_EPARSE, 1);
  CANON_ERR("NaN", LG_EPARSE, 0);
  CANON_ERR("-Infinity", LG_EPARSE, 1);
}

/* Exponents too large to track must not wrap into a plausible value:
 * 1 followed by a million zeros, times 10^-10000000, is 0; a million zeros
 * after the point, times 10^10000000, is out of range. */
static void test_numbers_huge_literals(void **state) {
  (void)state;
  size_t cap = 1000000 + 64, n = 0;
  char *b = malloc(cap);
  assert_non_null(b);
  b[n++] = '1';
  memset(b + n, '0', 1000000);
  n += 1000000;
  n += (size_t)snprintf(b + n, cap - n, "e-10000000");
  canon_eq(b, n, S("0"), __LINE__);
  n = 0;
  b[n++] = '0';
  b[n++] = '.';
  memset(b + n, '0', 999999);
  n += 999999;
  b[n++] = '1';
  n += (size_t)snprintf(b + n, cap - n, "e10000000");
  canon_err(b, n, LG_ERANGE, 0, __LINE__);
  /* A thousand significant digits still round to the nearest double. */
  n = 0;
  b[n++] = '0';
  b[n++] = '.';
  for (int i = 0; i < 1000; i++) b[n++] = '3';
  canon_eq(b, n, S("0.3333333333333333"), __LINE__);
  /* An exponent with many leading zeros is an ordinary exponent. */
  CANON_EQ("1e0000000000000000000000000000000000000002", "100");
  CANON_ERR("1e9999999999999999999999999999", LG_ERANGE, 0);
  CANON_EQ("1e-9999999999999999999999999999", "0");
  free(b);
}

/* A number can come out longer than it went in; the room reserved for the
 * rest of the input must survive that (this overflowed the output buffer
 * once: run it under ASan). */
static void test_numbers_expand(void **state) {
  (void)state;
  /* A fresh canonicaliser for each size: the shared one has grown its
   * buffers on earlier tests and would hide the boundary. */
  lg_canon_t *shared = C;
  for (size_t fill = 900; fill < 4200; fill += 37) {
    C = lg_canon_new();
    assert_non_null(C);
    char *in = malloc(fill + 512), *want = malloc(fill + 1024);
    assert_non_null(in);
    assert_non_null(want);
    size_t n = 0, w = 0;
    in[n++] = '[';
    want[w++] = '[';
    for (int i = 0; i < 24; i++) {
      n += (size_t)sprintf(in + n, "1e20,");
      w += (size_t)sprintf(want + w, "100000000000000000000,");
    }
    in[n++] = '"';
    want[w++] = '"';
    while (n < fill) {
      in[n++] = 'a';
      want[w++] = 'a';
    }
    in[n++] = '"';
    in[n++] = ']';
    want[w++] = '"';
    want[w++] = ']';
    canon_eq(in, n, want, w, __LINE__);
    free(in);
    free(want);
    lg_canon_free(C);
  }
  C = shared;
}

/* ------------------------------------------------------------------ */
/* Strings.                                                            */

static void test_strings(void **state) {
  (void)state;
  CANON_EQ("\"\"", "\"\"");
  CANON_EQ("\"plain text\"", "\"plain text\"");
  /* Control characters: \b \f \n \r \t by name, the rest as \u00xx. */
  CANON_EQ("\"\\u0000\\u0001\\u0007\\u000B\\u000e\\u001F\"",
           "\"\\u0000\\u0001\\u0007\\u000b\\u000e\\u001f\"");
  CANON_EQ("\"\\u0008\\u000C\\u000a\\u000D\\u0009\"", "\"\\b\\f\\n\\r\\t\"");
  CANON_EQ("\"\\b\\f\\n\\r\\t\"", "\"\\b\\f\\n\\r\\t\"");
  /* Quote and backslash stay escaped; the solidus does not. */
  CANON_EQ("\"\\\"\\\\\"", "\"\\\"\\\\\"");
  CANON_EQ("\"\\u0022\\u005C\"", "\"\\\"\\\\\"");
  CANON_EQ("\"a\\/b\"", "\"a/b\"");
  CANON_EQ("\"\\u002f\"", "\"/\"");
  /* Everything else is raw UTF-8, escaped or not in the input. */
  CANON_EQ("\"\\u0041\"", "\"A\"");
  CANON_EQ("\"\\u00e9\"", "\"\xc3\xa9\"");
  CANON_EQ("\"\\u00E9\"", "\"\xc3\xa9\"");
  CANON_EQ("\"\\u20ac\"", "\"\xe2\x82\xac\"");
  CANON_EQ("\"\\u2028\\u2029\"", "\"\xe2\x80\xa8\xe2\x80\xa9\"");
  CANON_EQ("\"\\uffff\"", "\"\xef\xbf\xbf\"");
  CANON_EQ("\"caf\xc3\xa9 \xf0\x9f\x8e\x89\"", "\"caf\xc3\xa9 \xf0\x9f\x8e\x89\"");
  CANON_EQ("\"\xf4\x8f\xbf\xbf\"", "\"\xf4\x8f\xbf\xbf\""); /* U+10FFFF */
  /* DEL is not a control character for JSON. */
  CANON_EQ("\"\x7f\"", "\"\x7f\"");
  CANON_EQ("\"\\u007f\"", "\"\x7f\"");
  /* Surrogate pairs become one 4-byte character. */
  CANON_EQ("\"\\ud83d\\ude00\"", "\"\xf0\x9f\x98\x80\"");
  CANON_EQ("\"\\uD83D\\uDE00\"", "\"\xf0\x9f\x98\x80\"");
  CANON_EQ("\"\\ud800\\udc00\"", "\"\xf0\x90\x80\x80\"");
  CANON_EQ("\"\\udbff\\udfff\"", "\"\xf4\x8f\xbf\xbf\"");
  /* Lone surrogates stay escaped, in lower case (JSON.stringify). */
  CANON_EQ("\"\\ud800\"", "\"\\ud800\"");
  CANON_EQ("\"\\uD800\"", "\"\\ud800\"");
  CANON_EQ("\"\\uDFFF\"", "\"\\udfff\"");
  CANON_EQ("\"\\udc00\\ud800\"", "\"\\udc00\\ud800\"");
  CANON_EQ("\"\\ud800\\ud800\"", "\"\\ud800\\ud800\"");
  CANON_EQ("\"\\ud800\\u0041\"", "\"\\ud800A\"");
  CANON_EQ("\"\\ud83dx\\ude00\"", "\"\\ud83dx\\ude00\"");
  CANON_EQ("\"\\ud83d\\n\"", "\"\\ud83d\\n\"");
  CANON_EQ("\"x\\ud83d\"", "\"x\\ud83d\"");
  /* RFC 8785 §3.2.2.2. */
  CANON_EQ("\"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\"",
           "\"\xe2\x82\xac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"");
  /* A long string with an escape near the end. */
  {
    size_t n = 70000;
    char *in = malloc(n + 16), *want = malloc(n + 16);
    assert_non_null(in);
    assert_non_null(want);
    in[0] = want[0] = '"';
    memset(in + 1, 'x', n);
    memset(want + 1, 'x', n);
    memcpy(in + 1 + n, "\\u00e9\"", 7);
    memcpy(want + 1 + n, "\xc3\xa9\"", 3);
    canon_eq(in, n + 8, want, n + 4, __LINE__);
    free(in);
    free(want);
  }
}

static void test_string_errors(void **state) {
  (void)state;
  /* Raw control characters are not allowed, NUL included. */
  CANON_ERR("\"a\x01\"", LG_EPARSE, 2);
  CANON_ERR("\"a\tb\"", LG_EPARSE, 2);
  CANON_ERR("\"a\nb\"", LG_EPARSE, 2);
  CANON_ERR("\"a\0b\"", LG_EPARSE, 2);
  /* Escapes. */
  CANON_ERR("\"\\x\"", LG_EPARSE, 1);
  CANON_ERR("\"ab\\'\"", LG_EPARSE, 3);
  CANON_ERR("\"\\U0041\"", LG_EPARSE, 1);
  CANON_ERR("\"\\u12G4\"", LG_EPARSE, 3);
  CANON_ERR("\"\\u12\"", LG_EPARSE, 3);
  CANON_ERR("\"\\u", LG_EPARSE, 3);
  CANON_ERR("\"\\ud800\\u12\"", LG_EPARSE, 9);
  CANON_ERR("\"\\ud800\\uzzzz\"", LG_EPARSE, 9);
  /* Unterminated. */
  CANON_ERR("\"abc", LG_EPARSE, 4);
  CANON_ERR("\"", LG_EPARSE, 1);
  CANON_ERR("\"\\", LG_EPARSE, 1);
  CANON_ERR("\"ab\\\"", LG_EPARSE, 5);
  CANON_ERR("[\"a", LG_EPARSE, 3);
}

static void test_utf8(void **state) {
  (void)state;
  /* Overlong forms. */
  CANON_ERR("\"\xc0\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xc1\xbf\"", LG_EUTF8, 1);
  CANON_ERR("\"\xe0\x80\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xe0\x9f\xbf\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf0\x80\x80\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf0\x8f\xbf\xbf\"", LG_EUTF8, 1);
  /* Encoded surrogates (CESU-8). */
  CANON_ERR("\"\xed\xa0\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xed\xbf\xbf\"", LG_EUTF8, 1);
  CANON_ERR("\"\xed\xa0\xbd\xed\xb8\x80\"", LG_EUTF8, 1);
  /* Past U+10FFFF, and bytes that never occur. */
  CANON_ERR("\"\xf4\x90\x80\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf5\x80\x80\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf8\x88\x80\x80\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"\xfe\"", LG_EUTF8, 1);
  CANON_ERR("\"\xff\"", LG_EUTF8, 1);
  /* Truncated sequences, before the quote and at the end of input. */
  CANON_ERR("\"\xc3\"", LG_EUTF8, 1);
  CANON_ERR("\"\xe2\x82\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf0\x9f\x98\"", LG_EUTF8, 1);
  CANON_ERR("\"\xf0\x9f\x98", LG_EUTF8, 1);
  CANON_ERR("\"\xc3", LG_EUTF8, 1);
  CANON_ERR("\"\xe2\x82x\"", LG_EUTF8, 1);
  /* Stray continuation bytes. */
  CANON_ERR("\"\x80\"", LG_EUTF8, 1);
  CANON_ERR("\"ab\xbf\"", LG_EUTF8, 3);
  CANON_ERR("\"\xc3\xa9\xa9\"", LG_EUTF8, 3);
  /* The offset is the bad byte's, wherever it is. */
  CANON_ERR("{\"key\":[1,\"ok\",\"b\xc3(\"]}", LG_EUTF8, 17);
  CANON_ERR("{\"\xc0\x80\":1}", LG_EUTF8, 2);
  CANON_ERR("{\"caf\xc3\xa9\":\"\xed\xa0\x80\"}", LG_EUTF8, 10);
  /* Outside strings a high byte is simply not JSON. */
  CANON_ERR("\xc3\xa9", LG_EPARSE, 0);
  CANON_ERR("[1,\xef\xbb\xbf]", LG_EPARSE, 3);
}

/* ------------------------------------------------------------------ */
/* Objects: key order, duplicates, white space.                        */

static void test_key_order(void **state) {
  (void)state;
  CANON_EQ("{\"b\":1,\"a\":2}", "{\"a\":2,\"b\":1}");
  CANON_EQ("{\"a\":1,\"b\":2}", "{\"a\":1,\"b\":2}");
  CANON_EQ("{\"ab\":1,\"a\":2,\"\":3}", "{\"\":3,\"a\":2,\"ab\":1}");
  CANON_EQ("{\"B\":1,\"a\":2,\"A\":3,\"_\":4}", "{\"A\":3,\"B\":1,\"_\":4,\"a\":2}");
  /* RFC 8785 §3.2.3: UTF-16 code units, not code points. U+20AC (euro)
   * comes before U+1F600 (D83D DE00), which comes before U+FB33 — in code
   * point order the emoji would be last. */
  CANON_EQ("{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew "
           "Letter Dalet With Dagesh\",\"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning "
           "Face\",\"\\u0080\":\"Control\",\"\\u00f6\":\"Latin Small Letter O With "
           "Diaeresis\"}",
           "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xc2\x80\":\"Control\",\"\xc3\xb6\":"
           "\"Latin Small Letter O With Diaeresis\",\"\xe2\x82\xac\":\"Euro "
           "Sign\",\"\xf0\x9f\x98\x80\":\"Emoji: Grinning Face\",\"\xef\xac\xb3\":\"Hebrew "
           "Letter Dalet With Dagesh\"}");
  /* The same keys given raw. */
  CANON_EQ("{\"\xef\xac\xb3\":3,\"\xf0\x9f\x98\x80\":2,\"\xe2\x82\xac\":1}",
           "{\"\xe2\x82\xac\":1,\"\xf0\x9f\x98\x80\":2,\"\xef\xac\xb3\":3}");
  CANON_EQ("{\"\\ue000\":1,\"\\ud83d\\ude00\":2}",
           "{\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1}");
  /* Keys are compared decoded, not as their escaped bytes: '"' (0x22)
   * before '#' (0x23), "\n" (0x0A) before "A", "\\" (0x5C) between '['
   * and ']'. */
  CANON_EQ("{\"#\":1,\"\\\"\":2}", "{\"\\\"\":2,\"#\":1}");
  CANON_EQ("{\"A\":1,\"\\n\":2}", "{\"\\n\":2,\"A\":1}");
  CANON_EQ("{\"]\":1,\"\\\\\":2,\"[\":3}", "{\"[\":3,\"\\\\\":2,\"]\":1}");
  CANON_EQ("{\"\\u0062\":1,\"a\":2}", "{\"a\":2,\"b\":1}");
  CANON_EQ("{\"ab\":1,\"a\\u0000\":2,\"a\":3}", "{\"a\":3,\"a\\u0000\":2,\"ab\":1}");
  CANON_EQ("{\"\\n\":1,\"\\u0001\":2}", "{\"\\u0001\":2,\"\\n\":1}");
  CANON_EQ("{\"a\\/b\":1,\"a.b\":2}", "{\"a.b\":2,\"a/b\":1}");
  /* Lone surrogates sort by their code unit too. */
  CANON_EQ("{\"\\uffff\":1,\"\\ud83d\\ude00\":2,\"\\ud800\":3,\"\\ue000\":4}",
           "{\"\\ud800\":3,\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":4,\"\xef\xbf\xbf\":1}");
  /* Nested objects are sorted at every level; arrays keep their order. */
  CANON_EQ("{\"z\":{\"y\":1,\"x\":[{\"b\":1,\"a\":2},{\"d\":{\"f\":0,\"e\":0}}]},\"a\":[3,1,2]}",
           "{\"a\":[3,1,2],\"z\":{\"x\":[{\"a\":2,\"b\":1},{\"d\":{\"e\":0,\"f\":0}}],\"y\":1}}");
}

/* Many members, in reverse order and interleaved with nested objects, so
 * that the member stack grows and the sort moves long values. */
static void test_key_order_large(void **state) {
  (void)state;
  enum { N = 600 };
  size_t cap = N * 64 + 64;
  char *in = malloc(cap), *want = malloc(cap);
  assert_non_null(in);
  assert_non_null(want);
  size_t n = 0, w = 0;
  in[n++] = '{';
  for (int i = N - 1; i >= 0; i--)
    n += (size_t)snprintf(in + n, cap - n, "%s\"k%04d\" : {\"z\":%d,\"y\":\"%0*d\"}",
                          i == N - 1 ? "" : ", ", i, i, i % 40 + 1, 7);
  in[n++] = '}';
  want[w++] = '{';
  for (int i = 0; i < N; i++)
    w += (size_t)snprintf(want + w, cap - w, "%s\"k%04d\":{\"y\":\"%0*d\",\"z\":%d}",
                          i ? "," : "", i, i % 40 + 1, 7, i);
  want[w++] = '}';
  canon_eq(in, n, want, w, __LINE__);
  free(in);
  free(want);
}

static void test_duplicate_keys(void **state) {
  (void)state;
  CANON_ERR("{\"a\":1,\"a\":2}", LG_EDUPKEY, 7);
  CANON_ERR("{\"a\":1,\"a\":1}", LG_EDUPKEY, 7);
  /* The same key written differently. */
  CANON_ERR("{\"a\":1,\"\\u0061\":2}", LG_EDUPKEY, 7);
  CANON_ERR("{\"\\u0061\":1,\"a\":2}", LG_EDUPKEY, 12);
  CANON_ERR("{\"\xc3\xa9\":1,\"\\u00e9\":2}", LG_EDUPKEY, 8);
  CANON_ERR("{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}", LG_EDUPKEY, 10);
  CANON_ERR("{\"a/b\":1,\"a\\/b\":2}", LG_EDUPKEY, 9);
  /* Not adjacent, and only found once the keys are sorted. */
  CANON_ERR("{\"b\":1,\"a\":2,\"b\":3}", LG_EDUPKEY, 13);
  CANON_ERR("{\"b\":1,\"c\":2,\"a\":3,\"b\":4}", LG_EDUPKEY, 19);
  /* In a nested object. */
  CANON_ERR("{\"x\":{\"q\":1,\"p\":2,\"q\":3}}", LG_EDUPKEY, 18);
  CANON_ERR("[{},{\"k\":[],\"k\":{}}]", LG_EDUPKEY, 12);
  /* In a big object (sorted another way than small ones): the duplicate
   * is reported at its later occurrence, however far apart the two are. */
  {
    char buf[4096];
    size_t n = 0;
    long at = -1;
    buf[n++] = '{';
    for (int i = 99; i >= 0; i--) {
      if (i == 10) at = (long)n + 1;
      n += (size_t)sprintf(buf + n, "%s\"k%02d\":%d", i == 99 ? "" : ",", i == 10 ? 77 : i, i);
    }
    buf[n++] = '}';
    canon_err(buf, n, LG_EDUPKEY, at, __LINE__);
  }
  /* Keys that differ only after a NUL or in case are different. */
  CANON_EQ("{\"a\":1,\"a\\u0000\":2,\"A\":3}", "{\"A\":3,\"a\":1,\"a\\u0000\":2}");
  /* The same key in sibling objects is fine. */
  CANON_EQ("[{\"a\":1},{\"a\":2}]", "[{\"a\":1},{\"a\":2}]");
}

static void test_whitespace(void **state) {
  (void)state;
  CANON_EQ(" \t\r\n{ \"a\" : [ 1 , 2 , { } , [ ] ] ,\n\t\"b\" : { \"c\" : null } } \n",
           "{\"a\":[1,2,{},[]],\"b\":{\"c\":null}}");
  CANON_EQ("  \"x\"  ", "\"x\"");
  CANON_EQ("\n7\n", "7");
  CANON_EQ("[ true , false , null ]", "[true,false,null]");
  /* White space inside strings is data. */
  CANON_EQ("{\" a \":\" b \"}", "{\" a \":\" b \"}");
  /* Only the four JSON white space characters are white space. */
  CANON_ERR("\f1", LG_EPARSE, 0);
  CANON_ERR("[1,\v2]", LG_EPARSE, 3);
  CANON_ERR("\xc2\xa0" "1", LG_EPARSE, 0);
}

/* ------------------------------------------------------------------ */
/* Syntax errors and their byte offsets.                                */

static void test_syntax_errors(void **state) {
  (void)state;
  /* Trailing garbage. */
  CANON_ERR("{} x", LG_EPARSE, 3);
  CANON_ERR("1 2", LG_EPARSE, 2);
  CANON_ERR("[1]]", LG_EPARSE, 3);
  CANON_ERR("{}{}", LG_EPARSE, 2);
  CANON_ERR("\"a\"\"b\"", LG_EPARSE, 3);
  CANON_ERR("nulls", LG_EPARSE, 4);
  CANON_ERR("{}\0", LG_EPARSE, 2);
  /* Nothing there. */
  CANON_ERR("", LG_EPARSE, 0);
  CANON_ERR("   ", LG_EPARSE, 3);
  /* Literals. */
  CANON_EQ("true", "true");
  CANON_EQ("false", "false");
  CANON_EQ("null", "null");
  CANON_ERR("tru", LG_EPARSE, 0);
  CANON_ERR("True", LG_EPARSE, 0);
  CANON_ERR("[nul]", LG_EPARSE, 1);
  CANON_ERR("undefined", LG_EPARSE, 0);
  /* Unterminated containers. */
  CANON_ERR("[", LG_EPARSE, 1);
  CANON_ERR("{", LG_EPARSE, 1);
  CANON_ERR("[1,2", LG_EPARSE, 4);
  CANON_ERR("{\"a\":1", LG_EPARSE, 6);
  CANON_ERR("{\"a\"", LG_EPARSE, 4);
  CANON_ERR("{\"a\":", LG_EPARSE, 5);
  /* Misplaced punctuation. */
  CANON_ERR("[1,]", LG_EPARSE, 3);
  CANON_ERR("[,1]", LG_EPARSE, 1);
  CANON_ERR("[1 2]", LG_EPARSE, 3);
  CANON_ERR("{\"a\":1,}", LG_EPARSE, 7);
  CANON_ERR("{,}", LG_EPARSE, 1);
  CANON_ERR("{\"a\" 1}", LG_EPARSE, 5);
  CANON_ERR("{\"a\"::1}", LG_EPARSE, 5);
  CANON_ERR("{1:2}", LG_EPARSE, 1);
  CANON_ERR("{'a':1}", LG_EPARSE, 1);
  CANON_ERR("{\"a\":1;\"b\":2}", LG_EPARSE, 6);
  CANON_ERR("]", LG_EPARSE, 0);
  CANON_ERR("/* */ 1", LG_EPARSE, 0);
  /* Bad arguments. */
  const char *out;
  size_t olen;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_canon_json(C, NULL, 3, &out, &olen, &err), LG_EINVAL);
  assert_int_equal(err.code, LG_EINVAL);
  assert_int_equal(lg_canon_json(NULL, "1", 1, &out, &olen, NULL), LG_EINVAL);
  assert_int_equal(lg_canon_json(C, NULL, 0, &out, &olen, NULL), LG_EPARSE);
  /* The length is respected: bytes past it are not read. */
  canon_eq("[1]xyz", 3, S("[1]"), __LINE__);
  canon_err("\"ab\"", 3, LG_EPARSE, 3, __LINE__);
}

static void test_depth(void **state) {
  (void)state;
  char buf[512];
  /* 64 levels of arrays are fine, 65 are not. */
  for (int depth = 63; depth <= 66; depth++) {
    size_t n = 0;
    for (int i = 0; i < depth; i++) buf[n++] = '[';
    for (int i = 0; i < depth; i++) buf[n++] = ']';
    if (depth <= LG_CANON_MAX_DEPTH)
      canon_eq(buf, n, buf, n, __LINE__);
    else
      canon_err(buf, n, LG_EDEPTH, LG_CANON_MAX_DEPTH, __LINE__);
  }
  /* The same with objects, and mixed: {"a":[{"a":[ ... 1 ... ]}]}. */
  for (int depth = 64; depth <= 65; depth++) {
    size_t n = 0, opens[80];
    for (int i = 0; i < depth; i++) {
      opens[i] = n;
      n += (size_t)sprintf(buf + n, i % 2 ? "[" : "{\"a\":");
    }
    buf[n++] = '1';
    for (int i = depth - 1; i >= 0; i--) buf[n++] = i % 2 ? ']' : '}';
    if (depth == 64)
      canon_eq(buf, n, buf, n, __LINE__);
    else
      canon_err(buf, n, LG_EDEPTH, (long)opens[64], __LINE__);
  }
  /* Nesting counts containers, not siblings. */
  {
    size_t n = 0;
    buf[n++] = '[';
    for (int i = 0; i < 100; i++) n += (size_t)sprintf(buf + n, "%s[]", i ? "," : "");
    buf[n++] = ']';
    canon_eq(buf, n, buf, n, __LINE__);
  }
  /* Hostile depth: an error, not a crash. */
  size_t big = 100000;
  char *deep = malloc(2 * big);
  assert_non_null(deep);
  memset(deep, '[', big);
  canon_err(deep, big, LG_EDEPTH, LG_CANON_MAX_DEPTH, __LINE__);
  memset(deep + big, ']', big);
  canon_err(deep, 2 * big, LG_EDEPTH, LG_CANON_MAX_DEPTH, __LINE__);
  for (size_t i = 0; i < big; i++) deep[i] = i % 5 ? '[' : ' ';
  canon_err(deep, big, LG_EDEPTH, 81, __LINE__); /* the 65th '[' */
  free(deep);
  /* The canonicaliser is still fine afterwards. */
  CANON_EQ("{\"b\":[],\"a\":{}}", "{\"a\":{},\"b\":[]}");
}

/* ------------------------------------------------------------------ */
/* Fingerprints and loop keys.                                         */

static const char POLICY[] =
    "{\"tools\":{"
    "\"charge_invoice\":{\"loop_key\":{\"invoice_id\":[\"digits\"]},\"side_effects\":true},"
    "\"search\":{\"loop_key\":{\"q\":[\"lower\",\"trim\",\"collapse_space\"]}},"
    "\"lookup\":{\"loop_key\":[\"customer_id\"]},"
    "\"pair\":{\"loop_key\":[\"b\",\"a\"]},"
    "\"poll_job\":{\"loop_key\":false},"
    "\"everything\":{\"loop_key\":true},"
    "\"nothing\":{\"loop_key\":[]},"
    "\"strip\":{\"loop_key\":{\"id\":[\"strip_prefix:INV-\"]}},"
    "\"upper_then_strip\":{\"loop_key\":{\"id\":[\"upper\",\"strip_prefix:INV-\"]}},"
    "\"strip_then_upper\":{\"loop_key\":{\"id\":[\"strip_prefix:INV-\",\"upper\"]}},"
    "\"mixed\":{\"loop_key\":{\"a\":[\"lower\"],\"b\":[],\"caf\\u00e9\":[\"trim\"],"
    "\"k\\\"q\":[\"upper\"]}},"
    "\"run_shell\":{\"empty_ok\":true}"
    "}}";

static lg_policy_t *P;

/* Fingerprints args for tool under P; returns the code and copies the key
 * material into km (NUL-terminated). Checks the construction and that the
 * key material is canonical whenever it succeeds. */
static int fp(const lg_policy_t *pol, const char *tool, const char *args, size_t len,
              char hex[LG_FP_HEX], char *km, size_t kmcap, lg_error_t *err) {
  const char *k = NULL;
  size_t kl = 0;
  int rc = lg_canon_fingerprint(C, pol, tool, args, len, hex, &k, &kl, err);
  if (rc) return rc;
  if (kl >= kmcap) fail_msg("key material too long for the test buffer");
  memcpy(km, k, kl);
  km[kl] = 0;
  char want[LG_FP_HEX];
  sha_tool_km(tool, km, kl, want);
  if (strcmp(want, hex) != 0) fail_msg("fingerprint is not sha256(tool \\n km) for %s", km);
  const char *o;
  size_t ol;
  if (lg_canon_json(C, km, kl, &o, &ol, NULL) != 0 || ol != kl || memcmp(o, km, kl) != 0)
    fail_msg("key material [%s] is not canonical", km);
  return 0;
}

/* Expects the key material of (tool, args) under P to be `want`. */
static void km_eq(const char *tool, const char *args, size_t len, const char *want, int line) {
  char hex[LG_FP_HEX], km[4096];
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = fp(P, tool, args, len, hex, km, sizeof km, &err);
  if (rc) fail_msg("line %d: %s %s: %s (%s)", line, tool, show(args, len), lg_err_name(rc),
                   err.message);
  if (strcmp(km, want) != 0)
    fail_msg("line %d: %s %s\n  key material [%s]\n  want         [%s]", line, tool,
             show(args, len), show(km, strlen(km)), show(want, strlen(want)));
}
#define KM_EQ(tool, args, want) km_eq(tool, S(args), want, __LINE__)

/* The fingerprint of (tool, args) under P, as a new string. */
static char *fp_of(const char *tool, const char *args) {
  char hex[LG_FP_HEX], km[4096];
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = fp(P, tool, args, strlen(args), hex, km, sizeof km, &err);
  if (rc) fail_msg("%s %s: %s (%s)", tool, args, lg_err_name(rc), err.message);
  return strdup(hex);
}

static void assert_same_fp(const char *tool, const char *a, const char *b) {
  char *x = fp_of(tool, a), *y = fp_of(tool, b);
  if (strcmp(x, y) != 0) fail_msg("%s: %s and %s should have one fingerprint", tool, a, b);
  free(x);
  free(y);
}

static void assert_other_fp(const char *tool, const char *a, const char *b) {
  char *x = fp_of(tool, a), *y = fp_of(tool, b);
  if (strcmp(x, y) == 0) fail_msg("%s: %s and %s should differ", tool, a, b);
  free(x);
  free(y);
}

static void test_fingerprint_basics(void **state) {
  (void)state;
  char hex[LG_FP_HEX], hex2[LG_FP_HEX], km[256];
  /* No policy: all arguments, canonical. */
  assert_int_equal(fp(NULL, "bash", S("{ \"cwd\":\"/tmp\", \"command\":\"ls -la\" }"), hex, km,
                      sizeof km, NULL),
                   0);
  assert_string_equal(km, "{\"command\":\"ls -la\",\"cwd\":\"/tmp\"}");
  assert_int_equal(strlen(hex), 64);
  for (int i = 0; i < 64; i++) assert_true(strchr("0123456789abcdef", hex[i]) != NULL);
  /* The tool is part of the fingerprint. */
  assert_int_equal(fp(NULL, "sh", S("{\"command\":\"ls -la\",\"cwd\":\"/tmp\"}"), hex2, km,
                      sizeof km, NULL),
                   0);
  assert_string_not_equal(hex, hex2);
  /* NULL arguments mean {}. */
  assert_int_equal(fp(NULL, "list", NULL, 0, hex, km, sizeof km, NULL), 0);
  assert_string_equal(km, "{}");
  assert_int_equal(fp(NULL, "list", S("{}"), hex2, km, sizeof km, NULL), 0);
  assert_string_equal(hex, hex2);
  /* key_material and km_len may be NULL. */
  assert_int_equal(lg_canon_fingerprint(C, NULL, "list", S("{}"), hex2, NULL, NULL, NULL), 0);
  assert_string_equal(hex, hex2);
  /* An empty tool name is a name; no tool is an error. */
  assert_int_equal(fp(NULL, "", S("{}"), hex, km, sizeof km, NULL), 0);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_canon_fingerprint(C, NULL, NULL, S("{}"), hex, NULL, NULL, &err),
                   LG_EINVAL);
  assert_int_equal(err.code, LG_EINVAL);
  assert_int_equal(lg_canon_fingerprint(NULL, NULL, "t", S("{}"), hex, NULL, NULL, NULL),
                   LG_EINVAL);
  /* Malformed arguments are reported like lg_canon_json reports them. */
  memset(&err, 0, sizeof err);
  assert_int_equal(fp(NULL, "t", S("{\"a\":01}"), hex, km, sizeof km, &err), LG_EPARSE);
  assert_int_equal(err.offset, 6);
  memset(&err, 0, sizeof err);
  assert_int_equal(fp(P, "lookup", S("{\"customer_id\":1,\"x\":\"\xff\"}"), hex, km, sizeof km,
                      &err),
                   LG_EUTF8);
  assert_int_equal(err.offset, 22);
  /* sha256 of bare bytes. */
  assert_int_equal(lg_canon_sha256_hex(C, "", 0, hex), 0);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  assert_int_equal(lg_canon_sha256_hex(C, "abc", 3, hex), 0);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert_int_equal(lg_canon_sha256_hex(NULL, "abc", 3, hex), LG_EINVAL);
}

static void test_loop_key_fields(void **state) {
  (void)state;
  /* Only the listed fields, whatever else the call carries. */
  KM_EQ("lookup", "{\"customer_id\":\"c-1\",\"page\":2,\"ts\":1712}", "{\"customer_id\":\"c-1\"}");
  KM_EQ("lookup", "{\"ts\":1,\"customer_id\":\"c-1\"}", "{\"customer_id\":\"c-1\"}");
  assert_same_fp("lookup", "{\"customer_id\":\"c-1\",\"page\":2}",
                 "{\"page\":3,\"customer_id\":\"c-1\",\"note\":{\"x\":[1]}}");
  assert_other_fp("lookup", "{\"customer_id\":\"c-1\"}", "{\"customer_id\":\"c-2\"}");
  /* Missing fields are left out. */
  KM_EQ("lookup", "{\"page\":2}", "{}");
  KM_EQ("lookup", "{}", "{}");
  KM_EQ("pair", "{\"a\":1}", "{\"a\":1}");
  /* Several fields come out sorted, not in the policy's order. */
  KM_EQ("pair", "{\"c\":3,\"b\":2,\"a\":1}", "{\"a\":1,\"b\":2}");
  /* The selected value is kept whole: nested objects are canonical, and
   * their own fields of the same name are not touched. */
  KM_EQ("lookup", "{\"customer_id\":{\"z\":[ {\"b\":1, \"a\":2} ],\"customer_id\":7},\"x\":1}",
        "{\"customer_id\":{\"customer_id\":7,\"z\":[{\"a\":2,\"b\":1}]}}");
  /* A field whose key is written with escapes is still that field. */
  KM_EQ("lookup", "{\"customer\\u005fid\":\"c-1\",\"x\":1}", "{\"customer_id\":\"c-1\"}");
  KM_EQ("mixed", "{\"caf\\u00e9\":\" x \",\"cafe\":1}", "{\"caf\xc3\xa9\":\"x\"}");
  KM_EQ("mixed", "{\"caf\xc3\xa9\":\" x \"}", "{\"caf\xc3\xa9\":\"x\"}");
  KM_EQ("mixed", "{\"k\\\"q\":\"a\",\"kq\":\"b\"}", "{\"k\\\"q\":\"A\"}");
  KM_EQ("mixed", "{\"k\\u0022q\":\"a\"}", "{\"k\\\"q\":\"A\"}");
  /* Fields with no normalizers pass unchanged. */
  KM_EQ("mixed", "{\"b\":\" B \",\"a\":\" A \"}", "{\"a\":\" a \",\"b\":\" B \"}");
  /* An empty list selects nothing; true and false select everything. */
  KM_EQ("nothing", "{\"a\":1}", "{}");
  KM_EQ("everything", "{\"b\":1,\"a\":2}", "{\"a\":2,\"b\":1}");
  KM_EQ("poll_job", "{\"job\":\"j-1\",\"attempt\":3}", "{\"attempt\":3,\"job\":\"j-1\"}");
  KM_EQ("run_shell", "{\"cmd\":\"ls\"}", "{\"cmd\":\"ls\"}");
  KM_EQ("not_in_policy", "{\"b\":1,\"a\":2}", "{\"a\":2,\"b\":1}");
  /* loop_key false still yields a fingerprint, the one of all arguments:
   * the same as without a policy. */
  {
    char h1[LG_FP_HEX], h2[LG_FP_HEX], km[256];
    assert_int_equal(fp(P, "poll_job", S("{\"job\":\"j-1\"}"), h1, km, sizeof km, NULL), 0);
    assert_int_equal(fp(NULL, "poll_job", S("{\"job\":\"j-1\"}"), h2, km, sizeof km, NULL), 0);
    assert_string_equal(h1, h2);
    assert_other_fp("poll_job", "{\"job\":\"j-1\"}", "{\"job\":\"j-2\"}");
  }
  /* Selecting fields needs an object. */
  const char *bad[] = {"[1]", "\"customer_id\"", "null", "3", "  [] ", "true"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char hex[LG_FP_HEX], km[64];
    lg_error_t err;
    memset(&err, 0, sizeof err);
    int rc = fp(P, "lookup", bad[i], strlen(bad[i]), hex, km, sizeof km, &err);
    if (rc != LG_EINVAL || err.code != LG_EINVAL)
      fail_msg("lookup %s: got %s, want LG_EINVAL", bad[i], lg_err_name(rc));
    /* Tools that select nothing take any JSON value. */
    assert_int_equal(fp(P, "poll_job", bad[i], strlen(bad[i]), hex, km, sizeof km, NULL), 0);
  }
  /* Dropped fields are still checked: malformed, or a duplicate key. */
  {
    char hex[LG_FP_HEX], km[64];
    lg_error_t err;
    memset(&err, 0, sizeof err);
    assert_int_equal(fp(P, "lookup", S("{\"customer_id\":1,\"x\":[1,}"), hex, km, sizeof km, &err),
                     LG_EPARSE);
    assert_int_equal(err.offset, 24);
    memset(&err, 0, sizeof err);
    assert_int_equal(fp(P, "lookup", S("{\"customer_id\":1,\"x\":1,\"x\":2}"), hex, km, sizeof km,
                        &err),
                     LG_EDUPKEY);
    assert_int_equal(err.offset, 23);
    memset(&err, 0, sizeof err);
    assert_int_equal(fp(P, "lookup", S("{\"customer_id\":1,\"customer_id\":1}"), hex, km,
                        sizeof km, &err),
                     LG_EDUPKEY);
    assert_int_equal(err.offset, 17);
    assert_int_equal(fp(P, "lookup", S("{\"customer_id\":1,\"x\":1e999}"), hex, km, sizeof km,
                        NULL),
                     LG_ERANGE);
  }
}

static void test_loop_key_normalizers(void **state) {
  (void)state;
  /* digits: every spelling of an invoice number is one invoice. */
  KM_EQ("charge_invoice", "{\"invoice_id\":\"INV-2291\",\"amount\":10}", "{\"invoice_id\":\"2291\"}");
  const char *same[] = {"{\"invoice_id\":\"INV-2291\"}", "{\"invoice_id\":\"inv-2291\"}",
                        "{\"invoice_id\":\"INV-2291 \"}", "{\"invoice_id\":\" 2291\"}",
                        "{\"amount\":5,\"invoice_id\":\"#2291\"}",
                        "{\"invoice_id\":\"2\\u00a02\\u200b9\\n1\"}"};
  for (size_t i = 1; i < sizeof same / sizeof same[0]; i++)
    assert_same_fp("charge_invoice", same[0], same[i]);
  assert_other_fp("charge_invoice", same[0], "{\"invoice_id\":\"INV-2292\"}");
  KM_EQ("charge_invoice", "{\"invoice_id\":\"no digits\"}", "{\"invoice_id\":\"\"}");
  /* Other types pass through every normalizer unchanged. */
  KM_EQ("charge_invoice", "{\"invoice_id\":2291}", "{\"invoice_id\":2291}");
  assert_other_fp("charge_invoice", "{\"invoice_id\":2291}", "{\"invoice_id\":\"2291\"}");
  KM_EQ("charge_invoice", "{\"invoice_id\":[\"INV-1\"]}", "{\"invoice_id\":[\"INV-1\"]}");
  KM_EQ("charge_invoice", "{\"invoice_id\":{\"n\":\"INV-1\"}}", "{\"invoice_id\":{\"n\":\"INV-1\"}}");
  KM_EQ("charge_invoice", "{\"invoice_id\":null}", "{\"invoice_id\":null}");
  KM_EQ("charge_invoice", "{\"invoice_id\":true}", "{\"invoice_id\":true}");
  KM_EQ("charge_invoice", "{\"invoice_id\":1.0e3}", "{\"invoice_id\":1000}");
  KM_EQ("search", "{\"q\":42}", "{\"q\":42}");
  KM_EQ("search", "{\"q\":[\" A  B \"]}", "{\"q\":[\" A  B \"]}");
  /* lower, trim, collapse_space, in that order. */
  KM_EQ("search", "{\"q\":\"  Hello   World \"}", "{\"q\":\"hello world\"}");
  KM_EQ("search", "{\"q\":\"\\tHello\\n\\r World\\t\"}", "{\"q\":\"hello world\"}");
  KM_EQ("search", "{\"q\":\"   \"}", "{\"q\":\"\"}");
  KM_EQ("search", "{\"q\":\"\"}", "{\"q\":\"\"}");
  KM_EQ("search", "{\"q\":\"ABC\"}", "{\"q\":\"abc\"}");
  assert_same_fp("search", "{\"q\":\"  Hello   World \"}", "{\"q\":\"hello world\",\"page\":2}");
  assert_other_fp("search", "{\"q\":\"hello world\"}", "{\"q\":\"helloworld\"}");
  /* The result is escaped canonically again. */
  KM_EQ("search", "{\"q\":\" Say \\\"HI\\\"\\\\ \"}", "{\"q\":\"say \\\"hi\\\"\\\\\"}");
  KM_EQ("search", "{\"q\":\"A\\u0001B\"}", "{\"q\":\"a\\u0001b\"}");
  KM_EQ("search", "{\"q\":\" \\ud800 \"}", "{\"q\":\"\\ud800\"}");
  KM_EQ("search", "{\"q\":\" \\ud800X\\udc00 \"}", "{\"q\":\"\\ud800x\\udc00\"}");
  KM_EQ("search", "{\"q\":\" Caf\\u00e9  \\ud83d\\ude00 \"}", "{\"q\":\"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
  /* strip_prefix: once, at the start, case-sensitive. */
  KM_EQ("strip", "{\"id\":\"INV-2291\"}", "{\"id\":\"2291\"}");
  KM_EQ("strip", "{\"id\":\"INV-INV-7\"}", "{\"id\":\"INV-7\"}");
  KM_EQ("strip", "{\"id\":\"inv-7\"}", "{\"id\":\"inv-7\"}");
  KM_EQ("strip", "{\"id\":\"X-INV-7\"}", "{\"id\":\"X-INV-7\"}");
  KM_EQ("strip", "{\"id\":\"INV-\"}", "{\"id\":\"\"}");
  KM_EQ("strip", "{\"id\":\"INV\"}", "{\"id\":\"INV\"}");
  KM_EQ("strip", "{\"id\":\"\\u0049NV-5\"}", "{\"id\":\"5\"}");
  /* Normalizers apply in the order given. */
  KM_EQ("upper_then_strip", "{\"id\":\"inv-7a\"}", "{\"id\":\"7A\"}");
  KM_EQ("strip_then_upper", "{\"id\":\"inv-7a\"}", "{\"id\":\"INV-7A\"}");
  KM_EQ("strip_then_upper", "{\"id\":\"INV-7a\"}", "{\"id\":\"7A\"}");
  /* Several normalized fields in one call. */
  KM_EQ("mixed", "{\"k\\\"q\":\"x\",\"a\":\"MiXeD\",\"b\":\"Keep\",\"caf\xc3\xa9\":\"\\t1 \"}",
        "{\"a\":\"mixed\",\"b\":\"Keep\",\"caf\xc3\xa9\":\"1\",\"k\\\"q\":\"X\"}");
}

int main(void) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  C = lg_canon_new();
  P = lg_policy_parse(POLICY, strlen(POLICY), "POLICY", &err);
  if (!C || !P) {
    fprintf(stderr, "setup failed: %s %s\n", err.field, err.message);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_numbers),
      cmocka_unit_test(test_numbers_huge_literals),
      cmocka_unit_test(test_numbers_expand),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_string_errors),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_key_order),
      cmocka_unit_test(test_key_order_large),
      cmocka_unit_test(test_duplicate_keys),
      cmocka_unit_test(test_whitespace),
      cmocka_unit_test(test_syntax_errors),
      cmocka_unit_test(test_depth),
      cmocka_unit_test(test_fingerprint_basics),
      cmocka_unit_test(test_loop_key_fields),
      cmocka_unit_test(test_loop_key_normalizers),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  lg_policy_free(P);
  lg_canon_free(C);
  return failed;
}
