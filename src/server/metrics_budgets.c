/*
 * metrics_budgets.c — the shared budgets in GET /metrics: for each budget,
 * its limit, what was spent in the current period, what open reservations
 * hold, and when it resets, so dashboards and alerts can set spend against
 * limits (monitoring/).
 *
 *   loopguard_budget_limit_usd{scope}          the limit of each period
 *   loopguard_budget_spent_usd{scope}          settled in this period
 *   loopguard_budget_reserved_usd{scope}       held by open reservations
 *   loopguard_budget_resets_at_seconds{scope}  epoch seconds (period none: absent)
 *
 * The scope label comes from the store, not from a request: budgets are
 * made by operators (PUT /v1/budgets/{scope}, operator role), and at most
 * LG__METRICS_BUDGETS are shown, so a scrape stays small. Read at scrape
 * time (a scan of the budget rows, off the hot path); when the store
 * cannot be read the series are left out and the rest of /metrics stands.
 */
#include "server.h"

#define LG__METRICS_BUDGETS 200

typedef struct mb_ctx {
  lg__buf_t rows[4]; /* one block of samples per metric */
  int n;
} mb_ctx_t;

/* A label value with \\, " and newline escaped (the text format's rules). */
static void label(lg__buf_t *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"') lg__buf_putc(b, '\\'), lg__buf_putc(b, *s);
    else if (*s == '\n') lg__buf_puts(b, "\\n");
    else lg__buf_putc(b, *s);
  }
}

static void sample(lg__buf_t *b, const char *name, const char *scope, int64_t micro) {
  lg__buf_printf(b, "%s{scope=\"", name);
  label(b, scope);
  lg__buf_puts(b, "\"} ");
  lg__buf_usd(b, lg_budget_micro_to_nusd(micro));
  lg__buf_putc(b, '\n');
}

static int one(void *ud, const lg_budget_t *bud) {
  mb_ctx_t *c = ud;
  if (c->n >= LG__METRICS_BUDGETS) return 1; /* enough: stop the listing */
  c->n++;
  sample(&c->rows[0], "loopguard_budget_limit_usd", bud->scope, bud->limit_micro);
  sample(&c->rows[1], "loopguard_budget_spent_usd", bud->scope, bud->spent_micro);
  sample(&c->rows[2], "loopguard_budget_reserved_usd", bud->scope, bud->reserved_micro);
  if (bud->resets_at_ms >= 0) {
    lg__buf_puts(&c->rows[3], "loopguard_budget_resets_at_seconds{scope=\"");
    label(&c->rows[3], bud->scope);
    lg__buf_printf(&c->rows[3], "\"} %lld\n", (long long)(bud->resets_at_ms / 1000));
  }
  return 0;
}

int lg__metrics_budgets(lg_server_t *srv, lg_store_t *st, lg__buf_t *b, lg_error_t *e) {
  static const char *heads[4] = {
      "# HELP loopguard_budget_limit_usd The limit of each period of a shared budget, USD.\n"
      "# TYPE loopguard_budget_limit_usd gauge\n",
      "# HELP loopguard_budget_spent_usd Spent (settled) in the current period of a budget, USD.\n"
      "# TYPE loopguard_budget_spent_usd gauge\n",
      "# HELP loopguard_budget_reserved_usd Held by open reservations against a budget, USD.\n"
      "# TYPE loopguard_budget_reserved_usd gauge\n",
      "# HELP loopguard_budget_resets_at_seconds When a budget's spend goes back to 0 (Unix time).\n"
      "# TYPE loopguard_budget_resets_at_seconds gauge\n"};
  mb_ctx_t c;
  memset(&c, 0, sizeof c);
  int rc = st ? lg_budget_list(st, lg__server_now(srv), one, &c, e) : 0;
  if (rc == 1) rc = 0; /* enough of them */
  for (int i = 0; i < 4; i++) {
    lg__buf_puts(b, heads[i]);
    if (!rc && c.rows[i].len) lg__buf_append(b, c.rows[i].data, c.rows[i].len);
    lg__buf_free(&c.rows[i]);
  }
  return b->oom ? LG_ENOMEM : rc;
}
