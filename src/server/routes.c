/*
 * routes.c — the endpoints of http-api-v1.
 *
 * Every decision for a run (calls, results, state, handoffs, model calls,
 * usage, cancel) is made the same way, in decide_locked() below, called by
 * lg_store_with_run() with the run's row locked (one transaction):
 *
 *   1. load the run from its record: the engine state (lg_run_load) with
 *      the policy parsed from the stored policy JSON (a shared cache: most
 *      runs have the default), and the store's ledger at the run's start
 *      (lg_store_ledger_at), so /calls use the durable ledger by itself;
 *   2. the run's time: now minus its creation, never before the last event
 *      the run saw (clocks of replicas differ; a trace must not go back);
 *   3. the kill switch: a deny rule for the run or its group stops it
 *      (lg_run_cancel with the operator's reason) before anything else;
 *   4. decide (lg_run_before / _after / _state / _handoff / _model /
 *      _usage / _cancel);
 *   5. save the run (lg_store_run_put) and append the event's trace-v1
 *      line, in the same transaction;
 *   6. build the answer while the decision's borrowed strings are alive.
 * The answer is sent only after the transaction committed. If anything
 * fails nothing is written, the answer is an error, and the client may
 * send the event again: so a kill -9 loses no acknowledged decision, and
 * replicas on one PostgreSQL answer as one server would.
 *
 * Events for a run that has already stopped change nothing: the answer is
 * the stop, and neither the store nor the trace is written.
 *
 * The trace lines are the events exactly as the engine was given them
 * (the call_id and turn the server assigned, the run's t_ms), so replaying
 * GET /v1/runs/{id}/trace gives the same decisions. A model call is
 * written with its worst case (what was decided on); its usage is written
 * as an internal "usage" line, folded into the model line when the trace
 * is read (see fold_usage()).
 */
#include "../store/store.h" /* lg__store_deny: the group kill switch */
#include "server.h"

#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ */
/* Small helpers.                                                      */

static void jstr(lg__buf_t *b, const char *s) {
  if (s) lg__buf_json_str(b, s, strlen(s));
  else lg__buf_puts(b, "null");
}

/* A key and a string value, when the value is not NULL. */
static void kv_str(lg__buf_t *b, const char *k, const char *v) {
  if (!v) return;
  lg__buf_printf(b, ",\"%s\":", k);
  lg__buf_json_str(b, v, strlen(v));
}

/* Answers with the text j (new; freed here) and `status`, or 500 when j
 * is NULL (what a *_json() function returns out of memory). */
static void answer_text(lg__req_t *rq, char *j, int status) {
  if (!j) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  lg__buf_puts(&rq->out, j);
  lg__free(j);
  rq->status = status;
}

static bool valid_id(const char *s) {
  if (!s || !*s) return false;
  size_t n = strlen(s);
  if (n > 1024) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return false;
  return true;
}

static int bad_body(lg__req_t *rq, int rc, const lg_error_t *e) {
  if (rc == LG_ENOMEM) return lg__req_error(rq, 500, "internal", NULL, "out of memory");
  return lg__req_error(rq, 400, "invalid_request", e->field, "%s", e->message);
}

static int parse(lg__req_t *rq, lg__body_kind_t kind, lg__body_t *b) {
  lg_error_t e = {0};
  int rc = lg__body_parse(kind, rq->body, rq->body_len, b, &e);
  if (rc) bad_body(rq, rc, &e);
  return rc;
}

/* Logs an internal error (the client gets a 500 with the same text). */
static void log_error(lg_server_t *srv, const lg__req_t *rq, const lg_error_t *e, int rc) {
  lg__buf_t f = {0};
  char buf[1024];
  lg__buf_puts(&f, "\"route\":");
  jstr(&f, lg__route_name(rq->route));
  if (rq->id) {
    lg__buf_puts(&f, ",\"id\":");
    jstr(&f, rq->id);
  }
  lg__buf_printf(&f, ",\"code\":\"%s\",\"message\":", lg_err_name(rc));
  jstr(&f, e && e->message[0] ? lg_error_format(e, buf, sizeof buf) : lg_strerror(rc));
  if (!f.oom) lg__server_log(srv, "error", "request_failed", f.data);
  lg__buf_free(&f);
}

/* Answers a store error: what was asked was not done (nothing stored). */
static int store_error(lg__req_t *rq, int rc, const lg_error_t *e, const char *what) {
  char buf[1024];
  const char *msg = e && e->message[0] ? lg_error_format(e, buf, sizeof buf) : lg_strerror(rc);
  switch (rc) {
  case LG_ENOTFOUND: return lg__req_error(rq, 404, "not_found", NULL, "%s: %s", what, msg);
  case LG_ECONFLICT: return lg__req_error(rq, 409, "conflict", NULL, "%s: %s", what, msg);
  case LG_EINVAL: return lg__req_error(rq, 400, "invalid_request", e ? e->field : NULL, "%s", msg);
  default:
    log_error(rq->srv, rq, e, rc);
    return lg__req_error(rq, 500, "internal", NULL,
                         "%s: %s (nothing was decided or stored; it is safe to retry)", what,
                         rc == LG_EBUSY ? "the store was busy" : msg);
  }
}

static lg__worker_t *worker(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  if (!w) store_error(rq, e.code ? e.code : LG_ESTORE, &e, "the store cannot be opened");
  return w;
}

static void counters_json(lg__buf_t *b, const lg_counters_t *c) {
  lg__buf_printf(b,
                 "{\"steps\":%lld,\"calls\":%lld,\"blocked\":%lld,\"replayed\":%lld,"
                 "\"results\":%lld,\"model_calls\":%lld,\"tokens\":%lld,\"handoffs\":%lld,"
                 "\"cost_usd\":",
                 (long long)c->steps, (long long)c->calls, (long long)c->blocked,
                 (long long)c->replayed, (long long)c->results, (long long)c->model_calls,
                 (long long)c->tokens, (long long)c->handoffs);
  lg__buf_usd(b, c->cost_nusd);
  lg__buf_printf(b, ",\"elapsed_ms\":%lld}", (long long)c->last_t_ms);
}

static const char *alt_names[] = {"ask_human", "skip_current", "finalize_partial",
                                  "escalate_model"};

static void alternatives_json(lg__buf_t *b, unsigned alts) {
  lg__buf_puts(b, ",\"alternatives\":[");
  int first = 1;
  for (int i = 0; i < 4; i++)
    if (alts & (1u << i)) {
      lg__buf_printf(b, "%s\"%s\"", first ? "" : ",", alt_names[i]);
      first = 0;
    }
  lg__buf_putc(b, ']');
}

/* ------------------------------------------------------------------ */
/* Creating runs.                                                      */

/* A new run id: "run_" and 24 random hex digits. */
static int new_run_id(char out[32]) {
  unsigned char r[12];
  if (RAND_bytes(r, sizeof r) != 1) return LG_EIO;
  static const char hx[] = "0123456789abcdef";
  memcpy(out, "run_", 4);
  for (int i = 0; i < 12; i++) {
    out[4 + 2 * i] = hx[r[i] >> 4];
    out[5 + 2 * i] = hx[r[i] & 15];
  }
  out[28] = 0;
  return 0;
}

/* The progress_version of a run's trace line, if the trace log has it:
 * 1 found (*pv set, *has), 0 not known. */
static int logged_checkpoint(lg_store_t *s, const char *run_id, int *has, int64_t *pv) {
  lg__buf_t b = {0};
  lg_error_t e = {0};
  int known = 0;
  if (!lg__store_events_read(s, run_id, &b, &e) && b.len) {
    char *nl = memchr(b.data, '\n', b.len);
    json_t *ev = json_loadb(b.data, nl ? (size_t)(nl - b.data) : b.len, 0, NULL);
    const char *type = ev ? json_string_value(json_object_get(ev, "type")) : NULL;
    if (type && !strcmp(type, "run")) {
      json_t *v = json_object_get(ev, "progress_version");
      *has = json_is_integer(v);
      *pv = *has ? (int64_t)json_integer_value(v) : 0;
      known = 1;
    }
    json_decref(ev);
  }
  lg__buf_free(&b);
  return known;
}

static void run_created_answer(lg__req_t *rq, const char *run_id, const char *group,
                               const char *policy_json, int status) {
  rq->status = status;
  lg__buf_puts(&rq->out, "{\"run_id\":");
  jstr(&rq->out, run_id);
  if (group) kv_str(&rq->out, "group", group);
  lg__buf_puts(&rq->out, ",\"policy\":");
  lg__buf_puts(&rq->out, policy_json);
  lg__buf_putc(&rq->out, '}');
}

void lg__h_run_create(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  lg__body_t b;
  if (parse(rq, LG__B_RUN, &b)) return;
  char idbuf[32];
  const char *run_id = b.run_id;
  lg_policy_t *pol = NULL;
  char *pjson = NULL, *state = NULL, *env = NULL;
  lg_run_t *run = NULL;
  lg_error_t e = {0};
  lg__buf_t line = {0};
  if (!run_id) {
    if (new_run_id(idbuf)) {
      lg__req_error(rq, 500, "internal", NULL, "no randomness for a run id");
      goto out;
    }
    run_id = idbuf;
  } else if (strchr(run_id, '/')) {
    lg__req_error(rq, 400, "invalid_request", "run_id", "run_id: must not contain '/'");
    goto out;
  }
  if (b.policy) {
    size_t len;
    char *text = lg__json_text(b.policy, &len);
    if (!text) {
      lg__req_error(rq, 500, "internal", NULL, "out of memory");
      goto out;
    }
    pol = lg_policy_parse(text, len, "policy", &e);
    lg__free(text);
    if (!pol) {
      char field[160];
      snprintf(field, sizeof field, "policy%s%s", e.field[0] ? "." : "", e.field);
      if (e.code == LG_ENOMEM) lg__req_error(rq, 500, "internal", NULL, "out of memory");
      else lg__req_error(rq, 400, "invalid_request", field, "%s: %s", field, e.message);
      goto out;
    }
    pjson = lg_policy_to_json(pol);
  } else {
    pol = lg_policy_ref(srv->default_policy);
    pjson = lg__strdup(srv->default_policy_json);
  }
  if (!pjson) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    goto out;
  }
  run = lg_run_new(run_id, b.group, pol, b.has_progress_version ? &b.progress_version : NULL,
                   NULL, &e);
  size_t state_len = 0;
  if (!run || lg_run_save(run, &state, &state_len)) {
    if (e.code && e.code != LG_ENOMEM) lg__req_error(rq, 400, "invalid_request", e.field, "%s", e.message);
    else lg__req_error(rq, 500, "internal", NULL, "out of memory");
    goto out;
  }
  lg__worker_t *w = worker(rq);
  if (!w) goto out;
  /* A run may name the shared budgets its model calls reserve against;
   * they must exist (a typo must not leave a run unguarded). */
  const char *scopes[16];
  size_t nscopes = b.scopes ? json_array_size(b.scopes) : 0;
  for (size_t k = 0; k < nscopes; k++) scopes[k] = json_string_value(json_array_get(b.scopes, k));
  if (nscopes) {
    int src = lg_budget_scopes_check(w->store, scopes, nscopes, &e);
    if (src == LG_ENOTFOUND) {
      lg__req_error(rq, 404, "not_found", "scopes", "scopes: %s", e.message);
      goto out;
    }
    if (src == LG_EINVAL) {
      lg__req_error(rq, 400, "invalid_request", "scopes", "scopes: %s", e.message);
      goto out;
    }
    if (src) {
      store_error(rq, src, &e, "checking the scopes");
      goto out;
    }
  }
  int64_t now = lg__server_now(srv);
  /* No envelope while the run is active (see decide_locked). */
  lg_run_record_t rec = {(char *)run_id, (char *)b.group, 0, NULL, pjson, state, state_len, NULL,
                         now, now};
  /* The trace starts with the run: its effective policy and checkpoint. */
  lg__buf_puts(&line, "{\"type\":\"run\",\"run_id\":");
  jstr(&line, run_id);
  kv_str(&line, "group", b.group);
  if (b.has_progress_version)
    lg__buf_printf(&line, ",\"progress_version\":%lld", (long long)b.progress_version);
  lg__buf_puts(&line, ",\"policy\":");
  lg__buf_puts(&line, pjson);
  lg__buf_puts(&line, ",\"t_ms\":0}\n");
  if (line.oom) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    goto out;
  }
  /* The run, its scopes and its first trace line: all or nothing. */
  const char *failed = "creating the run";
  lg__store_lock(w->store);
  int rc = lg__store_begin(w->store, LG__TXN_RUN, &e);
  if (!rc) {
    rc = lg_store_run_create(w->store, &rec, &e);
    if (!rc && nscopes && (rc = lg_budget_run_scopes_set(w->store, run_id, scopes, nscopes, &e)))
      failed = "saving the run's scopes";
    if (!rc && (rc = lg__store_events_append(w->store, run_id, line.data, line.len, &e)))
      failed = "writing the run's trace";
    int erc = lg__store_end(w->store, rc == 0, &e);
    if (!rc) rc = erc;
  }
  lg__store_unlock(w->store);
  if (rc == LG_ECONFLICT) {
    /* Already there: the same body again is the same answer (a client's
     * retry), anything else a conflict. */
    lg_run_record_t old = {0};
    lg_error_t e2 = {0};
    rc = lg_store_run_get(w->store, run_id, &old, &e2);
    if (rc) {
      store_error(rq, rc, &e2, "reading the existing run");
      goto out;
    }
    int has_pv = 0;
    int64_t pv = 0;
    int same = ((!old.group && !b.group) || (old.group && b.group && !strcmp(old.group, b.group))) &&
               old.policy_json && !strcmp(old.policy_json, pjson);
    if (same && logged_checkpoint(w->store, run_id, &has_pv, &pv))
      same = has_pv == b.has_progress_version && (!has_pv || pv == b.progress_version);
    if (same) run_created_answer(rq, run_id, old.group, old.policy_json, 200);
    else
      lg__req_error(rq, 409, "conflict", "run_id",
                    "run_id: run \"%s\" already exists with a different group, policy or "
                    "progress_version",
                    run_id);
    lg_run_record_clear(&old);
    goto out;
  }
  if (rc) {
    store_error(rq, rc, &e, failed);
    goto out;
  }
  atomic_fetch_add(&srv->metrics.runs_active, 1);
  run_created_answer(rq, run_id, b.group, pjson, 201);
out:
  lg__buf_free(&line);
  lg_run_free(run);
  lg_policy_free(pol);
  lg__free(pjson);
  lg__free(state);
  lg__free(env);
  lg__body_clear(&b);
}

/* ------------------------------------------------------------------ */
/* Reading runs.                                                       */

/* The stored run of the path's id, for the GET handlers: the thread's
 * worker, or NULL once the error (404, or the store's) is answered. */
static lg__worker_t *read_run(lg__req_t *rq, lg_run_record_t *rec) {
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return NULL;
  }
  lg__worker_t *w = worker(rq);
  if (!w) return NULL;
  lg_error_t e = {0};
  int rc = lg_store_run_get(w->store, rq->id, rec, &e);
  if (rc == LG_ENOTFOUND) lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
  else if (rc) store_error(rq, rc, &e, "reading the run");
  return rc ? NULL : w;
}

void lg__h_run_get(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  lg_run_record_t rec = {0};
  lg_error_t e = {0};
  lg__worker_t *w = read_run(rq, &rec);
  if (!w) return;
  lg_counters_t c;
  memset(&c, 0, sizeof c);
  lg_policy_t *pol = lg__server_policy(srv, rec.policy_json, &e);
  lg_run_t *run = pol && rec.state ? lg_run_load(rec.state, rec.state_len, pol, NULL, &e) : NULL;
  if (run) lg_run_counters(run, &c);
  char created[32], updated[32];
  lg__store_time(rec.created_ms, created);
  lg__store_time(rec.updated_ms, updated);
  lg__buf_t *b = &rq->out;
  lg__buf_puts(b, "{\"run_id\":");
  jstr(b, rec.run_id);
  lg__buf_puts(b, ",\"group\":");
  jstr(b, rec.group);
  lg__buf_printf(b, ",\"status\":\"%s\",\"terminal_reason\":", rec.stopped ? "stopped" : "active");
  jstr(b, rec.terminal_reason);
  lg__buf_printf(b, ",\"created_at\":\"%s\",\"updated_at\":\"%s\",\"counters\":", created, updated);
  counters_json(b, &c);
  lg__buf_puts(b, ",\"envelope\":");
  char *env = run ? lg_run_envelope_json(run) : NULL;
  lg__buf_puts(b, env ? env : rec.envelope_json && *rec.envelope_json ? rec.envelope_json : "null");
  lg__buf_putc(b, '}');
  rq->status = 200;
  lg__free(env);
  lg_run_free(run);
  lg_policy_free(pol);
  lg_run_record_clear(&rec);
}

typedef struct list_ctx {
  lg__buf_t *b;   /* the answer */
  int n;          /* runs written */
  const char *unknown; /* the first unknown query parameter */
} list_ctx_t;

static enum MHD_Result list_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value) {
  (void)kind;
  (void)value;
  list_ctx_t *lc = cls;
  if (strcmp(key, "status") && strcmp(key, "reason") && strcmp(key, "limit") &&
      strcmp(key, "group")) {
    lc->unknown = key;
    return MHD_NO;
  }
  return MHD_YES;
}

static int list_cb(void *ud, const lg_run_record_t *rec) {
  list_ctx_t *lc = ud;
  char *j = lg_run_record_to_json(rec);
  if (!j) return LG_ENOMEM;
  if (lc->n++) lg__buf_putc(lc->b, ',');
  lg__buf_puts(lc->b, j);
  lg__free(j);
  return lc->b->oom ? LG_ENOMEM : 0;
}

void lg__h_run_list(lg__req_t *rq) {
  list_ctx_t lc = {&rq->out, 0, NULL};
  MHD_get_connection_values(rq->conn, MHD_GET_ARGUMENT_KIND, list_arg, &lc);
  if (lc.unknown) {
    lg__req_error(rq, 400, "invalid_request", lc.unknown,
                  "%s: unknown query parameter (known: status, reason, group, limit)", lc.unknown);
    return;
  }
  lg_run_filter_t f = {0};
  f.status = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "status");
  f.reason = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "reason");
  f.group = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "group");
  const char *limit = MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, "limit");
  f.limit = 100;
  if (f.status && strcmp(f.status, "active") && strcmp(f.status, "stopped")) {
    lg__req_error(rq, 400, "invalid_request", "status", "status: expected \"active\" or \"stopped\"");
    return;
  }
  if (f.reason && !*f.reason) f.reason = NULL;
  if (f.group && !*f.group) f.group = NULL;
  if (limit) {
    char *end;
    long v = strtol(limit, &end, 10);
    if (!*limit || *end || v < 1 || v > 10000) {
      lg__req_error(rq, 400, "invalid_request", "limit", "limit: expected a number from 1 to 10000");
      return;
    }
    f.limit = (size_t)v;
  }
  lg__worker_t *w = worker(rq);
  if (!w) return;
  lg_error_t e = {0};
  lg__buf_puts(&rq->out, "{\"runs\":[");
  int rc = lg_store_run_list(w->store, &f, list_cb, &lc, &e);
  if (rc) {
    store_error(rq, rc, &e, "listing runs");
    return;
  }
  lg__buf_puts(&rq->out, "]}");
  rq->status = 200;
}

/* ------------------------------------------------------------------ */
/* Decisions.                                                          */

/* Everything one decision needs and produces. */
typedef struct dctx {
  lg_server_t *srv;
  lg__worker_t *w;
  lg_canon_t *canon;      /* scratch of the thread that decides */
  lg__route_t route;      /* which event */
  const lg__body_t *b;    /* its body */
  const char *args;       /* calls: args as compact JSON */
  size_t args_len;
  const char *value;      /* results: value as compact JSON, or NULL */
  size_t value_len;
  const char *world;      /* state: world as compact JSON */
  size_t world_len;
  int64_t now;            /* the server's clock, epoch ms */
  const char *cancel_reason; /* cancel: the operator's reason, or NULL */
  /* the outcome */
  int client_status;      /* an error answer decided inside, or 0 */
  char client_type[24];
  char client_field[128];
  char client_msg[600];
  int stopped_now;        /* this event stopped the run */
  int was_stopped;        /* the run had stopped before it */
  lg_action_t action;     /* the decision, for metrics and logs */
  lg_reason_t reason;
  int ledger_outcome;     /* an lg_claim_outcome_t, or -1 */
  lg__buf_t resp;         /* the answer's body */
  lg__buf_t line;         /* the trace line */
  lg__buf_t stop_log;     /* fields of the stop's log line */
  char *client_body;      /* a whole error answer (a budget's refusal), or NULL */
  int retry_after;        /* with a 429: seconds for Retry-After */
  char *budget_meta;      /* a stop by a shared budget: its refusal metadata */
} dctx_t;

static int client_error(dctx_t *x, int status, const char *type, const lg_error_t *e,
                        const char *fallback) {
  x->client_status = status;
  snprintf(x->client_type, sizeof x->client_type, "%s", type);
  snprintf(x->client_field, sizeof x->client_field, "%s", e ? e->field : "");
  snprintf(x->client_msg, sizeof x->client_msg, "%s",
           e && e->message[0] ? e->message : fallback);
  return LG_ECONFLICT; /* any non-zero: the transaction is rolled back */
}

/* Maps an engine error: the event was malformed or does not fit the
 * run's state (nothing changed in the run). Store errors pass through. */
static int engine_error(dctx_t *x, int rc, const lg_error_t *e) {
  switch (rc) {
  case LG_EINVAL:
  case LG_EPARSE:
  case LG_EDEPTH:
  case LG_ERANGE:
  case LG_EUTF8:
  case LG_EDUPKEY:
  case LG_ETOOBIG: return client_error(x, 400, "invalid_request", e, lg_strerror(rc));
  case LG_ENOTFOUND:
  case LG_ESTATE: return client_error(x, 409, "conflict", e, lg_strerror(rc));
  default: return rc;
  }
}

static void line_t(lg__buf_t *l, int64_t t) { lg__buf_printf(l, ",\"t_ms\":%lld}\n", (long long)t); }

/* The answer to a decision. */
static void decision_json(dctx_t *x, lg_run_t *run, const lg_decision_t *d) {
  lg__buf_t *b = &x->resp;
  lg__buf_putc(b, '{');
  if (x->route == LG__RT_CALLS || x->route == LG__RT_RESULTS) {
    lg__buf_puts(b, "\"call_id\":");
    jstr(b, d->call_id ? d->call_id : x->b->call_id);
    lg__buf_putc(b, ',');
  }
  lg__buf_printf(b, "\"action\":\"%s\"", lg_action_name(d->action));
  const char *why = d->reason_text && *d->reason_text ? d->reason_text : NULL;
  if (!why && d->reason != LG_R_NONE) why = lg_reason_name(d->reason);
  kv_str(b, "reason", why);
  if (d->guard && *d->guard) kv_str(b, "guard", d->guard);
  if (x->route == LG__RT_CALLS && d->fingerprint[0]) { /* none: stopped by a deny rule */
    lg__buf_printf(b, ",\"fingerprint\":\"%s\",\"repeat\":%u", d->fingerprint, d->repeat);
    kv_str(b, "idempotency_key", d->idempotency_key);
  }
  kv_str(b, "message", d->message);
  if (d->hide_tool) {
    lg__buf_puts(b, ",\"hide_tools\":[");
    jstr(b, d->hide_tool);
    lg__buf_printf(b, "],\"hide_turns\":%u", d->hide_turns);
  }
  if (d->alternatives && d->action != LG_ACT_EXECUTE) alternatives_json(b, d->alternatives);
  if (d->action == LG_ACT_REPLAY) {
    lg__buf_puts(b, ",\"saved_result\":");
    if (d->saved_result && d->saved_result_len) lg__buf_append(b, d->saved_result, d->saved_result_len);
    else lg__buf_puts(b, "null");
  }
  if (x->route == LG__RT_MODEL && d->action == LG_ACT_EXECUTE)
    lg__buf_printf(b, ",\"reservation_id\":\"%lld\"", (long long)d->reservation);
  if (d->action == LG_ACT_STOP && x->budget_meta) {
    lg__buf_puts(b, ",\"metadata\":");
    lg__buf_puts(b, x->budget_meta);
  }
  if (d->action == LG_ACT_STOP) {
    lg__buf_printf(b, ",\"next_allowed_action\":\"%s\",\"envelope\":",
                   lg_next_name(d->next_allowed_action));
    char *env = lg_run_envelope_json(run);
    lg__buf_puts(b, env ? env : "null");
    lg__free(env);
  }
  lg__buf_putc(b, '}');
}

/* The fields of the log line of a stop. */
static void stop_fields(dctx_t *x, const char *run_id, const lg_decision_t *d) {
  lg__buf_t *f = &x->stop_log;
  lg__buf_puts(f, "\"run_id\":");
  jstr(f, run_id);
  lg__buf_puts(f, ",\"reason\":");
  jstr(f, d->reason_text && *d->reason_text ? d->reason_text : lg_reason_name(d->reason));
  lg__buf_puts(f, ",\"guard\":");
  jstr(f, d->guard && *d->guard ? d->guard : NULL);
  lg__buf_puts(f, ",\"tool\":");
  jstr(f, x->route == LG__RT_CALLS ? x->b->tool : NULL);
  lg__buf_puts(f, ",\"call_id\":");
  jstr(f, d->call_id);
  lg__buf_puts(f, ",\"on\":");
  jstr(f, lg__route_name(x->route));
  lg__buf_puts(f, ",\"message\":");
  jstr(f, d->message);
}

/* Parses "N" (a reservation id as /model answered it); 0 for none. */
static int64_t reservation_of(const char *s) {
  if (!s) return 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  return (*s && !*end && v > 0) ? (int64_t)v : -1;
}

/* The decision, under the run's lock: see the top of the file. */
static int decide_locked(void *ud, lg_store_t *s, const lg_run_record_t *rec) {
  dctx_t *x = ud;
  lg_server_t *srv = x->srv;
  const lg__body_t *b = x->b;
  lg_error_t e = {0};
  int rc = 0;
  lg_run_t *run = NULL;
  lg_ledger_t *ledger = NULL;
  char *state = NULL, *env = NULL, *why = NULL;
  lg_policy_t *pol = lg__server_policy(srv, rec->policy_json, &e);
  if (!pol) return e.code ? e.code : LG_ENOMEM;
  ledger = lg_store_ledger_at(s, rec->created_ms);
  if (!ledger) {
    lg_policy_free(pol);
    return lg__err(&e, LG_ENOMEM, NULL, -1, "out of memory");
  }
  run = rec->state ? lg_run_load(rec->state, rec->state_len, pol, ledger, &e) : NULL;
  lg_policy_free(pol);
  if (!run) {
    rc = e.code && e.code != LG_EINVAL ? e.code : LG_ESTATE;
    goto out;
  }
  lg_counters_t c0;
  lg_run_counters(run, &c0);
  int64_t t = x->now - rec->created_ms;
  if (t < c0.last_t_ms) t = c0.last_t_ms;
  if (t < 0) t = 0;
  x->was_stopped = lg_run_stopped(run);
  lg_decision_t d;
  memset(&d, 0, sizeof d);
  lg__buf_t *l = &x->line;
  int cancelled = 0;
  if (!x->was_stopped && x->route != LG__RT_RUN_CANCEL) {
    int den = lg_store_denied(s, rec->run_id, rec->group, &why, &e);
    if (den < 0) {
      rc = den;
      goto out;
    }
    if (den) { /* the kill switch, before anything else */
      lg_run_cancel(run, why, t, &d);
      lg__buf_puts(l, "{\"type\":\"cancel\"");
      kv_str(l, "reason", why);
      line_t(l, t);
      cancelled = 1;
    }
  }
  if (!cancelled) {
    switch (x->route) {
    case LG__RT_CALLS: {
      lg_call_t call;
      memset(&call, 0, sizeof call);
      call.tool = b->tool;
      call.args = x->args;
      call.args_len = x->args_len;
      call.turn = b->has_turn ? b->turn : c0.calls + 1; /* a turn of its own */
      call.call_id = b->call_id;
      call.idempotency_key = b->idempotency_key;
      call.agent = b->agent;
      call.t_ms = t;
      if ((rc = lg_run_before(run, x->canon, &call, &d, &e))) {
        rc = engine_error(x, rc, &e);
        goto out;
      }
      lg__buf_printf(l, "{\"type\":\"call\",\"turn\":%lld,\"tool\":", (long long)call.turn);
      jstr(l, b->tool);
      lg__buf_puts(l, ",\"args\":");
      lg__buf_append(l, x->args, x->args_len);
      kv_str(l, "call_id", d.call_id);
      kv_str(l, "idempotency_key", b->idempotency_key);
      kv_str(l, "agent", b->agent);
      line_t(l, t);
      if (d.idempotency_key && !x->was_stopped) {
        if (d.action == LG_ACT_EXECUTE) x->ledger_outcome = LG_CLAIM_CLAIMED;
        else if (d.action == LG_ACT_REPLAY) x->ledger_outcome = LG_CLAIM_REPLAY;
        else if (d.reason == LG_R_IN_PROGRESS) x->ledger_outcome = LG_CLAIM_IN_PROGRESS;
        else if (d.reason == LG_R_IDEMPOTENCY_MISMATCH) x->ledger_outcome = LG_CLAIM_MISMATCH;
        else if (d.reason == LG_R_UNKNOWN_OUTCOME) x->ledger_outcome = LG_CLAIM_UNKNOWN_OUTCOME;
      }
      break;
    }
    case LG__RT_RESULTS: {
      lg_result_t res;
      memset(&res, 0, sizeof res);
      res.call_id = b->call_id;
      res.status = b->status ? lg_status_parse(b->status, strlen(b->status)) : LG_STATUS_INVALID;
      res.has_progress_version = b->has_progress_version;
      res.progress_version = b->progress_version;
      res.side_effect_committed = b->side_effect_committed;
      res.retry_after_ms = b->retry_after_ms;
      res.value_kind = LG_VALUE_ABSENT;
      if (b->value) {
        res.value = x->value;
        res.value_len = x->value_len;
        res.value_kind = LG_VALUE_PRESENT;
        if (json_is_null(b->value)) {
          res.value_kind = LG_VALUE_NULL;
        } else if (json_is_string(b->value)) {
          /* Blank: white space only, as the trace reader sees it in the
           * JSON text written below (space, \t, \n, \r). */
          const char *v = json_string_value(b->value);
          size_t n = json_string_length(b->value), k = 0;
          while (k < n && (v[k] == ' ' || v[k] == '\t' || v[k] == '\n' || v[k] == '\r')) k++;
          if (k == n) res.value_kind = LG_VALUE_BLANK;
        }
      }
      res.operation_id = b->operation_id;
      res.t_ms = t;
      if ((rc = lg_run_after(run, &res, &d, &e))) {
        rc = engine_error(x, rc, &e);
        goto out;
      }
      lg__buf_puts(l, "{\"type\":\"result\"");
      kv_str(l, "call_id", d.call_id);
      kv_str(l, "status", b->status);
      if (b->has_progress_version)
        lg__buf_printf(l, ",\"progress_version\":%lld", (long long)b->progress_version);
      if (b->side_effect_committed >= 0)
        lg__buf_printf(l, ",\"side_effect_committed\":%s", b->side_effect_committed ? "true" : "false");
      if (b->retry_after_ms >= 0)
        lg__buf_printf(l, ",\"retry_after_ms\":%lld", (long long)b->retry_after_ms);
      if (b->value) {
        lg__buf_puts(l, ",\"value\":");
        lg__buf_append(l, x->value, x->value_len);
      }
      kv_str(l, "operation_id", b->operation_id);
      line_t(l, t);
      break;
    }
    case LG__RT_STATE:
      if ((rc = lg_run_state(run, x->canon, x->world, x->world_len, t, &d, &e))) {
        rc = engine_error(x, rc, &e);
        goto out;
      }
      lg__buf_puts(l, "{\"type\":\"state\",\"world\":");
      lg__buf_append(l, x->world, x->world_len);
      line_t(l, t);
      break;
    case LG__RT_HANDOFFS:
      if ((rc = lg_run_handoff(run, b->from, b->to, t, &d, &e))) {
        rc = engine_error(x, rc, &e);
        goto out;
      }
      lg__buf_puts(l, "{\"type\":\"handoff\"");
      kv_str(l, "from", b->from);
      kv_str(l, "to", b->to);
      line_t(l, t);
      break;
    case LG__RT_MODEL: {
      lg_model_call_t m;
      memset(&m, 0, sizeof m);
      m.model = b->model;
      m.turn = b->has_turn ? b->turn : 0;
      m.input_tokens = b->input_tokens;
      m.max_tokens = b->max_tokens;
      m.output_tokens = -1; /* unknown before the call */
      m.cost_nusd = b->has_cost ? b->cost_nusd : -1;
      m.t_ms = t;
      /* The spend gate: the run's caps, the prices, and the shared budgets
       * of the run's scopes, all before the call (src/budget/gate.c). */
      lg_budget_gate_t gate;
      memset(&gate, 0, sizeof gate);
      lg_prices_t *prices = lg_price_book_get(srv->prices);
      rc = lg_budget_model(s, prices, run, &m, 0, x->now, &d, &gate, &e);
      lg_prices_free(prices);
      if (rc == LG_BUDGET_REFUSED) { /* too much in flight: 429, nothing changed */
        lg__metrics_budget_refusal(&srv->metrics, gate.refusal.limit_source);
        x->client_status = gate.refusal.http_status;
        x->retry_after = (int)gate.refusal.retry_after_s;
        x->client_body = lg_budget_refusal_json(&gate.refusal);
        rc = LG_ECONFLICT; /* roll back */
        goto out;
      }
      if (rc == LG_ENOTFOUND || (rc == LG_EINVAL && !strcmp(e.field, "max_tokens"))) {
        rc = client_error(x, 422, "unprocessable", &e, "no price for this model");
        goto out;
      }
      if (rc) {
        rc = engine_error(x, rc, &e);
        goto out;
      }
      if (gate.refused) {
        lg__metrics_budget_refusal(&srv->metrics, gate.refusal.limit_source);
        x->budget_meta = lg_budget_refusal_metadata_json(&gate.refusal);
      }
      if (gate.worst_nusd >= 0 && !b->has_cost) { /* replay holds what was held */
        m.cost_nusd = gate.worst_nusd;
      }
      /* What was decided on: the worst case. output_tokens = max_tokens
       * makes replay hold what the server holds until the usage comes. */
      lg__buf_puts(l, "{\"type\":\"model\"");
      if (b->has_turn) lg__buf_printf(l, ",\"turn\":%lld", (long long)b->turn);
      kv_str(l, "model", b->model);
      lg__buf_printf(l, ",\"input_tokens\":%lld", (long long)b->input_tokens);
      if (b->max_tokens >= 0)
        lg__buf_printf(l, ",\"max_tokens\":%lld,\"output_tokens\":%lld", (long long)b->max_tokens,
                       (long long)b->max_tokens);
      if (m.cost_nusd >= 0) {
        lg__buf_puts(l, ",\"cost\":");
        lg__buf_usd(l, m.cost_nusd);
      }
      if (d.action == LG_ACT_EXECUTE) lg__buf_printf(l, ",\"reservation\":%lld", (long long)d.reservation);
      line_t(l, t);
      break;
    }
    case LG__RT_USAGE: {
      int64_t resv = reservation_of(b->reservation_id);
      if (resv < 0) {
        rc = client_error(x, 400, "invalid_request", NULL,
                          "reservation_id: expected the reservation_id that /model answered");
        snprintf(x->client_field, sizeof x->client_field, "reservation_id");
        goto out;
      }
      if (x->was_stopped) {
        lg_run_stop(run, LG_R_NONE, NULL, t, &d); /* fills d with the stop */
        break;
      }
      int64_t actual = -1;
      lg_prices_t *prices = lg_price_book_get(srv->prices);
      rc = lg_budget_usage(s, prices, run, resv, b->input_tokens, b->output_tokens,
                           b->has_cost ? b->cost_nusd : -1, t, x->now, &actual, &e);
      lg_prices_free(prices);
      if (rc == LG_ENOTFOUND) {
        rc = client_error(x, 409, "conflict", NULL,
                          resv ? "reservation_id: no open reservation with that id in this run"
                               : "no model call of this run is waiting for its usage");
        snprintf(x->client_field, sizeof x->client_field, "reservation_id");
        goto out;
      }
      if (rc) goto out;
      d.action = LG_ACT_CONTINUE;
      d.reason_text = "";
      d.guard = "";
      lg__buf_puts(l, "{\"type\":\"usage\"");
      if (resv) lg__buf_printf(l, ",\"reservation\":%lld", (long long)resv);
      lg__buf_printf(l, ",\"input_tokens\":%lld,\"output_tokens\":%lld", (long long)b->input_tokens,
                     (long long)b->output_tokens);
      if (actual >= 0) {
        lg__buf_puts(l, ",\"cost\":");
        lg__buf_usd(l, actual);
      }
      line_t(l, t);
      break;
    }
    case LG__RT_RUN_CANCEL:
      lg_run_cancel(run, x->cancel_reason, t, &d);
      lg__buf_puts(l, "{\"type\":\"cancel\"");
      kv_str(l, "reason", x->cancel_reason);
      line_t(l, t);
      break;
    default: rc = LG_EINVAL; goto out;
    }
  }
  x->action = d.action;
  x->reason = d.reason;
  if (!x->was_stopped) {
    /* Save, in this transaction, then the trace line. */
    size_t state_len = 0;
    /* The stored envelope is the terminal one: written when the run stops.
     * While it is active the state says everything (GET /v1/runs/{id} and
     * `loopguard runs show` rebuild the envelope from it), and the row
     * stays small enough for one page, which halves what a commit
     * writes. */
    int stopped_now = lg_run_stopped(run);
    if ((rc = lg_run_save(run, &state, &state_len)) ||
        (stopped_now && !(env = lg_run_envelope_json(run)))) {
      rc = rc ? rc : LG_ENOMEM;
      goto out;
    }
    lg_run_record_t r2 = *rec;
    r2.stopped = stopped_now;
    r2.terminal_reason = (char *)lg_run_terminal_reason(run);
    r2.state = state;
    r2.state_len = state_len;
    r2.envelope_json = env;
    r2.updated_ms = x->now;
    if (l->oom) {
      rc = LG_ENOMEM;
      goto out;
    }
    if ((rc = lg__store_run_put_events(s, &r2, l->data, l->len, &e))) goto out;
    x->stopped_now = r2.stopped;
    if (x->stopped_now) stop_fields(x, rec->run_id, &d);
  }
  decision_json(x, run, &d);
  if (x->resp.oom || x->stop_log.oom) rc = LG_ENOMEM;
out:
  if (rc && !x->client_status && e.message[0]) {
    lg_error_t *keep = &e;
    char buf[700];
    snprintf(x->client_msg, sizeof x->client_msg, "%s", lg_error_format(keep, buf, sizeof buf));
  }
  lg_run_free(run);
  lg_ledger_free(ledger);
  lg__free(state);
  lg__free(env);
  lg__free(why);
  return rc;
}

/* The answer to a decision once it is done (committed or not), on the
 * HTTP thread: the metrics and the log hear of it, and rq gets the
 * answer. */
static void finish_decision(lg__req_t *rq, dctx_t *x, int rc, lg_error_t *e) {
  lg_server_t *srv = rq->srv;
  if (rc == 0) {
    rq->status = 200;
    lg__buf_t tmp = rq->out;
    rq->out = x->resp;
    x->resp = tmp;
    lg__metrics_decision(&srv->metrics, x->action, x->reason, !x->was_stopped && x->stopped_now);
    if (!x->was_stopped) {
      if (x->ledger_outcome >= 0) lg__metrics_ledger(&srv->metrics, (lg_claim_outcome_t)x->ledger_outcome);
      if (x->stopped_now) {
        atomic_fetch_sub(&srv->metrics.runs_active, 1);
        lg__server_log(srv, "info", "stop", x->stop_log.data);
      }
    }
  } else if (x->client_status && x->client_body) { /* a budget's refusal */
    rq->status = x->client_status;
    rq->retry_after = x->retry_after;
    lg__buf_puts(&rq->out, x->client_body);
  } else if (x->client_status) {
    lg__req_error(rq, x->client_status, x->client_type, x->client_field, "%s", x->client_msg);
  } else if (rc == LG_ENOTFOUND) {
    lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
  } else {
    if (x->client_msg[0]) snprintf(e->message, sizeof e->message, "%.500s", x->client_msg);
    store_error(rq, rc, e, "deciding");
  }
  lg__free(x->client_body);
  x->client_body = NULL;
  lg__free(x->budget_meta);
  x->budget_meta = NULL;
  lg__buf_free(&x->resp);
  lg__buf_free(&x->line);
  lg__buf_free(&x->stop_log);
}

/* A decision with everything it holds, on the heap while it waits. */
typedef struct decide_job {
  lg__job_t job;  /* first: rq->job points here */
  dctx_t x;
  lg__body_t b;
  char *args, *value, *world; /* compact JSON of the body's values */
} decide_job_t;

static void free_decide_job(decide_job_t *dj) {
  lg__free(dj->args);
  lg__free(dj->value);
  lg__free(dj->world);
  lg__body_clear(&dj->b);
  lg__free(dj);
}

static void decide_finish(lg__req_t *rq) {
  decide_job_t *dj = (decide_job_t *)rq->job;
  rq->job = NULL;
  finish_decision(rq, &dj->x, dj->job.rc, &dj->job.err);
  free_decide_job(dj);
}

void lg__h_decide(lg__req_t *rq) {
  static const lg__body_kind_t kinds[LG__RT__COUNT] = {
      [LG__RT_CALLS] = LG__B_CALL, [LG__RT_RESULTS] = LG__B_RESULT,
      [LG__RT_STATE] = LG__B_STATE, [LG__RT_HANDOFFS] = LG__B_HANDOFF,
      [LG__RT_MODEL] = LG__B_MODEL, [LG__RT_USAGE] = LG__B_USAGE};
  lg_server_t *srv = rq->srv;
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return;
  }
  decide_job_t *dj = lg__calloc(1, sizeof *dj);
  if (!dj) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  if (parse(rq, kinds[rq->route], &dj->b)) {
    free_decide_job(dj);
    return;
  }
  dctx_t *x = &dj->x;
  const lg__body_t *b = &dj->b;
  x->b = b;
  if (rq->route == LG__RT_CALLS) {
    if (b->args) {
      if (!(dj->args = lg__json_text(b->args, &x->args_len))) goto oom;
      x->args = dj->args;
    } else {
      x->args = "{}";
      x->args_len = 2;
    }
  } else if (rq->route == LG__RT_RESULTS && b->value) {
    if (!(dj->value = lg__json_text(b->value, &x->value_len))) goto oom;
    x->value = dj->value;
  } else if (rq->route == LG__RT_STATE) {
    if (!(dj->world = lg__json_text(b->world, &x->world_len))) goto oom;
    x->world = dj->world;
  }
  x->srv = srv;
  x->route = rq->route;
  x->ledger_outcome = -1;
  x->now = lg__server_now(srv);
  dj->job.run_id = rq->id;
  dj->job.fn = decide_locked;
  dj->job.ud = x;
  if (srv->batcher) { /* group commit: the HTTP layer parks the request */
    x->canon = lg__batcher_canon(srv->batcher);
    rq->job = &dj->job;
    rq->finish = decide_finish;
    return;
  }
  x->w = worker(rq);
  if (!x->w) {
    free_decide_job(dj);
    return;
  }
  x->canon = x->w->canon;
  dj->job.rc = lg_store_with_run(x->w->store, rq->id, decide_locked, x, &dj->job.err);
  rq->job = &dj->job;
  decide_finish(rq);
  return;
oom:
  lg__req_error(rq, 500, "internal", NULL, "out of memory");
  free_decide_job(dj);
}

/* ------------------------------------------------------------------ */
/* The kill switch.                                                    */

/* Cancels one run through the decision path; *cancelled when it was
 * active. The answer (its envelope) goes to x->resp. */
static int cancel_one(lg__req_t *rq, const char *run_id, const char *reason, lg_error_t *e,
                      dctx_t *x) {
  lg_server_t *srv = rq->srv;
  memset(x, 0, sizeof *x);
  x->srv = srv;
  x->w = lg__server_worker(srv, e);
  if (!x->w) return e->code ? e->code : LG_ESTORE;
  x->canon = x->w->canon;
  x->route = LG__RT_RUN_CANCEL;
  x->ledger_outcome = -1;
  x->cancel_reason = reason;
  x->now = lg__server_now(srv);
  lg__body_t none;
  memset(&none, 0, sizeof none);
  x->b = &none;
  int rc = lg_store_with_run(x->w->store, run_id, decide_locked, x, e);
  if (!rc && !x->was_stopped) {
    lg__metrics_decision(&srv->metrics, x->action, x->reason, 1);
    atomic_fetch_sub(&srv->metrics.runs_active, 1);
    lg__server_log(srv, "info", "stop", x->stop_log.data);
  }
  return rc;
}

static void free_dctx(dctx_t *x) {
  lg__free(x->client_body);
  lg__free(x->budget_meta);
  lg__buf_free(&x->resp);
  lg__buf_free(&x->line);
  lg__buf_free(&x->stop_log);
}

void lg__h_run_cancel(lg__req_t *rq) {
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return;
  }
  lg__body_t b;
  if (parse(rq, LG__B_CANCEL, &b)) return;
  dctx_t x;
  lg_error_t e = {0};
  int rc = cancel_one(rq, rq->id, b.reason, &e, &x);
  if (rc == LG_ENOTFOUND) {
    lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
  } else if (rc) {
    store_error(rq, rc, &e, "cancelling");
  } else {
    /* {run_id, status, envelope}: the envelope out of the decision. */
    json_t *d = json_loadb(x.resp.data, x.resp.len, 0, NULL);
    json_t *env = d ? json_object_get(d, "envelope") : NULL;
    char *envs = env ? json_dumps(env, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    lg__buf_puts(&rq->out, "{\"run_id\":");
    jstr(&rq->out, rq->id);
    lg__buf_printf(&rq->out, ",\"status\":\"stopped\",\"cancelled\":%s,\"envelope\":%s}",
                   x.was_stopped ? "false" : "true", envs ? envs : "null");
    rq->status = envs ? 200 : 500;
    if (!envs) lg__req_error(rq, 500, "internal", NULL, "out of memory");
    lg__free(envs);
    json_decref(d);
  }
  free_dctx(&x);
  lg__body_clear(&b);
}

typedef struct ids {
  char **v;
  size_t n, cap;
} ids_t;

static int collect(void *ud, const lg_run_record_t *rec) {
  ids_t *ids = ud;
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? ids->cap * 2 : 16;
    char **v = lg__realloc(ids->v, cap * sizeof *v);
    if (!v) return LG_ENOMEM;
    ids->v = v;
    ids->cap = cap;
  }
  if (!(ids->v[ids->n] = lg__strdup(rec->run_id))) return LG_ENOMEM;
  ids->n++;
  return 0;
}

void lg__h_group_cancel(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no group with that name");
    return;
  }
  lg__body_t b;
  if (parse(rq, LG__B_CANCEL, &b)) return;
  lg__worker_t *w = worker(rq);
  if (!w) {
    lg__body_clear(&b);
    return;
  }
  lg_error_t e = {0};
  /* The deny rule first, durable on its own: every worker of every replica
   * checks it before its next decision, and it holds for runs of the
   * group that do not exist yet. */
  int rc = lg__store_deny(w->store, LG__DENY_GROUP, rq->id, b.reason, lg__server_now(srv), &e);
  if (rc) {
    store_error(rq, rc, &e, "cancelling the group");
    lg__body_clear(&b);
    return;
  }
  ids_t ids = {0};
  lg_run_filter_t f = {.status = "active", .group = rq->id};
  rc = lg_store_run_list(w->store, &f, collect, &ids, &e);
  lg__buf_puts(&rq->out, "{\"group\":");
  jstr(&rq->out, rq->id);
  lg__buf_puts(&rq->out, ",\"cancelled\":[");
  int n = 0;
  for (size_t i = 0; i < ids.n && !rc; i++) {
    dctx_t x;
    rc = cancel_one(rq, ids.v[i], b.reason, &e, &x);
    if (rc == LG_ENOTFOUND) rc = 0; /* gone meanwhile */
    else if (!rc && !x.was_stopped) {
      if (n++) lg__buf_putc(&rq->out, ',');
      jstr(&rq->out, ids.v[i]);
    }
    free_dctx(&x);
  }
  lg__buf_puts(&rq->out, "]}");
  if (rc) store_error(rq, rc, &e, "cancelling the group's runs (the group's deny rule is stored)");
  else rq->status = 200;
  for (size_t i = 0; i < ids.n; i++) lg__free(ids.v[i]);
  lg__free(ids.v);
  lg__body_clear(&b);
}

/* ------------------------------------------------------------------ */
/* Traces.                                                             */

void lg__h_trace(lg__req_t *rq) {
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return;
  }
  lg__worker_t *w = worker(rq);
  if (!w) return;
  lg_error_t e = {0};
  char *text = NULL;
  int rc = lg_store_run_trace(w->store, rq->id, &text, NULL, &e);
  if (rc == LG_ENOTFOUND) {
    lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
    return;
  }
  if (rc) {
    store_error(rq, rc, &e, "reading the run's trace");
    return;
  }
  answer_text(rq, text, 200);
  if (rq->status == 200) rq->content_type = "application/x-ndjson";
}

/* ------------------------------------------------------------------ */
/* Operations (the idempotency ledger).                                */

/* Answers with the operation of `key` as it is now. No row is 404 for a
 * GET; after a commit or fail (missing_is_free) it is a key that a
 * retryable failure freed. */
static void op_answer(lg__req_t *rq, lg_store_t *s, const char *key, int missing_is_free) {
  lg_operation_t op;
  memset(&op, 0, sizeof op);
  lg_error_t e = {0};
  int rc = lg_store_operation(s, key, lg__server_now(rq->srv), &op, &e);
  if (rc == LG_ENOTFOUND && !missing_is_free) {
    lg__req_error(rq, 404, "not_found", NULL, "no operation \"%s\"", key);
    return;
  }
  if (rc == LG_ENOTFOUND) {
    lg__buf_puts(&rq->out, "{\"key\":");
    jstr(&rq->out, key);
    lg__buf_puts(&rq->out, ",\"state\":\"free\"}");
    rq->status = 200;
    return;
  }
  if (rc) {
    store_error(rq, rc, &e, "reading the operation");
    return;
  }
  char *j = lg_operation_to_json(&op);
  lg_operation_clear(&op);
  answer_text(rq, j, 200);
}

void lg__h_op_claim(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  lg__body_t b;
  if (parse(rq, LG__B_CLAIM, &b)) return;
  if (strlen(b.request_fp) > 256) {
    lg__req_error(rq, 400, "invalid_request", "request_fingerprint",
                  "request_fingerprint: longer than 256 bytes");
    lg__body_clear(&b);
    return;
  }
  lg__worker_t *w = worker(rq);
  if (!w) {
    lg__body_clear(&b);
    return;
  }
  lg_claim_t cl;
  memset(&cl, 0, sizeof cl);
  lg_error_t e = {0};
  int rc = lg_store_claim(w->store, b.key, b.request_fp, b.run_id, b.lease_ms > 0 ? b.lease_ms : 0,
                          lg__server_now(srv), &cl, &e);
  if (rc) {
    store_error(rq, rc, &e, "claiming");
    lg__body_clear(&b);
    return;
  }
  lg__metrics_ledger(&srv->metrics, cl.outcome);
  lg__buf_t *o = &rq->out;
  switch (cl.outcome) {
  case LG_CLAIM_CLAIMED:
    rq->status = 201;
    lg__buf_puts(o, "{\"outcome\":\"claimed\",\"key\":");
    jstr(o, b.key);
    /* What commit and fail must present: the claimant's proof. */
    lg__buf_puts(o, ",\"claim_token\":");
    jstr(o, cl.claim_token);
    lg__buf_putc(o, '}');
    break;
  case LG_CLAIM_REPLAY:
    rq->status = 200;
    lg__buf_puts(o, "{\"outcome\":\"replay\",\"key\":");
    jstr(o, b.key);
    lg__buf_printf(o, ",\"failed\":%s,\"result\":", cl.failed ? "true" : "false");
    if (cl.result && cl.result_len) lg__buf_append(o, cl.result, cl.result_len);
    else lg__buf_puts(o, "null");
    lg__buf_putc(o, '}');
    break;
  default: {
    int status = cl.outcome == LG_CLAIM_MISMATCH ? 422 : 409;
    const char *type = status == 422 ? "unprocessable" : "conflict";
    const char *msg =
        cl.outcome == LG_CLAIM_MISMATCH
            ? "the key is held for a different request fingerprint"
        : cl.outcome == LG_CLAIM_IN_PROGRESS
            ? "another worker holds this key and has not reported an outcome yet"
            : "a claim of this key ran out of its lease with no outcome: reconcile it (commit or "
              "fail) before anyone runs it again";
    rq->status = status;
    lg__buf_printf(o, "{\"outcome\":\"%s\",\"key\":", lg_claim_outcome_name(cl.outcome));
    jstr(o, b.key);
    lg__buf_printf(o, ",\"error\":{\"code\":%d,\"type\":\"%s\",\"message\":\"%s\"}}", status, type,
                   msg);
  }
  }
  lg_claim_clear(&cl);
  lg__body_clear(&b);
}

/* Who settles a key over HTTP (docs/security.md, "Who may undo what"): an
 * operator token acts as an operator; an agent token must present the
 * claim's claim_token. A server with no tokens (loopback only) has no
 * roles: a request without claim_token acts as the operator, one with a
 * claim_token is held to it. */
static void op_actor(lg__req_t *rq, const char *claim_token, lg_op_actor_t *as) {
  lg_server_t *srv = rq->srv;
  memset(as, 0, sizeof *as);
  as->claim_token = claim_token;
  if (srv->auth.n) {
    lg__role_t role = lg__auth_role(
        &srv->auth, MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, "Authorization"));
    as->operator = role == LG__ROLE_OPERATOR;
    as->who = "http:operator";
  } else {
    as->operator = claim_token == NULL;
    as->who = "http:open";
  }
}

/* The answer of a commit or fail refused: 403 with who may. */
static void op_refused(lg__req_t *rq, const lg_error_t *e) {
  lg__req_error(rq, 403, "forbidden", e->field[0] ? e->field : NULL, "%s", e->message);
}

void lg__h_op_commit(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no operation with that key");
    return;
  }
  lg__body_t b;
  if (parse(rq, LG__B_COMMIT, &b)) return;
  size_t len = 0;
  char *text = lg__json_text(b.result, &len);
  lg__worker_t *w = text ? worker(rq) : NULL;
  if (!text) lg__req_error(rq, 500, "internal", NULL, "out of memory");
  if (w) {
    lg_error_t e = {0};
    lg_op_actor_t as;
    op_actor(rq, b.claim_token, &as);
    int rc = lg_store_commit_as(w->store, rq->id, text, len, b.operation_id, &as,
                                lg__server_now(srv), &e);
    if (rc == LG_ENOTFOUND) lg__req_error(rq, 404, "not_found", NULL, "no operation \"%s\"", rq->id);
    else if (rc == LG_EPERM) op_refused(rq, &e);
    else if (rc) store_error(rq, rc, &e, "committing");
    else op_answer(rq, w->store, rq->id, 1);
  }
  lg__free(text);
  lg__body_clear(&b);
}

void lg__h_op_fail(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no operation with that key");
    return;
  }
  lg__body_t b;
  if (parse(rq, LG__B_FAIL, &b)) return;
  lg__worker_t *w = worker(rq);
  if (w) {
    lg_error_t e = {0};
    lg_op_actor_t as;
    op_actor(rq, b.claim_token, &as);
    int rc = lg_store_fail_as(w->store, rq->id, b.retryable, &as, lg__server_now(srv), &e);
    if (rc == LG_ENOTFOUND) lg__req_error(rq, 404, "not_found", NULL, "no operation \"%s\"", rq->id);
    else if (rc == LG_EPERM) op_refused(rq, &e);
    else if (rc) store_error(rq, rc, &e, "failing");
    else op_answer(rq, w->store, rq->id, 1);
  }
  lg__body_clear(&b);
}

void lg__h_op_get(lg__req_t *rq) {
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no operation with that key");
    return;
  }
  lg__worker_t *w = worker(rq);
  if (w) op_answer(rq, w->store, rq->id, 0);
}

/* ------------------------------------------------------------------ */
/* Budgets: the shared spend gate (src/budget). PUT/GET
 * /v1/budgets/{scope}, POST /v1/budgets/reserve and /settle; the router
 * already checked the roles. */

/* A budget error: the library's field and message, with the status of the
 * error's kind. */
static void budget_error(lg__req_t *rq, int rc, lg_error_t *e, const char *doing) {
  if (rc == LG_EINVAL || rc == LG_ERANGE)
    lg__req_error(rq, 400, "invalid_request", e->field[0] ? e->field : NULL, "%s", e->message);
  else if (rc == LG_ENOTFOUND)
    lg__req_error(rq, 404, "not_found", e->field[0] ? e->field : NULL, "%s", e->message);
  else if (rc == LG_ECONFLICT)
    lg__req_error(rq, 409, "conflict", e->field[0] ? e->field : NULL, "%s", e->message);
  else store_error(rq, rc, e, doing);
}

static void budget_put_get(lg__req_t *rq, lg__worker_t *w, bool put) {
  lg_server_t *srv = rq->srv;
  lg_error_t e = {0};
  lg_budget_t bud;
  int rc;
  if (put) {
    lg__body_t b;
    if (parse(rq, LG__B_BUDGET_SET, &b)) return;
    int64_t limit = 0, cap = -1;
    lg_budget_period_t period;
    rc = lg_budget_usd_to_micro(b.limit_usd, &limit, "limit_usd", &e);
    if (!rc && b.has_max_in_flight) rc = lg_budget_usd_to_micro(b.max_in_flight_usd, &cap, "max_in_flight_usd", &e);
    if (!rc) rc = lg_budget_period_parse(b.period, &period, &e);
    if (!rc) rc = lg_budget_set(w->store, rq->id, limit, period, cap, lg__server_now(srv), &bud, &e);
    lg__body_clear(&b);
  } else {
    rc = lg_budget_get(w->store, rq->id, lg__server_now(srv), &bud, &e);
  }
  if (rc) {
    budget_error(rq, rc, &e, put ? "setting the budget" : "reading the budget");
    return;
  }
  answer_text(rq, lg_budget_to_json(&bud), 200);
}

static void budget_reserve(lg__req_t *rq, lg__worker_t *w) {
  lg_server_t *srv = rq->srv;
  lg__body_t b;
  if (parse(rq, LG__B_RESERVE, &b)) return;
  lg_error_t e = {0};
  const char *scopes[16];
  size_t n = json_array_size(b.scopes);
  for (size_t k = 0; k < n; k++) scopes[k] = json_string_value(json_array_get(b.scopes, k));
  int64_t amount = 0;
  int rc = lg_budget_usd_to_micro(b.amount_usd, &amount, "amount_usd", &e);
  lg_budget_reservation_t res;
  lg_budget_refusal_t why;
  memset(&why, 0, sizeof why);
  if (!rc) {
    lg_budget_request_t req = {scopes, n, amount, b.ttl_ms > 0 ? b.ttl_ms : 0, NULL, 0, NULL};
    rc = lg_budget_reserve(w->store, &req, lg__server_now(srv), &res, &why, &e);
  }
  lg__body_clear(&b);
  if (rc == LG_BUDGET_REFUSED) {
    lg__metrics_budget_refusal(&srv->metrics, why.limit_source);
    if (why.http_status == 429) rq->retry_after = (int)(why.retry_after_s > 0 ? why.retry_after_s : 1);
    answer_text(rq, lg_budget_refusal_json(&why), why.http_status);
  } else if (rc) {
    budget_error(rq, rc, &e, "reserving");
  } else {
    answer_text(rq, lg_budget_reservation_json(&res), 201);
  }
}

static void budget_settle(lg__req_t *rq, lg__worker_t *w) {
  lg_server_t *srv = rq->srv;
  lg__body_t b;
  if (parse(rq, LG__B_SETTLE, &b)) return;
  lg_error_t e = {0};
  int64_t actual = 0;
  lg_budget_settlement_t st;
  memset(&st, 0, sizeof st);
  int rc = lg_budget_usd_to_micro(b.actual_usd, &actual, "actual_usd", &e);
  /* Only an operator's settlement charges above the reservation (the
   * router let agents in): an agent's is bounded, and says so. */
  lg__role_t role = srv->auth.n ? lg__auth_role(&srv->auth, MHD_lookup_connection_value(
                                                   rq->conn, MHD_HEADER_KIND, "Authorization"))
                                : LG__ROLE_OPERATOR;
  if (!rc && role == LG__ROLE_OPERATOR)
    rc = lg_budget_settle(w->store, b.reservation_id, actual, lg__server_now(srv), &st, &e);
  else if (!rc)
    rc = lg_budget_settle_bounded(w->store, b.reservation_id, actual, lg__server_now(srv), &st,
                                  &e);
  lg__body_clear(&b);
  if (rc) {
    budget_error(rq, rc, &e, "settling");
    return;
  }
  char *j = lg_budget_settlement_json(&st);
  lg_budget_settlement_clear(&st);
  answer_text(rq, j, 200);
}

void lg__h_budgets(lg__req_t *rq) {
  lg__worker_t *w = worker(rq);
  if (!w) return;
  if (!strcmp(rq->method, "PUT")) budget_put_get(rq, w, true);
  else if (!strcmp(rq->method, "GET")) budget_put_get(rq, w, false);
  else if (!strcmp(rq->id, "reserve")) budget_reserve(rq, w);
  else if (!strcmp(rq->id, "settle")) budget_settle(rq, w);
  else lg__req_error(rq, 404, "not_found", NULL, "POST /v1/budgets/%s: use reserve or settle", rq->id);
}

/* ------------------------------------------------------------------ */
/* Health and metrics.                                                 */

void lg__h_healthz(lg__req_t *rq) {
  /* Open to anyone: the answer names the store's kind, never its URL or
   * path (the detail goes to the log). 200 only when the store answers
   * and could take a write now; 503 with the reason otherwise. Reads go
   * to the store's reader, so this never waits behind a write. */
  lg_server_t *srv = rq->srv;
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(srv, &e);
  int version = 0;
  int rc = w ? lg_store_schema_version(w->store, &version, &e) : (e.code ? e.code : LG_ESTORE);
  const char *reason = NULL;
  if (rc) {
    log_error(srv, rq, &e, rc);
    reason = rc == LG_EBUSY ? "the store is locked by another writer"
             : rc == LG_ENOMEM ? "out of memory"
                               : "the store does not answer (the server's log has the detail)";
  } else if ((rc = lg__store_write_probe(w->store, lg__server_now(srv), &e))) {
    reason = e.message; /* the probe's own words: no URL, no path */
  }
  if (rc) {
    rq->status = 503;
    lg__buf_puts(&rq->out, "{\"status\":\"unavailable\",\"store\":");
    jstr(&rq->out, srv->scheme);
    lg__buf_puts(&rq->out, ",\"writable\":false,\"reason\":");
    jstr(&rq->out, reason);
    lg__buf_puts(&rq->out, ",\"error\":{\"code\":503,\"type\":\"internal\",\"message\":");
    jstr(&rq->out, reason);
    lg__buf_puts(&rq->out, "}}");
    return;
  }
  rq->status = 200;
  lg__buf_puts(&rq->out, "{\"status\":\"ok\",\"version\":\"" LG_VERSION_STRING "\",\"store\":");
  jstr(&rq->out, srv->scheme);
  lg__buf_printf(&rq->out, ",\"schema\":%d,\"writable\":true,\"draining\":%s}", version,
                 atomic_load(&srv->draining) ? "true" : "false");
}

void lg__h_metrics(lg__req_t *rq) {
  lg__worker_t *w = worker(rq);
  if (!w) return;
  lg__server_count_active(rq->srv, w->store);
  if (rq->srv->batcher) {
    uint64_t batches, jobs;
    lg__batcher_stats(rq->srv->batcher, &batches, &jobs);
    lg__buf_printf(&rq->out,
                   "# HELP loopguard_commit_batches_total Transactions of the group commit.\n"
                   "# TYPE loopguard_commit_batches_total counter\n"
                   "loopguard_commit_batches_total %llu\n"
                   "# HELP loopguard_commit_decisions_total Decisions made in those transactions.\n"
                   "# TYPE loopguard_commit_decisions_total counter\n"
                   "loopguard_commit_decisions_total %llu\n",
                   (unsigned long long)batches, (unsigned long long)jobs);
  }
  if (lg__metrics_render(&rq->srv->metrics, &rq->out)) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  rq->status = 200;
  rq->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
