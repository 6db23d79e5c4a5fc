/*
 * keys_routes.c — the routes of loopguard keys (gateway-v1, "Keys"):
 *
 *   POST  /v1/keys               (operator) 201 {key, hash, ...}: the secret, once
 *   GET   /v1/keys               (operator) {keys: [...]} without secrets
 *   GET   /v1/keys/{hash}        (operator) the key with usage today, this week, this month
 *   PATCH /v1/keys/{hash}        (operator) any creation field, disabled
 *   POST  /v1/keys/{hash}/rotate (operator) {key, hash, ...}: the old secret stops at once
 *   GET   /v1/key                (the key itself as bearer) its own usage and limit
 *
 * The rules are the library's (src/budget/keys.c, lg_key_*); the router
 * has checked the operator role. A handler answers on the HTTP thread:
 * keys are managed rarely, and each call is one short transaction.
 */
#include "server.h"

#include <string.h>
#include <strings.h>

static void key_error(lg__req_t *rq, int rc, const lg_error_t *e, const char *doing) {
  char buf[1024];
  const char *msg = e->message[0] ? e->message : lg_strerror(rc);
  const char *field = e->field[0] ? e->field : NULL;
  switch (rc) {
  case LG_EINVAL:
  case LG_EPARSE:
  case LG_ERANGE:
    lg__req_error(rq, 400, "invalid_request", field, "%s", msg);
    break;
  case LG_ENOTFOUND:
    lg__req_error(rq, 404, "not_found", field, "%s", msg);
    break;
  case LG_EPERM:
    lg__req_error(rq, 401, "unauthorized", NULL, "%s", msg);
    break;
  case LG_ECONFLICT:
    lg__req_error(rq, 409, "conflict", field, "%s", msg);
    break;
  default:
    lg__req_error(rq, 500, "internal", NULL, "%s: %s", doing, lg_error_format(e, buf, sizeof buf));
  }
}

static void done(lg__req_t *rq, int rc, const lg_error_t *e, char *out, int status,
                 const char *doing) {
  if (rc) {
    key_error(rq, rc, e, doing);
  } else {
    lg__buf_puts(&rq->out, out);
    rq->status = status;
  }
  lg_free(out);
}

void lg__h_keys(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  char *out = NULL;
  int64_t now = lg__server_now(rq->srv);
  int rc = !w ? (e.code ? e.code : LG_ESTORE)
           : !strcmp(rq->method, "POST")
               ? lg_key_create(w->store, rq->body, rq->body_len, now, &out, &e)
               : lg_key_list(w->store, now, &out, &e);
  done(rq, rc, &e, out, !strcmp(rq->method, "POST") ? 201 : 200, "keys");
}

void lg__h_key(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  char *out = NULL;
  int64_t now = lg__server_now(rq->srv);
  int rc = !w ? (e.code ? e.code : LG_ESTORE)
           : !strcmp(rq->method, "PATCH")
               ? lg_key_update(w->store, rq->id, rq->body, rq->body_len, now, &out, &e)
               : lg_key_show(w->store, rq->id, now, &out, &e);
  done(rq, rc, &e, out, 200, "the key");
}

void lg__h_key_rotate(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  char *out = NULL;
  int rc = w ? lg_key_rotate(w->store, rq->id, lg__server_now(rq->srv), &out, &e)
             : (e.code ? e.code : LG_ESTORE);
  done(rq, rc, &e, out, 200, "rotating the key");
}

void lg__h_key_self(lg__req_t *rq) {
  const char *az = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Authorization");
  const char *secret = lg__auth_key_secret(az);
  if (!secret) {
    lg__req_error(rq, 401, "unauthorized", NULL,
                  "GET /v1/key needs the key itself as bearer (Authorization: Bearer lgk-...)");
    return;
  }
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  char *out = NULL;
  int rc = w ? lg_key_self(w->store, secret, lg__server_now(rq->srv), &out, &e)
             : (e.code ? e.code : LG_ESTORE);
  done(rq, rc, &e, out, 200, "the key");
}
