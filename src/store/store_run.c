/*
 * store_run.c — where the store meets the engine: saving an lg_run_t as a
 * run record (its lg_run_save state, policy JSON, status, terminal reason
 * and envelope), loading it back, and the kill switch, which writes a
 * durable deny rule first and then stops the stored run under its lock.
 *
 * The deny rule goes first, in a durable statement of its own, because it
 * is what every worker checks before its next decision: even when
 * stopping the stored run fails (or the run does not exist yet), no worker
 * decides for it again without seeing the cancel.
 */
#include "store.h"

#include <stdio.h>

int lg_store_run_save(lg_store_t *s, const lg_run_t *run, int64_t now_ms, lg_error_t *err) {
  if (!run) return lg__err(err, LG_EINVAL, NULL, -1, "no run given");
  lg_run_record_t rec = {0};
  char *state = NULL, *policy = NULL, *env = NULL;
  size_t state_len = 0;
  int rc = lg_run_save(run, &state, &state_len);
  if (rc) return lg__err(err, rc, NULL, -1, "cannot serialise run \"%s\"", lg_run_id(run));
  policy = lg_policy_to_json(lg_run_policy(run));
  env = lg_run_envelope_json(run);
  if (!policy || !env) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto out;
  }
  rec.run_id = (char *)lg_run_id(run);
  rec.group = (char *)lg_run_group(run);
  rec.stopped = lg_run_stopped(run);
  rec.terminal_reason = (char *)lg_run_terminal_reason(run);
  rec.policy_json = policy;
  rec.state = state;
  rec.state_len = state_len;
  rec.envelope_json = env;
  rec.created_ms = now_ms;
  rec.updated_ms = now_ms;
  rc = lg_store_run_put(s, &rec, err);
out:
  lg__free(state);
  lg__free(policy);
  lg__free(env);
  return rc;
}

/* Builds the engine's run from a stored record. */
static int run_from_record(const lg_run_record_t *rec, lg_ledger_t *ledger, lg_run_t **out,
                           lg_error_t *err) {
  *out = NULL;
  if (!rec->state || !rec->state_len)
    return lg__err(err, LG_ESTATE, "state", -1, "run \"%s\" has no saved state", rec->run_id);
  lg_policy_t *pol = NULL;
  if (rec->policy_json && *rec->policy_json) {
    pol = lg_policy_parse(rec->policy_json, strlen(rec->policy_json), "stored policy", err);
    if (!pol) return err && err->code ? err->code : LG_EPOLICY;
  }
  lg_run_t *run = lg_run_load(rec->state, rec->state_len, pol, ledger, err);
  lg_policy_free(pol);
  if (!run) {
    int code = err && err->code ? err->code : LG_ESTATE;
    if (code != LG_ENOMEM)
      lg__err(err, LG_ESTATE, "state", -1, "the stored state of run \"%s\" cannot be read back",
              rec->run_id);
    return code == LG_ENOMEM ? code : LG_ESTATE;
  }
  *out = run;
  return 0;
}

int lg_store_run_load(lg_store_t *s, const char *run_id, lg_ledger_t *ledger, lg_run_t **out,
                      lg_error_t *err) {
  *out = NULL;
  lg_run_record_t rec = {0};
  int rc = lg_store_run_get(s, run_id, &rec, err);
  if (rc) return rc;
  rc = run_from_record(&rec, ledger, out, err);
  lg_run_record_clear(&rec);
  if (rc) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

/* ---- the kill switch ---- */

typedef struct cancel_ctx {
  const char *reason; /* the operator's, or NULL */
  int64_t now_ms;     /* when */
  int cancelled;      /* set: the run was active and is stopped now */
} cancel_ctx_t;

/* Under the run's lock: stops an active run and saves it. */
static int cancel_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  cancel_ctx_t *c = ud;
  c->cancelled = 0;
  if (rec->stopped) return 0;
  lg_run_t *run = NULL;
  lg_error_t e = {0};
  int rc = run_from_record(rec, NULL, &run, &e);
  if (rc == LG_ESTATE) {
    /* No readable engine state (a record written by hand or by another
     * tool): mark the record itself stopped, keeping what is there. */
    lg_run_record_t r = *rec;
    r.stopped = 1;
    r.terminal_reason = (char *)lg_reason_name(LG_R_OPERATOR_CANCELLED);
    r.updated_ms = c->now_ms;
    rc = lg_store_run_put(s, &r, NULL);
    if (!rc) c->cancelled = 1;
    return rc;
  }
  if (rc) return rc;
  lg_counters_t k;
  lg_run_counters(run, &k);
  int64_t t = c->now_ms - rec->created_ms;
  if (t < k.last_t_ms) t = k.last_t_ms;
  lg_decision_t d;
  rc = lg_run_cancel(run, c->reason, t, &d);
  if (!rc) rc = lg_store_run_save(s, run, c->now_ms, NULL);
  lg_run_free(run);
  if (!rc) c->cancelled = 1;
  return rc;
}

int lg_store_cancel_run(lg_store_t *s, const char *run_id, const char *reason, int64_t now_ms,
                        lg_error_t *err) {
  int rc = lg__store_deny(s, LG__DENY_RUN, run_id, reason, now_ms, err);
  if (rc) return rc;
  cancel_ctx_t c = {reason, now_ms, 0};
  lg_error_t e = {0};
  rc = lg_store_with_run(s, run_id, cancel_locked, &c, &e);
  if (rc == LG_ENOTFOUND) return 0; /* not stored yet: the deny rule waits for it */
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

int lg_store_cancel_group(lg_store_t *s, const char *group, const char *reason, int64_t now_ms,
                          char **cancelled_json, lg_error_t *err) {
  if (cancelled_json) *cancelled_json = NULL;
  int rc = lg__store_deny(s, LG__DENY_GROUP, group, reason, now_ms, err);
  if (rc) return rc;
  ids_t ids = {0};
  lg_run_filter_t f = {.status = "active", .group = group};
  rc = lg_store_run_list(s, &f, collect, &ids, err);
  if (rc == LG_ENOMEM) lg__err(err, rc, NULL, -1, "out of memory");
  lg__buf_t b = {0};
  lg__buf_putc(&b, '[');
  int first = 1;
  for (size_t i = 0; i < ids.n && !rc; i++) {
    cancel_ctx_t c = {reason, now_ms, 0};
    rc = lg_store_with_run(s, ids.v[i], cancel_locked, &c, err);
    if (rc == LG_ENOTFOUND) rc = 0; /* gone meanwhile */
    if (!rc && c.cancelled) {
      if (!first) lg__buf_putc(&b, ',');
      lg__buf_json_str(&b, ids.v[i], strlen(ids.v[i]));
      first = 0;
    }
  }
  lg__buf_putc(&b, ']');
  for (size_t i = 0; i < ids.n; i++) lg__free(ids.v[i]);
  lg__free(ids.v);
  if (!rc && cancelled_json) {
    *cancelled_json = lg__buf_steal(&b, NULL);
    if (!*cancelled_json) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  lg__buf_free(&b);
  return rc;
}
