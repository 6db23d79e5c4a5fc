/*
 * routes.c — the endpoints of http-api-v1.
 *
 * A handler only turns its request into something the layers below take:
 * an event for the decision step (src/step/: load the run, the deny rules,
 * apply, save, the trace line, in one store transaction), a ledger or
 * budget call, a read. Deciding, saving and tracing happen once, below;
 * the answer is sent only after the transaction committed.
 *
 * Every route that writes hands its write over as a job (a write_job_t
 * of its kind: "Writes" below), reads are made on the spot. With a store
 * that takes one writer at a time (sqlite:, memory:) the job runs in the
 * group commit (src/store/group.c): the handler parks its request and the
 * committer wakes it once the batch is stored, so an HTTP thread never
 * waits for the database's write lock and its reads go to the store's
 * reader meanwhile. With postgres: the job runs at once on the thread's
 * own connection.
 */
#include "../step/step.h"
#include "server.h"
#include "../gateway/gateway.h"

#include <errno.h>
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

/* Logs an internal error: the request_failed line has the whole detail,
 * the store's URL or path included (the client's 500 has not: that is for
 * the operator, lg__req_store_error). */
static void log_failure(lg_server_t *srv, const lg__req_t *rq, const lg_error_t *e, int rc) {
  lg__buf_t f = {0};
  char buf[1024];
  lg__buf_puts(&f, "\"route\":");
  jstr(&f, lg__route_name(rq->route));
  if (rq->id) {
    lg__buf_puts(&f, ",\"id\":");
    jstr(&f, rq->id);
  }
  lg__buf_printf(&f, ",\"code\":\"%s\",\"message\":", lg_err_name(rc));
  jstr(&f, lg__error_logged(e, rc, buf, sizeof buf));
  if (!f.oom) lg__server_log(srv, "error", "request_failed", f.data);
  lg__buf_free(&f);
}

/* Answers a store error: what was asked was not done (nothing stored),
 * unless the store says a lost COMMIT may have stored it all
 * (LG__ERR_MAYBE_STORED). The answer says what failed in the store's own
 * words, never where (the store's URL or file: the log line has it). */
int lg__req_store_error(lg__req_t *rq, int rc, const lg_error_t *e, const char *what) {
  char buf[600];
  const char *msg = lg__error_public(e, rc, buf, sizeof buf);
  switch (rc) {
  case LG_ENOTFOUND: return lg__req_error(rq, 404, "not_found", NULL, "%s: %s", what, msg);
  case LG_ECONFLICT: return lg__req_error(rq, 409, "conflict", NULL, "%s: %s", what, msg);
  case LG_EINVAL: return lg__req_error(rq, 400, "invalid_request", e ? e->field : NULL, "%s", msg);
  default:
    log_failure(rq->srv, rq, e, rc);
    if (e && strstr(e->message, LG__ERR_MAYBE_STORED)) /* the database may have it all */
      return lg__req_error(rq, 500, "internal", NULL,
                           "%s: %s (the outcome is unknown: read it back before a retry, which "
                           "may count it twice)",
                           what, msg);
    return lg__req_error(rq, 500, "internal", NULL,
                         "%s: %s (nothing was decided or stored; it is safe to retry)", what,
                         rc == LG_EBUSY ? "the store was busy" : msg);
  }
}

static lg__worker_t *worker(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  if (!w) lg__req_store_error(rq, e.code ? e.code : LG_ESTORE, &e, "the store cannot be opened");
  return w;
}

/* The thread's worker for a read of the path's id, or NULL once the
 * error is answered (no_id, a 404, for an id no store would have). */
static lg__worker_t *id_worker(lg__req_t *rq, const char *no_id) {
  if (!valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "%s", no_id);
    return NULL;
  }
  return worker(rq);
}

/* The scopes of a body's "scopes" (checked by body.c: at most
 * LG_BUDGET_MAX_SCOPES strings) into out, borrowed; returns how many. */
static size_t body_scopes(const json_t *arr, const char *out[LG_BUDGET_MAX_SCOPES]) {
  size_t n = arr ? json_array_size(arr) : 0;
  if (n > LG_BUDGET_MAX_SCOPES) n = LG_BUDGET_MAX_SCOPES;
  for (size_t k = 0; k < n; k++) out[k] = json_string_value(json_array_get(arr, k));
  return n;
}

/* ------------------------------------------------------------------ */
/* Writes: one way for every route that changes the store.             */

/* A route's write, on the heap while it waits. Each route's job type
 * starts with this one and adds its own fields.
 *
 * With a committer (sqlite:, memory:; srv->batcher) the handler parks the
 * request (http.c suspends the connection and goes on serving others) and
 * the write runs on the committer's store handle inside its batch's
 * transaction; the answer is made on the HTTP thread once the batch is
 * committed (write_finish). So an HTTP thread never waits for the
 * database's write lock, which another process may hold for the whole busy
 * timeout, and the reads it serves meanwhile go to the store's reader.
 * Without a committer (postgres:) the write runs at once on the thread's
 * own connection, each store call its own transaction. */
typedef struct write_job write_job_t;
typedef struct write_kind write_kind_t;
struct write_job {
  lg__job_t job;            /* first: rq->job points here */
  const write_kind_t *k;    /* what it is (static) */
  const char *id;           /* the path's id (rq->id, which outlives the job) */
  lg__body_t b;             /* the parsed body */
  int64_t now_ms;           /* when the request came */
  lg_canon_t *canon;        /* the writing thread's scratch (for decisions) */
  int rc;                   /* write's result */
};

/* A route's kind of write. */
struct write_kind {
  lg__body_kind_t body;     /* how its body parses */
  const char *no_id;        /* the 404's message for a bad id in the path;
                               NULL: the path has none */
  const char *doing;        /* what it does, for an error ("claiming") */
  /* The write, on the committer (or this thread): its outcome into the
   * route's fields and *err. Returns the route's result code. */
  int (*write)(write_job_t *wj, lg_store_t *s, lg_error_t *err);
  /* The answer, on the HTTP thread, after the commit: rc is write's. */
  void (*answer)(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *err);
  void (*clear)(write_job_t *wj); /* frees the route's fields; may be NULL */
};

/* A new job of `size` bytes (a route's type, write_job_t first) of kind
 * k (static) for the request, its path's id checked and its body parsed;
 * NULL once the error is answered. */
static void *write_job_new(lg__req_t *rq, size_t size, const write_kind_t *k) {
  if (k->no_id && !valid_id(rq->id)) {
    lg__req_error(rq, 404, "not_found", NULL, "%s", k->no_id);
    return NULL;
  }
  write_job_t *wj = lg__calloc(1, size);
  if (!wj) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  if (parse(rq, k->body, &wj->b)) {
    lg__free(wj);
    return NULL;
  }
  wj->k = k;
  wj->id = rq->id;
  wj->now_ms = lg__server_now(rq->srv);
  return wj;
}

static void write_job_free(write_job_t *wj) {
  if (wj->k->clear) wj->k->clear(wj);
  lg__body_clear(&wj->b);
  lg__free(wj);
}

/* The job's write as the batcher calls it. The route's result stays in
 * the job and 0 is returned: what the write stored (each store call
 * atomic on its own) commits with the batch, or fails with it. */
static int write_call(void *ud, lg_store_t *s, lg_error_t *err) {
  write_job_t *wj = ud;
  wj->rc = wj->k->write(wj, s, err);
  return 0;
}

/* The write is done, on the HTTP thread: its answer. */
static void write_finish(lg__req_t *rq) {
  write_job_t *wj = (write_job_t *)rq->job;
  rq->job = NULL;
  if (wj->job.rc) lg__req_store_error(rq, wj->job.rc, &wj->job.err, wj->k->doing); /* nothing stored */
  else wj->k->answer(rq, wj, wj->rc, &wj->job.err);
  write_job_free(wj);
}

/* Hands the write over: to the committer (the request is parked, and
 * answered by write_finish after the commit), or, without one, runs and
 * answers it here. The handler returns after this. */
static void write_submit(lg__req_t *rq, write_job_t *wj) {
  wj->job.write = write_call;
  wj->job.ud = wj;
  rq->job = &wj->job;
  if (rq->srv->batcher) {
    wj->canon = lg__batcher_canon(rq->srv->batcher);
    rq->finish = write_finish;
    return;
  }
  lg__worker_t *w = worker(rq);
  if (!w) {
    rq->job = NULL;
    write_job_free(wj);
    return;
  }
  wj->canon = w->canon;
  lg__job_run(w->store, &wj->job);
  write_finish(rq);
}

/* ------------------------------------------------------------------ */
/* Creating runs.                                                      */

/* A run to create. */
typedef struct create_job {
  write_job_t w;       /* first */
  char idbuf[32];      /* the id made here when the body named none */
  const char *run_id;  /* the body's run_id, or idbuf */
  lg_policy_t *pol;    /* its policy (a reference) */
  char *pjson;         /* the policy's JSON text */
  lg_run_t *run;       /* the new run */
  const char *scopes[LG_BUDGET_MAX_SCOPES]; /* its shared budgets (the body's) */
  size_t nscopes;
  int checked;         /* the scopes exist: the run's creation was tried */
  int same;            /* it existed, created with the same body */
} create_job_t;

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

/* The run's id: the body's, or a new one. 0, or -1 once answered. */
static int create_id(lg__req_t *rq, create_job_t *cj) {
  cj->run_id = cj->w.b.run_id;
  if (!cj->run_id) {
    if (lg__step_new_run_id(cj->idbuf)) {
      lg__req_error(rq, 500, "internal", NULL, "no randomness for a run id");
      return -1;
    }
    cj->run_id = cj->idbuf;
  } else if (!lg__path_segment_ok(cj->run_id)) {
    lg__req_error(rq, 400, "invalid_request", "run_id",
                  "run_id: must not contain '/' nor be \".\" or \"..\" (its URLs could not name it)");
    return -1;
  }
  if (cj->w.b.group && !lg__path_segment_ok(cj->w.b.group)) { /* as its cancel's path */
    lg__req_error(rq, 400, "invalid_request", "group",
                  "group: must not contain '/' nor be \".\" or \"..\" (its cancel's URL could not name it)");
    return -1;
  }
  return 0;
}

/* The run's policy: the body's, or the server's default. 0, or -1 once
 * answered. */
static int create_policy(lg__req_t *rq, create_job_t *cj) {
  const json_t *given = cj->w.b.policy;
  if (!given) {
    cj->pol = lg_policy_ref(rq->srv->default_policy);
    cj->pjson = lg__strdup(rq->srv->default_policy_json);
  } else {
    size_t len;
    lg_error_t e = {0};
    char *text = lg__json_text(given, &len);
    cj->pol = text ? lg_policy_parse(text, len, "policy", &e) : NULL;
    lg__free(text);
    if (!cj->pol && text && e.code != LG_ENOMEM) {
      char field[160];
      snprintf(field, sizeof field, "policy%s%s", e.field[0] ? "." : "", e.field);
      lg__req_error(rq, 400, "invalid_request", field, "%s: %s", field, e.message);
      return -1;
    }
    cj->pjson = cj->pol ? lg_policy_to_json(cj->pol) : NULL;
  }
  if (!cj->pjson) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return -1;
  }
  return 0;
}

/* The run itself, in memory. 0, or -1 once answered. */
static int create_run(lg__req_t *rq, create_job_t *cj) {
  const lg__body_t *b = &cj->w.b;
  lg_error_t e = {0};
  cj->run = lg_run_new(cj->run_id, b->group, cj->pol,
                       b->has_progress_version ? &b->progress_version : NULL, NULL, &e);
  if (cj->run) return 0;
  if (e.code && e.code != LG_ENOMEM) lg__req_error(rq, 400, "invalid_request", e.field, "%s", e.message);
  else lg__req_error(rq, 500, "internal", NULL, "out of memory");
  return -1;
}

/* On the committer: the scopes must exist (a typo must not leave a run
 * unguarded), then the run, its scopes and its first trace line. */
static int create_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  create_job_t *cj = (create_job_t *)wj;
  const lg__body_t *b = &wj->b;
  int rc = cj->nscopes ? lg_budget_scopes_check(s, cj->scopes, cj->nscopes, err) : 0;
  if (rc) return rc;
  cj->checked = 1;
  return lg__step_create(s, cj->run, cj->pjson, b->has_progress_version ? &b->progress_version : NULL,
                         cj->scopes, cj->nscopes, wj->now_ms, &cj->same, err);
}

static void create_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  create_job_t *cj = (create_job_t *)wj;
  if (!rc) {
    atomic_fetch_add(&rq->srv->metrics.runs_active, 1);
    run_created_answer(rq, cj->run_id, wj->b.group, cj->pjson, 201);
  } else if (!cj->checked && (rc == LG_ENOTFOUND || rc == LG_EINVAL)) {
    lg__req_error(rq, rc == LG_ENOTFOUND ? 404 : 400,
                  rc == LG_ENOTFOUND ? "not_found" : "invalid_request", "scopes", "scopes: %s",
                  e->message);
  } else if (!cj->checked) {
    lg__req_store_error(rq, rc, e, "checking the scopes");
  } else if (rc == LG_ECONFLICT && cj->same) {
    /* Already there, from the same body: a client's retry. */
    run_created_answer(rq, cj->run_id, wj->b.group, cj->pjson, 200);
  } else if (rc == LG_ECONFLICT) {
    lg__req_error(rq, 409, "conflict", "run_id",
                  "run_id: run \"%s\" already exists with a different group, policy or "
                  "progress_version",
                  cj->run_id);
  } else {
    lg__req_store_error(rq, rc, e, wj->k->doing);
  }
}

static void create_clear(write_job_t *wj) {
  create_job_t *cj = (create_job_t *)wj;
  lg_run_free(cj->run);
  lg_policy_free(cj->pol);
  lg__free(cj->pjson);
}

void lg__h_run_create(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_RUN, NULL, "creating the run", create_write,
                                 create_answer, create_clear};
  create_job_t *cj = write_job_new(rq, sizeof *cj, &k);
  if (!cj) return;
  if (create_id(rq, cj) || create_policy(rq, cj) || create_run(rq, cj)) {
    write_job_free(&cj->w);
    return;
  }
  cj->nscopes = body_scopes(cj->w.b.scopes, cj->scopes);
  write_submit(rq, &cj->w);
}

/* ------------------------------------------------------------------ */
/* Reading runs.                                                       */

/* The stored run of the path's id, for the GET handlers: the thread's
 * worker, or NULL once the error (404, or the store's) is answered. */
static lg__worker_t *read_run(lg__req_t *rq, lg_run_record_t *rec) {
  lg__worker_t *w = id_worker(rq, "no run with that id");
  if (!w) return NULL;
  lg_error_t e = {0};
  int rc = lg_store_run_get(w->store, rq->id, rec, &e);
  if (rc == LG_ENOTFOUND) lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
  else if (rc) lg__req_store_error(rq, rc, &e, "reading the run");
  return rc ? NULL : w;
}

/* A run as GET /v1/runs/{id} and each of GET /v1/runs answer it: its
 * record with the counters and the envelope of its saved state (an
 * active run's too, which the row does not keep). */
static void run_json(lg_server_t *srv, lg__buf_t *b, const lg_run_record_t *rec) {
  lg_error_t e = {0};
  lg_counters_t c;
  memset(&c, 0, sizeof c);
  lg_policy_t *pol = lg__server_policy(srv, rec->policy_json, &e);
  lg_run_t *run = pol && rec->state ? lg_run_load(rec->state, rec->state_len, pol, NULL, &e) : NULL;
  if (run) lg_run_counters(run, &c);
  char created[32], updated[32];
  lg__time_rfc3339(rec->created_ms, created);
  lg__time_rfc3339(rec->updated_ms, updated);
  lg__buf_puts(b, "{\"run_id\":");
  jstr(b, rec->run_id);
  lg__buf_puts(b, ",\"group\":");
  jstr(b, rec->group);
  lg__buf_printf(b, ",\"status\":\"%s\",\"terminal_reason\":", rec->stopped ? "stopped" : "active");
  jstr(b, rec->terminal_reason);
  lg__buf_printf(b, ",\"created_at\":\"%s\",\"updated_at\":\"%s\",\"counters\":", created, updated);
  char *cj = lg_counters_to_json(&c);
  if (!cj || lg__buf_puts(b, cj)) b->oom = true;
  lg__free(cj);
  lg__buf_puts(b, ",\"envelope\":");
  char *env = run ? lg_run_envelope_json(run) : NULL;
  lg__buf_puts(b, env ? env : rec->envelope_json && *rec->envelope_json ? rec->envelope_json : "null");
  lg__buf_putc(b, '}');
  lg__free(env);
  lg_run_free(run);
  lg_policy_free(pol);
}

void lg__h_run_get(lg__req_t *rq) {
  lg_run_record_t rec = {0};
  if (!read_run(rq, &rec)) return;
  run_json(rq->srv, &rq->out, &rec);
  rq->status = 200;
  lg_run_record_clear(&rec);
}

typedef struct list_ctx {
  lg_server_t *srv;
  lg__buf_t *b;   /* the answer */
  int n;          /* runs written */
  const char *unknown; /* the first unknown query parameter */
  const char *twice;   /* the first one given twice (which would count?) */
  unsigned seen;       /* the known ones given, by bit */
} list_ctx_t;

static enum MHD_Result list_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value) {
  (void)kind;
  (void)value;
  static const char *const known[] = {"status", "reason", "limit", "group"};
  list_ctx_t *lc = cls;
  for (unsigned i = 0; i < LG__ARRAY_LEN(known); i++) {
    if (strcmp(key, known[i])) continue;
    if (lc->seen & 1u << i) {
      lc->twice = key;
      return MHD_NO;
    }
    lc->seen |= 1u << i;
    return MHD_YES;
  }
  lc->unknown = key;
  return MHD_NO;
}

static int list_cb(void *ud, const lg_run_record_t *rec) {
  list_ctx_t *lc = ud;
  if (lc->n++) lg__buf_putc(lc->b, ',');
  run_json(lc->srv, lc->b, rec);
  return lc->b->oom ? LG_ENOMEM : 0;
}

void lg__h_run_list(lg__req_t *rq) {
  list_ctx_t lc = {rq->srv, &rq->out, 0, NULL, NULL, 0};
  MHD_get_connection_values(rq->conn, MHD_GET_ARGUMENT_KIND, list_arg, &lc);
  if (lc.unknown) {
    lg__req_error(rq, 400, "invalid_request", lc.unknown,
                  "%s: unknown query parameter (known: status, reason, group, limit)", lc.unknown);
    return;
  }
  if (lc.twice) {
    lg__req_error(rq, 400, "invalid_request", lc.twice, "%s: given more than once", lc.twice);
    return;
  }
  lg_run_filter_t f = {.with_state = 1}; /* each run's counters */
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
    long v = strspn(limit, "0123456789") == strlen(limit) && strlen(limit) <= 5 ? atol(limit) : 0;
    if (v < 1 || v > 10000) { /* digits alone: no sign, no space */
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
    lg__req_store_error(rq, rc, &e, "listing runs");
    return;
  }
  lg__buf_puts(&rq->out, "]}");
  rq->status = 200;
}

/* ------------------------------------------------------------------ */
/* Decisions: each route's body as its event, for the decision step.   */

/* A decision with everything it holds, on the heap while it waits. */
typedef struct decide_job {
  write_job_t w;       /* first */
  lg__step_t st;       /* the step: its event in, its outcome out */
  char *args, *value, *world; /* compact JSON of the body's values */
  lg_prices_t *prices; /* a reference, for model and usage events */
} decide_job_t;

static lg_policy_t *server_policy(void *ud, const char *json, lg_error_t *err) {
  return lg__server_policy(ud, json, err);
}

/* Parses "N" (a reservation id as /model answered it: digits, a positive
 * int64); 0 for none, -1 for anything else. */
static int64_t reservation_of(const char *s) {
  if (!s) return 0;
  if (!*s || strspn(s, "0123456789") != strlen(s)) return -1; /* no sign, no space */
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  return errno == ERANGE || v <= 0 ? -1 : (int64_t)v;
}

/* A result's value as the engine classes it (as the trace reader does). */
static lg_value_kind_t value_kind(const json_t *v) {
  if (!v) return LG_VALUE_ABSENT;
  if (json_is_null(v)) return LG_VALUE_NULL;
  if (json_is_string(v)) { /* blank: white space only */
    const char *t = json_string_value(v);
    size_t n = json_string_length(v);
    if (lg__json_ws_end(t, 0, n) == n) return LG_VALUE_BLANK;
  }
  return LG_VALUE_PRESENT;
}

/* The body of a decision route as the event it stands for. Returns 0, or
 * -1 once an error is answered. */
static int body_event(lg__req_t *rq, decide_job_t *dj) {
  const lg__body_t *b = &dj->w.b;
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

static void note_step(lg_server_t *srv, const lg__step_t *st) {
  lg__server_note_step(srv, st);
  if (st->budget_refused) lg__metrics_budget_refusal(&srv->metrics, st->refusal.limit_source);
}

/* The answer to a step that did not decide. */
static void step_error(lg__req_t *rq, const lg__step_t *st, int rc, lg_error_t *e,
                       const char *doing) {
  const char *msg = lg__error_text(e, rc);
  switch (st->fail) {
  case LG__STEP_BAD_EVENT: lg__req_error(rq, 400, "invalid_request", e->field, "%s", msg); return;
  case LG__STEP_CONFLICT: lg__req_error(rq, 409, "conflict", e->field, "%s", msg); return;
  case LG__STEP_UNPRICED: lg__req_error(rq, 422, "unprocessable", e->field, "%s", msg); return;
  case LG__STEP_NO_RUN: lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id); return;
  case LG__STEP_REFUSED: { /* too much in flight: 429, nothing changed */
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
  default: lg__req_store_error(rq, rc, e, doing); return;
  }
}

static void decide_clear(write_job_t *wj) {
  decide_job_t *dj = (decide_job_t *)wj;
  lg__step_clear(&dj->st);
  lg_prices_free(dj->prices);
  lg__free(dj->args);
  lg__free(dj->value);
  lg__free(dj->world);
}

/* On the committer: the step, under the run's lock. */
static int decide_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  decide_job_t *dj = (decide_job_t *)wj;
  dj->st.canon = wj->canon;
  return lg_store_with_run(s, wj->id, lg__step_locked, &dj->st, err);
}

static void decide_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  lg__step_t *st = &((decide_job_t *)wj)->st;
  rc = lg__step_finish(st, rc, e);
  if (rc) {
    step_error(rq, st, rc, e, wj->k->doing);
    return;
  }
  rq->status = 200;
  lg__buf_t tmp = rq->out;
  rq->out = st->answer;
  st->answer = tmp;
  note_step(rq->srv, st);
}

void lg__h_decide(lg__req_t *rq) {
#define LG__DECIDE(rt, body)                                                                       \
  [LG__RT_##rt] = {LG__B_##body, "no run with that id", "deciding", decide_write, decide_answer,   \
                   decide_clear}
  static const write_kind_t kinds[LG__RT__COUNT] = {
      LG__DECIDE(CALLS, CALL),       LG__DECIDE(RESULTS, RESULT), LG__DECIDE(STATE, STATE),
      LG__DECIDE(HANDOFFS, HANDOFF), LG__DECIDE(MODEL, MODEL),    LG__DECIDE(USAGE, USAGE),
      LG__DECIDE(TEXT, TEXT),        LG__DECIDE(USER, USER),      LG__DECIDE(COMPACTION, COMPACTION),
      LG__DECIDE(RESUME, RESUME)};
#undef LG__DECIDE
  lg_server_t *srv = rq->srv;
  decide_job_t *dj = write_job_new(rq, sizeof *dj, &kinds[rq->route]);
  if (!dj) return;
  lg__step_init(&dj->st, NULL, dj->w.now_ms);
  int brc = body_event(rq, dj);
  if (brc) {
    if (brc == -2) lg__req_error(rq, 500, "internal", NULL, "out of memory");
    write_job_free(&dj->w);
    return;
  }
  lg__step_t *st = &dj->st;
  st->policy = server_policy;
  st->policy_ud = srv;
  if (rq->route == LG__RT_MODEL || rq->route == LG__RT_USAGE)
    st->prices = dj->prices = lg_price_book_get(srv->prices);
  write_submit(rq, &dj->w);
}

/* ------------------------------------------------------------------ */
/* The kill switch.                                                    */

/* A cancel that failed after its deny rule was stored: the kill switch
 * holds (every worker checks the rule before it decides), so the answer
 * says that, not "nothing stored"; what failed is stopping the stored
 * runs, which a retry finishes. */
static void cancel_half_done(lg__req_t *rq, int rc, const lg_error_t *e, const char *doing,
                             const char *stopped) {
  char buf[600];
  log_failure(rq->srv, rq, e, rc);
  lg__req_error(rq, 500, "internal", NULL,
                "%s: %s. The cancel itself is stored: every later call of %s, from any worker, "
                "is a stop; %s. Retrying is safe and stops the rest",
                doing, rc == LG_EBUSY ? "the store was busy" : lg__error_public(e, rc, buf, sizeof buf),
                stopped ? "the group's runs" : "the run",
                stopped ? stopped : "the run's own record was not updated");
}

/* A run's cancel. */
typedef struct cancel_job {
  write_job_t w;    /* first */
  lg__step_t st;    /* the cancel's step */
  int rule_stored;  /* its deny rule is written */
} cancel_job_t;

static int cancel_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  cancel_job_t *cj = (cancel_job_t *)wj;
  return lg__step_cancel(s, wj->id, wj->b.reason, wj->now_ms, &cj->st, &cj->rule_stored, err);
}

static void cancel_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  lg__step_t *st = &((cancel_job_t *)wj)->st;
  if (rc && ((cancel_job_t *)wj)->rule_stored && st->fail == LG__STEP_STORE) {
    cancel_half_done(rq, rc, e, wj->k->doing, NULL);
    return;
  }
  if (rc && ((cancel_job_t *)wj)->rule_stored && st->fail == LG__STEP_NO_RUN) {
    /* a kill switch holds what it was asked: the run is refused from its
     * first decision if it comes (a typo's rule stops nothing) */
    lg__req_error(rq, 404, "not_found", NULL,
                  "no run \"%s\" yet; its cancel is kept: if a run of that id is created, its "
                  "first decision is a stop",
                  rq->id);
    return;
  }
  if (rc) {
    step_error(rq, st, rc, e, wj->k->doing);
    return;
  }
  note_step(rq->srv, st);
  lg__buf_puts(&rq->out, "{\"run_id\":");
  jstr(&rq->out, wj->id);
  lg__buf_printf(&rq->out, ",\"status\":\"stopped\",\"cancelled\":%s,\"envelope\":%s}",
                 st->was_stopped ? "false" : "true", st->envelope ? st->envelope : "null");
  rq->status = 200;
}

static void cancel_clear(write_job_t *wj) { lg__step_clear(&((cancel_job_t *)wj)->st); }

void lg__h_run_cancel(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_CANCEL, "no run with that id", "cancelling",
                                 cancel_write, cancel_answer, cancel_clear};
  cancel_job_t *cj = write_job_new(rq, sizeof *cj, &k);
  if (cj) write_submit(rq, &cj->w);
}

/* A group's cancel: the runs it stopped, with their steps' outcomes for
 * the metrics and the log (noted once stored). */
typedef struct group_job {
  write_job_t w;      /* first */
  lg__step_t *steps;  /* of the runs stopped (only stop_log kept) */
  char **ids;         /* their ids (new) */
  size_t n, cap;      /* how many; room */
  int oom;            /* a run stopped could not be kept */
  int rule_stored;    /* the group's deny rule is written */
} group_job_t;

/* On the committer, for each run stopped: keeps its id and outcome. */
static void group_run_cancelled(void *ud, const char *run_id, lg__step_t *st) {
  group_job_t *g = ud;
  if (g->n == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 8;
    lg__step_t *steps = lg__realloc(g->steps, cap * sizeof *steps);
    if (steps) g->steps = steps;
    char **ids = steps ? lg__realloc(g->ids, cap * sizeof *ids) : NULL;
    if (ids) g->ids = ids;
    if (!ids) {
      g->oom = 1;
      return;
    }
    g->cap = cap;
  }
  if (!(g->ids[g->n] = lg__strdup(run_id))) {
    g->oom = 1;
    return;
  }
  lg__step_t *kept = &g->steps[g->n++];
  *kept = *st; /* its stop_log moves here; the rest stays the step's */
  memset(&kept->answer, 0, sizeof kept->answer);
  kept->envelope = NULL;
  memset(&st->stop_log, 0, sizeof st->stop_log);
}

static int group_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  /* The group's deny rule first, durable on its own: every worker of
   * every replica checks it before its next decision, and it holds for
   * runs of the group that do not exist yet. */
  return lg__step_cancel_group(s, wj->id, wj->b.reason, wj->now_ms, group_run_cancelled, wj,
                               &((group_job_t *)wj)->rule_stored, err);
}

static void group_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  group_job_t *g = (group_job_t *)wj;
  for (size_t i = 0; i < g->n; i++) note_step(rq->srv, &g->steps[i]); /* stored */
  if (rc && g->rule_stored) {
    char stopped[96];
    snprintf(stopped, sizeof stopped, "%zu of its active runs were stopped before the failure", g->n);
    cancel_half_done(rq, rc, e, wj->k->doing, stopped);
    return;
  }
  if (rc) {
    lg__req_store_error(rq, rc, e, wj->k->doing);
    return;
  }
  if (g->oom) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory listing the runs cancelled");
    return;
  }
  lg__buf_puts(&rq->out, "{\"group\":");
  jstr(&rq->out, wj->id);
  lg__buf_puts(&rq->out, ",\"cancelled\":[");
  for (size_t i = 0; i < g->n; i++) {
    if (i) lg__buf_putc(&rq->out, ',');
    jstr(&rq->out, g->ids[i]);
  }
  lg__buf_puts(&rq->out, "]}");
  rq->status = 200;
}

static void group_clear(write_job_t *wj) {
  group_job_t *g = (group_job_t *)wj;
  for (size_t i = 0; i < g->n; i++) {
    lg__step_clear(&g->steps[i]);
    lg__free(g->ids[i]);
  }
  lg__free(g->steps);
  lg__free(g->ids);
}

void lg__h_group_cancel(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_CANCEL, "no group with that name",
                                 "cancelling the group's runs", group_write, group_answer,
                                 group_clear};
  group_job_t *g = write_job_new(rq, sizeof *g, &k);
  if (g) write_submit(rq, &g->w);
}

/* ------------------------------------------------------------------ */
/* Traces.                                                             */

void lg__h_trace(lg__req_t *rq) {
  lg__worker_t *w = id_worker(rq, "no run with that id");
  if (!w) return;
  lg_error_t e = {0};
  char *text = NULL;
  int rc = lg_store_run_trace(w->store, rq->id, &text, NULL, &e);
  if (rc == LG_ENOTFOUND) {
    lg__req_error(rq, 404, "not_found", NULL, "no run \"%s\"", rq->id);
    return;
  }
  if (rc) {
    lg__req_store_error(rq, rc, &e, "reading the run's trace");
    return;
  }
  answer_text(rq, text, 200);
  if (rq->status == 200) rq->content_type = "application/x-ndjson";
}

/* ------------------------------------------------------------------ */
/* Operations (the idempotency ledger).                                */

/* Answers with the operation of `key` as it was read (rc, op, e). No row
 * is 404 for a GET; after a commit or fail (missing_is_free) it is a key
 * that a retryable failure freed. */
static void op_reply(lg__req_t *rq, const char *key, int rc, const lg_operation_t *op,
                     const lg_error_t *e, int missing_is_free) {
  if (rc == LG_ENOTFOUND && !missing_is_free) {
    lg__req_error(rq, 404, "not_found", NULL, "no operation \"%s\"", key);
  } else if (rc == LG_ENOTFOUND) {
    lg__buf_puts(&rq->out, "{\"key\":");
    jstr(&rq->out, key);
    lg__buf_puts(&rq->out, ",\"state\":\"free\"}");
    rq->status = 200;
  } else if (rc) {
    lg__req_store_error(rq, rc, e, "reading the operation");
  } else {
    answer_text(rq, lg_operation_to_json(op), 200);
  }
}

/* A claim. */
typedef struct claim_job {
  write_job_t w;  /* first */
  lg_claim_t cl;  /* its outcome */
} claim_job_t;

static int claim_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  const lg__body_t *b = &wj->b;
  return lg_store_claim(s, b->key, b->request_fp, b->run_id, b->lease_ms > 0 ? b->lease_ms : 0,
                        wj->now_ms, &((claim_job_t *)wj)->cl, err);
}

static void claim_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  const lg_claim_t *cl = &((claim_job_t *)wj)->cl;
  const char *key = wj->b.key;
  if (rc) {
    lg__req_store_error(rq, rc, e, wj->k->doing);
    return;
  }
  lg__metrics_ledger(&rq->srv->metrics, cl->outcome);
  lg__buf_t *o = &rq->out;
  switch (cl->outcome) {
  case LG_CLAIM_CLAIMED:
    rq->status = 201;
    lg__buf_puts(o, "{\"outcome\":\"claimed\",\"key\":");
    jstr(o, key);
    /* What commit and fail must present: the claimant's proof. */
    lg__buf_puts(o, ",\"claim_token\":");
    jstr(o, cl->claim_token);
    lg__buf_putc(o, '}');
    break;
  case LG_CLAIM_REPLAY:
    rq->status = 200;
    lg__buf_puts(o, "{\"outcome\":\"replay\",\"key\":");
    jstr(o, key);
    lg__buf_printf(o, ",\"failed\":%s,\"result\":", cl->failed ? "true" : "false");
    if (cl->result && cl->result_len) lg__buf_append(o, cl->result, cl->result_len);
    else lg__buf_puts(o, "null");
    lg__buf_putc(o, '}');
    break;
  default: {
    int status = cl->outcome == LG_CLAIM_MISMATCH ? 422 : 409;
    const char *type = status == 422 ? "unprocessable" : "conflict";
    const char *msg =
        cl->outcome == LG_CLAIM_MISMATCH
            ? "the key is held for a different request fingerprint"
        : cl->outcome == LG_CLAIM_IN_PROGRESS
            ? "another worker holds this key and has not reported an outcome yet"
            : "a claim of this key ran out of its lease with no outcome: reconcile it (commit or "
              "fail) before anyone runs it again";
    rq->status = status;
    lg__buf_printf(o, "{\"outcome\":\"%s\",\"key\":", lg_claim_outcome_name(cl->outcome));
    jstr(o, key);
    lg__buf_printf(o, ",\"error\":{\"code\":%d,\"type\":\"%s\",\"message\":\"%s\"}}", status, type,
                   msg);
  }
  }
}

static void claim_clear(write_job_t *wj) { lg_claim_clear(&((claim_job_t *)wj)->cl); }

void lg__h_op_claim(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_CLAIM, NULL, "claiming", claim_write, claim_answer,
                                 claim_clear};
  claim_job_t *cj = write_job_new(rq, sizeof *cj, &k);
  if (!cj) return;
  write_submit(rq, &cj->w); /* the ledger refuses a fingerprint over its bound, naming it */
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

/* A key's commit or fail, and the operation as it is after it. */
typedef struct settle_job {
  write_job_t w;       /* first */
  lg_op_actor_t as;    /* who settles */
  char *result;        /* commit: the result's JSON text */
  size_t result_len;
  int op_rc;           /* the operation read after the write: 0 or its error */
  lg_operation_t op;
  lg_error_t op_err;
} settle_job_t;

static int commit_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  settle_job_t *sj = (settle_job_t *)wj;
  int rc = lg_store_commit_as(s, wj->id, sj->result, sj->result_len, wj->b.operation_id, &sj->as,
                              wj->now_ms, err);
  if (!rc) sj->op_rc = lg_store_operation(s, wj->id, wj->now_ms, &sj->op, &sj->op_err);
  return rc;
}

static int fail_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  settle_job_t *sj = (settle_job_t *)wj;
  int rc = lg_store_fail_as(s, wj->id, wj->b.retryable, &sj->as, wj->now_ms, err);
  if (!rc) sj->op_rc = lg_store_operation(s, wj->id, wj->now_ms, &sj->op, &sj->op_err);
  return rc;
}

static void settle_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  settle_job_t *sj = (settle_job_t *)wj;
  if (rc == LG_ENOTFOUND) lg__req_error(rq, 404, "not_found", NULL, "no operation \"%s\"", wj->id);
  else if (rc == LG_EPERM) /* 403 with who may */
    lg__req_error(rq, 403, "forbidden", e->field[0] ? e->field : NULL, "%s", e->message);
  else if (rc) lg__req_store_error(rq, rc, e, wj->k->doing);
  else op_reply(rq, wj->id, sj->op_rc, &sj->op, &sj->op_err, 1);
}

static void settle_clear(write_job_t *wj) {
  settle_job_t *sj = (settle_job_t *)wj;
  lg__free(sj->result);
  lg_operation_clear(&sj->op);
}

/* The commit or fail of the path's key (k says which). */
static void settle_key(lg__req_t *rq, const write_kind_t *k) {
  settle_job_t *sj = write_job_new(rq, sizeof *sj, k);
  if (!sj) return;
  op_actor(rq, sj->w.b.claim_token, &sj->as);
  if (sj->w.b.result && !(sj->result = lg__json_text(sj->w.b.result, &sj->result_len))) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    write_job_free(&sj->w);
    return;
  }
  write_submit(rq, &sj->w);
}

void lg__h_op_commit(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_COMMIT, "no operation with that key", "committing",
                                 commit_write, settle_answer, settle_clear};
  settle_key(rq, &k);
}

void lg__h_op_fail(lg__req_t *rq) {
  static const write_kind_t k = {LG__B_FAIL, "no operation with that key", "failing", fail_write,
                                 settle_answer, settle_clear};
  settle_key(rq, &k);
}

void lg__h_op_get(lg__req_t *rq) {
  lg__worker_t *w = id_worker(rq, "no operation with that key");
  if (!w) return;
  lg_operation_t op;
  memset(&op, 0, sizeof op);
  lg_error_t e = {0};
  int rc = lg_store_operation(w->store, rq->id, lg__server_now(rq->srv), &op, &e);
  op_reply(rq, rq->id, rc, &op, &e, 0);
  lg_operation_clear(&op);
}

/* ------------------------------------------------------------------ */
/* Budgets: the shared spend gate (src/budget). PUT/GET
 * /v1/budgets/{scope}, POST /v1/budgets/reserve and /settle; the router
 * already checked the roles. */

/* A budget error: the library's field and message, with the status of the
 * error's kind. */
void lg__req_budget_error(lg__req_t *rq, int rc, lg_error_t *e, const char *doing) {
  if (rc == LG_EINVAL || rc == LG_ERANGE)
    lg__req_error(rq, 400, "invalid_request", e->field[0] ? e->field : NULL, "%s", e->message);
  else if (rc == LG_ENOTFOUND)
    lg__req_error(rq, 404, "not_found", e->field[0] ? e->field : NULL, "%s", e->message);
  else if (rc == LG_ECONFLICT)
    lg__req_error(rq, 409, "conflict", e->field[0] ? e->field : NULL, "%s", e->message);
  else lg__req_store_error(rq, rc, e, doing);
}

static void budget_get(lg__req_t *rq) {
  lg__worker_t *w = worker(rq);
  if (!w) return;
  lg_error_t e = {0};
  lg_budget_t bud;
  int rc = lg_budget_get(w->store, rq->id, lg__server_now(rq->srv), &bud, &e);
  if (rc) lg__req_budget_error(rq, rc, &e, "reading the budget");
  else answer_text(rq, lg_budget_to_json(&bud), 200);
}

/* A budget's change, reservation or settlement. */
typedef struct budget_job {
  write_job_t w;              /* first */
  int64_t micro;              /* set: the limit; reserve: the amount;
                                 settle: the actual cost (micro-USD) */
  int64_t cap;                /* set: max_in_flight, -1 none */
  lg_budget_period_t period;  /* set */
  const char *scopes[LG_BUDGET_MAX_SCOPES]; /* reserve (the body's) */
  size_t nscopes;
  int bounded;                /* settle: at most the reservation (an agent's) */
  lg_budget_t bud;            /* set: the budget after it */
  lg_budget_reservation_t res;   /* reserve */
  lg_budget_refusal_t why;       /* reserve refused */
  lg_budget_settlement_t settled; /* settle */
} budget_job_t;

static int budget_set_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  budget_job_t *bj = (budget_job_t *)wj;
  return lg_budget_set(s, wj->id, bj->micro, bj->period, bj->cap, wj->now_ms, &bj->bud, err);
}

static void budget_set_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  if (rc) lg__req_budget_error(rq, rc, e, wj->k->doing);
  else answer_text(rq, lg_budget_to_json(&((budget_job_t *)wj)->bud), 200);
}

static int reserve_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  budget_job_t *bj = (budget_job_t *)wj;
  lg_budget_request_t req = {bj->scopes, bj->nscopes, bj->micro,
                             wj->b.ttl_ms > 0 ? wj->b.ttl_ms : 0, NULL, 0, NULL};
  return lg_budget_reserve(s, &req, wj->now_ms, &bj->res, &bj->why, err);
}

static void reserve_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  budget_job_t *bj = (budget_job_t *)wj;
  if (rc == LG_BUDGET_REFUSED) {
    lg__metrics_budget_refusal(&rq->srv->metrics, bj->why.limit_source);
    if (bj->why.retry_after_s > 0) rq->retry_after = (int)bj->why.retry_after_s;
    answer_text(rq, lg__http_refusal_json(&bj->why), lg__http_refusal_status(&bj->why));
  } else if (rc) {
    lg__req_budget_error(rq, rc, e, wj->k->doing);
  } else {
    answer_text(rq, lg__budget_reservation_json(&bj->res), 201);
  }
}

static int settle_write(write_job_t *wj, lg_store_t *s, lg_error_t *err) {
  budget_job_t *bj = (budget_job_t *)wj;
  const char *id = wj->b.reservation_id;
  return bj->bounded ? lg_budget_settle_bounded(s, id, bj->micro, wj->now_ms, &bj->settled, err)
                     : lg_budget_settle(s, id, bj->micro, wj->now_ms, &bj->settled, err);
}

static void settle_budget_answer(lg__req_t *rq, write_job_t *wj, int rc, lg_error_t *e) {
  if (rc) lg__req_budget_error(rq, rc, e, wj->k->doing);
  else answer_text(rq, lg__budget_settlement_json(&((budget_job_t *)wj)->settled), 200);
}

static void budget_clear(write_job_t *wj) {
  lg_budget_settlement_clear(&((budget_job_t *)wj)->settled);
}

/* The job of a budget write, its amounts checked (pure: before it is
 * handed over); NULL once an error is answered. */
static budget_job_t *budget_job(lg__req_t *rq, const write_kind_t *k) {
  budget_job_t *bj = write_job_new(rq, sizeof *bj, k);
  if (!bj) return NULL;
  const lg__body_t *b = &bj->w.b;
  lg_error_t e = {0};
  int rc = 0;
  bj->cap = -1;
  switch (k->body) {
  case LG__B_BUDGET_SET:
    rc = lg_budget_usd_to_micro(b->limit_usd, &bj->micro, "limit_usd", &e);
    if (!rc && b->has_max_in_flight)
      rc = lg_budget_usd_to_micro(b->max_in_flight_usd, &bj->cap, "max_in_flight_usd", &e);
    if (!rc) rc = lg_budget_period_parse(b->period, &bj->period, &e);
    break;
  case LG__B_RESERVE:
    bj->nscopes = body_scopes(b->scopes, bj->scopes);
    rc = lg_budget_usd_to_micro(b->amount_usd, &bj->micro, "amount_usd", &e);
    break;
  default: {
    rc = lg_budget_usd_to_micro(b->actual_usd, &bj->micro, "actual_usd", &e);
    /* Only an operator's settlement charges above the reservation (the
     * router let agents in): an agent's is bounded, and says so. */
    lg_server_t *srv = rq->srv;
    bj->bounded = srv->auth.n && lg__auth_role(&srv->auth, MHD_lookup_connection_value(
                                                   rq->conn, MHD_HEADER_KIND, "Authorization")) !=
                                     LG__ROLE_OPERATOR;
  }
  }
  if (rc) {
    lg__req_budget_error(rq, rc, &e, k->doing);
    write_job_free(&bj->w);
    return NULL;
  }
  return bj;
}

void lg__h_budgets(lg__req_t *rq) {
  static const write_kind_t set = {LG__B_BUDGET_SET, NULL, "setting the budget",
                                   budget_set_write, budget_set_answer, budget_clear},
                            reserve = {LG__B_RESERVE, NULL, "reserving", reserve_write,
                                       reserve_answer, budget_clear},
                            settle = {LG__B_SETTLE, NULL, "settling", settle_write,
                                      settle_budget_answer, budget_clear};
  const write_kind_t *k = NULL;
  if (!strcmp(rq->method, "GET")) {
    budget_get(rq);
    return;
  }
  if (!strcmp(rq->method, "PUT")) k = &set;
  else if (!strcmp(rq->id, "reserve")) k = &reserve;
  else if (!strcmp(rq->id, "settle")) k = &settle;
  if (!k) {
    lg__req_error(rq, 404, "not_found", NULL, "POST /v1/budgets/%s: use reserve or settle", rq->id);
    return;
  }
  budget_job_t *bj = budget_job(rq, k);
  if (bj) write_submit(rq, &bj->w);
}

/* ------------------------------------------------------------------ */
/* Health and metrics.                                                 */

/* How long a probe (/healthz, /metrics) waits for a database's answer or
 * connection (PostgreSQL; a shorter query_timeout_ms wins): a load
 * balancer's probe and Prometheus' scrape give up after a few seconds, and
 * a silent database must read as down, not as a probe that never answers. */
#define LG__PROBE_DEADLINE_MS 2000

/* The thread's store handle for a probe, its waits bounded by the probes'
 * deadline until probe_done; NULL with *e filled when it cannot be opened. */
static lg_store_t *probe_store(lg_server_t *srv, lg_error_t *e) {
  static const char why[] = "the probes' deadline";
  lg__worker_t *w = lg__server_worker_within(srv, LG__PROBE_DEADLINE_MS, why, e);
  if (!w) return NULL;
  lg__store_deadline(w->store, LG__PROBE_DEADLINE_MS, why);
  return w->store;
}

static void probe_done(lg_store_t *st) {
  if (st) lg__store_deadline(st, 0, NULL);
}

void lg__h_healthz(lg__req_t *rq) {
  /* Open to anyone: the answer names the store's kind, never its URL or
   * path (the detail goes to the log). 200 only when the store answers
   * and could take a write now; 503 with the reason otherwise. Reads go
   * to the store's reader, so this never waits behind a write. */
  lg_server_t *srv = rq->srv;
  lg_error_t e = {0};
  lg_store_t *st = probe_store(srv, &e); /* in time, however long a request may wait */
  int version = 0;
  int rc = st ? lg_store_schema_version(st, &version, &e) : (e.code ? e.code : LG_ESTORE);
  const char *reason = NULL;
  if (rc) {
    log_failure(srv, rq, &e, rc);
    reason = rc == LG_EBUSY ? "the store is locked by another writer"
             : rc == LG_ENOMEM ? "out of memory"
                               : "the store does not answer (the server's log has the detail)";
  } else if ((rc = lg__store_write_probe(st, lg__server_now(srv), &e))) {
    reason = e.message; /* the probe's own words: no URL, no path */
  }
  probe_done(st);
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
  /* A scrape is answered in time when the store does not answer: its
   * reads wait the probes' deadline, and when they fail the server's own
   * counters are still sent, runs_active as last counted, the budgets'
   * gauges without samples, and loopguard_store_up 0 says why. */
  lg_server_t *srv = rq->srv;
  lg_error_t e = {0};
  lg_store_t *st = probe_store(srv, &e);
  int rc = st ? lg__server_count_active(srv, st, &e) : (e.code ? e.code : LG_ESTORE);
  if (rq->srv->batcher) {
    uint64_t batches, jobs;
    lg__batcher_stats(rq->srv->batcher, &batches, &jobs);
    lg__buf_printf(&rq->out,
                   "# HELP loopguard_commit_batches_total Transactions of the group commit.\n"
                   "# TYPE loopguard_commit_batches_total counter\n"
                   "loopguard_commit_batches_total %llu\n"
                   "# HELP loopguard_commit_decisions_total Decisions and other writes made in those "
                   "transactions.\n"
                   "# TYPE loopguard_commit_decisions_total counter\n"
                   "loopguard_commit_decisions_total %llu\n",
                   (unsigned long long)batches, (unsigned long long)jobs);
  }
  if (rq->srv->gw) lg__gw_metrics(rq->srv->gw, &rq->out);
  int oom = lg__metrics_render(&rq->srv->metrics, &rq->out);
  if (!oom) { /* metrics_budgets.c; the store not read again once it failed */
    int brc = lg__metrics_budgets(srv, rc ? NULL : st, &rq->out, &e);
    if (brc == LG_ENOMEM) oom = 1;
    else if (brc) rc = brc;
  }
  probe_done(st);
  if (rc) log_failure(srv, rq, &e, rc);
  lg__buf_printf(&rq->out,
                 "# HELP loopguard_store_up Whether the store answered this scrape's reads (0: "
                 "the server's log has why).\n"
                 "# TYPE loopguard_store_up gauge\n"
                 "loopguard_store_up %d\n",
                 rc ? 0 : 1);
  if (oom || rq->out.oom) {
    lg__req_error(rq, 500, "internal", NULL, "out of memory");
    return;
  }
  rq->status = 200;
  rq->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
