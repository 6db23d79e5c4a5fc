/*
 * driver_sqlite.c — the SQLite driver (driver.h), for sqlite:PATH (one
 * file in WAL mode that several processes may share) and memory: (a
 * database in memory private to the handle, on one connection).
 *
 * Durability follows the kind of data. The connection's default is
 * synchronous=FULL, so every ledger claim, commit and fail — a statement
 * of its own, or a BEGIN IMMEDIATE transaction — is on disk before it is
 * acknowledged. A run transaction of a store opened durability=relaxed
 * switches to synchronous=NORMAL (the WAL is not synced at its commit: a
 * crash of the process loses nothing, a power cut may lose the last
 * decisions' counters). SQLite does not let the level change inside a
 * transaction, so when a ledger savepoint joined such a run transaction
 * the WAL is synced by hand right after its COMMIT (wal_sync), before the
 * call returns: a claim made during a decision is as durable as one made
 * on its own.
 *
 * Writers serialize on BEGIN IMMEDIATE (the database's write lock), which
 * is what makes one claim win and what serializes two decisions for a run.
 * A lock not had within busy_timeout_ms is LG_EBUSY. SQLite's result codes
 * stop here: callers see LG_EBUSY, LG_ENOMEM, LG_ECONFLICT (a unique key)
 * or LG_ESTORE with SQLite's own message.
 *
 * Reads outside the handle's transactions may go through the reader, a
 * read-only connection of the file (WAL readers never wait for the write
 * lock), and /healthz's write probe tries the write lock on a connection
 * of its own. memory: has neither: one handle is the whole database.
 *
 * memory: is a memdb database (a name without a leading slash: private
 * to its connection), not ":memory:". A ":memory:" database lives in
 * SQLite's page cache, every page of it, and a commit that truncates the
 * cache (one that let a page past the end into it) walks the whole cache:
 * at 100,000 gateway runs that was milliseconds on one commit in a
 * hundred. memdb keeps the bytes in one buffer of its own, beside a page
 * cache as small as a file's (test_store_conformance, test_cache_bounded).
 */
#include "driver.h"
#include "store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

const lg__dialect_t lg__dialect_sqlite = {
    .id = LG__D_SQLITE,
    .placeholder = '?',
    .for_update = "", /* a transaction holds the database's write lock */
    .table_exists = "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                    " AND name = 'lg_schema_version'",
    .now_ms = "CAST(strftime('%s','now') AS INTEGER) * 1000",
    .migrate_begin = "BEGIN IMMEDIATE",
    .trace_tail = 1,
};

/* Transaction control, run for every decision (a savepoint each, a
 * transaction for each group commit): prepared on first use, not parsed
 * again every time as sqlite3_exec() would. */
enum { C_BEGIN, C_BEGIN_READ, C_COMMIT, C_ROLLBACK, C_SAVEPOINT, C_RELEASE, C_ROLLBACK_TO,
       C_SYNC_NORMAL, C_SYNC_FULL, C__N };
static const char *const ctl_sql[C__N] = {
    [C_BEGIN] = "BEGIN IMMEDIATE",
    [C_BEGIN_READ] = "BEGIN",
    [C_COMMIT] = "COMMIT",
    [C_ROLLBACK] = "ROLLBACK",
    [C_SAVEPOINT] = "SAVEPOINT lg_sp",
    [C_RELEASE] = "RELEASE lg_sp",
    [C_ROLLBACK_TO] = "ROLLBACK TO lg_sp",
    [C_SYNC_NORMAL] = "PRAGMA synchronous=NORMAL",
    [C_SYNC_FULL] = "PRAGMA synchronous=FULL",
};

typedef struct sqc {
  sqlite3 *db;               /* the connection */
  sqlite3_stmt **q;          /* the query table, prepared once (nq entries) */
  const char *const *sql;    /* its text, for the reader */
  int nq;
  sqlite3_stmt *ctl[C__N];   /* prepared on first use */
  int memory;                /* memory: (no file, no reader, no probe) */
  int sync;                  /* the synchronous level set now: 1 NORMAL, 2 FULL */
  int need_sync;             /* a ledger write joined this run transaction */
  int in_txn;                /* a transaction of begin() is open */
  /* The reader: a read-only connection for reads outside this handle's
   * transactions (lg__store_read_begin), so that they never wait behind a
   * write — this handle's own, waiting for the file's write lock, or
   * another process's. WAL readers do not take the write lock. Opened on
   * first use; its statements are prepared on first use too. */
  sqlite3 *rdb;              /* NULL until first used */
  sqlite3_stmt **rq;         /* its statements */
  pthread_mutex_t rmu;       /* one reader at a time on it */
  char *path;                /* the file, for the reader and the probe */
  /* The write probe (/healthz): a connection of its own that tries the
   * write lock without waiting for the handle. */
  sqlite3 *pdb;              /* NULL until first used */
  pthread_mutex_t pmu;       /* one probe at a time */
  int64_t locked_since_ms;   /* the probe first found the lock held (0: not) */
  _Atomic int full;          /* the last write failed for a full disk */
} sqc_t;

/* The connection whose reader the calling thread holds, or NULL. */
static _Thread_local sqc_t *tl_reader;

static int reading(const sqc_t *c) { return tl_reader == c; }
static sqlite3 *cur_db(const sqc_t *c) { return reading(c) ? c->rdb : c->db; }

/* Translates an SQLite result code at the edge; db gives the message. */
static int fail_on(sqc_t *c, sqlite3 *db, int rc, const char *what, lg_error_t *err) {
  int prim = rc & 0xff;
  if (c && prim == SQLITE_FULL) c->full = 1;
  int code = prim == SQLITE_BUSY || prim == SQLITE_LOCKED ? LG_EBUSY
             : prim == SQLITE_NOMEM                       ? LG_ENOMEM
             : rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE
                 ? LG_ECONFLICT
                 : LG_ESTORE;
  const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (code == LG_EBUSY)
    return lg__err(err, code, NULL, -1, "%s: the database is locked by another writer (%s)",
                   what, msg);
  return lg__err(err, code, NULL, -1, "%s: %s", what, msg);
}

static int sq_fail(lg_store_t *s, int rc, const char *what, lg_error_t *err) {
  sqc_t *c = s->conn;
  return fail_on(c, c ? cur_db(c) : NULL, rc, what, err);
}

static int d_exec(lg_store_t *s, const char *sql, lg_error_t *err) {
  sqc_t *c = s->conn;
  int rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
  return rc == SQLITE_OK ? 0 : sq_fail(s, rc, sql, err);
}

static int d_query_int(lg_store_t *s, const char *sql, int64_t *out, lg_error_t *err) {
  sqc_t *c = s->conn;
  sqlite3_stmt *st = NULL;
  *out = 0;
  int rc = sqlite3_prepare_v2(cur_db(c), sql, -1, &st, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
  int ret = rc == SQLITE_ROW ? 0 : sq_fail(s, rc, sql, err);
  sqlite3_finalize(st);
  return ret;
}

/* Runs transaction control statement `which`. */
static int ctl(lg_store_t *s, int which, lg_error_t *err) {
  sqc_t *c = s->conn;
  int rc = SQLITE_OK;
  if (!c->ctl[which]) rc = sqlite3_prepare_v2(c->db, ctl_sql[which], -1, &c->ctl[which], NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(c->ctl[which]);
    int reset = sqlite3_reset(c->ctl[which]);
    rc = rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : reset != SQLITE_OK ? reset : rc;
  }
  return rc == SQLITE_OK ? 0 : fail_on(c, c->db, rc, ctl_sql[which], err);
}

static int set_sync(lg_store_t *s, int level, lg_error_t *err) {
  sqc_t *c = s->conn;
  if (c->sync == level || c->memory) return 0;
  int rc = ctl(s, level == 2 ? C_SYNC_FULL : C_SYNC_NORMAL, err);
  if (!rc) c->sync = level;
  return rc;
}

static void finalize_all(sqc_t *c) {
  for (int i = 0; c->q && i < c->nq; i++) sqlite3_finalize(c->q[i]);
  for (int i = 0; c->rq && i < c->nq; i++) sqlite3_finalize(c->rq[i]);
  for (int i = 0; i < C__N; i++) sqlite3_finalize(c->ctl[i]);
  lg__free(c->q);
  lg__free(c->rq);
  c->q = c->rq = NULL;
}

static void free_conn(lg_store_t *s) {
  sqc_t *c = s->conn;
  if (!c) return;
  finalize_all(c);
  sqlite3_close(c->db);
  if (c->rdb) sqlite3_close(c->rdb);
  if (c->pdb) sqlite3_close(c->pdb);
  pthread_mutex_destroy(&c->rmu);
  pthread_mutex_destroy(&c->pmu);
  lg__free(c->path);
  lg__free(c);
  s->conn = NULL;
}

/* Switching to WAL needs a moment of exclusive access, and SQLite does
 * not always wait for it through the busy handler: retry until the busy
 * timeout is spent. */
static int use_wal(lg_store_t *s, lg_error_t *err) {
  sqc_t *c = s->conn;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode=WAL", -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    int wal = rc == SQLITE_ROW &&
              !sqlite3_stricmp((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    if (wal) return 0;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long waited = (long)((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
    if ((rc & 0xff) != SQLITE_BUSY || waited >= s->opts.busy_timeout_ms)
      return rc == SQLITE_ROW ? lg__err(err, LG_ESTORE, NULL, -1,
                                        "the database cannot use WAL mode (is it on a "
                                        "network file system or read-only?)")
                              : sq_fail(s, rc, "switching to WAL mode", err);
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* SQLite's own wait for a lock (sqlite3_busy_timeout's: the same steps,
 * the same total, ud the timeout in ms), which first tells the thread that
 * it blocks (lg__will_block: a server's loop leader passes its lead on). */
static int on_busy(void *ud, int count) {
  static const unsigned char step[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
  static const unsigned char before[] = {0, 1, 3, 8, 18, 33, 53, 78, 103, 128, 178, 228};
  const int n = (int)sizeof step, timeout = *(const int *)ud;
  int delay = count < n ? step[count] : step[n - 1];
  int prior = count < n ? before[count] : before[n - 1] + step[n - 1] * (count - (n - 1));
  if (prior + delay > timeout && (delay = timeout - prior) <= 0) return 0;
  if (count == 0) lg__will_block();
  sqlite3_sleep(delay);
  return 1;
}

/* SQLite counts every allocation it makes (sqlite3_memory_used) under a
 * global mutex unless told not to: 70 allocations a gateway request, 3%
 * of its instructions, a lock and an unlock each, for a figure nothing
 * here reads. Said once, before SQLite's first use in the process; when
 * the program around the library has used SQLite already, it is too late
 * and changes nothing (SQLITE_MISUSE, ignored). */
static void sqlite_config(void) { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }

static int open_conn(lg_store_t *s, const char *path, int memory, lg_error_t *err) {
  static pthread_once_t configured = PTHREAD_ONCE_INIT;
  pthread_once(&configured, sqlite_config);
  if (!memory && (!path || !*path))
    return lg__err(err, LG_EINVAL, "url", -1, "sqlite: needs a file name (sqlite:PATH)");
  sqc_t *c = lg__calloc(1, sizeof *c);
  if (!c) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  if (!(c->path = lg__strdup(memory ? "file:loopguard-memory?vfs=memdb" : path))) {
    lg__free(c);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  /* Recursive: a list's callback may read again. */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&c->rmu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_mutex_init(&c->pmu, NULL);
  c->memory = memory;
  s->conn = c;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (memory ? SQLITE_OPEN_URI : 0);
  if (!s->opts.no_create || memory) flags |= SQLITE_OPEN_CREATE;
  int rc = sqlite3_open_v2(c->path, &c->db, flags, NULL);
  /* Without SQLITE_OPEN_CREATE a missing file is SQLITE_CANTOPEN; say
   * "not found" only when it really is not there (not for a permission). */
  if (rc == SQLITE_CANTOPEN && s->opts.no_create && !memory && access(path, F_OK) != 0 &&
      errno == ENOENT) {
    rc = lg__err(err, LG_ENOTFOUND, "url", -1, "no store at %s", path);
    goto fail;
  }
  if (rc != SQLITE_OK) {
    rc = sq_fail(s, rc, "opening the database", err);
    goto fail;
  }
  sqlite3_extended_result_codes(c->db, 1);
  if (memory) { /* memdb stops a database at 1 GiB by default: as much as the process may hold */
    sqlite3_int64 lim = (sqlite3_int64)1 << 46;
    sqlite3_file_control(c->db, "main", SQLITE_FCNTL_SIZE_LIMIT, &lim);
    /* One handle is the whole database: it keeps its lock, so a transaction
     * neither takes it nor checks the schema again (a commit 11,000
     * instructions → 7,400; docs/internals/performance.md, session 30). */
    sqlite3_exec(c->db, "PRAGMA locking_mode=EXCLUSIVE", NULL, NULL, NULL);
  }
  sqlite3_busy_handler(c->db, on_busy, &s->opts.busy_timeout_ms);
  if (!memory && (rc = use_wal(s, err))) goto fail;
  if ((rc = set_sync(s, 2, err))) goto fail;
  return 0;
fail:
  free_conn(s);
  return rc;
}

static int d_open(lg_store_t *s, const char *path, lg_error_t *err) {
  return open_conn(s, path, 0, err);
}

static int d_open_memory(lg_store_t *s, const char *arg, lg_error_t *err) {
  (void)arg;
  return open_conn(s, NULL, 1, err);
}

static void d_close(lg_store_t *s) {
  sqc_t *c = s->conn;
  if (!c) return;
  if (!sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
  free_conn(s);
}

static int d_prepare(lg_store_t *s, const char *const *sql, int n, lg_error_t *err) {
  sqc_t *c = s->conn;
  if (!(c->q = lg__calloc((size_t)n, sizeof *c->q)) ||
      !(c->rq = lg__calloc((size_t)n, sizeof *c->rq)))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  c->nq = n;
  c->sql = sql;
  for (int i = 0; i < n; i++) {
    if (!sql[i]) continue;
    int rc = sqlite3_prepare_v3(c->db, sql[i], -1, SQLITE_PREPARE_PERSISTENT, &c->q[i], NULL);
    if (rc != SQLITE_OK) return sq_fail(s, rc, "preparing a statement", err);
  }
  return 0;
}

/* The statement (the reader's, prepared on first use, while the calling
 * thread reads through it). */
static lg__stmt_t *d_stmt(lg_store_t *s, int which, lg_error_t *err) {
  sqc_t *c = s->conn;
  if (!reading(c)) return (lg__stmt_t *)c->q[which];
  /* The reader's own statement, prepared on first use. */
  if (!c->rq[which]) {
    int rc = sqlite3_prepare_v3(c->rdb, c->sql[which], -1, SQLITE_PREPARE_PERSISTENT,
                                &c->rq[which], NULL);
    if (rc != SQLITE_OK) {
      fail_on(c, c->rdb, rc, "preparing a statement", err);
      return NULL;
    }
  }
  return (lg__stmt_t *)c->rq[which];
}

#define ST(x) ((sqlite3_stmt *)(x))

static void d_bind_null(lg__stmt_t *st, int i) { sqlite3_bind_null(ST(st), i); }
static void d_bind_i64(lg__stmt_t *st, int i, int64_t v) { sqlite3_bind_int64(ST(st), i, v); }
static void d_bind_text(lg__stmt_t *st, int i, const char *v, size_t n) {
  if (v) sqlite3_bind_text64(ST(st), i, v, n, SQLITE_STATIC, SQLITE_UTF8);
  else sqlite3_bind_null(ST(st), i);
}
static void d_bind_blob(lg__stmt_t *st, int i, const void *v, size_t n) {
  if (v) sqlite3_bind_blob64(ST(st), i, v, n, SQLITE_STATIC);
  else sqlite3_bind_null(ST(st), i);
}

static int d_step(lg_store_t *s, lg__stmt_t *x, const char *what, lg_error_t *err) {
  sqc_t *c = s->conn;
  sqlite3_stmt *st = ST(x);
  sqlite3 *db = sqlite3_db_handle(st);
  /* A write outside a transaction is a ledger write: durable. */
  if (db == c->db && !sqlite3_stmt_busy(st) && !sqlite3_stmt_readonly(st) &&
      sqlite3_get_autocommit(db)) {
    int rc = set_sync(s, 2, err);
    if (rc) return rc;
  }
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) return LG__ROW;
  if (rc == SQLITE_DONE) return LG__DONE;
  return fail_on(c, db, rc, what, err);
}

static int64_t d_changes(lg_store_t *s, lg__stmt_t *st) {
  (void)s;
  return sqlite3_changes(sqlite3_db_handle(ST(st)));
}

static void d_reset(lg__stmt_t *st) {
  sqlite3_reset(ST(st));
  sqlite3_clear_bindings(ST(st));
}

static int d_ncols(lg__stmt_t *st) { return sqlite3_column_count(ST(st)); }
static int d_col_null(lg__stmt_t *st, int i) { return sqlite3_column_type(ST(st), i) == SQLITE_NULL; }
static int64_t d_col_i64(lg__stmt_t *st, int i) { return sqlite3_column_int64(ST(st), i); }
static const char *d_col_text(lg__stmt_t *st, int i, size_t *len) {
  if (sqlite3_column_type(ST(st), i) == SQLITE_NULL) {
    if (len) *len = 0;
    return NULL;
  }
  const void *p = sqlite3_column_blob(ST(st), i);
  if (len) *len = (size_t)sqlite3_column_bytes(ST(st), i);
  return p ? p : "";
}

/* ---- transactions ---- */

/* Makes the WAL durable now: what synchronous=FULL does at a commit. A
 * relaxed run transaction runs at NORMAL, and SQLite does not allow
 * changing the level inside a transaction; when a ledger write joined
 * one, this is called right after its COMMIT, before anything is
 * acknowledged. */
static int wal_sync(lg_store_t *s, lg_error_t *err) {
  sqc_t *c = s->conn;
  sqlite3_file *wal = NULL;
  int rc = sqlite3_file_control(c->db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal);
  if (rc != SQLITE_OK || !wal || !wal->pMethods) return sq_fail(s, rc, "finding the WAL", err);
  rc = wal->pMethods->xSync(wal, SQLITE_SYNC_NORMAL);
  return rc == SQLITE_OK ? 0 : sq_fail(s, rc, "syncing the WAL", err);
}

static int d_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  sqc_t *c = s->conn;
  int rc;
  if (nested) {
    /* SQLite undoes a whole transaction by itself on some errors (a disk
     * full, an I/O error, no memory): a SAVEPOINT then would begin a
     * transaction of its own, which its RELEASE commits, out of the batch
     * whose COMMIT then fails and answers every job "nothing stored" (and
     * a retry would decide it twice). */
    if (c->in_txn && sqlite3_get_autocommit(c->db))
      return lg__err(err, LG_ESTORE, NULL, -1,
                     "SQLite rolled the transaction back (a disk full, an I/O error or no "
                     "memory): nothing of it is stored");
    if (upgrade) c->need_sync = 1;
    return ctl(s, C_SAVEPOINT, err);
  }
  c->need_sync = 0;
  /* A run transaction is durable too unless the store was opened relaxed. */
  int relaxed = kind == LG__TXN_RUN && s->opts.durability == LG_STORE_RELAXED;
  if ((rc = set_sync(s, relaxed ? 1 : 2, err))) return rc;
  if ((rc = lg__store_fault_at(s, "sqlite.begin", err))) return rc;
  if ((rc = ctl(s, C_BEGIN, err))) return rc;
  c->in_txn = 1;
  return 0;
}

static int d_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  sqc_t *c = s->conn;
  int rc;
  if (nested) {
    if (!commit && (rc = ctl(s, C_ROLLBACK_TO, err))) return rc;
    return ctl(s, C_RELEASE, err);
  }
  c->in_txn = 0;
  if (commit) {
    rc = ctl(s, C_COMMIT, err);
    if (rc && !sqlite3_get_autocommit(c->db)) ctl(s, C_ROLLBACK, NULL);
    if (!rc) c->full = 0;
    if (!rc && c->need_sync && c->sync != 2 && !c->memory) rc = wal_sync(s, err);
  } else {
    rc = sqlite3_get_autocommit(c->db) ? 0 : ctl(s, C_ROLLBACK, err);
  }
  c->need_sync = 0;
  /* synchronous stays as this transaction set it: the server's committer
   * runs one run transaction after another, and setting it is a PRAGMA
   * that SQLite parses again every time. The next ledger transaction, or
   * write outside a transaction (d_step), sets it back to FULL. */
  return rc;
}

static int d_in_txn(lg_store_t *s) {
  sqc_t *c = s->conn;
  return c->in_txn && !reading(c);
}

/* ---- the run cache's clock ---- */

/* SQLite's data version (SQLITE_FCNTL_DATA_VERSION): moves with every
 * commit, this connection's and any other's, in this process or another. */
static unsigned d_data_version(lg_store_t *s) {
  sqc_t *c = s->conn;
  unsigned v = 0;
  if (sqlite3_file_control(c->db, "main", SQLITE_FCNTL_DATA_VERSION, &v) != SQLITE_OK) return 0;
  return v;
}

/* ---- the reader and the probe ---- */

/* Takes (on) or gives back (off) the reader for the calling thread: the
 * read-only connection, opened on first use. While taken, d_stmt hands
 * out its statements and never the handle's own connection, which may be
 * inside a write. */
static int d_reader(lg_store_t *s, int on, lg_error_t *err) {
  sqc_t *c = s->conn;
  if (!on) {
    tl_reader = NULL;
    pthread_mutex_unlock(&c->rmu);
    return 0;
  }
  pthread_mutex_lock(&c->rmu);
  if (!c->rdb) {
    int rc = sqlite3_open_v2(c->path, &c->rdb, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
      lg__err(err, LG_ESTORE, NULL, -1, "opening the reader: %s",
              c->rdb ? sqlite3_errmsg(c->rdb) : sqlite3_errstr(rc));
      sqlite3_close(c->rdb);
      c->rdb = NULL;
      pthread_mutex_unlock(&c->rmu);
      return LG_ESTORE;
    }
    sqlite3_extended_result_codes(c->rdb, 1);
    sqlite3_busy_handler(c->rdb, on_busy, &s->opts.busy_timeout_ms);
  }
  tl_reader = c;
  return 0;
}

static int d_reading(lg_store_t *s, int set, int on) {
  sqc_t *c = s->conn;
  int was = reading(c);
  if (set) tl_reader = on ? c : NULL;
  return was;
}

static int d_snapshot(lg_store_t *s, int on, int *opened, lg_error_t *err) {
  sqc_t *c = s->conn;
  sqlite3 *db = cur_db(c);
  if (!on) {
    int rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : sq_fail(s, rc, "COMMIT", err);
  }
  *opened = 0;
  if (!sqlite3_get_autocommit(db)) return 0; /* inside our own transaction */
  int rc = reading(c) ? (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK ? 0 : LG_ESTORE)
                      : ctl(s, C_BEGIN_READ, err);
  if (rc) return rc == LG_ESTORE && reading(c) ? sq_fail(s, SQLITE_ERROR, "BEGIN", err) : rc;
  *opened = 1;
  return 0;
}

/* The write probe: BEGIN IMMEDIATE and ROLLBACK on a connection of its
 * own, waiting at most 100 ms (a commit of this process's own committer
 * takes a few ms; a lock held longer is another writer's, or a stuck
 * one), and the free space of the file system. Writes nothing. */
static int d_write_probe(lg_store_t *s, int64_t now_ms, lg_error_t *err) {
  sqc_t *c = s->conn;
  int out = 0;
  pthread_mutex_lock(&c->pmu);
  if (!c->pdb) {
    if (sqlite3_open_v2(c->path, &c->pdb, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
      out = lg__err(err, LG_ESTORE, NULL, -1, "the store's file cannot be opened for writing");
      sqlite3_close(c->pdb);
      c->pdb = NULL;
      goto done;
    }
    sqlite3_busy_timeout(c->pdb, 100);
  }
  int rc = sqlite3_exec(c->pdb, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
    if (!c->locked_since_ms) c->locked_since_ms = now_ms;
    int64_t held = now_ms - c->locked_since_ms;
    out = lg__err(err, LG_EBUSY, NULL, -1,
                  "the store's write lock has been held by another writer for %lld.%01lld s "
                  "(writes wait %d ms for it, then fail)",
                  (long long)(held / 1000), (long long)(held % 1000 / 100),
                  s->opts.busy_timeout_ms);
    goto done;
  }
  c->locked_since_ms = 0;
  if (rc != SQLITE_OK) {
    out = lg__err(err, LG_ESTORE, NULL, -1, "the store cannot begin a write: %s",
                  sqlite3_errstr(rc));
    goto done;
  }
  sqlite3_exec(c->pdb, "ROLLBACK", NULL, NULL, NULL);
  struct statvfs vfs;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", c->path);
  char *slash = strrchr(dir, '/');
  if (slash) *(slash == dir ? slash + 1 : slash) = 0;
  else snprintf(dir, sizeof dir, ".");
  if (statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < (1u << 20))
    out = lg__err(err, LG_ESTORE, NULL, -1,
                  "disk full: %llu bytes free on the store's file system",
                  (unsigned long long)vfs.f_bavail * vfs.f_frsize);
  else if (c->full)
    out = lg__err(err, LG_ESTORE, NULL, -1,
                  "disk full: the last write failed with \"database or disk is full\"");
done:
  pthread_mutex_unlock(&c->pmu);
  return out;
}

/* ---- for the checkpointer and the tests ---- */

void lg__store_sqlite_autocheckpoint(lg_store_t *s, int pages) {
  if (!s || s->drv != &lg__driver_sqlite || !s->conn) return;
  sqc_t *c = s->conn;
  lg__store_lock(s);
  sqlite3_wal_autocheckpoint(c->db, pages);
  lg__store_unlock(s);
}

int lg__store_sqlite_synchronous(lg_store_t *s) {
  if (!s || s->drv != &lg__driver_sqlite || !s->conn) return -1;
  sqc_t *c = s->conn;
  sqlite3_stmt *st = NULL;
  lg__store_lock(s);
  int level = -1;
  if (sqlite3_prepare_v2(c->db, "PRAGMA synchronous", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    level = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  lg__store_unlock(s);
  return level;
}

int64_t lg__store_sqlite_cache_bytes(lg_store_t *s) {
  if (!s || (s->drv != &lg__driver_sqlite && s->drv != &lg__driver_sqlite_memory) || !s->conn) return -1;
  sqc_t *c = s->conn;
  int cur = 0, hi = 0;
  lg__store_lock(s);
  int rc = sqlite3_db_status(c->db, SQLITE_DBSTATUS_CACHE_USED, &cur, &hi, 0);
  lg__store_unlock(s);
  return rc == SQLITE_OK ? cur : -1;
}

const char *lg__store_sqlite_path(const lg_store_t *s) {
  if (!s || s->drv != &lg__driver_sqlite || !s->conn) return NULL;
  return ((const sqc_t *)s->conn)->path;
}

#define COMMON                                                                              \
  .dialect = &lg__dialect_sqlite, .close = d_close, .prepare = d_prepare, .exec = d_exec,  \
  .query_int = d_query_int, .begin = d_begin, .end = d_end, .in_txn = d_in_txn,             \
  .stmt = d_stmt, .bind_null = d_bind_null, .bind_i64 = d_bind_i64,                         \
  .bind_text = d_bind_text, .bind_blob = d_bind_blob, .step = d_step, .changes = d_changes, \
  .reset = d_reset, .ncols = d_ncols, .col_null = d_col_null, .col_i64 = d_col_i64,         \
  .col_text = d_col_text, .data_version = d_data_version, .reading = d_reading,             \
  .snapshot = d_snapshot

const lg__driver_t lg__driver_sqlite = {
    .name = "sqlite",
    .caps = LG__CAP_SINGLE_WRITER | LG__CAP_DATA_VERSION,
    .open = d_open,
    .reader = d_reader,
    .write_probe = d_write_probe,
    COMMON,
};

const lg__driver_t lg__driver_sqlite_memory = {
    .name = "memory",
    .caps = LG__CAP_SINGLE_WRITER | LG__CAP_DATA_VERSION,
    .open = d_open_memory,
    COMMON,
};
