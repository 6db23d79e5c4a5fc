/*
 * expect.c — a trace as a regression test: the `# expect {...}` line that
 * says how the guard stops a trace (trace-v1, "Expectations").
 *
 * The expectation is computed by replaying the trace (lg_replay_buffer),
 * never copied from what a store or a server believed: it says what
 * replay does, so `loopguard test` on the file holds by construction and
 * fails the day a change to the guard makes it stop the incident
 * differently. Only the keys of the spec's table are written:
 *
 *   terminal_reason      the summary's reason, or null (no stop)
 *   stopped_at_call      N, when the stop was the answer to the N-th call
 *                        event (a stop on a result, a model call, a text
 *                        or a cancel has no key of its own: the counts
 *                        and the reason pin it down); the last stop's,
 *                        when a resume undid an earlier one
 *   executed_calls, blocked_calls, replayed_calls
 *   call_N_action        for every call the guard did not simply execute
 *                        (block, replay, stop), at most LG__EXPECT_ACTIONS
 *
 * One code path for `loopguard runs export` and for the server's
 * GET /v1/runs/{id}/regression, so the file an operator downloads from
 * the console and the one a script exports are the same bytes.
 */
#include "../util/internal.h"

#define LG__EXPECT_ACTIONS 64 /* call_N_action keys at most: a line stays readable */

typedef struct expect_ctx {
  lg__buf_t actions;        /* ,"call_N_action":"..." members */
  int nactions;             /* how many */
  long ncalls;              /* call events acted on so far */
  long stop_call;           /* N of the call that stopped, 0: none */
  int have_sum;             /* the summary was seen */
  lg__buf_t sum;            /* the members of the summary part */
} expect_ctx_t;

static int on_event(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *s) {
  expect_ctx_t *c = ud;
  if (ev) {
    if (ev->type == LG_EV_RESUME && ev->acted && ev->decision.action != LG_ACT_STOP)
      c->stop_call = 0; /* the run goes on: its stop is a later one's */
    if (ev->type != LG_EV_CALL || !ev->acted) return 0;
    c->ncalls++;
    lg_action_t a = ev->decision.action;
    if (a == LG_ACT_STOP && !c->stop_call) c->stop_call = c->ncalls;
    if (a != LG_ACT_EXECUTE && c->nactions < LG__EXPECT_ACTIONS) {
      lg__buf_printf(&c->actions, ",\"call_%ld_action\":\"%s\"", c->ncalls, lg_action_name(a));
      c->nactions++;
    }
    return c->actions.oom ? LG_ENOMEM : 0;
  }
  c->have_sum = 1;
  lg__buf_t *b = &c->sum;
  lg__buf_puts(b, "{\"terminal_reason\":");
  if (s->terminal_reason) lg__buf_json_str(b, s->terminal_reason, strlen(s->terminal_reason));
  else lg__buf_puts(b, "null");
  /* The stop was on a call when the summary's line is that call's. */
  if (s->terminal_reason && c->stop_call) lg__buf_printf(b, ",\"stopped_at_call\":%ld", c->stop_call);
  lg__buf_printf(b, ",\"executed_calls\":%lld,\"blocked_calls\":%lld,\"replayed_calls\":%lld",
                 (long long)s->executed_calls, (long long)s->blocked_calls,
                 (long long)s->replayed_calls);
  return b->oom ? LG_ENOMEM : 0;
}

/* True when the line (without its '\n') is a `# expect` comment. */
static bool is_expect_line(const char *p, size_t n) {
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
  return n - i >= 8 && !memcmp(p + i, "# expect", 8) &&
         (n - i == 8 || p[i + 8] == ' ' || p[i + 8] == '\t' || p[i + 8] == '{');
}

int lg_expect_compute(const char *name, const char *trace, size_t len,
                                lg_policy_t *policy, char **line, lg_error_t *err) {
  *line = NULL;
  expect_ctx_t c;
  memset(&c, 0, sizeof c);
  int rc = lg_replay_buffer(name, trace, len, policy, on_event, &c, err);
  if (!rc && !c.have_sum) rc = lg__err(err, LG_ETRACE, NULL, -1, "%s: the replay gave no summary", name);
  if (!rc) {
    lg__buf_t out = {0};
    lg__buf_puts(&out, "# expect ");
    lg__buf_append(&out, c.sum.data, c.sum.len);
    if (c.actions.len) lg__buf_append(&out, c.actions.data, c.actions.len);
    lg__buf_puts(&out, "}\n");
    *line = lg__buf_steal(&out, NULL);
    if (!*line) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  lg__buf_free(&c.actions);
  lg__buf_free(&c.sum);
  return rc;
}

int lg_expect_trace(const char *name, const char *trace, size_t len,
                              lg_policy_t *policy, char **out, size_t *out_len,
                              lg_error_t *err) {
  *out = NULL;
  if (out_len) *out_len = 0;
  char *line = NULL;
  int rc = lg_expect_compute(name, trace, len, policy, &line, err);
  if (rc) return rc;
  lg__buf_t b = {0};
  lg__buf_puts(&b, line);
  lg__free(line);
  /* The trace as it is, less any `# expect` line it had: the new one
   * replaces it (comments are ignored by replay, so the decisions are
   * the same; only line numbers move, which no key depends on). */
  for (size_t i = 0; i < len;) {
    const char *nl = memchr(trace + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (trace + i)) : len - i;
    if (!is_expect_line(trace + i, n)) {
      lg__buf_append(&b, trace + i, n);
      lg__buf_putc(&b, '\n');
    }
    i += n + (nl ? 1 : 0);
  }
  *out = lg__buf_steal(&b, out_len);
  return *out ? 0 : lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
}
