/*
 * test_engine.c — the decision engine (lg_run_*), driven directly.
 *
 * One test (at least) for every stop reason and every block reason of
 * policy-v1, one for every rule of the decision order showing that it wins
 * over the later ones, and tests of the ladder's details (same-turn calls,
 * non-adjacent repeats, the window, progress, checkpoints, rungs turned
 * off, loop_key false), derived idempotency keys, the steer message and the
 * recovery hints, the terminal envelope (parsed with jansson), and the
 * engine's behaviour on events after a stop and on bad input.
 *
 * Behaviour that a trace can show in full (decisions, repeat counts,
 * fingerprints, the summary's counts) is data instead: a folder per case in
 * tests/data/engine/, run by test_engine_cases. What stays here needs the
 * API itself: guard names, the absence of a message, envelope fields,
 * ledgers shared between runs, error codes.
 *
 * Helpers at the top build runs from policy JSON and feed them events; each
 * asserts that the engine accepted the event, so a test reads as the
 * sequence of decisions it expects.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "loopguard.h"

/* ------------------------------------------------------------------ */
/* Helpers.                                                             */

static lg_canon_t *C;      /* scratch canonicaliser for every test */
static int64_t g_turn;     /* the next model turn of call() */

static int setup(void **state) {
  (void)state;
  g_turn = 0;
  return 0;
}

static lg_policy_t *pol(const char *json) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(json, strlen(json), "test", &err);
  if (!p) fail_msg("policy %s: %s: %s", json, err.field, err.message);
  return p;
}

static lg_run_t *mk_full(const char *id, const char *pjson, const int64_t *cp, lg_ledger_t *l) {
  lg_policy_t *p = pjson ? pol(pjson) : NULL;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *r = lg_run_new(id, NULL, p, cp, l, &err);
  lg_policy_free(p);
  if (!r) fail_msg("lg_run_new: %s", err.message);
  return r;
}
static lg_run_t *mk(const char *pjson) { return mk_full("r1", pjson, NULL, NULL); }

static int try_call(lg_run_t *r, const char *tool, const char *args, int64_t turn, int64_t t,
                    const char *id, const char *key, lg_decision_t *d, lg_error_t *err) {
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = tool;
  c.args = args;
  c.args_len = args ? strlen(args) : 0;
  c.turn = turn;
  c.t_ms = t;
  c.call_id = id;
  c.idempotency_key = key;
  return lg_run_before(r, C, &c, d, err);
}

/* A call that the engine must accept; returns its action. */
static lg_action_t callx(lg_run_t *r, const char *tool, const char *args, int64_t turn, int64_t t,
                         const char *id, const char *key, lg_decision_t *d) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = try_call(r, tool, args, turn, t, id, key, d, &err);
  if (rc) fail_msg("lg_run_before(%s %s): %s: %s", tool, args ? args : "", lg_err_name(rc), err.message);
  return d->action;
}
/* A call in a new turn at time 0. */
static lg_action_t call(lg_run_t *r, const char *tool, const char *args, lg_decision_t *d) {
  return callx(r, tool, args, ++g_turn, 0, NULL, NULL, d);
}
static lg_action_t call_t(lg_run_t *r, const char *tool, const char *args, int64_t t, lg_decision_t *d) {
  return callx(r, tool, args, ++g_turn, t, NULL, NULL, d);
}

static lg_result_t res0(lg_status_t st) {
  lg_result_t x;
  memset(&x, 0, sizeof x);
  x.status = st;
  x.side_effect_committed = -1;
  x.retry_after_ms = -1;
  x.value_kind = LG_VALUE_ABSENT;
  return x;
}
static lg_action_t after(lg_run_t *r, const lg_result_t *x, lg_decision_t *d) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_run_after(r, x, d, &err);
  if (rc) fail_msg("lg_run_after: %s: %s", lg_err_name(rc), err.message);
  return d->action;
}
/* A result of the latest call with `st` and nothing else. */
static lg_action_t res_st(lg_run_t *r, lg_status_t st, lg_decision_t *d) {
  lg_result_t x = res0(st);
  return after(r, &x, d);
}
static lg_action_t ok(lg_run_t *r, lg_decision_t *d) { return res_st(r, LG_STATUS_PROGRESS, d); }
static lg_action_t res_pv(lg_run_t *r, int64_t pv, lg_decision_t *d) {
  lg_result_t x = res0(LG_STATUS_PROGRESS);
  x.has_progress_version = 1;
  x.progress_version = pv;
  return after(r, &x, d);
}
static lg_action_t res_val(lg_run_t *r, const char *id, lg_status_t st, const char *value,
                           int committed, const char *opid, lg_decision_t *d) {
  lg_result_t x = res0(st);
  x.call_id = id;
  if (value) {
    x.value = value;
    x.value_len = strlen(value);
    x.value_kind = LG_VALUE_PRESENT;
  }
  x.side_effect_committed = committed;
  x.operation_id = opid;
  return after(r, &x, d);
}
static lg_action_t res_retry(lg_run_t *r, int64_t retry_after, int64_t t, lg_decision_t *d) {
  lg_result_t x = res0(LG_STATUS_RETRYABLE);
  x.retry_after_ms = retry_after;
  x.t_ms = t;
  return after(r, &x, d);
}

static lg_action_t model(lg_run_t *r, int64_t in, int64_t max_tokens, int64_t cost, int64_t t,
                         lg_decision_t *d) {
  lg_model_call_t m;
  memset(&m, 0, sizeof m);
  m.turn = ++g_turn;
  m.input_tokens = in;
  m.max_tokens = max_tokens;
  m.output_tokens = -1;
  m.cost_nusd = cost;
  m.t_ms = t;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_run_model(r, &m, d, &err);
  if (rc) fail_msg("lg_run_model: %s: %s", lg_err_name(rc), err.message);
  return d->action;
}

static lg_action_t world(lg_run_t *r, const char *world, lg_decision_t *d) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_run_state(r, C, world, strlen(world), 0, d, &err);
  if (rc) fail_msg("lg_run_state: %s: %s", lg_err_name(rc), err.message);
  return d->action;
}

static json_t *envelope(const lg_run_t *r) {
  char *s = lg_run_envelope_json(r);
  assert_non_null(s);
  json_error_t je;
  json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &je);
  if (!j) fail_msg("envelope is not JSON (%s): %s", je.text, s);
  lg_free(s);
  return j;
}
static const char *jstr(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}
static json_int_t jint(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  if (!json_is_integer(v)) fail_msg("field %s is not an integer", k);
  return json_integer_value(v);
}

/* The whole state of a run, for "nothing changed" checks. */
typedef struct snap {
  char *blob;
  size_t len;
  char *env;
} snap_t;
static snap_t snap(const lg_run_t *r) {
  snap_t s;
  assert_int_equal(lg_run_save(r, &s.blob, &s.len), 0);
  s.env = lg_run_envelope_json(r);
  assert_non_null(s.env);
  return s;
}
static void snap_same(const lg_run_t *r, snap_t *s) {
  snap_t now = snap(r);
  assert_string_equal(now.env, s->env);
  assert_int_equal(now.len, s->len);
  assert_memory_equal(now.blob, s->blob, s->len);
  lg_free(now.blob);
  lg_free(now.env);
  lg_free(s->blob);
  lg_free(s->env);
}

static void contains(const char *hay, const char *needle) {
  if (!hay) fail_msg("no message (wanted one containing \"%s\")", needle);
  if (!strstr(hay, needle)) fail_msg("\"%s\" does not contain \"%s\"", hay, needle);
}

static void fp_of(const char *pjson, const char *tool, const char *args, char hex[LG_FP_HEX]) {
  lg_policy_t *p = pjson ? pol(pjson) : NULL;
  assert_int_equal(lg_canon_fingerprint(C, p, tool, args, strlen(args), hex, NULL, NULL, NULL), 0);
  lg_policy_free(p);
}

static void assert_stop(const lg_decision_t *d, lg_reason_t reason, const char *guard) {
  if (d->action != LG_ACT_STOP)
    fail_msg("expected stop/%s, got %s/%s", lg_reason_name(reason), lg_action_name(d->action),
             lg_reason_name(d->reason));
  if (d->reason != reason)
    fail_msg("expected stop/%s, got stop/%s", lg_reason_name(reason), lg_reason_name(d->reason));
  if (guard) assert_string_equal(d->guard, guard);
}
static void assert_block(const lg_decision_t *d, lg_reason_t reason) {
  if (d->action != LG_ACT_BLOCK || d->reason != reason)
    fail_msg("expected block/%s, got %s/%s", lg_reason_name(reason), lg_action_name(d->action),
             lg_reason_name(d->reason));
}

/* ------------------------------------------------------------------ */
/* Stop reasons: caps.                                                  */

static void t_step_cap(void **state) {
  (void)state;
  lg_run_t *r = mk("{\"limits\":{\"max_steps\":3}}");
  lg_decision_t d;
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call(r, "a", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_int_equal(call(r, "b", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call(r, "c", "{}", &d);
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  assert_string_equal(d.reason_text, "step_cap");
  assert_string_equal(lg_run_terminal_reason(r), "step_cap");
  assert_true(lg_run_stopped(r));
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.steps, 3);
  assert_int_equal(c.calls, 5);
  assert_int_equal(c.blocked, 1);
  lg_run_free(r);
}

static void t_model_call_cap(void **state) {
  (void)state;
  lg_run_t *r = mk("{\"limits\":{\"max_model_calls\":2}}");
  lg_decision_t d;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(model(r, 10, 10, -1, 0, &d), LG_ACT_EXECUTE);
    assert_true(d.reservation > 0);
    assert_int_equal(lg_run_usage(r, d.reservation, 10, 5, 0, 0), 0);
  }
  model(r, 10, 10, -1, 0, &d);
  assert_stop(&d, LG_R_MODEL_CALL_CAP, "caps");
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.model_calls, 2);
  assert_int_equal(c.tokens, 30);
  lg_run_free(r);
}

static void t_tool_call_cap(void **state) {
  (void)state;
  lg_run_t *r = mk("{\"tools\":{\"fetch\":{\"max_calls\":2}}}");
  lg_decision_t d;
  assert_int_equal(call(r, "fetch", "{\"a\":1}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  assert_int_equal(call(r, "other", "{}", &d), LG_ACT_EXECUTE); /* not counted for fetch */
  ok(r, &d);
  assert_int_equal(call(r, "fetch", "{\"a\":2}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call(r, "fetch", "{\"a\":3}", &d);
  assert_stop(&d, LG_R_TOOL_CALL_CAP, "caps");
  contains(d.message, "fetch");
  lg_run_free(r);
}

static void t_wall_clock_cap(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"limits\":{\"max_wall_ms\":1000}}");
  assert_int_equal(call_t(r, "a", "{\"i\":1}", 999, &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call_t(r, "a", "{\"i\":2}", 1000, &d);
  assert_stop(&d, LG_R_WALL_CLOCK_CAP, "caps");
  lg_run_free(r);
  /* A model call at the cap stops too. */
  r = mk("{\"limits\":{\"max_wall_ms\":1000}}");
  assert_int_equal(model(r, 1, 1, 1, 999, &d), LG_ACT_EXECUTE);
  model(r, 1, 1, 1, 1000, &d);
  assert_stop(&d, LG_R_WALL_CLOCK_CAP, "caps");
  lg_run_free(r);
  /* The default is 600000 ms. */
  r = mk(NULL);
  assert_int_equal(call_t(r, "a", "{}", 599999, &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call_t(r, "b", "{}", 600000, &d);
  assert_stop(&d, LG_R_WALL_CLOCK_CAP, "caps");
  lg_run_free(r);
}

static void t_cost_cap(void **state) {
  (void)state;
  lg_decision_t d;
  lg_counters_t c;
  const int64_t cap = 1000000; /* 0.001 USD in nano-USD */
  lg_run_t *r = mk("{\"limits\":{\"max_cost_usd\":0.001}}");
  assert_int_equal(model(r, 10, 10, 400000, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, d.reservation, 10, 10, 400000, 0), 0);
  assert_int_equal(model(r, 10, 10, 400000, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, d.reservation, 10, 10, 350000, 0), 0); /* cheaper than feared */
  /* 750000 settled + 250000 worst case = exactly the cap: allowed. */
  assert_int_equal(model(r, 10, 10, 250000, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, d.reservation, 10, 10, 250000, 0), 0);
  lg_run_counters(r, &c);
  assert_int_equal(c.cost_nusd, cap);
  model(r, 10, 10, 1, 0, &d);
  assert_stop(&d, LG_R_COST_CAP, "caps");
  lg_run_counters(r, &c);
  assert_true(c.cost_nusd <= cap);
  assert_int_equal(c.model_calls, 3);
  lg_run_free(r);

  /* Reservations not settled yet are held against the cap: two calls in
   * flight cannot overshoot it together. */
  r = mk("{\"limits\":{\"max_cost_usd\":0.001}}");
  assert_int_equal(model(r, 10, 10, 600000, 0, &d), LG_ACT_EXECUTE);
  int64_t first = d.reservation;
  model(r, 10, 10, 600000, 0, &d);
  assert_stop(&d, LG_R_COST_CAP, "caps");
  lg_run_free(r);
  r = mk("{\"limits\":{\"max_cost_usd\":0.001}}");
  assert_int_equal(model(r, 10, 10, 600000, 0, &d), LG_ACT_EXECUTE);
  first = d.reservation;
  assert_int_equal(lg_run_usage(r, first, 10, 10, 100000, 0), 0); /* settles: frees 500000 */
  assert_int_equal(model(r, 10, 10, 600000, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, first, 1, 1, 1, 0), LG_ENOTFOUND); /* settled already */
  assert_int_equal(lg_run_usage(r, 0, 1, 1, 600000, 0), 0);            /* oldest open one */
  lg_run_counters(r, &c);
  assert_int_equal(c.cost_nusd, 700000);
  assert_int_equal(lg_run_usage(r, 0, 1, 1, 1, 0), LG_ENOTFOUND); /* none open */
  lg_run_free(r);
}

static void t_token_cap(void **state) {
  (void)state;
  lg_decision_t d;
  lg_counters_t c;
  lg_run_t *r = mk("{\"limits\":{\"max_tokens\":1000}}");
  assert_int_equal(model(r, 300, 200, -1, 0, &d), LG_ACT_EXECUTE); /* worst 500 */
  assert_int_equal(lg_run_usage(r, d.reservation, 300, 100, 0, 0), 0);
  assert_int_equal(model(r, 400, 200, -1, 0, &d), LG_ACT_EXECUTE); /* 400 + 600 = cap */
  assert_int_equal(lg_run_usage(r, d.reservation, 400, 150, 0, 0), 0);
  lg_run_counters(r, &c);
  assert_int_equal(c.tokens, 950);
  model(r, 10, 100, -1, 0, &d); /* 950 + 110 > 1000 */
  assert_stop(&d, LG_R_TOKEN_CAP, "caps");
  lg_run_counters(r, &c);
  assert_true(c.tokens <= 1000);
  assert_int_equal(c.model_calls, 2);
  lg_run_free(r);
}

static void t_handoff_cap(void **state) {
  (void)state;
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *r = mk("{\"limits\":{\"max_handoffs\":2}}");
  assert_int_equal(lg_run_handoff(r, "planner", "coder", 0, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  assert_int_equal(lg_run_handoff(r, "coder", "planner", 0, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  assert_int_equal(lg_run_handoff(r, "planner", "coder", 0, &d, &err), 0);
  assert_stop(&d, LG_R_HANDOFF_CAP, "caps");
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.handoffs, 2);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Stop reasons: the ladder and cycles.                                 */

static void t_same_call_repeat_ladder(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  const char *a = "{\"q\":\"acme\",\"page\":1}";
  assert_int_equal(call(r, "search", a, &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 1);
  assert_null(d.message);
  ok(r, &d);
  assert_int_equal(call(r, "search", a, &d), LG_ACT_EXECUTE); /* observe */
  assert_int_equal(d.repeat, 2);
  assert_non_null(d.message);
  ok(r, &d);
  for (int n = 3; n <= 5; n++) {
    call(r, "search", a, &d);
    assert_block(&d, LG_R_SAME_CALL_REPEAT);
    assert_string_equal(d.guard, "repeat");
    assert_int_equal(d.repeat, n);
    assert_false(lg_run_stopped(r));
  }
  call(r, "search", a, &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  assert_int_equal(d.repeat, 6);
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.steps, 2);
  assert_int_equal(c.blocked, 3);
  assert_int_equal(c.calls, 6);
  lg_run_free(r);
}

/* Runs the tools named by the letters of `seq` (args {}), each in its own
 * turn with an ok result when executed; the last call must stop with
 * short_cycle iff `cycle`, and every earlier one must execute. */
static void cycle_case(const char *pjson, const char *seq, bool cycle) {
  lg_run_t *r = mk(pjson);
  lg_decision_t d;
  size_t n = strlen(seq);
  for (size_t i = 0; i < n; i++) {
    char tool[2] = {seq[i], 0};
    call(r, tool, "{}", &d);
    if (i + 1 < n || !cycle) {
      if (d.action != LG_ACT_EXECUTE)
        fail_msg("%s: call %zu (%s) was %s/%s, expected execute", seq, i + 1, tool,
                 lg_action_name(d.action), lg_reason_name(d.reason));
      ok(r, &d);
    } else {
      assert_stop(&d, LG_R_SHORT_CYCLE, "cycle");
      contains(d.message, tool);
    }
  }
  lg_run_free(r);
}

static void t_short_cycle(void **state) {
  (void)state;
  cycle_case(NULL, "abab", true);
  cycle_case(NULL, "abcabc", true);
  cycle_case(NULL, "abcdabcd", true);
  cycle_case(NULL, "xabab", true);  /* a prefix does not matter */
  cycle_case(NULL, "abac", false);  /* A B A C is not a cycle */
  cycle_case(NULL, "abacd", false);
  cycle_case(NULL, "aba", false);   /* one and a half rounds */
  cycle_case(NULL, "abcdeabcde", false); /* period 5 > max_period 4 */
  cycle_case("{\"cycle\":{\"max_period\":5}}", "abcdeabcde", true);
  cycle_case("{\"cycle\":{\"max_period\":2}}", "abcabc", false);
  cycle_case("{\"cycle\":{\"max_period\":0}}", "abab", false); /* off */
}

/* ------------------------------------------------------------------ */
/* Stop reasons: progress, failures, validation, statuses, operators.   */

static void t_no_progress_versions(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  call(r, "step", "{\"i\":1}", &d);
  assert_int_equal(res_pv(r, 1, &d), LG_ACT_CONTINUE); /* progress */
  call(r, "step", "{\"i\":2}", &d);
  assert_int_equal(res_pv(r, 1, &d), LG_ACT_CONTINUE); /* 1 without */
  call(r, "step", "{\"i\":3}", &d);
  assert_int_equal(res_pv(r, 1, &d), LG_ACT_CONTINUE); /* 2 */
  call(r, "step", "{\"i\":4}", &d);
  assert_int_equal(res_pv(r, 2, &d), LG_ACT_CONTINUE); /* progress: count restarts */
  call(r, "step", "{\"i\":5}", &d);
  assert_int_equal(res_pv(r, 2, &d), LG_ACT_CONTINUE);
  call(r, "step", "{\"i\":6}", &d);
  assert_int_equal(res_pv(r, 0, &d), LG_ACT_CONTINUE); /* lower is not progress either */
  call(r, "step", "{\"i\":7}", &d);
  res_pv(r, 2, &d);
  assert_stop(&d, LG_R_NO_PROGRESS, "no_progress");
  assert_non_null(d.message);
  lg_run_free(r);
  /* Turned off. */
  r = mk("{\"no_progress\":{\"results\":0}}");
  for (int i = 0; i < 8; i++) {
    char a[32];
    snprintf(a, sizeof a, "{\"i\":%d}", i);
    assert_int_equal(call(r, "step", a, &d), LG_ACT_EXECUTE);
    assert_int_equal(res_pv(r, 1, &d), LG_ACT_CONTINUE);
  }
  lg_run_free(r);
}

static void t_no_progress_world(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  /* The same world, written differently (key order, 1 vs 1.0). */
  const char *w[] = {"{\"cursor\":17,\"queue\":40}", "{\"queue\":40,\"cursor\":17}",
                     "{\"cursor\":17.0,\"queue\":40}"};
  assert_int_equal(world(r, w[0], &d), LG_ACT_CONTINUE);
  for (int i = 1; i <= 4; i++) assert_int_equal(world(r, w[i % 3], &d), LG_ACT_CONTINUE);
  /* A change restarts the count. */
  assert_int_equal(world(r, "{\"cursor\":18,\"queue\":39}", &d), LG_ACT_CONTINUE);
  for (int i = 1; i <= 4; i++)
    assert_int_equal(world(r, "{\"queue\":39,\"cursor\":18}", &d), LG_ACT_CONTINUE);
  world(r, "{\"cursor\":18,\"queue\":39}", &d); /* the 5th identical to the one before */
  assert_stop(&d, LG_R_NO_PROGRESS, "no_progress");
  lg_run_free(r);
  /* world_steps 2: the 3rd snapshot of three equal ones stops. */
  r = mk("{\"no_progress\":{\"world_steps\":2}}");
  assert_int_equal(world(r, "{}", &d), LG_ACT_CONTINUE);
  assert_int_equal(world(r, "{}", &d), LG_ACT_CONTINUE);
  world(r, "{}", &d);
  assert_stop(&d, LG_R_NO_PROGRESS, "no_progress");
  lg_run_free(r);
  /* A malformed snapshot is an error that changes nothing. */
  r = mk(NULL);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_true(lg_run_state(r, C, "{\"a\":", 5, 0, &d, &err) < 0);
  assert_false(lg_run_stopped(r));
  lg_run_free(r);
}

static void t_failure_streak(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  /* The model dodges the repeat check by changing an argument. */
  for (int i = 1; i <= 4; i++) {
    char a[32];
    snprintf(a, sizeof a, "{\"invoice\":%d}", i);
    assert_int_equal(call(r, "charge", a, &d), LG_ACT_EXECUTE);
    assert_int_equal(res_st(r, LG_STATUS_RETRYABLE, &d), LG_ACT_CONTINUE);
  }
  assert_int_equal(call(r, "charge", "{\"invoice\":5}", &d), LG_ACT_EXECUTE);
  res_st(r, LG_STATUS_RETRYABLE, &d);
  assert_stop(&d, LG_R_FAILURE_STREAK, "failure_streak");
  contains(d.message, "charge");
  contains(d.message, "5");
  lg_run_free(r);
  /* A success of the tool ends the streak. */
  r = mk(NULL);
  for (int i = 1; i <= 9; i++) {
    char a[32];
    snprintf(a, sizeof a, "{\"invoice\":%d}", i);
    assert_int_equal(call(r, "charge", a, &d), LG_ACT_EXECUTE);
    assert_int_equal(res_st(r, i == 5 ? LG_STATUS_PROGRESS : LG_STATUS_RETRYABLE, &d),
                     LG_ACT_CONTINUE);
  }
  lg_run_free(r);
  /* failure_streak 0 turns it off. */
  r = mk("{\"failure_streak\":0}");
  for (int i = 1; i <= 8; i++) {
    char a[32];
    snprintf(a, sizeof a, "{\"invoice\":%d}", i);
    assert_int_equal(call(r, "charge", a, &d), LG_ACT_EXECUTE);
    assert_int_equal(res_st(r, LG_STATUS_RETRYABLE, &d), LG_ACT_CONTINUE);
  }
  lg_run_free(r);
}

static void invalid_case(const char *pjson, lg_status_t st, lg_value_kind_t vk, const char *value,
                         bool stops) {
  lg_run_t *r = mk(pjson);
  lg_decision_t d;
  assert_int_equal(call(r, "run_shell", "{\"cmd\":\"ls\"}", &d), LG_ACT_EXECUTE);
  lg_result_t x = res0(st);
  x.value_kind = vk;
  x.value = value;
  x.value_len = value ? strlen(value) : 0;
  after(r, &x, &d);
  if (stops) {
    assert_stop(&d, LG_R_INVALID_TOOL_RESULT, "validation");
    contains(d.message, "run_shell");
    assert_int_equal(d.next_allowed_action, LG_NEXT_HUMAN_REVIEW);
  } else {
    assert_int_equal(d.action, LG_ACT_CONTINUE);
  }
  lg_run_free(r);
}

static void t_invalid_tool_result(void **state) {
  (void)state;
  assert_int_equal(lg_status_parse("done", 4), LG_STATUS_INVALID);
  assert_int_equal(lg_status_parse(NULL, 0), LG_STATUS_INVALID);
  assert_int_equal(lg_status_parse("progres", 7), LG_STATUS_INVALID);
  assert_int_equal(lg_status_parse("progress", 8), LG_STATUS_PROGRESS);
  assert_int_equal(lg_status_parse("human_required", 14), LG_STATUS_HUMAN_REQUIRED);
  /* Missing or unknown status. */
  invalid_case(NULL, LG_STATUS_INVALID, LG_VALUE_ABSENT, NULL, true);
  invalid_case(NULL, lg_status_parse("done", 4), LG_VALUE_PRESENT, "{\"ok\":true}", true);
  /* null and blank values. */
  invalid_case(NULL, LG_STATUS_PROGRESS, LG_VALUE_NULL, "null", true);
  invalid_case(NULL, LG_STATUS_PROGRESS, LG_VALUE_BLANK, "\"  \"", true);
  invalid_case(NULL, LG_STATUS_COMPLETE, LG_VALUE_BLANK, "\"\"", true); /* gate before complete */
  /* No value at all is fine; so is a real one. */
  invalid_case(NULL, LG_STATUS_PROGRESS, LG_VALUE_ABSENT, NULL, false);
  invalid_case(NULL, LG_STATUS_PROGRESS, LG_VALUE_PRESENT, "\"x\"", false);
  /* empty_ok accepts null and blank, not a missing status. */
  const char *eok = "{\"tools\":{\"run_shell\":{\"empty_ok\":true}}}";
  invalid_case(eok, LG_STATUS_PROGRESS, LG_VALUE_NULL, "null", false);
  invalid_case(eok, LG_STATUS_PROGRESS, LG_VALUE_BLANK, "\"\"", false);
  invalid_case(eok, LG_STATUS_INVALID, LG_VALUE_PRESENT, "\"x\"", true);
  /* empty_ok of another tool does not help. */
  invalid_case("{\"tools\":{\"other\":{\"empty_ok\":true}}}", LG_STATUS_PROGRESS, LG_VALUE_NULL,
               "null", true);
}

static void t_status_stops(void **state) {
  (void)state;
  static const struct {
    lg_status_t st;
    lg_reason_t reason;
    lg_next_t next;
  } cases[] = {{LG_STATUS_COMPLETE, LG_R_COMPLETE, LG_NEXT_NONE},
               {LG_STATUS_FATAL, LG_R_FATAL, LG_NEXT_HUMAN_REVIEW},
               {LG_STATUS_PERMISSION_DENIED, LG_R_PERMISSION_DENIED, LG_NEXT_HUMAN_REVIEW},
               {LG_STATUS_POLICY_BLOCKED, LG_R_POLICY_BLOCKED, LG_NEXT_HUMAN_REVIEW},
               {LG_STATUS_HUMAN_REQUIRED, LG_R_HUMAN_REQUIRED, LG_NEXT_HUMAN_REVIEW}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lg_run_t *r = mk(NULL);
    lg_decision_t d;
    assert_int_equal(call(r, "deploy", "{\"svc\":\"billing\"}", &d), LG_ACT_EXECUTE);
    res_val(r, d.call_id, cases[i].st, "{\"detail\":1}", -1, NULL, &d);
    assert_stop(&d, cases[i].reason, "status");
    assert_string_equal(d.reason_text, lg_status_name(cases[i].st));
    assert_string_equal(lg_run_terminal_reason(r), lg_reason_name(cases[i].reason));
    assert_int_equal(d.next_allowed_action, cases[i].next);
    assert_non_null(d.call_id);
    /* At once: the first such answer ends the run, no backoff. */
    call(r, "deploy", "{\"svc\":\"billing\"}", &d);
    assert_stop(&d, cases[i].reason, NULL);
    lg_run_free(r);
  }
}

static void t_operator_cancel(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_cancel(r, "runaway spend on ticket 91", 42, &d), 0);
  assert_stop(&d, LG_R_OPERATOR_CANCELLED, "kill_switch");
  /* The reason is one of the documented set; the words are a note. */
  assert_string_equal(d.reason_text, "operator_cancelled_loop");
  assert_string_equal(d.operator_note, "runaway spend on ticket 91");
  assert_string_equal(lg_run_terminal_reason(r), "operator_cancelled_loop");
  /* Every later call gets the stop, before any side effect. */
  call(r, "b", "{}", &d);
  assert_stop(&d, LG_R_OPERATOR_CANCELLED, "kill_switch");
  assert_string_equal(d.reason_text, "operator_cancelled_loop");
  assert_string_equal(d.operator_note, "runaway spend on ticket 91");
  json_t *e = envelope(r);
  assert_string_equal(jstr(e, "terminal_reason"), "operator_cancelled_loop");
  assert_string_equal(jstr(e, "operator_note"), "runaway spend on ticket 91");
  assert_string_equal(jstr(e, "guard"), "kill_switch");
  assert_int_equal(jint(e, "stopped_at_ms"), 42);
  json_decref(e);
  lg_run_free(r);
  /* Without a reason: operator_cancelled_loop. */
  r = mk(NULL);
  assert_int_equal(lg_run_cancel(r, NULL, 0, &d), 0);
  assert_stop(&d, LG_R_OPERATOR_CANCELLED, "kill_switch");
  assert_string_equal(d.reason_text, "operator_cancelled_loop");
  assert_string_equal(lg_run_terminal_reason(r), "operator_cancelled_loop");
  lg_run_free(r);
}

static void t_budget_exceeded(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(lg_run_stop(r, LG_R_NONE, "x", 0, &d), LG_EINVAL);
  assert_int_equal(lg_run_stop(r, LG_R__COUNT, "x", 0, &d), LG_EINVAL);
  assert_false(lg_run_stopped(r));
  assert_int_equal(lg_run_stop(r, LG_R_BUDGET_EXCEEDED, "the workspace budget is spent", 7, &d), 0);
  assert_stop(&d, LG_R_BUDGET_EXCEEDED, NULL);
  assert_string_equal(lg_run_terminal_reason(r), "budget_exceeded");
  assert_int_equal(d.next_allowed_action, LG_NEXT_HUMAN_REVIEW);
  model(r, 1, 1, 1, 8, &d);
  assert_stop(&d, LG_R_BUDGET_EXCEEDED, NULL);
  json_t *e = envelope(r);
  assert_string_equal(jstr(e, "terminal_reason"), "budget_exceeded");
  assert_string_equal(jstr(e, "message"), "the workspace budget is spent");
  json_decref(e);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Block reasons and the ledger.                                        */

static void t_retry_too_soon(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(call_t(r, "quote", "{\"sku\":7}", 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(res_retry(r, 1000, 10, &d), LG_ACT_CONTINUE);
  call_t(r, "quote", "{\"sku\":7}", 500, &d);
  assert_block(&d, LG_R_RETRY_TOO_SOON);
  assert_string_equal(d.guard, "retry");
  /* Every block carries the cascade: the tool is hidden for a while. */
  assert_string_equal(d.hide_tool, "quote");
  assert_int_equal(d.hide_turns, 2);
  contains(d.message, "quote");
  /* Another call is not held back. */
  assert_int_equal(call_t(r, "quote", "{\"sku\":8}", 600, &d), LG_ACT_EXECUTE);
  lg_run_free(r);
  /* Once the wait is over the same call runs. */
  r = mk(NULL);
  assert_int_equal(call_t(r, "quote", "{\"sku\":7}", 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(res_retry(r, 1000, 10, &d), LG_ACT_CONTINUE);
  assert_int_equal(call_t(r, "quote", "{\"sku\":7}", 1010, &d), LG_ACT_EXECUTE);
  lg_run_free(r);
}

static void t_in_progress_same_turn(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"tools\":{\"send_email\":{\"side_effects\":true}}}");
  const char *a = "{\"to\":\"cfo@example.com\",\"body\":\"hi\"}";
  /* Two identical writes in one model turn, before the first result. */
  assert_int_equal(callx(r, "send_email", a, 1, 0, "m1", NULL, &d), LG_ACT_EXECUTE);
  assert_non_null(d.idempotency_key);
  char key[256];
  snprintf(key, sizeof key, "%s", d.idempotency_key);
  callx(r, "send_email", a, 1, 0, "m2", NULL, &d);
  assert_block(&d, LG_R_IN_PROGRESS);
  assert_string_equal(d.guard, "ledger");
  assert_string_equal(d.idempotency_key, key);
  assert_int_equal(d.repeat, 1); /* the same turn counts once */
  contains(d.message, "send_email");
  /* The blocked one has no result to give. */
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_result_t x = res0(LG_STATUS_PROGRESS);
  x.call_id = "m2";
  assert_int_equal(lg_run_after(r, &x, &d, &err), LG_ENOTFOUND);
  assert_int_equal(res_val(r, "m1", LG_STATUS_PROGRESS, "{\"sent\":true}", -1, "msg-1", &d),
                   LG_ACT_CONTINUE);
  /* From now on the write replays. */
  assert_int_equal(callx(r, "send_email", a, 2, 0, "m3", NULL, &d), LG_ACT_REPLAY);
  assert_string_equal(d.guard, "ledger");
  assert_non_null(d.saved_result);
  assert_int_equal(d.saved_result_len, strlen("{\"sent\":true}"));
  assert_memory_equal(d.saved_result, "{\"sent\":true}", d.saved_result_len);
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.steps, 1);
  assert_int_equal(c.blocked, 1);
  assert_int_equal(c.replayed, 1);
  lg_run_free(r);
}

static void t_in_progress_shared_ledger(void **state) {
  (void)state;
  lg_decision_t d;
  lg_ledger_t *l = lg_ledger_memory_new();
  assert_non_null(l);
  const char *a = "{\"order\":77}";
  char hex[LG_FP_HEX];
  fp_of(NULL, "ship", a, hex);
  lg_claim_t cl;
  memset(&cl, 0, sizeof cl);
  /* Another worker holds the key. */
  assert_int_equal(l->methods->claim(l->self, "order-77", hex, "worker-2", 60000, 0, &cl, NULL), 0);
  assert_int_equal(cl.outcome, LG_CLAIM_CLAIMED);
  lg_run_t *r = mk_full("r1", NULL, NULL, l);
  callx(r, "ship", a, 1, 10, NULL, "order-77", &d);
  assert_block(&d, LG_R_IN_PROGRESS);
  assert_string_equal(d.idempotency_key, "order-77");
  /* The other worker finishes: the call replays its result. */
  assert_int_equal(l->methods->commit(l->self, "order-77", "{\"tracking\":\"Z9\"}", 17, "op-5", 20, NULL), 0);
  assert_int_equal(callx(r, "ship", a, 2, 30, NULL, "order-77", &d), LG_ACT_REPLAY);
  assert_int_equal(d.saved_result_len, 17);
  assert_memory_equal(d.saved_result, "{\"tracking\":\"Z9\"}", 17);
  lg_run_free(r);
  lg_ledger_free(l);
}

static void t_idempotency_mismatch(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(callx(r, "refund", "{\"amount\":10}", 1, 0, NULL, "refund-1", &d), LG_ACT_EXECUTE);
  /* Still in flight: another request under the key is a mismatch too. */
  callx(r, "refund", "{\"amount\":99}", 1, 0, NULL, "refund-1", &d);
  assert_block(&d, LG_R_IDEMPOTENCY_MISMATCH);
  assert_string_equal(d.guard, "ledger");
  contains(d.message, "refund-1");
  assert_int_equal(res_val(r, "c1", LG_STATUS_PROGRESS, "{\"ok\":1}", 1, NULL, &d), LG_ACT_CONTINUE);
  callx(r, "refund", "{\"amount\":11}", 2, 0, NULL, "refund-1", &d);
  assert_block(&d, LG_R_IDEMPOTENCY_MISMATCH);
  assert_false(lg_run_stopped(r));
  /* The same request under the key replays. */
  assert_int_equal(callx(r, "refund", "{\"amount\":10}", 3, 0, NULL, "refund-1", &d), LG_ACT_REPLAY);
  lg_run_free(r);
}

static void t_unknown_outcome(void **state) {
  (void)state;
  lg_decision_t d;
  lg_ledger_t *l = lg_ledger_memory_new();
  assert_non_null(l);
  const char *a = "{\"invoice\":\"INV-1\"}";
  char hex[LG_FP_HEX];
  fp_of(NULL, "charge", a, hex);
  lg_claim_t cl;
  memset(&cl, 0, sizeof cl);
  assert_int_equal(l->methods->claim(l->self, "inv-1", hex, "crashed", 100, 0, &cl, NULL), 0);
  /* Within the lease: in progress. */
  lg_run_t *r = mk_full("r1", NULL, NULL, l);
  callx(r, "charge", a, 1, 50, NULL, "inv-1", &d);
  assert_block(&d, LG_R_IN_PROGRESS);
  lg_run_free(r);
  /* The lease ran out with no outcome: nobody knows whether it happened. */
  r = mk_full("r2", NULL, NULL, l);
  callx(r, "charge", a, 1, 500, NULL, "inv-1", &d);
  assert_stop(&d, LG_R_UNKNOWN_OUTCOME, "ledger");
  assert_int_equal(d.next_allowed_action, LG_NEXT_HUMAN_REVIEW);
  contains(d.message, "inv-1");
  json_t *e = envelope(r);
  json_t *rc = json_object_get(e, "refused_call");
  assert_true(json_is_object(rc));
  assert_string_equal(jstr(rc, "tool"), "charge");
  assert_string_equal(jstr(rc, "fingerprint"), hex);
  json_decref(e);
  /* The key was not taken over. */
  assert_int_equal(l->methods->peek(l->self, "inv-1", hex, 600, &cl, NULL), 0);
  assert_int_equal(cl.outcome, LG_CLAIM_UNKNOWN_OUTCOME);
  lg_run_free(r);
  lg_ledger_free(l);
}

/* ------------------------------------------------------------------ */
/* The decision order: each rule wins over the later ones.              */

static void t_order_stopped_first(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"limits\":{\"max_wall_ms\":100}}");
  assert_int_equal(lg_run_cancel(r, "halt", 1, &d), 0);
  call_t(r, "a", "{}", 5000, &d); /* past the wall clock: still the cancel */
  assert_stop(&d, LG_R_OPERATOR_CANCELLED, "kill_switch");
  assert_string_equal(d.reason_text, "operator_cancelled_loop");
  assert_string_equal(d.operator_note, "halt");
  lg_run_free(r);
}

static void t_order_caps_among_themselves(void **state) {
  (void)state;
  lg_decision_t d;
  /* Wall clock, then steps, then the tool's max_calls. */
  lg_run_t *r = mk("{\"limits\":{\"max_steps\":1,\"max_wall_ms\":100},\"tools\":{\"a\":{\"max_calls\":1}}}");
  assert_int_equal(call_t(r, "a", "{\"i\":1}", 0, &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call_t(r, "a", "{\"i\":2}", 100, &d);
  assert_stop(&d, LG_R_WALL_CLOCK_CAP, "caps");
  lg_run_free(r);
  r = mk("{\"limits\":{\"max_steps\":1},\"tools\":{\"a\":{\"max_calls\":1}}}");
  assert_int_equal(call(r, "a", "{\"i\":1}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call(r, "a", "{\"i\":2}", &d);
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  lg_run_free(r);
}

static void t_order_cap_beats_ladder(void **state) {
  (void)state;
  lg_decision_t d;
  const char *p = "{\"limits\":{\"max_steps\":2},\"repeat\":{\"block\":false,\"stop\":3}}";
  lg_run_t *r = mk(p);
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  call(r, "a", "{}", &d); /* both the step cap and the stop rung */
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  assert_int_equal(d.repeat, 3);
  lg_run_free(r);
  /* Control: without the cap the stop rung fires. */
  r = mk("{\"repeat\":{\"block\":false,\"stop\":3}}");
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  lg_run_free(r);
  /* A cap beats a short cycle too. */
  r = mk("{\"limits\":{\"max_steps\":3}}");
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "b", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "b", "{}", &d);
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  lg_run_free(r);
}

static void t_order_stop_rung_beats_replay(void **state) {
  (void)state;
  lg_decision_t d;
  const char *p = "{\"repeat\":{\"observe\":false,\"block\":false,\"stop\":2},"
                  "\"tools\":{\"w\":{\"side_effects\":true}}}";
  lg_run_t *r = mk(p);
  assert_int_equal(call(r, "w", "{\"x\":1}", &d), LG_ACT_EXECUTE);
  res_val(r, NULL, LG_STATUS_PROGRESS, "{\"done\":1}", -1, NULL, &d);
  call(r, "w", "{\"x\":1}", &d); /* committed, and the 2nd identical call */
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  lg_run_free(r);
  /* Control: with the stop rung later, the same call replays. */
  r = mk("{\"repeat\":{\"observe\":false,\"block\":false,\"stop\":3},"
         "\"tools\":{\"w\":{\"side_effects\":true}}}");
  call(r, "w", "{\"x\":1}", &d);
  res_val(r, NULL, LG_STATUS_PROGRESS, "{\"done\":1}", -1, NULL, &d);
  assert_int_equal(call(r, "w", "{\"x\":1}", &d), LG_ACT_REPLAY);
  lg_run_free(r);
  /* A short cycle beats replay too: replayed calls count toward it. */
  r = mk("{\"tools\":{\"w\":{\"side_effects\":true}}}");
  call(r, "w", "{\"x\":1}", &d);
  res_val(r, NULL, LG_STATUS_PROGRESS, "1", -1, NULL, &d);
  call(r, "w", "{\"x\":2}", &d);
  res_val(r, NULL, LG_STATUS_PROGRESS, "2", -1, NULL, &d);
  assert_int_equal(call(r, "w", "{\"x\":1}", &d), LG_ACT_REPLAY);
  call(r, "w", "{\"x\":2}", &d);
  assert_stop(&d, LG_R_SHORT_CYCLE, "cycle");
  lg_run_free(r);
}

static void t_order_block_rung_beats_execute(void **state) {
  (void)state;
  lg_decision_t d;
  lg_ledger_t *l = lg_ledger_memory_new();
  lg_run_t *r = mk_full("r1", "{\"tools\":{\"w\":{\"side_effects\":true}}}", NULL, l);
  /* Retryable failures free the key each time; the 3rd call is blocked
   * and must not claim the key (no side effect). */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(call(r, "w", "{\"x\":1}", &d), LG_ACT_EXECUTE);
    res_st(r, LG_STATUS_RETRYABLE, &d);
  }
  call(r, "w", "{\"x\":1}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  char hex[LG_FP_HEX];
  fp_of("{\"tools\":{\"w\":{\"side_effects\":true}}}", "w", "{\"x\":1}", hex);
  lg_claim_t cl;
  memset(&cl, 0, sizeof cl);
  assert_non_null(d.idempotency_key);
  assert_int_equal(l->methods->peek(l->self, d.idempotency_key, hex, 0, &cl, NULL), 0);
  assert_int_equal(cl.outcome, LG_CLAIM_FREE);
  lg_run_free(r);
  lg_ledger_free(l);
}

/* ------------------------------------------------------------------ */
/* The ladder in detail.                                                */

static void t_same_turn_counts_once(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  for (int i = 0; i < 4; i++) {
    char id[8];
    snprintf(id, sizeof id, "t1-%d", i);
    assert_int_equal(callx(r, "lookup", "{\"id\":5}", 1, 0, id, NULL, &d), LG_ACT_EXECUTE);
    assert_int_equal(d.repeat, 1);
    assert_null(d.message);
  }
  for (int i = 0; i < 4; i++) ok(r, &d);
  assert_int_equal(callx(r, "lookup", "{\"id\":5}", 2, 0, NULL, NULL, &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 2);
  ok(r, &d);
  callx(r, "lookup", "{\"id\":5}", 3, 0, NULL, NULL, &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_int_equal(d.repeat, 3);
  lg_run_free(r);
}

static void t_progress_restarts_window(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  call(r, "poll", "{\"job\":1}", &d);
  ok(r, &d);
  assert_int_equal(call(r, "poll", "{\"job\":1}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 2);
  res_pv(r, 1, &d); /* confirmed progress */
  assert_int_equal(call(r, "poll", "{\"job\":1}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 1);
  assert_null(d.message);
  res_pv(r, 2, &d);
  /* Cycles too: A B | progress | A B is no cycle. */
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "b", "{}", &d);
  res_pv(r, 3, &d);
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  assert_int_equal(call(r, "b", "{}", &d), LG_ACT_EXECUTE);
  /* A version that is not higher does not restart it. */
  res_pv(r, 3, &d);
  assert_int_equal(call(r, "b", "{}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 2);
  lg_run_free(r);
}

static void t_checkpoint_resume(void **state) {
  (void)state;
  lg_decision_t d;
  int64_t cp = 5;
  lg_run_t *r = mk_full("r1", NULL, &cp, NULL);
  json_t *e = envelope(r);
  assert_int_equal(jint(e, "last_checkpoint"), 5);
  assert_null(jstr(e, "terminal_reason"));
  assert_string_equal(jstr(e, "status"), "active");
  json_decref(e);
  call(r, "sync", "{}", &d);
  res_pv(r, 5, &d); /* at the checkpoint: not progress */
  assert_int_equal(call(r, "sync", "{}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 2);
  res_pv(r, 4, &d); /* below: not progress */
  call(r, "sync", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT); /* the window did not restart */
  assert_int_equal(call(r, "other", "{}", &d), LG_ACT_EXECUTE);
  res_pv(r, 5, &d); /* the third result without progress */
  assert_stop(&d, LG_R_NO_PROGRESS, "no_progress");
  lg_run_free(r);
  /* Above the checkpoint: progress. */
  r = mk_full("r1", NULL, &cp, NULL);
  call(r, "sync", "{}", &d);
  ok(r, &d);
  call(r, "sync", "{}", &d);
  res_pv(r, 6, &d);
  assert_int_equal(call(r, "sync", "{}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 1);
  e = envelope(r);
  assert_int_equal(jint(e, "last_checkpoint"), 6);
  json_decref(e);
  lg_run_free(r);
}

static void t_rungs_false(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"repeat\":{\"observe\":false,\"block\":false,\"stop\":false},"
                   "\"failure_streak\":0}");
  for (int i = 1; i <= 12; i++) {
    assert_int_equal(call(r, "ping", "{}", &d), LG_ACT_EXECUTE);
    assert_int_equal(d.repeat, i);
    assert_null(d.message);
    ok(r, &d);
  }
  lg_run_free(r);
  /* Only the block rung off: 3-5 run, the 6th stops. */
  r = mk("{\"repeat\":{\"block\":false}}");
  for (int i = 1; i <= 5; i++) {
    assert_int_equal(call(r, "ping", "{}", &d), LG_ACT_EXECUTE);
    if (i >= 2) contains(d.message, "ping");
    ok(r, &d);
  }
  call(r, "ping", "{}", &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  lg_run_free(r);
  /* Only observe off: no message at 2, block at 3. */
  r = mk("{\"repeat\":{\"observe\":false}}");
  call(r, "ping", "{}", &d);
  ok(r, &d);
  assert_int_equal(call(r, "ping", "{}", &d), LG_ACT_EXECUTE);
  assert_null(d.message);
  ok(r, &d);
  call(r, "ping", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  lg_run_free(r);
  /* Custom rungs: observe 3, block 4, stop 5. */
  r = mk("{\"repeat\":{\"observe\":3,\"block\":4,\"stop\":5}}");
  call(r, "ping", "{}", &d);
  ok(r, &d);
  call(r, "ping", "{}", &d);
  assert_null(d.message);
  ok(r, &d);
  assert_int_equal(call(r, "ping", "{}", &d), LG_ACT_EXECUTE);
  assert_non_null(d.message);
  ok(r, &d);
  call(r, "ping", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  call(r, "ping", "{}", &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  lg_run_free(r);
}

static void t_loop_key_false(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"tools\":{\"poll_job\":{\"loop_key\":false,\"max_calls\":8}}}");
  for (int i = 0; i < 8; i++) {
    callx(r, "poll_job", "{\"job\":1}", ++g_turn, 0, NULL, NULL, &d);
    assert_int_equal(d.action, LG_ACT_EXECUTE);
    assert_int_equal(d.repeat, 0);
    assert_null(d.message);
    ok(r, &d);
    /* Interleaved with another call: no A B A B cycle either. */
    if (i < 2) {
      assert_int_equal(call(r, "status", "{\"n\":1}", &d), LG_ACT_EXECUTE);
      ok(r, &d);
    }
  }
  /* Still capped. */
  call(r, "poll_job", "{\"job\":1}", &d);
  assert_stop(&d, LG_R_TOOL_CALL_CAP, "caps");
  lg_run_free(r);
  /* And still subject to no-progress. */
  r = mk("{\"tools\":{\"poll_job\":{\"loop_key\":false}}}");
  call(r, "poll_job", "{}", &d);
  res_pv(r, 1, &d);
  for (int i = 0; i < 2; i++) {
    call(r, "poll_job", "{}", &d);
    assert_int_equal(res_pv(r, 1, &d), LG_ACT_CONTINUE);
  }
  call(r, "poll_job", "{}", &d);
  res_pv(r, 1, &d);
  assert_stop(&d, LG_R_NO_PROGRESS, "no_progress");
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Idempotency keys.                                                    */

static void t_derived_keys(void **state) {
  (void)state;
  lg_decision_t d;
  const char *p = "{\"tools\":{\"charge\":{\"side_effects\":true}}}";
  lg_ledger_t *l = lg_ledger_memory_new();
  lg_run_t *r = mk_full("run-a", p, NULL, l);
  assert_int_equal(call(r, "charge", "{\"amount\":5}", &d), LG_ACT_EXECUTE);
  assert_non_null(d.idempotency_key);
  char key[256];
  snprintf(key, sizeof key, "%s", d.idempotency_key);
  /* "lg:" + SHA-256 hex of run id "\n" loop key: derived from the run and
   * the loop key, with a fixed length whatever the run id. */
  char material[128], want[LG_FP_HEX];
  snprintf(material, sizeof material, "run-a\n%.64s", d.fingerprint);
  lg_canon_t *c = lg_canon_new();
  assert_int_equal(lg_canon_sha256_hex(c, material, strlen(material), want), 0);
  lg_canon_free(c);
  assert_int_equal(strlen(key), 67);
  assert_memory_equal(key, "lg:", 3);
  assert_memory_equal(key + 3, want, 64);
  res_val(r, NULL, LG_STATUS_PROGRESS, "{\"charged\":5}", -1, "op-1", &d);
  /* The identical write replays, with the same derived key. */
  assert_int_equal(call(r, "charge", "{\"amount\":5}", &d), LG_ACT_REPLAY);
  assert_string_equal(d.idempotency_key, key);
  assert_memory_equal(d.saved_result, "{\"charged\":5}", d.saved_result_len);
  /* A different write runs. */
  assert_int_equal(call(r, "charge", "{\"amount\":6}", &d), LG_ACT_EXECUTE);
  assert_string_not_equal(d.idempotency_key, key);
  ok(r, &d);
  /* A tool without side_effects gets no key. */
  assert_int_equal(call(r, "read", "{}", &d), LG_ACT_EXECUTE);
  assert_null(d.idempotency_key);
  ok(r, &d);
  /* Another run's derived keys are its own. */
  lg_run_t *r2 = mk_full("run-b", p, NULL, l);
  assert_int_equal(call(r2, "charge", "{\"amount\":5}", &d), LG_ACT_EXECUTE);
  assert_string_not_equal(d.idempotency_key, key);
  /* A given key is shared across runs: a restarted run replays. */
  assert_int_equal(callx(r2, "ship", "{\"o\":1}", ++g_turn, 0, NULL, "ship-o1", &d), LG_ACT_EXECUTE);
  res_val(r2, NULL, LG_STATUS_COMPLETE, "{\"t\":1}", -1, NULL, &d);
  lg_run_t *r3 = mk_full("run-c", p, NULL, l);
  assert_int_equal(callx(r3, "ship", "{\"o\":1}", ++g_turn, 0, NULL, "ship-o1", &d), LG_ACT_REPLAY);
  lg_run_free(r3);
  lg_run_free(r2);
  lg_run_free(r);
  lg_ledger_free(l);
}

static void t_invalid_result_keeps_claim(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"tools\":{\"w\":{\"side_effects\":true}},\"repeat\":{\"block\":false}}");
  /* A retryable failure frees the key: the call runs again. */
  call(r, "w", "{}", &d);
  res_st(r, LG_STATUS_RETRYABLE, &d);
  assert_int_equal(call(r, "w", "{}", &d), LG_ACT_EXECUTE);
  /* An invalid result leaves the key claimed (outcome unknown). */
  lg_result_t x = res0(LG_STATUS_INVALID);
  after(r, &x, &d);
  assert_stop(&d, LG_R_INVALID_TOOL_RESULT, "validation");
  json_t *e = envelope(r);
  json_t *ops = json_object_get(e, "operations");
  assert_int_equal(json_array_size(ops), 1);
  assert_string_equal(jstr(json_array_get(ops, 0), "state"), "claimed");
  json_decref(e);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Messages and recovery hints.                                         */

static bool first_person(const char *m) {
  return m && (!strncmp(m, "I ", 2) || strstr(m, " I ") || strstr(m, "I have") || strstr(m, "I am"));
}

static void t_steer_messages(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  ok(r, &d);
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  contains(d.message, "search_crm");
  contains(d.message, "2");
  assert_true(first_person(d.message));
  ok(r, &d);
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  contains(d.message, "search_crm");
  contains(d.message, "3");
  assert_true(first_person(d.message));
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  contains(d.message, "4");
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  call(r, "search_crm", "{\"q\":\"acme\"}", &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, NULL);
  contains(d.message, "search_crm");
  contains(d.message, "6");
  assert_true(first_person(d.message));
  /* The envelope keeps the stop's message. */
  json_t *e = envelope(r);
  assert_string_equal(jstr(e, "message"), d.message);
  json_decref(e);
  lg_run_free(r);
}

static void t_block_hints(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  call(r, "search", "{}", &d);
  assert_null(d.hide_tool);
  assert_int_equal(d.alternatives, 0);
  ok(r, &d);
  call(r, "search", "{}", &d);
  assert_null(d.hide_tool); /* observing only */
  ok(r, &d);
  call(r, "search", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_non_null(d.hide_tool);
  assert_string_equal(d.hide_tool, "search");
  assert_int_equal(d.hide_turns, 2); /* cascade.hide_turns */
  assert_int_equal(d.alternatives, 0); /* cascade.offer is [] by default */
  assert_null(d.escalate_model);
  lg_run_free(r);
  /* With an offer and an escalation in the policy, the block carries them. */
  r = mk("{\"cascade\":{\"hide_turns\":3,\"offer\":[\"ask_human\",\"finalize_partial\"],"
         "\"escalate\":{\"model\":\"big\",\"turns\":1}}}");
  for (int i = 0; i < 2; i++) {
    call(r, "search", "{}", &d);
    ok(r, &d);
  }
  call(r, "search", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_string_equal(d.hide_tool, "search");
  assert_int_equal(d.hide_turns, 3);
  assert_int_equal(d.alternatives, LG_ALT_ASK_HUMAN | LG_ALT_FINALIZE_PARTIAL);
  assert_string_equal(d.escalate_model, "big");
  assert_int_equal(d.escalate_turns, 1);
  lg_run_free(r);
  /* hide_turns 0: never hidden, nothing offered. */
  r = mk("{\"cascade\":{\"hide_turns\":0,\"offer\":[\"ask_human\"]}}");
  for (int i = 0; i < 2; i++) {
    call(r, "search", "{}", &d);
    ok(r, &d);
  }
  call(r, "search", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_null(d.hide_tool);
  assert_int_equal(d.alternatives, 0);
  lg_run_free(r);
}

static void t_next_allowed_action(void **state) {
  (void)state;
  /* Every stop reason through lg_run_stop, and the natural ones agree. */
  for (int reason = LG_R_NONE + 1; reason < LG_R__COUNT; reason++) {
    lg_run_t *r = mk(NULL);
    lg_decision_t d;
    assert_int_equal(lg_run_stop(r, (lg_reason_t)reason, NULL, 0, &d), 0);
    assert_int_equal(d.action, LG_ACT_STOP);
    assert_int_equal(d.reason, reason);
    lg_next_t want;
    switch (reason) {
    case LG_R_COMPLETE: want = LG_NEXT_NONE; break;
    /* Loops resume after a change; a cap would stop a resumed run at once
     * (the run's policy cannot change), so caps go to a person. */
    case LG_R_SAME_CALL_REPEAT:
    case LG_R_SHORT_CYCLE:
    case LG_R_NO_PROGRESS:
    case LG_R_FAILURE_STREAK:
    case LG_R_TEXT_REPEAT:
    case LG_R_MONOLOGUE:
    case LG_R_CONTEXT_LOOP:
    case LG_R_BLOCK_STREAK: want = LG_NEXT_RESUME_AFTER_CHANGE; break;
    default: want = LG_NEXT_HUMAN_REVIEW;
    }
    if (d.next_allowed_action != want)
      fail_msg("%s: next_allowed_action %s, expected %s", lg_reason_name((lg_reason_t)reason),
               lg_next_name(d.next_allowed_action), lg_next_name(want));
    json_t *e = envelope(r);
    assert_string_equal(jstr(e, "next_allowed_action"), lg_next_name(want));
    json_t *alts = json_object_get(e, "alternatives");
    assert_true(json_is_array(alts));
    if (want == LG_NEXT_NONE) assert_int_equal(json_array_size(alts), 0);
    else assert_true(json_array_size(alts) > 0);
    json_decref(e);
    lg_run_free(r);
  }
  assert_string_equal(lg_next_name(LG_NEXT_NONE), "none");
  assert_string_equal(lg_next_name(LG_NEXT_HUMAN_REVIEW), "human_review");
  assert_string_equal(lg_next_name(LG_NEXT_RESUME_AFTER_CHANGE), "resume_after_change");
}

/* ------------------------------------------------------------------ */
/* The terminal envelope.                                               */

static void t_envelope(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk_full("env-run", "{\"tools\":{\"w\":{\"side_effects\":true}}}", NULL, NULL);
  /* An operation with a given key, committed with an operation id. */
  assert_int_equal(callx(r, "w", "{\"id\":1}", ++g_turn, 10, NULL, "k-1", &d), LG_ACT_EXECUTE);
  res_val(r, NULL, LG_STATUS_PROGRESS, "{\"ok\":true}", 1, "op-1", &d);
  /* A write with a derived key that fails for good. */
  assert_int_equal(callx(r, "w", "{\"id\":2}", ++g_turn, 20, NULL, NULL, &d), LG_ACT_EXECUTE);
  char k2[256];
  snprintf(k2, sizeof k2, "%s", d.idempotency_key);
  lg_result_t x = res0(LG_STATUS_RETRYABLE);
  after(r, &x, &d);
  assert_int_equal(callx(r, "w", "{\"id\":2}", ++g_turn, 25, NULL, NULL, &d), LG_ACT_EXECUTE);
  after(r, &x, &d);
  /* The loop. */
  char fp[LG_FP_HEX];
  for (int i = 0; i < 6; i++) {
    callx(r, "search", "{\"q\":\"a\"}", ++g_turn, 30 + i, NULL, NULL, &d);
    if (d.action == LG_ACT_EXECUTE) ok(r, &d);
  }
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  memcpy(fp, d.fingerprint, LG_FP_HEX);
  char refused_id[32];
  snprintf(refused_id, sizeof refused_id, "%s", d.call_id);
  assert_string_equal(refused_id, "c9");

  json_t *e = envelope(r);
  assert_string_equal(jstr(e, "run_id"), "env-run");
  assert_true(json_is_null(json_object_get(e, "group")));
  assert_string_equal(jstr(e, "status"), "stopped");
  assert_string_equal(jstr(e, "terminal_reason"), "same_call_repeat");
  assert_string_equal(jstr(e, "guard"), "repeat");
  assert_string_equal(jstr(e, "next_allowed_action"), "resume_after_change");
  contains(jstr(e, "message"), "search");
  assert_int_equal(jint(e, "stopped_at_ms"), 35);
  assert_true(json_is_null(json_object_get(e, "last_checkpoint")));

  json_t *rc = json_object_get(e, "refused_call");
  assert_true(json_is_object(rc));
  assert_string_equal(jstr(rc, "tool"), "search");
  assert_string_equal(jstr(rc, "call_id"), "c9");
  assert_string_equal(jstr(rc, "fingerprint"), fp);
  assert_string_equal(jstr(rc, "key_material"), "{\"q\":\"a\"}");
  assert_int_equal(jint(rc, "turn"), g_turn);

  json_t *c = json_object_get(e, "counters");
  assert_int_equal(jint(c, "steps"), 5);
  assert_int_equal(jint(c, "calls"), 9);
  assert_int_equal(jint(c, "blocked"), 3);
  assert_int_equal(jint(c, "replayed"), 0);
  assert_int_equal(jint(c, "results"), 5);
  assert_int_equal(jint(c, "model_calls"), 0);
  assert_true(json_is_number(json_object_get(c, "cost_usd")));

  json_t *ops = json_object_get(e, "operations");
  assert_true(json_is_array(ops));
  bool seen1 = false, seen2 = false;
  for (size_t i = 0; i < json_array_size(ops); i++) {
    json_t *o = json_array_get(ops, i);
    if (!strcmp(jstr(o, "key"), "k-1")) {
      seen1 = true;
      assert_string_equal(jstr(o, "state"), "committed");
      assert_string_equal(jstr(o, "operation_id"), "op-1");
    } else if (!strcmp(jstr(o, "key"), k2)) {
      seen2 = true;
      assert_string_equal(jstr(o, "state"), "released");
    }
  }
  assert_true(seen1 && seen2);

  json_t *tried = json_object_get(e, "tried");
  assert_true(json_is_array(tried));
  assert_int_equal(json_array_size(tried), 3);
  json_t *t0 = json_array_get(tried, 0); /* most asked-for first */
  assert_string_equal(jstr(t0, "tool"), "search");
  assert_string_equal(jstr(t0, "fingerprint"), fp);
  assert_int_equal(jint(t0, "count"), 6);
  assert_string_equal(jstr(t0, "last"), "blocked");
  bool w1 = false, w2 = false;
  for (size_t i = 1; i < 3; i++) {
    json_t *t = json_array_get(tried, i);
    assert_string_equal(jstr(t, "tool"), "w");
    if (jint(t, "count") == 1) {
      w1 = true;
      assert_string_equal(jstr(t, "last"), "progress");
    } else {
      w2 = true;
      assert_int_equal(jint(t, "count"), 2);
      assert_string_equal(jstr(t, "last"), "retryable");
    }
  }
  assert_true(w1 && w2);
  json_decref(e);
  lg_run_free(r);

  /* An active run: no terminal reason, no refused call. */
  r = mk(NULL);
  e = envelope(r);
  assert_string_equal(jstr(e, "status"), "active");
  assert_true(json_is_null(json_object_get(e, "terminal_reason")));
  assert_true(json_is_null(json_object_get(e, "refused_call")));
  assert_true(json_is_null(json_object_get(e, "next_allowed_action")));
  json_decref(e);
  lg_run_free(r);
}

static void t_envelope_cost(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  model(r, 100, 50, 1500, 0, &d);
  assert_int_equal(lg_run_usage(r, d.reservation, 100, 20, 1234, 0), 0);
  json_t *e = envelope(r);
  json_t *c = json_object_get(e, "counters");
  assert_true(json_real_value(json_object_get(c, "cost_usd")) > 1.2339e-6 &&
              json_real_value(json_object_get(c, "cost_usd")) < 1.2341e-6);
  assert_int_equal(jint(c, "tokens"), 120);
  assert_int_equal(jint(c, "model_calls"), 1);
  json_decref(e);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* After a stop, and bad input.                                         */

static void t_events_after_stop(void **state) {
  (void)state;
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *r = mk(NULL);
  assert_int_equal(callx(r, "a", "{}", 1, 0, "p1", NULL, &d), LG_ACT_EXECUTE); /* left pending */
  assert_int_equal(callx(r, "b", "{}", 1, 0, "p2", NULL, &d), LG_ACT_EXECUTE);
  res_val(r, "p2", LG_STATUS_FATAL, NULL, -1, NULL, &d);
  assert_stop(&d, LG_R_FATAL, "status");
  snap_t s = snap(r);
  call(r, "c", "{}", &d);
  assert_stop(&d, LG_R_FATAL, "status");
  assert_string_equal(d.reason_text, "fatal");
  res_val(r, "p1", LG_STATUS_PROGRESS, "1", -1, NULL, &d);
  assert_stop(&d, LG_R_FATAL, NULL);
  model(r, 1, 1, 1, 0, &d);
  assert_stop(&d, LG_R_FATAL, NULL);
  world(r, "{}", &d);
  assert_stop(&d, LG_R_FATAL, NULL);
  assert_int_equal(lg_run_handoff(r, "x", "y", 0, &d, &err), 0);
  assert_stop(&d, LG_R_FATAL, NULL);
  assert_int_equal(lg_run_cancel(r, "late", 0, &d), 0);
  assert_stop(&d, LG_R_FATAL, NULL);
  assert_string_equal(d.reason_text, "fatal");
  assert_int_equal(lg_run_stop(r, LG_R_BUDGET_EXCEEDED, NULL, 0, &d), 0);
  assert_stop(&d, LG_R_FATAL, NULL);
  snap_same(r, &s);
  assert_string_equal(lg_run_terminal_reason(r), "fatal");
  lg_run_free(r);
}

static void t_unknown_call_ids(void **state) {
  (void)state;
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *r = mk(NULL);
  lg_result_t x = res0(LG_STATUS_PROGRESS);
  assert_int_equal(lg_run_after(r, &x, &d, &err), LG_ENOTFOUND); /* nothing pending */
  assert_int_equal(callx(r, "a", "{}", 1, 0, "id-1", NULL, &d), LG_ACT_EXECUTE);
  snap_t s = snap(r);
  x.call_id = "nope";
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_run_after(r, &x, &d, &err), LG_ENOTFOUND);
  assert_string_equal(err.field, "call_id");
  snap_same(r, &s);
  x.call_id = "id-1";
  assert_int_equal(after(r, &x, &d), LG_ACT_CONTINUE);
  assert_string_equal(d.call_id, "id-1");
  assert_int_equal(lg_run_after(r, &x, &d, &err), LG_ENOTFOUND); /* twice */
  /* Default ids are c<N>; a result without an id is for the latest call. */
  assert_int_equal(callx(r, "b", "{}", 2, 0, NULL, NULL, &d), LG_ACT_EXECUTE);
  assert_string_equal(d.call_id, "c2");
  assert_int_equal(callx(r, "c", "{}", 2, 0, NULL, NULL, &d), LG_ACT_EXECUTE);
  assert_string_equal(d.call_id, "c3");
  x.call_id = NULL;
  assert_int_equal(after(r, &x, &d), LG_ACT_CONTINUE);
  assert_string_equal(d.call_id, "c3");
  /* Out of order is fine. */
  x.call_id = "c2";
  assert_int_equal(after(r, &x, &d), LG_ACT_CONTINUE);
  assert_string_equal(d.call_id, "c2");
  lg_run_free(r);
}

static void t_malformed_args(void **state) {
  (void)state;
  lg_decision_t d;
  lg_error_t err;
  lg_run_t *r = mk(NULL);
  call(r, "a", "{\"k\":1}", &d);
  ok(r, &d);
  assert_int_equal(call(r, "a", "{\"k\":1}", &d), LG_ACT_EXECUTE);
  ok(r, &d);
  snap_t s = snap(r);
  static const char *bad[] = {"{\"k\":", "{\"k\":1,}", "{\"k\":1}x", "{\"k\":tru}",
                              "{\"k\":1,\"k\":2}", "\xff", "{\"k\":\"\xc3\"}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&err, 0, sizeof err);
    int rc = try_call(r, "a", bad[i], 9, 0, NULL, NULL, &d, &err);
    if (rc >= 0) fail_msg("args %s accepted", bad[i]);
    assert_true(err.code == rc);
  }
  /* JSON, but not an object: trace-v1's args is one (a gateway call's
   * arguments are a model's text; one of these was recorded once, and its
   * trace did not replay). */
  static const char *not_object[] = {"null", "[1]", " 7", "\"s\"", "true", "  "};
  for (size_t i = 0; i < sizeof not_object / sizeof not_object[0]; i++) {
    memset(&err, 0, sizeof err);
    assert_int_equal(try_call(r, "a", not_object[i], 9, 0, NULL, NULL, &d, &err), LG_EINVAL);
    contains(err.message, "args: expected an object");
  }
  memset(&err, 0, sizeof err);
  assert_int_equal(try_call(r, NULL, "{}", 9, 0, NULL, NULL, &d, &err), LG_EINVAL);
  assert_int_equal(try_call(r, "", "{}", 9, 0, NULL, NULL, &d, &err), LG_EINVAL);
  /* A bad precomputed fingerprint. */
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = "a";
  c.fingerprint = "XYZ";
  assert_int_equal(lg_run_before(r, C, &c, &d, &err), LG_EINVAL);
  snap_same(r, &s);
  /* The run goes on as if nothing happened: this is the 3rd identical. */
  call(r, "a", "{\"k\":1}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT);
  assert_int_equal(d.repeat, 3);
  assert_string_equal(d.call_id, "c3");
  lg_run_free(r);
}

static void t_precomputed_fingerprint(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  char hex[LG_FP_HEX];
  const char *km;
  size_t kml;
  assert_int_equal(lg_canon_fingerprint(C, NULL, "a", "{\"b\":1,\"a\":2}", 13, hex, &km, &kml, NULL), 0);
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = "a";
  c.fingerprint = hex;
  c.turn = 1;
  assert_int_equal(lg_run_before(r, C, &c, &d, NULL), 0);
  assert_string_equal(d.fingerprint, hex);
  ok(r, &d);
  /* The engine's own fingerprint of the same arguments is the same loop key. */
  assert_int_equal(callx(r, "a", "{\"a\":2,\"b\":1.0}", 2, 0, NULL, NULL, &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 2);
  lg_run_free(r);
}

static void t_names(void **state) {
  (void)state;
  assert_string_equal(lg_reason_name(LG_R_SAME_CALL_REPEAT), "same_call_repeat");
  assert_string_equal(lg_reason_name(LG_R_OPERATOR_CANCELLED), "operator_cancelled_loop");
  assert_string_equal(lg_reason_name(LG_R_NONE), "");
  assert_string_equal(lg_reason_name((lg_reason_t)999), "");
  assert_string_equal(lg_action_name(LG_ACT_REPLAY), "replay");
  assert_string_equal(lg_status_name(LG_STATUS_PERMISSION_DENIED), "permission_denied");
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_null(lg_run_new(NULL, NULL, NULL, NULL, NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
  assert_null(lg_run_new("", NULL, NULL, NULL, NULL, NULL));
  lg_run_t *r = mk_full("id", NULL, NULL, NULL);
  assert_string_equal(lg_run_id(r), "id");
  assert_null(lg_run_group(r));
  assert_non_null(lg_run_policy(r));
  assert_null(lg_run_terminal_reason(r));
  lg_run_free(r);
  lg_run_free(NULL);
}

/* ------------------------------------------------------------------ */
/* Short cycles up to period 8; the block streak.                       */

static void t_cycle_periods_to_8(void **state) {
  (void)state;
  const char *P8 = "{\"cycle\":{\"max_period\":8}}";
  cycle_case(P8, "abcdeabcde", true);
  cycle_case(P8, "abcdefabcdef", true);
  cycle_case(P8, "abcdefgabcdefg", true);
  cycle_case(P8, "abcdefghabcdefgh", true);
  cycle_case(P8, "abcdefghiabcdefghi", false); /* period 9 > 8 */
  cycle_case("{\"cycle\":{\"max_period\":6}}", "abcdefgabcdefg", false);
}

/* A B C D E A B C D E ...: no key reaches the stop rung inside the window
 * and the period is above cycle.max_period, so before block_streak every
 * call from the third round on was blocked, for ever. */
static void t_block_streak_five_cycle(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  int stopped_at = 0;
  for (int i = 0; i < 60 && !stopped_at; i++) {
    char tool[2] = {(char)('a' + i % 5), 0};
    lg_action_t a = call(r, tool, "{}", &d);
    if (a == LG_ACT_EXECUTE) ok(r, &d);
    else if (a == LG_ACT_STOP) stopped_at = i + 1;
    else assert_block(&d, LG_R_SAME_CALL_REPEAT);
  }
  assert_int_equal(stopped_at, 15); /* round 3: five blocks in a row */
  assert_stop(&d, LG_R_BLOCK_STREAK, "block_streak");
  assert_string_equal(d.reason_text, "block_streak");
  assert_int_equal(d.next_allowed_action, LG_NEXT_RESUME_AFTER_CHANGE);
  contains(d.message, "refused");
  json_t *e = envelope(r);
  assert_string_equal(jstr(e, "terminal_reason"), "block_streak");
  assert_string_equal(jstr(json_object_get(e, "refused_call"), "tool"), "e");
  json_decref(e);
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.blocked, 4);
  lg_run_free(r);
  /* Turned off, the same loop is blocked forever: the motivation. */
  r = mk("{\"block_streak\":0}");
  for (int i = 0; i < 60; i++) {
    char tool[2] = {(char)('a' + i % 5), 0};
    lg_action_t a = call(r, tool, "{}", &d);
    assert_true(a != LG_ACT_STOP);
    if (a == LG_ACT_EXECUTE) ok(r, &d);
  }
  lg_run_free(r);
}

static void t_block_streak_reset_by_execution(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk("{\"block_streak\":2}");
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT); /* streak 1 */
  assert_int_equal(call(r, "b", "{}", &d), LG_ACT_EXECUTE); /* ends it */
  ok(r, &d);
  call(r, "a", "{}", &d);
  assert_block(&d, LG_R_SAME_CALL_REPEAT); /* streak 1 again */
  call(r, "a", "{}", &d);
  assert_stop(&d, LG_R_BLOCK_STREAK, "block_streak");
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Text loops.                                                          */

static lg_action_t text(lg_run_t *r, int64_t turn, const char *s, lg_decision_t *d) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_run_text(r, turn, s, strlen(s), NULL, 0, d, &err);
  if (rc) fail_msg("lg_run_text: %s: %s", lg_err_name(rc), err.message);
  return d->action;
}

/* Feeds s as one response in pieces of `step` bytes (0: pseudo-random
 * sizes from seed); returns the end offset of the piece whose decision was
 * not CONTINUE (0 when none), and that decision in *d. A later piece must
 * not be decided differently again unless the run stopped. */
static char g_msg[512]; /* the message of pieces()'s decision (borrowed ones do not last) */
static size_t pieces(lg_run_t *r, int64_t turn, const char *s, size_t step, unsigned seed,
                     lg_decision_t *d, lg_action_t *act) {
  size_t n = strlen(s), at = 0, i = 0;
  *act = LG_ACT_CONTINUE;
  while (i < n) {
    size_t k = step;
    if (!k) {
      seed = seed * 1103515245u + 12345u;
      k = 1 + (seed >> 16) % 9;
    }
    if (k > n - i) k = n - i;
    lg_decision_t x;
    lg_error_t err;
    memset(&err, 0, sizeof err);
    assert_int_equal(lg_run_text(r, turn, s + i, k, NULL, 0, &x, &err), 0);
    i += k;
    if (x.action != LG_ACT_CONTINUE && !at) {
      at = i;
      *act = x.action;
      *d = x;
      snprintf(g_msg, sizeof g_msg, "%s", x.message ? x.message : "");
      d->message = g_msg;
    } else if (x.action != LG_ACT_CONTINUE && *act != LG_ACT_STOP) {
      fail_msg("a second %s at byte %zu of one response", lg_action_name(x.action), i);
    }
  }
  return at;
}

/* s as one response is a loop, found at the same byte however it is cut
 * (in pieces of 1..13 bytes, and random ones, mid-UTF-8 included). */
static void chant_case(const char *s) {
  lg_decision_t d;
  lg_action_t act;
  lg_run_t *r = mk(NULL);
  size_t exact = pieces(r, 1, s, 1, 0, &d, &act);
  if (!exact) fail_msg("not seen as a loop: \"%s\"", s);
  assert_int_equal(act, LG_ACT_OBSERVE);
  assert_int_equal(d.reason, LG_R_TEXT_REPEAT);
  assert_string_equal(d.guard, "text");
  contains(d.message, "I have been repeating");
  lg_run_free(r);
  for (size_t step = 0; step <= 13; step++) {
    for (unsigned seed = 1; seed <= (step ? 1u : 20u); seed++) {
      r = mk(NULL);
      size_t at = pieces(r, 1, s, step, seed, &d, &act);
      assert_int_equal(act, LG_ACT_OBSERVE);
      /* The piece that holds the completing byte says so. */
      if (!(at >= exact && (step ? at - exact < step : at - exact < 9)))
        fail_msg("step %zu seed %u: seen at %zu, the loop ends at byte %zu", step, seed, at, exact);
      lg_run_free(r);
    }
  }
}

static void calm_case(const char *s) {
  for (size_t step = 0; step <= 7; step++) {
    lg_decision_t d;
    lg_action_t act;
    lg_run_t *r = mk(NULL);
    size_t at = pieces(r, 1, s, step, 7, &d, &act);
    if (at) fail_msg("seen as a loop at byte %zu (pieces of %zu): \"%s\"", at, step, s);
    lg_run_free(r);
  }
}

static void t_text_chanting(void **state) {
  (void)state;
  /* A sentence said over and over. */
  chant_case("Let me look at the logs first. Let me look at the logs first. Let me look at the "
             "logs first. Let me look at the logs first.");
  /* A paragraph of two sentences, three times, blank lines between. */
  chant_case("I checked the build.\nIt still fails on the same test, so I will try again.\n\n"
             "I checked the build.\nIt still fails on the same test, so I will try again.\n\n"
             "I checked the build.\nIt still fails on the same test, so I will try again.\n\n");
  /* A short block of words with no punctuation at all. */
  chant_case("now retrying the request now retrying the request now retrying the request now "
             "retrying the request now retrying");
  /* Non-ASCII text: pieces cut inside characters. */
  chant_case("Je vérifie le fichier à nouveau. Je vérifie le fichier à nouveau. "
             "Je vérifie le fichier à nouveau. 日本語のテキストです。");
  chant_case("日本語 の テキスト 日本語 の テキスト 日本語 の テキスト 日本語 の テキスト end");
  /* After ordinary prose, and indented. */
  chant_case("Here is what I found so far about the issue.\n"
             "  Checking again the same thing. Checking again the same thing. Checking again "
             "the same thing.\n");
}

static void t_text_not_loops(void **state) {
  (void)state;
  /* Code blocks repeat on purpose. */
  calm_case("Here is the fix:\n```c\nx = x + 1;\nx = x + 1;\nx = x + 1;\nx = x + 1;\n"
            "x = x + 1;\nx = x + 1;\nx = x + 1;\nx = x + 1;\n```\nThat is all.");
  calm_case("Indented code:\n\n    x = x + 1;\n    x = x + 1;\n    x = x + 1;\n    x = x + 1;\n"
            "\tx = x + 1;\n\tx = x + 1;\n\tx = x + 1;\n\nDone.");
  calm_case("~~~\nok ok ok ok ok ok ok ok ok ok\nok ok ok ok ok ok ok ok ok ok\n~~~\nDone.");
  /* Tables. */
  calm_case("| name | value |\n|------|-------|\n| a | 0 |\n| a | 0 |\n| a | 0 |\n| a | 0 |\n"
            "| a | 0 |\n| a | 0 |\n");
  /* Lists whose items share a long prefix, or are the same. */
  calm_case("- Step 1: run the build and read the output carefully.\n"
            "- Step 2: run the build and read the output carefully.\n"
            "- Step 3: run the build and read the output carefully.\n"
            "- Step 4: run the build and read the output carefully.\n"
            "- Step 5: run the build and read the output carefully.\n");
  calm_case("1. Check the file for errors again.\n2. Check the file for errors again.\n"
            "3. Check the file for errors again.\n4. Check the file for errors again.\n"
            "10) Check the file for errors again.\n");
  calm_case("* same item text here\n* same item text here\n* same item text here\n"
            "* same item text here\n+ same item text here\n");
  /* Divider lines. */
  calm_case("Part one is done.\n----\n----\n----\n----\n====\n====\n====\n***\n***\n***\n"
            "_____\n_____\n_____\nPart two starts.\n");
  /* Headings. */
  calm_case("# Notes\n# Notes\n# Notes\n# Notes\n## Notes\n## Notes\n");
  /* A phrase that comes back far apart. */
  calm_case("Let me check the config file. It has a port setting that looks wrong. "
            "Let me check the config file. The logs say the server started on 8080. "
            "Let me check the config file. Then I will restart the service and test it. "
            "Let me check the config file.");
  /* Emphasis is not chanting. */
  calm_case("No, no, no. That is not it. Very very very good work on this.");
  /* The same short sentence three times is below the sentence floor. */
  calm_case("Done. Done. Done.");
}

/* Random texts of words, punctuation, fences, tables, lists, dividers and
 * multi-byte characters: however a text is cut, the detector finds a loop
 * (or none) at the same byte. */
static void t_text_any_cut(void **state) {
  (void)state;
  static const char *tok[] = {"the ", "cat ", "sat. ", "\n", "```\n", "| a |\n", "- x\n",
                              "日本 ", "again ", "----\n", "  ", "try it now. ", "é", "\t",
                              "1. ", "~~~", "#", "go go ", "?", "    x\n"};
  unsigned seed = 12345;
  int loops = 0;
  for (int k = 0; k < 300; k++) {
    char buf[700];
    size_t n = 0;
    while (n < 600) {
      seed = seed * 1103515245u + 12345u;
      const char *t = tok[(seed >> 16) % (sizeof tok / sizeof tok[0])];
      /* Runs of one token make loops likely enough to test both ways. */
      int reps = (seed >> 8) % 7 == 0 ? 6 : 1;
      for (int r = 0; r < reps && n + strlen(t) < sizeof buf - 1; r++) {
        memcpy(buf + n, t, strlen(t));
        n += strlen(t);
      }
    }
    buf[n] = 0;
    lg_decision_t d;
    lg_action_t act;
    lg_run_t *r = mk(NULL);
    size_t exact = pieces(r, 1, buf, 1, 0, &d, &act);
    lg_run_free(r);
    loops += exact != 0;
    for (unsigned cut = 1; cut <= 3; cut++) {
      r = mk(NULL);
      size_t at = pieces(r, 1, buf, 0, seed + cut, &d, &act);
      lg_run_free(r);
      if ((exact == 0) != (at == 0) || (exact && (at < exact || at - exact >= 9)))
        fail_msg("text %d cut %u: loop at %zu byte by byte, at %zu in pieces", k, cut, exact, at);
    }
  }
  assert_true(loops > 0 && loops < 300); /* both kinds were tried */
}

static void t_text_ladder(void **state) {
  (void)state;
  const char *loop = "I will try once more. I will try once more. I will try once more. ";
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(text(r, 1, "Thinking about it.", &d), LG_ACT_CONTINUE);
  assert_null(d.message);
  assert_int_equal(text(r, 2, loop, &d), LG_ACT_OBSERVE); /* observe: 1 */
  assert_string_equal(lg_action_name(d.action), "observe");
  /* The same response looping on counts once. */
  assert_int_equal(text(r, 2, loop, &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 2, loop, &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 3, "Something else entirely.", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 4, loop, &d), LG_ACT_STOP); /* stop: 2 */
  assert_stop(&d, LG_R_TEXT_REPEAT, "text");
  assert_int_equal(d.next_allowed_action, LG_NEXT_RESUME_AFTER_CHANGE);
  assert_string_equal(lg_run_terminal_reason(r), "text_repeat");
  assert_int_equal(text(r, 5, "more", &d), LG_ACT_STOP); /* after the stop */
  lg_run_free(r);
  /* Rungs turned off. */
  r = mk("{\"text\":{\"repeat\":{\"observe\":false,\"stop\":1}}}");
  assert_int_equal(text(r, 1, loop, &d), LG_ACT_STOP);
  lg_run_free(r);
  r = mk("{\"text\":{\"repeat\":{\"observe\":false,\"stop\":false},\"monologue\":0}}");
  for (int i = 1; i < 6; i++) assert_int_equal(text(r, i, loop, &d), LG_ACT_CONTINUE);
  lg_run_free(r);
  r = mk("{\"text\":{\"repeat\":{\"observe\":2,\"stop\":false},\"monologue\":0}}");
  assert_int_equal(text(r, 1, loop, &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 2, loop, &d), LG_ACT_OBSERVE);
  assert_int_equal(text(r, 3, loop, &d), LG_ACT_OBSERVE);
  lg_run_free(r);
  /* Bad input changes nothing. */
  r = mk(NULL);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_run_text(r, 1, NULL, 3, NULL, 0, &d, &err), LG_EINVAL);
  assert_int_equal(lg_run_text(r, 1, NULL, 0, NULL, 0, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  lg_run_free(r);
}

static void t_monologue(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  assert_int_equal(text(r, 1, "I should look at the config file.", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 2, "I should  look at\nthe config file. ", &d), LG_ACT_CONTINUE);
  /* The third turn, in pieces: equal only once the last one is in. */
  assert_int_equal(text(r, 3, "  I should look", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 3, " at the config", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 3, " file.", &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_MONOLOGUE, "monologue");
  contains(d.message, "3 turns");
  assert_int_equal(d.next_allowed_action, LG_NEXT_RESUME_AFTER_CHANGE);
  lg_run_free(r);
  /* Different words are different text. */
  r = mk(NULL);
  text(r, 1, "I should look at the config file.", &d);
  text(r, 2, "I should look at the config file.", &d);
  assert_int_equal(text(r, 3, "I should look at the main file.", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 4, "I should look at the main file.", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 5, "I should look at the main file.", &d), LG_ACT_STOP);
  lg_run_free(r);
  /* An executed call between the turns breaks it; a blocked one does not. */
  r = mk(NULL);
  text(r, 1, "Let me search.", &d);
  assert_int_equal(callx(r, "search", "{}", 1, 0, NULL, NULL, &d), LG_ACT_EXECUTE);
  ok(r, &d);
  text(r, 2, "Let me search.", &d);
  callx(r, "search", "{}", 2, 0, NULL, NULL, &d);
  ok(r, &d);
  assert_int_equal(text(r, 3, "Let me search.", &d), LG_ACT_CONTINUE);
  assert_int_equal(text(r, 4, "Let me search.", &d), LG_ACT_CONTINUE);
  assert_int_equal(callx(r, "search", "{}", 4, 0, NULL, NULL, &d), LG_ACT_BLOCK);
  assert_int_equal(text(r, 5, "Let me search.", &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_MONOLOGUE, "monologue");
  lg_run_free(r);
  /* Off, and a policy of 2. */
  r = mk("{\"text\":{\"monologue\":0}}");
  for (int i = 1; i < 8; i++) assert_int_equal(text(r, i, "Same again.", &d), LG_ACT_CONTINUE);
  lg_run_free(r);
  r = mk("{\"text\":{\"monologue\":2}}");
  text(r, 1, "Same again.", &d);
  assert_int_equal(text(r, 2, "Same again.", &d), LG_ACT_STOP);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Episodes, compactions, resume.                                       */

static void t_user_new_episode(void **state) {
  (void)state;
  lg_decision_t d;
  lg_counters_t c;
  lg_run_t *r = mk("{\"limits\":{\"max_steps\":6},\"failure_streak\":2,\"compaction\":{\"max\":2}}");
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "a", "{}", &d);
  assert_int_equal(d.repeat, 2);
  res_st(r, LG_STATUS_RETRYABLE, &d); /* failure streak 1 */
  assert_int_equal(lg_run_compaction(r, 0, &d), 0); /* compaction 1 */
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  text(r, 50, "Again and again we go. Again and again we go. Again and again we go. ", &d);
  assert_int_equal(d.action, LG_ACT_OBSERVE); /* text loop 1 */
  assert_int_equal(lg_run_user(r, 5, &d), 0);
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  /* Loop guards start again... */
  call(r, "a", "{}", &d);
  assert_int_equal(d.repeat, 1);
  assert_null(d.message);
  res_st(r, LG_STATUS_RETRYABLE, &d);
  assert_int_equal(d.action, LG_ACT_CONTINUE); /* streak 1, not 2 */
  assert_int_equal(text(r, 51, "Again and again we go. Again and again we go. Again and again we go. ", &d),
                   LG_ACT_OBSERVE); /* the first text loop of the episode */
  assert_int_equal(lg_run_compaction(r, 0, &d), 0);
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  /* ...caps and counters carry on. */
  lg_run_counters(r, &c);
  assert_int_equal(c.steps, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(call(r, "b", i ? "{\"i\":1}" : "{}", &d) == LG_ACT_EXECUTE || i == 2, 1);
    if (d.action == LG_ACT_EXECUTE) ok(r, &d);
  }
  call(r, "z", "{}", &d);
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  assert_int_equal(lg_run_user(r, 9, &d), 0); /* a stopped run stays stopped */
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  lg_run_free(r);
}

static void t_compaction_loop(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  for (int i = 0; i < 9; i++) {
    assert_int_equal(lg_run_compaction(r, i, &d), 0);
    assert_int_equal(d.action, LG_ACT_CONTINUE);
  }
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE); /* starts the count again */
  ok(r, &d);
  for (int i = 0; i < 9; i++) {
    assert_int_equal(lg_run_compaction(r, 10 + i, &d), 0);
    assert_int_equal(d.action, LG_ACT_CONTINUE);
  }
  assert_int_equal(lg_run_compaction(r, 30, &d), 0);
  assert_stop(&d, LG_R_CONTEXT_LOOP, "compaction");
  assert_string_equal(d.reason_text, "context_loop");
  contains(d.message, "10 times");
  lg_run_free(r);
  r = mk("{\"compaction\":{\"max\":0}}");
  for (int i = 0; i < 40; i++) {
    assert_int_equal(lg_run_compaction(r, i, &d), 0);
    assert_int_equal(d.action, LG_ACT_CONTINUE);
  }
  lg_run_free(r);
}

static void t_resume(void **state) {
  (void)state;
  lg_decision_t d;
  lg_error_t err;
  lg_counters_t c;
  lg_run_t *r = mk("{\"repeat\":{\"stop\":3,\"block\":false}}");
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, &err), LG_ESTATE); /* active */
  assert_true(strlen(err.message) > 0);
  for (int i = 0; i < 2; i++) {
    call(r, "a", "{}", &d);
    ok(r, &d);
  }
  call(r, "a", "{}", &d);
  assert_stop(&d, LG_R_SAME_CALL_REPEAT, "repeat");
  int64_t pv = 42;
  assert_int_equal(lg_run_resume(r, &pv, 100, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  assert_false(lg_run_stopped(r));
  assert_null(lg_run_terminal_reason(r));
  json_t *e = envelope(r);
  assert_true(json_is_null(json_object_get(e, "terminal_reason")));
  assert_true(json_is_null(json_object_get(e, "refused_call")));
  assert_int_equal(jint(e, "last_checkpoint"), 42);
  json_decref(e);
  lg_run_counters(r, &c);
  assert_int_equal(c.steps, 2); /* counters carry on */
  assert_int_equal(c.calls, 3);
  /* A fresh window: the same call is the first again. */
  assert_int_equal(call(r, "a", "{}", &d), LG_ACT_EXECUTE);
  assert_int_equal(d.repeat, 1);
  ok(r, &d);
  lg_run_free(r);
  /* Stops that a resume cannot cure. */
  r = mk("{\"limits\":{\"max_steps\":1}}");
  call(r, "a", "{}", &d);
  ok(r, &d);
  call(r, "b", "{}", &d);
  assert_stop(&d, LG_R_STEP_CAP, "caps");
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, &err), LG_ESTATE);
  contains(err.message, "step_cap");
  assert_true(lg_run_stopped(r));
  lg_run_free(r);
  r = mk(NULL);
  lg_run_cancel(r, NULL, 0, &d);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, NULL), LG_ESTATE);
  lg_run_free(r);
  r = mk(NULL);
  call(r, "a", "{}", &d);
  res_st(r, LG_STATUS_COMPLETE, &d);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, NULL), LG_ESTATE);
  lg_run_free(r);
  r = mk(NULL);
  lg_run_stop(r, LG_R_BUDGET_EXCEEDED, NULL, 0, &d);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, NULL), LG_ESTATE);
  lg_run_free(r);
  /* A text loop stop resumes, with the text ladder fresh. */
  r = mk("{\"text\":{\"repeat\":{\"observe\":false,\"stop\":1}}}");
  const char *loop = "Trying the same thing. Trying the same thing. Trying the same thing. ";
  assert_int_equal(text(r, 1, loop, &d), LG_ACT_STOP);
  assert_int_equal(lg_run_resume(r, NULL, 0, &d, NULL), 0);
  assert_int_equal(text(r, 2, "A fresh start.", &d), LG_ACT_CONTINUE);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* The recovery cascade.                                                */

static lg_run_t *blocked_run(const char *pjson, lg_decision_t *d) {
  lg_run_t *r = mk(pjson);
  for (int i = 0; i < 2; i++) {
    call(r, "search", "{}", d);
    ok(r, d);
  }
  call(r, "search", "{}", d);
  assert_block(d, LG_R_SAME_CALL_REPEAT);
  return r;
}

static void t_cascade_hide_and_escalate(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = blocked_run("{\"cascade\":{\"hide_turns\":2,\"offer\":[\"ask_human\"],"
                            "\"escalate\":{\"model\":\"big\",\"turns\":3}}}", &d);
  assert_int_equal(model(r, 10, 10, 0, 0, &d), LG_ACT_EXECUTE);
  assert_string_equal(d.hide_tool, "search");
  assert_int_equal(d.hide_turns, 2);
  assert_int_equal(d.alternatives, LG_ALT_ASK_HUMAN);
  assert_string_equal(d.escalate_model, "big");
  assert_int_equal(d.escalate_turns, 3);
  assert_int_equal(model(r, 10, 10, 0, 0, &d), LG_ACT_EXECUTE);
  assert_string_equal(d.hide_tool, "search");
  assert_int_equal(d.hide_turns, 1);
  assert_int_equal(d.escalate_turns, 2);
  assert_int_equal(model(r, 10, 10, 0, 0, &d), LG_ACT_EXECUTE);
  assert_null(d.hide_tool); /* hidden for two model calls */
  assert_int_equal(d.alternatives, 0);
  assert_string_equal(d.escalate_model, "big");
  assert_int_equal(d.escalate_turns, 1);
  assert_int_equal(model(r, 10, 10, 0, 0, &d), LG_ACT_EXECUTE);
  assert_null(d.escalate_model);
  assert_int_equal(d.escalate_turns, 0);
  /* The offer is over: ask_human is a tool call like any other. */
  assert_int_equal(call(r, "ask_human", "{\"q\":\"?\"}", &d), LG_ACT_EXECUTE);
  lg_run_free(r);
  /* Without a block nothing is hidden or escalated. */
  r = mk("{\"cascade\":{\"escalate\":{\"model\":\"big\"}}}");
  model(r, 10, 10, 0, 0, &d);
  assert_null(d.hide_tool);
  assert_null(d.escalate_model);
  lg_run_free(r);
}

static void t_cascade_offered_tools(void **state) {
  (void)state;
  lg_decision_t d;
  const char *P = "{\"cascade\":{\"offer\":[\"ask_human\",\"finalize_partial\"]}}";
  lg_run_t *r = blocked_run(P, &d);
  model(r, 10, 10, 0, 0, &d);
  assert_int_equal(call(r, "ask_human", "{\"question\":\"Which invoice?\",\"n\":1}", &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_HUMAN_REQUIRED, "cascade");
  assert_int_equal(d.next_allowed_action, LG_NEXT_HUMAN_REVIEW);
  json_t *e = envelope(r);
  json_t *q = json_object_get(e, "question");
  assert_true(json_is_object(q));
  assert_string_equal(jstr(q, "question"), "Which invoice?");
  assert_true(json_is_null(json_object_get(e, "partial")));
  json_decref(e);
  lg_run_free(r);
  /* finalize_partial right after the block (before any model call). */
  r = blocked_run(P, &d);
  assert_int_equal(call(r, "finalize_partial", "{\"answer\":\"2 of 3 done\"}", &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_COMPLETE, "cascade");
  assert_int_equal(d.next_allowed_action, LG_NEXT_NONE);
  e = envelope(r);
  assert_string_equal(jstr(json_object_get(e, "partial"), "answer"), "2 of 3 done");
  assert_true(json_is_null(json_object_get(e, "question")));
  json_decref(e);
  lg_run_free(r);
  /* A question too long to keep whole is kept as a string of its start. */
  r = blocked_run(P, &d);
  size_t big = 20000;
  char *args = malloc(big + 32);
  int len = snprintf(args, big + 32, "{\"question\":\"");
  memset(args + len, 'q', big);
  strcpy(args + len + big, "\"}");
  assert_int_equal(call(r, "ask_human", args, &d), LG_ACT_STOP);
  free(args);
  e = envelope(r);
  q = json_object_get(e, "question");
  assert_true(json_is_string(q));
  assert_int_equal(json_string_length(q), 16384);
  json_decref(e);
  lg_run_free(r);
  /* Not offered by the policy, or no block: an ordinary call. */
  r = blocked_run("{\"cascade\":{\"offer\":[\"finalize_partial\"]}}", &d);
  assert_int_equal(call(r, "ask_human", "{}", &d), LG_ACT_EXECUTE);
  lg_run_free(r);
  r = mk(P);
  assert_int_equal(call(r, "ask_human", "{}", &d), LG_ACT_EXECUTE);
  lg_run_free(r);
}

/* ------------------------------------------------------------------ */
/* Saturating counters, and money in the envelope.                      */

static void t_saturating_counters(void **state) {
  (void)state;
  lg_decision_t d;
  lg_counters_t c;
  lg_run_t *r = mk("{\"limits\":{\"max_tokens\":1000}}");
  assert_int_equal(model(r, INT64_MAX, 10, -1, 0, &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_TOKEN_CAP, "caps");
  lg_run_free(r);
  r = mk("{\"limits\":{\"max_tokens\":1000}}");
  assert_int_equal(model(r, 10, INT64_MAX, -1, 0, &d), LG_ACT_STOP);
  lg_run_free(r);
  /* No token cap: reservations and usage saturate instead of wrapping. */
  r = mk(NULL);
  assert_int_equal(model(r, INT64_MAX, INT64_MAX, INT64_MAX, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(model(r, INT64_MAX, INT64_MAX, INT64_MAX, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, 0, INT64_MAX, INT64_MAX, INT64_MAX, 0), 0);
  assert_int_equal(lg_run_usage(r, 0, INT64_MAX, INT64_MAX, INT64_MAX, 0), 0);
  lg_run_counters(r, &c);
  assert_true(c.tokens == INT64_MAX);
  assert_true(c.cost_nusd == INT64_MAX);
  char *env = lg_run_envelope_json(r);
  assert_non_null(env);
  lg_free(env);
  lg_run_free(r);
  /* Caps hold after saturated usage. */
  r = mk("{\"limits\":{\"max_tokens\":1000,\"max_cost_usd\":1}}");
  assert_int_equal(model(r, 10, 10, 10, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, d.reservation, INT64_MAX, INT64_MAX, 5, 0), 0);
  assert_int_equal(model(r, 0, 0, 0, 0, &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_TOKEN_CAP, "caps");
  lg_run_free(r);
  r = mk("{\"limits\":{\"max_cost_usd\":1}}");
  assert_int_equal(model(r, 10, 10, INT64_MAX, 0, &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_COST_CAP, "caps");
  lg_run_free(r);
  r = mk("{\"limits\":{\"max_cost_usd\":1}}");
  assert_int_equal(model(r, 10, 10, 10, 0, &d), LG_ACT_EXECUTE);
  assert_int_equal(lg_run_usage(r, d.reservation, 1, 1, INT64_MAX, 0), 0);
  assert_int_equal(lg_run_usage(r, 0, 1, 1, INT64_MAX, 0), LG_ENOTFOUND);
  assert_int_equal(model(r, 10, 10, 0, 0, &d), LG_ACT_STOP);
  assert_stop(&d, LG_R_COST_CAP, "caps");
  lg_run_free(r);
  /* A retry_after_ms of INT64_MAX waits for ever, without overflow. */
  r = mk("{\"limits\":{\"max_wall_ms\":null}}");
  call_t(r, "q", "{}", 5, &d);
  assert_int_equal(res_retry(r, INT64_MAX, 5, &d), LG_ACT_CONTINUE);
  call_t(r, "q", "{}", -5, &d);
  assert_block(&d, LG_R_RETRY_TOO_SOON);
  call_t(r, "q", "{}", INT64_MAX - 1, &d);
  assert_block(&d, LG_R_RETRY_TOO_SOON);
  lg_run_free(r);
}

static void t_envelope_money(void **state) {
  (void)state;
  lg_decision_t d;
  lg_run_t *r = mk(NULL);
  model(r, 100, 50, 3100000, 0, &d);
  assert_int_equal(lg_run_usage(r, d.reservation, 100, 20, 3100000, 0), 0);
  char *s = lg_run_envelope_json(r);
  contains(s, "\"cost_usd\":0.0031,");
  lg_free(s);
  lg_run_free(r);
}

static void t_new_names(void **state) {
  (void)state;
  assert_string_equal(lg_reason_name(LG_R_TEXT_REPEAT), "text_repeat");
  assert_string_equal(lg_reason_name(LG_R_MONOLOGUE), "monologue");
  assert_string_equal(lg_reason_name(LG_R_CONTEXT_LOOP), "context_loop");
  assert_string_equal(lg_reason_name(LG_R_BLOCK_STREAK), "block_streak");
  assert_string_equal(lg_action_name(LG_ACT_OBSERVE), "observe");
  /* Appended: the saved integers of older reasons keep their meaning. */
  assert_int_equal(LG_R_ALREADY_COMMITTED, 24);
  assert_int_equal(LG_R_TEXT_REPEAT, 25);
  assert_int_equal(LG_R_BLOCK_STREAK, 28);
  assert_int_equal(LG_ACT_CONTINUE, 4);
  assert_int_equal(LG_ACT_OBSERVE, 5);
}

/* Zero-filled structs do the obvious thing: a call with only tool and
 * args (args_len 0: NUL-terminated) is a turn of its own, so identical
 * calls count as repeats; a result with only a status changes nothing but
 * what the status says; a model call with nothing set is let through. */
static void t_zero_call(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  for (int i = 1; i <= 3; i++) {
    lg_call_t c;
    memset(&c, 0, sizeof c);
    c.tool = "search";
    c.args = "{\"q\": \"INV-7\"}";
    assert_int_equal(lg_run_before(r, C, &c, &d, &err), 0);
    assert_int_equal(d.repeat, (unsigned)i);
    assert_int_equal(d.action, i < 3 ? LG_ACT_EXECUTE : LG_ACT_BLOCK);
  }
  lg_run_free(r);
}

static void t_zero_result(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = "poll";
  assert_int_equal(lg_run_before(r, C, &c, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  lg_result_t res;
  memset(&res, 0, sizeof res);
  res.status = LG_STATUS_RETRYABLE;
  res.value_kind = LG_VALUE_PRESENT;
  res.value = "{\"busy\":true}"; /* value_len 0: NUL-terminated */
  assert_int_equal(lg_run_after(r, &res, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_CONTINUE);
  /* retry_after_ms 0 asked for no wait: the same call again is not
   * retry_too_soon. */
  assert_int_equal(lg_run_before(r, C, &c, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  lg_counters_t k;
  lg_run_counters(r, &k);
  assert_int_equal(k.results, 1);
  lg_run_free(r);
}

static void t_zero_model(void **state) {
  (void)state;
  lg_run_t *r = mk(NULL);
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_model_call_t m;
  memset(&m, 0, sizeof m);
  assert_int_equal(lg_run_model(r, &m, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  lg_counters_t k;
  lg_run_counters(r, &k);
  assert_int_equal(k.model_calls, 1);
  lg_run_free(r);
}

int main(void) {
  C = lg_canon_new();
  if (!C) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(t_step_cap, setup),
      cmocka_unit_test_setup(t_model_call_cap, setup),
      cmocka_unit_test_setup(t_tool_call_cap, setup),
      cmocka_unit_test_setup(t_wall_clock_cap, setup),
      cmocka_unit_test_setup(t_cost_cap, setup),
      cmocka_unit_test_setup(t_token_cap, setup),
      cmocka_unit_test_setup(t_handoff_cap, setup),
      cmocka_unit_test_setup(t_same_call_repeat_ladder, setup),
      cmocka_unit_test_setup(t_short_cycle, setup),
      cmocka_unit_test_setup(t_no_progress_versions, setup),
      cmocka_unit_test_setup(t_no_progress_world, setup),
      cmocka_unit_test_setup(t_failure_streak, setup),
      cmocka_unit_test_setup(t_invalid_tool_result, setup),
      cmocka_unit_test_setup(t_status_stops, setup),
      cmocka_unit_test_setup(t_operator_cancel, setup),
      cmocka_unit_test_setup(t_zero_call, setup),
      cmocka_unit_test_setup(t_zero_result, setup),
      cmocka_unit_test_setup(t_zero_model, setup),
      cmocka_unit_test_setup(t_budget_exceeded, setup),
      cmocka_unit_test_setup(t_retry_too_soon, setup),
      cmocka_unit_test_setup(t_in_progress_same_turn, setup),
      cmocka_unit_test_setup(t_in_progress_shared_ledger, setup),
      cmocka_unit_test_setup(t_idempotency_mismatch, setup),
      cmocka_unit_test_setup(t_unknown_outcome, setup),
      cmocka_unit_test_setup(t_order_stopped_first, setup),
      cmocka_unit_test_setup(t_order_caps_among_themselves, setup),
      cmocka_unit_test_setup(t_order_cap_beats_ladder, setup),
      cmocka_unit_test_setup(t_order_stop_rung_beats_replay, setup),
      cmocka_unit_test_setup(t_order_block_rung_beats_execute, setup),
      cmocka_unit_test_setup(t_same_turn_counts_once, setup),
      cmocka_unit_test_setup(t_progress_restarts_window, setup),
      cmocka_unit_test_setup(t_checkpoint_resume, setup),
      cmocka_unit_test_setup(t_rungs_false, setup),
      cmocka_unit_test_setup(t_loop_key_false, setup),
      cmocka_unit_test_setup(t_derived_keys, setup),
      cmocka_unit_test_setup(t_invalid_result_keeps_claim, setup),
      cmocka_unit_test_setup(t_steer_messages, setup),
      cmocka_unit_test_setup(t_block_hints, setup),
      cmocka_unit_test_setup(t_next_allowed_action, setup),
      cmocka_unit_test_setup(t_envelope, setup),
      cmocka_unit_test_setup(t_envelope_cost, setup),
      cmocka_unit_test_setup(t_events_after_stop, setup),
      cmocka_unit_test_setup(t_unknown_call_ids, setup),
      cmocka_unit_test_setup(t_malformed_args, setup),
      cmocka_unit_test_setup(t_precomputed_fingerprint, setup),
      cmocka_unit_test_setup(t_names, setup),
      cmocka_unit_test_setup(t_cycle_periods_to_8, setup),
      cmocka_unit_test_setup(t_block_streak_five_cycle, setup),
      cmocka_unit_test_setup(t_block_streak_reset_by_execution, setup),
      cmocka_unit_test_setup(t_text_chanting, setup),
      cmocka_unit_test_setup(t_text_not_loops, setup),
      cmocka_unit_test_setup(t_text_any_cut, setup),
      cmocka_unit_test_setup(t_text_ladder, setup),
      cmocka_unit_test_setup(t_monologue, setup),
      cmocka_unit_test_setup(t_user_new_episode, setup),
      cmocka_unit_test_setup(t_compaction_loop, setup),
      cmocka_unit_test_setup(t_resume, setup),
      cmocka_unit_test_setup(t_cascade_hide_and_escalate, setup),
      cmocka_unit_test_setup(t_cascade_offered_tools, setup),
      cmocka_unit_test_setup(t_saturating_counters, setup),
      cmocka_unit_test_setup(t_envelope_money, setup),
      cmocka_unit_test_setup(t_new_names, setup),
  };
  int rc = cmocka_run_group_tests_name("engine", tests, NULL, NULL);
  lg_canon_free(C);
  return rc;
}
