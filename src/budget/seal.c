/*
 * seal.c — a loopguard key's own provider keys (byok) at rest.
 *
 * The spec is silent on how a provider key is stored (docs/spec-notes.md);
 * several replicas share the store, so a provider key is sealed with
 * AES-256-GCM under the server's secret (--secret-file, 32 random bytes
 * or 64 hex digits; every replica is given the same file). A sealed value
 * is "lgenc:v1:" and the base64 of nonce (12) | ciphertext | tag (16). The
 * AES key is HMAC-SHA256(secret, "loopguard byok v1"), so that the file
 * may one day key other things; the additional data is the key's id and
 * the upstream's name, so that a sealed value moved to another key or
 * another upstream does not open. A wrong secret and an altered value are
 * the same failure to the cipher: LG_EPERM, never bytes sent upstream.
 *
 * Without a secret, provider keys are stored as they are (and a key shows
 * "byok_at_rest": "clear"); a sealed value cannot be opened then.
 */
#include "budget.h"
#include "../util/utf8.h"
#include "../store/store.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>

#define NONCE 12
#define TAG 16

int lg__byok_is_sealed(const char *v) {
  return v && !strncmp(v, LG__BYOK_SEALED, sizeof LG__BYOK_SEALED - 1);
}

int lg_key_secret_load(const char *path, unsigned char secret[LG_KEY_SECRET_BYTES],
                       lg_error_t *err) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) {
    lg__err(err, LG_EIO, "secret_file", -1, "cannot open the secret file: %s",
            strerror(path ? errno : EINVAL));
    lg__err_where(err, path ? path : "(none)", 0);
    return LG_EIO;
  }
  unsigned char buf[160];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  int rc = 0;
  if (n == LG_KEY_SECRET_BYTES) {
    memcpy(secret, buf, LG_KEY_SECRET_BYTES); /* 32 raw bytes */
  } else {
    size_t m = n;
    while (m && (buf[m - 1] == '\n' || buf[m - 1] == '\r' || buf[m - 1] == ' ')) m--;
    int ok = m == 2 * LG_KEY_SECRET_BYTES;
    for (size_t i = 0; ok && i < LG_KEY_SECRET_BYTES; i++) {
      int hi = lg__hexval((unsigned char)buf[2 * i]), lo = lg__hexval((unsigned char)buf[2 * i + 1]);
      if (hi < 0 || lo < 0) ok = 0;
      else secret[i] = (unsigned char)(hi << 4 | lo);
    }
    if (!ok) {
      rc = lg__err(err, LG_EINVAL, "secret_file", -1,
                   "the secret file must hold 32 random bytes or 64 hex digits (make one with "
                   "`openssl rand -hex 32 > FILE`); it holds %zu%s bytes",
                   n, n == sizeof buf ? " or more" : "");
      lg__err_where(err, path, 0);
    }
  }
  OPENSSL_cleanse(buf, sizeof buf);
  return rc;
}

void lg_key_set_secret(lg_store_t *s, const unsigned char secret[LG_KEY_SECRET_BYTES]) {
  if (!secret) {
    OPENSSL_cleanse(s->key_secret, sizeof s->key_secret);
    s->has_key_secret = 0;
    return;
  }
  unsigned int len = sizeof s->key_secret;
  static const char info[] = "loopguard byok v1";
  s->has_key_secret = HMAC(EVP_sha256(), secret, LG_KEY_SECRET_BYTES,
                           (const unsigned char *)info, sizeof info - 1, s->key_secret, &len) &&
                      len == sizeof s->key_secret;
}

int lg_key_has_secret(const lg_store_t *s) { return s->has_key_secret; }

/* The additional data: the key's id and the upstream, each ended by a 0. */
static int put_aad(EVP_CIPHER_CTX *c, const char *key_id, const char *upstream) {
  int n;
  return EVP_EncryptUpdate(c, NULL, &n, (const unsigned char *)key_id, (int)strlen(key_id) + 1) &&
         EVP_EncryptUpdate(c, NULL, &n, (const unsigned char *)upstream,
                           (int)strlen(upstream) + 1);
}
static int put_aad_dec(EVP_CIPHER_CTX *c, const char *key_id, const char *upstream) {
  int n;
  return EVP_DecryptUpdate(c, NULL, &n, (const unsigned char *)key_id, (int)strlen(key_id) + 1) &&
         EVP_DecryptUpdate(c, NULL, &n, (const unsigned char *)upstream,
                           (int)strlen(upstream) + 1);
}

int lg__byok_seal(const unsigned char key[32], const char *key_id, const char *upstream,
                  const char *plain, char **out, lg_error_t *err) {
  *out = NULL;
  size_t pl = strlen(plain);
  if (pl > 8192) return lg__err(err, LG_EINVAL, "byok", -1, "a provider key of over 8 KiB");
  unsigned char *raw = lg__malloc(NONCE + pl + TAG);
  char *b64 = lg__malloc(sizeof LG__BYOK_SEALED + 4 * ((NONCE + pl + TAG + 2) / 3) + 1);
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  int n = 0, f = 0;
  int ok = raw && b64 && c && RAND_bytes(raw, NONCE) == 1 &&
           EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, raw) && put_aad(c, key_id, upstream) &&
           EVP_EncryptUpdate(c, raw + NONCE, &n, (const unsigned char *)plain, (int)pl) &&
           EVP_EncryptFinal_ex(c, raw + NONCE + n, &f) &&
           EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG, raw + NONCE + n + f);
  EVP_CIPHER_CTX_free(c);
  if (ok) {
    memcpy(b64, LG__BYOK_SEALED, sizeof LG__BYOK_SEALED - 1);
    EVP_EncodeBlock((unsigned char *)b64 + sizeof LG__BYOK_SEALED - 1, raw,
                    (int)(NONCE + (size_t)n + (size_t)f + TAG));
    *out = b64;
  } else {
    lg__free(b64);
  }
  if (raw) OPENSSL_cleanse(raw, NONCE + pl + TAG);
  lg__free(raw);
  return ok ? 0 : lg__err(err, b64 && raw ? LG_EIO : LG_ENOMEM, "byok", -1,
                          "could not seal a provider key (OpenSSL)");
}

int lg__byok_open(const unsigned char key[32], const char *key_id, const char *upstream,
                  const char *sealed, char **out, lg_error_t *err) {
  *out = NULL;
  if (!lg__byok_is_sealed(sealed)) /* first: a shorter string has no bytes past the prefix */
    return lg__err(err, LG_EPERM, "byok", -1, "not a sealed provider key");
  const char *b = sealed + sizeof LG__BYOK_SEALED - 1;
  size_t bl = strlen(b);
  if (bl % 4 || bl < 4) return lg__err(err, LG_EPERM, "byok", -1, "not a sealed provider key");
  unsigned char *raw = lg__malloc(bl / 4 * 3 + 1);
  if (!raw) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  int rl = EVP_DecodeBlock(raw, (const unsigned char *)b, (int)bl);
  if (rl > 0 && b[bl - 1] == '=') rl--;
  if (rl > 0 && b[bl - 2] == '=') rl--;
  int ok = rl >= NONCE + TAG;
  size_t cl = ok ? (size_t)rl - NONCE - TAG : 0;
  char *plain = ok ? lg__malloc(cl + 1) : NULL;
  EVP_CIPHER_CTX *c = ok ? EVP_CIPHER_CTX_new() : NULL;
  int n = 0, f = 0;
  ok = ok && plain && c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, raw) &&
       put_aad_dec(c, key_id, upstream) &&
       EVP_DecryptUpdate(c, (unsigned char *)plain, &n, raw + NONCE, (int)cl) &&
       EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG, raw + NONCE + cl) &&
       EVP_DecryptFinal_ex(c, (unsigned char *)plain + n, &f) == 1;
  EVP_CIPHER_CTX_free(c);
  OPENSSL_cleanse(raw, bl / 4 * 3 + 1);
  lg__free(raw);
  if (!ok) {
    if (plain) OPENSSL_cleanse(plain, cl + 1);
    lg__free(plain);
    return lg__err(err, LG_EPERM, "byok", -1,
                   "the sealed provider key does not open with this secret (another "
                   "--secret-file, or the row was altered)");
  }
  plain[n + f] = 0;
  *out = plain;
  return 0;
}
