/*
 * http.c — one HTTP request, from its headers to its answer.
 *
 * libmicrohttpd calls lg__http_access several times per request: once
 * when the headers are in (*con_cls is still NULL), once per piece of the
 * body (*upload_size > 0: the piece must be consumed by setting it to 0),
 * and once more when the body is complete (*upload_size == 0), which is
 * when a handler runs and the answer is queued. So:
 *
 *   headers   route the path, check the token and the role, and refuse a
 *             Content-Length over the limit with 413 right away, without
 *             reading the body (the connection is closed after it);
 *   body      append, bounded by max_body (a body without Content-Length
 *             that grows past it is cut off) and by the timeout (a client
 *             that trickles its body is cut off too);
 *   complete  run the handler, or answer the error found at the headers
 *             (the body was read and dropped, so keep-alive still works).
 *
 * lg__http_completed (libmicrohttpd's completion callback) records the
 * request's latency and status in the metrics and frees what it held.
 */
#include "server.h"
#include "../gateway/gateway.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One request in flight. */
typedef struct http_req {
  lg__req_t rq;        /* what the handler sees and fills */
  lg__buf_t body;      /* the body so far */
  uint64_t t0_ns;      /* monotonic time of the headers */
  void (*handler)(lg__req_t *); /* NULL: answer the error in rq */
  int errored;         /* rq holds an error to answer */
  int answered;        /* a response was queued */
  int parked;          /* suspended, waiting for its job */
} http_req_t;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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
  lg__buf_printf(&rq->out, "{\"error\":{\"code\":%d,\"type\":\"%s\",\"message\":", status, type);
  lg__buf_json_str(&rq->out, msg, strlen(msg));
  if (field && *field) {
    lg__buf_puts(&rq->out, ",\"field\":");
    lg__buf_json_str(&rq->out, field, strlen(field));
  }
  lg__buf_puts(&rq->out, "}}");
  return status;
}

/* ---- routing ---- */

/* A route: the handler and the role it needs (NONE: open). */
typedef struct route_hit {
  lg__route_t route;
  void (*handler)(lg__req_t *);
  int role;           /* lg__role_t needed */
  const char *method; /* the method it answers */
  const char *allow;  /* the Allow header of a 405 (NULL: method) */
} route_hit_t;

static bool starts(const char *s, const char *prefix, const char **rest) {
  size_t n = strlen(prefix);
  if (strncmp(s, prefix, n)) return false;
  *rest = s + n;
  return true;
}

static bool ends(const char *s, size_t len, const char *suffix) {
  size_t n = strlen(suffix);
  return len > n && !memcmp(s + len - n, suffix, n);
}

/* Matches the path; fills *hit and the id (a new string) from the path.
 * Returns 1 when the path exists (whatever the method), 0 when not, -1 on
 * out-of-memory. */
static int route(const char *url, const char *method, route_hit_t *hit, char **id) {
  const char *rest;
  *id = NULL;
  memset(hit, 0, sizeof *hit);
  hit->route = LG__RT_OTHER;
#define HIT(rt, fn, role_, meth) (*hit = (route_hit_t){rt, fn, role_, meth, NULL})
  if (!strcmp(url, "/healthz")) {
    HIT(LG__RT_HEALTHZ, lg__h_healthz, LG__ROLE_NONE, "GET");
    return 1;
  }
  if (lg__console_path(url)) { /* console.c: open, like /healthz */
    HIT(LG__RT_CONSOLE, lg__h_console, LG__ROLE_NONE, "GET");
    *id = lg__strdup(url);
    return 1;
  }
  if (!strcmp(url, "/metrics")) {
    HIT(LG__RT_METRICS, lg__h_metrics, LG__ROLE_AGENT, "GET");
    return 1;
  }
  if (!strcmp(url, "/openapi.json")) {
    HIT(LG__RT_OPENAPI, lg__h_openapi, LG__ROLE_NONE, "GET");
    return 1;
  }
  if (!strcmp(url, "/v1/budgets")) {
    HIT(LG__RT_BUDGET_LIST, lg__h_budget_list, LG__ROLE_OPERATOR, "GET");
    return 1;
  }
  if (!strcmp(url, "/v1/runs")) {
    if (!strcmp(method, "GET")) HIT(LG__RT_RUN_LIST, lg__h_run_list, LG__ROLE_OPERATOR, "GET");
    else HIT(LG__RT_RUN_CREATE, lg__h_run_create, LG__ROLE_AGENT, "POST");
    hit->allow = "GET, POST";
    return 1;
  }
  if (starts(url, "/v1/runs/", &rest) && *rest) {
    static const struct {
      const char *suffix;
      lg__route_t rt;
      void (*fn)(lg__req_t *);
      int role;
      const char *method;
    } subs[] = {
        {"/calls", LG__RT_CALLS, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/results", LG__RT_RESULTS, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/state", LG__RT_STATE, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/handoffs", LG__RT_HANDOFFS, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/model", LG__RT_MODEL, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/usage", LG__RT_USAGE, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/text", LG__RT_TEXT, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/user", LG__RT_USER, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/compaction", LG__RT_COMPACTION, lg__h_decide, LG__ROLE_AGENT, "POST"},
        {"/resume", LG__RT_RESUME, lg__h_decide, LG__ROLE_OPERATOR, "POST"},
        {"/cancel", LG__RT_RUN_CANCEL, lg__h_run_cancel, LG__ROLE_OPERATOR, "POST"},
        {"/trace", LG__RT_TRACE, lg__h_trace, LG__ROLE_AGENT, "GET"},
        {"/regression", LG__RT_REGRESSION, lg__h_regression, LG__ROLE_AGENT, "GET"},
    };
    size_t len = strlen(rest);
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
      if (ends(rest, len, subs[i].suffix)) {
        HIT(subs[i].rt, subs[i].fn, subs[i].role, subs[i].method);
        *id = lg__strndup(rest, len - strlen(subs[i].suffix));
        return 1;
      }
    HIT(LG__RT_RUN_GET, lg__h_run_get, LG__ROLE_AGENT, "GET");
    *id = lg__strdup(rest);
    return 1;
  }
  if (starts(url, "/v1/groups/", &rest) && ends(rest, strlen(rest), "/cancel")) {
    HIT(LG__RT_GROUP_CANCEL, lg__h_group_cancel, LG__ROLE_OPERATOR, "POST");
    *id = lg__strndup(rest, strlen(rest) - 7);
    return 1;
  }
  if (!strcmp(url, "/v1/operations/claim")) {
    HIT(LG__RT_OP_CLAIM, lg__h_op_claim, LG__ROLE_AGENT, "POST");
    return 1;
  }
  if (starts(url, "/v1/operations/", &rest) && *rest) {
    size_t len = strlen(rest);
    if (!strcmp(method, "POST") && ends(rest, len, "/commit")) {
      HIT(LG__RT_OP_COMMIT, lg__h_op_commit, LG__ROLE_AGENT, "POST");
      *id = lg__strndup(rest, len - 7);
    } else if (!strcmp(method, "POST") && ends(rest, len, "/fail")) {
      HIT(LG__RT_OP_FAIL, lg__h_op_fail, LG__ROLE_AGENT, "POST");
      *id = lg__strndup(rest, len - 5);
    } else {
      HIT(LG__RT_OP_GET, lg__h_op_get, LG__ROLE_AGENT, "GET");
      *id = lg__strdup(rest);
    }
    return 1;
  }
  /* The shared budgets (the spend gate). Roles: PUT is operator; GET,
   * reserve and settle are agent. */
  if (starts(url, "/v1/budgets/", &rest) && *rest) {
    HIT(LG__RT_BUDGETS, lg__h_budgets, !strcmp(method, "PUT") ? LG__ROLE_OPERATOR : LG__ROLE_AGENT,
        method);
    *id = lg__strdup(rest);
    return 1;
  }
#undef HIT
  return 0;
}

static int route_or_oom(const char *url, const char *method, route_hit_t *hit, char **id) {
  int found = route(url, method, hit, id);
  bool wants_id = found && hit->route != LG__RT_HEALTHZ && hit->route != LG__RT_METRICS &&
                  hit->route != LG__RT_OPENAPI && hit->route != LG__RT_BUDGET_LIST &&
                  hit->route != LG__RT_RUN_LIST && hit->route != LG__RT_RUN_CREATE &&
                  hit->route != LG__RT_OP_CLAIM;
  return wants_id && !*id ? -1 : found;
}

/* Called by the committer: the connection may go on. */
static void job_done(lg__job_t *j) { MHD_resume_connection((struct MHD_Connection *)j->owner); }

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
  lg__free(hr);
}

enum MHD_Result lg__http_access(void *cls, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_size, void **con_cls) {
  (void)version;
  lg_server_t *srv = cls;
  http_req_t *hr = *con_cls;
  if (!hr) { /* the headers are in */
    hr = lg__calloc(1, sizeof *hr);
    if (!hr) return MHD_NO;
    *con_cls = hr;
    atomic_fetch_add(&srv->inflight, 1);
    hr->t0_ns = mono_ns();
    lg__req_t *rq = &hr->rq;
    rq->srv = srv;
    rq->conn = c;
    rq->method = method; /* MHD keeps it for the whole request */
    route_hit_t hit;
    char *id = NULL;
    int found = route_or_oom(url, method, &hit, &id);
    if (!found && srv->gw && lg__gw_claims(srv->gw, url)) { /* gateway-v1 */
      found = (id = lg__strdup(url)) ? 1 : -1;
      hit = (route_hit_t){LG__RT_OTHER, lg__gw_handle, LG__ROLE_AGENT, method, NULL};
    }
    rq->route = hit.route;
    rq->id_buf = id;
    rq->id = id;
    if (found < 0) {
      lg__req_error(rq, 500, "internal", NULL, "out of memory");
      hr->errored = 1;
    } else if (!found) {
      lg__req_error(rq, 404, "not_found", NULL, "no endpoint %s %s", method, url);
      hr->errored = 1;
    } else if (hit.route == LG__RT_BUDGETS &&
               strcmp(method, !strcmp(id, "reserve") || !strcmp(id, "settle") ? "POST" : "GET") &&
               strcmp(method, !strcmp(id, "reserve") || !strcmp(id, "settle") ? "POST" : "PUT")) {
      rq->allow = !strcmp(id, "reserve") || !strcmp(id, "settle") ? "POST" : "GET, PUT";
      lg__req_error(rq, 405, "invalid_request", NULL, "%s %s: method not allowed; use %s", method,
                    url, rq->allow);
      hr->errored = 1;
    } else if (hit.route != LG__RT_BUDGETS && strcmp(method, hit.method)) {
      rq->allow = hit.allow ? hit.allow : hit.method;
      lg__req_error(rq, 405, "invalid_request", NULL, "%s %s: method not allowed; use %s", method,
                    url, hit.method);
      hr->errored = 1;
    } else if (hit.role != LG__ROLE_NONE && srv->auth.n) {
      lg__role_t role =
          lg__auth_role(&srv->auth, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
      if (role == LG__ROLE_NONE) {
        lg__req_error(rq, 401, "unauthorized", NULL,
                      "a valid bearer token is required (Authorization: Bearer TOKEN)");
        hr->errored = 1;
      } else if ((int)role < hit.role) {
        lg__req_error(rq, 403, "forbidden", NULL, "%s %s needs the operator role", method, url);
        hr->errored = 1;
      }
    }
    hr->handler = hr->errored ? NULL : hit.handler;
    /* A declared body over the limit: refused now, without reading it. */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      char *end;
      unsigned long long n = strtoull(cl, &end, 10);
      if (n > srv->o.max_body) {
        lg__req_error(rq, 413, "payload_too_large", "body",
                      "the body is %llu bytes; the limit is %zu bytes", n, srv->o.max_body);
        hr->errored = 1;
        hr->handler = NULL;
        return answer(srv, c, hr);
      }
    }
    return MHD_YES;
  }
  if (*upload_size) { /* a piece of the body */
    size_t n = *upload_size;
    *upload_size = 0;
    if (hr->answered) return MHD_YES; /* answered early: the rest is dropped */
    if (mono_ns() - hr->t0_ns > (uint64_t)srv->o.timeout_s * 1000000000u)
      return MHD_NO; /* a client that trickles its body: cut off */
    if (hr->body.len + n > srv->o.max_body) {
      if (!hr->errored || hr->rq.status != 413) {
        lg__req_error(&hr->rq, 413, "payload_too_large", "body",
                      "the body is over the limit of %zu bytes", srv->o.max_body);
        hr->errored = 1;
        hr->handler = NULL;
        /* Answer now when libmicrohttpd allows it mid-body; else cut the
         * connection rather than read an unbounded body. */
        if (answer(srv, c, hr) != MHD_YES) return MHD_NO;
      }
      return MHD_YES;
    }
    if (!hr->errored && lg__buf_append(&hr->body, upload, n)) return MHD_NO;
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
  if (!hr->errored && hr->handler) {
    rq->body = hr->body.data ? hr->body.data : "";
    rq->body_len = hr->body.len;
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
  (void)c;
  (void)toe;
  lg_server_t *srv = cls;
  http_req_t *hr = *con_cls;
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
                      mono_ns() - hr->t0_ns);
  atomic_fetch_sub(&srv->inflight, 1);
  free_req(hr);
}
