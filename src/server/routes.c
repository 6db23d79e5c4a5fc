/*
 * routes.c — the endpoints of http-api-v1.
 *
 * A handler only turns its request into something the layers below take:
 * an event for the decision step (src/step/: load the run, the deny rules,
 * apply, save, the trace line, in one store transaction), a ledger or
 * budget call, a read. Deciding, saving and tracing happen once, below;
 * the answer is sent only after the transaction committed. With a store
 * that takes one writer at a time the step runs in the group commit
 * (src/store/group.c): the handler parks its request and the committer
 * wakes it once the batch is stored.
 */
#include "../step/step.h"
#include "server.h"
#include "../gateway/gateway.h"

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

/* ------------------------------------------------------------------ */
/* Creating runs.                                                      */


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
  char *pjson = NULL;
  lg_run_t *run = NULL;
  lg_error_t e = {0};
  if (!run_id) {
    if (lg__step_new_run_id(idbuf)) {
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
  if (!run) {
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
  int same = 0;
  int rc = lg__step_create(w->store, run, pjson,
                           b.has_progress_version ? &b.progress_version : NULL, scopes, nscopes,
                           lg__server_now(srv), &same, &e);
  if (rc == LG_ECONFLICT) {
    /* Already there: the same body again is the same answer (a client's
     * retry), anything else a conflict. */
    if (same) run_created_answer(rq, run_id, b.group, pjson, 200);
    else
      lg__req_error(rq, 409, "conflict", "run_id",
                    "run_id: run \"%s\" already exists with a different group, policy or "
                    "progress_version",
                    run_id);
    goto out;
  }
  if (rc) {
    store_error(rq, rc, &e, "creating the run");
    goto out;
  }
  atomic_fetch_add(&srv->metrics.runs_active, 1);
  run_created_answer(rq, run_id, b.group, pjson, 201);
out:
  lg_run_free(run);
  lg_policy_free(pol);
  lg__free(pjson);
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
  lg__time_rfc3339(rec.created_ms, created);
  lg__time_rfc3339(rec.updated_ms, updated);
  lg__buf_t *b = &rq->out;
  lg__buf_puts(b, "{\"run_id\":");
  jstr(b, rec.run_id);
  lg__buf_puts(b, ",\"group\":");
  jstr(b, rec.group);
  lg__buf_printf(b, ",\"status\":\"%s\",\"terminal_reason\":", rec.stopped ? "stopped" : "active");
  jstr(b, rec.terminal_reason);
  lg__buf_printf(b, ",\"created_at\":\"%s\",\"updated_at\":\"%s\",\"counters\":", created, updated);
  char *cj = lg_counters_to_json(&c);
  if (!cj || lg__buf_puts(b, cj)) b->oom = true;
  lg__free(cj);
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
/* Decisions: each route's body as its event, for the decision step.   */

/* A decision with everything it holds, on the heap while it waits. */
typedef struct decide_job {
  lg__job_t job;       /* first: rq->job points here */
  lg__step_t st;       /* the step: its event in, its outcome out */
  lg__body_t b;        /* the parsed body */
  char *args, *value, *world; /* compact JSON of the body's values */
  lg_prices_t *prices; /* a reference, for model and usage events */
} decide_job_t;

static lg_policy_t *server_policy(void *ud, const char *json, lg_error_t *err) {
  return lg__server_policy(ud, json, err);
}

/* Parses "N" (a reservation id as /model answered it); 0 for none. */
static int64_t reservation_of(const char *s) {
  if (!s) return 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  return (*s && !*end && v > 0) ? (int64_t)v : -1;
}

/* A result's value as the engine classes it (as the trace reader does). */
static lg_value_kind_t value_kind(const json_t *v) {
  if (!v) return LG_VALUE_ABSENT;
  if (json_is_null(v)) return LG_VALUE_NULL;
  if (json_is_string(v)) { /* blank: white space only */
    const char *t = json_string_value(v);
    size_t n = json_string_length(v), k = 0;
    while (k < n && (t[k] == ' ' || t[k] == '\t' || t[k] == '\n' || t[k] == '\r')) k++;
    if (k == n) return LG_VALUE_BLANK;
  }
  return LG_VALUE_PRESENT;
}

/* The body of a decision route as the event it stands for. Returns 0, or
 * -1 once an error is answered. */
static int body_event(lg__req_t *rq, decide_job_t *dj) {
  const lg__body_t *b = &dj->b;
  lg_event_t *ev = &dj->st.ev;
  memset(ev, 0, sizeof *ev);
  switch (rq->route) {
  case LG__RT_CALLS: {
    size_t len = 2;
    if (b->args && !(dj->args = lg__json_text(b->args, &len))) return -2;
    ev->type = LG_EV_CALL;
    ev->u.call.tool = b->tool;
    ev->u.call.args = dj->args ? dj->args : "{}";
    ev->u.call.args_len = len;
    ev->u.call.turn = b->has_turn ? b->turn : 0;
    dj->st.auto_turn = !b->has_turn;
    ev->u.call.call_id = b->call_id;
    ev->u.call.idempotency_key = b->idempotency_key;
    ev->u.call.agent = b->agent;
    return 0;
  }
  case LG__RT_RESULTS: {
    lg_result_t *r = &ev->u.result;
    ev->type = LG_EV_RESULT;
    r->call_id = b->call_id;
    r->status = b->status ? lg_status_parse(b->status, strlen(b->status)) : LG_STATUS_INVALID;
    r->has_progress_version = b->has_progress_version;
    r->progress_version = b->progress_version;
    r->side_effect_committed = b->side_effect_committed < 0 ? 0 : b->side_effect_committed ? 1 : -1;
    r->retry_after_ms = b->retry_after_ms;
    r->value_kind = value_kind(b->value);
    if (b->value && !(dj->value = lg__json_text(b->value, &r->value_len))) return -2;
    r->value = dj->value;
    r->operation_id = b->operation_id;
    return 0;
  }
  case LG__RT_STATE:
    ev->type = LG_EV_STATE;
    if (!(dj->world = lg__json_text(b->world, &ev->u.state.len))) return -2;
    ev->u.state.world = dj->world;
    return 0;
  case LG__RT_HANDOFFS:
    ev->type = LG_EV_HANDOFF;
    ev->u.handoff.from = b->from;
    ev->u.handoff.to = b->to;
    return 0;
  case LG__RT_MODEL: {
    lg_model_call_t *m = &ev->u.model.m;
    ev->type = LG_EV_MODEL;
    m->model = b->model;
    m->turn = b->has_turn ? b->turn : 0;
    m->input_tokens = b->input_tokens;
    m->max_tokens = b->max_tokens;
    m->output_tokens = -1; /* unknown before the call */
    m->cost_nusd = b->has_cost ? b->cost_nusd : -1;
    return 0;
  }
  case LG__RT_USAGE: {
    int64_t resv = reservation_of(b->reservation_id);
    if (resv < 0) {
      lg__req_error(rq, 400, "invalid_request", "reservation_id",
                    "reservation_id: expected the reservation_id that /model answered");
      return -1;
    }
    ev->type = LG_EV_USAGE;
    ev->u.usage.reservation = resv;
    ev->u.usage.input_tokens = b->input_tokens;
    ev->u.usage.output_tokens = b->output_tokens;
    ev->u.usage.cost_nusd = b->has_cost ? b->cost_nusd : -1;
    return 0;
  }
  case LG__RT_TEXT:
    ev->type = LG_EV_TEXT;
    ev->u.text.text = b->text;
    ev->u.text.len = b->text_len;
    ev->u.text.turn = b->has_turn ? b->turn : 0;
    ev->u.text.agent = b->agent;
    dj->st.auto_turn = !b->has_turn;
    return 0;
  case LG__RT_USER:
    ev->type = LG_EV_USER;
    ev->u.user.text = b->text;
    return 0;
  case LG__RT_COMPACTION: ev->type = LG_EV_COMPACTION; return 0;
  case LG__RT_RESUME:
    ev->type = LG_EV_RESUME;
    ev->u.resume.has_progress_version = b->has_progress_version;
    ev->u.resume.progress_version = b->progress_version;
    ev->u.resume.note = b->note;
    return 0;
  default: break;
  }
  lg__req_error(rq, 500, "internal", NULL, "no event for this route");
  return -1;
}

/* What the metrics and the log hear of a step that decided. */
static void note_step(lg_server_t *srv, const lg__step_t *st) {
  lg__metrics_decision(&srv->metrics, st->action, st->reason, st->stopped_now);
  if (st->budget_refused) lg__metrics_budget_refusal(&srv->metrics, st->refusal.limit_source);
  if (st->was_stopped) return;
  if (st->ledger_outcome >= 0) lg__metrics_ledger(&srv->metrics, (lg_claim_outcome_t)st->ledger_outcome);
  if (st->stopped_now) {
    atomic_fetch_sub(&srv->metrics.runs_active, 1);
    lg__server_log(srv, "info", "stop", st->stop_log.data);
  }
}

/* The answer to a step that did not decide. */
static void step_error(lg__req_t *rq, const lg__step_t *st, int rc, lg_error_t *e,
                       const char *doing) {
  const char *msg = e->message[0] ? e->message : lg_strerror(rc);
  switch (st->fail) {
  case LG__STEP_BAD_EVENT: lg__req_error(rq, 400, "invalid_request", e->field, "%s", msg); return;
  case LG__STEP_CONFLICT: lg__req_error(rq, 409, "conflict", e->field, "%s", msg); return;
  case LG__STEP_UNPRICED: lg__req_error(rq, 422, "unprocessable", e->field, "%s", msg); return;
  case LG__STEP_NO_RUN: lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id); return;
  case LG__STEP_IN_FLIGHT: { /* too much in flight: 429, nothing changed */
    char *body = lg__http_refusal_json(&st->refusal);
    lg__metrics_budget_refusal(&rq->srv->metrics, st->refusal.limit_source);
    if (!body) {
      lg__req_error(rq, 500, "internal", NULL, "out of memory");
      return;
    }
    rq->status = lg__http_refusal_status(&st->refusal);
    rq->retry_after = (int)st->refusal.retry_after_s;
    lg__buf_puts(&rq->out, body);
    lg__free(body);
    return;
  }
  default: store_error(rq, rc, e, doing); return;
  }
}

static void free_decide_job(decide_job_t *dj) {
  lg__step_clear(&dj->st);
  lg_prices_free(dj->prices);
  lg__free(dj->args);
  lg__free(dj->value);
  lg__free(dj->world);
  lg__body_clear(&dj->b);
  lg__free(dj);
}

/* The step is done (committed or not), on the HTTP thread. */
static void decide_finish(lg__req_t *rq) {
  decide_job_t *dj = (decide_job_t *)rq->job;
  rq->job = NULL;
  lg__step_t *st = &dj->st;
  int rc = lg__step_finish(st, dj->job.rc, &dj->job.err);
  if (!rc) {
    rq->status = 200;
    lg__buf_t tmp = rq->out;
    rq->out = st->answer;
    st->answer = tmp;
    note_step(rq->srv, st);
  } else {
    step_error(rq, st, rc, &dj->job.err, "deciding");
  }
  free_decide_job(dj);
}

void lg__h_decide(lg__req_t *rq) {
  static const lg__body_kind_t kinds[LG__RT__COUNT] = {
      [LG__RT_CALLS] = LG__B_CALL, [LG__RT_RESULTS] = LG__B_RESULT,
      [LG__RT_STATE] = LG__B_STATE, [LG__RT_HANDOFFS] = LG__B_HANDOFF,
      [LG__RT_MODEL] = LG__B_MODEL, [LG__RT_USAGE] = LG__B_USAGE,
      [LG__RT_TEXT] = LG__B_TEXT, [LG__RT_USER] = LG__B_USER,
      [LG__RT_COMPACTION] = LG__B_COMPACTION, [LG__RT_RESUME] = LG__B_RESUME};
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
  lg__step_init(&dj->st, NULL, lg__server_now(srv));
  int brc = body_event(rq, dj);
  if (brc) {
    if (brc == -2) lg__req_error(rq, 500, "internal", NULL, "out of memory");
    free_decide_job(dj);
    return;
  }
  lg__step_t *st = &dj->st;
  st->policy = server_policy;
  st->policy_ud = srv;
  if (rq->route == LG__RT_MODEL || rq->route == LG__RT_USAGE)
    st->prices = dj->prices = lg_price_book_get(srv->prices);
  dj->job.run_id = rq->id;
  dj->job.fn = lg__step_locked;
  dj->job.ud = st;
  rq->job = &dj->job;
  if (srv->batcher) { /* group commit: the HTTP layer parks the request */
    st->canon = lg__batcher_canon(srv->batcher);
    rq->finish = decide_finish;
    return;
  }
  lg__worker_t *w = worker(rq);
  if (!w) {
    rq->job = NULL;
    free_decide_job(dj);
    return;
  }
  st->canon = w->canon;
  dj->job.rc = lg_store_with_run(w->store, rq->id, lg__step_locked, st, &dj->job.err);
  decide_finish(rq);
}

/* ------------------------------------------------------------------ */
/* The kill switch.                                                    */

void lg__h_run_cancel(lg__req_t *rq) {
  lg_server_t *srv = rq->srv;
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "no run with that id");
    return;
  }
  lg__body_t b;
  if (parse(rq, LG__B_CANCEL, &b)) return;
  lg__worker_t *w = worker(rq);
  if (!w) {
    lg__body_clear(&b);
    return;
  }
  lg__step_t st;
  lg_error_t e = {0};
  int rc = lg__step_cancel(w->store, rq->id, b.reason, lg__server_now(srv), &st, &e);
  if (rc) {
    step_error(rq, &st, rc, &e, "cancelling");
  } else {
    note_step(srv, &st);
    lg__buf_puts(&rq->out, "{\"run_id\":");
    jstr(&rq->out, rq->id);
    lg__buf_printf(&rq->out, ",\"status\":\"stopped\",\"cancelled\":%s,\"envelope\":%s}",
                   st.was_stopped ? "false" : "true", st.envelope ? st.envelope : "null");
    rq->status = 200;
  }
  lg__step_clear(&st);
  lg__body_clear(&b);
}

typedef struct group_ctx {
  lg__req_t *rq;
  int n; /* runs listed */
} group_ctx_t;

static void group_run_cancelled(void *ud, const char *run_id, lg__step_t *st) {
  group_ctx_t *g = ud;
  note_step(g->rq->srv, st);
  if (g->n++) lg__buf_putc(&g->rq->out, ',');
  jstr(&g->rq->out, run_id);
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
  group_ctx_t g = {rq, 0};
  lg__buf_puts(&rq->out, "{\"group\":");
  jstr(&rq->out, rq->id);
  lg__buf_puts(&rq->out, ",\"cancelled\":[");
  /* The group's deny rule first, durable on its own: every worker of
   * every replica checks it before its next decision, and it holds for
   * runs of the group that do not exist yet. */
  int rc = lg__step_cancel_group(w->store, rq->id, b.reason, lg__server_now(srv),
                                 group_run_cancelled, &g, &e);
  lg__buf_puts(&rq->out, "]}");
  if (rc) {
    rq->out.len = 0;
    store_error(rq, rc, &e, "cancelling the group's runs");
  } else {
    rq->status = 200;
  }
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
    if (why.retry_after_s > 0) rq->retry_after = (int)(why.retry_after_s > 0 ? why.retry_after_s : 1);
    answer_text(rq, lg__http_refusal_json(&why), lg__http_refusal_status(&why));
  } else if (rc) {
    budget_error(rq, rc, &e, "reserving");
  } else {
    answer_text(rq, lg__budget_reservation_json(&res), 201);
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
  char *j = lg__budget_settlement_json(&st);
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
  if (rq->srv->gw) lg__gw_metrics(rq->srv->gw, &rq->out);
  if (lg__metrics_render(&rq->srv->metrics, &rq->out) ||
      lg__metrics_budgets(rq->srv, w->store, &rq->out)) { /* metrics_budgets.c */
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  rq->status = 200;
  rq->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
