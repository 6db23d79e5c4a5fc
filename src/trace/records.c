/*
 * records.c — replay's --json records (trace-v1, "Replay"): one per
 * acted event, with the decision written by the one decision printer
 * (lg__decision_json, src/event/json.c), and one summary per trace. The
 * CLI and the tests print replays through these two functions.
 */
#include "trace.h"

#include "../event/event.h"

int lg_replay_event_json(const lg_replay_event_t *ev, char **json) {
  *json = NULL;
  /* trace-v1 lists the records: no state records (a stop by a snapshot
   * shows in the summary), none for skipped results, none for the usage
   * lines that settle a model call the server let through (the model
   * record is the decision). */
  if (!ev->acted || ev->type == LG_EV_STATE || ev->type == LG_EV_USAGE) return 0;
  const lg_decision_t *d = &ev->decision;
  lg__buf_t b = {0};
  lg__buf_printf(&b, "{\"line\":%ld,\"type\":\"%s\",", ev->line, lg_event_type_name(ev->type));
  if (ev->type == LG_EV_CALL) {
    lg__buf_puts(&b, "\"tool\":");
    lg__buf_json_str_or_null(&b, ev->tool);
    lg__buf_putc(&b, ',');
    if (d->call_id) {
      lg__buf_puts(&b, "\"call_id\":");
      lg__buf_json_str_or_null(&b, d->call_id);
      lg__buf_putc(&b, ',');
    }
  }
  lg__decision_json(&b, ev->type, d);
  lg__buf_putc(&b, '}');
  *json = lg__buf_steal(&b, NULL);
  return *json ? 0 : LG_ENOMEM;
}

char *lg_replay_summary_json(const lg_replay_summary_t *s) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"type\":\"summary\",\"trace\":");
  lg__buf_json_str_or_null(&b, s->trace);
  lg__buf_puts(&b, ",\"run_id\":");
  lg__buf_json_str_or_null(&b, s->run_id);
  lg__buf_puts(&b, ",\"terminal_reason\":");
  lg__buf_json_str_or_null(&b, s->terminal_reason);
  if (s->stopped_at_line) lg__buf_printf(&b, ",\"stopped_at_line\":%ld", s->stopped_at_line);
  else lg__buf_puts(&b, ",\"stopped_at_line\":null");
  lg__buf_printf(&b,
                 ",\"executed_calls\":%lld,\"blocked_calls\":%lld,\"replayed_calls\":%lld,"
                 "\"model_calls\":%lld,\"cost_usd\":",
                 (long long)s->executed_calls, (long long)s->blocked_calls,
                 (long long)s->replayed_calls, (long long)s->model_calls);
  lg__buf_usd(&b, s->cost_nusd);
  lg__buf_printf(&b, ",\"tokens\":%lld,\"events_after_stop\":%lld,\"envelope\":", (long long)s->tokens,
                 (long long)s->events_after_stop);
  lg__buf_puts(&b, s->envelope ? s->envelope : "null");
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}
