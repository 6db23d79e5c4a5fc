/*
 * trace.c — reading trace-v1 lines and replaying them through the engine.
 *
 * The reader is on the hot path (a replay must do a million calls a
 * second), so it does not build a DOM. One pass over a line finds each
 * member of the event object and where its value lies; only the values the
 * event needs are then looked at: short strings are copied (decoded when
 * they hold escapes), numbers are read in place, and `args`, `value` and
 * `world` are handed as spans to the canonicaliser, which validates them as
 * it goes. Values of unknown fields are validated the same way and dropped.
 * A known field with the wrong JSON type is an error that names the field.
 *
 * Replay feeds the events to a fresh run exactly as a live agent would:
 * before() for a call, after() for its result, and so on. The result of a
 * call that did not execute is skipped; after a stop, the remaining events
 * are read (and must still be well-formed) but not acted on.
 */
#include "../canon/canon.h"
#include "../event/event.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fields the reader knows, of every event type. */
#define FIELD_MAP(XX)                                                          \
  XX(TYPE, "type") XX(T_MS, "t_ms") XX(RUN_ID, "run_id") XX(POLICY, "policy")  \
  XX(PROGRESS_VERSION, "progress_version") XX(GROUP, "group")                  \
  XX(TURN, "turn") XX(INPUT_TOKENS, "input_tokens")                            \
  XX(OUTPUT_TOKENS, "output_tokens") XX(MAX_TOKENS, "max_tokens")              \
  XX(COST, "cost") XX(MODEL, "model") XX(TOOL, "tool") XX(ARGS, "args")        \
  XX(CALL_ID, "call_id") XX(IDEMPOTENCY_KEY, "idempotency_key")                \
  XX(AGENT, "agent") XX(STATUS, "status")                                      \
  XX(SIDE_EFFECT_COMMITTED, "side_effect_committed")                           \
  XX(RETRY_AFTER_MS, "retry_after_ms") XX(VALUE, "value")                      \
  XX(OPERATION_ID, "operation_id") XX(WORLD, "world") XX(FROM, "from")         \
  XX(TO, "to") XX(REASON, "reason") XX(RESERVATION, "reservation")            \
  XX(SCOPE, "scope") XX(LIMIT_SOURCE, "limit_source")                          \
  XX(REQUESTED_USD, "requested_usd") XX(TEXT, "text") XX(NOTE, "note")

enum {
#define XX(id, name) F_##id,
  FIELD_MAP(XX)
#undef XX
  F__COUNT
};
static const char *field_names[] = {
#define XX(id, name) name,
    FIELD_MAP(XX)
#undef XX
};

typedef struct span {
  size_t a, b;   /* value bytes [a, b) of the line */
  uint32_t gen;  /* the line it belongs to: present when == reader's gen */
} span_t;

/* The reader's state for one trace. */
typedef struct reader {
  const char *name;   /* file name for messages */
  lg_canon_t *canon;
  lg_error_t *err;
  const char *s;      /* the current line */
  size_t n;
  long line;
  span_t f[F__COUNT];
  uint32_t gen;       /* counts lines; spans of older lines are absent */
  lg__buf_t strs;     /* decoded strings of the current line; reserved for
                         the whole line up front, so it never moves */
  const char *str[F__COUNT]; /* decoded string fields, once read */
  uint32_t str_gen[F__COUNT]; /* == gen once read on this line */
  uint32_t fmask;     /* bit f: field f is on the current line */
  const lg_policy_t *policy; /* the run's, for loop keys; NULL before it */
  bool has_fp;        /* args were canonicalised while scanning */
  lg__buf_t *km;      /* into this key material (the event's own buffer) */
} reader_t;


static int get_str(reader_t *r, int f, const char **out);

/* Whether field f is on the current line. */
#define HAS(rd, id) ((rd)->f[id].gen == (rd)->gen)

/* The id of a known field name, or -1. Constant-length comparisons, which
 * the compiler turns into a word compare or two. */
static int field_id(const char *k, size_t len) {
#define IS(lit) (!memcmp(k, lit, sizeof(lit) - 1))
  switch (len) {
  case 2: return IS("to") ? F_TO : -1;
  case 4:
    return IS("type")   ? F_TYPE
           : IS("text") ? F_TEXT
           : IS("note") ? F_NOTE
           : IS("turn") ? F_TURN
           : IS("tool") ? F_TOOL
           : IS("args") ? F_ARGS
           : IS("t_ms") ? F_T_MS
           : IS("cost") ? F_COST
           : IS("from") ? F_FROM
                        : -1;
  case 5:
    return IS("value")   ? F_VALUE
           : IS("model") ? F_MODEL
           : IS("world") ? F_WORLD
           : IS("group") ? F_GROUP
           : IS("agent") ? F_AGENT
           : IS("scope") ? F_SCOPE
                         : -1;
  case 6:
    return IS("status")   ? F_STATUS
           : IS("run_id") ? F_RUN_ID
           : IS("policy") ? F_POLICY
           : IS("reason") ? F_REASON
                          : -1;
  case 7: return IS("call_id") ? F_CALL_ID : -1;
  case 10: return IS("max_tokens") ? F_MAX_TOKENS : -1;
  case 11: return IS("reservation") ? F_RESERVATION : -1;
  case 12:
    return IS("input_tokens")   ? F_INPUT_TOKENS
           : IS("operation_id") ? F_OPERATION_ID
           : IS("limit_source") ? F_LIMIT_SOURCE
                                : -1;
  case 13: return IS("output_tokens") ? F_OUTPUT_TOKENS : IS("requested_usd") ? F_REQUESTED_USD : -1;
  case 14: return IS("retry_after_ms") ? F_RETRY_AFTER_MS : -1;
  case 15: return IS("idempotency_key") ? F_IDEMPOTENCY_KEY : -1;
  case 16: return IS("progress_version") ? F_PROGRESS_VERSION : -1;
  case 21: return IS("side_effect_committed") ? F_SIDE_EFFECT_COMMITTED : -1;
  }
  return -1;
#undef IS
}

static int rerr(reader_t *r, int code, int field, long off, const char *fmt, const char *a) {
  lg__err(r->err, code, field >= 0 ? field_names[field] : NULL, off, fmt, a ? a : "");
  lg__err_where(r->err, r->name, r->line);
  return code;
}

/* The end of the value at i (not validated: the canonicaliser does that). */
static int value_end(reader_t *r, size_t i, size_t *end) {
  const char *s = r->s;
  size_t n = r->n;
  if (i >= n) return rerr(r, LG_EPARSE, -1, (long)i, "unexpected end of line%s", NULL);
  char ch = s[i];
  if (ch == '"') {
    for (i++; i < n;) {
      const char *q = memchr(s + i, '"', n - i);
      if (!q) break;
      size_t j = (size_t)(q - s), bs = 0;
      while (j - bs > i && s[j - bs - 1] == '\\') bs++;
      if (!(bs & 1)) { /* not escaped */
        *end = j + 1;
        return 0;
      }
      i = j + 1;
    }
    return rerr(r, LG_EPARSE, -1, (long)n, "unterminated string%s", NULL);
  }
  if (ch == '{' || ch == '[') {
    int depth = 0;
    for (; i < n; i++) {
      char c = s[i];
      if (c == '"') {
        for (i++; i < n && s[i] != '"'; i++)
          if (s[i] == '\\') i++;
        if (i >= n) break;
      } else if (c == '{' || c == '[') {
        depth++;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          *end = i + 1;
          return 0;
        }
      }
    }
    return rerr(r, LG_EPARSE, -1, (long)n, "unterminated object or array%s", NULL);
  }
  size_t j = i;
  while (j < n && !lg__json_ws(s[j]) && s[j] != ',' && s[j] != '}' && s[j] != ']') j++;
  if (j == i) return rerr(r, LG_EPARSE, -1, (long)i, "expected a value%s", NULL);
  *end = j;
  return 0;
}

/* Validates a span with the canonicaliser; errors name the field. */
static int validate(reader_t *r, int field, const char *fname, span_t sp) {
  const char *out;
  size_t ol;
  int rc = lg_canon_json(r->canon, r->s + sp.a, sp.b - sp.a, &out, &ol, r->err);
  if (rc) {
    if (r->err) {
      r->err->offset = r->err->offset >= 0 ? r->err->offset + (long)sp.a : (long)sp.a;
      snprintf(r->err->field, sizeof r->err->field, "%s", field >= 0 ? field_names[field] : fname);
    }
    lg__err_where(r->err, r->name, r->line);
  }
  return rc;
}

/* Splits the line's object into fields. */
static int scan_line(reader_t *r) {
  const char *s = r->s;
  size_t i = 0, n = r->n;
  if (++r->gen == 0) { /* after 4 billion lines, start over cleanly */
    memset(r->f, 0, sizeof r->f);
    memset(r->str_gen, 0, sizeof r->str_gen);
    r->gen = 1;
  }
  r->strs.len = 0;
  r->fmask = 0;
  r->has_fp = false;
  i = lg__json_ws_end(s, i, n);
  if (i >= n || s[i] != '{')
    return rerr(r, LG_ETRACE, -1, (long)i, "an event is a JSON object%s", NULL);
  i++;
  i = lg__json_ws_end(s, i, n);
  if (i < n && s[i] == '}') {
    i++;
    goto tail;
  }
  for (;;) {
    i = lg__json_ws_end(s, i, n);
    if (i >= n || s[i] != '"') return rerr(r, LG_EPARSE, -1, (long)i, "expected a string key%s", NULL);
    size_t ks = i + 1, ke;
    if (value_end(r, i, &ke)) return r->err ? r->err->code : LG_EPARSE;
    size_t klen = ke - ks - 1;
    bool plain = memchr(s + ks, '\\', klen) == NULL;
    i = ke;
    i = lg__json_ws_end(s, i, n);
    if (i >= n || s[i] != ':') return rerr(r, LG_EPARSE, -1, (long)i, "expected ':' after a key%s", NULL);
    i++;
    i = lg__json_ws_end(s, i, n);
    int fid = plain ? field_id(s + ks, klen) : -1;
    size_t vs = i, ve;
    /* A result's value is only found here; the deciding side validates it
     * (see apply), which balances the two threads of a large replay. */
    if (fid == F_ARGS || fid == F_WORLD || fid < 0) {
      /* Values the canonicaliser reads anyway: it validates them and says
       * where they end in the same pass. Arguments are fingerprinted right
       * here when the tool is already known (it usually comes first). */
      const lg__toolpol_t *select = NULL;
      const char *tool = NULL;
      bool fingerprint = fid == F_ARGS && r->km && i < n && s[i] == '{' && HAS(r, F_TOOL); /* i == n: no value */
      if (fingerprint) {
        int rc = get_str(r, F_TOOL, &tool);
        if (rc) return rc;
        select = lg__canon_select(r->policy, tool);
      }
      size_t used;
      int rc = lg__canon_prefix(r->canon, s + i, n - i, select, &used, r->err);
      if (rc) {
        char kname[64];
        snprintf(kname, sizeof kname, "%.*s", (int)(klen < 60 ? klen : 60), s + ks);
        if (r->err) {
          r->err->offset = r->err->offset >= 0 ? r->err->offset + (long)i : (long)i;
          snprintf(r->err->field, sizeof r->err->field, "%s", kname);
        }
        lg__err_where(r->err, r->name, r->line);
        return rc;
      }
      ve = i + used;
      if (fingerprint) {
        size_t kl;
        const char *km = lg__canon_output(r->canon, &kl);
        r->km->len = 0;
        if (lg__buf_append(r->km, km, kl))
          return rerr(r, LG_ENOMEM, F_ARGS, -1, "out of memory%s", NULL);
        r->has_fp = true;
      }
    } else if (value_end(r, i, &ve)) {
      return r->err ? r->err->code : LG_EPARSE;
    }
    if (fid >= 0) {
      if (HAS(r, fid))
        return rerr(r, LG_EDUPKEY, fid, (long)(ks - 1), "the field appears twice%s", NULL);
      r->f[fid] = (span_t){vs, ve, r->gen};
      r->fmask |= 1u << fid;
    }
    i = ve;
    i = lg__json_ws_end(s, i, n);
    if (i < n && s[i] == ',') {
      i++;
      continue;
    }
    if (i < n && s[i] == '}') {
      i++;
      break;
    }
    return rerr(r, LG_EPARSE, -1, (long)i, "expected ',' or '}'%s", NULL);
  }
tail:
  i = lg__json_ws_end(s, i, n);
  if (i != n) return rerr(r, LG_EPARSE, -1, (long)i, "unexpected data after the event object%s", NULL);
  return 0;
}

/* JSON type letter of a field's value. */
static char kind(const reader_t *r, int f) {
  char c = r->s[r->f[f].a];
  if (c == '-' || (c >= '0' && c <= '9')) return '0';
  return c;
}

static const char *kind_name(char k) {
  switch (k) {
  case '"': return "a string";
  case '{': return "an object";
  case '[': return "an array";
  case '0': return "a number";
  case 't':
  case 'f': return "a boolean";
  case 'n': return "null";
  }
  return "not JSON";
}

static int wrong_type(reader_t *r, int f, const char *want) {
  char msg[128];
  snprintf(msg, sizeof msg, "expected %s, got %s", want, kind_name(kind(r, f)));
  return rerr(r, LG_ETRACE, f, (long)r->f[f].a, "%s", msg);
}

/* A string field, decoded, or NULL when absent. Stays valid for the line. */
static int get_str(reader_t *r, int f, const char **out) {
  *out = NULL;
  if (r->str_gen[f] == r->gen) {
    *out = r->str[f];
    return 0;
  }
  if (!HAS(r, f)) return 0;
  if (kind(r, f) != '"') return wrong_type(r, f, "a string");
  span_t sp = r->f[f];
  const char *v = r->s + sp.a + 1;
  size_t vl = sp.b - sp.a - 2;
  bool simple = true;
  for (size_t k = 0; k < vl; k++) {
    unsigned char ch = (unsigned char)v[k];
    if (ch == '\\' || ch < 0x20 || ch >= 0x80) {
      simple = false;
      break;
    }
  }
  /* Decoded strings are never longer than their JSON text: room for all
   * of the line's is reserved with the first, so none of them moves. */
  if (r->strs.len == 0 && lg__buf_reserve(&r->strs, r->n + 2 * F__COUNT))
    return rerr(r, LG_ENOMEM, f, -1, "out of memory%s", NULL);
  size_t off = r->strs.len;
  if (simple) {
    if (lg__buf_append(&r->strs, v, vl) || lg__buf_putc(&r->strs, 0))
      return rerr(r, LG_ENOMEM, f, -1, "out of memory%s", NULL);
  } else {
    /* Validate and decode through the canonicaliser: its output keeps only
     * a few escapes (quote, backslash, controls, lone surrogates). */
    int rc = validate(r, f, NULL, sp);
    if (rc) return rc;
    const char *c;
    size_t cl;
    lg_canon_json(r->canon, r->s + sp.a, sp.b - sp.a, &c, &cl, NULL);
    for (size_t k = 1; k + 1 < cl; k++) {
      char ch = c[k];
      if (ch == '\\') {
        char e = c[++k];
        ch = e == 'b' ? '\b' : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e;
        if (e == 'u') { /* \u00XX control or a lone surrogate: keep 0xXX or drop */
          unsigned v4 = (unsigned)strtoul((char[]){c[k + 1], c[k + 2], c[k + 3], c[k + 4], 0}, NULL, 16);
          k += 4;
          if (v4 >= 0x80) continue;
          ch = (char)v4;
        }
      }
      if (lg__buf_putc(&r->strs, ch)) return rerr(r, LG_ENOMEM, f, -1, "out of memory%s", NULL);
    }
    if (lg__buf_putc(&r->strs, 0)) return rerr(r, LG_ENOMEM, f, -1, "out of memory%s", NULL);
  }
  r->str[f] = *out = r->strs.data + off;
  r->str_gen[f] = r->gen;
  return 0;
}

/* strtod of a JSON number's whole text, however long: a number of many
 * digits is valid JSON, and its text cut short would be another number
 * (1.000...0e9 read as 1). 0, or LG_ENOMEM. */
static int number_of(const char *v, size_t len, double *out) {
  char tmp[128], *t = len < sizeof tmp ? tmp : lg__malloc(len + 1);
  if (!t) return LG_ENOMEM;
  memcpy(t, v, len);
  t[len] = 0;
  *out = strtod(t, NULL);
  if (t != tmp) lg__free(t);
  return 0;
}

/* An integer field; *present says whether it was there. */
static int get_int(reader_t *r, int f, int64_t *out, bool *present) {
  if (present) *present = false;
  if (!HAS(r, f)) return 0;
  if (kind(r, f) != '0') return wrong_type(r, f, "a whole number");
  span_t sp = r->f[f];
  const char *v = r->s + sp.a;
  size_t len = sp.b - sp.a, k = 0;
  bool neg = v[0] == '-';
  if (neg) k++;
  uint64_t acc = 0;
  /* A leading zero ("01") is not JSON: the validator below says so. */
  bool plain = k < len && !(v[k] == '0' && len - k > 1);
  const uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; plain && k < len; k++) {
    if (v[k] < '0' || v[k] > '9') {
      plain = false;
      break;
    }
    uint64_t digit = (uint64_t)(v[k] - '0');
    if (acc > (limit - digit) / 10) /* acc * 10 + digit would not fit */
      return rerr(r, LG_ETRACE, f, (long)sp.a, "number out of range%s", NULL);
    acc = acc * 10 + digit;
  }
  if (!plain) { /* 1.0, 1e3: fine when whole */
    int rc = validate(r, f, NULL, sp);
    if (rc) return rc;
    double d;
    if (number_of(v, len, &d)) return rerr(r, LG_ENOMEM, f, (long)sp.a, "out of memory%s", NULL);
    if (d != floor(d) || fabs(d) > 9.0e18) return wrong_type(r, f, "a whole number");
    *out = (int64_t)d;
  } else {
    *out = !neg ? (int64_t)acc : acc > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)acc;
  }
  if (present) *present = true;
  return 0;
}

static int get_num(reader_t *r, int f, double *out, bool *present) {
  *present = false;
  if (!HAS(r, f)) return 0;
  if (kind(r, f) != '0') return wrong_type(r, f, "a number");
  int rc = validate(r, f, NULL, r->f[f]);
  if (rc) return rc;
  if (number_of(r->s + r->f[f].a, r->f[f].b - r->f[f].a, out))
    return rerr(r, LG_ENOMEM, f, (long)r->f[f].a, "out of memory%s", NULL);
  *present = true;
  return 0;
}

static int get_bool(reader_t *r, int f, int *out) {
  *out = -1;
  if (!HAS(r, f)) return 0;
  span_t sp = r->f[f];
  if (sp.b - sp.a == 4 && !memcmp(r->s + sp.a, "true", 4)) *out = 1;
  else if (sp.b - sp.a == 5 && !memcmp(r->s + sp.a, "false", 5)) *out = 0;
  else return wrong_type(r, f, "true or false");
  return 0;
}

/* A USD amount read by get_num into nano-USD (-1 when absent). */
static int usd_nusd(reader_t *r, int f, double usd, bool present, int64_t *nusd) {
  *nusd = -1;
  if (!present) return 0;
  /* up to 1e9 inclusive: what the server takes (http-api: "at most 1e9
   * USD"), so that every trace it writes replays */
  if (!(usd >= 0 && usd <= 1e9) || lg__usd_to_units(usd, LG__USD_NANO, nusd))
    return rerr(r, LG_ETRACE, f, (long)r->f[f].a, "must be a non-negative USD amount of at most 1e9%s", NULL);
  return 0;
}

static int need_object(reader_t *r, int f, bool required) {
  if (!HAS(r, f)) {
    if (required) return rerr(r, LG_ETRACE, f, -1, "this field is required%s", NULL);
    return 0;
  }
  if (kind(r, f) != '{') return wrong_type(r, f, "an object");
  return 0;
}

/* ------------------------------------------------------------------ */
/* Events between the reading side and the deciding side. scan() splits  */
/* a line into field spans and canonicalises its arguments (a scanned_t); */
/* parse() reads the spans into typed fields (an ev_t); apply() gives the */
/* event to the engine. On a large trace scan() runs in a reader thread   */
/* and the rest in the deciding thread (see the pipeline below), which    */
/* splits the work about evenly. Only a scanned_t crosses between the     */
/* cores: the line, its spans (into the trace buffer, which outlives the  */
/* replay) and the key material, in a slot the reader alone writes; the   */
/* deciding side parses into its own ev_t, so that no cache line of a     */
/* slot is written from both cores.                                       */

typedef enum ev_kind { EV_SKIP = 0, EV_LINE, EV_EVENT, EV_ERROR } ev_kind_t;

typedef struct scanned {
  ev_kind_t kind;          /* EV_SKIP, EV_LINE or EV_ERROR */
  long line;
  const char *s;           /* the line */
  size_t n;
  uint32_t fmask;          /* bit f: field f is on the line, at f[f] */
  struct { uint32_t a, b; } f[F__COUNT]; /* offsets in the line */
  bool has_km;             /* call: key material computed with the policy */
  lg__buf_t km;
  lg_policy_t *policy;     /* run: the trace's own policy (a reference) */
  int policy_rc;           /* run: the policy was rejected, as said in err */
  int rc;                  /* EV_ERROR: the error */
  /* EV_ERROR, and policy_rc: the reading side's error. It stops reading
   * after one, so the error stays as it is; a pointer keeps the slot
   * small (an lg_error_t is 900 bytes). */
  const lg_error_t *err;
} scanned_t;

typedef struct ev {
  ev_kind_t kind;          /* EV_SKIP or EV_EVENT */
  const scanned_t *sc;     /* the line it was parsed from */
  /* Strings live in the deciding side's reader until the next event. */
  lg_event_type_t type;
  int64_t t_ms;
  const char *str[F__COUNT];
  uint32_t str_set;        /* bit f: str[f] is set */
  int64_t turn;            /* call (or -line when absent), model */
  bool has_pv;             /* run, result */
  int64_t pv;
  int64_t in, out, max, cost_nusd; /* model */
  const char *args;        /* call: the args span, or NULL */
  size_t args_len;
  size_t args_off;         /* where the args start in the line */
  lg_status_t status;      /* result */
  int64_t retry_after;
  int sec;
  const char *value;
  size_t value_len, value_off;
  lg_value_kind_t value_kind;
  const char *world;       /* state */
  size_t world_len, world_off;
  bool has_resv;           /* model: a later usage line settles it */
  int64_t resv;            /* usage: the reservation, 0 the oldest */
  int64_t requested_nusd;  /* budget */
  lg_reason_t stop_reason; /* stop */
} ev_t;

static void scanned_free(scanned_t *e) {
  lg_policy_free(e->policy);
  e->policy = NULL;
  lg__buf_free(&e->km);
}

static lg_event_type_t event_type(const char *t) {
  /* The common types first, by their first letter; the rest by name. */
  switch (t[0]) {
  case 'c':
    if (!strcmp(t, "call")) return LG_EV_CALL;
    break;
  case 'r':
    if (!strcmp(t, "result")) return LG_EV_RESULT;
    break;
  case 'm':
    if (!strcmp(t, "model")) return LG_EV_MODEL;
    break;
  }
  return lg_event_type_parse(t);
}

/* What the deciding side keeps from line to line. */
typedef struct parse_state {
  lg_policy_t *override;   /* --policy: replaces the trace's own */
  bool seen_event;         /* an event came already (a run must be first) */
  int64_t last_t;          /* t_ms of the previous event */
} parse_state_t;

/* Whether the scanned line is a run event. The raw bytes decide unless
 * the type holds an escape; a type that does not decode is parse()'s to
 * report. */
static bool is_run_line(reader_t *r) {
  if (!HAS(r, F_TYPE)) return false;
  const char *v = r->s + r->f[F_TYPE].a;
  size_t l = r->f[F_TYPE].b - r->f[F_TYPE].a;
  if (l == 5 && !memcmp(v, "\"run\"", 5)) return true;
  if (!memchr(v, '\\', l)) return false;
  const char *t;
  return get_str(r, F_TYPE, &t) == 0 && t && !strcmp(t, "run");
}

/* The reading side: splits the line r->s into e (EV_LINE). A run event's
 * own policy is parsed here too, since the loop keys of the calls that
 * follow depend on it; a policy that fails is kept in e and reported by
 * parse(), in its place among the line's checks. Returns 0, or an error
 * in r->err. */
static int scan(reader_t *r, const parse_state_t *ps, scanned_t *e) {
  e->kind = EV_SKIP;
  e->line = r->line;
  e->has_km = false;
  lg_policy_free(e->policy);
  e->policy = NULL;
  e->policy_rc = 0;
  r->km = &e->km;
  if (r->n > UINT32_MAX)
    return rerr(r, LG_ETRACE, -1, -1, "the line is longer than 4 GiB%s", NULL);
  int rc = scan_line(r);
  if (rc) return rc;
  if (r->has_fp) e->has_km = true;
  e->s = r->s;
  e->n = r->n;
  e->fmask = r->fmask;
  for (uint32_t m = r->fmask; m; m &= m - 1) {
    int f = __builtin_ctz(m);
    e->f[f].a = (uint32_t)r->f[f].a;
    e->f[f].b = (uint32_t)r->f[f].b;
  }
  e->kind = EV_LINE;
  if (!ps->override && HAS(r, F_POLICY) && kind(r, F_POLICY) == '{' && is_run_line(r)) {
    e->policy = lg_policy_parse(r->s + r->f[F_POLICY].a, r->f[F_POLICY].b - r->f[F_POLICY].a, r->name,
                                r->err);
    if (!e->policy) {
      /* LG_EPOLICY, or LG_ENOMEM: a valid policy is not reported bad. */
      e->policy_rc = r->err && r->err->code ? r->err->code : LG_EPOLICY;
      if (r->err) {
        lg__err_field_prefix(r->err, "policy");
        r->err->line = r->line;
        r->err->offset = -1;
        snprintf(r->err->source, sizeof r->err->source, "%s", r->name);
      }
      e->err = r->err;
      return 0;
    }
    r->policy = e->policy; /* loop keys of the following calls */
  }
  return 0;
}

/* String field f of the line into e->str[f], when there. */
static int keep_str(reader_t *r, ev_t *e, int f) {
  const char *v;
  int rc = get_str(r, f, &v);
  if (rc || !v) return rc;
  e->str[f] = v;
  e->str_set |= 1u << f;
  return 0;
}

/* The deciding side, one function per event type: each reads the fields
 * its type has from the line in r into e, and says what a line of that
 * type must hold. They return 0 or an error filled into r->err. */

static int parse_run(reader_t *r, const parse_state_t *ps, const scanned_t *sc, ev_t *e) {
  int rc;
  if (ps->seen_event)
    return rerr(r, LG_ETRACE, F_TYPE, -1, "a run event must come first in a trace%s", NULL);
  if ((rc = keep_str(r, e, F_RUN_ID)) || (rc = keep_str(r, e, F_GROUP)) ||
      (rc = get_int(r, F_PROGRESS_VERSION, &e->pv, &e->has_pv)) || (rc = need_object(r, F_POLICY, false)))
    return rc;
  if (!e->str[F_RUN_ID]) return rerr(r, LG_ETRACE, F_RUN_ID, -1, "a run event needs a run_id%s", NULL);
  if (sc->policy_rc) { /* the reading side parsed the policy */
    if (r->err && sc->err) *r->err = *sc->err;
    return sc->policy_rc;
  }
  return 0;
}

static int parse_model(reader_t *r, ev_t *e) {
  int rc;
  double cost = 0;
  bool has_cost;
  e->turn = 0;
  e->in = 0;
  e->out = e->max = -1;
  if ((rc = get_int(r, F_TURN, &e->turn, NULL)) || (rc = get_int(r, F_INPUT_TOKENS, &e->in, NULL)) ||
      (rc = get_int(r, F_OUTPUT_TOKENS, &e->out, NULL)) || (rc = get_int(r, F_MAX_TOKENS, &e->max, NULL)) ||
      (rc = get_num(r, F_COST, &cost, &has_cost)) || (rc = keep_str(r, e, F_MODEL)))
    return rc;
  if ((rc = usd_nusd(r, F_COST, cost, has_cost, &e->cost_nusd))) return rc;
  e->has_resv = HAS(r, F_RESERVATION);
  return get_int(r, F_RESERVATION, &e->resv, NULL);
}

static int parse_call(reader_t *r, ev_t *e) {
  int rc;
  bool has_turn;
  if ((rc = keep_str(r, e, F_TOOL)) || (rc = keep_str(r, e, F_CALL_ID)) ||
      (rc = keep_str(r, e, F_IDEMPOTENCY_KEY)) || (rc = keep_str(r, e, F_AGENT)) ||
      (rc = get_int(r, F_TURN, &e->turn, &has_turn)) || (rc = need_object(r, F_ARGS, false)))
    return rc;
  if (!e->str[F_TOOL]) return rerr(r, LG_ETRACE, F_TOOL, -1, "a call needs a tool%s", NULL);
  if (!has_turn) e->turn = -r->line; /* no turn: a turn of its own */
  e->args = HAS(r, F_ARGS) ? r->s + r->f[F_ARGS].a : NULL;
  e->args_len = HAS(r, F_ARGS) ? r->f[F_ARGS].b - r->f[F_ARGS].a : 0;
  e->args_off = HAS(r, F_ARGS) ? r->f[F_ARGS].a : 0;
  return 0;
}

/* Whether the JSON string at s[a..b) (quotes included) is blank: nothing
 * but white space, escaped or not, between its quotes — the same white
 * space as the server's test of a decoded string (space, tab, LF, CR). */
static bool blank_string(const char *s, size_t a, size_t b) {
  for (size_t i = a + 1; i + 1 < b; i++) {
    char ch = s[i];
    if (ch == ' ' || ch == '\t') continue;
    if (ch == '\\' && i + 2 < b && strchr("ntr", s[i + 1])) {
      i++;
      continue;
    }
    if (ch == '\\' && i + 6 < b && s[i + 1] == 'u' && !memcmp(s + i + 2, "00", 2)) {
      const char *h = s + i + 4;
      if (!memcmp(h, "20", 2) || !memcmp(h, "09", 2) || !memcmp(h, "0a", 2) || !memcmp(h, "0A", 2) ||
          !memcmp(h, "0d", 2) || !memcmp(h, "0D", 2)) {
        i += 5;
        continue;
      }
    }
    return false;
  }
  return true;
}

static int parse_result(reader_t *r, ev_t *e) {
  int rc;
  bool has;
  e->retry_after = -1;
  if ((rc = keep_str(r, e, F_STATUS)) || (rc = keep_str(r, e, F_CALL_ID)) ||
      (rc = keep_str(r, e, F_OPERATION_ID)) || (rc = get_int(r, F_PROGRESS_VERSION, &e->pv, &has)) ||
      (rc = get_int(r, F_RETRY_AFTER_MS, &e->retry_after, NULL)) ||
      (rc = get_bool(r, F_SIDE_EFFECT_COMMITTED, &e->sec)))
    return rc;
  e->has_pv = has;
  e->value_kind = LG_VALUE_ABSENT;
  e->value = NULL;
  e->value_len = 0;
  if (!HAS(r, F_VALUE)) return 0;
  span_t sp = r->f[F_VALUE];
  e->value = r->s + sp.a;
  e->value_len = sp.b - sp.a;
  e->value_off = sp.a;
  char k = kind(r, F_VALUE);
  e->value_kind = LG_VALUE_PRESENT;
  if (k == 'n') e->value_kind = LG_VALUE_NULL;
  else if (k == '"' && blank_string(r->s, sp.a, sp.b)) e->value_kind = LG_VALUE_BLANK;
  return 0;
}

static int parse_state(reader_t *r, ev_t *e) {
  int rc;
  if ((rc = need_object(r, F_WORLD, true))) return rc;
  e->world = r->s + r->f[F_WORLD].a;
  e->world_len = r->f[F_WORLD].b - r->f[F_WORLD].a;
  e->world_off = r->f[F_WORLD].a;
  return 0;
}

static int parse_text(reader_t *r, ev_t *e) {
  int rc;
  bool has_turn;
  if ((rc = keep_str(r, e, F_TEXT)) || (rc = keep_str(r, e, F_AGENT)) ||
      (rc = get_int(r, F_TURN, &e->turn, &has_turn)))
    return rc;
  if (!e->str[F_TEXT]) return rerr(r, LG_ETRACE, F_TEXT, -1, "a text event needs its text%s", NULL);
  if (!has_turn) e->turn = -r->line; /* no turn: a response of its own */
  return 0;
}

static int parse_budget(reader_t *r, ev_t *e) {
  int rc;
  double req = 0;
  bool has_req;
  if ((rc = keep_str(r, e, F_SCOPE)) || (rc = keep_str(r, e, F_LIMIT_SOURCE)) ||
      (rc = get_num(r, F_REQUESTED_USD, &req, &has_req)))
    return rc;
  return usd_nusd(r, F_REQUESTED_USD, req, has_req, &e->requested_nusd);
}

static int parse_usage(reader_t *r, ev_t *e) {
  int rc;
  double cost = 0;
  bool has_cost;
  e->resv = 0;
  e->in = e->out = 0;
  if ((rc = get_int(r, F_RESERVATION, &e->resv, NULL)) || (rc = get_int(r, F_INPUT_TOKENS, &e->in, NULL)) ||
      (rc = get_int(r, F_OUTPUT_TOKENS, &e->out, NULL)) || (rc = get_num(r, F_COST, &cost, &has_cost)) ||
      (rc = usd_nusd(r, F_COST, cost, has_cost, &e->cost_nusd)))
    return rc;
  if (e->resv < 0 || e->in < 0 || e->out < 0)
    return rerr(r, LG_ETRACE, e->resv < 0 ? F_RESERVATION : e->in < 0 ? F_INPUT_TOKENS : F_OUTPUT_TOKENS, -1,
                "must not be negative%s", NULL);
  return 0;
}

static int parse_stop(reader_t *r, ev_t *e) {
  int rc;
  if ((rc = keep_str(r, e, F_REASON)) || (rc = keep_str(r, e, F_NOTE))) return rc;
  const char *why = e->str[F_REASON];
  e->stop_reason = LG_R_NONE;
  for (int k = 1; why && k < LG_R__COUNT; k++)
    if (!strcmp(why, lg_reason_name((lg_reason_t)k))) e->stop_reason = (lg_reason_t)k;
  if (e->stop_reason == LG_R_NONE)
    return rerr(r, LG_ETRACE, F_REASON, -1, "a stop event needs one of the stop reasons%s", NULL);
  return 0;
}

static int parse_resume(reader_t *r, ev_t *e) {
  int rc;
  bool has;
  if ((rc = keep_str(r, e, F_NOTE)) || (rc = get_int(r, F_PROGRESS_VERSION, &e->pv, &has))) return rc;
  e->has_pv = has;
  return 0;
}

/* The deciding side: reads the fields of the scanned line e, through the
 * reader r (for decoding and messages), into e: what every line has (its
 * type, t_ms that never goes back), then its type's own fields. Returns 0
 * (e->kind says what it was), or an error filled into r->err. */
static int parse_line(reader_t *r, parse_state_t *ps, const scanned_t *sc, ev_t *e) {
  e->kind = EV_SKIP;
  e->sc = sc;
  for (uint32_t m = e->str_set; m; m &= m - 1) e->str[__builtin_ctz(m)] = NULL;
  e->str_set = 0;
  /* The line into r, as if r had scanned it. */
  r->s = sc->s;
  r->n = sc->n;
  r->line = sc->line;
  r->strs.len = 0;
  if (++r->gen == 0) {
    memset(r->f, 0, sizeof r->f);
    memset(r->str_gen, 0, sizeof r->str_gen);
    r->gen = 1;
  }
  for (uint32_t m = sc->fmask; m; m &= m - 1) {
    int f = __builtin_ctz(m);
    r->f[f] = (span_t){sc->f[f].a, sc->f[f].b, r->gen};
  }
  int rc;
  const char *type_s;
  if (!HAS(r, F_TYPE)) return rerr(r, LG_ETRACE, F_TYPE, -1, "every event needs a \"type\"%s", NULL);
  if ((rc = get_str(r, F_TYPE, &type_s))) return rc;
  lg_event_type_t type = event_type(type_s);
  if (!type) return 0; /* unknown types are ignored */
  e->type = type;
  e->t_ms = ps->last_t;
  bool has_t;
  if ((rc = get_int(r, F_T_MS, &e->t_ms, &has_t))) return rc;
  if (has_t && e->t_ms < ps->last_t)
    return rerr(r, LG_ETRACE, F_T_MS, (long)r->f[F_T_MS].a, "t_ms went backwards%s", NULL);
  ps->last_t = e->t_ms;
  switch (type) {
  case LG_EV_RUN: rc = parse_run(r, ps, sc, e); break;
  case LG_EV_MODEL: rc = parse_model(r, e); break;
  case LG_EV_CALL: rc = parse_call(r, e); break;
  case LG_EV_RESULT: rc = parse_result(r, e); break;
  case LG_EV_STATE: rc = parse_state(r, e); break;
  case LG_EV_HANDOFF:
    if (!(rc = keep_str(r, e, F_FROM))) rc = keep_str(r, e, F_TO);
    break;
  case LG_EV_CANCEL: rc = keep_str(r, e, F_REASON); break;
  case LG_EV_TEXT: rc = parse_text(r, e); break;
  case LG_EV_USER: rc = keep_str(r, e, F_TEXT); break;
  case LG_EV_BUDGET: rc = parse_budget(r, e); break;
  case LG_EV_USAGE: rc = parse_usage(r, e); break;
  case LG_EV_STOP: rc = parse_stop(r, e); break;
  case LG_EV_RESUME: rc = parse_resume(r, e); break;
  default: break;
  }
  if (rc) return rc;
  ps->seen_event = true;
  e->kind = EV_EVENT;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Applying events to the run.                                          */

#define SKIP_MAX 64

typedef struct replay {
  const char *name;
  lg_canon_t *canon;     /* the deciding side's canonicaliser */
  lg_policy_t *override;
  lg_replay_cb cb;
  void *ud;
  lg_error_t *err;
  lg_run_t *run;
  long stopped_line;
  int64_t after_stop;
  bool last_call_executed;
  bool any_call;
  char *skipped[SKIP_MAX]; /* ids of calls that did not execute */
  int nskip, skip_head;
  reader_t r;            /* parse(): decoded strings, messages */
  parse_state_t ps;
  ev_t ev;               /* the event being parsed and applied */
} replay_t;

static int ensure_run(replay_t *rp, long line, const char *run_id, const char *group, lg_policy_t *policy,
                      const int64_t *checkpoint) {
  if (rp->run) return 0;
  char *own = NULL;
  if (!run_id) { /* a trace without a run event: the run is named after the file */
    const char *base = strrchr(rp->name, '/');
    base = base ? base + 1 : rp->name;
    size_t bl = strlen(base);
    if (bl > 6 && !strcmp(base + bl - 6, ".jsonl")) bl -= 6;
    own = lg__strndup(base, bl ? bl : strlen(base));
    if (!own) return lg__err(rp->err, LG_ENOMEM, NULL, -1, "out of memory");
    run_id = *own ? own : "trace";
  }
  rp->run = lg_run_new(run_id, group, rp->override ? rp->override : policy, checkpoint, NULL, rp->err);
  lg__free(own);
  if (!rp->run) {
    lg__err_where(rp->err, rp->name, line);
    return rp->err ? rp->err->code : LG_ENOMEM;
  }
  return 0;
}

/* Returns 0 or LG_ENOMEM: a forgotten id would make its result look like
 * the answer to no call, and a sound trace would be reported as bad. */
static int remember_skip(replay_t *rp, const char *id) {
  char *c = lg__strdup(id);
  if (!c) return LG_ENOMEM;
  if (rp->nskip == SKIP_MAX) {
    lg__free(rp->skipped[rp->skip_head]);
    rp->skipped[rp->skip_head] = c;
    rp->skip_head = (rp->skip_head + 1) % SKIP_MAX;
  } else {
    rp->skipped[rp->nskip++] = c;
  }
  return 0;
}

static bool was_skipped(replay_t *rp, const char *id) {
  for (int i = 0; i < rp->nskip; i++)
    if (!strcmp(rp->skipped[i], id)) return true;
  return false;
}

/* The parsed line as the event every front end gives the engine. */
static void to_event(const ev_t *e, lg_event_t *out) {
  memset(out, 0, sizeof *out);
  out->type = e->type;
  out->t_ms = e->t_ms;
  switch (e->type) {
  case LG_EV_MODEL:
    out->u.model.m = (lg_model_call_t){e->str[F_MODEL], e->turn, e->in, e->max, e->out, e->cost_nusd, e->t_ms};
    out->u.model.settled = !e->has_resv;
    break;
  case LG_EV_CALL: {
    lg_call_t *c = &out->u.call;
    c->tool = e->str[F_TOOL];
    c->call_id = e->str[F_CALL_ID];
    c->idempotency_key = e->str[F_IDEMPOTENCY_KEY];
    c->agent = e->str[F_AGENT];
    c->turn = e->turn;
    c->args = e->args;
    c->args_len = e->args_len;
    break;
  }
  case LG_EV_RESULT: {
    lg_result_t *res = &out->u.result;
    const char *st = e->str[F_STATUS];
    res->call_id = e->str[F_CALL_ID];
    res->status = st ? lg_status_parse(st, strlen(st)) : LG_STATUS_INVALID;
    res->has_progress_version = e->has_pv;
    res->progress_version = e->pv;
    res->retry_after_ms = e->retry_after;
    res->side_effect_committed = e->sec < 0 ? 0 : e->sec ? 1 : -1; /* absent 0, false -1 */
    res->operation_id = e->str[F_OPERATION_ID];
    res->value_kind = e->value_kind;
    res->value = e->value;
    res->value_len = e->value_len;
    break;
  }
  case LG_EV_USAGE:
    out->u.usage.reservation = e->resv;
    out->u.usage.input_tokens = e->in;
    out->u.usage.output_tokens = e->out;
    out->u.usage.cost_nusd = e->cost_nusd;
    break;
  case LG_EV_STATE:
    out->u.state.world = e->world;
    out->u.state.len = e->world_len;
    break;
  case LG_EV_HANDOFF:
    out->u.handoff.from = e->str[F_FROM];
    out->u.handoff.to = e->str[F_TO];
    break;
  case LG_EV_CANCEL: out->u.cancel.reason = e->str[F_REASON]; break;
  case LG_EV_TEXT:
    out->u.text.turn = e->turn;
    out->u.text.text = e->str[F_TEXT];
    out->u.text.agent = e->str[F_AGENT];
    break;
  case LG_EV_USER: out->u.user.text = e->str[F_TEXT]; break;
  case LG_EV_BUDGET:
    out->u.budget.scope = e->str[F_SCOPE];
    out->u.budget.limit_source = e->str[F_LIMIT_SOURCE];
    out->u.budget.requested_nusd = e->requested_nusd;
    break;
  case LG_EV_STOP:
    out->u.stop.reason = e->stop_reason;
    out->u.stop.message = e->str[F_NOTE];
    break;
  case LG_EV_RESUME:
    out->u.resume.has_progress_version = e->has_pv;
    out->u.resume.progress_version = e->pv;
    out->u.resume.note = e->str[F_NOTE];
    break;
  default: break;
  }
}

/* Whether a result line answers a call that did not execute (skipped). */
static bool skipped_result(replay_t *rp, const ev_t *e) {
  const char *id = e->str[F_CALL_ID];
  if (!id) return rp->any_call && !rp->last_call_executed;
  /* An id that an executed call waiting for its result also has is that
   * call's result, as the engine takes it (a client may reuse a call id,
   * or name a call "c4" as the engine names its fourth): the server
   * applied it and wrote it, so replay must apply it too. */
  return !lg__run_awaits(rp->run, id) && was_skipped(rp, id);
}

/* Gives one parsed event to the run (through lg__run_apply, as every
 * front end does) and to the callback. */
static int apply(replay_t *rp, ev_t *e) {
  lg_error_t *err = rp->err;
  int rc;
  if (e->type == LG_EV_RUN)
    return ensure_run(rp, e->sc->line, e->str[F_RUN_ID], e->str[F_GROUP], e->sc->policy,
                      e->has_pv ? &e->pv : NULL);
  if ((rc = ensure_run(rp, e->sc->line, NULL, NULL, NULL, NULL))) return rc;
  if (e->type == LG_EV_RESULT && e->value) { /* the reader only found its end */
    const char *out;
    size_t ol;
    if ((rc = lg_canon_json(rp->canon, e->value, e->value_len, &out, &ol, err))) {
      if (err) {
        err->offset = err->offset >= 0 ? err->offset + (long)e->value_off : (long)e->value_off;
        snprintf(err->field, sizeof err->field, "value");
      }
      lg__err_where(err, rp->name, e->sc->line);
      return rc;
    }
  }
  /* After a stop the events are read, not acted on; a resume may end the
   * stop (one that cannot — the run is active, or its stop is not for a
   * change — is read and not acted on, as the server refuses it). */
  bool resume = e->type == LG_EV_RESUME;
  if (lg_run_stopped(rp->run) != resume) {
    rp->after_stop += resume ? 0 : 1;
    return 0;
  }
  lg_replay_event_t ev; /* the decision is filled by the engine */
  ev.trace = rp->name;
  ev.line = e->sc->line;
  ev.type = e->type;
  ev.tool = e->str[F_TOOL];
  ev.model = e->str[F_MODEL];
  ev.from = e->str[F_FROM];
  ev.to = e->str[F_TO];
  ev.acted = 1;
  ev.skipped = 0;
  lg_decision_t *d = &ev.decision;
  if (e->type == LG_EV_RESULT && skipped_result(rp, e)) {
    ev.acted = 0;
    ev.skipped = 1;
    return rp->cb ? rp->cb(rp->ud, &ev, NULL) : 0;
  }
  lg_event_t event;
  to_event(e, &event);
  char hex[LG_FP_HEX];
  const scanned_t *sc = e->sc;
  if (e->type == LG_EV_CALL && sc->has_km) { /* the reader canonicalised; the hash is done here */
    if (lg__canon_fp_of(rp->canon, event.u.call.tool, sc->km.data, sc->km.len, hex)) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      goto engine_error;
    }
    event.u.call.fingerprint = hex;
    event.u.call.key_material = sc->km.data;
    event.u.call.key_material_len = sc->km.len;
  }
  rc = lg__run_apply(rp->run, rp->canon, &event, sc->has_km, d, err);
  if (resume) {
    if (rc == LG_ESTATE) { /* refused: the run stays stopped */
      if (err) memset(err, 0, sizeof *err);
      rp->after_stop++;
      return 0;
    }
    if (!rc) rp->stopped_line = 0; /* a later stop is the run's end */
  }
  if (rc) {
    if (err && err->offset >= 0) {
      if (e->type == LG_EV_CALL && e->args && !strncmp(err->field, "args", 4))
        err->offset += (long)e->args_off; /* from the args to the line */
      else if (e->type == LG_EV_STATE)
        err->offset += (long)e->world_off;
    }
    goto engine_error;
  }
  if (e->type == LG_EV_CALL) {
    rp->any_call = true;
    rp->last_call_executed = d->action == LG_ACT_EXECUTE;
    if (d->action != LG_ACT_EXECUTE && d->call_id && remember_skip(rp, d->call_id)) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      goto engine_error;
    }
  }
  if (d->action == LG_ACT_STOP && !rp->stopped_line) rp->stopped_line = e->sc->line;
  return rp->cb ? rp->cb(rp->ud, &ev, NULL) : 0;
engine_error:
  lg__err_where(err, rp->name, e->sc->line);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Reading lines, in this thread or in a reader thread.                 */

/* The next line from *pos that is not blank or a comment; false at the
 * end. *s and *n are the whole line (offsets in messages count from it). */
static bool next_line(const char *buf, size_t len, size_t *pos, long *line, const char **s, size_t *n) {
  while (*pos < len) {
    size_t start = *pos;
    const char *nl = memchr(buf + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - buf) : len;
    (*line)++;
    *pos = end + 1;
    size_t a = start;
    a = lg__json_ws_end(buf, a, end);
    if (a < end && buf[a] != '#') {
      *s = buf + start;
      *n = end - start;
      return true;
    }
  }
  return false;
}

/* The reading side of a replay. */
typedef struct producer {
  reader_t r;
  parse_state_t ps;
  lg_policy_t *held;       /* a reference to the trace's policy, in r.policy */
  lg_error_t err;          /* the reader's own; copied into an EV_ERROR */
  const char *buf;
  size_t len, pos;
  long line;
} producer_t;

/* Scans the next line into e; false at the end of the buffer. An error
 * becomes an EV_ERROR event (and the end). */
static bool produce(producer_t *p, scanned_t *e) {
  const char *s;
  size_t n;
  for (;;) {
    if (!next_line(p->buf, p->len, &p->pos, &p->line, &s, &n)) return false;
    p->r.s = s;
    p->r.n = n;
    p->r.line = p->line;
    p->err.source[0] = 0; /* the rest is written with the error */
    p->err.line = 0;
    p->err.field[0] = 0;
    p->err.offset = -1;
    int rc = scan(&p->r, &p->ps, e);
    if (rc) {
      e->kind = EV_ERROR;
      e->rc = rc;
      e->err = &p->err;
      p->pos = p->len; /* nothing after an error */
      return true;
    }
    if (e->policy_rc) p->pos = p->len; /* parse() reports it; nothing after */
    if (e->policy) {
      lg_policy_free(p->held);
      p->held = lg_policy_ref(e->policy);
    }
    return true;
  }
}

/* The deciding side of one event from produce(). */
static int take(replay_t *rp, const scanned_t *sc) {
  if (sc->kind == EV_ERROR) {
    if (rp->err) *rp->err = *sc->err;
    return sc->rc;
  }
  int rc = parse_line(&rp->r, &rp->ps, sc, &rp->ev);
  if (rc || rp->ev.kind != EV_EVENT) return rc;
  return apply(rp, &rp->ev);
}

/* ------------------------------------------------------------------ */
/* The pipeline. On a large trace, a reader thread parses and            */
/* canonicalises lines while this thread decides: the two halves of the  */
/* work take about the same time, so a replay runs on two cores. Events  */
/* go through a ring of RING slots; each side publishes its position     */
/* every BATCH events, not every event, so the cache line that holds it  */
/* does not bounce between the cores.                                    */

#define RING 1024
#define BATCH 32
#define PIPELINE_MIN_BYTES (1u << 20) /* smaller traces: one thread */

typedef struct ring {
  scanned_t slot[RING];
  producer_t *p;
  size_t head;   /* events produced (atomic) */
  size_t tail;   /* events consumed (atomic) */
  int done;      /* the producer has published its last event (atomic) */
  int cancel;    /* the consumer stopped early (atomic) */
} ring_t;

static void relax(unsigned *spins) {
  if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else {
    sched_yield();
  }
}

static void *producer_main(void *arg) {
  ring_t *q = arg;
  size_t head = 0, tail = 0;
  for (;;) {
    unsigned spins = 0;
    while (head - tail >= RING) { /* full: wait for the consumer */
      if (__atomic_load_n(&q->cancel, __ATOMIC_ACQUIRE)) goto out;
      tail = __atomic_load_n(&q->tail, __ATOMIC_ACQUIRE);
      if (head - tail >= RING) {
        __atomic_store_n(&q->head, head, __ATOMIC_RELEASE);
        relax(&spins);
      }
    }
    scanned_t *e = &q->slot[head % RING];
    bool more = produce(q->p, e);
    if (!more) break;
    head++;
    if (head % BATCH == 0) __atomic_store_n(&q->head, head, __ATOMIC_RELEASE);
    if (e->kind == EV_ERROR) break;
  }
out:
  __atomic_store_n(&q->head, head, __ATOMIC_RELEASE);
  __atomic_store_n(&q->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Takes events from the ring and applies them. */
static int consume(replay_t *rp, ring_t *q) {
  size_t tail = 0, head = 0;
  int rc = 0;
  for (;;) {
    if (tail == head) {
      unsigned spins = 0;
      for (;;) {
        int done = __atomic_load_n(&q->done, __ATOMIC_ACQUIRE);
        head = __atomic_load_n(&q->head, __ATOMIC_ACQUIRE);
        if (head != tail || done) break;
        __atomic_store_n(&q->tail, tail, __ATOMIC_RELEASE);
        relax(&spins);
      }
      if (head == tail) break; /* done, and nothing left */
    }
    rc = take(rp, &q->slot[tail % RING]);
    tail++;
    if (tail % BATCH == 0) __atomic_store_n(&q->tail, tail, __ATOMIC_RELEASE);
    if (rc) break;
  }
  __atomic_store_n(&q->tail, tail, __ATOMIC_RELEASE);
  return rc;
}

int lg_replay_buffer(const char *name, const char *buf, size_t len, lg_policy_t *policy,
                     lg_replay_cb cb, void *ud, lg_error_t *err) {
  replay_t rp;
  memset(&rp, 0, sizeof rp);
  rp.name = name ? name : "<trace>";
  rp.err = err;
  rp.override = policy;
  rp.cb = cb;
  rp.ud = ud;
  producer_t *p = lg__calloc(1, sizeof *p);
  ring_t *q = NULL;
  scanned_t *one = NULL;
  int rc = 0;
  rp.canon = lg_canon_new();
  if (p) p->r.canon = lg_canon_new();
  if (!p || !rp.canon || !p->r.canon) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto done;
  }
  rp.r.name = rp.name;
  rp.r.canon = rp.canon;
  rp.r.err = err;
  rp.ps.override = policy;
  p->r.name = rp.name;
  p->r.err = &p->err;
  p->r.policy = policy;
  p->ps.override = policy;
  p->buf = buf;
  p->len = len;
  pthread_t th;
  bool threaded = false;
  /* Two threads pay off only on a large trace and a second core.
   * LOOPGUARD_REPLAY_THREADS=1 keeps everything on one (to compare). */
  const char *threads = getenv("LOOPGUARD_REPLAY_THREADS");
  bool two = sysconf(_SC_NPROCESSORS_ONLN) > 1 && !(threads && atoi(threads) == 1);
  if (two && len >= PIPELINE_MIN_BYTES && (q = lg__calloc(1, sizeof *q))) {
    q->p = p;
    threaded = pthread_create(&th, NULL, producer_main, q) == 0;
  }
  if (threaded) {
    rc = consume(&rp, q);
    __atomic_store_n(&q->cancel, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
  } else {
    if (!(one = lg__calloc(1, sizeof *one))) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      goto done;
    }
    while (!rc && produce(p, one)) rc = take(&rp, one);
  }
  if (rc) goto done;
  if ((rc = ensure_run(&rp, 0, NULL, NULL, NULL, NULL))) goto done; /* an empty trace */
  {
    lg_replay_summary_t sum;
    memset(&sum, 0, sizeof sum);
    lg_counters_t c;
    lg_run_counters(rp.run, &c);
    sum.trace = rp.name;
    sum.run_id = lg_run_id(rp.run);
    sum.terminal_reason = lg_run_terminal_reason(rp.run);
    sum.stopped_at_line = rp.stopped_line;
    sum.executed_calls = c.steps;
    sum.blocked_calls = c.blocked;
    sum.replayed_calls = c.replayed;
    sum.model_calls = c.model_calls;
    sum.cost_nusd = c.cost_nusd;
    sum.tokens = c.tokens;
    sum.events_after_stop = rp.after_stop;
    char *env = lg_run_envelope_json(rp.run);
    if (!env) {
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      goto done;
    }
    sum.envelope = env;
    if (cb) rc = cb(ud, NULL, &sum);
    lg__free(env);
  }
done:
  if (q) {
    for (size_t i = 0; i < RING; i++) scanned_free(&q->slot[i]);
    lg__free(q);
  }
  if (one) {
    scanned_free(one);
    lg__free(one);
  }
  if (p) {
    lg_canon_free(p->r.canon);
    lg__buf_free(&p->r.strs);
    lg_policy_free(p->held);
    lg__free(p);
  }
  lg_run_free(rp.run);
  lg_canon_free(rp.canon);
  lg__buf_free(&rp.r.strs);
  for (int i = 0; i < rp.nskip; i++) lg__free(rp.skipped[i]);
  return rc;
}

int lg_replay_file(const char *path, lg_policy_t *policy, lg_replay_cb cb, void *ud, lg_error_t *err) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    lg__err(err, LG_EIO, NULL, -1, "cannot open: %s", strerror(errno));
    lg__err_where(err, path, 0);
    return LG_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    /* A plain file: map it, rather than copy 60 MB through read(). */
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
      lg__err(err, LG_EIO, NULL, -1, "cannot map: %s", strerror(errno));
      lg__err_where(err, path, 0);
      return LG_EIO;
    }
    madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
    int rc = lg_replay_buffer(path, m, (size_t)st.st_size, policy, cb, ud, err);
    munmap(m, (size_t)st.st_size);
    return rc;
  }
  /* Anything else (a pipe, /dev/stdin, an empty file): read to the end. */
  lg__buf_t b = {0};
  for (;;) {
    if (lg__buf_reserve(&b, 65536)) {
      close(fd);
      lg__buf_free(&b);
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    }
    ssize_t n = read(fd, b.data + b.len, b.cap - b.len - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      lg__buf_free(&b);
      lg__err(err, LG_EIO, NULL, -1, "read error: %s", strerror(e));
      lg__err_where(err, path, 0);
      return LG_EIO;
    }
    if (n == 0) break;
    b.len += (size_t)n;
  }
  close(fd);
  int rc = lg_replay_buffer(path, b.data ? b.data : "", b.len, policy, cb, ud, err);
  lg__buf_free(&b);
  return rc;
}
