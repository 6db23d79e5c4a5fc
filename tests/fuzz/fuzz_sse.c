/*
 * fuzz_sse.c — the framing of an upstream's SSE stream (src/gateway/sse.c,
 * lg__sse_next), on any bytes: an upstream's stream is bytes from the
 * network, and the gateway reads every event of it before the client does.
 *
 * Input: one byte seeds how the stream is cut into reads, the rest is the
 * stream.
 * Invariants:
 *   - each event lg__sse_next finds is the one a plain reading of the
 *     rules finds (written out here, a byte at a time: lines end with
 *     "\r\n", "\n" or "\r", a "\r" last not yet known to be whole;
 *     an event ends with its first empty line; its data lines, without
 *     "data:" and one space, joined by "\n"): the same end, the same
 *     data, none where it finds none;
 *   - a one-line event's data lies inside the event's own bytes;
 *   - read as the gateway reads it (each read appended to what was kept,
 *     the whole events taken from the front, the rest kept), the stream
 *     gives the same events and keeps the same rest however it is cut
 *     into reads: 1 to 64 bytes, from the seed.
 */
#include "loopguard.h"
#include "gateway/gw.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

/* The rules, a byte at a time: 1 and the event's length and data (into
 * *out, *has set when it has a data line), 0 when no event is whole. */
static int plain_next(const char *d, size_t len, size_t *used, lg__buf_t *out, int *has) {
  out->len = 0;
  *has = 0;
  size_t start = 0; /* of the line being read */
  for (size_t i = 0; i < len; i++) {
    if (d[i] != '\n' && d[i] != '\r') continue;
    size_t end = 1; /* the line end's bytes */
    if (d[i] == '\r') {
      if (i + 1 == len) return 0; /* "\r" or the first half of "\r\n": not known yet */
      if (d[i + 1] == '\n') end = 2;
    }
    size_t ll = i - start;
    if (!ll) { /* an empty line: the event ends */
      *used = i + end;
      return 1;
    }
    if (ll >= 5 && !memcmp(d + start, "data:", 5)) {
      size_t v = start + 5, vn = ll - 5;
      if (vn && d[v] == ' ') v++, vn--;
      if (*has) lg__buf_putc(out, '\n');
      lg__buf_append(out, d + v, vn);
      *has = 1;
    }
    i += end - 1;
    start = i + 1;
  }
  return 0;
}

/* The events of one reading, each as its length, a has-data byte and its
 * data, one after the other in *log; *rest what is kept at the end. */
static void read_stream(const uint8_t *data, size_t size, const char *s, size_t n, unsigned seed,
                        lg__buf_t *log, lg__buf_t *rest) {
  lg__buf_t line = {0}, joined = {0}, want = {0};
  size_t at = 0;
  while (at < n) {
    size_t take = n - at;
    if (seed) { /* a cut of 1 to 64 bytes */
      seed = seed * 1103515245u + 12345u;
      size_t cut = 1 + (seed >> 16) % 64;
      if (cut < take) take = cut;
    }
    lg__buf_append(&line, s + at, take);
    at += take;
    size_t off = 0;
    lg__sse_event_t ev;
    for (;;) {
      const char *d = line.data + off;
      size_t len = line.len - off, wused = 0;
      int has = 0, got = lg__sse_next(d, len, &ev, &joined);
      int wgot = plain_next(d, len, &wused, &want, &has);
      check(got == wgot, "an event where the rules find none, or none where they find one", data, size);
      if (!got) break;
      check(ev.used == wused, "the event ends where the rules end it", data, size);
      check(!ev.data == !has, "data where the rules find a data line, and only there", data, size);
      if (ev.data) {
        check(ev.data_len == want.len && !memcmp(ev.data, want.data, want.len),
              "the event's data is its data lines, joined", data, size);
        check((ev.data >= d && ev.data + ev.data_len <= d + ev.used) ||
                  (joined.data && ev.data == joined.data),
              "the data lies in the event, or in the joined lines", data, size);
      }
      uint64_t u = ev.used;
      lg__buf_append(log, &u, sizeof u);
      lg__buf_putc(log, ev.data ? 1 : 0);
      if (ev.data) lg__buf_append(log, ev.data, ev.data_len);
      off += ev.used;
    }
    memmove(line.data, line.data + off, line.len - off);
    line.len -= off;
  }
  if (line.len) lg__buf_append(rest, line.data, line.len);
  lg__buf_free(&line);
  lg__buf_free(&joined);
  lg__buf_free(&want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  lg__buf_t log1 = {0}, rest1 = {0}, log2 = {0}, rest2 = {0};
  read_stream(data, size, s, n, 0, &log1, &rest1);             /* in one read */
  read_stream(data, size, s, n, data[0] | 256u, &log2, &rest2); /* cut up */
  check(!log1.oom && !log2.oom && !rest1.oom && !rest2.oom, "out of memory", data, size);
  check(log1.len == log2.len && (!log1.len || !memcmp(log1.data, log2.data, log1.len)),
        "the same events however the stream is cut into reads", data, size);
  check(rest1.len == rest2.len && (!rest1.len || !memcmp(rest1.data, rest2.data, rest1.len)),
        "the same rest kept however the stream is cut into reads", data, size);
  lg__buf_free(&log1);
  lg__buf_free(&rest1);
  lg__buf_free(&log2);
  lg__buf_free(&rest2);
  return 0;
}
