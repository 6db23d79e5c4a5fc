/*
 * cmd_budget.c — `loopguard budget set|show|list|reset`: the shared spend
 * budgets of a store, for operators.
 *
 * Each subcommand opens the store named by --store (else $LOOPGUARD_STORE,
 * else sqlite:loopguard.db), makes one budget call with the real clock as
 * now_ms, and prints for a person, or JSON with --json (one object; `list`
 * one object per line). Exit status: 0 done, 1 an error (a message on
 * stderr naming the store and the scope), 2 bad usage.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *budget_usage =
    "usage: loopguard budget set SCOPE --limit-usd X --period daily|weekly|monthly|none\n"
    "                            [--max-in-flight-usd Y] [--store URL] [--json]\n"
    "       loopguard budget show SCOPE [--store URL] [--json]\n"
    "       loopguard budget list [--store URL] [--json]\n"
    "       loopguard budget reset SCOPE [--store URL] [--json]\n"
    "\n"
    "Shared spend budgets: a limit in USD per period for a scope (key:NAME,\n"
    "workspace:NAME, team:NAME, customer:NAME or any name). Model calls reserve\n"
    "their worst case against their scopes before they are made and settle the\n"
    "real cost after. Run 'loopguard budget SUBCOMMAND --help' for each one's flags.\n"
    "\n"
    "A store is a URL: memory:, sqlite:PATH or postgres:CONNINFO; the default is\n"
    "$LOOPGUARD_STORE, else sqlite:loopguard.db in the current folder; read-only\n"
    "subcommands never create it.\n"
    "\n"
    "Exit status: 0 success, 1 an error (the message names the store and the\n"
    "scope), 2 bad usage.\n";

static const char *set_usage =
    "usage: loopguard budget set SCOPE --limit-usd X --period daily|weekly|monthly|none\n"
    "                            [--max-in-flight-usd Y] [--store URL] [--json]\n"
    "\n"
    "Creates the budget of SCOPE, or changes its limit, period and in-flight cap.\n"
    "What was spent in the current period and the reservations in flight are kept.\n"
    "\n"
    "  --limit-usd X           the most SCOPE may spend in a period, in USD (a\n"
    "                          decimal number, e.g. 25 or 0.50)\n"
    "  --period P              daily (from 00:00 UTC), weekly (from Monday 00:00\n"
    "                          UTC), monthly (from the 1st, 00:00 UTC) or none\n"
    "                          (never resets)\n"
    "  --max-in-flight-usd Y   the most that calls in flight may hold at once;\n"
    "                          a call past it is refused with 429 and Retry-After\n"
    "                          (default: no cap; set replaces it, so give it again\n"
    "                          when you change the limit)\n"
    "  --store URL             the store (default $LOOPGUARD_STORE, else\n"
    "                          sqlite:loopguard.db)\n"
    "  --json                  print the budget as GET /v1/budgets/{scope} does\n"
    "  --help                  this text\n"
    "\n"
    "Exit status: 0 set, 1 an error, 2 bad usage.\n";

static const char *show_usage =
    "usage: loopguard budget show SCOPE [--store URL] [--json]\n"
    "\n"
    "Shows the budget of SCOPE as of now: its limit and period, what was spent in\n"
    "the current period, what calls in flight hold, what remains, when it resets.\n"
    "Changes nothing.\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        print the object of GET /v1/budgets/{scope}\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 shown, 1 an error (no budget for SCOPE, ...), 2 bad usage.\n";

static const char *list_usage =
    "usage: loopguard budget list [--store URL] [--json]\n"
    "\n"
    "Lists every budget of the store by scope, as of now. Changes nothing.\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        one object per line, as GET /v1/budgets/{scope} prints it\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 listed (also when there is none), 1 an error, 2 bad usage.\n";

static const char *reset_usage =
    "usage: loopguard budget reset SCOPE [--store URL] [--json]\n"
    "\n"
    "Sets what SCOPE has spent in the current period back to 0. The limit, the\n"
    "period and the reservations in flight stay: calls in flight still hold\n"
    "their worst case until they settle or run out.\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        print the budget after the reset\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 reset, 1 an error (no budget for SCOPE, ...), 2 bad usage.\n";

/* ---- helpers ---- */

static void fmt_time(int64_t ms, char buf[40]) {
  time_t s = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, 40, "%sZ", day);
}

/* Micro-dollars as a decimal USD text: 25, 0.5, 0.000042. */
static void fmt_usd(int64_t micro, char buf[40]) { lg_usd_format(lg_budget_micro_to_nusd(micro), buf); }

/* A USD amount: a plain decimal number (digits, a point, an exponent).
 * Returns 0, or prints a usage error and returns 2. */
int cli_parse_usd(const char *flag, const char *text, int64_t *micro, const char *usage) {
  const char *p = text;
  int digits = 0;
  while (isdigit((unsigned char)*p)) p++, digits++;
  if (*p == '.')
    for (p++; isdigit((unsigned char)*p); p++) digits++;
  if (digits && (*p == 'e' || *p == 'E')) {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) digits = 0;
    while (isdigit((unsigned char)*p)) p++;
  }
  if (!digits || *p)
    return cli_usage(usage, "%s wants an amount of USD such as 25 or 0.50, not '%s'", flag, text);
  errno = 0;
  double v = strtod(text, NULL);
  lg_error_t err = {0};
  if (errno == ERANGE || lg_budget_usd_to_micro(v, micro, flag, &err))
    return cli_usage(usage, "%s: %s", flag, err.message[0] ? err.message : "out of range");
  return 0;
}

static void print_json(const lg_budget_t *b) {
  char *j = lg_budget_to_json(b);
  if (j) puts(j);
  else fputs("loopguard: out of memory\n", stderr);
  lg_free(j);
}

static const char *per(lg_budget_period_t p) {
  switch (p) {
  case LG_PERIOD_DAILY: return "a day";
  case LG_PERIOD_WEEKLY: return "a week";
  case LG_PERIOD_MONTHLY: return "a month";
  default: return "in all (never resets)";
  }
}

static void print_human(const lg_budget_t *b) {
  char lim[40], sp[40], res[40], left[40], mif[40], t[40];
  fmt_usd(b->limit_micro, lim);
  fmt_usd(b->spent_micro, sp);
  fmt_usd(b->reserved_micro, res);
  fmt_usd(lg_budget_remaining(b), left);
  printf("%s\n", b->scope);
  printf("  limit          %s USD %s (%s)\n", lim, per(b->period),
         lg_budget_period_name(b->period));
  if (b->period != LG_PERIOD_NONE) {
    fmt_time(b->period_start_ms, t);
    printf("  spent          %s USD since %s\n", sp, t);
  } else {
    printf("  spent          %s USD\n", sp);
  }
  if (b->open_reservations) {
    fmt_time(b->next_expiry_ms, t);
    printf("  reserved       %s USD by %lld call%s in flight (the first runs out at %s)\n", res,
           (long long)b->open_reservations, b->open_reservations == 1 ? "" : "s", t);
  } else {
    printf("  reserved       0 USD (no call in flight)\n");
  }
  printf("  remaining      %s USD\n", left);
  if (b->max_in_flight_micro >= 0) {
    fmt_usd(b->max_in_flight_micro, mif);
    printf("  max in flight  %s USD\n", mif);
  } else {
    printf("  max in flight  no cap\n");
  }
  if (b->resets_at_ms >= 0) {
    fmt_time(b->resets_at_ms, t);
    printf("  resets at      %s\n", t);
  } else {
    printf("  resets at      never\n");
  }
}

/* ---- set ---- */

static int do_set(int argc, char **argv) {
  const char *store = NULL, *limit = NULL, *period = NULL, *mif = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--limit-usd", 1, &limit},
                    {"--period", 1, &period},
                    {"--max-in-flight-usd", 1, &mif},
                    {"--store", 1, &store},
                    {"--json", 0, &json},
                    {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "budget set needs a SCOPE", &npos, set_usage);
  if (rc >= 0) return rc;
  lg_error_t err = {0};
  if (lg_budget_scope_check(pos[0], &err))
    return cli_usage(set_usage, "SCOPE '%s': %s", pos[0], err.message);
  if (!limit) return cli_usage(set_usage, "budget set needs --limit-usd X");
  if (!period) return cli_usage(set_usage, "budget set needs --period daily|weekly|monthly|none");
  int64_t lim = 0, cap = -1;
  lg_budget_period_t p;
  if ((rc = cli_parse_usd("--limit-usd", limit, &lim, set_usage))) return rc;
  if (mif && (rc = cli_parse_usd("--max-in-flight-usd", mif, &cap, set_usage))) return rc;
  if (lg_budget_period_parse(period, &p, &err))
    return cli_usage(set_usage, "--period: %s", err.message);
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  lg_budget_t b;
  rc = lg_budget_set(s, pos[0], lim, p, cap, cli_now_ms(), &b, &err);
  if (rc) {
    cli_error(&err);
  } else if (json) {
    print_json(&b);
  } else {
    char l[40], sp[40];
    fmt_usd(b.limit_micro, l);
    fmt_usd(b.spent_micro, sp);
    printf("set %s: %s USD %s; %s USD spent so far this period\n", b.scope, l, per(b.period), sp);
  }
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- show, reset ---- */

static int do_show_or_reset(int argc, char **argv, int reset) {
  const char *usage = reset ? reset_usage : show_usage;
  const char *store = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"--json", 0, &json}, {NULL, 0, NULL}};
  const char *pos[1];
  const char *missing = reset ? "budget reset needs a SCOPE" : "budget show needs a SCOPE";
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, missing, &npos, usage);
  if (rc >= 0) return rc;
  lg_error_t err = {0};
  if (lg_budget_scope_check(pos[0], &err))
    return cli_usage(usage, "SCOPE '%s': %s", pos[0], err.message);
  lg_store_t *s = reset ? cli_open_store(store) : cli_open_store_existing(store);
  if (!s) return 1;
  lg_budget_t b, before;
  int64_t now = cli_now_ms();
  int had = reset && lg_budget_get(s, pos[0], now, &before, NULL) == 0;
  rc = reset ? lg_budget_reset(s, pos[0], now, &b, &err) : lg_budget_get(s, pos[0], now, &b, &err);
  if (rc) {
    cli_error(&err);
  } else if (json) {
    print_json(&b);
  } else if (reset) {
    char sp[40], res[40];
    fmt_usd(had ? before.spent_micro : 0, sp);
    fmt_usd(b.reserved_micro, res);
    printf("reset %s: spent %s -> 0 USD this period; %s USD still held by calls in flight\n",
           b.scope, sp, res);
  } else {
    print_human(&b);
  }
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- list ---- */

typedef struct list_ctx {
  int json;
  int n;
} list_ctx_t;

static int list_one(void *ud, const lg_budget_t *b) {
  list_ctx_t *x = ud;
  if (x->json) {
    print_json(b);
  } else {
    char lim[40], sp[40], res[40], left[40], t[40] = "never";
    if (!x->n)
      printf("%-32s %12s %-8s %12s %12s %12s  %s\n", "SCOPE", "LIMIT_USD", "PERIOD", "SPENT_USD",
             "RESERVED_USD", "REMAINING", "RESETS_AT");
    fmt_usd(b->limit_micro, lim);
    fmt_usd(b->spent_micro, sp);
    fmt_usd(b->reserved_micro, res);
    fmt_usd(lg_budget_remaining(b), left);
    if (b->resets_at_ms >= 0) fmt_time(b->resets_at_ms, t);
    printf("%-32s %12s %-8s %12s %12s %12s  %s\n", b->scope, lim,
           lg_budget_period_name(b->period), sp, res, left, t);
  }
  x->n++;
  return 0;
}

static int do_list(int argc, char **argv) {
  const char *store = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"--json", 0, &json}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 0, NULL, &npos, list_usage);
  if (rc >= 0) return rc;
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  list_ctx_t x = {json != NULL, 0};
  lg_error_t err = {0};
  rc = lg_budget_list(s, cli_now_ms(), list_one, &x, &err);
  if (rc) cli_error(&err);
  else if (!x.n && !json)
    printf("no budgets in %s (create one with 'loopguard budget set SCOPE --limit-usd X "
           "--period P')\n",
           lg_store_name(s));
  lg_store_close(s);
  return rc ? 1 : 0;
}

int cmd_budget(int argc, char **argv) {
  if (argc < 2) return cli_usage(budget_usage, "budget needs a subcommand");
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(budget_usage, stdout);
    return 0;
  }
  if (!strcmp(sub, "set")) return do_set(argc - 1, argv + 1);
  if (!strcmp(sub, "show")) return do_show_or_reset(argc - 1, argv + 1, 0);
  if (!strcmp(sub, "list")) return do_list(argc - 1, argv + 1);
  if (!strcmp(sub, "reset")) return do_show_or_reset(argc - 1, argv + 1, 1);
  return cli_usage(budget_usage, "unknown budget subcommand '%s'", sub);
}
