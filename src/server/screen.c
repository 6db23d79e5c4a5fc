/*
 * screen.c — the first request head of a connection, checked before
 * libmicrohttpd reads it.
 *
 * libmicrohttpd 0.9.75 answers some malformed heads itself, in HTML, with
 * no hook between its parsing and its answer (docs/security.md, "Every
 * answer is JSON"). So the acceptor (accept.c) peeks at a new connection's
 * bytes (recv MSG_PEEK: they stay in the kernel for libmicrohttpd) and
 * hands the connection over only once its first head is complete and
 * passes lg__screen_head; a head that does not pass is answered here, in
 * the server's JSON error shape (lg__req_error, the one formatter).
 *
 * The scan is one pass over the bytes, a state per position, and every
 * decision is taken at the first byte that settles it: a byte that cannot
 * continue a valid head, the byte that passes a limit, the end of a line
 * (for what a whole line says), the empty line that ends the head. So the
 * answer for a prefix that is already decided never changes when more
 * bytes arrive (the acceptor peeks again at every new segment, and
 * fuzz_http_head checks this).
 *
 * What passes is what RFC 9112 calls a valid head, a little stricter than
 * libmicrohttpd: a request line of a method token, one space, a target of
 * visible bytes (at most LG__MAX_URI), one space and HTTP/1.x; header
 * lines of a token, a colon at once, and a value without control
 * characters other than tab; lines ending in CRLF or a bare LF; empty
 * lines before the request line skipped; the whole head at most
 * LG__MAX_HEAD bytes with the Cookie header's value counted twice, and at
 * most LG__MAX_FIELDS header lines, cookies and query parameters (what
 * libmicrohttpd keeps in its LG__MHD_POOL: past it, it would answer in
 * HTML). Content-Length is digits only, and several of them
 * must agree; Transfer-Encoding is chunked alone, once, not beside a
 * Content-Length and not in HTTP/1.0; Host at most once. Line folding,
 * whitespace before a colon, NUL and bare CR are refused (request
 * smuggling lives in the differences between two parsers' ideas of a
 * head; refusing what is ambiguous leaves none).
 */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <strings.h>

/* RFC 9110 tchar: the bytes of a method or a field name. */
static int tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return 1;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
  return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Where the scan is. */
typedef enum scan_state {
  S_LEAD = 0,   /* before the request line: empty lines skipped */
  S_LEAD_CR,    /* a CR before the request line: LF must follow */
  S_METHOD,     /* in the method */
  S_TARGET,     /* in the request target */
  S_VERSION,    /* in "HTTP/1.1" */
  S_LINE_CR,    /* a CR ended the request line: LF must follow */
  S_FIELD0,     /* at the start of a header line (or of the empty line) */
  S_NAME,       /* in a field name */
  S_VALUE,      /* in a field value */
  S_VALUE_CR,   /* a CR ended a header line: LF must follow */
  S_END_CR      /* a CR began the empty line: LF must follow */
} scan_state_t;

/* What the scan has seen of the head so far. */
typedef struct scan {
  const char *p;
  size_t line;          /* where the current line began */
  size_t mark;          /* where the current part began (target, version, value) */
  size_t name, name_len;/* the current field's name */
  size_t target_len;    /* the request target's length */
  int minor;            /* HTTP/1.minor */
  int n_cl, n_te, n_host;
  unsigned long long cl;/* the Content-Length */
  int query;            /* a '?' is in the target */
  size_t fields;        /* header lines, cookies and query parameters so far */
  size_t extra;         /* bytes counted beside the head's: Cookie values */
} scan_t;

static int refuse(lg__screen_t *out, int status, const char *type, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int refuse(lg__screen_t *out, int status, const char *type, const char *field,
                  const char *fmt, ...) {
  out->status = status;
  out->type = type;
  out->field = field;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->message, sizeof out->message, fmt, ap);
  va_end(ap);
  return -1;
}

/* At most 40 bytes of [s, s+n) for a message (escaped by lg__req_error). */
#define SNIP(s, n) (int)((n) > 40 ? 40 : (n)), (s)

static int too_large(const scan_t *s, lg__screen_t *out) {
  return refuse(out, 431, "headers_too_large", "headers",
                "the request head is over %d bytes%s; the limit is %d", LG__MAX_HEAD,
                s->extra ? " (its Cookie header counts twice)" : "", LG__MAX_HEAD);
}

/* n more fields (header lines, cookies, query parameters). */
static int add_fields(scan_t *s, size_t n, lg__screen_t *out) {
  s->fields += n;
  if (s->fields > LG__MAX_FIELDS)
    return refuse(out, 431, "headers_too_large", "headers",
                  "the request head has over %d fields (header lines, cookies and query "
                  "parameters); the limit is %d",
                  LG__MAX_FIELDS, LG__MAX_FIELDS);
  return 0;
}

static int bad_line(lg__screen_t *out, const char *what) {
  return refuse(out, 400, "invalid_request", "request_line",
                "request line: %s; expected METHOD SP TARGET SP HTTP/1.1", what);
}

/* The version so far [v, v+n) may still become HTTP/D.D. */
static int version_prefix_ok(const char *v, size_t n) {
  static const char pat[] = "HTTP/0.0";
  if (n > 8) return 0;
  for (size_t i = 0; i < n; i++) {
    if (pat[i] == '0' ? !(v[i] >= '0' && v[i] <= '9') : v[i] != pat[i]) return 0;
  }
  return 1;
}

/* The request line is complete: the version [v, v+n). */
static int end_request_line(scan_t *s, const char *v, size_t n, lg__screen_t *out) {
  if (n != 8 || !version_prefix_ok(v, n)) return bad_line(out, "the HTTP version is malformed");
  if (v[5] != '1')
    return refuse(out, 505, "http_version_not_supported", "version",
                  "%.8s is not supported: this server speaks HTTP/1.0 and HTTP/1.1", v);
  s->minor = v[7] - '0';
  return 0;
}

/* Trims optional whitespace (SP, HTAB) off both ends of [*v, *v+*n). */
static void trim(const char **v, size_t *n) {
  while (*n && (**v == ' ' || **v == '\t')) (*v)++, (*n)--;
  while (*n && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t')) (*n)--;
}

#define NAME_IS(s, lit)                                                                            \
  ((s)->name_len == sizeof(lit) - 1 && !strncasecmp((s)->p + (s)->name, lit, sizeof(lit) - 1))

/* A header line is complete: its value [v, v+n), untrimmed. */
static int end_field(scan_t *s, const char *v, size_t n, lg__screen_t *out) {
  trim(&v, &n);
  if (add_fields(s, 1, out)) return -1;
  if (NAME_IS(s, "Cookie")) { /* libmicrohttpd copies the value and splits it at ';' and ',' */
    size_t k = 1;
    for (size_t i = 0; i < n; i++) k += v[i] == ';' || v[i] == ',';
    s->extra += n + 1;
    if (add_fields(s, k, out)) return -1;
  } else if (NAME_IS(s, "Content-Length")) {
    unsigned long long x = 0;
    int over = 0;
    if (!n)
      return refuse(out, 400, "invalid_request", "Content-Length",
                    "Content-Length: empty; expected the body's length in bytes (digits only)");
    for (size_t i = 0; i < n; i++) {
      if (v[i] < '0' || v[i] > '9')
        return refuse(out, 400, "invalid_request", "Content-Length",
                      "Content-Length: \"%.*s\" is not a number of bytes (digits only, one value)",
                      SNIP(v, n));
      unsigned d = (unsigned)(v[i] - '0');
      if (x > (~0ull - d) / 10) over = 1;
      else x = x * 10 + d;
    }
    if (over)
      return refuse(out, 413, "payload_too_large", "body",
                    "Content-Length: %.*s does not fit in 64 bits; far over the body limit",
                    SNIP(v, n));
    if (s->n_cl++ && x != s->cl)
      return refuse(out, 400, "invalid_request", "Content-Length",
                    "Content-Length: given twice with different values (%llu and %llu)", s->cl, x);
    s->cl = x;
  } else if (NAME_IS(s, "Transfer-Encoding")) {
    if (s->n_te++)
      return refuse(out, 400, "invalid_request", "Transfer-Encoding",
                    "Transfer-Encoding: given more than once; only one \"chunked\" is accepted");
    if (n != 7 || strncasecmp(v, "chunked", 7))
      return refuse(out, 400, "invalid_request", "Transfer-Encoding",
                    "Transfer-Encoding: \"%.*s\" is not supported; only \"chunked\" is",
                    SNIP(v, n));
  } else if (NAME_IS(s, "Host")) {
    if (s->n_host++)
      return refuse(out, 400, "invalid_request", "Host", "Host: given more than once");
  }
  return 0;
}

/* The empty line is in: what the head says as a whole. */
static int end_head(scan_t *s, lg__screen_t *out) {
  if (s->n_te && s->n_cl)
    return refuse(out, 400, "invalid_request", "Transfer-Encoding",
                  "Transfer-Encoding: chunked beside a Content-Length; send one of them");
  if (s->n_te && s->minor == 0)
    return refuse(out, 400, "invalid_request", "Transfer-Encoding",
                  "Transfer-Encoding: not allowed in an HTTP/1.0 request");
  return 0;
}

/* One byte of the request line (S_METHOD, S_TARGET, S_VERSION). */
static int line_byte(scan_t *s, scan_state_t *st, size_t i, unsigned char c, lg__screen_t *out) {
  switch (*st) {
  case S_METHOD:
    if (c == ' ') {
      if (i == s->line) return bad_line(out, "it does not start with a method");
      *st = S_TARGET;
      s->mark = i + 1;
    } else if (!tchar(c)) {
      return bad_line(out, "the method holds a byte that is not a token character");
    }
    return 0;
  case S_TARGET:
    if (c == ' ') {
      if (i == s->mark) return bad_line(out, "the request target is empty");
      s->target_len = i - s->mark;
      *st = S_VERSION;
      s->mark = i + 1;
    } else if (c == '\r' || c == '\n') {
      return bad_line(out, "no HTTP version after the request target");
    } else if (c < 0x21 || c == 0x7f) {
      return refuse(out, 400, "invalid_request", "path",
                    "the request target holds a control character (0x%02x)", c);
    } else if (i - s->mark >= LG__MAX_URI) {
      return refuse(out, 414, "uri_too_long", "path",
                    "the request target is over %d bytes; the limit is %d", LG__MAX_URI,
                    LG__MAX_URI);
    } else if (c == '?' || (c == '&' && s->query)) { /* libmicrohttpd keeps each parameter */
      if (c == '?' && s->query) return 0;
      s->query = 1;
      return add_fields(s, 1, out);
    }
    return 0;
  default: /* S_VERSION */
    if (c == '\r' || c == '\n') {
      if (end_request_line(s, s->p + s->mark, i - s->mark, out)) return -1;
      *st = c == '\r' ? S_LINE_CR : S_FIELD0;
      s->line = i + 1;
    } else if (!version_prefix_ok(s->p + s->mark, i - s->mark + 1)) {
      return bad_line(out, "the HTTP version is malformed");
    }
    return 0;
  }
}

/* One byte of a header line (S_FIELD0, S_NAME, S_VALUE). Returns 1 when
 * the head is complete. */
static int field_byte(scan_t *s, scan_state_t *st, size_t i, unsigned char c, lg__screen_t *out) {
  switch (*st) {
  case S_FIELD0:
    if (c == '\r') *st = S_END_CR;
    else if (c == '\n') return end_head(s, out) ? -1 : 1;
    else if (c == ' ' || c == '\t')
      return refuse(out, 400, "invalid_request", "headers",
                    "a header line starts with whitespace (line folding is not accepted)");
    else if (!tchar(c))
      return refuse(out, 400, "invalid_request", "headers",
                    "a header line must start with a field name (got the byte 0x%02x)", c);
    else {
      *st = S_NAME;
      s->name = i;
    }
    return 0;
  case S_NAME:
    if (c == ':') {
      s->name_len = i - s->name;
      s->mark = i + 1;
      *st = S_VALUE;
    } else if (c == ' ' || c == '\t') {
      return refuse(out, 400, "invalid_request", "headers",
                    "%.*s: whitespace between a field name and its colon", SNIP(s->p + s->name,
                                                                              i - s->name));
    } else if (c == '\r' || c == '\n') {
      return refuse(out, 400, "invalid_request", "headers",
                    "the header line \"%.*s\" has no colon", SNIP(s->p + s->name, i - s->name));
    } else if (!tchar(c)) {
      return refuse(out, 400, "invalid_request", "headers",
                    "a field name holds a byte that is not a token character (0x%02x)", c);
    }
    return 0;
  default: /* S_VALUE */
    if (c == '\r' || c == '\n') {
      if (end_field(s, s->p + s->mark, i - s->mark, out)) return -1;
      *st = c == '\r' ? S_VALUE_CR : S_FIELD0;
      s->line = i + 1;
    } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return refuse(out, 400, "invalid_request", "headers",
                    "%.*s: the value holds a control character (0x%02x)",
                    SNIP(s->p + s->name, s->name_len), c);
    }
    return 0;
  }
}

int lg__screen_head(const char *p, size_t n, lg__screen_t *out) {
  memset(out, 0, sizeof *out);
  scan_t s;
  memset(&s, 0, sizeof s);
  s.p = p;
  scan_state_t st = S_LEAD;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (i + s.extra >= LG__MAX_HEAD) return too_large(&s, out);
    int rc = 0;
    switch (st) {
    case S_LEAD:
      if (c == '\r') st = S_LEAD_CR;
      else if (c != '\n') {
        st = S_METHOD;
        s.line = i;
        rc = line_byte(&s, &st, i, c, out);
      }
      break;
    case S_LEAD_CR:
    case S_LINE_CR:
    case S_VALUE_CR:
    case S_END_CR:
      if (c != '\n' && st == S_VALUE_CR)
        return refuse(out, 400, "invalid_request", "headers",
                      "%.*s: the value holds a CR not followed by LF",
                      SNIP(s.p + s.name, s.name_len));
      if (c != '\n') return bad_line(out, "a CR not followed by LF");
      if (st == S_END_CR) {
        if (end_head(&s, out)) return -1;
        out->head_len = i + 1;
        return 0;
      }
      st = st == S_LEAD_CR ? S_LEAD : S_FIELD0;
      break;
    case S_METHOD:
    case S_TARGET:
    case S_VERSION:
      rc = line_byte(&s, &st, i, c, out);
      break;
    default:
      rc = field_byte(&s, &st, i, c, out);
      if (rc == 1) {
        out->head_len = i + 1;
        return 0;
      }
      break;
    }
    if (rc < 0) return -1;
  }
  return LG__SCREEN_MORE;
}

int lg__screen_answer(const lg__screen_t *s, lg__buf_t *out) {
  lg__req_t rq;
  memset(&rq, 0, sizeof rq);
  lg__req_error(&rq, s->status, s->type, s->field, "%s", s->message);
  const char *reason = MHD_get_reason_phrase_for((unsigned)s->status);
  lg__buf_printf(out,
                 "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 s->status, reason && *reason ? reason : "Error", rq.out.len);
  lg__buf_append(out, rq.out.data, rq.out.len);
  if (rq.out.oom) out->oom = true;
  lg__buf_free(&rq.out);
  return out->oom ? LG_ENOMEM : 0;
}
