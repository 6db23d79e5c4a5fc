/*
 * ledger.c — the durable idempotency ledger: its rules, written once over
 * the store's row interface (src/store/store.h), so that memory:, sqlite:
 * and postgres: answer alike.
 *
 * A row is PENDING (claimed), COMMITTED or FAILED. What a reader sees also
 * depends on the clock it passes in (now_ms) — the ledger never reads one:
 *
 *   row                                   claim / peek answers
 *   none, or finished past retention      claimed (peek: free)
 *   request fingerprint differs           mismatch
 *   PENDING, now < lease_until            in_progress
 *   PENDING, now >= lease_until           unknown_outcome (never re-run)
 *   COMMITTED                             replay with its result
 *   FAILED                                replay, failed = 1
 *
 * Commit and fail of a claimed key are likewise one statement ("settle
 * the row if it is still pending"); only a key in another state is read
 * under its lock to work out the answer.
 *
 * A claim has exactly one winner because it rests on the backend's unique
 * key: "insert if absent" is one atomic statement, and only when the key is
 * present does the claim lock the row (BEGIN IMMEDIATE, SELECT ... FOR
 * UPDATE) to read it and, for a row past retention, take it over. Outside a
 * transaction the first insert is a statement of its own (one durable
 * write for the common case); inside lg_store_with_run everything joins the
 * run's transaction through a savepoint.
 */
#include "../store/store.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>

/* Rows carry the public states (lg_op_state_t: in_progress, committed,
 * failed); the store's names for them (src/store/store.h) are the same
 * values, so that a state has one definition. */
_Static_assert((int)LG__OP_PENDING == (int)LG_OP_IN_PROGRESS &&
                   (int)LG__OP_COMMITTED == (int)LG_OP_COMMITTED &&
                   (int)LG__OP_FAILED == (int)LG_OP_FAILED,
               "store.h's row states must be lg_op_state_t's values");

#define KEY_MAX 1024
#define RACE_RETRIES 16 /* a row deleted between insert and read: retry */

static int check_key(const char *key, lg_error_t *err) {
  if (!key || !*key) return lg__err(err, LG_EINVAL, "key", -1, "the idempotency key is empty");
  if (strlen(key) > KEY_MAX)
    return lg__err(err, LG_EINVAL, "key", -1, "the idempotency key is longer than %d bytes",
                   KEY_MAX);
  return 0;
}

int lg__ledger_check_fp(const char *fp, lg_error_t *err) {
  if (!fp || !*fp)
    return lg__err(err, LG_EINVAL, "request_fingerprint", -1, "the request fingerprint is empty");
  if (strlen(fp) > LG__LEDGER_FP_MAX)
    return lg__err(err, LG_EINVAL, "request_fingerprint", -1,
                   "the request fingerprint is longer than %d bytes", LG__LEDGER_FP_MAX);
  return 0;
}

/* 1 when a finished row has outlived the retention: it counts as gone. */
static int stale(const lg_store_t *s, const lg__op_row_t *r, int64_t now_ms) {
  return r->state != LG_OP_IN_PROGRESS && r->updated_ms <= now_ms - s->opts.retention_ms;
}

/* The one transition table of the ledger (see the top of the file). A
 * row an operator freed is only the record of that: the key is free. */
static lg_claim_outcome_t judge(const lg_store_t *s, const lg__op_row_t *r, const char *fp,
                                int64_t now_ms, int *failed) {
  *failed = 0;
  if (!r || r->freed || stale(s, r, now_ms)) return LG_CLAIM_FREE;
  if (fp && strcmp(r->request_fp, fp)) return LG_CLAIM_MISMATCH;
  switch (r->state) {
  case LG_OP_IN_PROGRESS:
    return now_ms < r->lease_until_ms ? LG_CLAIM_IN_PROGRESS : LG_CLAIM_UNKNOWN_OUTCOME;
  case LG_OP_FAILED: *failed = 1; return LG_CLAIM_REPLAY;
  default: return LG_CLAIM_REPLAY;
  }
}

static int fill_claim(lg_claim_outcome_t o, int failed, lg__op_row_t *r, lg_claim_t *out) {
  out->outcome = o;
  out->failed = failed;
  if (o == LG_CLAIM_REPLAY && r->result) {
    /* Hand the row's buffer over rather than copy it. */
    out->result = r->result;
    out->result_len = r->result_len;
    r->result = NULL;
  }
  return 0;
}

static int claim_locked(lg_store_t *s, const lg__op_row_t *mine, lg_claim_t *out,
                        lg_error_t *err) {
  int rc, inserted = 0;
  if (s->depth == 0) {
    /* The common case in one durable statement: the key is free. */
    if ((rc = lg__store_fault_at(s, "claim.insert", err))) return rc;
    rc = lg__sql_op_insert(s, mine, &inserted, err);
    if (rc) return rc;
    if (inserted) return fill_claim(LG_CLAIM_CLAIMED, 0, NULL, out);
  }
  for (int attempt = 0; attempt < RACE_RETRIES; attempt++) {
    lg__op_row_t cur = {0};
    int found = 0, failed = 0;
    if ((rc = lg__store_begin(s, LG__TXN_LEDGER, err))) return rc;
    rc = lg__sql_op_read(s, mine->key, 1, &cur, &found, err);
    if (rc) goto fail;
    if (!found) {
      if ((rc = lg__sql_op_insert(s, mine, &inserted, err))) goto fail;
      if (!inserted) { /* lost a race with another claimant: look again */
        lg__store_end(s, 0, NULL);
        continue;
      }
      if ((rc = lg__store_fault_at(s, "claim.before_commit", err))) goto fail;
      if ((rc = lg__store_end(s, 1, err))) return rc;
      return fill_claim(LG_CLAIM_CLAIMED, 0, NULL, out);
    }
    lg_claim_outcome_t o = judge(s, &cur, mine->request_fp, mine->created_ms, &failed);
    if (o == LG_CLAIM_FREE) {
      /* A finished row past retention: the key starts afresh. */
      lg__op_row_clear(&cur);
      if ((rc = lg__sql_op_update(s, mine, err))) goto fail;
      if ((rc = lg__store_fault_at(s, "claim.before_commit", err))) goto fail;
      if ((rc = lg__store_end(s, 1, err))) return rc;
      return fill_claim(LG_CLAIM_CLAIMED, 0, NULL, out);
    }
    rc = lg__store_end(s, 1, err);
    if (!rc) fill_claim(o, failed, &cur, out);
    lg__op_row_clear(&cur);
    return rc;
  fail:
    lg__op_row_clear(&cur);
    lg__store_end(s, 0, NULL);
    return rc;
  }
  return lg__err(err, LG_EBUSY, "key", -1,
                 "the key \"%s\" kept changing under the claim; try again", mine->key);
}

/* "ct_" + 32 hex digits of the kernel's randomness: the claim's token,
 * which its claimant presents to commit or fail it (lg_store_commit_as). */
static int new_token(char tok[LG_CLAIM_TOKEN_MAX], lg_error_t *err) {
  return lg__random_id("ct_", 16, tok, LG_CLAIM_TOKEN_MAX, "a claim token", err);
}

int lg_store_claim(lg_store_t *s, const char *key, const char *request_fp, const char *run_id,
                   int64_t lease_ms, int64_t now_ms, lg_claim_t *out, lg_error_t *err) {
  memset(out, 0, sizeof *out);
  int rc = check_key(key, err);
  if (!rc) rc = lg__ledger_check_fp(request_fp, err);
  if (rc) return rc;
  char token[LG_CLAIM_TOKEN_MAX];
  if ((rc = new_token(token, err))) return rc;
  if (lease_ms <= 0) lease_ms = s->opts.lease_ms;
  /* now + lease saturates: a lease of 2^63-1 ms means "for ever", and an
   * overflow would have put its end in the past (unknown_outcome at once). */
  int64_t lease_until = now_ms > 0 && lease_ms > INT64_MAX - now_ms ? INT64_MAX : now_ms + lease_ms;
  lg__op_row_t mine = {
      .key = (char *)key,
      .request_fp = (char *)request_fp,
      .run_id = (char *)(run_id && *run_id ? run_id : NULL),
      .state = LG_OP_IN_PROGRESS,
      .lease_until_ms = lease_until,
      .created_ms = now_ms,
      .updated_ms = now_ms,
      .claim_token = token,
  };
  lg__store_lock(s);
  rc = claim_locked(s, &mine, out, err);
  lg__store_unlock(s);
  if (!rc && out->outcome == LG_CLAIM_CLAIMED) memcpy(out->claim_token, token, sizeof token);
  if (rc) {
    lg_claim_clear(out);
    out->outcome = LG_CLAIM_FREE;
    if (err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  }
  return rc;
}

int lg_store_peek(lg_store_t *s, const char *key, const char *request_fp, int64_t now_ms,
                  lg_claim_t *out, lg_error_t *err) {
  memset(out, 0, sizeof *out);
  int rc = check_key(key, err);
  if (rc) return rc;
  lg__op_row_t cur = {0};
  int found = 0, failed = 0;
  int r = lg__store_read_begin(s); /* never behind a write */
  rc = lg__sql_op_read(s, key, 0, &cur, &found, err);
  lg__store_read_end(s, r);
  if (rc) {
    if (err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
    return rc;
  }
  lg_claim_outcome_t o = judge(s, found ? &cur : NULL, request_fp, now_ms, &failed);
  fill_claim(o, failed, &cur, out);
  lg__op_row_clear(&cur);
  return 0;
}

/* Reads the key's row under its lock for a change; LG_ENOTFOUND when the
 * ledger does not have it (or only past retention), or has it freed by
 * an operator and the change is not a free (freeing: the free stands).
 * Opens a transaction that the caller ends. */
static int open_for_change(lg_store_t *s, const char *key, int64_t now_ms, int freeing,
                           lg__op_row_t *cur, lg_error_t *err) {
  int found = 0;
  int rc = lg__store_begin(s, LG__TXN_LEDGER, err);
  if (rc) return rc;
  rc = lg__sql_op_read(s, key, 1, cur, &found, err);
  if (!rc && (!found || (cur->freed && !freeing) || stale(s, cur, now_ms)))
    rc = lg__err(err, LG_ENOTFOUND, "key", -1, "no claim for key \"%s\" in the ledger", key);
  if (rc) {
    lg__op_row_clear(cur);
    lg__store_end(s, 0, NULL);
  }
  return rc;
}

/* The outcome of a claimed key: state COMMITTED (with its result and
 * operation id), FAILED, or 0: released for a retry (the row goes). The
 * first outcome stands: a COMMITTED row never changes, and a FAILED one only
 * goes for a retry. points names the fault points of the one-statement path
 * and of the moment before the transaction commits. */
static int settle(lg_store_t *s, const char *key, int state, const char *result,
                  size_t result_len, const char *operation_id, int64_t now_ms,
                  const char *const points[2], lg_error_t *err) {
  int rc = check_key(key, err);
  if (rc) return rc;
  const char *opid = operation_id && *operation_id ? operation_id : NULL;
  if (!result) result_len = 0;
  lg__op_row_t cur = {0};
  lg__store_lock(s);
  if (s->depth == 0) {
    /* The common case in one durable statement: the key is claimed. */
    int changed = 0;
    rc = lg__store_fault_at(s, points[0], err);
    if (!rc)
      rc = lg__sql_op_settle(s, key, state, result, result_len, opid, now_ms, &changed, err);
    if (rc || changed) goto out;
  }
  rc = open_for_change(s, key, now_ms, state == 0, &cur, err);
  if (rc) goto out;
  if (cur.state == LG_OP_COMMITTED || cur.freed) {
    /* stands (a free asked again: the key is free, as it was) */
  } else if (state == 0) {
    rc = lg__sql_op_delete(s, key, err);
  } else if (cur.state == LG_OP_IN_PROGRESS) {
    lg__op_row_t next = cur;
    next.state = state;
    next.updated_ms = now_ms;
    if (state == LG_OP_COMMITTED) {
      next.result = (char *)result;
      next.result_len = result_len;
      next.operation_id = (char *)opid;
    }
    rc = lg__sql_op_update(s, &next, err);
    if (!rc) rc = lg__store_fault_at(s, points[1], err);
  }
  if (rc) lg__store_end(s, 0, NULL);
  else rc = lg__store_end(s, 1, err);
  lg__op_row_clear(&cur);
out:
  lg__store_unlock(s);
  if (rc && err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

int lg_store_commit(lg_store_t *s, const char *key, const char *result, size_t result_len,
                    const char *operation_id, int64_t now_ms, lg_error_t *err) {
  static const char *const points[2] = {"commit.settle", "commit.before_commit"};
  return settle(s, key, LG_OP_COMMITTED, result, result_len, operation_id, now_ms, points, err);
}

int lg_store_fail(lg_store_t *s, const char *key, int retryable, int64_t now_ms,
                  lg_error_t *err) {
  static const char *const points[2] = {"fail.settle", "fail.before_commit"};
  return settle(s, key, retryable ? 0 : LG_OP_FAILED, NULL, 0, NULL, now_ms, points, err);
}

int lg_store_operation(lg_store_t *s, const char *key, int64_t now_ms, lg_operation_t *out,
                       lg_error_t *err) {
  memset(out, 0, sizeof *out);
  int rc = check_key(key, err);
  if (rc) return rc;
  lg__op_row_t cur = {0};
  int found = 0;
  int r = lg__store_read_begin(s); /* never behind a write */
  rc = lg__sql_op_read(s, key, 0, &cur, &found, err);
  lg__store_read_end(s, r);
  if (!rc && (!found || stale(s, &cur, now_ms)))
    rc = lg__err(err, LG_ENOTFOUND, "key", -1, "no key \"%s\" in the ledger", key);
  if (rc) {
    lg__op_row_clear(&cur);
    if (err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
    return rc;
  }
  out->key = cur.key;
  out->request_fp = cur.request_fp;
  out->run_id = cur.run_id;
  out->result = cur.result;
  out->result_len = cur.result_len;
  out->operation_id = cur.operation_id;
  out->created_ms = cur.created_ms;
  out->updated_ms = cur.updated_ms;
  out->lease_until_ms = cur.lease_until_ms;
  out->resolved_by = cur.resolved_by;
  out->resolved_ms = cur.resolved_ms;
  lg__free(cur.claim_token); /* never shown: it is the claimant's */
  switch (cur.state) {
  case LG_OP_IN_PROGRESS:
    out->state = now_ms < cur.lease_until_ms ? LG_OP_IN_PROGRESS : LG_OP_UNKNOWN_OUTCOME;
    break;
  case LG_OP_COMMITTED: out->state = LG_OP_COMMITTED; break;
  default: out->state = cur.freed ? LG_OP_FREE : LG_OP_FAILED; break;
  }
  return 0;
}

/* ---- settling as someone: who may undo what ---- */

/* 0 when `as` may settle `cur` this way now (commit, or fail retryable or
 * not); LG_EPERM with a message saying who may. Only called for actors
 * that are not operators. */
static int may_settle(const lg__op_row_t *cur, const lg_op_actor_t *as, int commit,
                      int retryable, int64_t now_ms, lg_error_t *err) {
  if (cur->state == LG_OP_FAILED && !commit && retryable)
    return lg__err(err, LG_EPERM, "key", -1,
                   "the key \"%s\" failed for good; only an operator may free it for another try",
                   cur->key);
  if (cur->state != LG_OP_IN_PROGRESS) return 0; /* nothing will change: the first outcome stands */
  if (!cur->claim_token) return 0;            /* claimed before schema 6: trusted as before */
  const char *t = as->claim_token;
  size_t n = strlen(cur->claim_token);
  if (!t || strlen(t) != n || CRYPTO_memcmp(t, cur->claim_token, n))
    return lg__err(err, LG_EPERM, t ? "claim_token" : "key", -1,
                   "the key \"%s\" is claimed by %s%s%s; only that claimant, with the "
                   "claim_token its claim returned, or an operator may %s it",
                   cur->key, cur->run_id ? "run \"" : "another worker", cur->run_id ? cur->run_id : "",
                   cur->run_id ? "\"" : "", commit ? "commit" : "fail");
  if (!commit && now_ms >= cur->lease_until_ms)
    return lg__err(err, LG_EPERM, "key", -1,
                   "the claim of \"%s\" ran out of its lease: its outcome is unknown, and only "
                   "an operator may resolve it with a failure (the claimant may still commit "
                   "it)",
                   cur->key);
  return 0;
}

/* Settles `key` as `as` (not NULL): state LG_OP_COMMITTED or
 * LG_OP_FAILED, retryable frees. Reads the row under its lock first. */
static int settle_as(lg_store_t *s, const char *key, int state, int retryable, const char *result,
                     size_t result_len, const char *operation_id, const lg_op_actor_t *as,
                     int64_t now_ms, lg_error_t *err) {
  int rc = check_key(key, err);
  if (rc) return rc;
  lg__op_row_t cur = {0};
  lg__store_lock(s);
  int commit = state == LG_OP_COMMITTED;
  rc = open_for_change(s, key, now_ms, !commit && retryable, &cur, err);
  if (rc) goto out;
  if (!as->operator && !cur.freed) rc = may_settle(&cur, as, commit, retryable, now_ms, err);
  if (!rc && !cur.freed) { /* a free asked again: the key is free, as it was */
    lg__op_row_t next = cur;
    int write = 0;
    if (cur.state == LG_OP_IN_PROGRESS || (!commit && retryable && cur.state == LG_OP_FAILED)) {
      next.state = state;
      next.updated_ms = now_ms;
      if (commit) {
        next.result = (char *)result;
        next.result_len = result ? result_len : 0;
        next.operation_id = (char *)(operation_id && *operation_id ? operation_id : NULL);
      }
      write = 1;
    }
    if (write && as->operator) {
      /* An operator's act: recorded in the row. A key it frees stays as
       * that record (FAILED, freed: it counts as free). */
      next.resolved_by = (char *)(as->who && *as->who ? as->who : "operator");
      next.resolved_ms = now_ms;
      if (!commit && retryable) {
        next.state = LG_OP_FAILED;
        next.freed = 1;
        next.result = NULL;
        next.result_len = 0;
      }
      rc = lg__sql_op_update(s, &next, err);
    } else if (write && retryable && !commit) {
      rc = lg__sql_op_delete(s, key, err); /* the claimant's own retryable failure */
    } else if (write) {
      rc = lg__sql_op_update(s, &next, err);
    }
    if (!rc && write) rc = lg__store_fault_at(s, "settle_as.before_commit", err);
  }
  if (rc) lg__store_end(s, 0, NULL);
  else rc = lg__store_end(s, 1, err);
  lg__op_row_clear(&cur);
out:
  lg__store_unlock(s);
  if (rc && err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

int lg_store_commit_as(lg_store_t *s, const char *key, const char *result, size_t result_len,
                       const char *operation_id, const lg_op_actor_t *as, int64_t now_ms,
                       lg_error_t *err) {
  if (!as) return lg_store_commit(s, key, result, result_len, operation_id, now_ms, err);
  return settle_as(s, key, LG_OP_COMMITTED, 0, result, result_len, operation_id, as, now_ms,
                   err);
}

int lg_store_fail_as(lg_store_t *s, const char *key, int retryable, const lg_op_actor_t *as,
                     int64_t now_ms, lg_error_t *err) {
  if (!as) return lg_store_fail(s, key, retryable, now_ms, err);
  return settle_as(s, key, LG_OP_FAILED, retryable, NULL, 0, NULL, as, now_ms, err);
}

int lg_store_purge(lg_store_t *s, int64_t older_than_ms, int64_t now_ms, int64_t *purged,
                   lg_error_t *err) {
  int64_t n = 0;
  if (older_than_ms < 0) older_than_ms = s->opts.retention_ms;
  lg__store_lock(s);
  int rc = lg__sql_op_purge(s, now_ms - older_than_ms, &n, err);
  lg__store_unlock(s);
  if (purged) *purged = rc ? 0 : n;
  if (rc && err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

/* ---- the lg_ledger_t faces of a store ---- */

static int l_claim(void *self, const char *key, const char *fp, const char *run_id,
                   int64_t lease_ms, int64_t now_ms, lg_claim_t *out, lg_error_t *err) {
  return lg_store_claim(self, key, fp, run_id, lease_ms, now_ms, out, err);
}
static int l_peek(void *self, const char *key, const char *fp, int64_t now_ms, lg_claim_t *out,
                  lg_error_t *err) {
  return lg_store_peek(self, key, fp, now_ms, out, err);
}
static int l_commit(void *self, const char *key, const char *result, size_t len,
                    const char *operation_id, int64_t now_ms, lg_error_t *err) {
  return lg_store_commit(self, key, result, len, operation_id, now_ms, err);
}
static int l_fail(void *self, const char *key, int retryable, int64_t now_ms, lg_error_t *err) {
  return lg_store_fail(self, key, retryable, now_ms, err);
}
static void l_destroy(void *self) { (void)self; /* owned by the store */ }

const lg_ledger_methods_t lg__store_ledger_methods = {1, l_claim, l_peek, l_commit, l_fail,
                                                       l_destroy};

lg_ledger_t *lg_store_ledger(lg_store_t *s) { return s ? &s->ledger : NULL; }

/* The offset face: times relative to epoch_ms. */
typedef struct at_ledger {
  lg_store_t *s;    /* borrowed */
  int64_t epoch_ms; /* added to every now_ms */
} at_ledger_t;

static int a_claim(void *self, const char *key, const char *fp, const char *run_id,
                   int64_t lease_ms, int64_t now_ms, lg_claim_t *out, lg_error_t *err) {
  at_ledger_t *a = self;
  return lg_store_claim(a->s, key, fp, run_id, lease_ms, a->epoch_ms + now_ms, out, err);
}
static int a_peek(void *self, const char *key, const char *fp, int64_t now_ms, lg_claim_t *out,
                  lg_error_t *err) {
  at_ledger_t *a = self;
  return lg_store_peek(a->s, key, fp, a->epoch_ms + now_ms, out, err);
}
static int a_commit(void *self, const char *key, const char *result, size_t len,
                    const char *operation_id, int64_t now_ms, lg_error_t *err) {
  at_ledger_t *a = self;
  return lg_store_commit(a->s, key, result, len, operation_id, a->epoch_ms + now_ms, err);
}
static int a_fail(void *self, const char *key, int retryable, int64_t now_ms, lg_error_t *err) {
  at_ledger_t *a = self;
  return lg_store_fail(a->s, key, retryable, a->epoch_ms + now_ms, err);
}
static void a_destroy(void *self) { lg__free(self); }

static const lg_ledger_methods_t at_methods = {1, a_claim, a_peek, a_commit, a_fail, a_destroy};

lg_ledger_t *lg_store_ledger_new(lg_store_t *s, int64_t epoch_ms) {
  if (!s) return NULL;
  lg_ledger_t *l = lg__calloc(1, sizeof *l);
  at_ledger_t *a = lg__calloc(1, sizeof *a);
  if (!l || !a) {
    lg__free(l);
    lg__free(a);
    return NULL;
  }
  a->s = s;
  a->epoch_ms = epoch_ms;
  l->methods = &at_methods;
  l->self = a;
  return l;
}
