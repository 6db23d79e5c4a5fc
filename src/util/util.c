/*
 * util.c — the allocator hooks, the byte buffer, error codes and error
 * formatting. Every allocation of the library passes through lg__malloc and
 * friends so that tests can fail the Nth one (docs/internals/style.md, "failing
 * allocation N").
 */
#include "internal.h"
#include "utf8.h"

#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

static lg_malloc_fn g_malloc = malloc;
static lg_realloc_fn g_realloc = realloc;
static lg_free_fn g_free = free;

const char *lg_version(void) { return LG_VERSION_STRING; }

void lg_set_allocator(lg_malloc_fn m, lg_realloc_fn r, lg_free_fn f) {
  g_malloc = m ? m : malloc;
  g_realloc = r ? r : realloc;
  g_free = f ? f : free;
  lg__json_begin(); /* jansson's hooks call through g_malloc and g_free */
}

/* jansson does not reliably report its own allocation failures: most come
 * back as syntax errors, and a failed buffer growth can silently drop a
 * byte of a string, so a parse under memory pressure may "succeed" with
 * wrong content. Its hooks therefore note every failure in a per-thread
 * flag, and every parse checks the flag and discards its result. */
static _Thread_local bool g_json_oom;

/* ---- the region: trees read by lg__json_load in chunks, not a malloc a value ----
 *
 * The gateway reads a request of a few KB into a tree of about a thousand
 * jansson allocations, and frees them all when the request is answered:
 * malloc and free were a quarter of its instructions. Inside
 * lg__json_region_begin/end a thread's jansson allocations come from a
 * chunk of its own instead (a bump of a pointer), and a free is one
 * atomic decrement of the chunk's count of live allocations. A chunk goes
 * back to the pool once the thread has moved on from it and its last
 * allocation is freed, by any thread — so a value kept past the request
 * stays valid, only keeping its chunk. Allocations are told apart by
 * address: every chunk lies in one reserved span, anything else came
 * from g_malloc. */
#define JR_CHUNK ((size_t)128 * 1024) /* a chunk's size and alignment */
#define JR_CHUNKS 2048                /* the span: 256 MB of address space, reserved, not used */
#define JR_BIG (JR_CHUNK / 16)        /* larger allocations: g_malloc */
#define JR_BIAS ((long)1 << 40)       /* a chunk's count while its thread still allocates in it */
#define JR_KEEP 16                    /* released chunks kept resident at most */

typedef struct jr_chunk {
  _Atomic long live;     /* JR_BIAS - allocations + frees while open; live allocations once closed */
  long allocs;           /* made in it (its thread's only) */
  size_t used;           /* bytes handed out, this header included */
  struct jr_chunk *next; /* the pool's list */
} jr_chunk_t;
#define JR_HEAD ((sizeof(jr_chunk_t) + 15) & ~(size_t)15)

static _Atomic(char *) jr_span;      /* JR_CHUNKS chunks, JR_CHUNK-aligned; NULL: no region.
                                        Atomic: every free reads it, set once by the first region */
static size_t jr_fresh;              /* chunks of the span never used yet */
static jr_chunk_t *jr_pool;          /* released chunks, to use again */
static size_t jr_pooled;
static _Atomic size_t jr_in_use;     /* chunks taken and not yet released */
static pthread_mutex_t jr_mu = PTHREAD_MUTEX_INITIALIZER;
#if defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang's way to say it */
#define JR_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(JR_UNDER_ASAN)
static _Atomic int jr_enabled = 0;   /* under ASan, a malloc per value, so that it checks each */
#else
static _Atomic int jr_enabled = 1;
#endif
static _Thread_local int jr_depth;   /* inside lg__json_region_begin */
static _Thread_local jr_chunk_t *jr_cur; /* this thread's open chunk */

static void jr_span_reserve(void) {
  void *m = mmap(NULL, JR_CHUNKS * JR_CHUNK + JR_CHUNK, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return; /* no region: every allocation is g_malloc's */
  uintptr_t a = ((uintptr_t)m + JR_CHUNK - 1) & ~(uintptr_t)(JR_CHUNK - 1);
  atomic_store(&jr_span, (char *)a);
}

static inline int jr_owns(const void *p) {
  char *span = atomic_load_explicit(&jr_span, memory_order_relaxed);
  return span && (uintptr_t)p - (uintptr_t)span < (uintptr_t)JR_CHUNKS * JR_CHUNK;
}

static void jr_release(jr_chunk_t *c) {
  atomic_fetch_sub(&jr_in_use, 1);
  pthread_mutex_lock(&jr_mu);
  if (jr_pooled >= JR_KEEP) /* its pages go back to the kernel; the address stays the span's */
    madvise(c, JR_CHUNK, MADV_DONTNEED);
  else
    jr_pooled++;
  c->next = jr_pool;
  jr_pool = c;
  pthread_mutex_unlock(&jr_mu);
}

static jr_chunk_t *jr_take(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, jr_span_reserve);
  char *span = atomic_load(&jr_span);
  if (!span) return NULL;
  pthread_mutex_lock(&jr_mu);
  jr_chunk_t *c = jr_pool;
  if (c) {
    jr_pool = c->next;
    if (jr_pooled) jr_pooled--;
  } else if (jr_fresh < JR_CHUNKS) {
    c = (jr_chunk_t *)(span + jr_fresh++ * JR_CHUNK);
  }
  pthread_mutex_unlock(&jr_mu);
  if (!c) return NULL; /* the span is full: g_malloc until a chunk comes back */
  atomic_store(&c->live, JR_BIAS);
  c->allocs = 0;
  c->used = JR_HEAD;
  atomic_fetch_add(&jr_in_use, 1);
  return c;
}

/* The thread leaves its chunk: from now on the count is of live allocations. */
static void jr_close(jr_chunk_t *c) {
  long drop = JR_BIAS - c->allocs;
  if (atomic_fetch_sub(&c->live, drop) == drop) jr_release(c);
}

static void *jr_alloc(size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n > JR_BIG) return NULL;
  jr_chunk_t *c = jr_cur;
  if (!c || c->used + n > JR_CHUNK) {
    if (c) jr_close(c);
    if (!(jr_cur = c = jr_take())) return NULL;
  }
  void *p = (char *)c + c->used;
  c->used += n;
  c->allocs++;
  return p;
}

void lg__json_region_begin(void) {
  lg__json_begin();
  if (atomic_load_explicit(&jr_enabled, memory_order_relaxed)) jr_depth++;
}

void lg__json_region_end(void) {
  if (jr_depth) jr_depth--;
}

void lg__json_region_thread_end(void) {
  if (jr_cur) jr_close(jr_cur);
  jr_cur = NULL;
}

void lg__json_region_enable(int on) { atomic_store(&jr_enabled, on); }

size_t lg__json_region_chunks(void) { return atomic_load(&jr_in_use); }

static void *json_hook_malloc(size_t n) {
  void *p = jr_depth ? jr_alloc(n ? n : 1) : NULL;
  if (!p) p = g_malloc(n ? n : 1);
  if (!p) g_json_oom = true;
  return p;
}
static void json_hook_free(void *p) {
  if (!p) return;
  if (jr_owns(p)) {
    jr_chunk_t *c = (jr_chunk_t *)((uintptr_t)p & ~(uintptr_t)(JR_CHUNK - 1));
    if (atomic_fetch_sub(&c->live, 1) == 1) jr_release(c);
    return;
  }
  g_free(p);
}
static void json_hooks_install(void) { json_set_alloc_funcs(json_hook_malloc, json_hook_free); }

void lg__json_begin(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, json_hooks_install);
  g_json_oom = false;
}

bool lg__json_oom(void) { return g_json_oom; }

static _Thread_local void (*tl_block_hook)(void);
void lg__set_block_hook(void (*fn)(void)) { tl_block_hook = fn; }
void lg__will_block(void) {
  if (tl_block_hook) tl_block_hook();
}

static _Thread_local const lg__park_t *tl_park;
void lg__set_park(const lg__park_t *p) { tl_park = p; }
const lg__park_t *lg__park(void) { return tl_park; }

void *lg__malloc(size_t n) { return g_malloc(n ? n : 1); }
void *lg__calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  size_t total = n * size;
  void *p = g_malloc(total ? total : 1);
  if (p) memset(p, 0, n * size);
  return p;
}
void *lg__realloc(void *p, size_t n) { return g_realloc(p, n ? n : 1); }
void lg__free(void *p) {
  if (p) g_free(p);
}
void lg_free(void *p) { lg__free(p); }

char *lg__strndup(const char *s, size_t n) {
  char *d = lg__malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}
char *lg__strdup(const char *s) { return s ? lg__strndup(s, strlen(s)) : NULL; }

/* FNV-1a's step over 8-byte words, then the final mix of MurmurHash3:
 * a server decision hashes a run id and a policy of a few hundred bytes. */
uint64_t lg__hash_str(const char *s) { return lg__hash_bytes(s, strlen(s)); }

uint64_t lg__hash_bytes(const void *p, size_t n) {
  const char *s = p;
  size_t i = 0;
  uint64_t h = 1469598103934665603ull ^ n, w;
  for (; i + 8 <= n; i += 8) {
    w = lg__load64((const uint8_t *)s + i);
    h = (h ^ w) * 1099511628211ull;
  }
  w = 0;
  memcpy(&w, s + i, n - i);
  h = (h ^ w) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

/* ---- buffer ---- */

int lg__buf_reserve(lg__buf_t *b, size_t extra) {
  if (b->oom) return LG_ENOMEM;
  if (b->len + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) {
    if (cap > SIZE_MAX / 2) {
      b->oom = true;
      return LG_ENOMEM;
    }
    cap *= 2;
  }
  char *d = lg__realloc(b->data, cap);
  if (!d) {
    b->oom = true;
    return LG_ENOMEM;
  }
  b->data = d;
  b->cap = cap;
  return 0;
}

int lg__buf_append(lg__buf_t *b, const void *p, size_t n) {
  if (lg__buf_reserve(b, n)) return LG_ENOMEM;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
  return 0;
}

int lg__buf_read_file(lg__buf_t *b, const char *path, const char *what, lg_error_t *err) {
  FILE *f = fopen(path, "rb");
  int rc = 0;
  if (!f) {
    rc = lg__err(err, LG_EIO, NULL, -1, "cannot open the %s: %s", what, strerror(errno));
  } else {
    char chunk[8192];
    size_t n;
    while (!rc && (n = fread(chunk, 1, sizeof chunk, f)) > 0) rc = lg__buf_append(b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (rc) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    else if (bad) rc = lg__err(err, LG_EIO, NULL, -1, "cannot read the %s", what);
  }
  if (rc) {
    lg__buf_free(b);
    if (err) {
      snprintf(err->source, sizeof err->source, "%s", path);
      err->line = 0;
    }
  }
  return rc;
}
int lg__buf_puts(lg__buf_t *b, const char *s) {
  return lg__buf_append(b, s, strlen(s));
}
int lg__buf_putc(lg__buf_t *b, char c) { return lg__buf_append(b, &c, 1); }

int lg__buf_printf(lg__buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[256];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return LG_EINVAL;
  if ((size_t)n < sizeof tmp) return lg__buf_append(b, tmp, (size_t)n);
  if (lg__buf_reserve(b, (size_t)n)) return LG_ENOMEM;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

/* Bytes lg__buf_json_str escapes: controls, the quote and the backslash
 * (UTF-8 goes through as it is). */
static const uint8_t json_escaped[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    ['"'] = 1, ['\\'] = 1};

/* s as a JSON string, the controls' \u00XX escapes in the digits hex
 * (the trace's lowercase, or jansson's capitals). */
static int buf_json_str(lg__buf_t *b, const char *s, size_t n, const char *hex) {
  /* Written in place: room for the quotes and a few escapes first, more
   * only when escapes use it up (6 bytes at most for one). */
  if (lg__buf_reserve(b, n + n / 8 + 8)) return LG_ENOMEM;
  char *o = b->data + b->len;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) {
    if ((size_t)(b->data + b->cap - o) < 8) { /* 6 for this byte, the quote, the NUL */
      b->len = (size_t)(o - b->data);
      if (lg__buf_reserve(b, (n - i) + (n - i) / 8 + 8)) return LG_ENOMEM;
      o = b->data + b->len;
    }
    unsigned char ch = (unsigned char)s[i];
    if (!json_escaped[ch]) {
      *o++ = (char)ch;
      continue;
    }
    *o++ = '\\';
    switch (ch) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '\b': *o++ = 'b'; break;
    case '\f': *o++ = 'f'; break;
    case '\n': *o++ = 'n'; break;
    case '\r': *o++ = 'r'; break;
    case '\t': *o++ = 't'; break;
    default:
      *o++ = 'u', *o++ = '0', *o++ = '0';
      *o++ = hex[ch >> 4], *o++ = hex[ch & 15];
    }
  }
  *o++ = '"';
  *o = 0;
  b->len = (size_t)(o - b->data);
  return 0;
}

int lg__buf_json_str(lg__buf_t *b, const char *s, size_t n) { return buf_json_str(b, s, n, lg__hex_digits); }

static int buf_json_real(lg__buf_t *b, double d) {
  char t[40];
  int n = snprintf(t, sizeof t, "%.17g", d);
  if (n <= 0 || (size_t)n >= sizeof t - 2 || !isfinite(d)) return LG_EINVAL; /* as json_dumps */
  for (char *p = t; *p; p++)
    if (*p == ',') *p = '.'; /* a locale's decimal comma */
  if (!strchr(t, '.') && !strchr(t, 'e')) { /* else it would read back as an integer */
    memcpy(t + n, ".0", 3);
    n += 2;
  }
  char *e = strchr(t, 'e');
  if (e) { /* e+20 -> e20, e-05 -> e-5 */
    char *start = e + 1, *end = start + 1;
    if (*start == '-') start++;
    while (*end == '0') end++;
    if (end != start) {
      memmove(start, end, (size_t)(t + n - end) + 1);
      n -= (int)(end - start);
    }
  }
  return lg__buf_append(b, t, (size_t)n);
}

static int buf_json_string(lg__buf_t *b, const char *s, size_t n) {
  for (size_t i = 0; i < n;) { /* json_dumps refuses a string that is not UTF-8 */
    if ((unsigned char)s[i] < 0x80) {
      i++;
      continue;
    }
    size_t k = lg__utf8_len((const unsigned char *)s + i, n - i);
    if (!k) return LG_EINVAL;
    i += k;
  }
  return buf_json_str(b, s, n, "0123456789ABCDEF"); /* jansson's capitals: its bytes exactly */
}

/* One member of an object: the separator (then ','), the key, the value
 * (x, or the JSON text val when x is NULL). */
static int buf_json_member(lg__buf_t *b, char *sep, const char *k, const json_t *x, const char *val) {
  int rc;
  if ((rc = lg__buf_putc(b, *sep)) || (rc = buf_json_string(b, k, strlen(k))) ||
      (rc = lg__buf_putc(b, ':')) || (rc = x ? lg__buf_json(b, x) : lg__buf_puts(b, val)))
    return rc;
  *sep = ',';
  return 0;
}

int lg__buf_json_with(lg__buf_t *b, const json_t *o, const char *const *keys, const char *const *vals,
                      size_t n) {
  if (n > 32) return LG_EINVAL;
  uint32_t seen = 0;
  char sep = '{';
  const char *k;
  json_t *x;
  int rc;
  json_object_foreach((json_t *)o, k, x) {
    size_t i = 0;
    while (i < n && strcmp(k, keys[i])) i++;
    if (i < n) seen |= 1u << i;
    if (i < n && !vals[i]) continue;
    if ((rc = buf_json_member(b, &sep, k, i < n ? NULL : x, i < n ? vals[i] : NULL))) return rc;
  }
  for (size_t i = 0; i < n; i++)
    if (!(seen >> i & 1) && vals[i] && (rc = buf_json_member(b, &sep, keys[i], NULL, vals[i]))) return rc;
  return sep == '{' ? lg__buf_puts(b, "{}") : lg__buf_putc(b, '}');
}

int lg__buf_json(lg__buf_t *b, const json_t *v) {
  int rc = 0;
  switch (json_typeof(v)) {
  case JSON_OBJECT: return lg__buf_json_with(b, v, NULL, NULL, 0);
  case JSON_ARRAY: {
    size_t n = json_array_size(v);
    if (!n) return lg__buf_puts(b, "[]");
    for (size_t i = 0; i < n; i++)
      if ((rc = lg__buf_putc(b, i ? ',' : '[')) || (rc = lg__buf_json(b, json_array_get(v, i)))) return rc;
    return lg__buf_putc(b, ']');
  }
  case JSON_STRING: return buf_json_string(b, json_string_value(v), json_string_length(v));
  case JSON_INTEGER: return lg__buf_i64(b, (int64_t)json_integer_value(v)); /* %lld's digits */
  case JSON_REAL: return buf_json_real(b, json_real_value(v));
  case JSON_TRUE: return lg__buf_puts(b, "true");
  case JSON_FALSE: return lg__buf_puts(b, "false");
  case JSON_NULL: return lg__buf_puts(b, "null");
  }
  return LG_EINVAL;
}

void lg__buf_free(lg__buf_t *b) {
  lg__free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->oom = false;
}

char *lg__buf_steal(lg__buf_t *b, size_t *len) {
  if (b->oom || (!b->data && lg__buf_reserve(b, 0))) {
    lg__buf_free(b);
    return NULL;
  }
  char *d = b->data;
  d[b->len] = 0;
  if (len) *len = b->len;
  b->data = NULL;
  b->len = b->cap = 0;
  return d;
}

int lg__buf_json_str_or_null(lg__buf_t *b, const char *s) {
  return s ? lg__buf_json_str(b, s, strlen(s)) : lg__buf_puts(b, "null");
}

size_t lg__utf8_valid_prefix(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t k = (unsigned char)s[i] < 0x80 ? 1 : lg__utf8_len((const unsigned char *)s + i, n - i);
    if (!k) return i;
    i += k;
  }
  return n;
}

const char *lg__id_problem(const char *s, size_t n) {
  if (!n) return "must not be empty";
  if (n > LG__ID_MAX) return "longer than " LG__STR(LG__ID_MAX) " bytes";
  if (lg__utf8_valid_prefix(s, n) != n) return "not valid UTF-8";
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return "must not hold control characters";
  return NULL;
}

int lg__buf_json_str_lossy(lg__buf_t *b, const char *s, size_t n) {
  size_t ok = lg__utf8_valid_prefix(s, n);
  if (ok == n) return lg__buf_json_str(b, s, n);
  lg__buf_t t = {0};
  size_t i = 0;
  while (i < n) {
    size_t k = lg__utf8_valid_prefix(s + i, n - i);
    lg__buf_append(&t, s + i, k);
    i += k;
    if (i < n) { /* the byte that is not UTF-8 */
      lg__buf_puts(&t, "\xef\xbf\xbd");
      i++;
    }
  }
  int rc = t.oom ? LG_ENOMEM : lg__buf_json_str(b, t.data ? t.data : "", t.len);
  if (rc) b->oom = true;
  lg__buf_free(&t);
  return rc;
}

int lg__buf_json_kv(lg__buf_t *b, const char *key, const char *value) {
  if (!value) return 0;
  lg__buf_json_key(b, key);
  return lg__buf_json_str(b, value, strlen(value));
}

int lg__buf_json_key(lg__buf_t *b, const char *key) {
  size_t n = strlen(key);
  if (lg__buf_reserve(b, n + 4)) return LG_ENOMEM;
  char *p = b->data + b->len;
  p[0] = ',';
  p[1] = '"';
  memcpy(p + 2, key, n);
  p[n + 2] = '"';
  p[n + 3] = ':';
  b->len += n + 4;
  b->data[b->len] = 0;
  return 0;
}

int lg__buf_i64(lg__buf_t *b, int64_t v) {
  char tmp[20]; /* 2^63 has 19 digits */
  size_t k = sizeof tmp;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[--k] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0 && lg__buf_putc(b, '-')) return LG_ENOMEM;
  return lg__buf_append(b, tmp + k, sizeof tmp - k);
}

char *lg_json_quote(const char *s, size_t len) {
  lg__buf_t b = {0};
  if (lg__buf_json_str(&b, s, len)) {
    lg__buf_free(&b);
    return NULL;
  }
  return lg__buf_steal(&b, NULL);
}

/* ---- errors ---- */

const char *lg_strerror(int code) {
  switch (code) {
  case 0: return "success";
#define LG__XX(name, c, text) case c: return text;
    LG_ERRNO_MAP(LG__XX)
#undef LG__XX
  }
  return "unknown error";
}

const char *lg_err_name(int code) {
  switch (code) {
  case 0: return "LG_OK";
#define LG__XX(name, c, text) case c: return "LG_" #name;
    LG_ERRNO_MAP(LG__XX)
#undef LG__XX
  }
  return "LG_E?";
}

/* s into out[cap] from at, as snprintf would truncate it; the new end. */
static size_t put_trunc(char *out, size_t cap, size_t at, const char *s, size_t n) {
  if (at + 1 < cap) {
    size_t room = cap - 1 - at;
    memcpy(out + at, s, n < room ? n : room);
  }
  return at + n;
}

/* vsnprintf(out, cap, fmt, ap) for a format whose only directives are
 * %s and %% (most error messages), without printf's machinery: an
 * error is made for every refused event, so it is on hot paths (a
 * gateway request's tool results of calls it never saw). */
static void err_format(char *out, size_t cap, const char *fmt, va_list ap) {
  for (const char *p = fmt; (p = strchr(p, '%')); p += 2)
    if (p[1] != 's' && p[1] != '%') {
      vsnprintf(out, cap, fmt, ap);
      return;
    }
  size_t at = 0;
  for (const char *p = fmt;;) {
    const char *q = strchr(p, '%');
    if (!q) {
      at = put_trunc(out, cap, at, p, strlen(p));
      break;
    }
    at = put_trunc(out, cap, at, p, (size_t)(q - p));
    if (q[1] == '%') {
      at = put_trunc(out, cap, at, "%", 1);
    } else {
      const char *a = va_arg(ap, const char *);
      if (!a) a = "(null)"; /* as glibc writes it */
      at = put_trunc(out, cap, at, a, strlen(a));
    }
    p = q + 2;
  }
  out[at < cap ? at : cap - 1] = 0;
}

int (lg__err)(lg_error_t *err, int code, const char *field, long offset,
            const char *fmt, ...) {
  if (!err) return code;
  err->code = code;
  err->offset = offset;
  const char *f = field ? field : "";
  size_t fl = strlen(f);
  if (fl >= sizeof err->field) fl = sizeof err->field - 1;
  memcpy(err->field, f, fl);
  err->field[fl] = 0;
  va_list ap;
  va_start(ap, fmt);
  err_format(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  return code;
}

void lg__err_where(lg_error_t *err, const char *source, long line) {
  if (!err) return;
  if (!err->source[0] && source)
    snprintf(err->source, sizeof err->source, "%s", source);
  if (!err->line) err->line = line;
}

void lg__err_field_prefix(lg_error_t *err, const char *prefix) {
  if (!err) return;
  char tmp[sizeof err->field * 2];
  if (err->field[0])
    snprintf(tmp, sizeof tmp, "%s.%s", prefix, err->field);
  else
    snprintf(tmp, sizeof tmp, "%s", prefix);
  snprintf(err->field, sizeof err->field, "%.*s", (int)sizeof err->field - 1, tmp);
}

/* A walk of valid JSON text for lg__err_json_line: the position and its
 * line (a string holds no raw newline, so only white space counts). */
typedef struct jline {
  const char *s;
  size_t n, i;
  long line;
} jline_t;

static void jl_ws(jline_t *j) {
  for (; j->i < j->n && lg__json_ws(j->s[j->i]); j->i++)
    if (j->s[j->i] == '\n') j->line++;
}

/* Past the string at j (its opening quote), never past the text's end. */
static void jl_string(jline_t *j) {
  for (j->i++; j->i < j->n && j->s[j->i] != '"';) j->i += j->s[j->i] == '\\' ? 2 : 1;
  j->i = j->i < j->n ? j->i + 1 : j->n;
}

/* The key at j (its opening quote), decoded by jansson (an error's path
 * only), against the start of path p: how many bytes of p it is, or
 * SIZE_MAX when p does not start with it. j moves past the key. */
static size_t jl_key(jline_t *j, const char *p) {
  size_t a = j->i;
  jl_string(j);
  lg__json_begin();
  json_t *k = json_loadb(j->s + a, j->i - a, JSON_DECODE_ANY, NULL);
  const char *ks = json_string_value(k);
  size_t kl = ks ? json_string_length(k) : 0;
  size_t m = ks && kl <= strlen(p) && !memcmp(p, ks, kl) ? kl : SIZE_MAX;
  json_decref(k);
  return m;
}

/* Past the value at j (white space first); to the end on anything odd. */
static void jl_skip(jline_t *j) {
  jl_ws(j);
  if (j->i >= j->n) return;
  char c = j->s[j->i];
  if (c == '"') {
    jl_string(j);
  } else if (c == '{' || c == '[') {
    for (j->i++;;) {
      jl_ws(j);
      if (j->i >= j->n) return;
      size_t at = j->i;
      char d = j->s[j->i];
      if (d == '}' || d == ']') {
        j->i++;
        return;
      }
      if (d == ',' || d == ':') j->i++;
      else jl_skip(j); /* a key or a value */
      if (j->i == at) j->i = j->n; /* not JSON: stop */
    }
  } else {
    while (j->i < j->n && !lg__json_ws(j->s[j->i]) && !strchr(",:]}", j->s[j->i])) j->i++;
  }
}

/* The line of path p in the value at j, or 0. */
static long jl_find(jline_t *j, const char *p, int depth) {
  jl_ws(j);
  if (!*p) return j->line;
  if (j->i >= j->n || depth > 256) return 0;
  if (j->s[j->i] == '{') {
    for (j->i++;;) {
      jl_ws(j);
      if (j->i >= j->n || j->s[j->i] != '"') return 0;
      long at = j->line;
      size_t m = jl_key(j, p);
      jl_ws(j);
      if (j->i < j->n && j->s[j->i] == ':') j->i++;
      if (m != SIZE_MAX && (!p[m] || p[m] == '.' || p[m] == '[')) {
        if (!p[m]) return at;
        jline_t back = *j;
        long r = jl_find(j, p + m + (p[m] == '.'), depth + 1);
        if (r) return r;
        *j = back; /* a key with dots may come later */
      }
      jl_skip(j);
      jl_ws(j);
      if (j->i >= j->n || j->s[j->i] != ',') return 0;
      j->i++;
    }
  }
  if (j->s[j->i] == '[') {
    const char *q = p + (*p == '[');
    if (*q < '0' || *q > '9') return 0;
    char *end;
    unsigned long idx = strtoul(q, &end, 10);
    if (*p == '[' && *end++ != ']') return 0;
    if (*end && *end != '.' && *end != '[') return 0;
    j->i++;
    for (unsigned long k = 0;; k++) {
      jl_ws(j);
      if (j->i >= j->n || j->s[j->i] == ']') return 0;
      if (k == idx) return jl_find(j, end + (*end == '.'), depth + 1);
      jl_skip(j);
      jl_ws(j);
      if (j->i >= j->n || j->s[j->i] != ',') return 0;
      j->i++;
    }
  }
  return 0;
}

const char *lg__json_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER:
  case JSON_REAL: return "a number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "?";
}

int lg__json_unknown_fields(const json_t *o, bool (*known)(const char *name, const void *ud),
                            const void *ud, const char *hint, lg_error_t *err) {
  lg__buf_t names = {0};
  char first[72] = "";
  int n = 0;
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    if (known(k, ud)) continue;
    if (n++) lg__buf_puts(&names, ", ");
    size_t at = names.len;
    if (!*k) lg__buf_puts(&names, "\"\"");
    for (size_t i = 0; i < 64 && k[i]; i++) lg__buf_putc(&names, (unsigned char)k[i] < 0x20 ? '?' : k[i]);
    if (n == 1 && names.data)
      snprintf(first, sizeof first, "%.*s", (int)(names.len - at), names.data + at);
  }
  int rc = 0;
  if (n)
    rc = lg__err(err, LG_EINVAL, first[0] ? first : "body", -1, "unknown field%s: %s%s%s",
                 n > 1 ? "s" : "", names.data ? names.data : "?", hint ? " " : "", hint ? hint : "");
  lg__buf_free(&names);
  return rc;
}

void lg__err_json_line(lg_error_t *err, const char *s, size_t n) {
  if (!err) return;
  jline_t j = {s, n, 0, 1};
  err->line = err->field[0] && s ? jl_find(&j, err->field, 0) : 0;
}

const char *lg__error_text(const lg_error_t *err, int code) {
  return err && err->message[0] ? err->message : lg_strerror(code);
}

const char *lg__error_public(const lg_error_t *err, int code, char *buf, size_t size) {
  if (!err || !err->message[0] || !size) return lg__error_text(err, code);
  lg_error_t e = *err;
  e.source[0] = 0;
  e.line = 0;
  if (!e.code) e.code = code;
  lg_error_format(&e, buf, size);
  char *cut = strstr(buf, LG__ERR_DETAIL);
  if (cut) snprintf(cut, size - (size_t)(cut - buf), " (the server's log has the detail)");
  return buf;
}

const char *lg__error_logged(const lg_error_t *err, int code, char *buf, size_t size) {
  return err && err->message[0] ? lg_error_format(err, buf, size) : lg_strerror(code);
}

char *lg_error_format(const lg_error_t *err, char *buf, size_t size) {
  if (!buf || !size) return buf;
  if (!err) {
    snprintf(buf, size, "unknown error");
    return buf;
  }
  size_t n = 0;
#define LG__ADD(...)                                                           \
  do {                                                                         \
    if (n < size) n += (size_t)snprintf(buf + n, size - n, __VA_ARGS__);       \
  } while (0)
  if (err->source[0]) {
    LG__ADD("%s", err->source);
    if (err->line > 0) LG__ADD(":%ld", err->line);
    LG__ADD(": ");
  } else if (err->line > 0) {
    LG__ADD("line %ld: ", err->line);
  }
  if (err->field[0]) LG__ADD("%s: ", err->field);
  LG__ADD("%s", lg__error_text(err, err->code));
  if (err->offset >= 0 && err->line > 0)
    LG__ADD(" (at byte %ld of the line)", err->offset + 1);
  else if (err->offset >= 0)
    LG__ADD(" (at byte offset %ld)", err->offset);
#undef LG__ADD
  return buf;
}

void lg__time_rfc3339(int64_t ms, char buf[32]) {
  /* RFC 3339 has four-digit years: a time before 0000 or after 9999 (a
   * clock or a sum gone wild) prints as the nearest end, never as a year
   * of 292 million, a five-digit year cut short, or a bare number. */
  if (ms < -62167219200000LL) ms = -62167219200000LL; /* 0000-01-01T00:00:00.000Z */
  if (ms > 253402300799999LL) ms = 253402300799999LL; /* 9999-12-31T23:59:59.999Z */
  time_t secs = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  int milli = (int)(ms - (int64_t)secs * 1000);
  struct tm tm;
  if (!gmtime_r(&secs, &tm)) {
    snprintf(buf, 32, "%lld", (long long)ms);
    return;
  }
  snprintf(buf, 32, "%04u-%02u-%02uT%02u:%02u:%02u.%03uZ", (unsigned)(tm.tm_year + 1900) % 10000u,
           (unsigned)(tm.tm_mon + 1) % 100u, (unsigned)tm.tm_mday % 100u,
           (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u, (unsigned)tm.tm_sec % 100u,
           (unsigned)milli % 1000u);
}

/* utf8.h: the bytes that end a plain run inside a JSON string. */
const uint8_t lg__str_special[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};
