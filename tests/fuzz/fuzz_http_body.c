/*
 * fuzz_http_body.c — libFuzzer target for the server's request bodies
 * (lg__body_parse in src/server/body.c), which read bytes straight off the
 * network.
 *
 * The first byte picks the endpoint (calls, results, runs, ...); the rest
 * is the body, given without a terminating NUL so that a read past the end
 * is caught by ASan. Invariants beyond "no crash, no sanitizer report":
 *   - a rejected body is one of the documented codes, with a message that
 *     starts with the field it names (the client is told which field);
 *   - an accepted body holds what the endpoint needs: required fields are
 *     there, JSON values of the right type, counts not negative;
 *   - values the server writes into traces (args, value, world, result)
 *     print as JSON that the canonicaliser accepts.
 */
#include "loopguard.h"
#include "server/server.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

static lg_canon_t *C;

static void printable(const json_t *v, const uint8_t *data, size_t size) {
  if (!v) return;
  size_t n = 0;
  char *text = lg__json_text(v, &n);
  check(text != NULL, "a value prints as JSON", data, size);
  const char *out;
  size_t ol;
  lg_error_t err;
  /* jansson's output is JSON the canonicaliser must take: the body parser
   * refuses what is nested deeper than it (and so replay) accepts. */
  int rc = lg_canon_json(C, text, n, &out, &ol, &err);
  check(rc == 0, "a printed value canonicalises", data, size);
  lg__free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!C && !(C = lg_canon_new())) abort();
  if (size < 1) return 0;
  lg__body_kind_t kind = (lg__body_kind_t)(data[0] % LG__B__COUNT);
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  char *copy = malloc(len ? len : 1); /* exactly len bytes: no NUL after */
  if (!copy) return 0;
  memcpy(copy, text, len);
  lg__body_t b;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg__body_parse(kind, copy, len, &b, &err);
  if (rc) {
    check(rc == LG_EPARSE || rc == LG_EINVAL || rc == LG_EDUPKEY || rc == LG_ENOMEM,
          "an error code of the contract", data, size);
    check(err.message[0] != 0, "an error has a message", data, size);
    check(err.field[0] != 0, "an error names a field", data, size);
    check(rc == LG_ENOMEM || !strncmp(err.message, err.field, strlen(err.field)) ||
              !strncmp(err.message, "unknown field", 13),
          "the message starts with the field", data, size);
    check(b.root == NULL, "a failed parse holds nothing", data, size);
  } else {
    check(json_is_object(b.root), "the body is an object", data, size);
    switch (kind) {
    case LG__B_CALL: check(b.tool && *b.tool, "a call has a tool", data, size); break;
    case LG__B_STATE: check(json_is_object(b.world), "state has a world object", data, size); break;
    case LG__B_HANDOFF: check(b.from && b.to, "a handoff has from and to", data, size); break;
    case LG__B_MODEL: check(b.input_tokens >= 0, "input_tokens", data, size); break;
    case LG__B_USAGE:
      check(b.input_tokens >= 0 && b.output_tokens >= 0, "usage tokens", data, size);
      break;
    case LG__B_CLAIM: check(b.key && b.request_fp, "a claim has key and fingerprint", data, size); break;
    case LG__B_COMMIT: check(b.result != NULL, "a commit has a result", data, size); break;
    case LG__B_FAIL: check(b.retryable == 0 || b.retryable == 1, "fail has retryable", data, size); break;
    default: break;
    }
    check(!b.args || json_is_object(b.args), "args is an object", data, size);
    check(!b.policy || json_is_object(b.policy), "policy is an object", data, size);
    check(!b.has_cost || b.cost_nusd >= 0, "cost is not negative", data, size);
    check(b.retry_after_ms >= -1 && b.lease_ms >= -1 && b.max_tokens >= -1, "counts", data, size);
    /* Every number accepted is inside body.c's range table. */
    static const struct {
      const char *name;
      size_t off;
    } ints[] = {{"retry_after_ms", offsetof(lg__body_t, retry_after_ms)},
                {"input_tokens", offsetof(lg__body_t, input_tokens)},
                {"output_tokens", offsetof(lg__body_t, output_tokens)},
                {"max_tokens", offsetof(lg__body_t, max_tokens)},
                {"lease_ms", offsetof(lg__body_t, lease_ms)},
                {"ttl_ms", offsetof(lg__body_t, ttl_ms)}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
      int64_t v = *(const int64_t *)((const char *)&b + ints[i].off);
      for (const lg__range_t *g = lg__body_ranges(); g->field; g++)
        if (!strcmp(g->field, ints[i].name))
          check(v == -1 || (v >= g->lo && v <= g->hi), ints[i].name, data, size);
    }
    if (b.has_turn) check(b.turn >= 0 && b.turn <= 9007199254740992LL, "turn", data, size);
    if (b.has_progress_version)
      check(b.progress_version >= -9007199254740992LL && b.progress_version <= 9007199254740992LL,
            "progress_version", data, size);
    check(!b.has_cost || b.cost_nusd <= 1000000000LL * 1000000000LL, "cost_usd", data, size);
    check(b.amount_usd >= 0 && b.amount_usd <= 1e9 && b.actual_usd >= 0 && b.actual_usd <= 1e9 &&
              b.limit_usd >= 0 && b.limit_usd <= 1e12,
          "USD amounts", data, size);
    printable(b.args, data, size);
    printable(b.value, data, size);
    printable(b.world, data, size);
    printable(b.result, data, size);
    if (b.policy) { /* what POST /v1/runs does with it */
      size_t n;
      char *ptext = lg__json_text(b.policy, &n);
      lg_policy_t *p = ptext ? lg_policy_parse(ptext, n, "fuzz", &err) : NULL;
      lg_policy_free(p);
      lg__free(ptext);
    }
  }
  lg__body_clear(&b);
  check(b.root == NULL, "clear releases the document", data, size);
  free(copy);
  return 0;
}
