/*
 * policy.h — the compiled form of a policy-v1 document, shared by the
 * canonicaliser (loop keys), the engine (limits, ladders) and the trace
 * reader. A policy is immutable after lg_policy_parse() returns it.
 */
#ifndef LG_POLICY_H
#define LG_POLICY_H

#include "../util/internal.h"

/* Normalizers of a loop-key field, applied in order to string values. */
typedef enum lg__norm {
  LG__NORM_LOWER = 1,
  LG__NORM_UPPER,
  LG__NORM_TRIM,
  LG__NORM_COLLAPSE_SPACE,
  LG__NORM_DIGITS,
  LG__NORM_STRIP_PREFIX
} lg__norm_t;

#define LG__MAX_NORMS 8
#define LG__CYCLE_MAX 8 /* cycle.max_period at most (policy-v1) */

typedef struct lg__keyfield {
  char *name;                      /* the top-level argument's name */
  size_t name_len;                 /* strlen(name) */
  int nnorms;                      /* normalizers in use */
  lg__norm_t norms[LG__MAX_NORMS]; /* in the order they apply */
  char *prefix[LG__MAX_NORMS];     /* strip_prefix: its text, else NULL */
} lg__keyfield_t;

typedef enum lg__keymode {
  LG__KEY_ALL = 0, /* every argument (the default) */
  LG__KEY_FIELDS,  /* only `fields` */
  LG__KEY_OFF      /* loop_key: false — never a repeat or a cycle */
} lg__keymode_t;

typedef struct lg__toolpol {
  char *name;               /* the tool's name */
  lg__keymode_t key_mode;   /* how its loop key is formed */
  lg__keyfield_t *fields;   /* key_mode FIELDS: the fields */
  int nfields;              /* how many */
  bool side_effects;        /* derive an idempotency key when none given */
  int64_t max_calls;        /* executions allowed in a run, -1 none */
  bool empty_ok;            /* a null or blank value is a valid result */
} lg__toolpol_t;

struct lg_policy {
  int refs;                 /* reference count (atomic) */
  int64_t max_steps;        /* limits.*: -1 where null (no limit) */
  int64_t max_model_calls;
  int64_t max_wall_ms;
  int64_t max_cost_nusd;    /* max_cost_usd in nano-USD */
  int64_t max_tokens;
  int64_t max_handoffs;
  int64_t rep_observe;      /* repeat.*: 0 where the rung is off */
  int64_t rep_block;
  int64_t rep_stop;
  int64_t rep_window;       /* calls the repeat count looks back over */
  int64_t cycle_max_period; /* 0: off */
  int64_t np_results;       /* no_progress.results, 0 off */
  int64_t np_world_steps;   /* no_progress.world_steps, 0 off */
  int64_t failure_streak;   /* 0 off */
  int64_t block_streak;     /* blocked calls in a row that stop the run, 0 off */
  int64_t text_observe;     /* text.repeat.observe: n-th looping response, 0 off */
  int64_t text_stop;        /* text.repeat.stop, 0 off */
  int64_t text_monologue;   /* text.monologue: identical turns, 0 off */
  int64_t compaction_max;   /* compaction.max, 0 off */
  int64_t hide_turns;       /* cascade.hide_turns: model calls a blocked
                               tool stays hidden, 0 never */
  unsigned offer;           /* cascade.offer as LG_ALT_* bits */
  char *escalate_model;     /* cascade.escalate.model, NULL: no escalation */
  int64_t escalate_turns;   /* cascade.escalate.turns */
  int64_t gw_max_reasks;    /* gateway.max_reasks */
  bool gw_final_round;      /* gateway.final_round */
  lg__toolpol_t *tools;     /* per-tool settings, sorted by name */
  int ntools;               /* how many */
};

/* The tool's settings, or NULL when the policy names no such tool. */
const lg__toolpol_t *lg__policy_tool(const lg_policy_t *p, const char *name);

#endif
