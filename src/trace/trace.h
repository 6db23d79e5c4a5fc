/*
 * trace.h — the trace module inside the library: the one trace writer
 * (write.c). The reader and replay are public (lg_replay_*).
 */
#ifndef LG_TRACE_H
#define LG_TRACE_H

#include "../util/internal.h"

/* Appends the trace-v1 line (ending in '\n') of `ev`, applied with
 * decision `d` (may be NULL when the event was not decided on), to b.
 * 0, LG_ENOMEM, or LG_EINVAL for an event type with no line. */
int lg__trace_write(lg__buf_t *b, const lg_event_t *ev, const lg_decision_t *d);

/* Appends a run's first line: its id, group, checkpoint (may be NULL) and
 * effective policy (JSON text, may be NULL). */
int lg__trace_write_run(lg__buf_t *b, const char *run_id, const char *group,
                        const int64_t *progress_version, const char *policy_json);

#endif
