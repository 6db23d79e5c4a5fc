/*
 * fuzz_keys.c — libFuzzer target for the bodies of loopguard keys' routes
 * (POST /v1/keys, PATCH /v1/keys/{hash}: lg_key_create, lg_key_update in
 * src/budget/keys.c), on a memory: store; in open mode any process on the
 * machine may send them.
 *
 * Input: one byte of choices (bit 0: the store seals byok under a
 * secret), then the creation body, then, after a NUL byte, an update body
 * (none: the creation body again). Bodies are given without a terminating
 * NUL, so that a read past the end is caught by ASan.
 * Invariants beyond "no crash, no sanitizer report, no leak":
 *   - a refused body is LG_EPARSE, LG_EINVAL or LG_ERANGE (an amount past
 *     the largest) with a message, the last two naming the field; nothing
 *     else (a store error here is a bug);
 *   - a created key's answer is a JSON object with the secret ("lgk-"
 *     and 40 characters, shown once), its hash (64 hex digits, the
 *     secret's SHA-256 hex) and the body's name, as given;
 *   - what creation accepted, an update accepts (PATCH takes any
 *     creation field), and it changes nothing that GET shows;
 *   - an update refused leaves the key as it was (GET shows the same):
 *     nothing half-written.
 */
#include "loopguard.h"

#include <jansson.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

#define NOW 1764547200000LL /* 2025-12-01T00:00:00Z: every answer's times are the same */

static lg_store_t *S[2]; /* byok in clear, byok sealed */
static int created;     /* keys created in them */

static void close_stores(void) {
  lg_store_close(S[0]);
  lg_store_close(S[1]);
  S[0] = S[1] = NULL;
}

/* Two empty stores, the second with a secret; the old ones closed (every
 * key a store keeps is memory, and the fuzzer creates thousands). */
static void fresh_stores(void) {
  close_stores();
  lg_error_t e;
  S[0] = lg_store_open("memory:", NULL, &e);
  S[1] = lg_store_open("memory:", NULL, &e);
  if (!S[0] || !S[1]) abort();
  unsigned char secret[LG_KEY_SECRET_BYTES];
  memset(secret, 7, sizeof secret);
  lg_key_set_secret(S[1], secret);
  created = 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  fresh_stores();
  atexit(close_stores);
  return 0;
}

/* A refusal as documented. */
static void refused(int rc, const lg_error_t *e, const uint8_t *data, size_t size) {
  check(rc == LG_EINVAL || rc == LG_EPARSE || rc == LG_ERANGE,
        "a body is refused as LG_EINVAL, LG_EPARSE or LG_ERANGE", data, size);
  check(e->message[0] != 0, "a refusal says why", data, size);
  check(rc == LG_EPARSE || e->field[0] != 0, "a refused field is named", data, size);
}

/* GET /v1/keys/{hash}: its answer (new), which must be there. */
static char *show(lg_store_t *s, const char *hash, const uint8_t *data, size_t size) {
  char *out = NULL;
  lg_error_t e = {0};
  check(lg_key_show(s, hash, NOW, &out, &e) == 0 && out, "a created key is shown", data, size);
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (created >= 500) fresh_stores();
  lg_store_t *s = S[data[0] & 1];
  const uint8_t *body = data + 1, *nul = memchr(body, 0, size - 1);
  size_t blen = nul ? (size_t)(nul - body) : size - 1;
  const uint8_t *upd = nul ? nul + 1 : body;
  size_t ulen = nul ? size - 1 - blen - 1 : blen;
  char *b = malloc(blen ? blen : 1), *u = malloc(ulen ? ulen : 1);
  if (!b || !u) abort();
  memcpy(b, body, blen);
  memcpy(u, upd, ulen);

  char *out = NULL;
  lg_error_t e = {0};
  int rc = lg_key_create(s, b, blen, NOW, &out, &e);
  if (rc) {
    check(out == NULL, "a refused body has no answer", data, size);
    refused(rc, &e, data, size);
    goto done;
  }
  created++;
  json_t *k = json_loads(out, 0, NULL);
  check(json_is_object(k), "a created key's answer is a JSON object", data, size);
  const char *secret = json_string_value(json_object_get(k, "key"));
  const char *hash = json_string_value(json_object_get(k, "hash"));
  check(secret && !strncmp(secret, LG_KEY_PREFIX, 4) && strlen(secret) == 44,
        "the secret is lgk- and 40 characters", data, size);
  check(hash && strlen(hash) == 64 && strspn(hash, "0123456789abcdef") == 64, "the hash is 64 hex digits",
        data, size);
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)secret, strlen(secret), md);
  char hex[65];
  for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  check(!strcmp(hex, hash), "the hash is the secret's SHA-256", data, size);
  /* the name as given (jansson reads the body as the server did) */
  json_t *in = json_loadb(b, blen, 0, NULL), *name = json_object_get(in, "name");
  check(json_is_string(name) && json_equal(name, json_object_get(k, "name")),
        "the key's name is the body's, as given", data, size);
  json_decref(in);

  char *before = show(s, hash, data, size), *out2 = NULL;
  lg_error_t e2 = {0};
  int urc = lg_key_update(s, hash, b, blen, NOW, &out2, &e2);
  check(urc == 0, "an update accepts what creation accepted", data, size);
  lg_free(out2);
  out2 = NULL;
  char *again = show(s, hash, data, size);
  check(!strcmp(before, again), "an update with the creation's own fields changes nothing shown", data,
        size);
  lg_free(again);
  if (nul) { /* the update body */
    memset(&e2, 0, sizeof e2);
    urc = lg_key_update(s, hash, u, ulen, NOW, &out2, &e2);
    if (urc) {
      check(out2 == NULL, "a refused update has no answer", data, size);
      refused(urc, &e2, data, size);
      char *after = show(s, hash, data, size);
      check(!strcmp(before, after), "a refused update leaves the key as it was", data, size);
      lg_free(after);
    }
    lg_free(out2);
  }
  lg_free(before);
  json_decref(k);
done:
  lg_free(out);
  free(b);
  free(u);
  return 0;
}
