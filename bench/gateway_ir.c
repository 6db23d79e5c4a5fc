/*
 * gateway_ir.c — the gateway's instructions per request, under callgrind:
 * a fixed workload, so that two builds can be compared on a machine whose
 * timings are noise (bench/README.md, "Instructions per gateway request").
 *
 * It starts the benchmark's fake upstream (gw_bench_upstream, not under
 * valgrind) and `loopguard serve --store memory: --upstream` of this build
 * under `valgrind --tool=callgrind`, then for each of the four bodies of
 * the gateway benchmark (bench/gateway/body.py: 1 KB and 8 KB, stream
 * false and true) sends a few warm-up requests, zeroes callgrind's
 * counters (callgrind_control -z), sends exactly --requests requests one
 * after the other on one keep-alive connection (as wrk -c1 does), each
 * with an X-Loopguard-Run of its own as bench/gateway/agent.lua does (a
 * new run: every tool result of the conversation is new), dumps the
 * counters (callgrind_control -d) and prints the instructions per
 * request, from the dump's totals. Every answer must be 200 and carry
 * the upstream's tool call (a whole answer with X-Loopguard-Action:
 * execute, a stream up to its [DONE]), else the figure would measure an
 * error path: exit 1.
 *
 * --key: every request with a loopguard key whose limit never refuses
 * (the server gets --prices; the key is made through POST /v1/keys), as
 * bench/gateway/keys.sh times it: the key read, the worst case reserved
 * against its budget, max_tokens filled in, the usage settled.
 *
 * --steady measures agent.lua's steady mode instead (8 KB bodies): runs
 * of TURNS (10) requests, each the conversation so far plus the call the
 * previous answer asked for and its result, so the gateway reads one new
 * result a request, as with a real agent loop. --derived: the same loops
 * without X-Loopguard-Run, as most SDK agents send them (the run derived
 * from the conversation's first tool call, whose id is made a run's own).
 *
 * The dumps stay in --out.1 .. --out.4 (8k false, 8k true, 1k false,
 * 1k true) for callgrind_annotate.
 *
 * Usage: gateway_ir [--requests N] [--out FILE] [--bin LOOPGUARD]
 *                   [--only 8k|1k] [--steady] [--derived] [--key] [--no-valgrind]
 * Defaults: 200 requests a body, FILE = ./callgrind.gateway.out, LOOPGUARD
 * = this build's binary (--bin: another build's, for an A/B).
 * --no-valgrind prints the server's CPU time per request instead (/proc).
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "../tests/unit/test_server_http.h"
#include "bench_serve.h"

static pid_t lg_pid, up_pid;

/* Also when the server did not start: the fake upstream must not stay
 * behind (it holds the caller's stdout open). */
static void die(const char *what) {
  fprintf(stderr, "gateway_ir: %s\n", what);
  if (lg_pid > 0) kill(lg_pid, SIGTERM);
  if (up_pid > 0) kill(up_pid, SIGTERM);
  exit(1);
}

static const char *bin = LG_BIN_PATH;

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = malloc((size_t)n + 1);
  if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(p);
    return NULL;
  }
  fclose(f);
  p[n] = 0;
  *len = (size_t)n;
  return p;
}

/* Reads exactly n bytes. */
static int read_n(int fd, char *p, size_t n) {
  while (n) {
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* One line (up to CRLF) into buf. */
static int read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    if (read_n(fd, buf + n, 1)) return -1;
    if (n && buf[n - 1] == '\r' && buf[n] == '\n') {
      buf[n - 1] = 0;
      return 0;
    }
    n++;
  }
  return -1;
}

/* The body of the last answer (a stream's chunks joined). */
static char body_in[1 << 20];
static size_t body_n;

static int take(int fd, size_t len) {
  if (body_n + len >= sizeof body_in) return -1;
  if (read_n(fd, body_in + body_n, len)) return -1;
  body_n += len;
  body_in[body_n] = 0;
  return 0;
}

/* One answer: its status and head; its body (Content-Length or chunked)
 * into body_in. */
static int read_answer(int fd, int *status, char *head, size_t cap) {
  size_t hl = 0;
  body_n = 0;
  body_in[0] = 0;
  for (;;) {
    if (hl + 1 >= cap || read_n(fd, head + hl, 1)) return -1;
    head[++hl] = 0;
    if (hl >= 4 && !memcmp(head + hl - 4, "\r\n\r\n", 4)) break;
  }
  if (sscanf(head, "HTTP/1.%*d %d", status) != 1) return -1;
  const char *cl = ht_find(head, "\r\nContent-Length:");
  if (cl) return take(fd, strtoul(cl + 17, NULL, 10));
  if (!ht_find(head, "\r\nTransfer-Encoding: chunked")) return -1;
  for (;;) { /* chunked: SIZE CRLF DATA CRLF ..., then 0 CRLF CRLF */
    char line[64];
    if (read_line(fd, line, sizeof line)) return -1;
    size_t len = strtoul(line, NULL, 16);
    if (!len) return read_line(fd, line, sizeof line);
    if (take(fd, len) || read_line(fd, line, sizeof line) || line[0]) return -1;
  }
}

static char dir[] = "/tmp/gateway_ir.XXXXXX";

static void control(const char *what) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "callgrind_control %s %d >/dev/null 2>&1", what, (int)lg_pid);
  if (system(cmd)) die("callgrind_control failed");
}

static void stop_all(void) {
  if (lg_pid > 0) kill(lg_pid, SIGTERM), waitpid(lg_pid, NULL, 0);
  if (up_pid > 0) kill(up_pid, SIGTERM), waitpid(up_pid, NULL, 0);
  lg_pid = up_pid = 0;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "gateway_ir: could not remove %s\n", dir);
}

static void fail(const char *what) {
  stop_all();
  die(what);
}

static long run_seq; /* X-Loopguard-Run: gwir-N, a new run each request */

/* --steady: agent.lua's steady mode. The body says "user":"bench-steady"
 * (the fake upstream then asks for call_s<N>, N the results it holds);
 * a run is TURNS requests, each with one turn more than the last. */
#define TURNS 10
#define TURN                                                                                      \
  ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_s%06d\",\"type\":"      \
  "\"function\",\"function\":{\"name\":\"write_record\",\"arguments\":\"{\\\"record_id\\\":%d,"      \
  "\\\"value\\\":\\\"A\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_s%06d\",\"content\":"  \
  "\"{\\\"ok\\\":true,\\\"record_id\\\":%d}\"}"
static int steady, derived;
static char auth[128] = "sk-bench"; /* the client's key (--key: a loopguard key) */
static int turn;           /* of the run, 0 .. TURNS-1 */
static char steady_b[1 << 16]; /* the body of this turn */

/* The body of the next steady request, from the benchmark's body b. */
static int steady_body(const char *b, size_t blen, const char **out, size_t *olen) {
  const char *at = strstr(b, "],\"tools\":");
  if (b[0] != '{' || !at) return -1;
  int base = 0;
  for (const char *q = b; (q = strstr(q, "\"tool_call_id\"")); q++) base++;
  size_t cap = sizeof steady_b, n = (size_t)snprintf(steady_b, cap, "{\"user\":\"bench-steady\",%.*s",
                                                      (int)(at - b - 1), b + 1);
  for (int t = 0; t < turn && n < cap; t++)
    n += (size_t)snprintf(steady_b + n, cap - n, TURN, base + t, base + t, base + t, base + t);
  if (n + blen - (size_t)(at - b) >= cap) return -1;
  memcpy(steady_b + n, at, blen - (size_t)(at - b));
  *out = steady_b;
  *olen = n + blen - (size_t)(at - b);
  steady_b[*olen] = 0;
  if (derived) { /* the first call's id, the run's own: same length, so the body's size stays */
    char id[16];
    snprintf(id, sizeof id, "c%010ld", run_seq % 10000000000L);
    for (char *q = steady_b; (q = strstr(q, "call_000000")); q += 11) memcpy(q, id, 11);
  }
  return 0;
}

/* One request of body b on c; 0 when answered 200 with the call executed. */
static int one(ht_conn_t *c, const char *body, size_t blen, int stream) {
  char head[512];
  if (steady && steady_body(body, blen, &body, &blen)) return -1;
  int hn = derived  ? snprintf(head, sizeof head,
                               "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                               "Content-Length: %zu\r\n\r\n",
                               auth, blen)
           : steady ? snprintf(head, sizeof head,
                             "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                             "X-Loopguard-Run: gwir-s%ld\r\nContent-Length: %zu\r\n\r\n",
                             auth, run_seq, blen)
                  : snprintf(head, sizeof head,
                             "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                             "X-Loopguard-Run: gwir-%ld\r\nContent-Length: %zu\r\n\r\n",
                             auth, ++run_seq, blen);
  if (ht_send_all(c->fd, head, (size_t)hn) || ht_send_all(c->fd, body, blen)) return -1;
  int status = 0;
  char ah[8192];
  if (read_answer(c->fd, &status, ah, sizeof ah)) return -1;
  if (steady && ++turn == TURNS) turn = 0, run_seq++;
  /* the upstream's call let through; a whole answer says execute (a
   * stream's headers leave before its call is decided) */
  if (status != 200 || !strstr(body_in, steady ? "call_s" : "call_bench")) return -1;
  if (stream) return strstr(body_in, "data: [DONE]") ? 0 : -1;
  return ht_find(ah, "\r\nX-Loopguard-Action: execute\r\n") ? 0 : -1;
}

static unsigned long long dump_total(const char *out, int k) {
  char dump[600], line[512];
  snprintf(dump, sizeof dump, "%s.%d", out, k);
  FILE *f = fopen(dump, "r");
  unsigned long long ir = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "totals:", 7) || !strncmp(line, "summary:", 8))
      ir = strtoull(strchr(line, ':') + 1, NULL, 10);
  if (f) fclose(f);
  return ir;
}

int main(int argc, char **argv) {
  long requests = 200;
  int valgrind = 1, key = 0;
  const char *out = "callgrind.gateway.out", *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--requests") && i + 1 < argc) requests = atol(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--bin") && i + 1 < argc) bin = argv[++i];
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--no-valgrind")) valgrind = 0;
    else if (!strcmp(argv[i], "--steady")) steady = 1;
    else if (!strcmp(argv[i], "--derived")) steady = derived = 1;
    else if (!strcmp(argv[i], "--key")) key = 1;
    else {
      fprintf(stderr, "usage: gateway_ir [--requests N] [--out FILE] [--bin LOOPGUARD] "
                      "[--only 8k|1k] [--steady] [--derived] [--key] [--no-valgrind]\n");
      return 2;
    }
  }
  if (requests < 1) return 2;
  if (steady) only = "8k";
  signal(SIGPIPE, SIG_IGN);
  if (!mkdtemp(dir)) die("mkdtemp");
  char absout[4096];
  if (out[0] == '/') snprintf(absout, sizeof absout, "%s", out);
  else if (getcwd(absout, 2048)) snprintf(absout + strlen(absout), sizeof absout - strlen(absout), "/%s", out);

  /* The bodies, as the benchmark makes them. */
  static const struct {
    const char *name;
    int size, stream;
  } bodies[] = {{"8k", 8192, 0}, {"8k", 8192, 1}, {"1k", 1024, 0}, {"1k", 1024, 1}};
  char *body[4] = {0};
  size_t blen[4] = {0};
  for (int i = 0; i < 4; i++) {
    char cmd[1200], path[400];
    snprintf(path, sizeof path, "%s/body%d.json", dir, i);
    snprintf(cmd, sizeof cmd, "python3 '%s/bench/gateway/body.py' %d %d > '%s'", LG_SOURCE_DIR,
             bodies[i].size, bodies[i].stream, path);
    if (system(cmd) || !(body[i] = slurp(path, &blen[i]))) fail("bench/gateway/body.py failed");
  }

  /* The fake upstream. */
  char portfile[400];
  snprintf(portfile, sizeof portfile, "%s/up.port", dir);
  up_pid = fork();
  if (up_pid < 0) fail("fork");
  if (up_pid == 0) {
    execl(LG_UPSTREAM_PATH, LG_UPSTREAM_PATH, portfile, (char *)NULL);
    _exit(127);
  }
  int up_port = 0;
  for (int t = 0; t < 200 && !up_port; t++) {
    size_t n;
    char *p = slurp(portfile, &n);
    if (p && n) up_port = atoi(p);
    free(p);
    if (!up_port) usleep(20000);
  }
  if (!up_port) fail("the fake upstream did not start");

  char cmd[6000], prices[600] = "";
  if (key) { /* keys.sh's price table: the benchmark's model */
    char path[450];
    snprintf(path, sizeof path, "%s/prices.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs("{\"models\":{\"bench\":{\"input_usd_per_mtok\":1,\"output_usd_per_mtok\":2,"
                    "\"max_output_tokens\":1000}}}\n", f) < 0 || fclose(f))
      fail("cannot write the price table");
    snprintf(prices, sizeof prices, " --prices '%s'", path);
  }
  snprintf(cmd, sizeof cmd,
           "exec %s%s%s '%s' serve --listen 127.0.0.1:0 --store memory:%s "
           "--upstream http://127.0.0.1:%d/v1 --log /dev/null",
           valgrind ? "valgrind --tool=callgrind --callgrind-out-file='" : "", valgrind ? absout : "",
           valgrind ? "' 2>/dev/null" : "", bin, prices, up_port);
  server_t sv = serve_spawn(cmd);
  lg_pid = sv.pid;

  ht_conn_t c;
  ht_open(&c, sv.port);
  if (c.fd < 0) fail("connect");
  if (key) {
    ht_resp_t r;
    const char *k = NULL;
    if (ht_req(&c, "POST", "/v1/keys", NULL, "{\"name\":\"bench\",\"limit_usd\":1000000}", &r) ||
        r.status != 201 || !(k = ht_find(r.body, "\"key\":\"")))
      fail("POST /v1/keys did not make a key");
    snprintf(auth, sizeof auth, "%.*s", (int)strcspn(k + 7, "\""), k + 7);
    ht_resp_clear(&r);
  }
  int dumps = 0;
  printf("gateway: %s per request, %ld requests a body, one connection, %s%s\n",
         valgrind ? "instructions" : "server CPU", requests,
         derived ? "agent loops of 10 requests without X-Loopguard-Run (derived)" : steady ? "agent loops of 10 requests (steady)" : "a new X-Loopguard-Run each",
         key ? ", with a loopguard key" : "");
  for (int i = 0; i < 4; i++) {
    if (only && strcmp(only, bodies[i].name)) continue;
    for (int w = 0; w < 5; w++)
      if (one(&c, body[i], blen[i], bodies[i].stream)) fail("a warm-up request was not answered 200 / execute");
    if (valgrind) control("-z");
    double cpu0 = valgrind ? 0 : cpu_s(lg_pid);
    for (long k = 0; k < requests; k++)
      if (one(&c, body[i], blen[i], bodies[i].stream)) fail("a request was not answered 200 / execute");
    double cpu = valgrind ? 0 : cpu_s(lg_pid) - cpu0;
    if (!valgrind) {
      printf("{\"bench\":\"gateway_ir\",\"body\":\"%s\",\"mode\":\"%s\",\"stream\":%s,"
             "\"requests\":%ld,\"server_cpu_us_per_request\":%.1f}\n",
             bodies[i].name, derived ? "derived" : steady ? "steady" : "fresh", bodies[i].stream ? "true" : "false", requests, cpu * 1e6 / (double)requests);
      printf("gateway %s stream=%d: %.1f us of CPU per request (no valgrind)\n", bodies[i].name,
             bodies[i].stream, cpu * 1e6 / (double)requests);
      continue;
    }
    control("-d");
    unsigned long long ir = dump_total(absout, ++dumps);
    if (!ir) fail("no totals in the callgrind dump");
    printf("{\"bench\":\"gateway_ir\",\"body\":\"%s\",\"mode\":\"%s\",\"stream\":%s,"
           "\"requests\":%ld,\"ir\":%llu,\"ir_per_request\":%.0f,\"dump\":\"%s.%d\"}\n",
           bodies[i].name, derived ? "derived" : steady ? "steady" : "fresh", bodies[i].stream ? "true" : "false", requests, ir,
           (double)ir / (double)requests, out, dumps);
    printf("gateway %s stream=%d: %.0f instructions per request\n", bodies[i].name, bodies[i].stream,
           (double)ir / (double)requests);
    fflush(stdout);
  }
  ht_close(&c);
  for (int i = 0; i < 4; i++) free(body[i]);
  stop_all();
  return 0;
}
