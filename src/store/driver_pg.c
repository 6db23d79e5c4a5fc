/*
 * driver_pg.c — the PostgreSQL driver (driver.h) over libpq, for
 * postgres:CONNINFO: several servers on several machines sharing one
 * database.
 *
 * Writers serialize on row locks (LG__CAP_ROW_LOCKS): a decision for a run
 * is one transaction that starts by locking the run's row (SELECT ... FOR
 * UPDATE), and a claim rests on the primary key of lg_operations (INSERT
 * ... ON CONFLICT DO NOTHING in autocommit: of any number of concurrent
 * claimants exactly one inserts; PostgreSQL makes the others wait for it
 * to commit or roll back). lock_timeout is the store's busy_timeout_ms: a
 * lock not had in time is SQLSTATE 55P03, which becomes LG_EBUSY.
 *
 * Durability: ledger statements and transactions commit with the
 * session's synchronous_commit (on). A run transaction of a store opened
 * durability=relaxed sets it off for itself (SET LOCAL); a ledger
 * savepoint inside it sets it back on, so a claim made during a decision
 * is still durable.
 *
 * A dropped connection fails the call in progress with LG_ESTORE (nothing
 * half-written: PostgreSQL rolls back the open transaction) and is
 * re-established, its statements prepared again, at the start of the next
 * call outside a transaction. SQLSTATEs and libpq's statuses stop here.
 * A server that keeps the connection but does not answer (its disk
 * stalled, its process stopped, its machine paused: nothing that a TCP
 * keepalive sees) is the same once the store is open: every answer is
 * waited for at most query_timeout_ms (the URL's; 60 s by default), then
 * the socket is shut and the call fails as for a dropped connection.
 *
 * Numbers are sent as text, strings and bytes as their bytes (binary
 * format: no NUL needed); results come back in binary form (bigint as 8
 * bytes, big-endian).
 *
 * Pipelines. In batch mode (lg__sql_batch, asked for by the
 * budget module before an outermost transaction) BEGIN and the writes
 * whose result nobody needs (send(want 0)) wait, and go out in one
 * pipeline with the next statement that must run — or with the COMMIT —
 * so that a reservation costs two round trips instead of six; and
 * statements sent with want 1 (a row lock, then what it protects) go out
 * together with the first of them that is stepped. What runs, and in which
 * order, does not change, only when it is sent; a write's error may then
 * surface at the next statement or at the commit, and fails the
 * transaction there.
 */
#include "driver.h"
#include "store.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

const lg__dialect_t lg__dialect_pg = {
    .id = LG__D_POSTGRES,
    .placeholder = '$',
    .for_update = " FOR UPDATE",
    .table_exists = "SELECT CASE WHEN to_regclass('lg_schema_version') IS NULL THEN 0 ELSE 1 END",
    .now_ms = "(extract(epoch FROM now()) * 1000)::bigint",
    /* An arbitrary constant: the advisory lock that serializes migrations. */
    .migrate_begin = "BEGIN; SELECT pg_advisory_xact_lock(7160823011)",
    .trace_tail = 0,
};

#define MAX_PARAMS 16

struct lg__stmt {
  int which;                  /* the entry of the query table */
  int np;                     /* its parameters */
  const char *vals[MAX_PARAMS]; /* bound (borrowed; NULL: SQL NULL) */
  int lens[MAX_PARAMS];
  int fmts[MAX_PARAMS];       /* 0 text (numbers), 1 binary (bytes) */
  char num[MAX_PARAMS][24];   /* numbers bound, as text */
  PGresult *res;              /* its result once run */
  int row;                    /* the row step() is on (-1 before the first) */
  int queued;                 /* sent (want 1): waits in the pipeline */
  int failed;                 /* the pipeline it was in failed: an LG_E* code */
  int writes;                 /* not a SELECT: outside a transaction, its own COMMIT */
};

/* A statement of a pipeline: a held-back write (its parameters copied), a
 * statement whose result is wanted (st), or a command without parameters. */
typedef struct item {
  const char *sql;            /* a command, or NULL */
  lg__stmt_t *st;             /* a wanted result, or NULL */
  int which, np;              /* a held-back write: */
  char *vals[MAX_PARAMS];     /* its parameters (new) */
  int lens[MAX_PARAMS];
  int fmts[MAX_PARAMS];
} item_t;

typedef struct pgc {
  PGconn *conn;
  int prepared;               /* the statements exist on this connection */
  lg__stmt_t *st;             /* the query table's statements (n) */
  const char *const *sql;
  int n;
  int batch;                  /* the current outermost transaction is batched */
  int begin_pending;          /* its BEGIN has not been sent yet */
  item_t *q;                  /* waiting to be sent, in order */
  int nq, capq;
  int timed_out;              /* the connection was shut: no answer within the deadline */
  int commit_sent;            /* a COMMIT is on its way (d_end), or a write outside a
                                 transaction (d_step): a connection lost now leaves
                                 its outcome unknown (pg_fail) */
} pgc_t;

static void no_notices(void *arg, const char *msg) {
  (void)arg;
  (void)msg;
}

/* Copies libpq's message without its trailing newline. */
static void trim_msg(char *out, size_t size, const char *msg) {
  snprintf(out, size, "%s", msg && *msg ? msg : "unknown error");
  size_t n = strlen(out);
  while (n && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = 0;
}

/* Translates a failed result (or a connection failure when res is NULL). */
static int pg_fail(lg_store_t *s, PGresult *res, const char *what, lg_error_t *err) {
  pgc_t *p = s->conn;
  char msg[400];
  const char *maybe = p->commit_sent ? LG__ERR_MAYBE_STORED : "";
  if (p->timed_out)
    return lg__err(err, LG_ESTORE, NULL, -1,
                   "%s: PostgreSQL did not answer within %d ms (%s), and the "
                   "connection was dropped: the next call connects again%s",
                   what, s->deadline_ms ? s->deadline_ms : s->query_timeout_ms,
                   s->deadline_ms ? s->deadline_why : "query_timeout_ms", maybe);
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  int lost = !p->conn || PQstatus(p->conn) != CONNECTION_OK;
  trim_msg(msg, sizeof msg, res ? PQresultErrorMessage(res) : NULL);
  if ((!res || !*PQresultErrorMessage(res)) && p->conn)
    trim_msg(msg, sizeof msg, PQerrorMessage(p->conn));
  if (lost)
    return lg__err(err, LG_ESTORE, NULL, -1,
                   "%s: the connection to PostgreSQL was lost%s" LG__ERR_DETAIL "%s)", what,
                   maybe, msg);
  int code = LG_ESTORE;
  if (state && (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
                !strcmp(state, "55P03") || !strcmp(state, "57014") ||
                !strcmp(state, "53300")))
    code = LG_EBUSY;
  else if (state && !strcmp(state, "23505")) /* unique_violation */
    code = LG_ECONFLICT;
  return lg__err(err, code, NULL, -1, "%s: %s%s%s%s", what, msg, state ? " (SQLSTATE " : "",
                 state ? state : "", state ? ")" : "");
}

/* ---- waiting for an answer ---- */

static int64_t mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Waits until fd is ready for `events`, at most until `end` (mono_ms):
 * 1 ready, 0 not (a signal: ask again), -1 failed. Past `end` the socket
 * is shut and *timed_out set: libpq then reads its end at once, and the
 * call fails as a lost connection does. */
static int wait_fd(int fd, short events, int64_t end, int *timed_out) {
  int64_t left = end - mono_ms();
  if (left <= 0) {
    *timed_out = 1;
    shutdown(fd, SHUT_RDWR);
    return -1;
  }
  struct pollfd pf = {.fd = fd, .events = events};
  int n = poll(&pf, 1, (int)left);
  return n > 0 ? 1 : n == 0 || errno == EINTR ? 0 : -1;
}

/* Waits until PQgetResult can return without blocking, at most the
 * store's query_timeout_ms (or the shorter deadline lg__store_deadline
 * set): past it the connection is dropped (p->timed_out, wait_fd). A
 * connection that breaks meanwhile is left for PQgetResult to report. */
static void await_answer(lg_store_t *s) {
  pgc_t *p = s->conn;
  int fd = PQsocket(p->conn);
  int ms = s->deadline_ms ? s->deadline_ms : s->query_timeout_ms; /* lg__store_deadline */
  if (ms <= 0 || fd < 0) return;
  int64_t end = mono_ms() + ms;
  while (PQisBusy(p->conn)) {
    int n = wait_fd(fd, POLLIN, end, &p->timed_out);
    if (n < 0 || (n > 0 && !PQconsumeInput(p->conn))) return;
  }
}

static PGresult *next_result(lg_store_t *s) {
  await_answer(s);
  return PQgetResult(((pgc_t *)s->conn)->conn);
}

/* What PQexec returns, for a command just sent (sent: the PQsend* call's
 * 1) and each of its answers waited for by next_result: the last result,
 * or the first that failed; NULL when nothing was sent. */
static PGresult *sent_result(lg_store_t *s, int sent) {
  pgc_t *p = s->conn;
  PGresult *last = NULL, *res;
  if (!sent) return NULL;
  while ((res = next_result(s))) {
    if (last && PQresultStatus(last) == PGRES_FATAL_ERROR) {
      PQclear(res);
      continue;
    }
    PQclear(last);
    last = res;
    if (PQstatus(p->conn) == CONNECTION_BAD) break;
  }
  return last;
}

static PGresult *exec_cmd(lg_store_t *s, const char *sql) {
  return sent_result(s, PQsendQuery(((pgc_t *)s->conn)->conn, sql));
}

/* ---- pipelines ---- */

static void item_free(item_t *it) {
  for (int i = 0; i < MAX_PARAMS; i++) lg__free(it->vals[i]);
}

static void q_clear(pgc_t *p) {
  for (int i = 0; i < p->nq; i++) {
    if (p->q[i].st) p->q[i].st->queued = 0;
    item_free(&p->q[i]);
  }
  p->nq = 0;
}

static int q_push(lg_store_t *s, item_t **out, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (p->nq == p->capq) {
    int cap = p->capq ? p->capq * 2 : 16;
    item_t *q = lg__realloc(p->q, (size_t)cap * sizeof *q);
    if (!q) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    p->q = q;
    p->capq = cap;
  }
  *out = &p->q[p->nq++];
  memset(*out, 0, sizeof **out);
  return 0;
}

static int send_one(pgc_t *p, const item_t *x) {
  char name[16];
  if (x->sql) return PQsendQueryParams(p->conn, x->sql, 0, NULL, NULL, NULL, NULL, 1);
  const lg__stmt_t *st = x->st;
  int which = st ? st->which : x->which;
  snprintf(name, sizeof name, "lg_q%d", which);
  if (st) return PQsendQueryPrepared(p->conn, name, st->np, st->vals, st->lens, st->fmts, 1);
  return PQsendQueryPrepared(p->conn, name, x->np, (const char *const *)x->vals, x->lens,
                             x->fmts, 1);
}

/* Sends BEGIN if it waits, everything queued, then `last` (a command, or
 * NULL), in one pipeline, and reads every result: wanted results land in
 * their statements, last's in *last_res. Returns 0 or the first failure
 * (the statements after it did not run). After it nothing waits. */
static int flush(lg_store_t *s, const char *last, PGresult **last_res, lg_error_t *err) {
  pgc_t *p = s->conn;
  item_t begin = {.sql = "BEGIN"}, tail = {.sql = last};
  int n = p->nq + (p->begin_pending ? 1 : 0) + (last ? 1 : 0);
  const item_t **all = lg__calloc((size_t)n + 1, sizeof *all);
  int rc = 0, k = 0, sent = 0;
  if (last_res) *last_res = NULL;
  if (!all) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto out;
  }
  if (p->begin_pending) all[k++] = &begin;
  for (int i = 0; i < p->nq; i++) all[k++] = &p->q[i];
  if (last) all[k++] = &tail;
  if (PQenterPipelineMode(p->conn) != 1) {
    rc = pg_fail(s, NULL, "starting a pipeline", err);
    goto out;
  }
  for (; sent < n; sent++) {
    if (!send_one(p, all[sent])) {
      rc = pg_fail(s, NULL, "sending a statement", err);
      break;
    }
    if (all[sent] == &tail && !strcmp(last, "COMMIT")) p->commit_sent = 1;
  }
  if (PQpipelineSync(p->conn) != 1 && !rc) rc = pg_fail(s, NULL, "sending a pipeline", err);
  /* One result and a NULL per statement sent, then the sync. */
  for (int i = 0; i < sent; i++) {
    PGresult *res = next_result(s);
    if (!res) {
      if (!rc) rc = pg_fail(s, NULL, "reading a pipeline", err);
      break;
    }
    int st = PQresultStatus(res);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
      if (!rc && all[i]->st) {
        all[i]->st->res = res;
        all[i]->st->row = -1;
        res = NULL;
      } else if (!rc && all[i] == &tail) {
        *last_res = res;
        res = NULL;
      }
    } else if (!rc) {
      rc = pg_fail(s, st == PGRES_PIPELINE_ABORTED ? NULL : res, "statement", err);
    }
    PQclear(res);
    while ((res = next_result(s))) PQclear(res);
  }
  for (;;) {
    PGresult *res = next_result(s);
    if (!res) break;
    int st = PQresultStatus(res);
    PQclear(res);
    if (st == PGRES_PIPELINE_SYNC) break;
  }
  if (PQexitPipelineMode(p->conn) != 1 && !rc) rc = pg_fail(s, NULL, "ending a pipeline", err);
out:
  if (rc) {
    for (int i = 0; i < p->nq; i++)
      if (p->q[i].st) p->q[i].st->failed = rc;
    if (last_res) {
      PQclear(*last_res);
      *last_res = NULL;
    }
  }
  lg__free(all);
  p->begin_pending = 0;
  q_clear(p);
  return rc;
}

/* ---- the connection ---- */

static int pg_cmd(lg_store_t *s, const char *sql, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (p->begin_pending || p->nq) {
    int rc = flush(s, NULL, NULL, err);
    if (rc) return rc;
  }
  PGresult *res = exec_cmd(s, sql);
  int st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : pg_fail(s, res, sql, err);
  PQclear(res);
  return rc;
}

static int session_setup(lg_store_t *s, lg_error_t *err) {
  pgc_t *p = s->conn;
  char sql[160];
  PQsetNoticeProcessor(p->conn, no_notices, NULL);
  /* lock_timeout 0 would mean "wait for ever": "do not wait" is 1 ms. */
  int ms = s->opts.busy_timeout_ms > 0 ? s->opts.busy_timeout_ms : 1;
  snprintf(sql, sizeof sql,
           "SET lock_timeout = %d; SET synchronous_commit = on; SET client_min_messages = warning",
           ms);
  p->prepared = 0;
  return pg_cmd(s, sql, err);
}

/* The highest $N of a statement: its number of parameters. */
static int count_params(const char *sql) {
  int n = 0;
  for (const char *c = sql; *c; c++)
    if (*c == '$' && c[1] >= '0' && c[1] <= '9') {
      int k = atoi(c + 1);
      if (k > n) n = k;
    }
  return n;
}

static int prepare_all(lg_store_t *s, lg_error_t *err) {
  pgc_t *p = s->conn;
  for (int i = 0; i < p->n; i++) {
    if (!p->sql[i]) continue;
    char name[16];
    snprintf(name, sizeof name, "lg_q%d", i);
    PGresult *res = sent_result(s, PQsendPrepare(p->conn, name, p->sql[i], p->st[i].np, NULL));
    int ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    int rc = ok ? 0 : pg_fail(s, res, "preparing a statement", err);
    PQclear(res);
    if (rc) return rc;
  }
  p->prepared = 1;
  return 0;
}

/* Waits for a connection libpq started without blocking (PQconnectStart*
 * or PQresetStart: `reset`), at most the handle's shorter deadline
 * (lg__store_deadline), which is set whenever this is called: PQconnectdb
 * and PQreset wait up to connect_timeout (10 s by default) for a host that
 * does not answer, past a health probe's. On the deadline the attempt is
 * dropped (*timed_out, wait_fd); the next call starts a new one. PQstatus
 * says how it went. */
static void connect_wait(lg_store_t *s, PGconn *c, int reset, int *timed_out) {
  int64_t end = mono_ms() + s->deadline_ms;
  PostgresPollingStatusType st = PGRES_POLLING_WRITING; /* as libpq says to start */
  while (st == PGRES_POLLING_READING || st == PGRES_POLLING_WRITING) {
    int fd = PQsocket(c);
    short events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    int n = fd < 0 ? -1 : wait_fd(fd, events, end, timed_out);
    if (n < 0) return;
    if (n > 0) st = reset ? PQresetPoll(c) : PQconnectPoll(c);
  }
}

/* Connects again (PQreset), within the handle's deadline when it has one. */
static void reconnect(lg_store_t *s) {
  pgc_t *p = s->conn;
  if (!s->deadline_ms) PQreset(p->conn);
  else if (PQresetStart(p->conn)) connect_wait(s, p->conn, 1, &p->timed_out);
}

/* Makes sure the connection is up before a call that starts outside a
 * transaction: a connection lost by an earlier call is re-established. */
static int ensure(lg_store_t *s, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (PQstatus(p->conn) == CONNECTION_OK && (p->prepared || !p->st)) return 0;
  if (s->depth > 0)
    return lg__err(err, LG_ESTORE, NULL, -1,
                   "the connection to PostgreSQL was lost in the middle of a transaction");
  if (PQstatus(p->conn) != CONNECTION_OK) {
    p->timed_out = 0;
    reconnect(s);
    if (PQstatus(p->conn) != CONNECTION_OK) return pg_fail(s, NULL, "reconnecting", err);
  }
  int rc = session_setup(s, err);
  if (!rc && p->st) rc = prepare_all(s, err);
  return rc;
}

/* A database that stops answering (its host gone, a network split, a
 * failover that moves its address) must fail the calls waiting on it, not
 * hold every worker for the kernel's own bounds (a connect retries its SYN
 * for about two minutes; a query sent to a host that is gone waits about
 * fifteen): the connection's defaults, placed before the URL's conninfo so
 * that a value of the URL wins (libpq keeps the last one of a keyword), and
 * connect_timeout only when PGCONNECT_TIMEOUT does not set it. keepalives
 * and tcp_user_timeout apply to TCP only (not a unix socket); PQreset
 * reconnects with the same. */
static PGconn *connect_with_defaults(const char *conninfo, int start) {
  static const char *const keys[] = {"keepalives", "keepalives_idle", "keepalives_interval",
                                     "keepalives_count", "tcp_user_timeout", "connect_timeout",
                                     "dbname", NULL};
  /* a NULL value is skipped (libpq); dbname is expanded: the whole
   * conninfo, key=value or a URI */
  const char *const vals[] = {"1", "10", "5", "3", "30000", getenv("PGCONNECT_TIMEOUT") ? NULL : "10",
                              conninfo, NULL};
  return start ? PQconnectStartParams(keys, vals, 1) : PQconnectdbParams(keys, vals, 1);
}

static int d_open(lg_store_t *s, const char *conninfo, lg_error_t *err) {
  pgc_t *p = lg__calloc(1, sizeof *p);
  if (!p) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  s->conn = p;
  int rc;
  /* within the handle's deadline when it has one (lg__store_open_within) */
  p->conn = connect_with_defaults(conninfo ? conninfo : "", s->deadline_ms > 0);
  if (!p->conn) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory connecting to PostgreSQL");
    goto fail;
  }
  int timed_out = 0;
  if (s->deadline_ms > 0 && PQstatus(p->conn) != CONNECTION_BAD)
    connect_wait(s, p->conn, 0, &timed_out);
  if (timed_out) {
    rc = lg__err(err, LG_ESTORE, NULL, -1,
                 "cannot connect to PostgreSQL: it did not answer within %d ms (%s)",
                 s->deadline_ms, s->deadline_why);
    goto fail;
  }
  if (PQstatus(p->conn) != CONNECTION_OK) {
    char msg[400];
    trim_msg(msg, sizeof msg, PQerrorMessage(p->conn));
    rc = lg__err(err, LG_ESTORE, NULL, -1, "cannot connect to PostgreSQL" LG__ERR_DETAIL "%s)", msg);
    goto fail;
  }
  if ((rc = session_setup(s, err))) goto fail;
  return 0;
fail:
  PQfinish(p->conn);
  lg__free(p);
  s->conn = NULL;
  return rc;
}

static void d_reset(lg__stmt_t *st);

static void d_close(lg_store_t *s) {
  pgc_t *p = s->conn;
  if (!p) return;
  q_clear(p);
  lg__free(p->q);
  for (int i = 0; p->st && i < p->n; i++) d_reset(&p->st[i]);
  lg__free(p->st);
  PQfinish(p->conn); /* an open transaction is rolled back by the server */
  lg__free(p);
  s->conn = NULL;
}

static int d_prepare(lg_store_t *s, const char *const *sql, int n, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (!(p->st = lg__calloc((size_t)n, sizeof *p->st)))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  p->n = n;
  p->sql = sql;
  for (int i = 0; i < n; i++) {
    p->st[i].which = i;
    p->st[i].row = -1;
    p->st[i].np = sql[i] ? count_params(sql[i]) : 0;
    p->st[i].writes = sql[i] && strncmp(sql[i], "SELECT", 6);
    if (p->st[i].np > MAX_PARAMS)
      return lg__err(err, LG_ESTATE, NULL, -1, "query %d has more than %d parameters", i,
                     MAX_PARAMS);
  }
  return prepare_all(s, err);
}

static int d_exec(lg_store_t *s, const char *sql, lg_error_t *err) { return pg_cmd(s, sql, err); }

static int d_query_int(lg_store_t *s, const char *sql, int64_t *out, lg_error_t *err) {
  pgc_t *p = s->conn;
  *out = 0;
  int rc = s->depth == 0 ? ensure(s, err) : 0;
  if (!rc && (p->begin_pending || p->nq)) rc = flush(s, NULL, NULL, err);
  if (rc) return rc;
  PGresult *res = exec_cmd(s, sql);
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) < 1) {
    rc = pg_fail(s, res, sql, err);
  } else {
    *out = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
  }
  PQclear(res);
  return rc;
}

/* ---- transactions ---- */

static int d_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (nested)
    return pg_cmd(s, upgrade ? "SAVEPOINT lg_sp; SET LOCAL synchronous_commit = on"
                             : "SAVEPOINT lg_sp",
                  err);
  int rc = ensure(s, err);
  if (rc) {
    p->batch = 0;
    return rc;
  }
  if (p->batch && kind == LG__TXN_LEDGER) {
    p->begin_pending = 1; /* sent with the first statement */
    return 0;
  }
  p->batch = 0;
  /* synchronous_commit stays on (the session's) unless the store was
   * opened relaxed: with it off, a crash of PostgreSQL lost decisions that
   * had been answered (pg_ctl restart -m immediate under load). Group
   * commit (commit_delay, or many connections flushing together) keeps
   * the cost down. */
  int relaxed = kind == LG__TXN_RUN && s->opts.durability == LG_STORE_RELAXED;
  return pg_cmd(s, relaxed ? "BEGIN; SET LOCAL synchronous_commit = off" : "BEGIN", err);
}

/* Checks a COMMIT's result: an aborted transaction "commits" as ROLLBACK. */
static int commit_result(lg_store_t *s, PGresult *res, lg_error_t *err) {
  if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) return pg_fail(s, res, "COMMIT", err);
  if (strcmp(PQcmdStatus(res), "COMMIT"))
    return lg__err(err, LG_ESTORE, NULL, -1, "the transaction was rolled back by PostgreSQL");
  return 0;
}

static int d_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (nested) {
    if (!commit) q_clear(p); /* writes held back since the savepoint: never sent */
    return pg_cmd(s, commit ? "RELEASE SAVEPOINT lg_sp"
                            : "ROLLBACK TO SAVEPOINT lg_sp; RELEASE SAVEPOINT lg_sp",
                  err);
  }
  int was_pending = p->begin_pending;
  p->batch = 0;
  if (!commit) {
    p->begin_pending = 0;
    q_clear(p);
    if (was_pending) return 0; /* nothing was sent */
    if (PQstatus(p->conn) != CONNECTION_OK) return 0; /* the server rolled it back */
    return pg_cmd(s, "ROLLBACK", err);
  }
  if (was_pending && !p->nq) {
    p->begin_pending = 0; /* an empty transaction: nothing to send */
    return 0;
  }
  PGresult *res = NULL;
  int rc;
  /* Once the COMMIT is handed to libpq (p->commit_sent), a lost connection
   * may have lost only its answer: the error says the outcome is unknown */
  if (was_pending || p->nq) { /* BEGIN (if it waited), the writes held back and the COMMIT */
    rc = flush(s, "COMMIT", &res, err);
    if (!rc) rc = commit_result(s, res, err);
    if (rc && PQstatus(p->conn) == CONNECTION_OK && PQtransactionStatus(p->conn) != PQTRANS_IDLE)
      PQclear(exec_cmd(s, "ROLLBACK"));
  } else {
    int sent = PQsendQuery(p->conn, "COMMIT");
    p->commit_sent = sent;
    res = sent_result(s, sent);
    rc = commit_result(s, res, err);
  }
  p->commit_sent = 0;
  PQclear(res);
  return rc;
}

static int d_in_txn(lg_store_t *s) { return s->depth > 0; }

static int d_batch(lg_store_t *s) {
  pgc_t *p = s->conn;
  if (s->depth == 0) p->batch = 1;
  return 0;
}

/* ---- statements ---- */

static lg__stmt_t *d_stmt(lg_store_t *s, int which, lg_error_t *err) {
  (void)err;
  return &((pgc_t *)s->conn)->st[which];
}

static void d_bind_null(lg__stmt_t *st, int i) {
  st->vals[i - 1] = NULL;
  st->fmts[i - 1] = 0;
}
static void d_bind_i64(lg__stmt_t *st, int i, int64_t v) {
  snprintf(st->num[i - 1], sizeof st->num[i - 1], "%lld", (long long)v);
  st->vals[i - 1] = st->num[i - 1];
  st->lens[i - 1] = 0;
  st->fmts[i - 1] = 0;
}
static void d_bind_blob(lg__stmt_t *st, int i, const void *v, size_t n) {
  st->vals[i - 1] = v;
  st->lens[i - 1] = (int)n;
  st->fmts[i - 1] = 1;
}
static void d_bind_text(lg__stmt_t *st, int i, const char *v, size_t n) {
  d_bind_blob(st, i, v, n); /* text's binary form is its bytes */
}

static void d_reset(lg__stmt_t *st) {
  PQclear(st->res);
  st->res = NULL;
  st->row = -1;
  st->failed = 0;
  for (int i = 0; i < MAX_PARAMS; i++) st->vals[i] = NULL;
  /* A statement still queued stays in the pipeline (its values must live
   * until then): only flush() or a rollback takes it out. */
}

static int d_step(lg_store_t *s, lg__stmt_t *st, const char *what, lg_error_t *err) {
  pgc_t *p = s->conn;
  if (st->failed)
    return lg__err(err, st->failed, NULL, -1, "%s: an earlier statement of its pipeline failed",
                   what);
  if (!st->res) {
    int rc;
    if (st->queued || p->begin_pending || p->nq) {
      if (!st->queued) { /* behind what waits */
        item_t *it;
        if ((rc = q_push(s, &it, err))) return rc;
        it->st = st;
        st->queued = 1;
      }
      if ((rc = flush(s, NULL, NULL, err))) return rc;
    } else {
      if ((rc = ensure(s, err))) return rc;
      char name[16];
      snprintf(name, sizeof name, "lg_q%d", st->which);
      int sent = PQsendQueryPrepared(p->conn, name, st->np, st->vals, st->lens, st->fmts, 1);
      p->commit_sent = sent && st->writes && s->depth == 0; /* a lost answer: unknown */
      PGresult *res = sent_result(s, sent);
      int status = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
      rc = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK ? 0 : pg_fail(s, res, what, err);
      p->commit_sent = 0;
      if (rc) {
        PQclear(res);
        return rc;
      }
      st->res = res;
      st->row = -1;
    }
    if (!st->res)
      return lg__err(err, LG_ESTORE, NULL, -1, "%s: no result from PostgreSQL", what);
  }
  return ++st->row < PQntuples(st->res) ? LG__ROW : LG__DONE;
}

static int d_send(lg_store_t *s, lg__stmt_t *st, int want, lg_error_t *err) {
  pgc_t *p = s->conn;
  item_t *it;
  int rc;
  if (want) {
    if (st->queued || st->res) return 0;
    if ((rc = q_push(s, &it, err))) return rc;
    it->st = st;
    st->queued = 1;
    return 0;
  }
  if (!(p->batch && s->depth > 0)) { /* now */
    rc = d_step(s, st, "write", err);
    d_reset(st);
    return rc < 0 ? rc : 0;
  }
  /* Held back until the next statement or the commit: copy the values. */
  if ((rc = q_push(s, &it, err))) return rc;
  it->which = st->which;
  it->np = st->np;
  for (int i = 0; i < st->np; i++) {
    it->lens[i] = st->lens[i];
    it->fmts[i] = st->fmts[i];
    if (!st->vals[i]) continue;
    size_t len = st->fmts[i] ? (size_t)st->lens[i] : strlen(st->vals[i]);
    if (!(it->vals[i] = lg__strndup(st->vals[i], len))) {
      item_free(it);
      p->nq--;
      d_reset(st);
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
  }
  d_reset(st);
  return 0;
}

static int64_t d_changes(lg_store_t *s, lg__stmt_t *st) {
  (void)s;
  return st->res ? strtoll(PQcmdTuples(st->res), NULL, 10) : 0;
}

static int d_ncols(lg__stmt_t *st) { return st->res ? PQnfields(st->res) : 0; }

static int d_col_null(lg__stmt_t *st, int i) {
  return !st->res || i >= PQnfields(st->res) || PQgetisnull(st->res, st->row, i);
}

static int64_t d_col_i64(lg__stmt_t *st, int i) {
  if (d_col_null(st, i)) return 0;
  const unsigned char *v = (const unsigned char *)PQgetvalue(st->res, st->row, i);
  int len = PQgetlength(st->res, st->row, i);
  uint64_t x = 0;
  for (int k = 0; k < len; k++) x = (x << 8) | v[k];
  if (len == 4) return (int32_t)(uint32_t)x;
  if (len == 2) return (int16_t)(uint16_t)x;
  return (int64_t)x;
}

static const char *d_col_text(lg__stmt_t *st, int i, size_t *len) {
  if (d_col_null(st, i)) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = (size_t)PQgetlength(st->res, st->row, i);
  return PQgetvalue(st->res, st->row, i);
}

int lg__store_pg_backend_pid(lg_store_t *s) {
  pgc_t *p = s && s->drv == &lg__driver_pg ? s->conn : NULL;
  return p && p->conn ? PQbackendPID(p->conn) : 0;
}

const lg__driver_t lg__driver_pg = {
    .name = "postgres",
    .dialect = &lg__dialect_pg,
    .caps = LG__CAP_ROW_LOCKS,
    .open = d_open,
    .close = d_close,
    .prepare = d_prepare,
    .exec = d_exec,
    .query_int = d_query_int,
    .begin = d_begin,
    .end = d_end,
    .in_txn = d_in_txn,
    .stmt = d_stmt,
    .bind_null = d_bind_null,
    .bind_i64 = d_bind_i64,
    .bind_text = d_bind_text,
    .bind_blob = d_bind_blob,
    .step = d_step,
    .changes = d_changes,
    .reset = d_reset,
    .ncols = d_ncols,
    .col_null = d_col_null,
    .col_i64 = d_col_i64,
    .col_text = d_col_text,
    .send = d_send,
    .batch = d_batch,
};
