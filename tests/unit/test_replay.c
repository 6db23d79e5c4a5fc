/*
 * test_replay.c — the trace-v1 reader and the replay contract, through
 * lg_replay_buffer() (and lg_replay_file() for files).
 *
 * Each test writes a small trace, replays it with a callback that copies
 * every event and the summary into a record, and checks what the reader
 * accepted or refused (with the error's line, field and byte offset) and
 * what the guard decided. The cost-cap tests replay the billing incident of
 * tests/data/fixtures with a policy override and compare the cap with the
 * settled total, computed here from the trace itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <math.h>

#include "loopguard.h"

/* ------------------------------------------------------------------ */
/* Recording a replay.                                                  */

#define MAXEV 512

typedef struct ev {
  long line;
  lg_event_type_t type;
  int acted, skipped;
  lg_action_t action;
  lg_reason_t reason;
  char reason_text[64];
  char call_id[32];
  char tool[32];
  uint32_t repeat;
  char fp[LG_FP_HEX];
} ev_t;

typedef struct rec {
  ev_t ev[MAXEV];
  int n;
  int nsum;
  char trace[256];
  char run_id[128];
  char terminal_reason[64]; /* "" when NULL */
  bool has_terminal;
  long stopped_at_line;
  int64_t executed, blocked, replayed, model_calls, cost_nusd, tokens, after_stop;
  json_t *envelope;
} rec_t;

static int on_event(void *ud, const lg_replay_event_t *e, const lg_replay_summary_t *s) {
  rec_t *r = ud;
  if (e) {
    if (r->n >= MAXEV) return 0;
    ev_t *x = &r->ev[r->n++];
    memset(x, 0, sizeof *x);
    x->line = e->line;
    x->type = e->type;
    x->acted = e->acted;
    x->skipped = e->skipped;
    if (e->tool) snprintf(x->tool, sizeof x->tool, "%s", e->tool);
    if (e->acted) {
      x->action = e->decision.action;
      x->reason = e->decision.reason;
      snprintf(x->reason_text, sizeof x->reason_text, "%s",
               e->decision.reason_text ? e->decision.reason_text : "");
      if (e->decision.call_id) snprintf(x->call_id, sizeof x->call_id, "%s", e->decision.call_id);
      x->repeat = e->decision.repeat;
      memcpy(x->fp, e->decision.fingerprint, LG_FP_HEX);
    }
    return 0;
  }
  r->nsum++;
  snprintf(r->trace, sizeof r->trace, "%s", s->trace ? s->trace : "");
  snprintf(r->run_id, sizeof r->run_id, "%s", s->run_id ? s->run_id : "");
  r->has_terminal = s->terminal_reason != NULL;
  snprintf(r->terminal_reason, sizeof r->terminal_reason, "%s", s->terminal_reason ? s->terminal_reason : "");
  r->stopped_at_line = s->stopped_at_line;
  r->executed = s->executed_calls;
  r->blocked = s->blocked_calls;
  r->replayed = s->replayed_calls;
  r->model_calls = s->model_calls;
  r->cost_nusd = s->cost_nusd;
  r->tokens = s->tokens;
  r->after_stop = s->events_after_stop;
  json_decref(r->envelope);
  json_error_t je;
  r->envelope = json_loads(s->envelope, JSON_REJECT_DUPLICATES, &je);
  if (!r->envelope) fail_msg("summary envelope is not JSON: %s", je.text);
  return 0;
}

static lg_policy_t *pol(const char *json) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(json, strlen(json), "test", &err);
  if (!p) fail_msg("policy %s: %s", json, err.message);
  return p;
}

static rec_t *new_rec(void) {
  rec_t *r = calloc(1, sizeof *r);
  assert_non_null(r);
  return r;
}
static void free_rec(rec_t *r) {
  json_decref(r->envelope);
  free(r);
}

/* Replays `text` (policy override `pjson`, may be NULL); returns the code. */
static int replay(const char *name, const char *text, const char *pjson, rec_t *r, lg_error_t *err) {
  lg_policy_t *p = pjson ? pol(pjson) : NULL;
  memset(err, 0, sizeof *err);
  err->offset = -1;
  int rc = lg_replay_buffer(name, text, strlen(text), p, on_event, r, err);
  lg_policy_free(p);
  return rc;
}
/* Replays a trace that must be read without error. */
static rec_t *replay_ok(const char *text, const char *pjson) {
  rec_t *r = new_rec();
  lg_error_t err;
  int rc = replay("t.jsonl", text, pjson, r, &err);
  if (rc) {
    char buf[1024];
    fail_msg("replay failed: %s: %s", lg_err_name(rc), lg_error_format(&err, buf, sizeof buf));
  }
  assert_int_equal(r->nsum, 1);
  return r;
}
/* Replays a trace that must fail with `code` at `line`, naming `field`
 * (NULL: not checked). Returns the error. */
static lg_error_t replay_err(const char *text, int code, long line, const char *field) {
  rec_t *r = new_rec();
  lg_error_t err;
  int rc = replay("bad.jsonl", text, NULL, r, &err);
  if (rc != code) fail_msg("expected %s, got %s (%s) for:\n%s", lg_err_name(code), lg_err_name(rc), err.message, text);
  assert_int_equal(err.code, code);
  if (err.line != line) fail_msg("error on line %ld, expected %ld: %s", err.line, line, err.message);
  assert_string_equal(err.source, "bad.jsonl");
  if (field && strcmp(err.field, field)) fail_msg("error names field \"%s\", expected \"%s\"", err.field, field);
  assert_true(err.message[0] != 0);
  assert_int_equal(r->nsum, 0); /* no summary for a trace that could not be read */
  free_rec(r);
  return err;
}

static const ev_t *ev_at(const rec_t *r, long line) {
  for (int i = 0; i < r->n; i++)
    if (r->ev[i].line == line) return &r->ev[i];
  return NULL;
}
static const ev_t *must_ev(const rec_t *r, long line) {
  const ev_t *e = ev_at(r, line);
  if (!e) fail_msg("no event for line %ld", line);
  return e;
}

#define RUN "{\"type\":\"run\",\"run_id\":\"r\"}\n"
#define CALL(tool, turn) "{\"type\":\"call\",\"turn\":" #turn ",\"tool\":\"" tool "\",\"args\":{\"q\":1}}\n"
#define OK "{\"type\":\"result\",\"status\":\"progress\"}\n"

/* ------------------------------------------------------------------ */
/* The reader.                                                          */

static void t_blank_and_comments(void **state) {
  (void)state;
  rec_t *r = replay_ok("\n"
                       "   \n"
                       "# a comment\n"
                       "   # an indented comment with {\"type\":\"call\"}\n" RUN
                       "\t\n" CALL("a", 1) "\r\n" OK,
                       NULL);
  assert_int_equal(r->n, 2);
  assert_int_equal(r->ev[0].line, 7);
  assert_int_equal(r->ev[0].type, LG_EV_CALL);
  assert_int_equal(r->ev[0].action, LG_ACT_EXECUTE);
  assert_int_equal(r->ev[1].line, 9);
  assert_int_equal(r->ev[1].type, LG_EV_RESULT);
  assert_int_equal(r->ev[1].action, LG_ACT_CONTINUE);
  assert_string_equal(r->run_id, "r");
  assert_int_equal(r->executed, 1);
  free_rec(r);
  /* No final newline, CRLF line ends. */
  r = replay_ok(RUN "{\"type\":\"call\",\"tool\":\"a\"}\r\n{\"type\":\"result\",\"status\":\"progress\"}", NULL);
  assert_int_equal(r->n, 2);
  assert_int_equal(r->ev[1].action, LG_ACT_CONTINUE);
  free_rec(r);
}

static void t_unknown_types_and_fields(void **state) {
  (void)state;
  const char *plain = RUN CALL("a", 1) OK CALL("a", 2) OK CALL("a", 3);
  const char *noisy =
      "{\"type\":\"run\",\"run_id\":\"r\",\"writer\":{\"v\":[1,2,{\"x\":null}]}}\n"
      "{\"type\":\"telemetry\",\"cpu\":0.5,\"tool\":5}\n"
      "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"args\":{\"q\":1},\"latency_ms\":12,\"tags\":[\"x\"]}\n"
      "{\"type\":\"result\",\"status\":\"progress\",\"trace_id\":\"abc\"}\n"
      "{\"type\":\"future_event\"}\n"
      "{\"type\":\"call\",\"turn\":2,\"tool\":\"a\",\"args\":{\"q\":1},\"\\u0074ool2\":1}\n"
      "{\"type\":\"result\",\"status\":\"progress\",\"extra\":{}}\n"
      "{\"type\":\"call\",\"turn\":3,\"tool\":\"a\",\"args\":{\"q\":1}}\n";
  rec_t *a = replay_ok(plain, NULL), *b = replay_ok(noisy, NULL);
  /* The same decisions, event for event. */
  int na = 0, nb = 0;
  for (int i = 0; i < a->n; i++)
    if (a->ev[i].type == LG_EV_CALL) na++;
  for (int i = 0; i < b->n; i++)
    if (b->ev[i].type == LG_EV_CALL) nb++;
  assert_int_equal(na, 3);
  assert_int_equal(nb, 3);
  const ev_t *last_a = NULL, *last_b = NULL;
  for (int i = 0; i < a->n; i++)
    if (a->ev[i].type == LG_EV_CALL) last_a = &a->ev[i];
  for (int i = 0; i < b->n; i++)
    if (b->ev[i].type == LG_EV_CALL) last_b = &b->ev[i];
  assert_int_equal(last_a->action, LG_ACT_BLOCK);
  assert_int_equal(last_b->action, LG_ACT_BLOCK);
  assert_string_equal(last_a->fp, last_b->fp);
  assert_int_equal(last_b->repeat, 3);
  /* Unknown types are not events. */
  assert_null(ev_at(b, 2));
  assert_null(ev_at(b, 5));
  free_rec(a);
  free_rec(b);
}

static void t_wrong_types(void **state) {
  (void)state;
  static const struct {
    const char *line;
    const char *field;
  } cases[] = {
      {"{\"type\":\"call\",\"turn\":\"1\",\"tool\":\"a\"}", "turn"},
      {"{\"type\":\"call\",\"turn\":1,\"tool\":5}", "tool"},
      {"{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"args\":[1]}", "args"},
      {"{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"args\":\"{}\"}", "args"},
      {"{\"type\":\"call\",\"turn\":1.5,\"tool\":\"a\"}", "turn"},
      {"{\"type\":\"call\",\"tool\":\"a\",\"call_id\":7}", "call_id"},
      {"{\"type\":\"call\",\"tool\":\"a\",\"idempotency_key\":true}", "idempotency_key"},
      {"{\"type\":\"call\",\"tool\":\"a\",\"t_ms\":\"5\"}", "t_ms"},
      {"{\"type\":\"result\",\"status\":1}", "status"},
      {"{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":\"2\"}", "progress_version"},
      {"{\"type\":\"result\",\"status\":\"progress\",\"side_effect_committed\":\"yes\"}", "side_effect_committed"},
      {"{\"type\":\"result\",\"status\":\"progress\",\"retry_after_ms\":null}", "retry_after_ms"},
      {"{\"type\":\"result\",\"status\":\"progress\",\"operation_id\":1}", "operation_id"},
      {"{\"type\":\"model\",\"turn\":1,\"input_tokens\":\"10\"}", "input_tokens"},
      {"{\"type\":\"model\",\"turn\":1,\"cost\":\"0.1\"}", "cost"},
      {"{\"type\":\"model\",\"turn\":1,\"model\":1}", "model"},
      {"{\"type\":\"state\",\"world\":[]}", "world"},
      {"{\"type\":\"state\"}", "world"},
      {"{\"type\":\"handoff\",\"from\":1,\"to\":\"b\"}", "from"},
      {"{\"type\":\"cancel\",\"reason\":5}", "reason"},
      {"{\"type\":5}", "type"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    /* A call before a result, so that results have someone to answer. */
    snprintf(text, sizeof text, RUN "\n" CALL("x", 1) "%s\n", cases[i].line);
    lg_error_t err = replay_err(text, LG_ETRACE, 4, cases[i].field);
    (void)err;
  }
  /* The run event's own fields. */
  replay_err("{\"type\":\"run\",\"run_id\":5}\n", LG_ETRACE, 1, "run_id");
  replay_err("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":[]}\n", LG_ETRACE, 1, "policy");
  replay_err("{\"type\":\"run\",\"run_id\":\"r\",\"progress_version\":\"1\"}\n", LG_ETRACE, 1, "progress_version");
  replay_err("{\"type\":\"run\",\"run_id\":\"r\",\"group\":[]}\n", LG_ETRACE, 1, "group");
  /* Required fields. */
  replay_err(RUN "{\"type\":\"call\",\"turn\":1}\n", LG_ETRACE, 2, "tool");
  replay_err(RUN "{\"turn\":1}\n", LG_ETRACE, 2, "type");
  replay_err("{\"type\":\"run\"}\n", LG_ETRACE, 1, "run_id");
}

static void t_malformed_json(void **state) {
  (void)state;
  static const struct {
    const char *line;
    long min_off, max_off; /* where the error may point, 0-based */
  } cases[] = {
      {"{\"type\":\"call\",\"tool\":\"a\",\"args\":{\"x\":}}", 33, 38},
      {"{\"type\":\"call\",\"tool\":\"a\"", 20, 26},
      {"{\"type\":\"call\",\"tool\":\"a\"}}", 25, 27},
      {"{\"type\":\"call\" \"tool\":\"a\"}", 14, 16},
      {"{\"type\":\"call\",\"tool\":\"a\",\"args\":{\"x\":1,}}", 36, 42},
      {"{\"type\":\"call\",\"tool\":\"a\",\"args\":{\"x\":tru}}", 33, 40},
      {"{\"type\":\"call\",\"tool\":\"a\",\"args\":{\"x\":\"\xc3(\"}}", 33, 42},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[512];
    snprintf(text, sizeof text, RUN "# c\n%s\n" CALL("b", 2), cases[i].line);
    rec_t *r = new_rec();
    lg_error_t err;
    int rc = replay("m.jsonl", text, NULL, r, &err);
    if (rc >= 0) fail_msg("accepted: %s", cases[i].line);
    if (err.line != 3) fail_msg("%s: line %ld, expected 3", cases[i].line, err.line);
    assert_string_equal(err.source, "m.jsonl");
    if (err.offset < cases[i].min_off || err.offset > cases[i].max_off)
      fail_msg("%s: offset %ld, expected %ld..%ld (%s)", cases[i].line, err.offset, cases[i].min_off,
               cases[i].max_off, err.message);
    /* The formatted message names file, line and where. */
    char buf[1024];
    lg_error_format(&err, buf, sizeof buf);
    assert_non_null(strstr(buf, "m.jsonl:3"));
    assert_non_null(strstr(buf, "byte"));
    assert_int_equal(r->nsum, 0);
    free_rec(r);
  }
  /* Not an object at all. */
  replay_err(RUN "[1,2]\n", LG_ETRACE, 2, NULL);
  lg_error_t e = replay_err(RUN "nonsense\n", LG_ETRACE, 2, NULL);
  assert_true(e.offset >= 0);
  /* A field twice. */
  replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"tool\":\"b\"}\n", LG_EDUPKEY, 2, "tool");
  /* The buffer ends right after a key's colon (found by fuzz_trace: the
   * reader looked one byte past the end). The bytes are copied to a heap
   * block of their exact size, so ASan sees any read beyond it. */
  static const char *cut[] = {"{\"args\":\t\t", "{\"type\":\"call\",\"tool\":\"a\",\"args\":",
                              "{\"type\":\"result\",\"value\":", "{\"type\":\"state\",\"world\": ",
                              "{\"x\":", "{\"type\":", "{\"type\":\"call\",\"tool\":", "{\"type\":\"call\",\"tool\""};
  for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
    size_t n = strlen(cut[i]);
    char *b = malloc(n);
    memcpy(b, cut[i], n);
    lg_error_t err;
    memset(&err, 0, sizeof err);
    int rc = lg_replay_buffer("cut.jsonl", b, n, NULL, NULL, NULL, &err);
    free(b);
    if (rc >= 0) fail_msg("accepted the cut line %s", cut[i]);
    assert_int_equal(err.line, 1);
  }
}

static void t_run_not_first(void **state) {
  (void)state;
  replay_err(CALL("a", 1) RUN, LG_ETRACE, 2, NULL);
  replay_err(RUN RUN, LG_ETRACE, 2, NULL);
  /* A comment or an unknown type before it is fine. */
  rec_t *r = replay_ok("# hello\n{\"type\":\"meta\"}\n" RUN CALL("a", 1), NULL);
  assert_string_equal(r->run_id, "r");
  free_rec(r);
}

static void t_policy_in_run_event(void **state) {
  (void)state;
  const char *t = "# x\n{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"repeat\":{\"blok\":3}}}\n" CALL("a", 1);
  lg_error_t err = replay_err(t, LG_EPOLICY, 2, NULL);
  assert_non_null(strstr(err.field, "repeat.blok"));
  assert_string_equal(err.field, "policy.repeat.blok");
  err = replay_err("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"limits\":{\"max_steps\":\"10\"}}}\n",
                   LG_EPOLICY, 1, "policy.limits.max_steps");
  err = replay_err("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"tools\":{\"a\":{\"loop_kye\":false}}}}\n",
                   LG_EPOLICY, 1, NULL);
  assert_non_null(strstr(err.field, "loop_kye"));
  /* A valid one applies: block off, so the 3rd identical call runs. */
  rec_t *r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"repeat\":{\"block\":false}}}\n" CALL("a", 1) OK
                           CALL("a", 2) OK CALL("a", 3),
                       NULL);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_EXECUTE);
  free_rec(r);
}

static void t_policy_override(void **state) {
  (void)state;
  const char *t = "{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"repeat\":{\"block\":false}}}\n" CALL("a", 1) OK
      CALL("a", 2) OK CALL("a", 3);
  rec_t *r = replay_ok(t, NULL);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_EXECUTE);
  free_rec(r);
  r = replay_ok(t, "{}"); /* the default policy, given as an override */
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_BLOCK);
  free_rec(r);
  r = replay_ok(t, "{\"repeat\":{\"observe\":false,\"block\":false,\"stop\":2}}");
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_STOP);
  assert_string_equal(r->terminal_reason, "same_call_repeat");
  free_rec(r);
  /* The override's loop keys apply to the fingerprints too. */
  const char *v = RUN "{\"type\":\"call\",\"tool\":\"c\",\"args\":{\"id\":\"INV-1\"}}\n" OK
                      "{\"type\":\"call\",\"tool\":\"c\",\"args\":{\"id\":\"inv1\"}}\n";
  r = replay_ok(v, NULL);
  assert_int_equal(must_ev(r, 4)->repeat, 1);
  free_rec(r);
  r = replay_ok(v, "{\"tools\":{\"c\":{\"loop_key\":{\"id\":[\"digits\"]}}}}");
  assert_int_equal(must_ev(r, 4)->repeat, 2);
  assert_string_equal(must_ev(r, 2)->fp, must_ev(r, 4)->fp);
  free_rec(r);
}

static void t_t_ms(void **state) {
  (void)state;
  lg_error_t err = replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"t_ms\":100}\n"
                                  "{\"type\":\"result\",\"status\":\"progress\",\"t_ms\":99}\n",
                              LG_ETRACE, 3, "t_ms");
  (void)err;
  /* Equal is fine; an event without t_ms is at the previous time. */
  rec_t *r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"limits\":{\"max_wall_ms\":1000}}}\n"
                       "{\"type\":\"call\",\"tool\":\"a\",\"t_ms\":999}\n"
                       "{\"type\":\"result\",\"status\":\"progress\",\"t_ms\":999}\n"
                       "{\"type\":\"call\",\"tool\":\"b\"}\n" /* at 999: runs */
                       "{\"type\":\"result\",\"status\":\"progress\"}\n"
                       "{\"type\":\"call\",\"tool\":\"c\",\"t_ms\":1000}\n",
                       NULL);
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_EXECUTE);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_STOP);
  assert_string_equal(r->terminal_reason, "wall_clock_cap");
  assert_int_equal(json_integer_value(json_object_get(r->envelope, "stopped_at_ms")), 1000);
  free_rec(r);
  /* Time may not go backwards even without a time on the event before. */
  replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"t_ms\":50}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
                 "{\"type\":\"call\",\"tool\":\"b\",\"t_ms\":10}\n",
             LG_ETRACE, 4, "t_ms");
}

static void t_skipped_results(void **state) {
  (void)state;
  /* The 3rd call is blocked: its result line is skipped, not acted on. */
  rec_t *r = replay_ok(RUN CALL("a", 1) OK CALL("a", 2) OK CALL("a", 3)
                           "{\"type\":\"result\",\"status\":\"fatal\"}\n" CALL("b", 4) OK,
                       NULL);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_BLOCK);
  const ev_t *e = must_ev(r, 7);
  assert_int_equal(e->type, LG_EV_RESULT);
  assert_int_equal(e->acted, 0);
  assert_int_equal(e->skipped, 1);
  assert_false(r->has_terminal); /* the fatal result was never run */
  assert_int_equal(must_ev(r, 8)->action, LG_ACT_EXECUTE);
  assert_int_equal(must_ev(r, 9)->action, LG_ACT_CONTINUE);
  assert_int_equal(r->executed, 3);
  assert_int_equal(r->blocked, 1);
  free_rec(r);
  /* By call id, out of order. */
  r = replay_ok(RUN "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"call_id\":\"x1\"}\n"
                    "{\"type\":\"result\",\"call_id\":\"x1\",\"status\":\"progress\"}\n"
                    "{\"type\":\"call\",\"turn\":2,\"tool\":\"a\",\"call_id\":\"x2\"}\n"
                    "{\"type\":\"call\",\"turn\":3,\"tool\":\"a\",\"call_id\":\"x3\"}\n"
                    "{\"type\":\"call\",\"turn\":3,\"tool\":\"b\",\"call_id\":\"x4\"}\n"
                    "{\"type\":\"result\",\"call_id\":\"x4\",\"status\":\"progress\"}\n"
                    "{\"type\":\"result\",\"call_id\":\"x3\",\"status\":\"fatal\"}\n"
                    "{\"type\":\"result\",\"call_id\":\"x2\",\"status\":\"progress\"}\n",
                NULL);
  assert_int_equal(must_ev(r, 5)->action, LG_ACT_BLOCK); /* x3: the 3rd a */
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_EXECUTE);
  assert_int_equal(must_ev(r, 7)->action, LG_ACT_CONTINUE);
  assert_string_equal(must_ev(r, 7)->call_id, "x4");
  assert_int_equal(must_ev(r, 8)->skipped, 1);
  assert_int_equal(must_ev(r, 9)->action, LG_ACT_CONTINUE);
  assert_string_equal(must_ev(r, 9)->call_id, "x2");
  assert_false(r->has_terminal);
  free_rec(r);
}

static void t_result_defaults_to_latest_call(void **state) {
  (void)state;
  rec_t *r = replay_ok(RUN "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"call_id\":\"first\"}\n"
                           "{\"type\":\"call\",\"turn\":1,\"tool\":\"b\",\"call_id\":\"second\"}\n"
                           "{\"type\":\"result\",\"status\":\"progress\"}\n"
                           "{\"type\":\"result\",\"call_id\":\"first\",\"status\":\"complete\"}\n",
                       NULL);
  assert_string_equal(must_ev(r, 4)->call_id, "second");
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_CONTINUE);
  assert_string_equal(must_ev(r, 5)->call_id, "first");
  assert_string_equal(r->terminal_reason, "complete");
  free_rec(r);
  /* Without ids: the engine names calls c1, c2, ... */
  r = replay_ok(RUN CALL("a", 1) CALL("b", 1) OK OK, NULL);
  assert_string_equal(must_ev(r, 2)->call_id, "c1");
  assert_string_equal(must_ev(r, 3)->call_id, "c2");
  assert_string_equal(must_ev(r, 4)->call_id, "c2");
  assert_string_equal(must_ev(r, 5)->call_id, "c1");
  free_rec(r);
  /* A result for no call at all is an error naming the line. */
  replay_err(RUN OK, LG_ENOTFOUND, 2, NULL);
  replay_err(RUN CALL("a", 1) "{\"type\":\"result\",\"call_id\":\"zz\",\"status\":\"progress\"}\n",
             LG_ENOTFOUND, 3, NULL);
}

static void t_events_after_stop(void **state) {
  (void)state;
  rec_t *r = replay_ok(RUN CALL("deploy", 1) "{\"type\":\"result\",\"status\":\"permission_denied\"}\n" CALL("deploy", 2)
                           "{\"type\":\"result\",\"status\":\"progress\"}\n"
                           "{\"type\":\"model\",\"turn\":3,\"input_tokens\":5,\"cost\":0.5}\n"
                           "{\"type\":\"state\",\"world\":{}}\n"
                           "{\"type\":\"telemetry\"}\n"
                           "# comment\n"
                           "{\"type\":\"cancel\"}\n",
                       NULL);
  assert_string_equal(r->terminal_reason, "permission_denied");
  assert_int_equal(r->stopped_at_line, 3);
  assert_int_equal(r->after_stop, 5); /* call, result, model, state, cancel */
  assert_int_equal(r->executed, 1);
  assert_int_equal(r->model_calls, 0);
  assert_int_equal(r->cost_nusd, 0);
  for (int i = 0; i < r->n; i++)
    if (r->ev[i].line > 3) assert_int_equal(r->ev[i].acted, 0);
  free_rec(r);
  /* After the stop lines must still be well-formed. */
  replay_err(RUN "{\"type\":\"cancel\"}\n{\"type\":\"call\",\"tool\":7}\n", LG_ETRACE, 3, "tool");
  /* A cancel with a reason. */
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"cancel\",\"reason\":\"ops said so\"}\n" CALL("a", 2), NULL);
  assert_string_equal(r->terminal_reason, "operator_cancelled_loop");
  assert_int_equal(must_ev(r, 3)->action, LG_ACT_STOP);
  assert_int_equal(r->stopped_at_line, 3);
  assert_int_equal(r->after_stop, 1);
  free_rec(r);
}

static void t_no_run_event(void **state) {
  (void)state;
  rec_t *r = new_rec();
  lg_error_t err;
  assert_int_equal(replay("logs/incident-7.jsonl", CALL("a", 1) OK, NULL, r, &err), 0);
  assert_string_equal(r->run_id, "incident-7");
  assert_string_equal(r->trace, "logs/incident-7.jsonl");
  assert_int_equal(r->executed, 1);
  assert_int_equal(must_ev(r, 1)->action, LG_ACT_EXECUTE);
  free_rec(r);
}

static void t_empty_trace(void **state) {
  (void)state;
  static const char *texts[] = {"", "\n\n", "# only a comment\n", "   \n# x\n\t\n"};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    rec_t *r = replay_ok(texts[i], NULL);
    assert_int_equal(r->n, 0);
    assert_false(r->has_terminal);
    assert_int_equal(r->stopped_at_line, 0);
    assert_int_equal(r->executed + r->blocked + r->replayed + r->model_calls + r->after_stop, 0);
    assert_true(r->run_id[0] != 0);
    assert_string_equal(json_string_value(json_object_get(r->envelope, "status")), "active");
    assert_true(json_is_null(json_object_get(r->envelope, "terminal_reason")));
    free_rec(r);
  }
  /* A run event alone. */
  rec_t *r = replay_ok(RUN, NULL);
  assert_string_equal(r->run_id, "r");
  assert_false(r->has_terminal);
  free_rec(r);
}

static void t_summary_counts(void **state) {
  (void)state;
  /* Replayed writes and blocked calls are counted apart. */
  const char *t = RUN
      "{\"type\":\"call\",\"turn\":1,\"tool\":\"w\",\"args\":{\"a\":1},\"idempotency_key\":\"k\"}\n"
      "{\"type\":\"result\",\"status\":\"progress\",\"value\":{\"ok\":1}}\n"
      "{\"type\":\"call\",\"turn\":2,\"tool\":\"w\",\"args\":{\"a\":1},\"idempotency_key\":\"k\"}\n"
      "{\"type\":\"result\",\"status\":\"progress\",\"value\":{\"ok\":1}}\n"
      "{\"type\":\"call\",\"turn\":3,\"tool\":\"w\",\"args\":{\"a\":2},\"idempotency_key\":\"k\"}\n"
      "{\"type\":\"handoff\",\"from\":\"a\",\"to\":\"b\"}\n";
  rec_t *r = replay_ok(t, NULL);
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_REPLAY);
  assert_int_equal(must_ev(r, 5)->skipped, 1);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_BLOCK);
  assert_string_equal(must_ev(r, 6)->reason_text, "idempotency_mismatch");
  assert_int_equal(must_ev(r, 7)->type, LG_EV_HANDOFF);
  assert_int_equal(must_ev(r, 7)->action, LG_ACT_EXECUTE);
  assert_int_equal(r->executed, 1);
  assert_int_equal(r->replayed, 1);
  assert_int_equal(r->blocked, 1);
  json_t *ops = json_object_get(r->envelope, "operations");
  assert_int_equal(json_array_size(ops), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ops, 0), "key")), "k");
  free_rec(r);
  /* The validation gate through the reader: null and blank values. */
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"progress\",\"value\":null}\n", NULL);
  assert_string_equal(r->terminal_reason, "invalid_tool_result");
  free_rec(r);
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"progress\",\"value\":\" \\t\\n \"}\n", NULL);
  assert_string_equal(r->terminal_reason, "invalid_tool_result");
  free_rec(r);
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"progress\",\"value\":\" x \"}\n", NULL);
  assert_false(r->has_terminal);
  free_rec(r);
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"finished\"}\n", NULL);
  assert_string_equal(r->terminal_reason, "invalid_tool_result");
  free_rec(r);
  r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\"}\n", NULL);
  assert_string_equal(r->terminal_reason, "invalid_tool_result");
  free_rec(r);
  r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"tools\":{\"a\":{\"empty_ok\":true}}}}\n" CALL("a", 1)
                "{\"type\":\"result\",\"status\":\"progress\",\"value\":\"\"}\n",
                NULL);
  assert_false(r->has_terminal);
  free_rec(r);
}

static void t_checkpoint_and_group(void **state) {
  (void)state;
  rec_t *r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"group\":\"g1\",\"progress_version\":10}\n" CALL("a", 1)
                       "{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":10}\n" CALL("a", 2)
                       "{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":9}\n" CALL("a", 3),
                       NULL);
  assert_int_equal(must_ev(r, 6)->action, LG_ACT_BLOCK); /* no progress since the checkpoint */
  assert_string_equal(json_string_value(json_object_get(r->envelope, "group")), "g1");
  assert_int_equal(json_integer_value(json_object_get(r->envelope, "last_checkpoint")), 10);
  free_rec(r);
}


/* Integers of known fields: JSON's grammar, and no silent wrap-around. */
static void t_number_edges(void **state) {
  (void)state;
  /* A leading zero is not JSON. */
  replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"turn\":01}\n", LG_EPARSE, 2, "turn");
  replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"turn\":-01}\n", LG_EPARSE, 2, "turn");
  /* Too big for 64 bits: an error, not a negative number. */
  lg_error_t e = replay_err(RUN "{\"type\":\"call\",\"tool\":\"a\",\"t_ms\":10000000000000000000}\n", LG_ETRACE, 2, "t_ms");
  (void)e;
  replay_err(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":46116860184273879040}\n",
             LG_ETRACE, 3, "progress_version");
  /* The largest that fit are fine, and so are whole numbers written as 1.0 / 1e3. */
  rec_t *r = replay_ok(RUN CALL("a", 1) "{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":9223372036854775807}\n"
                       "{\"type\":\"call\",\"turn\":2.0,\"tool\":\"b\",\"t_ms\":1e3}\n",
                       NULL);
  assert_int_equal(json_integer_value(json_object_get(r->envelope, "last_checkpoint")), INT64_MAX);
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_EXECUTE);
  free_rec(r);
}

/* ------------------------------------------------------------------ */
/* Model calls and cost.                                                */

static void t_model_counts(void **state) {
  (void)state;
  rec_t *r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"limits\":{\"max_model_calls\":2}}}\n"
                       "{\"type\":\"model\",\"turn\":1,\"input_tokens\":100,\"output_tokens\":20,\"cost\":0.001}\n"
                       "{\"type\":\"model\",\"turn\":2,\"input_tokens\":200,\"output_tokens\":30,\"cost\":0.002,\"model\":\"m\"}\n"
                       "{\"type\":\"model\",\"turn\":3,\"input_tokens\":400,\"output_tokens\":40,\"cost\":0.004}\n",
                       NULL);
  assert_string_equal(r->terminal_reason, "model_call_cap");
  assert_int_equal(r->stopped_at_line, 4);
  assert_int_equal(r->model_calls, 2);
  assert_int_equal(r->tokens, 350);
  assert_int_equal(r->cost_nusd, 3000000);
  assert_int_equal(must_ev(r, 2)->action, LG_ACT_EXECUTE);
  assert_int_equal(must_ev(r, 4)->action, LG_ACT_STOP);
  free_rec(r);
  /* Token cap on the worst case (max_tokens), before the call. */
  r = replay_ok("{\"type\":\"run\",\"run_id\":\"r\",\"policy\":{\"limits\":{\"max_tokens\":1000}}}\n"
                "{\"type\":\"model\",\"turn\":1,\"input_tokens\":400,\"output_tokens\":50,\"max_tokens\":500}\n"
                "{\"type\":\"model\",\"turn\":2,\"input_tokens\":400,\"output_tokens\":50,\"max_tokens\":200}\n",
                NULL);
  assert_string_equal(r->terminal_reason, "token_cap");
  assert_int_equal(r->tokens, 450);
  assert_true(r->tokens <= 1000);
  free_rec(r);
}

/* The cost of each model line of a trace, in nano-USD (as replay reads
 * it), and the line numbers; returns how many. */
static int model_lines(const char *text, long *lines, int64_t *costs, int max) {
  int n = 0;
  long line = 0;
  for (const char *p = text; p && *p && n < max;) {
    const char *nl = strchr(p, '\n');
    size_t l = nl ? (size_t)(nl - p) : strlen(p);
    line++;
    json_t *o = (l && *p == '{') ? json_loadb(p, l, 0, NULL) : NULL;
    if (o && json_is_string(json_object_get(o, "type")) &&
        !strcmp(json_string_value(json_object_get(o, "type")), "model")) {
      lines[n] = line;
      costs[n] = llround(json_number_value(json_object_get(o, "cost")) * 1e9);
      n++;
    }
    json_decref(o);
    p = nl ? nl + 1 : NULL;
  }
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  return b;
}

/* Replays the billing incident with a cost cap; returns the record. */
static rec_t *billing(const char *pjson, char **text_out) {
  const char *data = getenv("LG_TEST_DATA");
  if (!data) fail_msg("LG_TEST_DATA is not set");
  char path[4096];
  snprintf(path, sizeof path, "%s/fixtures/seed002-billing.jsonl", data);
  char *text = slurp(path);
  lg_policy_t *p = pol(pjson);
  rec_t *r = new_rec();
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_replay_file(path, p, on_event, r, &err), 0);
  lg_policy_free(p);
  *text_out = text;
  return r;
}

static void t_cost_cap_billing(void **state) {
  (void)state;
  long lines[256];
  int64_t costs[256];
  char *text;
  /* The cap binds once the ladder and the failure streak are out of the
   * way: the stop is at the first model line whose cost would cross it. */
  const int64_t cap = 200000; /* 0.0002 USD */
  rec_t *r = billing("{\"limits\":{\"max_cost_usd\":0.0002},\"repeat\":{\"block\":false,\"stop\":false},"
                     "\"failure_streak\":0}",
                     &text);
  int n = model_lines(text, lines, costs, 256);
  assert_true(n > 0);
  int64_t total = 0;
  long want_line = 0;
  int want_calls = 0;
  for (int i = 0; i < n; i++) {
    if (total + costs[i] > cap) {
      want_line = lines[i];
      break;
    }
    total += costs[i];
    want_calls++;
  }
  assert_true(want_line > 0); /* the trace does cross the cap */
  assert_string_equal(r->terminal_reason, "cost_cap");
  assert_int_equal(r->stopped_at_line, want_line);
  assert_int_equal(must_ev(r, want_line)->action, LG_ACT_STOP);
  assert_int_equal(r->cost_nusd, total);
  assert_true(r->cost_nusd <= cap);
  assert_int_equal(r->model_calls, want_calls);
  json_t *c = json_object_get(r->envelope, "counters");
  assert_true(json_number_value(json_object_get(c, "cost_usd")) <= 0.0002 + 1e-12);
  free_rec(r);
  free(text);

  /* The brief's plain override: the same-call ladder stops the run first
   * (call 6, before the 8th model call would cross 0.0002), and the cap is
   * of course not overshot either. */
  r = billing("{\"limits\":{\"max_cost_usd\":0.0002}}", &text);
  assert_true(r->cost_nusd <= cap);
  assert_string_equal(r->terminal_reason, "same_call_repeat");
  free_rec(r);
  free(text);

  /* A lower cap with the default ladder: the cap comes first. */
  const int64_t cap2 = 100000;
  r = billing("{\"limits\":{\"max_cost_usd\":0.0001}}", &text);
  n = model_lines(text, lines, costs, 256);
  total = 0;
  want_line = 0;
  for (int i = 0; i < n; i++) {
    if (total + costs[i] > cap2) {
      want_line = lines[i];
      break;
    }
    total += costs[i];
  }
  assert_string_equal(r->terminal_reason, "cost_cap");
  assert_int_equal(r->stopped_at_line, want_line);
  assert_int_equal(r->cost_nusd, total);
  assert_true(r->cost_nusd <= cap2);
  free_rec(r);
  free(text);
}

/* lg_replay_file and lg_replay_buffer agree; a missing file is LG_EIO. */
static void t_replay_file(void **state) {
  (void)state;
  char path[] = "/tmp/lg_test_replay_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *t = RUN CALL("a", 1) OK CALL("a", 2) OK CALL("a", 3);
  assert_int_equal(write(fd, t, strlen(t)), (ssize_t)strlen(t));
  close(fd);
  rec_t *a = new_rec(), *b = new_rec();
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_replay_file(path, NULL, on_event, a, &err), 0);
  assert_int_equal(lg_replay_buffer(path, t, strlen(t), NULL, on_event, b, &err), 0);
  assert_int_equal(a->n, b->n);
  for (int i = 0; i < a->n; i++) {
    assert_int_equal(a->ev[i].line, b->ev[i].line);
    assert_int_equal(a->ev[i].action, b->ev[i].action);
    assert_string_equal(a->ev[i].fp, b->ev[i].fp);
  }
  assert_true(json_equal(a->envelope, b->envelope));
  assert_string_equal(a->trace, path);
  free_rec(a);
  free_rec(b);
  /* An empty file. */
  fd = open(path, O_WRONLY | O_TRUNC);
  close(fd);
  a = new_rec();
  assert_int_equal(lg_replay_file(path, NULL, on_event, a, &err), 0);
  assert_int_equal(a->nsum, 1);
  free_rec(a);
  unlink(path);
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_replay_file(path, NULL, on_event, NULL, &err), LG_EIO);
  assert_string_equal(err.source, path);
  /* A callback that says stop is obeyed and its code returned. */
  a = new_rec();
  assert_int_equal(lg_replay_buffer("x", t, strlen(t), NULL, NULL, NULL, &err), 0);
  free_rec(a);
}

static int stop_cb(void *ud, const lg_replay_event_t *e, const lg_replay_summary_t *s) {
  (void)s;
  int *n = ud;
  if (e && ++*n == 2) return 42;
  return 0;
}

static void t_callback_stops(void **state) {
  (void)state;
  int n = 0;
  const char *t = RUN CALL("a", 1) OK CALL("a", 2) OK;
  assert_int_equal(lg_replay_buffer("x", t, strlen(t), NULL, stop_cb, &n, NULL), 42);
  assert_int_equal(n, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_blank_and_comments),
      cmocka_unit_test(t_unknown_types_and_fields),
      cmocka_unit_test(t_wrong_types),
      cmocka_unit_test(t_malformed_json),
      cmocka_unit_test(t_number_edges),
      cmocka_unit_test(t_run_not_first),
      cmocka_unit_test(t_policy_in_run_event),
      cmocka_unit_test(t_policy_override),
      cmocka_unit_test(t_t_ms),
      cmocka_unit_test(t_skipped_results),
      cmocka_unit_test(t_result_defaults_to_latest_call),
      cmocka_unit_test(t_events_after_stop),
      cmocka_unit_test(t_no_run_event),
      cmocka_unit_test(t_empty_trace),
      cmocka_unit_test(t_summary_counts),
      cmocka_unit_test(t_checkpoint_and_group),
      cmocka_unit_test(t_model_counts),
      cmocka_unit_test(t_cost_cap_billing),
      cmocka_unit_test(t_replay_file),
      cmocka_unit_test(t_callback_stops),
  };
  return cmocka_run_group_tests_name("replay", tests, NULL, NULL);
}
