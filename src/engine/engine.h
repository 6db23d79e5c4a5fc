/*
 * engine.h — the state of one run, shared by the decision functions
 * (engine.c), the terminal envelope (envelope.c) and save/load (persist.c).
 * Everything is bounded: a run's memory does not grow with its length.
 */
#ifndef LG_ENGINE_H
#define LG_ENGINE_H

#include "../policy/policy.h"

#define LG__TRIED_MAX 16   /* distinct loop keys kept for the envelope */
#define LG__RETRY_MAX 8    /* retry_after_ms records kept */
#define LG__OPS_MAX 16     /* operations kept for the envelope */
#define LG__PENDING_MAX 64 /* executed calls waiting for a result */
#define LG__RESV_MAX 32    /* model-call reservations not settled yet */
#define LG__KM_MAX 512     /* bytes of the refused call's key material kept */

/* One call in the repeat/cycle window. */
typedef struct lg__win {
  uint64_t fp;  /* first 8 bytes of the fingerprint */
  int64_t turn; /* the model turn that asked for it */
} lg__win_t;

/* Per-tool counters. */
typedef struct lg__tool {
  char *name;           /* the tool */
  int64_t executed;     /* executions in the run (tool_call_cap) */
  int64_t fail_streak;  /* retryable results in a row */
} lg__tool_t;

/* A distinct loop key the model tried, for the envelope. */
typedef struct lg__tried {
  uint64_t fp64;        /* its first 8 bytes, compared first */
  char hex[64];         /* the full fingerprint in hex (no NUL): kept as the
                           engine gets it, so noting a call converts nothing */
  int tool;             /* index into tools */
  uint32_t count;       /* times asked for */
  uint8_t last;         /* last outcome: an lg__outcome value */
  uint64_t seq;         /* when last seen (for eviction) */
} lg__tried_t;

/* Outcomes kept in lg__tried.last: the result statuses, then decisions. */
enum { LG__OUT_EXECUTED = 16, LG__OUT_BLOCKED, LG__OUT_REPLAYED };

typedef struct lg__pending {
  char *call_id;        /* the call's id */
  char *key;            /* its idempotency key, or NULL */
  uint64_t fp;          /* first 8 bytes of the fingerprint */
  int tool;             /* index into tools */
} lg__pending_t;

typedef struct lg__retry {
  uint64_t fp;          /* the call that must wait */
  int64_t not_before;   /* ms */
} lg__retry_t;

typedef struct lg__op {
  char *key;            /* idempotency key */
  char *operation_id;   /* from the result, or NULL */
  uint8_t state;        /* an lg_claim_outcome_t-like state, see OPSTATE_ */
} lg__op_t;

enum { LG__OP_CLAIMED = 1, LG__OP_COMMITTED, LG__OP_FAILED, LG__OP_RELEASED, LG__OP_REPLAYED };

typedef struct lg__resv {
  int64_t id;           /* reservation id */
  int64_t cost;         /* worst-case nano-USD held */
  int64_t tokens;       /* worst-case tokens held */
} lg__resv_t;

struct lg_run {
  char *run_id;
  char *group;
  lg_policy_t *policy;     /* a reference */
  lg_ledger_t *ledger;     /* borrowed, or own_ledger */
  lg_ledger_t *own_ledger; /* a private in-memory ledger, or NULL */

  lg_counters_t c;         /* counters of the envelope */
  uint64_t seq;            /* events seen (orders the tried list) */

  /* Repeat and cycle window since the last confirmed progress. */
  lg__win_t *win;          /* ring of win_cap entries */
  int win_cap;
  int win_len;             /* entries in use */
  int win_head;            /* where the next entry goes */

  bool has_best;           /* a progress_version was seen */
  int64_t best;            /* the highest progress_version */
  int64_t np_count;        /* results in a row without progress */
  bool has_world;
  uint64_t world;          /* hash of the last world snapshot */
  int64_t world_same;      /* snapshots in a row identical to the last */

  lg__tool_t *tools;
  int ntools, captools;
  lg__tried_t tried[LG__TRIED_MAX];
  int ntried;
  lg__pending_t pending[LG__PENDING_MAX];
  int npending;
  lg__retry_t retry[LG__RETRY_MAX];
  int nretry;
  lg__op_t ops[LG__OPS_MAX];
  int nops;
  lg__resv_t resv[LG__RESV_MAX];
  int nresv;
  int64_t next_resv;       /* last reservation id given */
  int64_t held_cost;       /* sum of resv[].cost */
  int64_t held_tokens;     /* sum of resv[].tokens */

  /* The end. */
  bool stopped;
  lg_reason_t reason;
  char *reason_text;       /* the operator's own reason, or NULL */
  const char *guard;       /* static string */
  lg_next_t next;
  unsigned alternatives;
  char *stop_message;      /* what the envelope says happened */
  char *refused_tool;      /* the call refused by the stop, or NULL */
  char *refused_call_id;
  char *refused_km;        /* its key material (truncated) */
  char refused_fp[LG_FP_HEX];
  int64_t refused_turn;
  int64_t stopped_at_ms;

  /* Scratch behind the borrowed strings of the last decision; reused from
   * one decision to the next so that deciding allocates nothing. */
  lg__buf_t msg;           /* the steer message */
  lg__buf_t call_id_buf;   /* the call's id */
  lg__buf_t key_buf;       /* the idempotency key */
  const char *call_id;     /* call_id_buf's text, or NULL */
  const char *key;         /* key_buf's text, or NULL */
  lg_claim_t claim;        /* a replayed result */
};

/* lg_run_before; with trusted_fp, call->fingerprint (when given) was made
 * by the library itself and is not checked again. */
int lg__run_before(lg_run_t *run, lg_canon_t *canon, const lg_call_t *call, bool trusted_fp,
                   lg_decision_t *d, lg_error_t *err);
/* Tool index for `name`, adding it; -1 on out-of-memory. */
int lg__run_tool(lg_run_t *run, const char *name);

#endif
