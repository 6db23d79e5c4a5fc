/*
 * test_store_cli.c — `loopguard runs list|show|cancel|purge` over runs that the
 * engine saved in a store, and the kill switch seen from a worker.
 *
 * The CLI cannot create runs (the server does), so this program saves
 * engine runs through the API into a store — a SQLite file, or with
 * LG_STORE_BACKENDS=postgres the tests/pg/ database — then runs the
 * binary named by LG_BIN on it and checks what it prints and its exit
 * status; and after `runs cancel`, checks through the API that a worker's
 * next decision for the run is a stop with the operator's reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/wait.h>

#include "store_test_util.h"

static const char *url;

/* Runs `loopguard ARGS --store URL`; returns the exit status and the
 * output (static buffer). */
static int run_cli(const char *args, char **out) {
  static char buf[65536];
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' %s --store '%s' 2>&1", getenv("LG_BIN"), args, url);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = 0;
  int st = pclose(p);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Saves a run that made `calls` identical calls (policy defaults). */
static void save_run(lg_store_t *s, const char *id, const char *group, int calls, int64_t t) {
  lg_error_t err = {0};
  lg_canon_t *canon = lg_canon_new();
  lg_run_t *run = lg_run_new(id, group, NULL, NULL, NULL, &err);
  assert_non_null(run);
  lg_call_t call = {.tool = "search", .args = "{\"q\":\"same\"}", .args_len = 12};
  lg_result_t res = {.status = LG_STATUS_PROGRESS, .side_effect_committed = -1,
                     .retry_after_ms = -1};
  lg_decision_t d;
  for (int i = 0; i < calls; i++) {
    call.turn = i;
    call.t_ms = res.t_ms = i * 10;
    assert_int_equal(lg_run_before(run, canon, &call, &d, &err), 0);
    if (d.action == LG_ACT_EXECUTE) assert_int_equal(lg_run_after(run, &res, &d, &err), 0);
  }
  assert_int_equal(lg_store_run_save(s, run, t, &err), 0);
  lg_run_free(run);
  lg_canon_free(canon);
}

static void test_list_show_cancel(void **state) {
  (void)state;
  lg_store_t *s = lgt_open(url, NULL);
  int64_t now = lgt_now_ms();
  save_run(s, "older", "night", 1, now - 2000);
  save_run(s, "looping", "night", 6, now - 1000); /* stopped: same_call_repeat */
  save_run(s, "newest", "day", 2, now);
  lg_store_close(s);

  char *out;
  assert_int_equal(run_cli("runs list", &out), 0);
  char *a = strstr(out, "newest"), *b = strstr(out, "looping"), *c = strstr(out, "older");
  assert_true(a && b && c && a < b && b < c); /* newest first */
  assert_non_null(strstr(out, "same_call_repeat"));

  assert_int_equal(run_cli("runs list --json --status stopped", &out), 0);
  assert_non_null(strstr(out, "{\"run_id\":\"looping\",\"group\":\"night\",\"status\":\"stopped\""));
  assert_null(strstr(out, "newest"));
  assert_int_equal(run_cli("runs list --json --limit 1", &out), 0);
  assert_non_null(strstr(out, "\"newest\""));
  assert_null(strchr(strchr(out, '\n') + 1, '{')); /* one line */

  assert_int_equal(run_cli("runs show looping", &out), 0);
  assert_non_null(strstr(out, "status       stopped"));
  assert_non_null(strstr(out, "reason       same_call_repeat"));
  assert_non_null(strstr(out, "counters     "));
  assert_non_null(strstr(out, "\"terminal_reason\": \"same_call_repeat\""));
  assert_int_equal(run_cli("runs show looping --json", &out), 0);
  assert_non_null(strstr(out, "\"counters\":{\"steps\":"));
  assert_non_null(strstr(out, "\"cancel\":null"));
  assert_non_null(strstr(out, "\"envelope\":{\"run_id\":\"looping\""));

  /* The kill switch on a live run. */
  assert_int_equal(run_cli("runs cancel newest --reason 'costs too much'", &out), 0);
  assert_non_null(strstr(out, "cancelled run newest (operator_cancelled_loop: costs too much)"));
  assert_int_equal(run_cli("runs show newest --json", &out), 0);
  /* The reason is the kill switch's; the operator's words are a note. */
  assert_non_null(strstr(out, "\"status\":\"stopped\",\"terminal_reason\":\"operator_cancelled_loop\""));
  assert_non_null(strstr(out, "\"operator_note\":\"costs too much\""));
  assert_non_null(strstr(out, "\"cancel\":{\"reason\":\"costs too much\"}"));
  s = lgt_open(url, NULL);
  char *reason = NULL;
  assert_int_equal(lg_store_denied(s, "newest", "day", &reason, NULL), 1);
  assert_string_equal(reason, "costs too much");
  lg_free(reason);
  lg_store_close(s);

  /* A group: its active runs stop, and a worker deciding for a run of it
   * that it still holds in memory gets the stop before any side effect. */
  assert_int_equal(run_cli("runs cancel --group night --json", &out), 0);
  assert_non_null(strstr(out, "\"cancelled\":[\"older\"]"));
  s = lgt_open(url, NULL);
  lg_run_t *run = lg_run_new("night-new", "night", NULL, NULL, NULL, NULL);
  reason = NULL;
  int denied = lg_store_denied(s, lg_run_id(run), lg_run_group(run), &reason, NULL);
  assert_int_equal(denied, 1);
  lg_decision_t d;
  assert_int_equal(lg_run_cancel(run, reason, 5, &d), 0);
  assert_int_equal(d.action, LG_ACT_STOP);
  assert_string_equal(lg_run_terminal_reason(run), "operator_cancelled_loop");
  lg_free(reason);
  lg_run_free(run);
  lg_store_close(s);

  assert_int_equal(run_cli("runs list --status active", &out), 0);
  assert_non_null(strstr(out, "no runs in"));
}

/* `runs purge`: the runs not written to for the age go, with their trace;
 * the rest stay; the count printed, or as JSON. */
static void test_purge(void **state) {
  (void)state;
  lg_store_t *s = lgt_open(url, NULL);
  int64_t now = lgt_now_ms();
  save_run(s, "stale-1", NULL, 2, now - 3 * 86400000LL);
  save_run(s, "stale-2", "night", 6, now - 2 * 86400000LL); /* stopped, and old */
  save_run(s, "fresh", NULL, 1, now - 3600000);
  lg_store_close(s);
  char *out;
  assert_int_equal(run_cli("runs purge --older-than 1d", &out), 0);
  assert_non_null(strstr(out, "purged 2 runs not written to for 1d, with their traces"));
  assert_int_equal(run_cli("runs show stale-1", &out), 1);
  assert_non_null(strstr(out, "stale-1"));
  assert_int_equal(run_cli("runs trace stale-2", &out), 1);
  assert_int_equal(run_cli("runs list --json", &out), 0);
  assert_non_null(strstr(out, "\"fresh\""));
  assert_null(strstr(out, "stale"));
  assert_int_equal(run_cli("runs purge --older-than 1d --json", &out), 0);
  assert_string_equal(out, "{\"purged\":0,\"older_than_ms\":86400000}\n");
  assert_int_equal(run_cli("runs purge --older-than 30m", &out), 0);
  assert_non_null(strstr(out, "purged 1 run not written to for 30m"));
  assert_int_equal(run_cli("runs list", &out), 0);
  assert_null(strstr(out, "fresh"));
  assert_non_null(strstr(out, "newest")); /* test_list_show_cancel's, written just now */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_list_show_cancel),
                                     cmocka_unit_test(test_purge)};
  if (!getenv("LG_BIN")) {
    fprintf(stderr, "LG_BIN must name the loopguard binary\n");
    return 1;
  }
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    if (!strcmp(names[i], "memory")) continue; /* a CLI process has its own */
    char group[64];
    url = lgt_fresh_url(names[i]);
    snprintf(group, sizeof group, "runs CLI: %s", names[i]);
    failed += cmocka_run_group_tests_name(group, tests, NULL, NULL);
  }
  return failed ? 1 : 0;
}
