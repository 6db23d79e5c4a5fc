/*
 * fuzz_canon.c — libFuzzer target for the canonicaliser: lg_canon_json and
 * lg_canon_fingerprint with a fixed normalizer policy on arbitrary bytes.
 *
 * Beyond "no crash, no sanitizer report", it checks invariants that hold
 * for every input:
 *   - an accepted input's canonical form is a fixed point: canonicalising
 *     it again gives the same bytes;
 *   - a rejected input fails with a parse-class code whose offset lies
 *     inside the input;
 *   - a tool the policy does not narrow gets exactly the canonical form as
 *     key material, and the same verdict;
 *   - a tool that selects fields rejects non-objects with LG_EINVAL and
 *     otherwise accepts exactly what lg_canon_json accepts (dropped fields
 *     are still validated), with canonical key material and
 *     fingerprint = sha256(tool "\n" key material);
 *   - its normalizers are idempotent: the key material fingerprinted again
 *     gives the same key material.
 */
#include "loopguard.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

static lg_canon_t *C;
static lg_policy_t *P;

/* "t" selects and normalizes (idempotent chains only, so that the key
 * material is a fixed point of its own loop key); "s" has a chain that is
 * not idempotent (strip_prefix, then upper). Field names with an escape,
 * a quote and non-ASCII take the slow comparison. */
static const char POLICY[] =
    "{\"tools\":{"
    "\"t\":{\"loop_key\":{\"a\":[\"lower\",\"trim\",\"collapse_space\"],\"b\":[\"digits\"],"
    "\"c\":[\"upper\"],\"caf\\u00e9\":[\"trim\"],\"k\\\"q\":[],\"\\ud83d\\ude00\":[\"lower\"],"
    "\"n\":[\"collapse_space\",\"trim\",\"upper\"]}},"
    "\"s\":{\"loop_key\":{\"a\":[\"strip_prefix:INV-\",\"upper\"],\"b\":[\"strip_prefix:\\u00e9\"]}},"
    "\"l\":{\"loop_key\":[\"a\",\"z\"]},"
    "\"off\":{\"loop_key\":false}}}";

static char *dup_bytes(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) abort();
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  C = lg_canon_new();
  P = lg_policy_parse(POLICY, strlen(POLICY), "fuzz_canon", &err);
  if (!C || !P) {
    fprintf(stderr, "fuzz_canon: setup failed: %s %s\n", err.field, err.message);
    abort();
  }
  return 0;
}

/* Fingerprints with a selecting tool and checks what must hold. */
static void selecting(const char *tool, const char *in, size_t size, int rc, long off,
                      bool object, bool idempotent, const uint8_t *data) {
  char hex[LG_FP_HEX], want[LG_FP_HEX];
  const char *km;
  size_t kl;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rs = lg_canon_fingerprint(C, P, tool, in, size, hex, &km, &kl, &err);
  if (!object) {
    check(rs == LG_EINVAL, "selecting from a non-object is LG_EINVAL", data, size);
    return;
  }
  check(rs == rc, "selecting accepts what lg_canon_json accepts", data, size);
  if (rs) {
    check(err.offset == off, "same error offset when selecting", data, size);
    return;
  }
  check(kl >= 2 && km[0] == '{' && km[kl - 1] == '}', "key material is an object", data, size);
  char *k = dup_bytes(km, kl);
  size_t tl = strlen(tool);
  char *msg = malloc(tl + 1 + kl);
  if (!msg) abort();
  memcpy(msg, tool, tl);
  msg[tl] = '\n';
  memcpy(msg + tl + 1, k, kl);
  check(lg_canon_sha256_hex(C, msg, tl + 1 + kl, want) == 0 && !strcmp(want, hex),
        "fingerprint is sha256(tool \\n key material)", data, size);
  free(msg);
  const char *o;
  size_t ol;
  check(lg_canon_json(C, k, kl, &o, &ol, NULL) == 0 && ol == kl && !memcmp(o, k, kl),
        "key material is canonical", data, size);
  if (idempotent) {
    char hex2[LG_FP_HEX];
    check(lg_canon_fingerprint(C, P, tool, k, kl, hex2, &o, &ol, NULL) == 0 && ol == kl &&
              !memcmp(o, k, kl) && !strcmp(hex, hex2),
          "loop key of the key material is itself", data, size);
  }
  free(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!C) LLVMFuzzerInitialize(NULL, NULL);
  const char *in = (const char *)data;
  const char *out;
  size_t ol;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  int rc = lg_canon_json(C, in, size, &out, &ol, &err);
  long off = err.offset;
  char *canon = NULL;
  size_t cl = 0;
  if (rc == 0) {
    canon = dup_bytes(out, ol);
    cl = ol;
    check(lg_canon_json(C, canon, cl, &out, &ol, NULL) == 0 && ol == cl &&
              !memcmp(out, canon, cl),
          "canonical form is a fixed point", data, size);
  } else {
    check(rc == LG_EPARSE || rc == LG_EUTF8 || rc == LG_EDEPTH || rc == LG_ERANGE ||
              rc == LG_EDUPKEY,
          "a parse-class error code", data, size);
    check(err.code == rc && err.message[0], "err filled", data, size);
    check(off >= 0 && (size_t)off <= size, "error offset inside the input", data, size);
  }

  /* Tools that do not narrow the key: the canonical form, same verdict. */
  static const char *whole[] = {"other", "off"};
  for (int i = 0; i < 2; i++) {
    char hex[LG_FP_HEX];
    const char *km;
    size_t kl;
    memset(&err, 0, sizeof err);
    int rf = lg_canon_fingerprint(C, P, whole[i], in, size, hex, &km, &kl, &err);
    check(rf == rc, "fingerprint and lg_canon_json agree", data, size);
    if (rf == 0) check(kl == cl && !memcmp(km, canon, cl), "key material = canonical", data, size);
    else check(err.offset == off, "same error offset", data, size);
  }

  size_t i = 0;
  while (i < size && (in[i] == ' ' || in[i] == '\t' || in[i] == '\n' || in[i] == '\r')) i++;
  bool object = i < size && in[i] == '{';
  selecting("t", in, size, rc, off, object, true, data);
  selecting("s", in, size, rc, off, object, false, data);
  selecting("l", in, size, rc, off, object, true, data);
  free(canon);
  return 0;
}
