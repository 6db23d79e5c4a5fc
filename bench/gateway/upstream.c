/* gw_bench_upstream — the fake model provider of the gateway benchmark
 * (bench/gateway/run.sh, bench/README.md "Gateway").
 *
 * One thread, epoll, HTTP/1.1 keep-alive on loopback: it must never be
 * what limits the figures, so it does no JSON parsing and answers from
 * two prebuilt responses. Every POST gets the reply of OpenAI Chat
 * Completions in the real wire format, with `usage`: a chat.completion
 * asking for one tool call, or, when the body says `"stream":true`, the
 * same as an SSE stream (role chunk, the tool call's chunks, the finish
 * chunk, the usage chunk, `data: [DONE]`), sent with chunked transfer
 * encoding as providers send it. Anything else (a GET) is 404 in
 * OpenAI's error shape.
 *
 * A body with "user":"bench-steady" (an OpenAI field, forwarded as it is)
 * is a turn of an agent loop (agent.lua's steady mode): the call asked
 * for is then the conversation's next, id call_s<N> on record_id N, N the
 * tool results the body holds, so that each turn asks for a new call and
 * the next turn's body carries it with its result.
 *
 * Usage: gw_bench_upstream PORTFILE   listens on 127.0.0.1, a free port,
 *        written to PORTFILE; runs until SIGTERM / SIGINT.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_REQ (4 << 20) /* the largest request kept: 4 MB */
/* In a body: a turn of the steady benchmark (bench/gateway/agent.lua, LG_GW_MODE=steady) */
#define STEADY "\"user\":\"bench-steady\""

typedef struct {
  int fd;
  char *in;
  size_t len, cap;
  char *out; /* pending output (a short write) */
  size_t olen, ooff;
} conn_t;

static volatile sig_atomic_t stop;
static void on_signal(int s) {
  (void)s;
  stop = 1;
}

static void die(const char *what) {
  fprintf(stderr, "gw_bench_upstream: %s: %s\n", what, strerror(errno));
  exit(1);
}

static char *plain, *streamed, *notfound;
static size_t plain_len, streamed_len, notfound_len;

static char *xasprintf(size_t *len, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *xasprintf(size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) die("out of memory");
  *len = (size_t)n;
  return s;
}

#define CALL_ARGS "{\\\"record_id\\\":%ld,\\\"value\\\":\\\"A\\\"}"

/* The answer asking for one tool call, id call_id and record_id rec (its
 * arguments), whole or as an SSE stream, with its HTTP head. */
static char *answer(int stream, const char *call_id, long rec, size_t *len) {
  if (!stream) {
    size_t blen;
    char *body = xasprintf(&blen,
                           "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1764547200,"
                           "\"model\":\"bench\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                           "\"content\":null,\"refusal\":null,\"tool_calls\":[{\"id\":\"%s\",\"type\":"
                           "\"function\",\"function\":{\"name\":\"write_record\",\"arguments\":\"" CALL_ARGS
                           "\"}}]},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"usage\":{"
                           "\"prompt_tokens\":2048,\"completion_tokens\":18,\"total_tokens\":2066},"
                           "\"system_fingerprint\":\"fp_bench\"}",
                           call_id, rec);
    char *r = xasprintf(len,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                        "Connection: keep-alive\r\n\r\n%s",
                        blen, body);
    free(body);
    return r;
  }
  const char *base = "\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,"
                     "\"model\":\"bench\",\"system_fingerprint\":\"fp_bench\"";
  char *ev[6];
  size_t evlen[6];
  ev[0] = xasprintf(&evlen[0], "data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null},"
                    "\"logprobs\":null,\"finish_reason\":null}]}\n\n", base);
  ev[1] = xasprintf(&evlen[1], "data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":"
                    "\"%s\",\"type\":\"function\",\"function\":{\"name\":\"write_record\",\"arguments\":"
                    "\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n", base, call_id);
  ev[2] = xasprintf(&evlen[2], "data: {%s,\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
                    "{\"arguments\":\"" CALL_ARGS "\"}}]},\"logprobs\":null,\"finish_reason\":null}]}\n\n", base, rec);
  ev[3] = xasprintf(&evlen[3], "data: {%s,\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":"
                    "\"tool_calls\"}]}\n\n", base);
  ev[4] = xasprintf(&evlen[4], "data: {%s,\"choices\":[],\"usage\":{\"prompt_tokens\":2048,\"completion_tokens\":18,"
                    "\"total_tokens\":2066}}\n\n", base);
  ev[5] = xasprintf(&evlen[5], "data: [DONE]\n\n");
  /* One HTTP chunk per event, as a provider flushes them. */
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  if (!s) die("out of memory");
  n = (size_t)snprintf(s, cap,
                       "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                       "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n");
  for (int i = 0; i < 6; i++) {
    n += (size_t)snprintf(s + n, cap - n, "%zx\r\n%s\r\n", evlen[i], ev[i]);
    if (n >= cap) die("the stream answer does not fit");
    free(ev[i]);
  }
  n += (size_t)snprintf(s + n, cap - n, "0\r\n\r\n");
  if (n >= cap) die("the stream answer does not fit");
  *len = n;
  return s;
}

static void build_answers(void) {
  plain = answer(0, "call_bench", 7, &plain_len);
  streamed = answer(1, "call_bench", 7, &streamed_len);
  const char *nf = "{\"error\":{\"message\":\"Unknown request URL.\",\"type\":\"invalid_request_error\","
                   "\"param\":null,\"code\":\"unknown_url\"}}";
  notfound = xasprintf(&notfound_len,
                       "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                       "Connection: keep-alive\r\n\r\n%s",
                       strlen(nf), nf);
}

static void conn_close(int ep, conn_t *c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c->in);
  free(c->out);
  free(c);
}

/* Sends s (n bytes), keeping what the socket does not take. */
static int conn_send(int ep, conn_t *c, const char *s, size_t n) {
  if (c->olen > c->ooff) { /* already waiting: queue */
    char *o = realloc(c->out, c->olen + n);
    if (!o) return -1;
    memcpy(o + c->olen, s, n);
    c->out = o;
    c->olen += n;
    return 0;
  }
  ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
  if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
  if (w < 0) w = 0;
  if ((size_t)w == n) return 0;
  free(c->out);
  c->out = malloc(n - (size_t)w);
  if (!c->out) return -1;
  memcpy(c->out, s + w, n - (size_t)w);
  c->olen = n - (size_t)w;
  c->ooff = 0;
  struct epoll_event e = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
  return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
}

static int conn_flush(int ep, conn_t *c) {
  while (c->ooff < c->olen) {
    ssize_t w = send(c->fd, c->out + c->ooff, c->olen - c->ooff, MSG_NOSIGNAL);
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    c->ooff += (size_t)w;
  }
  c->olen = c->ooff = 0;
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
  return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
}

/* Answers every complete request in c->in; -1 closes the connection. */
static int conn_serve(int ep, conn_t *c) {
  for (;;) {
    char *end = memmem(c->in, c->len, "\r\n\r\n", 4);
    if (!end) return c->len > MAX_REQ ? -1 : 0;
    size_t head = (size_t)(end - c->in) + 4;
    size_t body = 0;
    for (char *p = c->in; p < end; p++) { /* Content-Length, any case */
      if ((p == c->in || p[-1] == '\n') && !strncasecmp(p, "content-length:", 15)) {
        body = strtoul(p + 15, NULL, 10);
        break;
      }
    }
    if (body > MAX_REQ) return -1;
    if (c->len < head + body) return 0;
    int rc;
    if (c->len >= 5 && !memcmp(c->in, "POST ", 5)) {
      /* "stream":true, with or without a space, anywhere in the body */
      const char *b = c->in + head;
      int stream = 0;
      for (const char *q = b; (q = memmem(q, (size_t)(b + body - q), "\"stream\"", 8)); q += 8) {
        const char *v = q + 8;
        while (v < b + body && (*v == ' ' || *v == ':')) v++;
        if (b + body - v >= 4 && !memcmp(v, "true", 4)) {
          stream = 1;
          break;
        }
      }
      if (memmem(b, body, STEADY, sizeof STEADY - 1)) {
        /* an agent loop's turn: the next call is the conversation's next one,
         * call_s<N> on record N, N the tool results it holds */
        long n = 0;
        for (const char *q = b; (q = memmem(q, (size_t)(b + body - q), "\"tool_call_id\"", 14)); q += 14) n++;
        char id[32];
        snprintf(id, sizeof id, "call_s%06ld", n);
        size_t alen;
        char *ans = answer(stream, id, n, &alen);
        rc = conn_send(ep, c, ans, alen);
        free(ans);
      } else {
        rc = stream ? conn_send(ep, c, streamed, streamed_len) : conn_send(ep, c, plain, plain_len);
      }
    } else {
      rc = conn_send(ep, c, notfound, notfound_len);
    }
    if (rc) return -1;
    memmove(c->in, c->in + head + body, c->len - head - body);
    c->len -= head + body;
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gw_bench_upstream PORTFILE\n");
    return 2;
  }
  build_answers();
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (ls < 0) die("socket");
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024)) die("bind/listen 127.0.0.1");
  socklen_t al = sizeof a;
  if (getsockname(ls, (struct sockaddr *)&a, &al)) die("getsockname");
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
  FILE *pf = fopen(tmp, "w");
  if (!pf || fprintf(pf, "%d\n", ntohs(a.sin_port)) < 0 || fclose(pf) || rename(tmp, argv[1])) die(argv[1]);

  int ep = epoll_create1(0);
  if (ep < 0) die("epoll_create1");
  struct epoll_event le = {.events = EPOLLIN, .data.ptr = NULL};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &le)) die("epoll_ctl");
  struct epoll_event evs[64];
  while (!stop) {
    int n = epoll_wait(ep, evs, 64, 200);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      if (!c) { /* the listener */
        int fd;
        while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conn_t *nc = calloc(1, sizeof *nc);
          if (!nc) die("out of memory");
          nc->fd = fd;
          struct epoll_event e = {.events = EPOLLIN, .data.ptr = nc};
          if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e)) die("epoll_ctl");
        }
        continue;
      }
      if ((evs[i].events & EPOLLOUT) && conn_flush(ep, c)) {
        conn_close(ep, c);
        continue;
      }
      if (!(evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
      int closed = 0;
      for (;;) {
        if (c->cap - c->len < 65536) {
          size_t nc = c->cap ? c->cap * 2 : 131072;
          char *p = realloc(c->in, nc);
          if (!p) die("out of memory");
          c->in = p;
          c->cap = nc;
        }
        ssize_t r = recv(c->fd, c->in + c->len, c->cap - c->len, 0);
        if (r > 0) {
          c->len += (size_t)r;
          continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        closed = 1; /* 0: the peer closed; an error */
        break;
      }
      if (closed || conn_serve(ep, c)) conn_close(ep, c);
    }
  }
  close(ls);
  return 0;
}
