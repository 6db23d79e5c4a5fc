/*
 * fuzz_json_load.c — libFuzzer target for lg__json_load
 * (src/server/json_load.c), the gateway's JSON reader: it reads the
 * client's request body and the upstream's answers, bytes from the
 * network on both sides, and stands in for jansson's json_loadb.
 *
 * The input is given without a terminating NUL (a read past the end is
 * ASan's). Invariants beyond "no crash, no sanitizer report", against
 * json_loadb(data, size, flags) on the same bytes, with flags 0 (the
 * gateway's) and JSON_REJECT_DUPLICATES (the sidecar's bodies):
 *   - one accepts exactly when the other does;
 *   - an accepted text gives equal trees, member order included (the
 *     compact dumps are the same bytes);
 *   - a refused text gives jansson's own error text, line and column;
 *   - the reals it counts are never fewer than the tree holds;
 *   - lg__json_text, the library's own writer, writes the bytes
 *     json_dumps writes;
 *   - lg__json_load_lazy (the gateway's conversation) agrees too, for
 *     members "messages" and "a" (../unit/lazy_check.h), alone, with its
 *     own read as the prefix, and with that prefix on the text with a
 *     byte changed.
 */
#include "server/server.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/lazy_check.h"
#include "fuzz_check.h"

static size_t count_reals(const json_t *v) {
  size_t n = json_is_real(v);
  for (size_t i = 0; json_is_array(v) && i < json_array_size(v); i++)
    n += count_reals(json_array_get(v, i));
  const char *k;
  json_t *x;
  if (json_is_object(v)) json_object_foreach((json_t *)v, k, x) n += count_reals(x);
  return n;
}

static void one(const uint8_t *data, size_t size, size_t flags) {
  const char *s = (const char *)data;
  json_error_t ours, theirs;
  size_t reals = 0;
  json_t *a = flags ? lg__json_load_flags(s, size, flags, &ours, &reals)
                    : lg__json_load(s, size, &ours, &reals);
  json_t *b = json_loadb(s, size, flags, &theirs);
  check((a == NULL) == (b == NULL), "accepts exactly what json_loadb accepts", data, size);
  if (a && b) {
    char *da = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
    char *db = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    check(da && db && !strcmp(da, db), "the same tree as json_loadb (member order too)", data, size);
    char *mine = lg__json_text(a, NULL);
    check(mine && db && !strcmp(mine, db), "lg__json_text writes what json_dumps writes", data, size);
    lg__free(mine);
    free(da);
    free(db);
    check(json_equal(a, b), "json_equal to json_loadb's tree", data, size);
    check(reals >= count_reals(a), "counts every real the tree holds", data, size);
  } else if (!a && !b) {
    check(!strcmp(ours.text, theirs.text) && ours.line == theirs.line &&
              ours.column == theirs.column && ours.position == theirs.position,
          "json_loadb's own error", data, size);
  }
  if (!flags)
    for (int k = 0; k < 2; k++) {
      /* read lazily; again with that read as the prefix; and, with it, the
       * text with one byte changed (a prefix that no longer matches) */
      const char *member = k ? "messages" : "a";
      lg__json_prefix_t *pre = NULL;
      const char *bad = lazy_disagrees_after(s, size, member, b, NULL, &pre);
      if (!bad) bad = lazy_disagrees_after(s, size, member, b, pre, NULL);
      if (!bad && size) {
        char *t = malloc(size);
        if (t) {
          memcpy(t, s, size);
          t[(size_t)(uint8_t)s[0] * size / 256] ^= 0x01;
          json_t *bt = json_loadb(t, size, 0, NULL);
          bad = lazy_disagrees_after(t, size, member, bt, pre, NULL);
          json_decref(bt);
          free(t);
        }
      }
      lg__json_prefix_free(pre);
      check(!bad, bad ? bad : "", data, size);
    }
  json_decref(a);
  json_decref(b);
}

/* Both ways the server reads: the gateway's (flags 0) and the sidecar's
 * bodies (JSON_REJECT_DUPLICATES). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  one(data, size, 0);
  one(data, size, JSON_REJECT_DUPLICATES);
  return 0;
}
