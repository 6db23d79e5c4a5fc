/*
 * ids.c — hex and randomness, once: the hex digits of fingerprints and
 * escapes, and the random names the library gives (reservation ids,
 * claim tokens, run ids), all from the kernel's getrandom.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <sys/random.h>

const char lg__hex_digits[17] = "0123456789abcdef";

/* A table rather than comparisons: fingerprint digits are random, and so
 * would be the branches. */
#define NO4 0xFF, 0xFF, 0xFF, 0xFF
#define NO16 NO4, NO4, NO4, NO4
const uint8_t lg__hex_value[256] = {
    NO16, NO16, NO16,                                                  /* 0x00-0x2f */
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, /* 0x30: 0-9 */
    NO16, NO16,                                                        /* 0x40-0x5f */
    0xFF, 10, 11, 12, 13, 14, 15, NO4, NO4, 0xFF,                      /* 0x60: a-f */
    NO16, NO16, NO16, NO16, NO16, NO16, NO16, NO16, NO16};             /* 0x70-0xff */
#undef NO16
#undef NO4

void lg__hex(const void *bytes, size_t n, char *out) {
  const unsigned char *b = bytes;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = lg__hex_digits[b[i] >> 4];
    out[2 * i + 1] = lg__hex_digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

int lg__random(void *bytes, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = getrandom((char *)bytes + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return LG_EIO;
    got += (size_t)k;
  }
  return 0;
}

int lg__random_id(const char *prefix, size_t nbytes, char *out, size_t size, const char *what,
                  lg_error_t *err) {
  unsigned char r[32];
  size_t pl = strlen(prefix);
  if (nbytes > sizeof r || pl + 2 * nbytes + 1 > size)
    return lg__err(err, LG_EINVAL, NULL, -1, "no room for %s", what);
  if (lg__random(r, nbytes)) return lg__err(err, LG_EIO, NULL, -1, "no randomness for %s", what);
  memcpy(out, prefix, pl);
  lg__hex(r, nbytes, out + pl);
  return 0;
}
