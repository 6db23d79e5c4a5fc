/*
 * fuzz_http_route.c — the router and the Host check of src/server/http.c
 * on arbitrary request targets and Host values.
 *
 * Input: one byte picks the method, then the request target (any bytes).
 * Invariants:
 *   - a routed id is 1 to 1024 bytes of valid UTF-8 without control
 *     characters or NUL; a run id or a group holds no '/';
 *   - every error body is strict JSON (jansson refuses invalid UTF-8) in
 *     the documented shape, with the status as its code;
 *   - a Host the check accepts has a port of 0 to 65535, or none, and its
 *     name is localhost, a dotted 127.x.y.z or [::1].
 */
#include "loopguard.h"
#include "server/server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *methods[] = {"GET", "POST", "PUT", "DELETE"};
  if (size < 1) return 0;
  const char *method = methods[data[0] % 4];
  size_t n = size - 1;
  char *t = malloc(n ? n : 1); /* exactly n bytes: no NUL after */
  if (!t) return 0;
  memcpy(t, data + 1, n);
  /* The request line never holds a NUL (libmicrohttpd stops there). */
  size_t tn = 0;
  while (tn < n && t[tn]) tn++;
  char *id = NULL, *body = NULL;
  size_t bl = 0;
  int rc = lg__http_probe(t, tn, method, &id, &body, &bl);
  if (rc == 1) {
    check(body == NULL || bl == 0, "a routed request has no error", data, size);
    if (id) {
      size_t il = strlen(id);
      check(il >= 1 && il <= 1024, "an id is 1 to 1024 bytes", data, size);
      check(lg__utf8_valid_prefix(id, il) == il, "an id is UTF-8", data, size);
      for (size_t i = 0; i < il; i++)
        check((unsigned char)id[i] >= 0x20 && id[i] != 0x7f, "an id has no control character",
              data, size);
      const char *q = memchr(t, '?', tn);
      size_t pl = q ? (size_t)(q - t) : tn;
      if ((pl > 9 && !memcmp(t, "/v1/runs/", 9)) || (pl > 11 && !memcmp(t, "/v1/groups/", 11)))
        check(strchr(id, '/') == NULL, "a run id or group holds no '/'", data, size);
    }
  } else {
    check(rc == 400 || rc == 404 || rc == 500, "a status of the contract", data, size);
    check(body != NULL, "an error has a body", data, size);
    json_error_t je;
    json_t *j = body ? json_loadb(body, bl, JSON_REJECT_DUPLICATES, &je) : NULL;
    check(j != NULL, "the error body is strict JSON", data, size);
    json_t *e = json_object_get(j, "error");
    check(json_is_object(e) && json_integer_value(json_object_get(e, "code")) == rc &&
              json_is_string(json_object_get(e, "type")) &&
              json_is_string(json_object_get(e, "message")),
          "the error shape", data, size);
    json_decref(j);
  }
  lg__free(id);
  lg__free(body);
  /* The same bytes as a Host value. */
  long port = 0;
  if (lg__http_loopback_host(t, n, &port)) {
    check(port == -1 || (port >= 0 && port <= 65535), "a port of 0 to 65535", data, size);
    size_t nl = 0;
    if (n && t[0] == '[') {
      check(n >= 5 && !memcmp(t, "[::1]", 5), "an IPv6 loopback is [::1]", data, size);
    } else {
      while (nl < n && t[nl] != ':') nl++;
      int ok = (nl == 9 && !strncasecmp(t, "localhost", 9)) ||
               (nl == 10 && !strncasecmp(t, "localhost.", 10)) || (nl >= 7 && !memcmp(t, "127.", 4));
      check(ok, "a loopback name", data, size);
      for (size_t i = 4; ok && nl >= 7 && !strncmp(t, "127.", 4) && i < nl; i++)
        check((t[i] >= '0' && t[i] <= '9') || t[i] == '.', "a dotted address", data, size);
    }
  }
  free(t);
  return 0;
}
