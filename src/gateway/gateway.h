/*
 * gateway.h — the gateway (gateway-v1): `loopguard serve --upstream URL`
 * as an OpenAI / Anthropic-compatible proxy that guards any agent by
 * changing only its base URL.
 *
 * The gateway is a front end like the sidecar's routes: it turns what it
 * reads (the conversation of each model request, the tool calls of each
 * response) into events for the decision step (src/step/) and filters the
 * response by the decisions. It never calls the engine or the store's
 * transactions itself.
 *
 *   gateway.c   life of the gateway: its worker threads (a bounded number
 *               of upstream requests in flight), the parked connections,
 *               run identity, the per-run bookkeeping, metrics;
 *   chat.c      a model request of any API: conversation -> events, the
 *               upstream body (restored calls, the cascade), the response
 *               filtered by the decisions, the exchange (conv.h);
 *   completions.c, messages.c, responses.c
 *               the three wire formats: final answers, stream readers,
 *               the end of a stream;
 *   policies.c  the named policies of --policies DIR;
 *   upstream.c  upstreams (--upstream, --upstreams FILE) and libcurl.
 *
 * Names are lg__gw_ (internal).
 */
#ifndef LG_GATEWAY_H
#define LG_GATEWAY_H

#include "../server/server.h"

typedef struct lg__gw lg__gw_t;

/* 1 when opts ask for the gateway (--upstream or --upstreams): the one
 * rule lg__gw_new and the server's choice of threads both follow. */
int lg__gw_wanted(const lg_server_options_t *opts);
/* Starts the gateway of srv when opts name upstreams (copied): parses them,
 * starts the worker threads. *out is NULL (and 0 returned) when no
 * upstream is configured. Errors name the flag or the file's field. */
int lg__gw_new(lg_server_t *srv, const lg_server_options_t *opts, lg__gw_t **out,
               lg_error_t *err);
/* Shutdown: aborts the upstream exchanges in flight (their clients get an
 * error, or the end of their stream) and waits until every job was
 * answered, so no connection stays parked. 1 when it aborted an upstream
 * exchange (a request cut), else 0 (NULL: no-op). */
int lg__gw_stop(lg__gw_t *gw);
/* Stops the workers (after the HTTP daemon stopped: no request is parked
 * on them then) and frees. NULL: no-op. */
void lg__gw_free(lg__gw_t *gw);

/* Leaders and followers (server.h). lg__gw_lead_post hands the lead of
 * loop l to an idle worker, which leads it (lg__loop_lead_for): 1 when a
 * worker was idle to take it at once, 0 otherwise (or gw NULL, or
 * stopping). lg__gw_run_mine runs, on a loop's leader between its turns,
 * the request it kept (gw_submit): 1 when there was one. */
int lg__gw_lead_post(lg__gw_t *gw, lg__loop_t *l);
int lg__gw_run_mine(lg__gw_t *gw);
/* 1 while this thread keeps a request it has not answered yet. */
int lg__gw_holds_mine(void);
/* The fibers of a thread that leads a loop (gateway.c, "fibers"):
 * begin as it starts to lead, with the epoll it waits on (-1: no fibers);
 * due_ms is how long its wait may last for them (-1: no limit); every
 * event of that epoll that is not the loop's goes to fiber_event; end,
 * once it leads no more, finishes its fibers there and frees them. */
void lg__gw_fibers_begin(lg__gw_t *gw, int ep);
int lg__gw_fibers_due_ms(void);
void lg__gw_fiber_event(void *ptr, uint32_t events);
void lg__gw_fibers_end(lg__gw_t *gw);

/* 1 when the gateway answers `url` (its three routes, and passthrough of
 * any other /v1/ path that is not loopguard's own API). */
int lg__gw_claims(const lg__gw_t *gw, const char *url);
/* Whether path (n bytes) is a model API's own without the /v1 before it
 * ("/chat/completions"): what a client whose base URL lacks /v1 sends,
 * which the server's 404 then says. */
int lg__gw_lacks_v1(const char *path, size_t n);
/* 1 when `method` `url` is one of the routes the gateway guards (a model
 * request it reads); 0: passed through as it is. */
int lg__gw_guards(const char *url, const char *method);
/* Whose client a gateway request is, by its url and method and whether
 * it came with anthropic-version: 2 an Anthropic SDK's (/v1/messages, or a
 * path passed through with that header: its count_tokens, batches,
 * files), 1 otherwise. Its errors take that API's shape, and a passed-
 * through one goes to an Anthropic upstream first (lg__gw_handle). */
int lg__gw_error_api(const char *url, const char *method, int anthropic_version);
/* lg__req_error for a gateway route (rq->api_errors): the server's own
 * refusals (401, 413, 415, ...) in the API's shape, `type` (the server's
 * error type) as the code and `field` as the param. Returns status. */
int lg__gw_req_error(lg__req_t *rq, int status, const char *type, const char *field,
                     const char *msg);
/* The handler of every gateway request (http.c routes to it). */
void lg__gw_handle(lg__req_t *rq);
/* The gateway's series of /metrics, appended to b. */
void lg__gw_metrics(lg__gw_t *gw, lg__buf_t *b);
/* The upstream lines of the banner (a note under a base URL without a
 * path). */
void lg__gw_banner(lg__gw_t *gw, lg__buf_t *b);
/* The gateway's part of the start's log: a warning for each upstream
 * whose base URL has no path (upstream_without_path). */
void lg__gw_log_start(lg__gw_t *gw);

#endif
