/*
 * cmd_serve.c — `loopguard serve`: the HTTP sidecar of http-api-v1.
 *
 * A thin shell over lg_server_*: it reads the flags, blocks the signals it
 * handles before the server's threads start (so they inherit the mask and
 * only this thread ever sees them), starts the server, prints where it
 * listens, and then waits for signals with sigwait():
 *   (starting)       SIGTERM, SIGINT end the process at once;
 *   SIGHUP           reopen the log file (after rotation), reload --prices;
 *   SIGTERM, SIGINT  stop accepting, finish requests in flight (for at most
 *                    --drain seconds; a second signal cuts them at once),
 *                    close the store, exit 0.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *serve_usage =
    "usage: loopguard serve [FLAGS]\n"
    "\n"
    "Runs the HTTP sidecar (http-api-v1): agents in any language ask it before\n"
    "every tool call and it answers execute, block, replay or stop. With\n"
    "--upstream it is also the gateway (gateway-v1): point an agent's OpenAI or\n"
    "Anthropic base URL at it and every tool call in the model's answers is\n"
    "guarded, with no change to the agent's code (docs/gateway.md).\n"
    "\n"
    "flags (default in brackets):\n"
    "  --listen HOST:PORT   address to listen on [127.0.0.1:8787]; port 0 takes a\n"
    "                       free port. Without tokens only a loopback address is\n"
    "                       allowed\n"
    "  --store URL          memory:, sqlite:PATH or postgres:CONNINFO\n"
    "                       [$LOOPGUARD_STORE, else sqlite:loopguard.db in the\n"
    "                       current folder]. busy_timeout_ms=N in the URL: how\n"
    "                       long a write waits for a lock another process holds\n"
    "                       [5000; 0: do not wait] (sqlite:PATH?busy_timeout_ms=N)\n"
    "  --tokens FILE        bearer tokens, one 'ROLE TOKEN' a line (roles: agent,\n"
    "                       operator; # comments) [none; also $LOOPGUARD_TOKENS as\n"
    "                       'ROLE TOKEN;ROLE TOKEN']. No tokens: auth off\n"
    "  --prices FILE        model prices (JSON, see docs/budget.md): the worst case\n"
    "                       of each /model call is priced and held against the\n"
    "                       run's caps and budgets; SIGHUP reloads it [none]\n"
    "  --policy FILE        default policy (policy-v1) of new runs [built-in]\n"
    "  --policies DIR       gateway-v1: named policies, DIR/NAME.json each, chosen\n"
    "                       by a request's X-Loopguard-Policy: NAME\n"
    "  --durability MODE    full: every answered decision is on disk first (SQLite\n"
    "                       synchronous=FULL, PostgreSQL synchronous_commit=on);\n"
    "                       relaxed: decisions that claim no key may be lost to a\n"
    "                       power cut (SQLite) or a PostgreSQL crash (docs/store.md)\n"
    "                       [full, or the store URL's durability=]\n"
    "  --threads N          HTTP worker threads [sqlite:, memory: one per core less\n"
    "                       one, as a thread of its own commits (with --upstream:\n"
    "                       one per core); postgres: four per core, at most 32]\n"
    "  --max-body BYTES     largest request body; larger is 413 [1048576]\n"
    "  --gateway-max-body BYTES  the same on the gateway's routes (a model request\n"
    "                       with its images, an upload passed through) [67108864]\n"
    "  --timeout SECONDS    cut off connections idle this long, and bodies not\n"
    "                       received in this time [30]\n"
    "  --drain SECONDS      at SIGTERM, how long requests in flight (a gateway's\n"
    "                       model calls) may take to finish before they are cut;\n"
    "                       keep it under the platform's own grace period\n"
    "                       [10; also $LOOPGUARD_DRAIN_SECONDS]\n"
    "  --log FILE           structured log, one JSON object a line; SIGHUP reopens\n"
    "                       it [stderr]\n"
    "  --retain-runs DURATION  purge runs not written to for DURATION (30d), as\n"
    "                       'loopguard runs purge' does, hourly at most [keep]\n"
    "  --upstream [NAME=]URL gateway-v1: an OpenAI/Anthropic-compatible upstream\n"
    "                       (repeatable; the first is the default); the gateway\n"
    "                       answers /v1/chat/completions and passes other /v1/ paths\n"
    "  --upstreams FILE     gateway-v1: upstreams and routes (JSON, docs/gateway.md)\n"
    "  --reservation-ttl MS gateway-v1: how long a model request's reservation holds\n"
    "                       if never settled, 1000-86400000 [upstream timeout + 1m]\n"
    "  --secret-file FILE   32 random bytes or 64 hex digits (openssl rand -hex 32):\n"
    "                       the keys' own provider keys (byok) are stored encrypted\n"
    "                       under it; give every replica the same file [none:\n"
    "                       stored in clear; also $LOOPGUARD_SECRET_FILE]\n"
    "  --trace-memory BYTES ignored, accepted for old scripts: traces are kept in\n"
    "                       the store with the decisions\n"
    "  -h, --help           this help\n";

static const char *serve_notes =
    "\n"
    "Environment for the gateway: LOOPGUARD_GATEWAY_FIBERS, the requests each\n"
    "loop's thread runs at once on fibers [256; 0: one at a time; at most 1024];\n"
    "LOOPGUARD_GATEWAY_WORKERS, the most worker threads for the requests past\n"
    "those (8 start; more when requests wait) [256; postgres: 16];\n"
    "LOOPGUARD_GATEWAY_MAX_RUNS, the runs kept in memory [10000];\n"
    "LOOPGUARD_GATEWAY_PREFIX_BYTES [16 MiB];\n"
    "LOOPGUARD_GATEWAY_ANSWER_BYTES, the most a guarded route holds of an\n"
    "upstream answer (whole, an event, a stream's text and calls) [64 MiB];\n"
    "LOOPGUARD_GATEWAY_KEEPALIVE_MS, an SSE comment to a stream held that long [15000];\n"
    "LOOPGUARD_RESERVATION_TTL_MS, --reservation-ttl when the flag is not given.\n"
    "Upstreams' TLS: the system's CAs; SSL_CERT_FILE and SSL_CERT_DIR, or an\n"
    "upstream's ca_file, for a private CA. Proxies: https_proxy, http_proxy,\n"
    "no_proxy (docs/gateway.md, \"TLS and proxies\").\n"
    "\n"
    "--retain-runs: a gateway makes a run a conversation, so its store grows with\n"
    "the traffic; the purge runs at the start and every tenth of DURATION (a second\n"
    "to an hour), a batch of runs at a time [also $LOOPGUARD_RETAIN_RUNS].\n"
    "\n"
    "A postgres: store's URL may also set query_timeout_ms=N: how long a call waits\n"
    "for the server's answer before the request fails [60000; 0: for ever;\n"
    "docs/store.md]. /healthz and /metrics wait 2 s at most, whatever it says.\n"
    "\n"
    "Signals: SIGTERM/SIGINT drain requests in flight (--drain), close the store and\n"
    "exit 0; a second SIGTERM/SIGINT cuts the drain (exit 1); before the server has\n"
    "started (the store opening) they end it at once (exit 1). SIGHUP reopens the log\n"
    "and reloads --prices. Exit status: 0 success, 1 an error or requests cut,\n"
    "2 bad usage.\n";

/* The range of --reservation-ttl and $LOOPGUARD_RESERVATION_TTL_MS, in ms. */
#define TTL_MIN_MS 1000LL
#define TTL_MAX_MS 86400000LL

/* A whole number flag in [min, max]. */
static int number(const char *flag, const char *v, long long min, long long max, long long *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (!*v || *end || errno || n < min || n > max) {
    cli_usage(NULL, "%s: expected a number from %lld to %lld, got '%s'", flag, min, max, v);
    return -1;
  }
  *out = n;
  return 0;
}

/* glibc gives the top of a thread's heap back to the kernel as soon as
 * more than the trim threshold is free there (madvise), and a request's
 * allocations fault the pages in again right after: each give-back is a
 * TLB shoot-down on every core that runs the server, and on a VM the
 * pair of them cost a gateway request with a loopguard key 1.0-1.4 ms
 * of CPU where it needs 0.4-0.6 (docs/server.md, "Memory"). The server
 * keeps what it freed, up to 256 MiB at the top of a heap, and serves
 * blocks under 4 MiB from its heaps (a request's are far smaller). Not
 * more: a block that grows by doubling (memory:'s database, in memdb)
 * is copied at each realloc while in a heap, and moved by mremap once
 * mapped; at 32 MiB those copies held the store for tens of ms at a time
 * (a gateway's p99 at 8 connections 65 ms, against 4 at 4 MiB).
 * GLIBC_TUNABLES naming malloc settings is the operator's choice, and
 * left alone. */
static void keep_freed_memory(void) {
  const char *t = getenv("GLIBC_TUNABLES");
  if (t && strstr(t, "glibc.malloc.")) return;
  mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
  mallopt(M_MMAP_THRESHOLD, 4 * 1024 * 1024);
}

/* ---- work done while the signals are listened to ---- */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct bg_job {
  void (*run)(void *);
  void *ctx;
  _Atomic int done;
} bg_job_t;

static void *bg_main(void *p) {
  bg_job_t *j = p;
  j->run(j->ctx);
  atomic_store(&j->done, 1);
  return NULL;
}

/* Runs run(ctx) on a thread of its own while this one takes the signals
 * of set (blocked in every thread) as they come: tick(ctx, sig, seconds)
 * is called at each, and every 50 ms with sig 0, with the seconds since
 * the start. Returns once run has returned (at once, on this thread,
 * when no thread can be made). */
static void with_signals(void (*run)(void *), void (*tick)(void *, int, double), void *ctx,
                         const sigset_t *set) {
  bg_job_t j = {.run = run, .ctx = ctx};
  pthread_t th;
  if (pthread_create(&th, NULL, bg_main, &j)) {
    run(ctx);
    return;
  }
  double t0 = mono_s();
  while (!atomic_load(&j.done)) {
    struct timespec wait = {0, 50 * 1000000};
    int sig = sigtimedwait(set, NULL, &wait);
    if (!atomic_load(&j.done)) tick(ctx, sig > 0 ? sig : 0, mono_s() - t0);
  }
  pthread_join(th, NULL);
}

/* ---- the start ---- */

typedef struct start_ctx {
  const lg_server_options_t *o;
  lg_error_t *err;
  lg_server_t *srv; /* out: the server started, or NULL (err) */
  int told;
} start_ctx_t;

static void start_run(void *ctx) {
  start_ctx_t *st = ctx;
  st->srv = lg_server_start(st->o, st->err);
}

/* While the server starts (the store is opened: a PostgreSQL host that
 * does not answer holds it for connect_timeout, a SQLite file another
 * process locks for busy_timeout_ms), SIGTERM or Ctrl-C ends the process
 * at once, as kill -9 would: nothing has been acknowledged yet, and a
 * store is never left half-written by a kill. A start still going after
 * two seconds says what it waits for, once. */
static void start_tick(void *ctx, int sig, double secs) {
  start_ctx_t *st = ctx;
  if (sig == SIGTERM || sig == SIGINT) {
    fprintf(stderr, "loopguard: %s while starting: not started\n", sig == SIGINT ? "interrupted" : "terminated");
    _exit(1);
  }
  if (!st->told && secs >= 2.0) {
    const char *u = st->o->store_url;
    fprintf(stderr, "loopguard: still starting: opening the %sstore (Ctrl-C gives up)\n",
            !strncmp(u, "postgres", 8) ? "PostgreSQL " : !strncmp(u, "sqlite:", 7) ? "SQLite " : "");
    st->told = 1;
  }
}

/* ---- the drain at SIGTERM ---- */

typedef struct drain_ctx {
  lg_server_t *srv;
  int drain_s, rc, cut, told;
} drain_ctx_t;

static void drain_run(void *ctx) {
  drain_ctx_t *d = ctx;
  d->rc = lg_server_shutdown(d->srv, d->drain_s * 1000);
}

/* A second SIGTERM or SIGINT cuts the drain, and a drain still waiting
 * after a second says so on stderr, once. */
static void drain_tick(void *ctx, int sig, double secs) {
  drain_ctx_t *d = ctx;
  if ((sig == SIGTERM || sig == SIGINT) && !d->cut) {
    d->cut = 1;
    lg_server_cut_drain(d->srv);
  }
  if (!d->told && !d->cut && secs >= 1.0) {
    fprintf(stderr,
            "loopguard: waiting up to %d s for the requests in flight to finish "
            "(SIGTERM or Ctrl-C again cuts them)\n",
            d->drain_s);
    d->told = 1;
  }
}

int cmd_serve(int argc, char **argv) {
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  const char *store = NULL, *durability = NULL, *drain = NULL, *retain = NULL;
  const char *upstreams[16];
  size_t nup = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(serve_usage, stdout);
      fputs(serve_notes, stdout);
      return 0;
    }
    static const char *with_value[] = {"--listen", "--store",    "--tokens",  "--prices",
                                       "--policy", "--threads",  "--max-body", "--timeout",
                                       "--log",    "--trace-memory", "--durability",
                                       "--upstream", "--upstreams", "--reservation-ttl",
                                       "--policies", "--secret-file", "--gateway-max-body",
                                       "--drain", "--retain-runs"};
    int known = -1;
    const char *val = NULL;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
      size_t n = strlen(with_value[k]);
      if (!strcmp(a, with_value[k])) {
        if (i + 1 >= argc) return cli_usage(serve_usage, "%s needs a value", a);
        known = (int)k;
        val = argv[++i];
      } else if (!strncmp(a, with_value[k], n) && a[n] == '=') {
        known = (int)k;
        val = a + n + 1;
      }
      if (known >= 0) break;
    }
    if (known < 0) return cli_usage(serve_usage, "unknown argument '%s'", a);
    long long n;
    switch (known) {
    case 0: o.listen = val; break;
    case 1: store = val; break;
    case 2: o.tokens_file = val; break;
    case 3: o.prices_file = val; break;
    case 4: o.policy_file = val; break;
    case 5:
      if (number(a, val, 1, 1024, &n)) return 2;
      o.threads = (int)n;
      break;
    case 6:
      if (number(a, val, 1024, 1LL << 30, &n)) return 2;
      o.max_body = (size_t)n;
      break;
    case 7:
      if (number(a, val, 1, 86400, &n)) return 2;
      o.timeout_s = (int)n;
      break;
    case 8: o.log_path = val; break;
    case 9: break; /* --trace-memory: ignored, whatever its value (old scripts) */
    case 10:
      if (strcmp(val, "full") && strcmp(val, "relaxed"))
        return cli_usage(serve_usage, "--durability: expected full or relaxed, got '%s'", val);
      durability = val;
      break;
    case 11:
      if (nup == sizeof upstreams / sizeof upstreams[0])
        return cli_usage(serve_usage, "at most %zu --upstream flags", nup);
      upstreams[nup++] = val;
      break;
    case 12: o.upstreams_file = val; break;
    case 13:
      if (number(a, val, TTL_MIN_MS, TTL_MAX_MS, &n)) return 2;
      o.reservation_ttl_ms = n;
      break;
    case 14: o.policies_dir = val; break;
    case 15: o.secret_file = val; break;
    case 16:
      if (number(a, val, 1024, 1LL << 34, &n)) return 2;
      o.gateway_max_body = (size_t)n;
      break;
    case 17: drain = val; break;
    case 18: retain = val; break;
    }
  }
  const char *env_retain = getenv("LOOPGUARD_RETAIN_RUNS");
  if (!retain && env_retain && *env_retain) retain = env_retain;
  if (retain && (o.retain_runs_ms = cli_parse_duration(retain)) < 1000)
    return cli_usage(serve_usage, "%s wants a duration of a second or more like 12h, 30d or 2w, not '%s'",
                     retain == env_retain ? "LOOPGUARD_RETAIN_RUNS" : "--retain-runs", retain);
  long long drain_s = 10;
  const char *env_drain = getenv("LOOPGUARD_DRAIN_SECONDS");
  if (!drain && env_drain && *env_drain &&
      number("LOOPGUARD_DRAIN_SECONDS", env_drain, 1, 86400, &drain_s))
    return 2;
  if (drain && number("--drain", drain, 1, 86400, &drain_s)) return 2;
  o.store_url = cli_store_url(store);
  /* --durability is the store URL's durability= parameter (docs/store.md). */
  char url_buf[4096];
  if (durability) {
    const char *u = o.store_url;
    int kv = !strncmp(u, "postgres:", 9) && strncmp(u, "postgres://", 11) &&
             strncmp(u, "postgresql://", 13);
    int n = snprintf(url_buf, sizeof url_buf, "%s%sdurability=%s", u,
                     kv ? " " : strchr(u, '?') ? "&" : "?", durability);
    if (n < 0 || (size_t)n >= sizeof url_buf)
      return cli_usage(serve_usage, "--store: the URL is too long");
    o.store_url = url_buf;
  }
  const char *env_up = getenv("LOOPGUARD_UPSTREAM");
  if (!nup && !o.upstreams_file && env_up && *env_up) upstreams[nup++] = env_up;
  o.upstreams = upstreams;
  o.nupstreams = nup;
  const char *env_ttl = getenv("LOOPGUARD_RESERVATION_TTL_MS");
  long long ttl;
  if (!o.reservation_ttl_ms && env_ttl && *env_ttl) {
    if (number("LOOPGUARD_RESERVATION_TTL_MS", env_ttl, TTL_MIN_MS, TTL_MAX_MS, &ttl)) return 2;
    o.reservation_ttl_ms = ttl;
  }
  const char *env_tokens = getenv("LOOPGUARD_TOKENS");
  if (env_tokens && *env_tokens) o.tokens = env_tokens;
  const char *env_secret = getenv("LOOPGUARD_SECRET_FILE");
  if (!o.secret_file && env_secret && *env_secret) o.secret_file = env_secret;

  /* Block the signals before the server's threads exist, so that only
   * sigwait() below receives them. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  keep_freed_memory();

  lg_error_t err;
  memset(&err, 0, sizeof err);
  start_ctx_t st = {.o = &o, .err = &err};
  with_signals(start_run, start_tick, &st, &set);
  lg_server_t *srv = st.srv;
  if (!srv) {
    cli_error(&err);
    if (strstr(err.message, "in use"))
      fprintf(stderr, "loopguard: another program listens on %s (another loopguard serve?): "
                      "pick another address with --listen HOST:PORT (port 0 takes a free one)\n",
              o.listen ? o.listen : "127.0.0.1:8787");
    return 1;
  }
  char *banner = lg_server_banner(srv);
  if (banner) fputs(banner, stdout);
  lg_free(banner);
  fflush(stdout);

  int rc = 0;
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig)) continue;
    if (sig == SIGHUP) {
      if (lg_server_reopen_log(srv))
        fprintf(stderr, "loopguard: cannot reopen the log file; still writing the old one\n");
      continue;
    }
    break; /* SIGTERM, SIGINT */
  }
  drain_ctx_t d = {.srv = srv, .drain_s = (int)drain_s};
  with_signals(drain_run, drain_tick, &d, &set);
  if (d.rc == LG_EBUSY) {
    if (d.cut) fprintf(stderr, "loopguard: a second signal: the requests still in flight were cut\n");
    else fprintf(stderr, "loopguard: requests were still in flight after %lld s (--drain); they were cut\n", drain_s);
    rc = 1;
  }
  lg_server_free(srv);
  return rc;
}
