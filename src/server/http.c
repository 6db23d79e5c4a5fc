/*
 * http.c — one HTTP request, from its headers to its answer.
 *
 * The URI log callback (lg__http_uri_log) runs first, when the request
 * line is in: it makes the request's state and keeps the raw request
 * target, which routing uses (libmicrohttpd's `url` is already decoded).
 * Then libmicrohttpd calls lg__http_access several times per request: once
 * when the headers are in, once per piece of the body (*upload_size > 0:
 * the piece must be consumed by setting it to 0), and once more when the
 * body is complete (*upload_size == 0), which is when a handler runs and
 * the answer is queued. So:
 *
 *   headers   the checks of check_headers, in the order docs/security.md
 *             gives (sizes, open mode, token, ids, path, method, role,
 *             Content-Type); a Content-Length over the limit is 413;
 *   body      append, bounded by max_body; after an error found at the
 *             headers (or a chunked body past the limit) the body is read
 *             and dropped, for at most LG__DRAIN_NS and LG__DRAIN_BYTES,
 *             so that a client that writes before it reads gets the answer
 *             and not a reset (the reaper of server.c cuts a body that
 *             trickles past --timeout);
 *   complete  run the handler, or answer the error found before.
 *
 * Every answer is JSON: lg__req_error escapes what it echoes and turns
 * bytes that are not UTF-8 into U+FFFD.
 *
 * lg__http_completed (libmicrohttpd's completion callback) records the
 * request's latency and status in the metrics and frees what it held.
 */
#include "server.h"
#include "../gateway/gateway.h"
#include "../util/utf8.h" /* lg__hexval */

#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

/* One request in flight. Made by the URI log callback, when the request
 * line is in (so that routing sees the raw path), freed by the completion
 * callback. */
typedef struct http_req {
  lg__req_t rq;        /* what the handler sees and fills */
  lg__buf_t body;      /* the body so far */
  char *raw_uri;       /* the request target as sent (NULL: out of memory) */
  size_t raw_len;      /* its length (may be over LG__MAX_URI: then 414) */
  uint64_t t0_ns;      /* monotonic time of the request line */
  void (*handler)(lg__req_t *); /* NULL: answer the error in rq */
  int headers_seen;    /* the access handler ran once (the headers are in) */
  int errored;         /* rq holds an error to answer */
  int answered;        /* a response was queued */
  int parked;          /* suspended, waiting for its job */
  int draining;        /* a body over the limit is read and dropped, then 413 */
  uint64_t dropped;    /* bytes dropped so far */
  int gw_route;        /* a gateway route: its limit is --gateway-max-body */
} http_req_t;

/* The request's body limit: --max-body, or --gateway-max-body on the
 * gateway's routes. */
static size_t body_limit(const lg_server_t *srv, const http_req_t *hr) {
  return hr->gw_route ? srv->o.gateway_max_body : srv->o.max_body;
}

/* The 413 of a body over the request's limit (n: its declared length, 0
 * when chunked), naming the flag that sets it. */
static void too_large(const lg_server_t *srv, http_req_t *hr, unsigned long long n) {
  char len[48] = "over the limit of";
  if (n) snprintf(len, sizeof len, "%llu bytes; the limit is", n);
  lg__req_error(&hr->rq, 413, "payload_too_large", "body", "the body is %s %zu bytes (loopguard serve %s)",
                len, body_limit(srv, hr), hr->gw_route ? "--gateway-max-body" : "--max-body");
}

int lg__req_error(lg__req_t *rq, int status, const char *type, const char *field, const char *fmt,
                  ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rq->status = status;
  rq->content_type = NULL;
  rq->out.len = 0;
  rq->out.oom = false;
  if (rq->api_errors) return lg__gw_req_error(rq, status, type, field, msg);
  lg__buf_printf(&rq->out, "{\"error\":{\"code\":%d,\"type\":", status);
  lg__buf_json_str_lossy(&rq->out, type, strlen(type));
  lg__buf_puts(&rq->out, ",\"message\":");
  lg__buf_json_str_lossy(&rq->out, msg, strlen(msg));
  if (field && *field) {
    lg__buf_puts(&rq->out, ",\"field\":");
    lg__buf_json_str_lossy(&rq->out, field, strlen(field));
  }
  lg__buf_puts(&rq->out, "}}");
  return status;
}

/* ---- routing ----
 *
 * Routing is on the raw path of the request line (as the client sent it,
 * before any percent-decoding: the URI log callback keeps it), split at
 * '/'. Only the segments that are ids are decoded, each on its own, so an
 * encoded slash can never move a segment boundary ("/v1/runs/p%2Fcalls"
 * is not the run "p"). A decoded id must be what every id is
 * (lg__id_problem: UTF-8, no control characters, at most LG__ID_MAX
 * bytes); %00 is refused everywhere, and
 * %2F is refused in run ids and groups (which may not hold '/') but kept
 * in operation keys and budget scopes, which are client data that the
 * body of /v1/operations/claim may already hold. */

/* A route: the handler and the role it needs (NONE: open). */
typedef struct route_hit {
  lg__route_t route;
  void (*handler)(lg__req_t *);
  int role;           /* lg__role_t needed */
  const char *method; /* the method it answers */
  const char *allow;  /* the Allow header of a 405 (NULL: method) */
} route_hit_t;

/* Decodes one raw path segment [s, s+n) into a new string (*out), for an
 * id. Returns 0, or an error filled in rq (400) and -1; -2 on
 * out-of-memory. */
static int decode_id(lg__req_t *rq, const char *what, const char *s, size_t n, bool slash_ok,
                     char **out) {
  *out = NULL;
  char *d = lg__malloc(n + 1);
  if (!d) return -2;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int ch = (unsigned char)s[i];
    if (ch == '%') {
      if (i + 2 >= n) {
        lg__free(d);
        lg__req_error(rq, 400, "invalid_request", what, "%s: a %% that does not start %%XX", what);
        return -1;
      }
      int h = lg__hexval((unsigned char)s[i + 1]), l = lg__hexval((unsigned char)s[i + 2]);
      if (h < 0 || l < 0) {
        lg__free(d);
        lg__req_error(rq, 400, "invalid_request", what, "%s: a %% that does not start %%XX", what);
        return -1;
      }
      ch = h * 16 + l;
      i += 2;
      if (ch == 0 || (ch == '/' && !slash_ok)) {
        lg__free(d);
        lg__req_error(rq, 400, "invalid_request", what, "%s: an encoded %s is not allowed in a path",
                      what, ch ? "slash (%2F)" : "NUL (%00)");
        return -1;
      }
    }
    d[m++] = (char)ch;
  }
  d[m] = 0;
  const char *why = lg__id_problem(d, m);
  if (why) {
    lg__free(d);
    lg__req_error(rq, 400, "invalid_request", what, "%s: %s", what, why);
    return -1;
  }
  *out = d;
  return 0;
}

#define MAX_SEGS 8

/* A raw path cut at its slashes: seg[k] (not NUL-terminated) of len[k]. */
typedef struct path {
  const char *seg[MAX_SEGS];
  size_t len[MAX_SEGS];
  int n;
} path_t;

/* Cuts [p, p+n) (which starts with '/') into segments: 0 when there are too
 * many or one is empty ("//", a trailing '/'). */
static int split_path(const char *p, size_t n, path_t *pt) {
  pt->n = 0;
  for (size_t i = 1, a = 1; i <= n; i++) {
    if (i == n || p[i] == '/') {
      if (pt->n == MAX_SEGS || i == a) return 0;
      pt->seg[pt->n] = p + a;
      pt->len[pt->n] = i - a;
      pt->n++;
      a = i + 1;
    }
  }
  return 1;
}

#define IS(k, lit) (pt->len[k] == sizeof(lit) - 1 && !memcmp(pt->seg[k], lit, sizeof(lit) - 1))
#define HIT(rt, fn, role_, meth) (*hit = (route_hit_t){rt, fn, role_, meth, NULL})
/* Decodes segment k as the request's id: the route's answer (1), or the
 * error of decode_id. */
#define WITH_ID(k, what, slash)                                                              \
  do {                                                                                       \
    int rc_ = decode_id(rq, what, pt->seg[k], pt->len[k], slash, &rq->id_buf);                \
    return rc_ ? rc_ : 1;                                                                    \
  } while (0)

/* The console's files (console.c): open, like /healthz. */
static int route_console(lg__req_t *rq, const char *p, size_t n, route_hit_t *hit) {
  char path[64];
  if (n >= sizeof path) return 0;
  memcpy(path, p, n);
  path[n] = 0;
  if (!lg__console_path(path)) return 0;
  HIT(LG__RT_CONSOLE, lg__h_console, LG__ROLE_NONE, "GET");
  rq->id_buf = lg__strdup(path);
  return rq->id_buf ? 1 : -2;
}

/* /healthz, /metrics, /openapi.json. */
static int route_top(const path_t *pt, route_hit_t *hit) {
  if (pt->n != 1) return 0;
  if (IS(0, "healthz")) HIT(LG__RT_HEALTHZ, lg__h_healthz, LG__ROLE_NONE, "GET");
  else if (IS(0, "metrics")) HIT(LG__RT_METRICS, lg__h_metrics, LG__ROLE_AGENT, "GET");
  else if (IS(0, "openapi.json")) HIT(LG__RT_OPENAPI, lg__h_openapi, LG__ROLE_NONE, "GET");
  else return 0;
  return 1;
}

/* /v1/key (the key itself authenticates: keys_routes.c), /v1/keys[/H[/rotate]]. */
static int route_keys(lg__req_t *rq, const path_t *pt, const char *method, route_hit_t *hit) {
  int get = !strcmp(method, "GET");
  if (pt->n == 2 && IS(1, "key")) {
    HIT(LG__RT_KEY_SELF, lg__h_key_self, LG__ROLE_NONE, "GET");
    return 1;
  }
  if (!IS(1, "keys")) return 0;
  if (pt->n == 2) {
    HIT(LG__RT_KEYS, lg__h_keys, LG__ROLE_OPERATOR, get ? "GET" : "POST");
    hit->allow = "GET, POST";
    return 1;
  }
  if (pt->n == 3) {
    HIT(LG__RT_KEY, lg__h_keys, LG__ROLE_OPERATOR, get ? "GET" : "PATCH");
    hit->allow = "GET, PATCH";
  } else if (pt->n == 4 && IS(3, "rotate")) {
    HIT(LG__RT_KEY_ROTATE, lg__h_keys, LG__ROLE_OPERATOR, "POST");
  } else {
    return 0;
  }
  WITH_ID(2, "hash", false);
}

/* What /v1/runs/{id}/SUFFIX does. */
static const struct {
  const char *suffix;
  lg__route_t rt;
  void (*fn)(lg__req_t *);
  int role;
  const char *method;
} run_subs[] = {
    {"calls", LG__RT_CALLS, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"results", LG__RT_RESULTS, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"state", LG__RT_STATE, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"handoffs", LG__RT_HANDOFFS, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"model", LG__RT_MODEL, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"usage", LG__RT_USAGE, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"text", LG__RT_TEXT, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"user", LG__RT_USER, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"compaction", LG__RT_COMPACTION, lg__h_decide, LG__ROLE_AGENT, "POST"},
    {"resume", LG__RT_RESUME, lg__h_decide, LG__ROLE_OPERATOR, "POST"},
    {"cancel", LG__RT_RUN_CANCEL, lg__h_run_cancel, LG__ROLE_OPERATOR, "POST"},
    {"trace", LG__RT_TRACE, lg__h_trace, LG__ROLE_AGENT, "GET"},
    {"regression", LG__RT_REGRESSION, lg__h_regression, LG__ROLE_AGENT, "GET"},
};

/* /v1/runs, /v1/runs/{id}, /v1/runs/{id}/SUFFIX. */
static int route_runs(lg__req_t *rq, const path_t *pt, const char *method, route_hit_t *hit) {
  if (pt->n == 2) {
    if (!strcmp(method, "GET")) HIT(LG__RT_RUN_LIST, lg__h_run_list, LG__ROLE_OPERATOR, "GET");
    else HIT(LG__RT_RUN_CREATE, lg__h_run_create, LG__ROLE_AGENT, "POST");
    hit->allow = "GET, POST";
    return 1;
  }
  if (pt->n == 3) {
    HIT(LG__RT_RUN_GET, lg__h_run_get, LG__ROLE_AGENT, "GET");
    WITH_ID(2, "run_id", false);
  }
  if (pt->n != 4) return 0;
  for (size_t i = 0; i < sizeof run_subs / sizeof run_subs[0]; i++) {
    if (pt->len[3] == strlen(run_subs[i].suffix) &&
        !memcmp(pt->seg[3], run_subs[i].suffix, pt->len[3])) {
      HIT(run_subs[i].rt, run_subs[i].fn, run_subs[i].role, run_subs[i].method);
      WITH_ID(2, "run_id", false);
    }
  }
  return 0;
}

/* /v1/operations/claim, /v1/operations/{key}[/commit|/fail]. */
static int route_operations(lg__req_t *rq, const path_t *pt, route_hit_t *hit) {
  if (pt->n == 3 && IS(2, "claim")) {
    HIT(LG__RT_OP_CLAIM, lg__h_op_claim, LG__ROLE_AGENT, "POST");
    return 1;
  }
  if (pt->n == 3) HIT(LG__RT_OP_GET, lg__h_op_get, LG__ROLE_AGENT, "GET");
  else if (pt->n == 4 && IS(3, "commit")) HIT(LG__RT_OP_COMMIT, lg__h_op_commit, LG__ROLE_AGENT, "POST");
  else if (pt->n == 4 && IS(3, "fail")) HIT(LG__RT_OP_FAIL, lg__h_op_fail, LG__ROLE_AGENT, "POST");
  else return 0;
  WITH_ID(2, "key", true);
}

/* Matches the raw path (no query) [p, p+n). Fills *hit and rq->id (a new
 * string, decoded). Returns 1 when the path exists (whatever the method), 0
 * when not, -1 with a 400 in rq for a bad id, -2 on out-of-memory. */
static int route(lg__req_t *rq, const char *p, size_t n, const char *method, route_hit_t *hit) {
  memset(hit, 0, sizeof *hit);
  hit->route = LG__RT_OTHER;
  if (!n || p[0] != '/') return 0;
  int rc = route_console(rq, p, n, hit);
  if (rc) return rc;
  path_t path, *pt = &path;
  if (!split_path(p, n, pt)) return 0;
  if (route_top(pt, hit)) return 1;
  if (pt->n < 2 || !IS(0, "v1")) return 0;
  if ((rc = route_keys(rq, pt, method, hit))) return rc;
  if (IS(1, "runs")) return route_runs(rq, pt, method, hit);
  if (IS(1, "operations")) return route_operations(rq, pt, hit);
  if (IS(1, "groups") && pt->n == 4 && IS(3, "cancel")) {
    HIT(LG__RT_GROUP_CANCEL, lg__h_group_cancel, LG__ROLE_OPERATOR, "POST");
    WITH_ID(2, "group", false);
  }
  /* The shared budgets (the spend gate). Roles: PUT is operator; GET,
   * reserve and settle are agent. */
  if (IS(1, "budgets") && pt->n == 2) {
    HIT(LG__RT_BUDGET_LIST, lg__h_budget_list, LG__ROLE_OPERATOR, "GET");
    return 1;
  }
  if (IS(1, "budgets") && pt->n == 3) {
    HIT(LG__RT_BUDGETS, lg__h_budgets,
        !strcmp(method, "PUT") ? LG__ROLE_OPERATOR : LG__ROLE_AGENT, method);
    WITH_ID(2, "scope", true);
  }
  return 0;
}
#undef WITH_ID
#undef HIT
#undef IS

int lg__http_probe(const char *target, size_t n, const char *method, char **id, char **body,
                   size_t *body_len) {
  lg__req_t rq;
  memset(&rq, 0, sizeof rq);
  *id = NULL;
  *body = NULL;
  *body_len = 0;
  const char *q = memchr(target, '?', n);
  size_t plen = q ? (size_t)(q - target) : n;
  route_hit_t hit;
  int found = route(&rq, target, plen, method, &hit);
  int rc = found;
  if (found == 0) {
    lg__req_error(&rq, 404, "not_found", NULL, "no endpoint %s %.*s", method, (int)plen, target);
    rc = 404;
  } else if (found == -1) {
    rc = 400;
  } else if (found == -2) {
    rc = 500;
  }
  *id = rq.id_buf;
  *body = lg__buf_steal(&rq.out, body_len);
  return rc;
}

/* ---- the open mode's rules (no tokens: loopback only) ----
 *
 * A browser on the same machine can reach a loopback server: a page can
 * POST a "simple" request (text/plain, a form) to 127.0.0.1 without a
 * preflight, and DNS rebinding can make evil.example resolve to 127.0.0.1
 * so that its scripts read the answers. So, with no tokens, a request must
 * name a loopback host (localhost, 127.x.x.x, [::1], any port), must not
 * come from a foreign Origin (none, "null" refused, or a loopback origin on
 * this server's port), and a body must be application/json (which a page
 * cannot send cross-origin without a preflight that this server does not
 * answer). */

/* 1 when [h, h+n) (a Host value or an Origin's host[:port]) names a
 * loopback host; *port gets the port (-1 when absent, -2 when malformed). */
int lg__http_loopback_host(const char *h, size_t n, long *port) {
  const char *end = h + n, *colon = NULL, *name_end;
  *port = -1;
  if (n && h[0] == '[') {
    const char *close = memchr(h, ']', n);
    if (!close) return 0;
    name_end = close + 1;
    if (name_end < end) {
      if (*name_end != ':') return 0;
      colon = name_end;
    }
    if (!((size_t)(close - h) == 4 && !memcmp(h, "[::1", 4))) return 0;
  } else {
    colon = memchr(h, ':', n);
    name_end = colon ? colon : end;
    size_t hl = (size_t)(name_end - h);
    bool ok = false;
    if ((hl == 9 && !strncasecmp(h, "localhost", 9)) ||
        (hl == 10 && !strncasecmp(h, "localhost.", 10))) {
      ok = true;
    } else if (hl >= 7 && hl <= 15 && !memcmp(h, "127.", 4)) {
      int dots = 0, digits = 0;
      ok = true;
      for (const char *q = h; q < name_end; q++) {
        if (*q == '.') {
          if (!digits) ok = false;
          dots++, digits = 0;
        } else if (*q >= '0' && *q <= '9' && digits < 3) {
          digits++;
        } else {
          ok = false;
        }
      }
      if (dots != 3 || !digits) ok = false;
    }
    if (!ok) return 0;
  }
  if (colon) {
    long v = 0;
    const char *q = colon + 1;
    if (q == end) return 0;
    for (; q < end; q++) {
      if (*q < '0' || *q > '9' || v > 65535) return 0;
      v = v * 10 + (*q - '0');
    }
    if (v > 65535) return 0;
    *port = v;
  }
  return 1;
}

/* The open mode's checks: 0, or an error filled in rq. */
static int open_mode_checks(lg_server_t *srv, lg__req_t *rq, struct MHD_Connection *c) {
  const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  long port;
  if (!host || !lg__http_loopback_host(host, strlen(host), &port)) {
    lg__req_error(rq, 403, "forbidden", "Host",
                  "Host: with no tokens configured the server answers only requests that name a "
                  "loopback host (localhost, 127.0.0.1, [::1]); got \"%s\"",
                  host ? host : "(none)");
    return -1;
  }
  const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  if (origin) {
    const char *h = !strncasecmp(origin, "http://", 7) ? origin + 7 : NULL;
    long oport = -1;
    int ok = h && lg__http_loopback_host(h, strlen(h), &oport) && oport == srv->port;
    if (!ok) {
      lg__req_error(rq, 403, "forbidden", "Origin",
                    "Origin: with no tokens configured, requests from web pages of other origins "
                    "are refused; got \"%s\"",
                    origin);
      return -1;
    }
  }
  return 0;
}

/* 1 when the request has a body (a Content-Length above 0, or chunked). */
static int has_body(struct MHD_Connection *c) {
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl && strcmp(cl, "0")) return 1;
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

/* 1 when the Content-Type is application/json (parameters allowed). */
static int is_json_type(const char *ct) {
  if (!ct) return 0;
  while (*ct == ' ' || *ct == '\t') ct++;
  if (strncasecmp(ct, "application/json", 16)) return 0;
  ct += 16;
  while (*ct == ' ' || *ct == '\t') ct++;
  return !*ct || *ct == ';';
}

/* What the request head holds, counted as the screen counts a first head
 * (screen.c): its bytes (line and headers) with the Cookie header's value
 * twice, and its fields (header lines, cookies, query parameters). */
typedef struct head_size {
  size_t n, fields;
  int cookie;
} head_size_t;
static enum MHD_Result add_header_size(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
  head_size_t *hs = cls;
  hs->fields++;
  if (kind == MHD_HEADER_KIND) {
    size_t v = value ? strlen(value) : 0;
    hs->n += strlen(key) + v + 4;
    if (!strcasecmp(key, "Cookie")) hs->n += v + 1, hs->cookie = 1;
  }
  return MHD_YES;
}

/* Called by the committer (or a gateway worker): the connection may go on.
 * Nothing of j or c is read once c is resumed: a thread running the loop
 * (its own, or a gateway worker in lg__loop_serve) may answer it and free
 * the job at once. */
static void job_done(lg__job_t *j) {
  struct MHD_Connection *c = j->owner;
  lg__loop_t *l = lg__conn_loop(c);
  int serve = j->may_serve;
  MHD_resume_connection(c);
  if (lg__loop_turns_next(l)) return;
  if (serve) lg__loop_serve(l);
  else if (l) lg__loop_wake(l);
}

/* ---- answering ---- */

static enum MHD_Result answer(lg_server_t *srv, struct MHD_Connection *c, http_req_t *hr) {
  lg__req_t *rq = &hr->rq;
  if (rq->out.oom) lg__req_error(rq, 500, "internal", NULL, "out of memory building the answer");
  if (!rq->status) rq->status = 500;
  size_t len = rq->out.len;
  char *body = lg__buf_steal(&rq->out, NULL);
  struct MHD_Response *r;
  bool own = rq->response != NULL; /* built whole by the handler */
  if (own) {
    lg__free(body);
    body = NULL;
    r = rq->response;
    rq->response = NULL;
  } else if (body)
    r = MHD_create_response_from_buffer_with_free_callback(len, body, lg__free);
  else
    r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
  if (!r) {
    lg__free(body);
    return MHD_NO;
  }
  if (!own)
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            rq->content_type ? rq->content_type : "application/json");
  lg__console_headers(r, rq);
  if (rq->status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  if (rq->status == 405 && rq->allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, rq->allow);
  if (rq->status == 429 && rq->retry_after > 0) {
    char ra[24];
    snprintf(ra, sizeof ra, "%d", rq->retry_after);
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
  }
  if (atomic_load(&srv->draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)rq->status, r);
  MHD_destroy_response(r);
  hr->answered = 1;
  return ok;
}

static void free_req(http_req_t *hr) {
  if (hr->rq.response) MHD_destroy_response(hr->rq.response); /* never queued */
  lg__buf_free(&hr->body);
  lg__buf_free(&hr->rq.out);
  lg__free(hr->rq.id_buf);
  lg__free(hr->raw_uri);
  lg__free(hr);
}

void *lg__http_uri_log(void *cls, const char *uri, struct MHD_Connection *c) {
  lg_server_t *srv = cls;
  http_req_t *hr = lg__calloc(1, sizeof *hr);
  if (!hr) return NULL; /* the access handler refuses the request */
  atomic_fetch_add(&srv->inflight, 1);
  hr->t0_ns = lg__mono_ns();
  hr->raw_len = uri ? strlen(uri) : 0;
  hr->raw_uri = lg__strndup(uri ? uri : "", hr->raw_len > LG__MAX_URI ? LG__MAX_URI : hr->raw_len);
  lg__conn_phase(srv, c, LG__PH_REQUEST);
  return hr;
}

/* The checks of the headers, in order: the request line (414), the head's
 * size (431), the open mode's Host and Origin (403), the token (401:
 * before any 404 or 405, so that an unauthenticated client learns nothing
 * of the paths), a bad id (400), the path (404), the method (405), the
 * role (403), the body's type (415). Leaves an error in hr->rq
 * (hr->errored) or the handler in hr->handler. */
static void check_headers(lg_server_t *srv, struct MHD_Connection *c, http_req_t *hr,
                          const char *method) {
  lg__req_t *rq = &hr->rq;
#define FAIL(...)                                                                                  \
  do {                                                                                             \
    lg__req_error(rq, __VA_ARGS__);                                                                \
    hr->errored = 1;                                                                               \
    return;                                                                                        \
  } while (0)
  if (!hr->raw_uri) FAIL(500, "internal", NULL, "out of memory");
  if (hr->raw_len > LG__MAX_URI)
    FAIL(414, "uri_too_long", "path", "the request target is %zu bytes; the limit is %d",
         hr->raw_len, LG__MAX_URI);
  /* "METHOD SP TARGET SP HTTP/1.1 CRLF", each "Name: value CRLF", the empty line */
  head_size_t hs = {strlen(method) + 1 + hr->raw_len + 11 + 2, 0, 0};
  MHD_get_connection_values(c, MHD_HEADER_KIND | MHD_COOKIE_KIND | MHD_GET_ARGUMENT_KIND,
                            add_header_size, &hs);
  if (hs.n > LG__MAX_HEAD)
    FAIL(431, "headers_too_large", "headers",
         "the request head is %zu bytes%s; the limit is %d", hs.n,
         hs.cookie ? " (its Cookie header counts twice)" : "", LG__MAX_HEAD);
  if (hs.fields > LG__MAX_FIELDS)
    FAIL(431, "headers_too_large", "headers",
         "the request head has %zu fields (header lines, cookies and query parameters); the "
         "limit is %d",
         hs.fields, LG__MAX_FIELDS);
  if (!srv->auth.n && open_mode_checks(srv, rq, c)) {
    hr->errored = 1;
    return;
  }
  const char *path = hr->raw_uri;
  const char *q = strchr(path, '?');
  size_t plen = q ? (size_t)(q - path) : strlen(path);
  route_hit_t hit;
  int found = route(rq, path, plen, method, &hit);
  if (!found && srv->gw) { /* gateway-v1: the model APIs and other /v1/ paths */
    char *url = lg__strndup(path, plen);
    if (!url) FAIL(500, "internal", NULL, "out of memory");
    if (lg__gw_claims(srv->gw, url)) {
      lg__free(rq->id_buf);
      rq->id_buf = url;
      rq->api_errors = lg__gw_error_api(
          url, method, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version") != NULL);
      rq->query = q;
      hr->gw_route = 1;
      hit = (route_hit_t){LG__RT_GATEWAY, lg__gw_handle, LG__ROLE_AGENT, method, NULL};
      found = 1;
    } else {
      lg__free(url);
    }
  }
  rq->route = hit.route;
  rq->id = rq->id_buf;
  /* A model API's path the gateway does not serve (a base URL without
   * /v1; an Azure path with no Azure upstream): a client's mistake, whose
   * 404 below says what to change, in the OpenAI shape its SDK reads.
   * With tokens it is a gateway request for the credentials it needs, so
   * that a client with a loopguard key gets that 404, not a 401 that
   * blames its key. */
  bool no_v1 = !found && srv->gw && lg__gw_lacks_v1(path, plen);
  bool no_azure = !found && srv->gw && plen >= 8 && !memcmp(path, "/openai/", 8);
  bool gw_miss = no_v1 || no_azure;
  bool gw_req = hit.handler == lg__gw_handle || gw_miss;
  if (gw_miss) rq->api_errors = 1;
  lg__role_t role = LG__ROLE_NONE;
  bool open_route = found > 0 && hit.role == LG__ROLE_NONE;
  if (srv->auth.n && !open_route) {
    const char *az = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    /* A gateway request with a loopguard key (Bearer, or x-api-key as
     * Anthropic clients send it, api-key as Azure OpenAI's do): the
     * gateway checks the key. */
    bool keyed = lg__auth_key_secret(az) || lg__auth_key_value(c, 1);
    /* gateway-v1: with tokens, every gateway request needs a loopguard
     * key; an agent or operator token is not a gateway credential. */
    if (gw_req && !keyed)
      FAIL(401, "invalid_api_key", NULL,
           "this gateway needs a loopguard key: send Authorization: Bearer lgk-... (or "
           "x-api-key: lgk-..., or api-key: lgk-...)%s; an operator creates one with POST /v1/keys or `loopguard "
           "keys create`",
           lg__auth_role(&srv->auth, az) != LG__ROLE_NONE ? ", not a loopguard token" : "");
    role = gw_req ? LG__ROLE_AGENT : lg__auth_role(&srv->auth, az);
    if (role == LG__ROLE_NONE)
      FAIL(401, "unauthorized", NULL,
           "a valid bearer token is required (Authorization: Bearer TOKEN)");
  }
  if (found == -2) FAIL(500, "internal", NULL, "out of memory");
  if (found == -1) {
    hr->errored = 1; /* the 400 of a bad id, filled by route() */
    return;
  }
  if (no_v1)
    FAIL(404, "not_found", NULL,
         "no endpoint %s %.*s: the gateway's paths start with /v1 (%s /v1%.*s), so an OpenAI "
         "client's base URL ends in /v1; an Anthropic client's does not (its SDK adds /v1)",
         method, (int)plen, path, method, (int)plen, path);
  /* an AzureOpenAI client's (/openai/deployments/NAME/...), or one whose
   * base URL is an Azure resource's v1 API (/openai/v1/...), and no
   * upstream is an Azure resource's classic API to send them to
   * (lg__gw_claims) */
  if (no_azure)
    FAIL(404, "not_found", NULL,
         "no endpoint %s %.*s: no upstream of this gateway is an Azure OpenAI resource; give it "
         "the resource as an upstream (--upstream https://RESOURCE.openai.azure.com/openai, or "
         "\"api\": \"azure\" in an --upstreams file for another host) for an "
         "AzureOpenAI client whose endpoint is the gateway, or its v1 API "
         "(https://RESOURCE.openai.azure.com/openai/v1) for an OpenAI client whose base URL is the "
         "gateway's /v1",
         method, (int)plen, path);
  if (!found) FAIL(404, "not_found", NULL, "no endpoint %s %.*s", method, (int)plen, path);
  if (hit.route == LG__RT_BUDGETS) {
    bool post = !strcmp(rq->id, "reserve") || !strcmp(rq->id, "settle");
    if (post ? strcmp(method, "POST") != 0 : strcmp(method, "GET") && strcmp(method, "PUT")) {
      rq->allow = post ? "POST" : "GET, PUT";
      FAIL(405, "invalid_request", NULL, "%s %.*s: method not allowed; use %s", method, (int)plen,
           path, rq->allow);
    }
  } else if (strcmp(method, hit.method)) {
    rq->allow = hit.allow ? hit.allow : hit.method;
    FAIL(405, "invalid_request", NULL, "%s %.*s: method not allowed; use %s", method, (int)plen,
         path, hit.method);
  }
  if (srv->auth.n && hit.role != LG__ROLE_NONE && (int)role < hit.role)
    FAIL(403, "forbidden", NULL, "%s %.*s needs the operator role", method, (int)plen, path);
  /* JSON bodies only, as they are, but for a path the gateway passes
   * through: an upload (multipart/form-data) goes on with its own type
   * (and encoding). A gzip body read as JSON would be "not a JSON
   * object": said for what it is instead. In the open mode, a body of
   * another type also needs the client's credential header, as every SDK
   * sends it: a web page can post a form to loopback without asking, but
   * not with an Authorization or x-api-key header (security.md). */
  bool body = has_body(c), pass = body && hr->gw_route && !lg__gw_guards(rq->id, method);
  bool as_is = pass && (srv->auth.n || MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization") ||
                        lg__auth_key_value(c, 0));
  if (body && !as_is) {
    if (!is_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)))
      FAIL(415, "unsupported_media_type", "Content-Type", "%s",
           pass ? "Content-Type: a request body must be application/json, or come with the "
                  "client's Authorization (or x-api-key) header to be passed through as it is"
                : "Content-Type: a request body must be application/json");
    const char *ce = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    if (ce && strcasecmp(ce, "identity"))
      FAIL(415, "unsupported_media_type", "Content-Encoding",
           "Content-Encoding: %.40s: a request body must be sent as it is (not encoded)", ce);
  }
  hr->handler = hit.handler;
#undef FAIL
}

enum MHD_Result lg__http_access(void *cls, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_size, void **con_cls) {
  (void)version;
  (void)url; /* decoded by libmicrohttpd: routing uses the raw target */
  lg_server_t *srv = cls;
  http_req_t *hr = *con_cls;
  if (!hr) return MHD_NO; /* the URI log callback ran out of memory */
  if (!hr->headers_seen) { /* the headers are in */
    hr->headers_seen = 1;
    lg__req_t *rq = &hr->rq;
    rq->srv = srv;
    rq->conn = c;
    rq->method = method; /* MHD keeps it for the whole request */
    rq->route = LG__RT_OTHER;
    check_headers(srv, c, hr, method);
    /* A declared body over the limit: 413 (after a 401: the token comes
     * first). With "Expect: 100-continue" the client waits, so the answer
     * goes now, and so it does when the body is far over the limit; any
     * other client is sending the body already, so it is read and dropped
     * (bounded: LG__DRAIN_*) and the 413 answered once it is in: closing
     * on unread bytes resets the connection before the client has read
     * the answer. */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      unsigned long long n = strtoull(cl, NULL, 10);
      /* Room for the declared body at once, not grown piece by piece (a
       * realloc a doubling); a large one still grows as it arrives, so a
       * Content-Length alone never holds memory. */
      size_t limit = body_limit(srv, hr);
      if (n <= limit && n <= LG__BODY_PREALLOC) lg__buf_reserve(&hr->body, (size_t)n);
      if (n > limit) {
        if (!hr->errored || rq->status != 401) too_large(srv, hr, n);
        hr->errored = 1;
        hr->handler = NULL;
        const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        if ((ex && !strcasecmp(ex, "100-continue")) || n > LG__DRAIN_BYTES)
          return answer(srv, c, hr);
      }
    }
    return MHD_YES;
  }
  if (*upload_size) { /* a piece of the body */
    size_t n = *upload_size;
    *upload_size = 0;
    if (hr->answered) return MHD_YES; /* answered early: the rest is dropped */
    if (hr->errored) { /* read and dropped, bounded */
      hr->dropped += n;
      if (hr->dropped > LG__DRAIN_BYTES || lg__mono_ns() - hr->t0_ns > LG__DRAIN_NS) return MHD_NO;
      return MHD_YES;
    }
    if (hr->body.len + n > body_limit(srv, hr)) { /* chunked, grown past the limit */
      too_large(srv, hr, 0);
      hr->errored = 1;
      hr->handler = NULL;
      hr->dropped = hr->body.len + n;
      lg__buf_free(&hr->body);
      return MHD_YES;
    }
    if (lg__buf_append(&hr->body, upload, n)) return MHD_NO;
    return MHD_YES;
  }
  if (hr->answered) return MHD_YES;
  lg__req_t *rq = &hr->rq;
  if (hr->parked) { /* resumed: the job is done */
    hr->parked = 0;
    rq->finish(rq);
    return answer(srv, c, hr);
  }
  /* The whole request is in. */
  lg__conn_phase(srv, c, LG__PH_BUSY);
  if (!hr->errored && hr->handler) {
    rq->body = hr->body.data ? hr->body.data : "";
    rq->body_len = hr->body.len;
    rq->body_buf = &hr->body;
    hr->handler(rq);
    if (rq->job) {
      /* Park the connection first, then hand the job over: the job may
       * be done (and resume the connection) before this returns. */
      hr->parked = 1;
      rq->job->owner = c;
      rq->job->done = job_done;
      MHD_suspend_connection(c);
      if (rq->submit) rq->submit(rq);
      else lg__batcher_submit(srv->batcher, rq->job);
      return MHD_YES;
    }
  }
  return answer(srv, c, hr);
}

void lg__http_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe) {
  (void)toe;
  lg_server_t *srv = cls;
  http_req_t *hr = *con_cls;
  lg__conn_phase(srv, c, LG__PH_IDLE);
  if (!hr) return;
  *con_cls = NULL;
  /* Parked, then resumed, but the client went away before its answer was
   * made: the decision was made and stored all the same, so it is counted
   * and logged, and its job freed. (A parked connection is never closed:
   * it is resumed first, when its job is done.) */
  if (hr->parked && hr->rq.finish) {
    hr->parked = 0;
    hr->rq.finish(&hr->rq);
  }
  lg__metrics_request(&srv->metrics, hr->rq.route, hr->answered ? hr->rq.status : 0,
                      lg__mono_ns() - hr->t0_ns);
  atomic_fetch_sub(&srv->inflight, 1);
  free_req(hr);
}

/* ---- a budget's refusal ---- */

int lg__http_refusal_status(const lg_budget_refusal_t *r) {
  if (r->retry_after_s > 0) return 429;
  return r->kind == LG_SCOPE_WORKSPACE ? 403 : 402;
}

char *lg__http_refusal_json(const lg_budget_refusal_t *r) {
  lg__buf_t b = {0};
  lg__buf_printf(&b, "{\"error\":{\"code\":%d,\"type\":", lg__http_refusal_status(r));
  const char *type = r->type ? r->type : "budget_exceeded";
  lg__buf_json_str(&b, type, strlen(type));
  lg__buf_puts(&b, ",\"message\":");
  lg__buf_json_str(&b, r->message, strlen(r->message));
  lg__buf_puts(&b, ",\"metadata\":");
  lg__budget_refusal_metadata(&b, r);
  lg__buf_puts(&b, "}}");
  return lg__buf_steal(&b, NULL);
}
