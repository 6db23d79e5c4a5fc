/*
 * store_run.c — where the store meets the engine: saving an lg_run_t as a
 * run record (its lg_run_save state, policy JSON, status, terminal reason
 * and envelope) and loading it back. The kill switch is a decision like
 * any other: src/step/step.c.
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
