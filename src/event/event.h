/*
 * event.h — the one event path, inside the library.
 *
 * A front end (the trace reader, the HTTP routes, the CLI, the gateway)
 * turns its input into an lg_event_t; lg__run_apply() gives it to the
 * engine, and lg__trace_write() (src/trace/write.c) writes it back as the
 * trace-v1 line that replays to the same decision. Nothing else calls the
 * engine's event functions.
 */
#ifndef LG_EVENT_H
#define LG_EVENT_H

#include "../util/internal.h"

/* lg_run_apply; with trusted_fp, a call's fingerprint (when given) was
 * made by the library itself and is not checked again (the trace reader
 * canonicalises while it scans). */
int lg__run_apply(lg_run_t *run, lg_canon_t *canon, const lg_event_t *ev, bool trusted_fp,
                  lg_decision_t *d, lg_error_t *err);

/* Whether an executed call with this id is waiting for its result: a
 * result naming it is that call's (replay must not take it for the
 * result of a call with the same id that was not executed). */
bool lg__run_awaits(const lg_run_t *run, const char *call_id);

/* The message of a stop by a shared budget, the same for the server that
 * refused and for the replay of its trace. */
int lg__budget_stop_message(lg__buf_t *b, const char *scope, const char *limit_source,
                            int64_t requested_nusd);

/* The decision's own members, for every answer that shows one (the
 * server's answer to an event, replay's --json records): appended to b
 * without braces, starting with "action":
 *   action; reason (the reason's text, absent for execute and continue);
 *   operator_note; guard (when one fired); for a call with a fingerprint,
 *   fingerprint, repeat and idempotency_key; message; hide_tools and
 *   hide_turns; alternatives (not with execute); saved_result (replay);
 *   next_allowed_action (stop).
 * `type` is the event's. Returns 0 or LG_ENOMEM (b->oom). */
int lg__decision_json(lg__buf_t *b, lg_event_type_t type, const lg_decision_t *d);

#endif
