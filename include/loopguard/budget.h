/*
 * loopguard/budget.h — the spend gate (docs/budget.md): prices, the worst
 * case of a model call, and shared budgets kept in a store. Built on
 * loopguard/store.h.
 */
#ifndef LOOPGUARD_BUDGET_H
#define LOOPGUARD_BUDGET_H

#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------
 * The spend gate (docs/budget.md): prices, the worst case of a model call,
 * and shared budgets for any scope ("key:...", "workspace:...", "team:...",
 * "customer:...", any name) kept in a store (memory:, sqlite:, postgres:).
 *
 * Amounts. Budgets and the store count integer micro-dollars (1e-6 USD,
 * "micro"); the engine counts nano-dollars (lg_model_call_t.cost_nusd,
 * "nusd"). The conversions below are the only ones: USD (a double from
 * JSON or a command line) is rounded to the nearest micro-dollar (a half
 * up, on the decimal as written: 0.0000005 is 1), and
 * nano-dollars are rounded UP to micro-dollars, so that a hold never
 * covers less than the engine decided on and spent never counts less
 * than was charged.
 *
 * Time is always an argument (now_ms, epoch milliseconds): nothing here
 * reads a clock, so tests set the time they want.
 *
 * A budget: a limit in USD for a period — daily (from 00:00 UTC), weekly
 * (from Monday 00:00 UTC), monthly (from the 1st, 00:00 UTC) or none —
 * and optionally a cap on what may be held by calls in flight. Before a
 * paid call, a reservation holds its worst case against every scope that
 * covers it, all or none, in one transaction; afterwards the settlement
 * moves the real cost from reserved to spent. Whatever the concurrency,
 * spent + reserved never exceeds a limit, with two exceptions that are
 * real money already spent: a settlement above its reservation (the
 * provider charged more than the worst case), and a settlement that comes
 * after the reservation's TTL ran out. A reservation not settled within
 * its TTL stops holding at that instant (a crashed agent cannot pin a
 * budget). See docs/budget.md.
 *
 * Functions return 0 or a negative LG_E* code with err filled (the store
 * named in err->source); lg_budget_reserve() also returns
 * LG_BUDGET_REFUSED. Store errors are those of the stores (LG_EBUSY: try
 * again; LG_ESTORE). On any error or refusal nothing was written.
 * ------------------------------------------------------------------- */

/* ---- amounts ---- */
#define LG_BUDGET_NUSD_PER_MICRO 1000        /* nano-dollars in a micro-dollar */
#define LG_BUDGET_MAX_USD 1000000000.0       /* larger amounts are LG_ERANGE */
#define LG_BUDGET_MAX_MICRO 1000000000000000LL /* LG_BUDGET_MAX_USD in micro */

/* USD to micro-dollars, rounded to the nearest (a half up, as written).
 * LG_EINVAL for NaN,
 * infinity or a negative amount; LG_ERANGE above LG_BUDGET_MAX_USD.
 * `what` names the amount in err ("limit_usd"); may be NULL. */
LG_EXPORT int lg_budget_usd_to_micro(double usd, int64_t *micro, const char *what,
                                     lg_error_t *err);
/* Nano-dollars to micro-dollars, rounded up; negative gives 0. */
LG_EXPORT int64_t lg_budget_nusd_to_micro(int64_t nusd);
/* Micro-dollars to nano-dollars (saturates at INT64_MAX). */
LG_EXPORT int64_t lg_budget_micro_to_nusd(int64_t micro);

/* ---- prices ----
 * A price file (JSON; docs/budget.md):
 *   {"models": {"MODEL": {"input_usd_per_mtok": 2.5,
 *                         "output_usd_per_mtok": 10,
 *                         "cached_input_usd_per_mtok": 1.25,   (optional)
 *                         "max_output_tokens": 16384}, ...},    (optional)
 *    "default": {...the same fields...},                        (optional)
 *    "default_max_tokens": 4096}                                (optional)
 * Prices are USD per million tokens, kept exactly to 1e-6 USD per million
 * tokens. A model is looked up by its exact name; one not listed takes
 * "default" when there is one, else it has no price and a call to it is
 * refused (fail closed). Parsed price tables are immutable and reference
 * counted: share them between threads freely. */
typedef struct lg_prices lg_prices_t;

/* One model's price. Amounts are micro-dollars per million tokens (USD
 * per million tokens times 10^6), which is also pico-dollars per token. */
typedef struct lg_price {
  int64_t input_per_mtok;        /* input tokens */
  int64_t output_per_mtok;       /* output tokens */
  int64_t cached_input_per_mtok; /* cached input tokens (input's when absent) */
  int64_t max_output_tokens;     /* the model's own output cap, -1 unknown */
  int is_default;                /* 1: the model is not listed; "default" */
  int64_t attachment_tokens;     /* the most one attachment of a request (an image or a
                                    file, by URL, id or inline) is billed, in input
                                    tokens; -1 unknown (a gateway counts its bytes) */
} lg_price_t;

/* Parses a price file's JSON. Unknown fields and wrong types are LG_EINVAL
 * with err->field naming the path ("models.gpt-4o.input_usd_per_mtok");
 * malformed JSON is LG_EPARSE with the line. `source` names the input in
 * messages (may be NULL). Returns a new reference or NULL. */
LG_EXPORT lg_prices_t *lg_prices_parse(const char *json, size_t len, const char *source,
                                       lg_error_t *err);
/* Reads and parses a price file (LG_EIO when it cannot be read). */
LG_EXPORT lg_prices_t *lg_prices_load_file(const char *path, lg_error_t *err);
LG_EXPORT lg_prices_t *lg_prices_ref(lg_prices_t *p);
/* Drops a reference; frees with the last one. NULL: no-op. */
LG_EXPORT void lg_prices_free(lg_prices_t *p);
/* Models listed (the default not counted). */
LG_EXPORT size_t lg_prices_count(const lg_prices_t *p);
/* Where the table came from (the file name or "<input>"). Borrowed. */
LG_EXPORT const char *lg_prices_source(const lg_prices_t *p);
/* The price of `model` (NULL: the default). LG_ENOTFOUND, with a message
 * naming the model and the price file, when it has none. */
LG_EXPORT int lg_prices_lookup(const lg_prices_t *p, const char *model, lg_price_t *out,
                               lg_error_t *err);
/* The worst case of a model call, in nano-dollars, rounded up:
 * input_tokens at the input price plus max_tokens at the output price.
 * max_tokens < 0 (absent) takes the model's max_output_tokens, else the
 * file's default_max_tokens, else the call is LG_EINVAL (field
 * "max_tokens": its output has no bound). LG_ENOTFOUND (field "model")
 * when the model has no price; LG_EINVAL for negative tokens; LG_ERANGE
 * when the figure overflows. p may be NULL (no price file: every model is
 * LG_ENOTFOUND). */
LG_EXPORT int lg_prices_worst_case(const lg_prices_t *p, const char *model,
                                   int64_t input_tokens, int64_t max_tokens, int64_t *nusd,
                                   lg_error_t *err);
/* The cost of a finished call from its usage, in nano-dollars, rounded
 * up: cached_input_tokens (part of input_tokens, 0 when unknown) at the
 * cached price, the rest of the input at the input price, output at the
 * output price. Errors as lg_prices_worst_case. */
LG_EXPORT int lg_prices_cost(const lg_prices_t *p, const char *model, int64_t input_tokens,
                             int64_t cached_input_tokens, int64_t output_tokens,
                             int64_t *nusd, lg_error_t *err);

/* A price book: the current price table of a long-running process, that a
 * reload replaces atomically (SIGHUP in the server). Readers take a
 * reference (lg_price_book_get) and keep using that table for the whole
 * request, whatever reloads happen meanwhile. Thread-safe. */
typedef struct lg_price_book lg_price_book_t;
/* A book loaded from `path` (NULL: an empty book, no prices). NULL with
 * err filled when the file cannot be read or parsed. */
LG_EXPORT lg_price_book_t *lg_price_book_new(const char *path, lg_error_t *err);
/* Reads the book's file again. On success the new table replaces the old
 * one for every later lg_price_book_get(); on failure (err says why: file,
 * line, field) the old table stays in use. LG_ESTATE for a book with no
 * file. */
LG_EXPORT int lg_price_book_reload(lg_price_book_t *b, lg_error_t *err);
/* Replaces the table with `p` (a reference is taken; NULL empties it). */
LG_EXPORT void lg_price_book_set(lg_price_book_t *b, lg_prices_t *p);
/* The current table: a new reference (lg_prices_free), or NULL when the
 * book is empty. */
LG_EXPORT lg_prices_t *lg_price_book_get(lg_price_book_t *b);
/* Frees the book (tables still referenced elsewhere live on). NULL: no-op. */
LG_EXPORT void lg_price_book_free(lg_price_book_t *b);

/* ---- periods ---- */
typedef enum lg_budget_period {
  LG_PERIOD_NONE = 0, /* never resets */
  LG_PERIOD_DAILY,    /* from 00:00 UTC */
  LG_PERIOD_WEEKLY,   /* from Monday 00:00 UTC */
  LG_PERIOD_MONTHLY   /* from the 1st, 00:00 UTC */
} lg_budget_period_t;
/* Static name: "none", "daily", "weekly", "monthly". */
LG_EXPORT const char *lg_budget_period_name(lg_budget_period_t p);
/* Parses a period name; LG_EINVAL (naming the choices) otherwise. */
LG_EXPORT int lg_budget_period_parse(const char *name, lg_budget_period_t *out,
                                     lg_error_t *err);
/* The period that contains now_ms: [*start_ms, *end_ms). For
 * LG_PERIOD_NONE *start_ms is 0 and *end_ms -1 (never). Either pointer may
 * be NULL. LG_EINVAL for an unknown period. */
LG_EXPORT int lg_budget_period_bounds(lg_budget_period_t p, int64_t now_ms, int64_t *start_ms,
                                      int64_t *end_ms);

/* ---- scopes ---- */
#define LG_BUDGET_SCOPE_MAX 256   /* bytes of a scope name */
#define LG_BUDGET_MAX_SCOPES 16   /* scopes of one reservation */
#define LG_BUDGET_ID_MAX 40       /* a reservation id and its NUL */

/* A scope's kind, from its name: "key:..." and "workspace:..." are their
 * own; every other name ("team:...", "customer:...", "nightly") is
 * LG_SCOPE_OTHER. The kind names a refusal's limit_source (and the
 * server's answer to it: docs/budget.md). */
typedef enum lg_scope_kind {
  LG_SCOPE_OTHER = 0, /* limit_source "scope_budget" */
  LG_SCOPE_KEY,       /* limit_source "key_limit" */
  LG_SCOPE_WORKSPACE  /* limit_source "workspace_budget" */
} lg_scope_kind_t;
LG_EXPORT lg_scope_kind_t lg_budget_scope_kind(const char *scope);
/* 0 when `scope` is a valid scope name (1 to LG_BUDGET_SCOPE_MAX bytes of
 * UTF-8 without control characters), else LG_EINVAL saying why. */
LG_EXPORT int lg_budget_scope_check(const char *scope, lg_error_t *err);

/* ---- budgets ---- */

/* A budget as of the now_ms it was read with. */
typedef struct lg_budget {
  char scope[LG_BUDGET_SCOPE_MAX + 1];
  int64_t limit_micro;          /* the limit of each period */
  lg_budget_period_t period;
  int64_t max_in_flight_micro;  /* cap on reserved_micro, -1 none */
  int64_t spent_micro;          /* settled in the current period */
  int64_t reserved_micro;       /* held by open reservations (not expired) */
  int64_t open_reservations;    /* how many hold it */
  int64_t period_start_ms;      /* start of the current period; 0 for none */
  int64_t resets_at_ms;         /* when spent goes back to 0; -1 never */
  int64_t next_expiry_ms;       /* no later than when the first open
                                   reservation runs out (one settled early
                                   may have been it); -1 when none is open */
  int64_t created_ms;
  int64_t updated_ms;           /* last change of limit, period or spent */
} lg_budget_t;

/* limit - spent - reserved, or 0 when that is negative. */
LG_EXPORT int64_t lg_budget_remaining(const lg_budget_t *b);
/* The object of PUT/GET /v1/budgets/{scope}: scope, limit_usd, period,
 * spent_usd, reserved_usd, resets_at (RFC 3339 UTC, null for period
 * none), max_in_flight_usd (or null), remaining_usd, open_reservations.
 * New string (lg_free), NULL on out-of-memory. */
LG_EXPORT char *lg_budget_to_json(const lg_budget_t *b);

/* Creates the budget of `scope` or changes its limit, period and
 * max_in_flight (max_in_flight_micro < 0: none). What was spent in the
 * current period and the reservations in flight are kept; a new period
 * starts at the start of the period that contains now_ms. *out (may be
 * NULL) receives the budget as it is now. LG_EINVAL for a bad scope,
 * amount (> LG_BUDGET_MAX_MICRO or negative) or period. Durable on
 * return. */
LG_EXPORT int lg_budget_set(lg_store_t *s, const char *scope, int64_t limit_micro,
                            lg_budget_period_t period, int64_t max_in_flight_micro,
                            int64_t now_ms, lg_budget_t *out, lg_error_t *err);
/* Reads a budget as of now_ms (a period that ended reads as spent 0;
 * expired reservations are not counted). LG_ENOTFOUND when the scope has
 * no budget. Changes nothing. */
LG_EXPORT int lg_budget_get(lg_store_t *s, const char *scope, int64_t now_ms,
                            lg_budget_t *out, lg_error_t *err);
/* Called once per budget, by scope name in byte order; `b` is borrowed
 * for the call. A non-zero return stops the listing and is returned. */
typedef int (*lg_budget_cb)(void *ud, const lg_budget_t *b);
LG_EXPORT int lg_budget_list(lg_store_t *s, int64_t now_ms, lg_budget_cb cb, void *ud,
                             lg_error_t *err);
/* Zeroes what was spent in the current period; the limit, the period and
 * the reservations in flight stay. LG_ENOTFOUND when there is no budget. */
LG_EXPORT int lg_budget_reset(lg_store_t *s, const char *scope, int64_t now_ms,
                              lg_budget_t *out, lg_error_t *err);

/* ---- reservations ---- */
#define LG_BUDGET_DEFAULT_TTL_MS 600000LL   /* 10 minutes */
#define LG_BUDGET_MAX_TTL_MS 86400000LL     /* 24 hours */
#define LG_BUDGET_REFUSED 1                 /* lg_budget_reserve: refused */

/* Why a reservation was refused. The first scope that refuses is
 * reported, limits before in-flight caps. A refusal is either final for
 * this call (type "budget_exceeded": a limit, or an in-flight cap that
 * the call alone exceeds) or worth retrying after retry_after_s (type
 * "rate_limited": an in-flight cap that is full now). How a front end
 * answers it (the server: 402, 403 or 429) is the front end's. */
typedef struct lg_budget_refusal {
  const char *type;         /* "budget_exceeded" or "rate_limited" */
  const char *limit_source; /* "key_limit", "workspace_budget",
                               "scope_budget" or "in_flight_budget" */
  lg_scope_kind_t kind;     /* of `scope` */
  char scope[LG_BUDGET_SCOPE_MAX + 1];
  int64_t remaining_micro;  /* what the scope could still take */
  int64_t requested_micro;  /* what the reservation asked for */
  int64_t limit_micro;      /* the limit (or max_in_flight) passed */
  int64_t resets_at_ms;     /* the scope's period end; -1 for none */
  int64_t retry_after_s;    /* rate_limited: seconds to wait (>= 1); else 0 */
  char message[512];        /* a sentence for the client */
} lg_budget_refusal_t;

/* What to reserve. */
typedef struct lg_budget_request {
  const char *const *scopes; /* 1 to LG_BUDGET_MAX_SCOPES scopes, no
                                duplicates, each with a budget */
  size_t nscopes;
  int64_t amount_micro;      /* the worst case, 0 to LG_BUDGET_MAX_MICRO */
  int64_t ttl_ms;            /* <= 0: LG_BUDGET_DEFAULT_TTL_MS; at most
                                LG_BUDGET_MAX_TTL_MS */
  const char *run_id;        /* the run it is for, or NULL */
  int64_t run_seq;           /* the engine's reservation number in that
                                run (lg_decision_t.reservation), or 0 */
  const char *model;         /* kept to price the settlement, or NULL */
} lg_budget_request_t;

/* A reservation made. */
typedef struct lg_budget_reservation {
  char id[LG_BUDGET_ID_MAX]; /* "rsv_" and 32 hex digits */
  int64_t amount_micro;
  int64_t created_ms;
  int64_t expires_ms;        /* created_ms + ttl */
} lg_budget_reservation_t;

/* Reserves req->amount_micro against every scope of the request, all or
 * none, atomically in the store (SQLite: one BEGIN IMMEDIATE transaction;
 * PostgreSQL: the budgets' rows locked FOR UPDATE in scope order;
 * memory: the handle's lock). Returns 0 with *out filled (durable), or
 * LG_BUDGET_REFUSED with *refusal filled (may be NULL) and nothing
 * written, when for some scope spent + reserved + amount > limit, or
 * reserved + amount > max_in_flight. Errors: LG_EINVAL (no scope, a
 * duplicate or malformed scope — err->field "scopes[i]" —, a negative or
 * too large amount or TTL), LG_ENOTFOUND (a scope with no budget, named),
 * store errors. Inside lg_store_with_run() it joins the run's transaction. */
LG_EXPORT int lg_budget_reserve(lg_store_t *s, const lg_budget_request_t *req, int64_t now_ms,
                                lg_budget_reservation_t *out, lg_budget_refusal_t *refusal,
                                lg_error_t *err);

/* A settlement made. */
typedef struct lg_budget_settlement {
  char id[LG_BUDGET_ID_MAX];
  int64_t reserved_micro;  /* what the reservation held */
  int64_t actual_micro;    /* what was charged to every scope */
  int late;                /* settled at or after its TTL: it no longer held */
  int capped;              /* lg_budget_settle_bounded() charged less than
                              asked: the bound (also kept in the row) */
  int64_t asked_micro;     /* what the settler asked to charge */
  size_t nscopes;
  lg_budget_t *scopes;     /* each scope after the settlement, by name
                              (new: lg_budget_settlement_clear) */
} lg_budget_settlement_t;

/* Settles a reservation: on every scope it covers, its hold ends and
 * actual_micro is added to the current period's spent — also when the
 * actual is above the reservation (the provider charged it; the budget
 * may then pass its limit by that difference) and also after the TTL ran
 * out (`late`: the money was spent all the same). actual 0 releases a
 * reservation whose call was not made. `out` may be NULL. Errors:
 * LG_ENOTFOUND (no such reservation, or forgotten by purge), LG_ECONFLICT
 * (already settled: nothing changes), LG_EINVAL (a negative or too large
 * actual), store errors. Durable on return; joins a run's transaction. */
LG_EXPORT int lg_budget_settle(lg_store_t *s, const char *reservation_id,
                               int64_t actual_micro, int64_t now_ms,
                               lg_budget_settlement_t *out, lg_error_t *err);
/* The most lg_budget_settle_bounded() charges, as a multiple of the
 * reservation: 1, so that an untrusted settler keeps spent + reserved <=
 * limit like everyone else. */
#define LG_BUDGET_SETTLE_MAX_FACTOR 1
/* lg_budget_settle() for a settler that is not trusted with the budget
 * (an agent over HTTP): it charges at most the reservation ×
 * LG_BUDGET_SETTLE_MAX_FACTOR. A larger actual is charged at that bound,
 * and the settlement says so (out->capped, out->asked_micro; the
 * reservation row keeps what was asked). An operator, or the engine
 * pricing a usage itself, settles with lg_budget_settle(). */
LG_EXPORT int lg_budget_settle_bounded(lg_store_t *s, const char *reservation_id,
                                       int64_t actual_micro, int64_t now_ms,
                                       lg_budget_settlement_t *out, lg_error_t *err);
LG_EXPORT void lg_budget_settlement_clear(lg_budget_settlement_t *st);

/* Housekeeping: deletes the rows of holds that have expired (they stopped
 * counting at their expiry already) and forgets reservations whose TTL
 * ended more than older_than_ms before now_ms (negative: the store's
 * retention; settling one after that is LG_ENOTFOUND). *purged (may be
 * NULL) receives the number of reservations forgotten. */
LG_EXPORT int lg_budget_purge(lg_store_t *s, int64_t older_than_ms, int64_t now_ms,
                              int64_t *purged, lg_error_t *err);

/* ---- runs: the spend gate for model calls ---- */

/* 0 when `scopes` could be a run's or a reservation's: 1 to
 * LG_BUDGET_MAX_SCOPES valid names, none twice (LG_EINVAL), each with a
 * budget in `s` (LG_ENOTFOUND); err->field names the one at fault
 * ("scopes[2]"). Changes nothing: check before creating a run, so that a
 * run is never created with scopes it cannot use. */
LG_EXPORT int lg_budget_scopes_check(lg_store_t *s, const char *const *scopes, size_t n,
                                     lg_error_t *err);

/* Stores the scopes a run's model calls reserve against (replacing any
 * given before; n 0 removes them). Every scope must have a budget
 * (LG_ENOTFOUND naming it) and appear once (LG_EINVAL). Call it when the
 * run is created (POST /v1/runs {scopes}). */
LG_EXPORT int lg_budget_run_scopes_set(lg_store_t *s, const char *run_id,
                                       const char *const *scopes, size_t n, lg_error_t *err);
/* The run's scopes as a JSON array of strings ("[]" when none). New
 * string (lg_free) in *json. */
LG_EXPORT int lg_budget_run_scopes(lg_store_t *s, const char *run_id, char **json,
                                   lg_error_t *err);

/* ---- keys (gateway-v1 "Keys"; docs/keys.md) ----
 * A loopguard key: a secret ("lgk-" and 40 random characters) that a
 * client calls the gateway with, stored only as its SHA-256, and a spend
 * limit that rides on the shared budget "key:ID" (ID: the hash of the
 * key's first secret, which rotation keeps). Each function answers the
 * JSON of its route in a new string *out (lg_free): create and rotate
 * {key, hash, ...} with the secret, shown this once; update and show the
 * key ({hash, id, name, limit_usd, limit_reset, workspace, usage_usd,
 * reserved_usd, limit_remaining_usd, disabled, created_at, ...}; show and
 * self add usage_daily_usd, usage_weekly_usd, usage_monthly_usd); list
 * {keys: [...]}. `json` is a creation or update body: {name, limit_usd?,
 * limit_reset?, workspace?, include_byok_in_limit?, rate_limit_per_min?,
 * models?, byok?} (update: any of them, and disabled); a bad field is
 * LG_EINVAL naming it. `ref` is a key's hash or id (LG_ENOTFOUND).
 * lg_key_self: the key of a secret (LG_EPERM: unknown, rotated or
 * disabled). Store errors as the budgets'. */
#define LG_KEY_PREFIX "lgk-"
/* A key's own provider keys (byok) at rest: with a secret set on the
 * store handle, they are written sealed (AES-256-GCM) and opened when a
 * request needs one; without, they are written as they are (docs/keys.md,
 * "Provider keys at rest"). lg_key_secret_load reads a secret file: 32
 * bytes, or 64 hex digits (a newline after them allowed); LG_EIO /
 * LG_EINVAL naming the file. lg_key_set_secret gives the handle the
 * secret (a copy of a key derived from it; NULL forgets it). */
#define LG_KEY_SECRET_BYTES 32
LG_EXPORT int lg_key_secret_load(const char *path, unsigned char secret[LG_KEY_SECRET_BYTES],
                                 lg_error_t *err);
LG_EXPORT void lg_key_set_secret(lg_store_t *s, const unsigned char secret[LG_KEY_SECRET_BYTES]);
LG_EXPORT int lg_key_has_secret(const lg_store_t *s);
LG_EXPORT int lg_key_create(lg_store_t *s, const char *json, size_t len, int64_t now_ms,
                            char **out, lg_error_t *err);
LG_EXPORT int lg_key_update(lg_store_t *s, const char *ref, const char *json, size_t len,
                            int64_t now_ms, char **out, lg_error_t *err);
LG_EXPORT int lg_key_rotate(lg_store_t *s, const char *ref, int64_t now_ms, char **out,
                            lg_error_t *err);
LG_EXPORT int lg_key_show(lg_store_t *s, const char *ref, int64_t now_ms, char **out,
                          lg_error_t *err);
LG_EXPORT int lg_key_list(lg_store_t *s, int64_t now_ms, char **out, lg_error_t *err);
LG_EXPORT int lg_key_self(lg_store_t *s, const char *secret, int64_t now_ms, char **out,
                          lg_error_t *err);

/* What lg_budget_model() did beside its decision. */
typedef struct lg_budget_gate {
  int refused;                 /* a shared budget refused: `refusal` says why */
  lg_budget_refusal_t refusal;
  char reservation_id[LG_BUDGET_ID_MAX]; /* the shared reservation made, ""
                                            when none (no scopes, not let
                                            through) */
  int64_t worst_nusd;          /* the worst case decided on, -1 unknown
                                  (write it to the trace as the cost) */
} lg_budget_gate_t;

/* POST /v1/runs/{id}/model: the whole spend gate for one model call of a
 * run loaded from `s` (call it inside lg_store_with_run). In order:
 *   1. the worst case: m->cost_nusd when the client gave one, the price
 *      table's figure (lg_prices_worst_case) when the model has a price,
 *      the larger of the two when both; a model with no price and no
 *      cost is refused (LG_ENOTFOUND, field "model", naming it) — unless
 *      neither the run's policy (max_cost_usd) nor any scope needs a cost;
 *   2. the run's scopes (lg_budget_run_scopes_set): a reservation of the
 *      worst case against all of them. Refused by a limit: the run stops
 *      with budget_exceeded (d is the stop; out->refused, out->refusal for
 *      the answer's metadata), return 0. Refused by an in-flight cap: the
 *      run does not change and LG_BUDGET_REFUSED is returned with
 *      out->refusal (rate_limited, retry_after_s: the server's 429);
 *   3. the engine (lg_run_model) with that worst case: its caps decide;
 *      if it does not let the call through, the shared reservation is
 *      undone.
 * `prices` may be NULL; ttl_ms <= 0 is LG_BUDGET_DEFAULT_TTL_MS; m->t_ms
 * is the run's time, now_ms the epoch time. */
LG_EXPORT int lg_budget_model(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                              const lg_model_call_t *m, int64_t ttl_ms, int64_t now_ms,
                              lg_decision_t *d, lg_budget_gate_t *out, lg_error_t *err);
/* POST /v1/runs/{id}/usage: settles the run's reservation `reservation`
 * (0: the oldest open one) in the engine and, when the run has scopes, in
 * the shared budgets. The actual cost: cost_nusd when >= 0; else the
 * tokens at the model's price when the model (kept with the shared
 * reservation) has one; else the worst case that was held. *actual_nusd
 * (may be NULL) receives it. LG_ENOTFOUND when the run has no such open
 * reservation (nothing changes). */
LG_EXPORT int lg_budget_usage(lg_store_t *s, const lg_prices_t *prices, lg_run_t *run,
                              int64_t reservation, int64_t input_tokens,
                              int64_t output_tokens, int64_t cost_nusd, int64_t t_ms,
                              int64_t now_ms, int64_t *actual_nusd, lg_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* LOOPGUARD_BUDGET_H */
