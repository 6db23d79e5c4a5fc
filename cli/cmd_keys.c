/*
 * cmd_keys.c — `loopguard keys create|list|show|update|disable|rotate`:
 * loopguard keys (docs/keys.md), for operators.
 *
 * As `loopguard budget`, each subcommand opens the store named by --store
 * (else $LOOPGUARD_STORE, else sqlite:loopguard.db) and makes one call of
 * the library (lg_key_*) with the real clock as now. The flags become the
 * JSON body of the HTTP routes, which the library checks once for both;
 * the answer is that of the route: JSON with --json, else a few lines for
 * a person. A key's secret is printed once, by create and rotate. Exit
 * status: 0 done, 1 an error (naming the store and the field), 2 bad
 * usage.
 */
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *keys_usage =
    "usage: loopguard keys create NAME [--limit-usd X] [--reset daily|weekly|monthly|none]\n"
    "                             [--workspace W] [--include-byok true|false]\n"
    "                             [--rate-limit N] [--models M1,M2] [--byok UPSTREAM=KEY]\n"
    "                             [--secret-file FILE] [--store URL] [--json]\n"
    "       loopguard keys list [--store URL] [--json]\n"
    "       loopguard keys show HASH [--store URL] [--json]\n"
    "       loopguard keys update HASH [the flags of create] [--enable] [--store URL] [--json]\n"
    "       loopguard keys disable HASH [--store URL] [--json]\n"
    "       loopguard keys rotate HASH [--store URL] [--json]\n"
    "\n"
    "Loopguard keys: a secret (lgk-...) that an agent calls the gateway with, and\n"
    "a spend limit on it that the agent's code cannot switch off (the budget\n"
    "key:ID). The secret is printed once, by create and rotate; the store keeps\n"
    "only its hash. Run 'loopguard keys SUBCOMMAND --help' for each one's flags.\n"
    "\n"
    "Exit status: 0 success, 1 an error (the message names the store and the\n"
    "field), 2 bad usage.\n";

/* The flags that create and update describe alike. Only update takes
 * `none` for a field, which clears it: each lists its own field flags. */
#define RESET_FLAG                                                                        \
  "  --reset P               when the limit resets: daily (00:00 UTC), weekly (Monday),\n" \
  "                          monthly (the 1st) or none (never; the default)\n"
#define INCLUDE_BYOK_FLAG                                                                 \
  "  --include-byok B        true: spend on the key's own provider key counts too\n"
#define SECRET_FILE_FLAG                                                                  \
  "  --secret-file FILE      the server's --secret-file: the provider key is stored\n"   \
  "                          encrypted under it (default $LOOPGUARD_SECRET_FILE; none:\n" \
  "                          in clear)\n"

static const char *create_usage =
    "usage: loopguard keys create NAME [--limit-usd X] [--reset daily|weekly|monthly|none]\n"
    "                             [--workspace W] [--include-byok true|false]\n"
    "                             [--rate-limit N] [--models M1,M2] [--byok UPSTREAM=KEY]\n"
    "                             [--secret-file FILE] [--store URL] [--json]\n"
    "\n"
    "Creates a key and prints its secret, once. A flag left out leaves the field\n"
    "unset ('none', which 'keys update' takes to clear a field, is refused here).\n"
    "\n"
    "  --limit-usd X           the key's spend limit in USD per period [no limit]\n"
    RESET_FLAG
    "  --workspace W           the key's workspace (its budget: workspace:W) [none]\n"
    INCLUDE_BYOK_FLAG
    "  --rate-limit N          requests a minute [no limit]\n"
    "  --models M1,M2          the only models the key may use [any]\n"
    "  --byok UPSTREAM=KEY     the key's own provider key for an upstream\n"
    SECRET_FILE_FLAG
    "  --store URL             the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json                  the answer of POST /v1/keys\n"
    "  --help                  this text\n"
    "\n"
    "Exit status: 0 created, 1 an error, 2 bad usage.\n";

static const char *update_usage =
    "usage: loopguard keys update HASH [--limit-usd X|none] [--reset P] [--workspace W|none]\n"
    "                             [--include-byok true|false] [--rate-limit N|none]\n"
    "                             [--models M1,M2|none] [--byok UPSTREAM=KEY|none] [--enable]\n"
    "                             [--secret-file FILE] [--store URL] [--json]\n"
    "\n"
    "Changes what is given and keeps the rest; spend so far stays.\n"
    "\n"
    "  --limit-usd X|none      the key's spend limit in USD per period (none: no limit)\n"
    RESET_FLAG
    "  --workspace W|none      the key's workspace (its budget: workspace:W; none: no\n"
    "                          workspace)\n"
    INCLUDE_BYOK_FLAG
    "  --rate-limit N|none     requests a minute (none: no limit)\n"
    "  --models M1,M2|none     the only models the key may use (none: any)\n"
    "  --byok UPSTREAM=KEY     the key's own provider key for an upstream (none: every\n"
    "                          provider key of the key removed)\n"
    SECRET_FILE_FLAG
    "  --enable                enables a disabled key\n"
    "  --store URL             the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json                  the answer of PATCH /v1/keys/{hash}\n"
    "  --help                  this text\n"
    "\n"
    "Exit status: 0 updated, 1 an error (no such key, a bad field), 2 bad usage.\n";

static const char *one_usage_fmt =
    "usage: loopguard keys %s%s [--store URL] [--json]\n"
    "\n"
    "%s\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        the answer of %s\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 done, 1 an error (no such key, no store), 2 bad usage.\n";

/* ---- the JSON body from the flags ---- */

typedef struct body {
  char *p;
  size_t len;
  FILE *f;
  int n;
} body_t;

static void str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void field(body_t *b, const char *name) {
  fputs(b->n++ ? "," : "", b->f);
  str(b->f, name);
  fputc(':', b->f);
}

static int is_none(const char *v) { return !strcmp(v, "none"); }

typedef struct fields {
  const char *name, *limit, *reset, *workspace, *byok_inc, *rate, *models, *byok, *enable;
} fields_t;

/* The body of the fields given; 2 after a usage error. */
static int build(const fields_t *x, const char *usage, int update, body_t *b) {
  memset(b, 0, sizeof *b);
  /* The body is JSON: a text that is not UTF-8 is named here, by its flag. */
  const struct {
    const char *what, *value;
  } texts[] = {{"NAME", x->name},     {"--reset", x->reset}, {"--workspace", x->workspace},
               {"--models", x->models}, {"--byok", x->byok}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    int rc = texts[i].value ? cli_check_utf8(texts[i].what, texts[i].value, usage) : -1;
    if (rc >= 0) return rc;
  }
  if (!update) { /* `none` clears a field of a key that has it: not a value to create with */
    const struct {
      const char *flag, *value, *without;
    } cleared[] = {{"--limit-usd", x->limit, "no limit"},
                   {"--workspace", x->workspace, "no workspace"},
                   {"--rate-limit", x->rate, "no rate limit"},
                   {"--models", x->models, "any model"},
                   {"--byok", x->byok, "no provider key"}};
    for (size_t i = 0; i < sizeof cleared / sizeof cleared[0]; i++)
      if (cleared[i].value && is_none(cleared[i].value))
        return cli_usage(usage,
                         "keys create: %s none: leave the flag out for %s ('none' clears a field "
                         "in 'keys update')",
                         cleared[i].flag, cleared[i].without);
  }
  b->f = open_memstream(&b->p, &b->len);
  if (!b->f) return 1;
  fputc('{', b->f);
  int rc = 0;
  if (x->name) field(b, "name"), str(b->f, x->name);
  if (x->limit) {
    int64_t micro = 0;
    field(b, "limit_usd");
    if (update && is_none(x->limit)) fputs("null", b->f);
    else if ((rc = cli_parse_usd("--limit-usd", x->limit, &micro, usage))) goto out;
    else fprintf(b->f, "%lld.%06lld", (long long)(micro / 1000000), (long long)(micro % 1000000));
  }
  if (x->reset) {
    field(b, "limit_reset");
    if (is_none(x->reset)) fputs("null", b->f);
    else str(b->f, x->reset);
  }
  if (x->workspace) {
    field(b, "workspace");
    if (update && is_none(x->workspace)) fputs("null", b->f);
    else str(b->f, x->workspace);
  }
  if (x->byok_inc) {
    if (strcmp(x->byok_inc, "true") && strcmp(x->byok_inc, "false")) {
      rc = cli_usage(usage, "--include-byok wants true or false, not '%s'", x->byok_inc);
      goto out;
    }
    field(b, "include_byok_in_limit");
    fputs(x->byok_inc, b->f);
  }
  if (x->rate) {
    char *end = NULL;
    long long n = strtoll(x->rate, &end, 10);
    field(b, "rate_limit_per_min");
    if (update && is_none(x->rate)) {
      fputs("null", b->f);
    } else if (!*x->rate || *end || n < 1) {
      rc = cli_usage(usage, "--rate-limit wants a whole number of requests a minute, not '%s'",
                     x->rate);
      goto out;
    } else {
      fprintf(b->f, "%lld", n);
    }
  }
  if (x->models) {
    field(b, "models");
    if (update && is_none(x->models)) {
      fputs("null", b->f);
    } else {
      fputc('[', b->f);
      char *m = strdup(x->models), *save = NULL;
      int k = 0;
      for (char *t = strtok_r(m, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        fputs(k++ ? "," : "", b->f);
        str(b->f, t);
      }
      free(m);
      fputc(']', b->f);
      if (!k) {
        rc = cli_usage(usage, "--models wants model names separated by commas");
        goto out;
      }
    }
  }
  if (x->byok) {
    field(b, "byok");
    const char *eq = strchr(x->byok, '=');
    if (update && is_none(x->byok)) {
      fputs("null", b->f);
    } else if (!eq || eq == x->byok || !eq[1]) {
      rc = cli_usage(usage, "--byok wants UPSTREAM=PROVIDER_KEY");
      goto out;
    } else {
      char *u = strndup(x->byok, (size_t)(eq - x->byok));
      fputc('{', b->f);
      str(b->f, u);
      fputc(':', b->f);
      str(b->f, eq + 1);
      fputc('}', b->f);
      free(u);
    }
  }
  if (x->enable) field(b, "disabled"), fputs("false", b->f);
  fputc('}', b->f);
out:
  fclose(b->f);
  b->f = NULL;
  return rc;
}

/* ---- printing ---- */

/* An amount of the answer in USD, for a person ("2.5", "0.000125"): the
 * budget's micro-dollars, written as every amount is (lg_usd_format). */
static const char *usd(const json_t *v, char buf[LG_USD_TEXT_MAX]) {
  int64_t m;
  if (!json_is_number(v) || lg_budget_usd_to_micro(json_number_value(v), &m, NULL, NULL)) return "?";
  return lg_usd_format(lg_budget_micro_to_nusd(m), buf);
}

/* The string `name` of the answer, else `none` (null: the field is not set). */
static const char *text(const json_t *key, const char *name, const char *none) {
  const char *s = json_string_value(json_object_get(key, name));
  return s ? s : none;
}

/* The answer of a key route (flat JSON, lg_key_*), for a person. */
static void print_key(const json_t *k) {
  char a[LG_USD_TEXT_MAX], b[LG_USD_TEXT_MAX], c[LG_USD_TEXT_MAX];
  printf("%s  %s\n", text(k, "hash", "?"), text(k, "name", "?"));
  const json_t *limit = json_object_get(k, "limit_usd");
  if (json_is_number(limit))
    printf("  limit          %s USD, reset %s\n", usd(limit, a), text(k, "limit_reset", "never"));
  else
    printf("  limit          no limit (the spend is still counted)\n");
  printf("  used           %s USD this period, %s USD held in flight",
         usd(json_object_get(k, "usage_usd"), a), usd(json_object_get(k, "reserved_usd"), b));
  const json_t *left = json_object_get(k, "limit_remaining_usd");
  if (json_is_number(left)) printf(", %s USD left", usd(left, c));
  printf("\n");
  if (json_object_get(k, "usage_daily_usd"))
    printf("  today / week / month  %s / %s / %s USD\n",
           usd(json_object_get(k, "usage_daily_usd"), a),
           usd(json_object_get(k, "usage_weekly_usd"), b),
           usd(json_object_get(k, "usage_monthly_usd"), c));
  printf("  workspace      %s\n", text(k, "workspace", "none"));
  const json_t *rate = json_object_get(k, "rate_limit_per_min");
  if (json_is_integer(rate))
    printf("  rate limit     %lld requests a minute\n", (long long)json_integer_value(rate));
  else
    printf("  rate limit     none\n");
  const json_t *models = json_object_get(k, "models"), *m;
  size_t i;
  printf("  models         %s", json_array_size(models) ? "" : "any");
  json_array_foreach(models, i, m) {
    printf("%s%s", i ? ", " : "", json_is_string(m) ? json_string_value(m) : "?");
  }
  printf("\n");
  printf("  disabled       %s\n", json_is_true(json_object_get(k, "disabled")) ? "true" : "false");
}

static int finish(lg_store_t *s, int rc, const lg_error_t *err, char *out, const char *json,
                  int secret) {
  json_t *k = NULL;
  if (rc) {
    cli_error(err);
  } else if (json) {
    printf("%s\n", out);
  } else if (!(k = json_loads(out, 0, NULL))) { /* the library's own answer: always JSON */
    fprintf(stderr, "loopguard: the answer is not JSON: %s\n", out);
    rc = 1;
  } else {
    if (secret)
      printf("secret %s\n(shown this once: the store keeps only its hash)\n", text(k, "key", "?"));
    print_key(k);
  }
  json_decref(k);
  lg_free(out);
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- subcommands ---- */

static int do_fields(int argc, char **argv, int update) {
  const char *usage = update ? update_usage : create_usage;
  fields_t x = {0};
  const char *store = NULL, *json = NULL, *secret_file = getenv("LOOPGUARD_SECRET_FILE");
  cli_flag_t flags[] = {{"--limit-usd", 1, &x.limit},
                        {"--reset", 1, &x.reset},
                        {"--workspace", 1, &x.workspace},
                        {"--include-byok", 1, &x.byok_inc},
                        {"--rate-limit", 1, &x.rate},
                        {"--models", 1, &x.models},
                        {"--byok", 1, &x.byok},
                        {update ? "--enable" : NULL, 0, &x.enable},
                        {"--store", 1, &store},
                        {"--json", 0, &json},
                        {"--secret-file", 1, &secret_file},
                        {NULL, 0, NULL}};
  if (!update) { /* no --enable: the list ends before it */
    memmove(&flags[7], &flags[8], 4 * sizeof flags[0]);
  }
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1,
                           update ? "keys update needs a HASH" : "keys create needs a NAME", &npos,
                           usage);
  if (rc >= 0) return rc;
  if (!update) x.name = pos[0];
  body_t b;
  if ((rc = build(&x, usage, update, &b))) {
    free(b.p);
    return rc;
  }
  lg_error_t err = {0};
  unsigned char secret[LG_KEY_SECRET_BYTES];
  if (secret_file && *secret_file && lg_key_secret_load(secret_file, secret, &err)) {
    cli_error(&err);
    free(b.p);
    return 1;
  }
  lg_store_t *s = cli_open_store(store);
  if (!s) {
    free(b.p);
    return 1;
  }
  if (secret_file && *secret_file) lg_key_set_secret(s, secret);
  memset(secret, 0, sizeof secret);
  char *out = NULL;
  rc = update ? lg_key_update(s, pos[0], b.p, b.len, cli_now_ms(), &out, &err)
              : lg_key_create(s, b.p, b.len, cli_now_ms(), &out, &err);
  free(b.p);
  return finish(s, rc, &err, out, json, !update);
}

static int do_one(int argc, char **argv, const char *sub) {
  char usage[1024];
  int list = !strcmp(sub, "list"), show = !strcmp(sub, "show");
  snprintf(usage, sizeof usage, one_usage_fmt, sub, list ? "" : " HASH",
           list   ? "Every key of the store, without secrets."
           : show ? "The key: its limit, its usage today, this week and this month, what is left."
           : !strcmp(sub, "rotate")
               ? "A new secret for the key, printed once: the old one stops working at once.\n"
                 "Its limit, usage and workspace carry over."
               : "Disables the key: every request with it is refused (401) at once.",
           list ? "GET /v1/keys" : show ? "GET /v1/keys/{hash}"
                             : !strcmp(sub, "rotate") ? "POST /v1/keys/{hash}/rotate"
                                                      : "PATCH /v1/keys/{hash}");
  const char *store = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"--json", 0, &json}, {NULL, 0, NULL}};
  const char *pos[1];
  char missing[64];
  snprintf(missing, sizeof missing, "keys %s needs a HASH", sub);
  int npos, rc = cli_parse(argc, argv, flags, pos, list ? 0 : 1, list ? NULL : missing, &npos,
                           usage);
  if (rc >= 0) return rc;
  int ro = list || show;
  lg_store_t *s = ro ? cli_open_store_existing(store) : cli_open_store(store);
  if (!s) return 1;
  lg_error_t err = {0};
  char *out = NULL;
  int64_t now = cli_now_ms();
  if (list) {
    rc = lg_key_list(s, now, &out, &err);
    if (!rc && !json) {
      printf("%s\n", out); /* one JSON object: the keys without secrets */
      lg_free(out);
      lg_store_close(s);
      return 0;
    }
    return finish(s, rc, &err, out, json ? json : "1", 0);
  }
  if (show) rc = lg_key_show(s, pos[0], now, &out, &err);
  else if (!strcmp(sub, "rotate")) rc = lg_key_rotate(s, pos[0], now, &out, &err);
  else rc = lg_key_update(s, pos[0], "{\"disabled\":true}", 17, now, &out, &err);
  return finish(s, rc, &err, out, json, !strcmp(sub, "rotate"));
}

int cmd_keys(int argc, char **argv) {
  if (argc < 2) return cli_usage(keys_usage, "keys needs a subcommand");
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(keys_usage, stdout);
    return 0;
  }
  if (!strcmp(sub, "create")) return do_fields(argc - 1, argv + 1, 0);
  if (!strcmp(sub, "update")) return do_fields(argc - 1, argv + 1, 1);
  if (!strcmp(sub, "list") || !strcmp(sub, "show") || !strcmp(sub, "disable") ||
      !strcmp(sub, "rotate"))
    return do_one(argc - 1, argv + 1, sub);
  return cli_usage(keys_usage, "unknown keys subcommand '%s'", sub);
}
