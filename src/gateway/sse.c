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

/* The line at d[i..len): its length, and in *term its end's (LF, CRLF
 * or CR: the SSE rule, any of the three); *term 0 when the line is not
 * whole yet (no end, or a CR last, which may be half a CRLF). Found with
 * memchr: an event's JSON holds no raw line end. */
static size_t line_at(const char *d, size_t len, size_t i, size_t *term) {
  const char *p = d + i, *lf = memchr(p, '\n', len - i);
  const char *cr = memchr(p, '\r', (size_t)((lf ? lf : d + len) - p));
  *term = 0;
  if (cr) {
    if (cr + 1 < d + len) *term = cr[1] == '\n' ? 2 : 1;
    return (size_t)(cr - p);
  }
  if (lf) *term = 1;
  return (size_t)((lf ? lf : d + len) - p);
}

int lg__sse_next(const char *d, size_t len, lg__sse_event_t *ev, lg__buf_t *joined) {
  if (!len) return 0;
  ev->data = NULL;
  ev->data_len = 0;
  /* One pass over the event's lines, to the first empty one, which ends
   * it (none yet: 0, and what was read here is read again with more
   * bytes). Its data lines joined by "\n", each without "data:" and the
   * one space after it (the SSE rule); one line is read in place. */
  int lines = 0;
  for (size_t i = 0, ll, term;; i += ll + term) {
    ll = line_at(d, len, i, &term);
    if (!term) return 0;
    if (!ll) {
      ev->used = i + term;
      break;
    }
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
  }
  if (lines > 1) {
    ev->data = joined->oom ? NULL : joined->data;
    ev->data_len = joined->oom ? 0 : joined->len;
  }
  return 1;
}
