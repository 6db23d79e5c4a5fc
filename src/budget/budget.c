/*
 * budget.c — shared budgets: their rules, written once over the store's
 * row interface (src/store/store.h, version 2), so that memory:, sqlite:
 * and postgres: answer alike. Also amounts, periods, scopes and the JSON
 * forms of budgets, refusals and settlements.
 *
 * What is stored. A budget row keeps its limit, period, max_in_flight,
 * the spent of one period (period_start_ms), and what its open
 * reservations hold: a sum and a count, with next_expiry_ms, a time no
 * later than the expiry of any of them. Each open reservation also has a
 * hold row per scope (amount, expires_ms). The counters change only under
 * the budget's row lock, with the hold rows, so a reservation reads one
 * row per scope — never a scan of hold rows, which come and go with every
 * call (on PostgreSQL their dead versions stay until vacuum, and a scan
 * per call would slow down with the traffic). Only when next_expiry_ms has
 * come are the hold rows read, and the counters set again from the live
 * ones. So:
 *   - a reservation that is not settled stops holding at its expiry, to
 *     the millisecond, with no write and no sweeper: a crashed agent
 *     cannot pin a budget. Readers leave it out from that instant; the
 *     next write that touches the scope (and lg_budget_purge) deletes its
 *     row and stores the counters without it;
 *   - a period that ended reads as spent 0 at its first instant, and the
 *     next write of the row stores the new period (lazy rollover).
 *
 * The invariant, spent + reserved <= limit for every scope, is kept by
 * reserve: it reads every scope under its row lock and writes the holds in
 * the same transaction, so that no two reservations decide on the same
 * figures. Locks are taken in scope order (byte-wise), by reserve and by
 * settle alike, so two transactions over overlapping scopes never wait for
 * each other in a cycle. On SQLite the whole transaction holds the
 * database's write lock (BEGIN IMMEDIATE); on PostgreSQL each budget row
 * is locked FOR UPDATE and its holds are read by a statement that starts
 * once the lock is had; in memory the handle's lock serializes everything.
 *
 * Settlement. The actual cost is added to the spent of the period the
 * settlement falls in (a call that straddles midnight is charged to the
 * new day: its hold counted against the new day already), also when it is
 * above the reservation and also when it comes after the TTL: that money
 * was spent, and a budget that a team pays from must show it. Those are
 * the only two ways spent + reserved can pass a limit, and only by what
 * was charged beyond the holds.
 */
#include "budget.h"

#include "../store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define DAY_MS 86400000LL
#define ID_PREFIX "rsv_"
#define RUN_ID_MAX 1024
#define MODEL_MAX 256

/* ------------------------------------------------------------------ */
/* Amounts.                                                             */

int lg_budget_usd_to_micro(double usd, int64_t *micro, const char *what, lg_error_t *err) {
  const char *w = what ? what : "amount";
  if (isnan(usd) || isinf(usd))
    return lg__err(err, LG_EINVAL, what, -1, "%s must be a finite number of USD", w);
  if (usd < 0) return lg__err(err, LG_EINVAL, what, -1, "%s must not be negative", w);
  if (usd > LG_BUDGET_MAX_USD)
    return lg__err(err, LG_ERANGE, what, -1, "%s is beyond %.0f USD", w, LG_BUDGET_MAX_USD);
  if (lg__usd_to_units(usd, LG__USD_MICRO, micro))
    return lg__err(err, LG_ERANGE, what, -1, "%s is beyond %.0f USD", w, LG_BUDGET_MAX_USD);
  return 0;
}

int64_t lg_budget_nusd_to_micro(int64_t nusd) {
  if (nusd <= 0) return 0;
  return nusd / LG_BUDGET_NUSD_PER_MICRO + (nusd % LG_BUDGET_NUSD_PER_MICRO != 0);
}

int64_t lg_budget_micro_to_nusd(int64_t micro) {
  int64_t n;
  if (micro <= 0) return 0;
  return __builtin_mul_overflow(micro, (int64_t)LG_BUDGET_NUSD_PER_MICRO, &n) ? INT64_MAX : n;
}

/* a + b, saturating at INT64_MAX (operands are never negative). */
static int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Appends micro-dollars as a JSON number of USD. */
static void put_usd(lg__buf_t *b, int64_t micro) { lg__buf_usd(b, lg_budget_micro_to_nusd(micro)); }

static void put_time_or_null(lg__buf_t *b, int64_t ms) {
  if (ms < 0) {
    lg__buf_puts(b, "null");
    return;
  }
  char t[32];
  lg__time_rfc3339(ms, t);
  lg__buf_printf(b, "\"%s\"", t);
}

/* ------------------------------------------------------------------ */
/* Periods: civil dates from day numbers (H. Hinnant's algorithms, exact
 * for the proleptic Gregorian calendar, leap years included).           */

static int64_t floor_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

static int64_t days_from_civil(int64_t y, int m, int d) {
  y -= m <= 2;
  int64_t era = (y >= 0 ? y : y - 399) / 400;
  int64_t yoe = y - era * 400;
  int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m) {
  z += 719468;
  int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  int64_t doe = z - era * 146097;
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  int64_t mp = (5 * doy + 2) / 153;
  *m = (int)(mp < 10 ? mp + 3 : mp - 9);
  *y = yoe + era * 400 + (*m <= 2);
}

static const char *const period_names[] = {"none", "daily", "weekly", "monthly"};

const char *lg_budget_period_name(lg_budget_period_t p) {
  return (unsigned)p < 4 ? period_names[p] : "?";
}

int lg_budget_period_parse(const char *name, lg_budget_period_t *out, lg_error_t *err) {
  for (int i = 0; i < 4; i++)
    if (name && !strcmp(name, period_names[i])) {
      *out = (lg_budget_period_t)i;
      return 0;
    }
  return lg__err(err, LG_EINVAL, "period", -1,
                 "period \"%s\" is not one of daily, weekly, monthly, none", name ? name : "");
}

int lg_budget_period_bounds(lg_budget_period_t p, int64_t now_ms, int64_t *start_ms,
                            int64_t *end_ms) {
  int64_t start, end;
  int64_t day = floor_div(now_ms, DAY_MS);
  switch (p) {
  case LG_PERIOD_NONE: start = 0; end = -1; break;
  case LG_PERIOD_DAILY:
    start = day * DAY_MS;
    end = start + DAY_MS;
    break;
  case LG_PERIOD_WEEKLY: {
    int64_t wd = floor_div(day + 3, 7) * 7; /* day 0 (1970-01-01) was a Thursday */
    int64_t monday = day - (day + 3 - wd);
    start = monday * DAY_MS;
    end = start + 7 * DAY_MS;
    break;
  }
  case LG_PERIOD_MONTHLY: {
    int64_t y;
    int m;
    civil_from_days(day, &y, &m);
    start = days_from_civil(y, m, 1) * DAY_MS;
    end = days_from_civil(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) * DAY_MS;
    break;
  }
  default: return LG_EINVAL;
  }
  if (start_ms) *start_ms = start;
  if (end_ms) *end_ms = end;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Scopes.                                                              */

lg_scope_kind_t lg_budget_scope_kind(const char *scope) {
  if (!scope) return LG_SCOPE_OTHER;
  if (!strncmp(scope, "key:", 4)) return LG_SCOPE_KEY;
  if (!strncmp(scope, "workspace:", 10)) return LG_SCOPE_WORKSPACE;
  return LG_SCOPE_OTHER;
}

/* 1 when s[0..n) is well-formed UTF-8 without control characters. */
static int clean_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c < 0x20 || c == 0x7f) return 0;
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (!len || i + len > n) return 0;
    for (size_t k = 1; k < len; k++)
      if ((s[i + k] & 0xc0) != 0x80) return 0;
    i += len;
  }
  return 1;
}

int lg_budget_scope_check(const char *scope, lg_error_t *err) {
  if (!scope || !*scope) return lg__err(err, LG_EINVAL, "scope", -1, "the scope is empty");
  size_t n = strlen(scope);
  if (n > LG_BUDGET_SCOPE_MAX)
    return lg__err(err, LG_EINVAL, "scope", -1, "the scope is longer than %d bytes",
                   LG_BUDGET_SCOPE_MAX);
  if (!clean_utf8((const unsigned char *)scope, n))
    return lg__err(err, LG_EINVAL, "scope", -1,
                   "the scope \"%.64s\" has a control character or is not UTF-8", scope);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Budgets as read.                                                     */

/* The row as of now_ms: a period that ended has spent 0. */
static void roll(lg__bud_row_t *r, int64_t now_ms) {
  if (r->period == LG_PERIOD_NONE) return;
  int64_t start;
  lg_budget_period_bounds((lg_budget_period_t)r->period, now_ms, &start, NULL);
  if (start > r->period_start_ms) {
    r->spent_micro = 0;
    r->period_start_ms = start;
  }
}

/* Holds stop counting at their expiry. The row's next_expiry_ms is no
 * later than any hold's; once it has come, the read looked at the hold
 * rows and the counters are set from the live ones (and next_expiry_ms
 * from the earliest of them). Returns 1 when that happened: a writer then
 * stores the row, and deletes the expired hold rows when there are any. */
static int release_expired(lg__bud_row_t *r, int64_t now_ms) {
  if (r->next_expiry_ms < 0 || r->next_expiry_ms > now_ms) return 0;
  r->reserved_micro = r->live_micro;
  r->holds = r->live_holds;
  r->next_expiry_ms = r->live_min_expiry_ms;
  return 1;
}

static void view(const lg__bud_row_t *r, lg_budget_t *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->scope, sizeof out->scope, "%s", r->scope ? r->scope : "");
  out->limit_micro = r->limit_micro;
  out->period = (lg_budget_period_t)r->period;
  out->max_in_flight_micro = r->max_in_flight_micro;
  out->spent_micro = r->spent_micro;
  out->reserved_micro = r->reserved_micro;
  out->open_reservations = r->holds;
  out->period_start_ms = r->period == LG_PERIOD_NONE ? 0 : r->period_start_ms;
  out->resets_at_ms = -1;
  if (r->period != LG_PERIOD_NONE)
    lg_budget_period_bounds(out->period, r->period_start_ms, NULL, &out->resets_at_ms);
  out->next_expiry_ms = r->holds > 0 ? r->next_expiry_ms : -1;
  out->created_ms = r->created_ms;
  out->updated_ms = r->updated_ms;
}

int64_t lg_budget_remaining(const lg_budget_t *b) {
  int64_t used = sat_add(b->spent_micro, b->reserved_micro);
  return used >= b->limit_micro ? 0 : b->limit_micro - used;
}

static void budget_json(lg__buf_t *b, const lg_budget_t *x) {
  lg__buf_puts(b, "{\"scope\":");
  lg__buf_json_str(b, x->scope, strlen(x->scope));
  lg__buf_puts(b, ",\"limit_usd\":");
  put_usd(b, x->limit_micro);
  lg__buf_printf(b, ",\"period\":\"%s\",\"spent_usd\":", lg_budget_period_name(x->period));
  put_usd(b, x->spent_micro);
  lg__buf_puts(b, ",\"reserved_usd\":");
  put_usd(b, x->reserved_micro);
  lg__buf_puts(b, ",\"resets_at\":");
  put_time_or_null(b, x->resets_at_ms);
  lg__buf_puts(b, ",\"max_in_flight_usd\":");
  if (x->max_in_flight_micro >= 0) put_usd(b, x->max_in_flight_micro);
  else lg__buf_puts(b, "null");
  lg__buf_puts(b, ",\"remaining_usd\":");
  put_usd(b, lg_budget_remaining(x));
  lg__buf_printf(b, ",\"open_reservations\":%lld}", (long long)x->open_reservations);
}

char *lg_budget_to_json(const lg_budget_t *x) {
  lg__buf_t b = {0};
  budget_json(&b, x);
  return lg__buf_steal(&b, NULL);
}

/* ------------------------------------------------------------------ */
/* The transaction around each call.                                     */

static int where(lg_store_t *s, int rc, lg_error_t *err) {
  if (rc < 0 && err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

/* Locks the handle and opens a durable transaction (a savepoint inside
 * one already open). */
static int txn_begin(lg_store_t *s, lg_error_t *err) {
  lg__store_lock(s);
  if (s->depth == 0) lg__sql_batch(s); /* fewer round trips (PostgreSQL) */
  int rc = lg__store_begin(s, LG__TXN_LEDGER, err);
  if (rc) lg__store_unlock(s);
  return rc;
}

/* Commits when rc is 0 (returning the commit's error), else rolls back
 * (returning rc); unlocks. */
static int txn_end(lg_store_t *s, int rc, lg_error_t *err) {
  if (rc == 0) rc = lg__store_end(s, 1, err);
  else lg__store_end(s, 0, NULL);
  lg__store_unlock(s);
  return rc;
}

int lg__budget_sp_begin(lg_store_t *s, lg_error_t *err) { return where(s, txn_begin(s, err), err); }

int lg__budget_sp_end(lg_store_t *s, int commit, lg_error_t *err) {
  int rc = 0;
  if (commit) rc = lg__store_end(s, 1, err);
  else lg__store_end(s, 0, NULL);
  lg__store_unlock(s);
  return where(s, rc, err);
}

static int check_amount(const char *what, int64_t micro, lg_error_t *err) {
  if (micro < 0) return lg__err(err, LG_EINVAL, what, -1, "%s must not be negative", what);
  if (micro > LG_BUDGET_MAX_MICRO)
    return lg__err(err, LG_ERANGE, what, -1, "%s is beyond %.0f USD", what, LG_BUDGET_MAX_USD);
  return 0;
}

/* Reads a budget under its lock, rolled to now_ms, its expired holds
 * released (*released 1: the row is to be written back, and its expired
 * hold rows deleted when row->expired_holds). LG_ENOTFOUND naming `field`
 * when there is none. */
static int read_locked(lg_store_t *s, const char *scope, const char *field, int64_t now_ms,
                       lg__bud_row_t *row, int *released, lg_error_t *err) {
  int found = 0;
  *released = 0;
  int rc = lg__sql_bud_read(s, scope, 1, now_ms, row, &found, err);
  if (rc) return rc;
  if (!found)
    return lg__err(err, LG_ENOTFOUND, field, -1, "no budget for scope \"%s\" (set one with "
                   "'loopguard budget set' or PUT /v1/budgets/{scope})", scope);
  roll(row, now_ms);
  *released = release_expired(row, now_ms);
  return 0;
}

/* Deletes the hold rows that release_expired() left out of the counters. */
static int drop_expired(lg_store_t *s, const lg__bud_row_t *row, int released, int64_t now_ms,
                        lg_error_t *err) {
  return released && row->expired_holds > 0 ? lg__sql_holds_expire(s, row->scope, now_ms, err) : 0;
}

/* ------------------------------------------------------------------ */
/* set, get, list, reset                                                */

int lg_budget_set(lg_store_t *s, const char *scope, int64_t limit_micro,
                  lg_budget_period_t period, int64_t max_in_flight_micro, int64_t now_ms,
                  lg_budget_t *out, lg_error_t *err) {
  int rc = lg_budget_scope_check(scope, err);
  if (!rc) rc = check_amount("limit_usd", limit_micro, err);
  if (!rc && max_in_flight_micro >= 0)
    rc = check_amount("max_in_flight_usd", max_in_flight_micro, err);
  if (!rc && (unsigned)period > LG_PERIOD_MONTHLY)
    rc = lg__err(err, LG_EINVAL, "period", -1, "unknown period %d", (int)period);
  if (rc) return rc;
  if ((rc = txn_begin(s, err))) return where(s, rc, err);
  lg__bud_row_t row = {0};
  int found = 0;
  rc = lg__sql_bud_read(s, scope, 1, now_ms, &row, &found, err);
  if (!rc) {
    if (found) {
      roll(&row, now_ms);
      if (release_expired(&row, now_ms)) rc = drop_expired(s, &row, 1, now_ms, err);
      if (row.period != (int)period) {
        /* The spent so far counts in the new period that contains now. */
        lg_budget_period_bounds(period, now_ms, &row.period_start_ms, NULL);
      }
    } else {
      row.scope = lg__strdup(scope);
      if (!row.scope) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      row.created_ms = now_ms;
      row.next_expiry_ms = -1; /* no hold; the counters start at 0 */
      lg_budget_period_bounds(period, now_ms, &row.period_start_ms, NULL);
    }
  }
  if (!rc) {
    row.limit_micro = limit_micro;
    row.period = (int)period;
    row.max_in_flight_micro = max_in_flight_micro >= 0 ? max_in_flight_micro : -1;
    row.updated_ms = now_ms;
    rc = lg__sql_bud_put(s, &row, err);
  }
  if (!rc) rc = lg__store_fault_at(s, "budget.set.before_commit", err);
  rc = txn_end(s, rc, err);
  if (!rc && out) view(&row, out);
  lg__bud_row_clear(&row);
  return where(s, rc, err);
}

int lg_budget_get(lg_store_t *s, const char *scope, int64_t now_ms, lg_budget_t *out,
                  lg_error_t *err) {
  int rc = lg_budget_scope_check(scope, err);
  if (rc) return rc;
  lg__bud_row_t row = {0};
  int found = 0;
  int r = lg__store_read_begin(s); /* never behind a write */
  rc = lg__sql_bud_read(s, scope, 0, now_ms, &row, &found, err);
  lg__store_read_end(s, r);
  if (!rc && !found)
    rc = lg__err(err, LG_ENOTFOUND, "scope", -1, "no budget for scope \"%s\"", scope);
  if (!rc) {
    release_expired(&row, now_ms);
    roll(&row, now_ms);
    view(&row, out);
  }
  lg__bud_row_clear(&row);
  return where(s, rc, err);
}

typedef struct list_ctx {
  lg_budget_cb cb;
  void *ud;
  int64_t now_ms;
} list_ctx_t;

static int list_one(void *ud, const lg__bud_row_t *row) {
  list_ctx_t *x = ud;
  lg__bud_row_t r = *row;
  lg_budget_t b;
  release_expired(&r, x->now_ms);
  roll(&r, x->now_ms);
  view(&r, &b);
  return x->cb(x->ud, &b);
}

int lg_budget_list(lg_store_t *s, int64_t now_ms, lg_budget_cb cb, void *ud, lg_error_t *err) {
  if (!cb) return lg__err(err, LG_EINVAL, NULL, -1, "no callback given");
  list_ctx_t x = {cb, ud, now_ms};
  int r = lg__store_read_begin(s);
  int rc = lg__sql_bud_list(s, now_ms, list_one, &x, err);
  lg__store_read_end(s, r);
  return where(s, rc, err);
}

int lg_budget_reset(lg_store_t *s, const char *scope, int64_t now_ms, lg_budget_t *out,
                    lg_error_t *err) {
  int rc = lg_budget_scope_check(scope, err);
  if (rc) return rc;
  if ((rc = txn_begin(s, err))) return where(s, rc, err);
  lg__bud_row_t row = {0};
  int released = 0;
  rc = read_locked(s, scope, "scope", now_ms, &row, &released, err);
  if (!rc) rc = drop_expired(s, &row, released, now_ms, err);
  if (!rc) {
    row.spent_micro = 0;
    lg_budget_period_bounds((lg_budget_period_t)row.period, now_ms, &row.period_start_ms, NULL);
    row.updated_ms = now_ms;
    rc = lg__sql_bud_put(s, &row, err);
  }
  rc = txn_end(s, rc, err);
  if (!rc && out) view(&row, out);
  lg__bud_row_clear(&row);
  return where(s, rc, err);
}

/* ------------------------------------------------------------------ */
/* Refusals.                                                            */

static const char *limit_source(lg_scope_kind_t k) {
  switch (k) {
  case LG_SCOPE_KEY: return "key_limit";
  case LG_SCOPE_WORKSPACE: return "workspace_budget";
  default: return "scope_budget";
  }
}

static void usd_text(char buf[LG_USD_TEXT_MAX], int64_t micro) {
  lg_usd_format(lg_budget_micro_to_nusd(micro), buf);
}

static void time_text(char buf[32], int64_t ms) {
  if (ms < 0) snprintf(buf, 32, "never");
  else lg__time_rfc3339(ms, buf);
}

/* How much of a scope a message quotes: 120 bytes at most, cut before a
 * character it would split (a message is UTF-8, as its JSON must be). */
static int scope_cut(const char *scope) {
  size_t n = strlen(scope);
  return (int)lg__utf8_valid_prefix(scope, n < 120 ? n : 120);
}

/* Spent + reserved + amount would pass the limit of b. */
static void refuse_limit(lg_budget_refusal_t *r, const lg_budget_t *b, int64_t amount) {
  char lim[32], sp[32], res[32], amt[32], left[32], at[32];
  memset(r, 0, sizeof *r);
  r->kind = lg_budget_scope_kind(b->scope);
  r->limit_source = limit_source(r->kind);
  r->type = "budget_exceeded";
  snprintf(r->scope, sizeof r->scope, "%s", b->scope);
  r->remaining_micro = lg_budget_remaining(b);
  r->requested_micro = amount;
  r->limit_micro = b->limit_micro;
  r->resets_at_ms = b->resets_at_ms;
  usd_text(lim, b->limit_micro);
  usd_text(sp, b->spent_micro);
  usd_text(res, b->reserved_micro);
  usd_text(amt, amount);
  usd_text(left, r->remaining_micro);
  time_text(at, b->resets_at_ms);
  if (b->period == LG_PERIOD_NONE)
    snprintf(r->message, sizeof r->message,
             "the budget of %.*s has %s USD left of its %s USD limit (%s spent, %s held by "
             "calls in flight) and this call may cost up to %s USD; it does not reset",
             scope_cut(b->scope), b->scope, left, lim, sp, res, amt);
  else
    snprintf(r->message, sizeof r->message,
             "the %s budget of %.*s has %s USD left of its %s USD limit (%s spent, %s held "
             "by calls in flight) and this call may cost up to %s USD; it resets at %s",
             lg_budget_period_name(b->period), scope_cut(b->scope), b->scope, left, lim, sp, res,
             amt, at);
}

/* reserved + amount would pass max_in_flight of b. When the amount alone
 * is more than max_in_flight, waiting cannot help: that is reported as
 * budget_exceeded, never as rate_limited, which a client would retry for
 * ever. */
static void refuse_in_flight(lg_budget_refusal_t *r, const lg_budget_t *b, int64_t amount,
                             int64_t now_ms) {
  char cap[32], res[32], amt[32];
  memset(r, 0, sizeof *r);
  r->kind = lg_budget_scope_kind(b->scope);
  r->limit_source = "in_flight_budget";
  snprintf(r->scope, sizeof r->scope, "%s", b->scope);
  r->remaining_micro =
      b->reserved_micro >= b->max_in_flight_micro ? 0 : b->max_in_flight_micro - b->reserved_micro;
  r->requested_micro = amount;
  r->limit_micro = b->max_in_flight_micro;
  r->resets_at_ms = b->resets_at_ms;
  usd_text(cap, b->max_in_flight_micro);
  usd_text(res, b->reserved_micro);
  usd_text(amt, amount);
  if (amount > b->max_in_flight_micro || b->next_expiry_ms < 0) {
    r->type = "budget_exceeded";
    snprintf(r->message, sizeof r->message,
             "this call may cost up to %s USD, more than the %s USD that %.*s allows in "
             "flight at once (max_in_flight_usd): it can never fit; lower max_tokens or raise "
             "max_in_flight_usd",
             amt, cap, scope_cut(b->scope), b->scope);
    return;
  }
  r->type = "rate_limited";
  int64_t wait = b->next_expiry_ms - now_ms;
  r->retry_after_s = wait <= 1000 ? 1 : (wait + 999) / 1000;
  snprintf(r->message, sizeof r->message,
           "%.*s has %s USD held by calls in flight and allows %s USD (max_in_flight_usd); "
           "this call may cost up to %s USD more; retry in %lld s, when the first of them runs "
           "out, or once some settle",
           scope_cut(b->scope), b->scope, res, cap, amt, (long long)r->retry_after_s);
}

void lg__budget_refusal_metadata(lg__buf_t *b, const lg_budget_refusal_t *r) {
  lg__buf_puts(b, "{\"limit_source\":");
  const char *src = r->limit_source ? r->limit_source : "";
  lg__buf_json_str(b, src, strlen(src));
  lg__buf_puts(b, ",\"scope\":");
  lg__buf_json_str(b, r->scope, strlen(r->scope));
  lg__buf_puts(b, ",\"remaining_usd\":");
  put_usd(b, r->remaining_micro);
  lg__buf_puts(b, ",\"requested_usd\":");
  put_usd(b, r->requested_micro);
  lg__buf_puts(b, ",\"resets_at\":");
  put_time_or_null(b, r->resets_at_ms);
  if (r->retry_after_s > 0)
    lg__buf_printf(b, ",\"retry_after_s\":%lld", (long long)r->retry_after_s);
  lg__buf_putc(b, '}');
}

char *lg__budget_refusal_metadata_json(const lg_budget_refusal_t *r) {
  lg__buf_t b = {0};
  lg__budget_refusal_metadata(&b, r);
  return lg__buf_steal(&b, NULL);
}

/* ------------------------------------------------------------------ */
/* Reservations.                                                        */

/* "rsv_" + 32 hex digits of the kernel's randomness. */
static int new_id(char id[LG_BUDGET_ID_MAX], lg_error_t *err) {
  return lg__random_id(ID_PREFIX, 16, id, LG_BUDGET_ID_MAX, "a reservation id", err);
}

static int check_opt_str(const char *what, const char *v, size_t max, lg_error_t *err) {
  if (!v) return 0;
  if (!*v) return lg__err(err, LG_EINVAL, what, -1, "%s is empty", what);
  if (strlen(v) > max)
    return lg__err(err, LG_EINVAL, what, -1, "%s is longer than %zu bytes", what, max);
  return 0;
}

/* Checks a list of scopes and sorts their indices by name into order[]:
 * 1 to LG_BUDGET_MAX_SCOPES scopes, each valid, none twice. */
static int check_scopes(const char *const *scopes, size_t n, size_t order[LG_BUDGET_MAX_SCOPES],
                        int allow_none, lg_error_t *err) {
  if (!n && allow_none) return 0;
  if (!n || !scopes)
    return lg__err(err, LG_EINVAL, "scopes", -1,
                   "no scope given: a reservation needs at least one");
  if (n > LG_BUDGET_MAX_SCOPES)
    return lg__err(err, LG_EINVAL, "scopes", -1, "%zu scopes; at most %d", n, LG_BUDGET_MAX_SCOPES);
  for (size_t i = 0; i < n; i++) {
    char f[32];
    snprintf(f, sizeof f, "scopes[%zu]", i);
    int rc = lg_budget_scope_check(scopes[i], err);
    if (rc) {
      if (err) snprintf(err->field, sizeof err->field, "%s", f);
      return rc;
    }
    order[i] = i;
  }
  /* n is at most 16: an insertion sort of the indices (qsort has no
   * context argument). */
  for (size_t i = 1; i < n; i++) {
    size_t v = order[i], j = i;
    while (j > 0 && strcmp(scopes[order[j - 1]], scopes[v]) > 0) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = v;
  }
  for (size_t i = 1; i < n; i++)
    if (!strcmp(scopes[order[i - 1]], scopes[order[i]])) {
      char f[32];
      size_t later = order[i] > order[i - 1] ? order[i] : order[i - 1];
      snprintf(f, sizeof f, "scopes[%zu]", later);
      return lg__err(err, LG_EINVAL, f, -1, "scope \"%.*s\" appears twice",
                     scope_cut(scopes[order[i]]), scopes[order[i]]);
    }
  return 0;
}

/* The scopes joined by '\n' in the given order of indices. */
static char *join_scopes(const char *const *scopes, const size_t *order, size_t n) {
  lg__buf_t b = {0};
  for (size_t i = 0; i < n; i++) {
    if (i) lg__buf_putc(&b, '\n');
    lg__buf_puts(&b, scopes[order ? order[i] : i]);
  }
  return lg__buf_steal(&b, NULL);
}

int lg__budget_reserve(lg_store_t *s, const lg_budget_request_t *req, int64_t now_ms,
                       lg_budget_reservation_t *out, lg_budget_refusal_t *refusal,
                       lg_error_t *err) {
  size_t order[LG_BUDGET_MAX_SCOPES];
  if (!req) return lg__err(err, LG_EINVAL, NULL, -1, "no request given");
  int rc = check_scopes(req->scopes, req->nscopes, order, 0, err);
  if (!rc) rc = check_amount("amount_usd", req->amount_micro, err);
  int64_t ttl = req->ttl_ms > 0 ? req->ttl_ms : LG_BUDGET_DEFAULT_TTL_MS;
  if (!rc && ttl > LG_BUDGET_MAX_TTL_MS)
    rc = lg__err(err, LG_EINVAL, "ttl_ms", -1, "ttl_ms %lld is beyond %lld (24 hours)",
                 (long long)ttl, (long long)LG_BUDGET_MAX_TTL_MS);
  if (!rc) rc = check_opt_str("run_id", req->run_id, RUN_ID_MAX, err);
  if (!rc) rc = check_opt_str("model", req->model, MODEL_MAX, err);
  if (!rc && req->run_seq < 0)
    rc = lg__err(err, LG_EINVAL, "run_seq", -1, "run_seq must not be negative");
  if (rc) return rc;
  size_t n = req->nscopes;
  lg__resv_row_t rv = {0};
  rv.asked_micro = -1; /* charged as asked: nothing settled yet */
  char id[LG_BUDGET_ID_MAX];
  if ((rc = new_id(id, err))) return rc;
  if (!(rv.scopes = join_scopes(req->scopes, order, n)))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  if ((rc = txn_begin(s, err))) {
    lg__free(rv.scopes);
    return where(s, rc, err);
  }
  lg__bud_row_t rows[LG_BUDGET_MAX_SCOPES];
  lg_budget_t views[LG_BUDGET_MAX_SCOPES];
  int released[LG_BUDGET_MAX_SCOPES] = {0};
  memset(rows, 0, sizeof rows);
  /* Lock every scope in name order, so that two reservations over common
   * scopes never wait for each other in a cycle. */
  for (size_t k = 0; k < n && !rc; k++) {
    size_t i = order[k];
    char f[32];
    snprintf(f, sizeof f, "scopes[%zu]", i);
    rc = read_locked(s, req->scopes[i], f, now_ms, &rows[i], &released[i], err);
    if (!rc) view(&rows[i], &views[i]);
  }
  int refused = 0;
  lg_budget_refusal_t why;
  /* Limits first, in the caller's order: a 429 only when waiting helps. */
  for (size_t i = 0; i < n && !rc && !refused; i++) {
    int64_t used = sat_add(rows[i].spent_micro, rows[i].reserved_micro);
    if (sat_add(used, req->amount_micro) > rows[i].limit_micro) {
      refuse_limit(&why, &views[i], req->amount_micro);
      refused = 1;
    }
  }
  for (size_t i = 0; i < n && !rc && !refused; i++) {
    if (rows[i].max_in_flight_micro < 0) continue;
    if (sat_add(rows[i].reserved_micro, req->amount_micro) > rows[i].max_in_flight_micro) {
      refuse_in_flight(&why, &views[i], req->amount_micro, now_ms);
      refused = 1;
    }
  }
  if (!rc && refused) rc = LG_BUDGET_REFUSED;
  /* The holds, scope by scope in lock order (expired ones go first), and
   * the counters with them. */
  for (size_t k = 0; k < n && !rc; k++) {
    size_t i = order[k];
    lg__bud_row_t *r = &rows[i];
    rc = drop_expired(s, r, released[i], now_ms, err);
    if (!rc) rc = lg__sql_hold_put(s, req->scopes[i], id, req->amount_micro, now_ms + ttl, err);
    if (rc) break;
    r->reserved_micro = sat_add(r->reserved_micro, req->amount_micro);
    r->holds++;
    if (r->next_expiry_ms < 0 || now_ms + ttl < r->next_expiry_ms) r->next_expiry_ms = now_ms + ttl;
    rc = lg__sql_bud_put(s, r, err);
  }
  if (!rc) {
    rv.id = id;
    rv.amount_micro = req->amount_micro;
    rv.run_id = (char *)req->run_id;
    rv.run_seq = req->run_seq;
    rv.model = (char *)req->model;
    rv.created_ms = now_ms;
    rv.expires_ms = now_ms + ttl;
    rc = lg__sql_resv_insert(s, &rv, err);
  }
  if (!rc) rc = lg__store_fault_at(s, "budget.reserve.before_commit", err);
  rc = txn_end(s, rc, err);
  for (size_t i = 0; i < n; i++) lg__bud_row_clear(&rows[i]);
  lg__free(rv.scopes);
  if (rc == LG_BUDGET_REFUSED) {
    if (refusal) *refusal = why;
    return rc;
  }
  if (!rc && out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", id);
    out->amount_micro = req->amount_micro;
    out->created_ms = now_ms;
    out->expires_ms = now_ms + ttl;
  }
  return where(s, rc, err);
}

int lg_budget_reserve(lg_store_t *s, const lg_budget_request_t *req, int64_t now_ms,
                      lg_budget_reservation_t *out, lg_budget_refusal_t *refusal,
                      lg_error_t *err) {
  return lg__budget_reserve(s, req, now_ms, out, refusal, err);
}

char *lg__budget_reservation_json(const lg_budget_reservation_t *r) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"reservation_id\":");
  lg__buf_json_str(&b, r->id, strlen(r->id));
  lg__buf_puts(&b, ",\"expires_at\":");
  put_time_or_null(&b, r->expires_ms);
  lg__buf_puts(&b, ",\"amount_usd\":");
  put_usd(&b, r->amount_micro);
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}

/* ------------------------------------------------------------------ */
/* Settlement.                                                          */

static int check_id(const char *id, lg_error_t *err) {
  if (!id || !*id)
    return lg__err(err, LG_EINVAL, "reservation_id", -1, "the reservation id is empty");
  if (strlen(id) >= LG_BUDGET_ID_MAX)
    return lg__err(err, LG_ENOTFOUND, "reservation_id", -1,
                   "no reservation \"%.64s\": reservation ids are \"rsv_\" and 32 hex digits", id);
  return 0;
}

/* Splits a '\n'-separated list in place into v[] (at most max). */
static size_t split(char *list, char **v, size_t max) {
  size_t n = 0;
  for (char *p = list; p && *p && n < max;) {
    v[n++] = p;
    char *nl = strchr(p, '\n');
    if (!nl) break;
    *nl = 0;
    p = nl + 1;
  }
  return n;
}

void lg_budget_settlement_clear(lg_budget_settlement_t *st) {
  if (!st) return;
  lg__free(st->scopes);
  memset(st, 0, sizeof *st);
}

/* Settles the reservation `rv` (read under its lock) with `actual`;
 * `asked` is what the settler asked for when actual was bounded below it
 * (else actual). */
static int settle_locked(lg_store_t *s, lg__resv_row_t *rv, int64_t actual, int64_t asked,
                         int64_t now_ms, lg_budget_settlement_t *out, lg_error_t *err) {
  char *names[LG_BUDGET_MAX_SCOPES];
  char *list = lg__strdup(rv->scopes);
  if (!list) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  size_t n = split(list, names, LG_BUDGET_MAX_SCOPES);
  int late = now_ms >= rv->expires_ms;
  int rc = 0;
  if (out && !(out->scopes = lg__calloc(n + 1, sizeof *out->scopes)))
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  /* Scopes were stored in name order: the same lock order as reserve. */
  for (size_t i = 0; i < n && !rc; i++) {
    lg__bud_row_t row = {0};
    int found = 0, dropped = 0;
    /* The row under its lock, its hold rows, and this reservation's hold
     * deleted — in that order. */
    rc = lg__sql_bud_read_drop(s, names[i], now_ms, rv->id, &row, &found, &dropped, err);
    if (!rc && !found) {
      lg__bud_row_clear(&row);
      continue; /* a budget that is gone is charged nothing */
    }
    roll(&row, now_ms);
    int released = rc ? 0 : release_expired(&row, now_ms);
    if (!rc) rc = drop_expired(s, &row, released, now_ms, err);
    if (!rc && dropped && rv->expires_ms > now_ms) {
      /* It still held: it leaves the counters. A hold that had expired
       * left them already (release_expired() saw it expired, now or when
       * another writer released it), and one another writer released is
       * not there to drop. */
      row.reserved_micro = row.reserved_micro > rv->amount_micro
                               ? row.reserved_micro - rv->amount_micro : 0;
      if (row.holds > 0) row.holds--;
    }
    row.spent_micro = sat_add(row.spent_micro, actual);
    row.updated_ms = now_ms;
    if (!rc) rc = lg__sql_bud_put(s, &row, err);
    if (!rc && out) view(&row, &out->scopes[out->nscopes++]);
    lg__bud_row_clear(&row);
  }
  lg__free(list);
  if (!rc) {
    rv->settled = 1;
    rv->actual_micro = actual;
    rv->settled_ms = now_ms;
    rv->asked_micro = asked > actual ? asked : -1;
    rc = lg__sql_resv_update(s, rv, err);
  }
  if (!rc && out) {
    snprintf(out->id, sizeof out->id, "%s", rv->id);
    out->reserved_micro = rv->amount_micro;
    out->actual_micro = actual;
    out->late = late;
    out->capped = asked > actual;
    out->asked_micro = asked;
  }
  return rc;
}

/* lg_budget_settle(), and lg_budget_settle_bounded() when bounded. */
static int settle(lg_store_t *s, const char *id, int64_t actual_micro, int bounded,
                  int64_t now_ms, lg_budget_settlement_t *out, lg_error_t *err) {
  if (out) memset(out, 0, sizeof *out);
  int rc = check_id(id, err);
  if (!rc) rc = check_amount("actual_usd", actual_micro, err);
  if (rc) return rc;
  if ((rc = txn_begin(s, err))) return where(s, rc, err);
  lg__resv_row_t rv = {0};
  int found = 0;
  rc = lg__sql_resv_read(s, id, 1, &rv, &found, err);
  if (!rc && !found)
    rc = lg__err(err, LG_ENOTFOUND, "reservation_id", -1,
                 "no reservation \"%s\" (never made, or forgotten by purge after its TTL)", id);
  if (!rc && rv.settled) {
    char at[32], amt[32];
    lg__time_rfc3339(rv.settled_ms, at);
    usd_text(amt, rv.actual_micro);
    char asked[80] = "";
    if (rv.asked_micro >= 0) {
      char a[32];
      usd_text(a, rv.asked_micro);
      snprintf(asked, sizeof asked, " (bounded: %s USD asked)", a);
    }
    rc = lg__err(err, LG_ECONFLICT, "reservation_id", -1,
                 "reservation \"%s\" was already settled at %s with %s USD%s; nothing changed",
                 id, at, amt, asked);
  }
  if (!rc) {
    /* An untrusted settler charges at most the reservation times the
     * factor: an agent that settles 10^9 USD must not lock a shared
     * budget for everyone. What it asked is kept in the row. */
    int64_t actual = actual_micro;
    if (bounded) {
      int64_t cap = rv.amount_micro > INT64_MAX / LG_BUDGET_SETTLE_MAX_FACTOR
                        ? INT64_MAX
                        : rv.amount_micro * LG_BUDGET_SETTLE_MAX_FACTOR;
      if (actual > cap) actual = cap;
    }
    rc = settle_locked(s, &rv, actual, actual_micro, now_ms, out, err);
  }
  if (!rc) rc = lg__store_fault_at(s, "budget.settle.before_commit", err);
  rc = txn_end(s, rc, err);
  lg__resv_row_clear(&rv);
  if (rc) lg_budget_settlement_clear(out);
  return where(s, rc, err);
}

int lg_budget_settle(lg_store_t *s, const char *id, int64_t actual_micro, int64_t now_ms,
                     lg_budget_settlement_t *out, lg_error_t *err) {
  return settle(s, id, actual_micro, 0, now_ms, out, err);
}

int lg_budget_settle_bounded(lg_store_t *s, const char *id, int64_t actual_micro,
                             int64_t now_ms, lg_budget_settlement_t *out, lg_error_t *err) {
  return settle(s, id, actual_micro, 1, now_ms, out, err);
}

char *lg__budget_settlement_json(const lg_budget_settlement_t *st) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"reservation_id\":");
  lg__buf_json_str(&b, st->id, strlen(st->id));
  lg__buf_puts(&b, ",\"reserved_usd\":");
  put_usd(&b, st->reserved_micro);
  lg__buf_puts(&b, ",\"actual_usd\":");
  put_usd(&b, st->actual_micro);
  lg__buf_printf(&b, ",\"late\":%s,\"capped\":%s", st->late ? "true" : "false",
                 st->capped ? "true" : "false");
  if (st->capped) {
    lg__buf_puts(&b, ",\"asked_usd\":");
    put_usd(&b, st->asked_micro);
  }
  lg__buf_puts(&b, ",\"scopes\":[");
  for (size_t i = 0; i < st->nscopes; i++) {
    if (i) lg__buf_putc(&b, ',');
    budget_json(&b, &st->scopes[i]);
  }
  lg__buf_puts(&b, "]}");
  return lg__buf_steal(&b, NULL);
}

/* The scopes whose holds may have expired (for purge). */
typedef struct due {
  char **v;
  size_t n, cap;
  int64_t now_ms;
  int oom;
} due_t;

static int collect_due(void *ud, const lg__bud_row_t *row) {
  due_t *x = ud;
  if (row->next_expiry_ms < 0 || row->next_expiry_ms > x->now_ms) return 0;
  if (x->n == x->cap) {
    size_t cap = x->cap ? x->cap * 2 : 16;
    char **v = lg__realloc(x->v, cap * sizeof *v);
    if (!v) return x->oom = 1, LG_ENOMEM;
    x->v = v;
    x->cap = cap;
  }
  if (!(x->v[x->n] = lg__strdup(row->scope))) return x->oom = 1, LG_ENOMEM;
  x->n++;
  return 0;
}

int lg_budget_purge(lg_store_t *s, int64_t older_than_ms, int64_t now_ms, int64_t *purged,
                    lg_error_t *err) {
  int64_t n = 0;
  if (purged) *purged = 0;
  if (older_than_ms < 0) older_than_ms = s->opts.retention_ms;
  /* The expired hold rows, scope by scope, each under its lock. */
  due_t due = {NULL, 0, 0, now_ms, 0};
  lg__store_lock(s);
  int rc = lg__sql_bud_list(s, now_ms, collect_due, &due, err);
  lg__store_unlock(s);
  if (rc && due.oom) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  for (size_t i = 0; i < due.n && !rc; i++) {
    if ((rc = txn_begin(s, err))) break;
    lg__bud_row_t row = {0};
    int released = 0;
    rc = read_locked(s, due.v[i], "scope", now_ms, &row, &released, err);
    if (rc == LG_ENOTFOUND) rc = 0;
    else if (!rc && released) {
      rc = drop_expired(s, &row, released, now_ms, err);
      if (!rc) rc = lg__sql_bud_put(s, &row, err);
    }
    lg__bud_row_clear(&row);
    rc = txn_end(s, rc, err);
  }
  for (size_t i = 0; i < due.n; i++) lg__free(due.v[i]);
  lg__free(due.v);
  /* Then the reservations whose TTL ended long enough ago. */
  if (!rc && !(rc = txn_begin(s, err))) {
    rc = lg__sql_resv_purge(s, now_ms - older_than_ms, &n, err);
    rc = txn_end(s, rc, err);
  }
  if (purged) *purged = rc ? 0 : n;
  return where(s, rc, err);
}

/* ------------------------------------------------------------------ */
/* Runs and their scopes.                                               */

int lg_budget_scopes_check(lg_store_t *s, const char *const *scopes, size_t n,
                           lg_error_t *err) {
  size_t order[LG_BUDGET_MAX_SCOPES];
  int rc = check_scopes(scopes, n, order, 0, err);
  if (rc) return rc;
  for (size_t i = 0; i < n && !rc; i++) {
    lg__bud_row_t row = {0};
    int found = 0;
    lg__store_lock(s);
    rc = lg__sql_bud_read(s, scopes[i], 0, 0, &row, &found, err);
    lg__store_unlock(s);
    if (!rc && !found) {
      char f[32];
      snprintf(f, sizeof f, "scopes[%zu]", i);
      rc = lg__err(err, LG_ENOTFOUND, f, -1, "no budget for scope \"%s\"", scopes[i]);
    }
    lg__bud_row_clear(&row);
  }
  return where(s, rc, err);
}

int lg_budget_run_scopes_set(lg_store_t *s, const char *run_id, const char *const *scopes,
                             size_t n, lg_error_t *err) {
  size_t order[LG_BUDGET_MAX_SCOPES];
  int rc = run_id && *run_id ? check_opt_str("run_id", run_id, RUN_ID_MAX, err)
                             : lg__err(err, LG_EINVAL, "run_id", -1, "run_id is empty");
  if (!rc) rc = check_scopes(scopes, n, order, 1, err);
  if (rc) return rc;
  char *list = n ? join_scopes(scopes, NULL, n) : NULL;
  if (n && !list) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  if ((rc = txn_begin(s, err))) {
    lg__free(list);
    return where(s, rc, err);
  }
  for (size_t i = 0; i < n && !rc; i++) {
    lg__bud_row_t row = {0};
    int found = 0;
    rc = lg__sql_bud_read(s, scopes[i], 0, 0, &row, &found, err);
    if (!rc && !found) {
      char f[32];
      snprintf(f, sizeof f, "scopes[%zu]", i);
      rc = lg__err(err, LG_ENOTFOUND, f, -1,
                   "no budget for scope \"%s\" (set one before naming it for a run)", scopes[i]);
    }
    lg__bud_row_clear(&row);
  }
  if (!rc) rc = lg__sql_runscopes_put(s, run_id, list, err);
  rc = txn_end(s, rc, err);
  lg__free(list);
  return where(s, rc, err);
}

void lg__budget_strv_free(char **v) {
  if (!v) return;
  lg__free(v[0]); /* one block: the list, split in place */
  lg__free(v);
}

int lg__budget_scopes_add(char ***scopes, size_t *n, const char *const *extra, size_t nextra,
                          lg_error_t *err) {
  if (!nextra) return 0;
  lg__buf_t b = {0};
  size_t k = 0;
  for (size_t i = 0; i < *n + nextra; i++) {
    const char *sc = i < *n ? (*scopes)[i] : extra[i - *n];
    int dup = 0;
    for (size_t j = 0; j < i && !dup; j++) dup = !strcmp(sc, j < *n ? (*scopes)[j] : extra[j - *n]);
    if (dup) continue;
    if (k++) lg__buf_putc(&b, '\n');
    lg__buf_puts(&b, sc);
  }
  if (k > LG_BUDGET_MAX_SCOPES) {
    lg__buf_free(&b);
    return lg__err(err, LG_EINVAL, "scopes", -1, "more than %d budget scopes for one model call",
                   LG_BUDGET_MAX_SCOPES);
  }
  char *list = lg__buf_steal(&b, NULL);
  char **v = list ? lg__calloc(LG_BUDGET_MAX_SCOPES + 1, sizeof *v) : NULL;
  if (!v) {
    lg__free(list);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  lg__budget_strv_free(*scopes);
  *n = split(list, v, LG_BUDGET_MAX_SCOPES);
  *scopes = v; /* v[0] is `list` */
  return 0;
}

int lg__budget_run_scopes(lg_store_t *s, const char *run_id, char ***scopes, size_t *n,
                          lg_error_t *err) {
  *scopes = NULL;
  *n = 0;
  char *list = NULL;
  int found = 0;
  lg__store_lock(s);
  int rc = lg__sql_runscopes_get(s, run_id, &list, &found, err);
  lg__store_unlock(s);
  if (rc) return where(s, rc, err);
  if (!found || !list || !*list) {
    lg__free(list);
    return 0;
  }
  char **v = lg__calloc(LG_BUDGET_MAX_SCOPES + 1, sizeof *v);
  if (!v) {
    lg__free(list);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  *n = split(list, v, LG_BUDGET_MAX_SCOPES);
  *scopes = v; /* v[0] is `list` */
  return 0;
}

int lg_budget_run_scopes(lg_store_t *s, const char *run_id, char **json, lg_error_t *err) {
  char **v;
  size_t n;
  *json = NULL;
  if (!run_id || !*run_id) return lg__err(err, LG_EINVAL, "run_id", -1, "run_id is empty");
  int rc = lg__budget_run_scopes(s, run_id, &v, &n, err);
  if (rc) return rc;
  lg__buf_t b = {0};
  lg__buf_putc(&b, '[');
  for (size_t i = 0; i < n; i++) {
    if (i) lg__buf_putc(&b, ',');
    lg__buf_json_str(&b, v[i], strlen(v[i]));
  }
  lg__buf_putc(&b, ']');
  lg__budget_strv_free(v);
  *json = lg__buf_steal(&b, NULL);
  return *json ? 0 : lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
}

int lg__budget_run_reservation(lg_store_t *s, const char *run_id, int64_t run_seq, int *found,
                               char id[LG_BUDGET_ID_MAX], int64_t *run_seq_out,
                               int64_t *amount_micro, char **model, lg_error_t *err) {
  lg__resv_row_t rv = {0};
  *found = 0;
  *model = NULL;
  lg__store_lock(s);
  int rc = lg__sql_resv_of_run(s, run_id, run_seq, s->depth > 0, &rv, found, err);
  lg__store_unlock(s);
  if (rc) return where(s, rc, err);
  if (*found && rv.settled) *found = 0;
  if (*found) {
    snprintf(id, LG_BUDGET_ID_MAX, "%s", rv.id);
    *run_seq_out = rv.run_seq;
    *amount_micro = rv.amount_micro;
    *model = rv.model;
    rv.model = NULL;
  }
  lg__resv_row_clear(&rv);
  return 0;
}

int lg__budget_set_run_seq(lg_store_t *s, const char *id, int64_t run_seq, lg_error_t *err) {
  int rc = txn_begin(s, err);
  if (rc) return where(s, rc, err);
  lg__resv_row_t rv = {0};
  int found = 0;
  rc = lg__sql_resv_read(s, id, 1, &rv, &found, err);
  if (!rc && found) {
    rv.run_seq = run_seq;
    rc = lg__sql_resv_update(s, &rv, err);
  }
  rc = txn_end(s, rc, err);
  lg__resv_row_clear(&rv);
  return where(s, rc, err);
}
