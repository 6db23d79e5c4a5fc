/*
 * test_server.c — the HTTP sidecar, black-box, over real HTTP on loopback.
 *
 * A server is started in this process (lg_server_start, port 0, a fresh
 * store of each backend of LG_STORE_BACKENDS — default memory and sqlite;
 * postgres under tests/pg/with-postgres.sh — and a clock the tests move) and
 * spoken to through a raw socket: every endpoint of http-api-v1 (budgets
 * aside), every error type, both roles, and bad input — malformed JSON,
 * wrong types, unknown fields, oversized bodies, slow clients, unknown
 * runs, wrong tokens — each answered with its documented 4xx while the
 * server goes on serving. The decisions the server made are checked
 * against the replay of its own trace (lg_replay_buffer).
 *
 * Organised as the spec is: runs, decisions, cancel and listing, traces,
 * operations, health and metrics, then auth, limits and life.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>

#include "store_test_util.h"
#include "test_server_http.h"

#define AGENT_TOKEN "agent-token-0123456789"
#define OPERATOR_TOKEN "operator-token-0123456789"

static lg_server_t *S;  /* the open server (memory:, no auth) */
static int PORT;
static ht_conn_t C;     /* a keep-alive connection to it */
static char TMP[256];   /* a temporary folder */
static int seq;         /* makes run ids unique */

static const char *URL;  /* the store of this pass: memory:, sqlite: or postgres: */

static const char *store_url(void) { return URL; }

static lg_server_t *start(const lg_server_options_t *extra) {
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  if (extra) o = *extra;
  if (!o.listen) o.listen = "127.0.0.1:0";
  if (!o.store_url) o.store_url = store_url();
  o.clock = ht_clock;
  char log[300];
  snprintf(log, sizeof log, "%s/server.log", TMP);
  if (!o.log_path) o.log_path = log;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_server_t *s = lg_server_start(&o, &err);
  if (!s) {
    char buf[1024];
    fail_msg("lg_server_start: %s", lg_error_format(&err, buf, sizeof buf));
  }
  return s;
}

/* Request helpers on the shared connection; they check the status. */
static void req(const char *method, const char *path, const char *body, int want, ht_resp_t *r) {
  assert_int_equal(ht_req(&C, method, path, NULL, body, r), 0);
  if (r->status != want) fail_msg("%s %s -> %d, wanted %d: %s", method, path, r->status, want, r->body);
}

static void new_run(char *id, size_t n, const char *extra_json) {
  snprintf(id, n, "run-%d", ++seq);
  char body[2048];
  snprintf(body, sizeof body, "{\"run_id\":\"%s\"%s%s}", id, extra_json ? "," : "",
           extra_json ? extra_json : "");
  ht_resp_t r;
  req("POST", "/v1/runs", body, 201, &r);
  ht_resp_clear(&r);
}

static void call(const char *run, const char *body, ht_resp_t *r) {
  char path[512];
  snprintf(path, sizeof path, "/v1/runs/%s/calls", run);
  req("POST", path, body, 200, r);
}

static void post(const char *run, const char *what, const char *body, int want, ht_resp_t *r) {
  char path[512];
  snprintf(path, sizeof path, "/v1/runs/%s/%s", run, what);
  req("POST", path, body, want, r);
}

static void expect_error(const ht_resp_t *r, int code, const char *type, const char *in_message) {
  if (r->status != code) fail_msg("status %d, wanted %d: %s", r->status, code, r->body);
  assert_non_null(r->json);
  assert_int_equal(ht_int(r, "error.code"), code);
  assert_string_equal(ht_str(r, "error.type"), type);
  const char *m = ht_str(r, "error.message");
  assert_non_null(m);
  if (in_message && !strstr(m, in_message)) fail_msg("message \"%s\" lacks \"%s\"", m, in_message);
}

/* ------------------------------------------------------------------ */
/* Runs.                                                               */

static void test_create_run(void **state) {
  (void)state;
  ht_resp_t r;
  req("POST", "/v1/runs", "{\"run_id\":\"create-1\",\"group\":\"g1\",\"progress_version\":3}", 201, &r);
  assert_string_equal(ht_str(&r, "run_id"), "create-1");
  assert_int_equal(ht_int(&r, "policy.repeat.block"), 3); /* the effective policy */
  assert_int_equal(ht_int(&r, "policy.limits.max_steps"), 50);
  ht_resp_clear(&r);
  /* The same body again: the same answer, 200. */
  req("POST", "/v1/runs", "{\"run_id\":\"create-1\",\"group\":\"g1\",\"progress_version\":3}", 200, &r);
  assert_string_equal(ht_str(&r, "run_id"), "create-1");
  ht_resp_clear(&r);
  /* A different body with that id: 409. */
  req("POST", "/v1/runs", "{\"run_id\":\"create-1\",\"group\":\"g2\"}", 409, &r);
  expect_error(&r, 409, "conflict", "create-1");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":\"create-1\",\"group\":\"g1\",\"progress_version\":4}", 409, &r);
  ht_resp_clear(&r);
  /* No run_id: the server names it. */
  req("POST", "/v1/runs", "{}", 201, &r);
  assert_non_null(ht_str(&r, "run_id"));
  assert_int_equal(strncmp(ht_str(&r, "run_id"), "run_", 4), 0);
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "", 201, &r); /* an empty body is {} */
  ht_resp_clear(&r);
  /* A policy of its own, with the defaults filled in. */
  req("POST", "/v1/runs", "{\"run_id\":\"create-2\",\"policy\":{\"repeat\":{\"block\":4}}}", 201, &r);
  assert_int_equal(ht_int(&r, "policy.repeat.block"), 4);
  assert_int_equal(ht_int(&r, "policy.repeat.stop"), 6);
  ht_resp_clear(&r);
  /* GET it. */
  req("GET", "/v1/runs/create-1", NULL, 200, &r);
  assert_string_equal(ht_str(&r, "status"), "active");
  assert_string_equal(ht_str(&r, "group"), "g1");
  assert_int_equal(ht_int(&r, "counters.calls"), 0);
  assert_true(json_is_null(ht_get(&r, "terminal_reason")));
  assert_non_null(ht_get(&r, "envelope"));
  ht_resp_clear(&r);
}

static void test_create_run_errors(void **state) {
  (void)state;
  ht_resp_t r;
  req("POST", "/v1/runs", "{\"run_id\":\"e1\",\"policy\":{\"repeat\":{\"blok\":3}}}", 400, &r);
  expect_error(&r, 400, "invalid_request", "policy.repeat.blok");
  assert_string_equal(ht_str(&r, "error.field"), "policy.repeat.blok");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":7}", 400, &r);
  expect_error(&r, 400, "invalid_request", "run_id: expected a string, got a number");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":\"a/b\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "run_id");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":\"\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "run_id: must not be empty");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"rn_id\":\"x\",\"grop\":\"y\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "unknown fields: ");
  assert_non_null(strstr(ht_str(&r, "error.message"), "rn_id"));
  assert_non_null(strstr(ht_str(&r, "error.message"), "grop"));
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":\"x\",", 400, &r);
  expect_error(&r, 400, "invalid_request", "malformed JSON");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"run_id\":\"x\",\"run_id\":\"y\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "duplicate");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "[1,2]", 400, &r);
  expect_error(&r, 400, "invalid_request", "body: expected a JSON object");
  ht_resp_clear(&r);
  req("POST", "/v1/runs", "{\"progress_version\":1.5}", 400, &r);
  expect_error(&r, 400, "invalid_request", "progress_version: expected a whole number");
  ht_resp_clear(&r);
  req("GET", "/v1/runs/no-such-run", NULL, 404, &r);
  expect_error(&r, 404, "not_found", "no-such-run");
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Decisions.                                                          */

static void test_calls_ladder(void **state) {
  (void)state;
  char run[64];
  new_run(run, sizeof run, NULL);
  const char *want[] = {"execute", "execute", "block", "block", "block", "stop", "stop"};
  for (int i = 0; i < 7; i++) {
    ht_resp_t r;
    ht_advance(10);
    call(run, "{\"tool\":\"charge\",\"args\":{\"invoice\":\"INV-1\",\"amount\":12}}", &r);
    assert_string_equal(ht_str(&r, "action"), want[i]);
    assert_int_equal(strlen(ht_str(&r, "fingerprint")), 64);
    if (i < 6) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", i + 1);
      assert_string_equal(ht_str(&r, "call_id"), cid); /* the engine's names */
      assert_int_equal(ht_int(&r, "repeat"), i + 1);
    }
    if (i == 1) assert_non_null(ht_str(&r, "message")); /* observe: a steer message */
    if (i == 2) {
      assert_string_equal(ht_str(&r, "reason"), "same_call_repeat");
      assert_string_equal(json_string_value(json_array_get(ht_get(&r, "hide_tools"), 0)), "charge");
    }
    if (i == 5) {
      assert_string_equal(ht_str(&r, "reason"), "same_call_repeat");
      assert_string_equal(ht_str(&r, "envelope.terminal_reason"), "same_call_repeat");
      assert_string_equal(ht_str(&r, "envelope.guard"), "repeat");
    }
    /* Results for the calls that executed, so that none is left waiting. */
    if (!strcmp(want[i], "execute")) {
      ht_resp_t rr;
      post(run, "results", "{\"status\":\"progress\",\"value\":{\"ok\":true}}", 200, &rr);
      assert_string_equal(ht_str(&rr, "action"), "continue");
      ht_resp_clear(&rr);
    }
    ht_resp_clear(&r);
  }
  ht_resp_t r;
  char path[128];
  snprintf(path, sizeof path, "/v1/runs/%s", run);
  req("GET", path, NULL, 200, &r);
  assert_string_equal(ht_str(&r, "status"), "stopped");
  assert_string_equal(ht_str(&r, "terminal_reason"), "same_call_repeat");
  assert_int_equal(ht_int(&r, "counters.calls"), 6);
  assert_int_equal(ht_int(&r, "counters.steps"), 2);
  ht_resp_clear(&r);
}

static void test_calls_errors(void **state) {
  (void)state;
  char run[64];
  new_run(run, sizeof run, NULL);
  ht_resp_t r;
  post(run, "calls", "{\"args\":{}}", 400, &r);
  expect_error(&r, 400, "invalid_request", "tool: this field is required");
  assert_string_equal(ht_str(&r, "error.field"), "tool");
  ht_resp_clear(&r);
  post(run, "calls", "{\"tool\":\"t\",\"args\":[1]}", 400, &r);
  expect_error(&r, 400, "invalid_request", "args: expected an object, got an array");
  ht_resp_clear(&r);
  post(run, "calls", "{\"tool\":\"t\",\"turn\":\"3\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "turn: expected a whole number");
  ht_resp_clear(&r);
  post(run, "calls", "{\"tool\":\"t\",\"agrs\":{}}", 400, &r);
  expect_error(&r, 400, "invalid_request", "unknown field: agrs");
  ht_resp_clear(&r);
  post(run, "calls", "{\"tool\":\"t\",\"args\":{\"a\":1,\"a\":2}}", 400, &r);
  expect_error(&r, 400, "invalid_request", "duplicate");
  ht_resp_clear(&r);
  post(run, "calls", "{\"tool\":", 400, &r);
  expect_error(&r, 400, "invalid_request", "malformed JSON");
  ht_resp_clear(&r);
  post("no-such-run", "calls", "{\"tool\":\"t\"}", 404, &r);
  expect_error(&r, 404, "not_found", "no-such-run");
  ht_resp_clear(&r);
  /* None of that changed the run. */
  char path[128];
  snprintf(path, sizeof path, "/v1/runs/%s", run);
  req("GET", path, NULL, 200, &r);
  assert_int_equal(ht_int(&r, "counters.calls"), 0);
  ht_resp_clear(&r);
}

static void test_calls_turns_and_ids(void **state) {
  (void)state;
  char run[64];
  new_run(run, sizeof run, NULL);
  ht_resp_t r;
  /* Identical calls of one model turn count once. */
  for (int i = 0; i < 4; i++) {
    call(run, "{\"tool\":\"search\",\"args\":{\"q\":\"x\"},\"turn\":1}", &r);
    assert_string_equal(ht_str(&r, "action"), "execute");
    assert_int_equal(ht_int(&r, "repeat"), 1);
    ht_resp_clear(&r);
  }
  call(run, "{\"tool\":\"search\",\"args\":{\"q\":\"y\"},\"call_id\":\"mine-1\",\"agent\":\"a1\"}", &r);
  assert_string_equal(ht_str(&r, "call_id"), "mine-1");
  ht_resp_clear(&r);
  /* Results by id, and for the latest call. */
  post(run, "results", "{\"call_id\":\"mine-1\",\"status\":\"progress\"}", 200, &r);
  assert_string_equal(ht_str(&r, "call_id"), "mine-1");
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"progress\"}", 200, &r);
  assert_string_equal(ht_str(&r, "call_id"), "c4");
  ht_resp_clear(&r);
}

static void test_results(void **state) {
  (void)state;
  char run[64];
  ht_resp_t r;
  new_run(run, sizeof run, NULL);
  /* A result for no waiting call: 409. */
  post(run, "results", "{\"status\":\"progress\"}", 409, &r);
  expect_error(&r, 409, "conflict", NULL);
  ht_resp_clear(&r);
  call(run, "{\"tool\":\"t\",\"args\":{}}", &r);
  ht_resp_clear(&r);
  post(run, "results", "{\"call_id\":\"nope\",\"status\":\"progress\"}", 409, &r);
  expect_error(&r, 409, "conflict", "nope");
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":7}", 400, &r);
  expect_error(&r, 400, "invalid_request", "status: expected a string");
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"progress\",\"retry_after_ms\":-1}", 400, &r);
  expect_error(&r, 400, "invalid_request", "retry_after_ms: must not be negative");
  ht_resp_clear(&r);
  /* No status: not a 400 but the validation gate. */
  post(run, "results", "{\"value\":{\"rows\":[]}}", 200, &r);
  assert_string_equal(ht_str(&r, "action"), "stop");
  assert_string_equal(ht_str(&r, "reason"), "invalid_tool_result");
  assert_string_equal(ht_str(&r, "envelope.guard"), "validation");
  ht_resp_clear(&r);
  /* An unknown status, and a blank value: the same. */
  new_run(run, sizeof run, NULL);
  call(run, "{\"tool\":\"t\"}", &r);
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"done-ish\"}", 200, &r);
  assert_string_equal(ht_str(&r, "reason"), "invalid_tool_result");
  ht_resp_clear(&r);
  new_run(run, sizeof run, NULL);
  call(run, "{\"tool\":\"t\"}", &r);
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"progress\",\"value\":\"  \\n\"}", 200, &r);
  assert_string_equal(ht_str(&r, "reason"), "invalid_tool_result");
  ht_resp_clear(&r);
  /* fatal ends the run at once; complete too. */
  new_run(run, sizeof run, NULL);
  call(run, "{\"tool\":\"t\"}", &r);
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"permission_denied\"}", 200, &r);
  assert_string_equal(ht_str(&r, "reason"), "permission_denied");
  assert_string_equal(ht_str(&r, "envelope.next_allowed_action"), "human_review");
  ht_resp_clear(&r);
}

static void test_retry_after(void **state) {
  (void)state;
  char run[64];
  ht_resp_t r;
  new_run(run, sizeof run, NULL);
  call(run, "{\"tool\":\"pay\",\"args\":{\"id\":1}}", &r);
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"retryable\",\"retry_after_ms\":5000}", 200, &r);
  assert_string_equal(ht_str(&r, "action"), "continue");
  ht_resp_clear(&r);
  ht_advance(1000); /* the server's clock: too soon */
  call(run, "{\"tool\":\"pay\",\"args\":{\"id\":1}}", &r);
  assert_string_equal(ht_str(&r, "action"), "block");
  assert_string_equal(ht_str(&r, "reason"), "retry_too_soon");
  ht_resp_clear(&r);
  ht_advance(5000);
  call(run, "{\"tool\":\"pay\",\"args\":{\"id\":1}}", &r);
  assert_string_equal(ht_str(&r, "action"), "block"); /* now the ladder's 3rd */
  assert_string_equal(ht_str(&r, "reason"), "same_call_repeat");
  ht_resp_clear(&r);
}

static void test_state_handoffs(void **state) {
  (void)state;
  char run[64];
  ht_resp_t r;
  new_run(run, sizeof run, NULL);
  for (int i = 0; i < 6; i++) {
    post(run, "state", "{\"world\":{\"cursor\":5,\"queue\":[1,2]}}", 200, &r);
    assert_string_equal(ht_str(&r, "action"), i < 5 ? "continue" : "stop");
    if (i == 5) assert_string_equal(ht_str(&r, "reason"), "no_progress");
    ht_resp_clear(&r);
  }
  new_run(run, sizeof run, NULL);
  post(run, "state", "{}", 400, &r);
  expect_error(&r, 400, "invalid_request", "world: this field is required");
  ht_resp_clear(&r);
  post(run, "state", "{\"world\":3}", 400, &r);
  expect_error(&r, 400, "invalid_request", "world: expected an object");
  ht_resp_clear(&r);
  new_run(run, sizeof run, "\"policy\":{\"limits\":{\"max_handoffs\":2}}");
  for (int i = 0; i < 3; i++) {
    post(run, "handoffs", "{\"from\":\"planner\",\"to\":\"coder\"}", 200, &r);
    assert_string_equal(ht_str(&r, "action"), i < 2 ? "execute" : "stop");
    if (i == 2) assert_string_equal(ht_str(&r, "reason"), "handoff_cap");
    ht_resp_clear(&r);
  }
  post(run, "handoffs", "{\"from\":\"planner\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "to: this field is required");
  ht_resp_clear(&r);
}

static void test_model_usage(void **state) {
  (void)state;
  char run[64];
  ht_resp_t r;
  new_run(run, sizeof run, "\"policy\":{\"limits\":{\"max_cost_usd\":0.05,\"max_tokens\":10000}}");
  post(run, "model", "{\"model\":\"m1\",\"input_tokens\":1000,\"max_tokens\":500,\"cost_usd\":0.02,\"turn\":1}", 200, &r);
  assert_string_equal(ht_str(&r, "action"), "execute");
  const char *rid = ht_str(&r, "reservation_id");
  assert_non_null(rid);
  char body[256];
  snprintf(body, sizeof body, "{\"reservation_id\":\"%s\",\"input_tokens\":1000,\"output_tokens\":200,\"cost_usd\":0.015}", rid);
  ht_resp_clear(&r);
  post(run, "usage", body, 200, &r);
  assert_string_equal(ht_str(&r, "action"), "continue");
  ht_resp_clear(&r);
  post(run, "usage", body, 409, &r); /* settled already */
  expect_error(&r, 409, "conflict", NULL);
  ht_resp_clear(&r);
  /* 0.015 spent; 0.02 + 0.02 more fits (0.055 > 0.05 does not). */
  post(run, "model", "{\"input_tokens\":1000,\"max_tokens\":500,\"cost_usd\":0.02}", 200, &r);
  assert_string_equal(ht_str(&r, "action"), "execute");
  ht_resp_clear(&r);
  post(run, "model", "{\"input_tokens\":1000,\"max_tokens\":500,\"cost_usd\":0.02}", 200, &r);
  assert_string_equal(ht_str(&r, "action"), "stop");
  assert_string_equal(ht_str(&r, "reason"), "cost_cap");
  ht_resp_clear(&r);
  post(run, "model", "{\"input_tokens\":-1}", 400, &r);
  expect_error(&r, 400, "invalid_request", "input_tokens: must not be negative");
  ht_resp_clear(&r);
  post(run, "model", "{\"max_tokens\":5}", 400, &r);
  expect_error(&r, 400, "invalid_request", "input_tokens: this field is required");
  ht_resp_clear(&r);
  post(run, "usage", "{\"input_tokens\":1}", 400, &r);
  expect_error(&r, 400, "invalid_request", "output_tokens: this field is required");
  ht_resp_clear(&r);
  post(run, "usage", "{\"reservation_id\":\"zz\",\"input_tokens\":1,\"output_tokens\":1}", 400, &r);
  expect_error(&r, 400, "invalid_request", "reservation_id");
  ht_resp_clear(&r);
}

static void test_ledger_through_calls(void **state) {
  (void)state;
  char run[64];
  ht_resp_t r;
  new_run(run, sizeof run, "\"policy\":{\"tools\":{\"charge\":{\"side_effects\":true}}}");
  call(run, "{\"tool\":\"charge\",\"args\":{\"invoice\":42}}", &r);
  assert_string_equal(ht_str(&r, "action"), "execute");
  assert_non_null(ht_str(&r, "idempotency_key")); /* derived */
  ht_resp_clear(&r);
  post(run, "results", "{\"status\":\"progress\",\"value\":{\"charged\":\"ch_1\"},\"operation_id\":\"op-1\"}", 200, &r);
  ht_resp_clear(&r);
  call(run, "{\"tool\":\"charge\",\"args\":{\"invoice\":42}}", &r);
  assert_string_equal(ht_str(&r, "action"), "replay");
  assert_string_equal(ht_str(&r, "saved_result.charged"), "ch_1");
  ht_resp_clear(&r);
  /* A key given by the caller, claimed through /operations first. */
  req("POST", "/v1/operations/claim", "{\"key\":\"ext-key-1\",\"request_fingerprint\":\"fp-other\"}", 201, &r);
  ht_resp_clear(&r);
  call(run, "{\"tool\":\"refund\",\"args\":{\"x\":1},\"idempotency_key\":\"ext-key-1\"}", &r);
  assert_string_equal(ht_str(&r, "action"), "block");
  assert_string_equal(ht_str(&r, "reason"), "idempotency_mismatch");
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Cancel and listing.                                                 */

static void test_cancel(void **state) {
  (void)state;
  char run[64], path[128];
  ht_resp_t r;
  new_run(run, sizeof run, "\"group\":\"grp-c\"");
  call(run, "{\"tool\":\"t\"}", &r);
  ht_resp_clear(&r);
  /* A model call of 0.0031 USD: the cancel's envelope says 0.0031, as the
   * counters do (it once said 0.0030999999999999999). */
  post(run, "model", "{\"input_tokens\":10,\"max_tokens\":10,\"cost_usd\":0.0031}", 200, &r);
  ht_resp_clear(&r);
  post(run, "usage", "{\"input_tokens\":10,\"output_tokens\":5,\"cost_usd\":0.0031}", 200, &r);
  ht_resp_clear(&r);
  snprintf(path, sizeof path, "/v1/runs/%s/cancel", run);
  req("POST", path, "{\"reason\":\"runaway spend\"}", 200, &r);
  assert_non_null(strstr(r.body, "\"cost_usd\":0.0031,"));
  assert_null(strstr(r.body, "0.00309"));
  assert_string_equal(ht_str(&r, "envelope.terminal_reason"), "operator_cancelled_loop");
  assert_string_equal(ht_str(&r, "envelope.operator_note"), "runaway spend");
  assert_string_equal(ht_str(&r, "envelope.guard"), "kill_switch");
  ht_resp_clear(&r);
  call(run, "{\"tool\":\"t\"}", &r);
  assert_string_equal(ht_str(&r, "action"), "stop");
  assert_string_equal(ht_str(&r, "reason"), "operator_cancelled_loop");
  assert_string_equal(ht_str(&r, "operator_note"), "runaway spend");
  ht_resp_clear(&r);
  req("POST", path, NULL, 200, &r); /* again: still stopped, same envelope */
  ht_resp_clear(&r);
  req("POST", "/v1/runs/no-such-run/cancel", "{}", 404, &r);
  expect_error(&r, 404, "not_found", NULL);
  ht_resp_clear(&r);
  /* A group: its active runs stop, and so does a run created after. */
  char a[64], b[64], c[64];
  new_run(a, sizeof a, "\"group\":\"grp-d\"");
  new_run(b, sizeof b, "\"group\":\"grp-d\"");
  req("POST", "/v1/groups/grp-d/cancel", "{}", 200, &r);
  json_t *ids = ht_get(&r, "cancelled");
  assert_int_equal(json_array_size(ids), 2);
  ht_resp_clear(&r);
  call(a, "{\"tool\":\"t\"}", &r);
  assert_string_equal(ht_str(&r, "action"), "stop");
  assert_string_equal(ht_str(&r, "reason"), "operator_cancelled_loop");
  ht_resp_clear(&r);
  new_run(c, sizeof c, "\"group\":\"grp-d\"");
  call(c, "{\"tool\":\"t\"}", &r);
  assert_string_equal(ht_str(&r, "action"), "stop");
  ht_resp_clear(&r);
}

static void test_list(void **state) {
  (void)state;
  ht_resp_t r;
  char a[64];
  new_run(a, sizeof a, "\"group\":\"grp-l\"");
  req("GET", "/v1/runs?limit=2", NULL, 200, &r);
  assert_int_equal(json_array_size(ht_get(&r, "runs")), 2);
  /* Newest first. */
  assert_string_equal(json_string_value(json_object_get(json_array_get(ht_get(&r, "runs"), 0), "run_id")), a);
  ht_resp_clear(&r);
  req("GET", "/v1/runs?status=stopped&reason=same_call_repeat", NULL, 200, &r);
  json_t *runs = ht_get(&r, "runs");
  assert_true(json_array_size(runs) >= 1);
  for (size_t i = 0; i < json_array_size(runs); i++)
    assert_string_equal(json_string_value(json_object_get(json_array_get(runs, i), "terminal_reason")),
                        "same_call_repeat");
  ht_resp_clear(&r);
  req("GET", "/v1/runs?group=grp-l", NULL, 200, &r);
  assert_int_equal(json_array_size(ht_get(&r, "runs")), 1);
  ht_resp_clear(&r);
  req("GET", "/v1/runs?stauts=active", NULL, 400, &r);
  expect_error(&r, 400, "invalid_request", "stauts");
  ht_resp_clear(&r);
  req("GET", "/v1/runs?status=sleeping", NULL, 400, &r);
  expect_error(&r, 400, "invalid_request", "status");
  ht_resp_clear(&r);
  req("GET", "/v1/runs?limit=0", NULL, 400, &r);
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Traces: the server's decisions equal the replay of its own trace.   */

typedef struct replayed {
  char actions[256][48]; /* "action/reason" of every call, model, handoff, result, cancel */
  int n;
  char terminal[64];
} replayed_t;

static int collect_cb(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  replayed_t *rp = ud;
  if (sum) {
    snprintf(rp->terminal, sizeof rp->terminal, "%s", sum->terminal_reason ? sum->terminal_reason : "");
    return 0;
  }
  if (!ev->acted || ev->type == LG_EV_STATE || ev->type == LG_EV_USAGE || rp->n >= 256) return 0;
  snprintf(rp->actions[rp->n++], 48, "%s/%s", lg_action_name(ev->decision.action),
           ev->decision.reason_text ? ev->decision.reason_text : "");
  return 0;
}

static void test_trace_replays(void **state) {
  (void)state;
  char run[64];
  new_run(run, sizeof run,
          "\"group\":\"trace-g\",\"progress_version\":1,\"policy\":{\"tools\":{\"charge\":"
          "{\"side_effects\":true},\"poll\":{\"loop_key\":false}},\"limits\":{\"max_cost_usd\":1}}");
  /* A session that touches every kind of event; what the server said. */
  static const struct {
    const char *what, *body;
  } ev[] = {
      {"model", "{\"model\":\"m\",\"input_tokens\":100,\"max_tokens\":50,\"cost_usd\":0.3,\"turn\":1}"},
      {"usage", "{\"input_tokens\":100,\"output_tokens\":20,\"cost_usd\":0.1}"},
      {"calls", "{\"tool\":\"search\",\"args\":{\"q\":\"a\",\"n\":1.5,\"big\":12345678901234567},\"turn\":1}"},
      {"results", "{\"status\":\"progress\",\"progress_version\":2,\"value\":{\"rows\":[1]}}"},
      {"calls", "{\"tool\":\"charge\",\"args\":{\"inv\":1},\"turn\":2}"},
      {"results", "{\"status\":\"progress\",\"value\":{\"ch\":1},\"operation_id\":\"op9\"}"},
      {"calls", "{\"tool\":\"charge\",\"args\":{\"inv\":1},\"turn\":3}"},
      {"state", "{\"world\":{\"cursor\":1}}"},
      {"handoffs", "{\"from\":\"a\",\"to\":\"b\"}"},
      {"calls", "{\"tool\":\"poll\",\"args\":{\"job\":1}}"},
      {"results", "{\"status\":\"retryable\",\"retry_after_ms\":100}"},
      {"calls", "{\"tool\":\"poll\",\"args\":{\"job\":1}}"},
      {"calls", "{\"tool\":\"search\",\"args\":{\"q\":\"b\"},\"turn\":4}"},
      {"calls", "{\"tool\":\"search\",\"args\":{\"q\":\"b\"},\"turn\":5}"},
      {"calls", "{\"tool\":\"search\",\"args\":{\"q\":\"b\"},\"turn\":6}"},
      {"model", "{\"input_tokens\":100,\"max_tokens\":50,\"cost_usd\":0.2}"},
      {"usage", "{\"input_tokens\":90,\"output_tokens\":40,\"cost_usd\":0.25}"},
      {"model", "{\"input_tokens\":100,\"max_tokens\":50,\"cost_usd\":0.5}"},
  };
  replayed_t want;
  memset(&want, 0, sizeof want);
  for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) {
    ht_resp_t r;
    ht_advance(37);
    post(run, ev[i].what, ev[i].body, 200, &r);
    if (strcmp(ev[i].what, "state") && strcmp(ev[i].what, "usage")) {
      const char *reason = ht_str(&r, "reason");
      snprintf(want.actions[want.n++], 48, "%s/%s", ht_str(&r, "action"), reason ? reason : "");
    }
    ht_resp_clear(&r);
  }
  /* A cancel, and events after it. */
  ht_resp_t r;
  char path[128];
  snprintf(path, sizeof path, "/v1/runs/%s/cancel", run);
  ht_advance(5);
  req("POST", path, "{\"reason\":\"enough\"}", 200, &r);
  ht_resp_clear(&r);
  snprintf(want.actions[want.n++], 48, "stop/operator_cancelled_loop");
  call(run, "{\"tool\":\"search\",\"args\":{\"q\":\"z\"}}", &r);
  ht_resp_clear(&r);

  snprintf(path, sizeof path, "/v1/runs/%s/trace", run);
  req("GET", path, NULL, 200, &r);
  assert_non_null(ht_find(r.head, "application/x-ndjson"));
  assert_null(strstr(r.body, "# incomplete"));
  /* A model call let through names its reservation; its usage line,
   * written when /usage came, settles that one on replay. */
  assert_non_null(strstr(r.body, "\"reservation\":1,"));
  assert_non_null(strstr(r.body, "{\"type\":\"usage\","));
  replayed_t got;
  memset(&got, 0, sizeof got);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_replay_buffer("server-trace", r.body, r.len, NULL, collect_cb, &got, &err);
  if (rc) {
    char buf[1024];
    fail_msg("replay: %s\n%s", lg_error_format(&err, buf, sizeof buf), r.body);
  }
  if (got.n != want.n) {
    for (int i = 0; i < (got.n > want.n ? got.n : want.n); i++)
      fprintf(stderr, "%2d server %-40s replay %s\n", i, i < want.n ? want.actions[i] : "-",
              i < got.n ? got.actions[i] : "-");
    fputs(r.body, stderr);
  }
  if (got.n != want.n) fail_msg("replay gave %d decisions, the server %d:\n%s", got.n, want.n, r.body);
  for (int i = 0; i < want.n; i++)
    if (strcmp(got.actions[i], want.actions[i]))
      fail_msg("decision %d: server %s, replay %s\n%s", i, want.actions[i], got.actions[i], r.body);
  assert_string_equal(got.terminal, "operator_cancelled_loop");
  assert_string_equal(want.actions[want.n - 2], "execute/"); /* the last model call fit */
  ht_resp_clear(&r);
  req("GET", "/v1/runs/no-such-run/trace", NULL, 404, &r);
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Operations.                                                         */

static void test_operations(void **state) {
  (void)state;
  ht_resp_t r;
  req("POST", "/v1/operations/claim", "{\"key\":\"op-a\",\"request_fingerprint\":\"fp1\",\"lease_ms\":1000}", 201, &r);
  assert_string_equal(ht_str(&r, "outcome"), "claimed");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-a\",\"request_fingerprint\":\"fp1\"}", 409, &r);
  assert_string_equal(ht_str(&r, "outcome"), "in_progress");
  assert_string_equal(ht_str(&r, "error.type"), "conflict");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-a\",\"request_fingerprint\":\"fp2\"}", 422, &r);
  assert_string_equal(ht_str(&r, "outcome"), "mismatch");
  assert_string_equal(ht_str(&r, "error.type"), "unprocessable");
  ht_resp_clear(&r);
  req("GET", "/v1/operations/op-a", NULL, 200, &r);
  assert_string_equal(ht_str(&r, "state"), "in_progress");
  assert_string_equal(ht_str(&r, "request_fingerprint"), "fp1");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/op-a/commit", "{\"result\":{\"id\":\"x1\"},\"operation_id\":\"o1\"}", 200, &r);
  assert_string_equal(ht_str(&r, "state"), "committed");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-a\",\"request_fingerprint\":\"fp1\"}", 200, &r);
  assert_string_equal(ht_str(&r, "outcome"), "replay");
  assert_string_equal(ht_str(&r, "result.id"), "x1");
  ht_resp_clear(&r);
  /* fail: retryable frees the key, final keeps it. */
  req("POST", "/v1/operations/claim", "{\"key\":\"op-b\",\"request_fingerprint\":\"fp1\"}", 201, &r);
  ht_resp_clear(&r);
  req("POST", "/v1/operations/op-b/fail", "{\"retryable\":true}", 200, &r);
  assert_string_equal(ht_str(&r, "state"), "free");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-b\",\"request_fingerprint\":\"fp1\"}", 201, &r);
  ht_resp_clear(&r);
  req("POST", "/v1/operations/op-b/fail", "{\"retryable\":false}", 200, &r);
  assert_string_equal(ht_str(&r, "state"), "failed");
  ht_resp_clear(&r);
  /* A lease that runs out: unknown_outcome, 409. */
  req("POST", "/v1/operations/claim", "{\"key\":\"op-c\",\"request_fingerprint\":\"fp1\",\"lease_ms\":100}", 201, &r);
  ht_resp_clear(&r);
  ht_advance(1000);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-c\",\"request_fingerprint\":\"fp1\"}", 409, &r);
  assert_string_equal(ht_str(&r, "outcome"), "unknown_outcome");
  ht_resp_clear(&r);
  /* Errors. */
  req("POST", "/v1/operations/claim", "{\"key\":\"op-d\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "request_fingerprint: this field is required");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/nope/commit", "{\"result\":1}", 404, &r);
  expect_error(&r, 404, "not_found", NULL);
  ht_resp_clear(&r);
  req("POST", "/v1/operations/op-a/commit", "{}", 400, &r);
  expect_error(&r, 400, "invalid_request", "result: this field is required");
  ht_resp_clear(&r);
  req("POST", "/v1/operations/nope/fail", "{\"retryable\":\"yes\"}", 400, &r);
  expect_error(&r, 400, "invalid_request", "retryable: expected true or false");
  ht_resp_clear(&r);
  req("GET", "/v1/operations/nope", NULL, 404, &r);
  ht_resp_clear(&r);
  /* Keys with characters that need escaping in a path. */
  req("POST", "/v1/operations/claim", "{\"key\":\"a b/c:d\",\"request_fingerprint\":\"fp\"}", 201, &r);
  ht_resp_clear(&r);
  req("GET", "/v1/operations/a%20b%2Fc%3Ad", NULL, 200, &r);
  assert_string_equal(ht_str(&r, "key"), "a b/c:d");
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Health, metrics, routes.                                            */

static void test_health_metrics_routes(void **state) {
  (void)state;
  ht_resp_t r;
  req("GET", "/healthz", NULL, 200, &r);
  assert_string_equal(ht_str(&r, "status"), "ok");
  ht_resp_clear(&r);
  req("GET", "/metrics", NULL, 200, &r);
  assert_non_null(ht_find(r.head, "text/plain"));
  assert_non_null(strstr(r.body, "loopguard_decisions_total{action=\"block\",reason=\"same_call_repeat\"}"));
  assert_non_null(strstr(r.body, "loopguard_stops_total{reason=\"same_call_repeat\"}"));
  assert_non_null(strstr(r.body, "loopguard_ledger_outcomes_total{outcome=\"claimed\"}"));
  assert_non_null(strstr(r.body, "loopguard_runs_active "));
  assert_non_null(strstr(r.body, "loopguard_request_duration_seconds_bucket{route=\"calls\",le=\"+Inf\"}"));
  assert_non_null(strstr(r.body, "loopguard_requests_total{route=\"calls\",code=\"200\"}"));
  ht_resp_clear(&r);
  req("GET", "/v1/nothing", NULL, 404, &r);
  expect_error(&r, 404, "not_found", NULL);
  ht_resp_clear(&r);
  req("DELETE", "/v1/runs", NULL, 405, &r);
  expect_error(&r, 405, "invalid_request", "method not allowed");
  assert_non_null(ht_find(r.head, "Allow: GET, POST"));
  ht_resp_clear(&r);
  req("GET", "/v1/runs/x/calls", NULL, 405, &r);
  ht_resp_clear(&r);
  /* The budgets answer (tests/cli/serve_budget.sh covers them in full). */
  req("GET", "/v1/budgets/key:abc", NULL, 404, &r);
  expect_error(&r, 404, "not_found", "key:abc");
  ht_resp_clear(&r);
  req("PUT", "/v1/budgets/key:abc", "{\"limit_usd\":5,\"period\":\"daily\"}", 200, &r);
  ht_resp_clear(&r);
  req("DELETE", "/v1/budgets/key:abc", NULL, 405, &r);
  assert_non_null(ht_find(r.head, "Allow: GET, PUT"));
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Auth.                                                               */

static void test_auth(void **state) {
  (void)state;
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.tokens = "agent " AGENT_TOKEN "; operator " OPERATOR_TOKEN;
  lg_server_t *s = start(&o);
  ht_conn_t c;
  ht_open(&c, lg_server_port(s));
  ht_resp_t r;
  assert_int_equal(ht_req(&c, "POST", "/v1/runs", NULL, "{\"run_id\":\"auth-1\"}", &r), 0);
  expect_error(&r, 401, "unauthorized", NULL);
  assert_non_null(ht_find(r.head, "WWW-Authenticate: Bearer"));
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs", "agent-token-0123456780", "{\"run_id\":\"auth-1\"}", &r), 0);
  expect_error(&r, 401, "unauthorized", NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs", AGENT_TOKEN, "{\"run_id\":\"auth-1\"}", &r), 0);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs/auth-1/calls", AGENT_TOKEN, "{\"tool\":\"t\"}", &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  /* The agent may not cancel nor list: 403. */
  assert_int_equal(ht_req(&c, "POST", "/v1/runs/auth-1/cancel", AGENT_TOKEN, "{}", &r), 0);
  expect_error(&r, 403, "forbidden", "operator");
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/v1/runs", AGENT_TOKEN, NULL, &r), 0);
  expect_error(&r, 403, "forbidden", NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/groups/g/cancel", AGENT_TOKEN, "{}", &r), 0);
  expect_error(&r, 403, "forbidden", NULL);
  ht_resp_clear(&r);
  /* The operator may do everything. */
  assert_int_equal(ht_req(&c, "GET", "/v1/runs", OPERATOR_TOKEN, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs/auth-1/calls", OPERATOR_TOKEN, "{\"tool\":\"t\"}", &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs/auth-1/cancel", OPERATOR_TOKEN, "{}", &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  /* /healthz is open; /metrics is not. */
  assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/metrics", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 401);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/metrics", AGENT_TOKEN, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  /* A malformed header. */
  const char raw[] = "GET /v1/runs/auth-1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic xyz\r\n\r\n";
  assert_int_equal(ht_raw(&c, raw, sizeof raw - 1, &r), 0);
  assert_int_equal(r.status, 401);
  ht_resp_clear(&r);
  ht_close(&c);
  lg_server_free(s);
  /* No token appears in the log. */
  char path[300];
  snprintf(path, sizeof path, "%s/server.log", TMP);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    assert_null(strstr(line, AGENT_TOKEN));
    assert_null(strstr(line, OPERATOR_TOKEN));
  }
  fclose(f);
}

static void test_auth_config(void **state) {
  (void)state;
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.listen = "0.0.0.0:0";
  o.store_url = "memory:";
  char log[300];
  snprintf(log, sizeof log, "%s/server.log", TMP);
  o.log_path = log;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  /* No tokens: a non-loopback address is refused. */
  lg_server_t *s = lg_server_start(&o, &err);
  assert_null(s);
  assert_int_equal(err.code, LG_EINVAL);
  assert_non_null(strstr(err.message, "refusing"));
  /* With tokens it starts. */
  o.tokens = "operator " OPERATOR_TOKEN;
  s = lg_server_start(&o, &err);
  assert_non_null(s);
  char *banner = lg_server_banner(s);
  assert_non_null(strstr(banner, "auth:    on"));
  assert_null(strstr(banner, OPERATOR_TOKEN));
  lg_free(banner);
  lg_server_free(s);
  /* Bad token entries are refused, without echoing the token. */
  o.tokens = "admin " OPERATOR_TOKEN;
  memset(&err, 0, sizeof err);
  assert_null(lg_server_start(&o, &err));
  assert_null(strstr(err.message, OPERATOR_TOKEN));
  o.tokens = "agent short";
  assert_null(lg_server_start(&o, &err));
  /* A tokens file with comments. */
  char path[300];
  snprintf(path, sizeof path, "%s/tokens", TMP);
  FILE *f = fopen(path, "w");
  fprintf(f, "# tokens\n\nagent %s\n  operator   %s  \n", AGENT_TOKEN, OPERATOR_TOKEN);
  fclose(f);
  o.tokens = NULL;
  o.tokens_file = path;
  o.listen = "127.0.0.1:0";
  s = lg_server_start(&o, &err);
  assert_non_null(s);
  lg_server_free(s);
  o.tokens_file = "/nonexistent/tokens";
  assert_null(lg_server_start(&o, &err));
  assert_int_equal(err.code, LG_EIO);
}

/* ------------------------------------------------------------------ */
/* Limits: big bodies, slow clients; the server keeps serving.         */

static void test_big_bodies(void **state) {
  (void)state;
  ht_resp_t r;
  /* 10 MiB with a Content-Length: 413 at once, not read. */
  size_t big = 10u << 20;
  char *body = malloc(big + 1);
  memset(body, ' ', big);
  body[0] = '{';
  body[big - 1] = '}';
  body[big] = 0;
  assert_int_equal(ht_req(&C, "POST", "/v1/runs", NULL, body, &r), 0);
  expect_error(&r, 413, "payload_too_large", "limit");
  ht_resp_clear(&r);
  /* Just over 1 MiB, and just under. */
  body[(1u << 20) + 1] = 0;
  body[1u << 20] = '}';
  assert_int_equal(ht_req(&C, "POST", "/v1/runs", NULL, body, &r), 0);
  assert_int_equal(r.status, 413);
  ht_resp_clear(&r);
  body[(1u << 20) - 1] = 0;
  body[(1u << 20) - 2] = '}';
  assert_int_equal(ht_req(&C, "POST", "/v1/runs", NULL, body, &r), 0);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  free(body);
  /* Chunked, without a length, past the limit: cut off. */
  ht_conn_t c;
  ht_open(&c, PORT);
  const char head[] = "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  assert_int_equal(ht_send_all(c.fd, head, sizeof head - 1), 0);
  char chunk[70000];
  memset(chunk, ' ', sizeof chunk);
  int n = snprintf(chunk, 16, "%x\r\n", 65536);
  chunk[n] = ' ';
  memcpy(chunk + n + 65536, "\r\n", 2);
  int closed = 0;
  for (int i = 0; i < 40 && !closed; i++)
    closed = ht_send_all(c.fd, chunk, (size_t)n + 65538) != 0;
  if (!closed) {
    closed = ht_read(&c, &r) != 0 || r.status == 413;
    ht_resp_clear(&r);
  }
  assert_true(closed);
  ht_close(&c);
  /* Still serving. */
  req("GET", "/healthz", NULL, 200, &r);
  ht_resp_clear(&r);
}

static void test_slow_client(void **state) {
  (void)state;
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.timeout_s = 1;
  lg_server_t *s = start(&o);
  int port = lg_server_port(s);
  /* A client that sends half a request and stalls is cut off... */
  int stalled = ht_dial(port);
  const char half[] = "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"run";
  assert_int_equal(ht_send_all(stalled, half, sizeof half - 1), 0);
  /* ...and one that trickles its body too, while others are served. */
  int trickle = ht_dial(port);
  assert_int_equal(ht_send_all(trickle, half, sizeof half - 1), 0);
  ht_conn_t c;
  ht_open(&c, port);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int cut_stalled = 0, cut_trickle = 0;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((cut_stalled && cut_trickle) || t1.tv_sec - t0.tv_sec > 5) break;
    ht_resp_t r;
    assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    ht_resp_clear(&r);
    if (!cut_trickle && send(trickle, " ", 1, MSG_NOSIGNAL) < 0) cut_trickle = 1;
    char b[64];
    struct pollfd p[2] = {{cut_stalled ? -1 : stalled, POLLIN, 0}, {cut_trickle ? -1 : trickle, POLLIN, 0}};
    poll(p, 2, 100);
    if (p[0].revents && recv(stalled, b, sizeof b, MSG_DONTWAIT) == 0) cut_stalled = 1;
    if (p[1].revents && recv(trickle, b, sizeof b, MSG_DONTWAIT) <= 0) cut_trickle = 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_true(cut_stalled);
  assert_true(cut_trickle);
  assert_true(t1.tv_sec - t0.tv_sec <= 4);
  close(stalled);
  close(trickle);
  ht_close(&c);
  lg_server_free(s);
}

/* ------------------------------------------------------------------ */
/* Life: many clients at once, then a graceful shutdown.               */

typedef struct worker_arg {
  int port;
  int id;
  int errors;
  int done;
} worker_arg_t;

static void *agent_loop(void *p) {
  worker_arg_t *a = p;
  ht_conn_t c;
  ht_open(&c, a->port);
  char run[64], body[256], path[128];
  snprintf(run, sizeof run, "conc-%d", a->id);
  snprintf(body, sizeof body, "{\"run_id\":\"%s\"}", run);
  ht_resp_t r;
  if (ht_req(&c, "POST", "/v1/runs", NULL, body, &r) || r.status != 201) a->errors++;
  ht_resp_clear(&r);
  for (int i = 0; i < 50; i++) {
    snprintf(path, sizeof path, "/v1/runs/%s/calls", run);
    snprintf(body, sizeof body, "{\"tool\":\"t\",\"args\":{\"i\":%d}}", i % 40);
    if (ht_req(&c, "POST", path, NULL, body, &r) || r.status != 200) a->errors++;
    int exec = r.json && !strcmp(ht_str(&r, "action") ? ht_str(&r, "action") : "", "execute");
    ht_resp_clear(&r);
    if (exec) {
      snprintf(path, sizeof path, "/v1/runs/%s/results", run);
      if (ht_req(&c, "POST", path, NULL, "{\"status\":\"progress\"}", &r) || r.status != 200) a->errors++;
      ht_resp_clear(&r);
    }
    a->done++;
  }
  ht_close(&c);
  return NULL;
}

static void test_concurrent_and_shutdown(void **state) {
  (void)state;
  lg_server_t *s = start(NULL);
  enum { N = 16 };
  pthread_t th[N];
  worker_arg_t a[N];
  for (int i = 0; i < N; i++) {
    a[i] = (worker_arg_t){lg_server_port(s), i, 0, 0};
    pthread_create(&th[i], NULL, agent_loop, &a[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    assert_int_equal(a[i].errors, 0);
    assert_int_equal(a[i].done, 50);
  }
  /* A keep-alive connection open at shutdown does not hold it up. */
  ht_conn_t idle;
  ht_open(&idle, lg_server_port(s));
  ht_resp_t r;
  assert_int_equal(ht_req(&idle, "GET", "/healthz", NULL, NULL, &r), 0);
  ht_resp_clear(&r);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(lg_server_shutdown(s, 5000), 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_true(t1.tv_sec - t0.tv_sec < 3);
  assert_int_equal(lg_server_shutdown(s, 5000), 0); /* idempotent */
  ht_close(&idle);
  lg_server_free(s);
}

/* ------------------------------------------------------------------ */

static void rm_tmp(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
  if (system(cmd)) {
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(TMP, sizeof TMP, "/tmp/lgsrv.XXXXXX");
  if (!mkdtemp(TMP)) return 1;
  atexit(rm_tmp);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_run),
      cmocka_unit_test(test_create_run_errors),
      cmocka_unit_test(test_calls_ladder),
      cmocka_unit_test(test_calls_errors),
      cmocka_unit_test(test_calls_turns_and_ids),
      cmocka_unit_test(test_results),
      cmocka_unit_test(test_retry_after),
      cmocka_unit_test(test_state_handoffs),
      cmocka_unit_test(test_model_usage),
      cmocka_unit_test(test_ledger_through_calls),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_list),
      cmocka_unit_test(test_trace_replays),
      cmocka_unit_test(test_operations),
      cmocka_unit_test(test_health_metrics_routes),
      cmocka_unit_test(test_auth),
      cmocka_unit_test(test_auth_config),
      cmocka_unit_test(test_big_bodies),
      cmocka_unit_test(test_slow_client),
      cmocka_unit_test(test_concurrent_and_shutdown),
  };
  const char *names[LGT_MAX_BACKENDS];
  int nb = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < nb; i++) {
    URL = lgt_fresh_url(names[i]);
    fprintf(stderr, "== backend %s (%s)\n", names[i], URL);
    seq = 0;
    S = start(NULL);
    PORT = lg_server_port(S);
    ht_open(&C, PORT);
    failed += cmocka_run_group_tests_name(names[i], tests, NULL, NULL);
    ht_close(&C);
    lg_server_free(S);
  }
  return failed;
}
