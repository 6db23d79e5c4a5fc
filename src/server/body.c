/*
 * body.c — request bodies of http-api-v1, parsed and checked.
 *
 * A body is one JSON object, parsed by jansson with duplicate keys
 * rejected. Each endpoint has a table of the fields it knows (name, JSON
 * type, whether required, a range); a field of the wrong type, out of
 * range or not in the table is an error whose message starts with the
 * field's name ("args: expected an object, got an array"), and every
 * unknown field is named at once ("unknown fields: agnt, tunr"), so a
 * client sees all its typos in one round trip.
 *
 * The one field that is deliberately not checked for its value is a
 * result's `status`: a missing, null or unknown status is the tool's
 * answer being malformed, which the engine's validation gate turns into a
 * stop (invalid_tool_result), not a client error. Only a status that is
 * not a string at all is a 400.
 *
 * This file is fed untrusted bytes by the fuzz target
 * tests/fuzz/fuzz_http_body.c: nothing here may read past `len`, and any
 * input must end in either a filled body or an error, never a crash.
 */
#include "server.h"

#include <math.h>
#include <stdio.h>

/* JSON types a field may have. */
typedef enum ftype {
  T_STR = 1, /* a string */
  T_ID,      /* a string of 1 to 1024 bytes without control characters */
  T_INT,     /* a whole number (1 and 1.0 both) */
  T_UINT,    /* a whole number >= 0 */
  T_USD,     /* a number >= 0, USD */
  T_BOOL,    /* true or false */
  T_OBJ,     /* an object */
  T_ANY,     /* any JSON value */
  T_STATUS,  /* results' status: a string or null */
  T_SCOPES,  /* an array of 1 to 16 non-empty strings */
  T_DUSD,    /* a number >= 0 kept as given (budgets convert it) */
  T_DUSD_NULL /* the same, or null (absent) */
} ftype_t;

/* Where a field lands in lg__body_t. */
typedef enum fslot {
  S_RUN_ID = 1, S_GROUP, S_POLICY, S_PROGRESS_VERSION, S_TOOL, S_ARGS, S_TURN, S_CALL_ID,
  S_IDEMPOTENCY_KEY, S_AGENT, S_STATUS, S_SIDE_EFFECT_COMMITTED, S_RETRY_AFTER_MS, S_VALUE,
  S_OPERATION_ID, S_WORLD, S_FROM, S_TO, S_MODEL, S_INPUT_TOKENS, S_OUTPUT_TOKENS,
  S_MAX_TOKENS, S_COST, S_RESERVATION_ID, S_REASON, S_KEY, S_REQUEST_FP, S_LEASE_MS,
  S_RESULT, S_RETRYABLE, S_SCOPES, S_LIMIT, S_MAX_IN_FLIGHT, S_PERIOD, S_AMOUNT, S_TTL,
  S_ACTUAL, S_CLAIM_TOKEN, S_TEXT, S_NOTE
} fslot_t;

typedef struct field {
  const char *name; /* JSON member name */
  ftype_t type;
  fslot_t slot;
  bool required;
} field_t;

/* The range of every number a client may send, by field name (a field
 * of the same name has the same range in every body). Whole numbers are
 * checked exactly as int64; amounts of USD as doubles. A value outside is
 * a 400 naming the field and the range, before anything is decided or
 * stored: the engine and the stores never see a number they would have
 * to saturate. docs/security.md repeats this table
 * (test_server_hardening checks that it does). */
#define P53 9007199254740992LL /* 2^53: every integer a double holds */
#define WEEK_MS 604800000LL    /* 7 days */
static const lg__range_t ranges[] = {
    {"progress_version", -P53, P53, 0, 0, "a version the tool reports; only its rise counts"},
    {"turn", 0, P53, 0, 0, "the model turn of a call"},
    {"retry_after_ms", 0, WEEK_MS, 0, 0, "no identical call before this many ms"},
    {"input_tokens", 0, 1000000000LL, 0, 0, "tokens of one model call"},
    {"output_tokens", 0, 1000000000LL, 0, 0, "tokens of one model call"},
    {"max_tokens", 0, 1000000000LL, 0, 0, "tokens of one model call"},
    {"lease_ms", 0, WEEK_MS, 0, 0, "how long a claim is held (0: the store's lease)"},
    {"ttl_ms", 0, LG_BUDGET_MAX_TTL_MS, 0, 0, "how long a reservation is held (0: 10 minutes)"},
    {"cost_usd", 0, 0, 0, 1e9, "USD of one model call"},
    {"amount_usd", 0, 0, 0, 1e9, "USD reserved"},
    {"actual_usd", 0, 0, 0, 1e9, "USD settled"},
    {"limit_usd", 0, 0, 0, LG_BUDGET_MAX_USD, "USD a budget allows a period"},
    {"max_in_flight_usd", 0, 0, 0, LG_BUDGET_MAX_USD, "USD reserved at once"},
    {NULL, 0, 0, 0, 0, NULL}};

const lg__range_t *lg__body_ranges(void) { return ranges; }

static const lg__range_t *range_of(const char *name) {
  for (const lg__range_t *r = ranges; r->field; r++)
    if (!strcmp(r->field, name)) return r;
  return NULL;
}

static int out_of_range(lg_error_t *err, const char *name, const lg__range_t *r, bool negative) {
  if (!r) /* a field without a range (lg__body_unranged finds none): its type's own bounds */
    return lg__err(err, LG_EINVAL, name, -1, "%s: out of range", name);
  if (r->usd_hi > 0)
    return lg__err(err, LG_EINVAL, name, -1, "%s: %sthe range is 0 to %.0f (USD)", name,
                   negative ? "must not be negative; " : "", r->usd_hi);
  return lg__err(err, LG_EINVAL, name, -1, "%s: %sthe range is %lld to %lld", name,
                 negative ? "must not be negative; " : "", (long long)r->lo, (long long)r->hi);
}

/* The nesting of v as the canonicaliser counts it (a scalar 0, [] 1, [[]]
 * 2), stopping once past `limit`. */
static int depth_of(json_t *v, int limit) {
  if (limit < 0) return 1;
  int d = 0;
  if (json_is_object(v)) {
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
      int e = depth_of(x, limit - 1);
      if (e > d) d = e;
      if (d > limit) break;
    }
    return d + 1;
  }
  if (json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
      int e = depth_of(x, limit - 1);
      if (e > d) d = e;
      if (d > limit) break;
    }
    return d + 1;
  }
  return 0;
}

#define END {NULL, 0, 0, false}
static const field_t f_run[] = {{"run_id", T_ID, S_RUN_ID, false},
                                {"group", T_ID, S_GROUP, false},
                                {"policy", T_OBJ, S_POLICY, false},
                                {"progress_version", T_INT, S_PROGRESS_VERSION, false},
                                {"scopes", T_SCOPES, S_SCOPES, false},
                                END};
static const field_t f_call[] = {{"tool", T_ID, S_TOOL, true},
                                 {"args", T_OBJ, S_ARGS, false},
                                 {"turn", T_INT, S_TURN, false},
                                 {"call_id", T_ID, S_CALL_ID, false},
                                 {"idempotency_key", T_ID, S_IDEMPOTENCY_KEY, false},
                                 {"agent", T_STR, S_AGENT, false},
                                 END};
static const field_t f_result[] = {{"call_id", T_ID, S_CALL_ID, false},
                                   {"status", T_STATUS, S_STATUS, false},
                                   {"progress_version", T_INT, S_PROGRESS_VERSION, false},
                                   {"side_effect_committed", T_BOOL, S_SIDE_EFFECT_COMMITTED, false},
                                   {"retry_after_ms", T_UINT, S_RETRY_AFTER_MS, false},
                                   {"value", T_ANY, S_VALUE, false},
                                   {"operation_id", T_ID, S_OPERATION_ID, false},
                                   END};
static const field_t f_state[] = {{"world", T_OBJ, S_WORLD, true}, END};
static const field_t f_handoff[] = {{"from", T_STR, S_FROM, true}, {"to", T_STR, S_TO, true}, END};
static const field_t f_model[] = {{"model", T_STR, S_MODEL, false},
                                  {"input_tokens", T_UINT, S_INPUT_TOKENS, true},
                                  {"max_tokens", T_UINT, S_MAX_TOKENS, false},
                                  {"cost_usd", T_USD, S_COST, false},
                                  {"turn", T_INT, S_TURN, false},
                                  END};
static const field_t f_usage[] = {{"reservation_id", T_ID, S_RESERVATION_ID, false},
                                  {"input_tokens", T_UINT, S_INPUT_TOKENS, true},
                                  {"output_tokens", T_UINT, S_OUTPUT_TOKENS, true},
                                  {"cost_usd", T_USD, S_COST, false},
                                  END};
static const field_t f_cancel[] = {{"reason", T_ID, S_REASON, false}, END};
static const field_t f_claim[] = {{"key", T_ID, S_KEY, true},
                                  {"request_fingerprint", T_ID, S_REQUEST_FP, true},
                                  {"run_id", T_ID, S_RUN_ID, false},
                                  {"lease_ms", T_UINT, S_LEASE_MS, false},
                                  END};
static const field_t f_commit[] = {{"result", T_ANY, S_RESULT, true},
                                   {"operation_id", T_ID, S_OPERATION_ID, false},
                                   {"claim_token", T_ID, S_CLAIM_TOKEN, false},
                                   END};
static const field_t f_fail[] = {{"retryable", T_BOOL, S_RETRYABLE, true},
                                 {"claim_token", T_ID, S_CLAIM_TOKEN, false},
                                 END};
static const field_t f_budget_set[] = {{"limit_usd", T_DUSD, S_LIMIT, true},
                                       {"period", T_STR, S_PERIOD, true},
                                       {"max_in_flight_usd", T_DUSD_NULL, S_MAX_IN_FLIGHT, false},
                                       END};
static const field_t f_reserve[] = {{"scopes", T_SCOPES, S_SCOPES, true},
                                    {"amount_usd", T_DUSD, S_AMOUNT, true},
                                    {"ttl_ms", T_UINT, S_TTL, false},
                                    END};
static const field_t f_settle[] = {{"reservation_id", T_ID, S_RESERVATION_ID, true},
                                   {"actual_usd", T_DUSD, S_ACTUAL, true},
                                   END};

static const field_t f_text[] = {{"text", T_STR, S_TEXT, true},
                                 {"turn", T_INT, S_TURN, false},
                                 {"agent", T_STR, S_AGENT, false},
                                 END};
static const field_t f_user[] = {{"text", T_STR, S_TEXT, false}, END};
static const field_t f_compaction[] = {END};
static const field_t f_resume[] = {{"progress_version", T_INT, S_PROGRESS_VERSION, false},
                                   {"note", T_STR, S_NOTE, false},
                                   END};

static const field_t *tables[LG__B__COUNT] = {
    f_run,     f_call,   f_result,  f_state,      f_handoff, f_model,    f_usage,
    f_cancel,  f_claim,  f_commit,  f_fail,       f_budget_set, f_reserve, f_settle,
    f_text,    f_user,   f_compaction, f_resume};

const char *lg__body_unranged(void) {
  for (int k = 0; k < LG__B__COUNT; k++)
    for (const field_t *f = tables[k]; f->name; f++)
      if ((f->type == T_INT || f->type == T_UINT || f->type == T_USD || f->type == T_DUSD ||
           f->type == T_DUSD_NULL) &&
          !range_of(f->name))
        return f->name;
  return NULL;
}

static int wrong(lg_error_t *err, const char *name, const char *want, const json_t *v) {
  return lg__err(err, LG_EINVAL, name, -1, "%s: expected %s, got %s", name, want, lg__json_type_name(v));
}

/* A whole number: an integer, or a real with no fraction that fits. */
static int whole(const json_t *v, int64_t *out) {
  if (json_is_integer(v)) {
    *out = (int64_t)json_integer_value(v);
    return 1;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (d == floor(d) && fabs(d) < 9.0e18) {
      *out = (int64_t)d;
      return 1;
    }
  }
  return 0;
}

static void body_init(lg__body_t *b) {
  memset(b, 0, sizeof *b);
  b->progress_version = b->turn = -1;
  b->side_effect_committed = -1;
  b->retry_after_ms = -1;
  b->input_tokens = b->output_tokens = b->max_tokens = -1;
  b->lease_ms = -1;
  b->retryable = -1;
  b->ttl_ms = -1;
}

void lg__body_clear(lg__body_t *b) {
  if (b->root) json_decref(b->root);
  body_init(b);
}

/* The checks of one field, a function per kind of value; each returns 0
 * or an error naming the field. */

/* An id (T_ID): lg__id_problem's rule, as in a path or a header. */
static int check_id(const field_t *f, const json_t *v, lg_error_t *err) {
  const char *why = lg__id_problem(json_string_value(v), json_string_length(v));
  return why ? lg__err(err, LG_EINVAL, f->name, -1, "%s: %s", f->name, why) : 0;
}

/* A whole number (T_INT, T_UINT) within the field's range, into *i. */
static int check_whole(const field_t *f, const json_t *v, int64_t *i, lg_error_t *err) {
  const lg__range_t *r = range_of(f->name);
  if (!whole(v, i)) {
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && r)
      return out_of_range(err, f->name, r, json_real_value(v) < 0 && r->lo >= 0);
    return wrong(err, f->name, "a whole number", v);
  }
  if (r && (*i < r->lo || *i > r->hi)) return out_of_range(err, f->name, r, *i < 0 && r->lo >= 0);
  if (f->type == T_UINT && *i < 0)
    return lg__err(err, LG_EINVAL, f->name, -1, "%s: must not be negative", f->name);
  return 0;
}

/* A cost in USD (T_USD), 0 to the field's bound, into *i in nano-dollars. */
static int check_usd(const field_t *f, const json_t *v, int64_t *i, lg_error_t *err) {
  if (!json_is_number(v)) return wrong(err, f->name, "a number", v);
  double d = json_number_value(v);
  const lg__range_t *r = range_of(f->name);
  double hi = r ? r->usd_hi : 1e9;
  if (!(d >= 0 && d <= hi)) return out_of_range(err, f->name, r, d < 0);
  if (lg__usd_to_units(d, LG__USD_NANO, i)) return out_of_range(err, f->name, r, false);
  return 0;
}

/* A budget amount (T_DUSD): a number, not negative, within the bound. */
static int check_dusd(const field_t *f, const json_t *v, lg_error_t *err) {
  if (!json_is_number(v)) return wrong(err, f->name, "a number", v);
  double d = json_number_value(v);
  const lg__range_t *r = range_of(f->name);
  if (!(d >= 0)) return lg__err(err, LG_EINVAL, f->name, -1, "%s: must not be negative", f->name);
  if (r && !(d <= r->usd_hi)) return out_of_range(err, f->name, r, false);
  return 0;
}

/* Scope names (T_SCOPES): 1 to 16 non-empty strings. */
static int check_scopes(const field_t *f, const json_t *v, lg_error_t *err) {
  if (!json_is_array(v)) return wrong(err, f->name, "an array of scope names", v);
  size_t n = json_array_size(v);
  if (!n || n > 16) return lg__err(err, LG_EINVAL, f->name, -1, "%s: from 1 to 16 scope names", f->name);
  for (size_t k = 0; k < n; k++) {
    json_t *e = json_array_get(v, k);
    if (!json_is_string(e) || !json_string_length(e)) {
      char name[64];
      snprintf(name, sizeof name, "%s[%zu]", f->name, k);
      return lg__err(err, LG_EINVAL, name, -1, "%s: expected a non-empty string", name);
    }
  }
  return 0;
}

/* Checks one known field's value by its type: its string into *s, its
 * number (or boolean) into *i; *absent when a null means "not given". */
static int check_field(const field_t *f, json_t *v, const char **s, int64_t *i, bool *absent,
                       lg_error_t *err) {
  int rc = 0;
  *absent = false;
  switch (f->type) {
  case T_STR:
  case T_ID:
    if (!json_is_string(v)) return wrong(err, f->name, "a string", v);
    *s = json_string_value(v);
    if (f->type == T_ID) rc = check_id(f, v, err);
    break;
  case T_STATUS:
    if (json_is_null(v)) { /* the validation gate decides */
      *absent = true;
      return 0;
    }
    if (!json_is_string(v)) return wrong(err, f->name, "a string", v);
    *s = json_string_value(v);
    break;
  case T_INT:
  case T_UINT: rc = check_whole(f, v, i, err); break;
  case T_USD: rc = check_usd(f, v, i, err); break;
  case T_BOOL:
    if (!json_is_boolean(v)) return wrong(err, f->name, "true or false", v);
    *i = json_is_true(v);
    break;
  case T_OBJ:
    if (!json_is_object(v)) return wrong(err, f->name, "an object", v);
    break;
  case T_ANY: break;
  case T_SCOPES: rc = check_scopes(f, v, err); break;
  case T_DUSD_NULL:
    if (json_is_null(v)) {
      *absent = true;
      return 0;
    }
    rc = check_dusd(f, v, err);
    break;
  case T_DUSD: rc = check_dusd(f, v, err); break;
  }
  if (rc) return rc;
  /* Nesting: what the canonicaliser (and so replay) refuses, refused here,
   * so that nothing is stored that its trace cannot replay. */
  if ((f->type == T_OBJ || f->type == T_ANY) && depth_of(v, LG_CANON_MAX_DEPTH) > LG_CANON_MAX_DEPTH)
    return lg__err(err, LG_EINVAL, f->name, -1, "%s: nested deeper than %d levels", f->name,
                   LG_CANON_MAX_DEPTH);
  return 0;
}

/* Stores a checked field in its slot of b. */
static void store(lg__body_t *b, const field_t *f, json_t *v, const char *s, int64_t i) {
  switch (f->slot) {
  case S_RUN_ID: b->run_id = s; break;
  case S_GROUP: b->group = s; break;
  case S_POLICY: b->policy = v; break;
  case S_PROGRESS_VERSION:
    b->has_progress_version = 1;
    b->progress_version = i;
    break;
  case S_TOOL: b->tool = s; break;
  case S_ARGS: b->args = v; break;
  case S_TURN:
    b->has_turn = 1;
    b->turn = i;
    break;
  case S_CALL_ID: b->call_id = s; break;
  case S_IDEMPOTENCY_KEY: b->idempotency_key = s; break;
  case S_AGENT: b->agent = s; break;
  case S_STATUS: b->status = s; break;
  case S_SIDE_EFFECT_COMMITTED: b->side_effect_committed = (int)i; break;
  case S_RETRY_AFTER_MS: b->retry_after_ms = i; break;
  case S_VALUE: b->value = v; break;
  case S_OPERATION_ID: b->operation_id = s; break;
  case S_WORLD: b->world = v; break;
  case S_FROM: b->from = s; break;
  case S_TO: b->to = s; break;
  case S_MODEL: b->model = s; break;
  case S_INPUT_TOKENS: b->input_tokens = i; break;
  case S_OUTPUT_TOKENS: b->output_tokens = i; break;
  case S_MAX_TOKENS: b->max_tokens = i; break;
  case S_COST:
    b->has_cost = 1;
    b->cost_nusd = i;
    break;
  case S_RESERVATION_ID: b->reservation_id = s; break;
  case S_REASON: b->reason = s; break;
  case S_KEY: b->key = s; break;
  case S_REQUEST_FP: b->request_fp = s; break;
  case S_LEASE_MS: b->lease_ms = i; break;
  case S_RESULT: b->result = v; break;
  case S_RETRYABLE: b->retryable = (int)i; break;
  case S_SCOPES: b->scopes = v; break;
  case S_LIMIT: b->limit_usd = json_number_value(v); break;
  case S_MAX_IN_FLIGHT:
    b->has_max_in_flight = 1;
    b->max_in_flight_usd = json_number_value(v);
    break;
  case S_PERIOD: b->period = s; break;
  case S_AMOUNT: b->amount_usd = json_number_value(v); break;
  case S_TTL: b->ttl_ms = i; break;
  case S_ACTUAL: b->actual_usd = json_number_value(v); break;
  case S_CLAIM_TOKEN: b->claim_token = s; break;
  case S_TEXT:
    b->text = s;
    b->text_len = json_string_length(v);
    break;
  case S_NOTE: b->note = s; break;
  }
}

/* Checks one known field and stores it. */
static int take(lg__body_t *b, const field_t *f, json_t *v, lg_error_t *err) {
  const char *s = NULL;
  int64_t i = 0;
  bool absent;
  int rc = check_field(f, v, &s, &i, &absent, err);
  if (rc || absent) return rc;
  store(b, f, v, s, i);
  return 0;
}

/* A member name of the body's table (lg__json_unknown_fields). */
static bool in_table(const char *name, const void *ud) {
  const field_t *f = ud;
  while (f->name && strcmp(f->name, name)) f++;
  return f->name != NULL;
}

int lg__body_parse(lg__body_kind_t kind, const char *text, size_t len, lg__body_t *out,
                   lg_error_t *err) {
  body_init(out);
  if ((unsigned)kind >= LG__B__COUNT) return lg__err(err, LG_EINVAL, NULL, -1, "unknown body kind");
  size_t a = lg__json_ws_end(text, 0, len);
  json_t *root;
  if (a == len) {
    root = json_object(); /* an empty body is {} */
    if (!root) return lg__err(err, LG_ENOMEM, "body", -1, "out of memory");
  } else {
    json_error_t je;
    root = lg__json_load_flags(text, len, JSON_REJECT_DUPLICATES, &je, NULL); /* begins itself */
    if (lg__json_oom()) { /* see util.c: jansson may misreport it */
      json_decref(root);
      return lg__err(err, LG_ENOMEM, "body", -1, "out of memory");
    }
    if (!root) {
      int code = strstr(je.text, "duplicate") ? LG_EDUPKEY : LG_EPARSE;
      return lg__err(err, code, "body", je.position, "body: malformed JSON at line %d, column %d: %s",
                     je.line, je.column, je.text);
    }
  }
  if (!json_is_object(root)) {
    int rc = lg__err(err, LG_EINVAL, "body", -1, "body: expected a JSON object, got %s",
                     lg__json_type_name(root));
    json_decref(root);
    return rc;
  }
  out->root = root;
  const field_t *tab = tables[kind];
  /* Unknown fields first, all of them in one message. */
  int urc = lg__json_unknown_fields(root, in_table, tab, NULL, err);
  if (urc) {
    lg__body_clear(out);
    return urc;
  }
  for (const field_t *f = tab; f->name; f++) {
    json_t *fv = json_object_get(root, f->name);
    int rc = 0;
    if (!fv) {
      if (f->required) rc = lg__err(err, LG_EINVAL, f->name, -1, "%s: this field is required", f->name);
    } else {
      rc = take(out, f, fv, err);
    }
    if (rc) {
      lg__body_clear(out);
      return rc;
    }
  }
  return 0;
}

char *lg__json_text(const json_t *v, size_t *len) {
  /* json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)'s text (values as well
   * as documents), written by lg__buf_json: jansson's writer took about
   * 100 instructions a byte, through a callback a character. */
  lg__buf_t b = {0};
  if (!v || lg__buf_json(&b, v)) {
    lg__buf_free(&b);
    if (len) *len = 0;
    return NULL;
  }
  return lg__buf_steal(&b, len);
}
