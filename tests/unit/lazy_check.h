/*
 * lazy_check.h — lg__json_load_lazy (src/server/json_load.c) against
 * jansson's tree of the same text, for test_json_load.c and
 * fuzz_json_load.c: it accepts exactly what json_loadb accepts; each
 * element's peeked members are what the element built says; built
 * elements, in an order of their own, then all of them, make the tree
 * json_loadb makes (the same compact dump: member order too). With a
 * prefix (a text read before), the same holds, and the elements it
 * gives are taken only when the text starts with its bytes.
 */
#ifndef LG_TEST_LAZY_CHECK_H
#define LG_TEST_LAZY_CHECK_H

#include "server/server.h"

#include <stdlib.h>
#include <string.h>

/* NULL when lg__json_load_lazy(s, n, member), given prefix pre (may be
 * NULL), agrees with j, jansson's tree of s (NULL: jansson refuses s);
 * else what is wrong. *next (may be NULL): the prefix of this read (new). */
static inline const char *lazy_disagrees_after(const char *s, size_t n, const char *member, const json_t *j,
                                        const lg__json_prefix_t *pre, lg__json_prefix_t **next) {
  static const char *const peek[2] = {"role", "type"};
  lg__json_lazy_t lz;
  memset(&lz, 0, sizeof lz);
  lz.peek[0] = peek[0];
  lz.peek[1] = peek[1];
  lz.prefix = pre;
  json_error_t je;
  json_t *v = lg__json_load_lazy(s, n, member, &lz, &je, NULL);
  const char *bad = NULL;
  if ((v == NULL) != (j == NULL)) bad = "accepts exactly what json_loadb accepts";
  if (!bad && lz.reused && (n < pre->len || memcmp(s, pre->text, pre->len)))
    bad = "a prefix is taken only when the text starts with it";
  if (!bad && pre && v && lz.arr && pre->n && n >= pre->len && !memcmp(s, pre->text, pre->len) &&
      lz.at == pre->at && lz.reused != pre->n)
    bad = "a prefix the text starts with is taken";
  if (next) *next = bad ? NULL : lg__json_prefix_of(&lz, SIZE_MAX);
  json_t *arr = json_object_get(v, member), *want = json_object_get(j, member);
  if (!bad && lz.arr && arr != lz.arr) bad = "lz->arr is the tree's member";
  for (size_t i = 0; !bad && lz.arr && i < json_array_size(arr); i++)
    for (int k = 0; k < 2 && !bad; k++) {
      const char *got, *w = json_string_value(json_object_get(json_array_get(want, i), peek[k]));
      if (!lg__json_lazy_peek(&lz, arr, i, k, &got) && (got ? !w || strcmp(got, w) : w != NULL))
        bad = "a peek says what the element holds";
    }
  /* every other element first (a read out of order), then all */
  for (size_t i = 1; !bad && lz.arr && i < json_array_size(arr); i += 2)
    if (!lg__json_lazy_get(&lz, arr, i)) bad = "an element is built";
  if (!bad && lz.arr && lg__json_lazy_all(&lz, arr)) bad = "every element is built";
  if (!bad && v) {
    char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY), *b = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!a || !b || strcmp(a, b) || !json_equal(v, j)) bad = "the same tree as json_loadb";
    free(a);
    free(b);
  }
  json_decref(v);
  lg__json_lazy_free(&lz);
  return bad;
}

static inline const char *lazy_disagrees(const char *s, size_t n, const char *member, const json_t *j) {
  return lazy_disagrees_after(s, n, member, j, NULL, NULL);
}

#endif
