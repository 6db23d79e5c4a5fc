/*
 * test_stop_replay.c — every stop reason the server can give, replayed:
 * a run is driven over HTTP to the stop, its trace is fetched from the
 * server and replayed (lg_replay_buffer), and the replay must stop with
 * the same reason on the line of the very event the server stopped on,
 * with the same counters (replay_check.h). On every store backend
 * (LG_STORE_BACKENDS; default memory and sqlite, postgres under
 * tests/pg/with-postgres.sh).
 *
 * The cases are a table: a policy (and a budget scope), then the events,
 * the last of which is the one that must stop the run. Besides the
 * engine's own stops there are the stops decided outside it: a cancel
 * over HTTP, a group cancel, a cancel by lg_store_cancel_run on a store
 * handle of its own (as `loopguard runs cancel` does), a deny rule that
 * another replica wrote before the run's next call (the call becomes the
 * cancel), a cancel on a second server on the same store (a replica)
 * before the run's next call on the first, runs decided by two replicas
 * in turn, a run or a group cancelled before the run was created, and a shared
 * budget that refuses a model call (budget_exceeded: this used to replay
 * as no stop at all). The cases that need a second handle on the same
 * store (another process, another replica) are left out on memory:,
 * which is private to its handle.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>

#include "replay_check.h"
#include "store/store.h"

static char TMP[256];
static const char *URL;
static const char *BACKEND;
static int PORT;

typedef struct step {
  int advance_ms;    /* the clock moves this much first */
  const char *route; /* a decision route; or "cancel" (POST /cancel),
                        "group-cancel" (POST /v1/groups/G/cancel),
                        "store-cancel" (lg_store_cancel_run on a handle of
                        its own), "store-deny" (only the run's deny rule,
                        from another handle: a replica that has not
                        stepped the run), "replica-cancel" (POST /cancel
                        to a second server on the same store), or
                        "B:ROUTE" (a decision route of that second
                        server: two replicas deciding one run) */
  const char *body;  /* the body; for the cancels, the reason or NULL */
} step_t;

typedef struct scase {
  const char *name;
  const char *want;    /* the stop reason */
  const char *run;     /* run-creation fields besides run_id (JSON members) */
  const char *budget;  /* "SCOPE LIMIT": PUT /v1/budgets/SCOPE first, or NULL */
  const char *pre;     /* before the run exists: "group-cancel G", or
                          "cancel" (its id's cancel: 404, the rule waits) */
  int second_handle;   /* needs another handle on the same store (2: a
                          second server on it, another replica) */
  step_t steps[16];    /* the last one stops the run */
} scase_t;

#define CALL(args) {10, "calls", "{\"tool\":\"lookup\",\"args\":" args "}"}
#define TCALL(tool, args) {10, "calls", "{\"tool\":\"" tool "\",\"args\":" args "}"}
#define RESULT(status) {10, "results", "{\"status\":\"" status "\"}"}
#define RESULT_PV(status, pv) {10, "results", "{\"status\":\"" status "\",\"progress_version\":" #pv "}"}

static const scase_t CASES[] = {
    {"step_cap", "step_cap", "\"policy\":{\"limits\":{\"max_steps\":2}}", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT_PV("progress", 1), CALL("{\"id\":2}"), RESULT_PV("progress", 2),
      CALL("{\"id\":3}")}},
    {"model_call_cap", "model_call_cap", "\"policy\":{\"limits\":{\"max_model_calls\":1}}", NULL, NULL, 0,
     {{10, "model", "{\"input_tokens\":10,\"cost_usd\":0.01}"},
      {10, "usage", "{\"input_tokens\":10,\"output_tokens\":5}"},
      {10, "model", "{\"input_tokens\":10,\"cost_usd\":0.01}"}}},
    {"tool_call_cap", "tool_call_cap", "\"policy\":{\"tools\":{\"charge\":{\"max_calls\":1}}}", NULL, NULL, 0,
     {TCALL("charge", "{\"id\":1}"), RESULT_PV("progress", 1), TCALL("charge", "{\"id\":2}")}},
    {"wall_clock_cap", "wall_clock_cap", "\"policy\":{\"limits\":{\"max_wall_ms\":1000}}", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), {2000, "calls", "{\"tool\":\"lookup\",\"args\":{\"id\":2}}"}}},
    {"wall_clock_cap on a model call", "wall_clock_cap", "\"policy\":{\"limits\":{\"max_wall_ms\":1000}}", NULL,
     NULL, 0, {{10, "model", "{\"input_tokens\":10}"}, {2000, "model", "{\"input_tokens\":10}"}}},
    {"cost_cap", "cost_cap", "\"policy\":{\"limits\":{\"max_cost_usd\":0.05}}", NULL, NULL, 0,
     {{10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"},
      {10, "usage", "{\"input_tokens\":10,\"output_tokens\":5,\"cost_usd\":0.03}"},
      {10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"}}},
    {"token_cap", "token_cap", "\"policy\":{\"limits\":{\"max_tokens\":100}}", NULL, NULL, 0,
     {{10, "model", "{\"input_tokens\":50,\"max_tokens\":20}"},
      {10, "usage", "{\"input_tokens\":50,\"output_tokens\":20}"},
      {10, "model", "{\"input_tokens\":20,\"max_tokens\":20}"}}},
    {"handoff_cap", "handoff_cap", "\"policy\":{\"limits\":{\"max_handoffs\":1}}", NULL, NULL, 0,
     {{10, "handoffs", "{\"from\":\"a\",\"to\":\"b\"}"}, {10, "handoffs", "{\"from\":\"b\",\"to\":\"a\"}"}}},
    {"same_call_repeat", "same_call_repeat", "\"policy\":{\"repeat\":{\"stop\":4}}", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), CALL("{\"id\":1}"), RESULT("progress"), CALL("{\"id\":1}"),
      CALL("{\"id\":1}")}},
    {"short_cycle", "short_cycle", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), CALL("{\"id\":2}"), RESULT("progress"), CALL("{\"id\":1}"),
      RESULT("progress"), CALL("{\"id\":2}")}},
    {"no_progress (results)", "no_progress", "\"policy\":{\"no_progress\":{\"results\":2}}", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT_PV("progress", 1), CALL("{\"id\":2}"), RESULT_PV("progress", 1),
      CALL("{\"id\":3}"), RESULT_PV("progress", 1)}},
    {"no_progress (world)", "no_progress", "\"policy\":{\"no_progress\":{\"world_steps\":2}}", NULL, NULL, 0,
     {{10, "state", "{\"world\":{\"cursor\":1}}"}, {10, "state", "{\"world\":{\"cursor\":1}}"},
      {10, "state", "{\"world\":{\"cursor\":1}}"}}},
    {"failure_streak", "failure_streak", "\"policy\":{\"failure_streak\":2}", NULL, NULL, 0,
     {TCALL("poll", "{\"n\":1}"), RESULT("retryable"), TCALL("poll", "{\"n\":2}"), RESULT("retryable")}},
    {"invalid_tool_result (null value)", "invalid_tool_result", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), {10, "results", "{\"status\":\"progress\",\"value\":null}"}}},
    {"invalid_tool_result (no status)", "invalid_tool_result", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), {10, "results", "{\"value\":{\"a\":1}}"}}},
    {"invalid_tool_result (unknown status)", "invalid_tool_result", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), {10, "results", "{\"status\":\"okay\",\"value\":\"  \"}"}}},
    {"text_repeat (a chant, streamed in pieces of one turn)", "text_repeat",
     "\"policy\":{\"text\":{\"repeat\":{\"observe\":false,\"stop\":1}}}", NULL, NULL, 0,
     {{10, "text", "{\"turn\":1,\"text\":\"Let me try that again. \"}"},
      {10, "text", "{\"turn\":1,\"text\":\"Let me try that again. Let me try that again. \"}"}}},
    {"monologue", "monologue", NULL, NULL, NULL, 0,
     {{10, "text", "{\"text\":\"I will now check the invoice.\"}"},
      {10, "text", "{\"text\":\"I will now  check the invoice.\"}"},
      {10, "text", "{\"text\":\"I will now check\\nthe invoice.\"}"}}},
    {"context_loop", "context_loop", "\"policy\":{\"compaction\":{\"max\":3}}", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "compaction", "{}"}, {10, "compaction", "{}"},
      {10, "compaction", "{}"}}},
    {"block_streak (a five-step cycle of distinct calls)", "block_streak", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), CALL("{\"id\":2}"), CALL("{\"id\":3}"), CALL("{\"id\":4}"), CALL("{\"id\":5}"),
      CALL("{\"id\":1}"), CALL("{\"id\":2}"), CALL("{\"id\":3}"), CALL("{\"id\":4}"), CALL("{\"id\":5}"),
      CALL("{\"id\":1}"), CALL("{\"id\":2}"), CALL("{\"id\":3}"), CALL("{\"id\":4}"), CALL("{\"id\":5}")}},
    {"complete", "complete", NULL, NULL, NULL, 0, {CALL("{\"id\":1}"), RESULT("complete")}},
    {"fatal", "fatal", NULL, NULL, NULL, 0, {CALL("{\"id\":1}"), RESULT("fatal")}},
    {"permission_denied", "permission_denied", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("permission_denied")}},
    {"policy_blocked", "policy_blocked", NULL, NULL, NULL, 0, {CALL("{\"id\":1}"), RESULT("policy_blocked")}},
    {"human_required", "human_required", NULL, NULL, NULL, 0, {CALL("{\"id\":1}"), RESULT("human_required")}},
    {"cancel over HTTP", "operator_cancelled_loop", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "cancel", NULL}}},
    {"cancel over HTTP with a reason", "enough", NULL, NULL, NULL, 0,
     {CALL("{\"id\":1}"), {10, "cancel", "enough"}}},
    {"group cancel over HTTP", "operator_cancelled_loop", "\"group\":\"grp-http-%s\"", NULL, NULL, 0,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "group-cancel", NULL}}},
    {"group cancelled before the run existed", "stop-the-group", "\"group\":\"grp-pre-%s\"", NULL,
     "group-cancel grp-pre-%s", 0, {CALL("{\"id\":1}")}},
    {"cancel by lg_store_cancel_run, as the CLI does", "cli-cancel", NULL, NULL, NULL, 1,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "store-cancel", "cli-cancel"}}},
    {"cancel by another replica before the run's next call", "operator_cancelled_loop", NULL, NULL, NULL, 1,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "store-deny", NULL}, CALL("{\"id\":2}")}},
    {"cancel by another replica, with a reason, on a model call", "replica-says-no", NULL, NULL, NULL, 1,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "store-deny", "replica-says-no"},
      {10, "model", "{\"input_tokens\":10}"}}},
    {"a run cancelled before it was created", "too-early", NULL, NULL, "cancel", 0,
     {{10, "model", "{\"input_tokens\":10}"}}},
    /* The run's next call here is the check after every case: stop, and
     * no line. */
    {"cancel on another replica, then the run's next call here", "replica-cancel", NULL, NULL, NULL, 2,
     {CALL("{\"id\":1}"), RESULT("progress"), {10, "replica-cancel", "replica-cancel"}}},
    {"two replicas deciding one run, to a repeat stop", "same_call_repeat", "\"policy\":{\"repeat\":{\"stop\":4}}",
     NULL, NULL, 2,
     {CALL("{\"id\":1}"), {10, "B:results", "{\"status\":\"progress\"}"},
      {10, "B:calls", "{\"tool\":\"lookup\",\"args\":{\"id\":1}}"}, RESULT("progress"),
      {10, "B:calls", "{\"tool\":\"lookup\",\"args\":{\"id\":1}}"}, {10, "B:state", "{\"world\":{\"a\":1}}"},
      CALL("{\"id\":1}")}},
    {"two replicas, a model call on one and its usage on the other, to a cost cap", "cost_cap",
     "\"policy\":{\"limits\":{\"max_cost_usd\":0.05}}", NULL, NULL, 2,
     {{10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"},
      {10, "B:usage", "{\"input_tokens\":10,\"output_tokens\":5,\"cost_usd\":0.04}"},
      {10, "B:model", "{\"input_tokens\":10,\"cost_usd\":0.02}"}}},
    {"budget_exceeded (a team budget)", "budget_exceeded", "\"scopes\":[\"team:t-%s\"]", "team:t-%s 0.05",
     NULL, 0,
     {{10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"},
      {10, "usage", "{\"input_tokens\":10,\"output_tokens\":5,\"cost_usd\":0.03}"},
      CALL("{\"id\":1}"), RESULT("progress"),
      {10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"}}},
    {"budget_exceeded (a workspace budget, 403)", "budget_exceeded", "\"scopes\":[\"workspace:w-%s\"]",
     "workspace:w-%s 0.01", NULL, 0, {{10, "model", "{\"input_tokens\":10,\"cost_usd\":0.03}"}}},
};

/* "...%s..." with the backend's name in place of %s (names stay unique
 * per store: the budgets and groups of PostgreSQL outlive a run). */
static void fill(char *out, size_t n, const char *fmt) {
  snprintf(out, n, fmt, BACKEND, BACKEND);
}

static lg_store_t *second_handle(void) {
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(URL, NULL, &err);
  if (!s) {
    char buf[1024];
    fail_msg("a second handle on %s: %s", URL, lg_error_format(&err, buf, sizeof buf));
  }
  return s;
}

static int run_case(ht_conn_t *c, int idx) {
  const scase_t *k = &CASES[idx];
  static rc_run_t rc;
  char run_id[96], buf[1024], path[2048], body[2048];
  snprintf(run_id, sizeof run_id, "stop-%d-%s", idx, BACKEND);
  rc_init(&rc, run_id);
  rc_logf(&rc, "case %s\n", k->name);
  ht_resp_t a;
  int bad = 0;
  lg_store_t *other = NULL;
  lg_server_t *replica = NULL;
  ht_conn_t cb = {-1, 0};
  if (k->second_handle == 1) other = second_handle();
  if (k->second_handle == 2) {
    char log[300];
    snprintf(log, sizeof log, "%s/replica-%s.log", TMP, BACKEND);
    if (!(replica = rc_start(URL, NULL, log))) fail_msg("a second server on %s", URL);
    ht_open(&cb, lg_server_port(replica));
  }
  if (k->budget) { /* "SCOPE LIMIT" */
    char scope[256];
    double limit = 0;
    fill(buf, sizeof buf, k->budget);
    if (sscanf(buf, "%255s %lf", scope, &limit) != 2) fail_msg("bad case %s", k->name);
    snprintf(path, sizeof path, "/v1/budgets/%s", scope);
    snprintf(body, sizeof body, "{\"limit_usd\":%g,\"period\":\"none\"}", limit);
    if (rc_send(c, &rc, "PUT", path, body, &a) || a.status != 200) bad = 1;
    ht_resp_clear(&a);
  }
  if (k->pre && !strcmp(k->pre, "cancel")) { /* the run's own id, before it exists: 404 */
    snprintf(path, sizeof path, "/v1/runs/%s/cancel", run_id);
    if (rc_send(c, &rc, "POST", path, "{\"reason\":\"too-early\"}", &a) || a.status != 404) bad = 1;
    ht_resp_clear(&a);
  } else if (k->pre) { /* "group-cancel G": before the run exists */
    fill(buf, sizeof buf, k->pre);
    snprintf(path, sizeof path, "/v1/groups/%s/cancel", buf + strlen("group-cancel "));
    if (rc_send(c, &rc, "POST", path, "{\"reason\":\"stop-the-group\"}", &a) || a.status != 200) bad = 1;
    ht_resp_clear(&a);
  }
  fill(buf, sizeof buf, k->run ? k->run : "");
  snprintf(body, sizeof body, "{\"run_id\":\"%s\"%s%s}", run_id, k->run ? "," : "", buf);
  if (rc_send(c, &rc, "POST", "/v1/runs", body, &a) || a.status != 201) bad = 1;
  ht_resp_clear(&a);
  int nsteps = 0;
  while (nsteps < 16 && k->steps[nsteps].route) nsteps++;
  for (int i = 0; i < nsteps && !bad; i++) {
    const step_t *st = &k->steps[i];
    ht_advance(st->advance_ms);
    const char *r = st->route;
    int was_stopped = rc.stopped;
    if (!strcmp(r, "cancel")) {
      snprintf(path, sizeof path, "/v1/runs/%s/cancel", run_id);
      if (st->body) snprintf(body, sizeof body, "{\"reason\":\"%s\"}", st->body);
      else snprintf(body, sizeof body, "{}");
      if (rc_send(c, &rc, "POST", path, body, &a) || a.status != 200) bad = 1;
      else rc_note_cancel(&rc, json_is_true(ht_get(&a, "cancelled")), st->body);
    } else if (!strcmp(r, "group-cancel")) {
      fill(buf, sizeof buf, "grp-http-%s");
      snprintf(path, sizeof path, "/v1/groups/%s/cancel", buf);
      if (rc_send(c, &rc, "POST", path, "{}", &a) || a.status != 200) bad = 1;
      else {
        json_t *ids = ht_get(&a, "cancelled");
        int listed = 0;
        for (size_t j = 0; j < json_array_size(ids); j++)
          if (!strcmp(json_string_value(json_array_get(ids, j)), run_id)) listed = 1;
        if (!listed) rc_logf(&rc, "!! the group cancel does not list the run\n");
        bad = !listed;
        rc_note_cancel(&rc, listed, NULL);
      }
    } else if (!strcmp(r, "replica-cancel")) {
      snprintf(path, sizeof path, "/v1/runs/%s/cancel", run_id);
      snprintf(body, sizeof body, "{\"reason\":\"%s\"}", st->body);
      if (rc_send(&cb, &rc, "POST", path, body, &a) || a.status != 200) bad = 1;
      else rc_note_cancel(&rc, json_is_true(ht_get(&a, "cancelled")), st->body);
    } else if (!strncmp(r, "B:", 2)) { /* the other replica decides */
      snprintf(path, sizeof path, "/v1/runs/%s/%s", run_id, r + 2);
      if (rc_send(&cb, &rc, "POST", path, st->body, &a) || a.status != 200) bad = 1;
      else rc_note(&rc, r + 2, &a);
    } else if (!strcmp(r, "store-cancel") || !strcmp(r, "store-deny")) {
      lg_error_t err = {0};
      int src = !strcmp(r, "store-cancel")
                    ? lg_store_cancel_run(other, run_id, st->body, ht_clock_ms, &err)
                    : lg__store_deny(other, LG__DENY_RUN, run_id, st->body, ht_clock_ms, &err);
      rc_logf(&rc, "[t=%lld] %s on another handle (%s) -> %d %s\n", (long long)ht_clock_ms, r,
              st->body ? st->body : "no reason", src, err.message);
      if (src) bad = 1;
      if (!strcmp(r, "store-cancel")) rc_note_cancel(&rc, 1, st->body);
      memset(&a, 0, sizeof a);
    } else {
      snprintf(path, sizeof path, "/v1/runs/%s/%s", run_id, r);
      if (rc_send(c, &rc, "POST", path, st->body, &a) || a.status != 200) bad = 1;
      else rc_note(&rc, r, &a);
      if (!strcmp(r, "model") && i == nsteps - 1 && !strcmp(k->want, "budget_exceeded") &&
          !json_object_get(a.json, "metadata")) {
        rc_logf(&rc, "!! a budget refusal without its metadata\n");
        bad = 1;
      }
    }
    ht_resp_clear(&a);
    if (bad) break;
    /* Only the last event stops the run, with the reason wanted. */
    int last = i == nsteps - 1;
    if (!was_stopped && rc.stopped != last) {
      rc_logf(&rc, "!! %s\n", last ? "the last event did not stop the run" : "an event before the last stopped the run");
      bad = 1;
    } else if (last && strcmp(rc.line[rc.stop_at].reason, k->want)) {
      rc_logf(&rc, "!! stopped with %s, wanted %s\n", rc.line[rc.stop_at].reason, k->want);
      bad = 1;
    } else if (last && rc.stop_at != rc.n - 1) {
      bad = 1;
    }
  }
  if (bad) fprintf(stderr, "\n==== %s (%s): the server did not stop as the case says\n%s", k->name, BACKEND, rc.log);
  else if (rc_check(c, &rc, k->name)) bad = 1;
  /* Events after the stop: answered with the stop, nothing written (the
   * check again: the replay must still end on the same line). */
  if (!bad) {
    ht_advance(5);
    snprintf(path, sizeof path, "/v1/runs/%s/calls", run_id);
    if (rc_send(c, &rc, "POST", path, "{\"tool\":\"lookup\",\"args\":{\"id\":9}}", &a) || a.status != 200 ||
        strcmp(ht_str(&a, "action") ? ht_str(&a, "action") : "", "stop"))
      bad = 1;
    ht_resp_clear(&a);
    if (!bad && rc_check(c, &rc, k->name)) bad = 1;
  }
  lg_store_close(other);
  ht_close(&cb);
  lg_server_free(replica);
  rc_free(&rc);
  return bad;
}

static void test_every_stop_replays(void **state) {
  (void)state;
  ht_conn_t c;
  ht_open(&c, PORT);
  int failed = 0, ran = 0;
  for (int i = 0; i < (int)(sizeof CASES / sizeof CASES[0]); i++) {
    if (CASES[i].second_handle && !strcmp(BACKEND, "memory")) continue; /* private to its handle */
    ran++;
    if (run_case(&c, i)) {
      failed++;
      fprintf(stderr, "FAIL: %s (%s)\n", CASES[i].name, BACKEND);
    }
  }
  ht_close(&c);
  fprintf(stderr, "%s: %d stop cases, %d failed\n", BACKEND, ran, failed);
  if (failed) fail_msg("%d stop cases do not replay as the server decided", failed);
}

static void rm_tmp(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
  if (system(cmd)) {
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(TMP, sizeof TMP, "/tmp/lgstop.XXXXXX");
  if (!mkdtemp(TMP)) return 1;
  atexit(rm_tmp);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_stop_replays)};
  const char *names[LGT_MAX_BACKENDS];
  int nb = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < nb; i++) {
    BACKEND = names[i];
    URL = lgt_fresh_url(names[i]);
    fprintf(stderr, "== backend %s (%s)\n", names[i], URL);
    char log[300];
    snprintf(log, sizeof log, "%s/server-%s.log", TMP, BACKEND);
    lg_server_t *srv = rc_start(URL, NULL, log);
    if (!srv) return 1;
    PORT = lg_server_port(srv);
    failed += cmocka_run_group_tests_name(names[i], tests, NULL, NULL);
    lg_server_free(srv);
  }
  return failed;
}
