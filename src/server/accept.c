/*
 * accept.c — the server's accept loop: every connection is accepted here,
 * counted, and its first request head screened before libmicrohttpd sees
 * it.
 *
 * libmicrohttpd's daemons run without a listening socket
 * (MHD_USE_NO_LISTEN_SOCKET); one thread of ours accepts. For each new
 * connection it:
 *
 *   1. admits it or closes it at once: the connection limit and the
 *      per-address limit, counted here for the whole server (a daemon's
 *      own counts would split them --threads ways); past the soft limit
 *      the oldest idle connection is cut (see server.c, "connections");
 *   2. peeks (recv MSG_PEEK: the bytes stay in the kernel for
 *      libmicrohttpd) at what the client has sent, again at every new
 *      segment (edge-triggered epoll), until lg__screen_head (screen.c)
 *      decides on the first head;
 *   3. a head that passes: the connection goes to the daemon with the
 *      fewest connections (MHD_add_connection, from this thread for a
 *      daemon with a thread of its own, from the loop's thread in epoll
 *      mode, where libmicrohttpd is not thread-safe);
 *   4. a head that does not: the JSON answer (lg__screen_answer) with
 *      "Connection: close", then shutdown(SHUT_WR), and what the client
 *      still sends is read and dropped for at most LG__DRAIN_NS and
 *      LG__DRAIN_BYTES before the close, so that a client that writes
 *      before it reads gets the answer and not a reset.
 *
 * Deadlines are the reaper's (server.c): a connection held here is idle
 * until its first byte and in its request from then, like any other, and
 * the reaper cuts it (shutdown) at --timeout; the cut wakes this loop,
 * which closes it. Screening happens once per connection: a keep-alive
 * connection's later requests are read by libmicrohttpd directly.
 *
 * Only this thread closes the connections it holds, and it takes them out
 * of the table (under conn_mu) first, so a descriptor is never cut after
 * it was reused.
 */
#define _GNU_SOURCE /* accept4 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- connections per address ---- */

typedef struct ipnode {
  uint8_t key[16];        /* IPv6, or IPv4 mapped (::ffff:a.b.c.d) */
  unsigned n;             /* open connections */
  struct ipnode *next;
} ipnode_t;

#define IP_BUCKETS 4096
struct lg__ipcount {
  ipnode_t *b[IP_BUCKETS];
};

lg__ipcount_t *lg__ipcount_new(void) { return lg__calloc(1, sizeof(lg__ipcount_t)); }

void lg__ipcount_free(lg__ipcount_t *t) {
  if (!t) return;
  for (int i = 0; i < IP_BUCKETS; i++)
    for (ipnode_t *x = t->b[i], *nx; x; x = nx) {
      nx = x->next;
      lg__free(x);
    }
  lg__free(t);
}

/* The address's key; 0, or -1 when it is neither IPv4 nor IPv6. */
static int ip_key(const struct sockaddr_storage *a, uint8_t key[16]) {
  memset(key, 0, 16);
  if (a->ss_family == AF_INET) {
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
    return 0;
  }
  if (a->ss_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
    return 0;
  }
  return -1;
}

static ipnode_t **ip_slot(lg__ipcount_t *t, const uint8_t key[16]) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 16; i++) h = (h ^ key[i]) * 1099511628211ull;
  ipnode_t **p = &t->b[h % IP_BUCKETS];
  while (*p && memcmp((*p)->key, key, 16)) p = &(*p)->next;
  return p;
}

int lg__ipcount_add(lg__ipcount_t *t, const struct sockaddr_storage *addr, unsigned limit) {
  uint8_t key[16];
  if (!t || ip_key(addr, key)) return 0; /* not counted (a Unix socket) */
  ipnode_t **p = ip_slot(t, key);
  if (!*p) {
    ipnode_t *x = lg__calloc(1, sizeof *x);
    if (!x) return -1;
    memcpy(x->key, key, 16);
    *p = x;
  }
  if ((*p)->n >= limit) return -1;
  (*p)->n++;
  return 0;
}

void lg__ipcount_del(lg__ipcount_t *t, const struct sockaddr_storage *addr) {
  uint8_t key[16];
  if (!t || ip_key(addr, key)) return;
  ipnode_t **p = ip_slot(t, key);
  if (!*p) return;
  if (--(*p)->n == 0) {
    ipnode_t *x = *p;
    *p = x->next;
    lg__free(x);
  }
}

/* ---- the acceptor ---- */

struct lg__acceptor {
  lg_server_t *srv;
  int ep;                     /* epoll: the listening socket, efd, held connections */
  int efd;                    /* eventfd: stop */
  pthread_t th;
  int started;
  _Atomic int stop;
  lg__conn_t *held;           /* screening, in no order */
  lg__conn_t *drain_head, *drain_tail; /* answered, by drain_until */
  uint64_t cut_wait_ns;       /* since when it waits for cut ones to close (0: not) */
  char buf[LG__MAX_HEAD + 1]; /* what a peek sees */
};

/* How long new clients wait in the backlog for cut connections to close
 * (accept_some): a cut connection whose daemon has parked its request
 * closes only when the request ends; past this, refused as before. */
#define CUT_WAIT_NS (100 * 1000000ull)

static char listen_tag, wake_tag; /* epoll data of the two descriptors */

static void list_add(lg__conn_t **head, lg__conn_t *k) {
  k->hprev = NULL;
  k->hnext = *head;
  if (*head) (*head)->hprev = k;
  *head = k;
}

static void list_del(lg__conn_t **head, lg__conn_t **tail, lg__conn_t *k) {
  if (k->hprev) k->hprev->hnext = k->hnext;
  else *head = k->hnext;
  if (k->hnext) k->hnext->hprev = k->hprev;
  else if (tail) *tail = k->hprev;
  k->hprev = k->hnext = NULL;
}

/* Takes k out of the acceptor's lists and the table, closes and frees it. */
static void drop(lg__acceptor_t *a, lg__conn_t *k) {
  if (k->owner == LG__OWN_DRAIN) list_del(&a->drain_head, &a->drain_tail, k);
  else list_del(&a->held, NULL, k);
  pthread_mutex_lock(&a->srv->conn_mu);
  lg__conn_forget_locked(a->srv, k);
  pthread_mutex_unlock(&a->srv->conn_mu);
  /* Out of the epoll set first: close(2) removes a descriptor only when no
   * other refers to its socket, and a child the embedding process forks
   * (popen, posix_spawn) holds a copy until it execs; the set would go on
   * reporting events for k after it is freed. */
  if (k->in_epoll) epoll_ctl(a->ep, EPOLL_CTL_DEL, k->fd, NULL);
  close(k->fd);
  lg__free(k);
}

/* The daemon with the fewest connections. */
static lg__loop_t *pick_loop(lg_server_t *srv) {
  lg__loop_t *best = &srv->loops[0];
  for (int i = 1; i < srv->nloops; i++)
    if (atomic_load(&srv->loops[i].nconns) < atomic_load(&best->nconns)) best = &srv->loops[i];
  return best;
}

/* Gives k to a daemon: its first head is in and passed. */
static void hand_over(lg__acceptor_t *a, lg__conn_t *k) {
  lg_server_t *srv = a->srv;
  list_del(&a->held, NULL, k);
  if (k->in_epoll) epoll_ctl(a->ep, EPOLL_CTL_DEL, k->fd, NULL);
  k->in_epoll = 0;
  lg__loop_t *l = pick_loop(srv);
  pthread_mutex_lock(&srv->conn_mu);
  k->owner = LG__OWN_MHD;
  k->loop = l; /* counted in l->nconns until forgotten */
  atomic_fetch_add(&l->nconns, 1);
  pthread_mutex_unlock(&srv->conn_mu);
  if (srv->epoll_loop) { /* the loop's thread adds it (libmicrohttpd is not thread-safe there) */
    pthread_mutex_lock(&l->q_mu);
    k->hnext = l->queue;
    l->queue = k;
    pthread_mutex_unlock(&l->q_mu);
    lg__loop_wake(l);
    return;
  }
  int fd = k->fd;
  if (MHD_add_connection(l->mhd, fd, (struct sockaddr *)&k->addr, k->addrlen) != MHD_YES) {
    /* libmicrohttpd closed the socket; k is ours again unless it started */
    pthread_mutex_lock(&srv->conn_mu);
    int started = k->mc != NULL;
    if (!started) lg__conn_forget_locked(srv, k);
    pthread_mutex_unlock(&srv->conn_mu);
    if (!started) lg__free(k);
  }
}

void lg__loop_add_queued(lg__loop_t *l) {
  pthread_mutex_lock(&l->q_mu);
  lg__conn_t *q = l->queue;
  l->queue = NULL;
  pthread_mutex_unlock(&l->q_mu);
  lg_server_t *srv = l->srv;
  while (q) {
    lg__conn_t *k = q;
    q = q->hnext;
    k->hnext = NULL;
    if (MHD_add_connection(l->mhd, k->fd, (struct sockaddr *)&k->addr, k->addrlen) == MHD_YES)
      continue;
    pthread_mutex_lock(&srv->conn_mu);
    int started = k->mc != NULL;
    if (!started) lg__conn_forget_locked(srv, k);
    pthread_mutex_unlock(&srv->conn_mu);
    if (!started) lg__free(k);
  }
}

/* Answers a head that did not pass, and starts reading and dropping. */
static void refuse(lg__acceptor_t *a, lg__conn_t *k, const lg__screen_t *s) {
  lg_server_t *srv = a->srv;
  lg__buf_t b = {0};
  if (!lg__screen_answer(s, &b)) {
    ssize_t w = send(k->fd, b.data, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* a new socket's buffer takes a short answer whole; else the client is gone */
  }
  lg__buf_free(&b);
  lg__metrics_request(&srv->metrics, LG__RT_OTHER, s->status, 0);
  shutdown(k->fd, SHUT_WR);
  list_del(&a->held, NULL, k);
  pthread_mutex_lock(&srv->conn_mu);
  k->owner = LG__OWN_DRAIN;
  k->phase = LG__PH_BUSY; /* the drain has its own, shorter, deadline */
  pthread_mutex_unlock(&srv->conn_mu);
  k->drain_until = lg__mono_ns() + LG__DRAIN_NS;
  k->hprev = a->drain_tail;
  k->hnext = NULL;
  if (a->drain_tail) a->drain_tail->hnext = k;
  else a->drain_head = k;
  a->drain_tail = k;
}

/* Reads and drops what a refused client still sends. */
static void drain(lg__acceptor_t *a, lg__conn_t *k) {
  for (;;) {
    ssize_t n = recv(k->fd, a->buf, sizeof a->buf, MSG_DONTWAIT);
    if (n > 0) {
      k->dropped += (uint64_t)n;
      if (k->dropped > LG__DRAIN_BYTES) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    break; /* the client is done (0), or gone */
  }
  drop(a, k);
}

/* Peeks at a held connection and acts on what the screen decides. `hup`:
 * the client will send nothing more. Returns 1 when k is still held. */
static int screen(lg__acceptor_t *a, lg__conn_t *k, int hup) {
  ssize_t n = recv(k->fd, a->buf, sizeof a->buf, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) && !hup) return 1;
  if (n <= 0) { /* closed, cut by the reaper, or an error */
    drop(a, k);
    return 0;
  }
  if (!k->head_ns) { /* its first byte: the request's deadline runs from here */
    uint64_t now = lg__mono_ns();
    pthread_mutex_lock(&a->srv->conn_mu);
    k->head_ns = now;
    k->phase = LG__PH_REQUEST;
    k->since_ns = now;
    pthread_mutex_unlock(&a->srv->conn_mu);
  }
  lg__screen_t s;
  int rc = lg__screen_head(a->buf, (size_t)n, &s);
  if (rc == 0) {
    hand_over(a, k);
    return 0;
  }
  if (rc < 0) {
    refuse(a, k, &s);
    if (!k->in_epoll) {
      struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = k};
      k->in_epoll = !epoll_ctl(a->ep, EPOLL_CTL_ADD, k->fd, &ev);
    }
    drain(a, k);
    return 0;
  }
  if (hup) { /* half a head, and the client has stopped sending */
    drop(a, k);
    return 0;
  }
  return 1;
}

/* Admits a new connection into the table, or refuses it (NULL). */
static lg__conn_t *admit(lg_server_t *srv, int fd, const struct sockaddr_storage *ss,
                         socklen_t sl) {
  lg__conn_t *k = lg__calloc(1, sizeof *k);
  if (!k) return NULL;
  k->srv = srv;
  k->fd = fd;
  k->owner = LG__OWN_SCREEN;
  k->phase = LG__PH_IDLE;
  k->since_ns = lg__mono_ns();
  memcpy(&k->addr, ss, sizeof *ss);
  k->addrlen = sl;
  pthread_mutex_lock(&srv->conn_mu);
  int ok = srv->nconns < srv->conn_limit && (size_t)fd < srv->nbyfd &&
           !lg__ipcount_add(srv->ipc, ss, srv->per_ip);
  if (ok) {
    lg__conn_t *stale = srv->byfd[fd];
    if (stale) { /* handed over, then closed by libmicrohttpd before it started (out of
                    memory): never seen by libmicrohttpd again, as its number is reused */
      lg__conn_forget_locked(srv, stale);
      lg__free(stale);
    }
    srv->byfd[fd] = k;
    k->next = srv->conns;
    if (srv->conns) srv->conns->prev = k;
    srv->conns = k;
    srv->nconns++;
    if (srv->nconns - srv->ncut > srv->conn_soft) {
      /* Make room: the oldest connection that holds nothing the server
       * has begun goes: idle between requests, or its first head not in
       * yet (a slow head is no request yet; cutting it loses nothing). */
      lg__conn_t *old = NULL;
      for (lg__conn_t *x = k->next; x; x = x->next)
        if (!x->cut && (x->owner == LG__OWN_SCREEN || (x->mc && x->phase == LG__PH_IDLE)) &&
            (!old || x->since_ns < old->since_ns))
          old = x;
      if (old) {
        lg__conn_cut_locked(old);
        atomic_fetch_add(&srv->metrics.conn_cut[1], 1);
      }
    }
  }
  pthread_mutex_unlock(&srv->conn_mu);
  if (!ok) {
    lg__free(k);
    return NULL;
  }
  return k;
}

/* 1 when the table is at its hard limit with cut connections still in it:
 * they are on their way out (this loop, or their daemon, closes them on
 * the hang-up their cut raised), so the next client waits in the backlog
 * for their room rather than be refused, for up to CUT_WAIT_NS. */
static int full_of_cut(lg__acceptor_t *a) {
  lg_server_t *srv = a->srv;
  pthread_mutex_lock(&srv->conn_mu);
  int full = srv->nconns >= srv->conn_limit && srv->ncut > 0;
  pthread_mutex_unlock(&srv->conn_mu);
  if (!full) {
    a->cut_wait_ns = 0;
    return 0;
  }
  uint64_t now = lg__mono_ns();
  if (!a->cut_wait_ns) a->cut_wait_ns = now;
  return now - a->cut_wait_ns < CUT_WAIT_NS;
}

/* Accepts what the backlog holds (up to 256 a turn); 1 when it stopped
 * because the table is full of connections on their way out. */
static int accept_some(lg__acceptor_t *a) {
  lg_server_t *srv = a->srv;
  for (int i = 0; i < 256; i++) {
    if (full_of_cut(a)) return 1;
    struct sockaddr_storage ss = {0}; /* a family the kernel may leave unset reads as none */
    socklen_t sl = sizeof ss;
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        struct timespec ts = {0, 10 * 1000000L}; /* out of descriptors: let some close */
        nanosleep(&ts, NULL);
      }
      return 0;
    }
    lg__conn_t *k = admit(srv, fd, &ss, sl);
    if (!k) { /* over a limit: refused */
      close(fd);
      continue;
    }
    list_add(&a->held, k);
    if (!screen(a, k, 0)) continue; /* its head was in already */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = k};
    if (epoll_ctl(a->ep, EPOLL_CTL_ADD, fd, &ev)) {
      drop(a, k);
      continue;
    }
    k->in_epoll = 1;
  }
  return 0;
}

static void *acceptor_main(void *arg) {
  lg__acceptor_t *a = arg;
  prctl(PR_SET_NAME, "lg-accept", 0, 0, 0); /* for top -H and perf */
  struct epoll_event got[64];
  while (!atomic_load(&a->stop)) {
    int ms = -1;
    if (a->drain_head) {
      uint64_t now = lg__mono_ns(), until = a->drain_head->drain_until;
      ms = until > now ? (int)((until - now) / 1000000u) + 1 : 0;
    }
    int n = epoll_wait(a->ep, got, 64, ms), waiting = 0;
    for (int i = 0; i < n; i++) {
      void *p = got[i].data.ptr;
      if (p == &listen_tag) {
        waiting = accept_some(a);
      } else if (p == &wake_tag) {
        uint64_t v;
        ssize_t r = read(a->efd, &v, sizeof v);
        (void)r;
      } else {
        lg__conn_t *k = p;
        if (k->owner == LG__OWN_DRAIN) drain(a, k);
        else screen(a, k, (got[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
      }
    }
    uint64_t now = lg__mono_ns();
    while (a->drain_head && a->drain_head->drain_until <= now) drop(a, a->drain_head);
    /* Still full of cut connections that are not this loop's to close:
     * their daemons close them in a moment. The listening socket stays
     * readable, so wait that moment rather than spin on it. */
    if (waiting && full_of_cut(a)) {
      struct timespec ts = {0, 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  /* Stopping: no more connections; a held one whose head is in is served
   * (its answer says Connection: close), the others are closed. */
  epoll_ctl(a->ep, EPOLL_CTL_DEL, a->srv->listen_fd, NULL);
  close(a->srv->listen_fd);
  a->srv->listen_fd = -1;
  while (a->held)
    if (screen(a, a->held, 1)) drop(a, a->held);
  while (a->drain_head) drop(a, a->drain_head);
  return NULL;
}

int lg__acceptor_start(lg_server_t *srv, lg_error_t *err) {
  lg__acceptor_t *a = lg__calloc(1, sizeof *a);
  if (!a) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  a->srv = srv;
  a->ep = epoll_create1(EPOLL_CLOEXEC);
  a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  srv->acc = a;
  if (a->ep < 0 || a->efd < 0)
    return lg__err(err, LG_EIO, NULL, -1, "epoll/eventfd: %s", strerror(errno));
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
  struct epoll_event wv = {.events = EPOLLIN, .data.ptr = &wake_tag};
  if (epoll_ctl(a->ep, EPOLL_CTL_ADD, srv->listen_fd, &ev) ||
      epoll_ctl(a->ep, EPOLL_CTL_ADD, a->efd, &wv))
    return lg__err(err, LG_EIO, NULL, -1, "epoll_ctl: %s", strerror(errno));
  if (pthread_create(&a->th, NULL, acceptor_main, a))
    return lg__err(err, LG_EIO, NULL, -1, "cannot start a thread");
  a->started = 1;
  return 0;
}

void lg__acceptor_stop(lg_server_t *srv) {
  lg__acceptor_t *a = srv->acc;
  if (!a) return;
  if (a->started) {
    atomic_store(&a->stop, 1);
    uint64_t one = 1;
    ssize_t w = write(a->efd, &one, sizeof one);
    (void)w;
    pthread_join(a->th, NULL);
  }
  if (a->ep >= 0) close(a->ep);
  if (a->efd >= 0) close(a->efd);
  lg__free(a);
  srv->acc = NULL;
}
