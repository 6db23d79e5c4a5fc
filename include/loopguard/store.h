/*
 * loopguard/store.h — the durable side: stores opened by URL (memory:,
 * sqlite:PATH, postgres:CONNINFO), the durable idempotency ledger, run
 * state and traces as stored, and the kill switch. Built on
 * loopguard/core.h.
 */
#ifndef LOOPGUARD_STORE_H
#define LOOPGUARD_STORE_H

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------
 * Stores (memory:, sqlite:PATH, postgres:CONNINFO): the durable ledger,
 * run state and the kill switch.
 * ------------------------------------------------------------------- */
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

#define LG_STORE_SCHEMA_VERSION 8 /* the schema this release writes */
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

/* Two ledgers over the store, for lg_run_new()/lg_run_load(); the name
 * says who frees it, as everywhere (loopguard.h: *_new is the caller's).
 *
 * lg_store_ledger: the store's own ledger, BORROWED. It passes now_ms
 * through unchanged, so the caller's times must be epoch ms. Valid until
 * lg_store_close(); never give it to lg_ledger_free(). */
LG_EXPORT lg_ledger_t *lg_store_ledger(lg_store_t *s);
/* lg_store_ledger_new: a NEW ledger over the store for an engine whose
 * times are relative to a start (a run's t_ms): it adds epoch_ms to every
 * now_ms it is given. Free it with lg_ledger_free(); the store must
 * outlive it. NULL on out-of-memory. */
LG_EXPORT lg_ledger_t *lg_store_ledger_new(lg_store_t *s, int64_t epoch_ms);
/* The old name of lg_store_ledger_new (a new ledger, whatever its name
 * said), kept so that programs written against 0.1 still compile. */
#if defined(__GNUC__)
__attribute__((deprecated("use lg_store_ledger_new, which names its ownership")))
#endif
static inline lg_ledger_t *lg_store_ledger_at(lg_store_t *s, int64_t epoch_ms) {
  return lg_store_ledger_new(s, epoch_ms);
}

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
#ifndef __cplusplus
  int operator;            /* 1: an operator */
#else
  int operator_;           /* the same field: `operator` is a C++ keyword */
#endif
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
  int with_state;        /* 1: the records hold policy_json and state too
                            (a listing that shows each run's counters) */
} lg_run_filter_t;
/* Called once per run; the record (without policy_json and state, which
 * are NULL, unless the filter asked for them) is borrowed for the call. A
 * non-zero return stops the listing and is returned. */
typedef int (*lg_store_run_cb)(void *ud, const lg_run_record_t *rec);
/* Lists runs newest first (by creation). `f` may be NULL. */
LG_EXPORT int lg_store_run_list(lg_store_t *s, const lg_run_filter_t *f,
                                lg_store_run_cb cb, void *ud, lg_error_t *err);

/* Called after each batch of lg_store_purge_runs with the runs deleted so
 * far; a non-zero return stops the purge there (a server shutting down). */
typedef int (*lg_store_progress_fn)(void *ud, int64_t done);
/* Deletes the runs not updated for older_than_ms before now_ms (0: every
 * run not updated after now_ms; negative is LG_EINVAL), each with its
 * trace, its kill switch (a cancel of the run itself; a group's stays),
 * its budget scopes and the gateway's conversation keys that name it. A
 * run that holds an open budget reservation is kept until it is settled
 * or expires; ledger rows keep their own retention (lg_store_purge) and
 * budgets what they spent. Active runs are purged too: a run is old by
 * its last write, whatever its status. In batches of a few hundred runs,
 * each a transaction of its own (other writers wait for one batch, not
 * for all), progress (may be NULL) called after each (and may stop it:
 * 0 returned, the runs deleted so far in *purged); a run written
 * between its batch's start and its delete is kept. *purged (may be
 * NULL): the runs deleted, also on an error (the batches before it stay
 * deleted). */
LG_EXPORT int lg_store_purge_runs(lg_store_t *s, int64_t older_than_ms, int64_t now_ms,
                                  lg_store_progress_fn progress, void *ud, int64_t *purged,
                                  lg_error_t *err);

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

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_STORE_H */
