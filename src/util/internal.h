/*
 * internal.h — what the library's modules share and the public header does
 * not show: the allocator hooks every allocation goes through, a growable
 * byte buffer, error filling, and small helpers. Names are lg__ (internal,
 * not exported: the build hides every symbol without LG_EXPORT).
 */
#ifndef LG_INTERNAL_H
#define LG_INTERNAL_H

#include "loopguard.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Allocation through the hooks of lg_set_allocator(). */
void *lg__malloc(size_t n);
void *lg__calloc(size_t n, size_t size);
void *lg__realloc(void *p, size_t n);
void lg__free(void *p);
char *lg__strdup(const char *s);
char *lg__strndup(const char *s, size_t n);

/* A 64-bit hash of a NUL-terminated string, for in-memory tables (all
 * bits mixed: tables may index by the low ones). Not stable across
 * versions: never store it. */
uint64_t lg__hash_str(const char *s);
uint64_t lg__hash_bytes(const void *p, size_t n); /* lg__hash_str(s) is lg__hash_bytes(s, strlen(s)) */

/* A growable byte buffer. `data` is NUL-terminated whenever len < cap. */
typedef struct lg__buf {
  char *data;  /* heap bytes, or NULL before the first append */
  size_t len;  /* bytes in use */
  size_t cap;  /* bytes allocated */
  bool oom;    /* an append failed: later ones fail too, steal gives NULL */
} lg__buf_t;

int lg__buf_reserve(lg__buf_t *b, size_t extra);
int lg__buf_append(lg__buf_t *b, const void *p, size_t n);
int lg__buf_puts(lg__buf_t *b, const char *s);
int lg__buf_putc(lg__buf_t *b, char c);
int lg__buf_printf(lg__buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string with its quotes (control characters, quote
 * and backslash escaped; other bytes as they are). */
int lg__buf_json_str(lg__buf_t *b, const char *s, size_t n);
/* The same for a NUL-terminated string, or null when s is NULL. */
int lg__buf_json_str_or_null(lg__buf_t *b, const char *s);
/* The same for text that may not be UTF-8 (a path, a header, a parser's
 * error quoting the bytes it stopped at, a message cut at its buffer's
 * end): each byte that is not UTF-8 becomes U+FFFD, so every body and
 * log line the server writes is valid JSON. */
int lg__buf_json_str_lossy(lg__buf_t *b, const char *s, size_t n);
/* How many leading bytes of [s, s+n) are valid UTF-8 (n: all), by
 * lg__utf8_len's rules (no overlong form, surrogate or code point past
 * U+10FFFF). */
size_t lg__utf8_valid_prefix(const char *s, size_t n);
/* An id a client gives (a run id, a group, a call id, a ledger key, a
 * reason), in a body, a path or a header alike: 1 to LG__ID_MAX bytes of
 * UTF-8 without control characters. NULL when s[0..n) is one, else what
 * is wrong ("must not be empty", ...), to follow the field's name. */
#define LG__ID_MAX 1024
#define LG__STR_(x) #x
#define LG__STR(x) LG__STR_(x) /* a macro's value as a string literal */
const char *lg__id_problem(const char *s, size_t n);
/* Appends jansson value v as compact JSON text, what json_dumps(v,
 * JSON_COMPACT | JSON_ENCODE_ANY) writes (members in their order, reals
 * as jansson writes them: %.17g, ".0" when it would read as an integer,
 * no '+' or leading zero in the exponent, control characters as \u001F
 * in capitals): the same bytes. LG_EINVAL for a string that is not
 * UTF-8, which json_dumps refuses too; LG_ENOMEM. */
struct json_t;
int lg__buf_json(lg__buf_t *b, const struct json_t *v);
/* Object o as lg__buf_json writes it, but for the n (at most 32) members
 * named in keys, written as the JSON texts vals[i]: in that member's
 * place, or after o's own members when o has none; a NULL text leaves the
 * member out. The bytes a copy of o changed by json_object_set_new and
 * json_object_del would print, without the copy. o NULL: no members of
 * its own. */
int lg__buf_json_with(lg__buf_t *b, const struct json_t *o, const char *const *keys,
                      const char *const *vals, size_t n);
/* Appends ,"key":"value" (value escaped) when value is not NULL. */
int lg__buf_json_kv(lg__buf_t *b, const char *key, const char *value);
/* Appends ,"key": (key a plain name, not escaped). */
int lg__buf_json_key(lg__buf_t *b, const char *key);
/* Appends v in decimal, as printf's %lld (without printf: the trace line
 * and the decision are written on every decision). */
int lg__buf_i64(lg__buf_t *b, int64_t v);
/* Appends a nano-USD amount as a JSON number of USD ("0.000042"): the
 * text of lg_usd_format (usd.c). */
int lg__buf_usd(lg__buf_t *b, int64_t nusd);
void lg__buf_free(lg__buf_t *b);
/* Appends the whole file at path to b. 0, or an LG_EIO error ("cannot open
 * the WHAT: ...", "cannot read the WHAT") or LG_ENOMEM, with path as the
 * error's source and line 0; b is freed on error. */
int lg__buf_read_file(lg__buf_t *b, const char *path, const char *what, lg_error_t *err);
/* Hands the bytes over to the caller (NUL-terminated) and resets b. */
char *lg__buf_steal(lg__buf_t *b, size_t *len);

/* Around every jansson parse: lg__json_begin() before it (installs the
 * allocation hooks once, clears this thread's flag), lg__json_oom() after
 * it: true when an allocation failed during the parse, whose result must
 * then be discarded as LG_ENOMEM whatever jansson said. */
void lg__json_begin(void);
bool lg__json_oom(void);
/* Between these, this thread's jansson allocations of up to 8 KB come
 * from a chunk of its own rather than a malloc each (util.c, "the
 * region"): for the gateway's reader of network bytes (lg__json_load),
 * whose trees are made and freed a thousand values at a time. begin
 * calls lg__json_begin. A value made inside stays valid until freed, on
 * any thread, as any jansson value; one kept long keeps its 128 KB chunk
 * from going back, so what a run keeps is copied out (json_deep_copy
 * outside the region). Off under ASan, so that it checks every value. */
void lg__json_region_begin(void);
void lg__json_region_end(void);
/* A thread about to wait for something that may take long (a lock of the
 * store another process holds, a busy committer): lg__will_block runs the
 * hook this thread set (the server's loop leader passes its loop's lead
 * on, so that the loop's other connections are served meanwhile), if any.
 * The hook is per thread; NULL unsets it. */
void lg__will_block(void);
void lg__set_block_hook(void (*fn)(void));
/* A caller that can do other work while a job of its waits for another
 * thread (a gateway fiber: gateway.c): self() names what waits (NULL:
 * the caller blocks as usual), wait() stops it until wake() — from any
 * thread — says the job is done. Per thread, as the block hook; NULL
 * unsets it. lg__park() is this thread's, or NULL. */
typedef struct lg__park {
  void *(*self)(void);
  void (*wait)(void *who);
  void (*wake)(void *who);
} lg__park_t;
void lg__set_park(const lg__park_t *p);
const lg__park_t *lg__park(void);
/* A thread that used the region and ends (or idles long) gives its chunk up. */
void lg__json_region_thread_end(void);
/* For tests: the region on or off (default: on, off under ASan), and the
 * chunks taken and not yet back. */
void lg__json_region_enable(int on);
size_t lg__json_region_chunks(void);

/* ---- money (usd.c) ---- */
#define LG__USD_NANO 9  /* decimals of nano-dollars: the engine's unit */
#define LG__USD_MICRO 6 /* decimals of micro-dollars: budgets', prices' */
/* A USD amount read as a double (JSON, a command line) into integer
 * units of 10^-decimals USD: rounded to the nearest unit, a half up, on
 * the decimal the amount was written as (0.0000005 is one micro-dollar,
 * though its double is a little less). The one conversion of the library:
 * each caller checks its own range and names the field in its message.
 * LG_EINVAL for NaN, infinity or a negative amount; LG_ERANGE when the
 * units do not fit in int64_t. */
int lg__usd_to_units(double usd, int decimals, int64_t *out);

/* ---- hex and randomness (ids.c) ---- */
/* The 16 lowercase hex digits, for the JSON escapes of control bytes. */
extern const char lg__hex_digits[17];
/* The value of a lowercase hex digit (fingerprints, ids), 0xFF for any
 * other byte. */
extern const uint8_t lg__hex_value[256];
/* n bytes as 2n lowercase hex digits and a NUL into out[2n + 1]. */
void lg__hex(const void *bytes, size_t n, char *out);
/* The SHA-256 of n bytes as 64 lowercase hex digits and a NUL (all zeros
 * when OpenSSL fails, which it does not for SHA-256 in memory). */
void lg__sha256_hex(const void *p, size_t n, char out[65]);
/* The n bytes of 2n lowercase hex digits (no NUL needed): for digits
 * already known good (a fingerprint the library made or checked); any
 * other byte gives an unspecified value, not an error. */
void lg__unhex(const char *hex, size_t n, void *bytes);
/* n random bytes from the kernel (getrandom): the one source of ids,
 * tokens and reservation names. 0, or LG_EIO when there is none. */
int lg__random(void *bytes, size_t n);
/* `prefix` and 2 * nbytes random hex digits (at most 32 bytes) into
 * out[size] ("rsv_", "ct_", "run_"). 0, or LG_EIO (err says what for:
 * `what`), or LG_EINVAL when it does not fit. */
int lg__random_id(const char *prefix, size_t nbytes, char *out, size_t size, const char *what,
                  lg_error_t *err);

/* Formats epoch milliseconds as RFC 3339 UTC with milliseconds
 * ("2026-12-01T07:17:10.000Z") into buf: the one timestamp format of
 * every answer, log line and listing. */
void lg__time_rfc3339(int64_t ms, char buf[32]);

/* The members of JSON object o that known(name, ud) does not know, named
 * all at once: LG_EINVAL "unknown field: x" or "unknown fields: x, y"
 * (names cut to 64 bytes, control characters as '?', "" for an empty
 * one), then `hint` (may be NULL), with err->field the first of them. 0
 * when every member is known. For every body a client sends. */
int lg__json_unknown_fields(const struct json_t *o, bool (*known)(const char *name, const void *ud),
                            const void *ud, const char *hint, lg_error_t *err);

/* What JSON value v is, for an error message: "an object", "an array",
 * "a string", "a number", "a boolean", "null". */
const char *lg__json_type_name(const struct json_t *v);
/* An error's own sentence, without where (its source: a file, or a store's
 * URL), else the code's. */
const char *lg__error_text(const lg_error_t *err, int code);
/* A message may end with words of a library below that can name a host or
 * a path (libpq's: "connection to server at \"db.internal\"..."), after
 * this: the operator's, for the log. */
#define LG__ERR_DETAIL " (libpq: "
/* A store's message says this, before any LG__ERR_DETAIL, when a write
 * failed with its outcome unknown: the connection to the database was lost
 * (or dropped at its deadline) after the transaction's COMMIT was sent, so
 * the database may have stored it whole. An answer then does not say
 * "nothing was stored" (lg__req_store_error). */
#define LG__ERR_MAYBE_STORED "; its COMMIT was sent, so it may have been stored"
/* What an answer to a client may say of an error, in buf: lg_error_format
 * without where (the source and its line: a store's URL or file), the
 * field kept ("field: sentence"), cut before LG__ERR_DETAIL ("... (the
 * server's log has the detail)"). */
const char *lg__error_public(const lg_error_t *err, int code, char *buf, size_t size);
/* What the operator's log says of an error, in buf: lg_error_format (its
 * source, a store's URL or file, and libpq's words included), or the
 * code's text when err says nothing. */
const char *lg__error_logged(const lg_error_t *err, int code, char *buf, size_t size);

/* Fills err (when not NULL) and returns code. */
int lg__err(lg_error_t *err, int code, const char *field, long offset,
            const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#ifdef __clang_analyzer__
/* For clang's static analyzer (scan-build, docs/testing.md), which cannot see into
 * another file: lg__err returns the code it is given. Without this it
 * reads every error path as one that may also succeed. */
#define lg__err(err, code, ...) ((void)(lg__err)((err), (code), __VA_ARGS__), (code))
#endif
/* Sets err->source and err->line when they are not set yet. */
void lg__err_where(lg_error_t *err, const char *source, long line);
/* Prefixes err->field with `prefix.` (for nested objects). */
void lg__err_field_prefix(lg_error_t *err, const char *prefix);
/* The line of a setting a file's reader refused after jansson parsed the
 * file: err->line becomes the line where err's field path ("a.b",
 * "list.0" or "list[0].c", as errors name it; a key may hold dots)
 * starts in the JSON text s[0..n), 0 when err names no field or the path
 * is not in s. s must be text jansson accepted. */
void lg__err_json_line(lg_error_t *err, const char *s, size_t n);

/* A request fingerprint of the idempotency ledger, durable or in memory:
 * 1 to LG__LEDGER_FP_MAX bytes. 0, or LG_EINVAL naming
 * request_fingerprint (ledger.c). */
#define LG__LEDGER_FP_MAX 256
int lg__ledger_check_fp(const char *fp, lg_error_t *err);

/* a + b, held at INT64_MAX / INT64_MIN rather than past them (counts an
 * upstream reports: any integer JSON holds) */
static inline int64_t lg__add_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

static inline uint64_t lg__load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* JSON white space (RFC 8259: space, tab, LF, CR); one compare for the
 * bytes past the space, most of any JSON text. */
static inline bool lg__json_ws(char ch) {
  return (unsigned char)ch <= ' ' && (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t');
}

/* The index of the first byte of s[i..n) that is not JSON white space, or n. */
static inline size_t lg__json_ws_end(const char *s, size_t i, size_t n) {
  while (i < n && lg__json_ws(s[i])) i++;
  return i;
}

#define LG__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* An id that one segment of a URL's path can name (a run id, a group):
 * no '/', and not "." or "..", which browsers and proxies resolve away. */
static inline bool lg__path_segment_ok(const char *s) {
  return !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

#endif
