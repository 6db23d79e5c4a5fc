/*
 * budget.h — what the files of the budget module share: the rules of
 * budgets (budget.c) are used by the spend gate for model calls (gate.c).
 * Prices (prices.c) stand alone.
 */
#ifndef LG_BUDGET_H
#define LG_BUDGET_H

#include "../util/internal.h"

/* The scopes of a run as stored (run_scopes table): a new NULL-terminated
 * array of new strings in *scopes (lg__budget_strv_free), *n of them; 0
 * and NULL when the run has none. */
int lg__budget_run_scopes(lg_store_t *s, const char *run_id, char ***scopes, size_t *n,
                          lg_error_t *err);
void lg__budget_strv_free(char **v);
/* Adds `extra` (those not in it yet) to a vector of lg__budget_run_scopes
 * (replaced by a new one); LG_EINVAL past LG_BUDGET_MAX_SCOPES. */
int lg__budget_scopes_add(char ***scopes, size_t *n, const char *const *extra, size_t nextra,
                          lg_error_t *err);

/* lg_budget_reserve with the whole refusal, for the gate; `id` names the
 * reservation made (NULL: a random one). */
int lg__budget_reserve(lg_store_t *s, const lg_budget_request_t *req, int64_t now_ms,
                       lg_budget_reservation_t *out, lg_budget_refusal_t *refusal,
                       lg_error_t *err);

/* The reservation of a run's model call (run_seq 0: its oldest open one):
 * *found, and its id and model (model new, may be NULL) and amount. */
int lg__budget_run_reservation(lg_store_t *s, const char *run_id, int64_t run_seq, int *found,
                               char id[LG_BUDGET_ID_MAX], int64_t *run_seq_out,
                               int64_t *amount_micro, char **model, lg_error_t *err);
/* A savepoint (or transaction) of its own, durable at commit, with the
 * handle locked: for the gate, whose engine decision decides whether the
 * reservation made inside it stays. end commits or rolls back, unlocks. */
int lg__budget_sp_begin(lg_store_t *s, lg_error_t *err);
int lg__budget_sp_end(lg_store_t *s, int commit, lg_error_t *err);

/* Sets the run_seq of a reservation (the engine numbered the call). */
int lg__budget_set_run_seq(lg_store_t *s, const char *id, int64_t run_seq, lg_error_t *err);

/* gate.c: the two halves of a model call's spend gate around the engine's
 * decision, for the decision step (src/step/) and lg_budget_model. */
typedef struct lg__gate {
  char **scopes;                /* the run's scopes, then the call's own (new) */
  size_t n;
  size_t nrun;                  /* how many of them are the run's */
  int sp_open;                  /* a savepoint holds the reservation */
  int64_t run_seq;              /* the engine reservation expected */
  lg_budget_reservation_t resv; /* the shared reservation made */
} lg__gate_t;
/* Before the engine: the worst case into m->cost_nusd (out->worst_nusd),
 * then, when the run has scopes (its own, and `extra`: this call's own,
 * a gateway key's), the shared reservation in a savepoint.
 * LG_BUDGET_REFUSED with out->refused and out->refusal (nothing held);
 * other errors as lg_budget_model. lg__gate_clear(g) always after. */
int lg__gate_model_begin(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                         lg_model_call_t *m, const char *const *extra, size_t nextra,
                         int64_t ttl_ms, int64_t now_ms, lg__gate_t *g, lg_budget_gate_t *out,
                         lg_error_t *err);
/* Whether a refusal of lg__gate_model_begin stops the run (a budget
 * event): a limit of one of the run's own scopes. An in-flight cap that
 * is full now, or a limit of `extra` alone (a gateway key's, which the run
 * does not keep), changes nothing: the call is refused as an error. */
int lg__gate_refusal_stops(const lg__gate_t *g, const lg_budget_refusal_t *r);
/* After the engine decided (rc its return): keeps the reservation when
 * the call was let through, else undoes it. Returns rc or a store error. */
int lg__gate_model_end(lg_store_t *s, lg__gate_t *g, int rc, const lg_decision_t *d,
                       lg_budget_gate_t *out, lg_error_t *err);
void lg__gate_clear(lg__gate_t *g);
/* The output a call to `model` that gives no max_tokens is priced at
 * (lg_prices_worst_case): the model's max_output_tokens, else the file's
 * default_max_tokens; -1 when neither, or the model has no price. */
int64_t lg__prices_output_bound(const lg_prices_t *p, const char *model);
/* A model call's actual cost into *actual: cost_nusd (what its upstream
 * reported) when >= 0, else its tokens at `model`'s price, else held_nusd
 * (the worst case held for it); settled on shared reservation `id` unless
 * NULL: whole when the tokens are `measured` (the provider's count), at
 * most the reservation when they or the cost are a settler's word. */
int lg__budget_settle_usage(lg_store_t *s, const lg_prices_t *prices, const char *id,
                            const char *model, int64_t input_tokens, int64_t output_tokens,
                            int64_t cost_nusd, int measured, int64_t held_nusd, int64_t now_ms,
                            int64_t *actual_nusd, lg_error_t *err);
/* The shared half of a usage: finds the run's open reservation
 * (`reservation`, 0 the oldest) into *seq, the actual cost into *actual
 * (cost_nusd; else the tokens at the model's price; else the worst case
 * held) and settles the shared budgets with it; `measured`: the tokens are
 * the provider's count (settled whole), else an agent's word (settled at
 * most the reservation, as a reported cost is). The engine's settlement
 * (lg_run_usage) is the caller's. */
int lg__gate_usage(lg_store_t *s, const lg_prices_t *prices, const lg_run_t *run,
                   int64_t reservation, int64_t input_tokens, int64_t output_tokens,
                   int64_t cost_nusd, int measured, int64_t now_ms, int64_t *seq,
                   int64_t *actual_nusd, lg_error_t *err);

/* JSON shapes of the server's answers (http-api-v1), kept beside the
 * rules they report; not public API. Each returns a new string (lg__free)
 * or NULL on out-of-memory. */
/* A refusal's "metadata" object: limit_source, scope, remaining_usd,
 * requested_usd, resets_at (RFC 3339 UTC, null for period none), and
 * retry_after_s when rate_limited. Appended to b / as a new string. */
void lg__budget_refusal_metadata(lg__buf_t *b, const lg_budget_refusal_t *r);
char *lg__budget_refusal_metadata_json(const lg_budget_refusal_t *r);
/* The 201 answer of POST /v1/budgets/reserve: {reservation_id,
 * expires_at, amount_usd}. */
char *lg__budget_reservation_json(const lg_budget_reservation_t *r);
/* The 200 answer of POST /v1/budgets/settle: {reservation_id,
 * reserved_usd, actual_usd, late, capped, asked_usd (when capped), scopes:
 * [lg_budget_to_json objects]}. */
char *lg__budget_settlement_json(const lg_budget_settlement_t *st);

/* keys.c: the gate's checks of a loopguard key. key_auth: the key whose
 * current secret is [secret, +n) into *row (lg__key_row_clear), else
 * LG_EPERM with a message for a 401 (unknown, rotated or disabled); read
 * from the store each time. key_rate: counts one request against the
 * key's rate limit: 0, or LG_BUDGET_REFUSED with *retry_after_s (>= 1).
 * key_scope: the key's budget scope, key:ID. */
struct lg__key_row;
int lg__key_auth(lg_store_t *s, const char *secret, size_t n, struct lg__key_row *row,
                 lg_error_t *err);
int lg__key_rate(lg_store_t *s, const struct lg__key_row *r, int64_t now_ms,
                 int64_t *retry_after_s, lg_error_t *err);
void lg__key_scope(const struct lg__key_row *r, char out[LG_BUDGET_SCOPE_MAX + 1]);
/* key_byok: the key's own provider key for `upstream`, opened with the
 * store's secret, in a new string *pk (NULL: none for that upstream);
 * LG_EPERM naming the key when it is sealed and does not open (no secret,
 * or another one). */
int lg__key_byok(lg_store_t *s, const struct lg__key_row *r, const char *upstream, char **pk,
                 lg_error_t *err);

/* seal.c: a provider key at rest (AES-256-GCM). seal: "lgenc:v1:..." of
 * plain, bound to the key's id and the upstream's name; open: the plain
 * text again, LG_EPERM when the secret, the id, the upstream or a byte
 * differs. key: the AES key (the store's key_secret). */
#define LG__BYOK_SEALED "lgenc:v1:"
int lg__byok_is_sealed(const char *v);
int lg__byok_seal(const unsigned char key[32], const char *key_id, const char *upstream,
                  const char *plain, char **out, lg_error_t *err);
int lg__byok_open(const unsigned char key[32], const char *key_id, const char *upstream,
                  const char *sealed, char **out, lg_error_t *err);

#endif
