/*
 * keys.c — loopguard keys at the gateway's gate (gateway-v1, "Keys").
 *
 * A request with "Authorization: Bearer lgk-..." (or "x-api-key: lgk-...",
 * as Anthropic clients send it, "api-key: lgk-..." as Azure OpenAI's do) is
 * authenticated by its
 * key in the store, every time (no cache: a key disabled or rotated on
 * another replica is refused at once), its rate limit counted in the
 * key's row (lg__gw_keys_auth); the key itself never goes upstream. Before
 * a model request (lg__gw_keys_model) the key's models are checked, its
 * own provider key chosen for the upstream, and the request's own budget
 * scopes set to the key's: key:ID, and workspace:NAME when the workspace
 * has a budget (the model event reserves on them beside the run's own
 * scopes; the run's stored scopes are left alone, so that two keys on one
 * run, even on two replicas at once, are each charged their own). The reservation of the worst case against those scopes and the
 * run's caps, all or nothing, and its settlement from the usage, are the
 * gateway's model and usage events through the decision step, as for any
 * run with scopes (src/budget/gate.c): nothing here reserves.
 *
 * What is done here is what makes a refusal useful: a request without
 * max_tokens gets the most its budgets afford, capped by the model's
 * limit in the price table (so that the upstream can never answer more
 * than was reserved), and one whose max_tokens does not fit is refused
 * before the step with the max_tokens that would (402 key_limit, 403
 * workspace_budget). The check reads the budgets without a lock; the
 * reservation that follows is what holds under concurrency.
 */
#include "gw.h"

#include "../budget/budget.h"
#include "../store/store.h"

#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <strings.h>

/* Bytes added to the client's body before the step prices it (the
 * usage request of a stream, restored calls are counted by the step
 * itself): the check must not let through what the step refuses. */
#define INPUT_SLACK 512

static void clear_scopes(lg__gw_job_t *j) {
  for (size_t i = 0; i < j->nkey_scopes; i++) lg__free(j->key_scopes[i]);
  j->nkey_scopes = 0;
}

void lg__gw_keys_clear(lg__gw_job_t *j) {
  clear_scopes(j);
  lg__free(j->pass_model);
  j->pass_model = NULL;
  if (!j->key) return;
  lg__key_row_clear(j->key);
  lg__free(j->key);
  j->key = NULL;
  lg__free(j->provider_key);
  j->provider_key = NULL;
}

static void put_meta(lg__gw_job_t *j, const char *meta) {
  if (!meta || j->route == LG__GW_ROUTE_ANTHROPIC || j->out.len < 2) return;
  j->out.len -= 2; /* before the closing "}}" */
  lg__buf_printf(&j->out, ",\"metadata\":%s}}", meta);
}

/* Every refusal by a budget the gateway answers (its check before the
 * step, the step's own): answered and counted here, once. */
void lg__gw_keys_refusal(lg__gw_ctx_t *cx, lg__gw_job_t *j, const lg_budget_refusal_t *r,
                         const char *message) {
  lg__metrics_budget_refusal(&cx->srv->metrics, r->limit_source);
  int status = lg__http_refusal_status(r);
  char *meta = lg__budget_refusal_metadata_json(r);
  lg__gw_error(j, status, status == 429 ? "rate_limit_error" : "insufficient_quota",
               r->limit_source, "loopguard: %s", message && *message ? message : r->message);
  put_meta(j, meta);
  if (status == 429) j->retry_after = r->retry_after_s > 0 ? (int)r->retry_after_s : 1;
  lg__free(meta);
}

static void unauthorized(lg__gw_job_t *j, const char *why) {
  lg__gw_error(j, 401, "invalid_request_error", "invalid_api_key", "loopguard: %s", why);
}

/* The secret of "Bearer lgk-...", or NULL. */
static const char *bearer_key(const char *auth) {
  if (!auth || strncasecmp(auth, "Bearer ", 7)) return NULL;
  const char *t = auth + 7;
  while (*t == ' ') t++;
  return strncmp(t, LG_KEY_PREFIX, 4) ? NULL : t;
}

/* Sends the request upstream with the key's own provider key for
 * upstream `up`, when it has one (opened with the store's secret when it
 * is sealed). 1 with the error answered (500 naming the key) when it
 * cannot be had: never a sealed value sent upstream. */
static int use_byok(lg__gw_ctx_t *cx, size_t ui) {
  lg__gw_job_t *j = cx->j;
  const lg__gw_upstream_t *up = &lg__gw_cfg(cx->gw)->up[ui];
  j->key_byok = 0;
  j->byok_for = ui + 1;
  if (j->provider_key) OPENSSL_cleanse(j->provider_key, strlen(j->provider_key));
  lg__free(j->provider_key);
  j->provider_key = NULL;
  if (!j->key->byok) return 0;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  int rc = s ? lg__key_byok(s, j->key, up->name, &j->provider_key, &e) : LG_ESTORE;
  if (rc) {
    lg__gw_failed(j, "byok_unavailable", NULL, &e, rc);
    return 1;
  }
  j->key_byok = j->provider_key != NULL;
  return 0;
}

static int check_key(lg__gw_ctx_t *cx);
static int check_key_secret(lg__gw_ctx_t *cx, const char *xkey);
static int pass_unpriced(lg__gw_ctx_t *cx);
static int pass_embeddings(lg__gw_ctx_t *cx);

int lg__gw_keys_auth(lg__gw_ctx_t *cx) {
  int rc = check_key(cx);
  if (rc) lg__gw_answer(cx->j);
  return rc;
}

/* Takes "x-api-key: lgk-..." (or Azure's "api-key: lgk-...":
 * lg__auth_key_header) out of the headers forwarded upstream (new string:
 * the secret), or NULL when there is none. */
static char *take_key_header(lg__gw_job_t *j) {
  char *secret = NULL;
  struct curl_slist *keep = NULL, *t;
  for (struct curl_slist *h = j->fwd; h; h = h->next) {
    size_t n = lg__auth_key_header(h->data);
    if (n) {
      const char *v = h->data + n + 1; /* after "Name:" */
      while (*v == ' ') v++;
      if (!strncmp(v, LG_KEY_PREFIX, 4)) {
        lg__free(secret);
        secret = lg__strdup(v);
        continue;
      }
    }
    if ((t = curl_slist_append(keep, h->data))) keep = t;
  }
  curl_slist_free_all(j->fwd);
  j->fwd = keep;
  return secret;
}

static int check_key(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  char *xkey = take_key_header(j);
  int rc = check_key_secret(cx, xkey);
  if (xkey) OPENSSL_cleanse(xkey, strlen(xkey));
  lg__free(xkey);
  return rc;
}

static int check_key_secret(lg__gw_ctx_t *cx, const char *xkey) {
  lg__gw_job_t *j = cx->j;
  const char *secret = xkey ? xkey : bearer_key(j->auth);
  /* No loopguard key: with tokens the router already answered 401
   * (gateway-v1: every gateway request needs a key), unless it found one
   * in a header this file does not read (said again here: a request must
   * not go on unkeyed); with none (loopback), the client's own provider
   * key goes upstream. */
  if (!secret && cx->srv->auth.n) {
    unauthorized(j, "this gateway needs a loopguard key, and none was found in the request");
    return 1;
  }
  if (!secret) return 0;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  lg__key_row_t *row = lg__calloc(1, sizeof *row);
  size_t n = strlen(secret);
  while (n && (secret[n - 1] == ' ' || secret[n - 1] == '\t')) n--;
  int rc = !row ? LG_ENOMEM : s ? lg__key_auth(s, secret, n, row, &e) : (e.code ? e.code : LG_ESTORE);
  if (rc == LG_EPERM) {
    lg__free(row);
    unauthorized(j, e.message);
    return 1;
  }
  int64_t retry = 0;
  if (!rc) rc = lg__key_rate(s, row, lg__server_now(cx->srv), &retry, &e);
  if (rc == LG_BUDGET_REFUSED) {
    lg__gw_error(j, 429, "rate_limit_error", "rate_limited",
                 "loopguard: this key's rate limit of %lld requests a minute is reached; retry "
                 "in %lld s",
                 (long long)row->rate_per_min, (long long)retry);
    lg__key_row_clear(row);
    lg__free(row);
    char meta[96];
    snprintf(meta, sizeof meta, "{\"limit_source\":\"rate_limit\",\"retry_after_s\":%lld}",
             (long long)retry);
    put_meta(j, meta);
    j->retry_after = (int)retry;
    return 1;
  }
  if (rc) {
    if (row) lg__key_row_clear(row);
    lg__free(row);
    lg__gw_failed(j, NULL, "check the key", &e, rc);
    return 1;
  }
  j->key = row;
  lg__free(j->auth); /* never sent upstream */
  j->auth = NULL;
  if (j->kind == LG__GW_PASS && use_byok(cx, lg__gw_pass_upstream(cx->gw, j)))
    return 1;
  if (j->kind != LG__GW_PASS || j->pass_free) return 0;
  int priced = pass_embeddings(cx);
  return priced < 0 ? pass_unpriced(cx) : priced;
}

int64_t lg__gw_keys_ttl(lg__gw_ctx_t *cx, size_t ui) {
  int64_t t = cx->srv->o.reservation_ttl_ms;
  if (t <= 0) t = lg__gw_cfg(cx->gw)->up[ui].timeout_ms + 60000;
  return t > LG_BUDGET_MAX_TTL_MS ? LG_BUDGET_MAX_TTL_MS : t;
}

int64_t lg__gw_keys_usage_cost(json_t *usage) {
  json_t *c = json_object_get(usage, "cost");
  if (!json_is_number(c)) return -1;
  double v = json_number_value(c);
  if (!(v >= 0) || v > LG_BUDGET_MAX_USD) return -1;
  return (int64_t)ceil(v * 1e9);
}

/* ---- before a model request ---- */

static int model_allowed(const lg__key_row_t *k, const char *model) {
  if (!k->models) return 1;
  json_t *a = json_loads(k->models, 0, NULL);
  size_t i;
  json_t *m;
  int ok = 0;
  json_array_foreach(a, i, m) if (model && !strcmp(json_string_value(m), model)) ok = 1;
  json_decref(a);
  return ok;
}

const char *const lg__gw_bounds[LG__GW_NBOUNDS] = {"max_completion_tokens", "max_tokens",
                                                  "max_output_tokens"};

json_t *lg__gw_output_bound(json_t *root, const char **name) {
  for (size_t i = 0; i < LG__GW_NBOUNDS; i++) {
    json_t *x = json_object_get(root, lg__gw_bounds[i]);
    if (x) {
      if (name) *name = lg__gw_bounds[i];
      return x;
    }
  }
  return NULL;
}

/* The field that bounds the output on this route, and its value (-1):
 * the request's, else the one to add (max_completion_tokens for an
 * upstream that refused max_tokens, lg__gw_learn). */
static const char *max_field(lg__gw_ctx_t *cx, size_t ui, const char *model, const lg__gw_job_t *j,
                             json_t *root, int64_t *v) {
  const char *name;
  json_t *x = lg__gw_output_bound(root, &name);
  *v = json_is_integer(x) ? json_integer_value(x) : -1;
  if (x) return name;
  if (j->kind == LG__GW_RESPONSES) return "max_output_tokens";
  return lg__gw_learnt(cx, ui, LG__GW_LEARNT_MAX_COMPLETION_TOKENS, model) ? "max_completion_tokens" : "max_tokens";
}

/* The largest t in [0, hi] whose worst case fits in `room` nano-USD, or
 * -1 when not even 0 does. */
static int64_t affordable(const lg_prices_t *p, const char *model, int64_t input, int64_t hi,
                          int64_t room) {
  int64_t w = 0;
  if (lg_prices_worst_case(p, model, input, 0, &w, NULL) || w > room) return -1;
  int64_t lo = 0;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2;
    if (!lg_prices_worst_case(p, model, input, mid, &w, NULL) && w <= room) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

int64_t lg__gw_choices(const lg__gw_job_t *j, json_t *root) {
  json_t *n = j->kind == LG__GW_CHAT ? json_object_get(root, "n") : NULL;
  return json_is_integer(n) && json_integer_value(n) > 1 ? json_integer_value(n) : 1;
}

/* The model's own output cap: the price table's max_output_tokens, else
 * what the table bounds an output by (its default_max_tokens); -1 none. */
int64_t lg__gw_output_cap(const lg_prices_t *p, const char *model, int64_t input) {
  lg_price_t pr;
  if (lg_prices_lookup(p, model, &pr, NULL)) return -1;
  if (pr.max_output_tokens >= 0) return pr.max_output_tokens;
  int64_t w = 0;
  if (lg_prices_worst_case(p, model, input, -1, &w, NULL)) return -1;
  return affordable(p, model, input, 1 << 24, w);
}

typedef struct scope_set {
  const char *v[2];
  char key[LG_BUDGET_SCOPE_MAX + 1], ws[LG_BUDGET_SCOPE_MAX + 1];
  lg_budget_t b[2];
  size_t n;
} scope_set_t;

/* The key's scopes that have a budget, read as of now. */
static int key_scopes(lg_store_t *s, const lg__gw_job_t *j, int64_t now, scope_set_t *ss,
                      lg_error_t *e) {
  memset(ss, 0, sizeof *ss);
  int rc = 0;
  if (!j->key_byok || j->key->include_byok) {
    lg__key_scope(j->key, ss->key);
    rc = lg_budget_get(s, ss->key, now, &ss->b[ss->n], e);
    if (!rc) ss->v[ss->n++] = ss->key;
    else if (rc == LG_ENOTFOUND) rc = 0;
  }
  if (!rc && j->key->workspace) {
    snprintf(ss->ws, sizeof ss->ws, "workspace:%s", j->key->workspace);
    rc = lg_budget_get(s, ss->ws, now, &ss->b[ss->n], e);
    if (!rc) ss->v[ss->n++] = ss->ws;
    else if (rc == LG_ENOTFOUND) rc = 0; /* a workspace without a budget */
  }
  return rc;
}

/* A request passed through that a provider may bill (j->pass_free 0:
 * embeddings, images, a batch, ...), with a key whose spend is bounded
 * on that bill (its limit, unless its own provider key pays and is not
 * counted; its workspace's budget): refused, since the gateway prices
 * only the model APIs it guards, and a key's limit holds whatever the
 * agent calls. 1 when answered. */
static int pass_unpriced(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  scope_set_t ss;
  int rc = s ? key_scopes(s, j, lg__server_now(cx->srv), &ss, &e) : LG_ESTORE;
  if (rc) {
    lg__gw_failed(j, NULL, "read the key's budgets", &e, rc);
    return 1;
  }
  /* the key's scope is kept for its usage even without a limit */
  int own = ss.n && ss.v[0] == ss.key && j->key->limit_micro >= 0;
  if (!own && !(ss.n && ss.v[ss.n - 1] == ss.ws)) return 0;
  lg__gw_error(j, 403, "permission_error", "passthrough_not_priced",
               "loopguard: %s %s%s may be billed by the provider, and the gateway prices only the "
               "model APIs it guards (chat completions, responses, messages) and /v1/embeddings of "
               "a model its price table names: a key whose spend is bounded (%s) may not make it; "
               "use a key without a limit for it",
               j->method, lg__gw_api_prefix(j), j->path,
               own ? "its limit" : "its workspace's budget");
  put_meta(j, own ? "{\"limit_source\":\"key_limit\"}" : "{\"limit_source\":\"workspace_budget\"}");
  return 1;
}

/* The most tokens an embeddings request's `input` can be: a token is a
 * byte of text at least (a tokenizer's pieces are bytes), a token id one,
 * and 2 more an input for a provider that marks its start and end. -1
 * when it is none of a string, token ids, or an array of either. */
static int64_t embed_tokens(const json_t *in) {
  if (json_is_string(in)) return (int64_t)json_string_length(in) + 2;
  if (!json_is_array(in) || !json_array_size(in)) return -1;
  int64_t n = 0;
  size_t i;
  const json_t *x;
  if (json_is_integer(json_array_get(in, 0))) { /* one input's token ids */
    json_array_foreach(in, i, x) if (!json_is_integer(x)) return -1;
    return (int64_t)json_array_size(in) + 2;
  }
  json_array_foreach(in, i, x) {
    int one = json_is_string(x) || (json_is_array(x) && json_is_integer(json_array_get(x, 0)));
    int64_t t = one ? embed_tokens(x) : -1; /* an input: text, or token ids */
    if (t < 0) return -1;
    n += t;
  }
  return n;
}

/* Whether the request is one for embeddings: POST /v1/embeddings, or on
 * an AzureOpenAI client's path /openai/deployments/NAME/embeddings (*dep
 * NAME, dep_len bytes: the model when the body names none) or the
 * resource's v1 API's /openai/v1/embeddings. */
static int embeddings_path(const lg__gw_job_t *j, const char **dep, size_t *dep_len) {
  const char *p = j->path, *name, *slash;
  *dep = NULL;
  if (strcmp(j->method, "POST")) return 0;
  if (!j->azure) return !strcmp(p, "/embeddings");
  if (!strcmp(p, "/v1/embeddings")) return 1;
  if (strncmp(p, "/deployments/", 13) || !(slash = strchr(name = p + 13, '/')) || slash == name ||
      strcmp(slash, "/embeddings"))
    return 0;
  *dep = name;
  *dep_len = (size_t)(slash - name);
  return 1;
}

/* A passed-through request for embeddings (embeddings_path) whose model
 * the price table prices: with a key whose scopes have budgets, its worst
 * case (input only: embed_tokens) is reserved on them, all or none, as a
 * model call's is, and the request goes on; lg__gw_keys_pass_settle
 * charges what its answer's usage says. 0: passed on, 1: answered
 * (refused), -1: not such a request (pass_unpriced decides). */
static int pass_embeddings(lg__gw_ctx_t *cx) {
  lg__gw_job_t *j = cx->j;
  const char *dep;
  size_t dep_len = 0;
  if (!embeddings_path(j, &dep, &dep_len)) return -1;
  json_t *root = lg__json_load(j->body, j->body_len, NULL, NULL);
  const char *model = json_string_value(json_object_get(root, "model"));
  j->pass_model = model ? lg__strdup(model) : dep ? lg__strndup(dep, dep_len) : NULL;
  int64_t tokens = embed_tokens(json_object_get(root, "input")), nusd = 0;
  json_decref(root);
  lg_prices_t *p = lg_price_book_get(cx->srv->prices);
  int priced = j->pass_model && tokens >= 0 && !lg_prices_worst_case(p, j->pass_model, tokens, 0, &nusd, NULL);
  lg_prices_free(p);
  if (!j->pass_model && (model || dep)) priced = -1;
  if (priced <= 0) {
    if (!priced) return -1;
    lg__gw_error(j, 500, "server_error", NULL, "loopguard: out of memory");
    return 1;
  }
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  int64_t now = lg__server_now(cx->srv);
  scope_set_t ss;
  int rc = s ? key_scopes(s, j, now, &ss, &e) : LG_ESTORE;
  lg_budget_reservation_t res;
  lg_budget_refusal_t why;
  if (!rc && ss.n) {
    lg_budget_request_t req = {.scopes = ss.v,
                               .nscopes = ss.n,
                               .amount_micro = lg_budget_nusd_to_micro(nusd),
                               .ttl_ms = lg__gw_keys_ttl(cx, lg__gw_pass_upstream(cx->gw, j)),
                               .model = j->pass_model};
    rc = lg_budget_reserve(s, &req, now, &res, &why, &e);
  }
  if (rc == LG_BUDGET_REFUSED) {
    lg__gw_keys_refusal(cx, j, &why, NULL);
    return 1;
  }
  if (rc) {
    lg__gw_failed(j, NULL, "reserve the request's cost", &e, rc);
    return 1;
  }
  if (ss.n) {
    memcpy(j->pass_rsv, res.id, sizeof j->pass_rsv);
    j->pass_worst_nusd = nusd;
  }
  return 0;
}

/* What an embeddings answer's usage says (its last "usage" object, in the
 * answer's last bytes: OpenAI's comes at the end): its input tokens (-1
 * when it gives none) and its cost (usage.cost, USD, as a chat answer's
 * may: -1 when none). */
static void embed_usage(const char *t, size_t n, int64_t *tokens, int64_t *cost_nusd) {
  const char *u = NULL;
  *tokens = *cost_nusd = -1;
  for (size_t i = 0; i + 7 <= n; i++)
    if (!memcmp(t + i, "\"usage\"", 7)) u = t + i;
  if (!u || !(u = memchr(u, '{', n - (size_t)(u - t)))) return;
  json_t *o = json_loadb(u, n - (size_t)(u - t), JSON_DISABLE_EOF_CHECK, NULL);
  json_t *v = json_object_get(o, "prompt_tokens");
  if (!json_is_integer(v)) v = json_object_get(o, "total_tokens");
  if (json_is_integer(v) && json_integer_value(v) >= 0) *tokens = json_integer_value(v);
  *cost_nusd = lg__gw_keys_usage_cost(o);
  json_decref(o);
}

void lg__gw_keys_pass_settle(lg__gw_ctx_t *cx, int sent, int status) {
  lg__gw_job_t *j = cx->j;
  if (!j->pass_rsv[0]) return;
  /* billed: an answer of 2xx, at its usage (its cost, else its tokens at
   * the model's price, else the worst case when it says neither), or one
   * that may have been made (no answer, or cut short after the request
   * went: the worst case); not billed: a refusal, or a request never sent */
  int billed = status / 100 == 2 || (sent && !status);
  int64_t tokens = -1, cost = billed ? -1 : 0, nusd = 0;
  if (status / 100 == 2 && j->pass_tail_len) embed_usage(j->pass_tail, j->pass_tail_len, &tokens, &cost);
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  lg_prices_t *p = lg_price_book_get(cx->srv->prices);
  int rc = s ? lg__budget_settle_usage(s, p, j->pass_rsv, j->pass_model, tokens, 0, cost, 1,
                                       j->pass_worst_nusd, lg__server_now(cx->srv), &nusd, &e)
             : LG_ESTORE;
  lg_prices_free(p);
  if (rc) { /* its reservation stops holding at its TTL: never charged */
    const char *m = lg__error_text(&e, rc);
    lg__buf_t f = {0};
    lg__buf_printf(&f, "\"reservation_id\":\"%s\",\"path\":", j->pass_rsv);
    lg__gw_json_path(&f, j);
    lg__buf_puts(&f, ",\"message\":");
    lg__buf_json_str_lossy(&f, m, strlen(m));
    if (!f.oom) lg__server_log(cx->srv, "warn", "settlement_failed", f.data);
    lg__buf_free(&f);
  }
  j->pass_rsv[0] = 0;
}

static void usd(char *buf, size_t n, int64_t micro) {
  snprintf(buf, n, "$%lld.%02lld", (long long)(micro / 1000000),
           (long long)(micro % 1000000 / 10000));
}

/* The refusal of a request whose worst case does not fit in budget b. */
static void refuse(lg__gw_ctx_t *cx, lg__gw_job_t *j, const lg_budget_t *b, int64_t worst_nusd,
                   int64_t fits) {
  lg_budget_refusal_t r;
  memset(&r, 0, sizeof r);
  r.kind = lg_budget_scope_kind(b->scope);
  r.type = "budget_exceeded";
  r.limit_source = r.kind == LG_SCOPE_WORKSPACE ? "workspace_budget"
                   : r.kind == LG_SCOPE_KEY     ? "key_limit"
                                                : "scope_budget";
  snprintf(r.scope, sizeof r.scope, "%s", b->scope);
  r.remaining_micro = lg_budget_remaining(b);
  r.requested_micro = lg_budget_nusd_to_micro(worst_nusd);
  r.limit_micro = b->limit_micro;
  r.resets_at_ms = b->resets_at_ms;
  char lim[48], rem[48], msg[400];
  usd(lim, sizeof lim, b->limit_micro);
  usd(rem, sizeof rem, r.remaining_micro);
  const char *per = b->period == LG_PERIOD_NONE ? "" : lg_budget_period_name(b->period);
  if (r.kind == LG_SCOPE_WORKSPACE)
    snprintf(msg, sizeof msg, "Workspace %s%sbudget of %s exceeded", per, *per ? " " : "", lim);
  else
    snprintf(msg, sizeof msg, "Key %s%slimit of %s exceeded (%s left)", per, *per ? " " : "",
             lim, rem);
  if (fits > 0) {
    size_t l = strlen(msg);
    snprintf(msg + l, sizeof msg - l, "; a max_tokens of %lld would fit", (long long)fits);
  }
  lg__gw_keys_refusal(cx, j, &r, msg);
  if (fits > 0 && j->kind != LG__GW_MESSAGES && j->out.len > 3) {
    j->out.len -= 3; /* inside metadata: before "}}}" */
    lg__buf_printf(&j->out, ",\"max_affordable_tokens\":%lld}}}", (long long)fits);
  }
}

const char *lg__gw_key_id(const lg__gw_job_t *j) { return j->key ? j->key->id : NULL; }

int lg__gw_keys_route(lg__gw_ctx_t *cx, const char *asked, const char *model, size_t ui) {
  lg__gw_job_t *j = cx->j;
  if (!j->key) return 0;
  if (!model_allowed(j->key, asked) && !model_allowed(j->key, model)) {
    lg__gw_error(j, 403, "permission_error", "model_not_allowed",
                 "loopguard: this key may not use model \"%s\"", asked ? asked : model ? model : "");
    return 1;
  }
  return j->byok_for == ui + 1 ? 0 : use_byok(cx, ui);
}

int lg__gw_keys_model(lg__gw_ctx_t *cx, json_t *root, const char *model,
                      size_t ui, size_t body_len, const char **added, int *replaced) {
  lg__gw_job_t *j = cx->j;
  *added = NULL;
  *replaced = 0;
  if (!j->key) return 0;
  j->byok_for = 0; /* this request's first model call: looked up again */
  if (lg__gw_keys_route(cx, json_string_value(json_object_get(root, "model")), model, ui)) return 1;
  lg_error_t e = {0};
  lg_store_t *s = lg__gw_store(cx, &e);
  int64_t now = lg__server_now(cx->srv);
  scope_set_t ss;
  int rc = s ? key_scopes(s, j, now, &ss, &e) : LG_ESTORE;
  /* The request's own scopes, not the run's: two keys on one run (on one
   * replica or two at once) are each charged their own. */
  clear_scopes(j);
  for (size_t i = 0; !rc && i < ss.n; i++)
    if (!(j->key_scopes[j->nkey_scopes++] = lg__strdup(ss.v[i]))) rc = LG_ENOMEM;
  if (rc) {
    lg__gw_failed(j, NULL, "set the key's budgets", &e, rc);
    return 1;
  }
  lg_prices_t *p = lg_price_book_get(cx->srv->prices);
  int64_t input = (int64_t)body_len + INPUT_SLACK, asked_max = -1;
  const char *field = max_field(cx, ui, model, j, root, &asked_max);
  int64_t cap = lg__gw_output_cap(p, model, input), n = lg__gw_choices(j, root);
  int64_t want = asked_max >= 0 ? asked_max : cap; /* an answer's; n of them */
  int done = 0;
  for (size_t i = 0; i < ss.n && want >= 0 && !done; i++) {
    int64_t room = lg_budget_micro_to_nusd(lg_budget_remaining(&ss.b[i])), worst = 0;
    if (lg_prices_worst_case(p, model, input, lg__gw_times(want, n), &worst, NULL) || worst <= room) continue;
    int64_t fits = affordable(p, model, input, lg__gw_times(want, n), room);
    if (fits > 0) fits /= n; /* an answer's share */
    if (asked_max < 0 && fits > 0) {
      want = fits; /* no max_tokens asked: the most that fits */
      continue;
    }
    refuse(cx, j, &ss.b[i], worst, fits);
    done = 1;
  }
  /* The bound the reservation priced goes upstream, so that the answer
   * cannot be longer than what was reserved. */
  int had = json_object_get(root, field) != NULL; /* the client's null */
  if (!done && asked_max < 0 && want >= 0 && !json_object_set_new(root, field, json_integer(want))) {
    *added = field;
    *replaced = had;
  }
  lg_prices_free(p);
  return done;
}
