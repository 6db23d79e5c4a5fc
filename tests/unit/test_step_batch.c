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
 * (the first event becomes the cancel); an event a batch does not take
 * (nothing written).
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

/* A step of ev at now, as a front end makes one. */
static void init(lg__step_t *st, const lg_event_t *ev, int64_t now) {
  lg__step_init(st, ev, now);
  st->canon = canon;
}

/* The answer of a step on run-B, with run-B read as run-A (the envelope
 * of a stop names its run). */
static char *as_a(const lg__buf_t *b) {
  char *t = strndup(b->data ? b->data : "", b->len);
  for (char *p = t; (p = strstr(p, "run-B")); p += 5) p[4] = 'A';
  return t;
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
  init(&sa, &ev, now);
  init(&sb, &ev, now);
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

/* Runs evs one step each on a and as one batch on b, and checks that
 * every outcome and the traces agree. Returns the batch's rc. */
static int compare(lg_store_t *s, const char *a, const char *b, const lg_event_t *evs, size_t n,
                   int64_t now) {
  lg__step_t one[16], batch[16];
  assert_true(n <= 16);
  lg_error_t e = {0};
  int frc[16];
  for (size_t i = 0; i < n; i++) {
    init(&one[i], &evs[i], now);
    frc[i] = lg__step_run(s, a, &one[i], &e);
    init(&batch[i], &evs[i], now);
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
  char *ta = events_of(s, a), *tb = events_of(s, b);
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

static void not_batchable(void **state) {
  (void)state;
  lg_store_t *s = open_store();
  create(s, "run-B", "{}");
  char *before = events_of(s, "run-B");
  lg_event_t ev[] = {text_ev("fine"), call_ev("c1", "{}")};
  lg__step_t st[2];
  init(&st[0], &ev[0], T0 + 5);
  init(&st[1], &ev[1], T0 + 5);
  lg__step_batch_t b = {st, 2};
  lg_error_t e = {0};
  assert_int_equal(lg__step_batch_run(s, "run-B", &b, &e), LG_EINVAL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(st[i].decided, 0);
    assert_int_equal(st[i].fail, LG__STEP_STORE);
    assert_non_null(strstr(st[i].err.message, "call event"));
    lg__step_clear(&st[i]);
  }
  char *after = events_of(s, "run-B");
  assert_string_equal(before, after); /* nothing written */
  free(before);
  free(after);
  /* a run that is not stored */
  init(&st[0], &ev[0], T0 + 5);
  b.n = 1;
  assert_int_equal(lg__step_batch_run(s, "nope", &b, &e), LG_ENOTFOUND);
  assert_int_equal(st[0].fail, LG__STEP_NO_RUN);
  lg__step_clear(&st[0]);
  lg_store_close(s);
}

int main(void) {
  canon = lg_canon_new();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_as_one_by_one),
      cmocka_unit_test(stop_in_the_middle),
      cmocka_unit_test(deny_rule),
      cmocka_unit_test(not_batchable),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  lg_canon_free(canon);
  return rc;
}
