/*
 * test_server_hardening.c — what a hostile or careless client sends.
 *
 *   test_integer_ranges    every number a client sends has a range (body.c's
 *                          one table); outside it is a 400 naming the field;
 *                          times print as RFC 3339 with four-digit years;
 *                          docs/security.md lists the table as body.c has it.
 *   test_open_mode         no tokens: only a loopback Host, no foreign
 *                          Origin, bodies only as application/json (415) —
 *                          a web page cannot cancel a run.
 *   test_bytes             ids in paths: routed on the raw path, decoded per
 *                          segment, valid UTF-8 without control characters;
 *                          %2F in a run id, %00 anywhere: 400; every error
 *                          body parses as strict JSON in the documented
 *                          shape (jansson refuses invalid UTF-8).
 *   test_nesting           a JSON field nested deeper than
 *                          LG_CANON_MAX_DEPTH is a 400 naming it, and what
 *                          is accepted canonicalises (replays).
 *   test_own_answers       414 and 431 in JSON; a body over the limit sent
 *                          before reading (python3's http.client) gets its
 *                          413; with tokens, an unauthenticated request to
 *                          an unknown path or method is 401, not 404/405.
 *   test_forked_child      a refused client that goes on sending after the
 *                          server dropped it, while a child of the process
 *                          holds copies of every descriptor (popen does,
 *                          until it execs): the acceptor never sees the
 *                          freed connection again (a use after free in
 *                          clean runs; ASan shows it here every time).
 *   test_head_limits       a head at LG__MAX_HEAD bytes / LG__MAX_FIELDS
 *                          fields served, one more the JSON 431, on a first
 *                          and on a later head; a later head of 9-15 KiB
 *                          the JSON 431 on a kept connection
 *   test_screen            what libmicrohttpd answered itself in HTML (a
 *                          Content-Length of -1, over 2^64 or "1, 2", a
 *                          40 KiB header line or target, HTTP/2.0, no
 *                          version, garbage, a line without a colon, ...)
 *                          is one JSON answer in the documented shape,
 *                          read even by a client that sends a body first;
 *                          keep-alive clients work after them. In every
 *                          event-loop mode: epoll loops (1 and 3 daemons)
 *                          and libmicrohttpd's own poll() threads.
 */
#include <setjmp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/server.h"
#include "test_server_http.h"

void lg__time_rfc3339(int64_t ms, char buf[32]);

static lg_server_t *S;
static int PORT;
static ht_conn_t C;

static lg_server_t *start(const char *tokens) {
  lg_server_options_t o = {0};
  o.listen = "127.0.0.1:0";
  o.store_url = "memory:";
  o.tokens = tokens;
  o.log_path = "/dev/null";
  lg_error_t e = {0};
  lg_server_t *s = lg_server_start(&o, &e);
  if (!s) fail_msg("server: %s", e.message);
  return s;
}

static int setup(void **state) {
  (void)state;
  S = start(NULL);
  PORT = lg_server_port(S);
  ht_open(&C, PORT);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ht_close(&C);
  lg_server_free(S);
  return 0;
}

/* The documented error shape, parsed strictly: {"error":{"code":status,
 * "type":string,"message":string[,"field":string]}} and nothing else. */
static void expect_shape(const ht_resp_t *r, int status, const char *field) {
  if (r->status != status) fail_msg("status %d, wanted %d: %s", r->status, status, r->body);
  json_error_t je;
  json_t *j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &je);
  if (!j) fail_msg("the %d body is not JSON (%s): %s", status, je.text, r->body);
  if (!ht_find(r->head, "\r\nContent-Type: application/json"))
    fail_msg("the %d answer is not application/json: %s", status, r->head);
  json_t *e = json_object_get(j, "error");
  assert_non_null(e);
  assert_int_equal(json_object_size(j), 1);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), status);
  assert_true(json_is_string(json_object_get(e, "type")));
  assert_true(json_is_string(json_object_get(e, "message")));
  if (field) {
    const char *f = json_string_value(json_object_get(e, "field"));
    if (!f || strcmp(f, field)) fail_msg("field %s, wanted %s: %s", f ? f : "(none)", field, r->body);
  }
  json_decref(j);
}

static void post(const char *path, const char *body, ht_resp_t *r) {
  assert_int_equal(ht_req(&C, "POST", path, NULL, body, r), 0);
}

static void raw(const char *req, size_t n, ht_resp_t *r) {
  ht_conn_t c;
  ht_open(&c, PORT);
  if (ht_raw(&c, req, n, r)) fail_msg("no answer to %.60s", req);
  ht_close(&c);
}

/* ------------------------------------------------------------------ */

static void test_integer_ranges(void **state) {
  (void)state;
  ht_resp_t r;
  post("/v1/runs", "{\"run_id\":\"ints\"}", &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  static const struct {
    const char *path, *body, *field;
  } bad[] = {
      {"/v1/runs/ints/model", "{\"input_tokens\":9223372036854775807}", "input_tokens"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1000000001}", "input_tokens"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1,\"max_tokens\":1e308}", "max_tokens"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1,\"max_tokens\":-1}", "max_tokens"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1,\"cost_usd\":-0.5}", "cost_usd"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1,\"cost_usd\":1e300}", "cost_usd"},
      {"/v1/runs/ints/model", "{\"input_tokens\":1,\"turn\":9007199254740993}", "turn"},
      {"/v1/runs/ints/usage", "{\"input_tokens\":9223372036854775807,\"output_tokens\":1}",
       "input_tokens"},
      {"/v1/runs/ints/usage", "{\"input_tokens\":1,\"output_tokens\":-9223372036854775808}",
       "output_tokens"},
      {"/v1/runs/ints/calls", "{\"tool\":\"t\",\"turn\":-1}", "turn"},
      {"/v1/runs/ints/calls", "{\"tool\":\"t\",\"turn\":1e19}", "turn"},
      {"/v1/runs/ints/results", "{\"status\":\"ok\",\"retry_after_ms\":9223372036854775807}",
       "retry_after_ms"},
      {"/v1/runs/ints/results", "{\"status\":\"ok\",\"retry_after_ms\":604800001}",
       "retry_after_ms"},
      {"/v1/runs/ints/results", "{\"status\":\"ok\",\"progress_version\":9007199254740993}",
       "progress_version"},
      {"/v1/runs/ints/results", "{\"status\":\"ok\",\"progress_version\":-9007199254740993}",
       "progress_version"},
      {"/v1/runs", "{\"run_id\":\"ints2\",\"progress_version\":1e300}", "progress_version"},
      {"/v1/operations/claim",
       "{\"key\":\"k\",\"request_fingerprint\":\"f\",\"lease_ms\":9223372036854775807}", "lease_ms"},
      {"/v1/operations/claim", "{\"key\":\"k\",\"request_fingerprint\":\"f\",\"lease_ms\":-1}",
       "lease_ms"},
      {"/v1/budgets/reserve", "{\"scopes\":[\"team:a\"],\"amount_usd\":1e300}", "amount_usd"},
      {"/v1/budgets/reserve", "{\"scopes\":[\"team:a\"],\"amount_usd\":1,\"ttl_ms\":-1}", "ttl_ms"},
      /* past the 24 hours a reservation may hold: the budgets' own bound */
      {"/v1/budgets/reserve", "{\"scopes\":[\"team:a\"],\"amount_usd\":1,\"ttl_ms\":86400001}",
       "ttl_ms"},
      {"/v1/budgets/reserve",
       "{\"scopes\":[\"team:a\"],\"amount_usd\":1,\"ttl_ms\":9223372036854775807}", "ttl_ms"},
      {"/v1/budgets/settle", "{\"reservation_id\":\"x\",\"actual_usd\":1e300}", "actual_usd"},
      {"/v1/budgets/settle", "{\"reservation_id\":\"x\",\"actual_usd\":-1}", "actual_usd"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    post(bad[i].path, bad[i].body, &r);
    if (r.status != 400) fail_msg("%s %s -> %d: %s", bad[i].path, bad[i].body, r.status, r.body);
    expect_shape(&r, 400, bad[i].field);
    ht_resp_clear(&r);
  }
  /* Every number field of every body has its row in the table. */
  const char *unranged = lg__body_unranged();
  if (unranged) fail_msg("the number field %s has no range in body.c's table", unranged);
  /* Beyond int64 or double: jansson refuses the document itself. */
  post("/v1/runs/ints/model", "{\"input_tokens\":18446744073709551616}", &r);
  expect_shape(&r, 400, "body");
  ht_resp_clear(&r);
  post("/v1/runs/ints/model", "{\"input_tokens\":1,\"cost_usd\":1e309}", &r);
  expect_shape(&r, 400, "body");
  ht_resp_clear(&r);
  /* The edges are accepted; 0 is the default, as the reference says. */
  post("/v1/operations/claim", "{\"key\":\"edge\",\"request_fingerprint\":\"f\",\"lease_ms\":604800000}",
       &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  post("/v1/operations/claim", "{\"key\":\"edge0\",\"request_fingerprint\":\"f\",\"lease_ms\":0}", &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&C, "GET", "/v1/operations/edge", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  post("/v1/runs/ints/calls", "{\"tool\":\"t\",\"turn\":9007199254740992}", &r);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  post("/v1/runs/ints/results", "{\"status\":\"ok\",\"progress_version\":-9007199254740992,"
                                "\"retry_after_ms\":0}",
       &r);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  /* Times: RFC 3339, four-digit years, whatever the milliseconds. */
  static const int64_t ms[] = {INT64_MAX, INT64_MIN, -1, 0, 253402300800000LL, 1790000000000LL};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    char t[32];
    lg__time_rfc3339(ms[i], t);
    int y, mo, d, h, mi, sec, milli;
    char z;
    if (strlen(t) != 24 ||
        sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &y, &mo, &d, &h, &mi, &sec, &milli, &z) != 8 ||
        z != 'Z' || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
      fail_msg("%lld ms printed as \"%s\"", (long long)ms[i], t);
  }
  /* docs/security.md has the table as body.c has it. */
  const char *src = getenv("LG_SOURCE_DIR");
  if (src) {
    char path[512];
    snprintf(path, sizeof path, "%s/docs/security.md", src);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot read %s", path);
    static char doc[1 << 17];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = 0;
    fclose(f);
    for (const lg__range_t *g = lg__body_ranges(); g->field; g++) {
      char row[256];
      if (g->usd_hi > 0)
        snprintf(row, sizeof row, "| `%s` | 0 to %.0f USD |", g->field, g->usd_hi);
      else
        snprintf(row, sizeof row, "| `%s` | %lld to %lld |", g->field, (long long)g->lo,
                 (long long)g->hi);
      if (!strstr(doc, row)) fail_msg("docs/security.md lacks the row \"%s\"", row);
    }
  }
}

static void test_open_mode(void **state) {
  (void)state;
  ht_resp_t r;
  post("/v1/runs", "{\"run_id\":\"victim\"}", &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  char req[1024];
  /* A page's cross-site POST: text/plain, a foreign Host (DNS rebinding). */
  int n = snprintf(req, sizeof req,
                   "POST /v1/runs/victim/cancel HTTP/1.1\r\nHost: evil.example\r\n"
                   "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}");
  raw(req, (size_t)n, &r);
  expect_shape(&r, 403, "Host");
  ht_resp_clear(&r);
  /* The same with a loopback Host: text/plain is 415. */
  n = snprintf(req, sizeof req,
               "POST /v1/runs/victim/cancel HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
               "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
               PORT);
  raw(req, (size_t)n, &r);
  expect_shape(&r, 415, "Content-Type");
  ht_resp_clear(&r);
  /* A form, and no Content-Type at all: 415 too. */
  n = snprintf(req, sizeof req,
               "POST /v1/runs/victim/cancel HTTP/1.1\r\nHost: localhost\r\n"
               "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 2\r\n\r\n{}");
  raw(req, (size_t)n, &r);
  expect_shape(&r, 415, "Content-Type");
  ht_resp_clear(&r);
  n = snprintf(req, sizeof req,
               "POST /v1/runs/victim/cancel HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}");
  raw(req, (size_t)n, &r);
  expect_shape(&r, 415, "Content-Type");
  ht_resp_clear(&r);
  /* A foreign Origin, even with JSON and a loopback Host; an Origin on
   * another loopback port; "null". */
  const char *origins[] = {"http://evil.example", "http://127.0.0.1:1", "null",
                           "https://localhost"};
  for (size_t i = 0; i < sizeof origins / sizeof origins[0]; i++) {
    n = snprintf(req, sizeof req,
                 "POST /v1/runs/victim/cancel HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
                 PORT, origins[i]);
    raw(req, (size_t)n, &r);
    expect_shape(&r, 403, "Origin");
    ht_resp_clear(&r);
  }
  /* Hosts that are not loopback names. */
  const char *hosts[] = {"127.0.0.1.evil.example", "localhost.evil.example", "[::2]:80",
                         "128.0.0.1", "127.0.0.1:99999", "127.1", ""};
  for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
    n = snprintf(req, sizeof req, "GET /v1/runs/victim HTTP/1.1\r\nHost: %s\r\n\r\n", hosts[i]);
    raw(req, (size_t)n, &r);
    if (r.status != 403) fail_msg("Host \"%s\" -> %d", hosts[i], r.status);
    expect_shape(&r, 403, "Host");
    ht_resp_clear(&r);
  }
  /* The run was not cancelled by any of that. */
  assert_int_equal(ht_req(&C, "GET", "/v1/runs/victim", NULL, NULL, &r), 0);
  assert_string_equal(ht_str(&r, "status"), "active");
  ht_resp_clear(&r);
  /* Loopback names, any port; an Origin that is this server; JSON with
   * parameters. */
  const char *ok_hosts[] = {"localhost", "LOCALHOST:8787", "127.0.0.1", "127.9.8.7:1", "[::1]",
                            "[::1]:8787"};
  for (size_t i = 0; i < sizeof ok_hosts / sizeof ok_hosts[0]; i++) {
    n = snprintf(req, sizeof req, "GET /v1/runs/victim HTTP/1.1\r\nHost: %s\r\n\r\n", ok_hosts[i]);
    raw(req, (size_t)n, &r);
    if (r.status != 200) fail_msg("Host \"%s\" -> %d: %s", ok_hosts[i], r.status, r.body);
    ht_resp_clear(&r);
  }
  n = snprintf(req, sizeof req,
               "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: http://localhost:%d\r\n"
               "Content-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\n\r\n{}",
               PORT, PORT);
  raw(req, (size_t)n, &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  /* With tokens, the Host is not checked: the token is the guard. */
  lg_server_t *t = start("agent aaaaaaaaaaaaaaaaaaaaaaaa");
  ht_conn_t c;
  ht_open(&c, lg_server_port(t));
  n = snprintf(req, sizeof req,
               "GET /healthz HTTP/1.1\r\nHost: loopguard.internal\r\n"
               "Authorization: Bearer aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n");
  assert_int_equal(ht_raw(&c, req, (size_t)n, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  ht_close(&c);
  lg_server_free(t);
}

static void test_bytes(void **state) {
  (void)state;
  ht_resp_t r;
  static const struct {
    const char *method, *path;
    int status;
    const char *field;
  } cases[] = {
      {"GET", "/v1/runs/%ff", 400, "run_id"},
      {"GET", "/v1/runs/%c3%28", 400, "run_id"},       /* a broken sequence */
      {"GET", "/v1/runs/%ed%a0%80", 400, "run_id"},    /* a surrogate */
      {"GET", "/v1/runs/%c0%af", 400, "run_id"},       /* overlong '/' */
      {"GET", "/v1/runs/a%01b", 400, "run_id"},
      {"GET", "/v1/runs/a%7fb", 400, "run_id"},
      {"GET", "/v1/runs/a%00b", 400, "run_id"},
      {"GET", "/v1/runs/a%zz", 400, "run_id"},
      {"GET", "/v1/runs/a%2", 400, "run_id"},
      {"GET", "/v1/runs/p%2Fcalls", 400, "run_id"},
      {"POST", "/v1/runs/p%2fcalls", 400, "run_id"},
      {"POST", "/v1/groups/%ff/cancel", 400, "group"},
      {"POST", "/v1/groups/g%2Fh/cancel", 400, "group"},
      {"GET", "/v1/operations/k%00", 400, "key"},
      {"GET", "/v1/runs//calls", 404, NULL},
      {"POST", "//v1/runs", 404, NULL},
      {"GET", "/v1/runs/a/b/c", 404, NULL},
      {"GET", "/v1/runs/x/", 404, NULL},
      {"GET", "/\xff\xfe", 404, NULL},
      {"GET", "/v1/nope\xc3", 404, NULL},
      {"DELETE", "/v1/runs/\xff", 400, "run_id"},
      {"DELETE", "/v1/runs/ok", 405, NULL},
      {"PATCH", "/healthz\xe2\x82", 404, NULL},
  };
  char req[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    bool body = !strcmp(cases[i].method, "POST");
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n%s",
                     cases[i].method, cases[i].path,
                     body ? "Content-Type: application/json\r\nContent-Length: 2\r\n" : "",
                     body ? "{}" : "");
    raw(req, (size_t)n, &r);
    if (r.status != cases[i].status)
      fail_msg("%s %s -> %d, wanted %d: %s", cases[i].method, cases[i].path, r.status,
               cases[i].status, r.body);
    expect_shape(&r, cases[i].status, cases[i].field);
    ht_resp_clear(&r);
  }
  /* No deny rule was stored for a group named 0xFF: a run in a group
   * created now is not stopped. Nor for run "p". */
  post("/v1/runs", "{\"run_id\":\"p\"}", &r);
  ht_resp_clear(&r);
  post("/v1/runs/p/calls", "{\"tool\":\"t\"}", &r);
  assert_int_equal(r.status, 200);
  assert_string_equal(ht_str(&r, "action"), "execute");
  ht_resp_clear(&r);
  /* An operation key may hold '/': %2F is decoded inside its segment. */
  post("/v1/operations/claim", "{\"key\":\"a/b\",\"request_fingerprint\":\"f\"}", &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&C, "GET", "/v1/operations/a%2Fb", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(ht_str(&r, "key"), "a/b");
  ht_resp_clear(&r);
  /* An id with a quote and a backslash comes back escaped. */
  post("/v1/runs", "{\"run_id\":\"q\\\"\\\\\"}", &r);
  assert_int_equal(r.status, 201);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&C, "GET", "/v1/runs/nope%22%5C%E2%82%AC", NULL, NULL, &r), 0);
  expect_shape(&r, 404, NULL);
  ht_resp_clear(&r);
}

/* A value of `depth` nested arrays around 1. */
static char *nested(int depth) {
  char *s = malloc((size_t)depth * 2 + 2);
  memset(s, '[', (size_t)depth);
  s[depth] = '1';
  memset(s + depth + 1, ']', (size_t)depth);
  s[depth * 2 + 1] = 0;
  return s;
}

static void test_nesting(void **state) {
  (void)state;
  ht_resp_t r;
  post("/v1/runs", "{\"run_id\":\"deep\"}", &r);
  ht_resp_clear(&r);
  char body[8192];
  int depths[] = {LG_CANON_MAX_DEPTH + 1, 2000};
  for (size_t i = 0; i < 2; i++) {
    char *v = nested(depths[i]);
    post("/v1/runs/deep/calls", "{\"tool\":\"t\"}", &r);
    ht_resp_clear(&r);
    snprintf(body, sizeof body, "{\"status\":\"ok\",\"value\":%s}", v);
    post("/v1/runs/deep/results", body, &r);
    expect_shape(&r, 400, "value");
    ht_resp_clear(&r);
    snprintf(body, sizeof body, "{\"tool\":\"t\",\"args\":{\"a\":%s}}", v);
    post("/v1/runs/deep/calls", body, &r);
    expect_shape(&r, 400, "args");
    ht_resp_clear(&r);
    snprintf(body, sizeof body, "{\"result\":%s}", v);
    post("/v1/operations/x/commit", body, &r);
    expect_shape(&r, 400, "result");
    ht_resp_clear(&r);
    free(v);
  }
  /* The deepest accepted value is one the canonicaliser takes, and the
   * run's trace (which holds it) is served. */
  char *v = nested(LG_CANON_MAX_DEPTH);
  lg_canon_t *cn = lg_canon_new();
  const char *out;
  size_t ol;
  assert_int_equal(lg_canon_json(cn, v, strlen(v), &out, &ol, NULL), 0);
  lg_canon_free(cn);
  snprintf(body, sizeof body, "{\"status\":\"ok\",\"value\":%s}", v);
  post("/v1/runs/deep/results", body, &r);
  if (r.status != 200) fail_msg("a value %d deep -> %d: %s", LG_CANON_MAX_DEPTH, r.status, r.body);
  ht_resp_clear(&r);
  free(v);
  assert_int_equal(ht_req(&C, "GET", "/v1/runs/deep/trace", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
}

/* Runs python3 with a script; its stdout (first line) into out. */
static int python(const char *script, char *out, size_t n) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/lg_hard_%d.py", (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(script, f);
  fclose(f);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "python3 %s %d", path, PORT);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  out[0] = 0;
  if (!fgets(out, (int)n, p)) out[0] = 0;
  int rc = pclose(p);
  unlink(path);
  return rc;
}

static void test_own_answers(void **state) {
  (void)state;
  ht_resp_t r;
  /* 414 and 431, in JSON. */
  size_t big = 10000;
  char *req = malloc(big + 30000);
  int n = sprintf(req, "GET /");
  memset(req + n, 'a', big);
  n += (int)big;
  n += sprintf(req + n, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  raw(req, (size_t)n, &r);
  expect_shape(&r, 414, "path");
  ht_resp_clear(&r);
  n = sprintf(req, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  for (int i = 0; i < 20; i++) {
    n += sprintf(req + n, "X-Pad-%d: ", i);
    memset(req + n, 'b', 1000);
    n += 1000;
    n += sprintf(req + n, "\r\n");
  }
  n += sprintf(req + n, "\r\n");
  raw(req, (size_t)n, &r);
  expect_shape(&r, 431, "headers");
  ht_resp_clear(&r);
  free(req);
  /* What libmicrohttpd used to answer itself (test_screen checks the
   * answers): nothing stays in flight (a shutdown would wait for it). */
  const char *own[] = {
      "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: -1\r\n\r\n{}",
      "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 99999999999999999999999\r\n\r\n{}",
      "GET /healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"};
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
    raw(own[i], strlen(own[i]), &r);
    if (r.status < 400) fail_msg("%.40s -> %d", own[i], r.status);
    ht_resp_clear(&r);
  }
  for (int i = 0; i < 200 && atomic_load(&S->inflight) > 0; i++) usleep(5000);
  assert_int_equal(atomic_load(&S->inflight), 0);
  /* A body over the limit, sent whole before the answer is read: the
   * client must read the 413, not a reset. */
  char line[512];
  int rc = python("import http.client, json, sys\n"
                  "port = int(sys.argv[1])\n"
                  "out = []\n"
                  "for size in (2 << 20, 6 << 20):\n"
                  "    c = http.client.HTTPConnection('127.0.0.1', port, timeout=10)\n"
                  "    try:\n"
                  "        c.request('POST', '/v1/runs', b'x' * size,\n"
                  "                  {'Content-Type': 'application/json'})\n"
                  "        r = c.getresponse()\n"
                  "        d = json.loads(r.read())\n"
                  "        out.append('%d:%s' % (r.status, d['error']['type']))\n"
                  "    except Exception as e:\n"
                  "        out.append('error:' + type(e).__name__)\n"
                  "print(' '.join(out))\n",
                  line, sizeof line);
  printf("python3 http.client, 2 MiB and 6 MiB bodies: %s", line);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(line, "413:payload_too_large 413:payload_too_large"));
  /* With tokens: no token is 401 whatever the path or method. */
  lg_server_t *t = start("agent aaaaaaaaaaaaaaaaaaaaaaaa;operator bbbbbbbbbbbbbbbbbbbbbbbb");
  ht_conn_t c;
  ht_open(&c, lg_server_port(t));
  assert_int_equal(ht_req(&c, "GET", "/nope", NULL, NULL, &r), 0);
  expect_shape(&r, 401, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "DELETE", "/v1/runs/x", NULL, NULL, &r), 0);
  expect_shape(&r, 401, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/v1/runs/%ff", NULL, NULL, &r), 0);
  expect_shape(&r, 401, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/nope", "aaaaaaaaaaaaaaaaaaaaaaaa", NULL, &r), 0);
  expect_shape(&r, 404, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "DELETE", "/v1/runs/x", "aaaaaaaaaaaaaaaaaaaaaaaa", NULL, &r), 0);
  expect_shape(&r, 405, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "POST", "/v1/runs/x/cancel", "aaaaaaaaaaaaaaaaaaaaaaaa", "{}", &r), 0);
  expect_shape(&r, 403, NULL);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0); /* open */
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  ht_close(&c);
  lg_server_free(t);
}

/* A GET /healthz head of exactly `len` bytes: `nq` query parameters,
 * Host, `nlines` more header lines (the last one padded to the length),
 * and a Cookie header of `ncookies` pairs when ncookies > 0. NULL when the
 * parts do not fit in len. */
static char *head_of(size_t len, int nq, int nlines, int ncookies) {
  char *q = malloc(len + 1);
  size_t k = (size_t)sprintf(q, "GET /healthz");
  for (int i = 0; i < nq; i++) k += (size_t)sprintf(q + k, "%c%d", i ? '&' : '?', i % 10);
  k += (size_t)sprintf(q + k, " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  if (ncookies > 0) {
    k += (size_t)sprintf(q + k, "Cookie: ");
    for (int i = 0; i < ncookies; i++) k += (size_t)sprintf(q + k, "%sc=%d", i ? "; " : "", i % 10);
    k += (size_t)sprintf(q + k, "\r\n");
  }
  for (int i = 0; i < nlines; i++) {
    size_t left = len - k - 2; /* what is left for this line and the next ones */
    size_t line = i + 1 < nlines ? 12 : left;
    if (k + 12 + 2 > len || line < 12) {
      free(q);
      return NULL;
    }
    k += (size_t)sprintf(q + k, "X-F%03d: ", i % 1000);
    memset(q + k, 'v', line - 10);
    k += line - 10;
    k += (size_t)sprintf(q + k, "\r\n");
  }
  k += (size_t)sprintf(q + k, "\r\n");
  if (k != len) fail_msg("head_of(%zu): %zu bytes", len, k);
  q[k] = 0;
  return q;
}

/* Sends head on a connection that has served a request already (so that
 * libmicrohttpd reads it, not the acceptor's screen) and returns the
 * answer in r; fd_kept: the connection still serves after it. */
static void later_head(const char *head, ht_resp_t *r, int *kept) {
  ht_conn_t c;
  ht_open(&c, PORT);
  assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, r), 0);
  assert_int_equal(r->status, 200);
  ht_resp_clear(r);
  if (ht_send_all(c.fd, head, strlen(head)) || ht_read(&c, r)) {
    r->status = 0;
    *kept = 0;
  } else {
    ht_resp_t n;
    *kept = c.fd >= 0 && !ht_send_all(c.fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 43) &&
            !ht_read(&c, &n) && n.status == 200;
    if (*kept) ht_resp_clear(&n);
  }
  ht_close(&c);
}

/* The head limits (LG__MAX_HEAD bytes, the Cookie value counted twice;
 * LG__MAX_FIELDS header lines, cookies and query parameters), on a
 * connection's first head (the screen) and on a later one (http.c): at the
 * limit the request is served, past it the JSON 431; and a later head
 * between the limit and LG__MHD_POOL is the JSON 431 too, the connection
 * kept. */
static void test_head_limits(void **state) {
  (void)state;
  const int L = LG__MAX_HEAD, F = LG__MAX_FIELDS;
  static const struct {
    int over;
    size_t len;
    int nq, nlines, ncookies;
  } cases[] = {
      /* bytes: one long header line, and forty lines */
      {0, L, 0, 1, 0}, {1, L + 1, 0, 1, 0}, {0, L, 0, 40, 0}, {1, L + 1, 0, 40, 0},
      /* fields: Host and header lines; with query parameters; with cookies
       * (the Cookie line is a field too) */
      {0, 2000, 0, F - 1, 0}, {1, 2000, 0, F, 0},
      {0, 2000, F / 2, F / 2 - 1, 0}, {1, 2000, F / 2 + 1, F / 2 - 1, 0},
      {0, 2000, 0, 1, F - 3}, {1, 2000, 0, 1, F - 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len = cases[i].len;
    char *h = head_of(len, cases[i].nq, cases[i].nlines, cases[i].ncookies);
    if (!h) fail_msg("case %zu does not fit", i);
    ht_resp_t r;
    raw(h, len, &r);
    if (cases[i].over && r.status != 431) fail_msg("case %zu, first head: %d", i, r.status);
    if (cases[i].over) expect_shape(&r, 431, "headers");
    else if (r.status != 200) fail_msg("case %zu, first head: %d %s", i, r.status, r.body);
    ht_resp_clear(&r);
    int kept;
    later_head(h, &r, &kept);
    if (cases[i].over && r.status != 431) fail_msg("case %zu, later head: %d", i, r.status);
    if (cases[i].over) expect_shape(&r, 431, "headers");
    else if (r.status != 200) fail_msg("case %zu, later head: %d %s", i, r.status, r.body);
    if (!kept) fail_msg("case %zu: the connection closed after a later head", i);
    ht_resp_clear(&r);
    free(h);
  }
  /* A Cookie counts twice: a head of L - 2000 bytes whose cookie is 2000
   * bytes is over; a head of L bytes without one is not (above). */
  char *h = head_of((size_t)L - 2000, 0, 2, 0);
  char *c = malloc((size_t)L + 64);
  int n = sprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: a=");
  memset(c + n, 'x', 2000);
  sprintf(c + n + 2000, "\r\n%s", strstr(h, "\r\nX-F") + 2);
  ht_resp_t r;
  raw(c, strlen(c), &r);
  expect_shape(&r, 431, "headers");
  if (!strstr(r.body, "Cookie")) fail_msg("the 431 does not name the Cookie: %s", r.body);
  ht_resp_clear(&r);
  int kept;
  later_head(c, &r, &kept);
  expect_shape(&r, 431, "headers");
  ht_resp_clear(&r);
  free(c);
  free(h);
  /* A later head of 9 KiB to a little under LG__MHD_POOL: libmicrohttpd
   * holds it, http.c answers the JSON 431 and the connection goes on;
   * past the pool: libmicrohttpd's own 431 (HTML), the connection closed. */
  for (size_t len = 9 * 1024; len <= LG__MHD_POOL - 2048; len += 3 * 1024) {
    h = head_of(len, 0, 1, 0);
    later_head(h, &r, &kept);
    expect_shape(&r, 431, "headers");
    if (!kept) fail_msg("%zu bytes: the connection closed after the JSON 431", len);
    ht_resp_clear(&r);
    free(h);
  }
  h = head_of(LG__MHD_POOL + 1000, 0, 1, 0);
  later_head(h, &r, &kept);
  assert_int_equal(r.status, 431);
  ht_resp_clear(&r);
  free(h);
}

/* Sends req whole on a new connection (even when the server has answered
 * meanwhile), then reads until the server closes: the answer must be one
 * status line, application/json, and the error shape with `status` and
 * `field`. */
static void refused(int port, const char *req, size_t n, int status, const char *field) {
  int fd = ht_dial(port);
  assert_true(fd >= 0);
  if (ht_send_all(fd, req, n)) fail_msg("%.40s: the server reset the connection while it was sent", req);
  char *got = malloc(1 << 16);
  size_t len = 0;
  for (;;) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 10000) <= 0) fail_msg("%.40s: no end of the answer in 10 s", req);
    ssize_t r = recv(fd, got + len, (1 << 16) - 1 - len, 0);
    if (r < 0) fail_msg("%.40s: %s (read %zu bytes)", req, strerror(errno), len);
    if (r == 0) break;
    len += (size_t)r;
    if (len >= (1 << 16) - 1) fail_msg("%.40s: an answer of 64 KiB", req);
  }
  close(fd);
  got[len] = 0;
  int lines = 0;
  for (size_t i = 0; i + 7 < len; i++)
    if ((i == 0 || got[i - 1] == '\n') && !memcmp(got + i, "HTTP/1.", 7)) lines++;
  if (lines != 1) fail_msg("%.40s: %d status lines: %s", req, lines, got);
  char *sep = strstr(got, "\r\n\r\n");
  if (!sep) fail_msg("%.40s: no head: %s", req, got);
  ht_resp_t r;
  memset(&r, 0, sizeof r);
  size_t hl = (size_t)(sep - got) + 2; /* the head with its last CRLF */
  memcpy(r.head, got, hl < sizeof r.head ? hl : sizeof r.head - 1);
  sscanf(got, "HTTP/1.%*d %d", &r.status);
  r.body = sep + 4;
  r.len = len - (size_t)(sep + 4 - got);
  if (!ht_find(r.head, "\r\nConnection: close")) fail_msg("%.40s: no Connection: close", req);
  expect_shape(&r, status, field);
  free(got);
}

/* One request line with a target of n bytes, or a header line of n bytes. */
static char *long_req(size_t n, int target) {
  char *q = malloc(n + 128);
  int k = sprintf(q, "GET /");
  if (target) {
    memset(q + k, 'a', n);
    k += (int)n;
    k += sprintf(q + k, " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  } else {
    k += sprintf(q + k, "healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ");
    memset(q + k, 'b', n);
    k += (int)n;
    k += sprintf(q + k, "\r\n\r\n");
  }
  q[k] = 0;
  return q;
}

#define HEAD "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"

static void screen_cases(int port) {
  static const struct {
    const char *req;
    int status;
    const char *field;
  } cases[] = {
      {"POST /v1/runs HTTP/1.1\r\n" HEAD "Content-Length: -1\r\n\r\n{}", 400, "Content-Length"},
      {"POST /v1/runs HTTP/1.1\r\n" HEAD "Content-Length: 99999999999999999999999\r\n\r\n{}",
       413, "body"},
      {"POST /v1/runs HTTP/1.1\r\n" HEAD "Content-Length: 1, 2\r\n\r\n{}", 400,
       "Content-Length"},
      {"POST /v1/runs HTTP/1.1\r\n" HEAD "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
       400, "Content-Length"},
      {"POST /v1/runs HTTP/1.1\r\n" HEAD "Transfer-Encoding: gzip\r\n\r\n{}", 400,
       "Transfer-Encoding"},
      {"POST /v1/runs HTTP/1.1\r\n" HEAD
       "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
       400, "Transfer-Encoding"},
      {"GET /healthz HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 505, "version"},
      {"GET /healthz\r\nHost: 127.0.0.1\r\n\r\n", 400, "request_line"},
      {"\x16\x03\x01\x02\x00garbage\r\n\r\n", 400, "request_line"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nNoColonHere\r\n\r\n", 400, "headers"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A : b\r\n\r\n", 400, "headers"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\r\n folded\r\n\r\n", 400, "headers"},
      {"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n", 400, "Host"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    refused(port, cases[i].req, strlen(cases[i].req), cases[i].status, cases[i].field);
  char *q = long_req(40 * 1024, 0);
  refused(port, q, strlen(q), 431, "headers");
  free(q);
  q = long_req(40 * 1024, 1);
  refused(port, q, strlen(q), 414, "path");
  free(q);
  /* A bad head and then 1 MiB of body, all sent before the answer is
   * read: the answer, not a reset (the rest is read and dropped). */
  size_t big = 1 << 20;
  q = malloc(big + 256);
  int k = sprintf(q, "POST /v1/runs HTTP/1.1\r\n" HEAD "Content-Length: -1\r\n\r\n");
  memset(q + k, 'x', big);
  refused(port, q, (size_t)k + big, 400, "Content-Length");
  free(q);
}

/* A keep-alive client: three requests on one connection. */
static void keep_alive_works(int port) {
  ht_conn_t c;
  ht_open(&c, port);
  ht_resp_t r;
  for (int i = 0; i < 3; i++) {
    int fd = c.fd;
    assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(c.fd, fd); /* the same connection */
    ht_resp_clear(&r);
  }
  ht_close(&c);
}

/* The count of 505 answers in /metrics. */
static long answered_505(void) {
  ht_resp_t r;
  assert_int_equal(ht_req(&C, "GET", "/metrics", NULL, NULL, &r), 0);
  const char *m = strstr(r.body, "loopguard_requests_total{route=\"other\",code=\"505\"} ");
  long n = m ? strtol(strchr(m, '}') + 2, NULL, 10) : 0;
  ht_resp_clear(&r);
  return n;
}

static void test_screen(void **state) {
  (void)state;
  long before = answered_505();
  screen_cases(PORT);
  keep_alive_works(PORT);
  ht_resp_t r; /* the connection of setup(), opened before them, too */
  assert_int_equal(ht_req(&C, "GET", "/healthz", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  /* The refusals are counted as requests of the route "other". */
  assert_int_equal(answered_505(), before + 1);
  /* libmicrohttpd's own poll() threads (connections handed over from the
   * acceptor's thread), and three epoll loops. */
  setenv("LOOPGUARD_EVENT_LOOP", "poll", 1);
  lg_server_t *p = start(NULL);
  unsetenv("LOOPGUARD_EVENT_LOOP");
  screen_cases(lg_server_port(p));
  keep_alive_works(lg_server_port(p));
  lg_server_free(p);
  lg_server_options_t o = {0};
  o.listen = "127.0.0.1:0";
  o.store_url = "memory:";
  o.log_path = "/dev/null";
  o.threads = 3;
  lg_error_t e = {0};
  lg_server_t *t = lg_server_start(&o, &e);
  if (!t) fail_msg("server: %s", e.message);
  screen_cases(lg_server_port(t));
  for (int i = 0; i < 6; i++) keep_alive_works(lg_server_port(t));
  lg_server_free(t);
}

/* drop() closed the socket and freed its connection, but close(2) leaves
 * a descriptor in an epoll set while another descriptor refers to the same
 * socket, here the forked child's copy: the client's next bytes woke the
 * acceptor with the freed pointer. */
static void test_forked_child(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) {
    int fd = ht_dial(PORT);
    assert_true(fd >= 0);
    /* Refused by the acceptor's screen, which then drains what follows. */
    const char *head = "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: -1\r\n\r\n";
    assert_int_equal(ht_send_all(fd, head, strlen(head)), 0);
    /* The 400 is the sign the acceptor holds the socket, draining it. */
    char ans[512];
    struct pollfd in = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&in, 1, 5000), 1);
    ssize_t got = recv(fd, ans, sizeof ans - 1, 0);
    assert_true(got > 0);
    ans[got] = 0;
    assert_non_null(strstr(ans, " 400 "));
    /* Now a child holds a copy of every descriptor, the server's end of
     * this connection included, as a child before its exec does. */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
      sleep(5);
      _exit(0);
    }
    /* More than the drain reads: the server drops the connection mid-way
     * and the rest arrives at a socket it no longer owns. */
    static char chunk[65536];
    memset(chunk, 'x', sizeof chunk);
    size_t sent = 0;
    for (int spins = 0; sent < (12u << 20) && spins < 100;) {
      ssize_t w = send(fd, chunk, sizeof chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sent += (size_t)w;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        struct pollfd out = {.fd = fd, .events = POLLOUT};
        if (poll(&out, 1, 10) == 0) spins++;
      } else {
        break; /* reset: the server is done with it */
      }
    }
    close(fd);
    usleep(50 * 1000); /* the acceptor's turn */
    kill(child, SIGKILL);
    int st;
    waitpid(child, &st, 0);
  }
  /* Still serving, and nothing freed was touched (ASan would have said). */
  ht_resp_t r;
  assert_int_equal(ht_req(&C, "GET", "/healthz", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
}

int main(void) {
  /* A test client may write to a socket the server has closed (a refused
   * head): EPIPE, not death. The other server tests do the same. */
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_integer_ranges), cmocka_unit_test(test_open_mode),
      cmocka_unit_test(test_bytes),          cmocka_unit_test(test_nesting),
      cmocka_unit_test(test_own_answers),    cmocka_unit_test(test_forked_child),
      cmocka_unit_test(test_screen),         cmocka_unit_test(test_head_limits),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
