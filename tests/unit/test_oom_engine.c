/*
 * test_oom_engine.c — out-of-memory at every allocation of a run's whole
 * life and of a trace replay (docs/internals/style.md: "failing allocation N, then N+1,
 * ...").
 *
 * A counting allocator is installed with lg_set_allocator() before any
 * other call (it carries jansson's allocations too). For N = 1, 2, ... a
 * scenario runs with its N-th allocation failing — only that one, or that
 * one and every later one — until a run no longer reaches N. Then:
 *
 *   - every failure is clean: NULL or LG_ENOMEM (err->code too);
 *   - a call that returned LG_ENOMEM left its object as it was: retried
 *     with memory back, it decides what the uninterrupted reference run
 *     decided, and so does every later event (a state damaged by a failure
 *     that shows up later is the bug this test is for);
 *   - a call that absorbed the failure and succeeded made the reference's
 *     decision, steer message included;
 *   - at the end no allocation is outstanding.
 *
 * The scenarios: a run through lg_run_new, before/after (with a side
 * effect, a replay, a retry wait, a block), model/usage, state, handoff,
 * the envelope, save + load, and a stop by the ladder (which records the
 * refused call); one that ends with an unknown outcome; one with a cancel.
 * And lg_replay_buffer over every fixture trace, which must either fail
 * with LG_ENOMEM or replay exactly as the reference did.
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

#include "loopguard.h"

/* ------------------------------------------------------------------ */
/* The failing allocator. The replay may allocate from a reader thread, */
/* so the counters are atomic.                                          */

static long g_calls;     /* allocation attempts since arm() */
static long g_fail_at;   /* the attempt that fails (1-based), 0: none */
static int g_fail_rest;  /* also every attempt after it */
static long g_failed;    /* attempts made to fail */
static long g_live;      /* successful allocations not yet freed */

static bool should_fail(void) {
  long n = __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST);
  long at = __atomic_load_n(&g_fail_at, __ATOMIC_SEQ_CST);
  if (at && (n == at || (g_fail_rest && n > at))) {
    __atomic_add_fetch(&g_failed, 1, __ATOMIC_SEQ_CST);
    return true;
  }
  return false;
}
static void *c_malloc(size_t n) {
  if (should_fail()) return NULL;
  void *p = malloc(n);
  if (p) __atomic_add_fetch(&g_live, 1, __ATOMIC_SEQ_CST);
  return p;
}
static void *c_realloc(void *p, size_t n) {
  if (should_fail()) return NULL;
  void *q = realloc(p, n);
  if (q && !p) __atomic_add_fetch(&g_live, 1, __ATOMIC_SEQ_CST);
  return q;
}
static void c_free(void *p) {
  if (!p) return;
  __atomic_sub_fetch(&g_live, 1, __ATOMIC_SEQ_CST);
  free(p);
}
static long g_n; /* the N of the current run, for messages */
static void arm(long n, int rest) {
  g_n = n;
  g_calls = 0;
  g_failed = 0;
  g_fail_rest = rest;
  __atomic_store_n(&g_fail_at, n, __ATOMIC_SEQ_CST);
}
static void disarm(void) { __atomic_store_n(&g_fail_at, 0, __ATOMIC_SEQ_CST); }
static long failed(void) { return __atomic_load_n(&g_failed, __ATOMIC_SEQ_CST); }

#define MAX_N 20000

/* ------------------------------------------------------------------ */
/* Decisions, described as one string for comparison.                  */

static void describe(const lg_decision_t *d, bool with_message, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s/%s/%s rep=%u fp=%s id=%s key=%s msg=%s hide=%s:%u alt=%u next=%s resv=%lld esc=%s:%u saved=%.*s",
           lg_action_name(d->action), lg_reason_name(d->reason), d->reason_text ? d->reason_text : "(null)",
           d->guard ? d->guard : "(null)", d->repeat, d->fingerprint, d->call_id ? d->call_id : "-",
           d->idempotency_key ? d->idempotency_key : "-",
           with_message ? (d->message ? d->message : "-") : "?", d->hide_tool ? d->hide_tool : "-",
           d->hide_turns, d->alternatives, lg_next_name(d->next_allowed_action), (long long)d->reservation,
           d->escalate_model ? d->escalate_model : "-", d->escalate_turns, d->saved_result ? (int)d->saved_result_len : 1, d->saved_result ? d->saved_result : "-");
}

/* ------------------------------------------------------------------ */
/* Engine scenarios.                                                    */

enum kind { K_CALL, K_RESULT, K_MODEL, K_STATE, K_HANDOFF, K_CANCEL, K_ENVELOPE, K_SAVELOAD,
            K_TEXT, K_USER, K_COMPACTION, K_RESUME };

typedef struct step {
  enum kind k;
  const char *tool, *args, *id, *key; /* calls; id also for results */
  int64_t turn, t;
  lg_status_t st;                     /* results */
  int64_t pv;                         /* -1: none */
  int64_t retry;                      /* -1: none */
  const char *value;
  int committed;
  const char *text;                   /* state: the world; cancel: the reason */
} step_t;

#define CALLK(tool, args, turn, t, key) {K_CALL, tool, args, NULL, key, turn, t, 0, -1, -1, NULL, -1, NULL}
#define CALL(tool, args, turn, t) CALLK(tool, args, turn, t, NULL)
#define RES(st, pv, retry, value, t) {K_RESULT, NULL, NULL, NULL, NULL, 0, t, st, pv, retry, value, -1, NULL}
#define RESID(id, st, value, t) {K_RESULT, NULL, NULL, id, NULL, 0, t, st, -1, -1, value, -1, NULL}
#define MODEL(in, cost, t) {K_MODEL, NULL, NULL, NULL, NULL, 0, t, 0, in, 0, NULL, (int)(cost), NULL}
#define STATE(w, t) {K_STATE, NULL, NULL, NULL, NULL, 0, t, 0, -1, -1, NULL, -1, w}
#define HANDOFF(t) {K_HANDOFF, "a", "b", NULL, NULL, 0, t, 0, -1, -1, NULL, -1, NULL}
#define CANCEL(why, t) {K_CANCEL, NULL, NULL, NULL, NULL, 0, t, 0, -1, -1, NULL, -1, why}
#define ENVELOPE {K_ENVELOPE, NULL, NULL, NULL, NULL, 0, 0, 0, -1, -1, NULL, -1, NULL}
#define SAVELOAD {K_SAVELOAD, NULL, NULL, NULL, NULL, 0, 0, 0, -1, -1, NULL, -1, NULL}
#define TEXT(turn, s, t) {K_TEXT, NULL, NULL, NULL, NULL, turn, t, 0, -1, -1, NULL, -1, s}
#define USER(t) {K_USER, NULL, NULL, NULL, NULL, 0, t, 0, -1, -1, NULL, -1, NULL}
#define COMPACTION(t) {K_COMPACTION, NULL, NULL, NULL, NULL, 0, t, 0, -1, -1, NULL, -1, NULL}
#define RESUME(pv, t) {K_RESUME, NULL, NULL, NULL, NULL, 0, t, 0, pv, -1, NULL, -1, NULL}

static const char *POLICY =
    "{\"limits\":{\"max_cost_usd\":1,\"max_tokens\":100000},"
    "\"tools\":{\"w\":{\"side_effects\":true,\"loop_key\":{\"id\":[\"trim\",\"lower\"]}},"
    "\"p\":{\"loop_key\":false}}}";

static const step_t S_LADDER[] = {
    CALL("w", "{\"id\":\" A \",\"n\":1}", 1, 0),
    RES(LG_STATUS_PROGRESS, 1, -1, "{\"ok\":true}", 5),
    CALL("w", "{\"id\":\"a\"}", 2, 6), /* replay */
    MODEL(100, 2000, 7),
    CALL("s", "{\"q\":1}", 3, 8),
    CALL("p", "{}", 3, 8),
    RESID("c3", LG_STATUS_RETRYABLE, NULL, 9),
    {K_RESULT, NULL, NULL, "c4", NULL, 0, 9, LG_STATUS_PROGRESS, 1, -1, "\"x\"", -1, NULL},
    CALL("s", "{\"q\":1}", 4, 10), /* observe */
    RES(LG_STATUS_RETRYABLE, -1, 500, NULL, 11),
    CALL("s", "{\"q\":1}", 5, 12), /* retry_too_soon */
    STATE("{\"cursor\":1}", 13),
    STATE("{\"cursor\":1}", 13),
    HANDOFF(14),
    ENVELOPE,
    SAVELOAD,
    MODEL(50, 1000, 15),
    CALL("s", "{\"q\":1}", 6, 600), /* block: same_call_repeat */
    CALL("s", "{\"q\":1}", 7, 601),
    SAVELOAD,
    CALL("s", "{\"q\":1}", 8, 602), /* stop: the 6th */
    CALL("s", "{\"q\":2}", 9, 603), /* after the stop */
    ENVELOPE,
    SAVELOAD,
    ENVELOPE,
};

/* No wall clock: the run's claims get the default lease, 600000 ms. */
static const char *POLICY_OUTCOME = "{\"limits\":{\"max_wall_ms\":null},\"tools\":{\"w\":{\"side_effects\":true}}}";

static const step_t S_OUTCOME[] = {
    CALLK("w", "{\"id\":\"b\"}", 1, 0, "K-1"), /* left without a result */
    CALLK("w", "{\"id\":\"b\"}", 1, 1, "K-1"), /* in progress */
    CALLK("w", "{\"id\":\"c\"}", 2, 2, "K-1"), /* mismatch */
    SAVELOAD,
    CALLK("w", "{\"id\":\"b\"}", 3, 700000, "K-1"), /* the lease ran out */
    ENVELOPE,
};

static const step_t S_CANCEL[] = {
    CALL("a", "{}", 1, 0),
    RES(LG_STATUS_PROGRESS, 7, -1, "[1,2,3]", 1),
    MODEL(10, 10, 2),
    CANCEL("an operator's own reason", 3),
    CALL("a", "{}", 2, 4),
    ENVELOPE,
    SAVELOAD,
    ENVELOPE,
};

/* The text, episode, compaction and cascade guards, and resume. */
static const char *POLICY_TEXT =
    "{\"compaction\":{\"max\":2},\"repeat\":{\"stop\":4},"
    "\"cascade\":{\"offer\":[\"ask_human\"],\"escalate\":{\"model\":\"big\",\"turns\":2}}}";

static const step_t S_TEXT[] = {
    TEXT(1, "I will look. I will look again now. I will look again now. ", 0),
    TEXT(1, "I will look again now. ```\n", 1), /* observe */
    CALL("s", "{}", 2, 2),
    RES(LG_STATUS_PROGRESS, -1, -1, NULL, 3),
    CALL("s", "{}", 3, 4),
    CALL("s", "{}", 3, 4),
    CALL("s", "{}", 4, 5), /* block: hidden, escalated */
    MODEL(10, 10, 6),      /* carries both */
    COMPACTION(7),
    USER(8),
    COMPACTION(9),
    SAVELOAD,
    COMPACTION(10), /* stop: context_loop */
    ENVELOPE,
    RESUME(5, 11),
    TEXT(5, "Fresh text. Fresh text. Fresh text again.", 12),
    CALL("s", "{}", 6, 13),
    RES(LG_STATUS_PROGRESS, -1, -1, NULL, 14),
    CALL("s", "{}", 7, 15),
    RES(LG_STATUS_PROGRESS, -1, -1, NULL, 16),
    CALL("s", "{}", 8, 17), /* block */
    CALL("ask_human", "{\"question\":\"Which one?\"}", 8, 18), /* stop: human_required */
    ENVELOPE,
    SAVELOAD,
    RESUME(-1, 19), /* refused: ESTATE */
    ENVELOPE,
};

typedef struct ref {
  char (*desc)[2048];
  size_t n;
} ref_t;

/* One step; returns the code and fills desc. */
static int do_step(lg_run_t **runp, lg_ledger_t *ledger, lg_policy_t *pol, lg_canon_t *canon,
                   const step_t *s, bool with_message, char *desc, size_t cap) {
  lg_run_t *run = *runp;
  lg_decision_t d;
  memset(&d, 0, sizeof d);
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = 0;
  desc[0] = 0;
  switch (s->k) {
  case K_CALL: {
    lg_call_t c;
    memset(&c, 0, sizeof c);
    c.tool = s->tool;
    c.args = s->args;
    c.args_len = strlen(s->args);
    c.turn = s->turn;
    c.t_ms = s->t;
    c.idempotency_key = s->key;
    rc = lg_run_before(run, canon, &c, &d, &err);
    break;
  }
  case K_RESULT: {
    lg_result_t x;
    memset(&x, 0, sizeof x);
    x.call_id = s->id;
    x.status = s->st;
    x.has_progress_version = s->pv >= 0;
    x.progress_version = s->pv;
    x.retry_after_ms = s->retry;
    x.side_effect_committed = -1;
    if (s->value) {
      x.value = s->value;
      x.value_len = strlen(s->value);
      x.value_kind = LG_VALUE_PRESENT;
    }
    x.operation_id = "op";
    x.t_ms = s->t;
    rc = lg_run_after(run, &x, &d, &err);
    break;
  }
  case K_MODEL: {
    lg_model_call_t m = {"model-x", 1, s->pv, 100, -1, s->committed, s->t};
    rc = lg_run_model(run, &m, &d, &err);
    if (!rc && d.action == LG_ACT_EXECUTE) assert_int_equal(lg_run_usage(run, d.reservation, s->pv, 20, s->committed / 2, s->t), 0);
    break;
  }
  case K_STATE: rc = lg_run_state(run, canon, s->text, strlen(s->text), s->t, &d, &err); break;
  case K_HANDOFF: rc = lg_run_handoff(run, s->tool, s->args, s->t, &d, &err); break;
  case K_CANCEL: rc = lg_run_cancel(run, s->text, s->t, &d); break;
  case K_TEXT: rc = lg_run_text(run, s->turn, s->text, strlen(s->text), NULL, s->t, &d, &err); break;
  case K_USER: rc = lg_run_user(run, s->t, &d); break;
  case K_COMPACTION: rc = lg_run_compaction(run, s->t, &d); break;
  case K_RESUME:
    rc = lg_run_resume(run, s->pv >= 0 ? &s->pv : NULL, s->t, &d, &err);
    if (rc == LG_ESTATE) { /* refused, as meant: the run is unchanged */
      snprintf(desc, cap, "estate: %s", err.message);
      return 0;
    }
    break;
  case K_ENVELOPE: {
    char *e = lg_run_envelope_json(run);
    if (!e) return LG_ENOMEM;
    snprintf(desc, cap, "%s", e);
    lg_free(e);
    return 0;
  }
  case K_SAVELOAD: {
    char *b;
    size_t n;
    if ((rc = lg_run_save(run, &b, &n))) return rc;
    lg_run_t *r = lg_run_load(b, n, pol, ledger, &err);
    lg_free(b);
    if (!r) {
      if (err.code != LG_ENOMEM) fail_msg("lg_run_load: %s (%s)", lg_err_name(err.code), err.message);
      return LG_ENOMEM;
    }
    lg_run_free(run);
    *runp = r;
    snprintf(desc, cap, "reloaded");
    return 0;
  }
  }
  if (rc) {
    if (err.code != rc && s->k != K_CANCEL && s->k != K_USER && s->k != K_COMPACTION)
      fail_msg("rc %s but err.code %s (%s)", lg_err_name(rc), lg_err_name(err.code), err.message);
    return rc;
  }
  describe(&d, with_message, desc, cap);
  return 0;
}

/* The envelope's operations list is the one thing a run lets go under
 * out-of-memory without an error (engine.c op_note: "the envelope loses a
 * line, the decision stands": the ledger already has the outcome). This
 * gives the envelope without that list, to compare the rest; the number of
 * runs where it mattered is printed. */
static long g_lost_ops;
static const char *without_ops(const char *env) {
  static char buf[2][1 << 17];
  static int which;
  char *b = buf[which ^= 1];
  const char *a = strstr(env, "\"operations\":["), *z = a ? strstr(a, "],\"tried\":") : NULL;
  if (!a || !z) return env;
  snprintf(b, sizeof buf[0], "%.*s%s", (int)(a - env), env, z);
  return b;
}

/* Violations are collected, one per kind (the first N that shows it), so
 * that one run of the test shows every problem; the test fails at the end
 * of a scenario when there are any. */
#define MAX_FINDINGS 64
static char g_kind[MAX_FINDINGS][128], g_text[MAX_FINDINGS][1200];
static int g_nfind;
static void finding(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void finding(const char *kind, const char *fmt, ...) {
  for (int i = 0; i < g_nfind; i++)
    if (!strcmp(g_kind[i], kind)) return;
  if (g_nfind == MAX_FINDINGS) return;
  snprintf(g_kind[g_nfind], sizeof g_kind[0], "%s", kind);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_text[g_nfind], sizeof g_text[0], fmt, ap);
  va_end(ap);
  g_nfind++;
}
static void report_findings(const char *what) {
  if (!g_nfind) return;
  for (int i = 0; i < g_nfind; i++) printf("  FINDING %s: %s\n", g_kind[i], g_text[i]);
  int n = g_nfind;
  g_nfind = 0;
  fail_msg("%s: %d kinds of out-of-memory misbehaviour (listed above)", what, n);
}

/* Plays a scenario. With fill, records the reference (and any problem is
 * fatal). Returns false when the set-up failed (cleanly). */
static bool play(const char *name, lg_policy_t *pol, const step_t *steps, size_t nsteps, ref_t *ref, bool fill) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_ledger_t *ledger = lg_ledger_memory_new();
  lg_canon_t *canon = ledger ? lg_canon_new() : NULL;
  lg_run_t *run = canon ? lg_run_new("oom-run", "g", pol, NULL, ledger, &err) : NULL;
  if (!run) {
    if (fill || (canon && err.code != LG_ENOMEM)) fail_msg("%s: set-up failed: %s", name, err.message);
    lg_canon_free(canon);
    lg_ledger_free(ledger);
    return false;
  }
  char kind[128];
  bool after_failure = false; /* a failure happened in an earlier step */
  for (size_t i = 0; i < nsteps; i++) {
    char desc[2048];
    long before = failed();
    int rc = do_step(&run, ledger, pol, canon, &steps[i], true, desc, sizeof desc);
    bool hit = failed() != before;
    if (rc) {
      if (fill) fail_msg("%s step %zu: %s without a failing allocation", name, i, lg_err_name(rc));
      snprintf(kind, sizeof kind, "%s step %zu error", name, i);
      if (rc != LG_ENOMEM) {
        finding(kind, "N=%ld%s: %s, not LG_ENOMEM", g_n, g_fail_rest ? "+" : "", lg_err_name(rc));
        break;
      }
      if (!hit) {
        finding(kind, "N=%ld%s: LG_ENOMEM without a failing allocation in the call", g_n, g_fail_rest ? "+" : "");
        break;
      }
      disarm(); /* memory is back: the same event again */
      rc = do_step(&run, ledger, pol, canon, &steps[i], true, desc, sizeof desc);
      if (rc) {
        snprintf(kind, sizeof kind, "%s step %zu retry", name, i);
        finding(kind, "N=%ld%s: it returned LG_ENOMEM, and the same event again with memory back gives %s: "
                "the failed call changed the run", g_n, g_fail_rest ? "+" : "", lg_err_name(rc));
        break;
      }
      hit = false; /* the retry must be exact */
    }
    if (fill) {
      snprintf(ref->desc[i], sizeof ref->desc[i], "%s", desc);
    } else if (strcmp(desc, ref->desc[i])) {
      bool ok = false;
      if (after_failure && steps[i].k == K_ENVELOPE && !strcmp(without_ops(desc), without_ops(ref->desc[i]))) {
        g_lost_ops++; /* known: see without_ops */
        ok = true;
      }
      if (!ok) {
        size_t k = 0;
        while (desc[k] && desc[k] == ref->desc[i][k]) k++;
        size_t from = k > 100 ? k - 100 : 0;
        snprintf(kind, sizeof kind, "%s step %zu %s", name, i, hit ? "absorbed" : after_failure ? "later" : "differs");
        finding(kind, "N=%ld%s%s: decided\n      ...%.300s\n    not\n      ...%.300s", g_n, g_fail_rest ? "+" : "",
                hit ? " (this call absorbed a failed allocation)"
                    : after_failure ? " (an earlier call absorbed or retried a failure)" : "",
                desc + from, ref->desc[i] + from);
      }
    }
    if (hit || (!fill && failed())) after_failure = true;
  }
  lg_run_free(run);
  lg_canon_free(canon);
  lg_ledger_free(ledger);
  return true;
}

/* The policy is parsed before the allocator is armed: lg_policy_parse
 * under out-of-memory is test_oom.c's; here it is the run's life. */
static lg_policy_t *parse(const char *json) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(json, strlen(json), NULL, &err);
  if (!p) fail_msg("policy: %s", err.message);
  return p;
}

static void each_n(const char *name, const char *policy, const step_t *steps, size_t nsteps) {
  ref_t ref = {calloc(nsteps, sizeof *ref.desc), nsteps};
  assert_int_equal(g_live, 0);
  lg_policy_t *pol = parse(policy);
  long base = g_live;
  play(name, pol, steps, nsteps, &ref, true);
  assert_int_equal(g_live, base);
  for (int rest = 0; rest <= 1; rest++) {
    long n;
    for (n = 1; n < MAX_N; n++) {
      arm(n, rest);
      play(name, pol, steps, nsteps, &ref, false);
      bool reached = failed() > 0;
      disarm();
      if (g_live != base) {
        char kind[64];
        snprintf(kind, sizeof kind, "%s leak%s", name, rest ? "+" : "");
        finding(kind, "N=%ld%s: %ld allocations leaked", n, rest ? "+" : "", g_live - base);
        g_live = base; /* count on */
      }
      if (!reached) break;
    }
    assert_true(n > 10 && n < MAX_N);
    if (!rest) printf("  %-8s %ld allocations, each failed in turn\n", name, n - 1);
    if (g_lost_ops)
      printf("  %-8s %ld runs (%s) lost an operation detail of the envelope (known)\n", name, g_lost_ops,
             rest ? "N and after failing" : "only N failing");
    g_lost_ops = 0;
  }
  lg_policy_free(pol);
  free(ref.desc);
  report_findings(name);
  assert_int_equal(g_live, 0);
}

static void t_oom_ladder(void **state) {
  (void)state;
  each_n("ladder", POLICY, S_LADDER, sizeof S_LADDER / sizeof S_LADDER[0]);
}
static void t_oom_unknown_outcome(void **state) {
  (void)state;
  each_n("outcome", POLICY_OUTCOME, S_OUTCOME, sizeof S_OUTCOME / sizeof S_OUTCOME[0]);
}
static void t_oom_cancel(void **state) {
  (void)state;
  each_n("cancel", POLICY, S_CANCEL, sizeof S_CANCEL / sizeof S_CANCEL[0]);
}
static void t_oom_text(void **state) {
  (void)state;
  each_n("text", POLICY_TEXT, S_TEXT, sizeof S_TEXT / sizeof S_TEXT[0]);
}

/* The scenarios do what they are meant to. */
static void t_scenarios_are_meaningful(void **state) {
  (void)state;
  ref_t ref = {calloc(32, sizeof *ref.desc), 32};
  lg_policy_t *p = parse(POLICY), *po = parse(POLICY_OUTCOME);
  play("ladder", p, S_LADDER, sizeof S_LADDER / sizeof S_LADDER[0], &ref, true);
  assert_non_null(strstr(ref.desc[2], "replay/"));
  assert_non_null(strstr(ref.desc[10], "block/retry_too_soon"));
  assert_non_null(strstr(ref.desc[17], "block/same_call_repeat"));
  assert_non_null(strstr(ref.desc[20], "stop/same_call_repeat"));
  assert_non_null(strstr(ref.desc[22], "\"refused_call\":{"));
  play("outcome", po, S_OUTCOME, sizeof S_OUTCOME / sizeof S_OUTCOME[0], &ref, true);
  assert_non_null(strstr(ref.desc[1], "block/in_progress"));
  assert_non_null(strstr(ref.desc[2], "block/idempotency_mismatch"));
  assert_non_null(strstr(ref.desc[4], "stop/unknown_outcome"));
  play("cancel", p, S_CANCEL, sizeof S_CANCEL / sizeof S_CANCEL[0], &ref, true);
  assert_non_null(strstr(ref.desc[3], "stop/operator_cancelled_loop/an operator's own reason"));
  lg_policy_t *pt = parse(POLICY_TEXT);
  play("text", pt, S_TEXT, sizeof S_TEXT / sizeof S_TEXT[0], &ref, true);
  assert_non_null(strstr(ref.desc[1], "observe/text_repeat"));
  assert_non_null(strstr(ref.desc[6], "block/same_call_repeat"));
  assert_non_null(strstr(ref.desc[6], "hide=s:2"));
  assert_non_null(strstr(ref.desc[7], "esc=big:2"));
  assert_non_null(strstr(ref.desc[12], "stop/context_loop"));
  assert_non_null(strstr(ref.desc[14], "continue/"));
  assert_non_null(strstr(ref.desc[21], "stop/human_required"));
  assert_non_null(strstr(ref.desc[22], "\"question\":{\"question\":\"Which one?\"}"));
  lg_policy_free(pt);
  lg_policy_free(p);
  lg_policy_free(po);
  free(ref.desc);
  assert_int_equal(g_live, 0);
}

/* ------------------------------------------------------------------ */
/* Replay.                                                              */

typedef struct rrec {
  char *text;  /* every decision and the summary, one line each */
  size_t len, cap;
} rrec_t;

static void rput(rrec_t *r, const char *s) {
  size_t l = strlen(s);
  if (r->len + l + 2 > r->cap) {
    r->cap = (r->len + l + 2) * 2;
    r->text = realloc(r->text, r->cap); /* the system's: not counted */
  }
  memcpy(r->text + r->len, s, l);
  r->len += l;
  r->text[r->len++] = '\n';
  r->text[r->len] = 0;
}

static int rcb(void *ud, const lg_replay_event_t *e, const lg_replay_summary_t *s) {
  char buf[4096];
  if (e) {
    char d[2048] = "-";
    if (e->acted) describe(&e->decision, true, d, sizeof d);
    snprintf(buf, sizeof buf, "%ld %d %d %d %s", e->line, e->type, e->acted, e->skipped, d);
  } else {
    snprintf(buf, sizeof buf, "summary %s %s %ld %lld %lld %lld %lld %lld %lld %lld %s", s->run_id,
             s->terminal_reason ? s->terminal_reason : "-", s->stopped_at_line, (long long)s->executed_calls,
             (long long)s->blocked_calls, (long long)s->replayed_calls, (long long)s->model_calls,
             (long long)s->cost_nusd, (long long)s->tokens, (long long)s->events_after_stop, s->envelope);
  }
  rput(ud, buf);
  return 0;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* Replays `text` with every allocation failing in turn (see the top). */
static void oom_replay_one(const char *name, const char *text, size_t len) {
  /* A policy in the run event is given as an override, parsed before the
   * allocator is armed: jansson 2.14 itself crashes in json_loadb when
   * some of its allocations fail (see the report), and lg_policy_parse's
   * out-of-memory behaviour is test_oom.c's business. */
  lg_policy_t *pol = NULL;
  const char *pj = strstr(text, "\"policy\":");
  const char *nl0 = pj ? memchr(text, '\n', (size_t)(pj - text)) : NULL;
  if (pj && (!nl0 || strncmp(text, "# ", 2) == 0)) {
    /* The run event is the first event line; cut its policy object out. */
    const char *o = pj + 9;
    while (*o == ' ') o++;
    int depth = 0;
    const char *e = o;
    for (; *e; e++) {
      if (*e == '{') depth++;
      else if (*e == '}' && --depth == 0) break;
    }
    lg_error_t perr;
    memset(&perr, 0, sizeof perr);
    pol = lg_policy_parse(o, (size_t)(e - o + 1), "trace policy", &perr);
    if (!pol) fail_msg("%s: the run event's policy: %s", name, perr.message);
  }
  long base = g_live;
  rrec_t ref = {0};
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_int_equal(lg_replay_buffer(name, text, len, pol, rcb, &ref, &err), 0);
  assert_int_equal(g_live, base);
  long total = 0;
  for (int rest = 0; rest <= 1; rest++) {
    long n;
    for (n = 1; n < MAX_N; n++) {
      rrec_t got = {0};
      memset(&err, 0, sizeof err);
      arm(n, rest);
      int rc = lg_replay_buffer(name, text, len, pol, rcb, &got, &err);
      bool reached = failed() > 0;
      disarm();
      char kind[160];
      const char *nm = name, *plus = rest ? "+" : "";
      if (g_live != base) {
        snprintf(kind, sizeof kind, "replay %s leak%s", nm, plus);
        finding(kind, "N=%ld%s: %ld allocations leaked", n, plus, g_live - base);
        g_live = base;
      }
      if (rc) {
        snprintf(kind, sizeof kind, "replay %s %s", nm, lg_err_name(rc));
        if (!reached) finding(kind, "N=%ld%s: %s without a failing allocation", n, plus, lg_err_name(rc));
        else if (rc != LG_ENOMEM || err.code != LG_ENOMEM)
          finding(kind, "N=%ld%s: returned %s, err.code %s (%s), not LG_ENOMEM: a trace reported as bad", n, plus,
                  lg_err_name(rc), lg_err_name(err.code), err.message);
        /* What was reported before the failure is a prefix of the truth. */
        else if (got.len && strncmp(got.text, ref.text, got.len))
          finding(kind, "N=%ld%s: decisions before the failure differ", n, plus);
      } else if (strcmp(got.text ? got.text : "", ref.text)) {
        if (got.text && !strcmp(without_ops(got.text), without_ops(ref.text))) {
          g_lost_ops++; /* known: see without_ops */
        } else {
          /* Replay went on after a failure: it must not have changed anything. */
          size_t k = 0;
          while (got.text && got.text[k] == ref.text[k]) k++;
          while (k && ref.text[k - 1] != '\n') k--;
          snprintf(kind, sizeof kind, "replay %s differs", nm);
          finding(kind, "N=%ld%s: succeeded but differs from the reference at\n      %.300s\n    not\n      %.300s", n,
                  plus, got.text ? got.text + k : "", ref.text + k);
        }
      }
      free(got.text);
      if (!reached) break;
    }
    assert_true(n < MAX_N);
    if (!rest) total = n - 1;
  }
  printf("  replay %-32s %5ld allocations, each failed in turn\n", name, total);
  if (g_lost_ops) printf("  replay %-32s %5ld runs lost an operation detail of the envelope (known)\n", name, g_lost_ops);
  g_lost_ops = 0;
  free(ref.text);
  lg_policy_free(pol);
  assert_int_equal(g_live, 0);
}

/* Calls with ids that are blocked, and results naming them: the replay
 * must remember which ids to skip even when memory is short. */
static const char *SKIPS =
    "{\"type\":\"run\",\"run_id\":\"skips\"}\n"
    "{\"type\":\"call\",\"turn\":1,\"tool\":\"a\",\"call_id\":\"x1\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x1\",\"status\":\"progress\"}\n"
    "{\"type\":\"call\",\"turn\":2,\"tool\":\"a\",\"call_id\":\"x2\"}\n"
    "{\"type\":\"call\",\"turn\":3,\"tool\":\"a\",\"call_id\":\"x3\"}\n"
    "{\"type\":\"call\",\"turn\":3,\"tool\":\"b\",\"call_id\":\"x4\"}\n"
    "{\"type\":\"call\",\"turn\":4,\"tool\":\"a\",\"call_id\":\"x5\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x5\",\"status\":\"fatal\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x3\",\"status\":\"fatal\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x4\",\"status\":\"progress\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x2\",\"status\":\"progress\"}\n"
    "{\"type\":\"call\",\"turn\":5,\"tool\":\"c\",\"call_id\":\"x6\",\"idempotency_key\":\"k\"}\n"
    "{\"type\":\"result\",\"call_id\":\"x6\",\"status\":\"complete\",\"value\":[1],\"operation_id\":\"o\"}\n";

static void t_oom_replay(void **state) {
  (void)state;
  const char *data = getenv("LG_TEST_DATA");
  if (!data) fail_msg("LG_TEST_DATA is not set");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/fixtures", data);
  DIR *dp = opendir(dir);
  if (!dp) fail_msg("cannot open %s", dir);
  struct dirent *de;
  int nfix = 0;
  while ((de = readdir(dp))) {
    size_t l = strlen(de->d_name);
    if (l <= 6 || strcmp(de->d_name + l - 6, ".jsonl")) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    size_t len;
    char *text = slurp(path, &len);
    oom_replay_one(de->d_name, text, len);
    free(text);
    nfix++;
  }
  closedir(dp);
  assert_true(nfix > 0);
  oom_replay_one("skips", SKIPS, strlen(SKIPS));
  report_findings("replay");
}

int main(void) {
  lg_set_allocator(c_malloc, c_realloc, c_free);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_scenarios_are_meaningful),
      cmocka_unit_test(t_oom_ladder),
      cmocka_unit_test(t_oom_unknown_outcome),
      cmocka_unit_test(t_oom_cancel),
      cmocka_unit_test(t_oom_text),
      cmocka_unit_test(t_oom_replay),
  };
  int rc = cmocka_run_group_tests_name("oom_engine", tests, NULL, NULL);
  lg_set_allocator(NULL, NULL, NULL);
  return rc;
}
