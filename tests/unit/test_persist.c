/*
 * test_persist.c — lg_run_save() / lg_run_load(): a run saved and loaded
 * back after every event decides exactly as one that never stopped.
 *
 * A small driver here feeds trace-v1 events (parsed with jansson) to two
 * runs side by side: A runs uninterrupted; B is saved after every event and
 * replaced by a new run loaded from the bytes (same policy, same ledger).
 * Every decision (action, reason, guard, repeat, fingerprint, ids, message,
 * hints, saved result, next action, reservation) must be identical, and so
 * must the final envelopes and saved states. The driver follows the replay
 * contract, and for the fixture traces its decisions for A are also checked
 * against lg_replay_file(), so the driver cannot drift from replay.
 *
 * Then the other side: truncated, extended, mutated and hand-crafted blobs
 * must be refused with a clean error (or load into a run that is safe to
 * use), with no leak under ASan.
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
#include <math.h>

#include "loopguard.h"

static lg_canon_t *C;

/* ------------------------------------------------------------------ */
/* A decision, copied out of the run (its strings are borrowed).        */

typedef struct dec {
  int rc;
  lg_action_t action;
  lg_reason_t reason;
  char reason_text[256], guard[32], fp[LG_FP_HEX], call_id[128], key[512], message[1024];
  char hide_tool[128], saved[1024], escalate[128];
  bool has_call_id, has_key, has_message, has_hide, has_saved, has_escalate;
  uint32_t escalate_turns;
  uint32_t repeat, hide_turns;
  unsigned alternatives;
  size_t saved_len;
  lg_next_t next;
  int64_t reservation;
} dec_t;

static void copy_s(char *dst, size_t size, bool *has, const char *s) {
  *has = s != NULL;
  snprintf(dst, size, "%s", s ? s : "");
}

static void dec_copy(dec_t *o, int rc, const lg_decision_t *d) {
  memset(o, 0, sizeof *o);
  o->rc = rc;
  if (rc) return;
  bool dummy;
  o->action = d->action;
  o->reason = d->reason;
  copy_s(o->reason_text, sizeof o->reason_text, &dummy, d->reason_text);
  copy_s(o->guard, sizeof o->guard, &dummy, d->guard);
  memcpy(o->fp, d->fingerprint, LG_FP_HEX);
  copy_s(o->call_id, sizeof o->call_id, &o->has_call_id, d->call_id);
  copy_s(o->key, sizeof o->key, &o->has_key, d->idempotency_key);
  copy_s(o->message, sizeof o->message, &o->has_message, d->message);
  copy_s(o->hide_tool, sizeof o->hide_tool, &o->has_hide, d->hide_tool);
  o->has_saved = d->saved_result != NULL;
  o->saved_len = d->saved_result_len;
  if (d->saved_result) snprintf(o->saved, sizeof o->saved, "%.*s", (int)d->saved_result_len, d->saved_result);
  o->repeat = d->repeat;
  o->hide_turns = d->hide_turns;
  o->alternatives = d->alternatives;
  o->next = d->next_allowed_action;
  o->reservation = d->reservation;
  copy_s(o->escalate, sizeof o->escalate, &o->has_escalate, d->escalate_model);
  o->escalate_turns = d->escalate_turns;
}

static void dec_same(const char *where, long line, const dec_t *a, const dec_t *b) {
#define SAME_INT(f)                                                                        \
  if (a->f != b->f) fail_msg("%s line %ld: " #f " %lld vs %lld after reload", where, line, \
                             (long long)a->f, (long long)b->f)
#define SAME_STR(f)                                                                      \
  if (strcmp(a->f, b->f)) fail_msg("%s line %ld: " #f " \"%s\" vs \"%s\" after reload", \
                                   where, line, a->f, b->f)
  SAME_INT(rc);
  SAME_INT(action);
  SAME_INT(reason);
  SAME_STR(reason_text);
  SAME_STR(guard);
  SAME_INT(repeat);
  SAME_STR(fp);
  SAME_INT(has_call_id);
  SAME_STR(call_id);
  SAME_INT(has_key);
  SAME_STR(key);
  SAME_INT(has_message);
  SAME_STR(message);
  SAME_INT(has_hide);
  SAME_STR(hide_tool);
  SAME_INT(hide_turns);
  SAME_INT(alternatives);
  SAME_INT(has_saved);
  SAME_INT(saved_len);
  SAME_STR(saved);
  SAME_INT(next);
  SAME_INT(reservation);
  SAME_INT(has_escalate);
  SAME_STR(escalate);
  SAME_INT(escalate_turns);
#undef SAME_INT
#undef SAME_STR
}

/* ------------------------------------------------------------------ */
/* The driver: trace-v1 events into a run, as replay does.              */

typedef struct drv {
  lg_run_t *run;
  lg_ledger_t *ledger;  /* the run's, across reloads */
  lg_policy_t *policy;  /* the run's policy (a reference), NULL: default */
  bool reload;          /* save and load back after every event */
  bool any_call, last_exec;
  char *skipped[4096];  /* ids of calls that did not execute */
  int nskip;
  int64_t last_t;
  long reloads;
} drv_t;

static void drv_init(drv_t *D, bool reload) {
  memset(D, 0, sizeof *D);
  D->reload = reload;
  D->ledger = lg_ledger_memory_new();
  assert_non_null(D->ledger);
}

static void drv_free(drv_t *D) {
  lg_run_free(D->run);
  lg_policy_free(D->policy);
  lg_ledger_free(D->ledger);
  for (int i = 0; i < D->nskip; i++) free(D->skipped[i]);
}

/* The bytes of a run saved, loaded back and saved again. Loading may
 * normalise a detail that does not decide anything (an active run's guard,
 * NULL, comes back as ""), so states are compared in this form. */
static void norm_save(const lg_run_t *run, lg_policy_t *p, char **b, size_t *n) {
  char *b1;
  size_t n1;
  assert_int_equal(lg_run_save(run, &b1, &n1), 0);
  lg_run_t *r = lg_run_load(b1, n1, p, NULL, NULL);
  assert_non_null(r);
  assert_int_equal(lg_run_save(r, b, n), 0);
  lg_run_free(r);
  lg_free(b1);
}

/* Saves the run and replaces it with one loaded from the bytes. A second
 * round trip must give the same bytes as the first. */
static void drv_reload(drv_t *D) {
  char *b = NULL, *b2 = NULL;
  size_t n = 0, n2 = 0;
  assert_int_equal(lg_run_save(D->run, &b, &n), 0);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *r = lg_run_load(b, n, D->policy, D->ledger, &err);
  if (!r) fail_msg("lg_run_load of a fresh save failed: %s", err.message);
  norm_save(D->run, D->policy, &b2, &n2);
  char *b3;
  size_t n3;
  norm_save(r, D->policy, &b3, &n3);
  assert_int_equal(n2, n3);
  assert_memory_equal(b2, b3, n2);
  lg_free(b3);
  lg_run_free(D->run);
  D->run = r;
  D->reloads++;
  lg_free(b);
  lg_free(b2);
}

static void drv_start(drv_t *D, const char *run_id, const char *group, json_t *policy,
                      const int64_t *cp) {
  if (policy) {
    char *pj = json_dumps(policy, JSON_COMPACT);
    lg_error_t err;
    memset(&err, 0, sizeof err);
    D->policy = lg_policy_parse(pj, strlen(pj), "trace", &err);
    free(pj);
    if (!D->policy) fail_msg("policy: %s", err.message);
  }
  D->run = lg_run_new(run_id, group, D->policy, cp, D->ledger, NULL);
  assert_non_null(D->run);
}

static const char *sget(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}
static int64_t iget(json_t *o, const char *k, int64_t dflt, bool *has) {
  json_t *v = json_object_get(o, k);
  if (has) *has = v != NULL;
  return json_is_number(v) ? (int64_t)json_number_value(v) : dflt;
}

static bool was_skipped(drv_t *D, const char *id) {
  for (int i = 0; i < D->nskip; i++)
    if (!strcmp(D->skipped[i], id)) return true;
  return false;
}

/* Feeds one event; returns true when the run decided something (*out). */
static bool drv_event(drv_t *D, json_t *ev, long line, dec_t *out) {
  const char *type = sget(ev, "type");
  if (!type) return false;
  if (!strcmp(type, "run")) {
    bool has_pv;
    int64_t pv = iget(ev, "progress_version", 0, &has_pv);
    drv_start(D, sget(ev, "run_id"), sget(ev, "group"), json_object_get(ev, "policy"), has_pv ? &pv : NULL);
    if (D->reload) drv_reload(D);
    return false;
  }
  if (!D->run) drv_start(D, "trace", NULL, NULL, NULL);
  bool has_t;
  int64_t t = iget(ev, "t_ms", D->last_t, &has_t);
  D->last_t = t;
  lg_decision_t d;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = 0;
  bool acted = true;
  if (!strcmp(type, "model")) {
    lg_model_call_t m;
    memset(&m, 0, sizeof m);
    m.model = sget(ev, "model");
    m.turn = iget(ev, "turn", 0, NULL);
    m.input_tokens = iget(ev, "input_tokens", 0, NULL);
    m.output_tokens = iget(ev, "output_tokens", -1, NULL);
    m.max_tokens = iget(ev, "max_tokens", -1, NULL);
    json_t *c = json_object_get(ev, "cost");
    m.cost_nusd = c ? llround(json_number_value(c) * 1e9) : -1;
    m.t_ms = t;
    rc = lg_run_model(D->run, &m, &d, &err);
    if (!rc && d.action == LG_ACT_EXECUTE) {
      dec_copy(out, rc, &d); /* the usage call below is not an event */
      assert_int_equal(lg_run_usage(D->run, d.reservation, m.input_tokens, m.output_tokens, m.cost_nusd, t), 0);
      if (D->reload) drv_reload(D);
      return true;
    }
  } else if (!strcmp(type, "call")) {
    lg_call_t c;
    memset(&c, 0, sizeof c);
    c.tool = sget(ev, "tool");
    json_t *a = json_object_get(ev, "args");
    char *args = a ? json_dumps(a, JSON_COMPACT) : NULL;
    c.args = args;
    c.args_len = args ? strlen(args) : 0;
    bool has_turn;
    c.turn = iget(ev, "turn", 0, &has_turn);
    if (!has_turn) c.turn = -line;
    c.call_id = sget(ev, "call_id");
    c.idempotency_key = sget(ev, "idempotency_key");
    c.agent = sget(ev, "agent");
    c.t_ms = t;
    rc = lg_run_before(D->run, C, &c, &d, &err);
    free(args);
    if (!rc) {
      D->any_call = true;
      D->last_exec = d.action == LG_ACT_EXECUTE;
      if (!D->last_exec && d.call_id && D->nskip < 4096) D->skipped[D->nskip++] = strdup(d.call_id);
    }
  } else if (!strcmp(type, "result")) {
    lg_result_t x;
    memset(&x, 0, sizeof x);
    x.call_id = sget(ev, "call_id");
    if (x.call_id ? was_skipped(D, x.call_id) : (D->any_call && !D->last_exec)) return false;
    const char *st = sget(ev, "status");
    x.status = lg_status_parse(st, st ? strlen(st) : 0);
    bool has;
    x.progress_version = iget(ev, "progress_version", 0, &has);
    x.has_progress_version = has;
    x.retry_after_ms = iget(ev, "retry_after_ms", -1, NULL);
    json_t *sec = json_object_get(ev, "side_effect_committed");
    x.side_effect_committed = sec ? json_is_true(sec) : -1;
    x.operation_id = sget(ev, "operation_id");
    json_t *v = json_object_get(ev, "value");
    char *vt = NULL;
    if (v) {
      vt = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      x.value = vt;
      x.value_len = strlen(vt);
      x.value_kind = LG_VALUE_PRESENT;
      if (json_is_null(v)) x.value_kind = LG_VALUE_NULL;
      else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!s[strspn(s, " \t\r\n")]) x.value_kind = LG_VALUE_BLANK;
      }
    }
    x.t_ms = t;
    rc = lg_run_after(D->run, &x, &d, &err);
    free(vt);
  } else if (!strcmp(type, "state")) {
    char *w = json_dumps(json_object_get(ev, "world"), JSON_COMPACT);
    rc = lg_run_state(D->run, C, w, strlen(w), t, &d, &err);
    free(w);
  } else if (!strcmp(type, "handoff")) {
    rc = lg_run_handoff(D->run, sget(ev, "from"), sget(ev, "to"), t, &d, &err);
  } else if (!strcmp(type, "cancel")) {
    rc = lg_run_cancel(D->run, sget(ev, "reason"), t, &d);
  } else if (!strcmp(type, "text")) {
    const char *tx = sget(ev, "text");
    bool has_turn;
    int64_t turn = iget(ev, "turn", 0, &has_turn);
    rc = lg_run_text(D->run, has_turn ? turn : -line, tx, tx ? strlen(tx) : 0, sget(ev, "agent"), t,
                     &d, &err);
  } else if (!strcmp(type, "user")) {
    rc = lg_run_user(D->run, t, &d);
  } else if (!strcmp(type, "compaction")) {
    rc = lg_run_compaction(D->run, t, &d);
  } else if (!strcmp(type, "resume")) { /* not trace-v1: the operator's lg_run_resume */
    bool has_pv;
    int64_t pv = iget(ev, "progress_version", 0, &has_pv);
    rc = lg_run_resume(D->run, has_pv ? &pv : NULL, t, &d, &err);
  } else {
    acted = false;
  }
  if (acted) dec_copy(out, rc, &d);
  if (D->reload) drv_reload(D);
  return acted;
}

/* ------------------------------------------------------------------ */
/* Running a trace both ways.                                           */

typedef struct line_dec {
  bool acted;
  dec_t d;
} line_dec_t;

/* What lg_replay_* decided per line, for the cross-check. */
typedef struct rep {
  line_dec_t *lines;
  long max;
} rep_t;

static int rep_cb(void *ud, const lg_replay_event_t *e, const lg_replay_summary_t *s) {
  (void)s;
  rep_t *r = ud;
  if (e && e->acted && e->line < r->max) {
    r->lines[e->line].acted = true;
    dec_copy(&r->lines[e->line].d, 0, &e->decision);
  }
  return 0;
}

/* Replays `text` through A and B; checks every decision and the end. When
 * check_replay, A's decisions must also be lg_replay_buffer's. */
static void both_ways(const char *name, const char *text, bool check_replay) {
  drv_t A, B;
  drv_init(&A, false);
  drv_init(&B, true);
  long nlines = 1;
  for (const char *p = text; *p; p++) nlines += *p == '\n';
  rep_t rep = {calloc((size_t)nlines + 2, sizeof(line_dec_t)), nlines + 2};
  if (check_replay) {
    lg_error_t err;
    memset(&err, 0, sizeof err);
    int rc = lg_replay_buffer(name, text, strlen(text), NULL, rep_cb, &rep, &err);
    if (rc) fail_msg("%s: replay failed: %s", name, err.message);
  }
  long line = 0, decided = 0, stopped_at = 0;
  for (const char *p = text; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t l = nl ? (size_t)(nl - p) : strlen(p);
    line++;
    size_t a = strspn(p, " \t\r");
    if (a < l && p[a] != '#') {
      json_error_t je;
      json_t *ev = json_loadb(p, l, 0, &je);
      if (!ev) fail_msg("%s line %ld: not JSON: %s", name, line, je.text);
      dec_t da, db;
      bool stopped = A.run && lg_run_stopped(A.run);
      bool aa = drv_event(&A, ev, line, &da);
      bool ab = drv_event(&B, ev, line, &db);
      assert_int_equal(aa, ab);
      if (aa) {
        decided++;
        dec_same(name, line, &da, &db);
        if (check_replay && !stopped) {
          if (!rep.lines[line].acted) fail_msg("%s line %ld: replay did not act on it", name, line);
          /* The driver is replay: the same decision (rc 0 there). */
          assert_int_equal(da.rc, 0);
          /* Replay hands back the value's bytes as written in the trace,
           * the driver jansson's compact form of it: compare presence. */
          dec_t x = rep.lines[line].d, y = da;
          x.saved[0] = y.saved[0] = 0;
          x.saved_len = y.saved_len = 0;
          dec_same("replay vs driver", line, &x, &y);
        }
        if (!stopped && !da.rc && da.action == LG_ACT_STOP) stopped_at = line;
      }
      json_decref(ev);
    }
    p = nl ? nl + 1 : NULL;
  }
  assert_true(decided > 0);
  assert_true(B.reloads >= decided);
  /* The end: the same envelope and the same bytes. */
  char *ea = lg_run_envelope_json(A.run), *eb = lg_run_envelope_json(B.run);
  assert_string_equal(ea, eb);
  char *ba, *bb;
  size_t na, nb;
  norm_save(A.run, A.policy, &ba, &na);
  norm_save(B.run, B.policy, &bb, &nb);
  assert_int_equal(na, nb);
  assert_memory_equal(ba, bb, na);
  printf("  %-36s %4ld decisions, %4ld reloads, %s%s\n", name, decided, B.reloads,
         lg_run_stopped(A.run) ? "stopped: " : "active", lg_run_stopped(A.run) ? lg_run_terminal_reason(A.run) : "");
  (void)stopped_at;
  lg_free(ea);
  lg_free(eb);
  lg_free(ba);
  lg_free(bb);
  free(rep.lines);
  drv_free(&A);
  drv_free(&B);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  return b;
}

static void t_fixtures_reload_every_event(void **state) {
  (void)state;
  const char *data = getenv("LG_TEST_DATA");
  if (!data) fail_msg("LG_TEST_DATA is not set");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/fixtures", data);
  DIR *dp = opendir(dir);
  if (!dp) fail_msg("cannot open %s", dir);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(dp))) {
    size_t l = strlen(de->d_name);
    if (l <= 6 || strcmp(de->d_name + l - 6, ".jsonl")) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    char *text = slurp(path);
    both_ways(de->d_name, text, true);
    free(text);
    n++;
  }
  closedir(dp);
  if (!n) fail_msg("no fixtures in %s", dir);
}

/* ------------------------------------------------------------------ */
/* Synthetic sequences that reach every part of the saved state.        */

static void t_synthetic_writes(void **state) {
  (void)state;
  both_ways("writes",
            "{\"type\":\"run\",\"run_id\":\"w\",\"group\":\"g\",\"policy\":{\"tools\":{\"charge\":{\"side_effects\":true,"
            "\"loop_key\":{\"invoice\":[\"digits\"]}},\"mail\":{\"side_effects\":true}}}}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"charge\",\"args\":{\"invoice\":\"INV-1\"},\"t_ms\":5}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"charge\",\"args\":{\"invoice\":\"inv 1\"},\"call_id\":\"dup\"}\n"
            "{\"type\":\"result\",\"call_id\":\"c1\",\"status\":\"progress\",\"value\":{\"paid\":1},\"operation_id\":\"op1\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"charge\",\"args\":{\"invoice\":\"INV-1\"}}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"mail\",\"args\":{\"to\":\"a\"},\"idempotency_key\":\"m-1\"}\n"
            "{\"type\":\"result\",\"status\":\"retryable\",\"retry_after_ms\":1000,\"t_ms\":10}\n"
            "{\"type\":\"call\",\"turn\":4,\"tool\":\"mail\",\"args\":{\"to\":\"a\"},\"idempotency_key\":\"m-1\",\"t_ms\":20}\n"
            "{\"type\":\"call\",\"turn\":5,\"tool\":\"mail\",\"args\":{\"to\":\"b\"},\"idempotency_key\":\"m-1\",\"t_ms\":30}\n"
            "{\"type\":\"call\",\"turn\":6,\"tool\":\"mail\",\"args\":{\"to\":\"a\"},\"idempotency_key\":\"m-1\",\"t_ms\":1500}\n"
            "{\"type\":\"result\",\"status\":\"retryable\",\"side_effect_committed\":true,\"value\":\"sent\"}\n"
            "{\"type\":\"call\",\"turn\":7,\"tool\":\"mail\",\"args\":{\"to\":\"a\"},\"idempotency_key\":\"m-1\"}\n"
            "{\"type\":\"call\",\"turn\":8,\"tool\":\"mail\",\"args\":{\"to\":\"c\"}}\n"
            "{\"type\":\"result\",\"status\":\"fatal\"}\n",
            false);
}

static void t_synthetic_ladder_and_window(void **state) {
  (void)state;
  /* Enough calls to wrap the window's ring several times, with progress
   * resets, cycles broken by progress, and a stop at the end. */
  char text[65536] = "{\"type\":\"run\",\"run_id\":\"l\",\"policy\":{\"repeat\":{\"window\":5},\"limits\":{\"max_steps\":200}}}\n";
  size_t n = strlen(text);
  int pv = 0;
  for (int i = 0; i < 60; i++) {
    const char *tool = i % 3 == 0 ? "a" : i % 3 == 1 ? "b" : "c";
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"%s\",\"args\":{\"k\":%d}}\n", i + 1, tool, i % 4);
    if (i % 3 == 2) pv++;
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":%d}\n", pv);
  }
  for (int i = 0; i < 8; i++)
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"z\",\"args\":{}}\n"
                          "{\"type\":\"result\",\"status\":\"progress\"}\n",
                          100 + i);
  both_ways("ladder+window", text, true);
  both_ways("cycle",
            "{\"type\":\"run\",\"run_id\":\"c\"}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"b\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"c\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":4,\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":5,\"tool\":\"b\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":6,\"tool\":\"c\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":7,\"tool\":\"a\"}\n",
            true);
}

static void t_synthetic_models_world_handoffs(void **state) {
  (void)state;
  both_ways("models",
            "{\"type\":\"run\",\"run_id\":\"m\",\"policy\":{\"limits\":{\"max_cost_usd\":0.01,\"max_tokens\":5000}}}\n"
            "{\"type\":\"model\",\"turn\":1,\"input_tokens\":1000,\"output_tokens\":100,\"max_tokens\":500,\"cost\":0.002}\n"
            "{\"type\":\"model\",\"turn\":2,\"input_tokens\":1000,\"output_tokens\":200,\"cost\":0.003}\n"
            "{\"type\":\"handoff\",\"from\":\"a\",\"to\":\"b\"}\n"
            "{\"type\":\"state\",\"world\":{\"q\":1}}\n"
            "{\"type\":\"state\",\"world\":{\"q\":1}}\n"
            "{\"type\":\"model\",\"turn\":3,\"input_tokens\":1000,\"output_tokens\":300,\"cost\":0.004}\n"
            "{\"type\":\"model\",\"turn\":4,\"input_tokens\":10,\"output_tokens\":10,\"cost\":0.002}\n"
            "{\"type\":\"model\",\"turn\":5,\"input_tokens\":10,\"output_tokens\":10,\"cost\":0.002}\n",
            true);
  both_ways("world",
            "{\"type\":\"run\",\"run_id\":\"s\",\"policy\":{\"limits\":{\"max_handoffs\":3}}}\n"
            "{\"type\":\"state\",\"world\":{\"q\":1}}\n{\"type\":\"state\",\"world\":{\"q\":1}}\n"
            "{\"type\":\"handoff\",\"from\":\"a\",\"to\":\"b\"}\n{\"type\":\"handoff\",\"from\":\"b\",\"to\":\"a\"}\n"
            "{\"type\":\"state\",\"world\":{\"q\":2}}\n{\"type\":\"state\",\"world\":{\"q\":2}}\n"
            "{\"type\":\"state\",\"world\":{\"q\":2}}\n{\"type\":\"state\",\"world\":{\"q\":2}}\n"
            "{\"type\":\"state\",\"world\":{\"q\":2}}\n{\"type\":\"state\",\"world\":{\"q\":2}}\n"
            "{\"type\":\"call\",\"tool\":\"x\"}\n",
            true);
  both_ways("handoffs+cancel",
            "{\"type\":\"run\",\"run_id\":\"h\",\"policy\":{\"limits\":{\"max_handoffs\":1}}}\n"
            "{\"type\":\"handoff\",\"from\":\"a\",\"to\":\"b\",\"t_ms\":3}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"x\"}\n"
            "{\"type\":\"cancel\",\"reason\":\"ops: stuck in a loop\",\"t_ms\":9}\n"
            "{\"type\":\"handoff\",\"from\":\"b\",\"to\":\"a\"}\n"
            "{\"type\":\"result\",\"status\":\"progress\"}\n",
            true);
}

static void t_synthetic_many_keys(void **state) {
  (void)state;
  /* More distinct loop keys, operations and retry waits than the run keeps
   * (they are evicted), and pending calls across every reload. */
  char text[200000] = "{\"type\":\"run\",\"run_id\":\"k\",\"progress_version\":3,\"policy\":{\"tools\":{\"w\":{\"side_effects\":true},"
                      "\"p\":{\"loop_key\":false}},\"limits\":{\"max_steps\":500},\"failure_streak\":0,"
                      "\"no_progress\":{\"results\":0}}}\n";
  size_t n = strlen(text);
  for (int i = 0; i < 40; i++) {
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"w\",\"args\":{\"i\":%d},\"t_ms\":%d}\n"
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"p\",\"args\":{\"i\":%d}}\n"
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"r\",\"args\":{\"i\":%d}}\n"
                          "{\"type\":\"result\",\"call_id\":\"c%d\",\"status\":\"retryable\",\"retry_after_ms\":%d}\n"
                          "{\"type\":\"result\",\"call_id\":\"c%d\",\"status\":\"progress\",\"progress_version\":%d}\n"
                          "{\"type\":\"result\",\"call_id\":\"c%d\",\"status\":\"progress\",\"value\":{\"i\":%d},"
                          "\"operation_id\":\"op%d\"}\n",
                          i + 1, i, i * 10, i + 1, i % 3, i + 1, i, 3 * i + 3, 100 + i, 3 * i + 2, 2 + i / 2,
                          3 * i + 1, i, i);
  }
  /* Replays and retry blocks on old keys. */
  for (int i = 0; i < 40; i += 7)
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"w\",\"args\":{\"i\":%d}}\n"
                          "{\"type\":\"call\",\"turn\":%d,\"tool\":\"r\",\"args\":{\"i\":%d}}\n",
                          200 + i, i, 200 + i, i);
  both_ways("many keys", text, true);
}

static void t_synthetic_unknown_outcome(void **state) {
  (void)state;
  /* The run's own claim runs out (lease = the wall clock; none here: the
   * default 600000 ms) while its call never reported. */
  both_ways("own lease",
            "{\"type\":\"run\",\"run_id\":\"u\",\"policy\":{\"limits\":{\"max_wall_ms\":null}}}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"w\",\"args\":{},\"idempotency_key\":\"K\",\"call_id\":\"a\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"w\",\"args\":{},\"idempotency_key\":\"K\",\"t_ms\":1000}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"w\",\"args\":{},\"idempotency_key\":\"K\",\"t_ms\":700000}\n"
            "{\"type\":\"result\",\"call_id\":\"a\",\"status\":\"progress\"}\n",
            true);
}

/* Text in pieces (chanting, a monologue), episodes, compactions, the
 * block streak, the cascade (hidden tool, escalation, an offered tool) and
 * resumes: every piece of the format-2 state crosses a reload mid-way. */
static void t_synthetic_text_episodes_cascade(void **state) {
  (void)state;
  both_ways("text",
            "{\"type\":\"run\",\"run_id\":\"t\",\"policy\":{\"text\":{\"repeat\":{\"observe\":1,\"stop\":3}}}}\n"
            "{\"type\":\"text\",\"turn\":1,\"text\":\"I will read the fi\"}\n"
            "{\"type\":\"text\",\"turn\":1,\"text\":\"le now. I will read the file now. I w\"}\n"
            "{\"type\":\"text\",\"turn\":1,\"text\":\"ill read the file now. I will read\"}\n"
            "{\"type\":\"text\",\"turn\":1,\"text\":\" the file now.\\n```\\ncode\\n\"}\n"
            "{\"type\":\"text\",\"turn\":1,\"text\":\"code\\n```\\n| a |\\n- item\\n12\"}\n"
            "{\"type\":\"text\",\"turn\":2,\"text\":\"D\\u00e9j\\u00e0 vu \\u65e5\"}\n"
            "{\"type\":\"text\",\"turn\":2,\"text\":\"  again.\"}\n"
            "{\"type\":\"text\",\"turn\":3,\"text\":\"D\\u00e9j\\u00e0 vu \\u65e5 again.\"}\n"
            "{\"type\":\"compaction\"}\n"
            "{\"type\":\"text\",\"turn\":4,\"text\":\"D\\u00e9j\\u00e0 vu\"}\n"
            "{\"type\":\"text\",\"turn\":4,\"text\":\" \\u65e5 again.\"}\n"
            "{\"type\":\"text\",\"turn\":5,\"text\":\"after the stop\"}\n"
            "{\"type\":\"resume\",\"progress_version\":3}\n"
            "{\"type\":\"text\",\"turn\":6,\"text\":\"go go go go go go go go go\"}\n"
            "{\"type\":\"user\",\"text\":\"new task\"}\n"
            "{\"type\":\"text\",\"turn\":7,\"text\":\"Fresh. Fresh. Fresh.\"}\n",
            false);
  both_ways("episodes",
            "{\"type\":\"run\",\"run_id\":\"e\",\"policy\":{\"compaction\":{\"max\":3},\"failure_streak\":3}}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"args\":{}}\n"
            "{\"type\":\"result\",\"status\":\"retryable\"}\n"
            "{\"type\":\"compaction\"}\n{\"type\":\"compaction\"}\n"
            "{\"type\":\"user\"}\n"
            "{\"type\":\"compaction\"}\n{\"type\":\"compaction\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"a\",\"args\":{}}\n"
            "{\"type\":\"result\",\"status\":\"retryable\"}\n"
            "{\"type\":\"state\",\"world\":{\"q\":1}}\n"
            "{\"type\":\"compaction\"}\n{\"type\":\"compaction\"}\n{\"type\":\"compaction\"}\n"
            "{\"type\":\"resume\"}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"a\",\"args\":{}}\n",
            false);
  both_ways("cascade",
            "{\"type\":\"run\",\"run_id\":\"k\",\"policy\":{\"block_streak\":4,\"cascade\":{\"hide_turns\":2,"
            "\"offer\":[\"ask_human\",\"finalize_partial\"],\"escalate\":{\"model\":\"big\",\"turns\":3}}}}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"s\",\"args\":{}}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"s\",\"args\":{}}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"s\",\"args\":{}}\n"
            "{\"type\":\"model\",\"turn\":4,\"input_tokens\":10}\n"
            "{\"type\":\"call\",\"turn\":4,\"tool\":\"s\",\"args\":{}}\n"
            "{\"type\":\"model\",\"turn\":5,\"input_tokens\":10}\n"
            "{\"type\":\"model\",\"turn\":6,\"input_tokens\":10}\n"
            "{\"type\":\"call\",\"turn\":6,\"tool\":\"s\",\"args\":{}}\n"
            "{\"type\":\"call\",\"turn\":6,\"tool\":\"ask_human\",\"args\":{\"question\":\"Which one?\"}}\n"
            "{\"type\":\"call\",\"turn\":7,\"tool\":\"s\",\"args\":{}}\n",
            false);
  both_ways("block streak",
            "{\"type\":\"run\",\"run_id\":\"b\"}\n"
            "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":2,\"tool\":\"b\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":3,\"tool\":\"c\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":4,\"tool\":\"d\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":5,\"tool\":\"e\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":6,\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":7,\"tool\":\"b\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":8,\"tool\":\"c\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":9,\"tool\":\"d\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":10,\"tool\":\"e\"}\n{\"type\":\"result\",\"status\":\"progress\"}\n"
            "{\"type\":\"call\",\"turn\":11,\"tool\":\"a\"}\n{\"type\":\"call\",\"turn\":12,\"tool\":\"b\"}\n"
            "{\"type\":\"call\",\"turn\":13,\"tool\":\"c\"}\n{\"type\":\"call\",\"turn\":14,\"tool\":\"d\"}\n"
            "{\"type\":\"call\",\"turn\":15,\"tool\":\"e\"}\n"
            "{\"type\":\"resume\"}\n"
            "{\"type\":\"call\",\"turn\":16,\"tool\":\"a\"}\n",
            false);
}

/* ------------------------------------------------------------------ */
/* Blobs of older formats, written by the release before format 3      */
/* (commit 0b160f5): its lg_run_save() of the runs old_run() and       */
/* old_model_run() build. They must keep loading, into the state those */
/* calls give today.                                                    */

/* Runs with something in every part of their state, built through the
 * public API (the same code built them with the release that wrote the
 * format-2 fixtures). */
/* The first call of old_run() and rich_blob(): tool "w" with a side
 * effect, its result retryable with an operation id (*c and *x stay set
 * for the caller's next call and result). */
static void retryable_w(lg_run_t *r, lg_canon_t *canon, lg_call_t *c, lg_result_t *x,
                        const char *call_id, int64_t t_ms, const char *op) {
  lg_decision_t d;
  memset(c, 0, sizeof *c);
  c->tool = "w";
  c->args = "{\"i\":1}";
  c->args_len = strlen(c->args);
  c->turn = 1;
  c->call_id = call_id;
  c->t_ms = t_ms;
  assert_int_equal(lg_run_before(r, canon, c, &d, NULL), 0);
  memset(x, 0, sizeof *x);
  x->status = LG_STATUS_RETRYABLE;
  x->retry_after_ms = 500;
  x->side_effect_committed = -1;
  x->operation_id = op;
  x->call_id = call_id;
  x->t_ms = t_ms ? t_ms + 10 : 0;
  assert_int_equal(lg_run_after(r, x, &d, NULL), 0);
}

static lg_run_t *old_run(int which, lg_canon_t *canon, lg_policy_t *p) {
  lg_run_t *r = lg_run_new(which ? "fixture-stopped" : "fixture-active", which ? NULL : "grp", p, NULL,
                           NULL, NULL);
  lg_decision_t d;
  lg_call_t c;
  lg_result_t x;
  retryable_w(r, canon, &c, &x, "c1", 10, "op-1");
  c.tool = "search";
  c.args = "{\"q\":\"a\"}";
  c.args_len = strlen(c.args);
  c.turn = 2;
  c.call_id = "c2";
  c.t_ms = 30;
  lg_run_before(r, canon, &c, &d, NULL);
  x.status = LG_STATUS_PROGRESS;
  x.retry_after_ms = 0;
  x.operation_id = NULL;
  x.call_id = "c2";
  x.progress_version = 4;
  x.t_ms = 40;
  lg_run_after(r, &x, &d, NULL);
  c.call_id = "c3"; /* left pending */
  c.turn = 3;
  c.args = "{\"q\":\"b\"}";
  c.args_len = strlen(c.args);
  lg_run_before(r, canon, &c, &d, NULL);
  lg_model_call_t m = {"m", 3, 10, 10, -1, 50, 0};
  lg_run_model(r, &m, &d, NULL); /* a reservation left open */
  lg_run_state(r, canon, "{\"a\":1}", 7, 60, &d, NULL);
  lg_run_handoff(r, "a", "b", 70, &d, NULL);
  static const char t1[] = "I will read the file now. I will read the file now.\n```\ncode";
  lg_run_text(r, 4, t1, sizeof t1 - 1, NULL, 80, &d, NULL);
  static const char t2[] = "\n```\n| a |\n- item\n  Indented words go here and mid-sen";
  lg_run_text(r, 4, t2, sizeof t2 - 1, NULL, 90, &d, NULL);
  lg_run_compaction(r, 100, &d);
  if (which) lg_run_cancel(r, "because", 110, &d);
  return r;
}

static const char OLD_POLICY[] =
    "{\"tools\":{\"w\":{\"side_effects\":true}},\"text\":{\"repeat\":{\"observe\":1,\"stop\":5}}}";

static lg_run_t *old_model_run(void) {
  lg_run_t *r = lg_run_new("old", "g", NULL, NULL, NULL, NULL);
  assert_non_null(r);
  lg_model_call_t m = {NULL, 1, 10, 10, -1, 600, 0};
  lg_decision_t d;
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  assert_int_equal(lg_run_handoff(r, "a", "b", 1, &d, NULL), 0);
  return r;
}

/* 1877 bytes */
static const char fixture_v2_0[] =
    "\x4c\x47\x52\x02\x00\x00\x00\x00\x00\x00\x00\x0e\x00\x00\x00\x66\x69\x78\x74\x75\x72\x65\x2d\x61\x63\x74\x69\x76\x65\x03\x00\x00"
    "\x00\x67\x72\x70\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x64\x00\x00\x00\x00\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00"
    "\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\xdb\x53\x84\x06\xb3\xe3\x68\xfe\x01\x00\x00\x00"
    "\x00\x00\x00\x00\xa8\x5f\x0e\x16\xb4\x6b\xa0\xe6\x02\x00\x00\x00\x00\x00\x00\x00\x83\xf7\x34\x4e\x3b\xeb\xc6\x63\x03\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x2d\x7a\xc5\x5c\x7f\xbd\x5a\x01\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x77\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    "\x00\x06\x00\x00\x00\x73\x65\x61\x72\x63\x68\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00"
    "\x00\x00\x00\xfe\x68\xe3\xb3\x06\x84\x53\xdb\x7b\x17\xf0\x68\x0a\xfd\xee\x87\x71\x20\x65\x23\x66\xae\xb6\x96\x1a\xfd\x3e\x43\x62"
    "\x61\x2b\x94\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"
    "\x00\x00\x00\xe6\xa0\x6b\xb4\x16\x0e\x5f\xa8\x25\x5a\xc0\x31\xd6\x9e\xe6\x2a\x8e\xb3\x89\xea\xf0\xd1\xfa\x08\xdb\x47\xe3\x60\x7c"
    "\x23\xf6\xb0\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00"
    "\x00\x00\x00\x63\xc6\xeb\x3b\x4e\x34\xf7\x83\x9a\x89\x34\x3a\x0f\xf5\xae\x68\xb6\x66\xcb\xe9\x30\x2c\x18\x11\xb9\x0b\x78\x37\xea"
    "\xf5\x7c\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00"
    "\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x63\x33\xff\xff\xff\xff\x83\xf7\x34\x4e\x3b\xeb\xc6\x63\x01\x00\x00"
    "\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\xdb\x53\x84\x06\xb3\xe3\x68\xfe\x08\x02\x00\x00\x00\x00\x00\x00\x01\x00\x00"
    "\x00\x00\x00\x00\x00\x43\x00\x00\x00\x6c\x67\x3a\x38\x30\x65\x31\x33\x66\x64\x62\x36\x36\x63\x33\x33\x39\x30\x64\x30\x63\x33\x31"
    "\x37\x36\x61\x38\x65\x31\x63\x63\x64\x66\x64\x38\x37\x66\x32\x35\x38\x63\x31\x31\x65\x32\x62\x64\x38\x32\x33\x37\x62\x39\x37\x35"
    "\x64\x66\x39\x39\x31\x62\x64\x36\x35\x65\x63\x63\x04\x00\x00\x00\x6f\x70\x2d\x31\x04\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x32\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x32\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"
    "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x49\x20\x60\x00\x00\x00\x00\x00\x00\x00\x00\x00\x16\x8b\x62\x3c\x07\x00\x00\x00\xef\x2a\xec\x05\x05\x00\x00"
    "\x00\x5a\xd7\x93\xea\x8a\xaa\xb7\x5c\x4b\x77\x20\x42\xcb\x65\x3b\x21\xa6\xc2\x29\x0f\xf7\x9a\xb1\x28\x64\x03\x0c\xcc\x8d\x6d\x10"
    "\x10\xc5\xa3\xdf\xce\x1c\xb2\x0e\xb4\x43\x57\xea\xaa\xf7\x9a\xb1\x28\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x05\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x78\x84\xba\x25\x78\x84\xba\x25\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\xbb\xbc\x30\x3f\x50\xf8\x7f\x03\x70\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff";
/* 1932 bytes */
static const char fixture_v2_1[] =
    "\x4c\x47\x52\x02\x00\x00\x00\x00\x00\x00\x00\x0f\x00\x00\x00\x66\x69\x78\x74\x75\x72\x65\x2d\x73\x74\x6f\x70\x70\x65\x64\xff\xff"
    "\xff\xff\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00"
    "\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x64\x00\x00\x00\x00\x00\x00\x00\x0b\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00"
    "\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\xdb\x53\x84\x06\xb3\xe3\x68\xfe\x01\x00\x00\x00\x00\x00"
    "\x00\x00\xa8\x5f\x0e\x16\xb4\x6b\xa0\xe6\x02\x00\x00\x00\x00\x00\x00\x00\x83\xf7\x34\x4e\x3b\xeb\xc6\x63\x03\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x2d\x7a\xc5\x5c\x7f\xbd\x5a\x01\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x77\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x06"
    "\x00\x00\x00\x73\x65\x61\x72\x63\x68\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00"
    "\x00\xfe\x68\xe3\xb3\x06\x84\x53\xdb\x7b\x17\xf0\x68\x0a\xfd\xee\x87\x71\x20\x65\x23\x66\xae\xb6\x96\x1a\xfd\x3e\x43\x62\x61\x2b"
    "\x94\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    "\x00\xe6\xa0\x6b\xb4\x16\x0e\x5f\xa8\x25\x5a\xc0\x31\xd6\x9e\xe6\x2a\x8e\xb3\x89\xea\xf0\xd1\xfa\x08\xdb\x47\xe3\x60\x7c\x23\xf6"
    "\xb0\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00"
    "\x00\x63\xc6\xeb\x3b\x4e\x34\xf7\x83\x9a\x89\x34\x3a\x0f\xf5\xae\x68\xb6\x66\xcb\xe9\x30\x2c\x18\x11\xb9\x0b\x78\x37\xea\xf5\x7c"
    "\x01\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00"
    "\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x63\x33\xff\xff\xff\xff\x83\xf7\x34\x4e\x3b\xeb\xc6\x63\x01\x00\x00\x00\x00"
    "\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\xdb\x53\x84\x06\xb3\xe3\x68\xfe\x08\x02\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"
    "\x00\x00\x00\x43\x00\x00\x00\x6c\x67\x3a\x64\x62\x37\x32\x61\x62\x39\x62\x31\x63\x64\x64\x66\x31\x37\x35\x39\x61\x64\x30\x36\x39"
    "\x31\x36\x37\x30\x31\x33\x35\x66\x33\x37\x36\x37\x63\x63\x61\x32\x39\x66\x35\x65\x64\x34\x39\x33\x61\x66\x37\x34\x33\x30\x65\x31"
    "\x66\x61\x63\x32\x37\x32\x64\x35\x37\x66\x04\x00\x00\x00\x6f\x70\x2d\x31\x04\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00"
    "\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x32\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00"
    "\x00\x00\x32\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x12\x00\x00\x00\x00\x00"
    "\x00\x00\x07\x00\x00\x00\x62\x65\x63\x61\x75\x73\x65\x0b\x00\x00\x00\x6b\x69\x6c\x6c\x5f\x73\x77\x69\x74\x63\x68\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x27\x00\x00\x00\x41\x6e\x20\x6f\x70\x65\x72\x61\x74\x6f\x72\x20\x73\x74\x6f\x70"
    "\x70\x65\x64\x20\x74\x68\x69\x73\x20\x72\x75\x6e\x20\x28\x62\x65\x63\x61\x75\x73\x65\x29\x2e\xff\xff\xff\xff\xff\xff\xff\xff\xff"
    "\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x6e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x49\x20\x60\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x16\x8b\x62\x3c\x07\x00\x00\x00\xef\x2a\xec\x05\x05\x00\x00\x00\x5a\xd7\x93\xea\x8a\xaa\xb7\x5c"
    "\x4b\x77\x20\x42\xcb\x65\x3b\x21\xa6\xc2\x29\x0f\xf7\x9a\xb1\x28\x64\x03\x0c\xcc\x8d\x6d\x10\x10\xc5\xa3\xdf\xce\x1c\xb2\x0e\xb4"
    "\x43\x57\xea\xaa\xf7\x9a\xb1\x28\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00"
    "\x05\x00\x00\x00\x00\x00\x00\x00\x78\x84\xba\x25\x78\x84\xba\x25\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xbb\xbc\x30\x3f\x50\xf8\x7f\x03"
    "\x70\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff";
/* 1496 bytes */
static const char fixture_v2_old[] =
    "\x4c\x47\x52\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x6f\x6c\x64\x01\x00\x00\x00\x67\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"
    "\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x58\x02\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x01"
    "\x00\x00\x00\x00\x00\x00\x00\x58\x02\x00\x00\x00\x00\x00\x00\x14\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff"
    "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xc5\x9d\x1c\x81\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x25\x23\x22\x84\xe4\x9c\xf2\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff";

/* Loads an old blob and checks that it saves (in today's format) as the
 * run built today does, in the normalised form (see norm_save). */
static void old_loads_as(const char *blob, size_t n, lg_policy_t *p, const lg_run_t *today) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *o = lg_run_load(blob, n, p, NULL, &err);
  if (!o) fail_msg("an old blob (format %d) was refused: %s", blob[3], err.message);
  char *b1, *b2;
  size_t n1, n2;
  norm_save(o, p, &b1, &n1);
  norm_save(today, p, &b2, &n2);
  assert_true(b1[3] == 3); /* saved again in today's format */
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  char *e1 = lg_run_envelope_json(o), *e2 = lg_run_envelope_json(today);
  assert_string_equal(e1, e2);
  lg_free(e1);
  lg_free(e2);
  lg_free(b1);
  lg_free(b2);
  lg_run_free(o);
}

/* Format 2: an active run (pending call, open reservation, retry wait,
 * operation, world, an open text response mid-sentence, a compaction)
 * and the same run stopped. They load into exactly the state the same
 * calls give today, and decide the same next events. */
static void t_format2_loads(void **state) {
  (void)state;
  lg_policy_t *p = lg_policy_parse(OLD_POLICY, strlen(OLD_POLICY), NULL, NULL);
  assert_non_null(p);
  static const struct {
    const char *b;
    size_t n;
  } old[] = {{fixture_v2_0, sizeof fixture_v2_0 - 1}, {fixture_v2_1, sizeof fixture_v2_1 - 1}};
  for (int w = 0; w < 2; w++) {
    assert_int_equal((unsigned char)old[w].b[3], 2);
    lg_run_t *today = old_run(w, C, p);
    assert_int_equal(lg_run_stopped(today), w);
    old_loads_as(old[w].b, old[w].n, p, today);
    /* Both decide the next events alike. */
    lg_run_t *o = lg_run_load(old[w].b, old[w].n, p, NULL, NULL);
    assert_non_null(o);
    lg_run_t *runs[2] = {today, o};
    dec_t dd[2][3];
    for (int k = 0; k < 2; k++) {
      lg_decision_t d;
      static const char t3[] = "tence. I will read the file now. I will read the file now.";
      dec_copy(&dd[k][0], lg_run_text(runs[k], 4, t3, sizeof t3 - 1, NULL, 120, &d, NULL), &d);
      lg_call_t c;
      memset(&c, 0, sizeof c);
      c.tool = "search";
      c.args = "{\"q\":\"b\"}";
      c.args_len = strlen(c.args);
      c.turn = 5;
      c.call_id = "c4";
      dec_copy(&dd[k][1], lg_run_before(runs[k], C, &c, &d, NULL), &d);
      lg_result_t x;
      memset(&x, 0, sizeof x);
      x.status = LG_STATUS_PROGRESS;
      x.call_id = "c3";
      x.side_effect_committed = -1;
      dec_copy(&dd[k][2], lg_run_after(runs[k], &x, &d, NULL), &d);
    }
    for (int i = 0; i < 3; i++) dec_same("format 2", i, &dd[0][i], &dd[1][i]);
    lg_run_free(o);
    lg_run_free(today);
  }
  lg_policy_free(p);
}

/* Format 1 (before the text and cascade guards): the format 2 blob of
 * old_model_run() without format 2's tail loads, with those guards
 * starting from nothing. */
static void t_format1_loads(void **state) {
  (void)state;
  size_t n = sizeof fixture_v2_old - 1;
  /* Format 2 appends a fixed tail for a run in this state (no answer):
   * 2 streaks, 7 text flags, the line head, 4 word/sentence hashes, the two
   * rings, their counts, the monologue, the cascade and a NULL string. */
  const size_t tail = 16 + 56 + 12 + 16 + 4 * 64 + 16 + 8 * 32 + 16 + 32 + 32 + 32 + 16 + 4;
  assert_true(n > tail);
  char *v1 = malloc(n - tail);
  memcpy(v1, fixture_v2_old, n - tail);
  v1[3] = 1;
  lg_run_t *today = old_model_run();
  old_loads_as(fixture_v2_old, n, NULL, today);
  old_loads_as(v1, n - tail, NULL, today);
  /* A format from the future is refused. */
  lg_error_t err;
  memset(&err, 0, sizeof err);
  v1[3] = 4;
  assert_null(lg_run_load(v1, n - tail, NULL, NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
  lg_run_free(today);
  free(v1);
}

/* Format 3 leaves out what a run has not touched: a fresh run is a few
 * hundred bytes, and an agent loop of 20 calls stays well under 4 KiB. */
static void t_format3_compact(void **state) {
  (void)state;
  lg_run_t *r = lg_run_new("b123", NULL, NULL, NULL, NULL, NULL);
  char *b;
  size_t n;
  assert_int_equal(lg_run_save(r, &b, &n), 0);
  assert_true(n < 300);
  lg_free(b);
  for (int i = 1; i <= 20; i++) {
    char a[64];
    snprintf(a, sizeof a, "{\"q\":\"item %d\",\"page\":%d}", i, i % 7);
    lg_call_t c;
    memset(&c, 0, sizeof c);
    c.tool = "search";
    c.args = a;
    c.args_len = strlen(a);
    c.turn = i;
    lg_decision_t d;
    assert_int_equal(lg_run_before(r, C, &c, &d, NULL), 0);
    lg_result_t x;
    memset(&x, 0, sizeof x);
    x.status = LG_STATUS_PROGRESS;
    x.side_effect_committed = -1;
    assert_int_equal(lg_run_after(r, &x, &d, NULL), 0);
  }
  assert_int_equal(lg_run_save(r, &b, &n), 0);
  printf("  format 3: an agent loop of 20 calls saves in %zu bytes\n", n);
  assert_true(n < 1200);
  lg_free(b);
  lg_run_free(r);
}

static void t_no_checkpoint_vs_zero(void **state) {
  (void)state;
  both_ways("checkpoint 0",
            "{\"type\":\"run\",\"run_id\":\"z\",\"progress_version\":0}\n"
            "{\"type\":\"call\",\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":0}\n"
            "{\"type\":\"call\",\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":0}\n"
            "{\"type\":\"call\",\"tool\":\"a\"}\n{\"type\":\"result\",\"status\":\"progress\",\"progress_version\":0}\n",
            true);
}

/* A reservation not settled yet survives a reload: it is still held
 * against the cap and still settles by its id. */
static void t_open_reservation(void **state) {
  (void)state;
  lg_policy_t *p = lg_policy_parse("{\"limits\":{\"max_cost_usd\":0.001}}", strlen("{\"limits\":{\"max_cost_usd\":0.001}}"), NULL, NULL);
  assert_non_null(p);
  lg_run_t *r = lg_run_new("res", NULL, p, NULL, NULL, NULL);
  lg_model_call_t m = {NULL, 1, 10, 10, -1, 600000, 0};
  lg_decision_t d;
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  int64_t id = d.reservation;
  char *b;
  size_t n;
  assert_int_equal(lg_run_save(r, &b, &n), 0);
  lg_run_free(r);
  r = lg_run_load(b, n, p, NULL, NULL);
  lg_free(b);
  assert_non_null(r);
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  assert_int_equal(d.action, LG_ACT_STOP); /* 600000 held + 600000 > cap */
  assert_int_equal(d.reason, LG_R_COST_CAP);
  lg_run_free(r);
  /* Settled after the reload. */
  r = lg_run_new("res", NULL, p, NULL, NULL, NULL);
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  id = d.reservation;
  assert_int_equal(lg_run_save(r, &b, &n), 0);
  lg_run_free(r);
  r = lg_run_load(b, n, p, NULL, NULL);
  lg_free(b);
  assert_int_equal(lg_run_usage(r, id, 10, 10, 100000, 0), 0);
  assert_int_equal(lg_run_usage(r, id, 10, 10, 100000, 0), LG_ENOTFOUND);
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  assert_true(d.reservation > id);
  lg_counters_t c;
  lg_run_counters(r, &c);
  assert_int_equal(c.cost_nusd, 100000);
  lg_run_free(r);
  lg_policy_free(p);
}

/* ------------------------------------------------------------------ */
/* Bad blobs.                                                           */

/* A run with something in every part of its state, stopped. */
static void rich_blob(char **b, size_t *n) {
  lg_policy_t *p = lg_policy_parse("{\"tools\":{\"w\":{\"side_effects\":true}}}", strlen("{\"tools\":{\"w\":{\"side_effects\":true}}}"), NULL, NULL);
  assert_non_null(p);
  lg_run_t *r = lg_run_new("rich-run", "grp", p, NULL, NULL, NULL);
  assert_non_null(r);
  lg_decision_t d;
  lg_call_t c;
  lg_result_t x;
  retryable_w(r, C, &c, &x, NULL, 0, "op");
  c.tool = "QQQQtoolQQQQ"; /* left pending */
  c.turn = 2;
  assert_int_equal(lg_run_before(r, C, &c, &d, NULL), 0);
  lg_model_call_t m = {"m", 2, 10, 10, -1, 5, 0};
  assert_int_equal(lg_run_model(r, &m, &d, NULL), 0);
  assert_int_equal(lg_run_state(r, C, "{\"a\":1}", 7, 0, &d, NULL), 0);
  assert_int_equal(lg_run_handoff(r, "a", "b", 0, &d, NULL), 0);
  assert_int_equal(lg_run_cancel(r, "because", 1, &d), 0);
  assert_int_equal(lg_run_save(r, b, n), 0);
  lg_run_free(r);
  lg_policy_free(p);
}

/* Uses a run loaded from a damaged blob: nothing may crash or leak. */
static void exercise(lg_run_t *r) {
  char *e = lg_run_envelope_json(r);
  assert_non_null(e);
  json_error_t je;
  json_t *j = json_loads(e, 0, &je);
  /* A damaged name may hold bytes that are not UTF-8; the envelope copies
   * names as they are (as it does for lg_run_new's), so only that is
   * forgiven here. */
  if (!j && !strstr(je.text, "decode byte") && !strstr(je.text, "UTF-8"))
    fail_msg("envelope of a loaded run is not JSON (%s at %d): %.300s", je.text, je.position, e);
  json_decref(j);
  lg_free(e);
  lg_decision_t d;
  lg_error_t err;
  lg_result_t x;
  memset(&x, 0, sizeof x);
  x.status = LG_STATUS_RETRYABLE;
  x.retry_after_ms = 5;
  x.side_effect_committed = -1;
  (void)lg_run_after(r, &x, &d, &err);
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = "w";
  c.args = "{\"i\":1}";
  c.args_len = 7;
  (void)lg_run_before(r, C, &c, &d, &err);
  lg_model_call_t m = {NULL, 1, 1, 1, -1, 1, 0};
  if (!lg_run_model(r, &m, &d, &err) && d.action == LG_ACT_EXECUTE) (void)lg_run_usage(r, 0, 1, 1, 1, 0);
  (void)lg_run_state(r, C, "{}", 2, 0, &d, &err);
  (void)lg_run_handoff(r, "a", "b", 0, &d, &err);
  char *b;
  size_t n;
  if (!lg_run_save(r, &b, &n)) lg_free(b);
  (void)lg_run_cancel(r, NULL, 0, &d);
}

static void t_truncated_and_extended(void **state) {
  (void)state;
  char *b;
  size_t n;
  rich_blob(&b, &n);
  /* The intact blob loads and decides like the original (a stopped run). */
  lg_run_t *r = lg_run_load(b, n, NULL, NULL, NULL);
  assert_non_null(r);
  assert_string_equal(lg_run_terminal_reason(r), "operator_cancelled_loop");
  assert_string_equal(lg_run_group(r), "grp");
  lg_run_free(r);
  for (size_t k = 0; k < n; k++) {
    lg_error_t err;
    memset(&err, 0, sizeof err);
    r = lg_run_load(b, k, NULL, NULL, &err);
    if (r) fail_msg("a blob cut to %zu of %zu bytes loaded", k, n);
    assert_true(err.code < 0);
    assert_true(err.message[0] != 0);
  }
  char *longer = malloc(n + 1);
  memcpy(longer, b, n);
  longer[n] = 0;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_null(lg_run_load(longer, n + 1, NULL, NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
  /* Not a saved run, or a format from the future. */
  memcpy(longer, b, n);
  longer[0] = 'X';
  assert_null(lg_run_load(longer, n, NULL, NULL, &err));
  memcpy(longer, b, n);
  longer[3] ^= 0x7f; /* the format number */
  assert_null(lg_run_load(longer, n, NULL, NULL, &err));
  assert_null(lg_run_load("", 0, NULL, NULL, &err));
  free(longer);
  lg_free(b);
}

static void t_mutated(void **state) {
  (void)state;
  char *b;
  size_t n;
  rich_blob(&b, &n);
  char *m = malloc(n);
  long loaded = 0, refused = 0;
  static const int ops[] = {0, 1, 2, 3, 4};
  for (size_t k = 0; k < n; k++) {
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
      memcpy(m, b, n);
      unsigned char *u = (unsigned char *)m + k;
      switch (ops[o]) {
      case 0: *u = 0; break;
      case 1: *u = 0xff; break;
      case 2: *u ^= 0x01; break;
      case 3: *u ^= 0x80; break;
      case 4: *u = (unsigned char)(*u + 0x10); break;
      }
      if (!memcmp(m, b, n)) continue;
      lg_error_t err;
      memset(&err, 0, sizeof err);
      lg_run_t *r = lg_run_load(m, n, NULL, NULL, &err);
      if (!r) {
        assert_true(err.code < 0);
        refused++;
        continue;
      }
      loaded++;
      exercise(r);
      lg_run_free(r);
    }
  }
  /* Whole 8-byte fields set to odd values, at every offset. */
  static const int64_t vals[] = {0, 1, -1, 2, 16, 17, 64, 65, INT64_MAX, INT64_MIN, 1000001};
  for (size_t k = 0; k + 8 <= n; k++) {
    for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
      memcpy(m, b, n);
      for (int i = 0; i < 8; i++) m[k + (size_t)i] = (char)((uint64_t)vals[v] >> (8 * i));
      lg_error_t err;
      memset(&err, 0, sizeof err);
      lg_run_t *r = lg_run_load(m, n, NULL, NULL, &err);
      if (!r) {
        refused++;
        continue;
      }
      loaded++;
      exercise(r);
      lg_run_free(r);
    }
  }
  printf("  %zu-byte blob: %ld mutations refused, %ld loaded and exercised\n", n, refused, loaded);
  assert_true(refused > 0);
  free(m);
  lg_free(b);
}

/* A blob whose pending call names a tool of an empty tool table (written
 * by hand from a real blob): it must be refused, not loaded into a run
 * whose next result dereferences the empty table. */
static void t_pending_without_tools(void **state) {
  (void)state;
  lg_run_t *r = lg_run_new("r", NULL, NULL, NULL, NULL, NULL);
  lg_call_t c;
  memset(&c, 0, sizeof c);
  c.tool = "QQQQtoolQQQQ";
  c.turn = 1;
  lg_decision_t d;
  assert_int_equal(lg_run_before(r, C, &c, &d, NULL), 0); /* one tool, one tried key, one pending call */
  char *b;
  size_t n;
  assert_int_equal(lg_run_save(r, &b, &n), 0);
  lg_run_free(r);
  /* Format 3's tool table is: count (a zigzag varint: 1 is 0x02), then per
   * tool its name (varint length + 1, the bytes) and two counters (small
   * varints, a byte each here); the tried list follows: count, then per key
   * its 32 bytes and four small varints. Drop the tool and the tried key. */
  static const char name[] = "\x0dQQQQtoolQQQQ";
  char *at = NULL;
  for (size_t k = 0; k + sizeof name - 1 <= n; k++)
    if (!memcmp(b + k, name, sizeof name - 1)) {
      at = b + k;
      break;
    }
  assert_non_null(at);
  size_t tools = (size_t)(at - b) - 1, tool_len = 1 + 12 + 2, tried_len = 1 + 32 + 4;
  assert_int_equal(b[tools], 0x02);                /* one tool */
  assert_int_equal(b[tools + 1 + tool_len], 0x02); /* one tried key */
  char *m = malloc(n);
  size_t mn = 0;
  memcpy(m, b, tools);
  mn = tools;
  m[mn++] = 0; /* no tools */
  m[mn++] = 0; /* no tried keys */
  size_t rest = tools + 1 + tool_len + tried_len;
  memcpy(m + mn, b + rest, n - rest);
  mn += n - rest;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  r = lg_run_load(m, mn, NULL, NULL, &err);
  if (r) {
    exercise(r); /* what would crash */
    lg_run_free(r);
    fail_msg("a pending call of a tool that is not in the table was loaded");
  }
  assert_true(err.code < 0);
  /* Control: the blob before the surgery loads fine. */
  memcpy(m, b, n);
  r = lg_run_load(m, n, NULL, NULL, &err);
  assert_non_null(r);
  lg_run_free(r);
  free(m);
  lg_free(b);
}

int main(void) {
  C = lg_canon_new();
  if (!C) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_fixtures_reload_every_event),
      cmocka_unit_test(t_synthetic_writes),
      cmocka_unit_test(t_synthetic_ladder_and_window),
      cmocka_unit_test(t_synthetic_models_world_handoffs),
      cmocka_unit_test(t_synthetic_many_keys),
      cmocka_unit_test(t_synthetic_unknown_outcome),
      cmocka_unit_test(t_synthetic_text_episodes_cascade),
      cmocka_unit_test(t_format1_loads),
      cmocka_unit_test(t_format2_loads),
      cmocka_unit_test(t_format3_compact),
      cmocka_unit_test(t_no_checkpoint_vs_zero),
      cmocka_unit_test(t_open_reservation),
      cmocka_unit_test(t_truncated_and_extended),
      cmocka_unit_test(t_mutated),
      cmocka_unit_test(t_pending_without_tools),
  };
  int rc = cmocka_run_group_tests_name("persist", tests, NULL, NULL);
  lg_canon_free(C);
  return rc;
}
