/*
 * metrics.c — what GET /metrics shows, in the Prometheus text format
 * (version 0.0.4): decisions by action and reason, stops by reason, ledger
 * outcomes, active runs, and per route a request counter by status code
 * and a latency histogram.
 *
 * Every figure is a relaxed atomic counter in fixed arrays, so recording
 * costs an increment and never a lock or an allocation on the hot path.
 * Label values come from closed sets (enums, routes, a handful of status
 * codes), never from request data: an operator's free-text cancel reason
 * is counted under operator_cancelled_loop, so a client cannot grow the
 * series without bound.
 */
#include "server.h"

static const char *route_names[] = {
#define LG__XX(id, name) name,
    LG__ROUTE_MAP(LG__XX)
#undef LG__XX
};

const char *lg__route_name(lg__route_t r) {
  return (unsigned)r < LG__RT__COUNT ? route_names[r] : "other";
}

/* Upper bounds of the latency buckets, seconds and nanoseconds. */
static const char *bucket_le[LG__HIST_BUCKETS] = {
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025",  "0.05",    "0.1",    "0.25",  "0.5",    "1",     "2.5"};
static const uint64_t bucket_ns[LG__HIST_BUCKETS] = {
    100000,   250000,    500000,    1000000,   2500000,   5000000,    10000000,
    25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000u};

#define INC(x) atomic_fetch_add_explicit(&(x), 1, memory_order_relaxed)
#define GET(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* The slot of an HTTP status code: found, or claimed once; the last slot
 * takes every code that does not fit. A slot holds its code + 1, so that
 * 0, a request whose client hung up before its answer, has a slot of its
 * own (it was taken for a free one, and the next code claimed its counts). */
static int code_slot(lg__metrics_t *m, int code) {
  for (int i = 0; i < LG__CODE_SLOTS - 1; i++) {
    int c = GET(m->codes[i]);
    if (c == code + 1) return i;
    if (c == 0) {
      int zero = 0;
      if (atomic_compare_exchange_strong(&m->codes[i], &zero, code + 1) || zero == code + 1) return i;
    }
  }
  return LG__CODE_SLOTS - 1;
}

void lg__metrics_request(lg__metrics_t *m, lg__route_t r, int code, uint64_t ns) {
  if ((unsigned)r >= LG__RT__COUNT) r = LG__RT_OTHER;
  int b = 0;
  while (b < LG__HIST_BUCKETS && ns > bucket_ns[b]) b++;
  INC(m->hist[r][b]);
  atomic_fetch_add_explicit(&m->hist_sum_ns[r], ns, memory_order_relaxed);
  INC(m->requests[r][code_slot(m, code)]);
}

void lg__metrics_decision(lg__metrics_t *m, lg_action_t a, lg_reason_t why, int stopped_now) {
  if ((unsigned)a >= LG__ACTIONS) return;
  if ((unsigned)why >= LG_R__COUNT) why = LG_R_NONE;
  INC(m->decisions[a][why]);
  if (stopped_now) INC(m->stops[why]);
}

void lg__metrics_ledger(lg__metrics_t *m, lg_claim_outcome_t o) {
  if ((unsigned)o < LG__OUTCOMES) INC(m->ledger[o]);
}

static const char *limit_sources[4] = {"key_limit", "workspace_budget", "scope_budget",
                                       "in_flight_budget"};

void lg__metrics_budget_refusal(lg__metrics_t *m, const char *limit_source) {
  for (int i = 0; i < 4; i++)
    if (limit_source && !strcmp(limit_source, limit_sources[i])) INC(m->budget_refusals[i]);
}

int lg__metrics_render(lg__metrics_t *m, lg__buf_t *b) {
  lg__buf_puts(b, "# HELP loopguard_decisions_total Decisions answered, by action and reason.\n"
                  "# TYPE loopguard_decisions_total counter\n");
  for (int a = 0; a < LG__ACTIONS; a++)
    for (int r = 0; r < LG_R__COUNT; r++) {
      uint64_t v = GET(m->decisions[a][r]);
      if (v)
        lg__buf_printf(b, "loopguard_decisions_total{action=\"%s\",reason=\"%s\"} %llu\n",
                       lg_action_name((lg_action_t)a), lg_reason_name((lg_reason_t)r),
                       (unsigned long long)v);
    }
  lg__buf_puts(b, "# HELP loopguard_stops_total Runs stopped, by reason.\n"
                  "# TYPE loopguard_stops_total counter\n");
  for (int r = 1; r < LG_R__COUNT; r++) {
    uint64_t v = GET(m->stops[r]);
    if (v)
      lg__buf_printf(b, "loopguard_stops_total{reason=\"%s\"} %llu\n",
                     lg_reason_name((lg_reason_t)r), (unsigned long long)v);
  }
  lg__buf_puts(b, "# HELP loopguard_ledger_outcomes_total Idempotency ledger claims, by outcome.\n"
                  "# TYPE loopguard_ledger_outcomes_total counter\n");
  for (int o = 1; o < LG__OUTCOMES; o++)
    lg__buf_printf(b, "loopguard_ledger_outcomes_total{outcome=\"%s\"} %llu\n",
                   lg_claim_outcome_name((lg_claim_outcome_t)o),
                   (unsigned long long)GET(m->ledger[o]));
  lg__buf_puts(b, "# HELP loopguard_budget_refusals_total Reservations refused by a shared "
                  "budget, by limit_source.\n# TYPE loopguard_budget_refusals_total counter\n");
  for (int i = 0; i < 4; i++)
    lg__buf_printf(b, "loopguard_budget_refusals_total{limit_source=\"%s\"} %llu\n", limit_sources[i],
                   (unsigned long long)GET(m->budget_refusals[i]));
  lg__buf_printf(b,
                 "# HELP loopguard_connections_cut_total Connections the server closed: a "
                 "request or an idle connection past --timeout (deadline), or the oldest idle "
                 "one to make room (evicted).\n"
                 "# TYPE loopguard_connections_cut_total counter\n"
                 "loopguard_connections_cut_total{reason=\"deadline\"} %llu\n"
                 "loopguard_connections_cut_total{reason=\"evicted\"} %llu\n",
                 (unsigned long long)GET(m->conn_cut[0]), (unsigned long long)GET(m->conn_cut[1]));
  lg__buf_printf(b,
                 "# HELP loopguard_runs_active Runs in the store that have not stopped.\n"
                 "# TYPE loopguard_runs_active gauge\n"
                 "loopguard_runs_active %lld\n",
                 (long long)GET(m->runs_active));
  lg__buf_puts(b, "# HELP loopguard_requests_total HTTP requests answered, by route and status.\n"
                  "# TYPE loopguard_requests_total counter\n");
  for (int r = 0; r < LG__RT__COUNT; r++)
    for (int k = 0; k < LG__CODE_SLOTS; k++) {
      uint64_t v = GET(m->requests[r][k]);
      int code = GET(m->codes[k]) - 1; /* -1: the last slot, never claimed */
      if (!v) continue;
      if (code < 0)
        lg__buf_printf(b, "loopguard_requests_total{route=\"%s\",code=\"other\"} %llu\n",
                       route_names[r], (unsigned long long)v);
      else
        lg__buf_printf(b, "loopguard_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                       route_names[r], code, (unsigned long long)v);
    }
  lg__buf_puts(b, "# HELP loopguard_request_duration_seconds Time from a request's headers to "
                  "its answer sent, by route.\n"
                  "# TYPE loopguard_request_duration_seconds histogram\n");
  for (int r = 0; r < LG__RT__COUNT; r++) {
    uint64_t cum = 0, counts[LG__HIST_BUCKETS + 1];
    for (int k = 0; k <= LG__HIST_BUCKETS; k++) counts[k] = GET(m->hist[r][k]);
    uint64_t total = 0;
    for (int k = 0; k <= LG__HIST_BUCKETS; k++) total += counts[k];
    if (!total) continue;
    for (int k = 0; k < LG__HIST_BUCKETS; k++) {
      cum += counts[k];
      lg__buf_printf(b, "loopguard_request_duration_seconds_bucket{route=\"%s\",le=\"%s\"} %llu\n",
                     route_names[r], bucket_le[k], (unsigned long long)cum);
    }
    uint64_t ns = GET(m->hist_sum_ns[r]);
    lg__buf_printf(b,
                   "loopguard_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n"
                   "loopguard_request_duration_seconds_sum{route=\"%s\"} %llu.%09llu\n"
                   "loopguard_request_duration_seconds_count{route=\"%s\"} %llu\n",
                   route_names[r], (unsigned long long)total, route_names[r],
                   (unsigned long long)(ns / 1000000000u), (unsigned long long)(ns % 1000000000u),
                   route_names[r], (unsigned long long)total);
  }
  return b->oom ? LG_ENOMEM : 0;
}
