/*
 * prices.c — price tables: the price file, a model's price, the worst case
 * of a model call and the cost of a finished one, and the price book that
 * a server swaps atomically when the file is reloaded.
 *
 * A price is kept as an integer number of micro-dollars per million tokens
 * (USD per million tokens times 10^6). That number is also the price of one
 * token in pico-dollars, so a cost is an exact integer product (tokens ×
 * price, in pico-dollars) that is rounded up once, at the end, to
 * nano-dollars (the engine's unit). No floating point touches a cost; only
 * the file's decimal prices go through a double once, when parsed.
 *
 * A table is immutable once parsed and reference counted (atomically), like
 * a policy: a request takes a reference from the book and uses that table
 * to the end, whatever reloads happen meanwhile. The book's pointer swap is
 * under a mutex, held only for the swap and for taking a reference — a
 * reader never sees a table that is being freed.
 *
 * Models are kept sorted by name; a lookup is a binary search.
 */
#include "budget.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* The most a price may be: 10^6 USD per million tokens. */
#define PRICE_MAX_USD 1000000.0
/* The most tokens a call may say it uses: keeps every product in range. */
#define TOKENS_MAX 1000000000000LL /* 10^12 */

typedef struct model_price {
  char *name;        /* the model's exact name */
  lg_price_t price;  /* is_default 0 */
} model_price_t;

struct lg_prices {
  int refs;                 /* atomic */
  char *source;             /* file name or "<input>" */
  model_price_t *models;    /* sorted by name */
  size_t nmodels;
  int has_default;          /* "default" was given */
  lg_price_t dflt;          /* is_default 1 */
  int64_t default_max_tokens; /* -1: none */
};

/* ---- parsing ---- */

/* Names the input in err (replacing what an earlier call left there). */
static void set_source(lg_error_t *err, const char *src) {
  if (err) snprintf(err->source, sizeof err->source, "%s", src);
}

static void prices_destroy(lg_prices_t *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nmodels; i++) lg__free(p->models[i].name);
  lg__free(p->models);
  lg__free(p->source);
  lg__free(p);
}

/* A price in USD per million tokens, into micro-dollars per million. */
static int get_price(json_t *v, const char *path, int64_t *out, lg_error_t *err) {
  if (!json_is_number(v))
    return lg__err(err, LG_EINVAL, path, -1, "expected a number of USD per million tokens");
  double usd = json_number_value(v);
  if (!isfinite(usd) || usd < 0)
    return lg__err(err, LG_EINVAL, path, -1, "a price must be a non-negative number");
  if (usd > PRICE_MAX_USD)
    return lg__err(err, LG_ERANGE, path, -1, "%g USD per million tokens is beyond %g", usd,
                   PRICE_MAX_USD);
  if (lg__usd_to_units(usd, LG__USD_MICRO, out))
    return lg__err(err, LG_ERANGE, path, -1, "%g USD per million tokens is beyond %g", usd,
                   PRICE_MAX_USD);
  return 0;
}

static int get_tokens(json_t *v, const char *path, int64_t *out, lg_error_t *err) {
  if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > TOKENS_MAX)
    return lg__err(err, LG_EINVAL, path, -1, "expected a whole number of tokens above 0");
  *out = (int64_t)json_integer_value(v);
  return 0;
}

/* Parses one price object ("models.NAME" or "default") into *out. */
static int parse_price(json_t *obj, const char *path, lg_price_t *out, lg_error_t *err) {
  char f[256];
  if (!json_is_object(obj))
    return lg__err(err, LG_EINVAL, path, -1,
                   "expected an object with input_usd_per_mtok and output_usd_per_mtok");
  memset(out, 0, sizeof *out);
  out->cached_input_per_mtok = -1;
  out->max_output_tokens = -1;
  out->attachment_tokens = -1;
  int have_in = 0, have_out = 0, rc;
  const char *k;
  json_t *v;
  json_object_foreach(obj, k, v) {
    snprintf(f, sizeof f, "%s.%s", path, k);
    if (!strcmp(k, "input_usd_per_mtok")) {
      if ((rc = get_price(v, f, &out->input_per_mtok, err))) return rc;
      have_in = 1;
    } else if (!strcmp(k, "output_usd_per_mtok")) {
      if ((rc = get_price(v, f, &out->output_per_mtok, err))) return rc;
      have_out = 1;
    } else if (!strcmp(k, "cached_input_usd_per_mtok")) {
      if ((rc = get_price(v, f, &out->cached_input_per_mtok, err))) return rc;
    } else if (!strcmp(k, "max_output_tokens")) {
      if ((rc = get_tokens(v, f, &out->max_output_tokens, err))) return rc;
    } else if (!strcmp(k, "attachment_tokens")) {
      if ((rc = get_tokens(v, f, &out->attachment_tokens, err))) return rc;
    } else {
      return lg__err(err, LG_EINVAL, f, -1,
                     "unknown field (a price has input_usd_per_mtok, output_usd_per_mtok, "
                     "cached_input_usd_per_mtok, max_output_tokens, attachment_tokens)");
    }
  }
  if (!have_in || !have_out)
    return lg__err(err, LG_EINVAL, path, -1, "%s is missing",
                   !have_in ? "input_usd_per_mtok" : "output_usd_per_mtok");
  if (out->cached_input_per_mtok < 0) out->cached_input_per_mtok = out->input_per_mtok;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const model_price_t *)a)->name, ((const model_price_t *)b)->name);
}

static int parse_root(lg_prices_t *p, json_t *root, lg_error_t *err) {
  if (!json_is_object(root))
    return lg__err(err, LG_EINVAL, NULL, -1, "a price file is a JSON object with \"models\"");
  json_t *models = json_object_get(root, "models");
  if (!models)
    return lg__err(err, LG_EINVAL, "models", -1, "missing: the prices of the models");
  if (!json_is_object(models))
    return lg__err(err, LG_EINVAL, "models", -1, "expected an object of model name to price");
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (!strcmp(k, "models")) continue;
    if (!strcmp(k, "version")) {
      if (!json_is_integer(v) || json_integer_value(v) != 1)
        return lg__err(err, LG_EINVAL, "version", -1, "only version 1 is known");
    } else if (!strcmp(k, "default")) {
      int rc = parse_price(v, "default", &p->dflt, err);
      if (rc) return rc;
      p->dflt.is_default = 1;
      p->has_default = 1;
    } else if (!strcmp(k, "default_max_tokens")) {
      int rc = get_tokens(v, "default_max_tokens", &p->default_max_tokens, err);
      if (rc) return rc;
    } else {
      return lg__err(err, LG_EINVAL, k, -1,
                     "unknown field (a price file has models, default, default_max_tokens, "
                     "version)");
    }
  }
  size_t n = json_object_size(models);
  p->models = lg__calloc(n + 1, sizeof *p->models);
  if (!p->models) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  json_object_foreach(models, k, v) {
    char path[256];
    snprintf(path, sizeof path, "models.%s", k);
    if (!*k) return lg__err(err, LG_EINVAL, "models", -1, "a model name is empty");
    model_price_t *m = &p->models[p->nmodels];
    int rc = parse_price(v, path, &m->price, err);
    if (rc) return rc;
    if (!(m->name = lg__strdup(k))) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    p->nmodels++;
  }
  qsort(p->models, p->nmodels, sizeof *p->models, by_name);
  return 0;
}

lg_prices_t *lg_prices_parse(const char *json, size_t len, const char *source,
                             lg_error_t *err) {
  const char *src = source && *source ? source : "<input>";
  lg_prices_t *p = lg__calloc(1, sizeof *p);
  if (!p || !(p->source = lg__strdup(src))) {
    lg__free(p);
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return NULL;
  }
  p->refs = 1;
  p->default_max_tokens = -1;
  json_error_t je;
  lg__json_begin();
  json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
  if (lg__json_oom()) { /* jansson's own failures look like syntax errors */
    json_decref(root);
    lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    set_source(err, src);
    prices_destroy(p);
    return NULL;
  }
  if (!root) {
    if (json_error_code(&je) == json_error_out_of_memory || !je.text[0]) {
      lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    } else {
      lg__err(err, LG_EPARSE, NULL, je.position, "%s (line %d, column %d)", je.text, je.line,
              je.column);
      if (err) err->line = je.line;
    }
    set_source(err, src);
    prices_destroy(p);
    return NULL;
  }
  int rc = parse_root(p, root, err);
  json_decref(root);
  if (rc) {
    set_source(err, src);
    if (rc != LG_ENOMEM) lg__err_json_line(err, json, len);
    prices_destroy(p);
    return NULL;
  }
  return p;
}

lg_prices_t *lg_prices_load_file(const char *path, lg_error_t *err) {
  if (!path) {
    lg__err(err, LG_EINVAL, NULL, -1, "no price file named");
    return NULL;
  }
  lg__buf_t b = {0};
  if (lg__buf_read_file(&b, path, "price file", err)) return NULL;
  lg_prices_t *p = lg_prices_parse(b.data ? b.data : "", b.len, path, err);
  lg__buf_free(&b);
  return p;
}

lg_prices_t *lg_prices_ref(lg_prices_t *p) {
  if (p) __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
  return p;
}

void lg_prices_free(lg_prices_t *p) {
  if (p && __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0) prices_destroy(p);
}

size_t lg_prices_count(const lg_prices_t *p) { return p ? p->nmodels : 0; }
const char *lg_prices_source(const lg_prices_t *p) { return p ? p->source : NULL; }

/* ---- lookups and costs ---- */

int lg_prices_lookup(const lg_prices_t *p, const char *model, lg_price_t *out,
                     lg_error_t *err) {
  if (p && model) {
    size_t lo = 0, hi = p->nmodels;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      int c = strcmp(model, p->models[mid].name);
      if (!c) {
        *out = p->models[mid].price;
        return 0;
      }
      if (c < 0) hi = mid;
      else lo = mid + 1;
    }
  }
  if (p && p->has_default) {
    *out = p->dflt;
    return 0;
  }
  if (!p)
    return lg__err(err, LG_ENOTFOUND, "model", -1,
                   "no price for model \"%s\": no price file is loaded (start with --prices "
                   "FILE, or give cost_usd)",
                   model ? model : "(none)");
  if (!model)
    return lg__err(err, LG_ENOTFOUND, "model", -1,
                   "the call names no model and %s has no \"default\" price", p->source);
  return lg__err(err, LG_ENOTFOUND, "model", -1,
                 "no price for model \"%s\" in %s (and no \"default\" price): add it to the "
                 "price file, or give cost_usd",
                 model, p->source);
}

/* tokens × price in pico-dollars, rounded up to nano-dollars, added to
 * *acc. LG_ERANGE on overflow (not reachable with the bounds checked). */
static int add_cost(int64_t tokens, int64_t price_per_mtok, int64_t *acc_pusd) {
  int64_t pusd;
  if (__builtin_mul_overflow(tokens, price_per_mtok, &pusd)) return LG_ERANGE;
  if (__builtin_add_overflow(*acc_pusd, pusd, acc_pusd)) return LG_ERANGE;
  return 0;
}

static int64_t pusd_to_nusd(int64_t pusd) { return pusd / 1000 + (pusd % 1000 != 0); }

static int check_tokens(const char *what, int64_t n, lg_error_t *err) {
  if (n < 0) return lg__err(err, LG_EINVAL, what, -1, "%s must not be negative", what);
  if (n > TOKENS_MAX)
    return lg__err(err, LG_ERANGE, what, -1, "%s is beyond %lld", what, (long long)TOKENS_MAX);
  return 0;
}

/* The output of a call of model price pr that gives no max_tokens: the
 * model's bound, else the file's; -1 when neither (one rule for the worst
 * case and for the run's token cap). */
static int64_t output_bound(const lg_prices_t *p, const lg_price_t *pr) {
  return pr->max_output_tokens >= 0 ? pr->max_output_tokens : p->default_max_tokens;
}

int64_t lg__prices_output_bound(const lg_prices_t *p, const char *model) {
  lg_price_t pr;
  return lg_prices_lookup(p, model, &pr, NULL) ? -1 : output_bound(p, &pr);
}

int lg_prices_worst_case(const lg_prices_t *p, const char *model, int64_t input_tokens,
                         int64_t max_tokens, int64_t *nusd, lg_error_t *err) {
  lg_price_t pr;
  int rc = check_tokens("input_tokens", input_tokens, err);
  if (rc) return rc;
  if ((rc = lg_prices_lookup(p, model, &pr, err))) return rc;
  int64_t out_tokens = max_tokens >= 0 ? max_tokens : output_bound(p, &pr);
  if (out_tokens < 0)
    return lg__err(err, LG_EINVAL, "max_tokens", -1,
                   "the call gives no max_tokens, so its output has no bound, and %s sets "
                   "neither max_output_tokens for \"%s\" nor default_max_tokens",
                   p->source, model ? model : "default");
  if ((rc = check_tokens("max_tokens", out_tokens, err))) return rc;
  int64_t acc = 0;
  if (add_cost(input_tokens, pr.input_per_mtok, &acc) ||
      add_cost(out_tokens, pr.output_per_mtok, &acc))
    return lg__err(err, LG_ERANGE, "max_tokens", -1, "the worst case overflows");
  *nusd = pusd_to_nusd(acc);
  return 0;
}

int lg_prices_cost(const lg_prices_t *p, const char *model, int64_t input_tokens,
                   int64_t cached_input_tokens, int64_t output_tokens, int64_t *nusd,
                   lg_error_t *err) {
  lg_price_t pr;
  int rc;
  if ((rc = check_tokens("input_tokens", input_tokens, err)) ||
      (rc = check_tokens("cached_input_tokens", cached_input_tokens, err)) ||
      (rc = check_tokens("output_tokens", output_tokens, err)))
    return rc;
  if (cached_input_tokens > input_tokens)
    return lg__err(err, LG_EINVAL, "cached_input_tokens", -1,
                   "cached_input_tokens (%lld) is more than input_tokens (%lld)",
                   (long long)cached_input_tokens, (long long)input_tokens);
  if ((rc = lg_prices_lookup(p, model, &pr, err))) return rc;
  int64_t acc = 0;
  if (add_cost(input_tokens - cached_input_tokens, pr.input_per_mtok, &acc) ||
      add_cost(cached_input_tokens, pr.cached_input_per_mtok, &acc) ||
      add_cost(output_tokens, pr.output_per_mtok, &acc))
    return lg__err(err, LG_ERANGE, NULL, -1, "the cost overflows");
  *nusd = pusd_to_nusd(acc);
  return 0;
}

/* ---- the price book ---- */

struct lg_price_book {
  pthread_mutex_t mu; /* guards `cur` for the swap and the reference */
  lg_prices_t *cur;   /* a reference, or NULL */
  char *path;         /* the file, or NULL */
};

lg_price_book_t *lg_price_book_new(const char *path, lg_error_t *err) {
  lg_price_book_t *b = lg__calloc(1, sizeof *b);
  if (!b) goto oom;
  if (path && !(b->path = lg__strdup(path))) goto oom;
  if (pthread_mutex_init(&b->mu, NULL)) goto oom;
  if (path && !(b->cur = lg_prices_load_file(path, err))) {
    pthread_mutex_destroy(&b->mu);
    lg__free(b->path);
    lg__free(b);
    return NULL;
  }
  return b;
oom:
  if (b) lg__free(b->path);
  lg__free(b);
  lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return NULL;
}

void lg_price_book_set(lg_price_book_t *b, lg_prices_t *p) {
  lg_prices_ref(p);
  pthread_mutex_lock(&b->mu);
  lg_prices_t *old = b->cur;
  b->cur = p;
  pthread_mutex_unlock(&b->mu);
  lg_prices_free(old); /* readers that hold it keep their own reference */
}

int lg_price_book_reload(lg_price_book_t *b, lg_error_t *err) {
  if (!b->path) return lg__err(err, LG_ESTATE, NULL, -1, "the price book has no file to reload");
  lg_prices_t *p = lg_prices_load_file(b->path, err);
  if (!p) return err && err->code ? err->code : LG_EINVAL;
  lg_price_book_set(b, p);
  lg_prices_free(p);
  return 0;
}

lg_prices_t *lg_price_book_get(lg_price_book_t *b) {
  pthread_mutex_lock(&b->mu);
  lg_prices_t *p = lg_prices_ref(b->cur);
  pthread_mutex_unlock(&b->mu);
  return p;
}

void lg_price_book_free(lg_price_book_t *b) {
  if (!b) return;
  lg_prices_free(b->cur);
  pthread_mutex_destroy(&b->mu);
  lg__free(b->path);
  lg__free(b);
}
