/*
 * keys.c — loopguard keys (gateway-v1, "Keys"): a secret that a client
 * calls the gateway with, and the spend limit that rides on it.
 *
 * A key is a row of lg_keys (its name, workspace, reset period, rate
 * limit, models, provider keys) and a shared budget: the scope key:ID,
 * whose limit is the key's limit_usd (LG_BUDGET_MAX_MICRO when it has
 * none, so that its spend is still counted) and whose period is the key's
 * limit_reset. Spend, reservations, periods and refusals are those of the
 * budgets (budget.c): nothing here counts money.
 *
 * ID is the SHA-256 (hex) of the key's first secret and never changes;
 * `hash` is the SHA-256 of the current secret, which rotation replaces. A
 * presented secret is hashed, its row looked up by that hash, and the
 * hash compared again with CRYPTO_memcmp: an old secret, whose hash is
 * still the id of its key, is refused. Every check reads the store: a key
 * disabled or rotated on one replica is refused at once on every other.
 *
 * The fields of creation and update are parsed once (parse_fields), for
 * the HTTP routes and the CLI alike (both give JSON).
 */
#include "budget.h"
#include "../store/store.h"

#include <jansson.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>

#define SECRET_RANDOM 40 /* characters after "lgk-" */

static int where(lg_store_t *s, int rc, lg_error_t *err) {
  if (rc < 0 && err && !err->source[0]) lg__err_where(err, lg_store_name(s), 0);
  return rc;
}

/* "lgk-" and SECRET_RANDOM characters of [0-9A-Za-z] from OpenSSL's
 * generator (rejection sampling: no character more likely than another). */
static int new_secret(char out[5 + SECRET_RANDOM], lg_error_t *err) {
  static const char al[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  memcpy(out, LG_KEY_PREFIX, 4);
  size_t got = 0;
  while (got < SECRET_RANDOM) {
    unsigned char r[64];
    if (RAND_bytes(r, sizeof r) != 1)
      return lg__err(err, LG_EIO, NULL, -1, "no randomness for a key's secret");
    for (size_t i = 0; i < sizeof r && got < SECRET_RANDOM; i++)
      if (r[i] < 248) out[4 + got++] = al[r[i] % 62];
    OPENSSL_cleanse(r, sizeof r);
  }
  out[4 + SECRET_RANDOM] = 0;
  return 0;
}

static void scope_of(const char *id, char out[LG_BUDGET_SCOPE_MAX + 1]) {
  snprintf(out, LG_BUDGET_SCOPE_MAX + 1, "key:%s", id);
}

/* ---- the fields of creation and update ---- */

static int bad(lg_error_t *err, const char *field, const char *what) {
  return lg__err(err, LG_EINVAL, field, -1, "%s: %s", field, what);
}

static char *dup_json(json_t *v) {
  char *t = json_dumps(v, JSON_COMPACT);
  char *r = t ? lg__strdup(t) : NULL;
  free(t);
  return r;
}

/* The fields of creation; update takes `disabled` too. */
static const char *const key_fields[] = {"name", "limit_usd", "limit_reset", "workspace",
                                         "include_byok_in_limit", "rate_limit_per_min", "models",
                                         "byok", "disabled", NULL};

static bool key_field(const char *name, const void *ud) {
  int create = *(const int *)ud;
  for (const char *const *f = key_fields; *f; f++)
    if (!strcmp(*f, name)) return !create || strcmp(name, "disabled");
  return false;
}

/* Applies the fields of body to row, read as every body a client sends
 * (an empty one is {}, duplicate keys and unknown fields, all named, are
 * refused). create: name is required, disabled is not allowed. */
static int parse_fields(const char *json, size_t len, int create, lg__key_row_t *row,
                        lg_error_t *err) {
  if (!json || lg__json_ws_end(json, 0, len) == len) json = "{}", len = 2;
  lg__json_begin();
  json_error_t je;
  json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (lg__json_oom()) {
    json_decref(o);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  if (!o)
    return lg__err(err, LG_EPARSE, NULL, je.position, "body: malformed JSON at line %d, column %d: %s",
                   je.line, je.column, je.text);
  int rc = 0;
  if (!json_is_object(o)) rc = bad(err, "body", "expected a JSON object");
  else
    rc = lg__json_unknown_fields(o, key_field, &create,
                                 create ? "(known: name, limit_usd, limit_reset, workspace, "
                                          "include_byok_in_limit, rate_limit_per_min, models, byok)"
                                        : "(known: name, limit_usd, limit_reset, workspace, "
                                          "include_byok_in_limit, rate_limit_per_min, models, byok, "
                                          "disabled)",
                                 err);
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    if (rc) break;
    if (!strcmp(k, "name")) {
      if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > 200)
        rc = bad(err, k, "expected a string of 1 to 200 bytes");
      else lg__free(row->name), row->name = lg__strdup(json_string_value(v));
    } else if (!strcmp(k, "limit_usd")) {
      int64_t m = -1;
      if (json_is_null(v)) m = -1;
      else if (!json_is_number(v)) rc = bad(err, k, "expected a number of USD or null");
      else rc = lg_budget_usd_to_micro(json_number_value(v), &m, k, err);
      if (!rc) row->limit_micro = m;
    } else if (!strcmp(k, "limit_reset")) {
      lg_budget_period_t p = LG_PERIOD_NONE;
      if (json_is_null(v)) p = LG_PERIOD_NONE;
      else if (!json_is_string(v)) rc = bad(err, k, "expected \"daily\", \"weekly\", \"monthly\" or null");
      else if (lg_budget_period_parse(json_string_value(v), &p, err)) rc = bad(err, k, "expected \"daily\", \"weekly\", \"monthly\" or null");
      if (!rc) row->reset = (int)p;
    } else if (!strcmp(k, "workspace")) {
      lg__free(row->workspace);
      row->workspace = NULL;
      if (json_is_null(v)) continue;
      char sc[LG_BUDGET_SCOPE_MAX + 16];
      if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > 200) {
        rc = bad(err, k, "expected a name of 1 to 200 bytes or null");
        continue;
      }
      snprintf(sc, sizeof sc, "workspace:%s", json_string_value(v));
      if (lg_budget_scope_check(sc, NULL)) rc = bad(err, k, "must be UTF-8 without control characters");
      else row->workspace = lg__strdup(json_string_value(v));
    } else if (!strcmp(k, "include_byok_in_limit")) {
      if (!json_is_boolean(v)) rc = bad(err, k, "expected true or false");
      else row->include_byok = json_is_true(v);
    } else if (!strcmp(k, "rate_limit_per_min")) {
      double n = json_number_value(v); /* a whole number written 60 or 60.0 */
      if (json_is_null(v)) row->rate_per_min = -1;
      else if (!json_is_number(v) || n != floor(n) || n < 1 || n > 1000000)
        rc = bad(err, k, "expected a whole number of requests from 1 to 1000000, or null");
      else row->rate_per_min = (int64_t)n;
    } else if (!strcmp(k, "models")) {
      lg__free(row->models);
      row->models = NULL;
      if (json_is_null(v)) continue;
      size_t i;
      json_t *m;
      if (!json_is_array(v)) rc = bad(err, k, "expected an array of model names or null");
      json_array_foreach(v, i, m) if (!rc && (!json_is_string(m) || !json_string_length(m))) {
        char f[32];
        snprintf(f, sizeof f, "models[%zu]", i);
        rc = bad(err, f, "expected a model name");
      }
      if (!rc) row->models = dup_json(v);
    } else if (!strcmp(k, "byok")) {
      lg__free(row->byok);
      row->byok = NULL;
      if (json_is_null(v)) continue;
      const char *u;
      json_t *pk;
      if (!json_is_object(v)) rc = bad(err, k, "expected an object {UPSTREAM: PROVIDER_KEY} or null");
      json_object_foreach(v, u, pk) if (!rc && (!json_is_string(pk) || !json_string_length(pk) ||
                                                 lg__byok_is_sealed(json_string_value(pk)))) {
        char f[LG_BUDGET_SCOPE_MAX];
        snprintf(f, sizeof f, "byok.%.200s", u);
        rc = bad(err, f, json_is_string(pk) && json_string_length(pk)
                             ? "a provider key may not start with \"" LG__BYOK_SEALED "\""
                             : "expected the provider key as a string");
      }
      if (!rc) row->byok = dup_json(v);
    } else if (!strcmp(k, "disabled")) { /* update's alone (key_field) */
      if (!json_is_boolean(v)) rc = bad(err, k, "expected true or false");
      else row->disabled = json_is_true(v);
    }
  }
  if (!rc && create && !row->name) rc = bad(err, "name", "required");
  if (!rc && row->limit_micro < 0 && row->reset != LG_PERIOD_NONE)
    rc = bad(err, "limit_reset", "a reset needs a limit_usd");
  json_decref(o);
  return rc;
}

/* ---- answers ---- */

static void put_usd(lg__buf_t *b, int64_t micro) { lg__buf_usd(b, lg_budget_micro_to_nusd(micro)); }

static void put_time(lg__buf_t *b, int64_t ms) {
  char t[32];
  lg__time_rfc3339(ms, t);
  lg__buf_printf(b, "\"%s\"", t);
}

static void put_str_or_null(lg__buf_t *b, const char *s) {
  if (s) lg__buf_json_str(b, s, strlen(s));
  else lg__buf_puts(b, "null");
}

/* How the key's provider keys are stored: "encrypted" when every one is
 * sealed, "clear" when one is not, NULL when it has none. */
static const char *byok_at_rest(const lg__key_row_t *r) {
  json_t *o = r->byok ? json_loads(r->byok, 0, NULL) : NULL;
  const char *u, *at = NULL;
  json_t *v;
  json_object_foreach(o, u, v) {
    if (!lg__byok_is_sealed(json_string_value(v))) {
      at = "clear";
      break;
    }
    at = "encrypted";
  }
  json_decref(o);
  return at;
}

/* Seals the key's provider keys still in clear, when the store has a
 * secret (src/budget/seal.c); sealed ones are kept as they are. */
static int seal_byok(lg_store_t *s, lg__key_row_t *r, lg_error_t *err) {
  if (!s->has_key_secret || !r->byok) return 0;
  json_t *o = json_loads(r->byok, 0, NULL);
  if (!o) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  const char *u;
  json_t *v;
  int rc = 0;
  json_object_foreach(o, u, v) {
    const char *pk = json_string_value(v);
    char *sealed = NULL;
    if (rc || !pk || lg__byok_is_sealed(pk)) continue;
    rc = lg__byok_seal(s->key_secret, r->id, u, pk, &sealed, err);
    if (!rc && json_object_set_new(o, u, json_string(sealed)))
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    lg__free(sealed);
  }
  char *t = rc ? NULL : dup_json(o);
  if (!rc && !t) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  if (!rc) {
    OPENSSL_cleanse(r->byok, strlen(r->byok));
    lg__free(r->byok);
    r->byok = t;
  }
  json_decref(o);
  return rc;
}

/* The key as the API shows it: never a provider key, only the upstreams
 * that have one. usage (may be NULL): usage_daily_usd and the others. */
static void key_json(lg__buf_t *b, const lg__key_row_t *r, const lg_budget_t *bud,
                     const int64_t *usage) {
  lg__buf_puts(b, "{\"hash\":");
  put_str_or_null(b, r->hash);
  lg__buf_puts(b, ",\"id\":");
  put_str_or_null(b, r->id);
  lg__buf_puts(b, ",\"name\":");
  put_str_or_null(b, r->name);
  lg__buf_puts(b, ",\"limit_usd\":");
  if (r->limit_micro >= 0) put_usd(b, r->limit_micro);
  else lg__buf_puts(b, "null");
  lg__buf_puts(b, ",\"limit_reset\":");
  put_str_or_null(b, r->reset ? lg_budget_period_name(r->reset) : NULL);
  lg__buf_puts(b, ",\"workspace\":");
  put_str_or_null(b, r->workspace);
  lg__buf_printf(b, ",\"include_byok_in_limit\":%s", r->include_byok ? "true" : "false");
  lg__buf_puts(b, ",\"rate_limit_per_min\":");
  if (r->rate_per_min >= 0) lg__buf_printf(b, "%lld", (long long)r->rate_per_min);
  else lg__buf_puts(b, "null");
  lg__buf_printf(b, ",\"models\":%s", r->models ? r->models : "null");
  lg__buf_puts(b, ",\"byok_upstreams\":[");
  if (r->byok) {
    json_t *o = json_loads(r->byok, 0, NULL);
    const char *u;
    json_t *v;
    int n = 0;
    json_object_foreach(o, u, v) {
      if (n++) lg__buf_putc(b, ',');
      lg__buf_json_str(b, u, strlen(u));
    }
    json_decref(o);
  }
  lg__buf_puts(b, "],\"byok_at_rest\":");
  put_str_or_null(b, byok_at_rest(r));
  lg__buf_puts(b, ",\"scope\":");
  char sc[LG_BUDGET_SCOPE_MAX + 1];
  scope_of(r->id, sc);
  lg__buf_json_str(b, sc, strlen(sc));
  lg__buf_puts(b, ",\"usage_usd\":");
  put_usd(b, bud ? bud->spent_micro : 0);
  lg__buf_puts(b, ",\"reserved_usd\":");
  put_usd(b, bud ? bud->reserved_micro : 0);
  lg__buf_puts(b, ",\"limit_remaining_usd\":");
  if (r->limit_micro >= 0 && bud) put_usd(b, lg_budget_remaining(bud));
  else lg__buf_puts(b, "null");
  lg__buf_puts(b, ",\"resets_at\":");
  if (bud && bud->resets_at_ms >= 0 && r->reset) put_time(b, bud->resets_at_ms);
  else lg__buf_puts(b, "null");
  if (usage) {
    lg__buf_puts(b, ",\"usage_daily_usd\":");
    put_usd(b, usage[0]);
    lg__buf_puts(b, ",\"usage_weekly_usd\":");
    put_usd(b, usage[1]);
    lg__buf_puts(b, ",\"usage_monthly_usd\":");
    put_usd(b, usage[2]);
  }
  lg__buf_printf(b, ",\"disabled\":%s,\"created_at\":", r->disabled ? "true" : "false");
  put_time(b, r->created_ms);
  lg__buf_puts(b, ",\"rotated_at\":");
  if (r->rotated_ms) put_time(b, r->rotated_ms);
  else lg__buf_puts(b, "null");
  lg__buf_putc(b, '}');
}

/* The key's budget as of now (zeroes when it has none, which only an
 * interrupted creation leaves). */
static int key_budget(lg_store_t *s, const lg__key_row_t *r, int64_t now_ms, lg_budget_t *b,
                      lg_error_t *err) {
  char sc[LG_BUDGET_SCOPE_MAX + 1];
  scope_of(r->id, sc);
  memset(b, 0, sizeof *b);
  b->resets_at_ms = -1;
  int rc = lg_budget_get(s, sc, now_ms, b, err);
  return rc == LG_ENOTFOUND ? 0 : rc;
}

/* The key's settled spend of today, this week and this month (UTC). */
static int key_usage(lg_store_t *s, const lg__key_row_t *r, int64_t now_ms, int64_t usage[3],
                     lg_error_t *err) {
  char sc[LG_BUDGET_SCOPE_MAX + 1];
  scope_of(r->id, sc);
  static const lg_budget_period_t ps[3] = {LG_PERIOD_DAILY, LG_PERIOD_WEEKLY, LG_PERIOD_MONTHLY};
  int rd = lg__store_read_begin(s), rc = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    int64_t start = 0;
    lg_budget_period_bounds(ps[i], now_ms, &start, NULL);
    rc = lg__sql_key_spent_since(s, sc, start, &usage[i], err);
  }
  lg__store_read_end(s, rd);
  return rc;
}

static int answer(lg_store_t *s, const lg__key_row_t *r, const char *secret, int detail,
                  int64_t now_ms, char **out, lg_error_t *err) {
  lg_budget_t bud;
  int64_t usage[3] = {0, 0, 0};
  int rc = key_budget(s, r, now_ms, &bud, err);
  if (!rc && detail) rc = key_usage(s, r, now_ms, usage, err);
  if (rc) return rc;
  lg__buf_t b = {0};
  if (secret) {
    lg__buf_puts(&b, "{\"key\":");
    lg__buf_json_str(&b, secret, strlen(secret));
    lg__buf_putc(&b, ',');
    lg__buf_t k = {0};
    key_json(&k, r, &bud, detail ? usage : NULL);
    lg__buf_append(&b, k.data + 1, k.len - 1); /* the key's fields after "key" */
    lg__buf_free(&k);
  } else {
    key_json(&b, r, &bud, detail ? usage : NULL);
  }
  if (!(*out = lg__buf_steal(&b, NULL))) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

/* ---- the store ---- */

static int read_key(lg_store_t *s, const char *ref, lg__key_row_t *r, lg_error_t *err) {
  int found = 0;
  int rd = lg__store_read_begin(s);
  int rc = lg__sql_key_read(s, ref, r, &found, err);
  lg__store_read_end(s, rd);
  if (!rc && !found) rc = lg__err(err, LG_ENOTFOUND, "key", -1, "no key %.80s", ref);
  return rc;
}

/* The key's budget follows its limit and reset (spend in the period kept). */
static int sync_budget(lg_store_t *s, const lg__key_row_t *r, int64_t now_ms, lg_error_t *err) {
  char sc[LG_BUDGET_SCOPE_MAX + 1];
  scope_of(r->id, sc);
  lg_budget_t old;
  int64_t in_flight = -1; /* kept as an operator set it with PUT /v1/budgets */
  if (!lg_budget_get(s, sc, now_ms, &old, NULL)) in_flight = old.max_in_flight_micro;
  return lg_budget_set(s, sc, r->limit_micro >= 0 ? r->limit_micro : LG_BUDGET_MAX_MICRO,
                       (lg_budget_period_t)r->reset, in_flight, now_ms, NULL, err);
}

static int write_key(lg_store_t *s, const lg__key_row_t *r, int insert, lg_error_t *err) {
  lg__store_lock(s);
  int rc = lg__store_begin(s, LG__TXN_LEDGER, err), updated = 1;
  if (!rc) {
    rc = insert ? lg__sql_key_insert(s, r, err) : lg__sql_key_update(s, r, &updated, err);
    if (!rc && !updated) rc = lg__err(err, LG_ENOTFOUND, "key", -1, "no key %.80s", r->id);
    if (!rc) rc = lg__store_end(s, 1, err);
    else lg__store_end(s, 0, NULL);
  }
  lg__store_unlock(s);
  return rc;
}

int lg_key_create(lg_store_t *s, const char *json, size_t len, int64_t now_ms, char **out,
                  lg_error_t *err) {
  *out = NULL;
  lg__key_row_t r = {.limit_micro = -1, .rate_per_min = -1};
  char secret[5 + SECRET_RANDOM], hash[65];
  int rc = parse_fields(json, len, 1, &r, err);
  if (!rc) rc = new_secret(secret, err);
  if (!rc) {
    lg__sha256_hex(secret, strlen(secret), hash);
    r.id = lg__strdup(hash);
    r.hash = lg__strdup(hash);
    r.created_ms = r.updated_ms = now_ms;
    if (!r.id || !r.hash) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  if (!rc) rc = seal_byok(s, &r, err);
  /* The budget first: a key never exists without the scope it reserves on. */
  if (!rc) rc = sync_budget(s, &r, now_ms, err);
  if (!rc) rc = write_key(s, &r, 1, err);
  if (!rc) rc = answer(s, &r, secret, 0, now_ms, out, err);
  OPENSSL_cleanse(secret, sizeof secret);
  lg__key_row_clear(&r);
  return where(s, rc, err);
}

int lg_key_update(lg_store_t *s, const char *ref, const char *json, size_t len, int64_t now_ms,
                  char **out, lg_error_t *err) {
  *out = NULL;
  lg__key_row_t r = {0};
  int rc = read_key(s, ref, &r, err);
  if (!rc) rc = parse_fields(json, len, 0, &r, err);
  if (!rc) rc = seal_byok(s, &r, err);
  if (!rc) {
    r.updated_ms = now_ms;
    rc = sync_budget(s, &r, now_ms, err);
  }
  if (!rc) rc = write_key(s, &r, 0, err);
  if (!rc) rc = answer(s, &r, NULL, 0, now_ms, out, err);
  lg__key_row_clear(&r);
  return where(s, rc, err);
}

int lg_key_rotate(lg_store_t *s, const char *ref, int64_t now_ms, char **out, lg_error_t *err) {
  *out = NULL;
  lg__key_row_t r = {0};
  char secret[5 + SECRET_RANDOM], hash[65];
  int rc = read_key(s, ref, &r, err);
  if (!rc) rc = new_secret(secret, err);
  if (!rc) {
    lg__sha256_hex(secret, strlen(secret), hash);
    lg__free(r.hash);
    if (!(r.hash = lg__strdup(hash))) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    r.rotated_ms = r.updated_ms = now_ms;
  }
  if (!rc) rc = write_key(s, &r, 0, err);
  if (!rc) rc = answer(s, &r, secret, 0, now_ms, out, err);
  OPENSSL_cleanse(secret, sizeof secret);
  lg__key_row_clear(&r);
  return where(s, rc, err);
}

int lg_key_show(lg_store_t *s, const char *ref, int64_t now_ms, char **out, lg_error_t *err) {
  *out = NULL;
  lg__key_row_t r = {0};
  int rc = read_key(s, ref, &r, err);
  if (!rc) rc = answer(s, &r, NULL, 1, now_ms, out, err);
  lg__key_row_clear(&r);
  return where(s, rc, err);
}

typedef struct list_ctx {
  lg_store_t *s;
  int64_t now_ms;
  lg__buf_t b;
  int n;
  lg_error_t *err;
} list_ctx_t;

static int list_one(void *ud, const lg__key_row_t *r) {
  list_ctx_t *x = ud;
  lg_budget_t bud;
  int rc = key_budget(x->s, r, x->now_ms, &bud, x->err);
  if (rc) return rc;
  if (x->n++) lg__buf_putc(&x->b, ',');
  key_json(&x->b, r, &bud, NULL);
  return 0;
}

int lg_key_list(lg_store_t *s, int64_t now_ms, char **out, lg_error_t *err) {
  *out = NULL;
  list_ctx_t x = {s, now_ms, {0}, 0, err};
  lg__buf_puts(&x.b, "{\"keys\":[");
  int rd = lg__store_read_begin(s);
  int rc = lg__sql_key_list(s, list_one, &x, err);
  lg__store_read_end(s, rd);
  lg__buf_puts(&x.b, "]}");
  if (!rc && !(*out = lg__buf_steal(&x.b, NULL)))
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  lg__buf_free(&x.b);
  return where(s, rc, err);
}

/* ---- the gate's checks (src/gateway/keys.c) ---- */

int lg__key_auth(lg_store_t *s, const char *secret, size_t n, lg__key_row_t *row,
                 lg_error_t *err) {
  memset(row, 0, sizeof *row);
  if (n < 4 || memcmp(secret, LG_KEY_PREFIX, 4))
    return lg__err(err, LG_EPERM, "key", -1, "not a loopguard key (lgk-...)");
  char hash[65];
  lg__sha256_hex(secret, n, hash);
  int found = 0;
  int rd = lg__store_read_begin(s);
  int rc = lg__sql_key_read(s, hash, row, &found, err);
  lg__store_read_end(s, rd);
  if (rc) return where(s, rc, err);
  /* By its hash only: an old secret's hash is its key's id. */
  int match = found && row->hash && strlen(row->hash) == 64 && !CRYPTO_memcmp(row->hash, hash, 64);
  if (!match || row->disabled) {
    int disabled = match && row->disabled;
    lg__key_row_clear(row);
    return lg__err(err, LG_EPERM, "key", -1,
                   disabled ? "this loopguard key is disabled"
                            : "unknown loopguard key (rotated, or never issued)");
  }
  return 0;
}

int lg_key_self(lg_store_t *s, const char *secret, int64_t now_ms, char **out, lg_error_t *err) {
  *out = NULL;
  lg__key_row_t r;
  int rc = lg__key_auth(s, secret, secret ? strlen(secret) : 0, &r, err);
  if (!rc) rc = answer(s, &r, NULL, 1, now_ms, out, err);
  lg__key_row_clear(&r);
  return rc;
}

int lg__key_rate(lg_store_t *s, const lg__key_row_t *r, int64_t now_ms, int64_t *retry_after_s,
                 lg_error_t *err) {
  *retry_after_s = 0;
  if (r->rate_per_min < 0) return 0;
  int allowed = 0;
  int64_t start = now_ms;
  lg__store_lock(s);
  int rc = lg__sql_key_rate(s, r->id, r->rate_per_min, now_ms, &allowed, &start, err);
  lg__store_unlock(s);
  if (rc) return where(s, rc, err);
  if (allowed) return 0;
  int64_t wait = start + 60000 - now_ms;
  *retry_after_s = wait <= 1000 ? 1 : (wait + 999) / 1000;
  return LG_BUDGET_REFUSED;
}

void lg__key_scope(const lg__key_row_t *r, char out[LG_BUDGET_SCOPE_MAX + 1]) { scope_of(r->id, out); }

int lg__key_byok(lg_store_t *s, const lg__key_row_t *r, const char *upstream, char **pk,
                 lg_error_t *err) {
  *pk = NULL;
  json_t *o = r->byok ? json_loads(r->byok, 0, NULL) : NULL;
  const char *v = json_string_value(json_object_get(o, upstream));
  int rc = 0;
  if (v && !lg__byok_is_sealed(v)) {
    if (!(*pk = lg__strdup(v))) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (v && !s->has_key_secret) {
    rc = lg__err(err, LG_EPERM, "byok", -1,
                 "the provider key of loopguard key \"%.200s\" (%.12s...) for upstream \"%.100s\" "
                 "is encrypted, and this server has no secret to open it (--secret-file, or "
                 "LOOPGUARD_SECRET_FILE: the file the replica that wrote it was given)",
                 r->name ? r->name : "", r->id, upstream);
  } else if (v) {
    rc = lg__byok_open(s->key_secret, r->id, upstream, v, pk, err);
    if (rc == LG_EPERM)
      lg__err(err, LG_EPERM, "byok", -1,
              "the provider key of loopguard key \"%.200s\" (%.12s...) for upstream \"%.100s\" "
              "does not open with this server's secret (--secret-file): another secret than the "
              "one it was written with, or the row was altered",
              r->name ? r->name : "", r->id, upstream);
  }
  json_decref(o);
  return rc;
}
