/*
 * fuzz_prices.c — libFuzzer target for price files (lg_prices_parse in
 * src/budget/prices.c: `--prices`, reloaded on SIGHUP; written by hand or
 * by another tool).
 *
 * Input: the file's bytes, given without a terminating NUL so that a read
 * past the end is caught by ASan.
 * Invariants beyond "no crash, no sanitizer report, no leak":
 *   - a refused file is LG_EPARSE, LG_EINVAL or LG_ERANGE, with a message
 *     and the file's name; nothing else;
 *   - a table read back: a model's price, when it has one, is not
 *     negative, and its limits (max_output_tokens, attachment_tokens) are
 *     -1 (none) or whole numbers of tokens above 0;
 *   - a model call's worst case is its cost with nothing cached: the two
 *     fail alike, or give the same figure;
 *   - a worst case with no max_tokens is the one with the model's
 *     max_output_tokens, when it has one.
 */
#include "loopguard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

#define TOKENS_MAX 1000000000000LL /* prices.c's bound on a token count */

static const char *const MODELS[] = {"m", "openai/gpt-4o", "anything", ""};

static int tokens_or_none(int64_t n) { return n == -1 || (n > 0 && n <= TOKENS_MAX); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size ? size : 1);
  if (!text) return 0;
  memcpy(text, data, size);
  lg_error_t err = {0};
  lg_prices_t *p = lg_prices_parse(text, size, "fuzz.json", &err);
  if (!p) {
    check(err.code == LG_EPARSE || err.code == LG_EINVAL || err.code == LG_ERANGE,
          "a refused price file is EPARSE, EINVAL or ERANGE", data, size);
    check(err.message[0] != 0, "a refusal has a message", data, size);
    check(!strcmp(err.source, "fuzz.json"), "a refusal names the file", data, size);
    free(text);
    return 0;
  }
  for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
    const char *m = MODELS[i];
    lg_price_t pr;
    if (lg_prices_lookup(p, m, &pr, NULL)) continue;
    check(pr.input_per_mtok >= 0 && pr.output_per_mtok >= 0 && pr.cached_input_per_mtok >= 0,
          "prices are not negative", data, size);
    check(tokens_or_none(pr.max_output_tokens), "max_output_tokens is -1 or tokens", data, size);
    check(tokens_or_none(pr.attachment_tokens), "attachment_tokens is -1 or tokens", data, size);
    static const int64_t calls[][2] = {{0, 0}, {1, 1}, {1000, 500}, {123456, 7},
                                       {TOKENS_MAX, TOKENS_MAX}};
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
      int64_t worst = -1, cost = -1;
      int wr = lg_prices_worst_case(p, m, calls[k][0], calls[k][1], &worst, NULL);
      int cr = lg_prices_cost(p, m, calls[k][0], 0, calls[k][1], &cost, NULL);
      check(wr == cr, "the worst case and the cost of one call agree on failing", data, size);
      check(wr || (worst >= 0 && worst == cost), "the worst case is the cost with nothing cached",
            data, size);
    }
    int64_t bound = pr.max_output_tokens, a = -1, b = -1;
    int ar = lg_prices_worst_case(p, m, 100, -1, &a, NULL);
    if (!ar && bound > 0)
      check(!lg_prices_worst_case(p, m, 100, bound, &b, NULL) && a == b,
            "no max_tokens is the model's max_output_tokens", data, size);
  }
  lg_prices_free(p);
  free(text);
  return 0;
}
