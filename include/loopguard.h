/*
 * loopguard.h — the public API of libloopguard: this umbrella includes
 * the topic headers under loopguard/ (the way uv.h includes the headers
 * of uv/), each of which may also be included alone:
 *
 *   loopguard/core.h    errors, the allocator, canonical JSON, policies,
 *                       the ledger interface, the engine and its events
 *   loopguard/replay.h  trace replay and expectations (in memory)
 *   loopguard/store.h   stores, the durable ledger, runs, the kill switch
 *   loopguard/budget.h  prices and shared budgets (on store.h)
 *   loopguard/server.h  the HTTP sidecar and the gateway it hosts
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
 *   - Every function that returns a pointer says whether it is new (the
 *     caller frees it) or borrowed. Ledgers also say it in their name:
 *     lg_ledger_memory_new() and lg_store_ledger_new() give a ledger the
 *     caller frees with lg_ledger_free(); lg_store_ledger() gives the
 *     store's own, borrowed, never freed.
 */
#ifndef LOOPGUARD_H
#define LOOPGUARD_H

/* The topics, each a header of its own that may be included alone. */
#include "loopguard/core.h"   /* errors, allocator, canon, policy, engine, events */
#include "loopguard/replay.h" /* trace replay and expectations */
#include "loopguard/store.h"  /* stores, the durable ledger, runs, kill switch */
#include "loopguard/budget.h" /* prices and shared budgets */
#include "loopguard/server.h" /* the HTTP sidecar and its gateway */

#endif /* LOOPGUARD_H */
