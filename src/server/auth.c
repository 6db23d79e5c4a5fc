/*
 * auth.c — bearer tokens and their roles (http-api-v1, "Auth").
 *
 * Tokens come from a file ("ROLE TOKEN" a line, # comments) or from the
 * environment form ("ROLE TOKEN;ROLE TOKEN"). Only the SHA-256 digest of
 * each token is kept: a presented token is hashed and compared with every
 * configured digest through CRYPTO_memcmp, without stopping at a match, so
 * the time taken says neither whether nor which token matched (hashing
 * first also makes the comparison independent of the token's length).
 * Error messages name the file and line of a bad entry, never the token.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static void sha256(const char *s, size_t n, uint8_t out[32]) {
  unsigned int len = 32;
  if (!EVP_Digest(s, n, out, &len, EVP_sha256(), NULL)) memset(out, 0, 32);
}

static int role_of(const char *s, size_t n) {
  if (n == 5 && !memcmp(s, "agent", 5)) return LG__ROLE_AGENT;
  if (n == 8 && !memcmp(s, "operator", 8)) return LG__ROLE_OPERATOR;
  return LG__ROLE_NONE;
}

static bool sp(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* One "ROLE TOKEN" entry [s, s+n): adds it; blank and # lines are skipped. */
static int add_entry(lg__auth_t *a, const char *s, size_t n, const char *source, long line,
                     lg_error_t *err) {
  while (n && sp(*s)) s++, n--;
  while (n && sp(s[n - 1])) n--;
  if (!n || *s == '#') return 0;
  size_t i = 0;
  while (i < n && !sp(s[i])) i++;
  int role = role_of(s, i);
  size_t j = i;
  while (j < n && sp(s[j])) j++;
  const char *tok = s + j;
  size_t tl = n - j;
  int rc = 0;
  if (!role)
    rc = lg__err(err, LG_EINVAL, "tokens", -1,
                 "an entry must start with the role \"agent\" or \"operator\", then the token");
  else if (!tl)
    rc = lg__err(err, LG_EINVAL, "tokens", -1, "the entry has a role but no token");
  else if (tl < 16)
    rc = lg__err(err, LG_EINVAL, "tokens", -1,
                 "the token is shorter than 16 characters; use a long random token");
  else
    for (size_t k = 0; k < tl && !rc; k++)
      if (sp(tok[k]) || (unsigned char)tok[k] < 0x21 || tok[k] == 0x7f)
        rc = lg__err(err, LG_EINVAL, "tokens", -1,
                     "a token is one word of printable characters");
  if (rc) {
    lg__err_where(err, source, line);
    return rc;
  }
  lg__token_t *t = lg__realloc(a->tok, (a->n + 1) * sizeof *t);
  if (!t) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  a->tok = t;
  sha256(tok, tl, t[a->n].digest);
  t[a->n].role = role;
  a->n++;
  return 0;
}

int lg__auth_load_spec(lg__auth_t *a, const char *spec, const char *source, lg_error_t *err) {
  long entry = 0;
  for (const char *p = spec; p && *p;) {
    const char *end = strchr(p, ';');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    int rc = add_entry(a, p, n, source, ++entry, err);
    if (rc) return rc;
    p = end ? end + 1 : p + n;
  }
  return 0;
}

int lg__auth_load_file(lg__auth_t *a, const char *path, lg_error_t *err) {
  FILE *f = fopen(path, "r");
  if (!f) {
    lg__err(err, LG_EIO, "tokens", -1, "cannot open the tokens file: %s", strerror(errno));
    lg__err_where(err, path, 0);
    return LG_EIO;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  long no = 0;
  int rc = 0;
  size_t before = a->n;
  while (!rc && (n = getline(&line, &cap, f)) >= 0) {
    no++;
    if (n && line[n - 1] == '\n') n--;
    rc = add_entry(a, line, (size_t)n, path, no, err);
  }
  if (line) {
    /* The buffer held a token: clear it before giving it back. */
    OPENSSL_cleanse(line, cap);
    free(line);
  }
  fclose(f);
  if (!rc && a->n == before) {
    lg__err(err, LG_EINVAL, "tokens", -1, "the tokens file has no token in it");
    lg__err_where(err, path, 0);
    return LG_EINVAL;
  }
  return rc;
}

static const char *const key_headers[] = {"x-api-key", "api-key"};

size_t lg__auth_key_header(const char *h) {
  for (size_t i = 0; i < LG__ARRAY_LEN(key_headers); i++) {
    size_t n = strlen(key_headers[i]);
    if (!strncasecmp(h, key_headers[i], n) && (h[n] == ':' || !h[n])) return n;
  }
  return 0;
}

const char *lg__auth_key_value(struct MHD_Connection *c, int lgk) {
  for (size_t i = 0; i < LG__ARRAY_LEN(key_headers); i++) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, key_headers[i]);
    if (v && (!lgk || !strncmp(v, LG_KEY_PREFIX, 4))) return v;
  }
  return NULL;
}

const char *lg__auth_key_secret(const char *header) {
  if (!header || strncasecmp(header, "Bearer ", 7)) return NULL;
  const char *tok = header + 7;
  while (*tok == ' ') tok++;
  return strncmp(tok, LG_KEY_PREFIX, 4) ? NULL : tok;
}

lg__role_t lg__auth_role(const lg__auth_t *a, const char *header) {
  if (!header) return LG__ROLE_NONE;
  /* "Bearer" is case-insensitive (RFC 6750 §2.1 via RFC 7235). */
  if (strncasecmp(header, "Bearer ", 7)) return LG__ROLE_NONE;
  const char *tok = header + 7;
  while (*tok == ' ') tok++;
  size_t n = strlen(tok);
  while (n && sp(tok[n - 1])) n--;
  if (!n) return LG__ROLE_NONE;
  uint8_t d[32];
  sha256(tok, n, d);
  int role = LG__ROLE_NONE;
  for (size_t i = 0; i < a->n; i++) {
    /* No early exit and no branch on the secret: every digest is compared
     * and the role is picked with a mask. */
    int same = CRYPTO_memcmp(d, a->tok[i].digest, 32) == 0;
    int mask = -same;
    role = (role & ~mask) | (a->tok[i].role & mask);
  }
  OPENSSL_cleanse(d, sizeof d);
  return (lg__role_t)role;
}

void lg__auth_free(lg__auth_t *a) {
  if (!a) return;
  if (a->tok) OPENSSL_cleanse(a->tok, a->n * sizeof *a->tok);
  lg__free(a->tok);
  a->tok = NULL;
  a->n = 0;
}

int lg__is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    const uint8_t *b = in6->sin6_addr.s6_addr;
    static const uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!memcmp(b, lo, 16)) return 1;
    return !memcmp(b, mapped, 12) && b[12] == 127;
  }
  return 0;
}
