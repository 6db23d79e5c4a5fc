/*
 * loopguard/core.h — the pure core of libloopguard: version, error codes,
 * the allocator, canonical JSON and fingerprints, policies, the ledger
 * interface the engine consults, the engine (lg_run_*) and the events
 * that reach it. Nothing declared here touches a file, a socket or a
 * clock. The conventions of every topic header are those of
 * <loopguard.h>, which includes this one and the others (store.h,
 * budget.h, server.h, replay.h); a program may include a topic header
 * alone.
 */
#ifndef LOOPGUARD_CORE_H
#define LOOPGUARD_CORE_H

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
/* Counters as the JSON object of the envelope's "counters" (and of GET
 * /v1/runs/{id}, `loopguard runs show --json`): steps, calls, blocked,
 * replayed, results, model_calls, tokens, handoffs, cost_usd,
 * elapsed_ms. New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_counters_to_json(const lg_counters_t *c);
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

/* A decision as a JSON object, the one form every answer shows it in
 * (the sidecar's answer to an event, replay's --json records): action;
 * reason (absent for execute and continue); operator_note; guard; for a
 * call (type LG_EV_CALL), fingerprint, repeat and idempotency_key;
 * message; hide_tools and hide_turns; alternatives; saved_result
 * (replay); next_allowed_action (stop). New string (lg_free), NULL on
 * out-of-memory. */
LG_EXPORT char *lg_decision_to_json(lg_event_type_t type, const lg_decision_t *d);

/* Writes `s` as a JSON string (with quotes) into a new string (lg_free). */
LG_EXPORT char *lg_json_quote(const char *s, size_t len);

/* ---------------------------------------------------------------------
 * Amounts of money. The engine counts nano-dollars (int64_t *_nusd),
 * budgets micro-dollars (*_micro, loopguard/budget.h); USD read from
 * JSON or a command line is rounded to the nearest unit, a half up
 * (docs/reference/http-api.md, "Amounts").
 * ------------------------------------------------------------------- */
#define LG_USD_TEXT_MAX 32 /* bytes of the longest lg_usd_format text */

/* nano-USD as the shortest decimal number of USD ("0.000042", "25",
 * "-1.5"): how every cost_usd of an answer, a trace or a listing is
 * written. Fills buf (LG_USD_TEXT_MAX bytes) and returns it. */
LG_EXPORT char *lg_usd_format(int64_t nusd, char buf[LG_USD_TEXT_MAX]);

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_CORE_H */
