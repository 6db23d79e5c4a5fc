/*
 * test_expect.c — lg_expect_compute / lg_expect_trace: the `# expect`
 * line of a trace is what replaying it does (trace-v1, "Expectations").
 *
 * A stop on a call names the call (stopped_at_call) and every call that
 * was not executed (call_N_action); a stop on a result has no
 * stopped_at_call; a trace that does not stop expects terminal_reason
 * null; an old `# expect` line is replaced, and the output, computed
 * again, gives the same line (a fixed point); a malformed trace is an
 * error naming its line with nothing returned; and out of memory at
 * every allocation, one at a time, is a clean LG_ENOMEM with nothing
 * leaked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loopguard.h"

static const char *loop_trace =
    "# a repeat loop\n"
    "{\"type\":\"run\",\"run_id\":\"r1\"}\n"
    "{\"type\":\"call\",\"turn\":1,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"result\",\"status\":\"progress\",\"value\":{\"x\":1}}\n"
    "{\"type\":\"call\",\"turn\":2,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"result\",\"status\":\"progress\",\"value\":{\"x\":1}}\n"
    "{\"type\":\"call\",\"turn\":3,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"call\",\"turn\":4,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"call\",\"turn\":5,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"call\",\"turn\":6,\"tool\":\"t\",\"args\":{\"a\":1}}\n"
    "{\"type\":\"call\",\"turn\":7,\"tool\":\"t\",\"args\":{\"a\":1}}\n";

static const char *loop_expect =
    "# expect {\"terminal_reason\":\"same_call_repeat\",\"stopped_at_call\":6,\"executed_calls\":2,"
    "\"blocked_calls\":3,\"replayed_calls\":0,\"call_3_action\":\"block\",\"call_4_action\":"
    "\"block\",\"call_5_action\":\"block\",\"call_6_action\":\"stop\"}\n";

static char *compute(const char *trace) {
  char *line = NULL;
  lg_error_t err = {0};
  int rc = lg_expect_compute("t.jsonl", trace, strlen(trace), NULL, &line, &err);
  if (rc) fail_msg("lg_expect_compute: %s (%s)", lg_strerror(rc), err.message);
  return line;
}

static void t_stop_on_call(void **state) {
  (void)state;
  char *line = compute(loop_trace);
  assert_string_equal(line, loop_expect);
  lg_free(line);
}

static void t_stop_on_result(void **state) {
  (void)state;
  char *line = compute("{\"type\":\"call\",\"tool\":\"rm\",\"args\":{}}\n"
                       "{\"type\":\"result\",\"status\":\"permission_denied\"}\n");
  assert_string_equal(line, "# expect {\"terminal_reason\":\"permission_denied\",\"executed_calls\":1,"
                            "\"blocked_calls\":0,\"replayed_calls\":0}\n");
  lg_free(line);
}

static void t_no_stop(void **state) {
  (void)state;
  char *line = compute("{\"type\":\"call\",\"tool\":\"a\",\"args\":{}}\n");
  assert_string_equal(line, "# expect {\"terminal_reason\":null,\"executed_calls\":1,"
                            "\"blocked_calls\":0,\"replayed_calls\":0}\n");
  lg_free(line);
}

static void t_replaces_and_is_fixed_point(void **state) {
  (void)state;
  char buf[4096];
  snprintf(buf, sizeof buf, "# expect {\"terminal_reason\":\"short_cycle\"}\n%s", loop_trace);
  char *out = NULL;
  size_t len = 0;
  lg_error_t err = {0};
  assert_int_equal(lg_expect_trace("t", buf, strlen(buf), NULL, &out, &len, &err), 0);
  assert_int_equal(len, strlen(out));
  assert_int_equal(strncmp(out, loop_expect, strlen(loop_expect)), 0);
  assert_string_equal(out + strlen(loop_expect), loop_trace); /* the old line is gone */
  char *again = NULL;
  assert_int_equal(lg_expect_trace("t", out, len, NULL, &again, NULL, &err), 0);
  assert_string_equal(again, out);
  lg_free(again);
  lg_free(out);
}

static void t_malformed(void **state) {
  (void)state;
  const char *bad = "{\"type\":\"call\",\"tool\":\"a\",\"args\":{}}\n{\"type\":\"call\",\"tool\":7}\n";
  char *line = (char *)1, *out = (char *)1;
  lg_error_t err = {0};
  int rc = lg_expect_compute("bad.jsonl", bad, strlen(bad), NULL, &line, &err);
  assert_true(rc < 0);
  assert_null(line);
  assert_int_equal(err.line, 2);
  memset(&err, 0, sizeof err);
  assert_true(lg_expect_trace("bad.jsonl", bad, strlen(bad), NULL, &out, NULL, &err) < 0);
  assert_null(out);
}

/* ---- out of memory at allocation N ---- */
static long fail_at, count, live;
static int failed_one;
static void *t_malloc(size_t n) {
  if (fail_at && ++count == fail_at) return failed_one = 1, NULL;
  void *p = malloc(n);
  if (p) live++;
  return p;
}
static void *t_realloc(void *p, size_t n) {
  if (fail_at && ++count == fail_at) return failed_one = 1, NULL;
  void *q = realloc(p, n);
  if (q && !p) live++;
  return q;
}
static void t_free(void *p) {
  if (p) live--;
  free(p);
}

static void t_oom(void **state) {
  (void)state;
  lg_set_allocator(t_malloc, t_realloc, t_free);
  long n;
  for (n = 1;; n++) {
    fail_at = n;
    count = live = 0;
    failed_one = 0;
    char *out = NULL;
    lg_error_t err = {0};
    int rc = lg_expect_trace("t", loop_trace, strlen(loop_trace), NULL, &out, NULL, &err);
    if (rc) {
      assert_int_equal(rc, LG_ENOMEM);
      assert_null(out);
    } else {
      assert_int_equal(strncmp(out, loop_expect, strlen(loop_expect)), 0);
      lg_free(out);
    }
    if (live) fail_msg("%ld allocations leaked when allocation %ld failed", live, n);
    if (!failed_one) break;
  }
  lg_set_allocator(NULL, NULL, NULL);
  printf("lg_expect_trace: every one of %ld allocations failed in turn, cleanly\n", n - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_stop_on_call),   cmocka_unit_test(t_stop_on_result),
      cmocka_unit_test(t_no_stop),        cmocka_unit_test(t_replaces_and_is_fixed_point),
      cmocka_unit_test(t_malformed),      cmocka_unit_test(t_oom),
  };
  return cmocka_run_group_tests_name("expect", tests, NULL, NULL);
}
