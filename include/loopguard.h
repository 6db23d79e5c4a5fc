/*
 * loopguard.h — the one public header of libloopguard.
 *
 * loopguard stops AI agents that loop on tool calls. The library is a pure
 * decision engine (lg_run_*) fed with events — tool calls, tool results,
 * model calls, world snapshots, handoffs, cancels — that answers with
 * decisions: execute, block, replay, stop. Around it sit the parts that
 * touch the world: the canonicaliser and fingerprint (lg_canon_*), policy
 * files (lg_policy_*), trace replay (lg_replay_*) and the idempotency
 * ledger interface (lg_ledger_*) that the durable stores implement.
 *
 * Conventions, the same everywhere:
 *   - Functions that can fail return int: 0, or a negative LG_E* code.
 *     The optional lg_error_t * carries the detail (file, line, byte
 *     offset, field) and may be NULL.
 *   - Constructors return NULL on failure and fill *err.
 *   - lg_x_free(NULL) is a no-op.
 *   - Strings returned as `const char *` from a decision are borrowed from
 *     the run and stay valid until the next event is given to that run.
 *     Strings returned as `char *` are new and freed with lg_free().
 *   - Objects are not thread-safe unless said otherwise: use one lg_run_t
 *     and one lg_canon_t per thread at a time. Policies are immutable once
 *     parsed and may be shared between threads (their reference count is
 *     atomic).
 *   - Nothing aborts on out-of-memory: LG_ENOMEM is returned and the object
 *     is left as it was.
 */
#ifndef LOOPGUARD_H
#define LOOPGUARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LG_BUILDING) && defined(__GNUC__)
#define LG_EXPORT __attribute__((visibility("default")))
#else
#define LG_EXPORT
#endif

#define LG_VERSION_MAJOR 0
#define LG_VERSION_MINOR 1
#define LG_VERSION_PATCH 0
#define LG_VERSION_STRING "0.1.0"

/* Returns the library's version string, e.g. "0.1.0". Static storage. */
LG_EXPORT const char *lg_version(void);

/* ---------------------------------------------------------------------
 * Errors. One table generates the codes, lg_strerror() and lg_err_name().
 * Codes never change meaning between versions.
 * ------------------------------------------------------------------- */
#define LG_ERRNO_MAP(XX)                                                     \
  XX(ENOMEM, -1, "out of memory")                                            \
  XX(EINVAL, -2, "invalid argument")                                         \
  XX(EPARSE, -3, "malformed JSON")                                           \
  XX(EDEPTH, -4, "JSON nested too deeply")                                   \
  XX(ERANGE, -5, "number out of range")                                      \
  XX(EUTF8, -6, "invalid UTF-8")                                             \
  XX(EPOLICY, -7, "invalid policy")                                          \
  XX(ETRACE, -8, "invalid trace event")                                      \
  XX(EIO, -9, "input/output error")                                          \
  XX(ENOTFOUND, -10, "not found")                                            \
  XX(ESTATE, -11, "operation not valid in this state")                       \
  XX(ESTORE, -12, "storage backend error")                                   \
  XX(EBUSY, -13, "resource busy, try again")                                 \
  XX(ECONFLICT, -14, "conflict")                                             \
  XX(EDUPKEY, -15, "duplicate key in JSON object")                           \
  XX(ETOOBIG, -16, "input too large")                                        \
  XX(EPERM, -17, "not permitted")

typedef enum lg_errno {
  LG_OK = 0,
#define LG__XX(name, code, text) LG_##name = code,
  LG_ERRNO_MAP(LG__XX)
#undef LG__XX
} lg_errno_t;

/* Detail of an error. Every field is filled when known, else zero/empty. */
typedef struct lg_error {
  int code;            /* the LG_E* code also returned */
  long line;           /* 1-based line in `source`, 0 when not a line */
  long offset;         /* byte offset of the problem, -1 when unknown */
  char source[256];    /* file name or "<input>" */
  char field[128];     /* JSON path of the field, e.g. "repeat.blok" */
  char message[512];   /* a full sentence for a person */
} lg_error_t;

/* Static text for an error code ("out of memory"); "unknown error" else. */
LG_EXPORT const char *lg_strerror(int code);
/* Static name of an error code ("LG_ENOMEM"). */
LG_EXPORT const char *lg_err_name(int code);
/* Formats err as "source:line: field: message" (parts that are unknown are
 * left out) into buf; returns buf. */
LG_EXPORT char *lg_error_format(const lg_error_t *err, char *buf, size_t size);

/* ---------------------------------------------------------------------
 * Memory. Every allocation of the library (and of jansson, once this is
 * called) goes through these functions. Not thread-safe: call before any
 * other lg_ function. Pass NULLs to restore the defaults.
 * ------------------------------------------------------------------- */
typedef void *(*lg_malloc_fn)(size_t);
typedef void *(*lg_realloc_fn)(void *, size_t);
typedef void (*lg_free_fn)(void *);
LG_EXPORT void lg_set_allocator(lg_malloc_fn m, lg_realloc_fn r, lg_free_fn f);
/* Frees memory that a function of this library returned as `char *`. */
LG_EXPORT void lg_free(void *p);

/* ---------------------------------------------------------------------
 * Canonical JSON and fingerprints (RFC 8785, with exact big integers).
 * ------------------------------------------------------------------- */
#define LG_CANON_MAX_DEPTH 64 /* deeper nesting is LG_EDEPTH */
#define LG_FP_HEX 65          /* 64 hex digits and a NUL */

typedef struct lg_canon lg_canon_t;
typedef struct lg_policy lg_policy_t;

/* A reusable canonicaliser with its buffers. One per thread. Returns NULL
 * on out-of-memory. */
LG_EXPORT lg_canon_t *lg_canon_new(void);
LG_EXPORT void lg_canon_free(lg_canon_t *c);

/* Canonicalises one JSON text (any value) into the RFC 8785 form. On
 * success *out points at the canonical bytes (not NUL-terminated in
 * general; *out_len says how many), borrowed from `c` until its next use.
 * Errors: LG_EPARSE, LG_EUTF8, LG_EDEPTH, LG_ERANGE, LG_EDUPKEY, LG_ENOMEM,
 * with err->offset the byte offset in `json`. */
LG_EXPORT int lg_canon_json(lg_canon_t *c, const char *json, size_t len,
                            const char **out, size_t *out_len,
                            lg_error_t *err);

/* The fingerprint of a tool call: SHA-256 over tool + "\n" + canonical key
 * material, as 64 lowercase hex digits into hex[LG_FP_HEX]. The key
 * material is the call's arguments narrowed and normalised by the tool's
 * `loop_key` in `policy` (NULL: all arguments). When key_material is not
 * NULL it receives the canonical key material, borrowed from `c` until its
 * next use. A tool whose loop_key is false still gets a fingerprint of all
 * its arguments (it is simply never counted as a repeat). */
LG_EXPORT int lg_canon_fingerprint(lg_canon_t *c, const lg_policy_t *policy,
                                   const char *tool, const char *args,
                                   size_t args_len, char hex[LG_FP_HEX],
                                   const char **key_material, size_t *km_len,
                                   lg_error_t *err);

/* SHA-256 of bare bytes (the "keyMaterialVectors" form), as hex. */
LG_EXPORT int lg_canon_sha256_hex(lg_canon_t *c, const char *bytes,
                                  size_t len, char hex[LG_FP_HEX]);

/* ---------------------------------------------------------------------
 * Policies (policy-v1). Immutable once parsed; reference counted.
 * ------------------------------------------------------------------- */

/* The default policy (a new reference). NULL only on out-of-memory. */
LG_EXPORT lg_policy_t *lg_policy_default(void);
/* Parses a policy-v1 JSON object. Unknown or mistyped fields are
 * LG_EPOLICY with err->field naming the path ("repeat.blok"). Returns a new
 * reference or NULL. `source` names the input in messages (may be NULL). */
LG_EXPORT lg_policy_t *lg_policy_parse(const char *json, size_t len,
                                       const char *source, lg_error_t *err);
/* Reads and parses a policy file. */
LG_EXPORT lg_policy_t *lg_policy_load_file(const char *path, lg_error_t *err);
/* The effective policy as a JSON object with every default filled in.
 * Returns a new string (lg_free) or NULL on out-of-memory. */
LG_EXPORT char *lg_policy_to_json(const lg_policy_t *p);
LG_EXPORT lg_policy_t *lg_policy_ref(lg_policy_t *p);
/* Drops a reference; frees the policy with the last one. */
LG_EXPORT void lg_policy_free(lg_policy_t *p);

/* ---------------------------------------------------------------------
 * The idempotency ledger interface. The engine consults it for calls that
 * carry an idempotency key (given, or derived for tools with
 * side_effects). lg_ledger_memory_new() is the in-memory implementation;
 * the durable stores implement the same methods. Versioned like SQLite's
 * VFS: a newer struct keeps the older one as its prefix.
 * ------------------------------------------------------------------- */
typedef enum lg_claim_outcome {
  LG_CLAIM_FREE = 0,        /* peek only: nobody holds the key */
  LG_CLAIM_CLAIMED,         /* you hold it now: run the side effect */
  LG_CLAIM_REPLAY,          /* finished: here is the saved result */
  LG_CLAIM_IN_PROGRESS,     /* a live claim of someone else */
  LG_CLAIM_MISMATCH,        /* same key, different request fingerprint */
  LG_CLAIM_UNKNOWN_OUTCOME  /* a lease ran out with no outcome */
} lg_claim_outcome_t;

/* Static name: "free", "claimed", "replay", "in_progress", "mismatch",
 * "unknown_outcome". */
LG_EXPORT const char *lg_claim_outcome_name(lg_claim_outcome_t o);

#define LG_CLAIM_TOKEN_MAX 36 /* "ct_" + 32 hex digits + NUL */

typedef struct lg_claim {
  lg_claim_outcome_t outcome;
  char *result;        /* REPLAY: the saved result JSON (new; lg_free) */
  size_t result_len;
  int failed;          /* REPLAY of a final failure rather than a success */
  char claim_token[LG_CLAIM_TOKEN_MAX]; /* CLAIMED by a store: the token
                          that commit and fail by the claimant present
                          (lg_store_commit_as); "" otherwise */
} lg_claim_t;

typedef struct lg_ledger_methods {
  int version; /* 1 */
  /* Atomically claims `key` for `request_fp` (64 hex) with a lease; fills
   * out->outcome (never FREE). */
  int (*claim)(void *self, const char *key, const char *request_fp,
               const char *run_id, int64_t lease_ms, int64_t now_ms,
               lg_claim_t *out, lg_error_t *err);
  /* Reports the key's state without claiming (FREE when nobody holds it). */
  int (*peek)(void *self, const char *key, const char *request_fp,
              int64_t now_ms, lg_claim_t *out, lg_error_t *err);
  /* Saves the outcome of a claimed key; it replays from now on. */
  int (*commit)(void *self, const char *key, const char *result,
                size_t result_len, const char *operation_id, int64_t now_ms,
                lg_error_t *err);
  /* A failure: retryable frees the key, final keeps it (and replays). */
  int (*fail)(void *self, const char *key, int retryable, int64_t now_ms,
              lg_error_t *err);
  void (*destroy)(void *self);
} lg_ledger_methods_t;

typedef struct lg_ledger {
  const lg_ledger_methods_t *methods;
  void *self;
} lg_ledger_t;

/* An in-memory ledger (tests, replay). Free with lg_ledger_free(). */
LG_EXPORT lg_ledger_t *lg_ledger_memory_new(void);
/* Calls methods->destroy and frees the handle. */
LG_EXPORT void lg_ledger_free(lg_ledger_t *l);
/* Clears a claim's result. */
LG_EXPORT void lg_claim_clear(lg_claim_t *c);

/* ---------------------------------------------------------------------
 * The engine: one lg_run_t per agent run. Pure: no I/O, no clock (every
 * event carries its time in milliseconds since the run started), no
 * globals; the same events always give the same decisions.
 * ------------------------------------------------------------------- */
typedef enum lg_action {
  LG_ACT_EXECUTE = 0, /* run the tool / make the model call */
  LG_ACT_BLOCK,       /* do not run it; tell the model why */
  LG_ACT_REPLAY,      /* do not run it; hand back the saved result */
  LG_ACT_STOP,        /* end the run */
  LG_ACT_CONTINUE,    /* after a result: the run goes on */
  LG_ACT_OBSERVE      /* after text: the run goes on, and the model gets
                         the steer message (d->message) */
} lg_action_t;
LG_EXPORT const char *lg_action_name(lg_action_t a);

/* Stop and block reasons, by the names of policy-v1. New reasons are only
 * ever appended: saved runs keep reasons as these integers. */
#define LG_REASON_MAP(XX)                                                    \
  XX(NONE, "")                                                               \
  XX(STEP_CAP, "step_cap")                                                   \
  XX(MODEL_CALL_CAP, "model_call_cap")                                       \
  XX(TOOL_CALL_CAP, "tool_call_cap")                                         \
  XX(WALL_CLOCK_CAP, "wall_clock_cap")                                       \
  XX(COST_CAP, "cost_cap")                                                   \
  XX(TOKEN_CAP, "token_cap")                                                 \
  XX(HANDOFF_CAP, "handoff_cap")                                             \
  XX(SAME_CALL_REPEAT, "same_call_repeat")                                   \
  XX(SHORT_CYCLE, "short_cycle")                                             \
  XX(NO_PROGRESS, "no_progress")                                             \
  XX(FAILURE_STREAK, "failure_streak")                                       \
  XX(INVALID_TOOL_RESULT, "invalid_tool_result")                             \
  XX(COMPLETE, "complete")                                                   \
  XX(FATAL, "fatal")                                                         \
  XX(PERMISSION_DENIED, "permission_denied")                                 \
  XX(POLICY_BLOCKED, "policy_blocked")                                       \
  XX(HUMAN_REQUIRED, "human_required")                                       \
  XX(OPERATOR_CANCELLED, "operator_cancelled_loop")                          \
  XX(BUDGET_EXCEEDED, "budget_exceeded")                                     \
  XX(RETRY_TOO_SOON, "retry_too_soon")                                       \
  XX(IN_PROGRESS, "in_progress")                                             \
  XX(IDEMPOTENCY_MISMATCH, "idempotency_mismatch")                           \
  XX(UNKNOWN_OUTCOME, "unknown_outcome")                                     \
  XX(ALREADY_COMMITTED, "already_committed")                                 \
  XX(TEXT_REPEAT, "text_repeat")                                             \
  XX(MONOLOGUE, "monologue")                                                 \
  XX(CONTEXT_LOOP, "context_loop")                                           \
  XX(BLOCK_STREAK, "block_streak")

typedef enum lg_reason {
#define LG__XX(name, text) LG_R_##name,
  LG_REASON_MAP(LG__XX)
#undef LG__XX
  LG_R__COUNT
} lg_reason_t;
/* Static name ("same_call_repeat"); "" for LG_R_NONE. */
LG_EXPORT const char *lg_reason_name(lg_reason_t r);

/* What the caller may do after a stop. */
typedef enum lg_next {
  LG_NEXT_NONE = 0,             /* the run finished: nothing to do */
  LG_NEXT_HUMAN_REVIEW,         /* a person must look first */
  LG_NEXT_RESUME_AFTER_CHANGE   /* resume once the plan or input changed */
} lg_next_t;
LG_EXPORT const char *lg_next_name(lg_next_t n);

/* Alternatives offered to the model when a tool is hidden. */
#define LG_ALT_ASK_HUMAN 0x1u
#define LG_ALT_SKIP_CURRENT 0x2u
#define LG_ALT_FINALIZE_PARTIAL 0x4u
#define LG_ALT_ESCALATE_MODEL 0x8u

/* A decision. Strings are borrowed from the run until its next event. */
typedef struct lg_decision {
  lg_action_t action;
  lg_reason_t reason;         /* LG_R_NONE for execute and continue */
  const char *reason_text;    /* reason as text (an operator's own for a
                                 cancel); "" when none */
  const char *guard;          /* the guard that fired: "repeat", "cycle",
                                 "caps", "no_progress", "failure_streak",
                                 "retry", "validation", "status", "ledger",
                                 "kill_switch", "text", "monologue",
                                 "compaction", "block_streak", "cascade",
                                 "external"; "" when none */
  uint32_t repeat;            /* calls: the n-th identical call */
  char fingerprint[LG_FP_HEX];/* calls: the loop key's fingerprint */
  const char *call_id;        /* calls and results: the call's id */
  const char *idempotency_key;/* calls: given or derived key, or NULL */
  const char *message;        /* steer message for the model, or NULL */
  const char *hide_tool;      /* a tool to hide from the model, or NULL:
                                 set on a block (for cascade.hide_turns
                                 model calls) and on every model call let
                                 through while that tool is still hidden */
  uint32_t hide_turns;        /* for how many more model calls */
  unsigned alternatives;      /* LG_ALT_* offered instead: cascade.offer
                                 with hide_tool; on a stop, what the
                                 envelope lists */
  const char *saved_result;   /* replay: the saved result JSON */
  size_t saved_result_len;
  lg_next_t next_allowed_action; /* stop: what may happen next */
  int64_t reservation;        /* model calls let through: the id that
                                 lg_run_usage() settles */
  const char *escalate_model; /* cascade.escalate: on a block, and on model
                                 calls let through while the escalation
                                 lasts, the model to use instead; or NULL */
  uint32_t escalate_turns;    /* model calls the escalation still lasts */
  const char *operator_note;  /* a stop by a cancel: the operator's own
                                 words, or NULL (the reason stays
                                 operator_cancelled_loop) */
} lg_decision_t;

/* A tool call as the model asked for it. Zero-fill it and set `tool`
 * (and `args`): every other field's zero is the obvious default. */
typedef struct lg_call {
  const char *tool;            /* required */
  const char *args;            /* JSON object text; NULL means {} */
  size_t args_len;             /* 0: args is NUL-terminated */
  int64_t turn;                /* model turn; calls of one turn share it
                                  (identical calls in one turn count once);
                                  0: a turn of its own */
  const char *call_id;         /* NULL: the run names it "c<N>" */
  const char *idempotency_key; /* NULL: derived for side_effects tools */
  const char *agent;           /* may be NULL */
  int64_t t_ms;                /* time since the run started */
  /* Optional: a caller that already canonicalised the arguments with the
   * run's policy (lg_canon_fingerprint) passes the result here and the
   * engine does not do it again. key_material may then be NULL. */
  const char *fingerprint;     /* 64 hex digits, or NULL */
  const char *key_material;
  size_t key_material_len;
} lg_call_t;

/* Tool result statuses of trace-v1. LG_STATUS_INVALID for a missing or
 * unknown one (the validation gate stops the run on it). */
typedef enum lg_status {
  LG_STATUS_INVALID = 0,
  LG_STATUS_PROGRESS,
  LG_STATUS_COMPLETE,
  LG_STATUS_RETRYABLE,
  LG_STATUS_FATAL,
  LG_STATUS_PERMISSION_DENIED,
  LG_STATUS_POLICY_BLOCKED,
  LG_STATUS_HUMAN_REQUIRED
} lg_status_t;
/* Parses a status name; LG_STATUS_INVALID when unknown or NULL. */
LG_EXPORT lg_status_t lg_status_parse(const char *s, size_t len);
LG_EXPORT const char *lg_status_name(lg_status_t s);

/* Presence of the optional value of a result. */
typedef enum lg_value_kind {
  LG_VALUE_ABSENT = 0, /* no `value` field: fine */
  LG_VALUE_NULL,       /* null: a failure unless empty_ok */
  LG_VALUE_BLANK,      /* a string of white space only: the same */
  LG_VALUE_PRESENT     /* anything else */
} lg_value_kind_t;

/* What a tool answered. Zero-fill it and set `status`: every other
 * field's zero means "not given". */
typedef struct lg_result {
  const char *call_id;        /* NULL: the latest call */
  lg_status_t status;
  int has_progress_version;
  int64_t progress_version;
  int side_effect_committed;  /* 1 the tool says its side effect happened;
                                 0 not said; -1 the tool says it did not
                                 (the same as 0 to the engine; traces keep
                                 the difference) */
  int64_t retry_after_ms;     /* 0 (or below): no wait asked for */
  lg_value_kind_t value_kind; /* LG_VALUE_ABSENT (0): no value */
  const char *value;          /* JSON text of value (saved by the ledger) */
  size_t value_len;           /* 0: value is NUL-terminated */
  const char *operation_id;   /* may be NULL */
  int64_t t_ms;
} lg_result_t;

typedef struct lg_model_call {
  const char *model;          /* may be NULL */
  int64_t turn;
  int64_t input_tokens;
  int64_t max_tokens;         /* -1 absent: output_tokens is the worst case */
  int64_t output_tokens;      /* -1 absent (live: unknown before the call) */
  int64_t cost_nusd;          /* worst-case cost in nano-USD, -1 unknown */
  int64_t t_ms;
} lg_model_call_t;

/* Counters of a run, as the envelope reports them. */
typedef struct lg_counters {
  int64_t steps;              /* tool calls executed */
  int64_t calls;              /* tool calls asked for */
  int64_t blocked;
  int64_t replayed;
  int64_t model_calls;        /* paid model calls let through */
  int64_t cost_nusd;          /* their cost, nano-USD */
  int64_t tokens;             /* their input + output tokens */
  int64_t handoffs;
  int64_t results;
  int64_t last_t_ms;
} lg_counters_t;

typedef struct lg_run lg_run_t;

/* Starts a run. `policy` is referenced (NULL: the default); `ledger` is
 * borrowed and must outlive the run (NULL: the run makes a private
 * in-memory one). `checkpoint` is the progress_version to resume from, or
 * NULL. run_id is required; group may be NULL. */
LG_EXPORT lg_run_t *lg_run_new(const char *run_id, const char *group,
                               lg_policy_t *policy, const int64_t *checkpoint,
                               lg_ledger_t *ledger, lg_error_t *err);
LG_EXPORT void lg_run_free(lg_run_t *run);

/* Before a tool executes. `canon` is scratch for the fingerprint. Fills
 * *d. Returns LG_EINVAL / LG_EPARSE / ... for a malformed call (nothing in
 * the run changes) and LG_ESTORE when the ledger failed (nothing changes
 * either: decide again).
 *
 * The recovery cascade. Every block carries it: hide_tool (the blocked
 * tool) with hide_turns = cascade.hide_turns and alternatives =
 * cascade.offer (as LG_ALT_* bits), unless hide_turns is 0; and
 * escalate_model / escalate_turns when cascade.escalate is set. The
 * block_streak-th blocked call in a row (no executed call between) is not
 * blocked but stops the run (block_streak). After a block the offered
 * tools are live until the first model call that no longer hides the tool
 * has been let through: a call named "ask_human" (when offered) then stops
 * the run with human_required and its canonical arguments as the
 * envelope's "question"; "finalize_partial" stops it with complete and the
 * arguments as "partial" (guard "cascade"; decided before the caps, since
 * neither runs a tool). Outside that, they are calls like any other. */
LG_EXPORT int lg_run_before(lg_run_t *run, lg_canon_t *canon,
                            const lg_call_t *call, lg_decision_t *d,
                            lg_error_t *err);
/* After a tool ran. LG_ENOTFOUND when call_id names no executed call that
 * is waiting for its result. */
LG_EXPORT int lg_run_after(lg_run_t *run, const lg_result_t *res,
                           lg_decision_t *d, lg_error_t *err);
/* Before a paid model call: caps on model calls, wall clock, cost and
 * tokens, decided on the worst case so that they are never overshot (every
 * sum saturates at INT64_MAX: a huge input stops at the cap, never wraps
 * past it). A call let through after a block carries the cascade: while a
 * tool is hidden, hide_tool, hide_turns (the model calls it stays hidden,
 * this one included; each call let through counts one down) and
 * alternatives (cascade.offer); while the escalation lasts, escalate_model
 * and escalate_turns (the same way). */
LG_EXPORT int lg_run_model(lg_run_t *run, const lg_model_call_t *m,
                           lg_decision_t *d, lg_error_t *err);
/* After a model call that was let through: its real tokens and cost
 * settle the reservation `reservation` (from the decision of lg_run_model;
 * 0: the oldest one still open). LG_ENOTFOUND when there is no such
 * reservation. */
LG_EXPORT int lg_run_usage(lg_run_t *run, int64_t reservation,
                           int64_t input_tokens, int64_t output_tokens,
                           int64_t cost_nusd, int64_t t_ms);
/* A world-state snapshot (a JSON object): no-progress by world steps. */
LG_EXPORT int lg_run_state(lg_run_t *run, lg_canon_t *canon,
                           const char *world, size_t len, int64_t t_ms,
                           lg_decision_t *d, lg_error_t *err);
/* One agent hands the task to another: the handoff cap. */
LG_EXPORT int lg_run_handoff(lg_run_t *run, const char *from, const char *to,
                             int64_t t_ms, lg_decision_t *d, lg_error_t *err);
/* The kill switch: the run stops now, with the terminal reason
 * operator_cancelled_loop whatever `reason` says; the operator's own words
 * (`reason`, may be NULL) are kept beside it, as the decision's and the
 * envelope's operator_note. Fills *d with the stop. */
LG_EXPORT int lg_run_cancel(lg_run_t *run, const char *reason, int64_t t_ms,
                            lg_decision_t *d);
/* A stop decided outside the engine (a shared budget refused the call, a
 * framework raised its max-turns error): the run ends with `reason`. */
LG_EXPORT int lg_run_stop(lg_run_t *run, lg_reason_t reason, const char *text,
                          int64_t t_ms, lg_decision_t *d);

/* Text the model wrote (trace-v1 `text`). Pieces with the same `turn` are
 * consecutive pieces of one response (a stream), checked as they arrive; a
 * new turn starts a new response. `text` is `len` bytes of UTF-8 (a piece
 * may end in the middle of a character: the next piece continues it);
 * `agent` may be NULL. d->action: LG_ACT_CONTINUE, LG_ACT_OBSERVE
 * (d->message is the steer, in the first person), or LG_ACT_STOP
 * (text_repeat / monologue; guard "text" / "monologue"; or the run's stop
 * when it had stopped).
 *
 * Two guards look at text. Chanting: the end of one response keeps
 * repeating one block of itself (a sentence or paragraph repeated, or a
 * block of up to 16 words repeated 4 times or more, adjacent); fenced code,
 * table rows, list items and divider lines are not counted, and a phrase
 * that comes back far apart is not a loop. A response counts once, on the
 * piece that completes the loop; the n-th looping response of the run takes
 * the text.repeat ladder (observe, then stop). Monologue: the same text
 * (white space collapsed) as the whole text of text.monologue consecutive
 * model turns with no executed call between stops the run, on the piece
 * that makes the turn's text equal to the previous turns'. The detector
 * keeps a fixed-size state per run (a window of the current response's last
 * bytes and a few hashes). Errors: LG_EINVAL (text NULL with len > 0). */
LG_EXPORT int lg_run_text(lg_run_t *run, int64_t turn, const char *text, size_t len,
                          const char *agent, int64_t t_ms, lg_decision_t *d,
                          lg_error_t *err);
/* A new message from the person: a new episode (trace-v1 `user`). The
 * repeat window, cycles, no-progress counters, failure streaks, the block
 * streak, text and monologue state (the text.repeat count too), the
 * compaction count and the cascade (hidden tool, offer, escalation) start
 * again; caps, counters, cost, budgets, retry waits, the best
 * progress_version and the ledger carry on. d->action CONTINUE (or the
 * run's STOP when it had stopped). Cannot fail. */
LG_EXPORT int lg_run_user(lg_run_t *run, int64_t t_ms, lg_decision_t *d);
/* The agent's context was summarized or trimmed (trace-v1 `compaction`):
 * CONTINUE, or STOP / context_loop (guard "compaction") at the
 * compaction.max-th compaction with no executed call between. Returns 0,
 * or LG_ENOMEM with the run unchanged. */
LG_EXPORT int lg_run_compaction(lg_run_t *run, int64_t t_ms, lg_decision_t *d);
/* Resumes a run stopped with next_allowed_action resume_after_change,
 * after the operator changed something. progress_version (may be NULL)
 * becomes the new checkpoint (a new window, as confirmed progress).
 * Returns LG_ESTATE with err->message saying why when the run is active, or
 * its stop cannot be resumed (caps, operator cancel, budget_exceeded,
 * complete, fatal, ... anything whose next_allowed_action is not
 * resume_after_change); the run is then unchanged. On success the run is
 * active again: the repeat window, cycles, streaks (failure, block,
 * no-progress, text, compaction) and the cascade start afresh, as for
 * lg_run_user; caps, counters, cost, tokens and the ledger carry on; the
 * envelope forgets the stop and the call it refused; d->action CONTINUE. */
LG_EXPORT int lg_run_resume(lg_run_t *run, const int64_t *progress_version, int64_t t_ms,
                            lg_decision_t *d, lg_error_t *err);

LG_EXPORT const char *lg_run_id(const lg_run_t *run);
LG_EXPORT const char *lg_run_group(const lg_run_t *run);
LG_EXPORT const lg_policy_t *lg_run_policy(const lg_run_t *run);
/* 1 once the run has stopped. */
LG_EXPORT int lg_run_stopped(const lg_run_t *run);
/* The terminal reason as text, or NULL while the run is active. */
LG_EXPORT const char *lg_run_terminal_reason(const lg_run_t *run);
LG_EXPORT void lg_run_counters(const lg_run_t *run, lg_counters_t *out);
/* The terminal envelope (docs/engine.md) as a JSON object: also for a run
 * still active (terminal_reason null). New string (lg_free), NULL on
 * out-of-memory. */
LG_EXPORT char *lg_run_envelope_json(const lg_run_t *run);

/* Serialises the run's whole state (not its policy) into a new buffer
 * (lg_free), so that a store can save it after each decision. */
LG_EXPORT int lg_run_save(const lg_run_t *run, char **buf, size_t *len);
/* Restores a run saved by lg_run_save, with its policy and ledger. The
 * restored run decides exactly as the saved one would have. */
LG_EXPORT lg_run_t *lg_run_load(const char *buf, size_t len,
                                lg_policy_t *policy, lg_ledger_t *ledger,
                                lg_error_t *err);

/* ---------------------------------------------------------------------
 * Events: the one way anything reaches a run. Every front end — the trace
 * reader, the HTTP routes, the CLI's cancel, the gateway — turns its input
 * into lg_event_t values, and lg_run_apply() gives each to the engine.
 * The trace writer writes each applied event back as one trace-v1 line,
 * so that replaying a run's trace applies the very same events.
 * ------------------------------------------------------------------- */
typedef enum lg_event_type {
  LG_EV_RUN = 1,    /* starts a run (trace-v1 `run`; not applied) */
  LG_EV_MODEL,      /* a paid model call, before it is made */
  LG_EV_CALL,       /* the model asks for a tool call */
  LG_EV_RESULT,     /* what the tool answered */
  LG_EV_STATE,      /* a world-state snapshot */
  LG_EV_HANDOFF,    /* one agent hands the task to another */
  LG_EV_CANCEL,     /* an operator stops the run */
  LG_EV_TEXT,       /* text the model wrote (a piece of a response) */
  LG_EV_USER,       /* a new message from the person: a new episode */
  LG_EV_COMPACTION, /* the agent's context was summarized or trimmed */
  LG_EV_BUDGET,     /* a shared budget refused a model call */
  LG_EV_USAGE,      /* a model call's real usage, after it */
  LG_EV_RESUME,     /* an operator resumes a run stopped for a change */
  LG_EV_STOP        /* a stop decided outside the engine (the gateway's
                       re-asks ran out; a framework's max-turns error) */
} lg_event_type_t;
/* Static name, as trace-v1 spells it ("call", "usage"); "" when unknown. */
LG_EXPORT const char *lg_event_type_name(lg_event_type_t t);
/* The type named `name` (trace-v1's spelling), or 0 when unknown. */
LG_EXPORT lg_event_type_t lg_event_type_parse(const char *name);

/* One event. Zero-fill it, set `type`, `t_ms` and the member of `u` that
 * the type names; strings are borrowed for the call. The t_ms inside
 * u.call, u.result and u.model is ignored: the event's own t_ms counts. */
typedef struct lg_event {
  lg_event_type_t type;
  int64_t t_ms;               /* ms since the run started */
  union {
    lg_call_t call;           /* LG_EV_CALL */
    lg_result_t result;       /* LG_EV_RESULT */
    struct {                  /* LG_EV_MODEL */
      lg_model_call_t m;
      int settled;            /* 1: the event also carries the call's real
                                 usage (m.output_tokens, m.cost_nusd), as a
                                 trace's model line does, and it is settled
                                 at once; 0: a later LG_EV_USAGE settles it */
    } model;
    struct {                  /* LG_EV_USAGE */
      int64_t reservation;    /* the model decision's, 0: the oldest open */
      int64_t input_tokens, output_tokens;
      int64_t cost_nusd;      /* the real cost, -1 unknown */
    } usage;
    struct { const char *world; size_t len; } state; /* LG_EV_STATE */
    struct { const char *from, *to; } handoff;        /* LG_EV_HANDOFF */
    struct {                  /* LG_EV_CANCEL */
      const char *reason;     /* the operator's words, or NULL */
    } cancel;
    struct {                  /* LG_EV_TEXT */
      int64_t turn;           /* pieces of one response share it */
      const char *text;
      size_t len;             /* 0: text is NUL-terminated */
      const char *agent;      /* may be NULL */
    } text;
    struct { const char *text; } user;                 /* LG_EV_USER */
    struct {                  /* LG_EV_BUDGET */
      const char *scope;      /* the scope that refused */
      const char *limit_source; /* "key_limit", "workspace_budget", ... */
      int64_t requested_nusd; /* the worst case refused */
    } budget;
    struct {                  /* LG_EV_RESUME */
      int has_progress_version;
      int64_t progress_version; /* the new checkpoint */
      const char *note;       /* what changed, or NULL */
    } resume;
    struct {                  /* LG_EV_STOP */
      lg_reason_t reason;     /* one of the stop reasons */
      const char *message;    /* what the envelope says happened, or NULL */
    } stop;
  } u;
} lg_event_t;

/* Applies one event to a run and fills *d with the decision: calls
 * lg_run_before, results lg_run_after, model calls lg_run_model (and
 * lg_run_usage at once when u.model.settled), and so on. `canon` is
 * scratch (calls and world snapshots). Returns what the engine function
 * returns; LG_EINVAL for LG_EV_RUN or an unknown type (nothing changes). */
LG_EXPORT int lg_run_apply(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev,
                           lg_decision_t *d, lg_error_t *err);

/* ---------------------------------------------------------------------
 * Stores (memory:, sqlite:PATH, postgres:CONNINFO): the durable ledger,
 * run state and the kill switch.
 * ------------------------------------------------------------------- */
/* STORE-API-BEGIN (owned by the store module) */
/*
 * A store is opened by URL: "memory:" (private to the handle, for tests and
 * replay), "sqlite:PATH" (one file, WAL; several processes may share it) or
 * "postgres:CONNINFO" (libpq key=value or postgres:// URI; several machines
 * may share it). The store creates and migrates its own schema: a file or
 * database written by an older release opens in a newer one; one written by
 * a newer release is refused with LG_ESTORE.
 *
 * Every function that takes an lg_store_t may be called from several
 * threads on one handle: calls on a handle serialize on its own lock. For
 * parallelism open one handle per thread (sqlite:, postgres:). Backend
 * errors are translated: a lock not obtained within busy_timeout_ms is
 * LG_EBUSY (try again); anything else the backend refuses (a dropped
 * connection, a full disk, a corrupt file) is LG_ESTORE, with the backend's
 * text in err->message and the store named in err->source. On an error
 * nothing of the failed call was written.
 *
 * Time is always an argument (now_ms: milliseconds since the Unix epoch,
 * the caller's clock); the store never reads a clock itself.
 * ------------------------------------------------------------------- */
typedef struct lg_store lg_store_t;

#define LG_STORE_SCHEMA_VERSION 7 /* the schema this release writes */
#define LG_STORE_DEFAULT_RETENTION_MS (24LL * 60 * 60 * 1000)
#define LG_STORE_DEFAULT_LEASE_MS 60000
#define LG_STORE_DEFAULT_BUSY_TIMEOUT_MS 5000

/* Options of lg_store_open(); zero means the default for every field. */
typedef struct lg_store_options {
  int64_t retention_ms;  /* finished ledger rows replay this long, then
                            count as gone and are purged (default 24 h) */
  int64_t lease_ms;      /* lease of a claim that gives none (<= 0): 60 s */
  int busy_timeout_ms;   /* wait this long for a lock before LG_EBUSY
                            (default 5 s; negative: do not wait) */
  int durability;        /* LG_STORE_DURABLE or LG_STORE_RELAXED; the URL
                            parameter durability=full|relaxed overrides */
  int no_create;         /* 1: open only a store that exists: a sqlite: file
                            that is not there is LG_ENOTFOUND (field "url"),
                            nothing is created. For read-only commands. */
} lg_store_options_t;

/* Durability of run transactions (decisions); ledger claims, commits,
 * fails, deny rules and budget writes are always durable. DURABLE (the
 * default): a decision is acknowledged only once it is on disk (SQLite
 * synchronous=FULL, PostgreSQL synchronous_commit=on), so no acknowledged
 * decision is lost to a crash of the process, of PostgreSQL or of the
 * machine. RELAXED: SQLite synchronous=NORMAL for run transactions (a
 * crash of the process loses nothing; a power cut or OS crash may lose
 * the last decisions), PostgreSQL synchronous_commit=off (a crash of the
 * PostgreSQL server or its machine may lose the last decisions, up to
 * about 3 × wal_writer_delay). A decision that claimed a key is durable
 * in both. */
#define LG_STORE_DURABLE 0
#define LG_STORE_RELAXED 1

/* Opens (and creates or migrates) the store named by `url`; `opts` may be
 * NULL. Returns a new handle (lg_store_close) or NULL with err filled:
 * LG_EINVAL for a URL of no known scheme, LG_ESTORE when the backend cannot
 * be opened or its schema is newer than this release, LG_EBUSY when another
 * process held the schema lock longer than busy_timeout_ms. */
LG_EXPORT lg_store_t *lg_store_open(const char *url,
                                    const lg_store_options_t *opts,
                                    lg_error_t *err);
/* Closes the store; a transaction left open is rolled back. NULL: no-op. */
LG_EXPORT void lg_store_close(lg_store_t *s);
/* "memory", "sqlite" or "postgres". Static storage. */
LG_EXPORT const char *lg_store_scheme(const lg_store_t *s);
/* The store's URL with any password hidden, for messages. Borrowed from s. */
LG_EXPORT const char *lg_store_name(const lg_store_t *s);
/* The schema version found in the store (LG_STORE_SCHEMA_VERSION once
 * open). */
LG_EXPORT int lg_store_schema_version(lg_store_t *s, int *version,
                                      lg_error_t *err);

/* ---- the durable idempotency ledger ----
 *
 * A key moves through these states (lg_op_state_t):
 *   (none) --claim--> IN_PROGRESS --commit--> COMMITTED (replays its result)
 *                          |   \--fail--> FAILED (final; replays a failure)
 *                          |   \--fail(retryable)--> (none): the key is free
 *                          \--lease runs out--> UNKNOWN_OUTCOME
 * UNKNOWN_OUTCOME is IN_PROGRESS whose lease ended with no outcome: nobody
 * knows whether the side effect happened, so a claim answers
 * LG_CLAIM_UNKNOWN_OUTCOME and never runs it again by itself. An operator
 * (or a reconcile check) resolves it with commit (it happened: here is its
 * result), fail (it did not, and must not be retried) or fail(retryable)
 * (it did not: free the key). A claim with a different request fingerprint
 * than the key's is LG_CLAIM_MISMATCH whatever the state. COMMITTED and
 * FAILED rows are kept retention_ms after their last change, then count as
 * gone (a claim takes the key afresh) and lg_store_purge() deletes them.
 * Claims, commits and fails return only once they are durable (SQLite
 * synchronous=FULL, a PostgreSQL commit). */

/* The ledger interface of the store, for lg_run_new()/lg_run_load(). It
 * passes now_ms through unchanged, so the caller's times must be epoch ms.
 * Borrowed: owned by the store, valid until lg_store_close(); never give it
 * to lg_ledger_free(). */
LG_EXPORT lg_ledger_t *lg_store_ledger(lg_store_t *s);
/* A ledger over the store for an engine whose times are relative to a
 * start (a run's t_ms): it adds epoch_ms to every now_ms it is given.
 * Returns a new handle (lg_ledger_free; the store must outlive it) or NULL
 * on out-of-memory. */
LG_EXPORT lg_ledger_t *lg_store_ledger_at(lg_store_t *s, int64_t epoch_ms);

/* Claims `key` (1 to 1024 bytes) for the request fingerprint `request_fp`
 * (1 to 256 bytes, normally 64 hex digits) with a lease of lease_ms (<= 0:
 * the store's default). run_id may be NULL. Exactly one concurrent
 * claimant of a free key gets LG_CLAIM_CLAIMED, whatever the number of
 * processes or machines; the others see IN_PROGRESS, REPLAY, MISMATCH or
 * UNKNOWN_OUTCOME as above. out->result is new (lg_claim_clear). Returns 0
 * or LG_EINVAL / LG_EBUSY / LG_ESTORE / LG_ENOMEM (nothing claimed). */
LG_EXPORT int lg_store_claim(lg_store_t *s, const char *key,
                             const char *request_fp, const char *run_id,
                             int64_t lease_ms, int64_t now_ms, lg_claim_t *out,
                             lg_error_t *err);
/* What a claim would answer, without claiming: LG_CLAIM_FREE for a free
 * key. request_fp may be NULL (no mismatch check). */
LG_EXPORT int lg_store_peek(lg_store_t *s, const char *key,
                            const char *request_fp, int64_t now_ms,
                            lg_claim_t *out, lg_error_t *err);
/* Records the outcome of a claimed key: `result` (JSON text, may be NULL)
 * replays from now on. Resolves UNKNOWN_OUTCOME the same way. On a key
 * already finished it changes nothing and returns 0 (the first outcome
 * stands). LG_ENOTFOUND when the key is not in the ledger. */
LG_EXPORT int lg_store_commit(lg_store_t *s, const char *key,
                              const char *result, size_t result_len,
                              const char *operation_id, int64_t now_ms,
                              lg_error_t *err);
/* Records a failure of a claimed key. retryable: the key is freed (the
 * next claim wins it); final: the key is kept as FAILED and replays as a
 * failure (lg_claim_t.failed). fail(retryable) also frees a FAILED key (an
 * operator's decision to allow a retry); on a COMMITTED key it changes
 * nothing and returns 0. LG_ENOTFOUND when the key is not in the ledger. */
LG_EXPORT int lg_store_fail(lg_store_t *s, const char *key, int retryable,
                            int64_t now_ms, lg_error_t *err);

/* Who is settling a key, for lg_store_commit_as() / lg_store_fail_as().
 * lg_store_commit() and lg_store_fail() trust their caller (the engine
 * settling its own claim, a reconcile job); a front end that acts for
 * others (the HTTP server, the CLI) says who it acts for:
 *   - an operator may settle any key, also a claim that is not its own and
 *     an UNKNOWN_OUTCOME one, and free a FAILED key; what it does is
 *     recorded in the row (resolved_by = `who`, resolved_ms), and a key it
 *     frees is kept as a record that reads LG_OP_FREE until a claim takes
 *     it or purge removes it;
 *   - anyone else must be the claimant: present the claim_token of the
 *     claim (lg_claim_t.claim_token) while the key is claimed. The
 *     claimant may commit after its lease ran out (it knows the side
 *     effect happened), but not fail it: once the lease ran out the
 *     outcome is unknown to everyone else, and only an operator resolves
 *     it. A claim made before schema 6 has no token: its claimant is
 *     trusted as before.
 * A settler that may not is LG_EPERM, with a message saying who may;
 * nothing changes. Commit of a finished key changes nothing and is 0 for
 * anyone (the first outcome stands); freeing a FAILED key is an
 * operator's. */
typedef struct lg_op_actor {
  int operator;            /* 1: an operator */
  const char *claim_token; /* the claimant's token, or NULL */
  const char *who;         /* an operator's name for the record ("cli:alice",
                              "http:operator"); NULL: "operator" */
} lg_op_actor_t;

/* lg_store_commit() as `as` (NULL: as lg_store_commit()). */
LG_EXPORT int lg_store_commit_as(lg_store_t *s, const char *key,
                                 const char *result, size_t result_len,
                                 const char *operation_id,
                                 const lg_op_actor_t *as, int64_t now_ms,
                                 lg_error_t *err);
/* lg_store_fail() as `as` (NULL: as lg_store_fail()). */
LG_EXPORT int lg_store_fail_as(lg_store_t *s, const char *key, int retryable,
                               const lg_op_actor_t *as, int64_t now_ms,
                               lg_error_t *err);

typedef enum lg_op_state {
  LG_OP_IN_PROGRESS = 1,  /* claimed, lease still running */
  LG_OP_UNKNOWN_OUTCOME,  /* claimed, lease ran out, no outcome */
  LG_OP_COMMITTED,        /* outcome saved: replays its result */
  LG_OP_FAILED,           /* final failure: replays a failure */
  LG_OP_FREE              /* freed by an operator: the row is the record
                             of it (lg_store_fail_as); a claim takes it */
} lg_op_state_t;
/* Static name: "in_progress", "unknown_outcome", "committed", "failed",
 * "free". */
LG_EXPORT const char *lg_op_state_name(lg_op_state_t s);

/* One ledger row as an operator sees it. Strings are new (lg_operation_clear). */
typedef struct lg_operation {
  char *key;
  lg_op_state_t state;   /* as of the now_ms it was read with */
  char *request_fp;      /* fingerprint of the claim */
  char *run_id;          /* NULL when the claim named no run */
  char *result;          /* COMMITTED: the saved result, or NULL */
  size_t result_len;
  char *operation_id;    /* given with the commit, or NULL */
  int64_t created_ms;    /* when it was claimed */
  int64_t updated_ms;    /* its last change */
  int64_t lease_until_ms;/* end of the claim's lease */
  char *resolved_by;     /* an operator's outcome: who recorded it, or NULL */
  int64_t resolved_ms;   /* ... and when (0: none) */
} lg_operation_t;

/* Reads one key (LG_ENOTFOUND when absent or past retention). */
LG_EXPORT int lg_store_operation(lg_store_t *s, const char *key,
                                 int64_t now_ms, lg_operation_t *out,
                                 lg_error_t *err);
LG_EXPORT void lg_operation_clear(lg_operation_t *op);
/* The row as the JSON object of GET /v1/operations/{key}: key, state,
 * run_id, request_fingerprint, result (when committed), operation_id,
 * created_at, updated_at, lease_until, resolved_by, resolved_at (RFC 3339,
 * UTC, milliseconds; resolved_*: null unless an operator settled it). New
 * string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_operation_to_json(const lg_operation_t *op);
/* Deletes COMMITTED and FAILED rows whose last change is older than
 * older_than_ms before now_ms (negative: the store's retention; 0: every
 * finished row). Claims
 * (IN_PROGRESS, UNKNOWN_OUTCOME) are never purged: they wait for an outcome.
 * *purged (may be NULL) receives the number of rows deleted. */
LG_EXPORT int lg_store_purge(lg_store_t *s, int64_t older_than_ms,
                             int64_t now_ms, int64_t *purged, lg_error_t *err);

/* ---- run state ---- */

/* A run as stored. Strings are new (lg_run_record_clear). */
typedef struct lg_run_record {
  char *run_id;
  char *group;            /* NULL when none */
  int stopped;            /* status: 0 "active", 1 "stopped" */
  char *terminal_reason;  /* NULL while active */
  char *policy_json;      /* lg_policy_to_json() of the run's policy */
  char *state;            /* lg_run_save() bytes (binary) */
  size_t state_len;
  char *envelope_json;    /* lg_run_envelope_json() after the last decision */
  int64_t created_ms;     /* epoch ms */
  int64_t updated_ms;
} lg_run_record_t;
LG_EXPORT void lg_run_record_clear(lg_run_record_t *r);
/* The record as a JSON object: run_id, group, status, terminal_reason,
 * created_at, updated_at, and envelope (the stored envelope object, or
 * null). New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_run_record_to_json(const lg_run_record_t *r);

/* Stores a new run. LG_ECONFLICT when run_id is already stored (nothing
 * changes). Run state is kept durable against a crash of the process, not
 * of the machine (SQLite synchronous=NORMAL, PostgreSQL
 * synchronous_commit=off): losing the last decision's counters costs at
 * most one more repeated call, never a second side effect. */
LG_EXPORT int lg_store_run_create(lg_store_t *s, const lg_run_record_t *rec,
                                  lg_error_t *err);
/* Stores a run whether or not it exists (an existing run keeps its
 * created_ms). */
LG_EXPORT int lg_store_run_put(lg_store_t *s, const lg_run_record_t *rec,
                               lg_error_t *err);
/* Reads a run into *out (LG_ENOTFOUND when absent). */
LG_EXPORT int lg_store_run_get(lg_store_t *s, const char *run_id,
                               lg_run_record_t *out, lg_error_t *err);

typedef struct lg_run_filter {
  const char *status;    /* "active", "stopped" or NULL for both */
  const char *reason;    /* terminal reason, or NULL */
  const char *group;     /* or NULL */
  size_t limit;          /* at most this many; 0: no limit */
} lg_run_filter_t;
/* Called once per run; the record (without policy_json and state, which
 * are NULL) is borrowed for the call. A non-zero return stops the listing
 * and is returned. */
typedef int (*lg_store_run_cb)(void *ud, const lg_run_record_t *rec);
/* Lists runs newest first (by creation). `f` may be NULL. */
LG_EXPORT int lg_store_run_list(lg_store_t *s, const lg_run_filter_t *f,
                                lg_store_run_cb cb, void *ud, lg_error_t *err);

/* Called by lg_store_with_run() with the run locked; `rec` (the run as
 * stored, borrowed for the call) is the state to decide from. Everything
 * the function does on `s` — lg_store_run_put, ledger claims through
 * lg_store_ledger(s), lg_store_denied — is one transaction: a zero return
 * commits it, a non-zero one rolls it back and is returned. */
typedef int (*lg_store_run_fn)(void *ud, lg_store_t *s,
                               const lg_run_record_t *rec);
/* Runs fn for run_id under the run's lock (SQLite: BEGIN IMMEDIATE;
 * PostgreSQL: SELECT ... FOR UPDATE of the run's row; memory: the handle's
 * lock), so that two workers deciding for one run, in any processes, give
 * the answers one worker would. If the transaction included a ledger write
 * it is committed durably. LG_ENOTFOUND (fn not called) when the run is not
 * stored; LG_ESTATE when called from inside fn; LG_EBUSY when the lock was
 * not had within busy_timeout_ms; else fn's return or a store error (then
 * nothing fn wrote is kept: discard the decision it made). */
LG_EXPORT int lg_store_with_run(lg_store_t *s, const char *run_id,
                                lg_store_run_fn fn, void *ud, lg_error_t *err);

/* Saves an engine run: its state (lg_run_save), policy, group, status,
 * terminal reason and envelope, at now_ms. Inserts or replaces. */
LG_EXPORT int lg_store_run_save(lg_store_t *s, const lg_run_t *run,
                                int64_t now_ms, lg_error_t *err);
/* Loads the run saved under run_id into a new lg_run_t (lg_run_free) that
 * decides exactly as the saved one would; `ledger` is given to
 * lg_run_load (borrowed; NULL: a private in-memory one). LG_ENOTFOUND when
 * absent, LG_ESTATE when the stored state cannot be read back. */
LG_EXPORT int lg_store_run_load(lg_store_t *s, const char *run_id,
                                lg_ledger_t *ledger, lg_run_t **out,
                                lg_error_t *err);

/* The run's trace-v1 file (new; lg_free), *len its length (len may be
 * NULL): the events of its decisions as the store kept them, so that
 * `loopguard replay` on it gives the same decisions — how an incident in
 * production becomes a regression test. A run created before the store
 * kept traces (schema version 5) gives a file that starts with an
 * "# incomplete" comment. LG_ENOTFOUND when the run is not stored. */
LG_EXPORT int lg_store_run_trace(lg_store_t *s, const char *run_id, char **text, size_t *len,
                                 lg_error_t *err);

/* ---- the kill switch ---- */

/* Cancels a run: writes a durable deny rule for run_id with the operator's
 * reason (NULL: operator_cancelled_loop), then, when the run is stored and
 * active, stops it (lg_run_cancel) and saves it. Works before the run
 * exists: its first decision will stop. */
LG_EXPORT int lg_store_cancel_run(lg_store_t *s, const char *run_id,
                                  const char *reason, int64_t now_ms,
                                  lg_error_t *err);
/* Resumes a stored run stopped with next_allowed_action
 * resume_after_change, once the operator changed something: a resume
 * event through the decision step (lg_run_resume), recorded in the run's
 * trace. progress_version (may be NULL) is the new checkpoint; note (may
 * be NULL) says what changed and is kept in the trace. LG_ENOTFOUND when
 * the run is not stored; LG_ESTATE, with err->message saying why, when it
 * is active or its stop cannot be resumed (a cap, a cancel, a budget, a
 * final status): nothing changes then. */
LG_EXPORT int lg_store_resume_run(lg_store_t *s, const char *run_id,
                                  const int64_t *progress_version, const char *note,
                                  int64_t now_ms, lg_error_t *err);
/* Cancels a group: a durable deny rule for every run of the group, present
 * and future; the active stored runs of the group are stopped and saved.
 * *cancelled_json (may be NULL) receives a JSON array of their ids (new;
 * lg_free). */
LG_EXPORT int lg_store_cancel_group(lg_store_t *s, const char *group,
                                    const char *reason, int64_t now_ms,
                                    char **cancelled_json, lg_error_t *err);
/* Checks the deny rules for a run and its group (group may be NULL).
 * Returns 1 when denied (*reason, when not NULL, receives the operator's
 * reason as a new string, or NULL when none was given), 0 when not, or a
 * negative error. Call it before every decision, under the run's lock:
 * when denied, stop the run with lg_run_cancel(run, reason, ...) before
 * any side effect. */
LG_EXPORT int lg_store_denied(lg_store_t *s, const char *run_id,
                              const char *group, char **reason,
                              lg_error_t *err);
/* STORE-API-END */

/* BUDGET-API-BEGIN (owned by the budget module) */
/* ---------------------------------------------------------------------
 * The spend gate (docs/budget.md): prices, the worst case of a model call,
 * and shared budgets for any scope ("key:...", "workspace:...", "team:...",
 * "customer:...", any name) kept in a store (memory:, sqlite:, postgres:).
 *
 * Amounts. Budgets and the store count integer micro-dollars (1e-6 USD,
 * "micro"); the engine counts nano-dollars (lg_model_call_t.cost_nusd,
 * "nusd"). The conversions below are the only ones: USD (a double from
 * JSON or a command line) is rounded to the nearest micro-dollar, and
 * nano-dollars are rounded UP to micro-dollars, so that a hold never
 * covers less than the engine decided on and spent never counts less
 * than was charged.
 *
 * Time is always an argument (now_ms, epoch milliseconds): nothing here
 * reads a clock, so tests set the time they want.
 *
 * A budget: a limit in USD for a period — daily (from 00:00 UTC), weekly
 * (from Monday 00:00 UTC), monthly (from the 1st, 00:00 UTC) or none —
 * and optionally a cap on what may be held by calls in flight. Before a
 * paid call, a reservation holds its worst case against every scope that
 * covers it, all or none, in one transaction; afterwards the settlement
 * moves the real cost from reserved to spent. Whatever the concurrency,
 * spent + reserved never exceeds a limit, with two exceptions that are
 * real money already spent: a settlement above its reservation (the
 * provider charged more than the worst case), and a settlement that comes
 * after the reservation's TTL ran out. A reservation not settled within
 * its TTL stops holding at that instant (a crashed agent cannot pin a
 * budget). See docs/budget.md.
 *
 * Functions return 0 or a negative LG_E* code with err filled (the store
 * named in err->source); lg_budget_reserve() also returns
 * LG_BUDGET_REFUSED. Store errors are those of the stores (LG_EBUSY: try
 * again; LG_ESTORE). On any error or refusal nothing was written.
 * ------------------------------------------------------------------- */

/* ---- amounts ---- */
#define LG_BUDGET_NUSD_PER_MICRO 1000        /* nano-dollars in a micro-dollar */
#define LG_BUDGET_MAX_USD 1000000000.0       /* larger amounts are LG_ERANGE */
#define LG_BUDGET_MAX_MICRO 1000000000000000LL /* LG_BUDGET_MAX_USD in micro */

/* USD to micro-dollars, rounded to the nearest. LG_EINVAL for NaN,
 * infinity or a negative amount; LG_ERANGE above LG_BUDGET_MAX_USD.
 * `what` names the amount in err ("limit_usd"); may be NULL. */
LG_EXPORT int lg_budget_usd_to_micro(double usd, int64_t *micro, const char *what,
                                     lg_error_t *err);
/* Nano-dollars to micro-dollars, rounded up; negative gives 0. */
LG_EXPORT int64_t lg_budget_nusd_to_micro(int64_t nusd);
/* Micro-dollars to nano-dollars (saturates at INT64_MAX). */
LG_EXPORT int64_t lg_budget_micro_to_nusd(int64_t micro);

/* ---- prices ----
 * A price file (JSON; docs/budget.md):
 *   {"models": {"MODEL": {"input_usd_per_mtok": 2.5,
 *                         "output_usd_per_mtok": 10,
 *                         "cached_input_usd_per_mtok": 1.25,   (optional)
 *                         "max_output_tokens": 16384}, ...},    (optional)
 *    "default": {...the same fields...},                        (optional)
 *    "default_max_tokens": 4096}                                (optional)
 * Prices are USD per million tokens, kept exactly to 1e-6 USD per million
 * tokens. A model is looked up by its exact name; one not listed takes
 * "default" when there is one, else it has no price and a call to it is
 * refused (fail closed). Parsed price tables are immutable and reference
 * counted: share them between threads freely. */
typedef struct lg_prices lg_prices_t;

/* One model's price. Amounts are micro-dollars per million tokens (USD
 * per million tokens times 10^6), which is also pico-dollars per token. */
typedef struct lg_price {
  int64_t input_per_mtok;        /* input tokens */
  int64_t output_per_mtok;       /* output tokens */
  int64_t cached_input_per_mtok; /* cached input tokens (input's when absent) */
  int64_t max_output_tokens;     /* the model's own output cap, -1 unknown */
  int is_default;                /* 1: the model is not listed; "default" */
} lg_price_t;

/* Parses a price file's JSON. Unknown fields and wrong types are LG_EINVAL
 * with err->field naming the path ("models.gpt-4o.input_usd_per_mtok");
 * malformed JSON is LG_EPARSE with the line. `source` names the input in
 * messages (may be NULL). Returns a new reference or NULL. */
LG_EXPORT lg_prices_t *lg_prices_parse(const char *json, size_t len, const char *source,
                                       lg_error_t *err);
/* Reads and parses a price file (LG_EIO when it cannot be read). */
LG_EXPORT lg_prices_t *lg_prices_load_file(const char *path, lg_error_t *err);
LG_EXPORT lg_prices_t *lg_prices_ref(lg_prices_t *p);
/* Drops a reference; frees with the last one. NULL: no-op. */
LG_EXPORT void lg_prices_free(lg_prices_t *p);
/* Models listed (the default not counted). */
LG_EXPORT size_t lg_prices_count(const lg_prices_t *p);
/* Where the table came from (the file name or "<input>"). Borrowed. */
LG_EXPORT const char *lg_prices_source(const lg_prices_t *p);
/* The price of `model` (NULL: the default). LG_ENOTFOUND, with a message
 * naming the model and the price file, when it has none. */
LG_EXPORT int lg_prices_lookup(const lg_prices_t *p, const char *model, lg_price_t *out,
                               lg_error_t *err);
/* The worst case of a model call, in nano-dollars, rounded up:
 * input_tokens at the input price plus max_tokens at the output price.
 * max_tokens < 0 (absent) takes the model's max_output_tokens, else the
 * file's default_max_tokens, else the call is LG_EINVAL (field
 * "max_tokens": its output has no bound). LG_ENOTFOUND (field "model")
 * when the model has no price; LG_EINVAL for negative tokens; LG_ERANGE
 * when the figure overflows. p may be NULL (no price file: every model is
 * LG_ENOTFOUND). */
LG_EXPORT int lg_prices_worst_case(const lg_prices_t *p, const char *model,
                                   int64_t input_tokens, int64_t max_tokens, int64_t *nusd,
                                   lg_error_t *err);
/* The cost of a finished call from its usage, in nano-dollars, rounded
 * up: cached_input_tokens (part of input_tokens, 0 when unknown) at the
 * cached price, the rest of the input at the input price, output at the
 * output price. Errors as lg_prices_worst_case. */
LG_EXPORT int lg_prices_cost(const lg_prices_t *p, const char *model, int64_t input_tokens,
                             int64_t cached_input_tokens, int64_t output_tokens,
                             int64_t *nusd, lg_error_t *err);

/* A price book: the current price table of a long-running process, that a
 * reload replaces atomically (SIGHUP in the server). Readers take a
 * reference (lg_price_book_get) and keep using that table for the whole
 * request, whatever reloads happen meanwhile. Thread-safe. */
typedef struct lg_price_book lg_price_book_t;
/* A book loaded from `path` (NULL: an empty book, no prices). NULL with
 * err filled when the file cannot be read or parsed. */
LG_EXPORT lg_price_book_t *lg_price_book_new(const char *path, lg_error_t *err);
/* Reads the book's file again. On success the new table replaces the old
 * one for every later lg_price_book_get(); on failure (err says why: file,
 * line, field) the old table stays in use. LG_ESTATE for a book with no
 * file. */
LG_EXPORT int lg_price_book_reload(lg_price_book_t *b, lg_error_t *err);
/* Replaces the table with `p` (a reference is taken; NULL empties it). */
LG_EXPORT void lg_price_book_set(lg_price_book_t *b, lg_prices_t *p);
/* The current table: a new reference (lg_prices_free), or NULL when the
 * book is empty. */
LG_EXPORT lg_prices_t *lg_price_book_get(lg_price_book_t *b);
/* Frees the book (tables still referenced elsewhere live on). NULL: no-op. */
LG_EXPORT void lg_price_book_free(lg_price_book_t *b);

/* ---- periods ---- */
typedef enum lg_budget_period {
  LG_PERIOD_NONE = 0, /* never resets */
  LG_PERIOD_DAILY,    /* from 00:00 UTC */
  LG_PERIOD_WEEKLY,   /* from Monday 00:00 UTC */
  LG_PERIOD_MONTHLY   /* from the 1st, 00:00 UTC */
} lg_budget_period_t;
/* Static name: "none", "daily", "weekly", "monthly". */
LG_EXPORT const char *lg_budget_period_name(lg_budget_period_t p);
/* Parses a period name; LG_EINVAL (naming the choices) otherwise. */
LG_EXPORT int lg_budget_period_parse(const char *name, lg_budget_period_t *out,
                                     lg_error_t *err);
/* The period that contains now_ms: [*start_ms, *end_ms). For
 * LG_PERIOD_NONE *start_ms is 0 and *end_ms -1 (never). Either pointer may
 * be NULL. LG_EINVAL for an unknown period. */
LG_EXPORT int lg_budget_period_bounds(lg_budget_period_t p, int64_t now_ms, int64_t *start_ms,
                                      int64_t *end_ms);

/* ---- scopes ---- */
#define LG_BUDGET_SCOPE_MAX 256   /* bytes of a scope name */
#define LG_BUDGET_MAX_SCOPES 16   /* scopes of one reservation */
#define LG_BUDGET_ID_MAX 40       /* a reservation id and its NUL */

/* A scope's kind, from its name: "key:..." and "workspace:..." are their
 * own; every other name ("team:...", "customer:...", "nightly") is
 * LG_SCOPE_OTHER. The kind says how a refusal is reported. */
typedef enum lg_scope_kind {
  LG_SCOPE_OTHER = 0, /* 402, limit_source "scope_budget" */
  LG_SCOPE_KEY,       /* 402, limit_source "key_limit" */
  LG_SCOPE_WORKSPACE  /* 403, limit_source "workspace_budget" */
} lg_scope_kind_t;
LG_EXPORT lg_scope_kind_t lg_budget_scope_kind(const char *scope);
/* 0 when `scope` is a valid scope name (1 to LG_BUDGET_SCOPE_MAX bytes of
 * UTF-8 without control characters), else LG_EINVAL saying why. */
LG_EXPORT int lg_budget_scope_check(const char *scope, lg_error_t *err);

/* ---- budgets ---- */

/* A budget as of the now_ms it was read with. */
typedef struct lg_budget {
  char scope[LG_BUDGET_SCOPE_MAX + 1];
  int64_t limit_micro;          /* the limit of each period */
  lg_budget_period_t period;
  int64_t max_in_flight_micro;  /* cap on reserved_micro, -1 none */
  int64_t spent_micro;          /* settled in the current period */
  int64_t reserved_micro;       /* held by open reservations (not expired) */
  int64_t open_reservations;    /* how many hold it */
  int64_t period_start_ms;      /* start of the current period; 0 for none */
  int64_t resets_at_ms;         /* when spent goes back to 0; -1 never */
  int64_t next_expiry_ms;       /* no later than when the first open
                                   reservation runs out (one settled early
                                   may have been it); -1 when none is open */
  int64_t created_ms;
  int64_t updated_ms;           /* last change of limit, period or spent */
} lg_budget_t;

/* limit - spent - reserved, or 0 when that is negative. */
LG_EXPORT int64_t lg_budget_remaining(const lg_budget_t *b);
/* The object of PUT/GET /v1/budgets/{scope}: scope, limit_usd, period,
 * spent_usd, reserved_usd, resets_at (RFC 3339 UTC, null for period
 * none), max_in_flight_usd (or null), remaining_usd, open_reservations.
 * New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_budget_to_json(const lg_budget_t *b);

/* Creates the budget of `scope` or changes its limit, period and
 * max_in_flight (max_in_flight_micro < 0: none). What was spent in the
 * current period and the reservations in flight are kept; a new period
 * starts at the start of the period that contains now_ms. *out (may be
 * NULL) receives the budget as it is now. LG_EINVAL for a bad scope,
 * amount (> LG_BUDGET_MAX_MICRO or negative) or period. Durable on
 * return. */
LG_EXPORT int lg_budget_set(lg_store_t *s, const char *scope, int64_t limit_micro,
                            lg_budget_period_t period, int64_t max_in_flight_micro,
                            int64_t now_ms, lg_budget_t *out, lg_error_t *err);
/* Reads a budget as of now_ms (a period that ended reads as spent 0;
 * expired reservations are not counted). LG_ENOTFOUND when the scope has
 * no budget. Changes nothing. */
LG_EXPORT int lg_budget_get(lg_store_t *s, const char *scope, int64_t now_ms,
                            lg_budget_t *out, lg_error_t *err);
/* Called once per budget, by scope name in byte order; `b` is borrowed
 * for the call. A non-zero return stops the listing and is returned. */
typedef int (*lg_budget_cb)(void *ud, const lg_budget_t *b);
LG_EXPORT int lg_budget_list(lg_store_t *s, int64_t now_ms, lg_budget_cb cb, void *ud,
                             lg_error_t *err);
/* Zeroes what was spent in the current period; the limit, the period and
 * the reservations in flight stay. LG_ENOTFOUND when there is no budget. */
LG_EXPORT int lg_budget_reset(lg_store_t *s, const char *scope, int64_t now_ms,
                              lg_budget_t *out, lg_error_t *err);

/* ---- reservations ---- */
#define LG_BUDGET_DEFAULT_TTL_MS 600000LL   /* 10 minutes */
#define LG_BUDGET_MAX_TTL_MS 86400000LL     /* 24 hours */
#define LG_BUDGET_REFUSED 1                 /* lg_budget_reserve: refused */

/* Why a reservation was refused: what the error object of http-api-v1
 * carries. The first scope that refuses is reported, limits before
 * in-flight caps (a 429 is only answered when waiting can help). */
typedef struct lg_budget_refusal {
  int http_status;          /* 402, 403 or 429 */
  const char *type;         /* "budget_exceeded" or "rate_limited" (429) */
  const char *limit_source; /* "key_limit", "workspace_budget",
                               "scope_budget" or "in_flight_budget" */
  lg_scope_kind_t kind;     /* of `scope` */
  char scope[LG_BUDGET_SCOPE_MAX + 1];
  int64_t remaining_micro;  /* what the scope could still take */
  int64_t requested_micro;  /* what the reservation asked for */
  int64_t limit_micro;      /* the limit (or max_in_flight) passed */
  int64_t resets_at_ms;     /* the scope's period end; -1 for none */
  int64_t retry_after_s;    /* 429: the Retry-After header (>= 1); else 0 */
  char message[512];        /* a sentence for the client */
} lg_budget_refusal_t;

/* The error body of http-api-v1 for a refusal:
 * {"error":{"code":402,"type":"budget_exceeded","message":"...",
 *   "metadata":{"limit_source":"key_limit","scope":"key:a",
 *   "remaining_usd":0.5,"requested_usd":0.75,
 *   "resets_at":"2025-03-01T00:00:00.000Z"}}}
 * (resets_at null for period none; a 429 also has retry_after_s in the
 * metadata). New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_budget_refusal_json(const lg_budget_refusal_t *r);
/* Only the "metadata" object of it. New string (lg_free). */
LG_EXPORT char *lg_budget_refusal_metadata_json(const lg_budget_refusal_t *r);

/* What to reserve. */
typedef struct lg_budget_request {
  const char *const *scopes; /* 1 to LG_BUDGET_MAX_SCOPES scopes, no
                                duplicates, each with a budget */
  size_t nscopes;
  int64_t amount_micro;      /* the worst case, 0 to LG_BUDGET_MAX_MICRO */
  int64_t ttl_ms;            /* <= 0: LG_BUDGET_DEFAULT_TTL_MS; at most
                                LG_BUDGET_MAX_TTL_MS */
  const char *run_id;        /* the run it is for, or NULL */
  int64_t run_seq;           /* the engine's reservation number in that
                                run (lg_decision_t.reservation), or 0 */
  const char *model;         /* kept to price the settlement, or NULL */
} lg_budget_request_t;

/* A reservation made. */
typedef struct lg_budget_reservation {
  char id[LG_BUDGET_ID_MAX]; /* "rsv_" and 32 hex digits */
  int64_t amount_micro;
  int64_t created_ms;
  int64_t expires_ms;        /* created_ms + ttl */
} lg_budget_reservation_t;

/* Reserves req->amount_micro against every scope of the request, all or
 * none, atomically in the store (SQLite: one BEGIN IMMEDIATE transaction;
 * PostgreSQL: the budgets' rows locked FOR UPDATE in scope order;
 * memory: the handle's lock). Returns 0 with *out filled (durable), or
 * LG_BUDGET_REFUSED with *refusal filled (may be NULL) and nothing
 * written, when for some scope spent + reserved + amount > limit, or
 * reserved + amount > max_in_flight. Errors: LG_EINVAL (no scope, a
 * duplicate or malformed scope — err->field "scopes[i]" —, a negative or
 * too large amount or TTL), LG_ENOTFOUND (a scope with no budget, named),
 * store errors. Inside lg_store_with_run() it joins the run's transaction. */
LG_EXPORT int lg_budget_reserve(lg_store_t *s, const lg_budget_request_t *req, int64_t now_ms,
                                lg_budget_reservation_t *out, lg_budget_refusal_t *refusal,
                                lg_error_t *err);
/* The 201 answer of POST /v1/budgets/reserve: {reservation_id,
 * expires_at, amount_usd}. New string (lg_free). */
LG_EXPORT char *lg_budget_reservation_json(const lg_budget_reservation_t *r);

/* A settlement made. */
typedef struct lg_budget_settlement {
  char id[LG_BUDGET_ID_MAX];
  int64_t reserved_micro;  /* what the reservation held */
  int64_t actual_micro;    /* what was charged to every scope */
  int late;                /* settled at or after its TTL: it no longer held */
  int capped;              /* lg_budget_settle_bounded() charged less than
                              asked: the bound (also kept in the row) */
  int64_t asked_micro;     /* what the settler asked to charge */
  size_t nscopes;
  lg_budget_t *scopes;     /* each scope after the settlement, by name
                              (new: lg_budget_settlement_clear) */
} lg_budget_settlement_t;

/* Settles a reservation: on every scope it covers, its hold ends and
 * actual_micro is added to the current period's spent — also when the
 * actual is above the reservation (the provider charged it; the budget
 * may then pass its limit by that difference) and also after the TTL ran
 * out (`late`: the money was spent all the same). actual 0 releases a
 * reservation whose call was not made. `out` may be NULL. Errors:
 * LG_ENOTFOUND (no such reservation, or forgotten by purge), LG_ECONFLICT
 * (already settled: nothing changes), LG_EINVAL (a negative or too large
 * actual), store errors. Durable on return; joins a run's transaction. */
LG_EXPORT int lg_budget_settle(lg_store_t *s, const char *reservation_id,
                               int64_t actual_micro, int64_t now_ms,
                               lg_budget_settlement_t *out, lg_error_t *err);
/* The most lg_budget_settle_bounded() charges, as a multiple of the
 * reservation: 1, so that an untrusted settler keeps spent + reserved <=
 * limit like everyone else. */
#define LG_BUDGET_SETTLE_MAX_FACTOR 1
/* lg_budget_settle() for a settler that is not trusted with the budget
 * (an agent over HTTP): it charges at most the reservation ×
 * LG_BUDGET_SETTLE_MAX_FACTOR. A larger actual is charged at that bound,
 * and the settlement says so (out->capped, out->asked_micro; the
 * reservation row keeps what was asked). An operator, or the engine
 * pricing a usage itself, settles with lg_budget_settle(). */
LG_EXPORT int lg_budget_settle_bounded(lg_store_t *s, const char *reservation_id,
                                       int64_t actual_micro, int64_t now_ms,
                                       lg_budget_settlement_t *out, lg_error_t *err);
LG_EXPORT void lg_budget_settlement_clear(lg_budget_settlement_t *st);
/* The 200 answer of POST /v1/budgets/settle: {reservation_id,
 * reserved_usd, actual_usd, late, capped, asked_usd (when capped), scopes:
 * [lg_budget_to_json objects]}.
 * New string (lg_free). */
LG_EXPORT char *lg_budget_settlement_json(const lg_budget_settlement_t *st);

/* Housekeeping: deletes the rows of holds that have expired (they stopped
 * counting at their expiry already) and forgets reservations whose TTL
 * ended more than older_than_ms before now_ms (negative: the store's
 * retention; settling one after that is LG_ENOTFOUND). *purged (may be
 * NULL) receives the number of reservations forgotten. */
LG_EXPORT int lg_budget_purge(lg_store_t *s, int64_t older_than_ms, int64_t now_ms,
                              int64_t *purged, lg_error_t *err);

/* ---- runs: the spend gate for model calls ---- */

/* 0 when `scopes` could be a run's or a reservation's: 1 to
 * LG_BUDGET_MAX_SCOPES valid names, none twice (LG_EINVAL), each with a
 * budget in `s` (LG_ENOTFOUND); err->field names the one at fault
 * ("scopes[2]"). Changes nothing: check before creating a run, so that a
 * run is never created with scopes it cannot use. */
LG_EXPORT int lg_budget_scopes_check(lg_store_t *s, const char *const *scopes, size_t n,
                                     lg_error_t *err);

/* Stores the scopes a run's model calls reserve against (replacing any
 * given before; n 0 removes them). Every scope must have a budget
 * (LG_ENOTFOUND naming it) and appear once (LG_EINVAL). Call it when the
 * run is created (POST /v1/runs {scopes}). */
LG_EXPORT int lg_budget_run_scopes_set(lg_store_t *s, const char *run_id,
                                       const char *const *scopes, size_t n, lg_error_t *err);
/* The run's scopes as a JSON array of strings ("[]" when none). New
 * string (lg_free) in *json. */
LG_EXPORT int lg_budget_run_scopes(lg_store_t *s, const char *run_id, char **json,
                                   lg_error_t *err);

/* ---- keys (gateway-v1 "Keys"; docs/keys.md) ----
 * A loopguard key: a secret ("lgk-" and 40 random characters) that a
 * client calls the gateway with, stored only as its SHA-256, and a spend
 * limit that rides on the shared budget "key:ID" (ID: the hash of the
 * key's first secret, which rotation keeps). Each function answers the
 * JSON of its route in a new string *out (lg_free): create and rotate
 * {key, hash, ...} with the secret, shown this once; update and show the
 * key ({hash, id, name, limit_usd, limit_reset, workspace, usage_usd,
 * reserved_usd, limit_remaining_usd, disabled, created_at, ...}; show and
 * self add usage_daily_usd, usage_weekly_usd, usage_monthly_usd); list
 * {keys: [...]}. `json` is a creation or update body: {name, limit_usd?,
 * limit_reset?, workspace?, include_byok_in_limit?, rate_limit_per_min?,
 * models?, byok?} (update: any of them, and disabled); a bad field is
 * LG_EINVAL naming it. `ref` is a key's hash or id (LG_ENOTFOUND).
 * lg_key_self: the key of a secret (LG_EPERM: unknown, rotated or
 * disabled). Store errors as the budgets'. */
#define LG_KEY_PREFIX "lgk-"
LG_EXPORT int lg_key_create(lg_store_t *s, const char *json, size_t len, int64_t now_ms,
                            char **out, lg_error_t *err);
LG_EXPORT int lg_key_update(lg_store_t *s, const char *ref, const char *json, size_t len,
                            int64_t now_ms, char **out, lg_error_t *err);
LG_EXPORT int lg_key_rotate(lg_store_t *s, const char *ref, int64_t now_ms, char **out,
                            lg_error_t *err);
LG_EXPORT int lg_key_show(lg_store_t *s, const char *ref, int64_t now_ms, char **out,
                          lg_error_t *err);
LG_EXPORT int lg_key_list(lg_store_t *s, int64_t now_ms, char **out, lg_error_t *err);
LG_EXPORT int lg_key_self(lg_store_t *s, const char *secret, int64_t now_ms, char **out,
                          lg_error_t *err);

/* What lg_budget_model() did beside its decision. */
typedef struct lg_budget_gate {
  int refused;                 /* a shared budget refused: `refusal` says why */
  lg_budget_refusal_t refusal;
  char reservation_id[LG_BUDGET_ID_MAX]; /* the shared reservation made, ""
                                            when none (no scopes, not let
                                            through) */
  int64_t worst_nusd;          /* the worst case decided on, -1 unknown
                                  (write it to the trace as the cost) */
} lg_budget_gate_t;

/* POST /v1/runs/{id}/model: the whole spend gate for one model call of a
 * run loaded from `s` (call it inside lg_store_with_run). In order:
 *   1. the worst case: m->cost_nusd when the client gave one, the price
 *      table's figure (lg_prices_worst_case) when the model has a price,
 *      the larger of the two when both; a model with no price and no
 *      cost is refused (LG_ENOTFOUND, field "model", naming it) — unless
 *      neither the run's policy (max_cost_usd) nor any scope needs a cost;
 *   2. the run's scopes (lg_budget_run_scopes_set): a reservation of the
 *      worst case against all of them. Refused by a limit: the run stops
 *      with budget_exceeded (d is the stop; out->refused, out->refusal for
 *      the answer's metadata), return 0. Refused by an in-flight cap: the
 *      run does not change and LG_BUDGET_REFUSED is returned (answer 429
 *      with out->refusal, Retry-After out->refusal.retry_after_s);
 *   3. the engine (lg_run_model) with that worst case: its caps decide;
 *      if it does not let the call through, the shared reservation is
 *      undone.
 * `prices` may be NULL; ttl_ms <= 0 is LG_BUDGET_DEFAULT_TTL_MS; m->t_ms
 * is the run's time, now_ms the epoch time. */
LG_EXPORT int lg_budget_model(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                              const lg_model_call_t *m, int64_t ttl_ms, int64_t now_ms,
                              lg_decision_t *d, lg_budget_gate_t *out, lg_error_t *err);
/* POST /v1/runs/{id}/usage: settles the run's reservation `reservation`
 * (0: the oldest open one) in the engine and, when the run has scopes, in
 * the shared budgets. The actual cost: cost_nusd when >= 0; else the
 * tokens at the model's price when the model (kept with the shared
 * reservation) has one; else the worst case that was held. *actual_nusd
 * (may be NULL) receives it. LG_ENOTFOUND when the run has no such open
 * reservation (nothing changes). */
LG_EXPORT int lg_budget_usage(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                              int64_t reservation, int64_t input_tokens,
                              int64_t output_tokens, int64_t cost_nusd, int64_t t_ms,
                              int64_t now_ms, int64_t *actual_nusd, lg_error_t *err);
/* BUDGET-API-END */

/* SERVER-API-BEGIN */
/* ---------------------------------------------------------------------
 * The HTTP sidecar (http-api-v1): `loopguard serve` is a thin shell over
 * these functions. The server runs its own threads (libmicrohttpd, a
 * thread pool sized to the machine); every decision for a run is made
 * under the run's lock in the store and stored before it is answered.
 * The library installs no signal handler: the caller decides what a
 * signal means (the CLI maps SIGTERM/SIGINT to lg_server_shutdown and
 * SIGHUP to lg_server_reopen_log). Secrets (tokens, store passwords) are
 * never written to logs, traces or the banner.
 * ------------------------------------------------------------------- */
typedef struct lg_server lg_server_t;

#define LG_SERVER_DEFAULT_LISTEN "127.0.0.1:8787"
#define LG_SERVER_DEFAULT_MAX_BODY (1024 * 1024) /* bytes */
#define LG_SERVER_DEFAULT_TIMEOUT_S 30
#define LG_SERVER_DEFAULT_TRACE_MEMORY (256u * 1024 * 1024) /* not used */

/* Options of lg_server_start(); zero / NULL means the default for every
 * field. Strings are copied. */
typedef struct lg_server_options {
  const char *listen;       /* "HOST:PORT" or "[V6]:PORT"; port 0 takes any
                               free port (lg_server_port says which) */
  const char *store_url;    /* required: memory:, sqlite:PATH, postgres:... */
  const char *tokens_file;  /* "ROLE TOKEN" a line (# comments); or NULL */
  const char *tokens;       /* "ROLE TOKEN;ROLE TOKEN" (LOOPGUARD_TOKENS's
                               form); or NULL. Roles: agent, operator */
  const char *policy_file;  /* default policy of new runs; NULL: built-in */
  const char *prices_file;  /* model prices (docs/budget.md), reloaded by
                               lg_server_reopen_log; or NULL */
  int threads;              /* HTTP worker threads; 0: for sqlite: and
                               memory: one per online core less one (their
                               group commit has a thread of its own), for
                               postgres: four per core, at most 32 */
  size_t max_body;          /* larger request bodies are 413; 0: 1 MiB */
  int timeout_s;            /* a connection idle this long, or a body not
                               received in this time, is cut off; 0: 30 */
  const char *log_path;     /* structured log (JSON lines); NULL: stderr */
  size_t trace_memory;      /* not used: a run's trace lines are rows of
                               the store (schema 5); kept for source
                               compatibility */
  int64_t (*clock)(void *ud); /* epoch ms; NULL: CLOCK_REALTIME (tests
                               pass a fixed clock) */
  void *clock_ud;
  /* The gateway (gateway-v1, docs/gateway.md): on when an upstream is
   * given. Each entry is "URL" or "NAME=URL"; the first is the default. */
  const char *const *upstreams;
  size_t nupstreams;
  const char *upstreams_file; /* --upstreams FILE (JSON), or NULL */
  int64_t reservation_ttl_ms; /* a model request's reservation without a
                                 settlement; 0: the upstream's timeout
                                 plus a minute */
} lg_server_options_t;

/* Starts a server: opens the store (failing early when it cannot), loads
 * the tokens and the default policy, binds the address and starts serving
 * on threads of its own. Refuses (LG_EINVAL, err saying why) to bind a
 * non-loopback address when no token is configured. Returns a new server
 * (lg_server_free) or NULL with err filled. While it runs, lg_server_port,
 * lg_server_banner and lg_server_reopen_log may be called from any thread;
 * lg_server_shutdown and lg_server_free from one thread, after them. */
LG_EXPORT lg_server_t *lg_server_start(const lg_server_options_t *opts,
                                       lg_error_t *err);
/* The TCP port the server listens on. */
LG_EXPORT int lg_server_port(const lg_server_t *srv);
/* The lines to print at start: where it listens (a URL), the store
 * (without password), whether auth is on, the default policy's source,
 * and how to reach it. New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_server_banner(const lg_server_t *srv);
/* Reopens the log file (after log rotation; SIGHUP). 0 or LG_EIO (the old
 * file stays in use). */
LG_EXPORT int lg_server_reopen_log(lg_server_t *srv);
/* Graceful stop: stops accepting connections, lets requests in flight
 * finish (at most drain_ms; <= 0: 10 s), stops the threads and closes the
 * store. Idempotent. Returns 0, or LG_EBUSY when requests were still in
 * flight when drain_ms ran out (they were cut). */
LG_EXPORT int lg_server_shutdown(lg_server_t *srv, int drain_ms);
/* Shuts down (when not done yet, with the default drain) and frees. NULL:
 * no-op. */
LG_EXPORT void lg_server_free(lg_server_t *srv);
/* SERVER-API-END */

/* ---------------------------------------------------------------------
 * Traces (trace-v1) and replay.
 * ------------------------------------------------------------------- */
/* One replayed event and what the guard did with it (for printing). */
typedef struct lg_replay_event {
  const char *trace;          /* the file name */
  long line;                  /* 1-based line in the file */
  lg_event_type_t type;
  const char *tool;           /* calls: the tool */
  const char *model;          /* model events: the model, or NULL */
  const char *from, *to;      /* handoffs */
  int acted;                  /* 0: read after the stop, or a skipped result */
  int skipped;                /* result of a call that did not execute */
  lg_decision_t decision;     /* valid when acted */
} lg_replay_event_t;

/* The end of one trace. */
typedef struct lg_replay_summary {
  const char *trace;
  const char *run_id;
  const char *terminal_reason; /* NULL when the trace ended without a stop */
  long stopped_at_line;        /* 0 when none */
  int64_t executed_calls, blocked_calls, replayed_calls;
  int64_t model_calls, cost_nusd, tokens;
  int64_t events_after_stop;
  const char *envelope;        /* the terminal envelope JSON */
} lg_replay_summary_t;

/* Called for each event (ev) and at the end of each trace (ev == NULL,
 * sum != NULL). A non-zero return stops the replay and is returned. */
typedef int (*lg_replay_cb)(void *ud, const lg_replay_event_t *ev,
                            const lg_replay_summary_t *sum);

/* Replays one trace file through a fresh run with an in-memory ledger.
 * `policy` (may be NULL) overrides the trace's own; without either the
 * default applies. Returns 0 when the file was read and replayed, whatever
 * the guard decided; LG_ETRACE / LG_EIO / ... with err naming file, line
 * and field otherwise. */
LG_EXPORT int lg_replay_file(const char *path, lg_policy_t *policy,
                             lg_replay_cb cb, void *ud, lg_error_t *err);
/* The same over a buffer already in memory; `name` is used in messages. */
LG_EXPORT int lg_replay_buffer(const char *name, const char *buf, size_t len,
                               lg_policy_t *policy, lg_replay_cb cb, void *ud,
                               lg_error_t *err);

/* Expectations (trace-v1, "a trace as a regression test"). Replays the
 * trace `trace` (len bytes; `name` in messages; `policy` as in
 * lg_replay_file) and writes into *line a new string (lg_free) that says
 * what the replay did: "# expect {...}\n" with terminal_reason (null: no
 * stop), stopped_at_call (when the stop answered a call), executed_calls,
 * blocked_calls, replayed_calls and call_N_action for every call that was
 * not executed (the first 64). Errors as lg_replay_buffer's. */
LG_EXPORT int lg_expect_compute(const char *name, const char *trace, size_t len,
                                lg_policy_t *policy, char **line, lg_error_t *err);
/* The trace as a regression test: lg_expect_compute's line, then the
 * trace without any `# expect` line it had. New string in *out (lg_free),
 * its length in *out_len (may be NULL). Shared by `loopguard runs export`
 * and GET /v1/runs/{id}/regression. */
LG_EXPORT int lg_expect_trace(const char *name, const char *trace, size_t len,
                              lg_policy_t *policy, char **out, size_t *out_len,
                              lg_error_t *err);

/* Writes `s` as a JSON string (with quotes) into a new string (lg_free). */
LG_EXPORT char *lg_json_quote(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_H */
