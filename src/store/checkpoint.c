/*
 * checkpoint.c — WAL checkpoints of a sqlite: store, off the decision path.
 *
 * SQLite copies the WAL back into the database file ("checkpoints") when
 * it has grown past 1000 pages, inside the COMMIT that crossed the line,
 * with an fsync. At tens of thousands of decisions a second that is dozens
 * of times a second, each one stalling the group commit (batch.c) for a
 * millisecond or more: it is what the 99th percentile of latency is made
 * of. So this thread checkpoints every few milliseconds on a connection of
 * its own, in PASSIVE mode (it never waits for a lock and never holds up a
 * writer); the WAL then rarely grows to where the committer would
 * checkpoint it (which stays as the fallback), and the fsyncs of the
 * checkpoints happen here. What remains in the committer is the sync of
 * the WAL's header each time the WAL starts over from its beginning.
 *
 * This is SQLite's own recommendation for busy writers; SQLite allows it
 * from any number of connections and processes. While it runs, the
 * store's own commits checkpoint only past a guard of 64 Ki pages (256
 * MiB), should this thread fall far behind: SQLite's default (past 1000
 * pages, with an fsync of the database file, inside the commit that
 * crossed the line) held the group commit, and every HTTP thread behind
 * it, for seconds on a slow disk.
 */
#include "group.h"
#include "store.h"

#include <pthread.h>
#include <stdatomic.h>

#include <sys/prctl.h>

#include <errno.h>
#include <sqlite3.h>
#include <time.h>

struct lg__checkpointer {
  sqlite3 *db;          /* our own connection to the store's file */
  pthread_t th;         /* the thread */
  pthread_mutex_t mu;   /* guards stop */
  pthread_cond_t cv;    /* wakes the thread to stop */
  int stop;             /* set: exit */
  int every_ms;         /* pause between checkpoints */
  _Atomic uint64_t runs;/* checkpoints done (for tests) */
};

static void *loop(void *arg) {
  lg__checkpointer_t *c = arg;
  prctl(PR_SET_NAME, "lg-checkpoint", 0, 0, 0); /* for top -H and perf */
  pthread_mutex_lock(&c->mu);
  while (!c->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)c->every_ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    if (c->stop) break;
    pthread_mutex_unlock(&c->mu);
    int log = 0, done = 0;
    /* PASSIVE: copies what no reader still needs, waits for nobody. A
     * failure (busy, I/O) is left to the next round, or to SQLite's own
     * checkpoint at commit, which is still there as the fallback. */
    sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    atomic_fetch_add(&c->runs, 1);
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

lg__checkpointer_t *lg__checkpointer_new(lg_store_t *s, int every_ms) {
  const char *path = lg__store_sqlite_path(s);
  if (!path) return NULL;
  lg__checkpointer_t *c = lg__calloc(1, sizeof *c);
  if (!c) return NULL;
  c->every_ms = every_ms > 0 ? every_ms : 5;
  /* The store made the file (and put it in WAL mode) before this runs. */
  if (sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
      SQLITE_OK)
    goto fail_db;
  sqlite3_busy_timeout(c->db, 0);
  sqlite3_exec(c->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
  if (pthread_mutex_init(&c->mu, NULL)) goto fail_db;
  if (pthread_cond_init(&c->cv, NULL)) goto fail_mu;
  if (pthread_create(&c->th, NULL, loop, c)) goto fail_cv;
  lg__store_sqlite_autocheckpoint(s, 65536);
  return c;
fail_cv:
  pthread_cond_destroy(&c->cv);
fail_mu:
  pthread_mutex_destroy(&c->mu);
fail_db:
  sqlite3_close(c->db);
  lg__free(c);
  return NULL;
}

void lg__checkpointer_free(lg__checkpointer_t *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->th, NULL);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  sqlite3_close(c->db);
  lg__free(c);
}

