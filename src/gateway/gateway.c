/*
 * gateway.c — the life of the gateway and of each of its requests.
 *
 * A gateway request is read whole by the HTTP layer (http.c: the body and
 * its limit), then handed here: lg__gw_handle takes the body's buffer and
 * copies what else the worker needs (the headers to forward,
 * X-Loopguard-*), and parks the
 * connection with the job (rq->submit). A fixed pool of worker threads
 * takes jobs from a queue: that bounds the upstream requests in flight,
 * and keeps libmicrohttpd's threads free while an upstream thinks. The
 * worker turns the request into events for the decision step (chat.c),
 * asks the upstream, and answers: done() resumes the connection and
 * finish() builds the response on the HTTP thread. A stream is answered
 * as soon as the upstream's answer starts: its reader (on the HTTP
 * thread) takes what the worker wrote and suspends the connection while
 * there is nothing new.
 *
 * A job is reference counted: the worker, the HTTP side until finish(),
 * and a stream's response until libmicrohttpd frees it. So a client that
 * hangs up mid-stream frees nothing the worker still writes to; the
 * worker sees s_gone and aborts its upstream exchange.
 *
 * Runs. The gateway keeps, per run, what it needs between requests (what
 * it has already fed to the step, the calls it restored, the stop's
 * final message): in memory, in a table with a lock per run, so the
 * requests of one run are decided one at a time. The run itself, its
 * decisions and its trace are the store's, written by the step; so are
 * the conversation keys and what a replica needs of the others' memory
 * (lg__gw_key_put, lg__gw_data_put: not on memory:), so that every
 * replica of a store, and a server after a restart, decides a
 * conversation as the one that began it would.
 */
#include "gw.h"

#include "../store/store.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

#include <sched.h>
#include <unistd.h>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>

#include "../util/fiber.h"

/* The gateway's workers: GW_WORKERS start with the server; when a request
 * has waited GW_GROW_MS in the queue with no worker idle (every worker
 * holds a request, most often waiting for its upstream, which thinks for
 * seconds), one more starts, up to LOOPGUARD_GATEWAY_WORKERS: the default
 * is GW_WORKERS_MAX with a store all threads share (memory:, sqlite:),
 * GW_WORKERS_MAX_PG with PostgreSQL, where each worker opens a connection
 * of its own. A worker started stays until the server stops. */
#define GW_WORKERS 8
#define GW_WORKERS_MAX 256
#define GW_WORKERS_MAX_PG 16
#define GW_WORKERS_LIMIT 4096
#define GW_GROW_MS 50
/* Loops whose lead may wait for a worker at once (server.c has at most 32
 * loops, and a loop posts its lead once). */
#define GW_LEADS 32
#define GW_QUEUE_MAX 1024     /* requests waiting for a worker (LOOPGUARD_GATEWAY_QUEUE) */
#define GW_QUEUE_LIMIT 1048576
#define GW_BUCKETS 4096
#define GW_HIST 12

static const char *kind_names[LG__GW__KINDS] = {"chat_completions", "responses", "messages",
                                                "passthrough"};
static const double hist_le[GW_HIST] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,    2.5,   5,    10,  30};

/* A conversation's key (its start, a Responses id) -> its run. The run
 * owns its keys: they go when it is evicted. */
struct lg__gw_key {
  char *key;
  lg__gw_run_t *run;
  struct lg__gw_key *next;    /* hash chain */
  struct lg__gw_key *rnext;   /* the run's keys */
};
typedef lg__gw_key_t key_ent_t;

/* At most this many runs are kept in memory (LOOPGUARD_GATEWAY_MAX_RUNS);
 * past it, the least recently used run that no request holds is evicted. */
#define GW_MAX_RUNS_DEFAULT 10000
/* At most this many bytes of the runs' last conversations are kept to
 * read the next request faster (LOOPGUARD_GATEWAY_PREFIX_BYTES). */
#define GW_PREFIX_BYTES_DEFAULT ((size_t)16 << 20)
/* The most a guarded route holds of an upstream's answer at once: the
 * whole answer when it is not streamed, one event of a stream, a stream's
 * text and tool calls (LOOPGUARD_GATEWAY_ANSWER_BYTES). A model's answer
 * is a few hundred KB at most; an upstream that sends more is broken, and
 * the server's memory is every client's. */
#define GW_ANSWER_BYTES_DEFAULT ((size_t)64 << 20)
/* A held stream's keep-alive comment: under the 30 and 60 s idle
 * timeouts load balancers use. */
#define GW_KEEPALIVE_MS_DEFAULT 15000
/* A request without X-Loopguard-Run finds a kept conversation by the hash
 * of its first this many bytes (a shorter one is not found that way). */
#define GW_PREFIX_HEAD 2048
/* Kept conversations with the same first bytes looked at, newest first. */
#define GW_PREFIX_TRIES 8

#define GW_MAX_UP 16
/* Models remembered as taking max_completion_tokens only (past it: each
 * request of another such model is refused once, then mended). */
#define GW_LEARNT_MODELS 256

struct lg__gw {
  lg_server_t *srv;
  lg__gw_config_t cfg;
  pthread_t *th;               /* max_th of them; the first nth started */
  int nth, max_th;
  pthread_t grower;           /* starts workers when requests wait (grow_main) */
  int grower_ok;
  pthread_cond_t grow_cv;     /* a request queued with no worker idle, or quit */
  pthread_mutex_t qmu;        /* guards the queue, running */
  pthread_cond_t qcv;         /* a job queued, or quit: wakes one worker */
  pthread_cond_t idle_cv;     /* a worker done with a job: wakes lg__gw_stop */
  lg__gw_job_t *qhead, *qtail;
  size_t qlen;
  size_t qmax;                /* past it a request is answered 503 overloaded */
  int running;                /* jobs a worker (or a loop's leader) holds */
  int idle;                   /* workers waiting for a job */
  lg__loop_t *leads[GW_LEADS];/* loops whose lead was posted (lg__gw_lead_post) */
  int nleads;
  pthread_key_t ctx_key;      /* the context of a loop's thread that runs a job */
  int ctx_key_ok;
  pthread_key_t spare_key;    /* a thread's spare libcurl handles (spare_take), freed at its exit */
  int spare_key_ok;
  _Atomic int stop;           /* shutting down: abort upstream exchanges */
  int quit;                   /* workers exit */
  pthread_mutex_t tmu;        /* guards the tables */
  lg__gw_run_t *runs[GW_BUCKETS];
  key_ent_t *keys[GW_BUCKETS];
  lg__gw_run_t *lru_head, *lru_tail; /* most recently used first */
  size_t nruns, max_runs;
  size_t prefix_bytes, prefix_max;   /* the runs' prefixes (lg__gw_prefix_keep) */
  size_t answer_max;                 /* GW_ANSWER_BYTES_DEFAULT, or the environment's */
  uint64_t keepalive_ns;             /* lg__gw_stream_keepalive's (0: none) */
  lg__gw_run_t *heads[GW_BUCKETS];   /* runs by their prefix's first bytes (lg__gw_prefix_find) */
  _Atomic uint64_t msgs_read[2];     /* conversation elements checked, taken from a prefix */
  lg__gw_policies_t policies; /* --policies DIR */
  int fibers;                 /* a leader runs up to this many requests at once on fibers
                                 (LOOPGUARD_GATEWAY_FIBERS); 0: none */
  /* metrics */
  _Atomic uint64_t req[LG__GW__KINDS][GW_MAX_UP];
  _Atomic uint64_t up_hist[GW_MAX_UP][GW_HIST + 1];
  _Atomic uint64_t up_sum_ns[GW_MAX_UP];
  _Atomic uint64_t up_err[GW_MAX_UP][LG__GW_UP__KINDS];
  _Atomic uint64_t up_hung_up[GW_MAX_UP]; /* exchanges ended as their client hung up */
  _Atomic uint64_t cut_at_stop;           /* exchanges the shutdown aborted (lg__gw_stop) */
  _Atomic uint64_t fibers_made;           /* fiber stacks mapped (fib_get) */
  /* upstream_failed lines: when the next of an upstream and kind may be
   * written (lg__mono_ns), and the failures left out since the last */
  _Atomic uint64_t up_log_next[GW_MAX_UP][LG__GW_UP__KINDS];
  _Atomic uint64_t up_log_left[GW_MAX_UP][LG__GW_UP__KINDS];
  _Atomic uint64_t fail_log_next, fail_log_left; /* request_failed lines (lg__gw_error) */
  _Atomic uint64_t failed;                       /* requests answered 500 for a failure of ours */
  _Atomic uint64_t interventions[4][LG_R__COUNT]; /* block, replay, stop, observe */
  /* models whose upstream refused max_tokens ("UI\tMODEL"; lg__gw_learn), under tmu */
  char *mct[GW_LEARNT_MODELS];
  size_t nmct;
};

const lg__gw_config_t *lg__gw_cfg(const lg__gw_t *gw) { return &gw->cfg; }
_Atomic int *lg__gw_stopflag(lg__gw_t *gw) { return &gw->stop; }
size_t lg__gw_answer_max(const lg__gw_t *gw) { return gw->answer_max; }

/* ---- jobs ---- */

static void job_unref(lg__gw_job_t *j) {
  if (atomic_fetch_sub(&j->refs, 1) != 1) return;
  lg__free(j->method);
  lg__free(j->path);
  lg__free(j->query);
  lg__free(j->body);
  lg__free(j->auth);
  lg__free(j->hdr_run);
  lg__free(j->hdr_group);
  lg__free(j->hdr_agent);
  lg__free(j->hdr_policy);
  lg__gw_keys_clear(j);
  curl_slist_free_all(j->fwd);
  lg__buf_free(&j->out);
  lg__buf_free(&j->sbuf);
  lg__buf_free(&j->up_hdrs);
  lg__buf_free(&j->head.up_hdrs);
  pthread_mutex_destroy(&j->smu);
  lg__free(j);
}

/* Hands the answer to the HTTP side (resumes the connection; finish()
 * builds the response there). Once. After it the worker touches nothing
 * finish() reads: the head is a copy, and a whole answer (j->out) is
 * released only when the worker is done with the job (worker_main), so
 * that what follows the answer (the retry cache's copy of it, the run's
 * unlock) never races the HTTP thread, which hands j->out to
 * libmicrohttpd and frees it once sent. */
static void release(lg__gw_job_t *j) {
  if (j->released) return;
  j->released = 1;
  j->head.status = j->status;
  j->head.retry_after = j->retry_after;
  j->head.action = j->action;
  memcpy(j->head.ctype, j->ctype, sizeof j->ctype);
  memcpy(j->head.run_id, j->run_id, sizeof j->run_id);
  memcpy(j->head.reason, j->reason, sizeof j->reason);
  j->head.up_hdrs = j->up_hdrs; /* the HTTP side's now: a re-ask's exchange writes anew */
  memset(&j->up_hdrs, 0, sizeof j->up_hdrs);
  j->job.done(&j->job);
}

/* The answer is made; a stream's starts at once, a whole one when the
 * worker is done with the job. */
void lg__gw_answer(lg__gw_job_t *j) {
  if (j->answered) return;
  j->answered = 1;
  if (j->streaming) release(j);
}

/* Anthropic's error type for a status (its API's documented set). */
static const char *anthropic_type(int status) {
  switch (status) {
  case 400: return "invalid_request_error";
  case 401: return "authentication_error";
  case 402: return "billing_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 503: return "overloaded_error";
  default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

void lg__gw_error_body(lg__buf_t *b, int anthropic, int status, const char *type, const char *code,
                       const char *param, const char *msg) {
  b->len = 0;
  b->oom = false;
  if (anthropic) {
    lg__buf_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":",
                   anthropic_type(status));
    lg__buf_json_str_lossy(b, msg, strlen(msg));
    lg__buf_puts(b, "}}");
    return;
  }
  lg__buf_puts(b, "{\"error\":{\"message\":");
  lg__buf_json_str_lossy(b, msg, strlen(msg));
  lg__buf_puts(b, ",\"type\":");
  lg__buf_json_str(b, type, strlen(type));
  lg__buf_puts(b, ",\"param\":");
  if (param && *param) lg__buf_json_str_lossy(b, param, strlen(param));
  else lg__buf_puts(b, "null");
  lg__buf_puts(b, ",\"code\":");
  if (code) lg__buf_json_str(b, code, strlen(code));
  else lg__buf_puts(b, "null");
  lg__buf_puts(b, "}}");
}

static void log_failed(lg__gw_job_t *j, const char *msg);

/* The job's error answer, and a 500's log line (`logged`: what the log
 * says, the detail the answer leaves out). */
static void answer_error(lg__gw_job_t *j, int status, const char *type, const char *code,
                         const char *msg, const char *logged) {
  j->status = status;
  snprintf(j->ctype, sizeof j->ctype, "application/json");
  lg__gw_error_body(&j->out, j->route == LG__GW_ROUTE_ANTHROPIC, status, type, code, NULL, msg);
  if (status == 500) log_failed(j, logged); /* loopguard's own failure (the store, memory) */
}

void lg__gw_error(lg__gw_job_t *j, int status, const char *type, const char *code,
                  const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  answer_error(j, status, type, code, msg, msg);
}

void lg__gw_failed(lg__gw_job_t *j, const char *code, const char *doing, const lg_error_t *e,
                   int rc) {
  char buf[1024], msg[1024], logged[1024];
  const char *pre = doing ? "loopguard could not " : "loopguard";
  snprintf(msg, sizeof msg, "%s%s: %s", pre, doing ? doing : "",
           lg__error_public(e, rc, buf, sizeof buf));
  snprintf(logged, sizeof logged, "%s%s: %s", pre, doing ? doing : "",
           lg__error_logged(e, rc, buf, sizeof buf)); /* msg is made: buf again */
  answer_error(j, 500, "server_error", code, msg, logged);
}

const char *lg__gw_api_prefix(const lg__gw_job_t *j) { return j->azure ? "/openai" : "/v1"; }

void lg__gw_json_path(lg__buf_t *b, const lg__gw_job_t *j) {
  char path[512];
  snprintf(path, sizeof path, "%s%s", lg__gw_api_prefix(j), j->path ? j->path : "");
  lg__buf_json_str_lossy(b, path, strlen(path)); /* the client's bytes */
}

int lg__gw_error_api(const char *url, const char *method, int anthropic_version) {
  return !strcmp(url, "/v1/messages") || (anthropic_version && !lg__gw_guards(url, method)) ? 2 : 1;
}

int lg__gw_req_error(lg__req_t *rq, int status, const char *type, const char *field,
                     const char *msg) {
  const char *otype = status == 401   ? "invalid_request_error"
                      : status == 429 ? "rate_limit_error"
                      : status >= 500 ? "server_error"
                                      : "invalid_request_error";
  lg__gw_error_body(&rq->out, rq->api_errors == 2, status, otype, type, field, msg);
  return status;
}

/* ---- streams ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  lg__gw_job_t *j = cls;
  pthread_mutex_lock(&j->smu);
  size_t avail = j->sbuf.len - j->soff;
  if (avail) {
    size_t n = avail < max ? avail : max;
    memcpy(buf, j->sbuf.data + j->soff, n);
    j->soff += n;
    if (j->soff == j->sbuf.len) j->soff = j->sbuf.len = 0;
    pthread_mutex_unlock(&j->smu);
    return (ssize_t)n;
  }
  if (j->s_end) {
    int cut = j->s_cut;
    /* the answer's action and reason, known only now, as trailers after
     * the last chunk (announced by the head's Trailer field); added on
     * this thread, which alone reads the response until it is sent */
    if (!cut && j->s_resp) {
      if (j->s_action) MHD_add_response_footer(j->s_resp, "X-Loopguard-Action", j->s_action);
      if (j->s_reason[0]) MHD_add_response_footer(j->s_resp, "X-Loopguard-Reason", j->s_reason);
      j->s_resp = NULL;
    }
    pthread_mutex_unlock(&j->smu);
    return cut ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
  }
  /* Nothing yet: wait without spinning; the writer resumes us. */
  j->s_waiting = 1;
  MHD_suspend_connection(j->conn);
  pthread_mutex_unlock(&j->smu);
  return 0;
}

static void stream_free(void *cls) {
  lg__gw_job_t *j = cls;
  atomic_store(&j->s_gone, 1); /* the response is gone: a hang-up, or the end */
  job_unref(j);
}

/* Resumes the parked stream, under smu. Returns its event loop, to be
 * woken once smu is released (server.h: every resume is followed by a
 * wake, or the connection waits for the loop's next timeout, a second),
 * or NULL when the stream was not parked. */
static lg__loop_t *resume_stream(lg__gw_job_t *j) {
  if (!j->s_waiting) return NULL;
  j->s_waiting = 0;
  lg__loop_t *l = lg__conn_loop(j->conn); /* before: once resumed, conn may go */
  MHD_resume_connection(j->conn);
  return l;
}

void lg__gw_stream_start(lg__gw_job_t *j, int status, const char *ctype) {
  atomic_store(&j->s_last_ns, lg__mono_ns());
  j->streaming = 1;
  j->status = status;
  snprintf(j->ctype, sizeof j->ctype, "%s", ctype);
  lg__gw_answer(j);
}

int lg__gw_stream_write(lg__gw_job_t *j, const char *p, size_t n) {
  if (atomic_load(&j->s_gone)) return -1;
  atomic_store(&j->s_last_ns, lg__mono_ns());
  pthread_mutex_lock(&j->smu);
  int rc = lg__buf_append(&j->sbuf, p, n);
  lg__loop_t *l = resume_stream(j);
  pthread_mutex_unlock(&j->smu);
  if (l && !lg__loop_turns_next(l)) lg__loop_wake(l);
  return rc ? -1 : 0;
}

void lg__gw_stream_keepalive(lg__gw_t *gw, lg__gw_job_t *j) {
  static const char comment[] = ": loopguard: the answer is being read\n\n";
  if (!j->streaming || !gw->keepalive_ns) return;
  if (lg__mono_ns() - atomic_load(&j->s_last_ns) >= gw->keepalive_ns)
    lg__gw_stream_write(j, comment, sizeof comment - 1);
}

size_t lg__gw_stream_backlog(lg__gw_job_t *j) {
  pthread_mutex_lock(&j->smu);
  size_t n = j->sbuf.len - j->soff;
  pthread_mutex_unlock(&j->smu);
  return n;
}

void lg__gw_stream_cut(lg__gw_job_t *j) {
  pthread_mutex_lock(&j->smu);
  j->s_cut = 1;
  pthread_mutex_unlock(&j->smu);
}

/* From worker_main, which holds no lock then: the stream's end is sent
 * from this thread when its loop is idle (lg__loop_serve). */
void lg__gw_stream_end(lg__gw_job_t *j) {
  pthread_mutex_lock(&j->smu);
  j->s_end = 1;
  j->s_action = j->action;
  memcpy(j->s_reason, j->reason, sizeof j->s_reason);
  lg__loop_t *l = resume_stream(j);
  pthread_mutex_unlock(&j->smu);
  if (l && !lg__loop_turns_next(l)) lg__loop_serve(l);
}

/* ---- the HTTP side ---- */

/* act and reason: the answer's X-Loopguard-Action and -Reason (NULL and
 * "" on a stream still going: its trailers, stream_read). */
static void add_headers(struct MHD_Response *r, const lg__gw_job_t *j, const char *act,
                        const char *reason) {
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          j->head.ctype[0] ? j->head.ctype : "application/json");
  /* the upstream's own (its request id, rate limits, a 429's Retry-After),
   * but where the gateway says its own */
  int cache = 0;
  const lg__buf_t *h = &j->head.up_hdrs;
  for (size_t i = 0; !h->oom && i < h->len;) {
    const char *k = h->data + i, *v = k + strlen(k) + 1;
    i = (size_t)(v + strlen(v) + 1 - h->data);
    if (j->head.retry_after > 0 && !strcasecmp(k, MHD_HTTP_HEADER_RETRY_AFTER)) continue;
    cache |= !strcasecmp(k, MHD_HTTP_HEADER_CACHE_CONTROL);
    MHD_add_response_header(r, k, v);
  }
  if (j->head.run_id[0]) MHD_add_response_header(r, "X-Loopguard-Run", j->head.run_id);
  if (act) MHD_add_response_header(r, "X-Loopguard-Action", act);
  if (reason[0]) MHD_add_response_header(r, "X-Loopguard-Reason", reason);
  if (j->head.retry_after > 0) {
    char ra[24];
    snprintf(ra, sizeof ra, "%d", j->head.retry_after);
    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
  }
  if (j->streaming && !cache && !strncmp(j->head.ctype, "text/event-stream", 17))
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
}

static ssize_t head_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)cls, (void)pos, (void)buf, (void)max;
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

/* On the HTTP thread, once the worker answered (or the client is gone). */
static void gw_finish(lg__req_t *rq) {
  lg__gw_job_t *j = (lg__gw_job_t *)rq->job;
  rq->job = NULL;
  if (!j) return;
  struct MHD_Response *r = NULL;
  /* A stream whose last byte is written already (an upstream that sent
   * its whole answer at once, a stop's final message) goes as one body
   * of known length: one send with its head, where the chunked reader
   * takes three (the head, the data, the last chunk) and a suspend and a
   * resume of the connection. The events are the same bytes. */
  char *whole = NULL;
  size_t whole_len = 0;
  const char *act = j->head.action, *reason = j->head.reason;
  if (j->streaming) {
    pthread_mutex_lock(&j->smu);
    if (j->s_end && !j->s_cut && !j->soff && !j->sbuf.oom) whole = lg__buf_steal(&j->sbuf, &whole_len);
    pthread_mutex_unlock(&j->smu);
    /* its action and reason are known at its end (written with s_end,
     * never after): headers of a whole one, trailers of the rest */
    act = whole ? j->s_action : NULL;
    reason = whole ? j->s_reason : "";
  }
  if (whole) {
    r = MHD_create_response_from_buffer_with_free_callback(whole_len, whole, lg__free);
    if (!r) lg__free(whole);
  } else if (j->streaming) {
    atomic_fetch_add(&j->refs, 1); /* the stream's */
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
    if (!r) job_unref(j);
  } else if (j->head_known && !j->out.len) {
    /* a HEAD passed through: the upstream's Content-Length, no body (the
     * reader is never called for a HEAD) */
    r = MHD_create_response_from_callback(j->head_len, 4096, head_read, NULL, NULL);
  } else {
    size_t len = j->out.len;
    char *body = lg__buf_steal(&j->out, NULL);
    if (body) r = MHD_create_response_from_buffer_with_free_callback(len, body, lg__free);
    else r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) lg__free(body);
  }
  if (r) {
    add_headers(r, j, act, reason);
    if (j->streaming && !whole && j->head.run_id[0]) { /* a guarded stream: its trailers */
      MHD_add_response_header(r, "Trailer", "X-Loopguard-Action, X-Loopguard-Reason");
      pthread_mutex_lock(&j->smu);
      j->s_resp = r;
      pthread_mutex_unlock(&j->smu);
    }
    rq->response = r;
    rq->status = j->head.status ? j->head.status : 500;
  } else {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    if (j->streaming) atomic_store(&j->s_gone, 1);
  }
  job_unref(j); /* the HTTP side's */
}

/* Set while a worker of this gateway sends its answer itself
 * (worker_main, lg__loop_serve): a request read then is queued without
 * waking another worker, since this one takes the queue's next job as
 * soon as it is done. Once: a second request wakes a worker as usual. */
static _Thread_local lg__gw_t *tl_claim;

/* Leaders and followers (server.h). The requests this thread read as its
 * loop's leader and keeps (gw_submit), to run once its turn of the
 * daemon is over (lg__gw_run_mine): each on a fiber of its own (below),
 * or, without fibers, one at a time, run whole. tl_busy counts the
 * requests it runs now and has not answered yet. */
static _Thread_local int tl_busy;
/* This thread's context when it is a worker (worker_main); NULL on a
 * loop's own thread. */
static _Thread_local lg__gw_ctx_t *tl_cx;

/* ---- fibers ----
 *
 * A loop's leader runs every gateway request it reads on a fiber of its
 * own (util/fiber.h), between its turns of the daemon. A fiber stops only
 * to wait: for its upstream (libcurl's sockets in the leader's epoll, its
 * timer a deadline: upstream.c, perform_fiber) or for another request of
 * its run (lg__gw_run_get). So one thread takes many requests in turn, on
 * the core it runs on, with no hand-over to a worker and no wake-up of
 * another thread: the requests it reads while its fibers wait are its
 * own. The workers take what a leader does not keep: more than
 * LOOPGUARD_GATEWAY_FIBERS at once (GW_FIBERS by default: a fiber that
 * waits for its upstream costs its stack's touched pages, tens of KB, and
 * a connection; a worker a thread, and a request past the workers waits
 * in the queue until one is free), or the requests read by a thread that
 * does not lead.
 * A wait that may be long and is not the upstream's (a store lock another
 * process holds) still blocks the thread, which passes the lead first
 * (server.c) and then finishes its fibers, without leading
 * (lg__gw_fibers_end). A fiber is resumed only by its thread: the store's
 * reader and the JSON region are per thread.
 * LOOPGUARD_GATEWAY_FIBERS=0 turns fibers off (one request kept at a
 * time, run whole, as before them). Until session 34 a leader held 64. */
#define GW_FIBERS 256
#define GW_FIBERS_LIMIT 1024
/* A thread keeps the fibers it made for its next requests, as many as it
 * may run at once (gw->fibers). A fiber freed is a stack unmapped (a TLB
 * shootdown on every core) and the next one mapped again and faulted in:
 * with 16 kept (until session 34), 64 requests at once on two threads cost
 * a third more CPU a request, 128 almost half more
 * (loopguard_gateway_fibers_made_total, tests/gateway/reuse.sh). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GW_FIBER_STACK ((size_t)8 << 20) /* reserved, not resident: a page once touched */
#else
#define GW_FIBER_STACK ((size_t)2 << 20)
#endif
#define GW_FIBER_MAX_WAIT_NS 1000000000ull /* a waiting fiber looks at the stop and the client */

/* A thread's spare libcurl handles: an easy handle and its multi, whose
 * connection cache keeps the upstream connection of the request that used
 * them last. A fiber takes a pair when it starts and gives it back when it
 * is done, so that the thread's next request reuses the connection: a
 * fiber's own handles (until session 33) went with the fiber when the
 * thread passed the lead on (lg__gw_fibers_end frees its fibers) or when
 * more fibers than the 16 it kept then were done at once: with 64 agents at
 * once one request in six to eight opened a new connection upstream (a
 * TCP connection and, to a provider, a TLS handshake; tests/gateway/reuse.sh).
 * libcurl's shared connection cache (CURLSHOPT_SHARE) would serve every
 * thread but is not thread-safe in 7.88 (its KNOWN_BUGS); a thread's own
 * pairs are used by that thread alone. At most gw->fibers, freed when the
 * thread exits (spares_free, gw->spare_key). */
typedef struct gw_spares {
  struct {
    CURL *curl;
    CURLM *multi;
  } v[GW_FIBERS_LIMIT];
  int n;
  int keyed; /* the thread's key holds it: spares_free runs at its exit */
} gw_spares_t;
static _Thread_local gw_spares_t tl_spares;

typedef struct gw_fib {
  lg__fiber_t *f;
  lg__gw_ctx_t cx;            /* libcurl handles from the thread's spares while it runs */
  lg__gw_job_t *j;
  lg__gw_wait_t *w;           /* what it waits for, or NULL */
  uint64_t wait_until;        /* ... at the latest (lg__mono_ns) */
  int ready;                  /* its wait is over: resume it */
  struct gw_fib *next;        /* the active list, or the pool */
  struct gw_sched *sched;     /* its thread's */
  struct gw_fib *rnext;       /* the thread's woken list (park_wake) */
  struct gw_fib *lnext;       /* the fibers_run pass's ready ones */
} gw_fib_t;

/* A thread's requests: those it kept and has not started, its fibers. */
typedef struct gw_sched {
  int ep;                     /* the leader's epoll (lg__gw_fibers_begin); -1: no fibers */
  lg__gw_job_t *kept, *kept_tail;
  int nkept;
  gw_fib_t *active;
  int nactive;
  gw_fib_t *pool;
  int npool;
  gw_fib_t *cur;              /* the fiber running now */
  /* Fibers parked on another thread's work (the store's committer, or a
   * batch another thread runs: store/group.c) are woken from that
   * thread: put on `woken`, and the eventfd written when this thread
   * sleeps (or is about to) in its epoll. */
  _Atomic(gw_fib_t *) woken;
  _Atomic int sleeping;
  _Atomic int waking;         /* wakers between their push and their write */
  int wfd;                    /* eventfd in ep (data: &wsock), -1: none */
  lg__gw_sock_t wsock;
} gw_sched_t;
static _Thread_local gw_sched_t tl_sched = {.ep = -1, .wfd = -1};

int lg__gw_holds_mine(void) { return tl_sched.kept || tl_sched.nactive || tl_busy; }

/* 1 when j is kept by this thread (counted as running, so that
 * lg__gw_stop waits for it). */
static int keep_mine(lg__gw_t *gw, lg__gw_job_t *j) {
  if (!lg__loop_leads()) return 0;
  gw_sched_t *s = &tl_sched;
  if (s->ep < 0 ? lg__gw_holds_mine() : s->nkept + s->nactive >= gw->fibers) return 0;
  pthread_mutex_lock(&gw->qmu);
  int ok = !gw->quit && !atomic_load(&gw->stop);
  if (ok) gw->running++;
  pthread_mutex_unlock(&gw->qmu);
  if (!ok) return 0;
  j->qnext = NULL;
  if (s->kept_tail) s->kept_tail->qnext = j;
  else s->kept = j;
  s->kept_tail = j;
  s->nkept++;
  return 1;
}

/* Fewer workers idle than requests and leads wait for, and room for more
 * (grow_main starts them once the oldest has waited). With qmu held. */
static int short_of_workers(const lg__gw_t *gw) {
  return gw->qhead && gw->nth < gw->max_th && gw->idle < (int)gw->qlen + gw->nleads;
}

static void gw_submit(lg__req_t *rq) {
  lg__gw_job_t *j = (lg__gw_job_t *)rq->job;
  lg__gw_t *gw = j->gw;
  int claimed = tl_claim == gw;
  if (claimed) tl_claim = NULL;
  j->conn = rq->conn;
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(rq->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  j->fd = ci ? (int)ci->connect_fd : -1;
  if (!claimed && keep_mine(gw, j)) return;
  pthread_mutex_lock(&gw->qmu);
  int full = gw->qlen >= gw->qmax || gw->quit;
  if (!full) {
    j->queued_ns = lg__mono_ns();
    j->qnext = NULL;
    if (gw->qtail) gw->qtail->qnext = j;
    else gw->qhead = j;
    gw->qtail = j;
    gw->qlen++;
  }
  int grow = !full && short_of_workers(gw);
  pthread_mutex_unlock(&gw->qmu);
  /* After the unlock: a worker woken under the lock would wait at once for
   * the mutex, two more system calls and a switch a request. */
  if (!full && !claimed) pthread_cond_signal(&gw->qcv);
  if (grow) pthread_cond_signal(&gw->grow_cv);
  if (full) {
    lg__gw_error(j, 503, "server_error", "overloaded",
                 "loopguard gateway: too many requests waiting for an upstream; retry later");
    j->retry_after = 1;
    job_unref(j); /* the worker's, never taken */
    lg__gw_answer(j);
    release(j);
  }
}

/* Copies the headers a provider reads. */
typedef struct hdr_ctx {
  lg__gw_job_t *j;
  int oom;
} hdr_ctx_t;

static enum MHD_Result copy_header(void *cls, enum MHD_ValueKind kind, const char *k,
                                   const char *v) {
  (void)kind;
  hdr_ctx_t *h = cls;
  lg__gw_job_t *j = h->j;
  if (!j) return MHD_NO; /* never: the job is made before its headers are read */
  char **slot = NULL;
  if (!strcasecmp(k, "Authorization")) slot = &j->auth;
  else if (!strcasecmp(k, "X-Loopguard-Run")) slot = &j->hdr_run;
  else if (!strcasecmp(k, "X-Loopguard-Group")) slot = &j->hdr_group;
  else if (!strcasecmp(k, "X-Loopguard-Agent")) slot = &j->hdr_agent;
  else if (!strcasecmp(k, "X-Loopguard-Policy")) slot = &j->hdr_policy;
  if (slot) {
    lg__free(*slot);
    if (!(*slot = lg__strdup(v))) h->oom = 1;
    return MHD_YES;
  }
  /* a passed-through body's type (an upload's multipart boundary) and
   * encoding go with it; a guarded route's body is the gateway's JSON */
  if (lg__auth_key_header(k) || !strncasecmp(k, "anthropic-", 10) ||
      !strncasecmp(k, "openai-", 7) || !strcasecmp(k, "accept") ||
      (j->kind == LG__GW_PASS && (!strcasecmp(k, "Content-Type") || !strcasecmp(k, "Content-Encoding")))) {
    lg__buf_t b = {0};
    lg__buf_printf(&b, "%s: %s", k, v);
    struct curl_slist *t = b.oom ? NULL : curl_slist_append(j->fwd, b.data);
    if (t) j->fwd = t;
    else h->oom = 1;
    lg__buf_free(&b);
  }
  return MHD_YES;
}

/* The model API of a path under /openai (Azure OpenAI's): a deployment's
 * (/openai/deployments/NAME/chat/completions, and .../responses: the
 * Python AzureOpenAI's with azure_deployment), the resource's
 * (/openai/responses) and its v1 API's (/openai/v1/chat/completions, an
 * OpenAI client whose base URL is the gateway's /openai/v1, which would
 * otherwise pass on unguarded); what follows them as /v1's would. */
static const char *azure_route(const char *url) {
  if (!strncmp(url, "/openai/deployments/", 20)) {
    const char *name = url + 20, *slash = strchr(name, '/');
    return slash && slash > name ? slash : NULL;
  }
  if (!strncmp(url, "/openai/v1/", 11)) return url + 10;
  return !strncmp(url, "/openai/", 8) ? url + 7 : NULL;
}

/* The API's path of a gateway url (after /v1, or an Azure path's
 * prefix: azure_route), "" for another; *az whether it is Azure's. */
static const char *api_path(const char *url, int *az) {
  const char *a = azure_route(url);
  *az = a != NULL;
  return a ? a : !strncmp(url, "/v1/", 4) ? url + 3 : "";
}

static int gw_kind(const char *url, const char *method) {
  if (!strcmp(method, "POST")) {
    int az;
    const char *r = api_path(url, &az);
    if (!strcmp(r, "/chat/completions")) return LG__GW_CHAT;
    if (!strcmp(r, "/responses")) return LG__GW_RESPONSES;
    if (!strcmp(r, "/messages") && !az) return LG__GW_MESSAGES;
  }
  return LG__GW_PASS;
}

int lg__gw_guards(const char *url, const char *method) { return gw_kind(url, method) != LG__GW_PASS; }

/* Whether a request passed through is billed nothing by a provider: a
 * read or a delete, or one of the writes that start no billed work (a
 * file's upload, a moderation, a count of tokens, a conversation's items,
 * a stored completion's metadata, a cancel). Any other (embeddings,
 * images, audio, batches, the legacy completions, fine-tuning, an API
 * this list does not know) may be, and the gateway prices only the model
 * APIs it guards: a key whose spend is bounded may not make it (keys.c). */
static int pass_free(const char *url, const char *method) {
  static const char *const free_posts[] = {"/files", "/uploads", "/moderations", "/messages/count_tokens",
                                           "/responses/input_tokens", "/conversations"};
  static const char *const free_under[] = {"/uploads/", "/conversations/", "/chat/completions/"};
  if (!strcmp(method, "GET") || !strcmp(method, "HEAD") || !strcmp(method, "DELETE")) return 1;
  int az;
  const char *r = api_path(url, &az);
  size_t n = strlen(r);
  if (n >= 7 && !strcmp(r + n - 7, "/cancel")) return 1;
  for (size_t i = 0; i < LG__ARRAY_LEN(free_posts); i++)
    if (!strcmp(r, free_posts[i])) return 1;
  for (size_t i = 0; i < LG__ARRAY_LEN(free_under); i++)
    if (!strncmp(r, free_under[i], strlen(free_under[i]))) return 1;
  return 0;
}

int lg__gw_claims(const lg__gw_t *gw, const char *url) {
  static const char *own[] = {"/v1/runs", "/v1/groups", "/v1/operations", "/v1/budgets",
                              "/v1/keys", "/v1/key"};
  /* an AzureOpenAI client's paths, when an upstream is an Azure resource's
   * classic API (its base URL's path /openai) to send them to */
  if (!strncmp(url, "/openai/", 8)) {
    const lg__gw_config_t *cfg = lg__gw_cfg(gw);
    for (size_t i = 0; i < cfg->nup; i++)
      if (cfg->up[i].azure) return 1;
    return 0;
  }
  if (strncmp(url, "/v1/", 4)) return 0;
  for (size_t i = 0; i < LG__ARRAY_LEN(own); i++) {
    size_t n = strlen(own[i]);
    if (!strncmp(url, own[i], n) && (url[n] == 0 || url[n] == '/')) return 0;
  }
  return 1;
}

int lg__gw_lacks_v1(const char *path, size_t n) {
  static const char *const first[] = {"chat", "completions", "responses", "messages",
                                      "embeddings", "models", "files", "uploads",
                                      "audio", "images", "moderations", "batches"};
  if (n < 2 || path[0] != '/') return 0;
  const char *seg = path + 1, *end = memchr(seg, '/', n - 1);
  size_t len = end ? (size_t)(end - seg) : n - 1;
  for (size_t i = 0; i < LG__ARRAY_LEN(first); i++)
    if (strlen(first[i]) == len && !memcmp(seg, first[i], len)) return 1;
  return 0;
}

void lg__gw_url_put(lg__buf_t *b, const char *s, const char *ok) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if ((*p < 0x80 && isalnum(*p)) || strchr(ok, *p))
      lg__buf_append(b, (const char *)p, 1);
    else
      lg__buf_printf(b, "%%%02X", *p);
  }
}

/* The query of a request target, to go on upstream as the client sent
 * it: a byte a URL may not hold as it is (a space cannot be here, the
 * screen refuses it; a non-ASCII byte, a quote, a brace, ...) is
 * percent-encoded, so that libcurl takes the URL; the rest is unchanged. */
static char *query_of(const char *q) {
  lg__buf_t b = {0};
  lg__gw_url_put(&b, q, "-._~!$&'()*+,;=:@/?%");
  if (b.oom || !b.data) {
    lg__buf_free(&b);
    return NULL;
  }
  return lg__buf_steal(&b, NULL);
}

/* Whether url is another spelling of a guarded route (gw_kind's: a slash
 * doubled, or one at the end, /v1/chat/completions/, /v1//messages), that
 * route then in norm. */
static int near_route(const char *url, char norm[64]) {
  size_t n = 0;
  for (const char *p = url; *p; p++) {
    if (*p == '/' && n && norm[n - 1] == '/') continue; /* a slash doubled */
    if (n + 1 >= 64) return 0;                         /* longer than any route */
    norm[n++] = *p;
  }
  if (n > 1 && norm[n - 1] == '/') n--; /* one at the end */
  norm[n] = 0;
  return strcmp(norm, url) && gw_kind(norm, "POST") != LG__GW_PASS;
}

void lg__gw_handle(lg__req_t *rq) {
  lg__gw_t *gw = rq->srv->gw;
  /* A model request (a POST) to another spelling of a guarded route:
   * passed through, it would reach a provider that takes it unguarded.
   * Said instead. (GET /v1/chat/completions/..., OpenAI's stored
   * completions, passes.) */
  char near[64];
  if (!strcmp(rq->method, "POST") && near_route(rq->id, near)) {
    rq->api_errors = lg__gw_error_api(near, rq->method, 0);
    lg__req_error(rq, 404, "not_found", NULL,
                  "no endpoint %s %s: the gateway guards %s (no slash doubled or at the end), "
                  "and passes no other spelling of it on unguarded",
                  rq->method, rq->id, near);
    return;
  }
  /* /v1/v1/...: a base URL ending in /v1 where the SDK adds /v1 itself
   * (Anthropic's). No provider serves it: said here, not passed through. */
  if (!strncmp(rq->id, "/v1/v1/", 7)) {
    rq->api_errors = lg__gw_error_api(rq->id + 3, rq->method, 0); /* in the shape its SDK reads */
    lg__req_error(rq, 404, "not_found", NULL,
                  "no endpoint %s %s: /v1 is in the client's base URL twice; an Anthropic "
                  "client's base URL does not end in /v1 (its SDK adds /v1), an OpenAI client's does",
                  rq->method, rq->id);
    return;
  }
  lg__gw_job_t *j = lg__calloc(1, sizeof *j);
  if (!j) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  pthread_mutex_init(&j->smu, NULL);
  atomic_store(&j->refs, 2); /* the HTTP side's and the worker's */
  j->gw = gw;
  j->kind = gw_kind(rq->id, rq->method);
  j->method = lg__strdup(rq->method);
  j->azure = !strncmp(rq->id, "/openai/", 8);
  j->pass_free = j->kind == LG__GW_PASS && pass_free(rq->id, rq->method);
  j->path = lg__strdup(rq->id + (j->azure ? 7 : 3)); /* after "/openai" or "/v1" */
  j->body = lg__buf_steal(rq->body_buf, NULL); /* the HTTP layer's buffer becomes the job's */
  hdr_ctx_t h = {j, rq->query && !(j->query = query_of(rq->query))};
  MHD_get_connection_values(rq->conn, MHD_HEADER_KIND, copy_header, &h);
  /* the upstreams it may go to: an Azure path's an Azure resource; an
   * Anthropic SDK's (the Messages route, and its models.list(),
   * count_tokens, files passed through: rq->api_errors, lg__gw_error_api)
   * an Anthropic one first, and its errors in Anthropic's shape */
  j->route = j->azure ? LG__GW_ROUTE_AZURE
             : rq->api_errors == 2 ? LG__GW_ROUTE_ANTHROPIC
                                   : LG__GW_ROUTE_OPENAI;
  if (!j->method || !j->path || !j->body || h.oom) {
    atomic_store(&j->refs, 1);
    job_unref(j);
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  j->body_len = rq->body_len;
  rq->job = &j->job;
  rq->submit = gw_submit;
  rq->finish = gw_finish;
}

/* ---- workers ---- */

void lg__gw_upstream_failed(lg__gw_job_t *j, const lg__gw_http_t *x) {
  char lab[300];
  lg__gw_upstream_label(x->up, lab, sizeof lab);
  if (x->over)
    lg__gw_error(j, 502, "upstream_error", "upstream_bad_response",
                 "upstream %s sent %s over %zu bytes (LOOPGUARD_GATEWAY_ANSWER_BYTES); its answer is dropped",
                 lab, x->on_data && x->status >= 200 && x->status < 300 ? "a stream event" : "an answer",
                 x->max_bytes);
  else if (x->cc == CURLE_OPERATION_TIMEDOUT)
    lg__gw_error(j, 504, "upstream_timeout", "upstream_timeout", "upstream %s timed out: %s", lab,
                 x->errbuf);
  else
    lg__gw_error(j, 502, "upstream_error", "upstream_unreachable", "upstream %s cannot be reached: %s%s",
                 lab, x->errbuf,
                 x->proxy_cert
                     ? " (the https:// proxy's own certificate: its CA in SSL_CERT_FILE or SSL_CERT_DIR;"
                       " docs/gateway.md, \"TLS and proxies\")"
                 : x->cc == CURLE_PEER_FAILED_VERIFICATION || x->cc == CURLE_SSL_CACERT_BADFILE
                     ? " (a private CA: the upstream's ca_file in --upstreams, or SSL_CERT_FILE;"
                       " docs/gateway.md, \"TLS and proxies\")"
                     : "");
}

void lg__gw_upstream_answer(lg__gw_job_t *j, lg__gw_http_t *x) {
  j->status = (int)x->status;
  snprintf(j->ctype, sizeof j->ctype, "%s", x->ctype[0] ? x->ctype : "application/json");
  lg__buf_t t = j->out;
  j->out = x->body_out;
  x->body_out = t;
}

/* Keeps an answer's last bytes in j->pass_tail: a priced answer's usage
 * (lg__gw_keys_pass_settle). */
static void keep_tail(lg__gw_job_t *j, const char *p, size_t n) {
  size_t cap = sizeof j->pass_tail;
  if (n >= cap) {
    memcpy(j->pass_tail, p + n - cap, cap);
    j->pass_tail_len = cap;
    return;
  }
  size_t keep = j->pass_tail_len + n <= cap ? j->pass_tail_len : cap - n;
  memmove(j->pass_tail, j->pass_tail + j->pass_tail_len - keep, keep);
  memcpy(j->pass_tail + keep, p, n);
  j->pass_tail_len = keep + n;
}

/* A passed-through answer's bytes, on to the client as they come: the
 * first starts the stream with the upstream's status and type. */
static int pass_data(void *ud, const char *p, size_t n) {
  lg__gw_http_t *x = ud;
  lg__gw_job_t *j = x->stream;
  if (!j->streaming)
    lg__gw_stream_start(j, (int)x->status, x->ctype[0] ? x->ctype : "application/json");
  if (j->pass_rsv[0]) keep_tail(j, p, n);
  return lg__gw_stream_write(j, p, n);
}

/* A path the gateway does not guard: forwarded, its 2xx answer streamed
 * back as it arrives (a download, a legacy completion's events); any
 * other answer, whole, as the upstream sent it. */
size_t lg__gw_pass_upstream(const lg__gw_t *gw, const lg__gw_job_t *j) {
  return lg__gw_config_pick(lg__gw_cfg(gw), NULL, j->route, NULL);
}

static void passthrough(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  size_t ui = lg__gw_pass_upstream(cx->gw, j);
  j->upstream = ui;
  lg__gw_http_t x = {0};
  x.up = &cx->gw->cfg.up[ui];
  x.method = j->method;
  x.path = j->path;
  x.v1 = !j->azure;
  x.query = j->query;
  x.body = j->body_len || !strcmp(j->method, "POST") ? j->body : NULL;
  x.body_len = j->body_len;
  x.headers = j->fwd;
  x.client_auth = j->auth;
  x.provider_key = j->provider_key;
  x.stop = &cx->gw->stop;
  x.gone = &j->s_gone;
  x.client_fd = j->fd;
  x.on_data = pass_data;
  x.ud = &x;
  x.stream = j;
  x.hdrs = &j->up_hdrs;
  x.max_bytes = cx->gw->answer_max; /* an error answer, held whole */
  int rc = lg__gw_http_do(cx->curl, cx->multi, &x);
  lg__gw_note_upstream(cx->gw, ui, &x);
  /* a 2xx cut short, or no answer to a request that went, may be billed */
  lg__gw_keys_pass_settle(cx, x.cc != CURLE_COULDNT_CONNECT && x.cc != CURLE_COULDNT_RESOLVE_HOST,
                          rc && j->streaming ? 0 : (int)x.status);
  if (j->streaming) {
    if (rc) lg__gw_stream_cut(j); /* begun: the client sees it cut, not ended */
  } else if (rc) {
    lg__gw_upstream_failed(j, &x);
  } else {
    lg__gw_upstream_answer(j, &x);
    if (x.head_len >= 0) { /* a HEAD: the length a GET would get */
      j->head_known = 1;
      j->head_len = (uint64_t)x.head_len;
    }
  }
  lg__gw_http_clear(&x);
  lg__gw_answer(j);
}

/* Runs job j, counted in gw->running, on this thread (a worker, or a
 * loop's leader that kept it): the upstream exchange, the answer sent
 * (from this thread when no thread runs the loop), then the count. */
static void run_job(lg__gw_ctx_t *cx, lg__gw_job_t *j) {
  lg__gw_t *gw = cx->gw;
  cx->j = j;
  tl_busy++;
  if (!cx->curl) {
    lg__gw_error(j, 500, "server_error", NULL, "loopguard gateway: libcurl did not start");
    lg__gw_answer(j);
  } else if (atomic_load(&gw->stop)) {
    lg__gw_error(j, 503, "server_error", "shutting_down", "loopguard is shutting down; retry");
    j->retry_after = 1;
    lg__gw_answer(j);
  } else if (lg__gw_keys_auth(cx)) {
    /* a key refused: answered */
  } else if (j->kind == LG__GW_PASS) {
    passthrough(cx);
  } else {
    lg__gw_chat(cx);
  }
  if (!j->answered) { /* never left without an answer */
    lg__gw_error(j, 500, "server_error", NULL, "loopguard gateway: no answer was made");
    lg__gw_answer(j);
  }
  /* A whole answer goes now, or a stream's end: sent from this thread
   * when the connection's loop is idle (lg__loop_serve), since the
   * thread holds no lock here; a request read meanwhile is this thread's
   * next job: a worker's from the queue (tl_claim), a leader's its own
   * (keep_mine). */
  j->job.may_serve = 1;
  tl_busy--;
  /* a worker that does not lead (nor finishes fibers: it takes no job
   * from the queue until they are done) */
  if (tl_cx && !lg__loop_leads() && !lg__fiber_self()) tl_claim = gw;
  release(j);
  if (j->streaming) lg__gw_stream_end(j);
  tl_claim = NULL;
  atomic_fetch_add(&gw->req[j->kind][j->upstream < GW_MAX_UP ? j->upstream : GW_MAX_UP - 1], 1);
  job_unref(j);
  cx->j = NULL;
  pthread_mutex_lock(&gw->qmu);
  gw->running--;
  pthread_cond_broadcast(&gw->idle_cv); /* not qcv: that would wake every idle worker */
  pthread_mutex_unlock(&gw->qmu);
}

int lg__gw_lead_post(lg__gw_t *gw, lg__loop_t *l) {
  if (!gw) return 0;
  pthread_mutex_lock(&gw->qmu);
  /* Only to a worker that takes it at once: one idle beyond the jobs and
   * leads already waiting for one. */
  int ok = !gw->quit && !atomic_load(&gw->stop) && gw->nleads < GW_LEADS &&
           (size_t)gw->idle > gw->qlen + (size_t)gw->nleads;
  if (ok) gw->leads[gw->nleads++] = l;
  pthread_mutex_unlock(&gw->qmu);
  if (ok) pthread_cond_signal(&gw->qcv);
  return ok;
}

/* An easy handle and its multi freed (either may be NULL): the multi
 * first, as it may hold the easy handle. */
static void handles_free(CURL *curl, CURLM *multi) {
  if (multi) curl_multi_cleanup(multi);
  if (curl) curl_easy_cleanup(curl);
}

static void ctx_free(void *p) {
  lg__gw_ctx_t *cx = p;
  handles_free(cx->curl, cx->multi);
  lg__free(cx);
  lg__json_region_thread_end();
}

/* A loop's own thread's context, kept until the thread exits (gw->ctx_key). */
static lg__gw_ctx_t *home_ctx(lg__gw_t *gw) {
  lg__gw_ctx_t *cx = NULL;
  if (gw->ctx_key_ok && !(cx = pthread_getspecific(gw->ctx_key)) &&
      (cx = lg__calloc(1, sizeof *cx))) {
    cx->gw = gw;
    cx->srv = gw->srv;
    cx->curl = curl_easy_init();
    cx->multi = curl_multi_init();
    if (pthread_setspecific(gw->ctx_key, cx)) {
      ctx_free(cx);
      cx = NULL;
    }
  }
  return cx;
}

static lg__gw_job_t *next_kept(gw_sched_t *s) {
  lg__gw_job_t *j = s->kept;
  if (!j) return NULL;
  if (!(s->kept = j->qnext)) s->kept_tail = NULL;
  s->nkept--;
  j->qnext = NULL;
  return j;
}

static void fib_main(void *arg) {
  gw_fib_t *fb = arg;
  run_job(&fb->cx, fb->j);
}

static void spares_free(void *p) {
  gw_spares_t *sp = p;
  while (sp->n > 0) {
    sp->n--;
    handles_free(sp->v[sp->n].curl, sp->v[sp->n].multi);
  }
  sp->keyed = 0;
}

/* cx's handles: the thread's last spare pair, else new ones. 0: none (no
 * memory). */
static int spare_take(lg__gw_t *gw, lg__gw_ctx_t *cx) {
  gw_spares_t *sp = &tl_spares;
  if (sp->n > 0) {
    sp->n--;
    cx->curl = sp->v[sp->n].curl;
    cx->multi = sp->v[sp->n].multi;
    return 1;
  }
  if (!sp->keyed && gw->spare_key_ok) sp->keyed = !pthread_setspecific(gw->spare_key, sp);
  cx->curl = curl_easy_init();
  cx->multi = curl_multi_init();
  if (cx->curl && cx->multi) return 1;
  handles_free(cx->curl, cx->multi);
  cx->curl = NULL;
  cx->multi = NULL;
  return 0;
}

/* cx's handles back to the thread's spares (freed when they are full, or
 * when the thread could not be given its key: nothing would free them). */
static void spare_give(lg__gw_ctx_t *cx) {
  gw_spares_t *sp = &tl_spares;
  if (!cx->curl) return;
  if (sp->keyed && sp->n < cx->gw->fibers) {
    sp->v[sp->n].curl = cx->curl;
    sp->v[sp->n].multi = cx->multi;
    sp->n++;
  } else {
    handles_free(cx->curl, cx->multi);
  }
  cx->curl = NULL;
  cx->multi = NULL;
}

static void fib_free(gw_fib_t *fb) {
  spare_give(&fb->cx);
  lg__fiber_free(fb->f);
  lg__free(fb);
}

static gw_fib_t *fib_get(lg__gw_t *gw, gw_sched_t *s) {
  gw_fib_t *fb = s->pool;
  if (fb) {
    s->pool = fb->next;
    s->npool--;
  } else {
    if (!(fb = lg__calloc(1, sizeof *fb))) return NULL;
    if (!(fb->f = lg__fiber_new(GW_FIBER_STACK))) {
      fib_free(fb);
      return NULL;
    }
    atomic_fetch_add(&gw->fibers_made, 1);
  }
  if (!spare_take(gw, &fb->cx)) {
    fib_free(fb);
    return NULL;
  }
  fb->cx.gw = gw;
  fb->cx.srv = gw->srv;
  fb->sched = s;
  fb->next = s->active;
  s->active = fb;
  s->nactive++;
  return fb;
}

/* Runs fb until it waits or is done; a fiber done goes back to the pool. */
static void fib_run(gw_sched_t *s, gw_fib_t *fb, int start) {
  fb->ready = 0;
  gw_fib_t *outer = s->cur;
  s->cur = fb;
  int more = start ? lg__fiber_start(fb->f, fib_main, fb) : lg__fiber_resume(fb->f);
  s->cur = outer;
  if (more) return;
  gw_fib_t **pp = &s->active;
  while (*pp != fb) pp = &(*pp)->next;
  *pp = fb->next;
  s->nactive--;
  fb->j = NULL;
  fb->w = NULL;
  spare_give(&fb->cx); /* its upstream connection to the thread's next request */
  if (s->npool < fb->cx.gw->fibers) {
    fb->next = s->pool;
    s->pool = fb;
    s->npool++;
  } else {
    fib_free(fb);
  }
}

/* When fb's wait ends at the latest: libcurl's timer, or its bound. */
static uint64_t fib_due(const gw_fib_t *fb) {
  uint64_t t = fb->w->due_ns;
  return t && t < fb->wait_until ? t : fb->wait_until;
}

/* Runs j whole on this thread, without a fiber: the worker's context, or
 * the loop's own thread's; with neither (no memory), answered 500. */
static void run_whole(lg__gw_t *gw, lg__gw_job_t *j) {
  lg__gw_ctx_t *cx = tl_cx ? tl_cx : home_ctx(gw);
  lg__gw_ctx_t none = {gw, gw->srv, NULL, NULL, NULL};
  run_job(cx ? cx : &none, j);
}

/* lg__park for the store's batches (store/group.c): a fiber waits for a
 * batch another thread runs without stopping its own thread. */
static void *park_self(void) {
  return tl_sched.wfd >= 0 && lg__fiber_self() ? tl_sched.cur : NULL;
}
static void park_wait(void *who) {
  (void)who;
  lg__fiber_yield(); /* resumed once woken: never before (no wait, not ready) */
}
static void park_wake(void *who) {
  gw_fib_t *fb = who;
  gw_sched_t *s = fb->sched;
  atomic_fetch_add(&s->waking, 1); /* lg__gw_fibers_end keeps wfd open until 0 */
  gw_fib_t *head = atomic_load(&s->woken);
  do fb->rnext = head;
  while (!atomic_compare_exchange_weak(&s->woken, &head, fb));
  if (atomic_load(&s->sleeping)) {
    uint64_t one = 1;
    ssize_t w = write(s->wfd, &one, sizeof one);
    (void)w; /* a full counter is a wake-up pending already */
  }
  atomic_fetch_sub(&s->waking, 1);
}
static const lg__park_t gw_park = {park_self, park_wait, park_wake};

/* The fibers whose wait is over resumed, the kept requests started:
 * 1 when anything ran. */
static int fibers_run(lg__gw_t *gw, gw_sched_t *s) {
  int ran = 0;
  uint64_t now = 0;
  atomic_store(&s->sleeping, 0);
  for (gw_fib_t *fb = atomic_exchange(&s->woken, NULL); fb; fb = fb->rnext) fb->ready = 1;
  /* Which are ready, all known before any runs (a fiber run may wait
   * again), each then run once: a fiber done leaves the active list, and
   * one a run makes ready waits for the next pass, which comes at once
   * (lg__gw_fibers_due_ms is 0). Until session 34 the list was walked again
   * from its start after every run: with hundreds of fibers, quadratic. */
  gw_fib_t *batch = NULL, **bt = &batch;
  for (gw_fib_t *fb = s->active; fb; fb = fb->next) {
    if (!fb->ready && fb->w) {
      if (!now) now = lg__mono_ns();
      if (now >= fib_due(fb) || atomic_load(&gw->stop)) fb->ready = 1;
    }
    if (fb->ready) {
      *bt = fb;
      bt = &fb->lnext;
    }
  }
  *bt = NULL;
  for (gw_fib_t *fb = batch, *nx; fb; fb = nx) {
    nx = fb->lnext;
    fib_run(s, fb, 0);
    ran = 1;
  }
  lg__gw_job_t *j;
  while ((j = next_kept(s))) {
    ran = 1;
    gw_fib_t *fb = fib_get(gw, s);
    if (fb) {
      fb->j = j;
      fib_run(s, fb, 1);
    } else { /* no memory for a fiber */
      run_whole(gw, j);
    }
  }
  return ran;
}

int lg__gw_run_mine(lg__gw_t *gw) {
  gw_sched_t *s = &tl_sched;
  if (!gw) return 0;
  if (s->ep >= 0) return fibers_run(gw, s);
  lg__gw_job_t *j = next_kept(s); /* without fibers: one, run whole */
  if (!j) return 0;
  run_whole(gw, j);
  return 1;
}

void lg__gw_fibers_begin(lg__gw_t *gw, int ep) {
  gw_sched_t *s = &tl_sched;
  s->ep = -1;
  if (!gw || !gw->fibers || ep < 0) return;
  if ((s->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) return;
  s->wsock.fd = s->wfd;
  s->wsock.w = NULL;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->wsock};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, s->wfd, &ev)) {
    close(s->wfd);
    s->wfd = -1;
    return;
  }
  s->ep = ep;
  lg__set_park(&gw_park);
}

/* Before the thread's wait: how long it may last for the fibers (0: no
 * wait, one is woken already); from here to its next run of them, a
 * fiber woken from another thread writes the eventfd. */
int lg__gw_fibers_due_ms(void) {
  gw_sched_t *s = &tl_sched;
  if (s->wfd >= 0) {
    atomic_store(&s->sleeping, 1);
    if (atomic_load(&s->woken)) return 0;
  }
  if (s->kept) return 0;
  uint64_t first = UINT64_MAX, now = lg__mono_ns();
  for (gw_fib_t *fb = s->active; fb; fb = fb->next) {
    if (fb->ready) return 0;
    if (fb->w && fib_due(fb) < first) first = fib_due(fb);
  }
  if (first == UINT64_MAX) return -1;
  return first <= now ? 0 : (int)((first - now + 999999) / 1000000);
}

void lg__gw_fiber_event(void *ptr, uint32_t events) {
  lg__gw_sock_t *k = ptr;
  if (!k->w) { /* the eventfd of park_wake: the woken list is read at the next run */
    uint64_t v;
    ssize_t r = read(k->fd, &v, sizeof v);
    (void)r;
    return;
  }
  k->ev |= events;
  if (k->w->fib) ((gw_fib_t *)k->w->fib)->ready = 1;
}

void lg__gw_fibers_end(lg__gw_t *gw) {
  gw_sched_t *s = &tl_sched;
  if (s->ep >= 0) {
    while (gw && (s->nactive || s->kept)) { /* finished here, without the loop */
      fibers_run(gw, s);
      if (!s->nactive) continue;
      int ms = lg__gw_fibers_due_ms();
      struct epoll_event got[16];
      int n = epoll_wait(s->ep, got, 16, ms < 0 || ms > 1000 ? 1000 : ms);
      for (int i = 0; i < n; i++)
        if (got[i].data.u64 > 2) lg__gw_fiber_event(got[i].data.ptr, got[i].events);
    }
  }
  while (s->pool) {
    gw_fib_t *fb = s->pool;
    s->pool = fb->next;
    fib_free(fb);
  }
  s->npool = 0;
  s->ep = -1;
  lg__set_park(NULL);
  if (s->wfd >= 0) {
    while (atomic_load(&s->waking)) sched_yield(); /* a waker's write still to come */
    close(s->wfd);
    s->wfd = -1;
  }
}

int lg__gw_fiber_ep(void) {
  return tl_sched.cur && lg__fiber_self() ? tl_sched.ep : -1;
}

void lg__gw_fiber_wait(lg__gw_wait_t *w) {
  gw_fib_t *fb = tl_sched.cur;
  if (!fb) return;
  w->fib = fb;
  fb->w = w;
  fb->wait_until = lg__mono_ns() + GW_FIBER_MAX_WAIT_NS;
  lg__fiber_yield();
  fb->w = NULL;
  w->fib = NULL;
}

void lg__gw_fiber_sleep(int ms) {
  lg__gw_wait_t w = {0};
  w.due_ns = lg__mono_ns() + (uint64_t)ms * 1000000u;
  lg__gw_fiber_wait(&w);
}

static void *worker_main(void *arg) {
  lg__gw_t *gw = arg;
  prctl(PR_SET_NAME, "lg-gateway", 0, 0, 0); /* for top -H and perf */
  lg__gw_ctx_t cx = {gw, gw->srv, curl_easy_init(), NULL, curl_multi_init()};
  tl_cx = &cx;
  int counted = 1; /* start_worker counted this worker idle */
  for (;;) {
    pthread_mutex_lock(&gw->qmu);
    if (!counted) gw->idle++;
    counted = 0;
    while (!gw->qhead && !gw->nleads && !gw->quit) pthread_cond_wait(&gw->qcv, &gw->qmu);
    gw->idle--;
    if (gw->nleads) { /* a loop to lead: first, or its requests wait */
      lg__loop_t *l = gw->leads[0];
      memmove(gw->leads, gw->leads + 1, (size_t)--gw->nleads * sizeof *gw->leads);
      atomic_fetch_add(&l->helpers, 1); /* under qmu: lg__gw_stop waits for the lead taken */
      pthread_cond_broadcast(&gw->idle_cv);
      pthread_mutex_unlock(&gw->qmu);
      lg__loop_lead_for(l);
      continue;
    }
    lg__gw_job_t *j = gw->qhead;
    if (!j) {
      pthread_mutex_unlock(&gw->qmu);
      break;
    }
    gw->qhead = j->qnext;
    if (!gw->qhead) gw->qtail = NULL;
    gw->qlen--;
    gw->running++;
    pthread_mutex_unlock(&gw->qmu);
    run_job(&cx, j);
  }
  tl_cx = NULL;
  handles_free(cx.curl, cx.multi);
  lg__json_region_thread_end();
  return NULL;
}

/* Starts one more worker, counted idle at once (it takes the oldest job or
 * lead when it runs). With qmu held. */
static int start_worker(lg__gw_t *gw) {
  if (gw->nth >= gw->max_th || pthread_create(&gw->th[gw->nth], NULL, worker_main, gw)) return -1;
  gw->nth++;
  gw->idle++;
  return 0;
}

/* The pool's growth: when the oldest queued request has waited GW_GROW_MS
 * and fewer workers are idle than requests and leads wait for one, one
 * more worker starts, and again until there are enough. */
static void *grow_main(void *arg) {
  lg__gw_t *gw = arg;
  prctl(PR_SET_NAME, "lg-gw-grow", 0, 0, 0);
  pthread_mutex_lock(&gw->qmu);
  while (!gw->quit) {
    if (short_of_workers(gw)) {
      uint64_t due = gw->qhead->queued_ns + (uint64_t)GW_GROW_MS * 1000000u;
      if (lg__mono_ns() >= due) {
        if (start_worker(gw)) gw->max_th = gw->nth; /* no more threads here: grow no further */
        continue;
      }
      struct timespec until = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
      pthread_cond_timedwait(&gw->grow_cv, &gw->qmu, &until);
    } else {
      pthread_cond_wait(&gw->grow_cv, &gw->qmu);
    }
  }
  pthread_mutex_unlock(&gw->qmu);
  return NULL;
}

/* ---- runs ---- */

static size_t bucket(const char *s) { return lg__hash_str(s) & (GW_BUCKETS - 1); }


static key_ent_t *key_find(lg__gw_t *gw, const char *key) {
  for (key_ent_t *e = gw->keys[bucket(key)]; e; e = e->next)
    if (!strcmp(e->key, key)) return e;
  return NULL;
}

static lg__gw_run_t *key_get(lg__gw_t *gw, const char *key) {
  key_ent_t *e = key_find(gw, key);
  return e ? e->run : NULL;
}

/* lg__gw_key_put under tmu: 1 when key named another run or none. */
static int key_put(lg__gw_t *gw, const char *key, lg__gw_run_t *r) {
  key_ent_t *e = key_find(gw, key);
  if (e && e->run == r) return 0;
  if (e) {
    /* A start another conversation had too (a hash of the same messages:
     * the same prompt and the same first answer, yesterday's job or the
     * last chat's greeting): the key goes to the latest, whose answer the
     * client continues from; the earlier run keeps its other keys. */
    for (key_ent_t **pp = &e->run->keys; *pp; pp = &(*pp)->rnext)
      if (*pp == e) {
        *pp = e->rnext;
        break;
      }
    e->run = r;
    e->rnext = r->keys;
    r->keys = e;
  } else if (!e) {
    e = lg__calloc(1, sizeof *e);
    if (e && (e->key = lg__strdup(key))) {
      size_t b = bucket(key);
      e->run = r;
      e->next = gw->keys[b];
      gw->keys[b] = e;
      e->rnext = r->keys;
      r->keys = e;
    } else {
      lg__free(e);
    }
  }
  return 1;
}

/* Whether the conversation keys are kept in the store beside the table,
 * so that every replica of it, and this server after a restart, finds a
 * derived run: unless the store is memory: (the process's own: the table
 * is all of it). */
int lg__gw_keys_kept(const lg__gw_ctx_t *cx) { return strcmp(cx->srv->scheme, "memory") != 0; }

lg_store_t *lg__gw_store(lg__gw_ctx_t *cx, lg_error_t *err) {
  lg__worker_t *w = lg__server_worker(cx->srv, err);
  return w ? w->store : NULL;
}

/* key -> run_id (and data, or NULL) written to the store (lg__gw_store); a
 * failure is logged: this server still has them in memory. */
static void key_store(lg__gw_ctx_t *cx, const char *key, const char *run_id, const char *data) {
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  if (s && !lg__store_gw_key_put(s, key, run_id, data, lg__server_now(cx->srv), &e)) return;
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"run_id\":");
  lg__buf_json_str(&f, run_id, strlen(run_id));
  lg__buf_puts(&f, ",\"message\":");
  const char *m = lg__error_text(&e, e.code);
  lg__buf_json_str_lossy(&f, m, strlen(m));
  if (!f.oom) lg__server_log(cx->srv, "warn", "conversation_key_not_stored", f.data);
  lg__buf_free(&f);
}

/* The keys that name r in memory written to the store again: r was made
 * again after a purge deleted it with them, and another replica (or this
 * server after a restart) finds its conversation by them. */
static void keys_store_again(lg_server_t *srv, lg__gw_run_t *r) {
  lg__gw_ctx_t cx = {.gw = srv->gw, .srv = srv};
  if (!lg__gw_keys_kept(&cx)) return;
  lg__buf_t names = {0}; /* each followed by its NUL */
  pthread_mutex_lock(&cx.gw->tmu);
  for (key_ent_t *e = r->keys; e; e = e->rnext) lg__buf_append(&names, e->key, strlen(e->key) + 1);
  pthread_mutex_unlock(&cx.gw->tmu);
  for (size_t at = 0; !names.oom && at < names.len; at += strlen(names.data + at) + 1)
    key_store(&cx, names.data + at, r->id, NULL);
  lg__buf_free(&names);
}

int lg__gw_key_names(lg__gw_t *gw, const char *key, const lg__gw_run_t *r) {
  pthread_mutex_lock(&gw->tmu);
  int named = key_get(gw, key) == r;
  pthread_mutex_unlock(&gw->tmu);
  return named;
}

void lg__gw_key_put(lg__gw_ctx_t *cx, const char *key, lg__gw_run_t *r) {
  lg__gw_t *gw = cx->gw;
  pthread_mutex_lock(&gw->tmu);
  int changed = key_put(gw, key, r);
  pthread_mutex_unlock(&gw->tmu);
  if (changed && lg__gw_keys_kept(cx)) key_store(cx, key, r->id, NULL);
}

void lg__gw_data_put_text(lg__gw_ctx_t *cx, lg__gw_run_t *r, const char *key, const char *text) {
  if (lg__gw_keys_kept(cx)) key_store(cx, key, r->id, text);
}

void lg__gw_data_put(lg__gw_ctx_t *cx, lg__gw_run_t *r, const char *key, json_t *data) {
  if (!lg__gw_keys_kept(cx)) return;
  char *t = lg__json_text(data, NULL);
  if (t) lg__gw_data_put_text(cx, r, key, t);
  lg__free(t);
}

char *lg__gw_data_text(lg__gw_ctx_t *cx, const lg__gw_run_t *r, const char *key) {
  if (!lg__gw_keys_kept(cx)) return NULL;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  char *run = NULL, *data = NULL;
  if (s && !lg__store_gw_key_get(s, key, &run, &data, &e) && run && !strcmp(run, r->id)) {
    lg__free(run);
    return data;
  }
  lg__free(run);
  lg__free(data);
  return NULL;
}

json_t *lg__gw_data_get(lg__gw_ctx_t *cx, const lg__gw_run_t *r, const char *key) {
  char *t = lg__gw_data_text(cx, r, key);
  json_t *out = t ? lg__json_load(t, strlen(t), NULL, NULL) : NULL;
  lg__free(t);
  return out;
}

const lg__gw_policy_t *lg__gw_policy_named(const lg__gw_t *gw, const char *name) {
  return lg__gw_policies_find(&gw->policies, name);
}

static lg_policy_t *server_policy(void *ud, const char *json, lg_error_t *err) {
  return lg__server_policy(ud, json, err);
}

/* Stores a new run (the step's run creation); an existing one is fine. */
typedef struct create_ctx {
  lg_run_t *run;
  const char *pol_json;
  int64_t now_ms;
  int same;
} create_ctx_t;

static int create_write(void *ud, lg_store_t *s, lg_error_t *err) {
  create_ctx_t *c = ud;
  return lg__step_create(s, c->run, c->pol_json, NULL, NULL, 0, c->now_ms, &c->same, err);
}

/* ---- the table of runs: by id, in LRU order ---- */

static void lru_unlink(lg__gw_t *gw, lg__gw_run_t *r) {
  if (r->lru_prev) r->lru_prev->lru_next = r->lru_next;
  else gw->lru_head = r->lru_next;
  if (r->lru_next) r->lru_next->lru_prev = r->lru_prev;
  else gw->lru_tail = r->lru_prev;
  r->lru_prev = r->lru_next = NULL;
}

static void lru_front(lg__gw_t *gw, lg__gw_run_t *r) {
  if (gw->lru_head == r) return;
  if (r->lru_prev || r->lru_next || gw->lru_tail == r) lru_unlink(gw, r);
  r->lru_next = gw->lru_head;
  if (gw->lru_head) gw->lru_head->lru_prev = r;
  gw->lru_head = r;
  if (!gw->lru_tail) gw->lru_tail = r;
}

static void id_unlink(lg__gw_t *gw, lg__gw_run_t *r) {
  for (lg__gw_run_t **pp = &gw->runs[bucket(r->id)]; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  r->next = NULL;
}

static void id_link(lg__gw_t *gw, lg__gw_run_t *r) {
  size_t b = bucket(r->id);
  r->next = gw->runs[b];
  gw->runs[b] = r;
}

static void run_free(lg__gw_run_t *r);
static lg__json_prefix_t *prefix_detach(lg__gw_t *gw, lg__gw_run_t *r);

/* Takes r and its keys out of the tables, and frees it. Under tmu. */
static void evict(lg__gw_t *gw, lg__gw_run_t *r) {
  id_unlink(gw, r);
  lru_unlink(gw, r);
  for (key_ent_t *e = r->keys, *n; e; e = n) {
    n = e->rnext;
    for (key_ent_t **pp = &gw->keys[bucket(e->key)]; *pp; pp = &(*pp)->next)
      if (*pp == e) {
        *pp = e->next;
        break;
      }
    lg__free(e->key);
    lg__free(e);
  }
  r->keys = NULL;
  lg__json_prefix_free(prefix_detach(gw, r));
  gw->nruns--;
  run_free(r);
}

/* ---- kept conversations (json_load.c's prefixes) ---- */

/* Whether p is in the heads' table (long enough to be found by its start). */
static int headed(const lg__json_prefix_t *p) { return p->len >= GW_PREFIX_HEAD; }

/* r's prefix, taken out of it and of the heads' table. Under tmu. */
static lg__json_prefix_t *prefix_detach(lg__gw_t *gw, lg__gw_run_t *r) {
  lg__json_prefix_t *p = r->prefix;
  if (!p) return NULL;
  if (headed(p))
    for (lg__gw_run_t **pp = &gw->heads[r->head & (GW_BUCKETS - 1)]; *pp; pp = &(*pp)->hnext)
      if (*pp == r) {
        *pp = r->hnext;
        break;
      }
  r->hnext = NULL;
  r->prefix = NULL;
  gw->prefix_bytes -= lg__json_prefix_size(p);
  return p;
}

/* p kept as r's (r has none). Under tmu. */
static void prefix_attach(lg__gw_t *gw, lg__gw_run_t *r, lg__json_prefix_t *p) {
  r->prefix = p;
  gw->prefix_bytes += lg__json_prefix_size(p);
  if (headed(p)) {
    r->head = lg__hash_bytes(p->text, GW_PREFIX_HEAD);
    lg__gw_run_t **b = &gw->heads[r->head & (GW_BUCKETS - 1)];
    r->hnext = *b; /* newest first */
    *b = r;
  }
}

/* Past the bound: the least recently used runs no request holds go. */
static void evict_over(lg__gw_t *gw) {
  for (lg__gw_run_t *r = gw->lru_tail, *p; r && gw->nruns > gw->max_runs; r = p) {
    p = r->lru_prev;
    if (!r->busy) evict(gw, r);
  }
}

/* Under tmu. */
static lg__gw_run_t *run_by_id(lg__gw_t *gw, const char *id) {
  lg__gw_run_t *r = gw->runs[bucket(id)];
  while (r && strcmp(r->id, id)) r = r->next;
  return r;
}

struct lg__json_prefix *lg__gw_prefix_take(lg__gw_t *gw, const char *id) {
  pthread_mutex_lock(&gw->tmu);
  lg__gw_run_t *r = run_by_id(gw, id);
  lg__json_prefix_t *p = r ? prefix_detach(gw, r) : NULL;
  pthread_mutex_unlock(&gw->tmu);
  return p;
}

struct lg__json_prefix *lg__gw_prefix_find(lg__gw_t *gw, const char *body, size_t n) {
  if (n < GW_PREFIX_HEAD) return NULL;
  uint64_t h = lg__hash_bytes(body, GW_PREFIX_HEAD);
  lg__json_prefix_t *p = NULL;
  pthread_mutex_lock(&gw->tmu);
  int tries = 0;
  for (lg__gw_run_t *r = gw->heads[h & (GW_BUCKETS - 1)]; r && tries < GW_PREFIX_TRIES; r = r->hnext) {
    if (r->head != h) continue;
    tries++;
    if (lg__json_prefix_starts(r->prefix, body, n)) {
      p = prefix_detach(gw, r);
      break;
    }
  }
  pthread_mutex_unlock(&gw->tmu);
  return p;
}

void lg__gw_prefix_keep(lg__gw_t *gw, lg__gw_run_t *r, const lg__json_lazy_t *lz) {
  if (!lz->arr) return; /* the body was not read */
  atomic_fetch_add(&gw->msgs_read[0], lz->n - lz->reused);
  atomic_fetch_add(&gw->msgs_read[1], lz->reused);
  if (!r) return;
  pthread_mutex_lock(&gw->tmu);
  size_t room = gw->prefix_max - gw->prefix_bytes; /* prefix_bytes never passes prefix_max */
  int skip = !r->seen || r->prefix; /* its first request, or another's kept */
  r->seen = 1;
  pthread_mutex_unlock(&gw->tmu);
  lg__json_prefix_t *p = skip ? NULL : lg__json_prefix_of(lz, room);
  if (!p) return;
  size_t n = lg__json_prefix_size(p);
  pthread_mutex_lock(&gw->tmu);
  if (!r->prefix && gw->prefix_bytes + n <= gw->prefix_max) { /* else another request's is there */
    prefix_attach(gw, r, p);
    p = NULL;
  }
  pthread_mutex_unlock(&gw->tmu);
  lg__json_prefix_free(p);
}

/* A run new to the table, to be stored with its first step (on_store)
 * with pol_json and group, and locked: whole before the table shows it,
 * so that a request of the same run on another thread, which finds it
 * there, waits for its creator and then stores it if the creator did not
 * (test_gateway_runs). NULL: out of memory. */
static lg__gw_run_t *run_alloc(const char *id, lg_policy_t *pol, const char *pol_json,
                               const char *group) {
  lg__gw_run_t *r = lg__calloc(1, sizeof *r);
  if (!r) return NULL;
  pthread_mutex_init(&r->mu, NULL);
  pthread_mutex_lock(&r->mu);
  r->policy = lg_policy_ref(pol);
  r->text_steer_at = SIZE_MAX;
  r->unborn = 1;
  if (!(r->id = lg__strdup(id)) || !(r->steer = json_object()) || !(r->own = json_object()) ||
      !(r->birth_policy = lg__strdup(pol_json)) || (group && !(r->birth_group = lg__strdup(group)))) {
    pthread_mutex_unlock(&r->mu);
    run_free(r);
    return NULL;
  }
  return r;
}

/* Whether run id, named by a request's header and new in this server's
 * memory, is stored by another replica (or by this server before a
 * restart or an eviction): read once a run and server. Not on memory:
 * (no other replica; the benchmark's fresh runs read nothing). */
static int named_stored(lg__gw_ctx_t *cx, const char *id) {
  if (!lg__gw_keys_kept(cx)) return 0;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  lg_run_record_t rec;
  if (!s || lg_store_run_get(s, id, &rec, &e)) return 0;
  lg_run_record_clear(&rec);
  return 1;
}

lg__gw_run_t *lg__gw_run_get(lg__gw_ctx_t *cx, const char *id, const char *key,
                             const lg__gw_policy_t *policy, int *made, lg_error_t *err) {
  lg__gw_t *gw = cx->gw;
  lg_policy_t *pol = policy ? policy->policy : cx->srv->default_policy;
  const char *pol_json = policy ? policy->json : cx->srv->default_policy_json;
  char fresh[40], *stored = NULL;
  lg__gw_run_t *r = NULL;
  int unstored = 0; /* the store has no run for key */
  pthread_mutex_lock(&gw->tmu);
  if (!id && key) r = key_get(gw, key);
  if (!r && !id && key && lg__gw_keys_kept(cx)) {
    /* not known here: another replica's, or this server's before a
     * restart or an eviction, when the store has it (read outside the
     * table's lock: a database's round trip) */
    pthread_mutex_unlock(&gw->tmu);
    lg_store_t *ks = lg__gw_store(cx, err);
    if (!ks || lg__store_gw_key_get(ks, key, &stored, NULL, err)) return NULL;
    pthread_mutex_lock(&gw->tmu);
    r = key_get(gw, key); /* put meanwhile by a request on another thread */
    if (!r && stored) id = stored;
    unstored = !stored;
  }
  if (!r && !id) {
    if (lg__step_new_run_id(fresh)) {
      pthread_mutex_unlock(&gw->tmu);
      lg__err(err, LG_EIO, NULL, -1, "no randomness for a run id");
      return NULL;
    }
    id = fresh;
  }
  if (!r) r = run_by_id(gw, id);
  int created = 0;
  if (!r) {
    if (!(r = run_alloc(id, pol, pol_json, cx->j->hdr_group))) {
      pthread_mutex_unlock(&gw->tmu);
      lg__free(stored);
      lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      return NULL;
    }
    id_link(gw, r);
    gw->nruns++;
    created = 1;
    /* A conversation with a start the gateway does not know (begun before
     * a restart, or evicted; a Responses conversation's first request):
     * its next requests find this run by it, those that come with this
     * one too. */
    if (key) key_put(gw, key, r);
  }
  r->busy++;
  lru_front(gw, r);
  evict_over(gw);
  pthread_mutex_unlock(&gw->tmu);
  /* a conversation start no replica knew names its new run in the store
   * too (a stored one names it already) */
  if (created && unstored) key_store(cx, key, r->id, NULL);
  if (made) *made = created && !stored && !(id != fresh && named_stored(cx, r->id));
  lg__free(stored);
  /* (a created run is locked already) */
  if (!created && pthread_mutex_trylock(&r->mu)) { /* another request of the run is in flight: may be long */
    if (lg__gw_fiber_ep() >= 0) { /* its holder may be a fiber of this thread */
      while (pthread_mutex_trylock(&r->mu)) lg__gw_fiber_sleep(1);
    } else {
      lg__will_block();
      pthread_mutex_lock(&r->mu);
    }
  }
  return r;
}

void lg__gw_run_unlock(lg__gw_t *gw, lg__gw_run_t *r) {
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_lock(&gw->tmu);
  r->busy--;
  evict_over(gw);
  pthread_mutex_unlock(&gw->tmu);
}

static void run_free(lg__gw_run_t *r) {
  lg__free(r->id);
  lg__free(r->birth_group);
  lg__free(r->birth_policy);
  lg__json_prefix_free(r->prefix);
  for (size_t i = 0; i < r->nrs; i++) {
    json_decref(r->rs[i].items);
    lg__free(r->rs[i].resp_id);
  }
  lg__free(r->rs);
  json_decref(r->steer);
  json_decref(r->sights);
  json_decref(r->own);
  lg__free(r->final_text);
  lg__free(r->hide_tool);
  lg__free(r->esc_model);
  lg__free(r->text_steer);
  lg_policy_free(r->policy);
  lg__buf_free(&r->last_body);
  pthread_mutex_destroy(&r->mu);
  lg__free(r);
}

/* ---- the step ---- */

/* A run's first step with its creation: one job, one transaction. */
typedef struct born {
  create_ctx_t c;
  const char *run_id;
  lg_store_run_fn fn;
  void *ud;
  int once; /* the row written once, by the step (SQLite's stores) */
  int created, existed;
} born_t;

static int born_write(void *ud, lg_store_t *s, lg_error_t *err) {
  born_t *b = ud;
  if (b->once) {
    int rc = lg__step_with_new(s, b->c.run, b->c.pol_json, b->c.now_ms, b->fn, b->ud, &b->created, err);
    b->existed = !rc && !b->created;
    return rc;
  }
  int rc = create_write(&b->c, s, err);
  if (rc == LG_ECONFLICT) { /* there already: named by its header, or written by a job that failed after */
    b->existed = 1;
    memset(err, 0, sizeof *err);
  } else if (rc) {
    return rc;
  } else {
    b->created = 1;
  }
  return lg_store_with_run(s, b->run_id, b->fn, b->ud, err);
}

/* fn(ud), noting that it was called: a run not found by its job was not
 * stored (lg_store_with_run calls fn only on a stored run). */
typedef struct called {
  lg_store_run_fn fn;
  void *ud;
  int called;
} called_t;
static int call_noted(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  called_t *c = ud;
  c->called = 1;
  return c->fn(c->ud, s, rec);
}

/* fn(ud) for run r in one transaction: through the group commit
 * (sqlite:, memory:), waited for, or on this thread's connection
 * (postgres:); its rc, and its err into *err. canon: the scratch of the
 * thread that runs it, set first. A run not yet in the store (r->unborn)
 * is written first, in the same job: a fresh run's request pays two
 * transactions, not three (postgres: its row is a transaction of its own
 * before the step's, as lg__step_create makes it). */
static int on_store_once(lg_server_t *srv, lg__gw_run_t *r, lg_store_run_fn fn, void *ud,
                         lg_canon_t **canon, lg_error_t *err);

/* on_store_once, and once more for a run this server wrote and the store
 * no longer holds (`loopguard runs purge` deleted it): the run is made
 * again, under its id, by the same job as the step, as when it was new
 * (the conversation goes on from here, as after a restart on memory:), not
 * a 500 on every later request of its conversation. */
static int on_store(lg_server_t *srv, lg__gw_run_t *r, lg_store_run_fn fn, void *ud,
                    lg_canon_t **canon, lg_error_t *err) {
  if (r->unborn) return on_store_once(srv, r, fn, ud, canon, err); /* being made: nothing to find */
  called_t c = {fn, ud, 0};
  int rc = on_store_once(srv, r, call_noted, &c, canon, err);
  if (rc != LG_ENOTFOUND || c.called) return rc; /* found, or not found by fn itself */
  r->unborn = 1;
  r->birth_tried = 0;
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"run_id\":");
  lg__buf_json_str(&f, r->id, strlen(r->id));
  lg__buf_puts(&f, ",\"message\":\"the run is no longer in the store (purged): made again\"");
  if (!f.oom) lg__server_log(srv, "info", "run_gone", f.data);
  lg__buf_free(&f);
  if (err) memset(err, 0, sizeof *err);
  rc = on_store_once(srv, r, fn, ud, canon, err);
  if (!rc) keys_store_again(srv, r);
  return rc;
}

static int on_store_once(lg_server_t *srv, lg__gw_run_t *r, lg_store_run_fn fn, void *ud,
                         lg_canon_t **canon, lg_error_t *err) {
  lg_store_t *s = NULL; /* without a group commit: this thread's */
  if (srv->batcher) {
    *canon = lg__batcher_canon(srv->batcher);
  } else {
    lg__worker_t *wk = lg__server_worker(srv, err);
    if (!wk) return LG_ESTORE;
    *canon = wk->canon;
    s = wk->store;
  }
  born_t b = {.run_id = NULL}; /* filled for a run not yet stored */
  lg__job_t j = {.run_id = r->id, .fn = fn, .ud = ud};
  if (r->unborn) {
    b = (born_t){{lg_run_new(r->id, r->birth_group, r->policy, NULL, NULL, err), r->birth_policy,
                  lg__server_now(srv), 0},
                 r->id, fn, ud, srv->batcher != NULL, 0, 0};
    if (!b.c.run) return err && err->code ? err->code : LG_ENOMEM;
    j = (lg__job_t){.write = born_write, .ud = &b, .whole = 1};
  }
  if (s) {
    j.rc = r->unborn ? born_write(&b, s, &j.err) : lg_store_with_run(s, r->id, fn, ud, &j.err);
  } else {
    lg__batcher_run(srv->batcher, &j);
  }
  if (err) *err = j.err;
  if (!r->unborn) return j.rc;
  lg_run_free(b.c.run);
  if (!j.rc) { /* stored: the run and the step, committed */
    r->unborn = 0;
    /* counted once: when written here, or by a job that failed after */
    if (b.created || (b.existed && r->birth_tried)) atomic_fetch_add(&srv->metrics.runs_active, 1);
  } else if (b.created) {
    r->birth_tried = 1; /* written, unless the commit failed: the next job says */
  }
  return j.rc;
}

int lg__gw_step(lg__gw_ctx_t *cx, lg__gw_run_t *r, lg__step_t *st, lg_error_t *err) {
  lg_server_t *srv = cx->srv;
  st->policy = server_policy;
  st->policy_ud = srv;
  st->model_turn = 1;
  lg_error_t e = {0};
  int rc = lg__step_finish(st, on_store(srv, r, lg__step_locked, st, &st->canon, &e), &e);
  if (rc && err) *err = e;
  if (!rc) lg__server_note_step(srv, st); /* a budget's refusal: lg__gw_keys_refusal counts it */
  return rc;
}

int lg__gw_step_batch(lg__gw_ctx_t *cx, lg__gw_run_t *r, lg__step_batch_t *b, lg_error_t *err) {
  lg_server_t *srv = cx->srv;
  if (!b->n) return 0;
  b->v[0].policy = server_policy;
  b->v[0].policy_ud = srv;
  for (size_t i = 0; i < b->n; i++) b->v[i].model_turn = 1; /* as lg__gw_step's */
  lg_error_t e = {0};
  int rc = lg__step_batch_finish(b, on_store(srv, r, lg__step_batch_locked, b, &b->v[0].canon, &e), &e);
  if (rc && err) *err = e;
  for (size_t i = 0; !rc && i < b->n; i++)
    if (b->v[i].decided) lg__server_note_step(srv, &b->v[i]);
  return rc;
}

/* ---- metrics and logs ---- */

#define UP_LOG_GAP_NS 1000000000ull /* one line a second of a kind: upstream_failed, request_failed */

/* Whether a line of a kind that an outage repeats for every request is
 * written now: one a second (*next), the others counted (*left); *left_out
 * is how many were left out since the last one written. */
static int log_turn(_Atomic uint64_t *next, _Atomic uint64_t *left, uint64_t *left_out) {
  uint64_t now = lg__mono_ns(), at = atomic_load(next);
  if (now < at || !atomic_compare_exchange_strong(next, &at, now + UP_LOG_GAP_NS)) {
    atomic_fetch_add(left, 1);
    return 0;
  }
  *left_out = atomic_exchange(left, 0);
  return 1;
}

/* A request the gateway answered 500 for a failure of its own: the
 * on-call engineer's line, as the sidecar's routes write one (the client
 * has the same message); at most one a second, as upstream_failed. */
static void log_failed(lg__gw_job_t *j, const char *msg) {
  lg__gw_t *gw = j->gw;
  uint64_t left;
  if (!gw) return; /* a unit test's job: no gateway */
  atomic_fetch_add(&gw->failed, 1);
  if (!log_turn(&gw->fail_log_next, &gw->fail_log_left, &left)) return;
  lg__buf_t f = {0};
  lg__buf_printf(&f, "\"route\":\"gateway\",\"kind\":\"%s\",\"path\":", kind_names[j->kind]);
  lg__gw_json_path(&f, j);
  if (left) lg__buf_printf(&f, ",\"suppressed\":%llu", (unsigned long long)left);
  lg__buf_puts(&f, ",\"status\":500,\"message\":");
  lg__buf_json_str_lossy(&f, msg, strlen(msg));
  if (!f.oom) lg__server_log(gw->srv, "error", "request_failed", f.data);
  lg__buf_free(&f);
}

void lg__gw_note_upstream(lg__gw_t *gw, size_t up, const lg__gw_http_t *x) {
  size_t u = up < GW_MAX_UP ? up : GW_MAX_UP - 1;
  int b = 0;
  while (b < GW_HIST && (double)x->ns / 1e9 > hist_le[b]) b++;
  atomic_fetch_add(&gw->up_hist[u][b], 1);
  atomic_fetch_add(&gw->up_sum_ns[u], x->ns);
  if (lg__gw_http_hung_up(x)) atomic_fetch_add(&gw->up_hung_up[u], 1);
  if (x->cc != CURLE_OK && x->stop && atomic_load(x->stop)) atomic_fetch_add(&gw->cut_at_stop, 1);
  int k = lg__gw_http_failure(x);
  if (k == LG__GW_UP_OK) return;
  atomic_fetch_add(&gw->up_err[u][k], 1);
  if (k == LG__GW_UP_HTTP_4XX || k == LG__GW_UP_HTTP_5XX) return; /* the provider's answer, passed on: counted */
  /* The exchange failed: the on-call engineer's first question. An outage
   * fails every request, hundreds a second: one line a second for an
   * upstream and kind, the next saying how many were left out (the
   * counter above has them all). */
  uint64_t left;
  if (!log_turn(&gw->up_log_next[u][k], &gw->up_log_left[u][k], &left)) return;
  lg__buf_t f = {0};
  char lab[300];
  lg__buf_puts(&f, "\"upstream\":");
  lg__gw_upstream_label(x->up, lab, sizeof lab);
  lg__buf_json_str(&f, lab, strlen(lab));
  lg__buf_printf(&f, ",\"kind\":\"%s\",\"path\":", lg__gw_http_failure_names[k]);
  lg__buf_json_str_lossy(&f, x->path, strlen(x->path)); /* a passed-through path: the client's bytes */
  lg__buf_printf(&f, ",\"status\":%ld,\"ms\":%.1f,\"message\":", x->status, (double)x->ns / 1e6);
  const char *m = x->over ? "the answer was over LOOPGUARD_GATEWAY_ANSWER_BYTES" : x->errbuf;
  lg__buf_json_str_lossy(&f, m, strlen(m));
  if (left) lg__buf_printf(&f, ",\"suppressed\":%llu", (unsigned long long)left);
  if (!f.oom) lg__server_log(gw->srv, "warn", "upstream_failed", f.data);
  lg__buf_free(&f);
}

/* "UI\tMODEL", new (NULL: out of memory). */
static char *ui_model(size_t ui, const char *model) {
  lg__buf_t b = {0};
  lg__buf_printf(&b, "%zu\t%s", ui, model ? model : "");
  if (b.oom) lg__buf_free(&b);
  return b.data;
}

/* Whether "UI\tMODEL" k is in the table, and when add, put there (taking
 * k) if not: 1 it was. Under tmu. */
static int mct_seen(lg__gw_t *gw, char **k, int add) {
  int found = 0;
  pthread_mutex_lock(&gw->tmu);
  for (size_t i = 0; *k && i < gw->nmct && !found; i++) found = !strcmp(gw->mct[i], *k);
  if (add && *k && !found && gw->nmct < GW_LEARNT_MODELS) gw->mct[gw->nmct++] = *k, *k = NULL;
  pthread_mutex_unlock(&gw->tmu);
  return found;
}

int lg__gw_learnt(lg__gw_ctx_t *cx, size_t ui, int bit, const char *model) {
  lg__gw_t *gw = cx->gw;
  if (ui >= gw->cfg.nup || !(atomic_load(&gw->cfg.up[ui].learnt) & bit)) return 0;
  if (bit != LG__GW_LEARNT_MAX_COMPLETION_TOKENS) return 1;
  char *k = ui_model(ui, model);
  int found = mct_seen(gw, &k, 0);
  lg__free(k);
  return found;
}

void lg__gw_learn(lg__gw_ctx_t *cx, size_t ui, int bit, const char *model) {
  lg__gw_t *gw = cx->gw;
  if (ui >= gw->cfg.nup) return;
  int had = atomic_fetch_or(&gw->cfg.up[ui].learnt, bit) & bit;
  if (bit == LG__GW_LEARNT_MAX_COMPLETION_TOKENS) { /* a model's */
    char *k = ui_model(ui, model);
    had = mct_seen(gw, &k, 1);
    lg__free(k);
  }
  if (had) return;
  static const char *const said[2][2] = {
      {"upstream_refuses_stream_options",
       "the upstream refused stream_options (asked for a stream's usage): its streams are asked "
       "without it from now on, their usage read if it sends one, else counted from their bytes"},
      {"upstream_refuses_max_tokens",
       "the upstream refused the max_tokens a loopguard key adds, for max_completion_tokens: "
       "that one is added for this model from now on"}};
  int k = bit == LG__GW_LEARNT_NO_STREAM_OPTIONS ? 0 : 1;
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"upstream\":");
  lg__buf_json_str(&f, gw->cfg.up[ui].name, strlen(gw->cfg.up[ui].name));
  if (k && model) {
    lg__buf_puts(&f, ",\"model\":");
    lg__buf_json_str(&f, model, strlen(model));
  }
  lg__buf_puts(&f, ",\"message\":");
  lg__buf_json_str(&f, said[k][1], strlen(said[k][1]));
  if (!f.oom) lg__server_log(cx->srv, "info", said[k][0], f.data);
  lg__buf_free(&f);
}

void lg__gw_note_intervention(lg__gw_ctx_t *cx, const char *run_id, const char *action,
                              const char *reason, const char *tool, const char *call_id) {
  int a = !strcmp(action, "block") ? 0 : !strcmp(action, "replay") ? 1 : !strcmp(action, "stop") ? 2 : 3;
  lg_reason_t r = LG_R_NONE;
  for (int i = 0; i < LG_R__COUNT; i++)
    if (reason && !strcmp(lg_reason_name((lg_reason_t)i), reason)) r = (lg_reason_t)i;
  atomic_fetch_add(&cx->gw->interventions[a][r], 1);
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"run_id\":");
  lg__buf_json_str(&f, run_id, strlen(run_id));
  lg__buf_printf(&f, ",\"action\":\"%s\",\"reason\":", action);
  if (reason) lg__buf_json_str(&f, reason, strlen(reason));
  else lg__buf_puts(&f, "null");
  lg__buf_printf(&f, ",\"route\":\"%s\"", kind_names[cx->j->kind]);
  if (tool) {
    lg__buf_puts(&f, ",\"tool\":");
    lg__buf_json_str(&f, tool, strlen(tool));
  }
  if (call_id) {
    lg__buf_puts(&f, ",\"call_id\":");
    lg__buf_json_str(&f, call_id, strlen(call_id));
  }
  if (!f.oom) lg__server_log(cx->srv, "info", "gateway_intervention", f.data);
  lg__buf_free(&f);
}

void lg__gw_metrics(lg__gw_t *gw, lg__buf_t *b) {
  size_t nup = gw->cfg.nup < GW_MAX_UP ? gw->cfg.nup : GW_MAX_UP;
  pthread_mutex_lock(&gw->qmu);
  int nth = gw->nth, idle = gw->idle, max_th = gw->max_th;
  size_t qlen = gw->qlen;
  pthread_mutex_unlock(&gw->qmu);
  lg__buf_printf(b, "# HELP loopguard_gateway_workers The gateway's worker threads, busy (a request each, most "
                    "often waiting for its upstream) and idle; the pool grows when requests wait.\n"
                    "# TYPE loopguard_gateway_workers gauge\n"
                    "loopguard_gateway_workers{state=\"busy\"} %d\nloopguard_gateway_workers{state=\"idle\"} %d\n"
                    "# HELP loopguard_gateway_workers_max The most worker threads the pool may start "
                    "(LOOPGUARD_GATEWAY_WORKERS).\n# TYPE loopguard_gateway_workers_max gauge\n"
                    "loopguard_gateway_workers_max %d\n"
                    "# HELP loopguard_gateway_queued Gateway requests waiting for a worker.\n"
                    "# TYPE loopguard_gateway_queued gauge\nloopguard_gateway_queued %zu\n"
                    "# HELP loopguard_gateway_fibers_made_total Fibers the HTTP threads made to run "
                    "gateway requests on (a stack mapped each); a thread keeps as many as it had at "
                    "once, up to LOOPGUARD_GATEWAY_FIBERS, so this grows with the most requests at "
                    "once, not with requests.\n"
                    "# TYPE loopguard_gateway_fibers_made_total counter\n"
                    "loopguard_gateway_fibers_made_total %llu\n",
                 nth - idle, idle, max_th, qlen, (unsigned long long)atomic_load(&gw->fibers_made));
  lg__buf_puts(b, "# HELP loopguard_gateway_requests_total Gateway requests by route and upstream.\n"
                  "# TYPE loopguard_gateway_requests_total counter\n");
  for (int k = 0; k < LG__GW__KINDS; k++)
    for (size_t u = 0; u < nup; u++)
      lg__buf_printf(b, "loopguard_gateway_requests_total{route=\"%s\",upstream=\"%s\"} %llu\n",
                     kind_names[k], gw->cfg.up[u].name,
                     (unsigned long long)atomic_load(&gw->req[k][u]));
  lg__buf_puts(b, "# HELP loopguard_gateway_upstream_errors_total Upstream requests that failed, by upstream "
                  "and kind: unreachable (connect, DNS, TLS), timeout, broken (the answer cut off), "
                  "too_large, http_4xx and http_5xx (the provider's error answers, passed on).\n"
                  "# TYPE loopguard_gateway_upstream_errors_total counter\n");
  for (size_t u = 0; u < nup; u++)
    for (int k = LG__GW_UP_UNREACHABLE; k < LG__GW_UP__KINDS; k++)
      lg__buf_printf(b, "loopguard_gateway_upstream_errors_total{upstream=\"%s\",kind=\"%s\"} %llu\n",
                     gw->cfg.up[u].name, lg__gw_http_failure_names[k],
                     (unsigned long long)atomic_load(&gw->up_err[u][k]));
  lg__buf_puts(b, "# HELP loopguard_gateway_client_hangups_total Upstream requests the gateway ended because "
                  "their client hung up before the answer's end (an SDK's timeout shorter than the "
                  "model's answer, a person's Ctrl-C): the upstream is told at once.\n"
                  "# TYPE loopguard_gateway_client_hangups_total counter\n");
  for (size_t u = 0; u < nup; u++)
    lg__buf_printf(b, "loopguard_gateway_client_hangups_total{upstream=\"%s\"} %llu\n", gw->cfg.up[u].name,
                   (unsigned long long)atomic_load(&gw->up_hung_up[u]));
  lg__buf_printf(b,
                 "# HELP loopguard_gateway_failures_total Gateway requests answered 500 for a failure "
                 "of loopguard's own (the store down or refusing, out of memory; not an upstream's "
                 "error): the log's request_failed lines say which.\n"
                 "# TYPE loopguard_gateway_failures_total counter\n"
                 "loopguard_gateway_failures_total %llu\n",
                 (unsigned long long)atomic_load(&gw->failed));
  lg__buf_puts(b, "# HELP loopguard_gateway_upstream_seconds Upstream request latency.\n"
                  "# TYPE loopguard_gateway_upstream_seconds histogram\n");
  for (size_t u = 0; u < nup; u++) {
    uint64_t cum = 0;
    for (int i = 0; i <= GW_HIST; i++) {
      cum += atomic_load(&gw->up_hist[u][i]);
      if (i < GW_HIST)
        lg__buf_printf(b, "loopguard_gateway_upstream_seconds_bucket{upstream=\"%s\",le=\"%g\"} %llu\n",
                       gw->cfg.up[u].name, hist_le[i], (unsigned long long)cum);
      else
        lg__buf_printf(b, "loopguard_gateway_upstream_seconds_bucket{upstream=\"%s\",le=\"+Inf\"} %llu\n",
                       gw->cfg.up[u].name, (unsigned long long)cum);
    }
    lg__buf_printf(b, "loopguard_gateway_upstream_seconds_sum{upstream=\"%s\"} %.6f\n",
                   gw->cfg.up[u].name, (double)atomic_load(&gw->up_sum_ns[u]) / 1e9);
    lg__buf_printf(b, "loopguard_gateway_upstream_seconds_count{upstream=\"%s\"} %llu\n",
                   gw->cfg.up[u].name, (unsigned long long)cum);
  }
  lg__buf_printf(b, "# HELP loopguard_gateway_json_chunks Chunks of 128 KB holding JSON the server read "
                    "(gateway requests and answers, sidecar bodies) and has not freed: one open a thread "
                    "that reads JSON; more are values kept past their request.\n# TYPE loopguard_gateway_json_chunks gauge\nloopguard_gateway_json_chunks %zu\n",
                 lg__json_region_chunks());
  lg__buf_printf(b, "# HELP loopguard_gateway_messages_read_total The messages (Responses: input items) of "
                    "gateway requests, by how they were read: checked, or taken as they were from the "
                    "same bytes of the run's last request.\n# TYPE loopguard_gateway_messages_read_total counter\n"
                    "loopguard_gateway_messages_read_total{how=\"checked\"} %llu\n"
                    "loopguard_gateway_messages_read_total{how=\"reused\"} %llu\n",
                 (unsigned long long)atomic_load(&gw->msgs_read[0]),
                 (unsigned long long)atomic_load(&gw->msgs_read[1]));
  static const char *an[4] = {"block", "replay", "stop", "observe"};
  lg__buf_puts(b, "# HELP loopguard_gateway_interventions_total Calls and responses the gateway changed, by action and reason.\n"
                  "# TYPE loopguard_gateway_interventions_total counter\n");
  for (int a = 0; a < 4; a++)
    for (int r = 0; r < LG_R__COUNT; r++) {
      uint64_t v = atomic_load(&gw->interventions[a][r]);
      if (v)
        lg__buf_printf(b, "loopguard_gateway_interventions_total{action=\"%s\",reason=\"%s\"} %llu\n",
                       an[a], lg_reason_name((lg_reason_t)r), (unsigned long long)v);
    }
}

/* Whether a base URL has no path ("https://api.openai.com"; base_url has
 * no trailing slash): the API's paths then go right after the host, where
 * no provider serves them (their bases end in /v1, /api/v1,
 * /v1beta/openai, ...). Allowed, as a proxy may serve them there, but
 * said at the start: every request would be the provider's 404. */
static int without_path(const lg__gw_upstream_t *u) {
  const char *host = strstr(u->base_url, "://");
  return host && !strchr(host + 3, '/');
}

/* What the start says of u's base URL without a path (lg__gw_banner and
 * lg__gw_log_start). */
static void without_path_note(const lg__gw_upstream_t *u, lg__buf_t *b) {
  int anthropic = u->api == LG__GW_API_ANTHROPIC;
  lg__buf_printf(b, "%s has no path, so requests go to %s%s; a provider's base URL ends in its "
                    "path (%s)",
                 u->base_url, u->base_url, anthropic ? "/messages" : "/chat/completions",
                 anthropic ? "https://api.anthropic.com/v1" : "https://api.openai.com/v1");
}

void lg__gw_banner(lg__gw_t *gw, lg__buf_t *b) {
  for (size_t i = 0; i < gw->cfg.nup; i++) {
    const lg__gw_upstream_t *u = &gw->cfg.up[i];
    lg__buf_printf(b, "  gateway: %s -> %s (%s)%s%s\n", u->name, u->base_url,
                   u->api == LG__GW_API_ANTHROPIC ? "anthropic" : "openai",
                   i == gw->cfg.def ? ", the default" : "",
                   u->azure ? "; an Azure OpenAI resource: an AzureOpenAI client's endpoint is the "
                              "server's URL, without /v1"
                            : "");
    if (!without_path(u)) continue;
    lg__buf_puts(b, "  gateway: note: ");
    without_path_note(u, b);
    lg__buf_putc(b, '\n');
  }
}

void lg__gw_log_start(lg__gw_t *gw) {
  for (size_t i = 0; i < gw->cfg.nup; i++) {
    const lg__gw_upstream_t *u = &gw->cfg.up[i];
    if (!without_path(u)) continue;
    lg__buf_t f = {0}, m = {0};
    without_path_note(u, &m);
    lg__buf_puts(&f, "\"upstream\":");
    lg__buf_json_str(&f, u->name, strlen(u->name));
    lg__buf_puts(&f, ",\"base_url\":");
    lg__buf_json_str(&f, u->base_url, strlen(u->base_url));
    lg__buf_puts(&f, ",\"message\":");
    if (m.data) lg__buf_json_str(&f, m.data, m.len);
    if (!f.oom && !m.oom) lg__server_log(gw->srv, "warn", "upstream_without_path", f.data);
    lg__buf_free(&f);
    lg__buf_free(&m);
  }
}

/* ---- life ---- */

int lg__gw_wanted(const lg_server_options_t *opts) {
  return opts->nupstreams || (opts->upstreams_file && *opts->upstreams_file);
}

/* A whole number from the environment variable name, in [min, max]
 * (*v unchanged when it is not set): anything else fails the start. */
static int env_whole(const char *name, const char *unit, long long min, long long max, long long *v,
                     lg_error_t *err) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (*end || errno || x < min || x > max) {
    if (max == LLONG_MAX)
      return lg__err(err, LG_EINVAL, name, -1, "must be a whole number of %s, at least %lld, not \"%s\"",
                     unit, min, s);
    return lg__err(err, LG_EINVAL, name, -1, "must be a whole number of %s from %lld to %lld, not \"%s\"",
                   unit, min, max, s);
  }
  *v = x;
  return 0;
}

int lg__gw_new(lg_server_t *srv, const lg_server_options_t *opts, lg__gw_t **out,
               lg_error_t *err) {
  *out = NULL;
  if (!lg__gw_wanted(opts)) return 0;
  lg__gw_t *gw = lg__calloc(1, sizeof *gw);
  if (!gw) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  gw->srv = srv;
  int rc = lg__gw_config_load(&gw->cfg, opts->upstreams, opts->nupstreams, opts->upstreams_file, err);
  if (!rc && !gw->cfg.nup) rc = lg__err(err, LG_EINVAL, "upstream", -1, "no upstream given");
  if (!rc) rc = lg__gw_policies_load(&gw->policies, opts->policies_dir, err);
  const char *mr = getenv("LOOPGUARD_GATEWAY_MAX_RUNS");
  gw->max_runs = mr && atoll(mr) > 0 ? (size_t)atoll(mr) : GW_MAX_RUNS_DEFAULT;
  const char *pb = getenv("LOOPGUARD_GATEWAY_PREFIX_BYTES");
  gw->prefix_max = pb && *pb && atoll(pb) >= 0 ? (size_t)atoll(pb) : GW_PREFIX_BYTES_DEFAULT;
  long long ka = GW_KEEPALIVE_MS_DEFAULT, ab = (long long)GW_ANSWER_BYTES_DEFAULT;
  if (!rc) rc = env_whole("LOOPGUARD_GATEWAY_KEEPALIVE_MS", "milliseconds", 0, 3600000, &ka, err);
  if (!rc) rc = env_whole("LOOPGUARD_GATEWAY_ANSWER_BYTES", "bytes", 1024, LLONG_MAX, &ab, err);
  gw->keepalive_ns = (uint64_t)ka * 1000000ull;
  gw->answer_max = (size_t)ab;
  long long fib = GW_FIBERS;
  if (!rc) rc = env_whole("LOOPGUARD_GATEWAY_FIBERS", "fibers", 0, GW_FIBERS_LIMIT, &fib, err);
  gw->fibers = (int)fib;
  long long qm = GW_QUEUE_MAX;
  if (!rc) rc = env_whole("LOOPGUARD_GATEWAY_QUEUE", "requests", 1, GW_QUEUE_LIMIT, &qm, err);
  gw->qmax = (size_t)qm;
  const char *wn = getenv("LOOPGUARD_GATEWAY_WORKERS");
  gw->max_th = srv->shared ? GW_WORKERS_MAX : GW_WORKERS_MAX_PG;
  if (!rc && wn && *wn) {
    char *end;
    long v = strtol(wn, &end, 10);
    if (*end || v < 1 || v > GW_WORKERS_LIMIT)
      rc = lg__err(err, LG_EINVAL, "LOOPGUARD_GATEWAY_WORKERS", -1,
                   "must be a whole number of threads from 1 to %d, not \"%s\"", GW_WORKERS_LIMIT, wn);
    else
      gw->max_th = (int)v;
  }
  if (!rc && !(gw->th = lg__calloc((size_t)gw->max_th, sizeof *gw->th)))
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  if (rc) {
    lg__gw_config_clear(&gw->cfg);
    lg__gw_policies_clear(&gw->policies);
    lg__free(gw);
    return rc;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  pthread_mutex_init(&gw->qmu, NULL);
  pthread_cond_init(&gw->qcv, NULL);
  pthread_cond_init(&gw->idle_cv, NULL);
  pthread_mutex_init(&gw->tmu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* grow_main's deadlines are lg__mono_ns() */
  pthread_cond_init(&gw->grow_cv, &ca);
  pthread_condattr_destroy(&ca);
  gw->ctx_key_ok = !pthread_key_create(&gw->ctx_key, ctx_free);
  gw->spare_key_ok = !pthread_key_create(&gw->spare_key, spares_free);
  pthread_mutex_lock(&gw->qmu);
  for (int i = 0; i < GW_WORKERS && i < gw->max_th; i++)
    if (start_worker(gw)) break;
  pthread_mutex_unlock(&gw->qmu);
  gw->grower_ok = gw->nth && !pthread_create(&gw->grower, NULL, grow_main, gw);
  if (!gw->grower_ok) {
    lg__gw_free(gw);
    return lg__err(err, LG_ENOMEM, NULL, -1, "cannot start the gateway's threads");
  }
  *out = gw;
  return 0;
}

int lg__gw_stop(lg__gw_t *gw) {
  if (!gw) return 0;
  atomic_store(&gw->stop, 1);
  pthread_mutex_lock(&gw->qmu);
  /* (a posted lead taken too: stop_loops then waits for its worker) */
  while (gw->running || gw->qhead || gw->nleads) pthread_cond_wait(&gw->idle_cv, &gw->qmu);
  pthread_mutex_unlock(&gw->qmu);
  /* cut: an upstream exchange the stop aborted (a worker still settling
   * an answer it sent, or a request that had none, was not) */
  return atomic_load(&gw->cut_at_stop) > 0;
}

void lg__gw_free(lg__gw_t *gw) {
  if (!gw) return;
  atomic_store(&gw->stop, 1);
  pthread_mutex_lock(&gw->qmu);
  gw->quit = 1;
  pthread_cond_broadcast(&gw->qcv);
  pthread_cond_broadcast(&gw->grow_cv);
  pthread_mutex_unlock(&gw->qmu);
  if (gw->grower_ok) pthread_join(gw->grower, NULL); /* first: no worker starts after it */
  for (int i = 0; i < gw->nth; i++) pthread_join(gw->th[i], NULL);
  lg__free(gw->th);
  while (gw->lru_head) evict(gw, gw->lru_head);
  lg__gw_policies_clear(&gw->policies);
  lg__gw_config_clear(&gw->cfg);
  pthread_mutex_destroy(&gw->qmu);
  pthread_cond_destroy(&gw->qcv);
  pthread_cond_destroy(&gw->idle_cv);
  pthread_cond_destroy(&gw->grow_cv);
  pthread_mutex_destroy(&gw->tmu);
  for (size_t i = 0; i < gw->nmct; i++) lg__free(gw->mct[i]);
  if (gw->ctx_key_ok) pthread_key_delete(gw->ctx_key); /* the loops' threads are gone */
  if (gw->spare_key_ok) pthread_key_delete(gw->spare_key);
  lg__free(gw);
}
