/*
 * apply.c — lg_run_apply: one event to the engine, the same for every
 * front end.
 *
 * This is the only place where an event type meets the engine function
 * that decides on it. The trace reader (replay), the server's decision
 * step and the CLI all come through here, which is what makes a trace the
 * server wrote replay to the decisions the server gave.
 *
 * Two events are not the engine's own: a model call's usage, which
 * settles the reservation its model decision made (a trace's model line
 * carries its usage with it and is settled at once; the server's carries
 * the worst case and a later usage line settles it), and a shared
 * budget's refusal, which stops the run as budget_exceeded with a message
 * built from the refusal's fields alone, so that replay says the same.
 */
#include "event.h"

#include "../engine/engine.h"

#include <stdio.h>

static const char *type_names[] = {"",      "run",  "model", "call",       "result",
                                   "state", "handoff", "cancel", "text", "user",
                                   "compaction", "budget", "usage", "resume", "stop"};

const char *lg_event_type_name(lg_event_type_t t) {
  return (unsigned)t < LG__ARRAY_LEN(type_names) ? type_names[t] : "";
}

lg_event_type_t lg_event_type_parse(const char *name) {
  if (!name) return (lg_event_type_t)0;
  for (size_t i = 1; i < LG__ARRAY_LEN(type_names); i++)
    if (!strcmp(type_names[i], name)) return (lg_event_type_t)i;
  return (lg_event_type_t)0;
}

bool lg__run_awaits(const lg_run_t *run, const char *call_id) {
  for (int i = run->npending - 1; i >= 0; i--)
    if (!strcmp(run->pending[i].call_id, call_id)) return true;
  return false;
}

int lg__budget_stop_message(lg__buf_t *b, const char *scope, const char *limit_source,
                            int64_t requested_nusd) {
  lg__buf_printf(b, "The shared budget %s refused this model call (%s): it could cost ",
                 scope && *scope ? scope : "of this run", limit_source && *limit_source ? limit_source : "budget_exceeded");
  lg__buf_usd(b, requested_nusd > 0 ? requested_nusd : 0);
  lg__buf_puts(b, " USD, more than the budget has left. I am stopping before making it.");
  return b->oom ? LG_ENOMEM : 0;
}

static int apply_model(lg_run_t *run, const lg_event_t *ev, lg_decision_t *d, lg_error_t *err) {
  lg_model_call_t m = ev->u.model.m;
  m.t_ms = ev->t_ms;
  int rc = lg_run_model(run, &m, d, err);
  if (rc || d->action != LG_ACT_EXECUTE || !ev->u.model.settled) return rc;
  /* A trace's model line: the call was made and its usage is known. */
  return lg_run_usage(run, d->reservation, m.input_tokens, m.output_tokens, m.cost_nusd, ev->t_ms);
}

static int apply_usage(lg_run_t *run, const lg_event_t *ev, lg_decision_t *d, lg_error_t *err) {
  memset(d, 0, sizeof *d);
  d->reason_text = "";
  d->guard = "";
  /* After a stop nothing changes the run, as everywhere (replay reads
   * such lines but does not act on them). */
  if (lg_run_stopped(run)) return lg_run_stop(run, LG_R_NONE, NULL, ev->t_ms, d);
  int rc = lg_run_usage(run, ev->u.usage.reservation, ev->u.usage.input_tokens,
                        ev->u.usage.output_tokens, ev->u.usage.cost_nusd, ev->t_ms);
  if (rc == LG_ENOTFOUND && ev->u.usage.reservation)
    return lg__err(err, rc, "reservation", -1, "no open reservation %lld in run \"%s\"",
                   (long long)ev->u.usage.reservation, lg_run_id(run));
  if (rc == LG_ENOTFOUND)
    return lg__err(err, rc, "reservation", -1,
                   "no model call of run \"%s\" is waiting for its usage", lg_run_id(run));
  if (rc) return lg__err(err, rc, NULL, -1, "%s", lg_strerror(rc));
  d->action = LG_ACT_CONTINUE;
  return 0;
}

static int apply_budget(lg_run_t *run, const lg_event_t *ev, lg_decision_t *d, lg_error_t *err) {
  lg__buf_t msg = {0};
  int rc = lg__budget_stop_message(&msg, ev->u.budget.scope, ev->u.budget.limit_source,
                                   ev->u.budget.requested_nusd);
  if (!rc) rc = lg_run_stop(run, LG_R_BUDGET_EXCEEDED, msg.data, ev->t_ms, d);
  lg__buf_free(&msg);
  return rc ? lg__err(err, rc, NULL, -1, "%s", lg_strerror(rc)) : 0;
}

/* The run has seen time t: every event applied, not only the calls,
 * results and model calls let through that the engine dates itself. The
 * decision step dates the next event no earlier than this (a replica's
 * clock behind must not make a trace go back in time, which replay
 * refuses), and replay, applying the same events, keeps the same time. */
static int seen(lg_run_t *run, int64_t t, int rc) {
  if (!rc && t > run->c.last_t_ms) run->c.last_t_ms = t;
  return rc;
}

static int apply_one(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev, bool trusted_fp,
                     lg_decision_t *d, lg_error_t *err);

int lg__run_apply(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev, bool trusted_fp,
                  lg_decision_t *d, lg_error_t *err) {
  if (!run || !ev || !d) return lg__err(err, LG_EINVAL, NULL, -1, "no run, event or decision");
  bool was_stopped = lg_run_stopped(run);
  int rc = apply_one(run, canon, ev, trusted_fp, d, err);
  return was_stopped ? rc : seen(run, ev->t_ms, rc);
}

static int apply_one(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev, bool trusted_fp,
                     lg_decision_t *d, lg_error_t *err) {
  int64_t t = ev->t_ms;
  switch (ev->type) {
  case LG_EV_CALL: {
    lg_call_t c = ev->u.call;
    c.t_ms = t;
    return lg__run_before(run, canon, &c, trusted_fp, d, err);
  }
  case LG_EV_RESULT: {
    lg_result_t r = ev->u.result;
    r.t_ms = t;
    return lg_run_after(run, &r, d, err);
  }
  case LG_EV_MODEL: return apply_model(run, ev, d, err);
  case LG_EV_USAGE: return apply_usage(run, ev, d, err);
  case LG_EV_STATE:
    return lg_run_state(run, canon, ev->u.state.world, ev->u.state.len, t, d, err);
  case LG_EV_HANDOFF:
    return lg_run_handoff(run, ev->u.handoff.from, ev->u.handoff.to, t, d, err);
  case LG_EV_CANCEL: {
    int rc = lg_run_cancel(run, ev->u.cancel.reason, t, d);
    return rc ? lg__err(err, rc, NULL, -1, "%s", lg_strerror(rc)) : 0;
  }
  case LG_EV_BUDGET: return apply_budget(run, ev, d, err);
  case LG_EV_TEXT: {
    const char *text = ev->u.text.text ? ev->u.text.text : "";
    size_t len = ev->u.text.len ? ev->u.text.len : strlen(text);
    return lg_run_text(run, ev->u.text.turn, text, len, ev->u.text.agent, t, d, err);
  }
  case LG_EV_USER: return lg_run_user(run, t, d);
  case LG_EV_STOP: {
    int rc = lg_run_stop(run, ev->u.stop.reason, ev->u.stop.message, t, d);
    return rc ? lg__err(err, rc, "reason", -1, "%s", rc == LG_EINVAL ? "not a stop reason" : lg_strerror(rc))
              : 0;
  }
  case LG_EV_COMPACTION: return lg_run_compaction(run, t, d);
  case LG_EV_RESUME:
    return lg_run_resume(run, ev->u.resume.has_progress_version ? &ev->u.resume.progress_version : NULL,
                         t, d, err);
  default: break;
  }
  return lg__err(err, LG_EINVAL, "type", -1, "events of type \"%s\" are not applied to a run",
                 lg_event_type_name(ev->type));
}

int lg_run_apply(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev, lg_decision_t *d,
                 lg_error_t *err) {
  return lg__run_apply(run, canon, ev, false, d, err);
}
