/*
 * canon.h — internal entry points of the canonicaliser for the trace reader,
 * which meets JSON values in the middle of a line and does not know where
 * they end until it has read them.
 */
#ifndef LG_CANON_H
#define LG_CANON_H

#include "../policy/policy.h"

/* Canonicalises the JSON value at the start of s[0..n) (white space before
 * it allowed), keeping only the fields of `select` (NULL: all) when it is
 * an object; *end receives the offset just past the value. The output is
 * what lg_canon_json would return, available through lg__canon_output. */
int lg__canon_prefix(lg_canon_t *c, const char *s, size_t n, const lg__toolpol_t *select,
                     size_t *end, lg_error_t *err);
/* The canonical bytes of the last call. */
const char *lg__canon_output(const lg_canon_t *c, size_t *len);
/* The fingerprint of `tool` with the last call's output as key material. */
int lg__canon_fp(lg_canon_t *c, const char *tool, char hex[LG_FP_HEX]);
/* The fingerprint of `tool` with km[0..kml) as key material. */
int lg__canon_fp_of(lg_canon_t *c, const char *tool, const char *km, size_t kml, char hex[LG_FP_HEX]);
/* The loop-key selection of `tool` in `policy`, or NULL for all arguments. */
const lg__toolpol_t *lg__canon_select(const lg_policy_t *policy, const char *tool);

#endif
