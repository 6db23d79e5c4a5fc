/*
 * json.c — a decision as JSON, once: the members every answer that shows
 * a decision has (lg__decision_json, event.h). The server wraps them in
 * its answer (src/step/), replay in its --json records (src/trace/), so
 * that a run's live answers and the replay of its trace read the same.
 */
#include "event.h"

#include "../engine/engine.h"

#include <string.h>

int lg__decision_json(lg__buf_t *b, lg_event_type_t type, const lg_decision_t *d) {
  lg__buf_puts(b, "\"action\":\""); /* every decision: no printf */
  lg__buf_puts(b, lg_action_name(d->action));
  lg__buf_putc(b, '"');
  if (d->action != LG_ACT_EXECUTE && d->action != LG_ACT_CONTINUE) {
    const char *why = d->reason_text && *d->reason_text ? d->reason_text : NULL;
    if (!why && d->reason != LG_R_NONE) why = lg_reason_name(d->reason);
    lg__buf_json_kv(b, "reason", why);
  }
  lg__buf_json_kv(b, "operator_note", d->operator_note);
  if (d->guard && *d->guard) lg__buf_json_kv(b, "guard", d->guard);
  if (type == LG_EV_CALL && d->fingerprint[0]) { /* none: stopped by a deny rule */
    lg__buf_puts(b, ",\"fingerprint\":\"");
    lg__buf_puts(b, d->fingerprint);
    lg__buf_puts(b, "\",\"repeat\":");
    lg__buf_i64(b, d->repeat);
    lg__buf_json_kv(b, "idempotency_key", d->idempotency_key);
  }
  lg__buf_json_kv(b, "message", d->message);
  if (d->hide_tool) {
    lg__buf_puts(b, ",\"hide_tools\":[");
    lg__buf_json_str(b, d->hide_tool, strlen(d->hide_tool));
    lg__buf_putc(b, ']');
    lg__buf_json_key(b, "hide_turns");
    lg__buf_i64(b, d->hide_turns);
  }
  if (d->escalate_model) { /* cascade.escalate: a block, and the model calls it lasts */
    lg__buf_json_kv(b, "escalate_model", d->escalate_model);
    lg__buf_json_key(b, "escalate_turns");
    lg__buf_i64(b, d->escalate_turns);
  }
  if (d->alternatives && type == LG_EV_MODEL && d->action == LG_ACT_EXECUTE) {
    lg__buf_puts(b, ",\"offer\":"); /* cascade.offer: the tools this model call is offered */
    lg__alternatives_json(b, d->alternatives);
  }
  if (d->alternatives && d->action != LG_ACT_EXECUTE) {
    lg__buf_puts(b, ",\"alternatives\":");
    lg__alternatives_json(b, d->alternatives);
  }
  if (d->action == LG_ACT_REPLAY) {
    lg__buf_puts(b, ",\"saved_result\":");
    if (d->saved_result && d->saved_result_len) lg__buf_append(b, d->saved_result, d->saved_result_len);
    else lg__buf_puts(b, "null");
  }
  if (d->action == LG_ACT_STOP)
    lg__buf_printf(b, ",\"next_allowed_action\":\"%s\"", lg_next_name(d->next_allowed_action));
  return b->oom ? LG_ENOMEM : 0;
}

char *lg_decision_to_json(lg_event_type_t type, const lg_decision_t *d) {
  if (!d) return NULL;
  lg__buf_t b = {0};
  lg__buf_putc(&b, '{');
  lg__decision_json(&b, type, d);
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}
