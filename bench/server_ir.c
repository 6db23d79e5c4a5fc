/*
 * server_ir.c — the server's instructions per decision, under callgrind:
 * a fixed workload, so that two builds can be compared on a machine whose
 * timings are noise (bench/README.md, "Instructions per decision").
 *
 * It starts `loopguard serve` of this build under
 * `valgrind --tool=callgrind` on a fresh SQLite store, makes the runs
 * (the same policy as bench_server: no caps), zeroes callgrind's counters
 * (callgrind_control -z), then plays bench/bench_server_agent.lua's load
 * for exactly --decisions requests: C connections, each an agent loop — a
 * call, its result, the next call — on a run of its own, moving to a fresh
 * run after 20 calls. The connections go in lock step (a request on each,
 * then each answer), so the server sees C decisions at once, as under wrk.
 * Then it dumps the counters (callgrind_control -d), stops the server and
 * prints the instructions per decision, from the dump's totals. The dump
 * stays in --out for callgrind_annotate. With --no-valgrind it prints the
 * server's CPU time per decision instead (/proc, user + system): the
 * same workload timed, for what instructions do not show (the kernel).
 *
 * Usage: server_ir [--decisions N] [--connections C] [--out FILE]
 *                  [--bin LOOPGUARD] [--cache-sim] [--no-valgrind]
 * Defaults: 4000 decisions, 24 connections, FILE = ./callgrind.server.out,
 * LOOPGUARD = this build's binary (--bin: another build's, for an A/B).
 * --cache-sim: callgrind simulates the caches too (D1 and LL misses in the
 * dump, for callgrind_annotate; the figure printed stays instructions).
 * Exit status 0, or 1 when a request failed or a tool is missing.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "../tests/unit/test_server_http.h"
#include "bench_serve.h"

static void die(const char *what) {
  fprintf(stderr, "server_ir: %s\n", what);
  exit(1);
}

static pid_t server_pid;
static int server_port;

static const char *bin = LG_BIN_PATH;
static const char *vg_flags = ""; /* --cache-sim: "--cache-sim=yes " */

static void spawn(const char *store, const char *out, int valgrind) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "exec %s%s%s%s%s '%s' serve --listen 127.0.0.1:0 --store '%s' --log /dev/null",
           valgrind ? "valgrind --tool=callgrind " : "", valgrind ? vg_flags : "",
           valgrind ? "--callgrind-out-file='" : "",
           valgrind ? out : "", valgrind ? "' 2>/dev/null" : "", bin, store);
  server_t sv = serve_spawn(cmd);
  server_pid = sv.pid;
  server_port = sv.port;
}

static void control(const char *what) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "callgrind_control %s %d >/dev/null 2>&1", what, (int)server_pid);
  if (system(cmd)) die("callgrind_control failed");
}

/* One agent loop (bench_server_agent.lua): its run, its call number, and
 * whether its next request is the result of the call it just made. */
typedef struct agent {
  ht_conn_t c;
  long run;
  int k;
  char cid[64]; /* the call to report, or "" */
} agent_t;

static long next_run;

static void request(agent_t *a, long n, char *path, size_t pn, char *body, size_t bn) {
  if (a->cid[0]) {
    snprintf(path, pn, "/v1/runs/r%ld/results", a->run);
    snprintf(body, bn, "{\"call_id\":\"%s\",\"status\":\"progress\",\"value\":{\"rows\":3}}", a->cid);
    return;
  }
  if (a->k == 0 || a->k > 20) {
    a->run = next_run++;
    a->k = 1;
  }
  snprintf(path, pn, "/v1/runs/r%ld/calls", a->run);
  snprintf(body, bn,
           "{\"tool\":\"search\",\"call_id\":\"r%ld.%d\",\"args\":{\"q\":\"item %ld\",\"page\":%ld}}",
           a->run, a->k, n, n % 7);
}

static void answered(agent_t *a, const ht_resp_t *r) {
  if (a->cid[0]) { /* a result: the next call */
    a->cid[0] = 0;
    a->k++;
    return;
  }
  const char *act = ht_str(r, "action");
  if (act && !strcmp(act, "execute")) snprintf(a->cid, sizeof a->cid, "r%ld.%d", a->run, a->k);
  else a->k++;
}

static int send_req(ht_conn_t *c, const char *path, const char *body) {
  char req[2048];
  int n = snprintf(req, sizeof req,
                   "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\n\r\n%s",
                   path, strlen(body), body);
  return ht_send_all(c->fd, req, (size_t)n);
}

int main(int argc, char **argv) {
  long decisions = 4000;
  int conns = 24, valgrind = 1, relaxed = 0;
  const char *out = "callgrind.server.out";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--decisions") && i + 1 < argc) decisions = atol(argv[++i]);
    else if (!strcmp(argv[i], "--connections") && i + 1 < argc) conns = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--no-valgrind")) valgrind = 0;
    else if (!strcmp(argv[i], "--bin") && i + 1 < argc) bin = argv[++i];
    else if (!strcmp(argv[i], "--cache-sim")) vg_flags = "--cache-sim=yes ";
    else if (!strcmp(argv[i], "--relaxed")) relaxed = 1;
    else {
      fprintf(stderr, "usage: server_ir [--decisions N] [--connections C] [--out FILE] "
                      "[--bin LOOPGUARD] [--cache-sim] [--no-valgrind] [--relaxed]\n");
      return 2;
    }
  }
  if (decisions < 1 || conns < 1 || conns > 1000) return 2;
  signal(SIGPIPE, SIG_IGN);
  char dir[] = "/tmp/server_ir.XXXXXX", store[300];
  if (!mkdtemp(dir)) die("mkdtemp");
  /* --relaxed: run state acknowledged before it is on disk (the only way
   * of builds before schema 6, which do not know the parameter) */
  snprintf(store, sizeof store, "sqlite:%s/ir.db%s", dir, relaxed ? "?durability=relaxed" : "");
  spawn(store, out, valgrind);

  /* The runs: one per 40 decisions (20 calls and their results), and one
   * more per connection. */
  long runs = decisions / 40 + conns + 1;
  ht_conn_t mk;
  ht_open(&mk, server_port);
  for (long i = 0; i < runs; i++) {
    char body[256];
    ht_resp_t r;
    snprintf(body, sizeof body,
             "{\"run_id\":\"r%ld\",\"policy\":{\"limits\":{\"max_steps\":null,\"max_wall_ms\":null}}}", i);
    if (ht_req(&mk, "POST", "/v1/runs", NULL, body, &r) || r.status != 201) die("creating a run failed");
    ht_resp_clear(&r);
  }
  ht_close(&mk);

  agent_t *a = calloc((size_t)conns, sizeof *a);
  for (int i = 0; i < conns; i++) {
    ht_open(&a[i].c, server_port);
    if (a[i].c.fd < 0) die("connect");
  }
  if (valgrind) control("-z");
  double cpu0 = valgrind ? 0 : cpu_s(server_pid);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long done = 0;
  while (done < decisions) {
    int m = decisions - done < conns ? (int)(decisions - done) : conns;
    for (int i = 0; i < m; i++) {
      char path[128], body[512];
      request(&a[i], done + i, path, sizeof path, body, sizeof body);
      if (send_req(&a[i].c, path, body)) die("send failed");
    }
    for (int i = 0; i < m; i++) {
      ht_resp_t r;
      if (ht_read(&a[i].c, &r) || r.status != 200) die("a decision failed");
      answered(&a[i], &r);
      ht_resp_clear(&r);
    }
    done += m;
  }
  if (valgrind) control("-d");
  double cpu = valgrind ? 0 : cpu_s(server_pid) - cpu0;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  for (int i = 0; i < conns; i++) ht_close(&a[i].c);
  free(a);
  kill(server_pid, SIGTERM);
  int st;
  waitpid(server_pid, &st, 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "server_ir: could not remove %s\n", dir);
  if (!valgrind) {
    printf("{\"bench\":\"server_ir\",\"decisions\":%ld,\"connections\":%d,"
           "\"server_cpu_us_per_decision\":%.1f,\"decisions_per_s\":%.0f}\n",
           decisions, conns, cpu * 1e6 / (double)decisions, (double)decisions / wall);
    printf("server: %.1f us of CPU per decision, %.0f decisions/s in lock step (%ld decisions, "
           "%d connections, no valgrind)\n",
           cpu * 1e6 / (double)decisions, (double)decisions / wall, decisions, conns);
    return 0;
  }

  /* The dump (OUT.1, or OUT when callgrind names it so): its totals. */
  char dump[600], line[512];
  snprintf(dump, sizeof dump, "%s.1", out);
  FILE *f = fopen(dump, "r");
  if (!f) f = fopen(out, "r");
  unsigned long long ir = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "totals:", 7) || !strncmp(line, "summary:", 8))
      ir = strtoull(strchr(line, ':') + 1, NULL, 10);
  if (f) fclose(f);
  if (!ir) die("no totals in the callgrind dump");
  printf("{\"bench\":\"server_ir\",\"decisions\":%ld,\"connections\":%d,\"ir\":%llu,"
         "\"ir_per_decision\":%.0f}\n",
         decisions, conns, ir, (double)ir / (double)decisions);
  printf("server: %.0f instructions per decision (%ld decisions, %d connections; dump %s)\n",
         (double)ir / (double)decisions, decisions, conns, dump);
  return 0;
}
