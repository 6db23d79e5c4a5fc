/*
 * policy.c — policy-v1 documents: defaults, parsing and printing.
 *
 * A policy is read with jansson (strict: duplicate keys are rejected) into
 * the flat struct lg_policy of policy.h. Every field is optional; a field
 * the format does not know is an error naming its path, because a typo in a
 * safety setting ("repeat.blok") must never be silently ignored. The tools
 * are kept sorted by name so the hot path finds one with a binary search.
 */
#include "policy.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

static void set_defaults(lg_policy_t *p) {
  p->refs = 1;
  p->max_steps = 50;
  p->max_model_calls = 50;
  p->max_wall_ms = 600000;
  p->max_cost_nusd = -1;
  p->max_tokens = -1;
  p->max_handoffs = 10;
  p->rep_observe = 2;
  p->rep_block = 3;
  p->rep_stop = 6;
  p->rep_window = 20;
  p->cycle_max_period = 4;
  p->np_results = 3;
  p->np_world_steps = 5;
  p->failure_streak = 5;
  p->block_streak = 5;
  p->text_observe = 1;
  p->text_stop = 2;
  p->text_monologue = 3;
  p->compaction_max = 10;
  p->hide_turns = 2;
  p->offer = 0;
  p->escalate_model = NULL;
  p->escalate_turns = 0;
  p->gw_max_reasks = 2;
  p->gw_final_round = false;
}

lg_policy_t *lg_policy_default(void) {
  lg_policy_t *p = lg__calloc(1, sizeof *p);
  if (p) set_defaults(p);
  return p;
}

lg_policy_t *lg_policy_ref(lg_policy_t *p) {
  if (p) __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
  return p;
}

static void free_tool(lg__toolpol_t *t) {
  lg__free(t->name);
  for (int i = 0; i < t->nfields; i++) {
    lg__free(t->fields[i].name);
    for (int k = 0; k < t->fields[i].nnorms; k++) lg__free(t->fields[i].prefix[k]);
  }
  lg__free(t->fields);
}

void lg_policy_free(lg_policy_t *p) {
  if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  for (int i = 0; i < p->ntools; i++) free_tool(&p->tools[i]);
  lg__free(p->tools);
  lg__free(p->escalate_model);
  lg__free(p);
}

const lg__toolpol_t *lg__policy_tool(const lg_policy_t *p, const char *name) {
  int lo = 0, hi = p->ntools - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    int r = strcmp(p->tools[mid].name, name);
    if (r == 0) return &p->tools[mid];
    if (r < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

/* ---- parsing ---- */

typedef struct ctx {
  lg_error_t *err;
  const char *source;
  char path[128]; /* the path of the object being read, "" at the top */
} ctx_t;

static int fail(ctx_t *x, const char *key, const char *fmt, const char *a) {
  char field[256];
  if (x->path[0] && key)
    snprintf(field, sizeof field, "%s.%s", x->path, key);
  else
    snprintf(field, sizeof field, "%s", key ? key : x->path);
  char msg[256];
  snprintf(msg, sizeof msg, fmt, a ? a : "");
  return lg__err(x->err, LG_EPOLICY, field, -1, "%s", msg);
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a number with a fraction";
  case JSON_TRUE: return "true";
  case JSON_FALSE: return "false";
  case JSON_NULL: return "null";
  }
  return "something else";
}

/* A non-negative integer; null allowed (stored as -1) when nullable. */
static int get_count(ctx_t *x, const char *key, json_t *v, bool nullable,
                     int64_t *out) {
  if (nullable && json_is_null(v)) {
    *out = -1;
    return 0;
  }
  if (!json_is_integer(v))
    return fail(x, key, nullable ? "expected a whole number or null, got %s"
                                 : "expected a whole number, got %s",
                type_name(v));
  if (json_integer_value(v) < 0) return fail(x, key, "must not be negative%s", "");
  *out = json_integer_value(v);
  return 0;
}

/* A rung of the ladder: a whole number from 1, or false (off, stored 0). */
static int get_rung(ctx_t *x, const char *key, json_t *v, int64_t *out) {
  if (json_is_false(v)) {
    *out = 0;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 1)
    return fail(x, key, "expected a whole number from 1, or false; got %s",
                json_is_integer(v) ? "a number below 1" : type_name(v));
  *out = json_integer_value(v);
  return 0;
}

static int expect_object(ctx_t *x, const char *key, json_t *v) {
  if (!json_is_object(v)) return fail(x, key, "expected an object, got %s", type_name(v));
  return 0;
}

static void push_path(ctx_t *x, const char *key, char *saved) {
  memcpy(saved, x->path, sizeof x->path);
  if (x->path[0]) {
    size_t l = strlen(x->path);
    snprintf(x->path + l, sizeof x->path - l, ".%s", key);
  } else {
    snprintf(x->path, sizeof x->path, "%s", key);
  }
}
static void pop_path(ctx_t *x, const char *saved) { memcpy(x->path, saved, sizeof x->path); }

static int parse_limits(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc;
    if (!strcmp(k, "max_steps")) rc = get_count(x, k, v, true, &p->max_steps);
    else if (!strcmp(k, "max_model_calls")) rc = get_count(x, k, v, true, &p->max_model_calls);
    else if (!strcmp(k, "max_wall_ms")) rc = get_count(x, k, v, true, &p->max_wall_ms);
    else if (!strcmp(k, "max_tokens")) rc = get_count(x, k, v, true, &p->max_tokens);
    else if (!strcmp(k, "max_handoffs")) rc = get_count(x, k, v, true, &p->max_handoffs);
    else if (!strcmp(k, "max_cost_usd")) {
      if (json_is_null(v)) {
        p->max_cost_nusd = -1;
        rc = 0;
      } else if (!json_is_number(v)) {
        rc = fail(x, k, "expected a number of USD or null, got %s", type_name(v));
      } else {
        double usd = json_number_value(v);
        if (!(usd >= 0) || usd > 9e9)
          rc = fail(x, k, "must be between 0 and 9e9 USD%s", "");
        else if (lg__usd_to_units(usd, LG__USD_NANO, &p->max_cost_nusd))
          rc = fail(x, k, "must be between 0 and 9e9 USD%s", "");
        else
          rc = 0;
      }
    } else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  return 0;
}

static int parse_repeat(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc;
    if (!strcmp(k, "observe")) rc = get_rung(x, k, v, &p->rep_observe);
    else if (!strcmp(k, "block")) rc = get_rung(x, k, v, &p->rep_block);
    else if (!strcmp(k, "stop")) rc = get_rung(x, k, v, &p->rep_stop);
    else if (!strcmp(k, "window")) {
      rc = get_count(x, k, v, false, &p->rep_window);
      if (!rc && (p->rep_window < 1 || p->rep_window > 10000))
        rc = fail(x, k, "must be from 1 to 10000%s", "");
    } else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  return 0;
}

static int parse_norm(ctx_t *x, const char *key, json_t *v, lg__keyfield_t *f) {
  if (!json_is_string(v))
    return fail(x, key, "a normalizer is a string, got %s", type_name(v));
  const char *s = json_string_value(v);
  if (f->nnorms >= LG__MAX_NORMS) return fail(x, key, "at most 8 normalizers%s", "");
  int k = f->nnorms;
  if (!strcmp(s, "lower")) f->norms[k] = LG__NORM_LOWER;
  else if (!strcmp(s, "upper")) f->norms[k] = LG__NORM_UPPER;
  else if (!strcmp(s, "trim")) f->norms[k] = LG__NORM_TRIM;
  else if (!strcmp(s, "collapse_space")) f->norms[k] = LG__NORM_COLLAPSE_SPACE;
  else if (!strcmp(s, "digits")) f->norms[k] = LG__NORM_DIGITS;
  else if (!strncmp(s, "strip_prefix:", 13)) {
    f->norms[k] = LG__NORM_STRIP_PREFIX;
    f->prefix[k] = lg__strdup(s + 13);
    if (!f->prefix[k]) return lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
  } else
    return fail(x, key,
                "unknown normalizer \"%s\" (lower, upper, trim, collapse_space, "
                "digits, strip_prefix:TEXT)",
                s);
  f->nnorms++;
  return 0;
}

static int parse_loop_key(ctx_t *x, lg__toolpol_t *t, json_t *v) {
  if (json_is_false(v)) {
    t->key_mode = LG__KEY_OFF;
    return 0;
  }
  if (json_is_true(v)) {
    t->key_mode = LG__KEY_ALL;
    return 0;
  }
  size_t n = json_is_array(v) ? json_array_size(v) : json_is_object(v) ? json_object_size(v) : 0;
  if (!json_is_array(v) && !json_is_object(v))
    return fail(x, "loop_key",
                "expected false, a list of field names, or an object of field "
                "normalizers; got %s",
                type_name(v));
  t->key_mode = LG__KEY_FIELDS;
  t->fields = lg__calloc(n ? n : 1, sizeof *t->fields);
  if (!t->fields) return lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
  char saved[sizeof x->path];
  push_path(x, "loop_key", saved);
  int rc = 0;
  if (json_is_array(v)) {
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
      char idx[24];
      snprintf(idx, sizeof idx, "%zu", i);
      if (!json_is_string(e)) {
        rc = fail(x, idx, "a field name is a string, got %s", type_name(e));
        break;
      }
      /* A field listed twice is a typo, and would print as an object with
       * a duplicate key that no strict parser reads back. */
      for (int j = 0; j < t->nfields && !rc; j++)
        if (t->fields[j].name_len == json_string_length(e) &&
            !memcmp(t->fields[j].name, json_string_value(e), t->fields[j].name_len))
          rc = fail(x, idx, "field \"%s\" is listed twice", json_string_value(e));
      if (rc) break;
      lg__keyfield_t *f = &t->fields[t->nfields];
      f->name = lg__strdup(json_string_value(e));
      if (!f->name) {
        rc = lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
        break;
      }
      f->name_len = json_string_length(e);
      t->nfields++;
    }
  } else {
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e) {
      lg__keyfield_t *f = &t->fields[t->nfields];
      f->name = lg__strdup(k);
      if (!f->name) {
        rc = lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
        break;
      }
      f->name_len = strlen(k);
      t->nfields++;
      if (!json_is_array(e)) {
        rc = fail(x, k, "expected a list of normalizers, got %s", type_name(e));
        break;
      }
      size_t i;
      json_t *nv;
      json_array_foreach(e, i, nv) {
        if ((rc = parse_norm(x, k, nv, f))) break;
      }
      if (rc) break;
    }
  }
  pop_path(x, saved);
  return rc;
}

static int parse_tool(ctx_t *x, lg__toolpol_t *t, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc = 0;
    if (!strcmp(k, "loop_key")) rc = parse_loop_key(x, t, v);
    else if (!strcmp(k, "side_effects") || !strcmp(k, "empty_ok")) {
      if (!json_is_boolean(v)) rc = fail(x, k, "expected true or false, got %s", type_name(v));
      else if (k[0] == 's') t->side_effects = json_is_true(v);
      else t->empty_ok = json_is_true(v);
    } else if (!strcmp(k, "max_calls")) rc = get_count(x, k, v, true, &t->max_calls);
    else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  return 0;
}

static int tool_cmp(const void *a, const void *b) {
  return strcmp(((const lg__toolpol_t *)a)->name, ((const lg__toolpol_t *)b)->name);
}

static int parse_tools(ctx_t *x, lg_policy_t *p, json_t *o) {
  size_t n = json_object_size(o);
  p->tools = lg__calloc(n ? n : 1, sizeof *p->tools);
  if (!p->tools) return lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    lg__toolpol_t *t = &p->tools[p->ntools];
    t->name = lg__strdup(k);
    if (!t->name) return lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
    t->max_calls = -1;
    p->ntools++;
    int rc = expect_object(x, k, v);
    if (rc) return rc;
    char saved[sizeof x->path];
    push_path(x, k, saved);
    rc = parse_tool(x, t, v);
    pop_path(x, saved);
    if (rc) return rc;
  }
  qsort(p->tools, (size_t)p->ntools, sizeof *p->tools, tool_cmp);
  return 0;
}

/* A count with an upper bound (so that it fits the decision's uint32_t
 * fields and a run's counters can never overflow comparing to it). */
static int get_bounded(ctx_t *x, const char *key, json_t *v, int64_t max, int64_t *out) {
  int rc = get_count(x, key, v, false, out);
  if (!rc && *out > max) {
    char m[32];
    snprintf(m, sizeof m, "%lld", (long long)max);
    rc = fail(x, key, "must be at most %s", m);
  }
  return rc;
}

#define LG__COUNT_MAX 1000000 /* the largest threshold any guard takes */

static int parse_text(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc = 0;
    if (!strcmp(k, "monologue")) {
      /* One response is not a monologue: 0 (off) or 2 and up. */
      if (!(rc = get_bounded(x, k, v, LG__COUNT_MAX, &p->text_monologue)) && p->text_monologue == 1)
        rc = fail(x, k, "must be 0 (off) or at least 2%s", "");
    }
    else if (!strcmp(k, "repeat")) {
      if ((rc = expect_object(x, k, v))) return rc;
      char saved[sizeof x->path];
      push_path(x, k, saved);
      const char *rk;
      json_t *rv;
      json_object_foreach(v, rk, rv) {
        if (!strcmp(rk, "observe")) rc = get_rung(x, rk, rv, &p->text_observe);
        else if (!strcmp(rk, "stop")) rc = get_rung(x, rk, rv, &p->text_stop);
        else rc = fail(x, rk, "unknown field%s", "");
        if (rc) break;
      }
      pop_path(x, saved);
    } else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  if (p->text_observe && p->text_stop && p->text_observe > p->text_stop)
    return lg__err(x->err, LG_EPOLICY, "text.repeat.observe", -1,
                   "observe (%lld) must not be above stop (%lld)", (long long)p->text_observe,
                   (long long)p->text_stop);
  return 0;
}

static int parse_offer(ctx_t *x, lg_policy_t *p, json_t *v) {
  if (!json_is_array(v))
    return fail(x, "offer", "expected a list of \"ask_human\", \"finalize_partial\"; got %s",
                type_name(v));
  char saved[sizeof x->path];
  push_path(x, "offer", saved);
  int rc = 0;
  size_t i;
  json_t *e;
  p->offer = 0;
  json_array_foreach(v, i, e) {
    char idx[24];
    snprintf(idx, sizeof idx, "%zu", i);
    const char *s = json_is_string(e) ? json_string_value(e) : NULL;
    unsigned bit = !s                              ? 0
                   : !strcmp(s, "ask_human")        ? LG_ALT_ASK_HUMAN
                   : !strcmp(s, "finalize_partial") ? LG_ALT_FINALIZE_PARTIAL
                                                    : 0;
    if (!bit) rc = fail(x, idx, "expected \"ask_human\" or \"finalize_partial\"%s", "");
    else if (p->offer & bit) rc = fail(x, idx, "\"%s\" is listed twice", s);
    if (rc) break;
    p->offer |= bit;
  }
  pop_path(x, saved);
  return rc;
}

static int parse_escalate(ctx_t *x, lg_policy_t *p, json_t *v) {
  if (json_is_null(v)) return 0; /* none: the default */
  if (!json_is_object(v))
    return fail(x, "escalate", "expected an object {model, turns} or null, got %s", type_name(v));
  char saved[sizeof x->path];
  push_path(x, "escalate", saved);
  int rc = 0;
  const char *k;
  json_t *e;
  const char *model = NULL;
  int64_t turns = 2;
  json_object_foreach(v, k, e) {
    if (!strcmp(k, "model")) {
      if (!json_is_string(e) || !json_string_length(e))
        rc = fail(x, k, "expected a model name, got %s", json_is_string(e) ? "\"\"" : type_name(e));
      else model = json_string_value(e);
    } else if (!strcmp(k, "turns")) {
      if (!(rc = get_bounded(x, k, e, LG__COUNT_MAX, &turns)) && turns < 1)
        rc = fail(x, k, "must be at least 1%s", "");
    } else rc = fail(x, k, "unknown field%s", "");
    if (rc) break;
  }
  if (!rc && !model) rc = fail(x, "model", "is required%s", "");
  if (!rc) {
    char *m = lg__strdup(model);
    if (!m) rc = lg__err(x->err, LG_ENOMEM, NULL, -1, "out of memory");
    else {
      lg__free(p->escalate_model);
      p->escalate_model = m;
      p->escalate_turns = turns;
    }
  }
  pop_path(x, saved);
  return rc;
}

static int parse_cascade(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc;
    if (!strcmp(k, "hide_turns")) rc = get_bounded(x, k, v, LG__COUNT_MAX, &p->hide_turns);
    else if (!strcmp(k, "offer")) rc = parse_offer(x, p, v);
    else if (!strcmp(k, "escalate")) rc = parse_escalate(x, p, v);
    else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  return 0;
}

static int parse_gateway(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc = 0;
    if (!strcmp(k, "max_reasks")) rc = get_bounded(x, k, v, 100, &p->gw_max_reasks);
    else if (!strcmp(k, "final_round")) {
      if (!json_is_boolean(v)) rc = fail(x, k, "expected true or false, got %s", type_name(v));
      else p->gw_final_round = json_is_true(v);
    } else rc = fail(x, k, "unknown field%s", "");
    if (rc) return rc;
  }
  return 0;
}

/* compaction: {"max": N}. */
static int parse_compaction(ctx_t *x, lg_policy_t *p, json_t *o) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    int rc = strcmp(k, "max") ? fail(x, k, "unknown field%s", "")
                              : get_bounded(x, k, v, LG__COUNT_MAX, &p->compaction_max);
    if (rc) return rc;
  }
  return 0;
}

static int parse_top(ctx_t *x, lg_policy_t *p, json_t *root) {
  if (!json_is_object(root))
    return lg__err(x->err, LG_EPOLICY, NULL, -1, "a policy is a JSON object, got %s",
                   type_name(root));
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    int rc = 0;
    char saved[sizeof x->path];
    if (!strcmp(k, "failure_streak") || !strcmp(k, "block_streak")) {
      if ((rc = get_bounded(x, k, v, LG__COUNT_MAX,
                            k[0] == 'f' ? &p->failure_streak : &p->block_streak)))
        return rc;
      continue;
    }
    if (strcmp(k, "limits") && strcmp(k, "repeat") && strcmp(k, "cycle") &&
        strcmp(k, "no_progress") && strcmp(k, "tools") && strcmp(k, "text") &&
        strcmp(k, "compaction") && strcmp(k, "cascade") && strcmp(k, "gateway"))
      return fail(x, k, "unknown field%s", "");
    if ((rc = expect_object(x, k, v))) return rc;
    push_path(x, k, saved);
    if (!strcmp(k, "limits")) rc = parse_limits(x, p, v);
    else if (!strcmp(k, "text")) rc = parse_text(x, p, v);
    else if (!strcmp(k, "compaction")) rc = parse_compaction(x, p, v);
    else if (!strcmp(k, "cascade")) rc = parse_cascade(x, p, v);
    else if (!strcmp(k, "gateway")) rc = parse_gateway(x, p, v);
    else if (!strcmp(k, "repeat")) rc = parse_repeat(x, p, v);
    else if (!strcmp(k, "tools")) rc = parse_tools(x, p, v);
    else if (!strcmp(k, "cycle")) {
      const char *ck;
      json_t *cv;
      json_object_foreach(v, ck, cv) {
        if (strcmp(ck, "max_period")) rc = fail(x, ck, "unknown field%s", "");
        else if (!(rc = get_count(x, ck, cv, false, &p->cycle_max_period)) &&
                 p->cycle_max_period > LG__CYCLE_MAX)
          rc = fail(x, ck, "must be from 0 (off) to 8%s", "");
        if (rc) break;
      }
    } else { /* no_progress */
      const char *nk;
      json_t *nv;
      json_object_foreach(v, nk, nv) {
        if (!strcmp(nk, "results")) rc = get_count(x, nk, nv, false, &p->np_results);
        else if (!strcmp(nk, "world_steps")) rc = get_count(x, nk, nv, false, &p->np_world_steps);
        else rc = fail(x, nk, "unknown field%s", "");
        if (rc) break;
      }
    }
    pop_path(x, saved);
    if (rc) return rc;
  }
  /* The rungs must rise, or the ladder means nothing. */
  if (p->rep_observe && p->rep_block && p->rep_observe > p->rep_block)
    return lg__err(x->err, LG_EPOLICY, "repeat.observe", -1,
                   "observe (%lld) must not be above block (%lld)",
                   (long long)p->rep_observe, (long long)p->rep_block);
  if (p->rep_block && p->rep_stop && p->rep_block > p->rep_stop)
    return lg__err(x->err, LG_EPOLICY, "repeat.block", -1,
                   "block (%lld) must not be above stop (%lld)",
                   (long long)p->rep_block, (long long)p->rep_stop);
  /* With block off, observe and stop must still rise. */
  if (p->rep_observe && p->rep_stop && p->rep_observe > p->rep_stop)
    return lg__err(x->err, LG_EPOLICY, "repeat.observe", -1,
                   "observe (%lld) must not be above stop (%lld)",
                   (long long)p->rep_observe, (long long)p->rep_stop);
  return 0;
}

lg_policy_t *lg_policy_parse(const char *json, size_t len, const char *source,
                             lg_error_t *err) {
  ctx_t x = {err, source ? source : "<policy>", ""};
  json_error_t je;
  lg__json_begin();
  json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
  if (lg__json_oom()) { /* whatever jansson made of it (see util.c) */
    json_decref(root);
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return NULL;
  }
  if (!root) {
    /* jansson reports some allocation failures as json_error_out_of_memory
     * and others not at all (the error stays as initialised: no text). */
    if (json_error_code(&je) == json_error_out_of_memory || !je.text[0]) {
      lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      return NULL;
    }
    lg__err(err, LG_EPOLICY, NULL, je.position, "%s (line %d, column %d)", je.text,
            je.line, je.column);
    if (err) {
      snprintf(err->source, sizeof err->source, "%s", x.source);
      err->line = je.line;
    }
    return NULL;
  }
  lg_policy_t *p = lg_policy_default();
  int rc = p ? parse_top(&x, p, root) : lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  json_decref(root);
  if (rc) {
    lg_policy_free(p);
    if (rc != LG_ENOMEM) lg__err_json_line(err, json, len);
    if (err && !err->source[0]) snprintf(err->source, sizeof err->source, "%s", x.source);
    return NULL;
  }
  return p;
}

lg_policy_t *lg_policy_load_file(const char *path, lg_error_t *err) {
  lg__buf_t b = {0};
  if (lg__buf_read_file(&b, path, "policy file", err)) return NULL;
  lg_policy_t *p = lg_policy_parse(b.data ? b.data : "", b.len, path, err);
  lg__buf_free(&b);
  return p;
}

/* ---- printing ---- */

static void put_limit(lg__buf_t *b, const char *name, int64_t v, bool comma) {
  lg__buf_printf(b, "%s\"%s\":", comma ? "," : "", name);
  if (v < 0) lg__buf_puts(b, "null");
  else lg__buf_printf(b, "%lld", (long long)v);
}

static void put_rung(lg__buf_t *b, const char *name, int64_t v) {
  if (v) lg__buf_printf(b, "\"%s\":%lld,", name, (long long)v);
  else lg__buf_printf(b, "\"%s\":false,", name);
}

char *lg_policy_to_json(const lg_policy_t *p) {
  static const char *norm_names[] = {"", "lower", "upper", "trim", "collapse_space", "digits", "strip_prefix:"};
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"limits\":{");
  put_limit(&b, "max_steps", p->max_steps, false);
  put_limit(&b, "max_model_calls", p->max_model_calls, true);
  put_limit(&b, "max_wall_ms", p->max_wall_ms, true);
  lg__buf_puts(&b, ",\"max_cost_usd\":");
  if (p->max_cost_nusd < 0) lg__buf_puts(&b, "null");
  else lg__buf_usd(&b, p->max_cost_nusd);
  put_limit(&b, "max_tokens", p->max_tokens, true);
  put_limit(&b, "max_handoffs", p->max_handoffs, true);
  lg__buf_puts(&b, "},\"repeat\":{");
  put_rung(&b, "observe", p->rep_observe);
  put_rung(&b, "block", p->rep_block);
  put_rung(&b, "stop", p->rep_stop);
  lg__buf_printf(&b, "\"window\":%lld},\"cycle\":{\"max_period\":%lld},",
                 (long long)p->rep_window, (long long)p->cycle_max_period);
  lg__buf_printf(&b, "\"no_progress\":{\"results\":%lld,\"world_steps\":%lld},",
                 (long long)p->np_results, (long long)p->np_world_steps);
  lg__buf_printf(&b, "\"failure_streak\":%lld,\"block_streak\":%lld,\"text\":{\"repeat\":{",
                 (long long)p->failure_streak, (long long)p->block_streak);
  put_rung(&b, "observe", p->text_observe);
  if (p->text_stop) lg__buf_printf(&b, "\"stop\":%lld", (long long)p->text_stop);
  else lg__buf_puts(&b, "\"stop\":false");
  lg__buf_printf(&b, "},\"monologue\":%lld},\"compaction\":{\"max\":%lld},",
                 (long long)p->text_monologue, (long long)p->compaction_max);
  lg__buf_printf(&b, "\"cascade\":{\"hide_turns\":%lld,\"offer\":[%s%s%s],\"escalate\":",
                 (long long)p->hide_turns, p->offer & LG_ALT_ASK_HUMAN ? "\"ask_human\"" : "",
                 (p->offer & LG_ALT_ASK_HUMAN) && (p->offer & LG_ALT_FINALIZE_PARTIAL) ? "," : "",
                 p->offer & LG_ALT_FINALIZE_PARTIAL ? "\"finalize_partial\"" : "");
  if (p->escalate_model) {
    lg__buf_puts(&b, "{\"model\":");
    lg__buf_json_str(&b, p->escalate_model, strlen(p->escalate_model));
    lg__buf_printf(&b, ",\"turns\":%lld}", (long long)p->escalate_turns);
  } else {
    lg__buf_puts(&b, "null");
  }
  lg__buf_printf(&b, "},\"gateway\":{\"max_reasks\":%lld,\"final_round\":%s},\"tools\":{",
                 (long long)p->gw_max_reasks, p->gw_final_round ? "true" : "false");
  for (int i = 0; i < p->ntools; i++) {
    const lg__toolpol_t *t = &p->tools[i];
    if (i) lg__buf_putc(&b, ',');
    lg__buf_json_str(&b, t->name, strlen(t->name));
    lg__buf_puts(&b, ":{\"loop_key\":");
    if (t->key_mode == LG__KEY_OFF) lg__buf_puts(&b, "false");
    else if (t->key_mode == LG__KEY_ALL) lg__buf_puts(&b, "true");
    else {
      lg__buf_putc(&b, '{');
      for (int f = 0; f < t->nfields; f++) {
        const lg__keyfield_t *kf = &t->fields[f];
        if (f) lg__buf_putc(&b, ',');
        lg__buf_json_str(&b, kf->name, kf->name_len);
        lg__buf_puts(&b, ":[");
        for (int k = 0; k < kf->nnorms; k++) {
          if (k) lg__buf_putc(&b, ',');
          lg__buf_t nb = {0};
          lg__buf_puts(&nb, norm_names[kf->norms[k]]);
          if (kf->prefix[k]) lg__buf_puts(&nb, kf->prefix[k]);
          if (nb.oom) b.oom = true; /* or the normalizer would go missing */
          else lg__buf_json_str(&b, nb.data, nb.len);
          lg__buf_free(&nb);
        }
        lg__buf_putc(&b, ']');
      }
      lg__buf_putc(&b, '}');
    }
    lg__buf_printf(&b, ",\"side_effects\":%s,\"max_calls\":", t->side_effects ? "true" : "false");
    if (t->max_calls < 0) lg__buf_puts(&b, "null");
    else lg__buf_printf(&b, "%lld", (long long)t->max_calls);
    lg__buf_printf(&b, ",\"empty_ok\":%s}", t->empty_ok ? "true" : "false");
  }
  lg__buf_puts(&b, "}}");
  return lg__buf_steal(&b, NULL); /* NULL if any append ran out of memory */
}
