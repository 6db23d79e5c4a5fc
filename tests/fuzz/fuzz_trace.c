/*
 * fuzz_trace.c — libFuzzer target: lg_replay_buffer() on arbitrary bytes.
 *
 * A trace is untrusted input (it may come from anyone's incident report),
 * so the reader, the policy parser inside run events, the canonicaliser,
 * the engine and the envelope all see fuzzed data here. The callback reads
 * every field of every event and of the summary (so that ASan sees any
 * dangling or unterminated string) and checks what must hold whatever the
 * input:
 *   - an acted event's action is one its type can have; a call has a
 *     64-hex fingerprint; every reason but execute/continue is named;
 *   - the summary's counts are consistent and its envelope is JSON
 *     (names in it come from the trace, which the reader validated);
 *   - a replay that returns an error fills err with that code.
 * Inputs whose size is a multiple of 7 are replayed with a policy override
 * (loop keys, side effects, small caps), so that path is fuzzed too.
 *
 *   cmake -S . -B build-fuzz -DLG_FUZZ=ON -DCMAKE_C_COMPILER=clang
 *   make -C build-fuzz fuzz_trace fuzz_trace_corpus
 *   build-fuzz/tests/fuzz_trace build-fuzz/tests/corpus/fuzz_trace -max_total_time=120
 * (the corpus the build assembles: tests/fuzz/corpus/fuzz_trace/ and the
 * field incidents of tests/data/fixtures/).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loopguard.h"

static lg_policy_t *g_override;

#define CHECK(c)                                                         \
  do {                                                                   \
    if (!(c)) {                                                          \
      fprintf(stderr, "fuzz_trace: check failed: %s (line %d)\n", #c, __LINE__); \
      abort();                                                           \
    }                                                                    \
  } while (0)

static volatile size_t g_sink; /* keeps the reads below from being optimised out */

static void touch(const char *s) {
  if (s) g_sink += strlen(s);
}

typedef struct state {
  long last_line;
  long events;
} state_t;

static int on_event(void *ud, const lg_replay_event_t *e, const lg_replay_summary_t *s) {
  state_t *st = ud;
  if (e) {
    st->events++;
    CHECK(e->line > 0);
    CHECK(e->line >= st->last_line); /* in order */
    st->last_line = e->line;
    touch(e->trace);
    touch(e->tool);
    touch(e->model);
    touch(e->from);
    touch(e->to);
    /* a type the library names (not a range that went stale when
     * text, user, ..., stop were added after cancel) */
    CHECK(e->type >= LG_EV_RUN && *lg_event_type_name(e->type));
    touch(lg_event_type_name(e->type));
    if (e->skipped) CHECK(!e->acted && e->type == LG_EV_RESULT);
    if (!e->acted) return 0;
    const lg_decision_t *d = &e->decision;
    CHECK(strcmp(lg_action_name(d->action), "?") != 0); /* observe came after continue */
    touch(lg_action_name(d->action));
    touch(lg_reason_name(d->reason));
    touch(d->reason_text);
    touch(d->guard);
    touch(d->call_id);
    touch(d->idempotency_key);
    touch(d->message);
    touch(d->hide_tool);
    touch(lg_next_name(d->next_allowed_action));
    for (size_t i = 0; d->saved_result && i < d->saved_result_len; i++) g_sink += (unsigned char)d->saved_result[i];
    if (d->action != LG_ACT_EXECUTE && d->action != LG_ACT_CONTINUE && d->action != LG_ACT_REPLAY)
      CHECK(d->reason != LG_R_NONE && d->reason_text && *d->reason_text);
    switch (e->type) {
    case LG_EV_CALL:
      CHECK(e->tool && *e->tool);
      CHECK(d->action != LG_ACT_CONTINUE);
      CHECK(strlen(d->fingerprint) == 64);
      for (int i = 0; i < 64; i++)
        CHECK((d->fingerprint[i] >= '0' && d->fingerprint[i] <= '9') ||
              (d->fingerprint[i] >= 'a' && d->fingerprint[i] <= 'f'));
      if (d->action == LG_ACT_REPLAY) CHECK(d->idempotency_key != NULL);
      break;
    case LG_EV_RESULT:
    case LG_EV_STATE:
      CHECK(d->action == LG_ACT_CONTINUE || d->action == LG_ACT_STOP);
      break;
    case LG_EV_MODEL:
    case LG_EV_HANDOFF:
      CHECK(d->action == LG_ACT_EXECUTE || d->action == LG_ACT_STOP);
      break;
    case LG_EV_CANCEL: CHECK(d->action == LG_ACT_STOP); break;
    default: break;
    }
    return 0;
  }
  touch(s->trace);
  touch(s->run_id);
  touch(s->terminal_reason);
  CHECK(s->run_id && *s->run_id);
  CHECK(s->executed_calls >= 0 && s->blocked_calls >= 0 && s->replayed_calls >= 0);
  CHECK(s->model_calls >= 0 && s->cost_nusd >= 0 && s->tokens >= 0 && s->events_after_stop >= 0);
  CHECK((s->terminal_reason != NULL) == (s->stopped_at_line > 0)); /* a stop is on a line */
  if (!s->terminal_reason) CHECK(s->events_after_stop == 0);
  CHECK(s->envelope != NULL);
  json_error_t je;
  json_t *env = json_loads(s->envelope, JSON_REJECT_DUPLICATES, &je);
  if (!env) fprintf(stderr, "fuzz_trace: envelope is not JSON (%s): %.500s\n", je.text, s->envelope);
  CHECK(env != NULL);
  json_t *tr = json_object_get(env, "terminal_reason");
  CHECK(s->terminal_reason ? json_is_string(tr) && !strcmp(json_string_value(tr), s->terminal_reason)
                           : json_is_null(tr));
  json_t *c = json_object_get(env, "counters");
  CHECK(json_is_object(c));
  CHECK(json_integer_value(json_object_get(c, "steps")) == s->executed_calls);
  json_decref(env);
  return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  static const char pol[] =
      "{\"limits\":{\"max_steps\":20,\"max_cost_usd\":0.001,\"max_tokens\":5000,\"max_handoffs\":2},"
      "\"repeat\":{\"observe\":2,\"block\":3,\"stop\":5,\"window\":6},\"cycle\":{\"max_period\":3},"
      "\"tools\":{\"charge_invoice\":{\"loop_key\":{\"invoice_id\":[\"digits\"]},\"side_effects\":true,\"max_calls\":4},"
      "\"search\":{\"loop_key\":{\"q\":[\"lower\",\"trim\",\"collapse_space\"]}},\"lookup\":{\"loop_key\":[\"customer_id\"]},"
      "\"poll\":{\"loop_key\":false},\"sh\":{\"empty_ok\":true}}}";
  g_override = lg_policy_parse(pol, sizeof pol - 1, "override", NULL);
  if (!g_override) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  state_t st = {0, 0};
  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -1;
  lg_policy_t *p = size % 7 == 0 ? g_override : NULL;
  int rc = lg_replay_buffer("fuzz.jsonl", (const char *)data, size, p, on_event, &st, &err);
  if (rc) {
    CHECK(rc < 0);
    CHECK(err.code == rc);
    CHECK(err.line >= 0);
    char buf[1024];
    touch(lg_error_format(&err, buf, sizeof buf));
    touch(lg_strerror(rc));
  }
  return 0;
}
