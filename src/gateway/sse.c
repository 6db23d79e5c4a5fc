/*
 * sse.c — the framing of an upstream's Server-Sent Events stream (the
 * three APIs stream their answers as SSE): where each event ends, and its
 * data as the client's SSE reader will read it, so that the gateway judges
 * an event as the client will. Bytes in, spans out: no tree, no state;
 * chat.c's reader keeps what is not a whole event yet for the next bytes.
 * tests/fuzz/fuzz_sse.c checks it against a plain reading of the rules,
 * on bytes split anywhere.
 */
#include "gw.h"

/* Where the first event of d[0..len) ends: the offset of its blank line,
 * *sep the blank line's length ("\n\n" 2, "\r\n\r\n" 4); *sep 0: no whole
 * event yet. Found from the line ends, which an event's JSON never holds
 * but at its own end. */
static size_t event_end(const char *d, size_t len, size_t *sep) {
  *sep = 0;
  for (const char *q = d; (q = memchr(q, '\n', len - (size_t)(q - d))); q++) {
    size_t i = (size_t)(q - d);
    if (i + 1 < len && d[i + 1] == '\n') {
      *sep = 2;
      return i;
    }
    if (i >= 1 && i + 2 < len && d[i - 1] == '\r' && d[i + 1] == '\r' && d[i + 2] == '\n') {
      *sep = 4;
      return i - 1;
    }
  }
  return 0;
}

int lg__sse_next(const char *d, size_t len, lg__sse_event_t *ev, lg__buf_t *joined) {
  size_t sep = 0, end = len >= 2 ? event_end(d, len, &sep) : 0;
  if (!sep) return 0;
  ev->used = end + sep;
  ev->data = NULL;
  ev->data_len = 0;
  /* Its data lines joined by "\n", each without "data:" and the one space
   * after it (the SSE rule); one line is read in place. */
  int lines = 0;
  for (size_t i = 0; i < end;) {
    const char *nl = memchr(d + i, '\n', end - i);
    size_t k = nl ? (size_t)(nl - d) : end;
    size_t ll = k - i;
    if (ll && d[i + ll - 1] == '\r') ll--;
    if (ll >= 5 && !memcmp(d + i, "data:", 5)) {
      const char *v = d + i + 5;
      size_t vn = ll - 5;
      if (vn && *v == ' ') v++, vn--;
      if (lines == 1) { /* a second line: joined from here */
        joined->len = 0;
        lg__buf_append(joined, ev->data, ev->data_len);
      }
      if (lines) {
        lg__buf_putc(joined, '\n');
        lg__buf_append(joined, v, vn);
      } else {
        ev->data = v, ev->data_len = vn;
      }
      lines++;
    }
    i = k + 1;
  }
  if (lines > 1) {
    ev->data = joined->oom ? NULL : joined->data;
    ev->data_len = joined->oom ? 0 : joined->len;
  }
  return 1;
}
