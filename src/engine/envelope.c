/*
 * envelope.c — the terminal envelope (docs/engine.md, "The terminal envelope"): the machine-readable
 * record of how a run ended, written for the on-call engineer who reads it
 * at 3 a.m. as much as for the program that branches on it.
 *
 *   {"run_id","group","status","terminal_reason","guard","message",
 *    "next_allowed_action","alternatives":[...],"stopped_at_ms",
 *    "refused_call":{"tool","call_id","turn","fingerprint","key_material"},
 *    "question","partial","last_checkpoint","counters":{...},"operations":[{"key","state",
 *    "operation_id"}],"tried":[{"tool","fingerprint","count","last"}]}
 *
 * It is built from the run alone: pure, like the rest of the engine.
 */
#include "engine.h"

static const char *op_state_name(int s) {
  switch (s) {
  case LG__RUNOP_CLAIMED: return "claimed";
  case LG__RUNOP_COMMITTED: return "committed";
  case LG__RUNOP_FAILED: return "failed";
  case LG__RUNOP_RELEASED: return "released";
  case LG__RUNOP_REPLAYED: return "replayed";
  }
  return "unknown";
}

static const char *outcome_name(int o) {
  switch (o) {
  case LG__OUT_EXECUTED: return "executed";
  case LG__OUT_BLOCKED: return "blocked";
  case LG__OUT_REPLAYED: return "replayed";
  }
  const char *s = lg_status_name((lg_status_t)o);
  return *s ? s : "invalid";
}

void lg__alternatives_json(lg__buf_t *b, unsigned alternatives) {
  static const struct {
    unsigned bit;
    const char *name;
  } alts[] = {{LG_ALT_ASK_HUMAN, "ask_human"},
              {LG_ALT_SKIP_CURRENT, "skip_current"},
              {LG_ALT_FINALIZE_PARTIAL, "finalize_partial"},
              {LG_ALT_ESCALATE_MODEL, "escalate_model"}};
  lg__buf_putc(b, '[');
  bool first = true;
  for (size_t i = 0; i < LG__ARRAY_LEN(alts); i++) {
    if (!(alternatives & alts[i].bit)) continue;
    lg__buf_printf(b, "%s\"%s\"", first ? "" : ",", alts[i].name);
    first = false;
  }
  lg__buf_putc(b, ']');
}

/* The call the stop refused, or null. */
static void refused_call_json(lg__buf_t *b, const lg_run_t *run) {
  if (!run->refused_tool) {
    lg__buf_puts(b, "null");
    return;
  }
  lg__buf_puts(b, "{\"tool\":");
  lg__buf_json_str_or_null(b, run->refused_tool);
  lg__buf_puts(b, ",\"call_id\":");
  lg__buf_json_str_or_null(b, run->refused_call_id);
  lg__buf_printf(b, ",\"turn\":%lld,\"fingerprint\":\"%s\",\"key_material\":",
                 (long long)run->refused_turn, run->refused_fp);
  /* Key material is canonical JSON; it is embedded as a string because a
   * truncated document would not be JSON. */
  lg__buf_json_str_or_null(b, run->refused_km);
  lg__buf_putc(b, '}');
}

void lg__counters_json(lg__buf_t *b, const lg_counters_t *c) {
  lg__buf_printf(b,
                 "{\"steps\":%lld,\"calls\":%lld,\"blocked\":%lld,\"replayed\":%lld,"
                 "\"results\":%lld,\"model_calls\":%lld,\"tokens\":%lld,\"handoffs\":%lld,"
                 "\"cost_usd\":",
                 (long long)c->steps, (long long)c->calls, (long long)c->blocked,
                 (long long)c->replayed, (long long)c->results, (long long)c->model_calls,
                 (long long)c->tokens, (long long)c->handoffs);
  lg__buf_usd(b, c->cost_nusd);
  lg__buf_printf(b, ",\"elapsed_ms\":%lld}", (long long)c->last_t_ms);
}

char *lg_counters_to_json(const lg_counters_t *c) {
  if (!c) return NULL;
  lg__buf_t b = {0};
  lg__counters_json(&b, c);
  return lg__buf_steal(&b, NULL);
}

/* The run's operations: key, state, operation_id. */
static void operations_json(lg__buf_t *b, const lg_run_t *run) {
  lg__buf_putc(b, '[');
  for (int i = 0; i < run->nops; i++) {
    lg__buf_puts(b, i ? ",{\"key\":" : "{\"key\":");
    lg__buf_json_str_or_null(b, run->ops[i].key);
    lg__buf_printf(b, ",\"state\":\"%s\",\"operation_id\":", op_state_name(run->ops[i].state));
    lg__buf_json_str_or_null(b, run->ops[i].operation_id);
    lg__buf_putc(b, '}');
  }
  lg__buf_putc(b, ']');
}

/* The calls tried, most asked-for first: that is where the loop is. */
static void tried_json(lg__buf_t *b, const lg_run_t *run) {
  int order[LG__TRIED_MAX];
  for (int i = 0; i < run->ntried; i++) order[i] = i;
  for (int i = 1; i < run->ntried; i++) {
    int x = order[i], j = i;
    while (j > 0 && run->tried[order[j - 1]].count < run->tried[x].count) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = x;
  }
  lg__buf_putc(b, '[');
  for (int k = 0; k < run->ntried; k++) {
    const lg__tried_t *t = &run->tried[order[k]];
    char hex[LG_FP_HEX];
    memcpy(hex, t->hex, 64);
    hex[64] = 0;
    lg__buf_puts(b, k ? ",{\"tool\":" : "{\"tool\":");
    const char *tn = t->tool >= 0 && t->tool < run->ntools ? run->tools[t->tool].name : "?";
    lg__buf_json_str_or_null(b, tn);
    lg__buf_printf(b, ",\"fingerprint\":\"%s\",\"count\":%u,\"last\":\"%s\"}", hex, t->count,
                   outcome_name(t->last));
  }
  lg__buf_putc(b, ']');
}

char *lg_run_envelope_json(const lg_run_t *run) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"run_id\":");
  lg__buf_json_str_or_null(&b, run->run_id);
  lg__buf_puts(&b, ",\"group\":");
  lg__buf_json_str_or_null(&b, run->group);
  lg__buf_printf(&b, ",\"status\":\"%s\",\"terminal_reason\":", run->stopped ? "stopped" : "active");
  lg__buf_json_str_or_null(&b, lg_run_terminal_reason(run));
  lg__buf_puts(&b, ",\"operator_note\":");
  lg__buf_json_str_or_null(&b, run->stopped ? run->reason_text : NULL);
  lg__buf_puts(&b, ",\"guard\":");
  lg__buf_json_str_or_null(&b, run->stopped ? run->guard : NULL);
  lg__buf_puts(&b, ",\"message\":");
  lg__buf_json_str_or_null(&b, run->stopped ? run->stop_message : NULL);
  lg__buf_puts(&b, ",\"next_allowed_action\":");
  lg__buf_json_str_or_null(&b, run->stopped ? lg_next_name(run->next) : NULL);
  lg__buf_puts(&b, ",\"alternatives\":");
  lg__alternatives_json(&b, run->stopped ? run->alternatives : 0);
  lg__buf_puts(&b, ",\"stopped_at_ms\":");
  if (run->stopped) lg__buf_printf(&b, "%lld", (long long)run->stopped_at_ms);
  else lg__buf_puts(&b, "null");
  lg__buf_puts(&b, ",\"refused_call\":");
  refused_call_json(&b, run);
  /* The cascade's way out: what the model asked a person, or the partial
   * answer it finished with (its canonical arguments; a string when they
   * were too long to keep whole). */
  for (int k = LG__ANS_QUESTION; k <= LG__ANS_PARTIAL; k++) {
    lg__buf_puts(&b, k == LG__ANS_QUESTION ? ",\"question\":" : ",\"partial\":");
    if (run->answer && run->answer_kind == k && !run->answer_trunc) lg__buf_puts(&b, run->answer);
    else lg__buf_json_str_or_null(&b, run->answer && run->answer_kind == k ? run->answer : NULL);
  }
  lg__buf_puts(&b, ",\"last_checkpoint\":");
  if (run->has_best) lg__buf_printf(&b, "%lld", (long long)run->best);
  else lg__buf_puts(&b, "null");
  lg__buf_puts(&b, ",\"counters\":");
  lg__counters_json(&b, &run->c);
  lg__buf_puts(&b, ",\"operations\":");
  operations_json(&b, run);
  lg__buf_puts(&b, ",\"tried\":");
  tried_json(&b, run);
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}
