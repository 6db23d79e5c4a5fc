/*
 * server.c — the life of the HTTP sidecar: start, serve, drain, stop.
 *
 * lg_server_start() does everything that can fail before the first
 * request: it opens the store (one handle, kept for the first worker, so a
 * bad URL or an unreachable database is an error at start and not at the
 * first call), loads tokens and the default policy, resolves and binds the
 * listening address itself (so that port 0 works and the address can be
 * checked: without tokens only a loopback address may be bound), starts
 * --threads libmicrohttpd daemons without a listening socket (each with
 * its own epoll thread for postgres:, or driven by an event loop of ours
 * in epoll mode for sqlite: and memory: (see "the event loops")), and the
 * acceptor (accept.c), which accepts every connection, counts it against
 * the limits, screens its first request head (screen.c: what
 * libmicrohttpd would answer in HTML is answered in JSON) and hands it to
 * a daemon; deadlines that a trickle cannot extend (see "connections").
 *
 * Threads and stores. libmicrohttpd calls the handlers on its pool
 * threads. With PostgreSQL each thread gets its own lg_store_t (a handle
 * serialises its calls, so sharing one would serialise the server), made
 * on the thread's first request and kept in a thread-specific slot; the
 * handles are listed here and closed after the threads have stopped.
 * memory: and sqlite: are different: memory: is private to its handle, and
 * SQLite takes one writer at a time per database (several connections of
 * one process would meet in its busy handler, which sleeps, and would
 * each reread the pages the others wrote). Every thread shares the one
 * handle opened at start, and decisions go through the group commit of
 * batch.c.
 *
 * Shutdown (lg_server_shutdown): stop accepting (the acceptor closes the
 * listening socket),
 * answer requests still arriving on open connections with "Connection:
 * close", wait until none is in flight (bounded by drain_ms, or ended
 * early by lg_server_cut_drain from another thread), cut the gateway's
 * requests still running, stop the threads, close the store handles. A
 * request is always decided and stored, or not started: a thread
 * finishes its handler before it stops.
 */
#include "server.h"
#include "../gateway/gateway.h"
#include "../step/step.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

/* ---- the clock ---- */

int64_t lg__server_now(const lg_server_t *srv) {
  if (srv->o.clock) return srv->o.clock(srv->o.clock_ud);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- what a decided step leaves ---- */

void lg__server_note_step(lg_server_t *srv, const struct lg__step *st) {
  lg__metrics_decision(&srv->metrics, st->action, st->reason, st->stopped_now);
  if (st->was_stopped) {
    if (st->ev.type == LG_EV_RESUME && st->decided && st->action != LG_ACT_STOP)
      atomic_fetch_add(&srv->metrics.runs_active, 1); /* active again */
    return;
  }
  if (st->ledger_outcome >= 0) lg__metrics_ledger(&srv->metrics, (lg_claim_outcome_t)st->ledger_outcome);
  if (st->stopped_now) {
    atomic_fetch_sub(&srv->metrics.runs_active, 1);
    lg__server_log(srv, "info", "stop", st->stop_log.data);
  }
}

/* ---- logs ---- */

/* RFC 3339 UTC with milliseconds: 2025-01-31T12:00:00.123Z. */
static void rfc3339(int64_t ms, char out[32]) {
  lg__time_rfc3339(ms, out); /* the one formatter: clamped to 0000..9999 */
}

void lg__server_log(lg_server_t *srv, const char *level, const char *event, const char *fields) {
  char ts[32];
  int64_t now;
  {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t); /* log times are always real time */
    now = (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
  }
  rfc3339(now, ts);
  lg__buf_t b = {0};
  lg__buf_printf(&b, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":\"%s\"", ts, level, event);
  if (fields && *fields) {
    lg__buf_putc(&b, ',');
    lg__buf_puts(&b, fields);
  }
  lg__buf_puts(&b, "}\n");
  if (!b.oom) {
    pthread_mutex_lock(&srv->log_mu);
    if (srv->log) {
      fwrite(b.data, 1, b.len, srv->log);
      fflush(srv->log);
    }
    pthread_mutex_unlock(&srv->log_mu);
  }
  lg__buf_free(&b);
}

int lg_server_reopen_log(lg_server_t *srv) {
  if (!srv) return 0;
  if (srv->o.prices_file) { /* SIGHUP reloads the prices too */
    lg_error_t e = {0};
    if (lg_price_book_reload(srv->prices, &e)) { /* the old prices stay */
      char buf[600];
      lg__buf_t f = {0};
      lg__buf_puts(&f, "\"error\":");
      lg_error_format(&e, buf, sizeof buf);
      lg__buf_json_str(&f, buf, strlen(buf));
      if (!f.oom) lg__server_log(srv, "error", "prices_not_reloaded", f.data);
      lg__buf_free(&f);
    } else {
      lg__server_log(srv, "info", "prices_reloaded", NULL);
    }
  }
  if (!srv->o.log_path) return 0; /* stderr: nothing to reopen */
  FILE *f = fopen(srv->o.log_path, "a");
  if (!f) return LG_EIO;
  pthread_mutex_lock(&srv->log_mu);
  FILE *old = srv->log;
  srv->log = f;
  srv->log_owned = 1;
  pthread_mutex_unlock(&srv->log_mu);
  if (old && old != stderr) fclose(old);
  lg__server_log(srv, "info", "log_reopened", NULL);
  return 0;
}

/* ---- workers and their stores ---- */


lg__worker_t *lg__server_worker(lg_server_t *srv, lg_error_t *err) {
  return lg__server_worker_within(srv, 0, NULL, err);
}

lg__worker_t *lg__server_worker_within(lg_server_t *srv, int ms, const char *why,
                                       lg_error_t *err) {
  lg__worker_t *w = pthread_getspecific(srv->wkey);
  if (w) return w;
  w = lg__calloc(1, sizeof *w);
  if (!w || !(w->canon = lg_canon_new())) {
    lg__free(w);
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return NULL;
  }
  if (srv->shared) {
    w->store = srv->shared;
  } else {
    pthread_mutex_lock(&srv->wlist_mu);
    w->store = srv->spare;
    srv->spare = NULL;
    pthread_mutex_unlock(&srv->wlist_mu);
    if (!w->store && (w->store = lg__store_open_within(srv->o.store_url, NULL, ms, why, err)) &&
        srv->has_secret)
      lg_key_set_secret(w->store, srv->secret);
    if (!w->store) {
      lg_canon_free(w->canon);
      lg__free(w);
      return NULL;
    }
  }
  pthread_mutex_lock(&srv->wlist_mu);
  w->next = srv->workers;
  srv->workers = w;
  pthread_mutex_unlock(&srv->wlist_mu);
  pthread_setspecific(srv->wkey, w);
  return w;
}

/* ---- the policy cache ---- */

lg_policy_t *lg__server_policy(lg_server_t *srv, const char *json, lg_error_t *err) {
  if (!json || !*json) return lg_policy_ref(srv->default_policy);
  uint64_t h = lg__hash_str(json);
  pthread_mutex_lock(&srv->pol_mu);
  for (int i = 0; i < LG__POL_SLOTS; i++) {
    lg__pol_slot_t *sl = &srv->pol[i];
    if (sl->json && sl->hash == h && !strcmp(sl->json, json)) {
      sl->used = ++srv->pol_tick;
      lg_policy_t *p = lg_policy_ref(sl->pol);
      pthread_mutex_unlock(&srv->pol_mu);
      return p;
    }
  }
  pthread_mutex_unlock(&srv->pol_mu);
  /* Parsed outside the lock: parsing is the slow part. */
  lg_policy_t *p = lg_policy_parse(json, strlen(json), "stored policy", err);
  if (!p) return NULL;
  char *copy = lg__strdup(json);
  if (!copy) return p; /* not cached, still usable */
  pthread_mutex_lock(&srv->pol_mu);
  lg__pol_slot_t *victim = &srv->pol[0];
  for (int i = 0; i < LG__POL_SLOTS; i++) {
    lg__pol_slot_t *sl = &srv->pol[i];
    if (sl->json && sl->hash == h && !strcmp(sl->json, json)) { /* raced: keep theirs */
      victim = NULL;
      break;
    }
    if (!sl->json) {
      victim = sl;
      break;
    }
    if (sl->used < victim->used) victim = sl;
  }
  if (victim) {
    lg__free(victim->json);
    lg_policy_free(victim->pol);
    victim->json = copy;
    victim->hash = h;
    victim->pol = lg_policy_ref(p);
    victim->used = ++srv->pol_tick;
  } else {
    lg__free(copy);
  }
  pthread_mutex_unlock(&srv->pol_mu);
  return p;
}

/* ---- the listening socket ---- */

/* Splits "HOST:PORT" / "[V6]:PORT" / ":PORT". */
static int split_listen(const char *s, char **host, char **port, lg_error_t *err) {
  const char *colon;
  const char *h = s;
  size_t hl;
  if (*s == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return lg__err(err, LG_EINVAL, "listen", -1,
                     "--listen \"%s\": expected [IPV6]:PORT", s);
    h = s + 1;
    hl = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return lg__err(err, LG_EINVAL, "listen", -1, "--listen \"%s\": expected HOST:PORT", s);
    hl = (size_t)(colon - s);
  }
  const char *p = colon + 1;
  char *end;
  errno = 0;
  long pn = strtol(p, &end, 10);
  if (!*p || *end || errno || pn < 0 || pn > 65535)
    return lg__err(err, LG_EINVAL, "listen", -1,
                   "--listen \"%s\": the port must be a number from 0 to 65535", s);
  *host = lg__strndup(h, hl);
  *port = lg__strdup(p);
  if (!*host || !*port) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

static int bind_listen(lg_server_t *srv, lg_error_t *err) {
  char *host = NULL, *port = NULL;
  int rc = split_listen(srv->o.listen, &host, &port, err);
  if (rc) goto out;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int g = getaddrinfo(*host ? host : NULL, port, &hints, &res);
  if (g || !res) {
    rc = lg__err(err, LG_EINVAL, "listen", -1, "--listen \"%s\": cannot resolve \"%s\": %s",
                 srv->o.listen, host, gai_strerror(g));
    goto out;
  }
  struct addrinfo *ai = res;
  if (!lg__is_loopback(ai->ai_addr) && srv->auth.n == 0) {
    rc = lg__err(err, LG_EINVAL, "listen", -1,
                 "refusing to listen on %s with no tokens: without auth the server may only "
                 "bind a loopback address (give --tokens FILE or LOOPGUARD_TOKENS, or listen "
                 "on 127.0.0.1)",
                 srv->o.listen);
    freeaddrinfo(res);
    goto out;
  }
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    rc = lg__err(err, LG_EIO, "listen", -1, "socket: %s", strerror(errno));
    freeaddrinfo(res);
    goto out;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
    rc = lg__err(err, LG_EIO, "listen", -1, "cannot listen on %s: %s", srv->o.listen,
                 strerror(errno));
    close(fd);
    freeaddrinfo(res);
    goto out;
  }
  freeaddrinfo(res);
  /* Non-blocking: the acceptor takes what is there, and waits in epoll. */
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &sl);
  char nhost[NI_MAXHOST], nport[NI_MAXSERV];
  getnameinfo((struct sockaddr *)&ss, sl, nhost, sizeof nhost, nport, sizeof nport,
              NI_NUMERICHOST | NI_NUMERICSERV);
  srv->port = atoi(nport);
  srv->listen_fd = fd;
  lg__buf_t u = {0};
  lg__buf_printf(&u, ss.ss_family == AF_INET6 ? "http://[%s]:%s" : "http://%s:%s", nhost, nport);
  srv->url = lg__buf_steal(&u, NULL);
  srv->listen_host = host;
  host = NULL;
  if (!srv->url) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
out:
  lg__free(host);
  lg__free(port);
  return rc;
}

/* ---- connections: deadlines, eviction ----
 *
 * libmicrohttpd's --timeout is an idle timer: every byte restarts it, so a
 * client that sends a header byte every few seconds holds its connection
 * for ever, and a few thousand of them fill the connection limit and lock
 * every other client out. So every connection is tracked here, from its
 * accept (accept.c) to its close, with its phase (lg__phase_t) and when
 * the phase began, and a reaper thread cuts (shutdown(2); libmicrohttpd,
 * or the acceptor, then sees the end of the stream and closes it) every
 * connection that has been IDLE, or in its REQUEST, for longer than
 * --timeout, whatever trickled in meanwhile. A request being handled,
 * parked, or answered (BUSY) is never cut.
 *
 * And room is kept: past conn_soft connections (the hard limit less a
 * reserve), a new connection cuts the oldest idle one (accept.c), so a
 * health check or a new client always gets in while slow or idle sockets
 * hold the rest; the per-address limit keeps one address from taking them
 * all. A cut connection stays in the table until it is closed (by its
 * loop, a moment later), so the soft limit counts the connections not cut
 * (nconns - ncut), and at the hard limit, with cut ones on their way out,
 * the acceptor waits for them (100 ms at most) rather than refuse the next
 * client. The socket is shut down under conn_mu, and a connection leaves the
 * table (NOTIFY_CLOSED, or the acceptor's close) before its descriptor is
 * closed, so a descriptor is never shut down after it was reused. A
 * connection handed over and not yet started by libmicrohttpd (mc NULL)
 * is never cut: libmicrohttpd may have closed it already. */

uint64_t lg__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void lg__conn_cut_locked(lg__conn_t *k) {
  if (k->cut || k->fd < 0) return;
  k->cut = 1;
  k->srv->ncut++;
  shutdown(k->fd, SHUT_RDWR);
}

/* 1 when k may be cut: it is started by libmicrohttpd, or the acceptor's. */
static int cuttable(const lg__conn_t *k) { return k->mc || k->owner != LG__OWN_MHD; }

void lg__conn_forget_locked(lg_server_t *srv, lg__conn_t *k) {
  if (k->prev) k->prev->next = k->next;
  else srv->conns = k->next;
  if (k->next) k->next->prev = k->prev;
  k->prev = k->next = NULL;
  srv->nconns--;
  if (k->cut) srv->ncut--;
  lg__ipcount_del(srv->ipc, &k->addr);
  if (k->fd >= 0 && (size_t)k->fd < srv->nbyfd && srv->byfd[k->fd] == k) srv->byfd[k->fd] = NULL;
  if (k->loop) atomic_fetch_sub(&k->loop->nconns, 1);
  k->loop = NULL;
}

/* A connection libmicrohttpd starts: the one the acceptor handed over on
 * that descriptor. */
static void conn_started(lg_server_t *srv, struct MHD_Connection *c, void **socket_context) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  int fd = ci ? (int)ci->connect_fd : -1;
  pthread_mutex_lock(&srv->conn_mu);
  lg__conn_t *k = fd >= 0 && (size_t)fd < srv->nbyfd ? srv->byfd[fd] : NULL;
  if (k && !k->mc && k->owner == LG__OWN_MHD) {
    k->mc = c;
    *socket_context = k;
  }
  pthread_mutex_unlock(&srv->conn_mu);
  /* (not found: untracked, libmicrohttpd's own idle timeout only) */
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode code) {
  lg_server_t *srv = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    conn_started(srv, c, socket_context);
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    lg__conn_t *k = *socket_context;
    if (!k) return;
    pthread_mutex_lock(&srv->conn_mu);
    lg__conn_forget_locked(srv, k);
    pthread_mutex_unlock(&srv->conn_mu);
    lg__free(k);
    *socket_context = NULL;
  }
}

void lg__conn_phase(lg_server_t *srv, struct MHD_Connection *c, lg__phase_t ph) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  lg__conn_t *k = ci ? ci->socket_context : NULL;
  if (!k) return;
  uint64_t now = lg__mono_ns();
  pthread_mutex_lock(&srv->conn_mu);
  k->phase = ph;
  k->since_ns = now;
  if (ph == LG__PH_REQUEST && k->head_ns) { /* the first request began at its first byte */
    k->since_ns = k->head_ns;
    k->head_ns = 0;
  }
  pthread_mutex_unlock(&srv->conn_mu);
}

lg__loop_t *lg__conn_loop(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  lg__conn_t *k = ci ? ci->socket_context : NULL;
  return k ? k->loop : NULL;
}

/* ---- the event loops (epoll) ----
 *
 * With libmicrohttpd 0.9.75's own epoll thread (MHD_USE_EPOLL_INTERNAL_THREAD)
 * connections resumed by the committer were at times left unserved for
 * seconds (test_server_liveness). Its poll() mode has no such bug, but
 * scans every socket on every wake-up: 2,000 idle keep-alive connections
 * made a decision nine times slower. So, for the stores whose decisions
 * are parked for the group commit (sqlite:, memory:), libmicrohttpd runs
 * in epoll mode without a thread of its own: --threads daemons, each
 * driven by a loop of ours: add the connections the acceptor queued for
 * it, MHD_run, then wait on the daemon's epoll descriptor and on an
 * eventfd that lg__loop_wake writes after every MHD_resume_connection of
 * one of its connections (and after every connection queued), for at most
 * the daemon's next timeout. A wake-up between MHD_run and the wait leaves
 * the eventfd readable, so none is lost.
 *
 * Leaders and followers. One thread at a time leads a loop: waits on its
 * epoll descriptor and runs its daemon; at first that is the loop's own
 * thread (loop_main). Handing a gateway request to a gateway worker is a
 * wake-up across cores before any work (on this VM that hand-over, the
 * worker's start on a cold core included, doubled a request's CPU time at
 * one connection). So the leader keeps the requests it reads (gateway.c,
 * keep_mine) and runs each on a fiber of its own between its turns
 * (lg__gw_run_mine), still the leader: a fiber stops while its upstream
 * thinks (its sockets are in the epoll the leader waits on: leader_ep),
 * and the loop's other connections and the other fibers go on. (With
 * LOOPGUARD_GATEWAY_FIBERS=0 it keeps one at a time, and while it waits
 * for that one's upstream it waits on ep too, lg__loop_wait_fd in
 * libcurl's multi wait, and takes a turn when the loop has work,
 * lg__loop_turn; the requests it reads meanwhile go to the workers.)
 * Before a wait that may be long and is not the upstream's, and that a
 * fiber cannot wait for without its thread (lg__will_block: SQLite's busy
 * wait; without fibers also a committer busy past 2 ms and another request
 * of the same run in flight), it passes the lead:
 * to the loop's own thread if that waits for it, else to an idle gateway
 * worker (lg__gw_lead_post; only one that takes it at once). The thread
 * that passed it finishes its requests and then waits to be given the lead
 * back (the loop's own thread) or goes back to the workers; a worker that
 * leads gives the lead back home once the loop's own thread waits and the
 * worker holds no request, so the pool is whole again. */

void lg__loop_wake(lg__loop_t *l) {
  if (!l || l->efd < 0) return;
  uint64_t one = 1;
  ssize_t w = write(l->efd, &one, sizeof one);
  (void)w; /* a full counter is a pending wake-up already */
}

/* One turn of the loop's daemon, under run_mu: what it has to do now is
 * done. Returns how long it may wait before its next turn (ms; 0: more to
 * do at once). */
static int run_daemon(lg__loop_t *l) {
  MHD_run(l->mhd);
  MHD_UNSIGNED_LONG_LONG to = 0;
  int ms = 1000;
  if (MHD_get_timeout(l->mhd, &to) == MHD_YES) ms = to < 1000 ? (int)to : 1000;
  return ms;
}

/* Under run_mu, by whichever thread runs the daemon now: the connections
 * queued for it added, then up to `turns` turns while it has more to do
 * at once. Returns how long it may wait before its next turn (ms; 0: more
 * to do at once), or -1 when the loops stop (stop_loops clears mhd under
 * run_mu). */
static int turns_locked(lg__loop_t *l, int turns) {
  if (atomic_load(&l->srv->loop_stop) || !l->mhd) return -1;
  lg__loop_add_queued(l);
  int ms = 0;
  for (int t = 0; t < turns && !ms; t++) ms = run_daemon(l);
  return ms;
}

void lg__loop_serve(lg__loop_t *l) {
  if (!l) return;
  /* The loop's leader holds run_mu while it runs the daemon, and may have
   * passed this connection's resume already: then it is woken, as always.
   * Otherwise it sleeps in epoll_wait and the daemon is ours for a turn;
   * it needs no wake-up unless more is left to do at once (a connection
   * that becomes readable or writable later wakes its epoll descriptor).
   * An answered keep-alive connection counts as readable until a read
   * finds nothing, so a few turns are taken here, as the loop would; what
   * is still left after them (a pipelined request read, not yet answered:
   * its readiness was taken from the epoll descriptor already) is the
   * loop's, woken for it. */
  if (l->efd >= 0 && l->run_mu_ok && !pthread_mutex_trylock(&l->run_mu)) {
    int ms = turns_locked(l, 4);
    pthread_mutex_unlock(&l->run_mu);
    if (ms > 0) return;
  }
  lg__loop_wake(l);
}

static _Thread_local lg__loop_t *tl_leading; /* the loop this thread leads now */
static _Thread_local int tl_passed;          /* ... and it passed the lead on */

int lg__loop_leads(void) { return tl_leading && !tl_passed; }

/* Set while the leader runs its gateway requests between two turns: the
 * turn after them serves every connection resumed meanwhile. */
static _Thread_local int tl_between;
int lg__loop_turns_next(const lg__loop_t *l) { return tl_between && l && tl_leading == l && !tl_passed; }

/* The lead to the loop's own thread, when that waits for it: 1. */
static int give_home(lg__loop_t *l) {
  pthread_mutex_lock(&l->lead_mu);
  int home = l->home_waiting;
  if (home) {
    l->home_waiting = 0;
    l->home_lead = 1;
  }
  pthread_mutex_unlock(&l->lead_mu);
  if (home) pthread_cond_signal(&l->lead_cv);
  return home;
}

/* The leader is about to wait for something that may take long (the
 * store): the lead goes to the loop's own thread if it waits for it, else
 * to an idle gateway worker; with neither, this thread keeps it. */
static void pass_before_block(void) {
  lg__loop_t *l = tl_leading;
  if (l && !tl_passed) tl_passed = give_home(l) || lg__gw_lead_post(l->srv->gw, l);
}

/* Its eventfd read: the wake-ups so far are taken. */
static void drain_wake(lg__loop_t *l) {
  uint64_t v;
  ssize_t r = read(l->efd, &v, sizeof v);
  (void)r;
}

int lg__loop_wait_fd(void) { return lg__loop_leads() ? tl_leading->ep : -1; }

void lg__loop_turn(void) {
  if (!lg__loop_leads()) return;
  lg__loop_t *l = tl_leading;
  drain_wake(l); /* before the turn: a wake-up during it stays readable */
  pthread_mutex_lock(&l->run_mu);
  turns_locked(l, 4);
  pthread_mutex_unlock(&l->run_mu);
}

/* The epoll a leader waits on (lead): the loop's two descriptors (data
 * 1: the daemon's, 2: the eventfd) and its gateway fibers' sockets (data:
 * their lg__gw_sock_t). A thread's own, so that the leader after it never
 * sees the sockets of fibers it cannot resume. -1: none (the loop's ep
 * then, without fibers). */
static int leader_ep(lg__loop_t *l) {
  if (l->ep < 0 || !l->srv->gw) return -1;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return -1;
  struct epoll_event ev = {.events = EPOLLIN};
  ev.data.u64 = 1;
  int bad = epoll_ctl(ep, EPOLL_CTL_ADD, l->mhd_ep, &ev);
  ev.data.u64 = 2;
  bad = bad || epoll_ctl(ep, EPOLL_CTL_ADD, l->efd, &ev);
  if (bad) {
    close(ep);
    return -1;
  }
  return ep;
}

/* Leads l until the loops stop or this thread passed the lead on. Between
 * its turns it runs the gateway requests it kept (lg__gw_run_mine). A
 * gateway worker (not home) gives the lead back to the loop's own thread
 * as soon as that waits for it and the worker holds no request: the
 * worker goes back to the pool. Returns 1 when the lead was passed. */
static int lead(lg__loop_t *l, int home) {
  lg_server_t *srv = l->srv;
  tl_leading = l;
  tl_passed = 0;
  lg__set_block_hook(pass_before_block);
  int ep = leader_ep(l);
  lg__gw_fibers_begin(srv->gw, ep);
  int turn = 1, ms = 0;
  uint64_t due = 0; /* the daemon's next timeout (lg__mono_ns) */
  for (;;) {
    if (turn) {
      pthread_mutex_lock(&l->run_mu);
      ms = turns_locked(l, 1);
      pthread_mutex_unlock(&l->run_mu);
      if (ms < 0) break;
      due = lg__mono_ns() + (uint64_t)ms * 1000000u;
    } else { /* no turn since the last: what is left of its wait */
      uint64_t now = lg__mono_ns();
      ms = now >= due ? 0 : (int)((due - now + 999999) / 1000000);
    }
    turn = 1;
    tl_between = 1;
    if (lg__gw_run_mine(srv->gw)) ms = 0; /* what came meanwhile is looked at now */
    tl_between = 0;
    if (!tl_passed && !home && !lg__gw_holds_mine() && give_home(l)) tl_passed = 1;
    if (tl_passed) break;
    /* More to do at once (a request read in several steps): MHD again,
     * not a wait that would return at once (two system calls a turn). A
     * wake-up left unread makes the next wait return, which reads it. */
    if (ms == 0) continue;
    int fms = ep >= 0 ? lg__gw_fibers_due_ms() : -1;
    int wait = fms >= 0 && fms < ms ? fms : ms;
    struct epoll_event got[16];
    int n = epoll_wait(ep >= 0 ? ep : l->ep, got, 16, wait);
    /* Only fibers' sockets, or a fiber's timer: the daemon has nothing
     * new, no turn for it (a system call or two saved). */
    turn = n <= 0 && wait == ms;
    for (int i = 0; i < n; i++) {
      uint64_t d = ep >= 0 ? got[i].data.u64 : got[i].data.u32;
      if (d == 2) drain_wake(l);
      if (d <= 2) turn = 1;
      else lg__gw_fiber_event(got[i].data.ptr, got[i].events);
    }
  }
  lg__set_block_hook(NULL);
  tl_leading = NULL;
  if (ep >= 0) { /* the loop's to the next leader; the fibers left are finished here */
    epoll_ctl(ep, EPOLL_CTL_DEL, l->mhd_ep, NULL);
    epoll_ctl(ep, EPOLL_CTL_DEL, l->efd, NULL);
  }
  lg__gw_fibers_end(srv->gw);
  if (ep >= 0) close(ep);
  return tl_passed;
}

/* The lead back to the loop's own thread. */
static void lead_home(lg__loop_t *l) {
  pthread_mutex_lock(&l->lead_mu);
  l->home_lead = 1;
  pthread_mutex_unlock(&l->lead_mu);
  pthread_cond_signal(&l->lead_cv);
}

void lg__loop_lead_for(lg__loop_t *l) {
  if (!lead(l, 0)) lead_home(l); /* the loops stop: the loop's own thread ends it */
  atomic_fetch_sub(&l->helpers, 1);
}

static void *loop_main(void *arg) {
  lg__loop_t *l = arg;
  lg_server_t *srv = l->srv;
  prctl(PR_SET_NAME, "lg-http", 0, 0, 0); /* for top -H and perf */
  while (lead(l, 1)) { /* passed: back when the worker that leads gives it home, or at the stop */
    pthread_mutex_lock(&l->lead_mu);
    l->home_waiting = !l->home_lead;
    if (l->home_waiting) lg__loop_wake(l); /* the worker that leads sees it between two waits */
    while (!l->home_lead && !atomic_load(&srv->loop_stop)) pthread_cond_wait(&l->lead_cv, &l->lead_mu);
    l->home_waiting = l->home_lead = 0;
    pthread_mutex_unlock(&l->lead_mu);
  }
  return NULL;
}

static void *reaper_main(void *arg) {
  lg_server_t *srv = arg;
  prctl(PR_SET_NAME, "lg-reaper", 0, 0, 0);
  uint64_t limit = (uint64_t)srv->o.timeout_s * 1000000000u;
  while (!atomic_load(&srv->reaper_stop)) {
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    uint64_t now = lg__mono_ns();
    pthread_mutex_lock(&srv->conn_mu);
    for (lg__conn_t *k = srv->conns; k; k = k->next)
      if (k->phase != LG__PH_BUSY && !k->cut && cuttable(k) && now > k->since_ns + limit) {
        /* (not now - since: a phase may begin after `now` was read) */
        lg__conn_cut_locked(k);
        atomic_fetch_add(&srv->metrics.conn_cut[0], 1);
      }
    pthread_mutex_unlock(&srv->conn_mu);
  }
  return NULL;
}

/* --retain-runs: the runs not written to for that long purged at the
 * start and then every tenth of it (a second to an hour), a batch at a
 * time (lg_store_purge_runs), on this thread's store handle: the shared
 * one (sqlite:, memory:: its lock taken a batch at a time, as the group
 * commit takes it) or a connection of its own (postgres:). A shutdown
 * stops it after the batch in hand. */
static int retain_going(void *ud, int64_t done) {
  (void)done;
  return atomic_load(&((lg_server_t *)ud)->retainer_stop);
}

static void retain_once(lg_server_t *srv) {
  lg_error_t e = {0};
  int64_t n = 0;
  lg__worker_t *w = lg__server_worker(srv, &e);
  int rc = w ? lg_store_purge_runs(w->store, srv->o.retain_runs_ms, lg__server_now(srv), retain_going,
                                   srv, &n, &e)
             : LG_ESTORE;
  if (!rc && !n) return;
  lg__buf_t f = {0};
  lg__buf_printf(&f, "\"purged\":%lld,\"older_than_ms\":%lld", (long long)n,
                 (long long)srv->o.retain_runs_ms);
  if (rc) {
    const char *m = lg__error_text(&e, rc);
    lg__buf_puts(&f, ",\"message\":");
    lg__buf_json_str_lossy(&f, m, strlen(m)); /* a store's message may quote what it read */
  }
  if (!f.oom) lg__server_log(srv, rc ? "warn" : "info", rc ? "runs_purge_failed" : "runs_purged", f.data);
  lg__buf_free(&f);
}

static void *retainer_main(void *arg) {
  lg_server_t *srv = arg;
  prctl(PR_SET_NAME, "lg-retain", 0, 0, 0);
  int64_t every = srv->o.retain_runs_ms / 10;
  every = every < 1000 ? 1000 : every > 3600000 ? 3600000 : every;
  uint64_t next = 0; /* at once */
  while (!atomic_load(&srv->retainer_stop)) {
    if (lg__mono_ns() >= next) {
      retain_once(srv);
      next = lg__mono_ns() + (uint64_t)every * 1000000u;
    }
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static unsigned env_uint(const char *name, unsigned dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  unsigned long n = strtoul(v, &end, 10);
  return *end || !n || n > 1000000 ? dflt : (unsigned)n;
}

/* ---- start ---- */

static int online_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
}

static int count_active(lg_server_t *srv, lg_store_t *st, lg_error_t *e);

/* A server with copies of the caller's options and its locks, or NULL. */
static lg_server_t *server_new(const lg_server_options_t *opts, lg_error_t *err) {
  lg_server_t *srv = lg__calloc(1, sizeof *srv);
  if (!srv) {
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return NULL;
  }
  srv->listen_fd = -1;
  srv->o = *opts;
  /* Copies of every string, so the caller's may go away. */
  srv->o.listen = lg__strdup(opts->listen ? opts->listen : LG_SERVER_DEFAULT_LISTEN);
  srv->o.store_url = lg__strdup(opts->store_url);
  srv->o.tokens_file = opts->tokens_file ? lg__strdup(opts->tokens_file) : NULL;
  srv->o.tokens = NULL; /* not kept: digests only */
  srv->o.policy_file = opts->policy_file ? lg__strdup(opts->policy_file) : NULL;
  srv->o.prices_file = opts->prices_file ? lg__strdup(opts->prices_file) : NULL;
  srv->o.log_path = opts->log_path ? lg__strdup(opts->log_path) : NULL;
  srv->o.upstreams = NULL; /* the gateway keeps its own copies */
  srv->o.nupstreams = 0;
  srv->o.upstreams_file = NULL;
  srv->o.secret_file = NULL; /* read once by load_config, not kept */
  if (srv->o.max_body == 0) srv->o.max_body = LG_SERVER_DEFAULT_MAX_BODY;
  if (srv->o.gateway_max_body == 0) srv->o.gateway_max_body = LG_SERVER_DEFAULT_GATEWAY_MAX_BODY;
  if (srv->o.timeout_s <= 0) srv->o.timeout_s = LG_SERVER_DEFAULT_TIMEOUT_S;
  pthread_mutex_init(&srv->wlist_mu, NULL);
  pthread_mutex_init(&srv->pol_mu, NULL);
  pthread_mutex_init(&srv->log_mu, NULL);
  pthread_mutex_init(&srv->conn_mu, NULL);
  int key_ok = pthread_key_create(&srv->wkey, NULL) == 0;
  if (!srv->o.listen || !srv->o.store_url || (opts->tokens_file && !srv->o.tokens_file) ||
      (opts->policy_file && !srv->o.policy_file) || (opts->prices_file && !srv->o.prices_file) ||
      (opts->log_path && !srv->o.log_path) || !key_ok) {
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    lg_server_free(srv);
    return NULL;
  }
  return srv;
}

/* Prices, the log, tokens and the default policy. */
static int load_config(lg_server_t *srv, const lg_server_options_t *opts, lg_error_t *err) {
  /* Prices (--prices): an empty book without a file, so that a model call
   * that needs a price fails closed with a message naming the model. */
  srv->prices = lg_price_book_new(srv->o.prices_file, err);
  if (!srv->prices) {
    if (err && srv->o.prices_file) lg__err_where(err, srv->o.prices_file, 0);
    return -1;
  }
  /* The log first, so that everything after can say what happened. */
  if (srv->o.log_path) {
    srv->log = fopen(srv->o.log_path, "a");
    if (!srv->log) {
      lg__err(err, LG_EIO, "log", -1, "cannot open the log file: %s", strerror(errno));
      lg__err_where(err, srv->o.log_path, 0);
      return -1;
    }
    srv->log_owned = 1;
  } else {
    srv->log = stderr;
  }
  /* Tokens. */
  if (srv->o.tokens_file && lg__auth_load_file(&srv->auth, srv->o.tokens_file, err)) return -1;
  if (opts->tokens && lg__auth_load_spec(&srv->auth, opts->tokens, "LOOPGUARD_TOKENS", err))
    return -1;
  /* The secret of provider keys at rest (src/budget/seal.c): only the
   * secret is kept, not the file's name. */
  if (opts->secret_file) {
    if (lg_key_secret_load(opts->secret_file, srv->secret, err)) return -1;
    srv->has_secret = 1;
  }
  /* The default policy of new runs. */
  if (srv->o.policy_file) {
    srv->default_policy = lg_policy_load_file(srv->o.policy_file, err);
    srv->policy_source = lg__strdup(srv->o.policy_file);
  } else {
    srv->default_policy = lg_policy_default();
    srv->policy_source = lg__strdup("built-in default");
    if (!srv->default_policy) lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  if (!srv->default_policy) return -1;
  srv->default_policy_json = lg_policy_to_json(srv->default_policy);
  if (!srv->default_policy_json || !srv->policy_source)
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

/* The store, once now, so that a bad one fails the start; its
 * checkpointer, the thread count and the group commit. *st: the handle. */
static int open_store(lg_server_t *srv, lg_store_t **st, lg_error_t *err) {
  *st = lg_store_open(srv->o.store_url, NULL, err);
  if (!*st) return -1;
  if (srv->has_secret) lg_key_set_secret(*st, srv->secret);
  /* SQLite: WAL checkpoints in a thread of their own (src/store/
   * checkpoint.c); without it (0, or another store) they stay in the
   * commits. */
  const char *ev = getenv("LOOPGUARD_CHECKPOINT_MS");
  int every = ev ? atoi(ev) : 5;
  srv->ckpt = every > 0 ? lg__checkpointer_new(*st, every) : NULL;
  srv->scheme = lg_store_scheme(*st);
  srv->store_name = lg__strdup(lg_store_name(*st));
  if (lg__store_single_writer(*st)) srv->shared = *st;
  else srv->spare = *st;
  if (!srv->store_name) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  /* Threads. With group commit (sqlite:, memory:) the committer takes a
   * core of its own, so the HTTP threads get the others (at least one) —
   * unless the server is a gateway: its loops write their own batches
   * (the committer mostly idle) and run their requests on fibers, so a
   * loop a core (at 32 connections, 8 KB: 4,300-5,000 requests a second
   * with one loop on two cores, 5,800 with two; at 8 the same).
   * With postgres: a thread waits on its connection for most of a
   * decision (several round trips), so more threads than cores keep the
   * cores busy: four per core, at most 32 (each is a connection). */
  if (srv->o.threads <= 0) {
    int cores = online_cores();
    int http = srv->gateway_on ? cores : cores - 1;
    srv->o.threads = srv->shared ? (http > 1 ? http : 1) : (4 * cores > 32 ? 32 : 4 * cores);
  }
  if (srv->shared) srv->batcher = lg__batcher_new(srv->shared, 0);
  if (srv->shared && !srv->batcher) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

/* Connections: at most 16384 (LOOPGUARD_MAX_CONNECTIONS), within the
 * descriptors this process may open; 1/64 of them (at least 16) kept as
 * room (see accept.c); one address may hold a quarter of them (at least
 * 64; LOOPGUARD_MAX_PER_IP). The table by descriptor covers every
 * descriptor the process may have. */
static int set_limits(lg_server_t *srv, lg_error_t *err) {
  struct rlimit rl;
  unsigned conn_limit = env_uint("LOOPGUARD_MAX_CONNECTIONS", 16384);
  size_t nfd = 65536;
  if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
    unsigned room = rl.rlim_cur > 64 + (rlim_t)srv->o.threads * 4
                        ? (unsigned)(rl.rlim_cur - 64 - (rlim_t)srv->o.threads * 4)
                        : 16;
    if (room < conn_limit) conn_limit = room;
    nfd = rl.rlim_cur > (1u << 20) ? (1u << 20) : (size_t)rl.rlim_cur;
  }
  if (conn_limit < 32) conn_limit = 32;
  unsigned reserve = conn_limit / 64 < 16 ? 16 : conn_limit / 64;
  srv->conn_limit = conn_limit;
  srv->conn_soft = conn_limit - reserve;
  srv->per_ip = env_uint("LOOPGUARD_MAX_PER_IP", conn_limit / 4 < 64 ? 64 : conn_limit / 4);
  srv->byfd = lg__calloc(nfd, sizeof *srv->byfd);
  srv->nbyfd = srv->byfd ? nfd : 0;
  srv->ipc = lg__ipcount_new();
  if (!srv->byfd || !srv->ipc) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

/* The daemons: --threads of them, without a listening socket (the
 * acceptor hands them connections). sqlite:, memory: connections are
 * parked for the group commit and resumed by the committer: epoll mode,
 * each daemon driven by its loop (loop_main). postgres: no connection is
 * ever parked (each thread decides on its own connection), so each daemon
 * runs its own epoll thread. LOOPGUARD_EVENT_LOOP=poll (for comparison):
 * each its own poll() thread, which scans every socket on every wake-up. */
static int start_daemons(lg_server_t *srv, lg_error_t *err) {
  const char *el = getenv("LOOPGUARD_EVENT_LOOP");
  int use_epoll = !(el && !strcmp(el, "poll"));
  srv->epoll_loop = use_epoll && srv->shared;
  unsigned flags = MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO;
  if (srv->epoll_loop) flags |= MHD_USE_EPOLL;
  else if (use_epoll) flags |= MHD_USE_EPOLL_INTERNAL_THREAD;
  else flags |= MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
  int n = srv->epoll_loop && srv->o.threads > 32 ? 32 : srv->o.threads;
  srv->loops = lg__calloc((size_t)n, sizeof *srv->loops);
  if (!srv->loops) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  for (int i = 0; i < n; i++) {
    lg__loop_t *l = &srv->loops[i];
    l->srv = srv;
    l->efd = -1;
    l->ep = -1;
    l->mhd_ep = -1;
    l->q_mu_ok = !pthread_mutex_init(&l->q_mu, NULL);
    l->run_mu_ok = !pthread_mutex_init(&l->run_mu, NULL);
    if (!pthread_mutex_init(&l->lead_mu, NULL)) {
      if (!pthread_cond_init(&l->lead_cv, NULL)) l->lead_ok = 1;
      else pthread_mutex_destroy(&l->lead_mu);
    }
    srv->nloops = i + 1;
    if (!l->q_mu_ok || !l->run_mu_ok || !l->lead_ok)
      return lg__err(err, LG_ENOMEM, NULL, -1, "cannot make a loop's locks");
    if (srv->epoll_loop && (l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
      return lg__err(err, LG_EIO, NULL, -1, "eventfd: %s", strerror(errno));
    l->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, lg__http_access, srv, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)srv->o.timeout_s, MHD_OPTION_CONNECTION_LIMIT, srv->conn_limit,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)LG__MHD_POOL, MHD_OPTION_NOTIFY_COMPLETED,
        lg__http_completed, srv, MHD_OPTION_URI_LOG_CALLBACK, lg__http_uri_log, srv,
        MHD_OPTION_NOTIFY_CONNECTION, notify_conn, srv, MHD_OPTION_END);
    if (!l->mhd)
      return lg__err(err, LG_EIO, "listen", -1, "libmicrohttpd could not start on %s", srv->url);
    if (srv->epoll_loop) { /* where the leader waits: the daemon's descriptor, the eventfd */
      const union MHD_DaemonInfo *di = MHD_get_daemon_info(l->mhd, MHD_DAEMON_INFO_EPOLL_FD);
      struct epoll_event ev = {.events = EPOLLIN};
      if (!di || (l->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        return lg__err(err, LG_EIO, NULL, -1, "epoll: %s", strerror(errno));
      l->mhd_ep = di->epoll_fd;
      ev.data.u32 = 1;
      epoll_ctl(l->ep, EPOLL_CTL_ADD, di->epoll_fd, &ev);
      ev.data.u32 = 2;
      epoll_ctl(l->ep, EPOLL_CTL_ADD, l->efd, &ev);
    }
  }
  for (int i = 0; srv->epoll_loop && i < n; i++) {
    if (pthread_create(&srv->loops[i].th, NULL, loop_main, &srv->loops[i]))
      return lg__err(err, LG_EIO, NULL, -1, "cannot start a thread");
    srv->loops[i].started = 1;
  }
  return 0;
}

/* The start-up block of the log. */
static void log_start(lg_server_t *srv) {
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"version\":\"" LG_VERSION_STRING "\",\"listen\":");
  lg__buf_json_str(&f, srv->url, strlen(srv->url));
  lg__buf_puts(&f, ",\"store\":");
  lg__buf_json_str(&f, srv->store_name, strlen(srv->store_name));
  lg__buf_printf(&f, ",\"auth\":%s,\"tokens\":%zu,\"policy\":", srv->auth.n ? "true" : "false",
                 srv->auth.n);
  lg__buf_json_str(&f, srv->policy_source, strlen(srv->policy_source));
  lg__buf_printf(&f, ",\"threads\":%d,\"max_body\":%zu,\"timeout_s\":%d,\"connection_limit\":%u",
                 srv->o.threads, srv->o.max_body, srv->o.timeout_s, srv->conn_limit);
  if (srv->gw) lg__buf_printf(&f, ",\"gateway_max_body\":%zu", srv->o.gateway_max_body);
  if (srv->o.prices_file) {
    lg__buf_puts(&f, ",\"prices\":");
    lg__buf_json_str(&f, srv->o.prices_file, strlen(srv->o.prices_file));
    lg_prices_t *pr = lg_price_book_get(srv->prices);
    lg__buf_printf(&f, ",\"price_models\":%zu", pr ? lg_prices_count(pr) : 0);
    lg_prices_free(pr);
  }
  if (srv->o.retain_runs_ms > 0)
    lg__buf_printf(&f, ",\"retain_runs_ms\":%lld", (long long)srv->o.retain_runs_ms);
  lg__buf_printf(&f, ",\"byok_at_rest\":\"%s\"", srv->has_secret ? "encrypted" : "clear");
  if (!f.oom) lg__server_log(srv, "info", "start", f.data);
  lg__buf_free(&f);
  if (srv->gw) lg__gw_log_start(srv->gw);
}

lg_server_t *lg_server_start(const lg_server_options_t *opts, lg_error_t *err) {
  if (!opts || !opts->store_url || !*opts->store_url) {
    lg__err(err, LG_EINVAL, "store", -1, "no store URL given");
    return NULL;
  }
  lg_server_t *srv = server_new(opts, err);
  if (!srv) return NULL;
  lg_store_t *st = NULL;
  srv->gateway_on = lg__gw_wanted(opts);
  if (load_config(srv, opts, err) || open_store(srv, &st, err)) goto fail;
  /* The gateway (gateway-v1), when upstreams are given. */
  if (lg__gw_new(srv, opts, &srv->gw, err)) goto fail;
  /* The address, last: nothing binds before the rest is known good. */
  if (bind_listen(srv, err) || set_limits(srv, err)) goto fail;
  if (pthread_create(&srv->reaper, NULL, reaper_main, srv)) {
    lg__err(err, LG_EIO, NULL, -1, "cannot start a thread");
    goto fail;
  }
  srv->reaper_started = 1;
  if (srv->o.retain_runs_ms > 0) {
    if (pthread_create(&srv->retainer, NULL, retainer_main, srv)) {
      lg__err(err, LG_EIO, NULL, -1, "cannot start a thread");
      goto fail;
    }
    srv->retainer_started = 1;
  }
  if (start_daemons(srv, err) || lg__acceptor_start(srv, err)) goto fail;
  lg_error_t ce = {0};
  count_active(srv, st, &ce); /* a first count; /metrics tries again */
  log_start(srv);
  return srv;
fail:
  lg_server_free(srv);
  return NULL;
}

int lg_server_port(const lg_server_t *srv) { return srv->port; }

char *lg_server_banner(const lg_server_t *srv) {
  lg__buf_t b = {0};
  lg__buf_printf(&b, "loopguard %s: listening on %s\n", LG_VERSION_STRING, srv->url);
  lg__buf_printf(&b, "  store:   %s\n", srv->store_name);
  if (srv->auth.n)
    lg__buf_printf(&b, "  auth:    on (%zu token%s; send Authorization: Bearer TOKEN)\n",
                   srv->auth.n, srv->auth.n == 1 ? "" : "s");
  else
    lg__buf_puts(&b, "  auth:    off (no tokens configured: open on loopback only)\n");
  lg__buf_printf(&b, "  policy:  %s (default policy of new runs)\n", srv->policy_source);
  if (srv->o.prices_file) {
    lg_prices_t *pr = lg_price_book_get(srv->prices);
    lg__buf_printf(&b, "  prices:  %zu models from %s (reloaded on SIGHUP)\n",
                   pr ? lg_prices_count(pr) : 0, srv->o.prices_file);
    lg_prices_free(pr);
  } else {
    lg__buf_puts(&b, "  prices:  none (model calls need cost_usd when a cap or budget applies)\n");
  }
  if (srv->o.retain_runs_ms > 0) { /* in the largest unit that says it whole: 30d, 36h, 90s */
    static const struct {
      int64_t ms;
      char unit;
    } units[] = {{86400000, 'd'}, {3600000, 'h'}, {60000, 'm'}, {1000, 's'}};
    int64_t ms = srv->o.retain_runs_ms;
    size_t u = 0;
    while (u + 1 < sizeof units / sizeof units[0] && ms % units[u].ms) u++;
    lg__buf_printf(&b, "  runs:    purged %lld%c after their last write (--retain-runs)\n",
                   (long long)(ms / units[u].ms), units[u].unit);
  }
  lg__buf_printf(&b, "  threads: %d, max body %zu bytes", srv->o.threads, srv->o.max_body);
  if (srv->gw) lg__buf_printf(&b, " (gateway routes %zu)", srv->o.gateway_max_body);
  lg__buf_printf(&b, ", timeout %d s\n", srv->o.timeout_s);
  lg__buf_printf(&b, "  console: %s/ (the operator's web console%s)\n", srv->url,
                 srv->auth.n ? "; it asks for an operator token" : "");
  if (srv->gw) {
    lg__buf_printf(&b, "  gateway: %s/v1 (point an agent's OpenAI or Anthropic base URL here)\n",
                   srv->url);
    lg__gw_banner(srv->gw, &b);
  }
  lg__buf_printf(&b, "  try:     curl -s %s/healthz\n", srv->url);
  return lg__buf_steal(&b, NULL);
}

/* Counts the active runs of the store for the gauge. */
typedef struct counter {
  int64_t n;
} counter_t;
static int count_cb(void *ud, const lg_run_record_t *rec) {
  (void)rec;
  ((counter_t *)ud)->n++;
  return 0;
}
static int count_active(lg_server_t *srv, lg_store_t *st, lg_error_t *e) {
  counter_t c = {0};
  lg_run_filter_t f = {.status = "active"};
  int rc = lg_store_run_list(st, &f, count_cb, &c, e);
  if (!rc) {
    atomic_store(&srv->metrics.runs_active, c.n);
    atomic_store(&srv->metrics.runs_active_at_ms, lg__server_now(srv));
  }
  return rc;
}

int lg__server_count_active(lg_server_t *srv, lg_store_t *st, lg_error_t *e) {
  int64_t at = atomic_load(&srv->metrics.runs_active_at_ms);
  if (at && lg__server_now(srv) - at < 10000) return 0;
  return count_active(srv, st, e);
}

/* ---- stop ---- */

/* Stops the daemons: the loops' threads first (MHD_stop_daemon then runs
 * on this one), then the daemons, which close their connections. What is
 * left in the table then (queued for a loop and never added, or closed by
 * libmicrohttpd before it started) is closed and freed here. */
static void stop_loops(lg_server_t *srv) {
  atomic_store(&srv->loop_stop, 1);
  for (int i = 0; i < srv->nloops; i++) {
    lg__loop_t *l = &srv->loops[i];
    if (l->started) {
      lg__loop_wake(l); /* its leader, waiting on ep */
      pthread_mutex_lock(&l->lead_mu); /* its own thread, waiting for the lead (it reads */
      pthread_cond_broadcast(&l->lead_cv); /* loop_stop under lead_mu: no wake-up lost) */
      pthread_mutex_unlock(&l->lead_mu);
      pthread_join(l->th, NULL);
      l->started = 0;
    }
    /* A gateway worker that leads it leaves after its turn. */
    while (atomic_load(&l->helpers) > 0) {
      lg__loop_wake(l);
      sleep_ms(1);
    }
  }
  for (int i = 0; i < srv->nloops; i++) {
    lg__loop_t *l = &srv->loops[i];
    if (l->mhd) {
      if (l->run_mu_ok) pthread_mutex_lock(&l->run_mu); /* no turn of lg__loop_serve's */
      MHD_stop_daemon(l->mhd);
      l->mhd = NULL;
      if (l->run_mu_ok) pthread_mutex_unlock(&l->run_mu);
    }
    for (lg__conn_t *k = l->queue; k; k = k->hnext) close(k->fd); /* never libmicrohttpd's */
    l->queue = NULL;
    if (l->ep >= 0) close(l->ep);
    l->ep = -1;
    if (l->efd >= 0) close(l->efd);
    l->efd = -1;
    if (l->q_mu_ok) pthread_mutex_destroy(&l->q_mu);
    l->q_mu_ok = 0;
    if (l->run_mu_ok) pthread_mutex_destroy(&l->run_mu);
    l->run_mu_ok = 0;
    if (l->lead_ok) {
      pthread_mutex_destroy(&l->lead_mu);
      pthread_cond_destroy(&l->lead_cv);
    }
    l->lead_ok = 0;
  }
  pthread_mutex_lock(&srv->conn_mu);
  while (srv->conns) {
    lg__conn_t *k = srv->conns;
    lg__conn_forget_locked(srv, k);
    lg__free(k);
  }
  pthread_mutex_unlock(&srv->conn_mu);
  lg__free(srv->loops);
  srv->loops = NULL;
  srv->nloops = 0;
}

/* Waits (bounded) until no request is in flight: the gateway's and the
 * committer's parked ones answered first. Returns how long it waited;
 * *rc LG_EBUSY when some were still in flight at the bound (or the cut). */
static int drain_requests(lg_server_t *srv, int drain_ms, int *rc) {
  int waited = 0;
  while (atomic_load(&srv->inflight) > 0 && waited < drain_ms && !atomic_load(&srv->drain_cut)) {
    sleep_ms(5);
    waited += 5;
  }
  /* the gateway's requests answered: those still running are cut (their
   * upstream exchange aborted), past the bound or a cut */
  if (lg__gw_stop(srv->gw)) *rc = LG_EBUSY;
  /* Every decision handed to the committer is made, and its connection
   * resumed, before the daemon stops (it aborts on a parked connection);
   * then a moment for the daemon to send those answers. */
  lg__batcher_stop(srv->batcher);
  for (int extra = 0; srv->batcher && atomic_load(&srv->inflight) > 0 && extra < 1000;
       extra += 5) {
    sleep_ms(5);
    waited += 5;
  }
  if (atomic_load(&srv->inflight) > 0) *rc = LG_EBUSY;
  return waited;
}

void lg_server_cut_drain(lg_server_t *srv) {
  if (srv) atomic_store(&srv->drain_cut, 1);
}

int lg_server_shutdown(lg_server_t *srv, int drain_ms) {
  if (!srv || srv->stopped) return 0;
  srv->stopped = 1;
  int rc = 0;
  if (drain_ms <= 0) drain_ms = 10000;
  if (srv->nloops && srv->acc) { /* it started: drain */
    atomic_store(&srv->draining, 1);
    lg__acceptor_stop(srv); /* no new connection; the listening socket closed */
    int waited = drain_requests(srv, drain_ms, &rc);
    stop_loops(srv);
    lg__gw_free(srv->gw); /* no connection is parked on it any more */
    srv->gw = NULL;
    lg__batcher_free(srv->batcher);
    srv->batcher = NULL;
    char f[160];
    snprintf(f, sizeof f, "\"drained\":%s,\"waited_ms\":%d,\"cut_deadline\":%llu,\"cut_evicted\":%llu",
             rc ? "false" : "true", waited, (unsigned long long)atomic_load(&srv->metrics.conn_cut[0]),
             (unsigned long long)atomic_load(&srv->metrics.conn_cut[1]));
    lg__server_log(srv, "info", "stop", f);
  }
  lg__acceptor_stop(srv); /* after a start that failed half way */
  stop_loops(srv);
  if (srv->reaper_started) { /* after the daemons: no connection is left */
    atomic_store(&srv->reaper_stop, 1);
    pthread_join(srv->reaper, NULL);
    srv->reaper_started = 0;
  }
  if (srv->retainer_started) { /* after the batch in hand; before its store handle closes */
    atomic_store(&srv->retainer_stop, 1);
    pthread_join(srv->retainer, NULL);
    srv->retainer_started = 0;
  }
  lg__gw_free(srv->gw); /* when the daemons never started */
  srv->gw = NULL;
  lg__batcher_free(srv->batcher); /* when the daemons never started */
  srv->batcher = NULL;
  lg__checkpointer_free(srv->ckpt);
  srv->ckpt = NULL;
  /* The threads are gone: their store handles can close. */
  pthread_mutex_lock(&srv->wlist_mu);
  for (lg__worker_t *w = srv->workers, *next; w; w = next) {
    next = w->next;
    if (w->store != srv->shared) lg_store_close(w->store);
    lg_canon_free(w->canon);
    lg__free(w);
  }
  srv->workers = NULL;
  lg_store_close(srv->spare);
  srv->spare = NULL;
  lg_store_close(srv->shared);
  srv->shared = NULL;
  pthread_mutex_unlock(&srv->wlist_mu);
  if (srv->listen_fd >= 0) close(srv->listen_fd);
  srv->listen_fd = -1;
  return rc;
}

void lg_server_free(lg_server_t *srv) {
  if (!srv) return;
  lg_server_shutdown(srv, 0);
  lg__auth_free(&srv->auth);
  for (int i = 0; i < LG__POL_SLOTS; i++) {
    lg__free(srv->pol[i].json);
    lg_policy_free(srv->pol[i].pol);
  }
  lg_policy_free(srv->default_policy);
  lg__free(srv->default_policy_json);
  lg__free(srv->policy_source);
  lg__free(srv->store_name);
  lg__free(srv->url);
  lg__free(srv->listen_host);
  lg__free(srv->byfd);
  lg__ipcount_free(srv->ipc);
  lg__free((char *)srv->o.listen);
  lg__free((char *)srv->o.store_url);
  lg__free((char *)srv->o.tokens_file);
  OPENSSL_cleanse(srv->secret, sizeof srv->secret);
  lg__free((char *)srv->o.policy_file);
  lg__free((char *)srv->o.prices_file);
  lg_price_book_free(srv->prices);
  lg__free((char *)srv->o.log_path);
  if (srv->log_owned && srv->log) fclose(srv->log);
  pthread_key_delete(srv->wkey);
  pthread_mutex_destroy(&srv->wlist_mu);
  pthread_mutex_destroy(&srv->pol_mu);
  pthread_mutex_destroy(&srv->log_mu);
  pthread_mutex_destroy(&srv->conn_mu);
  lg__free(srv);
}
