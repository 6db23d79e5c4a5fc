/*
 * budget_list.c — GET /v1/budgets (operator): every shared budget in the
 * store, for the operator's view (what `loopguard budget list` prints).
 *
 *   200 {"budgets": [ {scope, limit_usd, period, spent_usd, reserved_usd,
 *                      resets_at, ...}, ... ]}
 *
 * Each object is the one GET /v1/budgets/{scope} answers
 * (lg_budget_to_json), in the order lg_budget_list gives (by scope). The
 * router has already checked the role; the handler only reads.
 */
#include "server.h"

#include <string.h>

typedef struct list_ctx {
  lg__buf_t *out;
  int n;    /* budgets written */
  int oom;  /* lg_budget_to_json ran out of memory */
} list_ctx_t;

static int put_one(void *ud, const lg_budget_t *b) {
  list_ctx_t *x = ud;
  char *j = lg_budget_to_json(b);
  if (!j) {
    x->oom = 1;
    return 1; /* stop the listing */
  }
  if (x->n++) lg__buf_puts(x->out, ",");
  lg__buf_puts(x->out, j);
  lg_free(j);
  return 0;
}

void lg__h_budget_list(lg__req_t *rq) {
  lg_error_t e = {0};
  lg__worker_t *w = lg__server_worker(rq->srv, &e);
  int rc = w ? 0 : (e.code ? e.code : LG_ESTORE);
  list_ctx_t x = {&rq->out, 0, 0};
  if (!rc) {
    lg__buf_puts(&rq->out, "{\"budgets\":[");
    rc = lg_budget_list(w->store, lg__server_now(rq->srv), put_one, &x, &e);
    if (x.oom) rc = LG_ENOMEM;
  }
  if (rc) {
    lg__req_store_error(rq, rc, &e, "listing the budgets");
    return;
  }
  lg__buf_puts(&rq->out, "]}");
  rq->status = 200;
}
