/*
 * test_gateway_keys.c — loopguard keys through a running gateway
 * (lg_server with an upstream) on a simulated clock (ht_clock), against a
 * tiny upstream in this file that answers every POST with a Chat
 * Completion of 10 prompt and 10 completion tokens and records the
 * Authorization it was sent:
 *   - resets at the period boundary: keys with limit_reset daily, weekly
 *     and monthly spend up to their limit and are refused 402 key_limit; a
 *     second before 00:00 UTC (Monday for weekly, the 1st for monthly)
 *     still refused, a second after the same request goes through and
 *     usage_usd restarts while the longer periods' usage still counts;
 *   - provider keys at rest (--secret-file): the upstream sees the key's
 *     own provider key, the store file holds no clear copy, a server with
 *     the same secret on the same store sends it too, one with another
 *     secret or none answers 500 naming the key and sends nothing
 *     upstream; without a secret the log says once that they are in clear;
 *   - several keys on one run (the same X-Loopguard-Run): each request is
 *     charged to its own key, and the run's cost cap holds across them.
 * On SQLite (a file per case). The shell tests (tests/gateway/keys.sh)
 * cover the rest with the real SDKs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include "test_server_http.h"

#define OP "operator-token-0123456789"

/* ---- the upstream ---- */

static int up_fd = -1, up_port;
static pthread_t up_th;
static volatile int up_stop;
static int up_calls;              /* POSTs answered */
static char up_auth[512];         /* the Authorization of the last one */
static pthread_mutex_t up_mu = PTHREAD_MUTEX_INITIALIZER;

static void up_serve(int fd) {
  char buf[65536];
  size_t n = 0;
  char *end = NULL;
  while (!end && n + 1 < sizeof buf) {
    ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (r <= 0) return;
    n += (size_t)r;
    buf[n] = 0;
    end = strstr(buf, "\r\n\r\n");
  }
  if (!end) return;
  const char *cl = ht_find(buf, "\r\nContent-Length:");
  size_t want = (size_t)(end + 4 - buf) + (cl ? strtoul(cl + 17, NULL, 10) : 0);
  while (n < want && n + 1 < sizeof buf) {
    ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
    if (r <= 0) return;
    n += (size_t)r;
  }
  buf[n] = 0;
  pthread_mutex_lock(&up_mu);
  up_calls++;
  const char *a = ht_find(buf, "\r\nAuthorization:");
  up_auth[0] = 0;
  if (a) {
    a += 16;
    while (*a == ' ') a++;
    size_t l = strcspn(a, "\r\n");
    snprintf(up_auth, sizeof up_auth, "%.*s", (int)l, a);
  }
  pthread_mutex_unlock(&up_mu);
  /* A text of its own each time: the same answer thrice is a text loop. */
  char body[512];
  int bl = snprintf(body, sizeof body,
                    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,"
                    "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                    "\"assistant\",\"content\":\"answer number %06d\"},\"finish_reason\":"
                    "\"stop\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":10,"
                    "\"total_tokens\":20}}",
                    up_calls);
  char out[1024];
  int len = snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     "%d\r\nConnection: close\r\n\r\n%s",
                     bl, body);
  ht_send_all(fd, out, (size_t)len);
}

static void *up_main(void *ud) {
  (void)ud;
  while (!up_stop) {
    struct pollfd p = {up_fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int c = accept(up_fd, NULL, NULL);
    if (c < 0) continue;
    up_serve(c);
    close(c);
  }
  return NULL;
}

static void up_start(void) {
  up_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(up_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(up_fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(up_fd, 64), 0);
  socklen_t l = sizeof a;
  getsockname(up_fd, (struct sockaddr *)&a, &l);
  up_port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(&up_th, NULL, up_main, NULL), 0);
}

static int calls(void) {
  pthread_mutex_lock(&up_mu);
  int n = up_calls;
  pthread_mutex_unlock(&up_mu);
  return n;
}

/* ---- the server ---- */

static char TMP[64];

static void write_file(const char *name, const void *data, size_t n) {
  char p[160];
  snprintf(p, sizeof p, "%s/%s", TMP, name);
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

typedef struct srv {
  lg_server_t *s;
  ht_conn_t c;
} srv_t;

/* A gateway on sqlite:TMP/DB with the operator token, the prices and, when
 * given, TMP/SECRET as its --secret-file. */
static void start(srv_t *x, const char *db, const char *secret) {
  char store[160], prices[160], sf[160], log[160], up[64];
  snprintf(store, sizeof store, "sqlite:%s/%s", TMP, db);
  snprintf(prices, sizeof prices, "%s/prices.json", TMP);
  snprintf(sf, sizeof sf, "%s/%s", TMP, secret ? secret : "");
  snprintf(log, sizeof log, "%s/%s.log", TMP, db);
  snprintf(up, sizeof up, "http://127.0.0.1:%d/v1", up_port);
  const char *ups[] = {up};
  lg_server_options_t o;
  memset(&o, 0, sizeof o);
  o.listen = "127.0.0.1:0";
  o.store_url = store;
  o.tokens = "operator " OP;
  o.prices_file = prices;
  o.log_path = log;
  o.clock = ht_clock;
  o.upstreams = ups;
  o.nupstreams = 1;
  o.secret_file = secret ? sf : NULL;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  x->s = lg_server_start(&o, &err);
  if (!x->s) {
    char buf[1024];
    fail_msg("lg_server_start: %s", lg_error_format(&err, buf, sizeof buf));
  }
  ht_open(&x->c, lg_server_port(x->s));
}

static void stop(srv_t *x) {
  ht_close(&x->c);
  assert_int_equal(lg_server_shutdown(x->s, 2000), 0);
  lg_server_free(x->s);
  x->s = NULL;
}

/* POST /v1/keys: the secret and hash of a new key. */
static void new_key(srv_t *x, const char *body, char secret[128], char hash[80]) {
  ht_resp_t r;
  assert_int_equal(ht_req(&x->c, "POST", "/v1/keys", OP, body, &r), 0);
  if (r.status != 201) fail_msg("POST /v1/keys %s -> %d %s", body, r.status, r.body);
  snprintf(secret, 128, "%s", ht_str(&r, "key"));
  snprintf(hash, 80, "%s", ht_str(&r, "hash"));
  ht_resp_clear(&r);
}

/* A chat completion with the key (max_tokens 10, a message of its own so
 * that every request is a run of its own unless run names one). */
static int seq;
static int chat(srv_t *x, const char *key, const char *run, ht_resp_t *r) {
  char body[512], req[2048];
  int bl = snprintf(body, sizeof body,
                    "{\"model\":\"m\",\"max_tokens\":10,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"request %04d\"}]}",
                    ++seq % 10000);
  int n = snprintf(req, sizeof req,
                   "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                   "Bearer %s\r\n%s%s%sContent-Type: application/json\r\nContent-Length: "
                   "%d\r\n\r\n%s",
                   key, run ? "X-Loopguard-Run: " : "", run ? run : "", run ? "\r\n" : "", bl,
                   body);
  assert_int_equal(ht_raw(&x->c, req, (size_t)n, r), 0);
  return r->status;
}

static int chat_status(srv_t *x, const char *key) {
  ht_resp_t r;
  int st = chat(x, key, NULL, &r);
  if (st == 402) assert_string_equal(ht_str(&r, "error.metadata.limit_source"), "key_limit");
  ht_resp_clear(&r);
  return st;
}

/* A micro-USD figure of GET /v1/keys/{hash}. */
static long long key_micro(srv_t *x, const char *hash, const char *field) {
  char path[128];
  snprintf(path, sizeof path, "/v1/keys/%s", hash);
  ht_resp_t r;
  assert_int_equal(ht_req(&x->c, "GET", path, OP, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  json_t *v = json_object_get(r.json, field);
  if (!json_is_number(v)) fail_msg("%s: no %s: %s", hash, field, r.body);
  long long m = llround(json_number_value(v) * 1e6);
  ht_resp_clear(&r);
  return m;
}

/* 1 micro-USD an input token, 100 an output token: an answer (10 + 10)
 * costs 1010; the worst case of a request (its ~150 bytes and 512 as
 * input, 10 output tokens) about 1660: a limit of 3000 takes two answers
 * and refuses the third. */
#define COST 1010

static int setup(void **state) {
  (void)state;
  signal(SIGPIPE, SIG_IGN);
  snprintf(TMP, sizeof TMP, "/tmp/lg_gwkeys_XXXXXX");
  assert_non_null(mkdtemp(TMP));
  const char *prices = "{\"models\":{\"m\":{\"input_usd_per_mtok\":1,\"output_usd_per_mtok\":100,"
                       "\"max_output_tokens\":50}}}";
  write_file("prices.json", prices, strlen(prices));
  up_start();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  up_stop = 1;
  pthread_join(up_th, NULL);
  close(up_fd);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", TMP);
  return system(cmd) ? -1 : 0;
}

/* ---- resets ---- */

#define WED 1794996000000LL  /* Wednesday 2026-11-18 10:00 UTC */
#define THU 1795046400000LL  /* Thursday 2026-11-19 00:00 UTC */
#define MON 1795392000000LL  /* Monday 2026-11-23 00:00 UTC */
#define DEC1 1796083200000LL /* Tuesday 2026-12-01 00:00 UTC */

static void set_clock(int64_t ms) { __atomic_store_n(&ht_clock_ms, ms, __ATOMIC_SEQ_CST); }

static void test_resets(void **state) {
  (void)state;
  set_clock(WED);
  srv_t x;
  start(&x, "resets.db", NULL);
  static const char *const periods[3] = {"daily", "weekly", "monthly"};
  static const int64_t bounds[3] = {THU, MON, DEC1};
  char key[3][128], hash[3][80];
  for (int i = 0; i < 3; i++) {
    char body[160];
    snprintf(body, sizeof body, "{\"name\":\"%s\",\"limit_usd\":0.003,\"limit_reset\":\"%s\"}",
             periods[i], periods[i]);
    new_key(&x, body, key[i], hash[i]);
    assert_int_equal(chat_status(&x, key[i]), 200);
    assert_int_equal(chat_status(&x, key[i]), 200);
    assert_int_equal(chat_status(&x, key[i]), 402);
    assert_int_equal(key_micro(&x, hash[i], "usage_usd"), 2 * COST);
    assert_int_equal(key_micro(&x, hash[i], "reserved_usd"), 0);
  }
  /* The boundaries in turn: a second before, every key not yet reset is
   * refused; a second after, the period's key goes through again. */
  for (int b = 0; b < 3; b++) {
    set_clock(bounds[b] - 1000);
    for (int i = b; i < 3; i++) {
      if (chat_status(&x, key[i]) != 402)
        fail_msg("%s: not refused a second before the %s boundary", periods[i], periods[b]);
      assert_int_equal(key_micro(&x, hash[i], "usage_usd"), 2 * COST);
    }
    set_clock(bounds[b] + 1000);
    for (int i = b + 1; i < 3; i++) /* the longer periods go on */
      if (chat_status(&x, key[i]) != 402)
        fail_msg("%s: reset at the %s boundary", periods[i], periods[b]);
    if (chat_status(&x, key[b]) != 200)
      fail_msg("%s: still refused a second after its boundary", periods[b]);
    assert_int_equal(key_micro(&x, hash[b], "usage_usd"), COST);
    assert_int_equal(key_micro(&x, hash[b], "limit_remaining_usd"), 3000 - COST);
    assert_int_equal(key_micro(&x, hash[b], "usage_daily_usd"), COST);
    /* The longer periods still count what was spent before. */
    if (b == 0) {
      assert_int_equal(key_micro(&x, hash[b], "usage_weekly_usd"), 3 * COST);
      assert_int_equal(key_micro(&x, hash[b], "usage_monthly_usd"), 3 * COST);
    } else if (b == 1) {
      assert_int_equal(key_micro(&x, hash[b], "usage_weekly_usd"), COST);
      assert_int_equal(key_micro(&x, hash[b], "usage_monthly_usd"), 3 * COST);
    }
    /* And the new period has its limit again: two answers, then 402. */
    assert_int_equal(chat_status(&x, key[b]), 200);
    assert_int_equal(chat_status(&x, key[b]), 402);
    assert_int_equal(key_micro(&x, hash[b], "usage_usd"), 2 * COST);
  }
  stop(&x);
}

/* ---- provider keys at rest ---- */

/* Whether a file of TMP holds `needle` anywhere. */
static int file_holds(const char *name, const char *needle) {
  char p[160];
  snprintf(p, sizeof p, "%s/%s", TMP, name);
  FILE *f = fopen(p, "rb");
  if (!f) return 0;
  static char buf[1 << 23];
  size_t n = fread(buf, 1, sizeof buf, f), l = strlen(needle);
  fclose(f);
  for (size_t i = 0; i + l <= n; i++)
    if (!memcmp(buf + i, needle, l)) return 1;
  return 0;
}

static const char *auth_seen(void) {
  static char a[512];
  pthread_mutex_lock(&up_mu);
  snprintf(a, sizeof a, "%s", up_auth);
  pthread_mutex_unlock(&up_mu);
  return a;
}

static void test_byok_at_rest(void **state) {
  (void)state;
  set_clock(WED);
  const char hex[] = "8f1e0c2b9a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f\n";
  write_file("secret.hex", hex, strlen(hex));
  unsigned char other[32];
  memset(other, 0x5a, sizeof other);
  write_file("other.bin", other, sizeof other);
  const char *pk = "sk-provider-own-0123456789abcdef";

  srv_t x;
  start(&x, "byok.db", "secret.hex");
  char key[128], hash[80];
  new_key(&x, "{\"name\":\"own-key\",\"byok\":{\"default\":\"sk-provider-own-0123456789abcdef\"}}",
          key, hash);
  char path[128];
  snprintf(path, sizeof path, "/v1/keys/%s", hash);
  ht_resp_t r;
  assert_int_equal(ht_req(&x.c, "GET", path, OP, NULL, &r), 0);
  assert_string_equal(ht_str(&r, "byok_at_rest"), "encrypted");
  assert_null(strstr(r.body, pk));
  ht_resp_clear(&r);
  assert_int_equal(chat_status(&x, key), 200);
  char want[128];
  snprintf(want, sizeof want, "Bearer %s", pk);
  assert_string_equal(auth_seen(), want); /* the upstream got the provider key */
  stop(&x);
  assert_false(file_holds("byok.db", pk));
  assert_false(file_holds("byok.db-wal", pk));
  assert_false(file_holds("byok.db.log", "byok_in_clear"));

  /* Another replica with the same secret file sends it too. */
  start(&x, "byok.db", "secret.hex");
  assert_int_equal(chat_status(&x, key), 200);
  assert_string_equal(auth_seen(), want);
  stop(&x);

  /* Another secret, or none: 500 naming the key, nothing sent upstream. */
  const char *secrets[2] = {"other.bin", NULL};
  for (int i = 0; i < 2; i++) {
    start(&x, "byok.db", secrets[i]);
    int before = calls();
    assert_int_equal(chat(&x, key, NULL, &r), 500);
    const char *m = ht_str(&r, "error.message");
    assert_non_null(m);
    if (!strstr(m, "\"own-key\"") || !strstr(m, i ? "no secret" : "does not open"))
      fail_msg("the error does not name the key or the cause: %s", r.body);
    ht_resp_clear(&r);
    assert_int_equal(calls(), before);
    stop(&x);
  }
  /* A server without a secret warns when it writes a key's provider keys
   * in clear, naming that key; not at its start (a sealed key it cannot
   * open is the 500 above), and not for a key without provider keys. */
  start(&x, "byok.db", NULL);
  char plain[128], plain_hash[80], clear_key[128], clear_hash[80];
  new_key(&x, "{\"name\":\"no-byok\"}", plain, plain_hash);
  new_key(&x, "{\"name\":\"clear-key\",\"byok\":{\"default\":\"sk-provider-clear-0123\"}}", clear_key,
          clear_hash);
  stop(&x);
  char log[200], line[4096];
  snprintf(log, sizeof log, "%s/byok.db.log", TMP);
  FILE *f = fopen(log, "r");
  int warned = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"byok_in_clear\"")) continue;
    warned++;
    if (!strstr(line, clear_hash) || !strstr(line, "\"clear-key\"")) fail_msg("the warning does not name the key: %s", line);
  }
  if (f) fclose(f);
  assert_int_equal(warned, 1);
}

/* ---- several keys on one run ---- */

static void test_keys_on_one_run(void **state) {
  (void)state;
  set_clock(WED);
  srv_t x;
  start(&x, "run.db", NULL);
  char ka[128], ha[80], kb[128], hb[80];
  new_key(&x, "{\"name\":\"a\",\"limit_usd\":1}", ka, ha);
  new_key(&x, "{\"name\":\"b\",\"limit_usd\":1}", kb, hb);
  /* The run's own cap, 0.003: two answers (1010 each) fit, the worst case
   * of a third does not. */
  /* The run has a shared budget of its own, team:shared, kept beside the
   * keys' scopes. */
  ht_resp_t r;
  assert_int_equal(ht_req(&x.c, "PUT", "/v1/budgets/team:shared", OP, "{\"limit_usd\":1,\"period\":\"none\"}", &r), 0);
  if (r.status != 200) fail_msg("PUT /v1/budgets/team:shared -> %d %s", r.status, r.body);
  ht_resp_clear(&r);
  assert_int_equal(ht_req(&x.c, "POST", "/v1/runs", OP,
                          "{\"run_id\":\"shared-run\",\"scopes\":[\"team:shared\"],"
                          "\"policy\":{\"limits\":{\"max_cost_usd\":0.003}}}",
                          &r),
                   0);
  if (r.status != 201) fail_msg("POST /v1/runs -> %d %s", r.status, r.body);
  ht_resp_clear(&r);
  assert_int_equal(chat(&x, ka, "shared-run", &r), 200);
  ht_resp_clear(&r);
  assert_int_equal(key_micro(&x, ha, "usage_usd"), COST);
  assert_int_equal(key_micro(&x, hb, "usage_usd"), 0);
  assert_int_equal(chat(&x, kb, "shared-run", &r), 200);
  ht_resp_clear(&r);
  assert_int_equal(key_micro(&x, ha, "usage_usd"), COST); /* b's answer is not a's */
  assert_int_equal(key_micro(&x, hb, "usage_usd"), COST);
  assert_int_equal(ht_req(&x.c, "GET", "/v1/budgets/team:shared", OP, NULL, &r), 0);
  if (llround(json_number_value(ht_get(&r, "spent_usd")) * 1e6) != 2 * COST)
    fail_msg("the run's own scope was not charged beside the keys': %s", r.body);
  ht_resp_clear(&r);
  /* The run has spent 2020 of 3000: the next worst case (about 1100:
   * the body as input, 10 output tokens)
   * does not fit, whichever key sends it. */
  int before = calls();
  for (int i = 0; i < 2; i++) {
    chat(&x, i ? kb : ka, "shared-run", &r);
    if (calls() != before)
      fail_msg("the run's cap did not hold across its keys (%c): %s", "ab"[i], r.body);
    ht_resp_clear(&r);
  }
  assert_int_equal(ht_req(&x.c, "GET", "/v1/runs/shared-run", OP, NULL, &r), 0);
  if (!ht_str(&r, "terminal_reason") || strcmp(ht_str(&r, "terminal_reason"), "cost_cap"))
    fail_msg("the run: %s", r.body);
  ht_resp_clear(&r);
  assert_int_equal(key_micro(&x, ha, "usage_usd"), COST);
  assert_int_equal(key_micro(&x, hb, "usage_usd"), COST);
  assert_int_equal(key_micro(&x, ha, "reserved_usd"), 0);
  assert_int_equal(key_micro(&x, hb, "reserved_usd"), 0);
  stop(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resets),
      cmocka_unit_test(test_byok_at_rest),
      cmocka_unit_test(test_keys_on_one_run),
  };
  return cmocka_run_group_tests_name("gateway_keys", tests, setup, teardown);
}
