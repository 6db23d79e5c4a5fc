/*
 * group.h — the store's group commit and background checkpoints: how a
 * server with one writer at a time (sqlite:, memory:) commits many
 * decisions at once (group.c) and keeps SQLite's WAL checkpoints off the
 * decision path (checkpoint.c). The server hands jobs over; it never
 * opens a transaction itself.
 */
#ifndef LG_STORE_GROUP_H
#define LG_STORE_GROUP_H

#include "../util/internal.h"

/* ------------------------------------------------------------------ */
/* group.c — group commit for the stores with one writer at a time.     */

/* A write waiting for the committer: a decision for one run (run_id and
 * fn), or any other write (run_id NULL and write). */
typedef struct lg__job {
  const char *run_id;         /* the run to lock, or NULL: a write */
  lg_store_run_fn fn;         /* run_id: what to do under its lock */
  /* run_id NULL: the write, called with the committer's handle inside the
   * batch's transaction. Each store call it makes is atomic on its own (a
   * savepoint), as it would be alone; a write of several calls that must
   * be all or nothing makes them through one call that is. Returns its
   * result (0, or an LG_E... code with *err filled). */
  int (*write)(void *ud, lg_store_t *s, lg_error_t *err);
  void *ud;                   /* fn's or write's argument */
  int whole;                  /* write: it fails whenever a store call of
                                 it fails (never goes on after one), so a
                                 batch of it alone is undone whole when it
                                 fails and its calls need no savepoint of
                                 their own (a decision, run_id, always) */
  int rc;                     /* out: lg_store_with_run's or write's result;
                                 when that was 0, the commit's error (then
                                 nothing of the batch was stored) */
  lg_error_t err;             /* out: its detail */
  void (*done)(struct lg__job *j); /* called by the committer once the
                                 batch is committed (or failed) */
  void *owner;                /* for done(): the connection to resume */
  int may_serve;              /* set by done()'s caller: it holds no lock a
                                 request handler takes, so done() may serve
                                 the connection on it (lg__loop_serve) */
  struct lg__job *next;       /* queue link */
} lg__job_t;

/* Runs job j on s now, on the calling thread: inside the transaction the
 * caller holds open (the committer's batch), or, with none, each store
 * call of the job a transaction of its own — a server without a committer
 * (postgres:, whose row locks let threads write in parallel) runs its
 * jobs so. Sets j->rc and j->err; does not call j->done. */
void lg__job_run(lg_store_t *s, lg__job_t *j);

typedef struct lg__batcher lg__batcher_t;
/* Starts a committer thread over the shared handle s (max_batch 0: 256). */
lg__batcher_t *lg__batcher_new(lg_store_t *s, size_t max_batch);
/* Queues a job; j->done is called from the committer thread (once the
 * batcher is stopping, from this one, before this returns). The committer
 * runs the jobs waiting in one transaction, each as lg__job_run would
 * (a decision under its own savepoint), and commits once before any
 * done() is called: nothing is answered before it is stored. */
void lg__batcher_submit(lg__batcher_t *b, lg__job_t *j);
/* Runs job j and returns once its batch is committed (j->rc and j->err
 * set; j->done and j->owner are the batcher's): for a caller that waits
 * anyway (a gateway worker). When the committer is idle and no job waits,
 * the batch of j alone is run on the calling thread — no hand-over to the
 * committer and back, two thread wake-ups a step fewer — else j is queued
 * and shares the next batch's commit, as a submitted job would. */
void lg__batcher_run(lg__batcher_t *b, lg__job_t *j);
/* Decides every job queued and stops the committer; jobs submitted after
 * it are decided on the submitting thread. Before the HTTP daemon stops:
 * no connection may stay parked (libmicrohttpd aborts on that). */
void lg__batcher_stop(lg__batcher_t *b);
/* Stops (if not yet) and frees. */
void lg__batcher_free(lg__batcher_t *b);
void lg__batcher_stats(lg__batcher_t *b, uint64_t *batches, uint64_t *jobs);
/* The canonicaliser of the committer's decisions (used under the store
 * handle's lock, which a batch holds throughout). */
lg_canon_t *lg__batcher_canon(lg__batcher_t *b);

/* ------------------------------------------------------------------ */
/* checkpoint.c — WAL checkpoints of a sqlite: store in the background.  */

typedef struct lg__checkpointer lg__checkpointer_t;
/* Starts checkpointing the SQLite file of store `s` every every_ms on a
 * connection of its own, and lets s's own commits checkpoint only far
 * behind. NULL for a store that needs none (not sqlite:), or when it
 * cannot start (then the commits checkpoint, as SQLite does by default). */
lg__checkpointer_t *lg__checkpointer_new(lg_store_t *s, int every_ms);
void lg__checkpointer_free(lg__checkpointer_t *c);

/* 1 when the store takes one writer at a time (sqlite:, memory:): its
 * decisions go through a group commit; 0 when row locks let writers run
 * in parallel on a handle each (postgres:). */
int lg__store_single_writer(const lg_store_t *s);

/* Bounds this handle's waits for its server's answers to ms (> 0) until
 * called again with 0, where the store's own deadline (query_timeout_ms)
 * is longer or none; `why` (static text) is what a call that outlives it
 * names. PostgreSQL only: a store that waits on no server ignores it. The
 * caller is the only user of the handle meanwhile. For /healthz, which
 * must answer a probe in time however long a request may wait. */
void lg__store_deadline(lg_store_t *s, int ms, const char *why);
/* lg_store_open, with the deadline of lg__store_deadline (ms > 0) on the
 * open's connect and every answer it waits for; 0: none, as
 * lg_store_open. For /healthz on a thread that has not connected yet. */
lg_store_t *lg__store_open_within(const char *url, const lg_store_options_t *opts, int ms,
                                  const char *why, lg_error_t *err);

/* Whether the store can take a write now (vtab write_probe): 0, or
 * LG_EBUSY / LG_ESTORE with a reason that names no URL. For /healthz. */
int lg__store_write_probe(lg_store_t *s, int64_t now_ms, lg_error_t *err);

#endif
