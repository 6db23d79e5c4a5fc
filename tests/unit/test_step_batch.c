/*
 * test_step_batch.c — the decision step's batch (lg__step_batch_run,
 * src/step/step.c): several events of one run in one transaction must
 * give the same decisions and the same trace as the same events through
 * one step each. Two runs are created alike and driven alike — the calls
 * one step each on both — then the same events go one step each to run A
 * and as one batch to run B; every outcome (decided, fail, action, reason,
 * stopped, the answer) and the traces must agree, and so must the next
 * decisions (the state saved once is the state saved each time). The
 * events hold a result for a call the run never made (it fails alone), a
 * result that stops the run (failure_streak) and events after the stop
 * (the stop again, no trace line), text and user events; a deny rule
 * (the first event becomes the cancel); the events that write the store
 * before the engine decides — a write's ledger claim, model calls that
 * reserve a key's budget or fail alone (its in-flight cap, no price), a
 * usage that settles and one whose settlement fails alone — where the
 * budgets must also agree; a failure after the engine took an event and
 * a store failure in the middle of a batch (nothing written); results
 * read late (the step's fill): only when the run waits for one, and then
 * as the whole event.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "step/step.h"
#include "store/store.h"

#define T0 1790000000000LL

static lg_canon_t *canon; /* the deciding thread's scratch */
static lg_prices_t *prices; /* model and usage events' */
/* Model events of run-A reserve key:A's budget, run-B's key:B's, set
 * alike: the budgets each run's events touched can be compared. */
static const char *const scope_a[] = {"key:A"}, *const scope_b[] = {"key:B"};

/* A step of ev at now on run `id`, as a front end makes one. */
static void init_on(lg__step_t *st, const lg_event_t *ev, int64_t now, const char *id) {
  lg__step_init(st, ev, now);
  st->canon = canon;
  st->prices = prices;
  st->scopes = strcmp(id, "run-A") ? scope_b : scope_a;
  st->nscopes = 1;
}

/* Text of run-B read as run-A's: the run's name (the envelope of a stop
 * names its run), and derived idempotency keys ("lg:" and a hash of the
 * run and the call) masked. */
static char *mask(char *t) {
  for (char *p = t; (p = strstr(p, "run-B")); p += 5) p[4] = 'A';
  for (char *p = t; (p = strstr(p, "lg:")); p += 3)
    if (strspn(p + 3, "0123456789abcdef") == 64) memset(p + 3, '0', 64);
  return t;
}

/* The answer of a step, masked. */
static char *as_a(const lg__buf_t *b) {
  return mask(strndup(b->data ? b->data : "", b->len));
}

static lg_store_t *open_store(void) {
  lg_error_t e = {0};
  lg_store_t *s = lg_store_open("memory:", NULL, &e);
  assert_non_null(s);
  return s;
}

static void create(lg_store_t *s, const char *id, const char *policy_json) {
  lg_error_t e = {0};
  lg_policy_t *p = lg_policy_parse(policy_json, strlen(policy_json), "test", &e);
  assert_non_null(p);
  lg_run_t *run = lg_run_new(id, NULL, p, NULL, NULL, &e);
  assert_non_null(run);
  char *pj = lg_policy_to_json(p);
  assert_int_equal(lg__step_create(s, run, pj, NULL, NULL, 0, T0, NULL, &e), 0);
  lg__free(pj);
  lg_run_free(run);
  lg_policy_free(p);
}

static lg_event_t call_ev(const char *id, const char *args) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_CALL;
  ev.u.call.tool = "write";
  ev.u.call.args = args;
  ev.u.call.turn = 1;
  ev.u.call.call_id = id;
  return ev;
}

static lg_event_t result_ev(const char *id, lg_status_t status) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESULT;
  ev.u.result.call_id = id;
  ev.u.result.status = status;
  ev.u.result.value = "{\"rows\":1}";
  ev.u.result.value_kind = LG_VALUE_PRESENT;
  return ev;
}

static lg_event_t text_ev(const char *t) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_TEXT;
  ev.u.text.text = t;
  ev.u.text.turn = 1;
  return ev;
}

static lg_event_t user_ev(void) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_USER;
  return ev;
}

/* One event, one step, on both runs: the same outcome. */
static void both(lg_store_t *s, const char *a, const char *b, lg_event_t ev, int64_t now) {
  lg__step_t sa, sb;
  lg_error_t e = {0};
  init_on(&sa, &ev, now, a);
  init_on(&sb, &ev, now, b);
  assert_int_equal(lg__step_run(s, a, &sa, &e), 0);
  assert_int_equal(lg__step_run(s, b, &sb, &e), 0);
  assert_int_equal(sa.action, sb.action);
  assert_int_equal(sa.reason, sb.reason);
  lg__step_clear(&sa);
  lg__step_clear(&sb);
}

/* The trace of a run without its first line (the run line names the run). */
static char *events_of(lg_store_t *s, const char *id) {
  lg__buf_t b = {0};
  assert_int_equal(lg__store_events_read(s, id, &b, NULL), 0);
  char *nl = memchr(b.data, '\n', b.len);
  assert_non_null(nl);
  char *out = strdup(nl + 1);
  lg__buf_free(&b);
  return out;
}

/* The last compare()'s batch: each step's failure, ledger outcome and the
 * reservation its answer names (0: none). */
static lg__step_fail_t got_fail[16];
static int got_ledger[16];
static long long got_resv[16];

/* Runs evs one step each on a and as one batch on b, and checks that
 * every outcome and the traces agree. Returns the batch's rc. */
static int compare(lg_store_t *s, const char *a, const char *b, const lg_event_t *evs, size_t n,
                   int64_t now) {
  lg__step_t one[16], batch[16];
  assert_true(n <= 16);
  lg_error_t e = {0};
  int frc[16];
  for (size_t i = 0; i < n; i++) {
    init_on(&one[i], &evs[i], now, a);
    frc[i] = lg__step_run(s, a, &one[i], &e);
    init_on(&batch[i], &evs[i], now, b);
  }
  lg__step_batch_t bt = {batch, n};
  int rc = lg__step_batch_run(s, b, &bt, &e);
  for (size_t i = 0; i < n && !rc; i++) {
    lg__step_t *x = &one[i], *y = &batch[i];
    if (frc[i]) {
      assert_int_equal(y->decided, 0);
      assert_int_equal(x->fail, y->fail);
    } else {
      assert_int_equal(y->decided, 1);
    }
    assert_int_equal(x->decided, y->decided);
    assert_int_equal(x->action, y->action);
    assert_int_equal(x->reason, y->reason);
    assert_int_equal(x->was_stopped, y->was_stopped);
    assert_int_equal(x->stopped_now, y->stopped_now);
    assert_int_equal(x->denied, y->denied);
    assert_int_equal(x->ledger_outcome, y->ledger_outcome);
    got_fail[i] = y->fail;
    got_ledger[i] = y->ledger_outcome;
    const char *r = y->answer.data ? strstr(y->answer.data, "\"reservation_id\":\"") : NULL;
    got_resv[i] = r ? atoll(r + 18) : 0;
    char *xa = as_a(&x->answer), *ya = as_a(&y->answer), *xl = as_a(&x->stop_log), *yl = as_a(&y->stop_log);
    assert_string_equal(xa, ya);
    assert_string_equal(xl, yl);
    free(xa);
    free(ya);
    free(xl);
    free(yl);
  }
  for (size_t i = 0; i < n; i++) {
    lg__step_clear(&one[i]);
    lg__step_clear(&batch[i]);
  }
  char *ta = mask(events_of(s, a)), *tb = mask(events_of(s, b));
  if (!rc) assert_string_equal(ta, tb);
  free(ta);
  free(tb);
  return rc;
}

static void three_calls(lg_store_t *s, const char *a, const char *b, int64_t now) {
  both(s, a, b, call_ev("c1", "{\"id\":1}"), now);
  both(s, a, b, call_ev("c2", "{\"id\":2}"), now);
  both(s, a, b, call_ev("c3", "{\"id\":3}"), now);
}

static void same_as_one_by_one(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-A", "{}");
  create(s, "run-B", "{}");
  three_calls(s, "run-A", "run-B", T0 + 10);
  lg_event_t evs[] = {result_ev("c1", LG_STATUS_PROGRESS), result_ev("ghost", LG_STATUS_PROGRESS),
                      text_ev("Now the second record."), result_ev("c2", LG_STATUS_PROGRESS),
                      user_ev(), result_ev("c3", LG_STATUS_RETRYABLE)};
  assert_int_equal(compare(s, "run-A", "run-B", evs, 6, T0 + 20), 0);
  /* the state saved once decides the next events as the state saved each time */
  both(s, "run-A", "run-B", call_ev("c4", "{\"id\":3}"), T0 + 30);
  lg_event_t more[] = {result_ev("c4", LG_STATUS_PROGRESS)};
  assert_int_equal(compare(s, "run-A", "run-B", more, 1, T0 + 40), 0);
  char *ta = events_of(s, "run-A");
  assert_non_null(strstr(ta, "\"type\":\"user\""));
  assert_null(strstr(ta, "ghost")); /* refused: not in the trace */
  free(ta);
  lg_store_close(s);
}

static void stop_in_the_middle(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-A", "{\"failure_streak\":2}");
  create(s, "run-B", "{\"failure_streak\":2}");
  three_calls(s, "run-A", "run-B", T0 + 10);
  lg_event_t evs[] = {result_ev("c1", LG_STATUS_FATAL), result_ev("c2", LG_STATUS_FATAL),
                      result_ev("c3", LG_STATUS_PROGRESS), text_ev("After the stop."), user_ev()};
  assert_int_equal(compare(s, "run-A", "run-B", evs, 5, T0 + 20), 0);
  lg_run_record_t ra = {0}, rb = {0};
  assert_int_equal(lg_store_run_get(s, "run-A", &ra, NULL), 0);
  assert_int_equal(lg_store_run_get(s, "run-B", &rb, NULL), 0);
  assert_true(ra.stopped && rb.stopped);
  assert_string_equal(ra.terminal_reason, rb.terminal_reason);
  assert_non_null(rb.envelope_json); /* the terminal envelope, written once */
  lg_run_record_clear(&ra);
  lg_run_record_clear(&rb);
  char *tb = events_of(s, "run-B");
  assert_null(strstr(tb, "After the stop.")); /* after the stop: no line */
  free(tb);
  lg_store_close(s);
}

static void deny_rule(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-A", "{}");
  create(s, "run-B", "{}");
  three_calls(s, "run-A", "run-B", T0 + 10);
  lg_error_t e = {0};
  assert_int_equal(lg__store_deny(s, LG__DENY_RUN, "run-A", "halt", T0 + 15, &e), 0);
  assert_int_equal(lg__store_deny(s, LG__DENY_RUN, "run-B", "halt", T0 + 15, &e), 0);
  lg_event_t evs[] = {result_ev("c1", LG_STATUS_PROGRESS), result_ev("c2", LG_STATUS_PROGRESS)};
  assert_int_equal(compare(s, "run-A", "run-B", evs, 2, T0 + 20), 0);
  char *tb = events_of(s, "run-B");
  assert_non_null(strstr(tb, "\"type\":\"cancel\""));
  free(tb);
  lg_store_close(s);
}

static lg_event_t model_ev(const char *model, int64_t input, int64_t max_tokens) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_MODEL;
  ev.u.model.m.model = model;
  ev.u.model.m.turn = 1;
  ev.u.model.m.input_tokens = input;
  ev.u.model.m.max_tokens = max_tokens;
  ev.u.model.m.output_tokens = -1;
  ev.u.model.m.cost_nusd = -1;
  return ev;
}

static lg_event_t usage_ev(int64_t reservation, int64_t in, int64_t out) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_USAGE;
  ev.u.usage.reservation = reservation;
  ev.u.usage.input_tokens = in;
  ev.u.usage.output_tokens = out;
  ev.u.usage.cost_nusd = -1;
  return ev;
}

#define USD 1000000LL

/* run-A and run-B with policy, and key:A's and key:B's budgets alike:
 * daily limit, max_in_flight (< 0: none). */
static void two_runs(lg_store_t *s, int64_t limit, int64_t in_flight, const char *policy) {
  lg_error_t e = {0};
  assert_int_equal(lg_budget_set(s, "key:A", limit, LG_PERIOD_DAILY, in_flight, T0, NULL, &e), 0);
  assert_int_equal(lg_budget_set(s, "key:B", limit, LG_PERIOD_DAILY, in_flight, T0, NULL, &e), 0);
  create(s, "run-A", policy);
  create(s, "run-B", policy);
}

/* key:A's and key:B's budgets agree (what each run's events did to them). */
static void same_budgets(lg_store_t *s, int64_t now) {
  lg_budget_t ba, bb;
  lg_error_t e = {0};
  assert_int_equal(lg_budget_get(s, "key:A", now, &ba, &e), 0);
  assert_int_equal(lg_budget_get(s, "key:B", now, &bb, &e), 0);
  assert_int_equal(ba.spent_micro, bb.spent_micro);
  assert_int_equal(ba.reserved_micro, bb.reserved_micro);
  assert_int_equal(ba.open_reservations, bb.open_reservations);
}

static int64_t reserved_micro(lg_store_t *s, const char *scope, int64_t now) {
  lg_budget_t b;
  lg_error_t e = {0};
  assert_int_equal(lg_budget_get(s, scope, now, &b, &e), 0);
  return b.reserved_micro;
}

/* The store's fault hook: fault_rc at fault_point. */
static const char *fault_point;
static int fault_rc;
static int at_fault(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  (void)s;
  return fault_point && !strcmp(point, fault_point) ? fault_rc : 0;
}

/* A limit that refuses a model call stops the run when the scope is the
 * run's own; when it is only the call's own (a gateway key's, which the
 * run does not keep), the call is refused and the run goes on as it was,
 * as the gateway's check before the step leaves it (keys.c): the run's
 * next request may come with another key, or after the key's period. */
static void own_scope_refusal(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg_error_t e = {0};
  /* 1 USD: the worst case of 1000 in + 1000 out of m (3 USD) does not fit */
  two_runs(s, 1 * USD, -1, "{}");
  lg_event_t evs[] = {model_ev("m", 1000, 1000), text_ev("Still going.")};
  assert_int_equal(compare(s, "run-A", "run-B", evs, 2, T0 + 10), 0);
  assert_int_equal(got_fail[0], LG__STEP_REFUSED);
  assert_int_equal(got_fail[1], LG__STEP_OK);
  assert_int_equal(reserved_micro(s, "key:B", T0 + 10), 0);
  lg_run_record_t rb = {0};
  assert_int_equal(lg_store_run_get(s, "run-B", &rb, NULL), 0);
  assert_false(rb.stopped);
  lg_run_record_clear(&rb);
  char *tb = events_of(s, "run-B");
  assert_null(strstr(tb, "\"type\":\"budget\""));
  assert_non_null(strstr(tb, "Still going."));
  free(tb);

  /* key:B is also the run's own scope (stored when it was made): stopped */
  lg_policy_t *p = lg_policy_parse("{}", 2, "test", &e);
  lg_run_t *run = lg_run_new("run-C", NULL, p, NULL, NULL, &e);
  assert_non_null(run);
  assert_int_equal(lg__step_create(s, run, "{}", NULL, scope_b, 1, T0, NULL, &e), 0);
  lg_run_free(run);
  lg_policy_free(p);
  lg_event_t ev = model_ev("m", 1000, 1000);
  lg__step_t st;
  init_on(&st, &ev, T0 + 20, "run-C");
  assert_int_equal(lg__step_run(s, "run-C", &st, &e), 0);
  assert_true(st.budget_refused);
  assert_true(st.stopped_now);
  lg__step_clear(&st);
  char *tc = events_of(s, "run-C");
  assert_non_null(strstr(tc, "\"type\":\"budget\",\"scope\":\"key:B\""));
  free(tc);
  lg_store_close(s);
}

static void store_writes(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  /* 1000 in + 1000 out of m: 3 USD at worst; the in-flight cap holds one */
  two_runs(s, 10 * USD, 5 * USD, "{\"tools\":{\"write\":{\"side_effects\":true}}}");
  /* a write claimed, a model call reserved, one refused by the in-flight
   * cap and one with no price (each alone), the same write again (its
   * claim is still open: seen in the batch's own transaction) */
  lg_event_t evs[] = {call_ev("c1", "{\"id\":1}"), model_ev("m", 1000, 1000), model_ev("m", 1000, 1000),
                      model_ev("nobody-prices-me", 1000, 1000), call_ev("c2", "{\"id\":1}"),
                      text_ev("Writing it.")};
  assert_int_equal(compare(s, "run-A", "run-B", evs, 6, T0 + 10), 0);
  same_budgets(s, T0 + 10);
  assert_int_equal(reserved_micro(s, "key:B", T0 + 10), 3 * USD); /* the one let through */
  assert_int_equal(got_ledger[0], LG_CLAIM_CLAIMED);
  assert_true(got_resv[1] > 0);
  assert_int_equal(got_fail[2], LG__STEP_REFUSED);
  assert_int_equal(got_fail[3], LG__STEP_UNPRICED);
  assert_int_equal(got_ledger[4], LG_CLAIM_IN_PROGRESS);
  long long first = got_resv[1];
  /* the result, the usage of the first reservation (settled), one whose
   * reservation is unknown (alone), the write once more (replayed) */
  lg_event_t more[] = {result_ev("c1", LG_STATUS_PROGRESS), usage_ev(first, 1000, 500), usage_ev(99, 1, 1),
                       call_ev("c3", "{\"id\":1}")};
  assert_int_equal(compare(s, "run-A", "run-B", more, 4, T0 + 20), 0);
  assert_int_equal(got_fail[1], LG__STEP_OK);
  assert_int_equal(got_fail[2], LG__STEP_CONFLICT);
  assert_int_equal(got_ledger[3], LG_CLAIM_REPLAY);
  same_budgets(s, T0 + 20);
  assert_int_equal(reserved_micro(s, "key:B", T0 + 20), 0);
  char *tb = events_of(s, "run-B");
  assert_non_null(strstr(tb, "\"type\":\"usage\",\"reservation\":1,"));
  assert_null(strstr(tb, "\"reservation\":99")); /* refused: not in the trace */
  free(tb);

  /* a settlement that fails alone (here: as if its reservation had gone)
   * takes its writes with it; the model call after it still reserves */
  fault_point = "budget.settle.before_commit";
  fault_rc = LG_ENOTFOUND;
  lg__store_set_fault(s, at_fault, NULL);
  lg_event_t held[] = {model_ev("m", 1000, 1000)};
  assert_int_equal(compare(s, "run-A", "run-B", held, 1, T0 + 30), 0);
  lg_event_t late[] = {usage_ev(got_resv[0], 1000, 1000), model_ev("m", 10, 10)};
  assert_int_equal(compare(s, "run-A", "run-B", late, 2, T0 + 30), 0);
  assert_int_equal(got_fail[0], LG__STEP_CONFLICT);
  assert_true(got_resv[1] > 0);
  same_budgets(s, T0 + 30);
  assert_true(reserved_micro(s, "key:B", T0 + 30) > 3 * USD - 1);
  lg__store_set_fault(s, NULL, NULL);
  lg_store_close(s);
}

/* A failure after the engine took an event, of a kind that alone would
 * be the event's own (409): the run in memory has changed, so the batch
 * fails whole and nothing of it stays, as with a step of its own. */
static void failed_after_the_engine(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  lg_error_t e = {0};
  two_runs(s, 10 * USD, -1, "{}");
  char *before = events_of(s, "run-B");
  fault_point = "gate.after_engine";
  fault_rc = LG_ENOTFOUND;
  lg__store_set_fault(s, at_fault, NULL);
  lg_event_t evs[] = {text_ev("Asking."), model_ev("m", 1000, 1000), text_ev("Asked.")};
  lg__step_t one, st[3];
  init_on(&one, &evs[1], T0 + 5, "run-A");
  assert_int_not_equal(lg__step_run(s, "run-A", &one, &e), 0);
  lg__step_clear(&one);
  for (int i = 0; i < 3; i++) init_on(&st[i], &evs[i], T0 + 5, "run-B");
  lg__step_batch_t b = {st, 3};
  assert_int_not_equal(lg__step_batch_run(s, "run-B", &b, &e), 0);
  lg__store_set_fault(s, NULL, NULL);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(st[i].decided, 0);
    assert_int_equal(st[i].fail, LG__STEP_STORE);
    lg__step_clear(&st[i]);
  }
  char *after = events_of(s, "run-B");
  assert_string_equal(before, after);
  free(before);
  free(after);
  assert_int_equal(reserved_micro(s, "key:B", T0 + 5), 0);
  /* and the run goes on from where it was: as run-A, which failed alone */
  assert_int_equal(compare(s, "run-A", "run-B", evs, 3, T0 + 6), 0);
  same_budgets(s, T0 + 6);
  lg_store_close(s);
}

static void store_failure(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-B", "{\"tools\":{\"write\":{\"side_effects\":true}}}");
  char *before = events_of(s, "run-B");
  lg_event_t ev[] = {text_ev("fine"), call_ev("c1", "{}"), text_ev("after")};
  lg__step_t st[3];
  for (int i = 0; i < 3; i++) init_on(&st[i], &ev[i], T0 + 5, "run-B");
  lg__step_batch_t b = {st, 3};
  lg_error_t e = {0};
  fault_point = "claim.before_commit"; /* after the claim's row went in */
  fault_rc = LG_ESTORE;
  lg__store_set_fault(s, at_fault, NULL);
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), LG_ESTORE);
  lg__store_set_fault(s, NULL, NULL);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(st[i].decided, 0);
    assert_int_equal(st[i].fail, LG__STEP_STORE);
    assert_non_null(strstr(st[i].err.message, "claim.before_commit"));
    lg__step_clear(&st[i]);
  }
  char *after = events_of(s, "run-B");
  assert_string_equal(before, after); /* nothing written */
  free(before);
  free(after);
  /* the same batch with the store well: decided, the claim made (the
   * first one's row went with its batch) */
  for (int i = 0; i < 3; i++) init_on(&st[i], &ev[i], T0 + 5, "run-B");
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), 0);
  assert_int_equal(st[1].action, LG_ACT_EXECUTE);
  assert_int_equal(st[1].ledger_outcome, LG_CLAIM_CLAIMED);
  for (int i = 0; i < 3; i++) lg__step_clear(&st[i]);
  /* a run that is not stored */
  init_on(&st[0], &ev[0], T0 + 5, "nope");
  b.n = 1;
  assert_int_equal(lg__step_batch_run(s, "nope", &b, &e), LG_ENOTFOUND);
  assert_int_equal(st[0].fail, LG__STEP_NO_RUN);
  lg__step_clear(&st[0]);
  lg_store_close(s);
}

/* A result read late (lg__step_t's fill, as the gateway reads a tool
 * message of the conversation): filled with the whole event here. */
static int fills, fill_rc;
static int fill_from(lg__step_t *st, void *ud) {
  fills++;
  if (fill_rc) return fill_rc;
  st->ev.u.result = ((const lg_event_t *)ud)->u.result;
  return 0;
}

static void init_late(lg__step_t *st, const lg_event_t *whole, int64_t now, const char *id) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESULT; /* nothing of the result yet, not even its call */
  init_on(st, &ev, now, id);
  st->fill = fill_from;
  st->fill_ud = (void *)whole;
}

/* Read only when the run waits for a result (a run with no call out
 * refuses every result: it is never read), and then decided as the whole
 * event is, one step each: the same outcomes and trace. A fill that fails
 * fails the batch whole: nothing written, and the batch again is whole. */
static void results_read_late(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-A", "{}");
  create(s, "run-B", "{}");
  lg_error_t e = {0};
  lg_event_t early[] = {result_ev("c1", LG_STATUS_PROGRESS), result_ev("c2", LG_STATUS_PROGRESS)};
  lg__step_t st[4];
  fills = 0;
  for (int i = 0; i < 2; i++) init_late(&st[i], &early[i], T0 + 5, "run-B");
  lg__step_batch_t b = {st, 2};
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), 0);
  assert_int_equal(fills, 0); /* no call out: not read */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(st[i].decided, 0);
    assert_int_equal(st[i].fail, LG__STEP_CONFLICT);
    lg__step_clear(&st[i]);
  }
  three_calls(s, "run-A", "run-B", T0 + 10);
  lg_event_t evs[] = {result_ev("c1", LG_STATUS_PROGRESS), result_ev("ghost", LG_STATUS_PROGRESS),
                      result_ev("c2", LG_STATUS_RETRYABLE), result_ev("c3", LG_STATUS_PROGRESS)};
  lg__step_t one[4];
  for (int i = 0; i < 4; i++) {
    init_on(&one[i], &evs[i], T0 + 20, "run-A");
    int rc = lg__step_run(s, "run-A", &one[i], &e);
    assert_int_equal(rc != 0, i == 1); /* the ghost's call was never made */
    init_late(&st[i], &evs[i], T0 + 20, "run-B");
  }
  /* first with a fill that fails (out of memory): nothing stays */
  char *before = events_of(s, "run-B");
  fills = 0;
  fill_rc = LG_ENOMEM;
  b.n = 4;
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), LG_ENOMEM);
  fill_rc = 0;
  assert_int_equal(fills, 1);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(st[i].decided, 0);
    assert_int_equal(st[i].fail, LG__STEP_STORE);
    lg__step_clear(&st[i]);
    init_late(&st[i], &evs[i], T0 + 20, "run-B");
  }
  char *after = events_of(s, "run-B");
  assert_string_equal(before, after);
  free(before);
  free(after);
  fills = 0;
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), 0);
  assert_int_equal(fills, 4); /* a call was out before each: every one read */
  for (int i = 0; i < 4; i++) {
    assert_int_equal(one[i].decided, st[i].decided);
    assert_int_equal(one[i].fail, st[i].fail);
    assert_int_equal(one[i].action, st[i].action);
    assert_int_equal(one[i].reason, st[i].reason);
    char *xa = as_a(&one[i].answer), *ya = as_a(&st[i].answer);
    assert_string_equal(xa, ya);
    free(xa);
    free(ya);
    lg__step_clear(&one[i]);
    lg__step_clear(&st[i]);
  }
  char *ta = mask(events_of(s, "run-A")), *tb = mask(events_of(s, "run-B"));
  assert_string_equal(ta, tb);
  assert_non_null(strstr(tb, "\"c3\""));
  free(ta);
  free(tb);
  lg_store_close(s);
}

int main(void) {
  canon = lg_canon_new();
  const char *pj = "{\"models\": {\"m\": {\"input_usd_per_mtok\": 1000, \"output_usd_per_mtok\": 2000}}}";
  lg_error_t e = {0};
  prices = lg_prices_parse(pj, strlen(pj), "prices", &e);
  if (!prices) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_as_one_by_one),
      cmocka_unit_test(stop_in_the_middle),
      cmocka_unit_test(deny_rule),
      cmocka_unit_test(store_writes),
      cmocka_unit_test(own_scope_refusal),
      cmocka_unit_test(failed_after_the_engine),
      cmocka_unit_test(store_failure),
      cmocka_unit_test(results_read_late),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  lg_canon_free(canon);
  lg_prices_free(prices);
  return rc;
}
