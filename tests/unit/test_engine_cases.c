/*
 * test_engine_cases.c — the engine's behaviour cases, as data.
 *
 * Every folder of the case directory ($LG_TEST_DATA/engine, or the
 * directory given on the command line) is one case and one cmocka test:
 *
 *   trace.jsonl     a trace-v1 file; a first `# ...` line says what it shows
 *   policy.json     optional: overrides the trace's policy (replay --policy)
 *   expected.jsonl  the expected `loopguard replay --json` output: one object
 *                   per acted event, then the summary
 *   README          optional: what the case shows, instead of the # line
 *
 * The trace is replayed with lg_replay_buffer() and each event is written
 * out by lg_replay_event_json() and lg_replay_summary_json(), the printers
 * of cli/cmd_replay.c's --json too. Comparison: the i-th expected object is matched with the i-th
 * actual one; every field present in the expected object must be JSON-equal
 * in the actual one (numbers by value, so 1 and 1.0 are equal); fields the
 * expected object leaves out are not compared; the numbers of objects must
 * be equal. Blank lines and `#` lines of expected.jsonl are ignored.
 *
 * Cases are found at run time (a new folder is a new test, no code change);
 * a folder without trace.jsonl or expected.jsonl fails, and so does a
 * directory with no case: a wrong path must not pass.
 *
 *   test_engine_cases [DIR]                run every case of DIR
 *   test_engine_cases [DIR] --print CASE   print CASE's actual output (for
 *                                          writing a new case; it is never
 *                                          written to expected.jsonl here)
 *
 * CASE is a folder name under DIR or a path to a case folder.
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
#include <sys/stat.h>

#include "loopguard.h"

#define MAX_CASES 1024

/* One case folder. */
typedef struct ecase {
  char name[256]; /* the folder's name */
  char dir[4096]; /* its path */
} ecase_t;

/* A growing text buffer for the actual output. */
typedef struct sbuf {
  char *s;
  size_t len, cap;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      fprintf(stderr, "out of memory\n");
      abort();
    }
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}
static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }
/* ---- the printer: `loopguard replay --json`'s, the library's one ---- */

static int on_event(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *s) {
  sbuf_t *b = ud;
  char *j = NULL;
  if (ev) {
    if (lg_replay_event_json(ev, &j)) return LG_ENOMEM;
    if (!j) return 0; /* an event with no record */
  } else if (!(j = lg_replay_summary_json(s))) {
    return LG_ENOMEM;
  }
  sb_str(b, j);
  sb_str(b, "\n");
  lg_free(j);
  return 0;
}

/* ---- files ---- */

/* The whole file, NUL-terminated (new; free), or NULL when it cannot be
 * read. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  sbuf_t b = {0};
  char tmp[8192];
  size_t k;
  while ((k = fread(tmp, 1, sizeof tmp, f)) > 0) sb_put(&b, tmp, k);
  fclose(f);
  if (!b.s) sb_put(&b, "", 0);
  *len = b.len;
  return b.s;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Parses JSON Lines text into an array of objects (new reference), skipping
 * blank and `#` lines; NULL with *bad_line set on a line that is not a JSON
 * object. */
static json_t *parse_lines(const char *text, long *bad_line, char *why, size_t why_size) {
  json_t *arr = json_array();
  long line = 0;
  for (const char *p = text; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t l = nl ? (size_t)(nl - p) : strlen(p);
    line++;
    size_t a = 0;
    while (a < l && (p[a] == ' ' || p[a] == '\t' || p[a] == '\r')) a++;
    if (a < l && p[a] != '#') {
      json_error_t je;
      json_t *o = json_loadb(p, l, 0, &je);
      if (!json_is_object(o)) {
        snprintf(why, why_size, "%s", o ? "not a JSON object" : je.text);
        json_decref(o);
        json_decref(arr);
        *bad_line = line;
        return NULL;
      }
      json_array_append_new(arr, o);
    }
    p = nl ? nl + 1 : NULL;
  }
  return arr;
}

/* Replays the case; returns its output as text (new; free), or NULL with
 * the reason in msg. */
static char *run_case(const ecase_t *c, char *msg, size_t msg_size) {
  char path[4200];
  snprintf(path, sizeof path, "%s/trace.jsonl", c->dir);
  size_t len;
  char *trace = slurp(path, &len);
  if (!trace) {
    if ((size_t)snprintf(msg, msg_size, "cannot read %s", path) >= msg_size) msg[msg_size - 1] = 0;
    return NULL;
  }
  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -1;
  lg_policy_t *policy = NULL;
  snprintf(path, sizeof path, "%s/policy.json", c->dir);
  if (is_file(path) && !(policy = lg_policy_load_file(path, &err))) {
    char buf[1024];
    snprintf(msg, msg_size, "policy.json: %s", lg_error_format(&err, buf, sizeof buf));
    free(trace);
    return NULL;
  }
  /* The name the summary shows: the case, not where the checkout is. */
  char name[300];
  snprintf(name, sizeof name, "%s/trace.jsonl", c->name);
  sbuf_t out = {0};
  memset(&err, 0, sizeof err);
  err.offset = -1;
  int rc = lg_replay_buffer(name, trace, len, policy, on_event, &out, &err);
  lg_policy_free(policy);
  free(trace);
  if (rc) {
    char buf[1024];
    snprintf(msg, msg_size, "replay failed: %s: %s", lg_err_name(rc), lg_error_format(&err, buf, sizeof buf));
    free(out.s);
    return NULL;
  }
  if (!out.s) sb_put(&out, "", 0);
  return out.s;
}

/* ---- comparison ---- */

/* JSON equality, with numbers compared by value. */
static bool same(json_t *a, json_t *b) {
  if (json_is_number(a) && json_is_number(b)) {
    if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
    return json_number_value(a) == json_number_value(b);
  }
  if (json_typeof(a) != json_typeof(b)) return false;
  if (json_is_array(a)) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); i++)
      if (!same(json_array_get(a, i), json_array_get(b, i))) return false;
    return true;
  }
  if (json_is_object(a)) {
    if (json_object_size(a) != json_object_size(b)) return false;
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v) {
      json_t *w = json_object_get(b, k);
      if (!w || !same(v, w)) return false;
    }
    return true;
  }
  return json_equal(a, b);
}

static char *dump(json_t *v) {
  return v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER) : strdup("(absent)");
}

/* The case's description: README's first line, or the trace's first #
 * line; "" when none. */
static void describe(const ecase_t *c, char *out, size_t size) {
  out[0] = 0;
  char path[4200];
  size_t len;
  snprintf(path, sizeof path, "%s/README", c->dir);
  char *t = slurp(path, &len);
  const char *p = t;
  if (!t) {
    snprintf(path, sizeof path, "%s/trace.jsonl", c->dir);
    t = slurp(path, &len);
    p = t && t[0] == '#' ? t + 1 : NULL;
  }
  if (p) {
    while (*p == ' ') p++;
    size_t n = strcspn(p, "\n");
    snprintf(out, size, "%.*s", (int)n, p);
  }
  free(t);
}

static void t_case(void **state) {
  const ecase_t *c = *state;
  char msg[2048] = "";
  char path[4200];
  snprintf(path, sizeof path, "%s/expected.jsonl", c->dir);
  size_t len;
  char *etext = slurp(path, &len);
  if (!etext) fail_msg("%s: cannot read %s", c->name, path);
  long bad = 0;
  json_t *expected = parse_lines(etext, &bad, msg, sizeof msg);
  free(etext);
  if (!expected) fail_msg("%s: expected.jsonl line %ld: %s", c->name, bad, msg);
  char *atext = run_case(c, msg, sizeof msg);
  if (!atext) {
    json_decref(expected);
    fail_msg("%s: %s", c->name, msg);
  }
  json_t *actual = parse_lines(atext, &bad, msg, sizeof msg);
  if (!actual) {
    free(atext);
    json_decref(expected);
    fail_msg("%s: the printer wrote a line that is not a JSON object (%ld): %s", c->name, bad, msg);
  }
  free(atext);

  int failures = 0;
  size_t ne = json_array_size(expected), na = json_array_size(actual);
  for (size_t i = 0; i < ne && i < na; i++) {
    json_t *e = json_array_get(expected, i), *a = json_array_get(actual, i);
    const char *k;
    json_t *v;
    json_object_foreach(e, k, v) {
      json_t *got = json_object_get(a, k);
      if (got && same(v, got)) continue;
      /* The object as context, without the (long) envelope unless that
       * is the field that differs. */
      json_t *ctx = json_copy(a);
      if (strcmp(k, "envelope") && json_object_get(ctx, "envelope"))
        json_object_set_new(ctx, "envelope", json_string("..."));
      char *ws = dump(v), *gs = dump(got), *whole = dump(ctx);
      json_decref(ctx);
      print_error("%s: object %zu, field \"%s\": expected %s, got %s\n    actual object: %s\n", c->name,
                  i + 1, k, ws, gs, whole);
      free(ws);
      free(gs);
      free(whole);
      failures++;
    }
  }
  if (ne != na) {
    print_error("%s: %zu objects expected, %zu in the output\n", c->name, ne, na);
    for (size_t i = ne; i < na; i++) {
      char *s = dump(json_array_get(actual, i));
      print_error("    extra actual object %zu: %s\n", i + 1, s);
      free(s);
    }
    for (size_t i = na; i < ne; i++) {
      char *s = dump(json_array_get(expected, i));
      print_error("    missing expected object %zu: %s\n", i + 1, s);
      free(s);
    }
    failures++;
  }
  json_decref(expected);
  json_decref(actual);
  if (failures) {
    char what[512];
    describe(c, what, sizeof what);
    fail_msg("%s: %d difference(s)%s%s", c->name, failures, what[0] ? " — the case: " : "", what);
  }
}

static void t_no_cases(void **state) {
  fail_msg("no case folders in %s", (const char *)*state);
}

static int cmp_case(const void *a, const void *b) {
  return strcmp(((const ecase_t *)a)->name, ((const ecase_t *)b)->name);
}

/* The case folders of dir (every folder in it), sorted by name; returns
 * how many. */
static int find_cases(const char *dir, ecase_t *cases, int max) {
  DIR *dp = opendir(dir);
  if (!dp) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(dp)) && n < max) {
    if (de->d_name[0] == '.') continue;
    /* Every folder is a case: one whose trace.jsonl is missing or
     * misnamed fails, rather than being passed over. */
    char sub[4400];
    struct stat st;
    snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
    if (stat(sub, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    snprintf(cases[n].name, sizeof cases[n].name, "%s", de->d_name);
    if ((size_t)snprintf(cases[n].dir, sizeof cases[n].dir, "%s/%s", dir, de->d_name) >= sizeof cases[n].dir)
      continue; /* a path this long is not one of ours */
    n++;
  }
  closedir(dp);
  qsort(cases, (size_t)n, sizeof *cases, cmp_case);
  return n;
}

static int print_case(const char *dir, const char *which) {
  ecase_t c;
  memset(&c, 0, sizeof c);
  struct stat st;
  if (strchr(which, '/') && stat(which, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(c.dir, sizeof c.dir, "%s", which);
  } else {
    if ((size_t)snprintf(c.dir, sizeof c.dir, "%s/%s", dir, which) >= sizeof c.dir) {
      fprintf(stderr, "test_engine_cases: path too long: %s\n", which);
      return 2;
    }
  }
  size_t l = strlen(c.dir);
  while (l > 1 && c.dir[l - 1] == '/') c.dir[--l] = 0;
  const char *base = strrchr(c.dir, '/');
  if ((size_t)snprintf(c.name, sizeof c.name, "%s", base ? base + 1 : c.dir) >= sizeof c.name) {
    fprintf(stderr, "test_engine_cases: case name too long: %s\n", c.dir);
    return 2;
  }
  char msg[2048];
  char *out = run_case(&c, msg, sizeof msg);
  if (!out) {
    fprintf(stderr, "test_engine_cases: %s: %s\n", c.name, msg);
    return 1;
  }
  fputs(out, stdout);
  free(out);
  return 0;
}

int main(int argc, char **argv) {
  const char *dir_arg = NULL, *print = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--print")) {
      if (++i >= argc) {
        fprintf(stderr, "usage: test_engine_cases [DIR] [--print CASE]\n");
        return 2;
      }
      print = argv[i];
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "usage: test_engine_cases [DIR] [--print CASE]\n");
      return 2;
    } else {
      dir_arg = argv[i];
    }
  }
  char dir[4096];
  if (dir_arg) {
    snprintf(dir, sizeof dir, "%s", dir_arg);
  } else {
    const char *data = getenv("LG_TEST_DATA");
#ifdef LG_ENGINE_CASES_DIR
    if (!data || !*data) data = LG_ENGINE_CASES_DIR;
#endif
    if (!data || !*data) {
      fprintf(stderr, "test_engine_cases: LG_TEST_DATA is not set and no DIR given\n");
      return 2;
    }
    snprintf(dir, sizeof dir, "%s/engine", data);
  }
  if (print) return print_case(dir, print);

  static ecase_t cases[MAX_CASES];
  int n = find_cases(dir, cases, MAX_CASES);
  struct CMUnitTest *tests = calloc(n ? (size_t)n : 1, sizeof *tests);
  if (!tests) return 1;
  if (n == 0) {
    tests[0].name = "no_cases";
    tests[0].test_func = t_no_cases;
    tests[0].initial_state = dir;
    n = 1;
  } else {
    for (int i = 0; i < n; i++) {
      tests[i].name = cases[i].name;
      tests[i].test_func = t_case;
      tests[i].initial_state = &cases[i];
    }
  }
  int rc = _cmocka_run_group_tests("engine_cases", tests, (size_t)n, NULL, NULL);
  free(tests);
  return rc;
}
