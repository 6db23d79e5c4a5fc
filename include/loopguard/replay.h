/*
 * loopguard/replay.h — traces (trace-v1) read back: replay through a
 * fresh run, and a trace as a regression test (expectations). In memory
 * only, on loopguard/core.h.
 */
#ifndef LOOPGUARD_REPLAY_H
#define LOOPGUARD_REPLAY_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* One replayed event as its record of `loopguard replay --json`
 * (trace-v1): {"line","type","tool" (calls),"call_id" (calls), and the
 * decision's members as lg_decision_to_json gives them}. *json receives a
 * new string (lg_free), or NULL for an event that has no record (not
 * acted on, a skipped result, a state or usage event). 0 or LG_ENOMEM. */
LG_EXPORT int lg_replay_event_json(const lg_replay_event_t *ev, char **json);
/* The summary record of one trace: {"type":"summary","trace","run_id",
 * "terminal_reason","stopped_at_line","executed_calls","blocked_calls",
 * "replayed_calls","model_calls","cost_usd","tokens","events_after_stop",
 * "envelope"}. New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_replay_summary_json(const lg_replay_summary_t *s);

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

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_REPLAY_H */
