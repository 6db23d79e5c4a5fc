/*
 * cmd_replay.c — `loopguard replay [--policy FILE] [--json] TRACE...`
 * and `loopguard fingerprint [--policy FILE] [--json] TOOL ARGS_JSON`.
 *
 * Replay prints, for a person, a compact timeline per trace: every event
 * where the guard did something (observed, blocked, replayed, stopped) on
 * its own line, runs of plain executions folded into one, and a closing
 * summary with the envelope's message and what may happen next. With
 * --json it prints the records of trace-v1 instead, one per line.
 */
#include "cli.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *replay_usage =
    "usage: loopguard replay [--policy FILE] [--json] [--quiet] TRACE...\n"
    "\n"
    "Feeds each trace-v1 file to a fresh guard, exactly as a live run would,\n"
    "with no model and no network, and shows what the guard decided. A TRACE\n"
    "of '-' is read from standard input.\n"
    "\n"
    "  --policy FILE  use this policy-v1 file instead of the traces' own\n"
    "  --json         one JSON object per event acted on (call, model, result,\n"
    "                 text, ...) and a summary per trace (trace-v1)\n"
    "  -q, --quiet    print only the summary line of each trace\n"
    "  --help         this text\n"
    "\n"
    "Exit status: 0 when every trace was read and replayed, whatever the guard\n"
    "decided; 1 when a trace could not be read or is malformed (the message\n"
    "names file, line and field); 2 on bad usage.\n";

typedef struct out {
  FILE *f;
  int json;
  int quiet;
  int color;
  /* Folded plain executions. */
  long fold_first, fold_last;
  int fold_n;
  char *fold_tool; /* the first one's tool, whole (malloc) */
  int fold_tools;  /* distinct tools among them (1 or "several") */
  /* The last steer message shown: the same kind again (action, reason and
   * tool, compared whole) is not repeated. */
  int msg_shown;
  int msg_action;
  char *msg_reason, *msg_tool; /* malloc */
  /* The trace's name, printed before its first line of output: a trace
   * that cannot be read prints only its error, on stderr. */
  const char *pending_header;
} out_t;

static void put_usd(FILE *f, int64_t nusd) {
  char t[LG_USD_TEXT_MAX];
  fputs(lg_usd_format(nusd, t), f);
}

static void put_str(FILE *f, const char *s) {
  char *q = lg_json_quote(s, strlen(s));
  fputs(q ? q : "\"\"", f);
  lg_free(q);
}

/* *dst becomes a copy of s (NULL for NULL, or when out of memory). */
static void keep(char **dst, const char *s) {
  free(*dst);
  *dst = s ? strdup(s) : NULL;
}

static bool same(const char *a, const char *b) { return a && b ? !strcmp(a, b) : a == b; }

/* ---- JSON records ---- */

static void json_event(out_t *o, const lg_replay_event_t *ev) {
  char *j = NULL;
  if (lg_replay_event_json(ev, &j)) fputs("loopguard: out of memory\n", stderr);
  if (j) fprintf(o->f, "%s\n", j);
  lg_free(j);
}

static void json_summary(out_t *o, const lg_replay_summary_t *s) {
  char *j = lg_replay_summary_json(s);
  if (j) fprintf(o->f, "%s\n", j);
  else fputs("loopguard: out of memory\n", stderr);
  lg_free(j);
}

/* ---- the timeline for a person ---- */

#define C(o, code) ((o)->color ? "\033[" code "m" : "")

static void flush_fold(out_t *o) {
  if (!o->fold_n) return;
  if (o->fold_n == 1)
    fprintf(o->f, "  line %-5ld %sexecute%s  %s\n", o->fold_first, C(o, "32"), C(o, "0"),
            o->fold_tool ? o->fold_tool : "?");
  else
    fprintf(o->f, "  lines %ld-%ld %s%d calls executed%s (%s)\n", o->fold_first, o->fold_last,
            C(o, "32"), o->fold_n, C(o, "0"),
            o->fold_tools > 1 ? "several tools" : o->fold_tool ? o->fold_tool : "?");
  o->fold_n = 0;
}

static const char *ordinal(unsigned n, char *buf, size_t size) {
  const char *suf = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suf = "st";
    else if (n % 10 == 2) suf = "nd";
    else if (n % 10 == 3) suf = "rd";
  }
  snprintf(buf, size, "%u%s", n, suf);
  return buf;
}

static void human_event(out_t *o, const lg_replay_event_t *ev) {
  if (!ev->acted) return;
  const lg_decision_t *d = &ev->decision;
  FILE *f = o->f;
  bool plain = d->action == LG_ACT_EXECUTE && !d->message;
  if (ev->type == LG_EV_CALL && plain) {
    if (!o->fold_n) {
      o->fold_first = ev->line;
      keep(&o->fold_tool, ev->tool);
      o->fold_tools = 1;
    } else if (!same(o->fold_tool, ev->tool)) {
      o->fold_tools = 2;
    }
    o->fold_last = ev->line;
    o->fold_n++;
    return;
  }
  /* Results, model calls and snapshots matter here only when they stop. */
  if ((ev->type == LG_EV_RESULT || ev->type == LG_EV_MODEL || ev->type == LG_EV_STATE) &&
      d->action != LG_ACT_STOP)
    return;
  flush_fold(o);
  const char *col = d->action == LG_ACT_STOP     ? "\033[1;31m"
                    : d->action == LG_ACT_BLOCK  ? "\033[33m"
                    : d->action == LG_ACT_REPLAY ? "\033[36m"
                                                 : "\033[32m";
  const char *what = d->action == LG_ACT_EXECUTE && d->message ? "observe" : lg_action_name(d->action);
  fprintf(f, "  line %-5ld %s%-8s%s %-8s", ev->line, o->color ? col : "", what, C(o, "0"),
          lg_event_type_name(ev->type));
  if (ev->type == LG_EV_CALL) fprintf(f, " %s", ev->tool);
  if (ev->type == LG_EV_HANDOFF) fprintf(f, " %s -> %s", ev->from ? ev->from : "?", ev->to ? ev->to : "?");
  if (d->reason_text && *d->reason_text) fprintf(f, "  %s", d->reason_text);
  if (ev->type == LG_EV_CALL && d->repeat > 1) {
    char ob[16];
    fprintf(f, " (%s identical call)", ordinal(d->repeat, ob, sizeof ob));
  }
  if (d->guard && *d->guard && d->action == LG_ACT_STOP) fprintf(f, " [guard: %s]", d->guard);
  fputc('\n', f);
  if (d->message && d->action != LG_ACT_STOP) {
    const char *reason = d->reason_text ? d->reason_text : "", *tool = ev->tool ? ev->tool : "";
    if (!o->msg_shown || o->msg_action != (int)d->action || !same(o->msg_reason, reason) ||
        !same(o->msg_tool, tool)) {
      fprintf(f, "             %s\"%s\"%s\n", C(o, "2"), d->message, C(o, "0"));
      o->msg_shown = 1;
      o->msg_action = (int)d->action;
      keep(&o->msg_reason, reason);
      keep(&o->msg_tool, tool);
    }
  }
}

static void human_summary(out_t *o, const lg_replay_summary_t *s) {
  FILE *f = o->f;
  flush_fold(o);
  if (s->terminal_reason)
    fprintf(f, "  %sstopped%s at line %ld: %s%s%s\n", C(o, "1;31"), C(o, "0"), s->stopped_at_line,
            C(o, "1"), s->terminal_reason, C(o, "0"));
  else
    fprintf(f, "  %sno stop%s: the trace ended with the run still going\n", C(o, "32"), C(o, "0"));
  fprintf(f, "  %lld executed, %lld blocked, %lld replayed", (long long)s->executed_calls,
          (long long)s->blocked_calls, (long long)s->replayed_calls);
  if (s->model_calls) {
    fprintf(f, "; %lld model calls, %lld tokens, $", (long long)s->model_calls, (long long)s->tokens);
    put_usd(f, s->cost_nusd);
  }
  if (s->events_after_stop) fprintf(f, "; %lld events after the stop not acted on", (long long)s->events_after_stop);
  fputc('\n', f);
}

/* The envelope's message and next step, read back from its JSON (the CLI
 * sees only the public API, so it reads the envelope like any client). */
static void envelope_field(const char *env, const char *name, char *out, size_t size) {
  out[0] = 0;
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":\"", name);
  const char *p = strstr(env, pat);
  if (!p) return;
  p += strlen(pat);
  size_t n = 0;
  while (*p && *p != '"' && n + 1 < size) {
    if (*p == '\\' && p[1]) p++;
    out[n++] = *p++;
  }
  out[n] = 0;
}

static int on_event(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  out_t *o = ud;
  if (o->pending_header) {
    fprintf(o->f, "%s%s%s\n", C(o, "1"), o->pending_header, C(o, "0"));
    o->pending_header = NULL;
  }
  if (ev) {
    if (o->json) json_event(o, ev);
    else if (!o->quiet) human_event(o, ev);
    return 0;
  }
  if (o->json) {
    json_summary(o, sum);
    return 0;
  }
  if (o->quiet) {
    fprintf(o->f, "%s: %s (%lld executed, %lld blocked, %lld replayed)\n", sum->trace,
            sum->terminal_reason ? sum->terminal_reason : "no stop", (long long)sum->executed_calls,
            (long long)sum->blocked_calls, (long long)sum->replayed_calls);
    return 0;
  }
  human_summary(o, sum);
  if (sum->terminal_reason) {
    char msg[1024], next[64];
    envelope_field(sum->envelope, "message", msg, sizeof msg);
    envelope_field(sum->envelope, "next_allowed_action", next, sizeof next);
    if (*msg) fprintf(o->f, "  %s\"%s\"%s\n", C(o, "2"), msg, C(o, "0"));
    if (*next) fprintf(o->f, "  next allowed action: %s\n", next);
  }
  return 0;
}

/* Reads all of `f` into a new buffer (*buf, free()). 0, or LG_EIO/LG_ENOMEM. */
static int read_all(FILE *f, char **buf, size_t *len) {
  size_t cap = 65536, n = 0;
  char *b = malloc(cap);
  if (!b) return LG_ENOMEM;
  for (;;) {
    if (n == cap) {
      char *nb = realloc(b, cap *= 2);
      if (!nb) return free(b), LG_ENOMEM;
      b = nb;
    }
    size_t got = fread(b + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  if (ferror(f)) return free(b), LG_EIO;
  *buf = b;
  *len = n;
  return 0;
}

int cmd_replay(int argc, char **argv) {
  out_t o;
  memset(&o, 0, sizeof o);
  o.f = stdout;
  const char *policy_path = NULL, *json = NULL, *quiet = NULL;
  cli_flag_t flags[] = {{"--policy", 1, &policy_path}, {"--json", 0, &json}, {"-q", 0, &quiet},
                        {"--quiet", 0, &quiet},        {NULL, 0, NULL}};
  const char **traces = calloc((size_t)argc, sizeof *traces);
  if (!traces) return 1;
  int ntraces, rc = cli_parse(argc, argv, flags, traces, argc, NULL, &ntraces, replay_usage);
  if (rc < 0 && !ntraces) rc = cli_usage(replay_usage, "no trace given");
  if (rc >= 0) {
    free(traces);
    return rc;
  }
  o.json = json != NULL;
  o.quiet = quiet != NULL;
  o.color = !o.json && cli_color(stdout);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *policy = NULL;
  if (policy_path && !(policy = lg_policy_load_file(policy_path, &err))) {
    cli_error(&err);
    free(traces);
    return 1;
  }
  int status = 0, stdin_read = 0, printed = 0;
  for (int i = 0; i < ntraces; i++) {
    int is_stdin = !strcmp(traces[i], "-");
    const char *name = is_stdin ? "<stdin>" : traces[i];
    if (!o.json && !o.quiet && printed) fputc('\n', o.f);
    o.pending_header = !o.json && !o.quiet ? name : NULL;
    memset(&err, 0, sizeof err);
    err.offset = -1;
    o.fold_n = 0;
    o.msg_shown = 0;
    if (is_stdin) {
      char *buf = NULL;
      size_t len = 0;
      if (stdin_read++) {
        rc = LG_EINVAL;
        snprintf(err.message, sizeof err.message, "standard input ('-') can be replayed only once");
        snprintf(err.source, sizeof err.source, "%s", name);
      } else if ((rc = read_all(stdin, &buf, &len))) {
        snprintf(err.message, sizeof err.message, "cannot read standard input");
        snprintf(err.source, sizeof err.source, "%s", name);
      } else {
        rc = lg_replay_buffer(name, buf, len, policy, on_event, &o, &err);
      }
      free(buf);
    } else {
      rc = lg_replay_file(traces[i], policy, on_event, &o, &err);
    }
    if (!o.pending_header) printed = 1;
    o.pending_header = NULL;
    if (rc) {
      if (!o.json && !o.quiet) flush_fold(&o);
      fflush(o.f);
      cli_error(&err);
      status = 1;
    }
  }
  lg_policy_free(policy);
  free(o.fold_tool);
  free(o.msg_reason);
  free(o.msg_tool);
  free(traces);
  return status;
}

/* ---- fingerprint ---- */

static const char *fp_usage =
    "usage: loopguard fingerprint [--policy FILE] [--json] TOOL ARGS_JSON\n"
    "\n"
    "Prints the canonical key material of a call (its arguments narrowed and\n"
    "normalized by the tool's loop_key in the policy, in RFC 8785 form) and\n"
    "its fingerprint, SHA-256 over TOOL + \"\\n\" + key material. Two calls are\n"
    "the same loop key exactly when their fingerprints are equal.\n"
    "\n"
    "  --policy FILE  apply this policy's loop_key for TOOL\n"
    "  --json         {\"tool\",\"key_material\",\"fingerprint\"}\n"
    "  -h, --help     this text\n"
    "\n"
    "example: loopguard fingerprint charge_invoice '{\"invoice_id\":\"INV-2291\"}'\n"
    "\n"
    "Exit status: 0 printed, 1 an error (ARGS_JSON is not valid JSON, or the\n"
    "policy file is unreadable or invalid: the message names file, line and\n"
    "field), 2 bad usage.\n";

int cmd_fingerprint(int argc, char **argv) {
  const char *policy_path = NULL, *json = NULL, *pos[2];
  cli_flag_t flags[] = {{"--policy", 1, &policy_path}, {"--json", 0, &json}, {NULL, 0, NULL}};
  int npos, rc = cli_parse(argc, argv, flags, pos, 2, "TOOL and ARGS_JSON are required", &npos,
                           fp_usage);
  if (rc >= 0 || (rc = cli_check_utf8("TOOL", pos[0], fp_usage)) >= 0) return rc;
  const char *tool = pos[0], *args = pos[1];
  lg_error_t err;
  memset(&err, 0, sizeof err);
  err.offset = -1;
  lg_policy_t *policy = NULL;
  if (policy_path && !(policy = lg_policy_load_file(policy_path, &err))) {
    cli_error(&err);
    return 1;
  }
  lg_canon_t *c = lg_canon_new();
  char hex[LG_FP_HEX];
  const char *km;
  size_t kml;
  rc = c ? lg_canon_fingerprint(c, policy, tool, args, strlen(args), hex, &km, &kml, &err) : LG_ENOMEM;
  if (rc) {
    if (!err.message[0]) snprintf(err.message, sizeof err.message, "%s", lg_strerror(rc));
    snprintf(err.source, sizeof err.source, "ARGS_JSON");
    char buf[1024];
    fprintf(stderr, "loopguard: %s\n", lg_error_format(&err, buf, sizeof buf));
  } else if (json) {
    fputs("{\"tool\":", stdout);
    put_str(stdout, tool);
    printf(",\"key_material\":%.*s,\"fingerprint\":\"%s\"}\n", (int)kml, km, hex);
  } else {
    printf("tool:          %s\nkey material:  %.*s\nfingerprint:   %s\n", tool, (int)kml, km, hex);
  }
  lg_canon_free(c);
  lg_policy_free(policy);
  return rc ? 1 : 0;
}
