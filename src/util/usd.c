/*
 * usd.c — money, once: USD amounts read from JSON or a command line (a
 * double) into integer units, and integer nano-dollars written back as
 * the shortest decimal number of USD. Every amount the library reads or
 * writes goes through these two functions, so that one amount is one
 * integer everywhere (the engine's nano-dollars, the budgets'
 * micro-dollars, a price's micro-dollars per million tokens).
 *
 * The rounding rule (docs/reference/http-api.md, "Amounts"): to the
 * nearest unit, a half up, on the decimal the amount was written as. A
 * double cannot hold most decimals exactly (0.0000005 is stored as
 * 4.99999999999999977e-07), so multiplying by 10^6 and rounding would
 * turn a written half micro-dollar into 0; instead the amount is printed
 * back as the shortest decimal that reads as the same double (15
 * significant digits hold every decimal a person or a JSON encoder
 * writes with that many, 16 most, 17 any double) and rounded in decimal. An
 * amount far enough from a half of a unit takes a shortcut that gives
 * the same answer.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int lg__usd_to_units(double usd, int decimals, int64_t *out) {
  if (!isfinite(usd) || usd < 0 || decimals < 0 || decimals > 12) return LG_EINVAL;
  /* The common case, fast: away from a half, the product rounds the same
   * as the decimal (below 1e12 units its error is under 4e-4 of a unit;
   * replay reads a cost on every model line). */
  static const double pow10[13] = {1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12};
  double x = usd * pow10[decimals];
  if (x < 1e12 && fabs(x - floor(x) - 0.5) > 1e-3) {
    *out = (int64_t)llround(x);
    return 0;
  }
  /* d.ddd...e±x: the shortest of 15, 16 or 17 significant digits that
   * reads back as usd. Without 16, an amount written with 16 (as
   * lg_usd_format writes 7696436.900718926) went to 17 digits of its
   * double's error, and a half up on the noise could move it a unit: a
   * policy printed and read again no longer printed the same. */
  char t[40];
  snprintf(t, sizeof t, "%.14e", usd);
  if (strtod(t, NULL) != usd) snprintf(t, sizeof t, "%.15e", usd);
  if (strtod(t, NULL) != usd) snprintf(t, sizeof t, "%.16e", usd);
  char digits[24];
  int n = 0;
  const char *p = t;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9') digits[n++] = *p;
  int exp10 = *p == 'e' ? atoi(p + 1) : 0;
  /* value = digits × 10^(exp10 - (n - 1)); units = value × 10^decimals. */
  int shift = exp10 - (n - 1) + decimals;
  int keep = shift >= 0 ? n : n + shift; /* digits left of the point */
  int64_t v = 0;
  for (int i = 0; i < keep && i < n; i++)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, digits[i] - '0', &v))
      return LG_ERANGE;
  for (int i = 0; i < shift - (n - keep) && shift > 0; i++)
    if (__builtin_mul_overflow(v, 10, &v)) return LG_ERANGE;
  /* A half up: the first digit dropped decides (the digits are exact). */
  if (keep >= 0 && keep < n && digits[keep] >= '5' && __builtin_add_overflow(v, 1, &v))
    return LG_ERANGE;
  *out = v;
  return 0;
}

char *lg_usd_format(int64_t nusd, char buf[LG_USD_TEXT_MAX]) {
  const char *sign = "";
  uint64_t v = (uint64_t)nusd;
  if (nusd < 0) {
    sign = "-";
    v = (uint64_t)0 - v;
  }
  char frac[16];
  snprintf(frac, sizeof frac, "%09llu", (unsigned long long)(v % 1000000000u));
  size_t fl = 9;
  while (fl > 0 && frac[fl - 1] == '0') fl--;
  frac[fl] = 0;
  snprintf(buf, LG_USD_TEXT_MAX, "%s%llu%s%s", sign, (unsigned long long)(v / 1000000000u),
           fl ? "." : "", frac);
  return buf;
}

int lg__buf_usd(lg__buf_t *b, int64_t nusd) {
  char t[LG_USD_TEXT_MAX];
  return lg__buf_puts(b, lg_usd_format(nusd, t));
}
