/*
 * fuzz_policy.c — libFuzzer target for lg_policy_parse.
 *
 * Invariants beyond "no crash, no sanitizer report":
 *   - a rejected policy is LG_EPOLICY with a message;
 *   - an accepted policy prints (lg_policy_to_json) as JSON that parses
 *     back to a policy printing the same bytes;
 *   - every tool it names can fingerprint a fixed argument object with its
 *     loop key (normalizers with arbitrary prefixes included), and the key
 *     material is canonical.
 */
#include "loopguard.h"
#include "policy/policy.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

static lg_canon_t *C;

static const char ARGS[] =
    "{\"q\":\"  Hello   World \",\"invoice_id\":\"INV-22\\u00e991\",\"id\":\"inv-7\","
    "\"customer_id\":12345678901234567890,\"n\":[1,{\"b\":2,\"a\":\" x \"}],"
    "\"caf\\u00e9\":\"\\ud800 \\t\",\"\":\"\",\"a\":\"A\",\"b\":\"b\",\"f\":null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!C && !(C = lg_canon_new())) abort();
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse((const char *)data, size, "fuzz", &err);
  if (!p) {
    check(err.code == LG_EPOLICY && err.message[0], "rejected as LG_EPOLICY", data, size);
    return 0;
  }
  char *s = lg_policy_to_json(p);
  check(s != NULL, "lg_policy_to_json", data, size);
  memset(&err, 0, sizeof err);
  lg_policy_t *q = lg_policy_parse(s, strlen(s), "round trip", &err);
  if (!q) fprintf(stderr, "printed: %s\nerror: %s: %s\n", s, err.field, err.message);
  check(q != NULL, "printed policy parses back", data, size);
  char *s2 = lg_policy_to_json(q);
  check(s2 && !strcmp(s, s2), "printed policy prints the same", data, size);
  for (int i = 0; i < p->ntools; i++) {
    char hex[LG_FP_HEX];
    const char *km, *o;
    size_t kl, ol;
    int rc = lg_canon_fingerprint(C, p, p->tools[i].name, ARGS, sizeof ARGS - 1, hex, &km, &kl,
                                  NULL);
    check(rc == 0, "fingerprint with the policy's loop key", data, size);
    char *k = malloc(kl + 1);
    if (!k) abort();
    memcpy(k, km, kl);
    check(lg_canon_json(C, k, kl, &o, &ol, NULL) == 0 && ol == kl && !memcmp(o, k, kl),
          "key material is canonical", data, size);
    free(k);
  }
  lg_free(s);
  lg_free(s2);
  lg_policy_free(q);
  lg_policy_free(p);
  return 0;
}
