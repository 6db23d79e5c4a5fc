/*
 * loopguard/server.h — the HTTP sidecar (http-api-v1) and, when
 * upstreams are given, the gateway (gateway-v1) it hosts. Built on
 * loopguard/core.h.
 */
#ifndef LOOPGUARD_SERVER_H
#define LOOPGUARD_SERVER_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------
 * The HTTP sidecar (http-api-v1): `loopguard serve` is a thin shell over
 * these functions. The server runs its own threads (libmicrohttpd, a
 * thread pool sized to the machine); every decision for a run is made
 * under the run's lock in the store and stored before it is answered.
 * The library installs no signal handler: the caller decides what a
 * signal means (the CLI maps SIGTERM/SIGINT to lg_server_shutdown and
 * SIGHUP to lg_server_reopen_log). Secrets (tokens, store passwords) are
 * never written to logs, traces or the banner.
 * ------------------------------------------------------------------- */
typedef struct lg_server lg_server_t;

#define LG_SERVER_DEFAULT_LISTEN "127.0.0.1:8787"
#define LG_SERVER_DEFAULT_MAX_BODY (1024 * 1024) /* bytes */
#define LG_SERVER_DEFAULT_GATEWAY_MAX_BODY (64u * 1024 * 1024) /* bytes */
#define LG_SERVER_DEFAULT_TIMEOUT_S 30
#define LG_SERVER_DEFAULT_TRACE_MEMORY (256u * 1024 * 1024) /* not used */

/* Options of lg_server_start(); zero / NULL means the default for every
 * field. Strings are copied. */
typedef struct lg_server_options {
  const char *listen;       /* "HOST:PORT" or "[V6]:PORT"; port 0 takes any
                               free port (lg_server_port says which) */
  const char *store_url;    /* required: memory:, sqlite:PATH, postgres:... */
  const char *tokens_file;  /* "ROLE TOKEN" a line (# comments); or NULL */
  const char *tokens;       /* "ROLE TOKEN;ROLE TOKEN" (LOOPGUARD_TOKENS's
                               form); or NULL. Roles: agent, operator */
  const char *policy_file;  /* default policy of new runs; NULL: built-in */
  const char *prices_file;  /* model prices (docs/budget.md), reloaded by
                               lg_server_reopen_log; or NULL */
  int threads;              /* HTTP worker threads; 0: for sqlite: and
                               memory: one per online core less one (their
                               group commit has a thread of its own), for
                               postgres: four per core, at most 32 */
  size_t max_body;          /* larger request bodies are 413; 0: 1 MiB */
  int timeout_s;            /* a connection idle this long, or a body not
                               received in this time, is cut off; 0: 30 */
  const char *log_path;     /* structured log (JSON lines); NULL: stderr */
  size_t trace_memory;      /* not used: a run's trace lines are rows of
                               the store (schema 5); kept for source
                               compatibility */
  int64_t (*clock)(void *ud); /* epoch ms; NULL: CLOCK_REALTIME (tests
                               pass a fixed clock) */
  void *clock_ud;
  /* The gateway (gateway-v1, docs/gateway.md): on when an upstream is
   * given. Each entry is "URL" or "NAME=URL"; the first is the default. */
  const char *const *upstreams;
  size_t nupstreams;
  const char *upstreams_file; /* --upstreams FILE (JSON), or NULL */
  int64_t reservation_ttl_ms; /* a model request's reservation without a
                                 settlement; 0: the upstream's timeout
                                 plus a minute */
  const char *policies_dir;   /* --policies DIR: NAME.json files, the
                                 policies X-Loopguard-Policy: NAME names;
                                 or NULL */
  const char *secret_file;    /* --secret-file FILE: 32 random bytes or 64
                                 hex digits; the keys' own provider keys
                                 (byok) are stored sealed under it (every
                                 replica is given the same file). NULL:
                                 stored in clear, said once in the log */
  size_t gateway_max_body;    /* the gateway's routes (a model request with
                                 its images, an upload passed through):
                                 larger bodies are 413; 0: 64 MiB. The
                                 server's own API keeps max_body */
  int64_t retain_runs_ms;     /* > 0: a thread of the server purges the
                                 runs not written to for this long
                                 (lg_store_purge_runs) at the start and
                                 then every tenth of it (at least a
                                 second, at most an hour); 0: runs are
                                 kept */
} lg_server_options_t;

/* Starts a server: opens the store (failing early when it cannot), loads
 * the tokens and the default policy, binds the address and starts serving
 * on threads of its own. Refuses (LG_EINVAL, err saying why) to bind a
 * non-loopback address when no token is configured. Returns a new server
 * (lg_server_free) or NULL with err filled. While it runs, lg_server_port,
 * lg_server_banner and lg_server_reopen_log may be called from any thread;
 * lg_server_shutdown and lg_server_free from one thread, after them
 * (lg_server_cut_drain from any, until lg_server_free). */
LG_EXPORT lg_server_t *lg_server_start(const lg_server_options_t *opts,
                                       lg_error_t *err);
/* The TCP port the server listens on. */
LG_EXPORT int lg_server_port(const lg_server_t *srv);
/* The lines to print at start: where it listens (a URL), the store
 * (without password), whether auth is on, the default policy's source,
 * and how to reach it. New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_server_banner(const lg_server_t *srv);
/* Reopens the log file (after log rotation; SIGHUP). 0 or LG_EIO (the old
 * file stays in use). */
LG_EXPORT int lg_server_reopen_log(lg_server_t *srv);
/* Graceful stop: stops accepting connections, lets requests in flight
 * finish (at most drain_ms; <= 0: 10 s), stops the threads and closes the
 * store. Idempotent. Returns 0, or LG_EBUSY when requests were still in
 * flight when drain_ms ran out (they were cut). */
LG_EXPORT int lg_server_shutdown(lg_server_t *srv, int drain_ms);
/* Ends the drain of a lg_server_shutdown running on another thread now:
 * the requests still in flight are cut, as when drain_ms runs out (a
 * second SIGTERM or Ctrl-C, in the CLI). May be called from any thread
 * until lg_server_free; before a shutdown, that shutdown cuts at once. */
LG_EXPORT void lg_server_cut_drain(lg_server_t *srv);
/* Shuts down (when not done yet, with the default drain) and frees. NULL:
 * no-op. */
LG_EXPORT void lg_server_free(lg_server_t *srv);

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_SERVER_H */
