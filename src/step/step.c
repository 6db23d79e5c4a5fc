/*
 * step.c — the decision step: one event for one stored run, under the
 * run's lock, in one store transaction (see step.h).
 *
 * lg__step_locked() is called by lg_store_with_run() with the run's row
 * locked, or by the group commit (src/store/group.c) for each of the
 * decisions it commits together:
 *
 *   1. load the run from its record: the engine state (lg_run_load) with
 *      the policy parsed from the stored policy JSON (st->policy may answer
 *      from a cache: most runs have the default), and the store's ledger at
 *      the run's start (lg_store_ledger_new), so calls use the durable
 *      ledger by themselves;
 *   2. the run's time: now minus its creation, never before the last event
 *      the run saw (clocks of replicas differ; a trace must not go back);
 *   3. the kill switch: a deny rule for the run or its group turns the
 *      event into the cancel it stands for, before anything else;
 *   4. what only the store knows: a model call's worst case and its shared
 *      budgets (a refusal by a limit turns the event into a budget event;
 *      one by an in-flight cap changes nothing), a usage's actual cost;
 *   5. apply the event (lg__run_apply, as replay does);
 *   6. save the run and append the event's trace line (lg__trace_write),
 *      in the same transaction;
 *   7. the answer (http-api-v1's decision object) while the decision's
 *      borrowed strings are alive.
 * Nothing is answered before the transaction commits; if anything fails
 * nothing is written. Events for a run that has already stopped change
 * nothing: the answer is the stop, and neither the store nor the trace is
 * written. So the trace is the events exactly as the engine was given
 * them, and replaying it gives the decisions the server gave.
 */
#include "step.h"

#include "../budget/budget.h"
#include "../engine/engine.h"
#include "../event/event.h"
#include "../store/store.h"
#include "../trace/trace.h"

#include <stdio.h>
#include <stdlib.h>

void lg__step_init(lg__step_t *st, const lg_event_t *ev, int64_t now_ms) {
  memset(st, 0, sizeof *st);
  if (ev) st->ev = *ev;
  st->now_ms = now_ms;
  st->ledger_outcome = -1;
}

void lg__step_clear(lg__step_t *st) {
  lg__free(st->envelope);
  st->envelope = NULL;
  lg__buf_free(&st->answer);
  lg__buf_free(&st->stop_log);
}

static int fail(lg__step_t *st, lg__step_fail_t why, int rc) {
  st->fail = why;
  return rc ? rc : LG_ECONFLICT; /* any non-zero: the transaction rolls back */
}

/* Classifies an engine error: the event was malformed or does not fit the
 * run's state (nothing changed in the run). Store errors pass through. */
static int engine_error(lg__step_t *st, int rc) {
  switch (rc) {
  case LG_EINVAL:
  case LG_EPARSE:
  case LG_EDEPTH:
  case LG_ERANGE:
  case LG_EUTF8:
  case LG_EDUPKEY:
  case LG_ETOOBIG: return fail(st, LG__STEP_BAD_EVENT, rc);
  case LG_ENOTFOUND:
  case LG_ESTATE: return fail(st, LG__STEP_CONFLICT, rc);
  default: return fail(st, LG__STEP_STORE, rc);
  }
}

/* ---- the answer ---- */

static void decision_json(lg__step_t *st, lg_run_t *run, const lg_decision_t *d,
                          const char *budget_meta) {
  lg__buf_t *b = &st->answer;
  /* A call or result a deny rule stopped answers as one (its call_id, no
   * fingerprint: the guard never read it), though the cancel took its
   * place in the trace. */
  lg_event_type_t type = st->denied ? st->asked : st->ev.type;
  lg__buf_putc(b, '{');
  if (type == LG_EV_CALL || type == LG_EV_RESULT) {
    const char *id = d->call_id ? d->call_id
                     : st->denied         ? st->asked_call_id
                     : type == LG_EV_CALL ? st->ev.u.call.call_id
                                          : st->ev.u.result.call_id;
    lg__buf_puts(b, "\"call_id\":");
    if (id) lg__buf_json_str(b, id, strlen(id));
    else lg__buf_puts(b, "null");
    lg__buf_putc(b, ',');
  }
  lg__decision_json(b, type, d);
  if (type == LG_EV_MODEL && d->action == LG_ACT_EXECUTE)
    lg__buf_printf(b, ",\"reservation_id\":\"%lld\"", (long long)d->reservation);
  if (d->action == LG_ACT_STOP && budget_meta) {
    lg__buf_puts(b, ",\"metadata\":");
    lg__buf_puts(b, budget_meta);
  }
  if (d->action == LG_ACT_STOP) {
    lg__buf_puts(b, ",\"envelope\":");
    lg__free(st->envelope);
    st->envelope = lg_run_envelope_json(run);
    lg__buf_puts(b, st->envelope ? st->envelope : "null");
    if (!st->envelope) b->oom = true;
  }
  lg__buf_putc(b, '}');
}

/* The fields of the log line of a stop. */
static void stop_fields(lg__step_t *st, const char *run_id, const lg_decision_t *d) {
  lg__buf_t *f = &st->stop_log;
  const char *tool = st->ev.type == LG_EV_CALL ? st->ev.u.call.tool : NULL;
  lg__buf_puts(f, "\"run_id\":");
  lg__buf_json_str(f, run_id, strlen(run_id));
  lg__buf_puts(f, ",\"reason\":");
  const char *why = d->reason_text && *d->reason_text ? d->reason_text : lg_reason_name(d->reason);
  lg__buf_json_str(f, why, strlen(why));
  lg__buf_puts(f, ",\"guard\":");
  if (d->guard && *d->guard) lg__buf_json_str(f, d->guard, strlen(d->guard));
  else lg__buf_puts(f, "null");
  lg__buf_json_kv(f, "operator_note", d->operator_note);
  lg__buf_json_kv(f, "tool", tool);
  lg__buf_json_kv(f, "call_id", d->call_id);
  lg__buf_json_kv(f, "on", lg_event_type_name(st->ev.type));
  lg__buf_json_kv(f, "message", d->message);
}

/* ---- what only the store knows ---- */

/* The deny rules: a cancel in place of the event (the trace says so). */
static int check_deny(lg__step_t *st, lg_store_t *s, const lg_run_record_t *rec, char **why,
                      lg_error_t *err) {
  int den = lg_store_denied(s, rec->run_id, rec->group, why, err);
  if (den <= 0) return den;
  st->asked = st->ev.type;
  st->asked_call_id = st->ev.type == LG_EV_CALL     ? st->ev.u.call.call_id
                      : st->ev.type == LG_EV_RESULT ? st->ev.u.result.call_id
                                                    : NULL;
  int64_t t = st->ev.t_ms;
  memset(&st->ev, 0, sizeof st->ev);
  st->ev.type = LG_EV_CANCEL;
  st->ev.t_ms = t;
  st->ev.u.cancel.reason = *why;
  st->denied = 1;
  return 0;
}

/* The event to the engine (step 5), as replay applies it; st->applied
 * when the engine took it (a failure after that is not the event's alone:
 * the run in memory has changed). */
static int apply(lg__step_t *st, lg_run_t *run, lg_decision_t *d, lg_error_t *err) {
  int rc = lg__run_apply(run, st->canon, &st->ev, false, d, err);
  if (!rc) st->applied = 1;
  return rc;
}

/* A model call: the worst case and the shared budgets around the engine. */
static int decide_model(lg__step_t *st, lg_store_t *s, lg_run_t *run, lg_decision_t *d,
                        char **budget_meta, lg_error_t *err) {
  lg__gate_t g;
  lg_budget_gate_t out;
  lg_model_call_t *m = &st->ev.u.model.m;
  m->t_ms = st->ev.t_ms;
  int rc = lg__gate_model_begin(s, st->prices, run, m, st->scopes, st->nscopes, st->ttl_ms,
                                st->now_ms, &g, &out, err);
  if (rc == LG_BUDGET_REFUSED) {
    st->budget_refused = 1;
    st->refusal = out.refusal;
    /* Too much in flight now, or a limit of the call's own scopes (a
     * gateway key's: the run's next request may come with another key,
     * or after the key's period resets): an error, nothing changed, as
     * the gateway's check before the step answers it. */
    if (!lg__gate_refusal_stops(&g, &out.refusal)) {
      lg__gate_clear(&g);
      return fail(st, LG__STEP_REFUSED, rc);
    }
    /* A limit of the run's own scopes: the run stops, and its trace says why. */
    *budget_meta = lg__budget_refusal_metadata_json(&out.refusal);
    int64_t t = st->ev.t_ms;
    memset(&st->ev, 0, sizeof st->ev);
    st->ev.type = LG_EV_BUDGET;
    st->ev.t_ms = t;
    st->ev.u.budget.scope = st->refusal.scope;
    st->ev.u.budget.limit_source = st->refusal.limit_source;
    st->ev.u.budget.requested_nusd = out.worst_nusd;
    lg__gate_clear(&g);
    if (!*budget_meta) return fail(st, LG__STEP_STORE, LG_ENOMEM);
    return apply(st, run, d, err);
  }
  if (rc == LG_ENOTFOUND || (rc == LG_EINVAL && err && !strcmp(err->field, "max_tokens"))) {
    lg__gate_clear(&g);
    return fail(st, LG__STEP_UNPRICED, rc);
  }
  if (rc) {
    lg__gate_clear(&g);
    return rc;
  }
  rc = apply(st, run, d, err);
  rc = lg__gate_model_end(s, &g, rc, d, &out, err);
  lg__gate_clear(&g);
  return rc;
}

/* A usage: the actual cost, settled with the shared budgets first. Also
 * for a run that has stopped since its model call left (a cancel, another
 * request of the run, another replica): that money was spent all the
 * same, so the shared budgets settle it; the stop stands, and the run's
 * counters and trace take nothing after it. */
static int decide_usage(lg__step_t *st, lg_store_t *s, lg_run_t *run, lg_decision_t *d,
                        lg_error_t *err) {
  int64_t seq = 0, actual = 0;
  int rc = lg__gate_usage(s, st->prices, run, st->ev.u.usage.reservation,
                          st->ev.u.usage.input_tokens, st->ev.u.usage.output_tokens,
                          st->ev.u.usage.cost_nusd, st->usage_measured, st->now_ms, &seq, &actual,
                          err);
  if (st->was_stopped) {
    if (rc && rc != LG_ENOTFOUND) return rc; /* not found: nothing held, nothing to settle */
    if (err) memset(err, 0, sizeof *err);
    st->actual_nusd = actual;
    return apply(st, run, d, err); /* the stop, again */
  }
  if (rc) return rc;
  st->actual_nusd = actual;
  st->ev.u.usage.cost_nusd = actual; /* what the engine and the trace count */
  return apply(st, run, d, err);
}

static int decide(lg__step_t *st, lg_store_t *s, lg_run_t *run, lg_decision_t *d,
                  char **budget_meta, lg_error_t *err) {
  if (st->was_stopped && st->ev.type != LG_EV_RESUME && st->ev.type != LG_EV_USAGE)
    return apply(st, run, d, err); /* the stop, again */
  switch (st->ev.type) {
  case LG_EV_MODEL: return decide_model(st, s, run, d, budget_meta, err);
  case LG_EV_USAGE: return decide_usage(st, s, run, d, err);
  default: return apply(st, run, d, err);
  }
}

/* ---- the step ---- */

static void note_ledger(lg__step_t *st, const lg_decision_t *d) {
  if (st->ev.type != LG_EV_CALL || !d->idempotency_key || st->was_stopped) return;
  if (d->action == LG_ACT_EXECUTE) st->ledger_outcome = LG_CLAIM_CLAIMED;
  else if (d->action == LG_ACT_REPLAY) st->ledger_outcome = LG_CLAIM_REPLAY;
  else if (d->reason == LG_R_IN_PROGRESS) st->ledger_outcome = LG_CLAIM_IN_PROGRESS;
  else if (d->reason == LG_R_IDEMPOTENCY_MISMATCH) st->ledger_outcome = LG_CLAIM_MISMATCH;
  else if (d->reason == LG_R_UNKNOWN_OUTCOME) st->ledger_outcome = LG_CLAIM_UNKNOWN_OUTCOME;
}

/* Saves the run and its trace lines (lines, len) in the transaction. */
static int save_run(lg_store_t *s, const lg_run_record_t *rec, lg_run_t *run, int64_t now_ms,
                    const char *lines, size_t len, lg_error_t *err) {
  char *state = NULL, *env = NULL;
  size_t state_len = 0;
  /* The stored envelope is the terminal one: written when the run stops.
   * While it is active the state says everything (GET /v1/runs/{id} and
   * `loopguard runs show` rebuild the envelope from it), and the row stays
   * small enough for one page, which halves what a commit writes. */
  int stopped = lg_run_stopped(run);
  int rc = lg_run_save(run, &state, &state_len);
  if (!rc && stopped && !(env = lg_run_envelope_json(run))) rc = LG_ENOMEM;
  if (!rc) {
    lg_run_record_t r2 = *rec;
    r2.stopped = stopped;
    r2.terminal_reason = (char *)lg_run_terminal_reason(run);
    r2.state = state;
    r2.state_len = state_len;
    r2.envelope_json = env;
    r2.updated_ms = now_ms;
    rc = lg__store_run_put_events(s, &r2, lines, len, err);
  } else {
    rc = lg__err(err, rc, NULL, -1, "out of memory");
  }
  lg__free(state);
  lg__free(env);
  return rc;
}

/* Saves the run and the event's trace line in the transaction; with
 * lines (a batch), only appends the line there: the batch saves once. */
static int save(lg__step_t *st, lg_store_t *s, const lg_run_record_t *rec, lg_run_t *run,
                const lg_decision_t *d, lg__buf_t *lines, lg_error_t *err) {
  if (lines) {
    int rc = lg__trace_write(lines, &st->ev, d);
    return rc || lines->oom ? lg__err(err, LG_ENOMEM, NULL, -1, "out of memory") : 0;
  }
  lg__buf_t line = {0};
  int rc = lg__trace_write(&line, &st->ev, d);
  if (rc || line.oom) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  else rc = save_run(s, rec, run, st->now_ms, line.data, line.len, err);
  lg__buf_free(&line);
  return rc;
}

/* Step 1: the run from its record (*run), with its policy and the store's
 * ledger at its start (*ledger, to free even on failure). */
static int load_run(lg__step_t *st, lg_store_t *s, const lg_run_record_t *rec, lg_run_t **run,
                    lg_ledger_t **ledger, lg_error_t *err) {
  lg_policy_t *pol = st->policy ? st->policy(st->policy_ud, rec->policy_json, err)
                     : rec->policy_json && *rec->policy_json
                         ? lg_policy_parse(rec->policy_json, strlen(rec->policy_json), "stored policy", err)
                         : lg_policy_default();
  if (!pol) return fail(st, LG__STEP_STORE, err->code ? err->code : LG_ENOMEM);
  if (!(*ledger = lg_store_ledger_new(s, rec->created_ms))) {
    lg_policy_free(pol);
    return fail(st, LG__STEP_STORE, lg__err(err, LG_ENOMEM, NULL, -1, "out of memory"));
  }
  *run = rec->state ? lg_run_load(rec->state, rec->state_len, pol, *ledger, err) : NULL;
  lg_policy_free(pol);
  if (!*run) return fail(st, LG__STEP_STORE, err->code && err->code != LG_EINVAL ? err->code : LG_ESTATE);
  return 0;
}

/* Step 2: the event's time in the run (now minus its creation, never
 * before the last event it saw), and the turn of an event that has none
 * or whose turn is the stored run's (model_turn). */
static void place_event(lg__step_t *st, const lg_run_record_t *rec, const lg_run_t *run) {
  lg_counters_t c0;
  lg_run_counters(run, &c0);
  int64_t t = st->now_ms - rec->created_ms;
  if (t < c0.last_t_ms) t = c0.last_t_ms;
  if (t < 0) t = 0;
  st->ev.t_ms = t;
  if (st->ev.type == LG_EV_CALL && st->auto_turn)
    st->ev.u.call.turn = c0.calls + 1; /* no turn: a turn of its own */
  if (st->ev.type == LG_EV_TEXT && st->auto_turn) /* no turn: a response of its own */
    st->ev.u.text.turn = -(int64_t)(run->seq + 1);
  if (st->model_turn) {
    if (st->ev.type == LG_EV_MODEL) st->ev.u.model.m.turn = c0.model_calls + 1;
    else if (st->ev.type == LG_EV_CALL) st->ev.u.call.turn = c0.model_calls;
    else if (st->ev.type == LG_EV_TEXT) st->ev.u.text.turn = c0.model_calls;
  }
}

/* Steps 6 and 7: what the decision leaves (the saved run and trace line,
 * unless the run had stopped before and stays so; the stop's log fields)
 * and the answer. */
static int record(lg__step_t *st, lg_store_t *s, const lg_run_record_t *rec, lg_run_t *run,
                  const lg_decision_t *d, const char *budget_meta, lg__buf_t *lines,
                  lg_error_t *err) {
  st->decided = 1;
  st->action = d->action;
  st->reason = d->reason;
  note_ledger(st, d);
  if (!st->was_stopped || (st->ev.type == LG_EV_RESUME && !lg_run_stopped(run))) {
    int rc = save(st, s, rec, run, d, lines, err);
    if (rc) return fail(st, LG__STEP_STORE, rc);
    st->stopped_now = lg_run_stopped(run) && !st->was_stopped;
    if (st->stopped_now) stop_fields(st, rec->run_id, d);
  }
  decision_json(st, run, d, budget_meta);
  if (st->answer.oom || st->stop_log.oom)
    return fail(st, LG__STEP_STORE, lg__err(err, LG_ENOMEM, NULL, -1, "out of memory"));
  return 0;
}

/* Steps 2 to 7 for one event on the loaded run: placed, the deny rules
 * (unless *deny_checked: a batch checks them once), decided, recorded
 * (lines: a batch's trace lines, or NULL: saved now). *why holds a deny
 * rule's reason (the cancel's), to free after. */
static int step_on(lg__step_t *st, lg_store_t *s, const lg_run_record_t *rec, lg_run_t *run,
                   int *deny_checked, char **why, lg__buf_t *lines, lg_error_t *err) {
  st->called = 1;
  char *budget_meta = NULL;
  int rc = 0;
  place_event(st, rec, run);
  st->was_stopped = lg_run_stopped(run);
  if (!st->was_stopped && st->ev.type != LG_EV_CANCEL && !*deny_checked) {
    *deny_checked = lines != NULL;
    if ((rc = check_deny(st, s, rec, why, err))) return fail(st, LG__STEP_STORE, rc);
  }
  if (st->fill && st->ev.type == LG_EV_RESULT && lg__run_awaits_result(run) &&
      (rc = st->fill(st, st->fill_ud)))
    return fail(st, LG__STEP_STORE,
                lg__err(err, rc, NULL, -1, "the result could not be read: %s", lg_strerror(rc)));
  lg_decision_t d;
  memset(&d, 0, sizeof d);
  if ((rc = decide(st, s, run, &d, &budget_meta, err))) {
    if (!st->fail) rc = engine_error(st, rc);
  } else {
    rc = record(st, s, rec, run, &d, budget_meta, lines, err);
  }
  lg__free(budget_meta);
  return rc;
}

int lg__step_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  lg__step_t *st = ud;
  lg_error_t e = {0}, *err = &e;
  st->called = 1;
  char *why = NULL;
  int rc = 0, deny_checked = 0;
  lg_ledger_t *ledger = NULL;
  lg_run_t *run = NULL;
  if (!(rc = load_run(st, s, rec, &run, &ledger, err)))
    rc = step_on(st, s, rec, run, &deny_checked, &why, NULL, err);
  if (rc) st->err = e;
  if (st->denied) st->ev.u.cancel.reason = NULL; /* freed below */
  lg_run_free(run);
  lg_ledger_free(ledger);
  lg__free(why);
  return rc;
}

int lg__step_run(lg_store_t *s, const char *run_id, lg__step_t *st, lg_error_t *err) {
  return lg__step_finish(st, lg_store_with_run(s, run_id, lg__step_locked, st, err), err);
}

int lg__step_finish(lg__step_t *st, int rc, lg_error_t *err) {
  if (!rc) return 0;
  if (st->fail) {
    if (err) *err = st->err;
  } else if (rc == LG_ENOTFOUND && !st->called) {
    st->fail = LG__STEP_NO_RUN;
  } else {
    st->fail = LG__STEP_STORE;
  }
  return rc;
}

/* ---- several events of one run ---- */

/* A batch that failed as a whole: no step decided, each says why. */
static void unwind(lg__step_batch_t *b, int rc, const lg_error_t *e) {
  for (size_t i = 0; i < b->n; i++) {
    lg__step_t *st = &b->v[i];
    lg__step_clear(st);
    st->decided = st->stopped_now = st->was_stopped = st->denied = 0;
    st->ledger_outcome = -1;
    st->fail = LG__STEP_STORE;
    st->err = *e;
    if (!st->err.code) st->err.code = rc;
  }
}

int lg__step_batch_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  lg__step_batch_t *b = ud;
  lg_error_t e = {0};
  if (!b->n) return 0;
  lg__step_t *first = &b->v[0];
  for (size_t i = 0; i < b->n; i++) b->v[i].called = 1;
  char *why = NULL;
  int rc = 0, deny_checked = 0, denied_at = -1;
  lg_ledger_t *ledger = NULL;
  lg_run_t *run = NULL;
  lg__buf_t lines = {0};
  if (!(rc = load_run(first, s, rec, &run, &ledger, &e))) {
    for (size_t i = 0; i < b->n && !rc; i++) {
      lg__step_t *st = &b->v[i];
      st->policy = first->policy;
      st->policy_ud = first->policy_ud;
      if (!st->canon) st->canon = first->canon;
      lg_error_t ei = {0};
      int src = step_on(st, s, rec, run, &deny_checked, &why, &lines, &ei);
      if (st->denied) denied_at = (int)i;
      if (!src) continue;
      st->err = ei;
      /* The event did not fit the run (the engine changed nothing, and a
       * claim, reservation or settlement made for it went with the
       * savepoint its layer made it in): as in a step of its own, it alone
       * fails. A store failure, or one after the engine took the event
       * (the run in memory has changed), fails them all. */
      if (st->fail == LG__STEP_STORE || st->applied) {
        rc = src;
        e = ei;
      }
    }
    if (!rc && lines.len) rc = save_run(s, rec, run, first->now_ms, lines.data, lines.len, &e);
  }
  if (denied_at >= 0) b->v[denied_at].ev.u.cancel.reason = NULL; /* freed below */
  if (rc) unwind(b, rc, &e);
  lg__buf_free(&lines);
  lg_run_free(run);
  lg_ledger_free(ledger);
  lg__free(why);
  return rc;
}

int lg__step_batch_run(lg_store_t *s, const char *run_id, lg__step_batch_t *b, lg_error_t *err) {
  return lg__step_batch_finish(b, lg_store_with_run(s, run_id, lg__step_batch_locked, b, err), err);
}

int lg__step_batch_finish(lg__step_batch_t *b, int rc, lg_error_t *err) {
  if (!rc || !b->n) return rc;
  lg_error_t e = {0};
  if (err) e = *err;
  if (!b->v[0].called) { /* not found, or the transaction did not open */
    for (size_t i = 0; i < b->n; i++) {
      b->v[i].fail = rc == LG_ENOTFOUND ? LG__STEP_NO_RUN : LG__STEP_STORE;
      b->v[i].err = e;
    }
    return rc;
  }
  int decided = 0;
  for (size_t i = 0; i < b->n; i++) decided |= b->v[i].decided;
  if (decided) unwind(b, rc, &e); /* the commit failed: nothing was written */
  else if (err) *err = b->v[0].err;
  return rc;
}

/* ---- creating runs ---- */

int lg__step_new_run_id(char out[32]) {
  return lg__random_id("run_", 12, out, 32, "a run id", NULL);
}

/* The progress_version in a run line (the writer's own line): 1 when the
 * line says (*pv set). The field, when there, is written once, as a plain
 * integer, and no string before it can hold its name (the run id and group
 * are escaped JSON strings). */
static int line_checkpoint(const char *line, size_t n, int64_t *pv) {
  static const char k[] = "\"progress_version\":";
  const size_t kl = sizeof k - 1;
  for (size_t i = 0; i + kl < n; i++)
    if (!memcmp(line + i, k, kl)) {
      *pv = strtoll(line + i + kl, NULL, 10);
      return 1;
    }
  return 0;
}

/* The progress_version of a run's first trace line: 1 when the line is a
 * run line (*has, *pv set from it), 0 when the run has no run line. */
static int logged_checkpoint(lg_store_t *s, const char *run_id, int *has, int64_t *pv) {
  lg__buf_t b = {0};
  int known = 0;
  *has = 0;
  if (!lg__store_events_read(s, run_id, &b, NULL) && b.len) {
    char *nl = memchr(b.data, '\n', b.len);
    size_t n = nl ? (size_t)(nl - b.data) : b.len;
    known = n > 13 && !memcmp(b.data, "{\"type\":\"run\"", 13);
    if (known) *has = line_checkpoint(b.data, n, pv);
  }
  lg__buf_free(&b);
  return known;
}

/* Whether the run's stored scopes are these (in any order). */
static int same_scopes(lg_store_t *s, const char *run_id, const char *const *scopes, size_t n) {
  char **v = NULL;
  size_t have = 0;
  if (lg__budget_run_scopes(s, run_id, &v, &have, NULL)) return 0;
  int same = have == n;
  for (size_t i = 0; same && i < n; i++) {
    size_t k = 0;
    while (k < have && strcmp(v[k], scopes[i])) k++;
    same = k < have;
  }
  lg__budget_strv_free(v);
  return same;
}

/* Whether a second creation of the run asks for the run as made: its
 * group, policy, checkpoint and budget scopes (a scope left out would
 * leave the client believing its run under a budget it is not under). */
static int same_run(lg_store_t *s, const lg_run_t *run, const char *policy_json,
                    const int64_t *checkpoint, const char *const *scopes, size_t nscopes,
                    int *same, lg_error_t *err) {
  lg_run_record_t old = {0};
  int rc = lg_store_run_get(s, lg_run_id(run), &old, err);
  if (rc) return rc;
  const char *group = lg_run_group(run);
  int has_pv = 0;
  int64_t pv = 0;
  *same = ((!old.group && !group) || (old.group && group && !strcmp(old.group, group))) &&
          old.policy_json && !strcmp(old.policy_json, policy_json);
  if (*same && logged_checkpoint(s, lg_run_id(run), &has_pv, &pv))
    *same = has_pv == (checkpoint != NULL) && (!has_pv || pv == *checkpoint);
  if (*same) *same = same_scopes(s, lg_run_id(run), scopes, nscopes);
  lg_run_record_clear(&old);
  return 0;
}

/* A new run's record (its state in *state) and its creation's trace line
 * (*line): 0, or LG_ENOMEM with err filled; *state and *line to free
 * either way. No envelope while the run is active (see save()). */
static int born_record(const lg_run_t *run, const char *policy_json, const int64_t *checkpoint,
                       int64_t now_ms, lg_run_record_t *rec, char **state, lg__buf_t *line,
                       lg_error_t *err) {
  size_t state_len = 0;
  int rc = lg_run_save(run, state, &state_len);
  if (!rc) rc = lg__trace_write_run(line, lg_run_id(run), lg_run_group(run), checkpoint, policy_json);
  if (rc) return lg__err(err, rc, NULL, -1, "out of memory");
  *rec = (lg_run_record_t){(char *)lg_run_id(run), (char *)lg_run_group(run), 0, NULL,
                           (char *)policy_json, *state, state_len, NULL, now_ms, now_ms};
  return 0;
}

int lg__step_create(lg_store_t *s, const lg_run_t *run, const char *policy_json,
                    const int64_t *checkpoint, const char *const *scopes, size_t nscopes,
                    int64_t now_ms, int *same, lg_error_t *err) {
  if (same) *same = 0;
  char *state = NULL;
  lg__buf_t line = {0};
  lg_run_record_t rec;
  int rc = born_record(run, policy_json, checkpoint, now_ms, &rec, &state, &line, err);
  if (rc) goto out;
  /* The run, its scopes and its first trace line: all or nothing. */
  lg__store_lock(s);
  rc = lg__store_begin(s, LG__TXN_RUN, err);
  if (!rc) {
    rc = lg__store_run_create_ev(s, &rec, line.data, line.len, err);
    if (!rc && nscopes) rc = lg_budget_run_scopes_set(s, rec.run_id, scopes, nscopes, err);
    int erc = lg__store_end(s, rc == 0, rc ? NULL : err);
    if (!rc) rc = erc;
  }
  lg__store_unlock(s);
  if (rc == LG_ECONFLICT && same) {
    int src = same_run(s, run, policy_json, checkpoint, scopes, nscopes, same, NULL);
    if (src) *same = 0;
  }
out:
  lg__free(state);
  lg__buf_free(&line);
  return rc;
}

int lg__step_with_new(lg_store_t *s, const lg_run_t *run, const char *policy_json, int64_t now_ms,
                      lg_store_run_fn fn, void *ud, int *created, lg_error_t *err) {
  char *state = NULL;
  lg__buf_t line = {0};
  lg_run_record_t rec;
  lg__store_born_t born = {.rec = &rec};
  int rc = born_record(run, policy_json, NULL, now_ms, &rec, &state, &line, err);
  if (!rc) {
    born.lines = line.data;
    born.len = line.len;
    rc = lg__store_with_run_born(s, &born, fn, ud, err);
  }
  *created = !rc && born.created;
  lg__free(state);
  lg__buf_free(&line);
  return rc;
}

/* ---- the kill switch ---- */

static lg_event_t cancel_event(const char *reason) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_CANCEL;
  ev.u.cancel.reason = reason;
  return ev;
}

/* A record with no engine state (written by hand or by another tool)
 * cannot take an event: it is marked stopped as it is. */
static int mark_stopped(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  const int64_t *now = ud;
  if (rec->stopped) return 0;
  lg_run_record_t r = *rec;
  r.stopped = 1;
  r.terminal_reason = (char *)lg_reason_name(LG_R_OPERATOR_CANCELLED);
  r.updated_ms = *now;
  return lg_store_run_put(s, &r, NULL);
}

/* Cancels one stored run through the step; LG_ENOTFOUND when not stored. */
static int cancel_one(lg_store_t *s, const char *run_id, const char *reason, int64_t now_ms,
                      lg__step_t *st, lg_error_t *err) {
  lg_event_t ev = cancel_event(reason);
  lg__step_init(st, &ev, now_ms);
  int rc = lg__step_run(s, run_id, st, err);
  if (rc == LG_ESTATE && st->fail == LG__STEP_STORE)
    rc = lg_store_with_run(s, run_id, mark_stopped, &now_ms, err);
  return rc;
}

int lg__step_cancel(lg_store_t *s, const char *run_id, const char *reason, int64_t now_ms,
                    lg__step_t *st, int *rule_stored, lg_error_t *err) {
  lg__step_init(st, NULL, now_ms);
  if (rule_stored) *rule_stored = 0;
  /* The deny rule first, durable on its own: even when stopping the stored
   * run fails (or the run does not exist yet), no worker decides for it
   * again without seeing the cancel. */
  int rc = lg__store_deny(s, LG__DENY_RUN, run_id, reason, now_ms, err);
  if (rc) {
    st->fail = LG__STEP_STORE;
    return rc;
  }
  if (rule_stored) *rule_stored = 1;
  return cancel_one(s, run_id, reason, now_ms, st, err);
}

int lg_store_cancel_run(lg_store_t *s, const char *run_id, const char *reason, int64_t now_ms,
                        lg_error_t *err) {
  lg__step_t st;
  lg_error_t e = {0};
  int rc = lg__step_cancel(s, run_id, reason, now_ms, &st, NULL, &e);
  lg__step_clear(&st);
  if (rc == LG_ENOTFOUND && st.fail == LG__STEP_NO_RUN) return 0; /* the rule waits for it */
  if (rc && err) *err = e;
  return rc;
}

typedef struct ids {
  char **v;   /* run ids (new) */
  size_t n;   /* how many */
  size_t cap; /* room */
} ids_t;

static int collect(void *ud, const lg_run_record_t *rec) {
  ids_t *ids = ud;
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? ids->cap * 2 : 16;
    char **v = lg__realloc(ids->v, cap * sizeof *v);
    if (!v) return LG_ENOMEM;
    ids->v = v;
    ids->cap = cap;
  }
  if (!(ids->v[ids->n] = lg__strdup(rec->run_id))) return LG_ENOMEM;
  ids->n++;
  return 0;
}

int lg__step_cancel_group(lg_store_t *s, const char *group, const char *reason, int64_t now_ms,
                          void (*on_run)(void *ud, const char *run_id, lg__step_t *st), void *ud,
                          int *rule_stored, lg_error_t *err) {
  if (rule_stored) *rule_stored = 0;
  int rc = lg__store_deny(s, LG__DENY_GROUP, group, reason, now_ms, err);
  if (rc) return rc;
  if (rule_stored) *rule_stored = 1;
  ids_t ids = {0};
  lg_run_filter_t f = {.status = "active", .group = group};
  rc = lg_store_run_list(s, &f, collect, &ids, err);
  if (rc == LG_ENOMEM) lg__err(err, rc, NULL, -1, "out of memory");
  for (size_t i = 0; i < ids.n && !rc; i++) {
    lg__step_t st;
    rc = cancel_one(s, ids.v[i], reason, now_ms, &st, err);
    if (rc == LG_ENOTFOUND) rc = 0; /* gone meanwhile */
    else if (!rc && on_run && (st.stopped_now || !st.decided)) on_run(ud, ids.v[i], &st);
    lg__step_clear(&st);
  }
  for (size_t i = 0; i < ids.n; i++) lg__free(ids.v[i]);
  lg__free(ids.v);
  return rc;
}

typedef struct cancelled {
  lg__buf_t b;
  int first;
} cancelled_t;

static void list_cancelled(void *ud, const char *run_id, lg__step_t *st) {
  (void)st;
  cancelled_t *c = ud;
  if (!c->first) lg__buf_putc(&c->b, ',');
  lg__buf_json_str(&c->b, run_id, strlen(run_id));
  c->first = 0;
}

int lg_store_cancel_group(lg_store_t *s, const char *group, const char *reason, int64_t now_ms,
                          char **cancelled_json, lg_error_t *err) {
  if (cancelled_json) *cancelled_json = NULL;
  cancelled_t c = {{0}, 1};
  lg__buf_putc(&c.b, '[');
  int rc = lg__step_cancel_group(s, group, reason, now_ms, list_cancelled, &c, NULL, err);
  lg__buf_putc(&c.b, ']');
  if (!rc && cancelled_json) {
    *cancelled_json = lg__buf_steal(&c.b, NULL);
    if (!*cancelled_json) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  lg__buf_free(&c.b);
  return rc;
}

int lg_store_resume_run(lg_store_t *s, const char *run_id, const int64_t *progress_version,
                        const char *note, int64_t now_ms, lg_error_t *err) {
  lg_event_t ev;
  memset(&ev, 0, sizeof ev);
  ev.type = LG_EV_RESUME;
  ev.u.resume.has_progress_version = progress_version != NULL;
  ev.u.resume.progress_version = progress_version ? *progress_version : 0;
  ev.u.resume.note = note;
  lg__step_t st;
  lg__step_init(&st, &ev, now_ms);
  int rc = lg__step_run(s, run_id, &st, err);
  if (rc == LG_ENOTFOUND && st.fail == LG__STEP_NO_RUN)
    lg__err(err, rc, NULL, -1, "no run \"%s\" in %s", run_id, lg_store_name(s));
  lg__step_clear(&st);
  return rc;
}
