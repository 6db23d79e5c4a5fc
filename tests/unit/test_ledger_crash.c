/*
 * test_ledger_crash.c — a worker killed between claim and commit.
 *
 * A child process claims a key with a 200 ms lease, performs its side
 * effect (a line appended to a file, as a payment would be sent) and is
 * killed with SIGKILL before it can commit. Then other worker processes
 * try the same operation: while the lease lives they get in_progress; once
 * it has run out, unknown_outcome — every time, from every worker — and
 * none of them performs the side effect again. The file has one line at
 * the end. An operator's commit then resolves the key and it replays.
 *
 * A second test kills a child inside a decision's transaction (after a
 * claim made under lg_store_with_run, before its commit): nothing of it
 * remains — neither the claim nor the run's new state — and the store is
 * not left locked.
 *
 * Times come from the real clock (the lease must really run out while the
 * crashed process is gone), except the in_progress check, which passes a
 * time inside the lease explicitly so that a slow machine cannot make it
 * flaky. Backends: sqlite by default, postgres from tests/pg/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "store/store.h"
#include "store_test_util.h"

#define FP "feedfacefeedfacefeedfacefeedfacefeedfacefeedfacefeedfacefeedface"
#define LEASE_MS 200

static const char *backend;
static char effects[600]; /* the side-effect log */

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, ch;
  while ((ch = fgetc(f)) != EOF) n += ch == '\n';
  fclose(f);
  return n;
}

static void side_effect(const char *who) {
  int fd = open(effects, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd < 0) _exit(7);
  char line[64];
  int n = snprintf(line, sizeof line, "charged by %s\n", who);
  if (write(fd, line, (size_t)n) != n) _exit(7);
  fsync(fd);
  close(fd);
}

/* The worker's whole logic: claim, and only when claimed run the side
 * effect and commit. Returns the outcome. `now` < 0: the real clock. */
static lg_claim_outcome_t worker(lg_store_t *s, const char *who, int64_t now, int crash_fd) {
  lg_claim_t c = {0};
  lg_error_t err = {0};
  int64_t t = now >= 0 ? now : lgt_now_ms();
  int rc = lg_store_claim(s, "charge-42", FP, who, LEASE_MS, t, &c, &err);
  if (rc) {
    fprintf(stderr, "%s: claim: %s\n", who, err.message);
    _exit(8);
  }
  lg_claim_outcome_t o = c.outcome;
  lg_claim_clear(&c);
  if (o != LG_CLAIM_CLAIMED) return o;
  side_effect(who);
  if (crash_fd >= 0) {
    /* Tell the parent when the claim was made, then wait to be killed. */
    if (write(crash_fd, &t, sizeof t) != (ssize_t)sizeof t) _exit(9);
    for (;;) pause();
  }
  if (lg_store_commit(s, "charge-42", "{\"ok\":true}", 11, NULL, lgt_now_ms(), &err)) _exit(10);
  return o;
}

/* Runs worker() in a new process and returns its outcome. */
static lg_claim_outcome_t in_child(const char *url, const char *who, int64_t now) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    lg_store_t *s = lgt_open(url, NULL);
    int o = worker(s, who, now, -1);
    lg_store_close(s);
    if (write(p[1], &o, sizeof o) != (ssize_t)sizeof o) _exit(11);
    _exit(0);
  }
  close(p[1]);
  int o = -1;
  ssize_t r = read(p[0], &o, sizeof o);
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  assert_int_equal(r, (ssize_t)sizeof o);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return (lg_claim_outcome_t)o;
}

static void test_killed_between_claim_and_commit(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_close(lgt_open(url, NULL));
  snprintf(effects, sizeof effects, "%s/effects-%s.log", lgt_tmpdir(), backend);
  unlink(effects);

  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t victim = fork();
  assert_true(victim >= 0);
  if (victim == 0) {
    close(p[0]);
    lg_store_t *s = lgt_open(url, NULL);
    worker(s, "victim", -1, p[1]);
    _exit(12); /* not reached: claimed, or something is wrong */
  }
  close(p[1]);
  int64_t claimed_at = 0;
  assert_int_equal(read(p[0], &claimed_at, sizeof claimed_at), (ssize_t)sizeof claimed_at);
  close(p[0]);
  assert_int_equal(kill(victim, SIGKILL), 0);
  int st = 0;
  waitpid(victim, &st, 0);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  assert_int_equal(count_lines(effects), 1);

  /* Inside the lease: someone else holds it. */
  assert_int_equal(in_child(url, "w1", claimed_at + LEASE_MS / 2), LG_CLAIM_IN_PROGRESS);
  /* After it, on the real clock: unknown_outcome, from every worker. */
  while (lgt_now_ms() < claimed_at + LEASE_MS + 5) lgt_sleep_ms(10);
  for (int i = 0; i < 4; i++) {
    char who[8];
    snprintf(who, sizeof who, "w%d", i + 2);
    assert_int_equal(in_child(url, who, -1), LG_CLAIM_UNKNOWN_OUTCOME);
  }
  assert_int_equal(count_lines(effects), 1); /* never a second charge */

  /* The operator reconciles: the charge went through. */
  lg_store_t *s = lgt_open(url, NULL);
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "charge-42", lgt_now_ms(), &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_UNKNOWN_OUTCOME);
  assert_string_equal(op.run_id, "victim");
  lg_operation_clear(&op);
  assert_int_equal(lg_store_commit(s, "charge-42", "{\"reconciled\":1}", 16, "ch_1", lgt_now_ms(),
                                   NULL),
                   0);
  lg_store_close(s);
  assert_int_equal(in_child(url, "w9", -1), LG_CLAIM_REPLAY);
  assert_int_equal(count_lines(effects), 1);
  printf("%s: killed after claim: in_progress in the lease, unknown_outcome after, "
         "1 side effect\n",
         backend);
}

/* ---- killed inside a decision's transaction ---- */

static int die_before_commit(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  (void)s;
  if (!strcmp(point, "with_run.before_commit")) raise(SIGKILL);
  return 0;
}

static int decide(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud;
  lg_claim_t c = {0};
  int rc = lg_store_claim(s, "inside", FP, rec->run_id, 60000, 1000, &c, NULL);
  if (rc || c.outcome != LG_CLAIM_CLAIMED) return rc ? rc : LG_ESTATE;
  lg_run_record_t r = *rec;
  r.envelope_json = "\"changed\"";
  r.stopped = 1;
  return lg_store_run_put(s, &r, NULL);
}

static void test_killed_inside_transaction(void **state) {
  (void)state;
  const char *url = lgt_fresh_url(backend);
  lg_store_t *s = lgt_open(url, NULL);
  lg_run_record_t rec = {.run_id = "r", .envelope_json = "\"original\"", .created_ms = 1,
                         .updated_ms = 1};
  assert_int_equal(lg_store_run_create(s, &rec, NULL), 0);
  lg_store_close(s);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    lg_store_t *cs = lgt_open(url, NULL);
    lg__store_set_fault(cs, die_before_commit, NULL);
    lg_store_with_run(cs, "r", decide, NULL, NULL);
    _exit(13); /* not reached */
  }
  int st = 0;
  waitpid(pid, &st, 0);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  /* Nothing half-written, and nothing left locked. */
  lg_store_options_t o = {.busy_timeout_ms = 2000};
  s = lgt_open(url, &o);
  lg_claim_t c = {0};
  assert_int_equal(lg_store_peek(s, "inside", FP, 2000, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "r", &got, NULL), 0);
  assert_string_equal(got.envelope_json, "\"original\"");
  assert_int_equal(got.stopped, 0);
  lg_run_record_clear(&got);
  assert_int_equal(lg_store_with_run(s, "r", decide, NULL, NULL), 0);
  assert_int_equal(lg_store_peek(s, "inside", FP, 2000, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  lg_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_killed_between_claim_and_commit),
      cmocka_unit_test(test_killed_inside_transaction),
  };
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char group[64];
    backend = names[i];
    if (!strcmp(backend, "memory")) continue; /* dies with its process */
    snprintf(group, sizeof group, "ledger crash: %s", backend);
    failed += cmocka_run_group_tests_name(group, tests, NULL, NULL);
  }
  return failed ? 1 : 0;
}
