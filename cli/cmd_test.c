/*
 * cmd_test.c — `loopguard test [--json] [--policy FILE] DIR|TRACE...`:
 * traces as regression tests (trace-v1, "Expectations").
 *
 * Every trace given, and every *.jsonl file under a folder given (at any
 * depth, in name order; symbolic links to folders are not followed), is
 * read for an `# expect {...}` comment before its first event. A trace with one is replayed (lg_replay_buffer) and
 * each key of the expectation checked; a trace without one is skipped —
 * counted, never passed. A failure prints a diff: the key, what was
 * expected, what replay did, and where (the line of the file, the N-th
 * call). An unknown key, or a key with a value of the wrong type, fails
 * the trace: a typo in an expectation must not pass silently.
 *
 * Calls are numbered as the file has them: every line that is a JSON
 * object of type "call", acted on or not (those after a stop are not).
 *
 * The closing line is "N passed, N failed, N skipped". Exit status: 0 when
 * every expectation holds, 1 when one does not (or a trace cannot be read,
 * or nothing was found to test), 2 on bad usage.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *test_usage =
    "usage: loopguard test [--json] [--policy FILE] DIR|TRACE...\n"
    "\n"
    "Replays every trace that has an '# expect {...}' line (files given, and\n"
    "*.jsonl files in folders, recursively) and checks that the guard still does\n"
    "what the line says; prints a diff for each one that no longer holds.\n"
    "'loopguard runs export' writes such files from the runs a store stopped.\n"
    "\n"
    "  --json          one JSON object per trace ({\"trace\",\"status\":\"pass\"|\n"
    "                  \"fail\"|\"skip\",\"failures\":[...]}) and a summary object\n"
    "  --policy FILE   replay with this policy instead of the traces' own\n"
    "  -q, --quiet     print only failures and the closing line\n"
    "  --help          this text\n"
    "\n"
    "Keys (trace-v1): terminal_reason, terminal_reason_one_of, executed_calls,\n"
    "blocked_calls, replayed_calls, max_executed_calls, stopped_at_call,\n"
    "call_N_action. An unknown key is an error, not a pass. Traces without an\n"
    "'# expect' line are skipped (counted apart, not passed).\n"
    "\n"
    "Exit status: 0 every expectation holds, 1 one does not (or a trace could not\n"
    "be read, or no trace was found), 2 bad usage.\n";

/* ---- the files ---- */

typedef struct paths {
  char **v;
  size_t n, cap;
} paths_t;

static int push(paths_t *p, const char *s) {
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 32;
    char **v = realloc(p->v, cap * sizeof *v);
    if (!v) return -1;
    p->v = v;
    p->cap = cap;
  }
  return (p->v[p->n] = strdup(s)) ? (int)p->n++ * 0 : -1;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds the *.jsonl files under dir, sorted per folder; -1 after a message.
 * A symbolic link to a file is read as the file; a link to a folder is not
 * followed: one to `.` or to a parent counted its traces again at every
 * level, and two such links made the walk exponential. */
static int walk(paths_t *out, const char *dir, int depth) {
  if (depth > 32) return 0;
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "loopguard: %s: %s\n", dir, strerror(errno));
    return -1;
  }
  paths_t here = {0};
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue; /* ., .., hidden files and export's temporaries */
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path) continue;
    if (push(&here, path)) rc = -1;
  }
  closedir(d);
  if (here.n) qsort(here.v, here.n, sizeof *here.v, cmp_str);
  for (size_t i = 0; i < here.n && !rc; i++) {
    struct stat st;
    if (lstat(here.v[i], &st)) continue;
    int link = S_ISLNK(st.st_mode);
    if (link && stat(here.v[i], &st)) continue; /* a link to nothing */
    size_t l = strlen(here.v[i]);
    if (S_ISDIR(st.st_mode) && !link) rc = walk(out, here.v[i], depth + 1);
    else if (S_ISREG(st.st_mode) && l > 6 && !strcmp(here.v[i] + l - 6, ".jsonl"))
      rc = push(out, here.v[i]);
  }
  for (size_t i = 0; i < here.n; i++) free(here.v[i]);
  free(here.v);
  return rc;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 8192, n = 0;
  char *b = malloc(cap);
  while (b) {
    if (n + 1 >= cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) {
        free(b);
        b = NULL;
        break;
      }
      b = nb;
    }
    size_t k = fread(b + n, 1, cap - n - 1, f);
    if (!k) break;
    n += k;
  }
  int bad = ferror(f);
  fclose(f);
  if (!b || bad) {
    free(b);
    return NULL;
  }
  b[n] = 0;
  *len = n;
  return b;
}

/* ---- one trace ---- */

/* What the file holds and what replay did, line by line. */
typedef struct check {
  long nlines;
  long *call_line;     /* [1..ncalls]: the line of the N-th call event */
  long ncalls;
  const char **action; /* [1..nlines]: the action of the line, NULL: none */
  bool have_sum;
  char *terminal_reason; /* NULL: no stop */
  long stopped_at_line;
  int64_t executed, blocked, replayed;
  /* the failures */
  json_t *failures;    /* array of {key, message, expected, got, line?, call?} */
} check_t;

static int on_event(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  check_t *c = ud;
  if (ev) {
    if (ev->acted && ev->line > 0 && ev->line <= c->nlines)
      c->action[ev->line] = lg_action_name(ev->decision.action);
    return 0;
  }
  c->have_sum = true;
  free(c->terminal_reason);
  c->terminal_reason = sum->terminal_reason ? strdup(sum->terminal_reason) : NULL;
  c->stopped_at_line = sum->stopped_at_line;
  c->executed = sum->executed_calls;
  c->blocked = sum->blocked_calls;
  c->replayed = sum->replayed_calls;
  return 0;
}

/* Records one failure: `key`, the expected and the actual value (stolen
 * references, may be NULL), where, and a sentence for a person. */
static void fail(check_t *c, const char *key, json_t *expected, json_t *got, long line, long call,
                 const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void fail(check_t *c, const char *key, json_t *expected, json_t *got, long line, long call,
                 const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_pack("{s:s, s:s}", "key", key ? key : "", "message", msg);
  if (!o) return;
  json_object_set_new(o, "expected", expected ? expected : json_null());
  json_object_set_new(o, "got", got ? got : json_null());
  if (line > 0) json_object_set_new(o, "line", json_integer(line));
  if (call > 0) json_object_set_new(o, "call", json_integer(call));
  json_array_append_new(c->failures, o);
}

/* The call number of a line (0: not a call line). */
static long call_of_line(const check_t *c, long line) {
  for (long n = 1; n <= c->ncalls; n++)
    if (c->call_line[n] == line) return n;
  return 0;
}

/* "the stop at line 12 (call 7)" / "no stop" into buf. */
static const char *where_stop(const check_t *c, char *buf, size_t size) {
  if (!c->terminal_reason) return snprintf(buf, size, "no stop"), buf;
  long n = call_of_line(c, c->stopped_at_line);
  if (n) snprintf(buf, size, "%s at line %ld (call %ld)", c->terminal_reason, c->stopped_at_line, n);
  else snprintf(buf, size, "%s at line %ld (not a call)", c->terminal_reason, c->stopped_at_line);
  return buf;
}

static json_t *reason_json(const char *r) { return r ? json_string(r) : json_null(); }

static void check_count(check_t *c, const char *key, json_t *v, int64_t got, int at_most) {
  if (!json_is_integer(v)) {
    fail(c, key, json_deep_copy(v), NULL, 0, 0, "%s: the expectation is not an integer", key);
    return;
  }
  int64_t want = (int64_t)json_integer_value(v);
  if (at_most ? got > want : got != want)
    fail(c, key, json_integer(want), json_integer(got), 0, 0, "%s: expected %s%lld, got %lld", key,
         at_most ? "at most " : "", (long long)want, (long long)got);
}

/* Checks one key of the expectation against the replay. */
static void check_key(check_t *c, const char *k, json_t *v) {
  char where[256];
  const char *tr = c->terminal_reason;
  if (!strcmp(k, "terminal_reason")) {
    if (!json_is_null(v) && !json_is_string(v)) {
      fail(c, k, json_deep_copy(v), NULL, 0, 0, "terminal_reason: the expectation is not a string or null");
      return;
    }
    const char *want = json_string_value(v);
    if (want ? !tr || strcmp(tr, want) : tr != NULL)
      fail(c, k, json_deep_copy(v), reason_json(tr), tr ? c->stopped_at_line : 0,
           tr ? call_of_line(c, c->stopped_at_line) : 0, "terminal_reason: expected %s, got %s",
           want ? want : "no stop (null)", where_stop(c, where, sizeof where));
  } else if (!strcmp(k, "terminal_reason_one_of")) {
    if (!json_is_array(v)) {
      fail(c, k, json_deep_copy(v), NULL, 0, 0, "terminal_reason_one_of: the expectation is not a list");
      return;
    }
    size_t i;
    json_t *e;
    bool found = false;
    json_array_foreach(v, i, e) {
      if (!json_is_string(e) && !json_is_null(e)) {
        fail(c, k, json_deep_copy(v), NULL, 0, 0, "terminal_reason_one_of: item %zu is not a string or null", i);
        return;
      }
      if (json_is_null(e) ? !tr : tr && !strcmp(tr, json_string_value(e))) found = true;
    }
    if (!found) {
      char *list = json_dumps(v, JSON_COMPACT);
      fail(c, k, json_deep_copy(v), reason_json(tr), tr ? c->stopped_at_line : 0, 0,
           "terminal_reason_one_of: expected one of %s, got %s", list ? list : "?",
           where_stop(c, where, sizeof where));
      free(list);
    }
  } else if (!strcmp(k, "executed_calls")) {
    check_count(c, k, v, c->executed, 0);
  } else if (!strcmp(k, "blocked_calls")) {
    check_count(c, k, v, c->blocked, 0);
  } else if (!strcmp(k, "replayed_calls")) {
    check_count(c, k, v, c->replayed, 0);
  } else if (!strcmp(k, "max_executed_calls")) {
    check_count(c, k, v, c->executed, 1);
  } else if (!strcmp(k, "stopped_at_call")) {
    long n = json_is_integer(v) ? (long)json_integer_value(v) : 0;
    if (!json_is_integer(v) || n < 1) {
      fail(c, k, json_deep_copy(v), NULL, 0, 0, "stopped_at_call: the expectation is not a positive integer");
      return;
    }
    if (n > c->ncalls) {
      fail(c, k, json_integer(n), NULL, 0, n, "stopped_at_call: the trace has no call %ld (%ld calls)", n,
           c->ncalls);
      return;
    }
    long want_line = c->call_line[n];
    if (!tr || c->stopped_at_line != want_line) {
      long got = tr ? call_of_line(c, c->stopped_at_line) : 0;
      fail(c, k, json_integer(n), got ? json_integer(got) : json_null(), tr ? c->stopped_at_line : 0, got,
           "stopped_at_call: expected the stop at call %ld (line %ld), got %s", n, want_line,
           where_stop(c, where, sizeof where));
    }
  } else if (!strncmp(k, "call_", 5) && strlen(k) > 12 && !strcmp(k + strlen(k) - 7, "_action")) {
    char *end;
    long n = strtol(k + 5, &end, 10);
    if (end != k + strlen(k) - 7 || n < 1 || k[5] < '1' || k[5] > '9') {
      fail(c, k, json_deep_copy(v), NULL, 0, 0, "%s: unknown expectation key", k);
      return;
    }
    if (!json_is_string(v)) {
      fail(c, k, json_deep_copy(v), NULL, 0, n, "%s: the expectation is not a string", k);
      return;
    }
    if (n > c->ncalls) {
      fail(c, k, json_deep_copy(v), NULL, 0, n, "%s: the trace has no call %ld (%ld calls)", k, n, c->ncalls);
      return;
    }
    long line = c->call_line[n];
    const char *got = c->action[line];
    if (!got || strcmp(got, json_string_value(v)))
      fail(c, k, json_deep_copy(v), got ? json_string(got) : json_null(), line, n,
           "call %ld (line %ld): expected %s, got %s", n, line, json_string_value(v),
           got ? got : "no decision (after the stop)");
  } else {
    fail(c, k, json_deep_copy(v), NULL, 0, 0,
         "unknown expectation key \"%s\" (an unknown key is an error, not a pass)", k);
  }
}

enum { T_PASS, T_FAIL, T_SKIP };

/* Tests one trace file: T_PASS, T_FAIL (failures in c) or T_SKIP. */
static int test_one(const char *path, lg_policy_t *policy, check_t *c) {
  size_t len = 0;
  char *text = slurp(path, &len);
  if (!text) {
    fail(c, NULL, NULL, NULL, 0, 0, "cannot read the file: %s", strerror(errno));
    return T_FAIL;
  }
  /* The lines: the expectation before the first event, and the calls. */
  long nlines = 1;
  for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
  c->nlines = nlines;
  c->call_line = calloc((size_t)nlines + 1, sizeof *c->call_line);
  c->action = calloc((size_t)nlines + 1, sizeof *c->action);
  json_t *expect = NULL;
  long expect_line = 0;
  int status = T_FAIL;
  if (!c->call_line || !c->action) {
    fail(c, NULL, NULL, NULL, 0, 0, "out of memory");
    goto out;
  }
  bool seen_event = false;
  long line = 0;
  for (size_t i = 0; i < len;) {
    const char *p = text + i, *nl = memchr(p, '\n', len - i);
    size_t n = nl ? (size_t)(nl - p) : len - i;
    i += n + 1;
    line++;
    size_t a = 0;
    while (a < n && (p[a] == ' ' || p[a] == '\t' || p[a] == '\r')) a++;
    if (a == n) continue;
    if (p[a] == '#') {
      if (seen_event || n - a < 8 || memcmp(p + a, "# expect", 8) ||
          (n - a > 8 && p[a + 8] != ' ' && p[a + 8] != '\t' && p[a + 8] != '{'))
        continue;
      if (expect) {
        fail(c, NULL, NULL, NULL, line, 0, "a second # expect line (the first is line %ld)", expect_line);
        goto out;
      }
      json_error_t je;
      expect = json_loadb(p + a + 8, n - a - 8, JSON_REJECT_DUPLICATES, &je);
      expect_line = line;
      if (!json_is_object(expect)) {
        fail(c, NULL, NULL, NULL, line, 0, "the # expect line is not a JSON object%s%s",
             expect ? "" : ": ", expect ? "" : je.text);
        goto out;
      }
      continue;
    }
    seen_event = true;
    if (p[a] == '{') {
      json_t *o = json_loadb(p + a, n - a, 0, NULL);
      const char *t = json_string_value(json_object_get(o, "type"));
      if (t && !strcmp(t, "call")) c->call_line[++c->ncalls] = line;
      json_decref(o);
    }
  }
  if (!expect) {
    status = T_SKIP;
    goto out;
  }
  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -1;
  int rc = lg_replay_buffer(path, text, len, policy, on_event, c, &err);
  if (rc || !c->have_sum) {
    char buf[1024];
    fail(c, NULL, NULL, NULL, err.line, 0, "the trace does not replay: %s",
         rc ? lg_error_format(&err, buf, sizeof buf) : "no summary");
    goto out;
  }
  const char *k;
  json_t *v;
  json_object_foreach(expect, k, v) check_key(c, k, v);
  status = json_array_size(c->failures) ? T_FAIL : T_PASS;
out:
  json_decref(expect);
  free(text);
  return status;
}

int cmd_test(int argc, char **argv) {
  const char *json = NULL, *policy_path = NULL, *quiet = NULL, *q = NULL;
  cli_flag_t flags[] = {{"--json", 0, &json},   {"--policy", 1, &policy_path},
                        {"--quiet", 0, &quiet}, {"-q", 0, &q},
                        {NULL, 0, NULL}};
  const char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) return 1;
  int npos, rc = cli_parse(argc, argv, flags, pos, argc, NULL, &npos, test_usage);
  if (rc >= 0) {
    free(pos);
    return rc;
  }
  if (!npos) {
    free(pos);
    return cli_usage(test_usage, "test needs a folder or a trace");
  }
  if (q) quiet = q;
  paths_t files = {0};
  int status = 0;
  for (int i = 0; i < npos; i++) {
    struct stat st;
    if (stat(pos[i], &st)) {
      fprintf(stderr, "loopguard: %s: %s\n", pos[i], strerror(errno));
      status = 1;
    } else if (S_ISDIR(st.st_mode)) {
      if (walk(&files, pos[i], 0)) status = 1;
    } else if (push(&files, pos[i])) {
      status = 1;
    }
  }
  free(pos);
  lg_policy_t *policy = NULL;
  lg_error_t err = {0};
  if (policy_path && !(policy = lg_policy_load_file(policy_path, &err))) {
    cli_error(&err);
    status = 1;
    goto done;
  }
  if (!files.n && !status) {
    fputs("loopguard: no trace found to test (*.jsonl files)\n", stderr);
    status = 1;
  }
  int color = !json && cli_color(stdout);
  long passed = 0, failed = 0, skipped = 0;
  for (size_t i = 0; i < files.n; i++) {
    check_t c;
    memset(&c, 0, sizeof c);
    c.failures = json_array();
    int r = c.failures ? test_one(files.v[i], policy, &c) : T_FAIL;
    if (r == T_PASS) passed++;
    else if (r == T_FAIL) failed++;
    else skipped++;
    if (json) {
      json_t *o = json_pack("{s:s, s:s, s:O}", "trace", files.v[i], "status",
                            r == T_PASS ? "pass" : r == T_FAIL ? "fail" : "skip", "failures",
                            c.failures ? c.failures : json_array());
      if (o && c.have_sum) {
        json_object_set_new(o, "terminal_reason", reason_json(c.terminal_reason));
        json_object_set_new(o, "stopped_at_line",
                            c.terminal_reason ? json_integer(c.stopped_at_line) : json_null());
      }
      char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
      if (s) puts(s);
      free(s);
      json_decref(o);
    } else if (r == T_FAIL) {
      printf("%sFAIL%s %s\n", color ? "\033[1;31m" : "", color ? "\033[0m" : "", files.v[i]);
      size_t k;
      json_t *f;
      json_array_foreach(c.failures, k, f) printf("  - %s\n", json_string_value(json_object_get(f, "message")));
    } else if (!quiet) {
      printf("%s %s%s\n", r == T_PASS ? (color ? "\033[32mok\033[0m  " : "ok  ") : "skip", files.v[i],
             r == T_SKIP ? " (no # expect line)" : "");
    }
    json_decref(c.failures);
    free(c.terminal_reason);
    free(c.call_line);
    free(c.action);
  }
  if (json)
    printf("{\"type\":\"summary\",\"passed\":%ld,\"failed\":%ld,\"skipped\":%ld}\n", passed, failed, skipped);
  else
    printf("%ld passed, %ld failed, %ld skipped\n", passed, failed, skipped);
  if (failed) status = 1;
done:
  for (size_t i = 0; i < files.n; i++) free(files.v[i]);
  free(files.v);
  lg_policy_free(policy);
  return status;
}
