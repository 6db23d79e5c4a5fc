/*
 * openapi.c — GET /openapi.json: the OpenAPI 3.1 description of the HTTP
 * API, open like /healthz (it says nothing about runs or budgets).
 *
 * The document is docs/openapi.json, turned into a C array when the
 * library is built (cmake/embed.cmake writes openapi_json.c), so the
 * server never reads a file at run time and always describes itself.
 * tests/cli/openapi.sh keeps the document and the router in step.
 */
#include "server.h"

#include <string.h>

extern const unsigned char lg__openapi_json[];
extern const size_t lg__openapi_json_len;

void lg__h_openapi(lg__req_t *rq) {
  if (lg__buf_append(&rq->out, lg__openapi_json, lg__openapi_json_len)) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  rq->status = 200;
}
