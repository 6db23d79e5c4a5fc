/*
 * test_budget_leak.c — a crashed agent cannot pin a budget.
 *
 * Child processes reserve against a budget and are killed with SIGKILL
 * before they settle. Until the reservations' TTL runs out they hold (a
 * reservation that needs the room is refused); from their expiry on the
 * budget is whole again — with no sweeper, no cleanup by anyone — and
 * purge forgets the dead reservations. A second test kills a process in
 * the middle of a reserve transaction (held at a fault point just before
 * its commit): nothing of it is left, and the next process reserves at
 * once.
 *
 * Backends: sqlite by default; postgres when registered by tests/pg/.
 * (memory: is private to a process, so a killed owner takes its store
 * with it.) The time is the real clock: the children and the parent must
 * agree on it, as separate workers would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "store/store.h"
#include "store_test_util.h"

#define USD 1000000LL
#define KIDS 8
#define TTL_MS 2000

static const char *backend;

typedef struct msg {
  char id[LG_BUDGET_ID_MAX];
  int64_t expires_ms;
  int rc;
} msg_t;

static int read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

static int reserve(lg_store_t *s, const char *scope, int64_t amount, int64_t ttl,
                   lg_budget_reservation_t *r, lg_budget_refusal_t *why) {
  lg_budget_request_t req = {.scopes = &scope, .nscopes = 1, .amount_micro = amount,
                             .ttl_ms = ttl};
  lg_error_t err = {0};
  int rc = lg_budget_reserve(s, &req, lgt_now_ms(), r, why, &err);
  if (rc < 0) fprintf(stderr, "reserve: %s\n", err.message);
  return rc;
}

static lg_budget_t get(lg_store_t *s, const char *scope) {
  lg_budget_t b;
  lg_error_t err = {0};
  if (lg_budget_get(s, scope, lgt_now_ms(), &b, &err)) fail_msg("get: %s", err.message);
  return b;
}

static void test_killed_owners_release(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_t *s = lgt_open(url, NULL);
  lg_error_t err = {0};
  assert_int_equal(lg_budget_set(s, "key:leak", 1 * USD, LG_PERIOD_NONE, -1, lgt_now_ms(), NULL,
                                 &err),
                   0);
  /* KIDS processes each hold 1/KIDS of the budget, then die unsettled. */
  pid_t pids[KIDS];
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  for (int i = 0; i < KIDS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(fds[0]);
      lg_store_t *cs = lgt_open(url, NULL);
      msg_t m = {{0}, 0, 0};
      lg_budget_reservation_t r;
      lg_budget_refusal_t why;
      m.rc = reserve(cs, "key:leak", USD / KIDS, TTL_MS, &r, &why);
      if (!m.rc) {
        memcpy(m.id, r.id, sizeof m.id);
        m.expires_ms = r.expires_ms;
      }
      if (write(fds[1], &m, sizeof m) != (ssize_t)sizeof m) _exit(3);
      for (;;) pause(); /* the model call that never comes back */
    }
  }
  close(fds[1]);
  int64_t last_expiry = 0, first_expiry = INT64_MAX;
  for (int i = 0; i < KIDS; i++) {
    msg_t m;
    assert_int_equal(read_all(fds[0], &m, sizeof m), 0);
    assert_int_equal(m.rc, 0);
    if (m.expires_ms > last_expiry) last_expiry = m.expires_ms;
    if (m.expires_ms < first_expiry) first_expiry = m.expires_ms;
  }
  close(fds[0]);
  for (int i = 0; i < KIDS; i++) {
    kill(pids[i], SIGKILL);
    int st;
    waitpid(pids[i], &st, 0);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  }
  /* Before their TTL: they still hold, and the budget refuses. */
  lg_budget_t b = get(s, "key:leak");
  int64_t now = lgt_now_ms();
  int checked_before = now < first_expiry - 200;
  if (checked_before) {
    assert_int_equal(b.reserved_micro, KIDS * (USD / KIDS));
    assert_int_equal(b.open_reservations, KIDS);
    lg_budget_reservation_t r;
    lg_budget_refusal_t why;
    assert_int_equal(reserve(s, "key:leak", USD / 2, 0, &r, &why), LG_BUDGET_REFUSED);
    assert_string_equal(why.limit_source, "key_limit");
  }
  /* From their expiry on, the budget is whole again. */
  while (lgt_now_ms() <= last_expiry) lgt_sleep_ms(10);
  b = get(s, "key:leak");
  assert_int_equal(b.reserved_micro, 0);
  assert_int_equal(b.open_reservations, 0);
  assert_int_equal(b.spent_micro, 0);
  assert_int_equal(lg_budget_remaining(&b), 1 * USD);
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  assert_int_equal(reserve(s, "key:leak", 1 * USD, 0, &r, &why), 0);
  assert_int_equal(lg_budget_settle(s, r.id, 0, lgt_now_ms(), NULL, &err), 0);
  /* Purge forgets the dead reservations. */
  int64_t purged = 0;
  assert_int_equal(lg_budget_purge(s, 0, lgt_now_ms(), &purged, &err), 0);
  assert_int_equal(purged, KIDS);
  printf("%s: %d owners killed holding %lld micro-USD (held until their TTL: %s); whole "
         "again %d ms after their reservations, by their TTL alone\n",
         backend, KIDS, (long long)USD, checked_before ? "checked" : "too slow to check",
         TTL_MS);
  lg_store_close(s);
}

/* A child that stops at the fault point, tells the parent, and waits to
 * be killed there: in the middle of its reserve transaction. */
static int stop_fd = -1;
static int stop_here(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  (void)s;
  if (strcmp(point, "budget.reserve.before_commit")) return 0;
  char c = 'x';
  if (write(stop_fd, &c, 1) != 1) _exit(4);
  for (;;) pause();
  return 0;
}

static void test_killed_inside_reserve(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_t *s = lgt_open(url, NULL);
  lg_error_t err = {0};
  assert_int_equal(lg_budget_set(s, "team:t", 1 * USD, LG_PERIOD_NONE, -1, lgt_now_ms(), NULL,
                                 &err),
                   0);
  lg_store_close(s);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    stop_fd = fds[1];
    lg_store_t *cs = lgt_open(url, NULL);
    lg__store_set_fault(cs, stop_here, NULL);
    lg_budget_reservation_t r;
    lg_budget_refusal_t why;
    reserve(cs, "team:t", 1 * USD, 60000, &r, &why);
    _exit(5); /* not reached */
  }
  close(fds[1]);
  char c;
  assert_int_equal(read_all(fds[0], &c, 1), 0);
  close(fds[0]);
  kill(pid, SIGKILL);
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFSIGNALED(st));
  /* Nothing of the dead transaction holds; the whole budget is there. */
  s = lgt_open(url, NULL);
  lg_budget_t b = get(s, "team:t");
  assert_int_equal(b.reserved_micro, 0);
  assert_int_equal(b.open_reservations, 0);
  lg_budget_reservation_t r;
  lg_budget_refusal_t why;
  int64_t t0 = lgt_now_ms();
  assert_int_equal(reserve(s, "team:t", 1 * USD, 0, &r, &why), 0);
  assert_true(lgt_now_ms() - t0 < 2000); /* no lock left behind to wait for */
  lg_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_owners_release),
      cmocka_unit_test(test_killed_inside_reserve),
  };
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char group[64];
    backend = names[i];
    if (!strcmp(backend, "memory")) continue;
    snprintf(group, sizeof group, "budget leaks: %s", backend);
    failed += cmocka_run_group_tests_name(group, tests, NULL, NULL);
  }
  return failed ? 1 : 0;
}
