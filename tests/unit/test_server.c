/*
 * test_server.c — the HTTP sidecar, black-box, over real HTTP on loopback:
 * what a table of requests and answers cannot show.
 *
 * The plain request -> answer checks of every route (runs, decisions,
 * cancel and listing, operations, budgets, health, metrics, routing, auth
 * and roles, errors per route) are data: tests/data/http/<case>/, run by
 * tests/http/run_cases.py against a real `loopguard serve` (ctest
 * http_cases). What stays here needs the process itself: a clock the tests
 * move (retry_after, a lease that runs out), the server's decisions against
 * the replay of its own trace (lg_replay_buffer), the log (no token in it),
 * lg_server_start's refusals, oversized bodies and slow clients (the server
 * goes on serving), many clients at once and a graceful shutdown.
 *
 * A server is started in this process (lg_server_start, port 0, a fresh
 * store of each backend of LG_STORE_BACKENDS — default memory and sqlite;
 * postgres under tests/pg/with-postgres.sh — and a clock the tests move) and
 * spoken to through a raw socket.
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
/* Decisions.                                                          */

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

static void test_lease_runs_out(void **state) {
  (void)state;
  /* A lease that runs out on the server's clock: unknown_outcome, 409. */
  ht_resp_t r;
  req("POST", "/v1/operations/claim", "{\"key\":\"op-c\",\"request_fingerprint\":\"fp1\",\"lease_ms\":100}", 201, &r);
  assert_string_equal(ht_str(&r, "outcome"), "claimed");
  ht_resp_clear(&r);
  ht_advance(99);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-c\",\"request_fingerprint\":\"fp1\"}", 409, &r);
  assert_string_equal(ht_str(&r, "outcome"), "in_progress");
  ht_resp_clear(&r);
  ht_advance(1000);
  req("POST", "/v1/operations/claim", "{\"key\":\"op-c\",\"request_fingerprint\":\"fp1\"}", 409, &r);
  assert_string_equal(ht_str(&r, "outcome"), "unknown_outcome");
  ht_resp_clear(&r);
  req("GET", "/v1/operations/op-c", NULL, 200, &r);
  assert_string_equal(ht_str(&r, "state"), "unknown_outcome");
  ht_resp_clear(&r);
}

/* ------------------------------------------------------------------ */
/* Auth.                                                               */

static void test_no_token_in_log(void **state) {
  (void)state;
  /* The roles themselves are tests/data/http/auth-roles; here, the log of
   * requests with good, wrong and refused tokens never holds one. */
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.tokens = "agent " AGENT_TOKEN "; operator " OPERATOR_TOKEN;
  lg_server_t *s = start(&o);
  ht_conn_t c;
  ht_open(&c, lg_server_port(s));
  static const struct {
    const char *method, *path, *token, *body;
    int want;
  } rq[] = {
      {"POST", "/v1/runs", "agent-token-0123456780", "{\"run_id\":\"auth-1\"}", 401},
      {"POST", "/v1/runs", AGENT_TOKEN, "{\"run_id\":\"auth-1\"}", 201},
      {"POST", "/v1/runs/auth-1/calls", AGENT_TOKEN, "{\"tool\":\"t\"}", 200},
      {"POST", "/v1/runs/auth-1/cancel", AGENT_TOKEN, "{}", 403},
      {"POST", "/v1/runs/auth-1/cancel", OPERATOR_TOKEN, "{}", 200},
      {"GET", "/metrics", AGENT_TOKEN, NULL, 200},
  };
  for (size_t i = 0; i < sizeof rq / sizeof rq[0]; i++) {
    ht_resp_t r;
    assert_int_equal(ht_req(&c, rq[i].method, rq[i].path, rq[i].token, rq[i].body, &r), 0);
    if (r.status != rq[i].want) fail_msg("%s %s -> %d, wanted %d", rq[i].method, rq[i].path, r.status, rq[i].want);
    ht_resp_clear(&r);
  }
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
  /* Chunked, without a length, past the limit and on past the drain's
   * bound (LG__DRAIN_BYTES, 8 MiB; 400 chunks of 64 KiB are 25 MiB, more
   * than that and both sockets' buffers): the server drops what it reads,
   * then closes the connection, so a send fails; it is not held to the
   * connection's timeout (the client never ends its body). */
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
  for (int i = 0; i < 400 && !closed; i++)
    closed = ht_send_all(c.fd, chunk, (size_t)n + 65538) != 0;
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
      cmocka_unit_test(test_retry_after),
      cmocka_unit_test(test_trace_replays),
      cmocka_unit_test(test_lease_runs_out),
      cmocka_unit_test(test_no_token_in_log),
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
