/*
 * cmd_export.c — `loopguard runs export [--reason R] [--since T] [-o DIR]
 * [--store URL]`: the runs the guard stopped, one regression test each.
 *
 * Every stopped run of the store (newest first, filtered by terminal
 * reason and by the time it last changed — its stop) becomes
 * DIR/<run_id>.jsonl: its trace as the store kept it
 * (lg_store_run_trace), behind an `# expect {...}` line computed by
 * replaying that very trace (lg_expect_trace), so the file says what
 * replay does, not what the store believed. `loopguard test DIR` then
 * checks them all, in a team's CI.
 *
 * File names are the run id with every byte outside [A-Za-z0-9._-]
 * replaced by '_' (and a short hash of the id added when anything was
 * replaced, so two ids never share a file); files are written to a
 * temporary name and renamed, so a reader never sees half a test.
 * Progress goes to stderr: a running count on a terminal, a line per
 * 100 runs otherwise, and a closing line.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *export_usage =
    "usage: loopguard runs export [--reason R] [--since T] [-o DIR] [--store URL]\n"
    "\n"
    "Writes every run the guard stopped as a regression test: DIR/<run_id>.jsonl,\n"
    "the run's trace-v1 file behind an '# expect {...}' line that says how replay\n"
    "stops it (terminal_reason, stopped_at_call, executed_calls, blocked_calls,\n"
    "...). Commit the folder and run 'loopguard test DIR' in CI: a change to the\n"
    "guard that would let an old incident through fails the build.\n"
    "\n"
    "  --reason R    only runs stopped for this terminal reason\n"
    "  --since T     only runs stopped at or after T: RFC 3339\n"
    "                (2026-12-01T00:00:00Z) or a duration back from now (24h, 7d,\n"
    "                90m, 1h30m; units ms s m h d w)\n"
    "  -o DIR        the folder (made when missing; default: the current one)\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 every run exported (also when there were none), 1 an error\n"
    "(the store, a file; the other runs are still exported), 2 bad usage.\n";

/* Days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  int64_t era = (y >= 0 ? y : y - 399) / 400;
  unsigned yoe = (unsigned)(y - era * 400);
  unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + (int64_t)doe - 719468;
}

/* Parses RFC 3339 ("2026-12-01T07:00:00Z", fraction and offset optional;
 * a date alone is its midnight UTC) into epoch ms; -1 when malformed. */
static int64_t parse_rfc3339(const char *s) {
  int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
  if (sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10) return -1;
  const char *p = s + n;
  int64_t frac_ms = 0, off_min = 0;
  if (*p) {
    if (*p != 'T' && *p != 't' && *p != ' ') return -1;
    p++;
    if (sscanf(p, "%2d:%2d:%2d%n", &h, &mi, &sec, &n) != 3 || n != 8) return -1;
    p += n;
    if (*p == '.') {
      int digits = 0;
      for (p++; *p >= '0' && *p <= '9'; p++, digits++)
        if (digits < 3) frac_ms = frac_ms * 10 + (*p - '0');
      if (!digits) return -1;
      for (; digits < 3; digits++) frac_ms *= 10;
    }
    if (*p == 'Z' || *p == 'z') p++;
    else if (*p == '+' || *p == '-') {
      int oh, om;
      if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &n) != 2 || n != 5) return -1;
      off_min = (oh * 60 + om) * (*p == '+' ? 1 : -1);
      p += 6;
    } else return -1;
    if (*p) return -1;
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return -1;
  int64_t days = days_from_civil(y, (unsigned)mo, (unsigned)d);
  return ((days * 86400 + h * 3600 + mi * 60 + sec) - off_min * 60) * 1000 + frac_ms;
}

/* A file name for a run id: safe bytes kept, others '_', and an FNV-1a
 * hash of the id when anything changed (or the name would hide). */
static void safe_name(const char *id, char *out, size_t size) {
  size_t n = 0;
  int changed = 0;
  for (const char *p = id; *p && n + 16 < size; p++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || (c == '.' && n > 0);
    out[n++] = ok ? c : '_';
    changed |= !ok;
  }
  if (strlen(id) > n) changed = 1;
  out[n] = 0;
  if (changed || !n) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 16777619u;
    snprintf(out + n, size - n, "%s%08x", n ? "-" : "run-", h);
  }
}

static int mkdir_p(const char *dir) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0777) && errno != EEXIST) return -1;
      *p = '/';
    }
  if (mkdir(buf, 0777) && errno != EEXIST) return -1;
  return 0;
}

typedef struct ids {
  char **v;
  size_t n, cap;
  int64_t since_ms; /* runs last changed before this are left out; INT64_MIN: none */
  int oom;
} ids_t;

static int collect(void *ud, const lg_run_record_t *r) {
  ids_t *ids = ud;
  if (r->updated_ms < ids->since_ms) return 0;
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? ids->cap * 2 : 64;
    char **v = realloc(ids->v, cap * sizeof *v);
    if (!v) return ids->oom = 1, LG_ENOMEM;
    ids->v = v;
    ids->cap = cap;
  }
  if (!(ids->v[ids->n] = strdup(r->run_id))) return ids->oom = 1, LG_ENOMEM;
  ids->n++;
  return 0;
}

/* The terminal reason replay found, from the # expect line (new string or NULL). */
static char *expected_reason(const char *text) {
  const char *nl = strchr(text, '\n');
  json_t *o = json_loadb(text + 9, nl ? (size_t)(nl - text - 9) : strlen(text + 9), 0, NULL);
  const char *r = json_string_value(json_object_get(o, "terminal_reason"));
  char *out = r ? strdup(r) : NULL;
  json_decref(o);
  return out;
}

static int write_file(const char *dir, const char *name, const char *text, size_t len,
                      char *path, size_t psize) {
  char tmp[4200];
  snprintf(path, psize, "%s/%s.jsonl", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.jsonl.tmp%ld", dir, name, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  int bad = fwrite(text, 1, len, f) != len;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
  }
  return 0;
}

int cmd_runs_export(int argc, char **argv) {
  const char *store = NULL, *reason = NULL, *since = NULL, *dir = NULL;
  cli_flag_t flags[] = {{"--reason", 1, &reason}, {"--since", 1, &since}, {"-o", 1, &dir},
                        {"--store", 1, &store},   {NULL, 0, NULL}};
  int npos, rc = cli_parse(argc, argv, flags, NULL, 0, NULL, &npos, export_usage);
  if (rc >= 0) return rc;
  ids_t ids = {NULL, 0, 0, INT64_MIN, 0};
  if (since) {
    int64_t d = cli_parse_duration(since);
    int64_t t = d >= 0 ? cli_now_ms() - d : parse_rfc3339(since);
    if (d < 0 && t < 0)
      return cli_usage(export_usage, "--since wants RFC 3339 or a duration like 24h, not '%s'", since);
    ids.since_ms = t;
  }
  if (reason && !*reason) reason = NULL;
  if (!dir || !*dir) dir = ".";
  lg_store_t *s = cli_open_store_existing(store); /* read-only: never creates one */
  if (!s) return 1; /* before the folder: a failed export leaves nothing behind */
  if (mkdir_p(dir)) {
    fprintf(stderr, "loopguard: %s: %s\n", dir, strerror(errno));
    lg_store_close(s);
    return 1;
  }
  lg_error_t err = {0};
  lg_run_filter_t f = {.status = "stopped", .reason = reason};
  rc = lg_store_run_list(s, &f, collect, &ids, &err);
  if (rc) {
    if (ids.oom) fputs("loopguard: out of memory listing runs\n", stderr);
    else cli_error(&err);
    goto out;
  }
  int tty = isatty(2);
  size_t done = 0, failed = 0, differ = 0;
  for (size_t i = 0; i < ids.n; i++) {
    const char *id = ids.v[i];
    char *trace = NULL, *test = NULL;
    size_t len = 0, tlen = 0;
    memset(&err, 0, sizeof err);
    err.offset = -1;
    int r = lg_store_run_trace(s, id, &trace, &len, &err);
    if (!r) r = lg_expect_trace(id, trace, len, NULL, &test, &tlen, &err);
    char name[256], path[4200];
    safe_name(id, name, sizeof name);
    if (r) {
      fprintf(stderr, "loopguard: run %s: ", id);
      cli_error(&err);
      failed++;
    } else if (write_file(dir, name, test, tlen, path, sizeof path)) {
      fprintf(stderr, "loopguard: %s/%s.jsonl: %s\n", dir, name, strerror(errno));
      failed++;
    } else {
      done++;
      /* Replay is the judge; say so when the store saw another ending
       * (a run created before the store kept traces, say). */
      lg_run_record_t rec = {0};
      char *got = expected_reason(test);
      if (!lg_store_run_get(s, id, &rec, NULL) && rec.terminal_reason &&
          (!got || strcmp(got, rec.terminal_reason))) {
        fprintf(stderr,
                "loopguard: warning: %s: the store says %s, replaying its trace gives %s; the "
                "test expects what replay does\n",
                path, rec.terminal_reason, got ? got : "no stop");
        differ++;
      }
      free(got);
      lg_run_record_clear(&rec);
    }
    lg_free(trace);
    lg_free(test);
    if (tty && ids.n > 1) fprintf(stderr, "\rexporting: %zu/%zu", i + 1, ids.n);
    else if (!tty && (i + 1) % 100 == 0) fprintf(stderr, "exporting: %zu/%zu\n", i + 1, ids.n);
  }
  if (tty && ids.n > 1) fputc('\n', stderr);
  fprintf(stderr, "exported %zu stopped run%s to %s", done, done == 1 ? "" : "s", dir);
  if (failed) fprintf(stderr, ", %zu failed", failed);
  if (differ) fprintf(stderr, ", %zu replay differently from the store", differ);
  fputc('\n', stderr);
  rc = failed ? 1 : 0;
out:
  for (size_t i = 0; i < ids.n; i++) free(ids.v[i]);
  free(ids.v);
  lg_store_close(s);
  return rc ? 1 : 0;
}
