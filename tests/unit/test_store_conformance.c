/*
 * test_store_conformance.c — one suite, every backend: the same tests run
 * against memory:, a SQLite file in a temporary folder and (registered by
 * tests/pg/) a real PostgreSQL, so that the three answer alike.
 *
 * Organised by what a user relies on: the ledger's states and transitions
 * (claim, in_progress, replay, mismatch, lease expiry to unknown_outcome
 * and its resolution by an operator, retryable and final failures,
 * retention and purge), the ledger through the engine, run records and
 * lg_store_with_run, the kill switch, and — for the durable backends —
 * restart (close and reopen) and schema migration. Every test starts from
 * a new, empty store; times are fixed numbers, never the clock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sqlite3.h>

#include "store/group.h"
#include "store/store.h"
#include "store_test_util.h"

#define FP1 "1111111111111111111111111111111111111111111111111111111111111111"
#define FP2 "2222222222222222222222222222222222222222222222222222222222222222"
#define T0 1700000000000LL /* a fixed "now" */

/* sqlite: and postgres: (memory: forgets everything on close). */
static int durable(void) { return strcmp(lgt_backend, "memory") != 0; }

static int setup(void **state) {
  *state = lgt_open(lgt_fresh_url(lgt_backend), NULL);
  return 0;
}

static int teardown(void **state) {
  lg_store_close(*state);
  return 0;
}

static lg_claim_outcome_t claim(lg_store_t *s, const char *key, const char *fp, int64_t lease,
                                int64_t now, lg_claim_t *out) {
  lg_error_t err = {0};
  int rc = lg_store_claim(s, key, fp, "run-1", lease, now, out, &err);
  if (rc) fail_msg("claim %s: %s: %s", key, lg_err_name(rc), err.message);
  return out->outcome;
}

static void commit(lg_store_t *s, const char *key, const char *result, int64_t now) {
  lg_error_t err = {0};
  int rc = lg_store_commit(s, key, result, result ? strlen(result) : 0, "op-1", now, &err);
  if (rc) fail_msg("commit %s: %s: %s", key, lg_err_name(rc), err.message);
}

/* ------------------------------------------------------------------ */
/* Opening.                                                            */

static void test_open(void **state) {
  lg_store_t *s = *state;
  int v = 0;
  assert_int_equal(lg_store_schema_version(s, &v, NULL), 0);
  assert_int_equal(v, LG_STORE_SCHEMA_VERSION);
  assert_string_equal(lg_store_scheme(s), lgt_backend);
  lg_error_t err = {0};
  assert_null(lg_store_open("mysql:x", NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
  assert_non_null(strstr(err.message, "mysql:x"));
  assert_null(lg_store_open("sqlite:", NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
}

static void test_redacted_name(void **state) {
  (void)state;
  /* The password of a conninfo never shows in messages. */
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open("postgres:host=/nonexistent/dir password=hunter2", NULL, &err);
  assert_null(s);
  assert_int_equal(err.code, LG_ESTORE);
  assert_null(strstr(err.source, "hunter2"));
  assert_null(strstr(err.message, "hunter2"));
  assert_non_null(strstr(err.source, "password=***"));
}

/* ------------------------------------------------------------------ */
/* The ledger.                                                         */

static void test_claim_then_in_progress(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  assert_int_equal(claim(s, "k", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(claim(s, "k", FP1, 1000, T0 + 1, &c), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(claim(s, "k", FP2, 1000, T0 + 2, &c), LG_CLAIM_MISMATCH);
  assert_int_equal(lg_store_peek(s, "k", FP1, T0 + 3, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  assert_int_equal(lg_store_peek(s, "other", FP1, T0 + 3, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  assert_int_equal(lg_store_peek(s, "k", NULL, T0 + 3, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
}

static void test_commit_replays(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  const char *result = "{\"charged\":true,\"amount\":\"12.50\",\"nul\":\"\\u0000\"}";
  assert_int_equal(claim(s, "pay-1", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "pay-1", result, T0 + 10);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(claim(s, "pay-1", FP1, 1000, T0 + 20 + i, &c), LG_CLAIM_REPLAY);
    assert_int_equal(c.failed, 0);
    assert_non_null(c.result);
    assert_int_equal(c.result_len, strlen(result));
    assert_memory_equal(c.result, result, c.result_len);
    lg_claim_clear(&c);
  }
  /* Replay, not mismatch, only for the same request. */
  assert_int_equal(claim(s, "pay-1", FP2, 1000, T0 + 30, &c), LG_CLAIM_MISMATCH);
  assert_null(c.result);
  /* The first outcome stands. */
  commit(s, "pay-1", "{\"other\":1}", T0 + 40);
  assert_int_equal(lg_store_fail(s, "pay-1", 1, T0 + 41, NULL), 0);
  assert_int_equal(claim(s, "pay-1", FP1, 1000, T0 + 50, &c), LG_CLAIM_REPLAY);
  assert_memory_equal(c.result, result, c.result_len);
  lg_claim_clear(&c);
  /* A commit with no result replays with none. */
  assert_int_equal(claim(s, "pay-2", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "pay-2", NULL, T0 + 1);
  assert_int_equal(claim(s, "pay-2", FP1, 1000, T0 + 2, &c), LG_CLAIM_REPLAY);
  assert_null(c.result);
}

static void test_binary_safe_result(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  const char bytes[] = "{\"a\":\"\xc3\xa9\xe2\x82\xac\"}";
  assert_int_equal(claim(s, "utf8", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_commit(s, "utf8", bytes, sizeof bytes - 1, NULL, T0, NULL), 0);
  assert_int_equal(claim(s, "utf8", FP1, 1000, T0, &c), LG_CLAIM_REPLAY);
  assert_int_equal(c.result_len, sizeof bytes - 1);
  assert_memory_equal(c.result, bytes, sizeof bytes - 1);
  lg_claim_clear(&c);
}

static void test_failures(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  /* Final: kept and replayed as a failure. */
  assert_int_equal(claim(s, "f", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_fail(s, "f", 0, T0 + 1, NULL), 0);
  assert_int_equal(claim(s, "f", FP1, 1000, T0 + 2, &c), LG_CLAIM_REPLAY);
  assert_int_equal(c.failed, 1);
  assert_null(c.result);
  assert_int_equal(lg_store_fail(s, "f", 0, T0 + 3, NULL), 0);
  /* A commit does not overwrite a final failure. */
  commit(s, "f", "{}", T0 + 4);
  assert_int_equal(claim(s, "f", FP1, 1000, T0 + 5, &c), LG_CLAIM_REPLAY);
  assert_int_equal(c.failed, 1);
  /* Retryable: the key is free again, and the next claim wins. */
  assert_int_equal(claim(s, "r", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_fail(s, "r", 1, T0 + 1, NULL), 0);
  assert_int_equal(lg_store_peek(s, "r", FP1, T0 + 2, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  assert_int_equal(claim(s, "r", FP2, 1000, T0 + 3, &c), LG_CLAIM_CLAIMED);
  /* An operator may free a final failure for a retry. */
  assert_int_equal(lg_store_fail(s, "f", 1, T0 + 6, NULL), 0);
  assert_int_equal(claim(s, "f", FP1, 1000, T0 + 7, &c), LG_CLAIM_CLAIMED);
}

static void test_unknown_keys(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  assert_int_equal(lg_store_commit(s, "nope", "{}", 2, NULL, T0, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "nope"));
  assert_int_equal(lg_store_fail(s, "nope", 0, T0, NULL), LG_ENOTFOUND);
  assert_int_equal(lg_store_fail(s, "nope", 1, T0, NULL), LG_ENOTFOUND);
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "nope", T0, &op, NULL), LG_ENOTFOUND);
}

static void test_invalid_arguments(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_error_t err = {0};
  assert_int_equal(lg_store_claim(s, "", FP1, NULL, 1, T0, &c, &err), LG_EINVAL);
  assert_string_equal(err.field, "key");
  assert_int_equal(lg_store_claim(s, "k", "", NULL, 1, T0, &c, &err), LG_EINVAL);
  assert_int_equal(lg_store_claim(s, NULL, FP1, NULL, 1, T0, &c, &err), LG_EINVAL);
  char big[1100];
  memset(big, 'k', sizeof big - 1);
  big[sizeof big - 1] = 0;
  assert_int_equal(lg_store_claim(s, big, FP1, NULL, 1, T0, &c, &err), LG_EINVAL);
}

static void test_lease_expiry_is_unknown_outcome(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_operation_t op;
  for (int i = 0; i < 3; i++) {
    char key[8];
    snprintf(key, sizeof key, "u%d", i);
    assert_int_equal(claim(s, key, FP1, 200, T0, &c), LG_CLAIM_CLAIMED);
    assert_int_equal(claim(s, key, FP1, 200, T0 + 199, &c), LG_CLAIM_IN_PROGRESS);
    /* The lease ran out with no outcome: never claimed again by itself. */
    for (int j = 0; j < 3; j++)
      assert_int_equal(claim(s, key, FP1, 200, T0 + 200 + j * 1000, &c),
                       LG_CLAIM_UNKNOWN_OUTCOME);
    assert_int_equal(lg_store_peek(s, key, FP1, T0 + 5000, &c, NULL), 0);
    assert_int_equal(c.outcome, LG_CLAIM_UNKNOWN_OUTCOME);
    assert_int_equal(lg_store_operation(s, key, T0 + 5000, &op, NULL), 0);
    assert_int_equal(op.state, LG_OP_UNKNOWN_OUTCOME);
    assert_int_equal(op.lease_until_ms, T0 + 200);
    lg_operation_clear(&op);
    /* A mismatch still says mismatch. */
    assert_int_equal(claim(s, key, FP2, 200, T0 + 6000, &c), LG_CLAIM_MISMATCH);
  }
  /* The operator's three resolutions. */
  commit(s, "u0", "{\"reconciled\":true}", T0 + 7000); /* it happened */
  assert_int_equal(claim(s, "u0", FP1, 200, T0 + 7001, &c), LG_CLAIM_REPLAY);
  assert_string_equal(c.result, "{\"reconciled\":true}");
  lg_claim_clear(&c);
  assert_int_equal(lg_store_fail(s, "u1", 0, T0 + 7000, NULL), 0); /* not, never retry */
  assert_int_equal(claim(s, "u1", FP1, 200, T0 + 7001, &c), LG_CLAIM_REPLAY);
  assert_int_equal(c.failed, 1);
  assert_int_equal(lg_store_fail(s, "u2", 1, T0 + 7000, NULL), 0); /* not: retry */
  assert_int_equal(claim(s, "u2", FP1, 200, T0 + 7001, &c), LG_CLAIM_CLAIMED);
}

static void test_default_lease(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  assert_int_equal(claim(s, "d", FP1, 0, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(claim(s, "d", FP1, 0, T0 + LG_STORE_DEFAULT_LEASE_MS - 1, &c),
                   LG_CLAIM_IN_PROGRESS);
  assert_int_equal(claim(s, "d", FP1, 0, T0 + LG_STORE_DEFAULT_LEASE_MS, &c),
                   LG_CLAIM_UNKNOWN_OUTCOME);
}

static void test_operation_show(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_operation_t op;
  assert_int_equal(claim(s, "show", FP1, 500, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_operation(s, "show", T0 + 1, &op, NULL), 0);
  assert_string_equal(op.key, "show");
  assert_int_equal(op.state, LG_OP_IN_PROGRESS);
  assert_string_equal(op.request_fp, FP1);
  assert_string_equal(op.run_id, "run-1");
  assert_null(op.result);
  assert_null(op.operation_id);
  assert_int_equal(op.created_ms, T0);
  assert_int_equal(op.updated_ms, T0);
  assert_int_equal(op.lease_until_ms, T0 + 500);
  lg_operation_clear(&op);
  commit(s, "show", "[1,2]", T0 + 100);
  assert_int_equal(lg_store_operation(s, "show", T0 + 101, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED);
  assert_string_equal(op.result, "[1,2]");
  assert_string_equal(op.operation_id, "op-1");
  assert_int_equal(op.created_ms, T0);
  assert_int_equal(op.updated_ms, T0 + 100);
  char *json = lg_operation_to_json(&op);
  assert_non_null(json);
  assert_non_null(strstr(json, "\"state\":\"committed\""));
  assert_non_null(strstr(json, "\"result\":[1,2]"));
  assert_non_null(strstr(json, "\"request_fingerprint\":\"" FP1 "\""));
  assert_non_null(strstr(json, "\"created_at\":\"2023-11-14T22:13:20.000Z\""));
  assert_non_null(strstr(json, "\"updated_at\":\"2023-11-14T22:13:20.100Z\""));
  lg_free(json);
  lg_operation_clear(&op);
  assert_int_equal(lg_store_fail(s, "show", 0, T0, NULL), 0);
  assert_int_equal(lg_store_operation(s, "show", T0 + 101, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED);
  lg_operation_clear(&op);
}

static void test_retention_and_purge(void **state) {
  lg_store_t *s = *state;
  lg_store_close(s);
  /* Reopen the same store with a short retention (memory: a new one). */
  lg_store_options_t o = {.retention_ms = 1000};
  *state = s = lgt_open(durable() ? lgt_url : "memory:", &o);
  lg_claim_t c = {0};
  assert_int_equal(claim(s, "old", FP1, 100000, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "old", "1", T0);
  assert_int_equal(claim(s, "failed", FP1, 100000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_fail(s, "failed", 0, T0, NULL), 0);
  assert_int_equal(claim(s, "pending", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(claim(s, "new", FP1, 100000, T0 + 600, &c), LG_CLAIM_CLAIMED);
  commit(s, "new", "2", T0 + 600);
  assert_int_equal(claim(s, "old", FP1, 100, T0 + 999, &c), LG_CLAIM_REPLAY);
  lg_claim_clear(&c);
  /* Past retention a finished key counts as gone, purged or not. */
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "old", T0 + 1000, &op, NULL), LG_ENOTFOUND);
  assert_int_equal(lg_store_peek(s, "old", FP1, T0 + 1000, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  /* Purge: finished rows only; an unresolved claim waits for a person. */
  int64_t n = -1;
  assert_int_equal(lg_store_purge(s, -1, T0 + 1000, &n, NULL), 0);
  assert_int_equal(n, 2); /* old, failed */
  assert_int_equal(lg_store_purge(s, -1, T0 + 1000, &n, NULL), 0);
  assert_int_equal(n, 0);
  assert_int_equal(claim(s, "pending", FP1, 100, T0 + 100000, &c), LG_CLAIM_UNKNOWN_OUTCOME);
  assert_int_equal(claim(s, "new", FP1, 100, T0 + 1000, &c), LG_CLAIM_REPLAY);
  lg_claim_clear(&c);
  /* An explicit age. */
  assert_int_equal(lg_store_purge(s, 100, T0 + 700, &n, NULL), 0);
  assert_int_equal(n, 1);
  assert_int_equal(claim(s, "old", FP2, 100, T0 + 2000, &c), LG_CLAIM_CLAIMED);
  /* 0: every finished row, however recent. */
  assert_int_equal(claim(s, "fresh", FP1, 100, T0 + 650, &c), LG_CLAIM_CLAIMED);
  commit(s, "fresh", "3", T0 + 650);
  assert_int_equal(lg_store_purge(s, 0, T0 + 650, &n, NULL), 0);
  assert_int_equal(n, 1);
}

static void test_retention_reclaim(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  /* Default retention: 24 h. A stale row is taken over by a new claim. */
  assert_int_equal(claim(s, "day", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "day", "\"x\"", T0 + 1);
  assert_int_equal(claim(s, "day", FP1, 1000, T0 + LG_STORE_DEFAULT_RETENTION_MS, &c),
                   LG_CLAIM_REPLAY);
  lg_claim_clear(&c);
  assert_int_equal(claim(s, "day", FP2, 1000, T0 + 1 + LG_STORE_DEFAULT_RETENTION_MS, &c),
                   LG_CLAIM_CLAIMED);
  lg_operation_t op;
  assert_int_equal(
      lg_store_operation(s, "day", T0 + 2 + LG_STORE_DEFAULT_RETENTION_MS, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_IN_PROGRESS);
  assert_string_equal(op.request_fp, FP2);
  assert_null(op.result);
  lg_operation_clear(&op);
}

static void test_ledger_interface(void **state) {
  lg_store_t *s = *state;
  lg_ledger_t *l = lg_store_ledger(s);
  assert_non_null(l);
  assert_int_equal(l->methods->version, 1);
  lg_claim_t c = {0};
  assert_int_equal(l->methods->claim(l->self, "li", FP1, "r", 100, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  assert_int_equal(l->methods->commit(l->self, "li", "7", 1, NULL, T0 + 1, NULL), 0);
  assert_int_equal(l->methods->peek(l->self, "li", FP1, T0 + 2, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_REPLAY);
  assert_string_equal(c.result, "7");
  lg_claim_clear(&c);
  /* The offset face adds its epoch to run-relative times. */
  lg_ledger_t *at = lg_store_ledger_new(s, T0);
  assert_non_null(at);
  assert_int_equal(at->methods->claim(at->self, "at", FP1, "r", 100, 5, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "at", T0 + 6, &op, NULL), 0);
  assert_int_equal(op.created_ms, T0 + 5);
  assert_int_equal(op.lease_until_ms, T0 + 105);
  lg_operation_clear(&op);
  assert_int_equal((at->methods->fail)(at->self, "at", 1, 6, NULL), 0);
  assert_int_equal(at->methods->peek(at->self, "at", FP1, 7, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  lg_ledger_free(at);
}

/* The engine deciding with the store's ledger: a write with a key runs
 * once; the same key in another run replays its saved result. */
static void test_engine_replays_through_store(void **state) {
  lg_store_t *s = *state;
  lg_canon_t *canon = lg_canon_new();
  lg_error_t err = {0};
  lg_ledger_t *l1 = lg_store_ledger_new(s, T0);
  lg_run_t *run = lg_run_new("run-a", NULL, NULL, NULL, l1, &err);
  assert_non_null(run);
  lg_call_t call = {.tool = "charge", .args = "{\"invoice\":7}", .args_len = 13,
                    .idempotency_key = "charge-7", .t_ms = 10};
  lg_decision_t d;
  assert_int_equal(lg_run_before(run, canon, &call, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_EXECUTE);
  lg_result_t res = {.status = LG_STATUS_PROGRESS, .side_effect_committed = 1,
                     .retry_after_ms = -1, .value_kind = LG_VALUE_PRESENT,
                     .value = "{\"receipt\":\"R-1\"}", .value_len = 17, .t_ms = 20};
  assert_int_equal(lg_run_after(run, &res, &d, &err), 0);
  lg_run_free(run);
  lg_ledger_free(l1);

  lg_ledger_t *l2 = lg_store_ledger_new(s, T0 + 5000);
  run = lg_run_new("run-b", NULL, NULL, NULL, l2, &err);
  assert_non_null(run);
  call.t_ms = 1;
  assert_int_equal(lg_run_before(run, canon, &call, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_REPLAY);
  assert_non_null(d.saved_result);
  assert_memory_equal(d.saved_result, "{\"receipt\":\"R-1\"}", 17);
  lg_run_free(run);
  lg_ledger_free(l2);
  lg_canon_free(canon);
}

/* A lease of 2^63-1 ms is "for ever": now + lease must not overflow into
 * the past (it made the claim unknown_outcome at once, and UBSan abort). */
static void test_lease_saturates(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_operation_t op;
  assert_int_equal(claim(s, "forever", FP1, INT64_MAX, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(claim(s, "forever", FP1, 100, T0 + 1, &c), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(claim(s, "forever", FP1, 100, T0 + 100LL * 365 * 86400000, &c),
                   LG_CLAIM_IN_PROGRESS);
  assert_int_equal(lg_store_operation(s, "forever", T0 + 2, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_IN_PROGRESS);
  assert_true(op.lease_until_ms == INT64_MAX);
  char *j = lg_operation_to_json(&op);
  assert_non_null(j);
  lg_free(j);
  lg_operation_clear(&op);
  /* The same through the run-relative face and the in-memory ledger. */
  lg_ledger_t *at = lg_store_ledger_new(s, T0);
  assert_int_equal(at->methods->claim(at->self, "forever2", FP1, NULL, INT64_MAX, 5, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  assert_int_equal(at->methods->peek(at->self, "forever2", FP1, 10, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  lg_ledger_free(at);
  lg_ledger_t *m = lg_ledger_memory_new();
  assert_int_equal(m->methods->claim(m->self, "k", FP1, NULL, INT64_MAX, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  assert_int_equal(m->methods->peek(m->self, "k", FP1, T0 + 1, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  /* a request fingerprint of 256 bytes, as the durable ledger takes: kept
   * whole (it was cut at 64, and every later claim of the key mismatched);
   * a longer one refused, as there */
  char fp256[257], fp257[258];
  memset(fp256, 'f', 256), fp256[256] = 0;
  memset(fp257, 'f', 257), fp257[257] = 0;
  assert_int_equal(m->methods->claim(m->self, "long-fp", fp256, NULL, INT64_MAX, T0, &c, NULL), 0);
  assert_int_equal(m->methods->peek(m->self, "long-fp", fp256, T0 + 1, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  lg_error_t e = {0};
  assert_int_equal(m->methods->claim(m->self, "longer-fp", fp257, NULL, INT64_MAX, T0, &c, &e), LG_EINVAL);
  assert_string_equal(e.field, "request_fingerprint");
  lg_ledger_free(m);
}

/* A derived idempotency key has one length whatever the run id: a
 * 1,024-byte run id made every derived key longer than the ledger's
 * 1,024-byte limit (a 400 naming "key", a field the client never sent). */
static void test_derived_key_fixed_length(void **state) {
  lg_store_t *s = *state;
  lg_canon_t *canon = lg_canon_new();
  lg_error_t err = {0};
  const char *pj = "{\"tools\":{\"charge\":{\"side_effects\":true}}}";
  lg_policy_t *p = lg_policy_parse(pj, strlen(pj), NULL, &err);
  assert_non_null(p);
  char ids[2][1025];
  memset(ids[0], 'r', 1024);
  ids[0][1024] = 0;
  snprintf(ids[1], sizeof ids[1], "r");
  char keys[2][128];
  for (int i = 0; i < 2; i++) {
    lg_ledger_t *l = lg_store_ledger_new(s, T0);
    lg_run_t *run = lg_run_new(ids[i], NULL, p, NULL, l, &err);
    assert_non_null(run);
    lg_call_t call = {.tool = "charge", .args = "{\"invoice\":7}", .args_len = 13, .t_ms = 10};
    lg_decision_t d;
    int rc = lg_run_before(run, canon, &call, &d, &err);
    if (rc) fail_msg("before: %s: %s", lg_err_name(rc), err.message);
    assert_int_equal(d.action, LG_ACT_EXECUTE);
    assert_non_null(d.idempotency_key);
    assert_int_equal(strlen(d.idempotency_key), 67);
    assert_memory_equal(d.idempotency_key, "lg:", 3);
    snprintf(keys[i], sizeof keys[i], "%s", d.idempotency_key);
    lg_run_free(run);
    lg_ledger_free(l);
  }
  assert_string_not_equal(keys[0], keys[1]); /* one key per run */
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, keys[0], T0 + 20, &op, NULL), 0);
  assert_string_equal(op.run_id, ids[0]);
  lg_operation_clear(&op);
  lg_policy_free(p);
  lg_canon_free(canon);
}

/* Who may undo what: commit and fail only by the claimant (its claim
 * token) or an operator; unknown_outcome is an operator's to resolve,
 * and what an operator does is recorded in the row. */
static void test_who_may_undo(void **state) {
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  lg_operation_t op;
  lg_error_t err = {0};
  char tok[LG_CLAIM_TOKEN_MAX];
  assert_int_equal(claim(s, "w1", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(strlen(c.claim_token), 35);
  assert_memory_equal(c.claim_token, "ct_", 3);
  memcpy(tok, c.claim_token, sizeof tok);
  lg_op_actor_t agent = {0}, wrong = {.claim_token = "ct_00000000000000000000000000000000"};
  lg_op_actor_t mine = {.claim_token = tok};
  lg_op_actor_t oper = {.operator = 1, .who = "cli:test"};
  /* Another agent frees the key another run holds: refused, nothing changes. */
  assert_int_equal(lg_store_fail_as(s, "w1", 1, &agent, T0 + 1, &err), LG_EPERM);
  assert_non_null(strstr(err.message, "only that claimant"));
  assert_non_null(strstr(err.message, "run-1"));
  assert_int_equal(lg_store_fail_as(s, "w1", 1, &wrong, T0 + 1, NULL), LG_EPERM);
  assert_int_equal(lg_store_commit_as(s, "w1", "{}", 2, NULL, &wrong, T0 + 1, NULL), LG_EPERM);
  assert_int_equal(claim(s, "w1", FP1, 1000, T0 + 2, &c), LG_CLAIM_IN_PROGRESS);
  /* The claimant commits with its token. */
  assert_int_equal(lg_store_commit_as(s, "w1", "{\"ok\":1}", 8, "op", &mine, T0 + 3, &err), 0);
  assert_int_equal(claim(s, "w1", FP1, 1000, T0 + 4, &c), LG_CLAIM_REPLAY);
  lg_claim_clear(&c);
  assert_int_equal(lg_store_operation(s, "w1", T0 + 5, &op, NULL), 0);
  assert_null(op.resolved_by); /* the claimant's own outcome */
  lg_operation_clear(&op);
  /* Its own retryable failure frees the key, as before. */
  assert_int_equal(claim(s, "w2", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  lg_op_actor_t mine2 = {.claim_token = c.claim_token};
  assert_int_equal(lg_store_fail_as(s, "w2", 1, &mine2, T0 + 1, &err), 0);
  assert_int_equal(lg_store_peek(s, "w2", FP1, T0 + 2, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);

  /* unknown_outcome: not even the claimant may fail it; it may commit. */
  assert_int_equal(claim(s, "w3", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  memcpy(tok, c.claim_token, sizeof tok);
  assert_int_equal(lg_store_fail_as(s, "w3", 1, &mine, T0 + 200, &err), LG_EPERM);
  assert_non_null(strstr(err.message, "only an operator"));
  assert_int_equal(lg_store_fail_as(s, "w3", 0, &mine, T0 + 200, NULL), LG_EPERM);
  assert_int_equal(lg_store_commit_as(s, "w3", "1", 1, NULL, &agent, T0 + 200, NULL), LG_EPERM);
  assert_int_equal(claim(s, "w3", FP1, 100, T0 + 201, &c), LG_CLAIM_UNKNOWN_OUTCOME);
  assert_int_equal(lg_store_commit_as(s, "w3", "\"late\"", 6, NULL, &mine, T0 + 202, &err), 0);
  assert_int_equal(claim(s, "w3", FP1, 100, T0 + 203, &c), LG_CLAIM_REPLAY);
  lg_claim_clear(&c);

  /* An operator resolves unknown_outcome, and the row says who and when. */
  assert_int_equal(claim(s, "w4", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_fail_as(s, "w4", 1, &oper, T0 + 500, &err), 0);
  assert_int_equal(lg_store_operation(s, "w4", T0 + 501, &op, &err), 0);
  assert_int_equal(op.state, LG_OP_FREE);
  assert_string_equal(lg_op_state_name(op.state), "free");
  assert_string_equal(op.resolved_by, "cli:test");
  assert_true(op.resolved_ms == T0 + 500);
  char *j = lg_operation_to_json(&op);
  assert_non_null(strstr(j, "\"state\":\"free\""));
  assert_non_null(strstr(j, "\"resolved_by\":\"cli:test\""));
  assert_null(strstr(j, "ct_")); /* the token is never shown */
  lg_free(j);
  lg_operation_clear(&op);
  assert_int_equal(lg_store_peek(s, "w4", FP2, T0 + 502, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  assert_int_equal(lg_store_commit_as(s, "w4", "1", 1, NULL, &oper, T0 + 503, NULL), LG_ENOTFOUND);
  /* The next claim takes it afresh (even for another request). */
  assert_int_equal(claim(s, "w4", FP2, 100, T0 + 600, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_operation(s, "w4", T0 + 601, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_IN_PROGRESS);
  assert_null(op.resolved_by);
  lg_operation_clear(&op);
  assert_int_equal(claim(s, "w5", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_commit_as(s, "w5", "\"done\"", 6, NULL, &oper, T0 + 300, &err), 0);
  assert_int_equal(lg_store_operation(s, "w5", T0 + 301, &op, NULL), 0);
  assert_int_equal(op.state, LG_OP_COMMITTED);
  assert_string_equal(op.resolved_by, "cli:test");
  lg_operation_clear(&op);

  /* A final failure is freed for another try by an operator only. */
  assert_int_equal(claim(s, "w6", FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
  memcpy(tok, c.claim_token, sizeof tok);
  assert_int_equal(lg_store_fail_as(s, "w6", 0, &mine, T0 + 1, &err), 0);
  assert_int_equal(lg_store_fail_as(s, "w6", 1, &mine, T0 + 2, &err), LG_EPERM);
  assert_int_equal(lg_store_fail_as(s, "w6", 1, &agent, T0 + 2, NULL), LG_EPERM);
  assert_int_equal(claim(s, "w6", FP1, 1000, T0 + 3, &c), LG_CLAIM_REPLAY);
  assert_int_equal(c.failed, 1);
  assert_int_equal(lg_store_fail_as(s, "w6", 1, &oper, T0 + 4, &err), 0);
  assert_int_equal(claim(s, "w6", FP1, 1000, T0 + 5, &c), LG_CLAIM_CLAIMED);
  /* Anyone's commit of a finished key changes nothing (the first outcome stands). */
  assert_int_equal(lg_store_commit_as(s, "w1", "2", 1, NULL, &agent, T0 + 6, NULL), 0);
  /* The record of a freed key is purged like any finished row. */
  int64_t purged = 0;
  assert_int_equal(claim(s, "w7", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg_store_fail_as(s, "w7", 1, &oper, T0 + 1000, NULL), 0);
  assert_int_equal(lg_store_purge(s, 0, T0 + 2000, &purged, NULL), 0);
  assert_int_equal(lg_store_operation(s, "w7", T0 + 2001, &op, NULL), LG_ENOTFOUND);
}

/* ------------------------------------------------------------------ */
/* Runs.                                                               */

static lg_run_record_t rec_of(const char *id, const char *group, int stopped, int64_t t) {
  lg_run_record_t r = {0};
  r.run_id = (char *)id;
  r.group = (char *)group;
  r.stopped = stopped;
  r.terminal_reason = stopped ? (char *)"same_call_repeat" : NULL;
  r.policy_json = (char *)"{}";
  r.state = (char *)"\x00\x01\x02state";
  r.state_len = 8;
  r.envelope_json = (char *)"{\"run_id\":\"x\"}";
  r.created_ms = t;
  r.updated_ms = t;
  return r;
}

static void test_run_records(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg_run_record_t r = rec_of("r1", "g", 0, T0);
  assert_int_equal(lg_store_run_create(s, &r, &err), 0);
  assert_int_equal(lg_store_run_create(s, &r, &err), LG_ECONFLICT);
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "r1", &got, &err), 0);
  assert_string_equal(got.run_id, "r1");
  assert_string_equal(got.group, "g");
  assert_int_equal(got.stopped, 0);
  assert_null(got.terminal_reason);
  assert_string_equal(got.policy_json, "{}");
  assert_int_equal(got.state_len, 8);
  assert_memory_equal(got.state, "\x00\x01\x02state", 8);
  assert_string_equal(got.envelope_json, "{\"run_id\":\"x\"}");
  assert_int_equal(got.created_ms, T0);
  lg_run_record_clear(&got);
  /* put replaces everything but the creation time. */
  r = rec_of("r1", NULL, 1, T0 + 50);
  assert_int_equal(lg_store_run_put(s, &r, &err), 0);
  assert_int_equal(lg_store_run_get(s, "r1", &got, &err), 0);
  assert_int_equal(got.stopped, 1);
  assert_null(got.group);
  assert_string_equal(got.terminal_reason, "same_call_repeat");
  assert_int_equal(got.created_ms, T0);
  assert_int_equal(got.updated_ms, T0 + 50);
  char *json = lg_run_record_to_json(&got);
  assert_non_null(strstr(json, "\"status\":\"stopped\""));
  assert_non_null(strstr(json, "\"envelope\":{\"run_id\":\"x\"}"));
  lg_free(json);
  lg_run_record_clear(&got);
  /* put of a new run creates it. */
  r = rec_of("r2", NULL, 0, T0 + 60);
  assert_int_equal(lg_store_run_put(s, &r, &err), 0);
  assert_int_equal(lg_store_run_get(s, "r2", &got, &err), 0);
  lg_run_record_clear(&got);
  assert_int_equal(lg_store_run_get(s, "r3", &got, &err), LG_ENOTFOUND);
  assert_non_null(strstr(err.message, "r3"));
}

typedef struct listed {
  char ids[16][16];
  int n;
  int stop_after; /* return 99 after this many (0: never) */
} listed_t;

static int list_cb(void *ud, const lg_run_record_t *rec) {
  listed_t *l = ud;
  assert_null(rec->state); /* not asked for */
  assert_null(rec->policy_json);
  snprintf(l->ids[l->n++], 16, "%s", rec->run_id);
  return l->stop_after && l->n >= l->stop_after ? 99 : 0;
}

static int list_state_cb(void *ud, const lg_run_record_t *rec) {
  (void)ud;
  assert_string_equal(rec->policy_json, "{}");
  assert_int_equal(rec->state_len, 8);
  assert_memory_equal(rec->state, "\x00\x01\x02state", 8);
  return 0;
}

static void test_run_list(void **state) {
  lg_store_t *s = *state;
  /* Created out of order; two in the same millisecond. */
  const char *ids[] = {"a", "b", "c", "d", "e"};
  int64_t at[] = {T0 + 30, T0 + 10, T0 + 20, T0 + 20, T0 + 40};
  int stopped[] = {0, 1, 0, 1, 0};
  for (int i = 0; i < 5; i++) {
    lg_run_record_t r = rec_of(ids[i], i < 3 ? "g1" : "g2", stopped[i], at[i]);
    assert_int_equal(lg_store_run_create(s, &r, NULL), 0);
  }
  listed_t l = {0};
  assert_int_equal(lg_store_run_list(s, NULL, list_cb, &l, NULL), 0);
  assert_int_equal(l.n, 5);
  const char *want[] = {"e", "a", "d", "c", "b"}; /* newest first; ties: later first */
  for (int i = 0; i < 5; i++) assert_string_equal(l.ids[i], want[i]);
  memset(&l, 0, sizeof l);
  lg_run_filter_t f = {.status = "active"};
  assert_int_equal(lg_store_run_list(s, &f, list_cb, &l, NULL), 0);
  assert_int_equal(l.n, 3);
  assert_string_equal(l.ids[0], "e");
  assert_string_equal(l.ids[2], "c");
  memset(&l, 0, sizeof l);
  f = (lg_run_filter_t){.status = "stopped", .limit = 1};
  assert_int_equal(lg_store_run_list(s, &f, list_cb, &l, NULL), 0);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.ids[0], "d");
  memset(&l, 0, sizeof l);
  f = (lg_run_filter_t){.group = "g1", .reason = "same_call_repeat"};
  assert_int_equal(lg_store_run_list(s, &f, list_cb, &l, NULL), 0);
  assert_int_equal(l.n, 1);
  assert_string_equal(l.ids[0], "b");
  memset(&l, 0, sizeof l);
  l.stop_after = 2;
  assert_int_equal(lg_store_run_list(s, NULL, list_cb, &l, NULL), 99);
  assert_int_equal(l.n, 2);
  f = (lg_run_filter_t){.status = "paused"};
  assert_int_equal(lg_store_run_list(s, &f, list_cb, &l, NULL), LG_EINVAL);
  /* Asked for (the server's list, with each run's counters): the policy
   * and the state, bytes and all. */
  f = (lg_run_filter_t){.status = "stopped", .limit = 1, .with_state = 1};
  assert_int_equal(lg_store_run_list(s, &f, list_state_cb, NULL, NULL), 0);
}

typedef struct wr {
  int calls;
  int fail_with;    /* return this from the callback */
  int nested_rc;    /* what a nested with_run returned */
} wr_t;

static int nested_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud;
  (void)s;
  (void)rec;
  return 0;
}

static int bump_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  wr_t *w = ud;
  w->calls++;
  lg_run_record_t r = *rec;
  char env[64];
  long n = rec->envelope_json ? strtol(rec->envelope_json + 1, NULL, 10) : 0;
  snprintf(env, sizeof env, "[%ld]", n + 1);
  r.envelope_json = env;
  r.updated_ms = rec->updated_ms + 1;
  assert_int_equal(lg_store_run_put(s, &r, NULL), 0);
  /* A claim inside the decision joins its transaction. */
  lg_claim_t c = {0};
  char key[32];
  snprintf(key, sizeof key, "in-run-%ld", n);
  assert_int_equal(lg_store_claim(s, key, FP1, rec->run_id, 1000, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  w->nested_rc = lg_store_with_run(s, rec->run_id, nested_fn, NULL, NULL);
  return w->fail_with;
}

static void test_with_run(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  wr_t w = {0};
  assert_int_equal(lg_store_with_run(s, "ghost", bump_fn, &w, &err), LG_ENOTFOUND);
  assert_int_equal(w.calls, 0);
  lg_run_record_t r = rec_of("wr", NULL, 0, T0);
  r.envelope_json = (char *)"[0]";
  assert_int_equal(lg_store_run_create(s, &r, NULL), 0);
  assert_int_equal(lg_store_with_run(s, "wr", bump_fn, &w, &err), 0);
  assert_int_equal(w.nested_rc, LG_ESTATE);
  lg_run_record_t got;
  assert_int_equal(lg_store_run_get(s, "wr", &got, NULL), 0);
  assert_string_equal(got.envelope_json, "[1]");
  lg_run_record_clear(&got);
  lg_claim_t c = {0};
  assert_int_equal(lg_store_peek(s, "in-run-0", FP1, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
  /* A failing decision leaves nothing behind: neither run nor claim. */
  w.fail_with = LG_ECONFLICT;
  assert_int_equal(lg_store_with_run(s, "wr", bump_fn, &w, &err), LG_ECONFLICT);
  assert_int_equal(lg_store_run_get(s, "wr", &got, NULL), 0);
  assert_string_equal(got.envelope_json, "[1]");
  lg_run_record_clear(&got);
  assert_int_equal(lg_store_peek(s, "in-run-1", FP1, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_FREE);
  /* And the store works on. */
  w.fail_with = 0;
  assert_int_equal(lg_store_with_run(s, "wr", bump_fn, &w, &err), 0);
  assert_int_equal(lg_store_peek(s, "in-run-1", FP1, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_IN_PROGRESS);
}

/* What a decision reads of its run is the stored row, however the row got
 * there: the SQLite store keeps the rows its transactions read and wrote
 * for the next ones (store_sql.c, "the run cache"). */
typedef struct put_ctx {
  const char *env;  /* the envelope to write */
  int fail_with;    /* then return this */
} put_ctx_t;

static int put_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  put_ctx_t *p = ud;
  lg_run_record_t r = *rec;
  r.envelope_json = (char *)p->env;
  r.created_ms = rec->created_ms + 999; /* an update keeps the stored one */
  assert_int_equal(lg_store_run_put(s, &r, NULL), 0);
  return p->fail_with;
}

static int copy_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)s;
  return lg__run_record_copy(ud, rec);
}

static void expect_run(lg_store_t *s, const char *id, const char *env, int64_t created) {
  lg_run_record_t got;
  lg_error_t err = {0};
  assert_int_equal(lg_store_with_run(s, id, copy_fn, &got, &err), 0);
  assert_string_equal(got.envelope_json, env);
  assert_int_equal(got.created_ms, created);
  lg_run_record_clear(&got);
}

static void test_run_reads_are_fresh(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg_run_record_t r = rec_of("fresh", NULL, 0, T0);
  assert_int_equal(lg_store_run_create(s, &r, NULL), 0);
  expect_run(s, "fresh", "{\"run_id\":\"x\"}", T0);
  put_ctx_t p = {"[a]", 0};
  assert_int_equal(lg_store_with_run(s, "fresh", put_fn, &p, &err), 0);
  expect_run(s, "fresh", "[a]", T0);
  /* Undone by a failing decision, alone or inside a group commit. */
  p = (put_ctx_t){"[b]", LG_ECONFLICT};
  assert_int_equal(lg_store_with_run(s, "fresh", put_fn, &p, &err), LG_ECONFLICT);
  expect_run(s, "fresh", "[a]", T0);
  lg__store_lock(s);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
  assert_int_equal(lg_store_with_run(s, "fresh", put_fn, &p, &err), LG_ECONFLICT);
  expect_run(s, "fresh", "[a]", T0);
  p = (put_ctx_t){"[c]", 0};
  assert_int_equal(lg_store_with_run(s, "fresh", put_fn, &p, &err), 0);
  expect_run(s, "fresh", "[c]", T0);
  assert_int_equal(lg__store_end(s, 1, &err), 0);
  lg__store_unlock(s);
  expect_run(s, "fresh", "[c]", T0);
  /* Written through another handle (another process, or the CLI). */
  if (!durable()) return;
  lg_store_t *other = lgt_open(lgt_url, NULL);
  r.envelope_json = (char *)"[d]";
  assert_int_equal(lg_store_run_put(other, &r, NULL), 0);
  lg_store_close(other);
  expect_run(s, "fresh", "[d]", T0);
}

/* An engine run saved and loaded decides as the original would. */
static void test_run_save_load(void **state) {
  lg_store_t *s = *state;
  lg_canon_t *canon = lg_canon_new();
  lg_error_t err = {0};
  const char *pj = "{\"repeat\":{\"observe\":2,\"block\":3,\"stop\":4}}";
  lg_policy_t *pol = lg_policy_parse(pj, strlen(pj), NULL, &err);
  assert_non_null(pol);
  lg_run_t *a = lg_run_new("saved", "team", pol, NULL, NULL, &err);
  lg_policy_free(pol);
  assert_non_null(a);
  lg_call_t call = {.tool = "search", .args = "{\"q\":\"x\"}", .args_len = 9};
  lg_result_t res = {.status = LG_STATUS_PROGRESS, .side_effect_committed = -1,
                     .retry_after_ms = -1};
  lg_decision_t d;
  for (int i = 0; i < 2; i++) {
    call.turn = i;
    call.t_ms = res.t_ms = i * 10;
    assert_int_equal(lg_run_before(a, canon, &call, &d, &err), 0);
    assert_int_equal(lg_run_after(a, &res, &d, &err), 0);
  }
  assert_int_equal(lg_store_run_save(s, a, T0, &err), 0);
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "saved", &rec, NULL), 0);
  assert_string_equal(rec.group, "team");
  assert_int_equal(rec.stopped, 0);
  assert_non_null(strstr(rec.policy_json, "\"repeat\""));
  assert_non_null(strstr(rec.envelope_json, "\"run_id\":\"saved\""));
  lg_run_record_clear(&rec);

  lg_run_t *b = NULL;
  assert_int_equal(lg_store_run_load(s, "saved", NULL, &b, &err), 0);
  assert_non_null(b);
  /* Both see the third identical call the same way, then the fourth. */
  for (int i = 2; i < 4; i++) {
    lg_decision_t da, db;
    call.turn = i;
    call.t_ms = i * 10;
    assert_int_equal(lg_run_before(a, canon, &call, &da, &err), 0);
    assert_int_equal(lg_run_before(b, canon, &call, &db, &err), 0);
    assert_int_equal(da.action, db.action);
    assert_int_equal(da.reason, db.reason);
    assert_int_equal(da.repeat, db.repeat);
  }
  assert_int_equal(lg_run_stopped(b), 1);
  assert_int_equal(lg_store_run_save(s, b, T0 + 100, &err), 0);
  assert_int_equal(lg_store_run_get(s, "saved", &rec, NULL), 0);
  assert_int_equal(rec.stopped, 1);
  assert_string_equal(rec.terminal_reason, "same_call_repeat");
  assert_int_equal(rec.created_ms, T0);
  lg_run_record_clear(&rec);
  lg_run_t *none = NULL;
  assert_int_equal(lg_store_run_load(s, "nope", NULL, &none, &err), LG_ENOTFOUND);
  assert_null(none);
  lg_run_free(a);
  lg_run_free(b);
  lg_canon_free(canon);
}

/* ------------------------------------------------------------------ */
/* The kill switch.                                                    */

static void save_new_run(lg_store_t *s, const char *id, const char *group, int64_t t) {
  lg_error_t err = {0};
  lg_run_t *run = lg_run_new(id, group, NULL, NULL, NULL, &err);
  assert_non_null(run);
  assert_int_equal(lg_store_run_save(s, run, t, &err), 0);
  lg_run_free(run);
}

static void test_cancel_run(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  char *reason = NULL;
  assert_int_equal(lg_store_denied(s, "later", NULL, &reason, NULL), 0);
  /* Before the run exists: the rule waits for it. */
  assert_int_equal(lg_store_cancel_run(s, "later", "runaway billing", T0, &err), 0);
  assert_int_equal(lg_store_denied(s, "later", "any", &reason, NULL), 1);
  assert_string_equal(reason, "runaway billing");
  lg_free(reason);
  /* A stored active run is stopped and saved, with the reason. */
  save_new_run(s, "live", "grp", T0);
  assert_int_equal(lg_store_cancel_run(s, "live", NULL, T0 + 500, &err), 0);
  assert_int_equal(lg_store_denied(s, "live", NULL, &reason, NULL), 1);
  assert_null(reason);
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "live", &rec, NULL), 0);
  assert_int_equal(rec.stopped, 1);
  assert_string_equal(rec.terminal_reason, "operator_cancelled_loop");
  assert_non_null(strstr(rec.envelope_json, "operator_cancelled_loop"));
  lg_run_record_clear(&rec);
  /* The next decision of any worker: stop, before any side effect. */
  lg_run_t *run = NULL;
  assert_int_equal(lg_store_run_load(s, "live", NULL, &run, &err), 0);
  lg_canon_t *canon = lg_canon_new();
  lg_call_t call = {.tool = "charge", .args = "{}", .args_len = 2, .t_ms = 600};
  lg_decision_t d;
  assert_int_equal(lg_run_before(run, canon, &call, &d, &err), 0);
  assert_int_equal(d.action, LG_ACT_STOP);
  lg_run_free(run);
  lg_canon_free(canon);
  /* Cancelling twice changes nothing. */
  assert_int_equal(lg_store_cancel_run(s, "live", "again", T0 + 900, &err), 0);
  assert_int_equal(lg_store_denied(s, "live", NULL, &reason, NULL), 1);
  assert_string_equal(reason, "again");
  lg_free(reason);
  assert_int_equal(lg_store_cancel_run(s, "", NULL, T0, &err), LG_EINVAL);
}

static void test_cancel_group(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  save_new_run(s, "g-1", "night", T0);
  save_new_run(s, "g-2", "night", T0 + 1);
  save_new_run(s, "other", "day", T0 + 2);
  char *ids = NULL;
  assert_int_equal(lg_store_cancel_group(s, "night", "stop the batch", T0 + 10, &ids, &err), 0);
  assert_string_equal(ids, "[\"g-2\",\"g-1\"]");
  lg_free(ids);
  char *reason = NULL;
  assert_int_equal(lg_store_denied(s, "g-3", "night", &reason, NULL), 1); /* a future run */
  assert_string_equal(reason, "stop the batch");
  lg_free(reason);
  assert_int_equal(lg_store_denied(s, "other", "day", NULL, NULL), 0);
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "other", &rec, NULL), 0);
  assert_int_equal(rec.stopped, 0);
  lg_run_record_clear(&rec);
  assert_int_equal(lg_store_run_get(s, "g-1", &rec, NULL), 0);
  assert_int_equal(rec.stopped, 1);
  lg_run_record_clear(&rec);
  /* Again: nothing active is left in the group. */
  assert_int_equal(lg_store_cancel_group(s, "night", NULL, T0 + 20, &ids, &err), 0);
  assert_string_equal(ids, "[]");
  lg_free(ids);
  /* A run's own rule comes before its group's. */
  assert_int_equal(lg_store_cancel_run(s, "g-1", "own", T0 + 30, &err), 0);
  assert_int_equal(lg_store_denied(s, "g-1", "night", &reason, NULL), 1);
  assert_string_equal(reason, "own");
  lg_free(reason);
}

/* SQLite: a decision's transaction runs at synchronous=NORMAL and leaves
 * the connection there (the server's committer runs one after another);
 * a ledger write, in a transaction or not, runs at FULL. */
/* Every acknowledged decision is durable by default: run transactions at
 * synchronous=FULL too. Opened with durability=relaxed, run transactions
 * run at NORMAL, and ledger writes are still FULL. */
static void test_sqlite_durability(void **state) {
  lg_store_t *s = *state;
  if (strcmp(lgt_backend, "sqlite")) {
    assert_int_equal(lg__store_sqlite_synchronous(s), -1);
    if (!strcmp(lgt_backend, "postgres")) { /* libpq never sees the parameter */
      char url[1200];
      snprintf(url, sizeof url, "%s durability=relaxed", lgt_url);
      lg_store_t *r = lgt_open(url, NULL);
      save_new_run(r, "dur-relaxed", NULL, T0);
      lg_store_close(r);
    }
    return;
  }
  lg_error_t err = {0};
  lg_claim_t c = {0};
  save_new_run(s, "dur", NULL, T0);
  assert_int_equal(lg__store_sqlite_synchronous(s), 2); /* the default: durable */
  char url[1200];
  snprintf(url, sizeof url, "%s?durability=relaxed", lgt_url);
  lg_store_t *r = lgt_open(url, NULL);
  save_new_run(r, "dur-relaxed", NULL, T0);
  assert_int_equal(lg__store_sqlite_synchronous(r), 1);
  assert_int_equal(lg__store_deny(r, LG__DENY_RUN, "other", NULL, T0, &err), 0);
  assert_int_equal(lg__store_sqlite_synchronous(r), 2);
  save_new_run(r, "dur2", NULL, T0);
  assert_int_equal(lg__store_sqlite_synchronous(r), 1);
  assert_int_equal(claim(r, "dur-key", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  assert_int_equal(lg__store_sqlite_synchronous(r), 2);
  save_new_run(r, "dur3", NULL, T0);
  commit(r, "dur-key", "{}", T0 + 1);
  assert_int_equal(lg__store_sqlite_synchronous(r), 2);
  lg_store_close(r);
  /* The option says the same; the URL's parameter overrides it. */
  lg_store_options_t o = {.durability = LG_STORE_RELAXED};
  r = lgt_open(lgt_url, &o);
  save_new_run(r, "dur4", NULL, T0);
  assert_int_equal(lg__store_sqlite_synchronous(r), 1);
  lg_store_close(r);
  snprintf(url, sizeof url, "%s?durability=full", lgt_url);
  r = lgt_open(url, &o);
  save_new_run(r, "dur5", NULL, T0);
  assert_int_equal(lg__store_sqlite_synchronous(r), 2);
  lg_store_close(r);
  /* A bad value names the parameter. */
  snprintf(url, sizeof url, "%s?durability=sometimes", lgt_url);
  assert_null(lg_store_open(url, NULL, &err));
  assert_int_equal(err.code, LG_EINVAL);
  assert_non_null(strstr(err.message, "durability=sometimes"));
  /* Every backend takes the parameter (PostgreSQL: key=value and URI). */
  lg_store_close(lgt_open("memory:?durability=relaxed", NULL));
}

/* busy_timeout_ms=N in the URL, on every backend: the option it
 * overrides, 0 for do not wait, taken out with durability= beside it
 * (libpq would refuse the key), and a bad value named. */
static void test_url_busy_timeout(void **state) {
  (void)state;
  char url[1200];
  const char *sep = !strcmp(lgt_backend, "postgres") && !strstr(lgt_url, "://") ? " " : "?";
  lg_store_options_t o = {.busy_timeout_ms = 9000};
  snprintf(url, sizeof url, "%s%sbusy_timeout_ms=250", lgt_url, sep);
  lg_store_t *r = lgt_open(url, &o);
  assert_int_equal(r->opts.busy_timeout_ms, 250);
  save_new_run(r, "busy-url", NULL, T0); /* the backend took the rest */
  lg_store_close(r);
  snprintf(url, sizeof url, "%s%sdurability=relaxed%sbusy_timeout_ms=0", lgt_url, sep,
           *sep == '?' ? "&" : " ");
  r = lgt_open(url, &o);
  assert_int_equal(r->opts.busy_timeout_ms, 0); /* do not wait */
  assert_int_equal(r->opts.durability, LG_STORE_RELAXED);
  save_new_run(r, "busy-url2", NULL, T0);
  lg_store_close(r);
  r = lgt_open(lgt_url, &o); /* without the parameter: the option */
  assert_int_equal(r->opts.busy_timeout_ms, 9000);
  lg_store_close(r);
  static const char *bad[] = {"abc", "", "-5", "10s", "99999999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    lg_error_t err = {0};
    snprintf(url, sizeof url, "%s%sbusy_timeout_ms=%s", lgt_url, sep, bad[i]);
    assert_null(lg_store_open(url, NULL, &err));
    assert_int_equal(err.code, LG_EINVAL);
    assert_non_null(strstr(err.message, "busy_timeout_ms="));
    assert_non_null(strstr(err.message, "milliseconds"));
  }
}

/* Reads do not wait for writes (SQLite): another process holds the
 * file's write lock and a thread of ours waits for it inside a
 * transaction, holding the handle; reads through the same handle answer
 * at once from its read-only connection, and the write probe of /healthz
 * says the lock is held, until it is released. */
static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static int touch_run(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  (void)ud, (void)s, (void)rec;
  return 0;
}
static int touch_list(void *ud, const lg_run_record_t *rec) {
  (void)ud, (void)rec;
  return 0;
}
static void *waiting_writer(void *arg) {
  lg_store_t *s = arg;
  lg_error_t err = {0};
  static int rc;
  rc = lg_store_with_run(s, "rw-run", touch_run, NULL, &err);
  return &rc;
}
/* memory: keeps its database out of SQLite's page cache (in memdb), so a
 * store grown past the cache holds only what a file's would in it: with
 * the whole database in the cache, every commit that truncated the cache
 * walked every page, a tail of milliseconds once a server held 100,000
 * runs. What was written is still read back whole after the growth. */
static void test_cache_bounded(void **state) {
  lg_store_t *s = *state;
  if (!strcmp(lgt_backend, "postgres")) {
    assert_int_equal(lg__store_sqlite_cache_bytes(s), -1);
    return;
  }
  enum { N = 400, SZ = 64 * 1024 };
  char *big = malloc(SZ + 1);
  assert_non_null(big);
  lg_claim_t c = {0};
  char key[32];
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < SZ; k++) big[k] = (char)('a' + (k * 7 + i) % 26);
    big[SZ] = 0;
    snprintf(key, sizeof key, "big-%d", i);
    assert_int_equal(claim(s, key, FP1, 1000, T0, &c), LG_CLAIM_CLAIMED);
    commit(s, key, big, T0);
  }
  int64_t cache = lg__store_sqlite_cache_bytes(s);
  /* 25 MB written; SQLite's default cache is 2,000 KiB of pages */
  if (cache < 0 || cache > 8 * 1024 * 1024)
    fail_msg("%s: the page cache holds %lld bytes after %d MB written", lgt_backend, (long long)cache,
             N * SZ >> 20);
  for (int i = 0; i < N; i += 133) {
    for (int k = 0; k < SZ; k++) big[k] = (char)('a' + (k * 7 + i) % 26);
    snprintf(key, sizeof key, "big-%d", i);
    assert_int_equal(claim(s, key, FP1, 1000, T0, &c), LG_CLAIM_REPLAY);
    assert_int_equal(c.result_len, SZ);
    assert_memory_equal(c.result, big, SZ);
    lg_claim_clear(&c);
  }
  free(big);
}

static void test_reads_do_not_wait(void **state) {
  lg_store_t *s = *state;
  if (strcmp(lgt_backend, "sqlite")) return;
  lg_error_t err = {0};
  lg_claim_t c = {0};
  save_new_run(s, "rw-run", NULL, T0);
  assert_int_equal(claim(s, "rw-key", FP1, 60000, T0, &c), LG_CLAIM_CLAIMED);
  lg_budget_t b;
  assert_int_equal(lg_budget_set(s, "key:rw", 1000000, LG_PERIOD_DAILY, -1, T0, &b, &err), 0);
  assert_int_equal(lg__store_write_probe(s, T0, &err), 0);
  sqlite3 *other;
  assert_int_equal(sqlite3_open(lgt_url + 7, &other), SQLITE_OK);
  assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiting_writer, s), 0);
  lgt_sleep_ms(200); /* the writer waits in its busy handler, holding the handle */
  int64_t t0 = mono_ms();
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "rw-run", &rec, &err), 0);
  lg_run_record_clear(&rec);
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "rw-key", T0 + 1, &op, &err), 0);
  lg_operation_clear(&op);
  assert_int_equal(lg_store_peek(s, "rw-key", FP1, T0 + 1, &c, &err), 0);
  assert_int_equal(lg_budget_get(s, "key:rw", T0 + 1, &b, &err), 0);
  int v = 0;
  assert_int_equal(lg_store_schema_version(s, &v, &err), 0);
  lg_run_filter_t f = {0};
  assert_true(lg_store_run_list(s, &f, touch_list, NULL, &err) >= 0);
  int64_t took = mono_ms() - t0;
  /* A read behind the writer waits out its busy timeout (5 s); a second
   * is far from both, on a machine loaded by the whole suite under ASan. */
  if (took >= 1000) fail_msg("reads took %lld ms behind the waiting write", (long long)took);
  assert_int_equal(lg__store_write_probe(s, T0 + 2, &err), LG_EBUSY);
  assert_non_null(strstr(err.message, "write lock has been held"));
  assert_null(strstr(err.message, lgt_url + 7)); /* no path */
  assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(other);
  void *res;
  pthread_join(th, &res);
  assert_int_equal(*(int *)res, 0); /* the write proceeded once the lock was free */
  assert_int_equal(lg__store_write_probe(s, T0 + 3, &err), 0);
}

/* The SQLite store asks once per transaction whether there is any rule at
 * all. A rule another handle writes between two transactions is seen by
 * the second; a rule written inside a transaction is seen by the rest of
 * it, and is gone with its rollback. */
static void test_deny_in_transaction(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  char *reason = NULL;
  if (durable()) {
    lg__store_lock(s);
    assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
    assert_int_equal(lg_store_denied(s, "r1", "g1", NULL, &err), 0);
    assert_int_equal(lg__store_end(s, 1, &err), 0);
    lg__store_unlock(s);
    lg_store_t *other = lgt_open(lgt_url, NULL);
    assert_int_equal(lg_store_cancel_run(other, "r1", "from the other", T0, &err), 0);
    lg_store_close(other);
    lg__store_lock(s);
    assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
    assert_int_equal(lg_store_denied(s, "r1", "g1", &reason, &err), 1);
    assert_string_equal(reason, "from the other");
    lg_free(reason);
    assert_int_equal(lg__store_end(s, 1, &err), 0);
    lg__store_unlock(s);
  }
  lg__store_lock(s);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
  assert_int_equal(lg_store_denied(s, "r2", "g2", NULL, &err), 0);
  assert_int_equal(lg__store_deny(s, LG__DENY_GROUP, "g2", "in txn", T0, &err), 0);
  assert_int_equal(lg_store_denied(s, "r2", "g2", &reason, &err), 1);
  assert_string_equal(reason, "in txn");
  lg_free(reason);
  assert_int_equal(lg_store_denied(s, "r3", "g3", NULL, &err), 0);
  assert_int_equal(lg__store_end(s, 0, &err), 0);
  lg__store_unlock(s);
  assert_int_equal(lg_store_denied(s, "r2", "g2", NULL, &err), 0);
}

/* ------------------------------------------------------------------ */
/* Durable backends: restart and migration.                            */

/* Trace lines: appended in order, with the transaction that writes
 * them, and undone with it, savepoint by savepoint. */
typedef struct evctx {
  const char *lines;
  int fail_with;
} evctx_t;

static int append_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  evctx_t *x = ud;
  int rc = lg__store_events_append(s, rec->run_id, x->lines, strlen(x->lines), NULL);
  return rc ? rc : x->fail_with;
}

static void expect_lines(lg_store_t *s, const char *run_id, const char *want) {
  lg__buf_t b = {0};
  lg_error_t err = {0};
  assert_int_equal(lg__store_events_read(s, run_id, &b, &err), 0);
  assert_int_equal(b.len, strlen(want));
  if (b.len) assert_memory_equal(b.data, want, b.len);
  lg__buf_free(&b);
}

static void test_events(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  expect_lines(s, "ev", ""); /* no run, no lines: not an error */
  save_new_run(s, "ev", NULL, T0);
  save_new_run(s, "other", NULL, T0);
  evctx_t x = {"{\"type\":\"call\",\"n\":1}\n", 0};
  assert_int_equal(lg_store_with_run(s, "ev", append_fn, &x, &err), 0);
  x.lines = "{\"type\":\"result\"}\n{\"type\":\"call\",\"n\":2}\n"; /* a block of two */
  assert_int_equal(lg_store_with_run(s, "ev", append_fn, &x, &err), 0);
  x.lines = "{\"type\":\"call\",\"run\":\"other\"}\n";
  assert_int_equal(lg_store_with_run(s, "other", append_fn, &x, &err), 0);
  /* A decision that fails leaves no line. */
  x.lines = "{\"type\":\"lost\"}\n";
  x.fail_with = LG_ECONFLICT;
  assert_int_equal(lg_store_with_run(s, "ev", append_fn, &x, &err), LG_ECONFLICT);
  expect_lines(s, "ev",
               "{\"type\":\"call\",\"n\":1}\n{\"type\":\"result\"}\n{\"type\":\"call\",\"n\":2}\n");
  expect_lines(s, "other", "{\"type\":\"call\",\"run\":\"other\"}\n");
  /* Undone by a savepoint's rollback, kept by the outer commit. */
  lg__store_lock(s);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
  assert_int_equal(lg__store_events_append(s, "other", "a\n", 2, &err), 0);
  assert_int_equal(lg__store_begin(s, LG__TXN_RUN, &err), 0);
  assert_int_equal(lg__store_events_append(s, "other", "b\n", 2, &err), 0);
  assert_int_equal(lg__store_end(s, 0, &err), 0);
  assert_int_equal(lg__store_events_append(s, "other", "c\n", 2, &err), 0);
  assert_int_equal(lg__store_end(s, 1, &err), 0);
  lg__store_unlock(s);
  expect_lines(s, "other", "{\"type\":\"call\",\"run\":\"other\"}\na\nc\n");
  /* Many lines (a backend may move older ones elsewhere as they pile up):
   * all come back, in order, and a failed decision still leaves none. */
  save_new_run(s, "long", NULL, T0);
  char want[200 * 100 + 1] = "", line[128];
  for (int i = 0; i < 200; i++) {
    snprintf(line, sizeof line, "{\"type\":\"call\",\"i\":%d,\"pad\":\"%0*d\"}\n", i, 40 + i % 30, 0);
    strcat(want, line);
    x.lines = line;
    x.fail_with = i % 7 == 3 ? LG_ECONFLICT : 0;
    assert_int_equal(lg_store_with_run(s, "long", append_fn, &x, &err), x.fail_with);
    if (x.fail_with) want[strlen(want) - strlen(line)] = 0;
  }
  expect_lines(s, "long", want);
  /* Bad ids are refused, nothing written. */
  assert_int_equal(lg__store_events_append(s, "", "x\n", 2, &err), LG_EINVAL);
}

/* A run not stored yet, taken by lg__store_with_run_born (the gateway's
 * fresh runs): fn sees the record in memory, and the row is written once,
 * by fn's first save, with the creation's lines before the save's; after
 * fn when it saved nothing; not at all when fn fails. A run already
 * stored is taken as stored, the creation's lines not written. */
typedef struct born_ctx {
  int saves;        /* lg__store_run_put_events calls, each with line */
  int fail_with;    /* then return this */
  int64_t created;  /* what fn saw */
} born_ctx_t;

static int born_fn(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  born_ctx_t *x = ud;
  x->created = rec->created_ms;
  for (int i = 0; i < x->saves; i++) {
    lg_run_record_t r = *rec;
    char env[32], line[64];
    snprintf(env, sizeof env, "[%d]", i + 1);
    snprintf(line, sizeof line, "{\"type\":\"call\",\"save\":%d}\n", i + 1);
    r.envelope_json = env;
    r.updated_ms = rec->updated_ms + i + 1;
    int rc = lg__store_run_put_events(s, &r, line, strlen(line), NULL);
    if (rc) return rc;
  }
  return x->fail_with;
}

static int fail_before_commit(void *ud, lg_store_t *s, const char *point) {
  (void)ud;
  (void)s;
  return strcmp(point, "with_run.before_commit") ? 0 : LG_EIO;
}

static int born_run(lg_store_t *s, const char *id, born_ctx_t *x, int *created) {
  lg_run_record_t r = rec_of(id, "g", 0, T0);
  lg__store_born_t b = {.rec = &r, .lines = "{\"type\":\"run\"}\n", .len = 15, .created = -1};
  lg_error_t err = {0};
  int rc = lg__store_with_run_born(s, &b, born_fn, x, &err);
  *created = b.created;
  return rc;
}

static void test_with_run_born(void **state) {
  lg_store_t *s = *state;
  static const char RUN[] = "{\"type\":\"run\"}\n", S1[] = "{\"type\":\"call\",\"save\":1}\n",
                    S2[] = "{\"type\":\"call\",\"save\":2}\n";
  char two[128], again[256], fail2[128];
  snprintf(two, sizeof two, "%s%s%s", RUN, S1, S2);
  snprintf(again, sizeof again, "%s%s", two, S1);
  snprintf(fail2, sizeof fail2, "%s%s", RUN, S1);
  const struct {
    const char *id, *what;
    int saves, fail_with, created; /* fn's saves and result; stored by this call */
    int fault;                     /* the store fails before the commit (LG_EIO) */
    const char *env;               /* the row's envelope after (NULL: no row) */
    int64_t updated;
    const char *lines;             /* the run's trace after */
  } steps[] = {
      {"b-fail", "fn fails after its save: no row, no line", 1, LG_ECONFLICT, 0, 0, NULL, 0, ""},
      {"b-fault", "the store fails after fn's save: no row, no line", 1, LG_EIO, 0, 1, NULL, 0, ""},
      {"b-none", "fn saves nothing: the row as given, its creation's lines", 0, 0, 1, 0,
       "{\"run_id\":\"x\"}", T0, RUN},
      {"b-two", "fn saves twice: inserted by the first, updated by the second", 2, 0, 1, 0, "[2]",
       T0 + 2, two},
      {"b-two", "stored already: fn sees the stored row, the creation not written again", 1, 0, 0, 0,
       "[1]", T0 + 3, again},
      {"b-fail", "the failed one's id is free: a later creation stores it", 1, 0, 1, 0, "[1]", T0 + 1,
       fail2},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    print_message("  %s\n", steps[i].what);
    born_ctx_t x = {.saves = steps[i].saves, .fail_with = steps[i].fault ? 0 : steps[i].fail_with};
    int created;
    lg__store_set_fault(s, steps[i].fault ? fail_before_commit : NULL, NULL);
    assert_int_equal(born_run(s, steps[i].id, &x, &created), steps[i].fail_with);
    lg__store_set_fault(s, NULL, NULL);
    assert_int_equal(created, steps[i].created);
    assert_int_equal(x.created, T0); /* the record fn saw: given, or stored with T0 */
    lg_run_record_t got;
    if (!steps[i].env) {
      assert_int_equal(lg_store_run_get(s, steps[i].id, &got, NULL), LG_ENOTFOUND);
    } else {
      assert_int_equal(lg_store_run_get(s, steps[i].id, &got, NULL), 0);
      assert_string_equal(got.group, "g");
      assert_string_equal(got.envelope_json, steps[i].env);
      assert_int_equal(got.created_ms, T0);
      assert_int_equal(got.updated_ms, steps[i].updated);
      lg_run_record_clear(&got);
    }
    expect_lines(s, steps[i].id, steps[i].lines);
  }
}

/* SQLite's stores make SQLite count nothing (driver_sqlite.c,
 * sqlite_config): its count of the bytes it holds takes a global lock on
 * every allocation, and the gateway makes 70 a request. */
static void test_sqlite_counts_nothing(void **state) {
  lg_store_t *s = *state;
  if (!strcmp(lgt_backend, "postgres")) skip();
  save_new_run(s, "counted", NULL, T0);
  lg_claim_t c = {0};
  assert_int_equal(lg_store_claim(s, "count-key", FP1, "counted", 1000, T0, &c, NULL), 0);
  assert_int_equal(c.outcome, LG_CLAIM_CLAIMED);
  assert_int_equal(sqlite3_memory_used(), 0);
}

static void test_restart(void **state) {
  if (!durable()) skip(); /* memory: has no "after a restart" */
  lg_store_t *s = *state;
  lg_claim_t c = {0};
  assert_int_equal(claim(s, "durable", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "durable", "{\"id\":42}", T0 + 1);
  assert_int_equal(claim(s, "inflight", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  save_new_run(s, "survivor", "g", T0);
  lg_error_t err = {0};
  evctx_t x = {"{\"type\":\"run\"}\n", 0};
  assert_int_equal(lg_store_with_run(s, "survivor", append_fn, &x, &err), 0);
  lg_run_t *run = NULL;
  assert_int_equal(lg_store_run_load(s, "survivor", NULL, &run, &err), 0);
  lg_canon_t *canon = lg_canon_new();
  lg_call_t call = {.tool = "t", .args = "{}", .args_len = 2, .t_ms = 5};
  lg_decision_t d;
  for (int i = 0; i < 3; i++) {
    call.turn = i;
    assert_int_equal(lg_run_before(run, canon, &call, &d, &err), 0);
    if (d.action == LG_ACT_EXECUTE) {
      lg_result_t res = {.status = LG_STATUS_PROGRESS, .side_effect_committed = -1,
                         .retry_after_ms = -1, .t_ms = 6};
      assert_int_equal(lg_run_after(run, &res, &d, &err), 0);
    }
  }
  assert_int_equal(lg_store_run_save(s, run, T0 + 10, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "tc:call_9", "survivor", NULL, T0 + 10, &err), 0);
  char *env_before = lg_run_envelope_json(run);
  lg_run_free(run);
  lg_store_close(s);

  *state = s = lgt_open(lgt_url, NULL);
  assert_int_equal(claim(s, "durable", FP1, 100, T0 + 2, &c), LG_CLAIM_REPLAY);
  assert_string_equal(c.result, "{\"id\":42}");
  lg_claim_clear(&c);
  assert_int_equal(claim(s, "inflight", FP1, 100, T0 + 50, &c), LG_CLAIM_IN_PROGRESS);
  assert_int_equal(claim(s, "inflight", FP1, 100, T0 + 100, &c), LG_CLAIM_UNKNOWN_OUTCOME);
  assert_int_equal(lg_store_run_load(s, "survivor", NULL, &run, &err), 0);
  char *env_after = lg_run_envelope_json(run);
  assert_string_equal(env_before, env_after);
  lg_counters_t k;
  lg_run_counters(run, &k);
  assert_int_equal(k.calls, 3);
  lg_free(env_before);
  lg_free(env_after);
  lg_run_free(run);
  lg_canon_free(canon);
  expect_lines(s, "survivor", "{\"type\":\"run\"}\n"); /* the trace survived */
  char *keyed = NULL; /* and the gateway's key of its conversation */
  assert_int_equal(lg__store_gw_key_get(s, "tc:call_9", &keyed, NULL, &err), 0);
  assert_non_null(keyed);
  assert_string_equal(keyed, "survivor");
  lg__free(keyed);
  assert_int_equal(lg_store_denied(s, "survivor", "g", NULL, NULL), 0);
  assert_int_equal(lg_store_cancel_run(s, "survivor", "r", T0 + 20, &err), 0);
  lg_store_close(s);
  *state = s = lgt_open(lgt_url, NULL);
  assert_int_equal(lg_store_denied(s, "survivor", NULL, NULL, NULL), 1);
}

static void test_migration_from_v1(void **state) {
  if (!durable()) skip(); /* memory: has no "after a restart" */
  lg_store_close(*state);
  *state = NULL;
  lgt_fresh_url(lgt_backend);
  /* Write a store as the first release did: the ledger only. */
  lg__store_schema_target = 1;
  lg_store_t *s = lgt_open(lgt_url, NULL);
  lg__store_schema_target = LG_STORE_SCHEMA_VERSION;
  int v = 0;
  assert_int_equal(lg_store_schema_version(s, &v, NULL), 0);
  assert_int_equal(v, 1);
  lg_claim_t c = {0};
  assert_int_equal(claim(s, "v1-key", FP1, 100, T0, &c), LG_CLAIM_CLAIMED);
  commit(s, "v1-key", "\"from v1\"", T0 + 1);
  lg_store_close(s);
  /* This release opens it, migrates it, and keeps its rows. */
  *state = s = lgt_open(lgt_url, NULL);
  assert_int_equal(lg_store_schema_version(s, &v, NULL), 0);
  assert_int_equal(v, LG_STORE_SCHEMA_VERSION);
  assert_int_equal(claim(s, "v1-key", FP1, 100, T0 + 2, &c), LG_CLAIM_REPLAY);
  assert_string_equal(c.result, "\"from v1\"");
  lg_claim_clear(&c);
  save_new_run(s, "after-migration", NULL, T0);
  lg_run_record_t rec;
  assert_int_equal(lg_store_run_get(s, "after-migration", &rec, NULL), 0);
  lg_run_record_clear(&rec);
}

static void test_newer_schema_refused(void **state) {
  if (!durable()) skip(); /* memory: has no "after a restart" */
  lg_store_close(*state);
  *state = NULL;
  lgt_fresh_url(lgt_backend);
  lg_store_close(lgt_open(lgt_url, NULL));
  if (!strcmp(lgt_backend, "sqlite")) {
    sqlite3 *db;
    assert_int_equal(sqlite3_open(lgt_url + 7, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db, "INSERT INTO lg_schema_version VALUES (99, 0)", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
  } else {
    assert_int_equal(lgt_pg_exec("INSERT INTO lg_schema_version VALUES (99, 0)"), 0);
  }
  lg_error_t err = {0};
  assert_null(lg_store_open(lgt_url, NULL, &err));
  assert_int_equal(err.code, LG_ESTORE);
  assert_non_null(strstr(err.message, "schema version 99"));
}

/* ------------------------------------------------------------------ */
/* Keys (gateway-v1 "Keys"): rows, lookup by id or hash, rotation, the    */
/* rate window, and the spend of a key's scope since a time.             */

static int count_key(void *ud, const lg__key_row_t *r) {
  (void)r;
  (*(int *)ud)++;
  return 0;
}

static void test_keys(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  lg__key_row_t k = {.id = FP1, .hash = FP1, .name = "agent-a", .limit_micro = 5000000,
                     .reset = LG_PERIOD_DAILY, .workspace = "acme", .include_byok = 1,
                     .rate_per_min = 2, .models = "[\"m\"]", .byok = "{\"u\":\"pk\"}",
                     .created_ms = T0, .updated_ms = T0};
  assert_int_equal(lg__sql_key_insert(s, &k, &err), 0);
  assert_int_equal(lg__sql_key_insert(s, &k, &err), LG_ECONFLICT);
  lg__key_row_t r = {0};
  int found = 0;
  assert_int_equal(lg__sql_key_read(s, FP1, &r, &found, &err), 0);
  assert_true(found);
  assert_string_equal(r.name, "agent-a");
  assert_int_equal(r.limit_micro, 5000000);
  assert_int_equal(r.reset, LG_PERIOD_DAILY);
  assert_string_equal(r.workspace, "acme");
  assert_int_equal(r.include_byok, 1);
  assert_int_equal(r.rate_per_min, 2);
  assert_string_equal(r.models, "[\"m\"]");
  assert_string_equal(r.byok, "{\"u\":\"pk\"}");
  assert_int_equal(r.disabled, 0);
  lg__key_row_clear(&r);

  /* Rotation: a new hash, the same id; found by either, NULLs kept. */
  lg__key_row_t u = k;
  u.hash = FP2;
  u.workspace = NULL;
  u.limit_micro = -1;
  u.rate_per_min = -1;
  u.disabled = 1;
  u.rotated_ms = T0 + 1;
  int updated = 0;
  assert_int_equal(lg__sql_key_update(s, &u, &updated, &err), 0);
  assert_true(updated);
  assert_int_equal(lg__sql_key_read(s, FP2, &r, &found, &err), 0);
  assert_true(found);
  assert_string_equal(r.id, FP1);
  assert_string_equal(r.hash, FP2);
  assert_null(r.workspace);
  assert_int_equal(r.limit_micro, -1);
  assert_int_equal(r.rate_per_min, -1);
  assert_int_equal(r.disabled, 1);
  assert_int_equal(r.rotated_ms, T0 + 1);
  lg__key_row_clear(&r);
  assert_int_equal(lg__sql_key_read(s, FP1, &r, &found, &err), 0);
  assert_true(found); /* by its id */
  lg__key_row_clear(&r);
  assert_int_equal(lg__sql_key_read(s, "nope", &r, &found, &err), 0);
  assert_false(found);
  u.id = "other";
  assert_int_equal(lg__sql_key_update(s, &u, &updated, &err), 0);
  assert_false(updated);
  int n = 0;
  assert_int_equal(lg__sql_key_list(s, count_key, &n, &err), 0);
  assert_int_equal(n, 1);

  /* The rate window: 2 a minute, a new window after a minute. */
  int ok = 0;
  int64_t start = 0;
  assert_int_equal(lg__sql_key_rate(s, FP1, 2, T0 + 100000, &ok, &start, &err), 0);
  assert_true(ok);
  assert_int_equal(start, T0 + 100000);
  assert_int_equal(lg__sql_key_rate(s, FP1, 2, T0 + 110000, &ok, &start, &err), 0);
  assert_true(ok);
  assert_int_equal(lg__sql_key_rate(s, FP1, 2, T0 + 120000, &ok, &start, &err), 0);
  assert_false(ok);
  assert_int_equal(start, T0 + 100000);
  assert_int_equal(lg__sql_key_rate(s, FP1, 2, T0 + 160000, &ok, &start, &err), 0);
  assert_true(ok);
  assert_int_equal(start, T0 + 160000);

  /* Spend since a time: settled reservations covering the scope only. */
  lg_budget_t b;
  assert_int_equal(lg_budget_set(s, "key:" FP1, 9000000, LG_PERIOD_NONE, -1, T0, &b, &err), 0);
  assert_int_equal(lg_budget_set(s, "workspace:acme", 9000000, LG_PERIOD_NONE, -1, T0, &b, &err), 0);
  const char *both[] = {"workspace:acme", "key:" FP1}, *ws[] = {"workspace:acme"};
  lg_budget_request_t rq = {.scopes = both, .nscopes = 2, .amount_micro = 300};
  lg_budget_reservation_t rv;
  assert_int_equal(lg_budget_reserve(s, &rq, T0 + 10, &rv, NULL, &err), 0);
  assert_int_equal(lg_budget_settle(s, rv.id, 200, T0 + 20, NULL, &err), 0);
  rq.scopes = ws;
  rq.nscopes = 1;
  assert_int_equal(lg_budget_reserve(s, &rq, T0 + 30, &rv, NULL, &err), 0);
  assert_int_equal(lg_budget_settle(s, rv.id, 50, T0 + 40, NULL, &err), 0);
  int64_t micro = -1;
  assert_int_equal(lg__sql_key_spent_since(s, "key:" FP1, T0, &micro, &err), 0);
  assert_int_equal(micro, 200);
  assert_int_equal(lg__sql_key_spent_since(s, "workspace:acme", T0, &micro, &err), 0);
  assert_int_equal(micro, 250);
  assert_int_equal(lg__sql_key_spent_since(s, "key:" FP1, T0 + 21, &micro, &err), 0);
  assert_int_equal(micro, 0);
}

/* The gateway's conversation keys: read back as written, with their data
 * or none, a key put again names the latest run (and its data), a key
 * never put reads as none; a restart keeps them (test_restart). */
static void test_gateway_keys(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  char *run = (char *)"x", *data = (char *)"x";
  assert_int_equal(lg__store_gw_key_get(s, "tc:call_1", &run, &data, &err), 0);
  assert_null(run);
  assert_null(data);
  assert_int_equal(lg__store_gw_key_put(s, "tc:call_1", "run_a", NULL, T0, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "resp:resp_1", "run_a", NULL, T0, &err), 0);
  assert_int_equal(lg__store_gw_key_get(s, "tc:call_1", &run, &data, &err), 0);
  assert_string_equal(run, "run_a");
  assert_null(data);
  lg__free(run);
  assert_int_equal(lg__store_gw_key_put(s, "tc:call_1", "run_b", "{\"prev\":null}", T0 + 1, &err), 0);
  assert_int_equal(lg__store_gw_key_get(s, "tc:call_1", &run, &data, &err), 0);
  assert_string_equal(run, "run_b");
  assert_string_equal(data, "{\"prev\":null}");
  lg__free(run);
  lg__free(data);
  assert_int_equal(lg__store_gw_key_get(s, "resp:resp_1", &run, NULL, &err), 0);
  assert_string_equal(run, "run_a");
  lg__free(run);
}

/* lg_store_purge_runs: the runs not written to since the cut go, each with
 * what is its alone (trace, cancel, budget scopes, conversation keys);
 * the rest stays, and so do the ledger, the budgets and a group's cancel. */
static int note_progress(void *ud, int64_t done) {
  int64_t *last = ud;
  assert_true(done >= *last); /* counts up, batch after batch */
  *last = done;
  return 0;
}

static int stop_at_once(void *ud, int64_t done) {
  *(int64_t *)ud = done;
  return 1;
}

static int has_run(lg_store_t *s, const char *id) {
  lg_run_record_t rec;
  int rc = lg_store_run_get(s, id, &rec, NULL);
  if (!rc) lg_run_record_clear(&rec);
  assert_true(rc == 0 || rc == LG_ENOTFOUND);
  return rc == 0;
}

static int has_key(lg_store_t *s, const char *key) {
  char *run = NULL;
  assert_int_equal(lg__store_gw_key_get(s, key, &run, NULL, NULL), 0);
  int found = run != NULL;
  lg__free(run);
  return found;
}

static void test_purge_runs(void **state) {
  lg_store_t *s = *state;
  lg_error_t err = {0};
  int64_t n = -1;
  /* old: last written at T0; new: at T0 + 10 s; held: old, with an open
   * reservation; a run older than the cut cancelled (its deny row goes),
   * a group's cancel (stays) */
  save_new_run(s, "old-1", "night", T0);
  save_new_run(s, "old-2", NULL, T0 + 1);
  save_new_run(s, "held", NULL, T0);
  save_new_run(s, "new", NULL, T0);
  save_new_run(s, "new", NULL, T0 + 10000); /* written again since */
  /* trace lines enough for a backend to move them out of the run's row */
  char line[1100];
  snprintf(line, sizeof line, "{\"type\":\"call\",\"pad\":\"%01000d\"}\n", 0);
  evctx_t x = {line, 0};
  for (int i = 0; i < 3; i++) assert_int_equal(lg_store_with_run(s, "old-1", append_fn, &x, &err), 0);
  assert_int_equal(lg_store_cancel_run(s, "old-2", "stop", T0 + 1, &err), 0);
  assert_int_equal(lg_store_cancel_group(s, "night", "batch", T0 + 1, NULL, &err), 0);
  assert_int_equal(lg_budget_set(s, "team:a", 1000000, LG_PERIOD_NONE, -1, T0, NULL, &err), 0);
  const char *scopes[] = {"team:a"};
  assert_int_equal(lg_budget_run_scopes_set(s, "old-1", scopes, 1, &err), 0);
  lg_budget_request_t req = {.scopes = scopes, .nscopes = 1, .amount_micro = 5000,
                             .ttl_ms = 3600000, .run_id = "held", .run_seq = 1};
  lg_budget_reservation_t rsv;
  assert_int_equal(lg_budget_reserve(s, &req, T0, &rsv, NULL, &err), 0);
  lg_claim_t c;
  assert_int_equal(lg_store_claim(s, "op-of-old-1", FP1, "old-1", 1000, T0, &c, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "conv:a", "old-1", NULL, T0, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "own:b", "old-2", "{}", T0, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "conv:c", "new", NULL, T0, &err), 0);
  assert_int_equal(lg__store_gw_key_put(s, "conv:d", "never-stored", NULL, T0 + 20000, &err), 0);

  /* A negative age is refused, nothing deleted. */
  assert_int_equal(lg_store_purge_runs(s, -1, T0 + 20000, NULL, NULL, &n, &err), LG_EINVAL);
  assert_int_equal(n, 0);
  assert_true(has_run(s, "old-1"));
  /* Not written for 15 s at T0 + 20 s: the cut is T0 + 5 s. */
  int64_t last = 0;
  assert_int_equal(lg_store_purge_runs(s, 15000, T0 + 20000, note_progress, &last, &n, &err), 0);
  assert_int_equal(n, 2);
  assert_int_equal(last, 2);
  assert_false(has_run(s, "old-1"));
  assert_false(has_run(s, "old-2"));
  assert_true(has_run(s, "held"));
  assert_true(has_run(s, "new"));
  expect_lines(s, "old-1", "");
  assert_int_equal(lg_store_denied(s, "old-2", NULL, NULL, NULL), 0);
  assert_int_equal(lg_store_denied(s, "old-3", "night", NULL, NULL), 1); /* the group's stays */
  char *json = NULL;
  assert_int_equal(lg_budget_run_scopes(s, "old-1", &json, &err), 0);
  assert_string_equal(json, "[]");
  lg_free(json);
  assert_false(has_key(s, "conv:a"));
  assert_false(has_key(s, "own:b"));
  assert_true(has_key(s, "conv:c"));
  assert_true(has_key(s, "conv:d")); /* newer than the cut: its run may be on its way */
  lg_operation_t op;
  assert_int_equal(lg_store_operation(s, "op-of-old-1", T0 + 20000, &op, &err), 0);
  lg_operation_clear(&op);
  /* The reservation settled: its run goes with the next purge. */
  assert_int_equal(lg_budget_settle(s, rsv.id, 4000, T0 + 1, NULL, &err), 0);
  assert_int_equal(lg_store_purge_runs(s, 15000, T0 + 20000, NULL, NULL, &n, &err), 0);
  assert_int_equal(n, 1);
  assert_false(has_run(s, "held"));
  lg_budget_t b;
  assert_int_equal(lg_budget_get(s, "team:a", T0 + 20000, &b, &err), 0);
  assert_int_equal(b.spent_micro, 4000);
  /* Age 0: every run not written after now. */
  assert_int_equal(lg_store_purge_runs(s, 0, T0 + 9999, NULL, NULL, &n, &err), 0);
  assert_int_equal(n, 0);
  assert_int_equal(lg_store_purge_runs(s, 0, T0 + 10000, NULL, NULL, &n, &err), 0);
  assert_int_equal(n, 1);
  assert_false(has_run(s, "new"));
  /* Many runs: batches, each counted. */
  char id[32];
  for (int i = 0; i < 700; i++) {
    snprintf(id, sizeof id, "many-%d", i);
    save_new_run(s, id, NULL, T0 + i % 3);
  }
  save_new_run(s, "young", NULL, T0 + 30000);
  /* Stopped by its caller after the first batch: that batch is purged,
   * the rest kept, no error. */
  last = 0;
  assert_int_equal(lg_store_purge_runs(s, 1000, T0 + 30000, stop_at_once, &last, &n, &err), 0);
  assert_int_equal(n, 256);
  assert_int_equal(last, 256);
  assert_false(has_run(s, "many-0"));
  assert_true(has_run(s, "many-698"));
  last = 0;
  assert_int_equal(lg_store_purge_runs(s, 1000, T0 + 30000, note_progress, &last, &n, &err), 0);
  assert_int_equal(n, 700 - 256);
  assert_int_equal(last, 700 - 256);
  assert_false(has_run(s, "many-0"));
  assert_false(has_run(s, "many-699"));
  assert_true(has_run(s, "young"));
  /* The store goes on: a purged run's id is free for a new run. */
  save_new_run(s, "old-1", NULL, T0 + 40000);
  expect_lines(s, "old-1", "");
  x.lines = "{\"type\":\"call\"}\n";
  assert_int_equal(lg_store_with_run(s, "old-1", append_fn, &x, &err), 0);
  expect_lines(s, "old-1", "{\"type\":\"call\"}\n");
  assert_true(has_run(s, "old-1"));
}

/* ------------------------------------------------------------------ */

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_open),
      T(test_redacted_name),
      T(test_claim_then_in_progress),
      T(test_commit_replays),
      T(test_binary_safe_result),
      T(test_failures),
      T(test_unknown_keys),
      T(test_invalid_arguments),
      T(test_lease_expiry_is_unknown_outcome),
      T(test_default_lease),
      T(test_operation_show),
      T(test_retention_and_purge),
      T(test_retention_reclaim),
      T(test_ledger_interface),
      T(test_engine_replays_through_store),
      T(test_lease_saturates),
      T(test_who_may_undo),
      T(test_derived_key_fixed_length),
      T(test_run_records),
      T(test_run_list),
      T(test_with_run),
      T(test_run_reads_are_fresh),
      T(test_run_save_load),
      T(test_cancel_run),
      T(test_cancel_group),
      T(test_deny_in_transaction),
      T(test_sqlite_durability),
      T(test_url_busy_timeout),
      T(test_reads_do_not_wait),
      T(test_cache_bounded),
      T(test_events),
      T(test_with_run_born),
      T(test_sqlite_counts_nothing),
      T(test_keys),
      T(test_gateway_keys),
      T(test_purge_runs),
      /* The durable backends only (memory: skips them). */
      T(test_restart),
      T(test_migration_from_v1),
      T(test_newer_schema_refused),
  };
  const char *names[LGT_MAX_BACKENDS];
  int n = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char group[64];
    lgt_backend = names[i];
    snprintf(group, sizeof group, "store conformance: %s", names[i]);
    failed += cmocka_run_group_tests_name(group, tests, NULL, NULL);
  }
  return failed ? 1 : 0;
}
