/*
 * utf8.h — what the two JSON readers (the canonicaliser, src/canon/, and
 * the gateway's lg__json_load, src/server/json_load.c) share about JSON
 * strings: the bytes that end a plain run, hex digits of \u escapes, and
 * UTF-8 checked (no overlong form, no surrogate, nothing past U+10FFFF)
 * and written. Inline: both read strings a byte at a time, plain runs
 * sixteen at a time.
 */
#ifndef LG_UTF8_H
#define LG_UTF8_H

#include <stddef.h>
#include <stdint.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Bytes that end a plain run inside a JSON string: controls, quote,
 * backslash and every non-ASCII byte (util.c). */
extern const uint8_t lg__str_special[256];

/* The end of the plain run of s[i..n): the index of its first special
 * byte (lg__str_special), or n. Sixteen bytes at a time where SSE2 is: a
 * byte is special when it is below 0x20 or above 0x7F (both below 0x20 as
 * signed bytes), a quote or a backslash. */
static inline size_t lg__str_plain_end(const unsigned char *s, size_t i, size_t n) {
#ifdef __SSE2__
  const __m128i sp = _mm_set1_epi8(0x20), qu = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\');
  while (i + 16 <= n) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
    __m128i hit = _mm_or_si128(_mm_cmplt_epi8(x, sp),
                               _mm_or_si128(_mm_cmpeq_epi8(x, qu), _mm_cmpeq_epi8(x, bs)));
    unsigned mask = (unsigned)_mm_movemask_epi8(hit);
    if (mask) return i + (size_t)__builtin_ctz(mask);
    i += 16;
  }
#endif
  while (i < n && !lg__str_special[s[i]]) i++;
  return i;
}

/* The value of a hex digit of either case, or -1: the one hex table
 * (lg__hex_value, ids.c, lowercase only) with A-F folded first. */
extern const uint8_t lg__hex_value[256];
static inline int lg__hexval(unsigned char ch) {
  uint8_t v = lg__hex_value[(unsigned)(ch - 'A') < 6u ? ch | 0x20 : ch];
  return v == 0xFF ? -1 : v;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static inline size_t lg__utf8_len(const unsigned char *s, size_t n) {
  unsigned char b = s[0];
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;
  if (b < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  if (b < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (b == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (b == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (b < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (b == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (b == 0xF4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
    return 4;
  }
  return 0;
}

/* Code point cp as UTF-8 into out; its length (1 to 4). */
static inline size_t lg__utf8_put(uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

#endif
