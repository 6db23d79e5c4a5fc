/*
 * gw.h — what the files of the gateway (src/gateway/) share: upstreams,
 * the job of one gateway request, the per-run bookkeeping, the step.
 */
#ifndef LG_GW_H
#define LG_GW_H

#include "gateway.h"
#include "../step/step.h"

#include <curl/curl.h>

/* ---- sse.c ---- */

/* One event of an SSE stream: `used` its bytes, its blank line included;
 * `data` its data lines joined by "\n" (without "data:" and the one space
 * after it), NULL when it has none (or joining them ran out of memory). */
typedef struct lg__sse_event {
  size_t used;
  const char *data;
  size_t data_len;
} lg__sse_event_t;

/* The first whole event of d[0..len): 1 and *ev, or 0 when no event is
 * whole yet. Its data points into d when it is one line, else into
 * *joined (reused from event to event; the caller frees it). */
int lg__sse_next(const char *d, size_t len, lg__sse_event_t *ev, lg__buf_t *joined);

/* ---- upstream.c ---- */

enum { LG__GW_API_OPENAI = 0, LG__GW_API_ANTHROPIC = 1 };

typedef struct lg__gw_upstream {
  char *name;         /* "default" for a bare --upstream URL */
  char *base_url;     /* without a trailing slash: ".../v1" */
  int api;            /* LG__GW_API_* */
  int azure;          /* an Azure OpenAI resource's classic API (the AzureOpenAI clients'
                         /openai/deployments/NAME/...), whose key goes in api-key: its
                         file's "api": "azure", or a URL on Azure's hosts ending in /openai */
  char *api_key;      /* read from api_key_env at start, or NULL: the client's */
  int64_t timeout_ms; /* the whole upstream request */
  char *ca_file;      /* the CA certificates (PEM) its TLS is checked against: its
                         ca_file, else SSL_CERT_FILE; NULL: libcurl's default file */
  char *ca_dir;       /* SSL_CERT_DIR (folders split by ':'), else NULL: libcurl's default */
  int ca_alone;       /* its ca_file is all it trusts (no folder of CAs) */
  char *proxy_ca_file, *proxy_ca_dir; /* SSL_CERT_FILE, SSL_CERT_DIR, or NULL: what an
                         https:// proxy's own certificate is checked against */
  _Atomic int learnt; /* what it refused of what the gateway adds (LG__GW_LEARNT_*, bits),
                         not sent to it again while the server runs; a model's in the
                         gateway's table (lg__gw_learn) */
} lg__gw_upstream_t;

/* The upstream refused stream_options, which the gateway adds to a Chat
 * Completions stream for its usage (Mistral's 422): it sends the usage
 * unasked, or the answer's bytes count. */
#define LG__GW_LEARNT_NO_STREAM_OPTIONS 1
/* The upstream refused the max_tokens a loopguard key adds to a Chat
 * Completions request without one, for max_completion_tokens (OpenAI's
 * reasoning models): that name is added instead, for that model (an
 * upstream may front several providers). */
#define LG__GW_LEARNT_MAX_COMPLETION_TOKENS 2

typedef struct lg__gw_route {
  char *model_prefix;
  size_t upstream;    /* index */
  int strip_prefix;
} lg__gw_route_t;

typedef struct lg__gw_config {
  lg__gw_upstream_t *up;
  size_t nup;
  size_t def;         /* the default upstream */
  lg__gw_route_t *routes;
  size_t nroutes;
} lg__gw_config_t;

/* Adds the --upstream values and the --upstreams file to cfg. */
int lg__gw_config_load(lg__gw_config_t *cfg, const char *const *specs, size_t n,
                       const char *file, lg_error_t *err);
void lg__gw_config_clear(lg__gw_config_t *cfg);
/* The route a request came on, as far as it picks an upstream. */
enum {
  LG__GW_ROUTE_OPENAI = 0, /* /v1/...: any upstream */
  LG__GW_ROUTE_ANTHROPIC,  /* /v1/messages, or anthropic-version: an Anthropic one first */
  LG__GW_ROUTE_AZURE       /* /openai/...: an Azure OpenAI resource's classic API only */
};
/* The upstream of a request: by the model's prefix, the route's API, the
 * default. On an Azure route only an Azure upstream is picked (a route
 * to another is skipped): no other serves the path, and the client's
 * api-key is that resource's. *model_out is the model to send (a prefix
 * stripped), borrowed from model. */
size_t lg__gw_config_pick(const lg__gw_config_t *cfg, const char *model, int route,
                          const char **model_out);

/* One upstream exchange. */
typedef struct lg__gw_http {
  /* in */
  const lg__gw_upstream_t *up;
  const char *method;         /* "POST", "GET", ... */
  const char *path;           /* after base_url: "/chat/completions" */
  int v1;                     /* path came under /v1: an Azure resource's upstream
                                 (base_url .../openai) takes it under /v1, its v1 API */
  const char *query;          /* "?..." after the path, or NULL */
  const char *body;           /* may be NULL */
  size_t body_len;
  struct curl_slist *headers; /* borrowed: the client's forwarded headers */
  const char *client_auth;    /* Authorization of the client, or NULL */
  const char *provider_key;   /* a loopguard key's own provider key for this
                                 upstream (keys.c): sent instead of the
                                 upstream's, or NULL */
  /* streaming: each piece of a 2xx body as it arrives (non-zero: abort;
   * LG__GW_OVER: abort, the answer is past max_bytes) */
  int (*on_data)(void *ud, const char *p, size_t n);
  void *ud;
  size_t max_bytes;           /* a body held whole past this many bytes (0: no bound)
                                 is aborted, and `over` set */
  _Atomic int *stop;          /* non-zero: abort (shutdown) */
  _Atomic int *gone;          /* non-zero: abort (the client went away: its stream's
                                 response freed, or client_fd hung up); may be NULL */
  int client_fd;              /* the client's socket, looked at while the answer is
                                 awaited: a hang-up sets *gone (upstream.c,
                                 look_at_client); -1 (or no gone): not looked at */
  uint64_t client_due_ns;     /* (upstream.c) its next look */
  struct lg__gw_job *stream;  /* the job whose client stream on_data feeds, or NULL:
                                 the transfer pauses while that client has more
                                 than LG__GW_STREAM_HIGH bytes unread (gateway.c,
                                 "streams"), so a slow reader holds the upstream
                                 back, not the gateway's memory */
  int pausable;               /* (upstream.c) driven by a loop that unpauses it */
  int paused;                 /*   paused for the stream's client */
  lg__buf_t *hdrs;            /* where the answer's end-to-end headers go (the
                                 job's up_hdrs), or NULL: "name\0value\0" each,
                                 the last response's (not a 100's) */
  /* out */
  long status;                /* 0 when no answer */
  lg__buf_t body_out;         /* the body (all of it when not streamed) */
  char ctype[128];            /* Content-Type of the answer */
  curl_off_t head_len;        /* a HEAD's answer: its Content-Length, or -1 */
  CURLcode cc;
  char errbuf[CURL_ERROR_SIZE];
  uint64_t ns;                /* how long it took */
  int over;                   /* aborted: the answer was past max_bytes */
  int cut;                    /* aborted by on_data (the guard cut the stream) */
  int proxy_cert;             /* failed: an https:// proxy's own certificate did not verify */
} lg__gw_http_t;

#define LG__GW_OVER 2 /* on_data's answer: the answer is past its bound */

/* How an exchange failed (loopguard_gateway_upstream_errors_total's kind):
 * LG__GW_UP_OK when it did not, or the gateway ended it (a client that
 * hung up, a shutdown, a stream the guard cut). */
enum {
  LG__GW_UP_OK,
  LG__GW_UP_UNREACHABLE,
  LG__GW_UP_TIMEOUT,
  LG__GW_UP_BROKEN,
  LG__GW_UP_TOO_LARGE,
  LG__GW_UP_HTTP_4XX,
  LG__GW_UP_HTTP_5XX,
  LG__GW_UP__KINDS
};
int lg__gw_http_failure(const lg__gw_http_t *x);
extern const char *const lg__gw_http_failure_names[LG__GW_UP__KINDS];
/* 1 when the gateway ended the exchange because its client went away
 * (*gone: before its answer began, or mid-stream); not a shutdown's, nor
 * a stream the guard cut. */
int lg__gw_http_hung_up(const lg__gw_http_t *x);

/* One header line of an upstream's answer ("Name: value\r\n", as libcurl
 * hands it) appended to out as "name\0value\0" when the gateway passes it
 * on to its client (upstream.c says which it does not): 1 when kept, 0
 * when not (not a field, a name that is not a token, a value with a CR,
 * LF or NUL). */
int lg__gw_header_keep(lg__buf_t *out, const char *line, size_t n);

/* A gateway fiber's wait for its upstream (gateway.c, "fibers";
 * upstream.c, perform_fiber): the sockets libcurl watches, in the
 * leader's epoll (each event's data is its lg__gw_sock_t), and libcurl's
 * timer. */
typedef struct lg__gw_sock {
  struct lg__gw_wait *w;
  int fd;                     /* -1: a free slot */
  uint32_t ev;                /* epoll events seen, not yet given to libcurl */
} lg__gw_sock_t;
typedef struct lg__gw_wait {
  lg__gw_sock_t socks[4];
  int ep;                     /* the epoll they are in */
  CURLM *m;
  uint64_t due_ns;            /* libcurl's timer (lg__mono_ns), 0: none */
  void *fib;                  /* the fiber waiting (gateway.c's) */
} lg__gw_wait_t;
/* The epoll for this fiber's sockets, or -1 when the caller runs on no
 * gateway fiber (a worker: it waits itself). */
int lg__gw_fiber_ep(void);
/* Stops the fiber until one of w's sockets has an event, w's timer is
 * due, or a second has passed (the stop and a client's hang-up are
 * looked at then). */
void lg__gw_fiber_wait(lg__gw_wait_t *w);
/* Stops the fiber for ms milliseconds. */
void lg__gw_fiber_sleep(int ms);

/* Performs x on the thread's reused handle h, through its multi handle m
 * (NULL: curl_easy_perform). While the thread leads a server loop
 * (server.h, lg__loop_wait_fd) it waits on the loop too, and takes its
 * turns meanwhile. 0, or LG_EIO (cc says). */
int lg__gw_http_do(CURL *h, CURLM *m, lg__gw_http_t *x);
void lg__gw_http_clear(lg__gw_http_t *x);
/* "name (host:port)" of an upstream for messages, into buf. */
const char *lg__gw_upstream_label(const lg__gw_upstream_t *u, char *buf, size_t size);

/* ---- policies.c: the named policies of --policies DIR ---- */

typedef struct lg__gw_policy {
  char *name;                 /* NAME of NAME.json */
  lg_policy_t *policy;
  char *json;                 /* its lg_policy_to_json */
} lg__gw_policy_t;

typedef struct lg__gw_policies {
  lg__gw_policy_t *v;
  size_t n;
} lg__gw_policies_t;

/* Loads every NAME.json of dir (NULL or "": none). Errors name the file
 * and its field. */
int lg__gw_policies_load(lg__gw_policies_t *ps, const char *dir, lg_error_t *err);
const lg__gw_policy_t *lg__gw_policies_find(const lg__gw_policies_t *ps, const char *name);
void lg__gw_policies_clear(lg__gw_policies_t *ps);

/* ---- gateway.c ---- */

enum { LG__GW_CHAT = 0, LG__GW_RESPONSES, LG__GW_MESSAGES, LG__GW_PASS, LG__GW__KINDS };

/* A blocked or replayed call restored in the conversation the upstream
 * sees: items put before the client's message `anchor`. */
typedef struct lg__gw_restore {
  size_t anchor;
  json_t *items;      /* array of messages (a reference) */
  char *resp_id;      /* Responses: the response they belong to, or NULL */
  int conv_sent;      /* Responses in a conversation: its answers are in the upstream's
                         conversation (sent once: chat.c, build_messages) */
  int lost;           /* the items are a conversation's request its upstream did not keep
                         (a stream cut): sent again whole, not only the answers (on
                         memory:; with a store, the conversation's answers:conv holds
                         what is to be sent, so the run's memory needs no such flag) */
} lg__gw_restore_t;

typedef struct lg__gw_key lg__gw_key_t;

/* What the gateway keeps of a run between its requests (gateway.c keeps
 * at most a bound of them, evicting the least recently used). */
typedef struct lg__gw_run {
  char *id;
  pthread_mutex_t mu;         /* one request of a run at a time */
  lg_policy_t *policy;        /* the policy the run was created with (a reference) */
  size_t fed;                 /* client messages already turned into events */
  lg__gw_restore_t *rs;
  size_t nrs, caprs;
  json_t *steer;              /* call_id -> steer message (object) */
  json_t *own;                /* Responses: the ids of answers the gateway made itself ->
                                 {prev: the upstream response to continue from, or null,
                                  items: the input to say again} (chat.c, own_response) */
  char *final_text;           /* the stop's message, once stopped */
  char *hide_tool;            /* hidden for hide_left more model calls */
  int hide_left;
  unsigned offer;             /* cascade.offer tools offered now (LG_ALT_* bits) */
  char *esc_model;            /* cascade.escalate: the model of the next esc_left calls */
  int esc_left;
  char *text_steer;           /* a text loop's steer message, for the model */
  size_t text_steer_at;       /* the client message it is said with, in a conversation sent
                                 whole (SIZE_MAX: not said yet; chat.c, text_steer_place) */
  int64_t model_calls;        /* model calls this server let through for the run (a later
                                 prompt told from the first; the events' turns are the
                                 stored run's: lg__step_t.model_turn) */
  json_t *sights;             /* the computer-use screens and running commands' outputs the
                                 run's calls answered with (the first 16 hex digits of each
                                 one's SHA-256, the newest 64, or NULL), and how many were new
                                 (sight_v: a result's progress_version, chat.c, seen_progress) */
  int64_t sight_v;
  int64_t stored_tokens;      /* Responses: the most tokens an answer of the run left in the
                                 upstream's stored conversation (its input + output), which a
                                 request continuing it is billed again as input (chat.c) */
  uint64_t mem_hash;          /* the hash of the run's memory as the store holds it (rs,
                                 steer, text_steer, stored_tokens, esc_*, sights: chat.c,
                                 mem_sync), when mem_stored */
  int mem_stored;
  uint64_t last_hash;         /* the last answered request, for retries */
  int64_t last_ms;
  lg__buf_t last_body;
  int last_status;
  char last_action[16], last_reason[64];
  struct lg__gw_run *next;    /* hash chain */
  /* gateway.c's bookkeeping, under its table lock */
  struct lg__gw_run *lru_prev, *lru_next; /* most recently used first */
  int busy;                   /* requests holding it: never evicted then */
  /* Created in memory and not yet in the store: its first step's job
   * writes it first (gateway.c, on_store). What the row is made with: */
  int unborn;
  char *birth_group;          /* X-Loopguard-Group of its first request, or NULL */
  char *birth_policy;         /* the policy's JSON */
  int birth_tried;            /* a job that wrote it failed: it may be stored */
  lg__gw_key_t *keys;         /* the conversation keys that name it */
  struct lg__json_prefix *prefix; /* its last request's conversation, as read (json_load.c) */
  uint64_t head;              /* the hash of prefix's first GW_PREFIX_HEAD bytes */
  struct lg__gw_run *hnext;   /* the heads' chain (gateway.c) */
  int seen;                   /* a request of it was read before (lg__gw_prefix_keep) */
} lg__gw_run_t;

/* One gateway request, from the HTTP thread to a worker and back. */
typedef struct lg__gw_job {
  lg__job_t job;              /* first: rq->job points here */
  lg__gw_t *gw;
  int kind;                   /* LG__GW_* */
  char *method, *path;        /* path after /v1 */
  char *query;                /* the client's query from its '?', sent on; or NULL */
  char *body;
  size_t body_len;
  struct curl_slist *fwd;     /* the client's headers sent upstream */
  char *auth;                 /* the client's Authorization */
  char *hdr_run, *hdr_group, *hdr_agent, *hdr_policy;
  /* the answer */
  int status;
  lg__buf_t out;
  char ctype[128];
  char run_id[1100];
  const char *action;         /* X-Loopguard-Action, or NULL */
  char reason[64];            /* X-Loopguard-Reason, or "" */
  size_t upstream;            /* for metrics */
  lg__buf_t up_hdrs;          /* the last upstream answer's end-to-end headers
                                 (lg__gw_http_t.hdrs), passed on with the answer */
  /* streaming (chat.c): the client reads what the worker writes */
  int streaming;              /* the answer is a stream */
  pthread_mutex_t smu;
  lg__buf_t sbuf;             /* written, not yet read */
  size_t soff;                /* read up to here */
  int s_end;                  /* the worker wrote the last byte */
  int s_waiting;              /* the reader suspended the connection */
  int s_cut;                  /* broken mid-way: ends without its last chunk */
  const char *s_action;       /* at s_end: the answer's X-Loopguard-Action and */
  char s_reason[64];          /*   -Reason, known only then: a stream's trailers */
  struct MHD_Response *s_resp; /* the stream's response (its trailers are added at the end) */
  _Atomic int s_gone;         /* the client went away */
  _Atomic uint64_t s_last_ns; /* when the client's stream was last written to
                                 (lg__mono_ns): lg__gw_stream_keepalive */
  struct MHD_Connection *conn;
  int fd;                     /* conn's socket (-1: not known) */
  _Atomic int refs;           /* the worker, the HTTP side, the stream */
  int answered;               /* the answer is made (the worker's side) */
  int released;               /* handed to the HTTP side (done() called) */
  /* What finish() reads, copied when the worker lets go: a stream is
   * released at its start, and the worker goes on (its action may rise,
   * an error may be written) while the HTTP thread builds the head. */
  struct {
    int status, retry_after;
    const char *action;
    char ctype[128], run_id[1100], reason[64];
    lg__buf_t up_hdrs;
  } head;
  struct lg__gw_job *qnext;
  uint64_t queued_ns;         /* when it joined the queue (lg__mono_ns) */
  /* keys.c: the loopguard key the request came with, or NULL */
  struct lg__key_row *key;
  int key_byok;               /* sent upstream with the key's own provider key */
  char *provider_key;         /* ... which is this one (new), or NULL */
  size_t byok_for;            /* the upstream (its index + 1) provider_key was
                                 looked up for; 0: none yet */
  char *key_scopes[2];        /* the key's scopes with a budget (new): the
                                 model call reserves on them beside the run's */
  size_t nkey_scopes;
  int retry_after;            /* a 429's Retry-After, seconds (0: none) */
  int route;                  /* LG__GW_ROUTE_*: the upstreams it may go to
                                 (lg__gw_config_pick) and its errors' shape, by
                                 its path and its anthropic-version */
  int azure;                  /* it came on an /openai/ path (an AzureOpenAI client's):
                                 its path goes upstream as it came (path) */
  int pass_free;              /* passed through, and billed nothing by a provider
                                 (lg__gw_handle: a read, an upload, a count, a cancel) */
  int head_known;             /* a passed-through HEAD: the length of the body */
  uint64_t head_len;          /*   a GET would get (its Content-Length) */
  /* keys.c: a passed-through request the price table prices (embeddings)
   * with its worst case reserved on the key's scopes, settled when its
   * answer ends (lg__gw_keys_pass_settle); pass_rsv "" when none */
  char pass_rsv[LG_BUDGET_ID_MAX];
  char *pass_model;           /* its model (new) */
  int64_t pass_worst_nusd;    /* its worst case */
  char pass_tail[1024];       /* the last bytes of its answer: the usage */
  size_t pass_tail_len;
} lg__gw_job_t;

/* The worker's context for one job. */
typedef struct lg__gw_ctx {
  lg__gw_t *gw;
  lg_server_t *srv;
  CURL *curl;
  lg__gw_job_t *j;
  CURLM *multi;               /* curl's transfers go through it (NULL: none) */
} lg__gw_ctx_t;

const lg__gw_config_t *lg__gw_cfg(const lg__gw_t *gw);
/* The upstream a passed-through request goes to: with anthropic-version
 * (an Anthropic SDK's: its models, count_tokens, files), the first
 * Anthropic upstream, as /v1/messages; else the default. */
size_t lg__gw_pass_upstream(const lg__gw_t *gw, const lg__gw_job_t *j);
/* Appends s to b for a URL: a byte other than an ASCII letter, a digit or
 * one of ok percent-encoded (%XX). */
void lg__gw_url_put(lg__buf_t *b, const char *s, const char *ok);
size_t lg__gw_answer_max(const lg__gw_t *gw); /* LOOPGUARD_GATEWAY_ANSWER_BYTES */
_Atomic int *lg__gw_stopflag(lg__gw_t *gw);
/* The run of a request: by its header, else derived (key); created
 * (stored, through the step's run creation, with `policy`: NULL for the
 * server's default) on first use. Locked. *made (may be NULL): whether
 * the run is new here and no replica's store named key, nor holds the
 * run the header names (the request begins its conversation, as far as
 * any replica knows). */
lg__gw_run_t *lg__gw_run_get(lg__gw_ctx_t *cx, const char *id, const char *key,
                             const lg__gw_policy_t *policy, int *made, lg_error_t *err);
void lg__gw_run_unlock(lg__gw_t *gw, lg__gw_run_t *r);
/* The conversation of run id's last request as read (the prefix of a
 * lazy read, json_load.c), taken out of the run: NULL when none. */
struct lg__json_prefix *lg__gw_prefix_take(lg__gw_t *gw, const char *id);
/* A request without a run's name: the kept conversation its body begins
 * with, found by the hash of its first 2 KiB and taken out of its run
 * (the run the body then names may be another: the same bytes read the
 * same). NULL when none. */
struct lg__json_prefix *lg__gw_prefix_find(lg__gw_t *gw, const char *body, size_t n);
/* A request's conversation as read (lz; nothing when its body was not):
 * its messages counted, checked and reused, for the metrics, and kept as
 * run r's (r not NULL) for its next request, from the run's second request
 * on (a run of one request costs nothing) and within the bound on all
 * runs' (the server's LOOPGUARD_GATEWAY_PREFIX_BYTES, 16 MiB; 0 turns it
 * off). */
void lg__gw_prefix_keep(lg__gw_t *gw, lg__gw_run_t *r, const lg__json_lazy_t *lz);
/* Remembers key -> r (the start of a conversation, a Responses id): in the
 * gateway's table, and in the store unless it is memory: (every replica,
 * and this server after a restart, finds the run by it). */
void lg__gw_key_put(lg__gw_ctx_t *cx, const char *key, lg__gw_run_t *r);
/* This thread's handle of the server's store, or NULL (err says why). */
lg_store_t *lg__gw_store(lg__gw_ctx_t *cx, lg_error_t *err);
/* Whether this server's table has key naming r (it answered what key
 * names, and holds what it kept of it). */
int lg__gw_key_names(lg__gw_t *gw, const char *key, const lg__gw_run_t *r);
/* Whether the keys are kept in the store too: not on memory:. */
int lg__gw_keys_kept(const lg__gw_ctx_t *cx);
/* What a key of r's carries besides its run (JSON), kept in the store
 * beside the conversation keys unless it is memory: (data_put), so that a
 * replica or a restarted server that does not hold it in memory reads it
 * (data_get: a new reference, or NULL when it is not there or is another
 * run's). chat.c's: the Responses answers the gateway made itself
 * ("own:ID"), the answers of a response's refused calls ("rs:ID") and a
 * conversation's not yet sent upstream ("answers:conv:ID"). */
void lg__gw_data_put(lg__gw_ctx_t *cx, lg__gw_run_t *r, const char *key, json_t *data);
json_t *lg__gw_data_get(lg__gw_ctx_t *cx, const lg__gw_run_t *r, const char *key);
/* The same with the data as the store's text (put: JSON already written;
 * text: new, or NULL), for a caller that compares it before it reads it. */
void lg__gw_data_put_text(lg__gw_ctx_t *cx, lg__gw_run_t *r, const char *key, const char *text);
char *lg__gw_data_text(lg__gw_ctx_t *cx, const lg__gw_run_t *r, const char *key);
/* The named policy of X-Loopguard-Policy, or NULL when not known. */
const lg__gw_policy_t *lg__gw_policy_named(const lg__gw_t *gw, const char *name);
/* One event through the decision step, synchronously. 0 when decided;
 * *answer (new, json) is the decision object. */
int lg__gw_step(lg__gw_ctx_t *cx, lg__gw_run_t *r, lg__step_t *st, lg_error_t *err);
/* Several events of one run through the decision step in one
 * transaction (lg__step_batch_t, step.h), synchronously. 0 when the batch
 * ran: each step says whether it decided. */
int lg__gw_step_batch(lg__gw_ctx_t *cx, lg__gw_run_t *r, lg__step_batch_t *b, lg_error_t *err);
/* Answers the job now (status, body), for a non-stream answer. */
void lg__gw_answer(lg__gw_job_t *j);
/* The stream of a job: starts it (the HTTP side answers status, ctype,
 * as the bytes come: an SSE stream is 200 text/event-stream); write
 * appends and wakes the reader; backlog is what its client has not read
 * yet; cut marks it broken (an upstream that failed mid-way: it ends
 * without its last chunk, so the client sees it cut); end closes it. */
void lg__gw_stream_start(lg__gw_job_t *j, int status, const char *ctype);
int lg__gw_stream_write(lg__gw_job_t *j, const char *p, size_t n);
size_t lg__gw_stream_backlog(lg__gw_job_t *j);
/* A begun stream the gateway has written nothing to for
 * LOOPGUARD_GATEWAY_KEEPALIVE_MS (it holds what the upstream sends: a
 * tool call's arguments until the call is decided) gets an SSE comment,
 * which SSE readers ignore, so that an idle-timeout proxy between the
 * client and the gateway keeps the connection. Called as upstream bytes
 * come, between whole events. */
void lg__gw_stream_keepalive(lg__gw_t *gw, lg__gw_job_t *j);
void lg__gw_stream_cut(lg__gw_job_t *j);
void lg__gw_stream_end(lg__gw_job_t *j);
/* A transfer feeding a stream pauses past HIGH unread bytes, goes on at LOW. */
#define LG__GW_STREAM_HIGH ((size_t)1 << 20)
#define LG__GW_STREAM_LOW ((size_t)256 << 10)
/* Metrics and the intervention log. */
/* An upstream exchange done: its latency, and when it failed, its kind
 * counted (loopguard_gateway_upstream_errors_total) and, when the
 * exchange itself failed (not an answer's status), logged. */
void lg__gw_note_upstream(lg__gw_t *gw, size_t up, const lg__gw_http_t *x);
/* Upstream ui refused what the gateway adds (bit, LG__GW_LEARNT_*; for
 * LG__GW_LEARNT_MAX_COMPLETION_TOKENS with model): not sent to it again,
 * said once in the log. */
void lg__gw_learn(lg__gw_ctx_t *cx, size_t ui, int bit, const char *model);
/* Whether upstream ui (with model) has refused bit. */
int lg__gw_learnt(lg__gw_ctx_t *cx, size_t ui, int bit, const char *model);
void lg__gw_note_intervention(lg__gw_ctx_t *cx, const char *run_id, const char *action,
                              const char *reason, const char *tool, const char *call_id);
/* An error body in the API's shape into b: OpenAI's {"error": {message,
 * type, param, code}}, or Anthropic's {"type": "error", "error": {type,
 * message}} (its type from the status). */
void lg__gw_error_body(lg__buf_t *b, int anthropic, int status, const char *type, const char *code,
                       const char *param, const char *msg);
/* The job's answer to an upstream exchange that failed (502, or 504 when
 * it timed out: the message names the upstream), or the upstream's own
 * answer as it sent it (its body moved out of x). */
void lg__gw_upstream_failed(lg__gw_job_t *j, const lg__gw_http_t *x);
void lg__gw_upstream_answer(lg__gw_job_t *j, lg__gw_http_t *x);
/* What the gateway took off the front of j->path ("/v1", or Azure's
 * "/openai"): the request's own path is this and j->path. */
const char *lg__gw_api_prefix(const lg__gw_job_t *j);
/* The request's path (the prefix and j->path: the client's bytes) as a
 * JSON string, for a log line. */
void lg__gw_json_path(lg__buf_t *b, const lg__gw_job_t *j);
/* An error in the API's shape as the job's answer: Anthropic's on an
 * Anthropic SDK's request (route LG__GW_ROUTE_ANTHROPIC), else OpenAI's.
 * A 500 (loopguard's own failure) is also a request_failed log line. */
void lg__gw_error(lg__gw_job_t *j, int status, const char *type, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* loopguard's own failure as the job's answer: 500 "loopguard could not
 * DOING: the error" ("loopguard: the error" without DOING), with `code`
 * (or null). The answer leaves out what only the operator should read (a
 * store's host or path, lg__error_public); the log line has it. */
void lg__gw_failed(lg__gw_job_t *j, const char *code, const char *doing, const lg_error_t *e,
                   int rc);

/* ---- chat.c ---- */
void lg__gw_chat(lg__gw_ctx_t *cx);
/* A command's output as a poll's progress compares it: each clock's
 * reading in it (a time of day with its seconds, H:MM:SS[.fff]; a date,
 * YYYY-MM-DD or YYYY/MM/DD; neither inside a longer run of digits) and
 * each random id (a UUID; a run of 32 hex digits or more: a trace id, a
 * digest; neither inside a longer word) written as one '#', so that a
 * build that says only the time or a new request's id is the same output
 * again. A file's line and column ("main.c:12:5"), a count, a short hash
 * are kept. Into out (n bytes at most); its length. */
size_t lg__gw_output_gist(const char *text, size_t n, char *out);

/* ---- keys.c: loopguard keys at the gate ---- */

/* Authenticates the job's lgk- key, if any (required when the server has
 * tokens), counts its rate limit and keeps it in j->key; the key is never
 * forwarded. 0: go on; 1: an error was answered. */
int lg__gw_keys_auth(lg__gw_ctx_t *cx);
/* Before a model request with a key: the models it may use, its provider
 * key for upstream ui, max_tokens filled in (root) when absent with the
 * most the key's budgets afford (*added: the member's name, a static
 * string; NULL when nothing was added; *replaced 1 when it took the place
 * of the client's own null; root is changed in no other way),
 * a 402 / 403 when nothing fits, and
 * the key's scopes in j->key_scopes, which the request's model event
 * reserves on beside the run's own. 0: go on; 1: answered. */
int lg__gw_keys_model(lg__gw_ctx_t *cx, json_t *root, const char *model, size_t ui,
                      size_t body_len, const char **added, int *replaced);
/* Where a model call of a request with a key goes: the key may use the
 * model (asked: its name as given, model: as sent upstream, either in the
 * key's list), and its own provider key is the one for upstream ui
 * (looked up again when the call goes to another upstream than the
 * request's first: an escalation, cascade.escalate). 0: go on; 1: a 403
 * or 500 answered. Without a key, 0. */
int lg__gw_keys_route(lg__gw_ctx_t *cx, const char *asked, const char *model, size_t ui);
/* The request's loopguard key's id (stable across rotations), or NULL. */
const char *lg__gw_key_id(const lg__gw_job_t *j);
/* The members that bound an answer's output, in the order they are read
 * (keys.c): max_completion_tokens, max_tokens, max_output_tokens. */
#define LG__GW_NBOUNDS 3
extern const char *const lg__gw_bounds[LG__GW_NBOUNDS];
/* The first of them the request has (null included), its name in *name
 * (may be NULL); NULL when it has none. */
json_t *lg__gw_output_bound(json_t *root, const char **name);
void lg__gw_keys_clear(lg__gw_job_t *j);
/* The answers a model request asks for: Chat Completions' `n` (an
 * integer of 2 and more; the provider takes at most 128), else 1. Each
 * may be as long as the request's max tokens, so the worst case counts
 * them all. */
int64_t lg__gw_choices(const lg__gw_job_t *j, json_t *root);
/* a * b (b > 0), or INT64_MAX when it does not fit: a worst case past
 * every bound, refused as such (LG_ERANGE). */
static inline int64_t lg__gw_times(int64_t a, int64_t b) { return a > INT64_MAX / b ? INT64_MAX : a * b; }
/* The output tokens a model call of `model` may give when the request
 * says no max tokens: the price table's max_output_tokens for it, else
 * its default_max_tokens; -1 when it bounds neither. */
int64_t lg__gw_output_cap(const lg_prices_t *p, const char *model, int64_t input);
/* How long a model request's reservation holds when it is never settled
 * (a crash): --reservation-ttl, else upstream ui's timeout plus a minute
 * (gateway-v1), at most LG_BUDGET_MAX_TTL_MS. */
int64_t lg__gw_keys_ttl(lg__gw_ctx_t *cx, size_t ui);
/* A passed-through request's reservation (keys.c: embeddings), settled
 * as its exchange ended: `sent` whether the request may have reached the
 * upstream, `status` the upstream's (0: none came), the answer's usage in
 * the job's pass_tail. Nothing without a reservation. */
void lg__gw_keys_pass_settle(lg__gw_ctx_t *cx, int sent, int status);
/* The usage's own cost (usage.cost, USD, as OpenRouter-style upstreams
 * report it) in nano-dollars rounded up, or -1 when it has none. */
int64_t lg__gw_keys_usage_cost(json_t *usage);
/* A shared budget's refusal as the route's error, with metadata
 * (limit_source ...) and, for a 429, Retry-After; `message` (NULL: the
 * refusal's own) after "loopguard: ". */
void lg__gw_keys_refusal(lg__gw_ctx_t *cx, lg__gw_job_t *j, const lg_budget_refusal_t *r,
                         const char *message);

#endif
