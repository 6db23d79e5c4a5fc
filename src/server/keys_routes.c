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
 * The first four are one handler (lg__h_keys), by route and method. *
 * The rules are the library's (src/budget/keys.c, lg_key_*); the router
 * has checked the operator role. A handler answers on the HTTP thread:
 * keys are managed rarely, and each call is one short transaction.
 */
#include "server.h"

#include <string.h>
#include <strings.h>

/* A key call's error: malformed JSON is 400, an unknown, rotated or
 * disabled secret 401; the rest as the budgets' (400, 404, 409, 500). */
static void key_error(lg__req_t *rq, int rc, lg_error_t *e, const char *doing) {
  if (rc == LG_EPARSE)
    lg__req_error(rq, 400, "invalid_request", NULL, "%s", e->message);
  else if (rc == LG_EPERM)
    lg__req_error(rq, 401, "unauthorized", NULL, "%s", e->message);
  else
    lg__req_budget_error(rq, rc, e, doing);
}

static void done(lg__req_t *rq, int rc, lg_error_t *e, char *out, int status,
                 const char *doing) {
  if (rc) {
    key_error(rq, rc, e, doing);
  } else {
    lg__buf_puts(&rq->out, out);
    rq->status = status;
  }
  lg_free(out);
}

/* The three operator routes: which call, by route and method. */
static int call(lg__req_t *rq, lg_store_t *s, int64_t now, char **out, lg_error_t *e) {
  int post = !strcmp(rq->method, "POST"), patch = !strcmp(rq->method, "PATCH");
  switch (rq->route) {
  case LG__RT_KEYS:
    return post ? lg_key_create(s, rq->body, rq->body_len, now, out, e)
                : lg_key_list(s, now, out, e);
  case LG__RT_KEY:
    return patch ? lg_key_update(s, rq->id, rq->body, rq->body_len, now, out, e)
                 : lg_key_show(s, rq->id, now, out, e);
  default:
    return lg_key_rotate(s, rq->id, now, out, e);
  }
}

/* A key written (created, updated, rotated) whose provider keys went into
 * the store in clear, without --secret-file: a warning naming it, in the
 * log (the moment to act: until session 41 the warning was at every
 * start, for every server without a secret, keys or not). */
static void warn_in_clear(lg__req_t *rq, const char *out) {
  json_t *o = out ? json_loads(out, 0, NULL) : NULL;
  const char *at_rest = json_string_value(json_object_get(o, "byok_at_rest"));
  if (!at_rest || strcmp(at_rest, "clear")) {
    json_decref(o);
    return;
  }
  const char *hash = json_string_value(json_object_get(o, "hash"));
  const char *name = json_string_value(json_object_get(o, "name"));
  lg__buf_t f = {0};
  lg__buf_puts(&f, "\"hash\":");
  lg__buf_json_str(&f, hash ? hash : "", hash ? strlen(hash) : 0);
  lg__buf_puts(&f, ",\"name\":");
  lg__buf_json_str(&f, name ? name : "", name ? strlen(name) : 0);
  lg__buf_puts(&f, ",\"message\":\"no --secret-file: this key's provider keys (byok) are stored in "
                   "clear in the store; give every replica the same secret file to store them "
                   "encrypted (the key is sealed the next time a server with a secret updates it)\"");
  if (!f.oom) lg__server_log(rq->srv, "warn", "byok_in_clear", f.data);
  lg__buf_free(&f);
  json_decref(o);
}

void lg__h_keys(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  char *out = NULL;
  int rc = w ? call(rq, w->store, lg__server_now(rq->srv), &out, &e) : (e.code ? e.code : LG_ESTORE);
  int created = rq->route == LG__RT_KEYS && !strcmp(rq->method, "POST");
  if (!rc && strcmp(rq->method, "GET")) warn_in_clear(rq, out);
  done(rq, rc, &e, out, created ? 201 : 200, "keys");
}

void lg__h_key_self(lg__req_t *rq) {
  const char *az = MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Authorization");
  const char *secret = lg__auth_key_secret(az);
  if (!secret) secret = lg__auth_key_value(rq->conn, 1);
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
