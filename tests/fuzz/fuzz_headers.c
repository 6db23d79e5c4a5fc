/*
 * fuzz_headers.c — the upstream's response header lines the gateway passes
 * on to its client (src/gateway/upstream.c, lg__gw_header_keep), on any
 * bytes: an upstream's headers are bytes from the network, and what is
 * kept is written into the client's response.
 *
 * Input: the header block, cut into lines at each "\n" (kept, as libcurl
 * hands a line to its header callback).
 * Invariants:
 *   - each line is kept or not as a plain reading of the rules says
 *     (written out here, a byte at a time: a name of token characters
 *     before the first ':', not one the gateway drops; a value without
 *     its leading blanks and its trailing blanks and line end, with no
 *     CR, LF or NUL left in it), and kept as "name\0value\0";
 *   - the kept block reads back as whole pairs: a name of token
 *     characters, a value with no CR or LF, each NUL-ended, nothing after
 *     the last pair.
 */
#include "loopguard.h"
#include "gateway/gw.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "fuzz_check.h"

static int token_char(unsigned char c) {
  static const char extra[] = "!#$%&'*+-.^_`|~";
  if (isalnum(c) && c < 0x80) return 1;
  for (size_t i = 0; i < sizeof extra - 1; i++)
    if (c == (unsigned char)extra[i]) return 1;
  return 0;
}

static int dropped(const char *k, size_t kl) {
  static const char *const names[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "te", "trailer", "upgrade",
                                      "proxy-authenticate", "content-length", "content-encoding",
                                      "content-type", "date", "server", "set-cookie"};
  char low[64];
  if (kl >= 12) {
    for (size_t i = 0; i < 12; i++) low[i] = (char)tolower((unsigned char)k[i]);
    if (!memcmp(low, "x-loopguard-", 12)) return 1;
  }
  if (kl >= sizeof low) return 0;
  for (size_t i = 0; i < kl; i++) low[i] = (char)tolower((unsigned char)k[i]);
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strlen(names[i]) == kl && !memcmp(low, names[i], kl)) return 1;
  return 0;
}

/* The rules, a byte at a time, into want. */
static void plain_keep(lg__buf_t *want, const char *p, size_t n) {
  size_t kl = 0;
  while (kl < n && p[kl] != ':') kl++;
  if (kl == n || kl == 0) return;
  for (size_t i = 0; i < kl; i++)
    if (!token_char((unsigned char)p[i])) return;
  size_t v = kl + 1, e = n;
  while (v < e && (p[v] == ' ' || p[v] == '\t')) v++;
  while (e > v && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
  for (size_t i = v; i < e; i++)
    if (p[i] == '\r' || p[i] == '\n' || p[i] == 0) return;
  if (dropped(p, kl)) return;
  lg__buf_append(want, p, kl);
  lg__buf_putc(want, 0);
  lg__buf_append(want, p + v, e - v);
  lg__buf_putc(want, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  lg__buf_t got = {0}, want = {0};
  for (size_t i = 0; i < size;) {
    size_t k = i;
    while (k < size && s[k] != '\n') k++;
    size_t n = (k < size ? k + 1 : k) - i;
    size_t before = got.len;
    int kept = lg__gw_header_keep(&got, s + i, n);
    check(kept == (got.len > before), "kept says whether the line was kept", data, size);
    plain_keep(&want, s + i, n);
    i += n;
  }
  check(!got.oom && !want.oom, "out of memory", data, size);
  check(got.len == want.len && (!got.len || !memcmp(got.data, want.data, got.len)),
        "each line kept as the rules say", data, size);
  for (size_t i = 0; i < got.len;) { /* whole pairs, as add_headers reads them */
    const char *k = got.data + i;
    size_t kl = strlen(k);
    check(kl > 0 && i + kl + 1 < got.len, "a name, then its value", data, size);
    for (size_t j = 0; j < kl; j++) check(token_char((unsigned char)k[j]), "a name of token characters", data, size);
    const char *v = k + kl + 1;
    size_t vl = strlen(v);
    check(!memchr(v, '\r', vl) && !memchr(v, '\n', vl), "a value on one line", data, size);
    i += kl + 1 + vl + 1;
    check(i <= got.len, "nothing but whole pairs", data, size);
  }
  lg__buf_free(&got);
  lg__buf_free(&want);
  return 0;
}
