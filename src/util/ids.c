/*
 * ids.c — hex, digests and randomness, once: the hex digits of
 * fingerprints and escapes, the SHA-256 of a key's secret or a
 * screenshot, and the random names the library gives (reservation ids,
 * claim tokens, run ids), all from the kernel's getrandom.
 */
#include "internal.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <sys/random.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

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

/* The server converts a run's tried fingerprints (32 bytes each, up to 16
 * a run) on every load and save of the run: 16 bytes at a time with SSE2
 * (every x86-64 has it), the rest a byte at a time with the tables
 * (docs/internals/performance.md). */
void lg__hex(const void *bytes, size_t n, char *out) {
  const unsigned char *b = bytes;
  size_t i = 0;
#ifdef __SSE2__
  const __m128i m4 = _mm_set1_epi8(0x0F), nine = _mm_set1_epi8(9), zero = _mm_set1_epi8('0'),
                gap = _mm_set1_epi8('a' - '0' - 10);
  for (; i + 16 <= n; i += 16) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4), lo = _mm_and_si128(x, m4);
    __m128i d[2] = {_mm_unpacklo_epi8(hi, lo), _mm_unpackhi_epi8(hi, lo)}; /* hi0 lo0 hi1 ... */
    for (int k = 0; k < 2; k++) {
      __m128i letter = _mm_and_si128(_mm_cmpgt_epi8(d[k], nine), gap);
      _mm_storeu_si128((__m128i *)(void *)(out + 2 * i + 16 * (size_t)k),
                       _mm_add_epi8(_mm_add_epi8(d[k], zero), letter));
    }
  }
#endif
  for (; i < n; i++) {
    out[2 * i] = lg__hex_digits[b[i] >> 4];
    out[2 * i + 1] = lg__hex_digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

void lg__sha256_hex(const void *p, size_t n, char out[65]) {
  unsigned char d[32];
  unsigned int len = 32;
  if (!EVP_Digest(p, n, d, &len, EVP_sha256(), NULL)) memset(d, 0, sizeof d);
  lg__hex(d, sizeof d, out);
}

void lg__unhex(const char *hex, size_t n, void *bytes) {
  uint8_t *out = bytes;
  size_t i = 0;
#ifdef __SSE2__
  const __m128i m4 = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(1), low = _mm_set1_epi16(0x00FF);
  for (; i + 16 <= n; i += 16) {
    __m128i w[2];
    for (int k = 0; k < 2; k++) {
      __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(hex + 2 * i + 16 * (size_t)k));
      /* '0'-'9' are 0x30-0x39, 'a'-'f' 0x61-0x66: the low nibble, + 9 when bit 6 is set */
      __m128i letter = _mm_and_si128(_mm_srli_epi16(c, 6), one);
      __m128i v = _mm_add_epi8(_mm_and_si128(c, m4),
                               _mm_add_epi8(_mm_slli_epi16(letter, 3), letter));
      /* each 16-bit lane: its first digit's value << 4 | its second's */
      w[k] = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, low), 4), _mm_srli_epi16(v, 8));
    }
    _mm_storeu_si128((__m128i *)(void *)(out + i), _mm_packus_epi16(w[0], w[1]));
  }
#endif
  for (; i < n; i++)
    out[i] = (uint8_t)(lg__hex_value[(uint8_t)hex[2 * i]] << 4 | lg__hex_value[(uint8_t)hex[2 * i + 1]]);
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
