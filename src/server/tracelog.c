/*
 * tracelog.c — the trace-v1 lines of each run, for GET /v1/runs/{id}/trace.
 *
 * THIS IMPLEMENTATION IS PROCESS-LOCAL AND IN MEMORY. The durable version
 * writes each line as a row of the store in the same transaction as the
 * decision (lg_store_event_append / lg_store_events, to come); it replaces
 * this file and nothing else, which is why the interface in server.h is
 * four functions wide and already takes the store handle and a
 * transaction. Until then a restarted server, or a run decided by another
 * replica, has lines missing, and lg__tracelog_read says so (*complete 0).
 *
 * Organisation: a hash table (chained) of runs, each with its lines in one
 * growable block, and a list of the runs by their last append. Memory is
 * bounded twice: a run that passes max_run_bytes stops recording (marked
 * truncated), and when the whole log passes max_bytes the runs appended to
 * least recently are dropped whole. One mutex guards everything; an append
 * is a copy of one short line, so it is held for well under a microsecond.
 *
 * Lines are appended inside the decision's transaction, under the run's
 * lock, so they are in decision order. If that transaction does not
 * commit, lg__tracelog_end takes the lines back out: it finds the exact
 * bytes it appended (at a line start, searching from the end: a later
 * decision of the same run may have appended after them).
 */
#include "server.h"

typedef struct tl_run {
  char *run_id;          /* the key */
  uint64_t h;            /* its hash */
  char *data;            /* the lines, each ending in \n */
  size_t len, cap;       /* bytes used, allocated */
  int truncated;         /* lines were dropped: the trace is incomplete */
  struct tl_run *chain;  /* next in the bucket */
  struct tl_run *newer, *older; /* the recency list */
} tl_run_t;

struct lg__tracelog {
  pthread_mutex_t mu;    /* guards everything below */
  tl_run_t **bucket;     /* nbucket chains */
  size_t nbucket;        /* a power of two */
  size_t nruns;          /* runs held */
  size_t bytes;          /* memory held for lines, keys and entries */
  size_t max_bytes;      /* bound of bytes */
  size_t max_run;        /* bound of one run's lines */
  tl_run_t *newest, *oldest;
};

#define ENTRY_OVERHEAD (sizeof(tl_run_t) + 16) /* an entry and its allocator header */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

lg__tracelog_t *lg__tracelog_new(size_t max_bytes, size_t max_run_bytes) {
  lg__tracelog_t *tl = lg__calloc(1, sizeof *tl);
  if (!tl) return NULL;
  tl->nbucket = 1024;
  tl->bucket = lg__calloc(tl->nbucket, sizeof *tl->bucket);
  if (!tl->bucket || pthread_mutex_init(&tl->mu, NULL)) {
    lg__free(tl->bucket);
    lg__free(tl);
    return NULL;
  }
  tl->max_bytes = max_bytes ? max_bytes : LG_SERVER_DEFAULT_TRACE_MEMORY;
  tl->max_run = max_run_bytes ? max_run_bytes : 4u * 1024 * 1024;
  if (tl->max_run > tl->max_bytes) tl->max_run = tl->max_bytes;
  return tl;
}

static void free_run(tl_run_t *r) {
  lg__free(r->run_id);
  lg__free(r->data);
  lg__free(r);
}

void lg__tracelog_free(lg__tracelog_t *tl) {
  if (!tl) return;
  for (tl_run_t *r = tl->newest, *next; r; r = next) {
    next = r->older;
    free_run(r);
  }
  lg__free(tl->bucket);
  pthread_mutex_destroy(&tl->mu);
  lg__free(tl);
}

static tl_run_t *find(lg__tracelog_t *tl, const char *run_id, uint64_t h) {
  for (tl_run_t *r = tl->bucket[h & (tl->nbucket - 1)]; r; r = r->chain)
    if (r->h == h && !strcmp(r->run_id, run_id)) return r;
  return NULL;
}

static void unlink_recent(lg__tracelog_t *tl, tl_run_t *r) {
  if (r->newer) r->newer->older = r->older;
  else tl->newest = r->older;
  if (r->older) r->older->newer = r->newer;
  else tl->oldest = r->newer;
  r->newer = r->older = NULL;
}

static void push_newest(lg__tracelog_t *tl, tl_run_t *r) {
  r->older = tl->newest;
  r->newer = NULL;
  if (tl->newest) tl->newest->newer = r;
  tl->newest = r;
  if (!tl->oldest) tl->oldest = r;
}

static void drop(lg__tracelog_t *tl, tl_run_t *r) {
  tl_run_t **pp = &tl->bucket[r->h & (tl->nbucket - 1)];
  while (*pp != r) pp = &(*pp)->chain;
  *pp = r->chain;
  unlink_recent(tl, r);
  tl->bytes -= r->cap + strlen(r->run_id) + 1 + ENTRY_OVERHEAD;
  tl->nruns--;
  free_run(r);
}

/* Doubles the table when it is full; a failure only makes chains longer. */
static void grow(lg__tracelog_t *tl) {
  if (tl->nruns < tl->nbucket) return;
  size_t n = tl->nbucket * 2;
  tl_run_t **b = lg__calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < tl->nbucket; i++)
    for (tl_run_t *r = tl->bucket[i], *next; r; r = next) {
      next = r->chain;
      r->chain = b[r->h & (n - 1)];
      b[r->h & (n - 1)] = r;
    }
  lg__free(tl->bucket);
  tl->bucket = b;
  tl->nbucket = n;
}

int lg__tracelog_append(lg__tracelog_t *tl, lg_store_t *s, const char *run_id, const char *lines,
                        size_t len, lg__trace_txn_t *txn) {
  (void)s; /* the durable version writes through the open transaction */
  if (!len) return 0;
  uint64_t h = hash_str(run_id);
  int rc = 0;
  pthread_mutex_lock(&tl->mu);
  tl_run_t *r = find(tl, run_id, h);
  if (!r) {
    r = lg__calloc(1, sizeof *r);
    if (!r || !(r->run_id = lg__strdup(run_id))) {
      lg__free(r);
      rc = LG_ENOMEM;
      goto out;
    }
    r->h = h;
    grow(tl);
    r->chain = tl->bucket[h & (tl->nbucket - 1)];
    tl->bucket[h & (tl->nbucket - 1)] = r;
    push_newest(tl, r);
    tl->nruns++;
    tl->bytes += strlen(run_id) + 1 + ENTRY_OVERHEAD;
    /* A run's log is complete only when it starts with its run line. */
    if (len < 13 || memcmp(lines, "{\"type\":\"run\"", 13)) r->truncated = 1;
  } else if (tl->newest != r) {
    unlink_recent(tl, r);
    push_newest(tl, r);
  }
  if (r->truncated && r->len == 0 && len >= 13 && !memcmp(lines, "{\"type\":\"run\"", 13))
    r->truncated = 0; /* an empty log that starts over with a run line */
  if (r->len + len > tl->max_run) {
    r->truncated = 1; /* the rest is not recorded; the trace says so */
    goto out;
  }
  if (r->len + len > r->cap) {
    size_t cap = r->len + len;
    cap += cap / 4;
    cap = (cap + 63) & ~(size_t)63;
    char *d = lg__realloc(r->data, cap);
    if (!d) {
      r->truncated = 1;
      rc = LG_ENOMEM;
      goto out;
    }
    tl->bytes += cap - r->cap;
    r->data = d;
    r->cap = cap;
  }
  memcpy(r->data + r->len, lines, len);
  r->len += len;
  if (txn) {
    if (!txn->run_id) txn->run_id = lg__strdup(run_id);
    lg__buf_append(&txn->lines, lines, len);
  }
  /* Bound the whole: drop the runs appended to least recently. */
  while (tl->bytes > tl->max_bytes && tl->oldest && tl->oldest != r) drop(tl, tl->oldest);
out:
  pthread_mutex_unlock(&tl->mu);
  return rc;
}

void lg__tracelog_end(lg__tracelog_t *tl, lg__trace_txn_t *txn, int committed) {
  if (!txn) return;
  if (!committed && txn->run_id && txn->lines.len) {
    pthread_mutex_lock(&tl->mu);
    tl_run_t *r = find(tl, txn->run_id, hash_str(txn->run_id));
    size_t n = txn->lines.len;
    if (r && r->len >= n && !txn->lines.oom) {
      /* Newest first: the lines are at a line start, usually the end. */
      for (size_t at = r->len - n + 1; at-- > 0;) {
        if ((at == 0 || r->data[at - 1] == '\n') && !memcmp(r->data + at, txn->lines.data, n)) {
          memmove(r->data + at, r->data + at + n, r->len - at - n);
          r->len -= n;
          break;
        }
      }
    } else if (r) {
      r->truncated = 1; /* cannot tell what to take back */
    }
    pthread_mutex_unlock(&tl->mu);
  }
  lg__free(txn->run_id);
  lg__buf_free(&txn->lines);
  txn->run_id = NULL;
}

int lg__tracelog_read(lg__tracelog_t *tl, lg_store_t *s, const char *run_id, lg__buf_t *out,
                      int *complete) {
  (void)s;
  *complete = 0;
  pthread_mutex_lock(&tl->mu);
  tl_run_t *r = find(tl, run_id, hash_str(run_id));
  int rc = 0;
  if (r) {
    *complete = !r->truncated;
    rc = lg__buf_append(out, r->data ? r->data : "", r->len);
  }
  pthread_mutex_unlock(&tl->mu);
  return rc;
}

size_t lg__tracelog_bytes(lg__tracelog_t *tl) {
  pthread_mutex_lock(&tl->mu);
  size_t b = tl->bytes + tl->nbucket * sizeof *tl->bucket;
  pthread_mutex_unlock(&tl->mu);
  return b;
}
