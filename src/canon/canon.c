/*
 * canon.c — RFC 8785 (JCS) canonical JSON and the call fingerprint, in one
 * pass over the input bytes.
 *
 * The parser is a recursive descent whose depth is capped at
 * LG_CANON_MAX_DEPTH, so hostile input cannot grow the C stack. It writes
 * the canonical form straight into an output buffer as it reads: strings are
 * re-escaped the JSON.stringify way, numbers are reformatted the ECMAScript
 * way, white space disappears. Objects are the only thing that needs a
 * second look: their members are written in input order while a small stack
 * remembers where each member starts; when the object closes and its keys
 * are not already in UTF-16 order, the members are rearranged in place
 * through a scratch buffer. Nothing is allocated per value — the buffers
 * belong to the lg_canon_t and are reused from call to call.
 *
 * One deliberate difference from RFC 8785 (docs/engine.md, "Fingerprints"): a number whose
 * exact value lies in [2^53, 10^21) is written with all its decimal digits,
 * because rounding it to a double would make two customer ids one.
 *
 * Validation happens on the way: UTF-8 (no overlongs, no surrogates, no
 * code point past U+10FFFF), escapes, the number grammar, finite numbers,
 * duplicate keys, trailing garbage. Every error reports its byte offset.
 */
#include "canon.h"

#include "../util/utf8.h"

#include <math.h>
/* SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP,
 * but they run the same SHA-NI code without EVP's dispatch: 40 ns less per
 * fingerprint, which is a sixth of the per-call budget. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>

/* Where a member of an object being parsed lies in the output. */
typedef struct member {
  size_t key;   /* offset of the key's opening quote */
  size_t colon; /* offset of the ':' after the key */
  size_t end;   /* offset just past the value */
  size_t src;   /* offset of the key's opening quote in the input */
  uint64_t k8;  /* plain keys: the first 8 bytes, big-endian, zero-padded */
  bool plain;   /* key is ASCII without escapes: memcmp orders it */
  bool keep;    /* false: not a loop-key field, dropped when sorted */
} member_t;

struct lg_canon {
  lg__buf_t out;      /* canonical output of the current call */
  lg__buf_t scratch;  /* where members are copied while being sorted */
  lg__buf_t tmp;      /* decoded strings for the normalizers */
  member_t *mem;      /* member stack shared by all nesting levels */
  size_t nmem, capmem;

};

/* Parser state for one input text. */
typedef struct parser {
  lg_canon_t *c;
  const unsigned char *s; /* input */
  size_t n;               /* its length */
  size_t i;               /* read position */
  lg_error_t *err;
  const lg__toolpol_t *select; /* depth 0: keep only these fields */
} parser_t;

static int perr(parser_t *p, int code, const char *what) {
  return lg__err(p->err, code, NULL, (long)p->i, "%s", what);
}

lg_canon_t *lg_canon_new(void) {
  lg_canon_t *c = lg__calloc(1, sizeof *c);
  if (!c) return NULL;
  if (lg__buf_reserve(&c->out, 1024)) {
    lg_canon_free(c);
    return NULL;
  }
  return c;
}

void lg_canon_free(lg_canon_t *c) {
  if (!c) return;
  lg__buf_free(&c->out);
  lg__buf_free(&c->scratch);
  lg__buf_free(&c->tmp);
  lg__free(c->mem);
  lg__free(c);
}

/* ------------------------------------------------------------------ */
/* Output helpers. The caller reserved room: strings and punctuation   */
/* never come out longer than they went in (see lg_canon_json).        */

static inline void put(lg_canon_t *c, char ch) { c->out.data[c->out.len++] = ch; }
static inline void putn(lg_canon_t *c, const void *p, size_t n) {
  memcpy(c->out.data + c->out.len, p, n);
  c->out.len += n;
}

static inline void skip_ws(parser_t *p) {
  /* Locals, not p->i: the compiler must assume that every byte written
   * through a char pointer may change *p, and would reload it. */
  const unsigned char *s = p->s;
  size_t i = p->i, n = p->n;
  while (i < n) {
    unsigned char ch = s[i];
    if (ch > ' ' || (ch != ' ' && ch != '\n' && ch != '\r' && ch != '\t')) break;
    i++;
  }
  p->i = i;
}

static void put_utf8(lg_canon_t *c, uint32_t cp) {
  char u[4];
  putn(c, u, lg__utf8_put(cp, u));
}

/* Writes one code point (or lone surrogate) the way JSON.stringify does. */
static void put_char(lg_canon_t *c, uint32_t cp) {
  const char *hex = lg__hex_digits;
  switch (cp) {
  case '"': putn(c, "\\\"", 2); return;
  case '\\': putn(c, "\\\\", 2); return;
  case '\b': putn(c, "\\b", 2); return;
  case '\f': putn(c, "\\f", 2); return;
  case '\n': putn(c, "\\n", 2); return;
  case '\r': putn(c, "\\r", 2); return;
  case '\t': putn(c, "\\t", 2); return;
  }
  if (cp < 0x20 || (cp >= 0xD800 && cp <= 0xDFFF)) {
    char e[6] = {'\\', 'u', hex[(cp >> 12) & 15], hex[(cp >> 8) & 15],
                 hex[(cp >> 4) & 15], hex[cp & 15]};
    putn(c, e, 6);
    return;
  }
  put_utf8(c, cp);
}

static int read_u4(parser_t *p, uint32_t *out) {
  if (p->n - p->i < 4) return perr(p, LG_EPARSE, "truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    int h = lg__hexval(p->s[p->i + (size_t)k]);
    if (h < 0) return perr(p, LG_EPARSE, "bad hex digit in \\u escape");
    v = (v << 4) | (uint32_t)h;
  }
  p->i += 4;
  *out = v;
  return 0;
}

/* Parses a string at p->i (its opening quote) and writes it canonically.
 * *plain is set when the string is printable ASCII with no escapes. */
static int cv_string(parser_t *p, bool *plain) {
  lg_canon_t *c = p->c;
  bool pl = true;
  p->i++; /* the quote */
  put(c, '"');
  for (;;) {
    size_t start = p->i, i = p->i, n = p->n;
    const unsigned char *s = p->s;
    /* The common case: a run of printable ASCII that needs no change. */
    i = lg__str_plain_end(s, i, n);
    p->i = i;
    putn(c, s + start, i - start);
    if (p->i >= p->n) return perr(p, LG_EPARSE, "unterminated string");
    unsigned char ch = p->s[p->i];
    if (ch == '"') {
      p->i++;
      put(c, '"');
      if (plain) *plain = pl;
      return 0;
    }
    pl = false;
    if (ch < 0x20) return perr(p, LG_EPARSE, "control character in string");
    if (ch >= 0x80) {
      size_t l = lg__utf8_len(p->s + p->i, p->n - p->i);
      if (!l) return perr(p, LG_EUTF8, "invalid UTF-8");
      putn(c, p->s + p->i, l);
      p->i += l;
      continue;
    }
    /* A backslash escape. */
    if (p->i + 1 >= p->n) return perr(p, LG_EPARSE, "unterminated string");
    unsigned char e = p->s[p->i + 1];
    p->i += 2;
    switch (e) {
    case '"': put_char(c, '"'); continue;
    case '\\': put_char(c, '\\'); continue;
    case '/': put(c, '/'); continue;
    case 'b': put_char(c, '\b'); continue;
    case 'f': put_char(c, '\f'); continue;
    case 'n': put_char(c, '\n'); continue;
    case 'r': put_char(c, '\r'); continue;
    case 't': put_char(c, '\t'); continue;
    case 'u': break;
    default:
      p->i -= 2;
      return perr(p, LG_EPARSE, "unknown escape in string");
    }
    uint32_t u;
    int rc = read_u4(p, &u);
    if (rc) return rc;
    if (u >= 0xD800 && u <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
        p->s[p->i + 1] == 'u') {
      size_t save = p->i;
      p->i += 2;
      uint32_t lo;
      rc = read_u4(p, &lo);
      if (rc) return rc;
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        put_utf8(c, 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00));
        continue;
      }
      p->i = save; /* a lone high surrogate followed by another escape */
    }
    put_char(c, u);
  }
}

/* ------------------------------------------------------------------ */
/* Numbers.                                                            */

#define MAX_SIG 64 /* significant digits kept for exact forms */

/* ECMAScript Number::toString from digits d[0..k) and point position n
 * (value = 0.d × 10^n), with sign. */
static void es_format(lg_canon_t *c, bool neg, const char *d, int k, int n) {
  if (neg) put(c, '-');
  if (k <= n && n <= 21) {
    putn(c, d, (size_t)k);
    for (int z = k; z < n; z++) put(c, '0');
  } else if (0 < n && n <= 21) {
    putn(c, d, (size_t)n);
    put(c, '.');
    putn(c, d + n, (size_t)(k - n));
  } else if (-6 < n && n <= 0) {
    putn(c, "0.", 2);
    for (int z = 0; z < -n; z++) put(c, '0');
    putn(c, d, (size_t)k);
  } else {
    int e = n - 1;
    put(c, d[0]);
    if (k > 1) {
      put(c, '.');
      putn(c, d + 1, (size_t)(k - 1));
    }
    char buf[16];
    int bl = snprintf(buf, sizeof buf, "e%c%d", e >= 0 ? '+' : '-', e >= 0 ? e : -e);
    putn(c, buf, (size_t)bl);
  }
}

/* Splits "D.DDDe±X" (from %e) into its digits and its exponent. */
static int split_e(const char *buf, char *d, int *e) {
  int k = 0;
  const char *q = buf;
  for (; *q && *q != 'e'; q++)
    if (*q >= '0' && *q <= '9') d[k++] = *q;
  *e = atoi(q + 1);
  return k;
}

/* Reads digits d[0..k) × 10^(e-k+1) back as a double. */
static double read_back(const char *d, int k, int e) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.*se%d", k, d, e - k + 1);
  return strtod(buf, NULL);
}

/* Shortest round-trip digits of a finite non-zero double; among several
 * of that length, the closest to v (ECMAScript Number::toString). For each
 * length the correctly rounded candidate comes first. When it does not
 * read back as v, its neighbour on the other side of v is tried too: just
 * above a power of two the doubles below v are closer together than those
 * above, so the rounded candidate can miss v's rounding interval while the
 * neighbour lands in it (2^-1017 is 7.120236347223045e-307, not the
 * 17-digit form). 17 digits always read back. */
static void shortest_digits(double v, char *d, int *k, int *n) {
  double a = fabs(v);
  char buf[40], nd[20];
  int kk = 0, e = 0;
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec - 1, a);
    kk = split_e(buf, d, &e);
    double r = strtod(buf, NULL);
    if (r == a || prec == 17) break;
    int ne = e;
    memcpy(nd, d, (size_t)kk);
    int j = kk - 1;
    if (r < a) { /* one unit up, with carry */
      while (j >= 0 && nd[j] == '9') nd[j--] = '0';
      if (j >= 0) {
        nd[j]++;
      } else { /* 99…9 + 1 = 100…0: one more power of ten */
        nd[0] = '1';
        ne++;
      }
    } else { /* one unit down, with borrow */
      while (j >= 0 && nd[j] == '0') nd[j--] = '9';
      if (j < 0) continue; /* never: d[0] is not '0' */
      nd[j]--;
      if (nd[0] == '0') continue; /* that is a shorter form, tried before */
    }
    if (read_back(nd, kk, ne) == a) {
      memcpy(d, nd, (size_t)kk);
      e = ne;
      break;
    }
  }
  while (kk > 1 && d[kk - 1] == '0') kk--;
  *k = kk;
  *n = e + 1;
}

/* A number literal as read: its significant digits (trailing zeros not
 * kept), and where the point goes. value = 0.d × 10^n, with
 * n = (nint > 0 ? nint : -lead_frac) + exp. */
typedef struct number {
  bool neg;
  char *d;           /* MAX_SIG bytes (the caller's: the struct stays in registers) */
  int k;             /* significant digits kept */
  bool more;         /* a non-zero digit beyond MAX_SIG */
  long nint;         /* integer-part digits after the first non-zero */
  long lead_frac;    /* zeros after the point before the first non-zero */
  bool seen_nz;
  int zeros_pending; /* zeros since the last non-zero digit (not kept) */
  long exp;
  bool exp_huge;     /* |exponent| too large to track: strtod decides */
} number_t;

static inline bool is_digit_at(const parser_t *p) {
  return p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9';
}

/* A significant digit after the first non-zero one: a zero waits (it is
 * kept only if a non-zero digit follows), a non-zero one is kept with the
 * zeros before it. */
static inline void keep_digit(number_t *m, char ch) {
  if (ch == '0') {
    m->zeros_pending++;
    return;
  }
  for (; m->zeros_pending; m->zeros_pending--)
    if (m->k < MAX_SIG) m->d[m->k++] = '0'; else m->more = true;
  if (m->k < MAX_SIG) m->d[m->k++] = ch; else m->more = true;
}

/* The literal's grammar (RFC 8259): -? (0 | [1-9][0-9]*) (. [0-9]+)?
 * ([eE] [+-]? [0-9]+)?, read into m. */
static inline int read_number(parser_t *p, number_t *m) {
  if (p->s[p->i] == '-') {
    m->neg = true;
    p->i++;
  }
  if (!is_digit_at(p)) return perr(p, LG_EPARSE, "expected a digit");
  if (p->s[p->i] == '0') {
    p->i++;
    if (is_digit_at(p)) return perr(p, LG_EPARSE, "leading zero in number");
  } else {
    while (is_digit_at(p)) {
      m->seen_nz = true;
      m->nint++;
      keep_digit(m, (char)p->s[p->i++]);
    }
  }
  if (p->i < p->n && p->s[p->i] == '.') {
    p->i++;
    if (!is_digit_at(p)) return perr(p, LG_EPARSE, "expected a digit after '.'");
    while (is_digit_at(p)) {
      char ch = (char)p->s[p->i++];
      if (!m->seen_nz) {
        if (ch == '0') {
          m->lead_frac++;
          continue;
        }
        m->seen_nz = true;
      }
      keep_digit(m, ch);
    }
  }
  if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    p->i++;
    bool eneg = false;
    if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) eneg = p->s[p->i++] == '-';
    if (!is_digit_at(p)) return perr(p, LG_EPARSE, "expected a digit in the exponent");
    while (is_digit_at(p)) {
      if (m->exp < 100000000) m->exp = m->exp * 10 + (p->s[p->i] - '0');
      else m->exp_huge = true;
      p->i++;
    }
    if (eneg) m->exp = -m->exp;
  }
  return 0;
}

/* An integer from 2^53 to 10^21 (n digits before the point) is written
 * exactly, all its digits and no exponent; returns false when m is not
 * one (below 2^53 the shortest form is the same digits anyway). */
static inline bool put_exact_int(lg_canon_t *c, const number_t *m, long n) {
  if (m->more || m->exp_huge || n < 16 || n > 21) return false;
  if (n == 16) {
    char pad[16];
    for (int z = 0; z < 16; z++) pad[z] = z < m->k ? m->d[z] : '0';
    if (memcmp(pad, "9007199254740992", 16) < 0) return false;
  }
  if (m->neg) put(c, '-');
  int ni = (int)n;
  putn(c, m->d, (size_t)(m->k < ni ? m->k : ni));
  for (int z = m->k; z < ni; z++) put(c, '0');
  if (m->k > ni) {
    put(c, '.');
    putn(c, m->d + ni, (size_t)(m->k - ni));
  }
  return true;
}

/* The general case: the literal s[start..p->i) rounded to a double, then
 * written with that double's shortest round-trip digits. */
static int put_via_double(parser_t *p, const number_t *m, size_t start) {
  lg_canon_t *c = p->c;
  size_t len = p->i - start;
  char stackbuf[128];
  char *lit = len < sizeof stackbuf ? stackbuf : lg__malloc(len + 1);
  if (!lit) return perr(p, LG_ENOMEM, "out of memory");
  memcpy(lit, p->s + start, len);
  lit[len] = 0;
  double v = strtod(lit, NULL);
  if (lit != stackbuf) lg__free(lit);
  if (!isfinite(v)) {
    p->i = start;
    return perr(p, LG_ERANGE, "number out of range");
  }
  if (v == 0) {
    put(c, '0');
    return 0;
  }
  char sd[20];
  int sk, sn;
  shortest_digits(v, sd, &sk, &sn);
  es_format(c, m->neg, sd, sk, sn);
  return 0;
}

/* A number, canonical (RFC 8785: the shortest digits that round-trip
 * through a double, in ECMAScript's form), beyond 2^53 exact. */
static int cv_number(parser_t *p) {
  lg_canon_t *c = p->c;
  size_t start = p->i;
  char digits[MAX_SIG];
  number_t m;
  m.d = digits;
  m.neg = m.more = m.seen_nz = m.exp_huge = false;
  m.k = m.zeros_pending = 0;
  m.nint = m.lead_frac = m.exp = 0;
  int rc = read_number(p, &m);
  if (rc) return rc;
  /* A number can come out longer than it went in ("1e20" is 21 digits),
   * which would eat the room lg_canon_json reserved for the rest of the
   * input, so the rest of the input is reserved again here. */
  size_t need = (p->n - p->i) + 128 + MAX_SIG;
  if (c->out.len + need >= c->out.cap && lg__buf_reserve(&c->out, need))
    return perr(p, LG_ENOMEM, "out of memory");
  if (m.k == 0) { /* zero, whatever its sign or form */
    put(c, '0');
    return 0;
  }
  long n = (m.nint > 0 ? m.nint : -m.lead_frac) + m.exp;
  if (put_exact_int(c, &m, n)) return 0;
  if (!m.more && !m.exp_huge && m.k <= 15 && n > -300 && n < 300) {
    /* Up to 15 significant digits survive the trip through a double
     * unchanged, so they are already the shortest round-trip digits. */
    es_format(c, m.neg, m.d, m.k, (int)n);
    return 0;
  }
  return put_via_double(p, &m, start);
}

/* ------------------------------------------------------------------ */
/* Object key order: UTF-16 code units of the decoded keys (RFC 8785).  */

/* Reads the next UTF-16 unit of a canonical string body; *pend carries a
 * low surrogate still to come. Returns -1 at the end. */
static int32_t next_unit(const unsigned char *s, size_t n, size_t *i,
                         int32_t *pend) {
  if (*pend >= 0) {
    int32_t u = *pend;
    *pend = -1;
    return u;
  }
  if (*i >= n) return -1;
  unsigned char b = s[*i];
  if (b == '\\') {
    unsigned char e = s[*i + 1];
    *i += 2;
    switch (e) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': {
      uint32_t v = 0; /* canonical text: four hex digits */
      for (int k = 0; k < 4; k++) v = (v << 4) | (uint32_t)lg__hexval(s[*i + (size_t)k]);
      *i += 4;
      return (int32_t)(v & 0xFFFF);
    }
    default: return e; /* '"' or '\\' */
    }
  }
  if (b < 0x80) {
    (*i)++;
    return b;
  }
  uint32_t cp;
  if (b < 0xE0) {
    cp = ((uint32_t)(b & 0x1F) << 6) | (s[*i + 1] & 0x3F);
    *i += 2;
  } else if (b < 0xF0) {
    cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[*i + 1] & 0x3F) << 6) |
         (s[*i + 2] & 0x3F);
    *i += 3;
  } else {
    cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[*i + 1] & 0x3F) << 12) |
         ((uint32_t)(s[*i + 2] & 0x3F) << 6) | (s[*i + 3] & 0x3F);
    *i += 4;
  }
  if (cp >= 0x10000) {
    cp -= 0x10000;
    *pend = (int32_t)(0xDC00 + (cp & 0x3FF));
    return (int32_t)(0xD800 + (cp >> 10));
  }
  return (int32_t)cp;
}

/* Compares the keys of two members (canonical strings in buf). */
static inline int key_cmp_slow(const char *buf, const member_t *a, const member_t *b);

/* Compares the keys of two members: most keys differ in their first eight
 * bytes, which for plain keys are compared as one integer. */
static inline int key_cmp(const char *buf, const member_t *a, const member_t *b) {
  if (a->plain && b->plain && a->k8 != b->k8) return a->k8 < b->k8 ? -1 : 1;
  return key_cmp_slow(buf, a, b);
}

static inline int key_cmp_slow(const char *buf, const member_t *a, const member_t *b) {
  const unsigned char *ka = (const unsigned char *)buf + a->key + 1;
  const unsigned char *kb = (const unsigned char *)buf + b->key + 1;
  size_t la = a->colon - a->key - 2, lb = b->colon - b->key - 2;
  if (a->plain && b->plain) { /* short ASCII keys: inline, no libc call */
    size_t m = la < lb ? la : lb;
    for (size_t i = 0; i < m; i++)
      if (ka[i] != kb[i]) return ka[i] < kb[i] ? -1 : 1;
    return la < lb ? -1 : la > lb;
  }
  size_t ia = 0, ib = 0;
  int32_t pa = -1, pb = -1;
  for (;;) {
    int32_t ua = next_unit(ka, la, &ia, &pa);
    int32_t ub = next_unit(kb, lb, &ib, &pb);
    if (ua != ub) return ua < ub ? -1 : 1;
    if (ua < 0) return 0;
  }
}

/* The error for two members with the same key: the offset is the later
 * one's in the input. */
static int dup_key(parser_t *p, const member_t *a, const member_t *b) {
  size_t at = a->src > b->src ? a->src : b->src;
  return lg__err(p->err, LG_EDUPKEY, NULL, (long)at,
                 "duplicate key in object at byte offset %zu", at);
}

/* Makes room for `extra` more members on the member stack. */
static int reserve_members(parser_t *p, size_t extra) {
  lg_canon_t *c = p->c;
  if (c->capmem - c->nmem >= extra) return 0;
  size_t cap = c->capmem ? c->capmem : 32;
  while (cap - c->nmem < extra) {
    if (cap > SIZE_MAX / 2 / sizeof(member_t)) return perr(p, LG_ENOMEM, "out of memory");
    cap *= 2;
  }
  member_t *nm = lg__realloc(c->mem, cap * sizeof *nm);
  if (!nm) return perr(p, LG_ENOMEM, "out of memory");
  c->mem = nm;
  c->capmem = cap;
  return 0;
}

static int push_member(parser_t *p, member_t m) {
  lg_canon_t *c = p->c;
  if (c->nmem == c->capmem) {
    int rc = reserve_members(p, 1);
    if (rc) return rc;
  }
  c->mem[c->nmem++] = m;
  return 0;
}

/* Stable bottom-up merge sort of m[0..cnt) by key, with tmp[0..cnt) as
 * scratch. Equal keys end up side by side, in input order. */
static void merge_sort(const char *buf, member_t *m, member_t *tmp, size_t cnt) {
  member_t *from = m, *to = tmp;
  for (size_t w = 1; w < cnt; w *= 2) {
    for (size_t lo = 0; lo < cnt; lo += 2 * w) {
      size_t mid = lo + w < cnt ? lo + w : cnt, hi = lo + 2 * w < cnt ? lo + 2 * w : cnt;
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi)
        to[k++] = key_cmp(buf, &from[j], &from[i]) < 0 ? from[j++] : from[i++];
      while (i < mid) to[k++] = from[i++];
      while (j < hi) to[k++] = from[j++];
    }
    member_t *t = from;
    from = to;
    to = t;
  }
  if (from != m) memcpy(m, from, cnt * sizeof *m);
}

/* Puts the members base..nmem of the object that starts at `open` (its
 * '{') in key order, leaves out the members that are not kept (fields a
 * loop key does not select) and rejects duplicate keys, kept or not: the
 * same arguments must be valid or invalid whatever the policy. */
static int sort_members(parser_t *p, size_t open, size_t base) {
  lg_canon_t *c = p->c;
  member_t *m = c->mem + base;
  size_t cnt = c->nmem - base;
  bool sorted = true, drops = cnt && !m[0].keep;
  for (size_t i = 1; i < cnt; i++) {
    int r = key_cmp(c->out.data, &m[i - 1], &m[i]);
    if (r == 0) return dup_key(p, &m[i - 1], &m[i]);
    if (r > 0) sorted = false;
    if (!m[i].keep) drops = true;
  }
  if (sorted && !drops) return 0;
  if (!sorted && cnt > 16) {
    /* A big object (hostile input, most likely): a merge sort, so that
     * 50,000 keys in reverse order cost milliseconds and not seconds. The
     * scratch space is the free end of the member stack. */
    int rc = reserve_members(p, cnt);
    if (rc) return rc;
    m = c->mem + base;
    merge_sort(c->out.data, m, c->mem + c->nmem, cnt);
    for (size_t i = 1; i < cnt; i++)
      if (key_cmp(c->out.data, &m[i - 1], &m[i]) == 0) return dup_key(p, &m[i - 1], &m[i]);
  } else if (!sorted) {
    /* Insertion sort: objects are small, and this keeps it stable. */
    /* Equal keys would meet as neighbours, so the comparison that stops
     * an insertion finds every duplicate. */
    for (size_t i = 1; i < cnt; i++) {
      member_t x = m[i];
      size_t j = i;
      int r = 1;
      while (j > 0 && (r = key_cmp(c->out.data, &m[j - 1], &x)) > 0) {
        m[j] = m[j - 1];
        j--;
      }
      m[j] = x;
      if (r == 0) return dup_key(p, &m[j - 1], &m[j]);
    }
  }
  size_t body = open + 1, total = c->out.len - body;
  c->scratch.len = 0;
  if (lg__buf_append(&c->scratch, c->out.data + body, total))
    return perr(p, LG_ENOMEM, "out of memory");
  size_t w = body;
  for (size_t i = 0; i < cnt; i++) {
    if (!m[i].keep) continue;
    if (w != body) c->out.data[w++] = ',';
    size_t len = m[i].end - m[i].key;
    memcpy(c->out.data + w, c->scratch.data + (m[i].key - body), len);
    w += len;
  }
  c->out.len = w;
  return 0;
}

static int cv_value(parser_t *p, int depth);
static int apply_norms(parser_t *p, const lg__keyfield_t *f, size_t vstart);

/* Sets *out to the field of p->select named by the key at out[key..colon),
 * or NULL. Fails only when out of memory. */
static int selected(parser_t *p, const member_t *m, const lg__keyfield_t **out) {
  const char *k = p->c->out.data + m->key + 1;
  *out = NULL;
  size_t kl = m->colon - m->key - 2;
  for (int i = 0; i < p->select->nfields; i++) {
    const lg__keyfield_t *f = &p->select->fields[i];
    if (m->plain) {
      if (f->name_len == kl && memcmp(f->name, k, kl) == 0) {
        *out = f;
        return 0;
      }
      continue;
    }
    /* Compare decoded forms: re-encode the field name canonically. */
    size_t save = p->c->out.len;
    if (lg__buf_reserve(&p->c->out, f->name_len * 6 + 2))
      return perr(p, LG_ENOMEM, "out of memory");
    const unsigned char *s = (const unsigned char *)f->name;
    for (size_t j = 0; j < f->name_len;) {
      size_t l = lg__utf8_len(s + j, f->name_len - j);
      if (!l) break;
      uint32_t cp = s[j];
      if (l == 2) cp = ((uint32_t)(s[j] & 0x1F) << 6) | (s[j + 1] & 0x3F);
      if (l == 3)
        cp = ((uint32_t)(s[j] & 0x0F) << 12) | ((uint32_t)(s[j + 1] & 0x3F) << 6) |
             (s[j + 2] & 0x3F);
      if (l == 4)
        cp = ((uint32_t)(s[j] & 0x07) << 18) | ((uint32_t)(s[j + 1] & 0x3F) << 12) |
             ((uint32_t)(s[j + 2] & 0x3F) << 6) | (s[j + 3] & 0x3F);
      put_char(p->c, cp);
      j += l;
    }
    bool eq = p->c->out.len - save == kl &&
              memcmp(p->c->out.data + save, p->c->out.data + m->key + 1, kl) == 0;
    p->c->out.len = save;
    if (eq) {
      *out = f;
      return 0;
    }
  }
  return 0;
}

static int cv_object(parser_t *p, int depth) {
  lg_canon_t *c = p->c;
  const lg__toolpol_t *select = depth == 1 ? p->select : NULL;
  size_t open = c->out.len;
  size_t base = c->nmem;
  put(c, '{');
  p->i++;
  skip_ws(p);
  if (p->i < p->n && p->s[p->i] == '}') {
    p->i++;
    put(c, '}');
    return 0;
  }
  for (bool first = true;; first = false) {
    skip_ws(p);
    if (p->i >= p->n || p->s[p->i] != '"')
      return perr(p, LG_EPARSE, "expected a string key");
    if (!first) put(c, ',');
    member_t m;
    m.key = c->out.len;
    m.src = p->i;
    int rc = cv_string(p, &m.plain);
    if (rc) return rc;
    m.k8 = 0;
    if (m.plain) { /* the key's first 8 bytes as a big-endian number */
      const unsigned char *k = (const unsigned char *)c->out.data + m.key + 1;
      size_t kl = c->out.len - m.key - 2;
      /* Eight bytes from k are inside the buffer (lg_canon_json reserved
       * 64 bytes past the input's length); those past the key are masked. */
      uint64_t v;
      memcpy(&v, k, 8);
      v = __builtin_bswap64(v);
      m.k8 = kl >= 8 ? v : kl ? v & (~UINT64_C(0) << (8 * (8 - kl))) : 0;
    }
    skip_ws(p);
    if (p->i >= p->n || p->s[p->i] != ':')
      return perr(p, LG_EPARSE, "expected ':' after key");
    p->i++;
    m.colon = c->out.len;
    put(c, ':');
    size_t vstart = c->out.len;
    rc = cv_value(p, depth);
    if (rc) return rc;
    m.end = c->out.len;
    m.keep = true;
    if (select) {
      /* A field the loop key does not select stays until the object
       * closes, so that its key is still checked for duplicates; then
       * sort_members leaves it out. */
      const lg__keyfield_t *f;
      if ((rc = selected(p, &m, &f))) return rc;
      m.keep = f != NULL;
      if (f && f->nnorms && c->out.data[vstart] == '"') {
        rc = apply_norms(p, f, vstart);
        if (rc) return rc;
        m.end = c->out.len;
      }
    }
    if ((rc = push_member(p, m))) return rc;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == '}') {
      p->i++;
      break;
    }
    return perr(p, LG_EPARSE, "expected ',' or '}' in object");
  }
  int rc = sort_members(p, open, base);
  c->nmem = base;
  if (rc) return rc;
  put(c, '}');
  return 0;
}

static int cv_array(parser_t *p, int depth) {
  lg_canon_t *c = p->c;
  put(c, '[');
  p->i++;
  skip_ws(p);
  if (p->i < p->n && p->s[p->i] == ']') {
    p->i++;
    put(c, ']');
    return 0;
  }
  for (bool first = true;; first = false) {
    if (!first) put(c, ',');
    int rc = cv_value(p, depth);
    if (rc) return rc;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == ']') {
      p->i++;
      put(c, ']');
      return 0;
    }
    return perr(p, LG_EPARSE, "expected ',' or ']' in array");
  }
}

static int cv_literal(parser_t *p, const char *word, size_t len) {
  if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0)
    return perr(p, LG_EPARSE, "unexpected character");
  putn(p->c, word, len);
  p->i += len;
  return 0;
}

static int cv_value(parser_t *p, int depth) {
  skip_ws(p);
  if (p->i >= p->n) return perr(p, LG_EPARSE, "unexpected end of input");
  switch (p->s[p->i]) {
  case '{':
    if (depth >= LG_CANON_MAX_DEPTH)
      return perr(p, LG_EDEPTH, "nesting deeper than 64 levels");
    return cv_object(p, depth + 1);
  case '[':
    if (depth >= LG_CANON_MAX_DEPTH)
      return perr(p, LG_EDEPTH, "nesting deeper than 64 levels");
    return cv_array(p, depth + 1);
  case '"': return cv_string(p, NULL);
  case 't': return cv_literal(p, "true", 4);
  case 'f': return cv_literal(p, "false", 5);
  case 'n': return cv_literal(p, "null", 4);
  default:
    if (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))
      return cv_number(p);
    return perr(p, LG_EPARSE, "unexpected character");
  }
}

/* ------------------------------------------------------------------ */
/* Normalizers. The canonical string at out[vstart..] is decoded into  */
/* tmp (lone surrogates as 3-byte sequences), transformed, and written  */
/* back canonically in its place.                                       */

static bool is_space(unsigned char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' ||
         ch == '\v';
}

static int apply_norms(parser_t *p, const lg__keyfield_t *f, size_t vstart) {
  lg_canon_t *c = p->c;
  const unsigned char *s = (const unsigned char *)c->out.data + vstart + 1;
  size_t n = c->out.len - vstart - 2, i = 0;
  c->tmp.len = 0;
  if (lg__buf_reserve(&c->tmp, n + 4)) return perr(p, LG_ENOMEM, "out of memory");
  /* Decode: canonical strings hold raw UTF-8 and a few escapes. */
  unsigned char *t = (unsigned char *)c->tmp.data;
  size_t tl = 0;
  while (i < n) {
    if (s[i] != '\\') {
      t[tl++] = s[i++];
      continue;
    }
    int32_t pend = -1;
    int32_t u = next_unit(s, n, &i, &pend);
    if (u < 0x80) {
      t[tl++] = (unsigned char)u;
    } else { /* a lone surrogate: keep it as its 3-byte form */
      t[tl++] = (unsigned char)(0xE0 | (u >> 12));
      t[tl++] = (unsigned char)(0x80 | ((u >> 6) & 0x3F));
      t[tl++] = (unsigned char)(0x80 | (u & 0x3F));
    }
  }
  for (int k = 0; k < f->nnorms; k++) {
    size_t w = 0;
    switch (f->norms[k]) {
    case LG__NORM_LOWER: /* ASCII letters only: no locale, no tables */
      for (size_t j = 0; j < tl; j++)
        if (t[j] >= 'A' && t[j] <= 'Z') t[j] = (unsigned char)(t[j] + 32);
      break;
    case LG__NORM_UPPER:
      for (size_t j = 0; j < tl; j++)
        if (t[j] >= 'a' && t[j] <= 'z') t[j] = (unsigned char)(t[j] - 32);
      break;
    case LG__NORM_TRIM: {
      size_t a = 0, b = tl;
      while (a < b && is_space(t[a])) a++;
      while (b > a && is_space(t[b - 1])) b--;
      memmove(t, t + a, b - a);
      tl = b - a;
      break;
    }
    case LG__NORM_COLLAPSE_SPACE:
      for (size_t j = 0; j < tl; j++) {
        if (is_space(t[j])) {
          if (w == 0 || t[w - 1] != ' ') t[w++] = ' ';
        } else {
          t[w++] = t[j];
        }
      }
      tl = w;
      break;
    case LG__NORM_DIGITS:
      for (size_t j = 0; j < tl; j++)
        if (t[j] >= '0' && t[j] <= '9') t[w++] = t[j];
      tl = w;
      break;
    case LG__NORM_STRIP_PREFIX: {
      size_t pl = strlen(f->prefix[k]);
      if (pl <= tl && memcmp(t, f->prefix[k], pl) == 0) {
        memmove(t, t + pl, tl - pl);
        tl -= pl;
      }
      break;
    }
    }
  }
  /* Re-encode in place: the result is never longer than 6 bytes a byte. */
  c->out.len = vstart;
  if (lg__buf_reserve(&c->out, tl * 6 + 2)) return perr(p, LG_ENOMEM, "out of memory");
  put(c, '"');
  for (size_t j = 0; j < tl;) {
    unsigned char b = t[j];
    if (b < 0x80) {
      put_char(c, b);
      j++;
      continue;
    }
    size_t l = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    if (l == 3 && b == 0xED && j + 1 < tl && t[j + 1] >= 0xA0) {
      uint32_t u = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(t[j + 1] & 0x3F) << 6) |
                   (t[j + 2] & 0x3F);
      put_char(c, u);
    } else {
      putn(c, t + j, l);
    }
    j += l;
  }
  put(c, '"');
  return 0;
}

/* ------------------------------------------------------------------ */

/* Canonicalises the value at json[0..); with `whole`, nothing but white
 * space may follow it. */
static int canon_value_at(lg_canon_t *c, const char *json, size_t len,
                          const lg__toolpol_t *select, bool whole, size_t *end,
                          lg_error_t *err) {
  parser_t p = {c, (const unsigned char *)json, len, 0, err, select};
  c->out.len = 0;
  c->nmem = 0;
  /* An allocation that failed in an earlier call left its buffer as it
   * was (lg__buf_t keeps the failure sticky): this call may try again. */
  c->out.oom = c->scratch.oom = c->tmp.oom = false;
  if (lg__buf_reserve(&c->out, len + 64))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  skip_ws(&p);
  if (select && (p.i >= p.n || p.s[p.i] != '{'))
    return perr(&p, LG_EINVAL,
                "arguments must be a JSON object to select loop-key fields");
  int rc = cv_value(&p, 0);
  if (rc) return rc;
  if (end) *end = p.i;
  if (whole) {
    skip_ws(&p);
    if (p.i != p.n) return perr(&p, LG_EPARSE, "unexpected data after the JSON value");
  }
  c->out.data[c->out.len] = 0;
  return 0;
}

static int canon_run(lg_canon_t *c, const char *json, size_t len,
                     const lg__toolpol_t *select, lg_error_t *err) {
  return canon_value_at(c, json, len, select, true, NULL, err);
}

int lg__canon_prefix(lg_canon_t *c, const char *s, size_t n, const lg__toolpol_t *select,
                     size_t *end, lg_error_t *err) {
  return canon_value_at(c, s, n, select, false, end, err);
}

const char *lg__canon_output(const lg_canon_t *c, size_t *len) {
  *len = c->out.len;
  return c->out.data;
}

const lg__toolpol_t *lg__canon_select(const lg_policy_t *policy, const char *tool) {
  const lg__toolpol_t *tp = policy ? lg__policy_tool(policy, tool) : NULL;
  return tp && tp->key_mode == LG__KEY_FIELDS ? tp : NULL;
}

int lg_canon_json(lg_canon_t *c, const char *json, size_t len,
                  const char **out, size_t *out_len, lg_error_t *err) {
  if (!c || (!json && len)) return lg__err(err, LG_EINVAL, NULL, -1, "no input");
  int rc = canon_run(c, json ? json : "", len, NULL, err);
  if (rc) return rc;
  *out = c->out.data;
  *out_len = c->out.len;
  return 0;
}

static void to_hex(const unsigned char *md, char hex[LG_FP_HEX]) { lg__hex(md, 32, hex); }

/* SHA-256 over a + ("\n" + b when b is given), as hex. */
static int sha_parts(lg_canon_t *c, const char *a, size_t al, const char *b,
                     size_t bl, char hex[LG_FP_HEX]) {
  (void)c;
  unsigned char md[32];
  SHA256_CTX ctx;
  if (!SHA256_Init(&ctx) || !SHA256_Update(&ctx, a, al) ||
      (b && (!SHA256_Update(&ctx, "\n", 1) || !SHA256_Update(&ctx, b, bl))) ||
      !SHA256_Final(md, &ctx))
    return LG_ENOMEM;
  to_hex(md, hex);
  return 0;
}

int lg__canon_fp(lg_canon_t *c, const char *tool, char hex[LG_FP_HEX]) {
  return sha_parts(c, tool, strlen(tool), c->out.data, c->out.len, hex);
}

int lg__canon_fp_of(lg_canon_t *c, const char *tool, const char *km, size_t kml,
                    char hex[LG_FP_HEX]) {
  return sha_parts(c, tool, strlen(tool), km, kml, hex);
}

int lg_canon_sha256_hex(lg_canon_t *c, const char *bytes, size_t len,
                        char hex[LG_FP_HEX]) {
  if (!c) return LG_EINVAL;
  return sha_parts(c, bytes, len, NULL, 0, hex);
}

int lg_canon_fingerprint(lg_canon_t *c, const lg_policy_t *policy,
                         const char *tool, const char *args, size_t args_len,
                         char hex[LG_FP_HEX], const char **key_material,
                         size_t *km_len, lg_error_t *err) {
  if (!c || !tool) return lg__err(err, LG_EINVAL, "tool", -1, "a call needs a tool name");
  if (!args) {
    args = "{}";
    args_len = 2;
  }
  int rc = canon_run(c, args, args_len, lg__canon_select(policy, tool), err);
  if (rc) return rc;
  if (sha_parts(c, tool, strlen(tool), c->out.data, c->out.len, hex))
    return lg__err(err, LG_ENOMEM, NULL, -1, "SHA-256 failed");
  if (key_material) *key_material = c->out.data;
  if (km_len) *km_len = c->out.len;
  return 0;
}
