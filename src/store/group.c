/*
 * group.c — group commit of decisions, for the stores that allow one
 * writer at a time (sqlite:, and memory:, whose one handle is the whole
 * database).
 *
 * A SQLite database takes one write transaction at a time, and each commit
 * costs about as much as the decision in it: deciding one run per
 * transaction caps the server at a few thousand decisions a second however
 * many threads wait for the lock. So a decision is not made on the HTTP
 * thread: the thread parks its request (libmicrohttpd suspends the
 * connection and goes on serving others) and hands a job to the committer
 * thread here, which takes every job waiting, opens one transaction, runs
 * each job — a decision through lg_store_with_run(), a savepoint per
 * decision, so a decision that fails is undone alone (a batch of one
 * decision needs none: it is undone with the batch) — commits once, and
 * only then marks the jobs done and wakes their connections. Nothing is
 * answered before the commit that stores it, so the durability contract
 * is the same as one transaction per decision; only the cost of the
 * commit is shared.
 *
 * Every other write of the server (a run's creation, a cancel, a ledger
 * claim, commit or fail, a budget's change, reservation or settlement) is
 * a job too, a write function called with the committer's handle inside
 * the batch's transaction. So no HTTP thread ever waits for the
 * database's write lock — another process may hold it for the whole busy
 * timeout — and the reads an HTTP thread makes go to the store's reader
 * (lg__store_read_begin) while the committer holds the handle.
 *
 * The committer holds the store handle's lock for the whole batch, so no
 * other thread's call on the shared handle can fall inside a batch's
 * transaction.
 *
 * PostgreSQL does not go through here: its row locks let decisions for
 * different runs proceed in parallel on per-thread connections, and a
 * batch holding many rows' locks could deadlock with another replica's.
 */
#include "driver.h"
#include "group.h"
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <sys/prctl.h>

struct lg__batcher {
  lg_store_t *s;          /* the shared handle */
  pthread_t th;           /* the committer */
  pthread_mutex_t mu;     /* guards the queue and stop */
  pthread_cond_t cv;      /* signalled on a new job or stop */
  lg__job_t *head, *tail; /* jobs waiting */
  int stop;               /* set: finish what is queued and exit */
  size_t max_batch;       /* decisions per transaction at most */
  lg_canon_t *canon;      /* the committer's scratch for fingerprints */
  int joined;             /* the committer has exited */
  int running;            /* batches being run now (the committer's, and
                             lg__batcher_run's on their callers' threads) */
  _Atomic uint64_t batches, jobs; /* for tests and benchmarks */
};

void lg__job_run(lg_store_t *s, lg__job_t *j) {
  memset(&j->err, 0, sizeof j->err);
  j->rc = j->run_id ? lg_store_with_run(s, j->run_id, j->fn, j->ud, &j->err)
                    : j->write(j->ud, s, &j->err);
}

static void run_batch(lg__batcher_t *b, lg__job_t *first) {
  lg_store_t *s = b->s;
  lg_error_t e;
  memset(&e, 0, sizeof e);
  lg__store_lock(s);
  int rc = lg__store_begin(s, LG__TXN_RUN, &e);
  /* A job alone, whole: the batch's transaction is its own, undone with it
   * (its first lg_store_with_run opens no savepoint: store.c, with_run). A
   * savepoint costs two statements, and every page the job changes is
   * copied into its journal. */
  int alone = !first->next && (first->run_id || first->whole);
  size_t n = 0;
  for (lg__job_t *j = first; j; j = j->next, n++) {
    if (rc) {
      j->rc = rc;
      j->err = e;
      continue;
    }
    s->alone = alone;
    lg__job_run(s, j);
    s->alone = 0;
  }
  if (!rc && alone && first->rc) {
    lg__store_end(s, 0, NULL); /* its failure: nothing of it stays */
  } else if (!rc) {
    int crc = lg__store_end(s, 1, &e);
    if (crc) /* nothing of the batch is stored: every decision fails */
      for (lg__job_t *j = first; j; j = j->next)
        if (!j->rc) {
          j->rc = crc;
          j->err = e;
        }
  }
  lg__store_unlock(s);
  atomic_fetch_add(&b->batches, 1);
  atomic_fetch_add(&b->jobs, n);
  for (lg__job_t *j = first, *next; j; j = next) {
    next = j->next; /* done() may free the job */
    j->next = NULL;
    if (j->done) j->done(j);
  }
}

/* Up to max_batch jobs off the queue, in arrival order (b->mu held, the
 * queue not empty). */
static lg__job_t *take(lg__batcher_t *b) {
  lg__job_t *first = b->head, *last = first;
  size_t n = 1;
  while (last->next && n < b->max_batch) {
    last = last->next;
    n++;
  }
  b->head = last->next;
  if (!b->head) b->tail = NULL;
  last->next = NULL;
  return first;
}

static void *committer(void *arg) {
  lg__batcher_t *b = arg;
  prctl(PR_SET_NAME, "lg-commit", 0, 0, 0); /* for top -H and perf */
  pthread_mutex_lock(&b->mu);
  for (;;) {
    while (!b->head && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
    if (!b->head && b->stop) break;
    lg__job_t *first = take(b);
    b->running++;
    pthread_mutex_unlock(&b->mu);
    run_batch(b, first);
    pthread_mutex_lock(&b->mu);
    b->running--;
  }
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

lg__batcher_t *lg__batcher_new(lg_store_t *s, size_t max_batch) {
  lg__batcher_t *b = lg__calloc(1, sizeof *b);
  if (!b) return NULL;
  b->s = s;
  b->max_batch = max_batch ? max_batch : 256;
  if (!(b->canon = lg_canon_new())) goto fail_canon;
  if (pthread_mutex_init(&b->mu, NULL)) goto fail_mu;
  if (pthread_cond_init(&b->cv, NULL)) goto fail_cv;
  if (pthread_create(&b->th, NULL, committer, b)) goto fail_th;
  return b;
fail_th:
  pthread_cond_destroy(&b->cv);
fail_cv:
  pthread_mutex_destroy(&b->mu);
fail_mu:
  lg_canon_free(b->canon);
fail_canon:
  lg__free(b);
  return NULL;
}

/* Appends j to the queue and wakes the committer (b->mu held). */
static void enqueue(lg__batcher_t *b, lg__job_t *j) {
  if (b->tail) b->tail->next = j;
  else b->head = j;
  b->tail = j;
  pthread_cond_signal(&b->cv);
}

void lg__batcher_submit(lg__batcher_t *b, lg__job_t *j) {
  j->next = NULL;
  pthread_mutex_lock(&b->mu);
  if (b->stop) { /* stopping: decided here and now, in a batch of its own */
    pthread_mutex_unlock(&b->mu);
    run_batch(b, j);
    return;
  }
  enqueue(b, j);
  pthread_mutex_unlock(&b->mu);
}

/* What lg__batcher_run's caller waits on while its job is queued. */
typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} waiter_t;

static void waiter_done(lg__job_t *j) {
  waiter_t *w = j->owner;
  pthread_mutex_lock(&w->mu);
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* What a parked caller (lg__park) waits on. */
typedef struct parked {
  const lg__park_t *pk;
  void *who;
} parked_t;

static void parked_done(lg__job_t *j) {
  parked_t *p = j->owner;
  p->pk->wake(p->who); /* the last use of p: its caller may go on at once */
}

void lg__batcher_run(lg__batcher_t *b, lg__job_t *j) {
  j->next = NULL;
  j->done = NULL;
  pthread_mutex_lock(&b->mu);
  if (b->stop || (!b->head && !b->running)) {
    /* Nothing to share a commit with: run it here, without a hand-over. */
    b->running++;
    pthread_mutex_unlock(&b->mu);
    run_batch(b, j);
    pthread_mutex_lock(&b->mu);
    /* Queued meanwhile: run here too, in batches, a hand-over to the
     * committer and back the fewer each; past a few rounds (other threads
     * keep queueing) the rest is the committer's, so that this caller
     * gets back to its own work. */
    for (int round = 0; b->head && round < 4; round++) {
      lg__job_t *more = take(b);
      pthread_mutex_unlock(&b->mu);
      run_batch(b, more);
      pthread_mutex_lock(&b->mu);
    }
    b->running--;
    if (b->head) pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return;
  }
  const lg__park_t *pk = lg__park();
  void *who = pk ? pk->self() : NULL;
  if (who) { /* a caller with other work: it waits without blocking its thread */
    parked_t p = {pk, who};
    j->owner = &p;
    j->done = parked_done;
    if (b->tail) b->tail->next = j;
    else b->head = j;
    b->tail = j;
    if (!b->running) pthread_cond_signal(&b->cv); /* else the batch running takes it next */
    pthread_mutex_unlock(&b->mu);
    pk->wait(who);
    j->owner = NULL;
    j->done = NULL;
    return;
  }
  waiter_t w = {.done = 0};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  j->owner = &w;
  j->done = waiter_done;
  enqueue(b, j);
  pthread_mutex_unlock(&b->mu);
  pthread_mutex_lock(&w.mu);
  /* A commit of others first: usually a moment. Past 2 ms the store may be
   * held (another process's lock): the caller is told it blocks. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += 2 * 1000 * 1000;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  while (!w.done && pthread_cond_timedwait(&w.cv, &w.mu, &until) != ETIMEDOUT) {
  }
  if (!w.done) {
    pthread_mutex_unlock(&w.mu);
    lg__will_block();
    pthread_mutex_lock(&w.mu);
  }
  while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  j->owner = NULL;
  j->done = NULL;
}

void lg__batcher_stop(lg__batcher_t *b) {
  if (!b) return;
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_cond_signal(&b->cv);
  int joined = b->joined;
  b->joined = 1;
  pthread_mutex_unlock(&b->mu);
  if (!joined) pthread_join(b->th, NULL);
}

void lg__batcher_free(lg__batcher_t *b) {
  if (!b) return;
  lg__batcher_stop(b);
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  lg_canon_free(b->canon);
  lg__free(b);
}

lg_canon_t *lg__batcher_canon(lg__batcher_t *b) { return b->canon; }

void lg__batcher_stats(lg__batcher_t *b, uint64_t *batches, uint64_t *jobs) {
  *batches = atomic_load(&b->batches);
  *jobs = atomic_load(&b->jobs);
}

int lg__store_single_writer(const lg_store_t *s) {
  return (s->drv->caps & LG__CAP_SINGLE_WRITER) != 0;
}
