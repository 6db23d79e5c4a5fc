/*
 * fuzz_http_head.c — the head screen of src/server/screen.c on arbitrary
 * bytes, as a connection's first bytes.
 *
 * Invariants:
 *   - a decided prefix stays decided: the answer for every prefix that is
 *     already decided (passed, or refused) is the same answer as for the
 *     whole input (the acceptor peeks again at every new segment);
 *   - LG__SCREEN_MORE only while the bytes are within LG__MAX_HEAD;
 *   - a head that passes is at most LG__MAX_HEAD bytes, ends with an empty
 *     line, holds no NUL, and its request line is METHOD SP TARGET SP
 *     HTTP/1.D with a target of at most LG__MAX_URI bytes, and it has at
 *     most LG__MAX_FIELDS header lines;
 *   - a refusal has a status of the contract (400, 413, 414, 431, 505) and
 *     its answer is one status line, application/json, and a strict JSON
 *     body in the documented shape with that code.
 */
#include "loopguard.h"
#include "server/server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

/* The request line of a head that passed: METHOD SP TARGET SP HTTP/1.D. */
static void check_passed(const char *p, size_t hl, const uint8_t *data, size_t size) {
  check(hl <= LG__MAX_HEAD, "a passed head is within LG__MAX_HEAD", data, size);
  check(hl >= 2 && p[hl - 1] == '\n' && (p[hl - 2] == '\n' || (hl >= 3 && p[hl - 2] == '\r' &&
                                                                 p[hl - 3] == '\n')),
        "a passed head ends with an empty line", data, size);
  check(memchr(p, 0, hl) == NULL, "a passed head holds no NUL", data, size);
  size_t i = 0;
  while (i < hl && (p[i] == '\r' || p[i] == '\n')) i++;
  const char *line = p + i;
  const char *eol = memchr(line, '\n', hl - i);
  check(eol != NULL, "a request line", data, size);
  size_t ll = (size_t)(eol - line);
  if (ll && line[ll - 1] == '\r') ll--;
  const char *sp1 = memchr(line, ' ', ll);
  check(sp1 && sp1 > line, "a method", data, size);
  const char *sp2 = memchr(sp1 + 1, ' ', ll - (size_t)(sp1 + 1 - line));
  check(sp2 && sp2 > sp1 + 1, "a target", data, size);
  check((size_t)(sp2 - sp1 - 1) <= LG__MAX_URI, "a target within LG__MAX_URI", data, size);
  size_t vl = ll - (size_t)(sp2 + 1 - line);
  check(vl == 8 && !memcmp(sp2 + 1, "HTTP/1.", 7) && sp2[8] >= '0' && sp2[8] <= '9',
        "HTTP/1.D", data, size);
  size_t lines = 0; /* header lines: each line after the request line but the empty one */
  for (const char *q = eol + 1; q < p + hl && *q != '\r' && *q != '\n'; lines++) {
    const char *e = memchr(q, '\n', (size_t)(p + hl - q));
    q = e ? e + 1 : p + hl;
  }
  check(lines <= LG__MAX_FIELDS, "at most LG__MAX_FIELDS header lines", data, size);
}

static void check_refused(const lg__screen_t *s, const uint8_t *data, size_t size) {
  check(s->status == 400 || s->status == 413 || s->status == 414 || s->status == 431 ||
            s->status == 505,
        "a status of the contract", data, size);
  lg__buf_t b = {0};
  check(lg__screen_answer(s, &b) == 0, "an answer", data, size);
  char *a = lg__buf_steal(&b, NULL);
  char *sep = strstr(a, "\r\n\r\n");
  check(sep != NULL, "the answer has a head", data, size);
  *sep = 0;
  int code = 0;
  check(sscanf(a, "HTTP/1.1 %d ", &code) == 1 && code == s->status, "its status line", data, size);
  check(strstr(a, "\r\nHTTP/") == NULL, "one status line", data, size);
  check(strstr(a, "\r\nContent-Type: application/json") != NULL, "application/json", data, size);
  check(strstr(a, "\r\nConnection: close") != NULL, "Connection: close", data, size);
  const char *body = sep + 4;
  json_error_t je;
  json_t *j = json_loads(body, JSON_REJECT_DUPLICATES, &je);
  check(j != NULL, "the body is strict JSON", data, size);
  json_t *e = json_object_get(j, "error");
  check(json_object_size(j) == 1 && json_is_object(e) &&
            json_integer_value(json_object_get(e, "code")) == s->status &&
            json_is_string(json_object_get(e, "type")) &&
            json_is_string(json_object_get(e, "message")) &&
            json_is_string(json_object_get(e, "field")),
        "the error shape", data, size);
  json_decref(j);
  lg__free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Exactly size bytes: the screen must not read past them. */
  char *p = malloc(size ? size : 1);
  if (!p) return 0;
  memcpy(p, data, size);
  lg__screen_t s;
  int rc = lg__screen_head(p, size, &s);
  check(rc == 0 || rc == -1 || rc == LG__SCREEN_MORE, "a result", data, size);
  if (rc == LG__SCREEN_MORE) check(size <= LG__MAX_HEAD, "MORE within the head limit", data, size);
  if (rc == 0) check_passed(p, s.head_len, data, size);
  if (rc == -1) check_refused(&s, data, size);
  /* Prefixes: decided ones agree with the whole. */
  size_t cuts[3] = {size / 2, size ? size - 1 : 0, rc == 0 ? s.head_len : size};
  for (int i = 0; i < 3; i++) {
    lg__screen_t t;
    int r = lg__screen_head(p, cuts[i], &t);
    if (r == LG__SCREEN_MORE) continue;
    check(r == rc, "a decided prefix stays decided", data, size);
    if (r == 0) check(t.head_len == s.head_len, "the same head", data, size);
    else check(t.status == s.status && !strcmp(t.message, s.message), "the same refusal", data, size);
  }
  free(p);
  return 0;
}
