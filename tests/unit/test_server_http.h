/*
 * test_server_http.h — what the server tests share: a small HTTP/1.1
 * client over a raw loopback socket (keep-alive, Content-Length bodies,
 * reconnecting when the server closed), a server started in this process
 * on a free port with a clock the test moves, and JSON helpers.
 *
 * The client is deliberately dumb and strict: it sends exactly the bytes
 * it is given, so tests can also send malformed, oversized and slow
 * requests. Header-only: each test program is one file plus this.
 */
#ifndef LG_TEST_SERVER_HTTP_H
#define LG_TEST_SERVER_HTTP_H

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loopguard.h"

/* ---- the clock the server reads ---- */

static int64_t ht_clock_ms = 1790000000000LL; /* moved by tests */
static __attribute__((unused)) int64_t ht_clock(void *ud) {
  (void)ud;
  return __atomic_load_n(&ht_clock_ms, __ATOMIC_SEQ_CST);
}
static __attribute__((unused)) void ht_advance(int64_t ms) {
  __atomic_add_fetch(&ht_clock_ms, ms, __ATOMIC_SEQ_CST);
}

/* strcasestr without _GNU_SOURCE. */
static const char *ht_find(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && (hay[i] | 0x20) == (needle[i] | 0x20)) i++;
    if (i == n) return hay;
  }
  return NULL;
}

/* ---- a connection ---- */

typedef struct ht_conn {
  int fd;   /* -1 when closed */
  int port;
} ht_conn_t;

typedef struct ht_resp {
  int status;          /* 0: no answer (the connection was closed) */
  char head[8192];     /* status line and headers */
  char *body;          /* NUL-terminated (malloc) */
  size_t len;
  json_t *json;        /* the body parsed, or NULL */
} ht_resp_t;

static void ht_resp_clear(ht_resp_t *r) {
  free(r->body);
  if (r->json) json_decref(r->json);
  memset(r, 0, sizeof *r);
}

static int ht_dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void ht_open(ht_conn_t *c, int port) {
  c->port = port;
  c->fd = ht_dial(port);
}

static void ht_close(ht_conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

static int ht_send_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* The first "\r\n\r\n" in the n bytes at p, or NULL. */
static const char *ht_head_end(const char *p, size_t n) {
  for (size_t i = 0; i + 4 <= n; i++)
    if (p[i] == '\r' && !memcmp(p + i, "\r\n\r\n", 4)) return p + i;
  return NULL;
}

/* Reads one answer on c into r. 0, or -1 when the connection closed. */
static int ht_read(ht_conn_t *c, ht_resp_t *r) {
  memset(r, 0, sizeof *r);
  size_t hl = 0;
  char *end = NULL;
  /* The head, and not a byte past it (a test may read the rest of the
   * connection itself): a look at what came (MSG_PEEK), then a read of it
   * up to the head's end. Byte by byte was a system call a byte, about 110
   * an answer: a third of test_replay_property's time was the kernel's. */
  while (!end) {
    if (hl + 1 >= sizeof r->head) return -1;
    ssize_t n = recv(c->fd, r->head + hl, sizeof r->head - 1 - hl, MSG_PEEK);
    if (n <= 0) return -1;
    size_t from = hl >= 3 ? hl - 3 : 0; /* an end split across two reads */
    const char *e = ht_head_end(r->head + from, hl + (size_t)n - from);
    size_t take = e ? (size_t)(e + 4 - (r->head + hl)) : (size_t)n;
    n = recv(c->fd, r->head + hl, take, 0);
    if (n <= 0) return -1;
    hl += (size_t)n;
    r->head[hl] = 0;
    if (e && (size_t)n == take) end = (char *)e; /* else looked for again in what comes */
  }
  if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
  const char *cl = ht_find(r->head, "\r\nContent-Length:");
  size_t len = cl ? strtoul(cl + 17, NULL, 10) : 0;
  r->body = malloc(len + 1);
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(c->fd, r->body + got, len - got, 0);
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  r->body[len] = 0;
  r->len = len;
  r->json = json_loadb(r->body, len, 0, NULL);
  if (ht_find(r->head, "\r\nConnection: close")) ht_close(c);
  return 0;
}

/* Sends raw bytes and reads the answer (reconnecting once first when the
 * connection is closed). */
static int ht_raw(ht_conn_t *c, const char *req, size_t n, ht_resp_t *r) {
  for (int attempt = 0; attempt < 2; attempt++) {
    if (c->fd < 0) c->fd = ht_dial(c->port);
    if (c->fd < 0) return -1;
    /* A server may answer (413) and close before the body is all sent:
     * read its answer even when sending failed. */
    int sent = ht_send_all(c->fd, req, n) == 0;
    if (!ht_read(c, r) && (sent || r->status)) return 0;
    ht_resp_clear(r);
    ht_close(c);
  }
  return -1;
}

/* METHOD PATH with an optional token and body; the answer in r. */
static __attribute__((unused)) int ht_req(ht_conn_t *c, const char *method, const char *path,
                                          const char *token, const char *body, ht_resp_t *r) {
  size_t bl = body ? strlen(body) : 0;
  size_t cap = bl + 1024 + strlen(path) + (token ? strlen(token) : 0);
  char *req = malloc(cap);
  int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, path);
  if (token) n += snprintf(req + n, cap - (size_t)n, "Authorization: Bearer %s\r\n", token);
  if (body)
    n += snprintf(req + n, cap - (size_t)n,
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n", bl);
  n += snprintf(req + n, cap - (size_t)n, "\r\n");
  if (body) memcpy(req + n, body, bl);
  int rc = ht_raw(c, req, (size_t)n + bl, r);
  free(req);
  return rc;
}

/* ---- JSON helpers ---- */

/* A string member by path "a.b.c" (NULL when absent or not a string). */
static __attribute__((unused)) const char *ht_str(const ht_resp_t *r, const char *path) {
  json_t *v = r->json;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
    v = json_object_get(v, tok);
  return json_string_value(v);
}

static __attribute__((unused)) json_t *ht_get(const ht_resp_t *r, const char *path) {
  json_t *v = r->json;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
    v = json_object_get(v, tok);
  return v;
}

static __attribute__((unused)) long long ht_int(const ht_resp_t *r, const char *path) {
  return json_integer_value(ht_get(r, path));
}

#endif
