/*
 * fuzz_gateway.c — the gateway whole (src/gateway/: a conversation read
 * as events, the guard's decisions, an upstream's answer read, changed
 * and answered), on any client body and any upstream answer, over
 * loopback: a client's body is untrusted bytes, and so is what comes
 * back from the network. fuzz_json_load, fuzz_sse and fuzz_headers read
 * the bytes; this target reads what the gateway makes of their shapes
 * (a tool result without its call, a call id twice, an answer whose
 * calls are not an array, a stream whose events come out of order).
 *
 * Four `loopguard serve` in the process (lg_server_start, the policies
 * of fuzz_policies below): one on a memory: store, two replicas of one
 * SQLite file, and one on memory: with tokens and prices, where every
 * model call goes with a loopguard key; their upstream a thread of this
 * file that answers every request with the input's answer (the first
 * server's as an Azure OpenAI resource's: its base URL's path /openai, its
 * file's "api": "azure").
 *
 * Input: byte 0 picks the API (bits 0-1: Chat Completions, Responses,
 * Messages, and Chat Completions on an AzureOpenAI client's path,
 * /openai/deployments/NAME/chat/completions, which only the first server
 * serves: the others answer it 404), whether the request names a new run of
 * its own (bit 2: to the memory: server, or with no named policy to the
 * one with the key; otherwise the gateway derives
 * the run from the conversation, so inputs may go on in earlier inputs'
 * runs, and the request goes to the replicas in turn, which share what
 * they decided through the store), the answer's type (bit 3:
 * JSON or SSE), the upstream's status (bits 4-5: 200, 200, 429, 500) and
 * a named policy (bits 6-7: none or one of three); the bytes up to the
 * first NUL are the client's body, those after it the upstream's answer.
 * Invariants:
 *   - every request is answered, whole, within 20 s (no crash, hang or
 *     sanitizer report in any thread of the server);
 *   - never a 500 of its own: nothing the client or the upstream sends
 *     is the gateway's failure (an upstream's 500 may be passed on);
 *   - an error of the gateway's own (any, when the upstream answers 200;
 *     one not of the upstream's status otherwise) is a JSON object with
 *     an "error" object, in the API's shape;
 *   - a whole answer (application/json) is JSON;
 *   - what the gateway sends upstream is a JSON object (a body it
 *     passes on with members added, "stream_options" or a note, stays
 *     one);
 *   - once an answer is whole, the key holds nothing reserved: its
 *     reservation was settled or released, whatever the upstream said;
 *   - no request is a 401, whatever its path or body: the keyed server's
 *     carry its valid loopguard key (the key is not what is wrong), the
 *     others have no tokens;
 *   - an AzureOpenAI client's path is served by the first server, whose
 *     upstream is an Azure resource's, and is a 404 that says so on the
 *     others.
 * LG_FUZZ_GATEWAY_LOG=FILE: the servers' log, and each answer's status
 * on stderr, to look into a finding.
 */
#include "loopguard.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_check.h"

/* ---- the upstream: every request answered with the input's answer ---- */

static pthread_mutex_t up_mu = PTHREAD_MUTEX_INITIALIZER;
static char *up_answer;
static size_t up_len;
static int up_status = 200, up_sse;
static char *up_bad; /* the first request body upstream that was no JSON object */

static int send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Where the head of the request in p[0..n) ends ("\r\n\r\n"), or NULL. */
static char *head_end(char *p, size_t n) {
  for (size_t i = 0; i + 4 <= n; i++)
    if (!memcmp(p + i, "\r\n\r\n", 4)) return p + i;
  return NULL;
}

/* One connection: requests read (a head, then Content-Length bytes) and
 * answered until the gateway closes it. */
static void *up_conn(void *ud) {
  int fd = (int)(intptr_t)ud, one = 1;
  /* an answer's head and body leave at once, not after a delayed ACK */
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  size_t cap = 1 << 16, have = 0;
  char *buf = malloc(cap);
  while (buf) {
    char *end = NULL;
    while (!(end = head_end(buf, have))) {
      if (have == cap && !(buf = realloc(buf, cap *= 2))) goto out;
      ssize_t r = recv(fd, buf + have, cap - have, 0);
      if (r <= 0) goto out;
      have += (size_t)r;
    }
    size_t head = (size_t)(end - buf) + 4, body = 0;
    int expect = 0;
    for (char *l = buf; l && l < end;) {
      if (!strncasecmp(l, "content-length:", 15)) body = strtoul(l + 15, NULL, 10);
      if (!strncasecmp(l, "expect:", 7)) expect = 1;
      char *nl = memchr(l, '\n', (size_t)(end - l));
      l = nl ? nl + 1 : NULL;
    }
    if (expect && send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25)) goto out;
    while (have < head + body) {
      if (have == cap && !(buf = realloc(buf, cap *= 2))) goto out;
      ssize_t r = recv(fd, buf + have, cap - have, 0);
      if (r <= 0) goto out;
      have += (size_t)r;
    }
    json_t *sent = json_loadb(buf + head, body, 0, NULL);
    pthread_mutex_lock(&up_mu);
    if (!json_is_object(sent) && !up_bad && (up_bad = malloc(body + 1))) {
      memcpy(up_bad, buf + head, body);
      up_bad[body] = 0;
    }
    json_decref(sent);
    char hd[256];
    int hn = snprintf(hd, sizeof hd,
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                      up_status, up_status == 200 ? "OK" : "Error",
                      up_sse ? "text/event-stream" : "application/json", up_len);
    int bad = send_all(fd, hd, (size_t)hn) || send_all(fd, up_answer ? up_answer : "", up_len);
    pthread_mutex_unlock(&up_mu);
    if (bad) goto out;
    memmove(buf, buf + head + body, have - head - body);
    have -= head + body;
  }
out:
  free(buf);
  close(fd);
  return NULL;
}

static void *up_accept(void *ud) {
  int ls = (int)(intptr_t)ud;
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    pthread_t t;
    if (pthread_create(&t, NULL, up_conn, (void *)(intptr_t)fd)) close(fd);
    else pthread_detach(t);
  }
  return NULL;
}

static int up_start(void) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 64) ||
      getsockname(ls, (struct sockaddr *)&a, &al)) {
    perror("fuzz_gateway: the upstream's socket");
    abort();
  }
  pthread_t t;
  if (pthread_create(&t, NULL, up_accept, (void *)(intptr_t)ls)) abort();
  pthread_detach(t);
  return ntohs(a.sin_port);
}

/* ---- the gateways, and their client ---- */

/* The servers: memory: (runs named by the request), two replicas of one
 * SQLite file (runs derived from the conversation, sent to each in turn:
 * what one decided, the other reads from the store), and memory: with
 * tokens and prices, where a loopguard key's limit gates every model
 * call (named runs without a named policy). */
enum { SERVERS = 4, KEYED = 3 };
static lg_server_t *srv[SERVERS];
static CURL *cl;
static char base[SERVERS][64], dir[256], key_auth[128], key_budget[256];
#define OP_TOKEN "operator-token-fuzz-0123456789"
static const char *fuzz_policies[] = {
    /* writes run once; a text loop stops and a call is refused at once (a
     * block, its re-ask and its refusal in every API's shape, on every
     * input with a call); the cascade offers and escalates */
    "writes", "{\"tools\":{\"write_record\":{\"side_effects\":true}},\"gateway\":{\"final_round\":true}}",
    "chant",
    "{\"text\":{\"repeat\":{\"observe\":false,\"stop\":1}},\"repeat\":{\"observe\":1,\"block\":1,\"stop\":6}}",
    "cascade",
    ("{\"cascade\":{\"offer\":[\"ask_human\",\"finalize_partial\"],"
     "\"escalate\":{\"model\":\"strong\",\"turns\":2}}}"),
};
/* every file start() writes in its folder besides the policies, removed by
 * stop() with the folder (azure.ups was not, session 46 to 48: a folder a run
 * was left in /tmp; fuzz-smoke now fails a target that leaves one) */
static const char *scratch_files[] = {"gw.db", "gw.db-wal", "gw.db-shm", "prices", "azure.ups"};
/* the models of the seeds and the escalation's, 1 and 100 USD a million
 * tokens: a request's worst case is a small part of the key's limit (its
 * attachments, inline ones too, counted at attachment_tokens) */
static const char *prices =
    "{\"models\": {\"m\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 100, "
    "\"max_output_tokens\": 50, \"attachment_tokens\": 1000}, \"strong\": {\"input_usd_per_mtok\": 1, \"output_usd_per_mtok\": 100, "
    "\"max_output_tokens\": 50, \"attachment_tokens\": 1000}}}";

static void stop(void) {
  for (int i = 0; i < SERVERS; i++) {
    if (srv[i]) lg_server_free(srv[i]);
    srv[i] = NULL;
  }
  if (cl) curl_easy_cleanup(cl);
  cl = NULL;
  char p[512];
  for (size_t i = 0; i < sizeof fuzz_policies / sizeof *fuzz_policies; i += 2) {
    snprintf(p, sizeof p, "%s/%s.json", dir, fuzz_policies[i]);
    unlink(p);
  }
  for (size_t i = 0; i < sizeof scratch_files / sizeof *scratch_files; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, scratch_files[i]);
    unlink(p);
  }
  rmdir(dir);
}

typedef struct {
  char *p;
  size_t n;
} got_t;

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
  got_t *g = ud;
  size_t n = sz * nm;
  char *q = realloc(g->p, g->n + n + 1);
  if (!q) return 0;
  memcpy(q + g->n, p, n);
  g->p = q;
  g->n += n;
  g->p[g->n] = 0;
  return n;
}

/* The keyed server's operator API: METHOD PATH (BODY or NULL), its JSON
 * answer (NULL on any failure). */
static json_t *op_call(const char *method, const char *path, const char *body) {
  char url[512];
  snprintf(url, sizeof url, "%s%s", base[KEYED], path);
  struct curl_slist *h = curl_slist_append(NULL, "Authorization: Bearer " OP_TOKEN);
  h = curl_slist_append(h, "Content-Type: application/json");
  got_t g = {0};
  curl_easy_reset(cl);
  curl_easy_setopt(cl, CURLOPT_URL, url);
  curl_easy_setopt(cl, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(cl, CURLOPT_CUSTOMREQUEST, method);
  if (body) curl_easy_setopt(cl, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(cl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(cl, CURLOPT_WRITEDATA, &g);
  curl_easy_setopt(cl, CURLOPT_TIMEOUT, 20L);
  curl_easy_setopt(cl, CURLOPT_NOSIGNAL, 1L);
  json_t *j = curl_easy_perform(cl) == CURLE_OK && g.p ? json_loads(g.p, 0, NULL) : NULL;
  free(g.p);
  curl_slist_free_all(h);
  return j;
}

/* The loopguard key every request to the keyed server carries, with a
 * limit no input reaches. */
static void make_key(void) {
  json_t *k = op_call("POST", "/v1/keys", "{\"name\":\"fuzz\",\"limit_usd\":1000000}");
  const char *sec = json_string_value(json_object_get(k, "key"));
  const char *hash = json_string_value(json_object_get(k, "hash"));
  if (!sec || !hash) {
    fprintf(stderr, "fuzz_gateway: no key made\n");
    abort();
  }
  snprintf(key_auth, sizeof key_auth, "Authorization: Bearer %s", sec);
  snprintf(key_budget, sizeof key_budget, "/v1/budgets/key:%s", hash);
  json_decref(k);
}

/* What the key holds reserved (USD), -1 when it could not be read. */
static double key_reserved(void) {
  json_t *b = op_call("GET", key_budget, NULL);
  json_t *r = json_object_get(b, "reserved_usd");
  double v = json_is_number(r) ? json_number_value(r) : -1;
  json_decref(b);
  return v;
}

static void start(void) {
  const char *tmp = getenv("TMPDIR"); /* fuzz-smoke's folder of a target */
  if (!tmp || !*tmp || strlen(tmp) > 200) tmp = "/tmp";
  snprintf(dir, sizeof dir, "%s/lg-fuzz-gw.XXXXXX", tmp);
  if (!mkdtemp(dir)) abort();
  for (size_t i = 0; i < sizeof fuzz_policies / sizeof *fuzz_policies; i += 2) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s.json", dir, fuzz_policies[i]);
    FILE *f = fopen(p, "w");
    if (!f || fputs(fuzz_policies[i + 1], f) < 0 || fclose(f)) abort();
  }
  char up[64], upaz[512], file[512], pf[512];
  int port = up_start();
  snprintf(up, sizeof up, "http://127.0.0.1:%d/v1", port);
  /* the first server's upstream an Azure resource's classic API (a file's
   * "api": "azure": the loopback host is not Azure's) */
  snprintf(upaz, sizeof upaz, "%s/azure.ups", dir);
  FILE *az = fopen(upaz, "w");
  if (!az || fprintf(az, "{\"upstreams\": {\"az\": {\"base_url\": \"http://127.0.0.1:%d/openai\", \"api\": \"azure\"}}}",
                     port) < 0 || fclose(az))
    abort();
  /* relaxed: no fsync a commit (the fuzzer's speed is the disk's otherwise) */
  snprintf(file, sizeof file, "sqlite:%s/gw.db?durability=relaxed", dir);
  snprintf(pf, sizeof pf, "%s/prices", dir); /* not *.json: the folder is --policies too */
  FILE *f = fopen(pf, "w");
  if (!f || fputs(prices, f) < 0 || fclose(f)) abort();
  const char *ups[] = {up}, *stores[SERVERS] = {"memory:", file, file, "memory:"};
  for (int i = 0; i < SERVERS; i++) {
    lg_server_options_t o;
    memset(&o, 0, sizeof o);
    o.listen = "127.0.0.1:0";
    o.store_url = stores[i];
    if (i == KEYED) {
      o.tokens = "operator " OP_TOKEN;
      o.prices_file = pf;
    }
    o.log_path = getenv("LG_FUZZ_GATEWAY_LOG") ? getenv("LG_FUZZ_GATEWAY_LOG") : "/dev/null";
    o.upstreams = ups;
    o.nupstreams = i == 0 ? 0 : 1;
    o.upstreams_file = i == 0 ? upaz : NULL;
    o.policies_dir = dir;
    o.threads = 2;
    lg_error_t err;
    memset(&err, 0, sizeof err);
    if (!(srv[i] = lg_server_start(&o, &err))) {
      char b[1024];
      fprintf(stderr, "fuzz_gateway: lg_server_start %s: %s\n", stores[i], lg_error_format(&err, b, sizeof b));
      abort();
    }
    snprintf(base[i], sizeof base[i], "http://127.0.0.1:%d", lg_server_port(srv[i]));
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (!(cl = curl_easy_init())) abort();
  atexit(stop);
  make_key();
}

/* An error in the API's shape: {"error":{...}}, on Anthropic's with
 * "type":"error" beside it. */
static int error_shaped(json_t *j, int anthropic) {
  const char *t = json_string_value(json_object_get(j, "type"));
  return json_is_object(json_object_get(j, "error")) && (!anthropic || (t && !strcmp(t, "error")));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *paths[] = {"/v1/chat/completions", "/v1/responses", "/v1/messages",
                                "/openai/deployments/fuzz/chat/completions?api-version=2024-10-21"};
  static const int statuses[] = {200, 200, 429, 500};
  static unsigned long n, derived;
  if (size < 1) return 0;
  if (!srv[0]) start();
  int api = data[0] & 3, named = data[0] & 4, pol = data[0] >> 6;
  const uint8_t *body = data + 1, *nul = memchr(body, 0, size - 1);
  size_t bl = nul ? (size_t)(nul - body) : size - 1;
  pthread_mutex_lock(&up_mu);
  free(up_answer);
  up_len = nul ? size - 1 - bl - 1 : 0;
  up_answer = malloc(up_len + 1);
  if (up_answer && up_len) memcpy(up_answer, nul + 1, up_len);
  if (!up_answer) up_len = 0;
  up_sse = !!(data[0] & 8);
  up_status = statuses[(data[0] >> 4) & 3];
  pthread_mutex_unlock(&up_mu);

  char url[128], run[64], policy[64];
  int keyed = named && !pol, to = keyed ? KEYED : named ? 0 : 1 + (int)(derived++ % 2);
  snprintf(url, sizeof url, "%s%s", base[to], paths[api]);
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  h = curl_slist_append(h, keyed ? key_auth : "Authorization: Bearer sk-fuzz");
  h = curl_slist_append(h, "anthropic-version: 2023-06-01");
  h = curl_slist_append(h, "Expect:");
  if (named) {
    snprintf(run, sizeof run, "X-Loopguard-Run: fz-%lu", ++n);
    h = curl_slist_append(h, run);
  }
  if (pol) {
    snprintf(policy, sizeof policy, "X-Loopguard-Policy: %s", fuzz_policies[(pol - 1) * 2]);
    h = curl_slist_append(h, policy);
  }
  got_t g = {0};
  curl_easy_reset(cl);
  curl_easy_setopt(cl, CURLOPT_URL, url);
  curl_easy_setopt(cl, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(cl, CURLOPT_POSTFIELDS, bl ? (const char *)body : "");
  curl_easy_setopt(cl, CURLOPT_POSTFIELDSIZE, (long)bl);
  curl_easy_setopt(cl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(cl, CURLOPT_WRITEDATA, &g);
  curl_easy_setopt(cl, CURLOPT_TIMEOUT, 20L);
  curl_easy_setopt(cl, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(cl);
  long status = 0;
  char *ctype = NULL;
  curl_easy_getinfo(cl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(cl, CURLINFO_CONTENT_TYPE, &ctype);
  if (rc != CURLE_OK) fprintf(stderr, "fuzz_gateway: %s (status %ld)\n", curl_easy_strerror(rc), status);
  check(rc == CURLE_OK, "the gateway answers every request, whole, within 20 s", data, size);
  if (getenv("LG_FUZZ_GATEWAY_LOG"))
    fprintf(stderr, "fuzz_gateway: %s %ld %s\n", url, status, ctype ? ctype : "-");
  int own = status != up_status || up_status == 200; /* not the upstream's passed on */
  if (status == 500 && own)
    fprintf(stderr, "fuzz_gateway: 500: %.*s\n", (int)(g.n > 500 ? 500 : g.n), g.p ? g.p : "");
  check(status != 500 || !own, "never a 500 of the gateway's own", data, size);
  int json = ctype && !strncasecmp(ctype, "application/json", 16);
  json_t *j = json ? json_loadb(g.p ? g.p : "", g.n, 0, NULL) : NULL;
  if (status >= 400 && own) {
    if (!error_shaped(j, api == 2))
      fprintf(stderr, "fuzz_gateway: %ld %s: %.*s\n", status, ctype ? ctype : "(no type)",
              (int)(g.n > 500 ? 500 : g.n), g.p ? g.p : "");
    check(error_shaped(j, api == 2), "an error is JSON in the API's shape", data, size);
  } else if (json && status < 400) {
    check(j != NULL, "a whole answer is JSON", data, size);
  }
  json_decref(j);
  if (api == 3) { /* an AzureOpenAI client's path: served by the first server (its upstream's
                     "api": "azure") and no other */
    int refused = status == 404 && g.p && strstr(g.p, "is an Azure OpenAI resource"); /* g.p ends in a NUL */
    check(refused == (to != 0), "an Azure path is served where an upstream is an Azure resource's, only there",
          data, size);
  }
  pthread_mutex_lock(&up_mu);
  if (up_bad) fprintf(stderr, "fuzz_gateway: sent upstream: %.500s\n", up_bad);
  int sent_ok = !up_bad;
  pthread_mutex_unlock(&up_mu);
  check(sent_ok, "what the gateway sends upstream is a JSON object", data, size);
  free(g.p);
  curl_slist_free_all(h);
  /* the keyed server's requests carry its valid key, the others have no
   * tokens, and the upstream never answers 401 */
  check(status != 401, "no request is a 401: a valid loopguard key, or no tokens", data, size);
  if (keyed) { /* the request answered, its reservation settled or released */
    double held = key_reserved();
    if (held != 0) fprintf(stderr, "fuzz_gateway: the key holds %g USD reserved\n", held);
    check(held == 0, "nothing is left reserved on the key once the answer is whole", data, size);
  }
  return 0;
}
