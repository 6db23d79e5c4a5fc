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

/* A decision waiting for the committer. */
typedef struct lg__job {
  const char *run_id;         /* the run to lock */
  lg_store_run_fn fn;         /* what to do under its lock */
  void *ud;                   /* fn's argument */
  int rc;                     /* out: lg_store_with_run's result, or the
                                 commit's error (then nothing was stored) */
  lg_error_t err;             /* out: its detail */
  void (*done)(struct lg__job *j); /* called by the committer once the
                                 batch is committed (or failed) */
  void *owner;                /* for done(): the connection to resume */
  struct lg__job *next;       /* queue link */
} lg__job_t;

typedef struct lg__batcher lg__batcher_t;
/* Starts a committer thread over the shared handle s (max_batch 0: 256). */
lg__batcher_t *lg__batcher_new(lg_store_t *s, size_t max_batch);
/* Queues a job; j->done is called from the committer thread (once the
 * batcher is stopping, from this one, before this returns). */
void lg__batcher_submit(lg__batcher_t *b, lg__job_t *j);
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

#endif
