/*
 * write.c — the one trace writer: every line of every trace loopguard
 * writes comes from here.
 *
 * lg__trace_write() turns an applied event, with the decision it got, back
 * into the trace-v1 line that replays to that decision: the call id the
 * engine gave a call, the reservation number a model call was let through
 * with (so that a later usage line settles the same one), the worst case a
 * model call was decided on. The reader (trace.c) and this writer are the
 * two halves of one format; tests/unit/test_trace_write.c checks that
 * every event type survives the round trip.
 *
 * Lines are compact JSON, fields in a fixed order, `t_ms` last; strings are
 * escaped by lg__buf_json_str, amounts of money printed by lg__buf_usd
 * (whole nano-dollars, exactly).
 */
#include "../event/event.h"
#include "trace.h"

/* Every line is written on the server's decision path: no printf. */
static void str(lg__buf_t *b, const char *k, const char *v) { lg__buf_json_kv(b, k, v); }

static void num(lg__buf_t *b, const char *k, int64_t v) {
  lg__buf_json_key(b, k);
  lg__buf_i64(b, v);
}

static void usd(lg__buf_t *b, const char *k, int64_t nusd) {
  lg__buf_json_key(b, k);
  lg__buf_usd(b, nusd);
}

static void json(lg__buf_t *b, const char *k, const char *v, size_t len) {
  lg__buf_json_key(b, k);
  lg__buf_append(b, v, len);
}

static void call_line(lg__buf_t *b, const lg_call_t *c, const lg_decision_t *d) {
  num(b, "turn", c->turn);
  str(b, "tool", c->tool);
  if (c->args) json(b, "args", c->args, c->args_len ? c->args_len : strlen(c->args));
  else lg__buf_puts(b, ",\"args\":{}");
  str(b, "call_id", d && d->call_id ? d->call_id : c->call_id);
  str(b, "idempotency_key", c->idempotency_key);
  str(b, "agent", c->agent);
}

static void result_line(lg__buf_t *b, const lg_result_t *r, const lg_decision_t *d) {
  str(b, "call_id", d && d->call_id ? d->call_id : r->call_id);
  /* A missing or unknown status is left out: both read back as invalid. */
  if (r->status != LG_STATUS_INVALID) str(b, "status", lg_status_name(r->status));
  if (r->has_progress_version) num(b, "progress_version", r->progress_version);
  if (r->side_effect_committed)
    lg__buf_puts(b, r->side_effect_committed > 0 ? ",\"side_effect_committed\":true"
                                                 : ",\"side_effect_committed\":false");
  if (r->retry_after_ms > 0) num(b, "retry_after_ms", r->retry_after_ms);
  if (r->value_kind != LG_VALUE_ABSENT && r->value)
    json(b, "value", r->value, r->value_len ? r->value_len : strlen(r->value));
  str(b, "operation_id", r->operation_id);
}

static void model_line(lg__buf_t *b, const lg_event_t *ev, const lg_decision_t *d) {
  const lg_model_call_t *m = &ev->u.model.m;
  num(b, "turn", m->turn);
  str(b, "model", m->model && *m->model ? m->model : NULL);
  num(b, "input_tokens", m->input_tokens);
  if (m->max_tokens >= 0) num(b, "max_tokens", m->max_tokens);
  if (ev->u.model.settled && m->output_tokens >= 0) num(b, "output_tokens", m->output_tokens);
  if (m->cost_nusd >= 0) usd(b, "cost", m->cost_nusd);
  /* Let through and settled later: the number its usage line names. */
  if (!ev->u.model.settled && d && d->action == LG_ACT_EXECUTE) num(b, "reservation", d->reservation);
}

int lg__trace_write(lg__buf_t *b, const lg_event_t *ev, const lg_decision_t *d) {
  lg__buf_puts(b, "{\"type\":\"");
  lg__buf_puts(b, lg_event_type_name(ev->type));
  lg__buf_putc(b, '"');
  switch (ev->type) {
  case LG_EV_CALL: call_line(b, &ev->u.call, d); break;
  case LG_EV_RESULT: result_line(b, &ev->u.result, d); break;
  case LG_EV_MODEL: model_line(b, ev, d); break;
  case LG_EV_USAGE:
    if (ev->u.usage.reservation) num(b, "reservation", ev->u.usage.reservation);
    num(b, "input_tokens", ev->u.usage.input_tokens);
    num(b, "output_tokens", ev->u.usage.output_tokens);
    if (ev->u.usage.cost_nusd >= 0) usd(b, "cost", ev->u.usage.cost_nusd);
    break;
  case LG_EV_STATE: json(b, "world", ev->u.state.world, ev->u.state.len); break;
  case LG_EV_HANDOFF:
    str(b, "from", ev->u.handoff.from);
    str(b, "to", ev->u.handoff.to);
    break;
  case LG_EV_CANCEL: str(b, "reason", ev->u.cancel.reason); break;
  case LG_EV_BUDGET:
    str(b, "scope", ev->u.budget.scope);
    str(b, "limit_source", ev->u.budget.limit_source);
    usd(b, "requested_usd", ev->u.budget.requested_nusd);
    break;
  case LG_EV_TEXT:
    num(b, "turn", ev->u.text.turn);
    lg__buf_puts(b, ",\"text\":");
    lg__buf_json_str(b, ev->u.text.text ? ev->u.text.text : "",
                     ev->u.text.text ? (ev->u.text.len ? ev->u.text.len : strlen(ev->u.text.text)) : 0);
    str(b, "agent", ev->u.text.agent);
    break;
  case LG_EV_USER: str(b, "text", ev->u.user.text); break;
  case LG_EV_COMPACTION: break;
  case LG_EV_STOP:
    str(b, "reason", lg_reason_name(ev->u.stop.reason));
    str(b, "note", ev->u.stop.message);
    break;
  case LG_EV_RESUME:
    if (ev->u.resume.has_progress_version) num(b, "progress_version", ev->u.resume.progress_version);
    str(b, "note", ev->u.resume.note);
    break;
  default: return LG_EINVAL;
  }
  num(b, "t_ms", ev->t_ms);
  lg__buf_puts(b, "}\n");
  return b->oom ? LG_ENOMEM : 0;
}

int lg__trace_write_run(lg__buf_t *b, const char *run_id, const char *group,
                        const int64_t *progress_version, const char *policy_json) {
  lg__buf_puts(b, "{\"type\":\"run\"");
  str(b, "run_id", run_id);
  str(b, "group", group);
  if (progress_version) num(b, "progress_version", *progress_version);
  if (policy_json) json(b, "policy", policy_json, strlen(policy_json));
  lg__buf_puts(b, ",\"t_ms\":0}\n");
  return b->oom ? LG_ENOMEM : 0;
}
