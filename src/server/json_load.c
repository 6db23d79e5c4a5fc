/*
 * json_load.c — lg__json_load: jansson's json_loadb(s, n, 0, err), faster.
 *
 * jansson's lexer reads its input a byte at a time through a stream with
 * a call per byte; on the gateway's 8 KB request bodies that was about
 * 180 instructions a byte, half of a whole gateway request. This parser
 * reads the bytes directly (runs of plain characters at once) and builds
 * the same tree with jansson's own constructors, so the result is the one
 * json_loadb gives: members in input order, a repeated key's last value
 * in its first place, integers as json_int_t, reals by strtod, strings
 * decoded and their UTF-8 checked as jansson checks it.
 *
 * It takes only what it is sure of. Anything else — a syntax error, an
 * integer or a real jansson would refuse as too big, a \u0000 or a lone
 * surrogate, invalid UTF-8, a nesting over MAX_DEPTH, a locale whose
 * decimal point is not '.', out of memory — and the text goes to
 * json_loadb, so every error (and its line and column) is jansson's.
 * With JSON_REJECT_DUPLICATES (the sidecar's bodies), a repeated key is
 * one of those: jansson refuses it in its own words.
 *
 * lg__json_load_lazy reads one member of the top object, an array, by
 * the same grammar without building it (f->skip): its elements are
 * placeholders, each built when first read (lg__json_lazy_get). The
 * gateway reads a conversation's messages this way: an agent loop's
 * request carries the whole conversation, of which the gateway reads the
 * few messages new since the last request (docs/internals/performance.md).
 * Every check is made on the whole text before the tree is given: an
 * element that is read later was already taken by the same code.
 */
#include "server.h"

#include "../util/utf8.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdlib.h>

#define MAX_DEPTH 256 /* deeper: jansson's verdict (its own limit is 2048) */

typedef struct fparse {
  const unsigned char *p, *end;
  lg__buf_t tmp; /* a string with escapes, decoded */
  size_t reals;  /* real numbers read (a repeated key's replaced one too) */
  int nodup;     /* JSON_REJECT_DUPLICATES: a repeated key is not taken */
  int skip;      /* checked, not built: a value is json_null() */
  const char *lazy;  /* the top object's member read lazily, or NULL */
  lg__json_lazy_t *lz;
  struct lg__json_span *cur; /* the lazy element being checked: its peeks */
  int peek_depth;            /*   at this depth */
  size_t peek_len[2];        /*   lz->peek's lengths (0: none) */
  int esc;                   /* the last string had an escape */
} fparse_t;

static inline void ws(fparse_t *f) {
  while (f->p < f->end && lg__json_ws((char)*f->p)) f->p++;
}

/* The four hex digits of a \u escape at p. */
static int hex4(const unsigned char *p, const unsigned char *end, unsigned *out) {
  if (end - p < 4) return -1;
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int d = lg__hexval(p[i]);
    if (d < 0) return -1;
    v = v * 16 + (unsigned)d;
  }
  *out = v;
  return 0;
}

/* A string after its opening quote: *s, *len its decoded bytes (the input
 * itself when it has no escape, else f->tmp). 0, or -1: not taken.
 * Decoded bytes are never more than the text they come from (an escape
 * of 2, 6 or 12 bytes gives 1 to 4), so at the first escape f->tmp gets
 * room for the rest of the input and the bytes are written in place.
 * With f->skip, escapes are checked, not decoded (*s is the text). */
static int str(fparse_t *f, const char **s, size_t *len) {
  const unsigned char *start = f->p, *p = start, *end = f->end;
  char *o = NULL; /* from the first escape: where the decoded bytes go */
  f->esc = 0;
  for (;;) {
    const unsigned char *q = p + lg__str_plain_end(p, 0, (size_t)(end - p));
    if (o) {
      memcpy(o, p, (size_t)(q - p));
      o += q - p;
    }
    p = q;
    if (q >= end) return -1;
    unsigned char c = *q;
    if (c == '"') break;
    if (c < 0x20) return -1;
    if (c >= 0x80) {
      size_t n = lg__utf8_len(q, (size_t)(end - q)); /* jansson's rules too */
      if (!n) return -1;
      if (o) {
        memcpy(o, q, n);
        o += n;
      }
      p += n;
      continue;
    }
    /* a backslash */
    f->esc = 1;
    if (!o && !f->skip) {
      f->tmp.len = 0;
      if (lg__buf_reserve(&f->tmp, (size_t)(end - start))) return -1;
      o = f->tmp.data;
      memcpy(o, start, (size_t)(q - start));
      o += q - start;
    }
    if (end - q < 2) return -1;
    unsigned char e = q[1];
    p = q + 2;
    char one = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b'
               : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
    if (one) {
      if (o) *o++ = one;
      continue;
    }
    unsigned cp, lo;
    if (e != 'u' || hex4(p, end, &cp) || !cp) return -1; /* \u0000: jansson refuses it */
    p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* a pair */
      if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) || lo < 0xDC00 || lo > 0xDFFF)
        return -1;
      p += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (o) o += lg__utf8_put(cp, o);
  }
  if (o) {
    *s = f->tmp.data;
    *len = f->tmp.len = (size_t)(o - f->tmp.data);
  } else {
    *s = (const char *)start;
    *len = (size_t)(p - start);
  }
  f->p = p + 1; /* the closing quote */
  return 0;
}

static inline int digit(const fparse_t *f) { return f->p < f->end && *f->p >= '0' && *f->p <= '9'; }

/* A number, by jansson's grammar: an integer that fits json_int_t, or a
 * finite real. NULL: not taken. */
static json_t *num(fparse_t *f) {
  const unsigned char *start = f->p;
  int neg = *f->p == '-';
  if (neg) f->p++;
  if (!digit(f)) return NULL;
  if (*f->p == '0') {
    f->p++;
    if (digit(f)) return NULL;
  } else {
    while (digit(f)) f->p++;
  }
  int real = 0;
  if (f->p < f->end && *f->p == '.') {
    f->p++;
    if (!digit(f)) return NULL;
    while (digit(f)) f->p++;
    real = 1;
  }
  if (f->p < f->end && (*f->p == 'e' || *f->p == 'E')) {
    f->p++;
    if (f->p < f->end && (*f->p == '+' || *f->p == '-')) f->p++;
    if (!digit(f)) return NULL;
    while (digit(f)) f->p++;
    real = 1;
  }
  size_t n = (size_t)(f->p - start);
  if (!real) {
    if (n - (size_t)neg > 18) return NULL; /* may not fit: jansson decides */
    json_int_t v = 0;
    for (const unsigned char *q = start + neg; q < f->p; q++) v = v * 10 + (*q - '0');
    return f->skip ? json_null() : json_integer(neg ? -v : v);
  }
  char buf[64];
  if (n >= sizeof buf || localeconv()->decimal_point[0] != '.') return NULL;
  memcpy(buf, start, n);
  buf[n] = 0;
  errno = 0;
  double d = strtod(buf, NULL);
  if ((d == HUGE_VAL || d == -HUGE_VAL) && errno == ERANGE) return NULL; /* jansson: overflow */
  f->reals++;
  return f->skip ? json_null() : json_real(d);
}

static json_t *value(fparse_t *f, int depth);

/* After a member or an element: 1 a ',' (another follows), 0 the closing
 * bracket, -1 anything else. */
static int after_item(fparse_t *f, char close) {
  ws(f);
  if (f->p < f->end && *f->p == ',') {
    f->p++;
    ws(f);
    return 1;
  }
  if (f->p < f->end && *f->p == (unsigned char)close) {
    f->p++;
    return 0;
  }
  return -1;
}

static json_t *lazy_array(fparse_t *f, int depth);

/* A member of the lazy element being checked, key k (kesc: spelled with
 * an escape): the value of a peeked key, its text from v to f->p (f->esc:
 * a string's escape). */
static void peek_member(fparse_t *f, const char *k, size_t kl, int kesc, const unsigned char *v) {
  struct lg__json_span *sp = f->cur;
  for (int i = 0; i < 2; i++) {
    if (!f->peek_len[i]) continue;
    if (kesc) { /* its decoded name is not known here */
      sp->state[i] = 2;
      continue;
    }
    if (sp->state[i] == 2 || f->peek_len[i] != kl || memcmp(f->lz->peek[i], k, kl)) continue;
    size_t n = *v == '"' ? (size_t)(f->p - v) - 2 : 0; /* a string's, without its quotes */
    if (*v != '"') {
      sp->state[i] = 0; /* not a string: as none (a repeat's last value is the one) */
    } else if (n < sizeof sp->val[i] && !f->esc) {
      memcpy(sp->val[i], v + 1, n);
      sp->val[i][n] = 0;
      sp->state[i] = 1;
    } else {
      sp->state[i] = 2;
    }
  }
}

/* Whether key k is the top object's lazy member. */
static int lazy_key(const fparse_t *f, int depth, const char *k, size_t kl) {
  return f->lazy && depth == 1 && strlen(f->lazy) == kl && !memcmp(f->lazy, k, kl);
}

static json_t *object(fparse_t *f, int depth) {
  json_t *o = f->skip ? json_null() : json_object();
  if (!o) return NULL;
  ws(f);
  if (f->p < f->end && *f->p == '}') {
    f->p++;
    return o;
  }
  for (;;) {
    const char *k;
    size_t kl;
    if (f->p >= f->end || *f->p != '"') break;
    f->p++;
    if (str(f, &k, &kl)) break;
    int kesc = f->esc;
    /* the key is copied by jansson; a decoded one lives in tmp, which the
     * value reuses: keep it aside */
    char kbuf[128], *kcopy = NULL;
    if (k == f->tmp.data && !f->skip) {
      if (kl < sizeof kbuf) {
        memcpy(kbuf, k, kl);
        k = kbuf;
      } else if (!(kcopy = lg__malloc(kl))) {
        break;
      } else {
        memcpy(kcopy, k, kl);
        k = kcopy;
      }
    }
    ws(f);
    json_t *v = NULL;
    if (f->p < f->end && *f->p == ':') {
      f->p++;
      ws(f);
      if (f->skip && depth == f->peek_depth) {
        const unsigned char *at = f->p;
        if ((v = value(f, depth + 1)) && (kesc || kl == f->peek_len[0] || kl == f->peek_len[1]))
          peek_member(f, k, kl, kesc, at);
      } else if (!lazy_key(f, depth, k, kl)) {
        v = value(f, depth + 1);
      } else if (f->p < f->end && *f->p == '[') {
        f->p++;
        v = lazy_array(f, depth + 1);
      } else { /* not an array: an ordinary member (a repeat replaces the array) */
        f->lz->arr = NULL;
        v = value(f, depth + 1);
      }
    }
    int bad = !v;
    if (f->skip) {
      /* nothing kept */
    } else if (!bad && f->nodup && json_object_getn(o, k, kl)) { /* jansson's error */
      json_decref(v);
      bad = 1;
    } else if (!bad) {
      bad = json_object_setn_new_nocheck(o, k, kl, v) != 0; /* takes v, even failing */
    }
    lg__free(kcopy);
    int next = bad ? -1 : after_item(f, '}');
    if (next == 0) return o;
    if (next < 0) break;
  }
  json_decref(o);
  return NULL;
}

static json_t *array(fparse_t *f, int depth) {
  json_t *a = f->skip ? json_null() : json_array();
  if (!a) return NULL;
  ws(f);
  if (f->p < f->end && *f->p == ']') {
    f->p++;
    return a;
  }
  for (;;) {
    json_t *v = value(f, depth + 1);
    int next = !v || (!f->skip && json_array_append_new(a, v)) ? -1 : after_item(f, ']');
    if (next == 0) return a;
    if (next < 0) break;
  }
  json_decref(a);
  return NULL;
}

/* Room in lz for n elements. */
static int lazy_room(lg__json_lazy_t *lz, size_t n) {
  if (n <= lz->cap) return 0;
  size_t cap = lz->cap ? lz->cap : 64;
  while (cap < n) cap *= 2;
  void *span = lg__realloc(lz->span, cap * sizeof *lz->span);
  if (!span) return -1;
  lz->span = span;
  lz->cap = cap;
  return 0;
}

/* The elements of lz->prefix taken into a, when the text starts with its
 * bytes and this array begins where its did: 1 taken (f->p after them),
 * 0 not, -1 out of memory. */
static int lazy_reuse(fparse_t *f, json_t *a) {
  lg__json_lazy_t *lz = f->lz;
  const lg__json_prefix_t *pre = lz->prefix;
  if (!pre || pre->at != lz->at ||
      !lg__json_prefix_starts(pre, lz->text, (size_t)(f->end - (const unsigned char *)lz->text)))
    return 0;
  if (lazy_room(lz, pre->n)) return -1;
  for (size_t i = 0; i < pre->n; i++)
    if (json_array_append_new(a, json_null())) return -1;
  memcpy(lz->span, pre->span, pre->n * sizeof *lz->span);
  int same[2];
  for (int k = 0; k < 2; k++) same[k] = lz->peek[k] && !strcmp(lz->peek[k], pre->peek[k]);
  for (size_t i = 0; i < pre->n; i++) {
    lz->span[i].built = 0;
    for (int k = 0; k < 2; k++)
      if (!same[k]) lz->span[i].state[k] = 2; /* peeked for another name: build to know */
  }
  lz->n = lz->reused = pre->n;
  f->reals += pre->reals;
  f->p = (const unsigned char *)lz->text + pre->len;
  return 1;
}

/* The lazy member's array, after its '[': each element checked, not
 * built; a placeholder (json_null()) in its place, its text in f->lz. */
static json_t *lazy_array(fparse_t *f, int depth) {
  lg__json_lazy_t *lz = f->lz;
  json_t *a = json_array();
  if (!a) return NULL;
  lz->arr = NULL;
  lz->n = lz->reused = 0;
  lz->at = (size_t)(f->p - (const unsigned char *)lz->text);
  size_t reals0 = f->reals;
  for (int k = 0; k < 2; k++) f->peek_len[k] = lz->peek[k] ? strlen(lz->peek[k]) : 0;
  int next = lazy_reuse(f, a);
  if (next > 0) {
    next = after_item(f, ']');
  } else if (!next) {
    ws(f);
    if (f->p < f->end && *f->p == ']') {
      f->p++;
      next = 0;
    } else {
      next = 1;
    }
  }
  while (next == 1) {
    if (lazy_room(lz, lz->n + 1)) break;
    const unsigned char *at = f->p;
    f->cur = &lz->span[lz->n];
    f->cur->built = 0;
    memset(f->cur->state, 0, sizeof f->cur->state);
    f->peek_depth = depth + 1;
    f->skip = 1;
    json_t *v = value(f, depth + 1);
    f->skip = 0;
    f->peek_depth = 0;
    if (!v || json_array_append_new(a, json_null())) break;
    lz->span[lz->n].off = (size_t)(at - (const unsigned char *)lz->text);
    lz->span[lz->n].len = (size_t)(f->p - at);
    lz->n++;
    next = after_item(f, ']');
  }
  if (next == 0) {
    lz->reals = f->reals - reals0;
    lz->arr = a;
    return a;
  }
  json_decref(a);
  return NULL;
}

static json_t *literal(fparse_t *f, const char *word, size_t n, json_t *v) {
  if ((size_t)(f->end - f->p) < n || memcmp(f->p, word, n)) return NULL;
  f->p += n;
  return v;
}

static json_t *value(fparse_t *f, int depth) {
  if (f->p >= f->end || depth > MAX_DEPTH) return NULL;
  switch (*f->p) {
  case '{': f->p++; return object(f, depth);
  case '[': f->p++; return array(f, depth);
  case '"': {
    f->p++;
    const char *s;
    size_t n;
    return str(f, &s, &n) ? NULL : f->skip ? json_null() : json_stringn_nocheck(s, n);
  }
  case 't': return literal(f, "true", 4, json_true());
  case 'f': return literal(f, "false", 5, json_false());
  case 'n': return literal(f, "null", 4, json_null());
  default: return *f->p == '-' || (*f->p >= '0' && *f->p <= '9') ? num(f) : NULL;
  }
}

/* The value of s (an object or an array, or with any, any value). */
static json_t *load_fast(const char *s, size_t n, size_t flags, size_t *reals, int any, const char *lazy,
                         lg__json_lazy_t *lz) {
  fparse_t f = {(const unsigned char *)s, s ? (const unsigned char *)s + n : NULL, {0}, 0, /* NULL + 0 is undefined */
                (flags & JSON_REJECT_DUPLICATES) != 0, 0, lazy, lz, NULL, 0, {0, 0}, 0};
  json_t *v = NULL;
  if (s) {
    ws(&f);
    if (f.p < f.end && (any || *f.p == '{' || *f.p == '[')) v = value(&f, 1);
    ws(&f);
    if (v && f.p != f.end) { /* something after the value */
      json_decref(v);
      v = NULL;
    }
  }
  lg__buf_free(&f.tmp);
  if (v && reals) *reals = f.reals;
  return v;
}

json_t *lg__json_load_fast(const char *s, size_t n, size_t flags, size_t *reals) {
  return load_fast(s, n, flags, reals, 0, NULL, NULL);
}

/* The real numbers of a tree (a text jansson read). */
static size_t reals_of(const json_t *v) {
  size_t n = json_is_real(v);
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++) n += reals_of(json_array_get(v, i));
  const char *k;
  json_t *x;
  if (json_is_object(v)) json_object_foreach((json_t *)v, k, x) n += reals_of(x);
  return n;
}

/* The fast reader, else jansson's; a lazy member's placeholders are in
 * the tree only when the fast reader took the text. */
static json_t *load(const char *s, size_t n, size_t flags, json_error_t *je, size_t *reals,
                    const char *lazy, lg__json_lazy_t *lz) {
  lg__json_region_begin(); /* the tree in chunks (util.c): freed a thousand values at a time */
  json_t *v = load_fast(s, n, flags, reals, 0, lazy, lz);
  if (!v) {
    if (lz) lz->arr = NULL, lz->reused = 0; /* jansson's tree: whole */
    v = json_loadb(s ? s : "", n, flags, je);
    if (v && reals) *reals = reals_of(v);
  }
  lg__json_region_end();
  return v;
}

json_t *lg__json_load_flags(const char *s, size_t n, size_t flags, json_error_t *je,
                            size_t *reals) {
  return load(s, n, flags, je, reals, NULL, NULL);
}

json_t *lg__json_load(const char *s, size_t n, json_error_t *je, size_t *reals) {
  return load(s, n, 0, je, reals, NULL, NULL);
}

json_t *lg__json_load_lazy(const char *s, size_t n, const char *member, lg__json_lazy_t *lz,
                           json_error_t *je, size_t *reals) {
  lz->text = s;
  lz->arr = NULL;
  lz->n = lz->reused = 0;
  json_t *v = load(s, n, 0, je, reals, member, lz);
  if (!v || json_object_get(v, member) != lz->arr) lz->arr = NULL, lz->reused = 0; /* a repeat replaced it */
  return v;
}

json_t *lg__json_lazy_get(lg__json_lazy_t *lz, json_t *arr, size_t i) {
  json_t *v = json_array_get(arr, i);
  if (!v || arr != lz->arr || i >= lz->n || lz->span[i].built) return v;
  lg__json_region_begin();
  v = load_fast(lz->text + lz->span[i].off, lz->span[i].len, 0, NULL, 1, NULL, NULL);
  lg__json_region_end();
  if (!v || json_array_set_new(arr, i, v)) return NULL; /* out of memory: it was checked */
  lz->span[i].built = 1;
  return v;
}

int lg__json_lazy_peek(const lg__json_lazy_t *lz, const json_t *arr, size_t i, int k, const char **out) {
  if (!arr || arr != lz->arr || i >= lz->n || k < 0 || k > 1 || !lz->peek[k] || lz->span[i].state[k] == 2)
    return -1;
  *out = lz->span[i].state[k] == 1 ? lz->span[i].val[k] : NULL;
  return 0;
}

int lg__json_lazy_all(lg__json_lazy_t *lz, json_t *arr) {
  for (size_t i = 0; i < json_array_size(arr); i++)
    if (!lg__json_lazy_get(lz, arr, i)) return -1;
  return 0;
}

lg__json_prefix_t *lg__json_prefix_of(const lg__json_lazy_t *lz, size_t max) {
  if (!lz->arr || !lz->n) return NULL;
  const struct lg__json_span *last = &lz->span[lz->n - 1];
  if (sizeof(lg__json_prefix_t) + last->off + last->len + lz->n * sizeof *lz->span > max) return NULL;
  lg__json_prefix_t *p = lg__calloc(1, sizeof *p);
  if (!p) return NULL;
  p->len = last->off + last->len;
  p->at = lz->at;
  p->reals = lz->reals;
  p->n = lz->n;
  p->text = lg__malloc(p->len);
  p->span = lg__malloc(lz->n * sizeof *p->span);
  if (!p->text || !p->span) {
    lg__json_prefix_free(p);
    return NULL;
  }
  memcpy(p->text, lz->text, p->len);
  memcpy(p->span, lz->span, lz->n * sizeof *p->span);
  for (int k = 0; k < 2; k++)
    if (lz->peek[k] && strlen(lz->peek[k]) < sizeof p->peek[k]) strcpy(p->peek[k], lz->peek[k]);
    else for (size_t i = 0; i < p->n; i++) p->span[i].state[k] = 2; /* not kept: not known */
  return p;
}

int lg__json_prefix_starts(const lg__json_prefix_t *p, const char *s, size_t n) {
  return p && p->n && n >= p->len && !memcmp(s, p->text, p->len);
}

size_t lg__json_prefix_size(const lg__json_prefix_t *p) {
  return p ? sizeof *p + p->len + p->n * sizeof *p->span : 0;
}

void lg__json_prefix_free(lg__json_prefix_t *p) {
  if (!p) return;
  lg__free(p->text);
  lg__free(p->span);
  lg__free(p);
}

void lg__json_lazy_free(lg__json_lazy_t *lz) {
  lg__free(lz->span);
  lz->span = NULL;
  lz->arr = NULL;
  lz->n = lz->cap = lz->reused = 0;
}
