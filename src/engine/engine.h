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

enum { LG__ANS_QUESTION = 1, LG__ANS_PARTIAL };

/* What became of an operation of the run, as the envelope lists it (the
 * ledger keeps its own row states: src/store/store.h). */
enum { LG__RUNOP_CLAIMED = 1, LG__RUNOP_COMMITTED, LG__RUNOP_FAILED, LG__RUNOP_RELEASED, LG__RUNOP_REPLAYED };

/* The text detector's state (text.c): one response at a time, fixed size.
 * Prose is read as words (runs of bytes between white space and sentence
 * ends) and sentences (ended by . ! ? or a line end); both are hashed as
 * they complete and kept in small rings, where a loop is a block at the
 * end repeated back to back. Lines that people repeat on purpose (fenced
 * code, table rows, list items, headings, dividers) are skipped and break
 * the rings, so repetition never spans them. */
#define LG__TW_WORDS 64   /* word hashes kept: a 16-word block seen 4 times */
#define LG__TW_SENTS 32   /* sentence hashes kept: an 8-sentence block 3 times + 8 */
/* FNV-1a's offset bases: a fresh response's word and monologue hashes
 * (text.c), and so a fresh run's (persist.c). */
#define LG__FNV32_OFF 2166136261u
#define LG__FNV64_OFF 14695981039346656037ull
#define LG__LINE_HEAD 12  /* bytes of a line's start kept to tell its kind */
#define LG__ANSWER_MAX 16384 /* bytes of an ask_human / finalize_partial call kept */

enum { LG__LINE_START = 0, LG__LINE_PROSE, LG__LINE_SKIP };

typedef struct lg__text {
  bool open;                   /* a response is being read */
  int64_t turn;                /* its turn */
  bool looped;                 /* it was counted as looping already */
  uint8_t line;                /* LG__LINE_*: the current line's kind */
  bool fence;                  /* inside a ``` (or ~~~) block */
  uint8_t head_len;            /* bytes in head */
  uint8_t indent;              /* columns of indentation before head (a
                                  tab counts 4; 4 or more: indented code) */
  char head[LG__LINE_HEAD];    /* the line's first bytes, while its kind is
                                  not known yet (indentation dropped) */
  uint32_t word;               /* hash of the word being read */
  uint32_t word_len;           /* its bytes so far */
  uint32_t sent;               /* hash of the sentence being read */
  uint32_t sent_words;         /* its words so far */
  uint32_t words[LG__TW_WORDS];/* ring of the last words' hashes */
  int nwords, whead;           /* entries in use; where the next one goes */
  uint32_t sents[LG__TW_SENTS];/* ring of the last sentences' hashes */
  uint32_t sent_nw[LG__TW_SENTS]; /* and their word counts */
  int nsents, shead;
  /* Monologue: the response's whole text, white space collapsed. */
  uint64_t mono;               /* FNV-1a of it so far */
  int64_t mono_len;            /* bytes hashed */
  bool mono_space;             /* white space seen since the last byte */
  bool mono_void;              /* an executed call came after this text: it
                                  does not count toward a monologue */
} lg__text_t;

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

  /* Streaks since the last executed call. */
  int64_t block_streak;    /* blocked calls in a row */
  int64_t compactions;     /* compaction events */

  /* Text guards. */
  lg__text_t text;         /* the current response */
  int64_t text_loops;      /* responses with a text loop (text.repeat) */
  uint64_t mono_ref;       /* hash of the last finished response's text */
  int64_t mono_ref_len;    /* its length; 0: none */
  int64_t mono_run;        /* finished responses in a row with that text */

  /* Recovery cascade (after a block). */
  int hidden;              /* the tool hidden from the model, -1 none */
  int64_t hide_left;       /* model calls it stays hidden */
  bool offer_live;         /* cascade.offer tools may be called now */
  int64_t escalate_left;   /* model calls the escalation still lasts */
  uint8_t answer_kind;     /* 0, LG__ANS_QUESTION or LG__ANS_PARTIAL */
  bool answer_trunc;       /* answer was cut at LG__ANSWER_MAX (a string) */
  char *answer;            /* the call's canonical args, or NULL */

  /* The end. */
  bool stopped;
  lg_reason_t reason;
  char *reason_text;       /* a cancel: the operator's own words, or NULL
                              (the envelope's operator_note) */
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
/* Whether the run can take a result now: it has stopped (every event
 * gets the stop) or an executed call waits for one. When not,
 * lg_run_after refuses every result (LG_ENOTFOUND) whatever it holds, so
 * a front end may leave a result's value unread (the step's fill). */
bool lg__run_awaits_result(const lg_run_t *run);
/* Tool index for `name`, adding it; -1 on out-of-memory. */
int lg__run_tool(lg_run_t *run, const char *name);
/* Appends LG_ALT_* bits as a JSON array of their names, in bit order
 * ("ask_human", "skip_current", "finalize_partial", "escalate_model"). */
void lg__alternatives_json(lg__buf_t *b, unsigned alternatives);
/* Appends the counters' JSON object (lg_counters_to_json; envelope.c). */
void lg__counters_json(lg__buf_t *b, const lg_counters_t *c);

/* text.c: starts a new response (the previous one's text goes to the
 * monologue count). */
void lg__text_begin(lg_run_t *run, int64_t turn);
/* Reads a piece of the current response; true when it completed a text
 * loop in a response not counted yet (and counts it). */
bool lg__text_feed(lg_run_t *run, const char *s, size_t n);
/* Clears the whole text state (an episode, a resume). */
void lg__text_clear(lg_run_t *run);
/* An executed call: text so far no longer makes a monologue. */
void lg__text_call(lg_run_t *run);

/* Saturating sums of counters that are never negative. */
static inline int64_t lg__sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}

#endif
