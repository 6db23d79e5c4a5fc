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
#include "../engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
  XX(TO, "to") XX(REASON, "reason")

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
  const lg_policy_t *policy; /* the run's, for loop keys; NULL before it */
  bool has_fp;        /* args were fingerprinted while scanning */
  char fp[LG_FP_HEX];
  lg__buf_t km;       /* their key material */
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
                         : -1;
  case 6:
    return IS("status")   ? F_STATUS
           : IS("run_id") ? F_RUN_ID
           : IS("policy") ? F_POLICY
           : IS("reason") ? F_REASON
                          : -1;
  case 7: return IS("call_id") ? F_CALL_ID : -1;
  case 10: return IS("max_tokens") ? F_MAX_TOKENS : -1;
  case 12: return IS("input_tokens") ? F_INPUT_TOKENS : IS("operation_id") ? F_OPERATION_ID : -1;
  case 13: return IS("output_tokens") ? F_OUTPUT_TOKENS : -1;
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

static bool ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; }

/* The end of the value at i (not validated: the canonicaliser does that). */
static int value_end(reader_t *r, size_t i, size_t *end) {
  const char *s = r->s;
  size_t n = r->n;
  if (i >= n) return rerr(r, LG_EPARSE, -1, (long)i, "unexpected end of line%s", NULL);
  char ch = s[i];
  if (ch == '"') {
    for (i++; i < n; i++) {
      if (s[i] == '\\') i++;
      else if (s[i] == '"') {
        *end = i + 1;
        return 0;
      }
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
  while (j < n && !ws(s[j]) && s[j] != ',' && s[j] != '}' && s[j] != ']') j++;
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
  r->has_fp = false;
  /* Decoded strings are never longer than their JSON text. */
  if (lg__buf_reserve(&r->strs, n + 2 * F__COUNT))
    return rerr(r, LG_ENOMEM, -1, -1, "out of memory%s", NULL);
  while (i < n && ws(s[i])) i++;
  if (i >= n || s[i] != '{')
    return rerr(r, LG_ETRACE, -1, (long)i, "an event is a JSON object%s", NULL);
  i++;
  while (i < n && ws(s[i])) i++;
  if (i < n && s[i] == '}') {
    i++;
    goto tail;
  }
  for (;;) {
    while (i < n && ws(s[i])) i++;
    if (i >= n || s[i] != '"') return rerr(r, LG_EPARSE, -1, (long)i, "expected a string key%s", NULL);
    size_t ks = i + 1, ke;
    if (value_end(r, i, &ke)) return r->err ? r->err->code : LG_EPARSE;
    size_t klen = ke - ks - 1;
    bool plain = memchr(s + ks, '\\', klen) == NULL;
    i = ke;
    while (i < n && ws(s[i])) i++;
    if (i >= n || s[i] != ':') return rerr(r, LG_EPARSE, -1, (long)i, "expected ':' after a key%s", NULL);
    i++;
    while (i < n && ws(s[i])) i++;
    int fid = plain ? field_id(s + ks, klen) : -1;
    size_t vs = i, ve;
    if (fid == F_ARGS || fid == F_VALUE || fid == F_WORLD || fid < 0) {
      /* Values the canonicaliser reads anyway: it validates them and says
       * where they end in the same pass. Arguments are fingerprinted right
       * here when the tool is already known (it usually comes first). */
      const lg__toolpol_t *select = NULL;
      const char *tool = NULL;
      bool fingerprint = fid == F_ARGS && s[i] == '{' && HAS(r, F_TOOL);
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
        r->km.len = 0;
        if (lg__buf_append(&r->km, km, kl) || lg__canon_fp(r->canon, tool, r->fp))
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
    }
    i = ve;
    while (i < n && ws(s[i])) i++;
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
  while (i < n && ws(s[i])) i++;
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

/* A string field already read by get_str (NULL when absent). */
static const char *str_of(reader_t *r, int f) { return r->str_gen[f] == r->gen ? r->str[f] : NULL; }

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
  bool plain = k < len;
  for (; k < len; k++) {
    if (v[k] < '0' || v[k] > '9') {
      plain = false;
      break;
    }
    if (acc > (UINT64_C(1) << 62)) return rerr(r, LG_ETRACE, f, (long)sp.a, "number out of range%s", NULL);
    acc = acc * 10 + (uint64_t)(v[k] - '0');
  }
  if (!plain) { /* 1.0, 1e3: fine when whole */
    int rc = validate(r, f, NULL, sp);
    if (rc) return rc;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(len < 63 ? len : 63), v);
    double d = strtod(tmp, NULL);
    if (d != floor(d) || fabs(d) > 9.0e18) return wrong_type(r, f, "a whole number");
    *out = (int64_t)d;
  } else {
    *out = neg ? -(int64_t)acc : (int64_t)acc;
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
  char tmp[128];
  size_t len = r->f[f].b - r->f[f].a;
  snprintf(tmp, sizeof tmp, "%.*s", (int)(len < 127 ? len : 127), r->s + r->f[f].a);
  *out = strtod(tmp, NULL);
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

static int need_object(reader_t *r, int f, bool required) {
  if (!HAS(r, f)) {
    if (required) return rerr(r, LG_ETRACE, f, -1, "this field is required%s", NULL);
    return 0;
  }
  if (kind(r, f) != '{') return wrong_type(r, f, "an object");
  return 0;
}

/* ------------------------------------------------------------------ */
/* Replay.                                                              */

#define SKIP_MAX 64

typedef struct replay {
  reader_t r;
  lg_policy_t *override;
  lg_replay_cb cb;
  void *ud;
  lg_run_t *run;
  bool seen_event;       /* an event other than `run` came already */
  long stopped_line;
  int64_t after_stop;
  bool last_call_executed;
  bool any_call;
  char *skipped[SKIP_MAX]; /* ids of calls that did not execute */
  int nskip, skip_head;
  char *run_id;          /* the name of a run without a run event */
} replay_t;

static int ensure_run(replay_t *rp, const char *run_id, const char *group, lg_policy_t *policy,
                      const int64_t *checkpoint) {
  if (rp->run) return 0;
  rp->run = lg_run_new(run_id, group, rp->override ? rp->override : policy, checkpoint, NULL, rp->r.err);
  if (!rp->run) {
    lg__err_where(rp->r.err, rp->r.name, rp->r.line);
    return rp->r.err ? rp->r.err->code : LG_ENOMEM;
  }
  rp->r.policy = lg_run_policy(rp->run);
  return 0;
}

static void remember_skip(replay_t *rp, const char *id) {
  char *c = lg__strdup(id);
  if (!c) return;
  if (rp->nskip == SKIP_MAX) {
    lg__free(rp->skipped[rp->skip_head]);
    rp->skipped[rp->skip_head] = c;
    rp->skip_head = (rp->skip_head + 1) % SKIP_MAX;
  } else {
    rp->skipped[rp->nskip++] = c;
  }
}

static bool was_skipped(replay_t *rp, const char *id) {
  for (int i = 0; i < rp->nskip; i++)
    if (!strcmp(rp->skipped[i], id)) return true;
  return false;
}

static lg_event_type_t event_type(const char *t) {
  static const char *names[] = {"run", "model", "call", "result", "state", "handoff", "cancel"};
  for (int i = 0; i < 7; i++)
    if (!strcmp(names[i], t)) return (lg_event_type_t)(i + 1);
  return (lg_event_type_t)0;
}

static int emit(replay_t *rp, lg_replay_event_t *ev) {
  return rp->cb ? rp->cb(rp->ud, ev, NULL) : 0;
}

/* One line of a trace. */
static int replay_line(replay_t *rp) {
  reader_t *r = &rp->r;
  int rc = scan_line(r);
  if (rc) return rc;
  const char *type_tok;
  if (!HAS(r, F_TYPE)) return rerr(r, LG_ETRACE, F_TYPE, -1, "every event needs a \"type\"%s", NULL);
  if ((rc = get_str(r, F_TYPE, &type_tok))) return rc;
  lg_event_type_t type = event_type(type_tok);
  if (!type) return 0; /* unknown types are ignored */
  int64_t t_ms = rp->run ? rp->run->c.last_t_ms : 0;
  bool has_t;
  if ((rc = get_int(r, F_T_MS, &t_ms, &has_t))) return rc;
  if (has_t && rp->run && t_ms < rp->run->c.last_t_ms)
    return rerr(r, LG_ETRACE, F_T_MS, (long)r->f[F_T_MS].a, "t_ms went backwards%s", NULL);

  lg_replay_event_t ev; /* the decision is filled by the engine */
  ev.trace = r->name;
  ev.line = r->line;
  ev.type = type;
  ev.tool = ev.model = ev.from = ev.to = NULL;
  ev.acted = ev.skipped = 0;
  bool stopped = rp->run && lg_run_stopped(rp->run);
  lg_decision_t *d = &ev.decision;
  lg_error_t *err = r->err;

  switch (type) {
  case LG_EV_RUN: {
    if (rp->seen_event || rp->run)
      return rerr(r, LG_ETRACE, F_TYPE, -1, "a run event must come first in a trace%s", NULL);
    const char *id, *group;
    int64_t pv;
    bool has_pv;
    if ((rc = get_str(r, F_RUN_ID, &id)) || (rc = get_str(r, F_GROUP, &group)) ||
        (rc = get_int(r, F_PROGRESS_VERSION, &pv, &has_pv)) || (rc = need_object(r, F_POLICY, false)))
      return rc;
    if (!id) return rerr(r, LG_ETRACE, F_RUN_ID, -1, "a run event needs a run_id%s", NULL);
    lg_policy_t *pol = NULL;
    if (HAS(r, F_POLICY) && !rp->override) {
      pol = lg_policy_parse(r->s + r->f[F_POLICY].a, r->f[F_POLICY].b - r->f[F_POLICY].a, r->name, err);
      if (!pol) {
        if (err) {
          lg__err_field_prefix(err, "policy");
          err->line = r->line;
          err->offset = -1;
          snprintf(err->source, sizeof err->source, "%s", r->name);
        }
        return LG_EPOLICY;
      }
    }
    rc = ensure_run(rp, id, group, pol, has_pv ? &pv : NULL);
    lg_policy_free(pol);
    return rc;
  }
  case LG_EV_MODEL: {
    int64_t turn = 0, in = 0, out = -1, max = -1;
    double cost = 0;
    bool has_cost;
    const char *model;
    if ((rc = get_int(r, F_TURN, &turn, NULL)) || (rc = get_int(r, F_INPUT_TOKENS, &in, NULL)) ||
        (rc = get_int(r, F_OUTPUT_TOKENS, &out, NULL)) || (rc = get_int(r, F_MAX_TOKENS, &max, NULL)) ||
        (rc = get_num(r, F_COST, &cost, &has_cost)) || (rc = get_str(r, F_MODEL, &model)))
      return rc;
    if (has_cost && !(cost >= 0 && cost < 1e9))
      return rerr(r, LG_ETRACE, F_COST, (long)r->f[F_COST].a, "cost must be a non-negative USD amount%s", NULL);
    ev.model = model;
    break;
  }
  case LG_EV_CALL: {
    const char *tool, *id, *key, *agent;
    int64_t turn = 0;
    if ((rc = get_str(r, F_TOOL, &tool)) || (rc = get_str(r, F_CALL_ID, &id)) ||
        (rc = get_str(r, F_IDEMPOTENCY_KEY, &key)) || (rc = get_str(r, F_AGENT, &agent)) ||
        (rc = get_int(r, F_TURN, &turn, NULL)) || (rc = need_object(r, F_ARGS, false)))
      return rc;
    if (!tool) return rerr(r, LG_ETRACE, F_TOOL, -1, "a call needs a tool%s", NULL);
    ev.tool = tool;
    break;
  }
  case LG_EV_RESULT: {
    const char *st, *id, *opid;
    int64_t v;
    int b;
    if ((rc = get_str(r, F_STATUS, &st)) || (rc = get_str(r, F_CALL_ID, &id)) ||
        (rc = get_str(r, F_OPERATION_ID, &opid)) || (rc = get_int(r, F_PROGRESS_VERSION, &v, NULL)) ||
        (rc = get_int(r, F_RETRY_AFTER_MS, &v, NULL)) || (rc = get_bool(r, F_SIDE_EFFECT_COMMITTED, &b)))
      return rc;
    break;
  }
  case LG_EV_STATE:
    if ((rc = need_object(r, F_WORLD, true))) return rc;
    break;
  case LG_EV_HANDOFF: {
    const char *from, *to;
    if ((rc = get_str(r, F_FROM, &from)) || (rc = get_str(r, F_TO, &to))) return rc;
    ev.from = from;
    ev.to = to;
    break;
  }
  case LG_EV_CANCEL: {
    const char *why;
    if ((rc = get_str(r, F_REASON, &why))) return rc;
    break;
  }
  default: break;
  }
  rp->seen_event = true;
  if (!rp->run) {
    /* A trace without a run event: the run is named after the file. */
    const char *base = strrchr(r->name, '/');
    base = base ? base + 1 : r->name;
    size_t bl = strlen(base);
    if (bl > 6 && !strcmp(base + bl - 6, ".jsonl")) bl -= 6;
    lg__free(rp->run_id);
    rp->run_id = lg__strndup(base, bl ? bl : 1);
    if (!rp->run_id) return rerr(r, LG_ENOMEM, -1, -1, "out of memory%s", NULL);
    if ((rc = ensure_run(rp, rp->run_id, NULL, NULL, NULL))) return rc;
  }
  if (stopped) {
    rp->after_stop++;
    return 0; /* read, not acted on */
  }
  ev.acted = 1;
  lg_run_t *run = rp->run;
  switch (type) {
  case LG_EV_MODEL: {
    lg_model_call_t m;
    memset(&m, 0, sizeof m);
    double cost = 0;
    bool has_cost;
    get_int(r, F_TURN, &m.turn, NULL);
    get_int(r, F_INPUT_TOKENS, &m.input_tokens, NULL);
    m.output_tokens = -1;
    m.max_tokens = -1;
    get_int(r, F_OUTPUT_TOKENS, &m.output_tokens, NULL);
    get_int(r, F_MAX_TOKENS, &m.max_tokens, NULL);
    get_num(r, F_COST, &cost, &has_cost);
    m.cost_nusd = has_cost ? (int64_t)llround(cost * 1e9) : -1;
    m.t_ms = t_ms;
    if ((rc = lg_run_model(run, &m, d, err))) goto engine_error;
    if (d->action == LG_ACT_EXECUTE)
      lg_run_usage(run, d->reservation, m.input_tokens, m.output_tokens, m.cost_nusd, t_ms);
    break;
  }
  case LG_EV_CALL: {
    lg_call_t c;
    memset(&c, 0, sizeof c);
    c.tool = str_of(r, F_TOOL);
    c.call_id = str_of(r, F_CALL_ID);
    c.idempotency_key = str_of(r, F_IDEMPOTENCY_KEY);
    c.agent = str_of(r, F_AGENT);
    bool has_turn;
    get_int(r, F_TURN, &c.turn, &has_turn);
    if (!has_turn) c.turn = -r->line; /* no turn: a turn of its own */
    if (HAS(r, F_ARGS)) {
      c.args = r->s + r->f[F_ARGS].a;
      c.args_len = r->f[F_ARGS].b - r->f[F_ARGS].a;
    }
    if (r->has_fp) {
      c.fingerprint = r->fp;
      c.key_material = r->km.data;
      c.key_material_len = r->km.len;
    }
    c.t_ms = t_ms;
    if ((rc = lg_run_before(run, r->canon, &c, d, err))) {
      if (err && HAS(r, F_ARGS) && !strncmp(err->field, "args", 4) && err->offset >= 0)
        err->offset += (long)r->f[F_ARGS].a;
      goto engine_error;
    }
    rp->any_call = true;
    rp->last_call_executed = d->action == LG_ACT_EXECUTE;
    if (d->action != LG_ACT_EXECUTE && d->call_id) remember_skip(rp, d->call_id);
    break;
  }
  case LG_EV_RESULT: {
    lg_result_t res;
    memset(&res, 0, sizeof res);
    res.call_id = str_of(r, F_CALL_ID);
    bool skip = res.call_id ? was_skipped(rp, res.call_id) : (rp->any_call && !rp->last_call_executed);
    if (skip) {
      ev.acted = 0;
      ev.skipped = 1;
      break;
    }
    const char *st = str_of(r, F_STATUS);
    res.status = st ? lg_status_parse(st, strlen(st)) : LG_STATUS_INVALID;
    bool has;
    get_int(r, F_PROGRESS_VERSION, &res.progress_version, &has);
    res.has_progress_version = has;
    res.retry_after_ms = -1;
    get_int(r, F_RETRY_AFTER_MS, &res.retry_after_ms, NULL);
    get_bool(r, F_SIDE_EFFECT_COMMITTED, &res.side_effect_committed);
    res.operation_id = str_of(r, F_OPERATION_ID);
    res.value_kind = LG_VALUE_ABSENT;
    if (HAS(r, F_VALUE)) {
      span_t sp = r->f[F_VALUE];
      res.value = r->s + sp.a;
      res.value_len = sp.b - sp.a;
      char k = kind(r, F_VALUE);
      res.value_kind = LG_VALUE_PRESENT;
      if (k == 'n') res.value_kind = LG_VALUE_NULL;
      else if (k == '"') {
        /* Blank: nothing but white space (escaped or not) between quotes. */
        bool blank = true;
        for (size_t i = sp.a + 1; i + 1 < sp.b && blank; i++) {
          char ch = r->s[i];
          if (ch == ' ' || ch == '\t') continue;
          if (ch == '\\' && i + 2 < sp.b && strchr("ntr", r->s[i + 1])) {
            i++;
            continue;
          }
          blank = false;
        }
        if (blank) res.value_kind = LG_VALUE_BLANK;
      }
    }
    res.t_ms = t_ms;
    if ((rc = lg_run_after(run, &res, d, err))) goto engine_error;
    break;
  }
  case LG_EV_STATE: {
    span_t sp = r->f[F_WORLD];
    if ((rc = lg_run_state(run, r->canon, r->s + sp.a, sp.b - sp.a, t_ms, d, err))) {
      if (err && err->offset >= 0) err->offset += (long)sp.a;
      goto engine_error;
    }
    break;
  }
  case LG_EV_HANDOFF:
    if ((rc = lg_run_handoff(run, ev.from, ev.to, t_ms, d, err))) goto engine_error;
    break;
  case LG_EV_CANCEL: {
    lg_run_cancel(run, str_of(r, F_REASON), t_ms, d);
    break;
  }
  default: break;
  }
  if (ev.acted && d->action == LG_ACT_STOP && !rp->stopped_line) rp->stopped_line = r->line;
  return emit(rp, &ev);
engine_error:
  lg__err_where(err, r->name, r->line);
  return rc;
}

int lg_replay_buffer(const char *name, const char *buf, size_t len, lg_policy_t *policy,
                     lg_replay_cb cb, void *ud, lg_error_t *err) {
  replay_t rp;
  memset(&rp, 0, sizeof rp);
  rp.r.name = name ? name : "<trace>";
  rp.r.err = err;
  rp.override = policy;
  rp.cb = cb;
  rp.ud = ud;
  rp.r.canon = lg_canon_new();
  rp.r.policy = policy;
  int rc = 0;
  if (!rp.r.canon) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto done;
  }
  size_t pos = 0;
  long line = 0;
  while (pos < len) {
    const char *nl = memchr(buf + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - buf) : len;
    line++;
    size_t a = pos;
    while (a < end && ws(buf[a])) a++;
    if (a < end && buf[a] != '#') {
      rp.r.s = buf + pos;
      rp.r.n = end - pos;
      rp.r.line = line;
      if ((rc = replay_line(&rp))) goto done;
    }
    pos = end + 1;
  }
  if (!rp.run) { /* an empty trace: still a run, that did nothing */
    const char *base = strrchr(rp.r.name, '/');
    if ((rc = ensure_run(&rp, base ? base + 1 : rp.r.name, NULL, NULL, NULL))) goto done;
  }
  {
    lg_replay_summary_t sum;
    memset(&sum, 0, sizeof sum);
    lg_counters_t c;
    lg_run_counters(rp.run, &c);
    sum.trace = rp.r.name;
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
  lg_run_free(rp.run);
  lg_canon_free(rp.r.canon);
  lg__buf_free(&rp.r.strs);
  lg__buf_free(&rp.r.km);
  for (int i = 0; i < rp.nskip; i++) lg__free(rp.skipped[i]);
  lg__free(rp.run_id);
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
