/*
 * server.h — what the files of the HTTP sidecar (src/server/) share.
 *
 * The server is split by concern, each file with one job:
 *   server.c    life of the server: options, the listening socket,
 *               libmicrohttpd, the connection table and its deadlines,
 *               per-thread store handles, draining, logs;
 *   accept.c    the accept loop: limits per server and per address, the
 *               first request head of each connection screened (and a bad
 *               one answered) before it is handed to libmicrohttpd;
 *   screen.c    the head screen: a pure check of a request head's bytes;
 *   http.c      one HTTP request: body accumulation with its limits, auth,
 *               routing to a handler, the response and its metrics;
 *   routes.c    the endpoints of http-api-v1: runs and decisions (every
 *               decision under lg_store_with_run), operations, traces;
 *   body.c      request bodies: JSON parsed strictly (jansson, duplicate
 *               keys rejected) and checked against each endpoint's fields,
 *               with errors that name the field;
 *   auth.c      bearer tokens, roles, constant-time comparison;
 *   metrics.c   counters and histograms, the Prometheus text format.
 *
 * A run's trace-v1 lines (GET /v1/runs/{id}/trace) are rows of the store,
 * written in the transaction of the decision they record
 * (lg__store_run_put_events, lg__store_run_create_ev), so every replica
 * and every restart sees them.
 *
 * Names are lg__ (internal). Nothing here is part of the public API; the
 * public part is the SERVER-API block of loopguard.h.
 */
#ifndef LG_SERVER_H
#define LG_SERVER_H

#include "../util/internal.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------ */
/* auth.c                                                              */

typedef enum lg__role {
  LG__ROLE_NONE = 0,     /* no valid token */
  LG__ROLE_AGENT = 1,    /* runs, calls, results, model calls, operations */
  LG__ROLE_OPERATOR = 2  /* all of that, plus cancel, list, budgets */
} lg__role_t;

typedef struct lg__token {
  uint8_t digest[32]; /* SHA-256 of the token: the token itself is not kept */
  int role;           /* lg__role_t */
} lg__token_t;

typedef struct lg__auth {
  lg__token_t *tok; /* configured tokens */
  size_t n;         /* how many */
} lg__auth_t;

/* Adds the tokens of a file ("ROLE TOKEN" a line, # comments, blank lines)
 * or of the environment form ("ROLE TOKEN;ROLE TOKEN"). Errors name the
 * file and line but never echo a token. */
int lg__auth_load_file(lg__auth_t *a, const char *path, lg_error_t *err);
int lg__auth_load_spec(lg__auth_t *a, const char *spec, const char *source,
                       lg_error_t *err);
/* The role of an Authorization header value ("Bearer TOKEN"); NONE when
 * absent, malformed or unknown. Takes the same time whichever token
 * matches, or none. */
lg__role_t lg__auth_role(const lg__auth_t *a, const char *header);
/* The secret of an Authorization value "Bearer lgk-..." (a loopguard key,
 * checked against the store by its route, not here), or NULL. */
const char *lg__auth_key_secret(const char *header);
/* The credential headers besides Authorization, the one list of them:
 * Anthropic's x-api-key, Azure OpenAI's api-key. lg__auth_key_header: the
 * length of the name when h, a header's name or a "Name: value" line, is
 * one of them, else 0. lg__auth_key_value: the value of the first of them
 * request c carries (with lgk, the first holding a loopguard key,
 * "lgk-..."), or NULL. */
size_t lg__auth_key_header(const char *h);
const char *lg__auth_key_value(struct MHD_Connection *c, int lgk);
void lg__auth_free(lg__auth_t *a);
/* 1 when the address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x). */
int lg__is_loopback(const struct sockaddr *sa);

/* ------------------------------------------------------------------ */
/* metrics.c                                                           */

/* Routes, as metrics label them. */
#define LG__ROUTE_MAP(XX)                                                    \
  XX(RUN_CREATE, "runs_create") XX(RUN_LIST, "runs_list")                    \
  XX(RUN_GET, "runs_get") XX(CALLS, "calls") XX(RESULTS, "results")          \
  XX(STATE, "state") XX(HANDOFFS, "handoffs") XX(MODEL, "model")             \
  XX(USAGE, "usage") XX(RUN_CANCEL, "runs_cancel")                           \
  XX(GROUP_CANCEL, "groups_cancel") XX(TRACE, "trace")                       \
  XX(OP_CLAIM, "operations_claim") XX(OP_COMMIT, "operations_commit")        \
  XX(OP_FAIL, "operations_fail") XX(OP_GET, "operations_get")                \
  XX(BUDGETS, "budgets") XX(BUDGET_LIST, "budgets_list")                    \
  XX(HEALTHZ, "healthz") XX(METRICS, "metrics") XX(OPENAPI, "openapi")      \
  XX(TEXT, "text") XX(USER, "user") XX(COMPACTION, "compaction")             \
  XX(RESUME, "resume") XX(CONSOLE, "console") XX(REGRESSION, "regression")   \
  XX(KEYS, "keys") XX(KEY, "keys_get") XX(KEY_ROTATE, "keys_rotate")         \
  XX(KEY_SELF, "key") XX(GATEWAY, "gateway") XX(OTHER, "other")

typedef enum lg__route {
#define LG__XX(id, name) LG__RT_##id,
  LG__ROUTE_MAP(LG__XX)
#undef LG__XX
  LG__RT__COUNT
} lg__route_t;
const char *lg__route_name(lg__route_t r);

#define LG__HIST_BUCKETS 14 /* + the implicit +Inf */
#define LG__CODE_SLOTS 16   /* distinct HTTP codes counted, then "other" */
#define LG__ACTIONS 6       /* lg_action_t values */
#define LG__OUTCOMES 6      /* lg_claim_outcome_t values */

typedef struct lg__metrics {
  _Atomic uint64_t decisions[LG__ACTIONS][LG_R__COUNT]; /* by action, reason */
  _Atomic uint64_t stops[LG_R__COUNT];                  /* runs stopped, by reason */
  _Atomic uint64_t ledger[LG__OUTCOMES];                /* claim outcomes */
  _Atomic uint64_t budget_refusals[4];                  /* by limit_source, see metrics.c */
  _Atomic uint64_t hist[LG__RT__COUNT][LG__HIST_BUCKETS + 1]; /* per bucket */
  _Atomic uint64_t hist_sum_ns[LG__RT__COUNT];          /* total seconds, ns */
  _Atomic uint64_t requests[LG__RT__COUNT][LG__CODE_SLOTS]; /* by code slot */
  _Atomic int codes[LG__CODE_SLOTS];                    /* slot -> HTTP code + 1 (0: free) */
  _Atomic uint64_t conn_cut[2];                         /* connections cut: past a
                                                           deadline, evicted for room */
  _Atomic int64_t runs_active;                          /* last count */
  _Atomic int64_t runs_active_at_ms;                    /* when counted, 0 never */
} lg__metrics_t;

void lg__metrics_request(lg__metrics_t *m, lg__route_t r, int code, uint64_t ns);
void lg__metrics_decision(lg__metrics_t *m, lg_action_t a, lg_reason_t why, int stopped_now);
void lg__metrics_ledger(lg__metrics_t *m, lg_claim_outcome_t o);
void lg__metrics_budget_refusal(lg__metrics_t *m, const char *limit_source);
/* The Prometheus text format (version 0.0.4) into b. */
int lg__metrics_render(lg__metrics_t *m, lg__buf_t *b);
/* The shared budgets' gauges (limit, spent, reserved, resets_at) of the
 * store `st` into b (metrics_budgets.c), their heads alone when st is NULL
 * or its read fails: 0, LG_ENOMEM, or the store's error (*e filled). */
int lg__metrics_budgets(lg_server_t *srv, lg_store_t *st, lg__buf_t *b, lg_error_t *e);

/* ------------------------------------------------------------------ */
/* body.c                                                              */

/* The bodies of the endpoints, each with its own fields. */
typedef enum lg__body_kind {
  LG__B_RUN = 0,      /* POST /v1/runs */
  LG__B_CALL,         /* POST /v1/runs/{id}/calls */
  LG__B_RESULT,       /* .../results */
  LG__B_STATE,        /* .../state */
  LG__B_HANDOFF,      /* .../handoffs */
  LG__B_MODEL,        /* .../model */
  LG__B_USAGE,        /* .../usage */
  LG__B_CANCEL,       /* .../cancel and /v1/groups/{g}/cancel */
  LG__B_CLAIM,        /* POST /v1/operations/claim */
  LG__B_COMMIT,       /* POST /v1/operations/{key}/commit */
  LG__B_FAIL,         /* POST /v1/operations/{key}/fail */
  LG__B_BUDGET_SET,   /* PUT /v1/budgets/{scope} */
  LG__B_RESERVE,      /* POST /v1/budgets/reserve */
  LG__B_SETTLE,       /* POST /v1/budgets/settle */
  LG__B_TEXT,         /* POST /v1/runs/{id}/text */
  LG__B_USER,         /* .../user */
  LG__B_COMPACTION,   /* .../compaction */
  LG__B_RESUME,       /* .../resume */
  LG__B__COUNT
} lg__body_kind_t;

/* A parsed and checked body. Strings and JSON values are borrowed from
 * `root`, which lg__body_clear releases. Absent integers are -1 unless a
 * has_ flag says otherwise. */
typedef struct lg__body {
  json_t *root;                  /* owns what follows */
  const char *run_id, *group;    /* runs */
  json_t *policy;                /* runs: a policy-v1 object */
  int has_progress_version;      /* runs, results */
  int64_t progress_version;
  const char *tool;              /* calls */
  json_t *args;                  /* calls: an object, or NULL ({}) */
  int has_turn;                  /* calls, model */
  int64_t turn;
  const char *call_id, *idempotency_key, *agent;
  const char *status;            /* results: NULL when absent or null */
  int side_effect_committed;     /* results: -1 absent, 0, 1 */
  int64_t retry_after_ms;        /* results: -1 absent */
  json_t *value;                 /* results: NULL when absent */
  const char *operation_id;      /* results, commit */
  json_t *world;                 /* state */
  const char *from, *to;         /* handoffs */
  const char *model;             /* model */
  int64_t input_tokens, output_tokens, max_tokens; /* model, usage */
  int has_cost;                  /* model, usage */
  int64_t cost_nusd;             /* cost_usd in nano-USD */
  const char *reservation_id;    /* usage */
  const char *reason;            /* cancel */
  const char *key, *request_fp;  /* claim */
  int64_t lease_ms;              /* claim: -1 absent */
  json_t *result;                /* commit: any JSON value (required) */
  int retryable;                 /* fail: 0 or 1 */
  json_t *scopes;                /* runs, reserve: an array of scope names */
  double limit_usd;              /* budgets: as given (micro-dollars are
                                    made by lg_budget_usd_to_micro) */
  int has_max_in_flight;         /* budgets */
  double max_in_flight_usd;
  const char *period;            /* budgets */
  double amount_usd;             /* reserve */
  int64_t ttl_ms;                /* reserve: -1 absent */
  double actual_usd;             /* settle */
  const char *claim_token;       /* commit, fail: the claim's token */
  const char *text;              /* text, user: NULL when absent */
  size_t text_len;
  const char *note;              /* resume */
} lg__body_t;

/* The range of a number field (body.c's one table, docs/security.md). */
typedef struct lg__range {
  const char *field;   /* JSON member name; NULL ends the table */
  int64_t lo, hi;      /* whole numbers: lo..hi, inclusive */
  double usd_lo, usd_hi; /* USD amounts (usd_hi > 0): usd_lo..usd_hi */
  const char *what;    /* what it is, for the docs */
} lg__range_t;
const lg__range_t *lg__body_ranges(void);
/* The first number field of a body without a range in the table (NULL:
 * none; test_server_hardening checks that a new field gets one). */
const char *lg__body_unranged(void);

/* Parses body text for `kind` into *out (which need not be initialised). An empty body is
 * {}. On error returns LG_EPARSE / LG_EINVAL / LG_EDUPKEY with err->field
 * naming the field ("args", "body" for the document itself) and
 * err->message a sentence that starts with it; out is left cleared. Never
 * reads past len; the text need not be NUL-terminated. */
int lg__body_parse(lg__body_kind_t kind, const char *text, size_t len, lg__body_t *out,
                   lg_error_t *err);
void lg__body_clear(lg__body_t *b);
/* Compact JSON text of v (new; lg__free). NULL on out-of-memory. */
char *lg__json_text(const json_t *v, size_t *len);
/* json_loadb(s, n, flags, je) (flags 0, or JSON_REJECT_DUPLICATES for the
 * sidecar's bodies), the same tree, read faster (json_load.c); an error is
 * always json_loadb's. *reals (may be NULL): the real numbers read, never
 * fewer than the tree holds (a repeated key's replaced value counts too).
 * It calls lg__json_begin itself (its trees in the region, util.c):
 * lg__json_oom() after it says whether an allocation failed.
 * lg__json_load: with flags 0. lg__json_load_fast: the fast reader alone,
 * NULL for anything it leaves to jansson (for tests). */
json_t *lg__json_load_flags(const char *s, size_t n, size_t flags, json_error_t *je,
                            size_t *reals);
json_t *lg__json_load(const char *s, size_t n, json_error_t *je, size_t *reals);
json_t *lg__json_load_fast(const char *s, size_t n, size_t flags, size_t *reals);
/* lg__json_load, except that the top object's `member`, when it is an
 * array, is checked but not built: lz->arr is that array, its elements
 * placeholders until lg__json_lazy_get reads them (the text s must stay
 * until then). lz->arr is NULL when the member is not an array or
 * jansson read the text (then the tree is whole). lg__json_lazy_get:
 * element i of arr (built on its first read when arr is lz->arr), NULL
 * when out of range or out of memory. lg__json_lazy_all: every element
 * built (before arr is copied or written out); -1 out of memory.
 * lz->peek (set before the load, NULL for none): two member names whose
 * string values each element keeps as it is checked, so that what an
 * element is can be known without building it: lg__json_lazy_peek gives
 * element i's member peek[k] as json_string_value(json_object_get(e,
 * peek[k])) would (NULL: none, or not a string), 0; or -1 when the
 * element must be built to know (a key or value with an escape, a value
 * over 23 bytes, arr not lz->arr).
 *
 * lz->prefix (may be NULL): a text read before (lg__json_prefix_of),
 * e.g. the same agent's last request. When the text read now starts
 * with its bytes, up to the end of its array's last element, those
 * elements are not checked again: their spans (and peeks) are taken as
 * they were (lz->reused says how many). The same bytes are the same
 * elements, so the tree and every check are as without it. */
typedef struct lg__json_prefix lg__json_prefix_t;
typedef struct lg__json_lazy {
  const char *peek[2];
  const lg__json_prefix_t *prefix;
  json_t *arr;
  const char *text;
  struct lg__json_span {
    size_t off, len;
    unsigned char built;    /* the element is in arr */
    unsigned char state[2]; /* peek[k]: 0 none, 1 in val[k], 2 not known */
    char val[2][24];
  } *span;
  size_t n, cap;
  size_t at;                /* the array's text begins here (after its '[') */
  size_t reals;             /* the real numbers of its elements */
  size_t reused;            /* elements taken from prefix */
} lg__json_lazy_t;
/* The text of a lazy read up to its array's last element, with what was
 * learnt of its elements, to be given as a later read's prefix (new:
 * lg__json_prefix_free). NULL when there is none (no lazy array, no
 * element), when it would hold more than max bytes, or out of memory.
 * lg__json_prefix_size: the bytes it holds. */
struct lg__json_prefix {
  char *text;
  size_t len, at, reals, n;
  struct lg__json_span *span;
  char peek[2][24]; /* the names its peeks are of ("": none); others: not known */
};
lg__json_prefix_t *lg__json_prefix_of(const lg__json_lazy_t *lz, size_t max);
size_t lg__json_prefix_size(const lg__json_prefix_t *p);
/* Whether the n bytes at s begin with p's text (then p may serve their
 * read; lg__json_load_lazy also checks that the array begins where it did). */
int lg__json_prefix_starts(const lg__json_prefix_t *p, const char *s, size_t n);
void lg__json_prefix_free(lg__json_prefix_t *p);
json_t *lg__json_load_lazy(const char *s, size_t n, const char *member, lg__json_lazy_t *lz,
                           json_error_t *je, size_t *reals);
json_t *lg__json_lazy_get(lg__json_lazy_t *lz, json_t *arr, size_t i);
int lg__json_lazy_peek(const lg__json_lazy_t *lz, const json_t *arr, size_t i, int k, const char **out);
int lg__json_lazy_all(lg__json_lazy_t *lz, json_t *arr);
void lg__json_lazy_free(lg__json_lazy_t *lz);

#include "../budget/budget.h" /* the refusal and the JSON answers of budgets */
#include "../store/group.h"

/* A shared budget's refusal as http-api-v1 answers it (the budget module
 * says why; the status is the server's): 429 when waiting can help
 * (rate_limited), 403 for a workspace: scope, else 402. */
int lg__http_refusal_status(const lg_budget_refusal_t *r);
/* The error body of a refusal: {"error":{"code":STATUS,"type","message",
 * "metadata":{...}}}. New string (lg__free) or NULL on out-of-memory. */
char *lg__http_refusal_json(const lg_budget_refusal_t *r);

/* ------------------------------------------------------------------ */
/* server.c and http.c                                                 */

/* What one worker thread keeps: its store handle and canonicaliser. */
typedef struct lg__worker {
  lg_store_t *store;         /* own handle, or the shared one (memory:) */
  lg_canon_t *canon;         /* scratch for fingerprints */
  struct lg__worker *next;   /* every worker, for closing at the end */
} lg__worker_t;

/* A parsed policy, shared by the runs whose stored policy JSON is the same
 * text (most runs share the default). */
typedef struct lg__pol_slot {
  uint64_t hash;      /* of json */
  char *json;         /* the policy JSON text, or NULL: empty slot */
  lg_policy_t *pol;   /* a reference */
  uint64_t used;      /* last use (eviction) */
} lg__pol_slot_t;
#define LG__POL_SLOTS 64

typedef struct lg__conn lg__conn_t; /* below */

/* One libmicrohttpd daemon (server.c), without a listening socket of its
 * own: the acceptor (accept.c) hands it connections. In epoll mode
 * (sqlite:, memory:) a loop of ours drives it and adds the connections
 * queued for it; otherwise its own thread runs it (efd -1, no th). */
typedef struct lg__loop {
  struct lg_server *srv;      /* its server */
  struct MHD_Daemon *mhd;     /* its daemon (NULL: not started) */
  int efd;                    /* eventfd that wakes it (-1: none) */
  pthread_t th;               /* runs loop_main */
  int started;                /* th runs */
  _Atomic int nconns;         /* connections handed to it and not closed */
  pthread_mutex_t q_mu;       /* guards queue */
  int q_mu_ok;                /* q_mu initialised */
  lg__conn_t *queue;          /* handed over, not yet added (epoll mode) */
  pthread_mutex_t run_mu;     /* held by the thread that runs the daemon now
                                 (its leader, or lg__loop_serve) */
  int run_mu_ok;              /* run_mu initialised */
  int ep;                     /* epoll of the daemon's descriptor and efd
                                 (-1: none) */
  int mhd_ep;                 /* the daemon's own epoll descriptor */
  /* Leaders and followers (server.c, "the event loops"): the thread that
   * leads the loop waits on ep and runs the daemon; the loop's own thread
   * (th), or a gateway worker the lead was passed to. */
  pthread_mutex_t lead_mu;    /* guards home_waiting, home_lead */
  pthread_cond_t lead_cv;     /* the lead given back to th */
  int lead_ok;                /* lead_mu, lead_cv initialised */
  int home_waiting;           /* th waits for the lead */
  int home_lead;              /* ... and the lead is its own again */
  _Atomic int helpers;        /* other threads in lead() now */
} lg__loop_t;

typedef struct lg__acceptor lg__acceptor_t; /* accept.c */
typedef struct lg__ipcount lg__ipcount_t;   /* accept.c: connections per address */

struct lg_server {
  lg_server_options_t o;      /* options with defaults filled (strings copied) */
  char *listen_host;          /* the host part of --listen, as given */
  char *url;                  /* http://HOST:PORT/ where it listens */
  int port;                   /* the port bound */
  int listen_fd;              /* the listening socket (the acceptor's) */
  lg__auth_t auth;            /* configured tokens; none: open */
  unsigned char secret[32];   /* --secret-file (has_secret), for the stores */
  int has_secret;
  char *store_name;           /* the store URL without password */
  const char *scheme;         /* "memory", "sqlite", "postgres" */
  lg_store_t *shared;         /* memory:, sqlite: the one handle all threads share */
  int gateway_on;             /* --upstream or --upstreams given */
  pthread_key_t wkey;         /* the thread's lg__worker_t */
  pthread_mutex_t wlist_mu;   /* guards workers and spare */
  lg__worker_t *workers;      /* every worker made */
  lg_store_t *spare;          /* the handle opened at start, for a worker */
  lg_policy_t *default_policy;/* policy of new runs */
  char *default_policy_json;  /* its lg_policy_to_json */
  char *policy_source;        /* "built-in default" or the file */
  pthread_mutex_t pol_mu;     /* guards pol */
  lg__pol_slot_t pol[LG__POL_SLOTS];
  uint64_t pol_tick;          /* use counter of the policy cache */
  lg__batcher_t *batcher;     /* group commit (shared handle), or NULL */
  lg__checkpointer_t *ckpt;   /* sqlite: background WAL checkpoints, or NULL */
  lg__metrics_t metrics;      /* counters, histograms */
  lg_price_book_t *prices;    /* --prices, reloaded on SIGHUP (empty: none) */
  pthread_mutex_t log_mu;     /* guards log */
  FILE *log;                  /* the log (stderr or log_path) */
  int log_owned;              /* log was opened here */
  pthread_mutex_t conn_mu;    /* guards conns, nconns, ncut, byfd, ipc */
  lg__conn_t *conns;          /* every open connection, newest first */
  size_t nconns;              /* how many */
  size_t ncut;                /* of them, cut (shut down) and not closed yet */
  lg__conn_t **byfd;          /* conns by descriptor (nbyfd slots) */
  size_t nbyfd;
  lg__ipcount_t *ipc;         /* connections per client address */
  unsigned conn_limit;        /* the hard limit: past it, refused at accept */
  unsigned conn_soft;         /* past it, the oldest idle connection is cut */
  unsigned per_ip;            /* connections from one address */
  int epoll_loop;             /* 1: libmicrohttpd in epoll mode, driven by loops */
  lg__loop_t *loops;          /* the daemons (--threads of them) */
  int nloops;                 /* how many started */
  lg__acceptor_t *acc;        /* the accept loop and the head screen */
  _Atomic int loop_stop;
  pthread_t reaper;           /* cuts connections past their deadlines */
  int reaper_started;
  _Atomic int reaper_stop;
  pthread_t retainer;         /* --retain-runs: purges old runs */
  int retainer_started;
  _Atomic int retainer_stop;
  _Atomic int inflight;       /* requests begun and not completed */
  _Atomic int draining;       /* shutdown has begun */
  _Atomic int drain_cut;      /* lg_server_cut_drain: the drain ends now */
  int stopped;                /* lg_server_shutdown done */
  struct lg__gw *gw;          /* the gateway (gateway-v1), or NULL: none */
};

/* The server's clock: epoch milliseconds (options.clock, or
 * CLOCK_REALTIME). The only place the server reads the time of day. */
int64_t lg__server_now(const lg_server_t *srv);
/* The calling thread's worker (made on first use), or NULL with err filled
 * when its store handle cannot be opened. */
lg__worker_t *lg__server_worker(lg_server_t *srv, lg_error_t *err);
/* The same, a store handle it opens connecting within ms (PostgreSQL;
 * lg__store_open_within): for /healthz, the first request of its thread. */
lg__worker_t *lg__server_worker_within(lg_server_t *srv, int ms, const char *why,
                                       lg_error_t *err);
/* A parsed policy for stored policy JSON: a new reference (lg_policy_free),
 * or NULL with err filled. */
lg_policy_t *lg__server_policy(lg_server_t *srv, const char *json, lg_error_t *err);
/* Refreshes the runs_active gauge from the store `st` when the last count
 * is older than 10 s (a scan of the active runs: not on the hot path): 0,
 * or the store's error (*e filled; the gauge keeps its last count). */
int lg__server_count_active(lg_server_t *srv, lg_store_t *st, lg_error_t *e);

/* What a decided step leaves in the metrics and the log, for the HTTP
 * API's routes and the gateway alike: its decision counted, the ledger's
 * outcome, the runs_active gauge (a run stopped now leaves it, a stopped
 * run resumed comes back), and a stop's log line. (A budget's refusal is
 * counted by whoever answers it.) */
struct lg__step;
void lg__server_note_step(lg_server_t *srv, const struct lg__step *st);

/* Writes one JSON log line: {"ts","level","event", then `fields` (JSON
 * members text without braces, may be NULL)}. */
void lg__server_log(lg_server_t *srv, const char *level, const char *event, const char *fields);

/* What a connection is doing, for the deadlines and the eviction of
 * server.c (the reaper). */
typedef enum lg__phase {
  LG__PH_IDLE = 0,  /* between requests (or before the first request line):
                       closed after --timeout whatever trickles in */
  LG__PH_REQUEST,   /* request line in, head and body arriving: the whole
                       request must be in within --timeout of its line */
  LG__PH_BUSY       /* handled, parked, or its answer being sent: never cut */
} lg__phase_t;

/* libmicrohttpd's memory a connection (its read buffer, and the parts of
 * the head it keeps there): a request head too large for it is answered in
 * JSON (414, 431) before libmicrohttpd would in HTML: by the screen for a
 * connection's first head, by http.c for the later ones. Half of it is
 * the read buffer a request starts with (MHD_pool_reset), so it sets how
 * many reads a body takes: at 32 KiB an 8 KiB agent body comes in one
 * read, not two, and 32 KiB in four, not six. 0.9.75 zeroes the whole
 * pool after every request: about 0.2 µs at 32 KiB (valgrind counts each
 * byte of that memset as an instruction: docs/internals/performance.md,
 * session 33). */
#define LG__MHD_POOL (32 * 1024)
/* Longest request target answered (a longer one is 414); longest request
 * head (line and headers, 431), in which the Cookie header's value counts
 * twice (libmicrohttpd keeps a copy of it); most fields of a head (header
 * lines, cookies and query parameters: libmicrohttpd keeps 64 bytes for
 * each; 431). The worst head within all three, 8 KiB + 100 x 64 bytes,
 * leaves libmicrohttpd more than 17 KiB of LG__MHD_POOL for the answer's
 * head. */
#define LG__MAX_URI 4096
#define LG__MAX_HEAD 8192
#define LG__MAX_FIELDS 100
/* After an error answered before the body was read, the rest is read and
 * dropped for at most this long and this much before the connection is
 * closed, so that a client that sends it all before reading (Python's
 * http.client, requests) reads the answer rather than a reset. */
#define LG__DRAIN_NS 2000000000ull
#define LG__DRAIN_BYTES (8u << 20)
/* A body whose Content-Length is at most this gets its room at once. */
#define LG__BODY_PREALLOC (64u << 10)

/* Who holds a connection (lg__conn_t.owner). */
typedef enum lg__owner {
  LG__OWN_MHD = 0,  /* handed to libmicrohttpd (or queued for its loop) */
  LG__OWN_SCREEN,   /* the acceptor: its first head not yet in */
  LG__OWN_DRAIN     /* the acceptor: answered, the rest read and dropped */
} lg__owner_t;

/* One TCP connection, from accept to close: libmicrohttpd's socket
 * context once handed over. */
struct lg__conn {
  lg_server_t *srv;          /* its server */
  lg__loop_t *loop;          /* its daemon (set when handed over) */
  struct MHD_Connection *mc; /* the connection (NULL: not started by MHD yet) */
  int fd;                    /* its socket (shut down to cut it) */
  int phase;                 /* lg__phase_t */
  int cut;                   /* shut down already */
  int owner;                 /* lg__owner_t */
  uint64_t since_ns;         /* when the phase began (monotonic) */
  uint64_t head_ns;          /* first byte of its first head (0: none yet):
                                its first request's deadline runs from it */
  uint64_t drain_until;      /* LG__OWN_DRAIN: closed then */
  uint64_t dropped;          /* LG__OWN_DRAIN: bytes dropped */
  struct sockaddr_storage addr; /* the client's address */
  socklen_t addrlen;
  int in_epoll;              /* in the acceptor's epoll set */
  struct lg__conn *prev, *next;   /* srv->conns */
  struct lg__conn *hprev, *hnext; /* the acceptor's lists, or a loop's queue */
};

/* server.c: the connection table (under conn_mu). */
/* Takes k out of the table (list, count, address count, byfd). */
void lg__conn_forget_locked(lg_server_t *srv, lg__conn_t *k);
/* Cuts k (shutdown(2)) unless it is cut already. */
void lg__conn_cut_locked(lg__conn_t *k);
/* Monotonic nanoseconds. */
uint64_t lg__mono_ns(void);

/* accept.c: the accept loop. Starts its thread on srv->listen_fd (0, or
 * -1 with err filled); stop closes the listening socket, hands over the
 * connections whose first head is in, closes the others and joins. */
int lg__acceptor_start(lg_server_t *srv, lg_error_t *err);
void lg__acceptor_stop(lg_server_t *srv);
/* The connection table's address counts (accept.c). */
lg__ipcount_t *lg__ipcount_new(void);
void lg__ipcount_free(lg__ipcount_t *t);
/* Adds one connection of addr; 0, or -1 when the address holds `limit`
 * already (or out of memory). Under conn_mu. */
int lg__ipcount_add(lg__ipcount_t *t, const struct sockaddr_storage *addr, unsigned limit);
void lg__ipcount_del(lg__ipcount_t *t, const struct sockaddr_storage *addr);
/* A loop (epoll mode) adds the connections queued for it (the thread that
 * runs its daemon, under run_mu). */
void lg__loop_add_queued(lg__loop_t *l);

/* screen.c: the first head of a connection. */
typedef struct lg__screen {
  int status;               /* the refusal's HTTP status (0: passed) */
  const char *type;         /* its error type (uri_too_long, ...) */
  const char *field;        /* the field it is about */
  char message[200];        /* what is wrong, and where */
  size_t head_len;          /* passed: the head's bytes, through its empty line */
} lg__screen_t;
#define LG__SCREEN_MORE 1
/* Screens the bytes [p, p+n) a connection has sent so far. Returns 0 when
 * they begin with a complete head that passes (out->head_len), -1 when
 * they cannot (out: the answer's status, type, field, message), or
 * LG__SCREEN_MORE when the head is not complete yet. A decided prefix
 * stays decided: more bytes never change a 0 or a -1. Pure. */
int lg__screen_head(const char *p, size_t n, lg__screen_t *out);
/* The whole HTTP answer of a refusal (status line, Connection: close,
 * application/json, the body built by lg__req_error) appended to out. */
int lg__screen_answer(const lg__screen_t *s, lg__buf_t *out);

/* Wakes the event loop of connection c (after MHD_resume_connection, from
 * any thread): with the loops of server.c (epoll), a resumed connection is
 * served at once. Must be read before resuming (lg__conn_loop). */
lg__loop_t *lg__conn_loop(struct MHD_Connection *c);
void lg__loop_wake(lg__loop_t *l);
/* The same, but when no other thread runs the loop's daemon at this moment
 * the caller runs it itself, so the resumed connection's answer leaves
 * from this thread at once instead of after the loop's thread wakes (a
 * wake-up across cores costs tens of microseconds on a VM). Only from a
 * thread that holds no lock a request handler may take (a gateway worker
 * between jobs): the handlers of other connections may run in it. */
void lg__loop_serve(lg__loop_t *l);
/* Leaders and followers (server.c, "the event loops"). The thread that
 * leads a loop waits on its epoll descriptor and runs its daemon; it may
 * keep one gateway request it read and answer it itself, between its
 * turns, instead of handing it to a worker across cores (gateway.c,
 * keep_mine and lg__gw_run_mine). While it waits for that request's
 * upstream it waits on the loop too (lg__loop_wait_fd) and takes a turn
 * when the loop has work (lg__loop_turn). Before a wait that may be long
 * (lg__will_block: a store lock another process holds, a busy committer)
 * it passes the lead to the loop's own thread if that waits for it, or
 * else to an idle gateway worker (lg__gw_lead_post), which leads with
 * lg__loop_lead_for until it can give the lead back. */
/* 1 when this thread leads a loop now and has not passed the lead. */
int lg__loop_leads(void);
/* 1 when the calling thread leads l and takes a turn of it before its
 * next wait (it runs its gateway requests between two turns): a
 * connection it resumes needs no wake-up, nor a turn of its own. */
int lg__loop_turns_next(const lg__loop_t *l);
/* The leader's loop descriptor to wait on beside its own (readable: call
 * lg__loop_turn), or -1 when this thread does not lead. */
int lg__loop_wait_fd(void);
/* A turn of the daemon of the loop this thread leads (no-op otherwise),
 * from a thread that holds no lock a request handler may take. */
void lg__loop_turn(void);
/* A gateway worker leads l (its lead was posted, and the worker counted
 * itself in l->helpers when it took it) until it gives the lead back to
 * l's own thread (once that waits for it and the worker holds no
 * request), passes it on before a long wait of its own, or the loops
 * stop (the lead then goes back to l's own thread). Leaves l->helpers one
 * less. */
void lg__loop_lead_for(lg__loop_t *l);

/* Sets the phase of connection c (from the libmicrohttpd threads). */
void lg__conn_phase(lg_server_t *srv, struct MHD_Connection *c, lg__phase_t ph);

/* For tests/fuzz/fuzz_http_route.c: routes the raw request target
 * [target, target+n) for method as the server does. Returns 1 when a
 * handler would run (*id: its decoded id, or NULL), else the status of the
 * answer (400 a bad id, 404, 500) with *body its JSON (both new; lg__free). */
int lg__http_probe(const char *target, size_t n, const char *method, char **id, char **body,
                   size_t *body_len);
/* 1 when [h, h+n), a Host value or an Origin's host[:port], names a
 * loopback host; *port: its port, -1 when none. */
int lg__http_loopback_host(const char *h, size_t n, long *port);

/* libmicrohttpd's URI log callback (http.c): makes the request's state
 * with the raw request target, before libmicrohttpd decodes it. */
void *lg__http_uri_log(void *cls, const char *uri, struct MHD_Connection *c);
/* libmicrohttpd's access handler and completion callback (http.c). */
enum MHD_Result lg__http_access(void *cls, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_size, void **con_cls);
void lg__http_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe);

/* ------------------------------------------------------------------ */
/* routes.c                                                            */

/* A request as the handlers see it. */
typedef struct lg__req {
  lg_server_t *srv;
  struct MHD_Connection *conn;
  lg__route_t route;
  const char *method;      /* "GET", "POST", ... */
  const char *id;          /* run id, group or operation key from the path */
  char *id_buf;            /* owns id */
  const char *query;       /* the target's query as sent, from its '?'; or
                              NULL (the gateway forwards it) */
  const char *body;        /* the request body (may be empty) */
  size_t body_len;
  lg__buf_t *body_buf;     /* what holds it: a handler that keeps the body
                              past its return takes it (lg__buf_steal) */
  /* the answer */
  int status;              /* HTTP status */
  lg__buf_t out;           /* body of the answer */
  const char *content_type;/* NULL: application/json */
  const char *allow;       /* 405: the Allow header */
  int retry_after;         /* 429: seconds for the Retry-After header */
  int api_errors;          /* a gateway route: errors in its API's shape
                              (lg__gw_req_error), 0: the server's */
  /* A deferred answer: a handler that sets job (and finish) has its
   * connection suspended and the job given to the batcher; once the job
   * is done, finish() runs on the HTTP thread and fills the answer. */
  lg__job_t *job;
  void (*finish)(struct lg__req *rq);
  /* A job that runs elsewhere (the gateway's workers): with submit set,
   * the parked job goes to submit(rq) instead of the batcher, and its
   * runner calls rq->job->done(rq->job) when finish() may answer. */
  void (*submit)(struct lg__req *rq);
  /* An answer finish() built whole (the gateway's: headers of its own,
   * a stream): queued instead of rq->out, or destroyed unqueued. */
  struct MHD_Response *response;
} lg__req_t;

/* Fills the answer of an error: {"error":{"code","type","message"[,
 * "field"]}}. Returns status. */
int lg__req_error(lg__req_t *rq, int status, const char *type, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Answers a store's error for `what` (routes.c): 404, 409 and 400 by its
 * code, else 500 "nothing was decided or stored; it is safe to retry" and
 * a request_failed log line with the whole detail. The answer has the
 * error's own sentence, never where (a store's URL or file) nor libpq's
 * words (lg__error_public): those are the operator's, in the log only. */
int lg__req_store_error(lg__req_t *rq, int rc, const lg_error_t *e, const char *what);

/* Answers a budget or key call's error (routes.c): 400 naming the field,
 * 404, 409, else the store's error (500, logged) for `doing`. */
void lg__req_budget_error(lg__req_t *rq, int rc, lg_error_t *e, const char *doing);

/* The handlers: each fills rq->status and rq->out. */
void lg__h_run_create(lg__req_t *rq);
void lg__h_run_list(lg__req_t *rq);
void lg__h_run_get(lg__req_t *rq);
void lg__h_decide(lg__req_t *rq); /* calls, results, state, handoffs, model, usage */
void lg__h_run_cancel(lg__req_t *rq);
void lg__h_group_cancel(lg__req_t *rq);
void lg__h_trace(lg__req_t *rq);
void lg__h_op_claim(lg__req_t *rq);
void lg__h_op_commit(lg__req_t *rq);
void lg__h_op_fail(lg__req_t *rq);
void lg__h_op_get(lg__req_t *rq);
void lg__h_budgets(lg__req_t *rq);
void lg__h_healthz(lg__req_t *rq);
void lg__h_metrics(lg__req_t *rq);
void lg__h_budget_list(lg__req_t *rq); /* budget_list.c: GET /v1/budgets */
void lg__h_openapi(lg__req_t *rq);     /* openapi.c: GET /openapi.json */
/* keys_routes.c: /v1/keys, /v1/keys/{hash} and .../rotate (h_keys, by
 * route and method), GET /v1/key (h_key_self). */
void lg__h_keys(lg__req_t *rq);
void lg__h_key_self(lg__req_t *rq);
/* console.c: the console's static files and GET /v1/runs/{id}/regression. */
int lg__console_path(const char *url); /* 1: a console file's path */
void lg__h_console(lg__req_t *rq);     /* rq->id: the path */
void lg__h_regression(lg__req_t *rq);
/* Adds the console's headers (CSP, nosniff, ...) to its answers. */
void lg__console_headers(struct MHD_Response *r, const lg__req_t *rq);

#endif
