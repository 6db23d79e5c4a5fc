/*
 * console.c — the operator's web console (GET /, /console.js,
 * /console.css) and the incident download it offers
 * (GET /v1/runs/{id}/regression).
 *
 * The console is three static files under console/, turned into byte
 * arrays at build time (cmake/embed.cmake): no file is read at run time
 * and nothing is fetched from elsewhere. The files are open (no token):
 * they hold no data; every API call the page makes carries the operator's
 * token as Authorization: Bearer, which the page keeps in sessionStorage
 * (never a cookie, so no request is ever authenticated by the browser on
 * its own and cross-site request forgery has nothing to ride on).
 *
 * Every console response carries a strict Content-Security-Policy (no
 * inline script or style, nothing but this origin), nosniff, no referrer
 * and no framing (lg__console_headers, called where answers are built).
 *
 * The regression route answers the run's trace behind its `# expect`
 * line, computed by replaying that trace: lg_expect_trace, the same code
 * as `loopguard runs export`, so the downloaded file and the exported one
 * are the same bytes.
 */
#include "server.h"

extern const unsigned char lg__asset_index_html[], lg__asset_console_js[], lg__asset_console_css[];
extern const size_t lg__asset_index_html_len, lg__asset_console_js_len, lg__asset_console_css_len;

#define LG__CONSOLE_CSP                                                                     \
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "           \
  "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

static const struct asset {
  const char *path;
  const char *type;
  const unsigned char *data;
  const size_t *len;
} assets[] = {
    {"/", "text/html; charset=utf-8", lg__asset_index_html, &lg__asset_index_html_len},
    {"/index.html", "text/html; charset=utf-8", lg__asset_index_html, &lg__asset_index_html_len},
    {"/console.js", "text/javascript; charset=utf-8", lg__asset_console_js, &lg__asset_console_js_len},
    {"/console.css", "text/css; charset=utf-8", lg__asset_console_css, &lg__asset_console_css_len},
};

static const struct asset *find(const char *path) {
  for (size_t i = 0; path && i < sizeof assets / sizeof assets[0]; i++)
    if (!strcmp(path, assets[i].path)) return &assets[i];
  return NULL;
}

int lg__console_path(const char *url) { return find(url) != NULL; }

void lg__h_console(lg__req_t *rq) {
  const struct asset *a = find(rq->id);
  if (!a) {
    lg__req_error(rq, 404, "not_found", NULL, "no such file");
    return;
  }
  lg__buf_append(&rq->out, a->data, *a->len);
  rq->content_type = a->type;
  rq->status = 200;
}

void lg__console_headers(struct MHD_Response *r, const lg__req_t *rq) {
  if (rq->route != LG__RT_CONSOLE) return;
  MHD_add_response_header(r, "Content-Security-Policy", LG__CONSOLE_CSP);
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(r, "X-Frame-Options", "DENY");
  MHD_add_response_header(r, "Cache-Control", "no-cache");
}

void lg__h_regression(lg__req_t *rq) {
  const char *id = rq->id;
  size_t n = id ? strlen(id) : 0;
  bool ok = n > 0 && n <= 1024;
  for (size_t i = 0; ok && i < n; i++)
    if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f) ok = false;
  if (!ok) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return;
  }
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  if (!w) {
    lg__req_store_error(rq, e.code ? e.code : LG_ESTORE, &e, "the store cannot be opened");
    return;
  }
  char *trace = NULL, *test = NULL;
  size_t len = 0, tlen = 0;
  int rc = lg_store_run_trace(w->store, id, &trace, &len, &e);
  if (rc == LG_ENOTFOUND) {
    lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", id);
    return;
  }
  if (rc) { /* the store's failure, not the trace's */
    lg__free(trace);
    lg__req_store_error(rq, rc, &e, "reading the run's trace");
    return;
  }
  rc = lg_expect_trace(id, trace, len, NULL, &test, &tlen, &e);
  lg__free(trace);
  if (rc) {
    char buf[1024];
    lg__req_error(rq, rc == LG_ENOMEM ? 500 : rc == LG_ETRACE || rc == LG_EPOLICY ? 422 : 500,
                  rc == LG_ENOMEM || (rc != LG_ETRACE && rc != LG_EPOLICY) ? "internal" : "unprocessable",
                  NULL, "the run's trace does not replay: %s", lg_error_format(&e, buf, sizeof buf));
    return;
  }
  lg__buf_append(&rq->out, test, tlen);
  lg__free(test);
  rq->content_type = "application/x-ndjson";
  rq->status = 200;
}
