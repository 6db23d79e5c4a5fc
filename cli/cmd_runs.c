/*
 * cmd_runs.c — `loopguard runs list|show|trace|cancel`: the runs kept in a
 * store, for operators.
 *
 * `list` prints runs newest first (one JSON object per line with --json);
 * `show` prints one run's state — status, terminal reason, counters,
 * whether a cancel is pending for it — and its terminal envelope, rebuilt
 * from the saved engine state (or, when that cannot be read back, the
 * envelope stored with it); `trace` writes its trace-v1 file, for
 * `loopguard replay` (lg_store_run_trace); `cancel` is the kill switch: a durable deny
 * rule that makes every worker's next decision for the run (or for every
 * run of a group, with --group) a stop with the operator's reason, before
 * any side effect — also for a run that is not in the store yet; `purge`
 * deletes the runs not written to for a while, with what is theirs alone
 * (lg_store_purge_runs): a store that every gateway conversation adds a
 * run to does not grow for ever.
 *
 * The store is --store URL, else $LOOPGUARD_STORE, else sqlite:loopguard.db.
 * Exit status: 0 success, 1 an error (a message naming the store), 2 bad
 * usage.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *runs_usage =
    "usage: loopguard runs list [--status active|stopped] [--limit N] [--group GROUP]\n"
    "                           [--reason REASON] [--store URL] [--json]\n"
    "       loopguard runs show RUN_ID [--store URL] [--json]\n"
    "       loopguard runs trace RUN_ID [--store URL] [-o FILE]\n"
    "       loopguard runs export [--reason R] [--since T] [-o DIR] [--store URL]\n"
    "       loopguard runs cancel RUN_ID [--reason TEXT] [--store URL] [--json]\n"
    "       loopguard runs cancel --group GROUP [--reason TEXT] [--store URL] [--json]\n"
    "       loopguard runs resume RUN_ID [--progress-version N] [--note TEXT] [--store URL] [--json]\n"
    "       loopguard runs purge --older-than DURATION [--store URL] [--json]\n"
    "\n"
    "Runs kept in a store, for operators. Run 'loopguard runs SUBCOMMAND --help'\n"
    "for each one's flags.\n"
    "\n"
    "A store is a URL: memory:, sqlite:PATH or postgres:CONNINFO; the default is\n"
    "$LOOPGUARD_STORE, else sqlite:loopguard.db in the current folder; read-only\n"
    "subcommands never create it.\n"
    "\n"
    "Exit status: 0 success, 1 an error (the message names the store), 2 bad usage.\n";

static const char *list_usage =
    "usage: loopguard runs list [--status active|stopped] [--limit N] [--group GROUP]\n"
    "                           [--reason REASON] [--store URL] [--json]\n"
    "\n"
    "Lists the runs in the store, newest first.\n"
    "\n"
    "  --status S      only active or only stopped runs\n"
    "  --limit N       at most N runs\n"
    "  --group GROUP   only runs of this group\n"
    "  --reason R      only runs stopped for this terminal reason\n"
    "  --store URL     the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json          one JSON object per line: run_id, group, status,\n"
    "                  terminal_reason, created_at, updated_at, envelope\n"
    "  --help          this text\n"
    "\n"
    "Exit status: 0 listed (also when there are none), 1 an error, 2 bad usage.\n";

static const char *show_usage =
    "usage: loopguard runs show RUN_ID [--store URL] [--json]\n"
    "\n"
    "Shows a run: its status, terminal reason, counters, a pending cancel, and\n"
    "its terminal envelope (what stopped it, the refused call, the operations\n"
    "and their keys, what the model tried, what may happen next).\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        one object: run_id, group, status, terminal_reason,\n"
    "                created_at, updated_at, counters, cancel, envelope\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 shown, 1 an error (no such run, the store unreachable),\n"
    "2 bad usage.\n";

static const char *trace_usage =
    "usage: loopguard runs trace RUN_ID [--store URL] [-o FILE]\n"
    "\n"
    "Writes the run's trace-v1 file: every event its decisions were made on, as\n"
    "the store kept them with the decisions. 'loopguard replay' on it gives the\n"
    "same decisions: this is how an incident becomes a regression test. The same\n"
    "file as GET /v1/runs/{id}/trace, without a server.\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  -o FILE       write to FILE instead of standard output\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 written, 1 an error (no such run, the store unreachable, FILE\n"
    "not writable), 2 bad usage.\n";

static const char *cancel_usage =
    "usage: loopguard runs cancel RUN_ID [--reason TEXT] [--store URL] [--json]\n"
    "       loopguard runs cancel --group GROUP [--reason TEXT] [--store URL] [--json]\n"
    "\n"
    "The kill switch. Writes a durable deny rule for the run (or for every run of\n"
    "the group, present and future): the next decision of every worker for it is\n"
    "a stop, before any side effect. A stored active run is stopped at once and\n"
    "its envelope saved. Works before the run exists in the store: its first\n"
    "decision stops. Cancelling again only updates the note.\n"
    "\n"
    "  --reason TEXT   why, in your words: kept as the envelope's operator_note\n"
    "                  (the terminal reason stays operator_cancelled_loop)\n"
    "  --group GROUP   cancel every run of GROUP instead of one run\n"
    "  --store URL     the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json          print {\"run_id\", \"reason\", \"operator_note\", \"stored\",\n"
    "                  \"envelope\"} (or {\"group\", \"reason\", \"operator_note\",\n"
    "                  \"cancelled\": [run ids]})\n"
    "  --help          this text\n"
    "\n"
    "Exit status: 0 cancelled, 1 an error, 2 bad usage.\n";

/* ---- helpers ---- */

static void fmt_time(int64_t ms, char buf[40]) {
  time_t s = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf(buf, 40, "%s UTC", day);
}

/* RFC 3339, UTC, milliseconds: the form of the library's JSON. */
static void fmt_iso(int64_t ms, char buf[40]) {
  time_t s = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, 40, "%s.%03dZ", day, (int)(ms % 1000));
}

static void put_str(FILE *f, const char *s) {
  if (!s) {
    fputs("null", f);
    return;
  }
  char *q = lg_json_quote(s, strlen(s));
  fputs(q ? q : "\"\"", f);
  lg_free(q);
}

/* Prints a JSON text indented for a person (as it is when it does not
 * parse, which a stored envelope always should). */
static void put_pretty(FILE *f, const char *json) {
  json_t *v = json_loads(json, JSON_DECODE_ANY, NULL);
  char *s = v ? json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
  fputs(s ? s : json, f);
  fputc('\n', f);
  free(s);
  json_decref(v);
}

/* ---- list ---- */

typedef struct list_ctx {
  int json;  /* one object per line */
  int n;     /* printed so far */
} list_ctx_t;

static int list_one(void *ud, const lg_run_record_t *r) {
  list_ctx_t *c = ud;
  if (c->json) {
    char *j = lg_run_record_to_json(r);
    if (!j) return LG_ENOMEM;
    puts(j);
    lg_free(j);
  } else {
    char t[40];
    if (!c->n) printf("%-24s %-8s %-26s %-12s %s\n", "RUN", "STATUS", "REASON", "GROUP",
                      "UPDATED");
    fmt_time(r->updated_ms, t);
    printf("%-24s %-8s %-26s %-12s %s\n", r->run_id, r->stopped ? "stopped" : "active",
           r->terminal_reason ? r->terminal_reason : "-", r->group ? r->group : "-", t);
  }
  c->n++;
  return 0;
}

static int do_list(int argc, char **argv) {
  const char *store = NULL, *status = NULL, *limit = NULL, *group = NULL, *reason = NULL,
             *json = NULL;
  cli_flag_t flags[] = {{"--status", 1, &status}, {"--limit", 1, &limit}, {"--group", 1, &group},
                    {"--reason", 1, &reason}, {"--store", 1, &store}, {"--json", 0, &json},
                    {NULL, 0, NULL}};
  int npos, rc = cli_parse(argc, argv, flags, NULL, 0, NULL, &npos, list_usage);
  if (rc >= 0) return rc;
  if (status && strcmp(status, "active") && strcmp(status, "stopped"))
    return cli_usage(list_usage, "--status is active or stopped, not '%s'", status);
  lg_run_filter_t f = {.status = status, .group = group, .reason = reason};
  if (limit) {
    char *end;
    errno = 0;
    long long n = strtoll(limit, &end, 10);
    if (errno || *end || end == limit || n <= 0)
      return cli_usage(list_usage, "--limit wants a positive number, not '%s'", limit);
    f.limit = (size_t)n;
  }
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  list_ctx_t c = {json != NULL, 0};
  lg_error_t err = {0};
  rc = lg_store_run_list(s, &f, list_one, &c, &err);
  if (rc) {
    cli_error(&err);
  } else if (!c.n && !json && (status || group || reason)) { /* the store may have others */
    printf("no runs in %s match", lg_store_name(s));
    if (status) printf(" --status %s", status);
    if (group) printf(" --group %s", group);
    if (reason) printf(" --reason %s", reason);
    putchar('\n');
  } else if (!c.n && !json) {
    printf("no runs in %s\n", lg_store_name(s));
  }
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- show ---- */

static void put_counters_json(const lg_counters_t *k) {
  char *j = lg_counters_to_json(k);
  fputs(j ? j : "null", stdout);
  lg_free(j);
}

static int do_show(int argc, char **argv) {
  const char *store = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"--json", 0, &json}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "runs show needs a RUN_ID", &npos, show_usage);
  if (rc >= 0) return rc;
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  lg_run_record_t rec = {0};
  lg_error_t err = {0};
  rc = lg_store_run_get(s, pos[0], &rec, &err);
  if (rc) {
    cli_error(&err);
    lg_store_close(s);
    return 1;
  }
  /* The engine's view, rebuilt from the saved state. */
  lg_run_t *run = NULL;
  lg_error_t lerr = {0};
  char *envelope = NULL;
  lg_counters_t k = {0};
  if (lg_store_run_load(s, pos[0], NULL, &run, &lerr) == 0) {
    envelope = lg_run_envelope_json(run);
    lg_run_counters(run, &k);
  } else {
    char buf[1024];
    fprintf(stderr, "loopguard: warning: showing the stored envelope: %s\n",
            lg_error_format(&lerr, buf, sizeof buf));
  }
  const char *env = envelope ? envelope : rec.envelope_json;
  char *cancel_reason = NULL;
  int denied = lg_store_denied(s, rec.run_id, rec.group, &cancel_reason, &err);
  if (denied < 0) {
    cli_error(&err);
    rc = 1;
    goto out;
  }
  char created[40], updated[40], created_iso[40], updated_iso[40];
  fmt_time(rec.created_ms, created);
  fmt_time(rec.updated_ms, updated);
  fmt_iso(rec.created_ms, created_iso);
  fmt_iso(rec.updated_ms, updated_iso);
  if (json) {
    printf("{\"run_id\":");
    put_str(stdout, rec.run_id);
    printf(",\"group\":");
    put_str(stdout, rec.group);
    printf(",\"status\":\"%s\",\"terminal_reason\":", rec.stopped ? "stopped" : "active");
    put_str(stdout, rec.terminal_reason);
    printf(",\"created_at\":\"%s\",\"updated_at\":\"%s\"", created_iso, updated_iso);
    printf(",\"counters\":");
    if (run) put_counters_json(&k);
    else fputs("null", stdout);
    printf(",\"cancel\":");
    if (denied) {
      printf("{\"reason\":");
      put_str(stdout, cancel_reason ? cancel_reason : "operator_cancelled_loop");
      printf("}");
    } else {
      fputs("null", stdout);
    }
    printf(",\"envelope\":%s}\n", env && *env ? env : "null");
  } else {
    printf("run          %s\n", rec.run_id);
    printf("group        %s\n", rec.group ? rec.group : "-");
    printf("status       %s\n", rec.stopped ? "stopped" : "active");
    if (rec.stopped)
      printf("reason       %s\n", rec.terminal_reason ? rec.terminal_reason : "-");
    printf("created      %s\n", created);
    printf("updated      %s\n", updated);
    char usd[LG_USD_TEXT_MAX];
    if (run)
      printf("counters     %lld steps, %lld calls (%lld blocked, %lld replayed), %lld model "
             "calls, %lld tokens, $%s\n",
             (long long)k.steps, (long long)k.calls, (long long)k.blocked,
             (long long)k.replayed, (long long)k.model_calls, (long long)k.tokens,
             lg_usd_format(k.cost_nusd, usd));
    if (denied)
      printf("cancel       %s%s\n", cancel_reason ? cancel_reason : "operator_cancelled_loop",
             rec.stopped ? "" : " (pending: the next decision stops)");
    if (env && *env) {
      printf("envelope\n");
      put_pretty(stdout, env);
    }
  }
out:
  lg_free(cancel_reason);
  lg_free(envelope);
  lg_run_free(run);
  lg_run_record_clear(&rec);
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- trace ---- */

static int do_trace(int argc, char **argv) {
  const char *store = NULL, *out = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"-o", 1, &out}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "runs trace needs a RUN_ID", &npos, trace_usage);
  if (rc >= 0) return rc;
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  lg_error_t err = {0};
  char *text = NULL;
  size_t len = 0;
  rc = lg_store_run_trace(s, pos[0], &text, &len, &err);
  lg_store_close(s);
  if (rc) {
    cli_error(&err);
    return 1;
  }
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "loopguard: %s: %s\n", out, strerror(errno));
    lg_free(text);
    return 1;
  }
  int bad = fwrite(text, 1, len, f) != len;
  if (out) bad |= fclose(f) != 0;
  else bad |= fflush(f) != 0;
  if (bad) fprintf(stderr, "loopguard: %s: %s\n", out ? out : "standard output", strerror(errno));
  lg_free(text);
  return bad ? 1 : 0;
}

/* ---- resume ---- */

static const char *resume_usage =
    "usage: loopguard runs resume RUN_ID [--progress-version N] [--note TEXT] [--store URL] [--json]\n"
    "\n"
    "Resumes a run that stopped with next_allowed_action resume_after_change (a\n"
    "repeat, a cycle, no progress, a text loop, ...) once something changed: its\n"
    "repeat window, cycles and streaks start again; caps, counters, cost and the\n"
    "ledger carry on. The resume is a line of the run's trace. A run stopped by a\n"
    "cap, a cancel, a budget or a final status cannot be resumed: start a new run.\n"
    "\n"
    "  --progress-version N  the new checkpoint (results must pass it to count as\n"
    "                        progress)\n"
    "  --note TEXT           what changed, kept in the trace\n"
    "  --store URL           memory:, sqlite:PATH or postgres:CONNINFO (default\n"
    "                        $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json                print {\"run_id\", \"status\", \"envelope\"}\n"
    "\n"
    "Exit status: 0 resumed, 1 an error (the run is missing, active, or stopped\n"
    "for a reason that cannot be resumed), 2 bad usage.\n";

static int do_resume(int argc, char **argv) {
  const char *store = NULL, *pv = NULL, *note = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--progress-version", 1, &pv}, {"--note", 1, &note}, {"--store", 1, &store},
                        {"--json", 0, &json},           {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, NULL, &npos, resume_usage);
  if (rc >= 0) return rc;
  if (npos != 1) return cli_usage(resume_usage, "runs resume needs a RUN_ID");
  if ((rc = cli_check_id("RUN_ID", pos[0], resume_usage)) >= 0 ||
      (note && (rc = cli_check_utf8("--note", note, resume_usage)) >= 0))
    return rc;
  int64_t version = 0;
  if (pv) {
    char *end;
    errno = 0;
    long long v = strtoll(pv, &end, 10);
    if (!*pv || *end || errno) return cli_usage(resume_usage, "--progress-version needs a whole number");
    version = v;
  }
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  lg_error_t err = {0};
  rc = lg_store_resume_run(s, pos[0], pv ? &version : NULL, note, cli_now_ms(), &err);
  if (rc) {
    cli_error(&err);
    lg_store_close(s);
    return 1;
  }
  if (json) {
    lg_run_record_t rec = {0};
    char *j = lg_store_run_get(s, pos[0], &rec, NULL) ? NULL : lg_run_record_to_json(&rec);
    printf("%s\n", j ? j : "null");
    lg_free(j);
    lg_run_record_clear(&rec);
  } else {
    printf("resumed run %s: it is active again; its repeat window and streaks start afresh\n", pos[0]);
  }
  lg_store_close(s);
  return 0;
}

/* ---- purge ---- */

static const char *purge_usage =
    "usage: loopguard runs purge --older-than DURATION [--store URL] [--json]\n"
    "\n"
    "Deletes the runs not written to for DURATION (their last decision, resume\n"
    "or cancel), whatever their status: each with its trace, its cancel, its\n"
    "budget scopes and the gateway's conversation keys that name it. A gateway\n"
    "makes a run for every conversation, so a store grows with every agent that\n"
    "talks through it; run this from cron (e.g. daily, --older-than 30d), or let\n"
    "the server do it ('loopguard serve --help': retain-runs), to keep it bounded.\n"
    "A conversation that comes back after its run was purged starts a new run; a\n"
    "sidecar client naming a purged run gets 404 (not_found).\n"
    "\n"
    "Kept: a run holding an open budget reservation (until it is settled or\n"
    "expires), the ledger (see 'loopguard ledger purge'), budgets and what they\n"
    "spent, a group's cancel. Export the traces you want to keep first\n"
    "('loopguard runs export'). Works in batches of a few hundred runs, each a\n"
    "transaction of its own, so a serving gateway waits for one batch at most;\n"
    "on a terminal it shows its progress.\n"
    "\n"
    "  --older-than DURATION  how long a run is kept after its last write: a\n"
    "                         number with a unit (ms s m h d w), e.g. 30d, 12h\n"
    "  --store URL            the store (default $LOOPGUARD_STORE, else\n"
    "                         sqlite:loopguard.db)\n"
    "  --json                 print {\"purged\": N, \"older_than_ms\": MS}\n"
    "  --help                 this text\n"
    "\n"
    "Exit status: 0 done (also when nothing was old enough), 1 an error (the\n"
    "batches before it stay purged; the message says how many), 2 bad usage.\n";

static int purge_progress(void *ud, int64_t done) {
  (void)ud;
  fprintf(stderr, "\rpurged %lld runs so far...", (long long)done);
  fflush(stderr);
  return 0;
}

static int do_purge(int argc, char **argv) {
  const char *store = NULL, *older = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--older-than", 1, &older}, {"--store", 1, &store}, {"--json", 0, &json},
                        {NULL, 0, NULL}};
  int npos, rc = cli_parse(argc, argv, flags, NULL, 0, NULL, &npos, purge_usage);
  if (rc >= 0) return rc;
  if (!older)
    return cli_usage(purge_usage, "runs purge needs --older-than DURATION (how long a run is kept "
                                  "after its last write, e.g. 30d)");
  int64_t age = cli_parse_duration(older);
  if (age < 0)
    return cli_usage(purge_usage, "--older-than wants a duration like 12h, 30d or 2w, not '%s'",
                     older);
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  int tty = isatty(STDERR_FILENO);
  int64_t n = 0;
  lg_error_t err = {0};
  rc = lg_store_purge_runs(s, age, cli_now_ms(), tty ? purge_progress : NULL, NULL, &n, &err);
  if (tty) fputs("\r\033[K", stderr);
  if (rc) {
    cli_error(&err);
    if (n) fprintf(stderr, "loopguard: %lld run%s purged before the error stay purged\n",
                   (long long)n, n == 1 ? "" : "s");
  } else if (json) {
    printf("{\"purged\":%lld,\"older_than_ms\":%lld}\n", (long long)n, (long long)age);
  } else {
    printf("purged %lld run%s not written to for %s, with their traces\n", (long long)n,
           n == 1 ? "" : "s", older);
  }
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- cancel ---- */

static int do_cancel(int argc, char **argv) {
  const char *store = NULL, *reason = NULL, *group = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--reason", 1, &reason}, {"--group", 1, &group}, {"--store", 1, &store},
                    {"--json", 0, &json},     {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, NULL, &npos, cancel_usage);
  if (rc >= 0) return rc;
  if (group && npos) return cli_usage(cancel_usage, "give a RUN_ID or --group GROUP, not both");
  if (!group && npos != 1) return cli_usage(cancel_usage, "runs cancel needs a RUN_ID");
  if (group && !*group) return cli_usage(cancel_usage, "--group needs a group name");
  if (reason && !*reason) reason = NULL;
  /* What the HTTP API takes: these go into the store and into JSON. */
  if ((!group && (rc = cli_check_id("RUN_ID", pos[0], cancel_usage)) >= 0) ||
      (group && (rc = cli_check_id("--group", group, cancel_usage)) >= 0) ||
      (reason && (rc = cli_check_id("--reason", reason, cancel_usage)) >= 0))
    return rc;
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  lg_error_t err = {0};
  int64_t now = cli_now_ms();
  /* The reason is always the kill switch's; the operator's words are a
   * note beside it (the envelope's operator_note). */
  char shown[600];
  snprintf(shown, sizeof shown, "operator_cancelled_loop%s%s", reason ? ": " : "", reason ? reason : "");
  if (group) {
    char *ids = NULL;
    rc = lg_store_cancel_group(s, group, reason, now, &ids, &err);
    if (rc) {
      cli_error(&err);
    } else if (json) {
      printf("{\"group\":");
      put_str(stdout, group);
      printf(",\"reason\":\"operator_cancelled_loop\",\"operator_note\":");
      if (reason) put_str(stdout, reason);
      else fputs("null", stdout);
      printf(",\"cancelled\":%s}\n", ids);
    } else {
      printf("cancelled group %s (%s): every run of it stops at its next decision; "
             "stopped now: %s\n",
             group, shown, ids);
    }
    lg_free(ids);
    lg_store_close(s);
    return rc ? 1 : 0;
  }
  rc = lg_store_cancel_run(s, pos[0], reason, now, &err);
  if (rc) {
    cli_error(&err);
    lg_store_close(s);
    return 1;
  }
  lg_run_record_t rec = {0};
  int stored = lg_store_run_get(s, pos[0], &rec, NULL) == 0;
  if (json) {
    printf("{\"run_id\":");
    put_str(stdout, pos[0]);
    printf(",\"reason\":\"operator_cancelled_loop\",\"operator_note\":");
    if (reason) put_str(stdout, reason);
    else fputs("null", stdout);
    printf(",\"stored\":%s,\"envelope\":%s}\n", stored ? "true" : "false",
           stored && rec.envelope_json && *rec.envelope_json ? rec.envelope_json : "null");
  } else if (stored) {
    printf("cancelled run %s (%s): it is stopped, and every worker's next decision for it "
           "is a stop\n",
           pos[0], shown);
  } else {
    printf("cancelled run %s (%s): it is not in the store yet; its first decision will "
           "be a stop\n",
           pos[0], shown);
  }
  lg_run_record_clear(&rec);
  lg_store_close(s);
  return 0;
}

int cmd_runs(int argc, char **argv) {
  if (argc < 2) return cli_usage(runs_usage, "runs needs a subcommand");
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(runs_usage, stdout);
    return 0;
  }
  if (!strcmp(sub, "list")) return do_list(argc - 1, argv + 1);
  if (!strcmp(sub, "show")) return do_show(argc - 1, argv + 1);
  if (!strcmp(sub, "trace")) return do_trace(argc - 1, argv + 1);
  if (!strcmp(sub, "cancel")) return do_cancel(argc - 1, argv + 1);
  if (!strcmp(sub, "resume")) return do_resume(argc - 1, argv + 1);
  if (!strcmp(sub, "purge")) return do_purge(argc - 1, argv + 1);
  if (!strcmp(sub, "export")) return cmd_runs_export(argc - 1, argv + 1); /* cmd_export.c */
  return cli_usage(runs_usage, "unknown runs subcommand '%s'", sub);
}
