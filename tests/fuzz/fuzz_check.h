/*
 * fuzz_check.h — what every fuzz target does when an invariant fails:
 * says which, shows the input, and aborts (libFuzzer keeps the input as
 * the reproducer).
 */
#ifndef LG_FUZZ_CHECK_H
#define LG_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline void check(int ok, const char *what, const uint8_t *data, size_t size) {
  if (ok) return;
  fprintf(stderr, "invariant violated: %s\ninput (%zu bytes): ", what, size);
  fwrite(data, 1, size, stderr);
  fputc('\n', stderr);
  abort();
}

#endif
