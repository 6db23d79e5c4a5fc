/*
 * test_store_faults.c — backend failures give clean errors and leave no
 * half-written row.
 *
 * SQLite: another connection holds the write lock (BEGIN EXCLUSIVE) and
 * the store's busy timeout is tiny: a claim, a commit and a decision under
 * lg_store_with_run each fail with LG_EBUSY, promptly, and once the lock
 * is gone the same calls succeed — nothing was written meanwhile.
 *
 * PostgreSQL: the store's own connection is killed (pg_terminate_backend
 * from another connection, through the fault-injection hook of store.h) in
 * the middle of a claim, of a commit and of a decision: each fails with
 * LG_ESTORE naming the lost connection, the row is as it was before the
 * call, and the next call reconnects by itself.
 *
 * Every backend: a fault injected between a write and its commit rolls the
 * whole call back. A cancel that fails after its deny rule is written
 * says so (the server must not answer "nothing stored"), and the rule
 * holds, as it does for a run not created yet.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <sqlite3.h>
#include <unistd.h>

#include "step/step.h"
#include "store/driver.h"
#include "store/group.h"
#include "store/store.h"
#include "store_test_util.h"

#define FP "abababababababababababababababababababababababababababababababab"
#define T0 1700000000000LL

static const char *backend;
static const char *fault_point; /* where the hook acts */
static int fault_code;          /* what it returns there (0: kill the connection) */
static int fault_hits;
static lg_store_t *armed_store; /* the store of the test (setup) */

static int hook(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  if (!fault_point || strcmp(point, fault_point)) return 0;
  fault_hits++;
  if (fault_code) return fault_code;
  char sql[96];
  snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d, 5000)", lg__store_pg_backend_pid(s));
  assert_int_equal(lgt_pg_exec(sql), 0);
  return 0;
}

static void arm(const char *point, int code) {
  fault_point = point;
  fault_code = code;
  fault_hits = 0;
  lg__store_set_fault(armed_store, hook, NULL);
}

static void disarm(void) {
  if (armed_store) lg__store_set_fault(armed_store, NULL, NULL);
  fault_point = NULL;
}

static int setup(void **state) {
  lg_store_options_t o = {.retention_ms = 1000, .busy_timeout_ms = 50};
  *state = armed_store = lgt_open(lgt_fresh_url(backend), &o);
  return 0;
}

static int teardown(void **state) {
  disarm();
  armed_store = NULL;
  lg_store_close(*state);
  return 0;
}

static lg_claim_outcome_t peek(lg_store_t *s, const char *key, int64_t now) {
  lg_claim_t c = {0};
  lg_error_t err = {0};
  int rc = lg_store_peek(s, key, FP, now, &c, &err);
  if (rc) fail_msg("peek: %s", err.message);
  lg_claim_clear(&c);
  return c.outcome;
}

/* ---- every backend: an injected fault before the commit ---- */

static void test_fault_before_commit_rolls_back(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_error_t err = {0};
  /* A finished row past retention makes the claim take the transaction
   * path (read, then replace). */
  assert_int_equal(lg_store_claim(s, "k", FP, NULL, 100, T0, &c, NULL), 0);
  assert_int_equal(lg_store_commit(s, "k", "\"old\"", 5, NULL, T0, NULL), 0);
  arm("claim.before_commit", LG_ESTORE);
  assert_int_equal(lg_store_claim(s, "k", FP, NULL, 100, T0 + 5000, &c, &err), LG_ESTORE);
  assert_int_equal(fault_hits, 1);
  disarm();
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "k", T0 + 500, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED); /* the old row, untouched */
  assert_string_equal(op.result, "\"old\"");
  lg_operation_clear(&op);
  /* A commit that fails leaves the claim in progress. */
  assert_int_equal(lg_store_claim(s, "k2", FP, NULL, 100000, T0, &c, NULL), 0);
  arm("commit.settle", LG_ESTORE);
  assert_int_equal(lg_store_commit(s, "k2", "1", 1, NULL, T0 + 1, &err), LG_ESTORE);
  disarm();
  assert_int_equal(peek(s, "k2", T0 + 2), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(lg_store_commit(s, "k2", "1", 1, NULL, T0 + 3, &err), 0);
  assert_int_equal(peek(s, "k2", T0 + 4), LG_CLAIM_REPLAY);
}

static int decide(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud;
  lg_claim_t c = {0};
  int rc = lg_store_claim(s, "in-decision", FP, rec->run_id, 100000, T0, &c, NULL);
  if (rc) return rc;
  lg_run_record_t r = *rec;
  r.envelope_json = "\"changed\"";
  return lg_store_run_put(s, &r, NULL);
}

static void make_run(lg_store_t *s) {
  lg_run_record_t rec = {.run_id = "run", .envelope_json = "\"original\"", .created_ms = T0,
                         .updated_ms = T0};
  assert_int_equal(lg_store_run_create(s, &rec, NULL), 0);
}

static void assert_run_untouched(lg_store_t *s) {
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "run", &got, NULL), 0);
  assert_string_equal(got.envelope_json, "\"original\"");
  lg_run_record_clear(&got);
  assert_int_equal(peek(s, "in-decision", T0), LG_CLAIM_FREE);
}

static void test_fault_in_decision_rolls_back(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  make_run(s);
  arm("with_run.before_commit", LG_ESTORE);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), LG_ESTORE);
  disarm();
  assert_run_untouched(s);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), 0);
  assert_int_equal(peek(s, "in-decision", T0), LG_CLAIM_IN_PROGRESS);
}

static int denied(lg_store_t *s, const char *run_id, const char *group) {
  lg_error_t err = {0};
  int d = lg_store_denied(s, run_id, group, NULL, &err);
  if (d < 0) fail_msg("denied: %s", err.message);
  return d;
}

static void test_cancel_fails_after_its_rule(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg__step_t st;
  int stored = -1;
  make_run(s);
  arm("with_run.before_commit", LG_ESTORE);
  assert_int_equal(lg__step_cancel(s, "run", NULL, T0 + 1, &st, &stored, &err), LG_ESTORE);
  disarm();
  assert_int_equal(st.fail, LG__STEP_STORE);
  lg__step_clear(&st);
  assert_int_equal(stored, 1);
  assert_int_equal(denied(s, "run", NULL), 1);

  lg_run_record_t g = {.run_id = "g1", .group = "grp", .created_ms = T0, .updated_ms = T0};
  assert_int_equal(lg_store_run_create(s, &g, NULL), 0);
  stored = -1;
  arm("with_run.before_commit", LG_ESTORE);
  assert_int_equal(lg__step_cancel_group(s, "grp", NULL, T0 + 1, NULL, NULL, &stored, &err),
                   LG_ESTORE);
  disarm();
  assert_int_equal(stored, 1);
  assert_int_equal(denied(s, "g2", "grp"), 1);

  /* No run yet: the rule waits for it. */
  stored = -1;
  assert_int_equal(lg__step_cancel(s, "later", NULL, T0, &st, &stored, &err), LG_ENOTFOUND);
  assert_int_equal(st.fail, LG__STEP_NO_RUN);
  lg__step_clear(&st);
  assert_int_equal(stored, 1);
  assert_int_equal(denied(s, "later", NULL), 1);
}

/* ---- SQLite: a transaction SQLite undid by itself ---- */

/* SQLite rolls a whole transaction back by itself on some errors (a disk
 * full, an I/O error, no memory). A job of the batch after that must fail,
 * not open a savepoint, which would begin a transaction of its own that
 * its RELEASE commits, out of the batch (whose COMMIT then fails: every
 * job answered "nothing stored", one of them stored, and decided twice
 * when retried). The undoing is a ROLLBACK on the connection here. */
static void test_sqlite_undone_transaction(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg__store_lock(s);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
  assert_int_equal(s->drv->exec(s, "ROLLBACK", &err), 0);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), LG_ESTORE);
  assert_non_null(strstr(err.message, "rolled the transaction back"));
  assert_int_not_equal(lg__store_end(s, 1, &err), 0); /* the batch's COMMIT: nothing to commit */
  lg__store_unlock(s);
  make_run(s); /* the store goes on */
}

/* ---- SQLite: SQLITE_BUSY ---- */

static void test_sqlite_busy(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_error_t err = {0};
  make_run(s);
  assert_int_equal(lg_store_claim(s, "held", FP, NULL, 100000, T0, &c, NULL), 0);
  sqlite3 *other;
  assert_int_equal(sqlite3_open(lgt_url + 7, &other), SQLITE_OK);
  assert_int_equal(sqlite3_exec(other, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
  int64_t t = lgt_now_ms();
  assert_int_equal(lg_store_claim(s, "new", FP, NULL, 100, T0, &c, &err), LG_EBUSY);
  assert_non_null(strstr(err.message, "locked"));
  assert_non_null(strstr(err.source, "sqlite:"));
  assert_int_equal(lg_store_commit(s, "held", "1", 1, NULL, T0, &err), LG_EBUSY);
  assert_int_equal(lg_store_fail(s, "held", 1, T0, &err), LG_EBUSY);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), LG_EBUSY);
  lg_run_record_t rec = {.run_id = "x", .created_ms = 1, .updated_ms = 1};
  assert_int_equal(lg_store_run_put(s, &rec, &err), LG_EBUSY);
  assert_true(lgt_now_ms() - t < 2000); /* 50 ms each, not the default 5 s */
  /* Reads go on meanwhile (WAL). */
  assert_int_equal(peek(s, "held", T0), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(other);
  /* Nothing was written, and everything works again. */
  assert_int_equal(peek(s, "new", T0), LG_CLAIM_FREE);
  assert_run_untouched(s);
  assert_int_equal(lg_store_claim(s, "new", FP, NULL, 100, T0, &c, &err), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_commit(s, "held", "1", 1, NULL, T0, &err), 0);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), 0);
}

/* ---- PostgreSQL: the connection dropped mid-call ---- */

static void test_pg_connection_dropped(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_error_t err = {0};
  /* 1. During a claim's first statement. */
  arm("claim.insert", 0);
  assert_int_equal(lg_store_claim(s, "a", FP, NULL, 100000, T0, &c, &err), LG_ESTORE);
  assert_non_null(strstr(err.message, "connection"));
  assert_int_equal(fault_hits, 1);
  disarm();
  assert_int_equal(peek(s, "a", T0), LG_CLAIM_FREE); /* reconnected; no row */
  assert_int_equal(lg_store_claim(s, "a", FP, NULL, 100000, T0, &c, &err), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);

  /* 2. Inside a claim's transaction, after its write. */
  assert_int_equal(lg_store_claim(s, "b", FP, NULL, 100, T0, &c, NULL), 0);
  assert_int_equal(lg_store_commit(s, "b", "\"old\"", 5, NULL, T0, NULL), 0);
  arm("claim.before_commit", 0);
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_store_claim(s, "b", FP, NULL, 100, T0 + 5000, &c, &err), LG_ESTORE);
  disarm();
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "b", T0 + 10, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED);
  assert_string_equal(op.result, "\"old\"");
  lg_operation_clear(&op);

  /* 3. During a commit's statement. */
  arm("commit.settle", 0);
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_store_commit(s, "a", "1", 1, NULL, T0 + 1, &err), LG_ESTORE);
  disarm();
  assert_int_equal(peek(s, "a", T0 + 2), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(lg_store_commit(s, "a", "1", 1, NULL, T0 + 3, &err), 0);
  assert_int_equal(peek(s, "a", T0 + 4), LG_CLAIM_REPLAY);

  /* 4. Inside a decision. */
  make_run(s);
  arm("with_run.before_commit", 0);
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), LG_ESTORE);
  disarm();
  assert_run_untouched(s);
  assert_int_equal(lg_store_with_run(s, "run", decide, NULL, &err), 0);
  assert_int_equal(peek(s, "in-decision", T0), LG_CLAIM_IN_PROGRESS);
}

/* A fault hook that stops the store's backend (SIGSTOP) at stop_point
 * (just before a COMMIT), and keeps its pid. */
static int stopped_pid;
static const char *stop_point;
static int stop_backend(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  if (strcmp(point, stop_point)) return 0;
  stopped_pid = lg__store_pg_backend_pid(s);
  assert_int_equal(kill(stopped_pid, SIGSTOP), 0);
  return 0;
}

static void stop_at(lg_store_t *s, const char *point) {
  stop_point = point;
  stopped_pid = 0;
  lg__store_set_fault(s, stop_backend, NULL);
}

/* After a call stop_at stopped the backend of: the call failed at the
 * deadline (300 ms) saying its outcome is unknown; the backend is woken
 * and waited for until it has ended (it finds its client gone). */
static void woken_unknown(lg_store_t *s, int rc, const lg_error_t *err, const char *what) {
  lg__store_set_fault(s, NULL, NULL);
  assert_true(stopped_pid > 0);
  kill(stopped_pid, SIGCONT);
  assert_int_equal(rc, LG_ESTORE);
  if (!strstr(err->message, "did not answer within 300 ms") || !strstr(err->message, LG__ERR_MAYBE_STORED))
    fail_msg("%s past the deadline does not say its outcome is unknown: %s", what, err->message);
  for (int i = 0; i < 200 && kill(stopped_pid, 0) == 0; i++) usleep(50000);
}

/* A server that keeps the connection but stops answering (its backend
 * stopped: a stalled disk, a paused machine, which no keepalive sees):
 * the call fails once query_timeout_ms has passed, saying so, and the
 * next call connects again. Without the deadline the commit below waits
 * for ever. What was sent is in the stopped backend's socket: woken, it
 * may still run it, whole (one transaction) or not at all, as after a
 * connection lost during a COMMIT; a retry of the commit is safe either
 * way (docs/store.md). */
static void test_pg_backend_frozen(void **state) {
  (void)state;
  char url[600];
  snprintf(url, sizeof url, "%s query_timeout_ms=300", lgt_fresh_url("postgres"));
  lg_store_t *s = lgt_open(url, NULL);
  lg_claim_t c = {0};
  lg_error_t err = {0};
  assert_int_equal(lg_store_claim(s, "k", FP, NULL, 100000, T0, &c, &err), 0);
  int pid = lg__store_pg_backend_pid(s);
  assert_true(pid > 0);
  assert_int_equal(kill(pid, SIGSTOP), 0);
  int rc = lg_store_commit(s, "k", "1", 1, NULL, T0 + 1, &err);
  kill(pid, SIGCONT); /* it finds its client gone, and ends */
  assert_int_equal(rc, LG_ESTORE);
  if (!strstr(err.message, "did not answer within 300 ms"))
    fail_msg("the error does not name the deadline: %s", err.message);
  /* the commit's write is a statement of its own, its own COMMIT: the
   * backend may run it when it wakes, and the error says so */
  if (!strstr(err.message, LG__ERR_MAYBE_STORED))
    fail_msg("the error does not say the write may be stored: %s", err.message);
  for (int i = 0; i < 200 && kill(pid, 0) == 0; i++) usleep(50000); /* until it has ended */
  lg_claim_outcome_t o = peek(s, "k", T0 + 2); /* reconnected */
  if (o != LG_CLAIM_IN_PROGRESS && o != LG_CLAIM_REPLAY) fail_msg("the key after the deadline: %d", o);
  assert_int_not_equal(lg__store_pg_backend_pid(s), pid);
  assert_int_equal(lg_store_commit(s, "k", "1", 1, NULL, T0 + 3, &err), 0); /* the retry */
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "k", T0 + 4, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED);
  assert_string_equal(op.result, "1");
  lg_operation_clear(&op);
  /* A read that outlives the deadline wrote nothing: nothing "may" be stored */
  pid = lg__store_pg_backend_pid(s);
  assert_int_equal(kill(pid, SIGSTOP), 0);
  memset(&err, 0, sizeof err);
  rc = lg_store_operation(s, "k", T0 + 5, &op, &err);
  kill(pid, SIGCONT);
  assert_int_equal(rc, LG_ESTORE);
  if (!strstr(err.message, "did not answer within 300 ms") || strstr(err.message, LG__ERR_MAYBE_STORED))
    fail_msg("a read past the deadline: %s", err.message);
  /* A decision's writes go with its COMMIT, in one pipeline: stopped
   * just before it, the backend holds them all, and a lost answer leaves
   * the outcome unknown, which the error says. Woken, the backend may run
   * them: the run and its claim are both changed, or neither. */
  make_run(s);
  stop_at(s, "with_run.before_commit");
  memset(&err, 0, sizeof err);
  rc = lg_store_with_run(s, "run", decide, NULL, &err);
  woken_unknown(s, rc, &err, "a decision's COMMIT");
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "run", &got, NULL), 0);
  int changed = !strcmp(got.envelope_json, "\"changed\"");
  lg_run_record_clear(&got);
  assert_int_equal(peek(s, "in-decision", T0), changed ? LG_CLAIM_IN_PROGRESS : LG_CLAIM_FREE);
  /* A reservation's writes wait for its COMMIT and go in one pipeline
   * with it (batch mode): the same, whole or not at all. */
  lg_budget_t b;
  assert_int_equal(lg_budget_set(s, "team:a", 1000000, LG_PERIOD_NONE, -1, T0, &b, &err), 0);
  const char *scopes[] = {"team:a"};
  lg_budget_request_t req = {.scopes = scopes, .nscopes = 1, .amount_micro = 250000};
  lg_budget_reservation_t r;
  stop_at(s, "budget.reserve.before_commit");
  memset(&err, 0, sizeof err);
  rc = lg_budget_reserve(s, &req, T0 + 6, &r, NULL, &err);
  woken_unknown(s, rc, &err, "a reservation's COMMIT");
  assert_int_equal(lg_budget_get(s, "team:a", T0 + 7, &b, &err), 0);
  if (!(b.reserved_micro == 0 && b.open_reservations == 0) &&
      !(b.reserved_micro == 250000 && b.open_reservations == 1))
    fail_msg("the reservation half stored: %lld reserved by %lld", (long long)b.reserved_micro,
             (long long)b.open_reservations);
  lg_store_close(s);
}

/* query_timeout_ms: milliseconds, for a postgres: store only. */
static void test_query_timeout_param(void **state) {
  (void)state;
  static const char *const bad[] = {"sqlite:/tmp/x.db?query_timeout_ms=5", "memory:?query_timeout_ms=5",
                                    "postgres:host=/nonexistent query_timeout_ms=-1",
                                    "postgres:host=/nonexistent query_timeout_ms=3600001",
                                    "postgres://h/db?query_timeout_ms=soon"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lg_error_t err = {0};
    assert_null(lg_store_open(bad[i], NULL, &err));
    assert_int_equal(err.code, LG_EINVAL);
    assert_string_equal(err.field, "url");
    if (!strstr(err.message, "query_timeout_ms")) fail_msg("%s: %s", bad[i], err.message);
  }
}

/* A server that is gone: a clean error, no hang. */
static void test_pg_unreachable(void **state) {
  (void)state;
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open("postgres:host=/nonexistent dbname=x connect_timeout=2",
                                NULL, &err);
  assert_null(s);
  assert_int_equal(err.code, LG_ESTORE);
  assert_non_null(strstr(err.message, "cannot connect"));
}

/* A host that takes the connection and never answers (a listener that
 * never accepts: the kernel completes the handshake, libpq's startup
 * packet waits unread): opened within a deadline, the open fails at it,
 * saying so, long before the URL's connect_timeout (30 s). No PostgreSQL
 * server is needed. */
static void test_pg_open_within(void **state) {
  (void)state;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(l, 8), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&a, &alen), 0);
  char url[200];
  snprintf(url, sizeof url, "postgres:host=127.0.0.1 port=%d dbname=x user=x connect_timeout=30",
           ntohs(a.sin_port));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  lg_error_t err = {0};
  lg_store_t *s = lg__store_open_within(url, NULL, 300, "the test's deadline", &err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  close(l);
  assert_null(s);
  assert_int_equal(err.code, LG_ESTORE);
  if (!strstr(err.message, "cannot connect to PostgreSQL: it did not answer within 300 ms (the test's deadline)"))
    fail_msg("the open past its deadline: %s", err.message);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  if (ms > 10000) fail_msg("the open took %ld ms, its deadline 300", ms); /* connect_timeout: 30 s */
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  const struct CMUnitTest common[] = {
      T(test_fault_before_commit_rolls_back),
      T(test_fault_in_decision_rolls_back),
      T(test_cancel_fails_after_its_rule),
  };
  const struct CMUnitTest sqlite_only[] = {T(test_sqlite_busy)};
  const struct CMUnitTest sqlite_driver[] = {T(test_sqlite_undone_transaction)}; /* memory: too */
  const struct CMUnitTest pg_only[] = {T(test_pg_connection_dropped), T(test_pg_unreachable),
                                       cmocka_unit_test(test_pg_backend_frozen)};
  const struct CMUnitTest every[] = {cmocka_unit_test(test_query_timeout_param),
                                      cmocka_unit_test(test_pg_open_within)};
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "memory,sqlite");
  int failed = cmocka_run_group_tests_name("store URL parameters", every, NULL, NULL);
  for (int i = 0; i < n; i++) {
    char group[64];
    backend = names[i];
    snprintf(group, sizeof group, "store faults: %s", backend);
    failed += cmocka_run_group_tests_name(group, common, NULL, NULL);
    snprintf(group, sizeof group, "store faults: %s only", backend);
    if (!strcmp(backend, "sqlite"))
      failed += cmocka_run_group_tests_name(group, sqlite_only, NULL, NULL);
    if (strcmp(backend, "postgres"))
      failed += cmocka_run_group_tests_name(group, sqlite_driver, NULL, NULL);
    if (!strcmp(backend, "postgres"))
      failed += cmocka_run_group_tests_name(group, pg_only, NULL, NULL);
  }
  return failed ? 1 : 0;
}
