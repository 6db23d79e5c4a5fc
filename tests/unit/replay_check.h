/*
 * replay_check.h — what the replay tests share (test_replay_property.c,
 * test_stop_replay.c): a server in this process on a store of each
 * backend, a log of what a run was sent and what the server answered, and
 * the check that replaying the server's own trace gives the same.
 *
 * The check, for one run:
 *   - every event the server decided on while the run was active (a 200
 *     answer before its first stop, or a cancel that says cancelled: true)
 *     is one trace line after the run line, in order; client errors (4xx),
 *     conflicts (409) and events after the stop leave none;
 *   - lg_replay_buffer over GET /v1/runs/{id}/trace acts on exactly those
 *     lines, skips none (the server writes no result for a call it did not
 *     execute) and reads none after the stop, and gives each the action
 *     and reason the server answered (and, for calls, the fingerprint);
 *   - the replay's summary equals GET /v1/runs/{id}: terminal reason, the
 *     line it stopped at (the line of the event the server stopped on),
 *     executed, blocked and replayed calls, model calls, tokens, cost.
 * On a mismatch rc_check() prints the run's requests and answers, the
 * trace and both sides' decisions, and returns -1.
 *
 * Header-only, like test_server_http.h, which it builds on.
 */
#ifndef LG_REPLAY_CHECK_H
#define LG_REPLAY_CHECK_H

#include <math.h>

#include "store_test_util.h"
#include "test_server_http.h"
#include "util/internal.h" /* lg__usd_to_units: amounts read as the library reads them */

#define RC_MAX_LINES 512

/* One trace line the server must have written, as the server answered. */
typedef struct rc_line {
  char type[16];    /* trace-v1 type: "call", "budget", ... */
  char action[16];  /* "execute", "stop", ... */
  char reason[96];  /* "" for none */
  char fp[LG_FP_HEX]; /* calls: the fingerprint answered, "" else */
} rc_line_t;

typedef struct rc_run {
  char id[128];
  rc_line_t line[RC_MAX_LINES]; /* after the run line */
  int n;
  int stopped;      /* the server answered a stop */
  int stop_at;      /* index in line[] of the stop, -1 */
  int overflow;     /* more lines than line[] holds */
  char *log;        /* what was sent and answered (malloc), for messages */
  size_t log_len, log_cap;
} rc_run_t;

static __attribute__((unused)) void rc_logf(rc_run_t *r, const char *fmt, ...) {
  char tmp[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1;
  if (r->log_len + (size_t)n + 1 > r->log_cap) {
    size_t cap = r->log_cap ? r->log_cap * 2 : 8192;
    while (cap < r->log_len + (size_t)n + 1) cap *= 2;
    r->log = realloc(r->log, cap);
    r->log_cap = cap;
  }
  memcpy(r->log + r->log_len, tmp, (size_t)n + 1);
  r->log_len += (size_t)n;
}

static __attribute__((unused)) void rc_init(rc_run_t *r, const char *id) {
  memset(r, 0, sizeof *r);
  snprintf(r->id, sizeof r->id, "%s", id);
  r->stop_at = -1;
}

static __attribute__((unused)) void rc_free(rc_run_t *r) {
  free(r->log);
  r->log = NULL;
  r->log_len = r->log_cap = 0;
}

static rc_line_t *rc_push(rc_run_t *r) {
  if (r->n == RC_MAX_LINES) {
    r->overflow = 1;
    return NULL;
  }
  rc_line_t *l = &r->line[r->n++];
  memset(l, 0, sizeof *l);
  return l;
}

/* The trace type of the line a decision route writes, from its answer. */
static const char *rc_route_type(const char *route, const ht_resp_t *a) {
  const char *reason = ht_str(a, "reason");
  if (!strcmp(route, "calls")) return "call";
  if (!strcmp(route, "results")) return "result";
  if (!strcmp(route, "state")) return "state";
  if (!strcmp(route, "handoffs")) return "handoff";
  if (!strcmp(route, "usage")) return "usage";
  if (!strcmp(route, "text")) return "text";
  if (!strcmp(route, "user")) return "user";
  if (!strcmp(route, "compaction")) return "compaction";
  if (!strcmp(route, "resume")) return "resume";
  if (!strcmp(route, "model"))
    return reason && !strcmp(reason, "budget_exceeded") && json_object_get(a->json, "metadata")
               ? "budget"
               : "model";
  return "?";
}

/* Notes the answer `a` to a decision route (calls, results, state,
 * handoffs, model, usage) of run r. A decision of an active run is one
 * trace line; a deny rule turns the event into a cancel (the answer's
 * guard is then the kill switch). */
static __attribute__((unused)) void rc_note(rc_run_t *r, const char *route, const ht_resp_t *a) {
  /* An accepted resume ends the stop: its line, and the run goes on. */
  int resume = !strcmp(route, "resume");
  if (a->status != 200 || r->stopped != resume) return;
  if (resume) {
    r->stopped = 0;
    r->stop_at = -1;
  }
  rc_line_t *l = rc_push(r);
  const char *action = ht_str(a, "action");
  const char *reason = ht_str(a, "reason");
  const char *fp = ht_str(a, "fingerprint");
  if (l) {
    snprintf(l->type, sizeof l->type, "%s", rc_route_type(route, a));
    const char *guard = ht_str(a, "guard");
    if (action && !strcmp(action, "stop") && guard && !strcmp(guard, "kill_switch"))
      snprintf(l->type, sizeof l->type, "cancel"); /* a deny rule took the event's place */
    snprintf(l->action, sizeof l->action, "%s", action ? action : "?");
    snprintf(l->reason, sizeof l->reason, "%s", reason ? reason : "");
    snprintf(l->fp, sizeof l->fp, "%s", fp && !strcmp(route, "calls") ? fp : "");
  }
  if (action && !strcmp(action, "stop")) {
    r->stopped = 1;
    r->stop_at = r->n - 1;
  }
}

/* Notes a cancel (over HTTP, or by lg_store_cancel_run/_group on any
 * store handle) that stopped run r with `reason` (NULL: the default);
 * `stopped_now`: it was active and the cancel is its last line. */
static __attribute__((unused)) void rc_note_cancel(rc_run_t *r, int stopped_now, const char *reason) {
  if (!stopped_now || r->stopped) return;
  rc_line_t *l = rc_push(r);
  if (l) {
    snprintf(l->type, sizeof l->type, "cancel");
    snprintf(l->action, sizeof l->action, "stop");
    (void)reason; /* the operator's words are a note: the reason is the kill switch's */
    snprintf(l->reason, sizeof l->reason, "operator_cancelled_loop");
  }
  r->stopped = 1;
  r->stop_at = r->n - 1;
}

/* ---- the replay side ---- */

typedef struct rc_got {
  rc_line_t line[RC_MAX_LINES];
  long lineno[RC_MAX_LINES];
  int n;
  int skipped;        /* results replay skipped */
  long first_skipped; /* the line of the first */
  int overflow;
  int have_sum;
  char terminal[96];  /* "" for none */
  long stopped_at_line;
  int64_t executed, blocked, replayed, model_calls, tokens, cost_nusd, after_stop;
} rc_got_t;

static int rc_replay_cb(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  rc_got_t *g = ud;
  if (sum) {
    g->have_sum = 1;
    snprintf(g->terminal, sizeof g->terminal, "%s", sum->terminal_reason ? sum->terminal_reason : "");
    g->stopped_at_line = sum->stopped_at_line;
    g->executed = sum->executed_calls;
    g->blocked = sum->blocked_calls;
    g->replayed = sum->replayed_calls;
    g->model_calls = sum->model_calls;
    g->tokens = sum->tokens;
    g->cost_nusd = sum->cost_nusd;
    g->after_stop = sum->events_after_stop;
    return 0;
  }
  if (ev->skipped) {
    if (!g->skipped++) g->first_skipped = ev->line;
    return 0;
  }
  if (!ev->acted) return 0;
  if (g->n == RC_MAX_LINES) {
    g->overflow = 1;
    return 0;
  }
  rc_line_t *l = &g->line[g->n];
  g->lineno[g->n++] = ev->line;
  /* The replay's decision as the server writes its own: through the
   * library's one printer, read back like the server's answer. */
  snprintf(l->type, sizeof l->type, "%s", lg_event_type_name(ev->type));
  char *dj = lg_decision_to_json(ev->type, &ev->decision);
  json_t *o = dj ? json_loads(dj, 0, NULL) : NULL;
  lg_free(dj);
  if (!o) return LG_ENOMEM;
  const char *action = json_string_value(json_object_get(o, "action"));
  const char *reason = json_string_value(json_object_get(o, "reason"));
  const char *fp = json_string_value(json_object_get(o, "fingerprint"));
  snprintf(l->action, sizeof l->action, "%s", action ? action : "?");
  snprintf(l->reason, sizeof l->reason, "%s", reason ? reason : "");
  snprintf(l->fp, sizeof l->fp, "%s", fp ? fp : "");
  json_decref(o);
  return 0;
}

/* The run's trace (new, malloc'd into *body) or NULL. */
static char *rc_get_trace(ht_conn_t *c, const char *run_id, size_t *len) {
  char path[256];
  snprintf(path, sizeof path, "/v1/runs/%s/trace", run_id);
  ht_resp_t t;
  if (ht_req(c, "GET", path, NULL, NULL, &t) || t.status != 200) {
    ht_resp_clear(&t);
    return NULL;
  }
  char *body = t.body;
  *len = t.len;
  t.body = NULL;
  ht_resp_clear(&t);
  return body;
}

/* Compares the replay of the server's trace of r with what the server
 * answered. 0 when they agree; else prints why (with `label`) and -1. */
static __attribute__((unused)) int rc_check(ht_conn_t *c, rc_run_t *r, const char *label) {
  char why[1024] = "";
  size_t tlen = 0;
  char *trace = rc_get_trace(c, r->id, &tlen);
  static rc_got_t g; /* large: not on the stack */
  memset(&g, 0, sizeof g);
  ht_resp_t run;
  memset(&run, 0, sizeof run);
  int bad = 0;
  long base = 1; /* the run line's number */
#define RC_BAD(...)                                                                              \
  do {                                                                                           \
    if (!bad) snprintf(why, sizeof why, __VA_ARGS__);                                            \
    bad = 1;                                                                                     \
  } while (0)
  if (!trace) {
    RC_BAD("GET /v1/runs/%s/trace failed", r->id);
    goto report;
  }
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_replay_buffer("server-trace", trace, tlen, NULL, rc_replay_cb, &g, &err);
  if (rc) {
    char buf[1024];
    RC_BAD("the server's trace does not replay: %s", lg_error_format(&err, buf, sizeof buf));
    goto report;
  }
  if (r->overflow || g.overflow) RC_BAD("more than %d lines: make the test's runs shorter", RC_MAX_LINES);
  if (g.skipped) RC_BAD("replay skipped the result on line %ld (the server wrote it: it decided on it)", g.first_skipped);
  if (g.after_stop) RC_BAD("replay read %lld events after the stop (the server writes none)", (long long)g.after_stop);
  /* Line numbers count from the run line (comment lines may come first). */
  for (const char *p = trace; *p && strncmp(p, "{\"type\":\"run\"", 13); base++) {
    const char *nl = strchr(p, '\n');
    if (!nl) break;
    p = nl + 1;
  }
  for (int i = 0; !bad && i < r->n && i < g.n; i++) {
    const rc_line_t *w = &r->line[i], *h = &g.line[i];
    if (g.lineno[i] != base + 1 + i)
      RC_BAD("event %d is on line %ld, not %ld", i + 1, g.lineno[i], base + 1 + i);
    else if (strcmp(w->type, h->type))
      RC_BAD("line %ld: the server decided a %s, replay read a %s", base + 1 + i, w->type, h->type);
    else if (strcmp(w->action, h->action) || strcmp(w->reason, h->reason))
      RC_BAD("line %ld (%s): server %s/%s, replay %s/%s", base + 1 + i, w->type, w->action, w->reason,
             h->action, h->reason);
    else if (w->fp[0] && strcmp(w->fp, h->fp))
      RC_BAD("line %ld (call): server fingerprint %s, replay %s", base + 1 + i, w->fp, h->fp);
  }
  if (!bad && r->n != g.n) RC_BAD("the server decided %d events, replay %d", r->n, g.n);
  if (!g.have_sum) RC_BAD("no summary");
  if (bad) goto report;
  /* The summary against the run as the server keeps it. */
  char path[256];
  snprintf(path, sizeof path, "/v1/runs/%s", r->id);
  if (ht_req(c, "GET", path, NULL, NULL, &run) || run.status != 200) {
    RC_BAD("GET %s failed", path);
    goto report;
  }
  const char *term = ht_str(&run, "terminal_reason");
  long want_line = r->stop_at >= 0 ? base + 1 + r->stop_at : 0;
  double cost = json_number_value(ht_get(&run, "counters.cost_usd"));
  int64_t cost_nusd = -1; /* read as the library reads an amount */
  lg__usd_to_units(cost, LG__USD_NANO, &cost_nusd);
  if (strcmp(term ? term : "", g.terminal))
    RC_BAD("terminal reason: server %s, replay %s", term ? term : "null", g.terminal[0] ? g.terminal : "null");
  else if (r->stopped && strcmp(r->line[r->stop_at].reason, g.terminal))
    RC_BAD("the server stopped with %s, replay ends with %s", r->line[r->stop_at].reason, g.terminal);
  else if (!r->stopped && term)
    RC_BAD("the server says %s but never answered a stop", term);
  else if (g.stopped_at_line != want_line)
    RC_BAD("stopped at line: server %ld, replay %ld", want_line, g.stopped_at_line);
  else if (ht_int(&run, "counters.steps") != g.executed)
    RC_BAD("executed calls: server %lld, replay %lld", ht_int(&run, "counters.steps"), (long long)g.executed);
  else if (ht_int(&run, "counters.blocked") != g.blocked)
    RC_BAD("blocked calls: server %lld, replay %lld", ht_int(&run, "counters.blocked"), (long long)g.blocked);
  else if (ht_int(&run, "counters.replayed") != g.replayed)
    RC_BAD("replayed calls: server %lld, replay %lld", ht_int(&run, "counters.replayed"), (long long)g.replayed);
  else if (ht_int(&run, "counters.model_calls") != g.model_calls)
    RC_BAD("model calls: server %lld, replay %lld", ht_int(&run, "counters.model_calls"), (long long)g.model_calls);
  else if (ht_int(&run, "counters.tokens") != g.tokens)
    RC_BAD("tokens: server %lld, replay %lld", ht_int(&run, "counters.tokens"), (long long)g.tokens);
  else if (llabs(cost_nusd - g.cost_nusd) > 1)
    RC_BAD("cost: server %lld nUSD, replay %lld", (long long)cost_nusd, (long long)g.cost_nusd);
report:
  if (bad) {
    fprintf(stderr, "\n==== %s: run %s: %s\n---- requests and answers\n%s", label, r->id, why,
            r->log ? r->log : "");
    fprintf(stderr, "---- trace\n%s", trace ? trace : "(none)\n");
    fprintf(stderr, "---- decisions (line: server | replay)\n");
    for (int i = 0; i < (r->n > g.n ? r->n : g.n); i++)
      fprintf(stderr, "%3ld: %-8s %-8s %-24s | %-8s %-8s %s\n", base + 1 + i, i < r->n ? r->line[i].type : "-",
              i < r->n ? r->line[i].action : "", i < r->n ? r->line[i].reason : "",
              i < g.n ? g.line[i].type : "-", i < g.n ? g.line[i].action : "",
              i < g.n ? g.line[i].reason : "");
  }
#undef RC_BAD
  ht_resp_clear(&run);
  free(trace);
  return bad ? -1 : 0;
}

/* ---- sending, with the log ---- */

/* METHOD /v1/... with body on c, logged into r (may be NULL). -1 when
 * the server did not answer. */
static __attribute__((unused)) int rc_send(ht_conn_t *c, rc_run_t *r, const char *method,
                                           const char *path, const char *body, ht_resp_t *a) {
  int rc = ht_req(c, method, path, NULL, body, a);
  if (r)
    rc_logf(r, "[t=%lld] %s %s %s\n   -> %d %.240s%s\n", (long long)ht_clock_ms, method, path,
            body ? body : "", rc ? 0 : a->status, rc ? "(no answer)" : a->body,
            !rc && a->len > 240 ? "..." : "");
  return rc;
}

/* Starts a server in this process on `url` with the test clock; `prices`
 * (may be NULL) a price file. */
static __attribute__((unused)) lg_server_t *rc_start(const char *url, const char *prices,
                                                     const char *log_path) {
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.listen = "127.0.0.1:0";
  o.store_url = url;
  o.clock = ht_clock;
  o.prices_file = prices;
  o.log_path = log_path;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_server_t *s = lg_server_start(&o, &err);
  if (!s) {
    char buf[1024];
    fprintf(stderr, "lg_server_start(%s): %s\n", url, lg_error_format(&err, buf, sizeof buf));
  }
  return s;
}

#endif
