/*
 * test_fixtures.c — every incident trace in $LG_TEST_DATA/fixtures must
 * replay to what its first line, `# expect {...}`, says.
 *
 * The fixtures are found at run time (a new file is a new case, no code
 * change), and the expectation keys are checked as
 * docs/reference/trace-v1.md ("Expectations") defines them, through the
 * library rather than `loopguard replay --json`: lg_replay_file() with a callback that
 * records the decision of every line and the summary.
 *
 *   terminal_reason          the summary's terminal reason (null: no stop)
 *   terminal_reason_one_of   one of these
 *   executed_calls           the summary's count
 *   max_executed_calls       at most this many
 *   stopped_at_call          N: the run stopped at the N-th `call` line
 *   call_N_action            the action of the N-th `call` line
 *
 * Call lines are numbered from the file itself (every line that is a JSON
 * object of type "call", acted on or not), as check-fixtures does. An
 * expectation key this test does not know fails the fixture: a typo in an
 * expectation must not pass silently.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>

#include "loopguard.h"

#define MAX_LINES 100000

/* What the replay did, line by line. */
typedef struct rec {
  const char *action[MAX_LINES + 1]; /* static names; NULL: no record */
  long ncall_events;                 /* call events acted on */
  bool have_sum;
  char *terminal_reason;             /* NULL: no stop */
  long stopped_at_line;
  int64_t executed;
} rec_t;

static int on_event(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  rec_t *r = ud;
  if (ev) {
    if (ev->acted && ev->line > 0 && ev->line <= MAX_LINES) {
      r->action[ev->line] = lg_action_name(ev->decision.action);
      if (ev->type == LG_EV_CALL) r->ncall_events++;
    }
    return 0;
  }
  r->have_sum = true;
  r->terminal_reason = sum->terminal_reason ? strdup(sum->terminal_reason) : NULL;
  r->stopped_at_line = sum->stopped_at_line;
  r->executed = sum->executed_calls;
  return 0;
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  for (;;) {
    if (n + 4096 > cap) b = realloc(b, cap *= 2);
    size_t k = fread(b + n, 1, cap - n - 1, f);
    if (!k) break;
    n += k;
  }
  fclose(f);
  b[n] = 0;
  *len = n;
  return b;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends a failure to msg. */
static void add(char *msg, size_t size, const char *fmt, ...) {
  size_t l = strlen(msg);
  if (l && l + 2 < size) {
    strcat(msg, "; ");
    l += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + l, size - l, fmt, ap);
  va_end(ap);
}

/* Checks one fixture; returns 0 when it passes, with a line printed. */
static int check_fixture(const char *dir, const char *name) {
  char path[8192];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) fail_msg("path too long: %s", name);
  size_t len;
  char *text = read_file(path, &len);
  char errs[2048] = "";
  json_t *expect = NULL;
  long *call_lines = calloc(MAX_LINES + 1, sizeof *call_lines);
  long ncalls = 0;
  rec_t *rec = calloc(1, sizeof *rec);
  if (!text) {
    add(errs, sizeof errs, "cannot read");
    goto report;
  }
  /* The expectation, and the call lines. */
  long line = 0;
  for (char *p = text; p && *p;) {
    char *nl = strchr(p, '\n');
    size_t l = nl ? (size_t)(nl - p) : strlen(p);
    line++;
    if (line == 1 && !strncmp(p, "# expect ", 9)) {
      json_error_t je;
      expect = json_loadb(p + 9, l - 9, 0, &je);
      if (!expect || !json_is_object(expect)) {
        add(errs, sizeof errs, "the # expect line is not a JSON object: %s", je.text);
        goto report;
      }
    }
    size_t a = 0;
    while (a < l && (p[a] == ' ' || p[a] == '\t' || p[a] == '\r')) a++;
    if (a < l && p[a] == '{') {
      json_t *o = json_loadb(p, l, 0, NULL);
      json_t *t = o ? json_object_get(o, "type") : NULL;
      if (json_is_string(t) && !strcmp(json_string_value(t), "call") && ncalls < MAX_LINES)
        call_lines[++ncalls] = line;
      json_decref(o);
    }
    p = nl ? nl + 1 : NULL;
  }
  if (!expect) {
    add(errs, sizeof errs, "no `# expect {...}` first line");
    goto report;
  }
  if (line > MAX_LINES) {
    add(errs, sizeof errs, "too many lines for this test");
    goto report;
  }

  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -1;
  int rc = lg_replay_file(path, NULL, on_event, rec, &err);
  if (rc) {
    char buf[1024];
    add(errs, sizeof errs, "replay failed: %s: %s", lg_err_name(rc), lg_error_format(&err, buf, sizeof buf));
    goto report;
  }
  if (!rec->have_sum) {
    add(errs, sizeof errs, "no summary");
    goto report;
  }
  /* Every acted call event is on a call line. */
  long acted_calls = 0;
  for (long n = 1; n <= ncalls; n++)
    if (rec->action[call_lines[n]]) acted_calls++;
  if (acted_calls != rec->ncall_events)
    add(errs, sizeof errs, "%ld call events acted on, %ld of them on call lines", rec->ncall_events,
        acted_calls);

  const char *k;
  json_t *v;
  json_object_foreach(expect, k, v) {
    const char *tr = rec->terminal_reason;
    if (!strcmp(k, "terminal_reason")) {
      bool same = json_is_null(v) ? tr == NULL : json_is_string(v) && tr && !strcmp(tr, json_string_value(v));
      if (!same)
        add(errs, sizeof errs, "terminal_reason %s, expected %s", tr ? tr : "null",
            json_is_string(v) ? json_string_value(v) : "null");
    } else if (!strcmp(k, "terminal_reason_one_of")) {
      bool found = false;
      size_t i;
      json_t *e;
      json_array_foreach(v, i, e) {
        if (json_is_string(e) && tr && !strcmp(tr, json_string_value(e))) found = true;
        if (json_is_null(e) && !tr) found = true;
      }
      if (!json_is_array(v)) add(errs, sizeof errs, "terminal_reason_one_of is not a list");
      else if (!found) add(errs, sizeof errs, "terminal_reason %s, expected one of the list", tr ? tr : "null");
    } else if (!strcmp(k, "executed_calls")) {
      if (!json_is_integer(v) || json_integer_value(v) != rec->executed)
        add(errs, sizeof errs, "executed_calls %lld, expected %lld", (long long)rec->executed,
            (long long)json_integer_value(v));
    } else if (!strcmp(k, "max_executed_calls")) {
      if (!json_is_integer(v) || rec->executed > json_integer_value(v))
        add(errs, sizeof errs, "executed_calls %lld, expected at most %lld", (long long)rec->executed,
            (long long)json_integer_value(v));
    } else if (!strcmp(k, "stopped_at_call")) {
      long n = json_is_integer(v) ? (long)json_integer_value(v) : 0;
      if (n < 1 || n > ncalls) add(errs, sizeof errs, "stopped_at_call %ld: no such call line", n);
      else if (rec->stopped_at_line != call_lines[n])
        add(errs, sizeof errs, "stopped_at_line %ld, expected %ld (call %ld)", rec->stopped_at_line,
            call_lines[n], n);
    } else if (!strncmp(k, "call_", 5) && strlen(k) > 12 && !strcmp(k + strlen(k) - 7, "_action")) {
      char *end;
      long n = strtol(k + 5, &end, 10);
      if (end != k + strlen(k) - 7 || n < 1 || n > ncalls) {
        add(errs, sizeof errs, "%s: no such call line", k);
        continue;
      }
      const char *got = rec->action[call_lines[n]];
      if (!json_is_string(v) || !got || strcmp(got, json_string_value(v)))
        add(errs, sizeof errs, "call %ld: action %s, expected %s", n, got ? got : "none",
            json_is_string(v) ? json_string_value(v) : "?");
    } else {
      add(errs, sizeof errs, "unknown expectation key \"%s\"", k);
    }
  }

report:
  if (errs[0]) printf("FAIL %s: %s\n", name, errs);
  else printf("ok   %s\n", name);
  fflush(stdout);
  json_decref(expect);
  free(rec ? rec->terminal_reason : NULL);
  free(rec);
  free(call_lines);
  free(text);
  return errs[0] ? 1 : 0;
}

static void t_fixtures(void **state) {
  (void)state;
  const char *data = getenv("LG_TEST_DATA");
  if (!data || !*data) fail_msg("LG_TEST_DATA is not set");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/fixtures", data);
  DIR *dp = opendir(dir);
  if (!dp) fail_msg("cannot open %s", dir);
  char *names[1024];
  int n = 0;
  struct dirent *de;
  while ((de = readdir(dp)) && n < 1024) {
    size_t l = strlen(de->d_name);
    if (l > 6 && !strcmp(de->d_name + l - 6, ".jsonl")) names[n++] = strdup(de->d_name);
  }
  closedir(dp);
  if (n == 0) fail_msg("no *.jsonl fixtures in %s", dir);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  int failed = 0;
  for (int i = 0; i < n; i++) {
    failed += check_fixture(dir, names[i]);
    free(names[i]);
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  if (failed) fail_msg("%d of %d fixtures failed", failed, n);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(t_fixtures)};
  return cmocka_run_group_tests_name("fixtures", tests, NULL, NULL);
}
