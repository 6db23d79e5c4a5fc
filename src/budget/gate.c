/*
 * gate.c — the spend gate for the model calls of a run: the worst case
 * from the price table, the run's shared budgets, and the engine's own
 * caps, decided together (lg_budget_model), and their settlement
 * (lg_budget_usage).
 *
 * Order, and why. The shared reservation is made first, in a savepoint,
 * and the engine decides after it: a shared refusal then leaves the engine
 * untouched (its counters never count a call that was not made), and an
 * engine refusal (a cap) rolls the savepoint back, as if the reservation
 * had never been made. The shared reservation is tied to the engine's
 * reservation number (lg_decision_t.reservation), so that /usage finds it
 * again from what /model answered. The engine numbers its reservations
 * 1, 2, ... as it lets model calls through — the same sequence as its
 * model_calls counter — so the number is known before the engine decides;
 * it is checked afterwards all the same, and corrected if it ever differs.
 *
 * Settlement reads the engine's open reservation for the worst case it
 * held (engine.h): a usage that reports no cost, for a model without a
 * price, is charged that worst case — never nothing.
 */
#include "budget.h"

#include "../engine/engine.h"
#include "../store/store.h" /* lg__store_fault_at */

#include <stdio.h>

/* 1 when the run's policy has a cost cap (it needs the worst case). */
static int run_needs_cost(const lg_run_t *run) {
  const lg_policy_t *p = lg_run_policy(run);
  return p && p->max_cost_nusd >= 0;
}

void lg__gate_clear(lg__gate_t *g) {
  lg__budget_strv_free(g->scopes);
  memset(g, 0, sizeof *g);
}

int lg__gate_model_begin(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                         lg_model_call_t *m, const char *const *extra, size_t nextra,
                         int64_t ttl_ms, int64_t now_ms, lg__gate_t *g, lg_budget_gate_t *out,
                         lg_error_t *err) {
  memset(g, 0, sizeof *g);
  memset(out, 0, sizeof *out);
  out->worst_nusd = -1;
  if (m->input_tokens < 0)
    return lg__err(err, LG_EINVAL, "input_tokens", -1, "input_tokens must not be negative");
  int rc = s ? lg__budget_run_scopes(s, lg_run_id(run), &g->scopes, &g->n, err) : 0;
  g->nrun = g->n;
  if (!rc && s) rc = lg__budget_scopes_add(&g->scopes, &g->n, extra, nextra, err);
  if (rc) return rc;

  /* 1. The worst case. */
  int64_t worst = m->cost_nusd >= 0 ? m->cost_nusd : -1;
  int64_t priced = 0;
  lg_error_t perr = {0};
  int prc = lg_prices_worst_case(prices, m->model, m->input_tokens, m->max_tokens, &priced, &perr);
  if (!prc) {
    if (priced > worst) worst = priced;
    /* A call that gives no max_tokens is priced at the price file's bound:
     * that bound is its max_tokens for the run's token cap too, and in its
     * trace, so that replay counts what the server counted. */
    if (m->max_tokens < 0) m->max_tokens = lg__prices_output_bound(prices, m->model);
  } else if (worst < 0 && (g->n > 0 || run_needs_cost(run))) {
    /* Fail closed: a cap or a budget cannot be kept without a cost. */
    if (err) *err = perr;
    return prc;
  }
  out->worst_nusd = worst;
  m->cost_nusd = worst;
  if (!g->n) return 0;

  /* 2. The shared budgets, in a savepoint the engine's answer decides on. */
  lg_counters_t c;
  lg_run_counters(run, &c);
  g->run_seq = c.model_calls + 1;
  lg_budget_request_t req = {
      .scopes = (const char *const *)g->scopes,
      .nscopes = g->n,
      .amount_micro = lg_budget_nusd_to_micro(worst),
      .ttl_ms = ttl_ms,
      .run_id = lg_run_id(run),
      .run_seq = g->run_seq,
      .model = m->model && *m->model ? m->model : NULL,
  };
  if ((rc = lg__budget_sp_begin(s, err))) return rc;
  rc = lg__budget_reserve(s, &req, now_ms, &g->resv, &out->refusal, err);
  if (rc) {
    lg__budget_sp_end(s, 0, NULL);
    if (rc == LG_BUDGET_REFUSED) out->refused = 1;
    return rc;
  }
  g->sp_open = 1;
  return 0;
}

int lg__gate_refusal_stops(const lg__gate_t *g, const lg_budget_refusal_t *r) {
  if (r->retry_after_s > 0) return 0;
  for (size_t i = 0; i < g->nrun; i++)
    if (!strcmp(g->scopes[i], r->scope)) return 1;
  return 0;
}

int lg__gate_model_end(lg_store_t *s, lg__gate_t *g, int rc, const lg_decision_t *d,
                       lg_budget_gate_t *out, lg_error_t *err) {
  if (!g->sp_open) return rc;
  g->sp_open = 0;
  if (!rc) rc = lg__store_fault_at(s, "gate.after_engine", err);
  if (!rc && d->action == LG_ACT_EXECUTE && d->reservation != g->run_seq)
    rc = lg__budget_set_run_seq(s, g->resv.id, d->reservation, err);
  if (rc || d->action != LG_ACT_EXECUTE) {
    /* Not let through (or failed): the reservation is undone. */
    lg__budget_sp_end(s, 0, NULL);
    return rc;
  }
  rc = lg__budget_sp_end(s, 1, err);
  if (!rc) snprintf(out->reservation_id, sizeof out->reservation_id, "%s", g->resv.id);
  return rc;
}

int lg_budget_model(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                    const lg_model_call_t *m, int64_t ttl_ms, int64_t now_ms, lg_decision_t *d,
                    lg_budget_gate_t *out, lg_error_t *err) {
  lg_budget_gate_t local;
  if (!out) out = &local;
  memset(out, 0, sizeof *out);
  out->worst_nusd = -1;
  if (!run || !m || !d) return lg__err(err, LG_EINVAL, NULL, -1, "no run, model call or decision");
  if (lg_run_stopped(run)) return lg_run_model(run, m, d, err); /* the stop, again */
  lg__gate_t g;
  lg_model_call_t mm = *m;
  int rc = lg__gate_model_begin(s, prices, run, &mm, NULL, 0, ttl_ms, now_ms, &g, out, err);
  if (rc == LG_BUDGET_REFUSED && lg__gate_refusal_stops(&g, &out->refusal)) {
    /* Refused by a limit: the run stops, as a budget event does. */
    lg_event_t ev = {.type = LG_EV_BUDGET, .t_ms = m->t_ms};
    ev.u.budget.scope = out->refusal.scope;
    ev.u.budget.limit_source = out->refusal.limit_source;
    ev.u.budget.requested_nusd = out->worst_nusd;
    rc = lg_run_apply(run, NULL, &ev, d, err);
  } else if (!rc) {
    rc = lg__gate_model_end(s, &g, lg_run_model(run, &mm, d, err), d, out, err);
  }
  lg__gate_clear(&g);
  return rc;
}

int lg__budget_settle_usage(lg_store_t *s, const lg_prices_t *prices, const char *id,
                            const char *model, int64_t input_tokens, int64_t output_tokens,
                            int64_t cost_nusd, int measured, int64_t held_nusd, int64_t now_ms,
                            int64_t *actual_nusd, lg_error_t *err) {
  int64_t actual = cost_nusd;
  if (actual < 0 && (!model || input_tokens < 0 || output_tokens < 0 ||
                     lg_prices_cost(prices, model, input_tokens, 0, output_tokens, &actual, NULL)))
    actual = -1;
  if (actual < 0) actual = held_nusd > 0 ? held_nusd : 0;
  *actual_nusd = actual;
  if (!id) return 0;
  /* A cost the client reported is a settler's word, not the engine's
   * price, and so are token counts an agent reports (measured: the
   * provider's own, read by the gateway): the shared budgets charge them
   * at most the reservation (a run's own counters still count all of it,
   * against its cost cap). */
  int64_t micro = lg_budget_nusd_to_micro(actual);
  return cost_nusd >= 0 || !measured ? lg_budget_settle_bounded(s, id, micro, now_ms, NULL, err)
                                     : lg_budget_settle(s, id, micro, now_ms, NULL, err);
}

int lg__gate_usage(lg_store_t *s, const lg_prices_t *prices, const lg_run_t *run,
                   int64_t reservation, int64_t input_tokens, int64_t output_tokens,
                   int64_t cost_nusd, int measured, int64_t now_ms, int64_t *seq_out,
                   int64_t *actual_nusd, lg_error_t *err) {
  *actual_nusd = 0;
  if (input_tokens < 0 || output_tokens < 0)
    return lg__err(err, LG_EINVAL, input_tokens < 0 ? "input_tokens" : "output_tokens", -1,
                   "token counts must not be negative");
  if (reservation < 0)
    return lg__err(err, LG_EINVAL, "reservation_id", -1, "reservation ids are positive");
  /* The engine's open reservation: which one, and the worst case it held. */
  int i = 0;
  if (reservation)
    while (i < run->nresv && run->resv[i].id != reservation) i++;
  if (i >= run->nresv && reservation)
    return lg__err(err, LG_ENOTFOUND, "reservation_id", -1,
                   "no open reservation %lld in run \"%s\"", (long long)reservation,
                   lg_run_id(run));
  if (i >= run->nresv)
    return lg__err(err, LG_ENOTFOUND, "reservation_id", -1,
                   "no model call of run \"%s\" is waiting for its usage", lg_run_id(run));
  int64_t seq = run->resv[i].id, held = run->resv[i].cost;

  /* The shared reservation of that call, if the run has budgets. */
  char id[LG_BUDGET_ID_MAX] = "";
  int64_t row_seq = 0, amount = 0;
  char *model = NULL;
  int found = 0;
  int rc = s ? lg__budget_run_reservation(s, lg_run_id(run), seq, &found, id, &row_seq, &amount,
                                          &model, err)
             : 0;
  if (rc) return rc;

  /* The actual cost, settled (the shared reservation when the run has one). */
  int64_t actual = 0;
  rc = lg__budget_settle_usage(s, prices, found ? id : NULL, model, input_tokens, output_tokens,
                               cost_nusd, measured, found ? lg_budget_micro_to_nusd(amount) : held,
                               now_ms, &actual, err);
  lg__free(model);
  if (rc) return rc;
  *seq_out = seq;
  *actual_nusd = actual;
  return 0;
}

int lg_budget_usage(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                    int64_t reservation, int64_t input_tokens, int64_t output_tokens,
                    int64_t cost_nusd, int64_t t_ms, int64_t now_ms, int64_t *actual_nusd,
                    lg_error_t *err) {
  if (actual_nusd) *actual_nusd = 0;
  if (!run) return lg__err(err, LG_EINVAL, NULL, -1, "no run");
  int64_t seq = 0, actual = 0;
  /* the library's caller reports what it measured, as the gateway does */
  int rc = lg__gate_usage(s, prices, run, reservation, input_tokens, output_tokens, cost_nusd, 1,
                          now_ms, &seq, &actual, err);
  if (rc) return rc;
  rc = lg_run_usage(run, seq, input_tokens, output_tokens, actual, t_ms);
  if (rc) return lg__err(err, rc, "reservation_id", -1, "%s", lg_strerror(rc));
  if (actual_nusd) *actual_nusd = actual;
  return 0;
}
