/*
 * store_trace.c — a run's trace-v1 file, from its rows in the store.
 *
 * The decisions write their events as trace lines in the same
 * transaction (lg__store_events_append); this turns those lines into the
 * file that `loopguard replay` reproduces the decisions from: a comment
 * naming the run, the run line (rebuilt from the run's row, with a
 * "# incomplete" comment, when the run is older than the store's traces),
 * the events with each internal "usage" line folded into its model line,
 * and a stop made outside the decisions (loopguard runs cancel) at the end
 * as the cancel it was. GET /v1/runs/{id}/trace and `loopguard runs trace`
 * both answer with it.
 */
#include "store.h"

#include <jansson.h>
#include <stdbool.h>

static void kv_str(lg__buf_t *b, const char *k, const char *v) {
  if (!v) return;
  lg__buf_printf(b, ",\"%s\":", k);
  lg__buf_json_str(b, v, strlen(v));
}

/* One line of a trace being assembled. */
typedef struct tline {
  const char *s;      /* the line (without its \n) */
  size_t n;
  char *own;          /* a rewritten line, or NULL */
  int drop;           /* left out of the answer */
  int settled;        /* a model line whose usage came */
} tline_t;

/* Folds each internal "usage" line into its model line. The model line
 * was written with the worst case the server decided on (the cost given,
 * output_tokens = max_tokens), so that replay holds what the server held;
 * once the usage is in, replay must count what the server counted after
 * it: the real cost, and input + output tokens. The model line keeps its
 * input_tokens and max_tokens (the decision depends on them), so its
 * output_tokens becomes (real input + real output) - declared input, and
 * its cost the real cost; the real figures are kept as "usage". This is
 * exact when no other model call of the run was decided in between (a
 * model call at a time, as agent loops do); otherwise the model line keeps
 * its worst case, replay then holds more than the server did, and the
 * usage line stays in the trace (replay ignores its type). A usage without
 * a reservation settles the oldest open one, as the engine does. */
static bool is_type(const tline_t *l, const char *prefix) {
  size_t n = strlen(prefix);
  return !l->drop && l->n > n && !memcmp(l->s, prefix, n);
}

static void fold_usage(tline_t *ln, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!is_type(&ln[i], "{\"type\":\"usage\"")) continue;
    json_t *u = json_loadb(ln[i].s, ln[i].n, 0, NULL);
    if (!u) continue;
    int64_t want = json_integer_value(json_object_get(u, "reservation")); /* 0: the oldest */
    size_t target = n;
    json_t *m = NULL;
    for (size_t k = 0; k < i && target == n; k++) {
      if (ln[k].settled || !is_type(&ln[k], "{\"type\":\"model\"")) continue;
      json_t *mk = json_loadb(ln[k].s, ln[k].n, 0, NULL);
      json_t *rv = mk ? json_object_get(mk, "reservation") : NULL;
      if (rv && (!want || json_integer_value(rv) == want)) {
        target = k;
        m = mk;
      } else {
        json_decref(mk);
      }
    }
    if (target == n) {
      json_decref(u);
      continue;
    }
    ln[target].settled = 1;
    bool alone = true; /* no other model call decided in between */
    for (size_t k = target + 1; k < i; k++)
      if (is_type(&ln[k], "{\"type\":\"model\"")) alone = false;
    if (alone) {
      int64_t in = json_integer_value(json_object_get(m, "input_tokens"));
      int64_t rin = json_integer_value(json_object_get(u, "input_tokens"));
      int64_t rout = json_integer_value(json_object_get(u, "output_tokens"));
      json_t *rc = json_object_get(u, "cost");
      int64_t out = rin + rout - in;
      if (out < 0) out = 0;
      json_object_set_new(m, "output_tokens", json_integer(out));
      if (rc) json_object_set(m, "cost", rc);
      else json_object_del(m, "cost");
      json_t *us = json_object();
      json_object_set_new(us, "input_tokens", json_integer(rin));
      json_object_set_new(us, "output_tokens", json_integer(rout));
      if (rc) json_object_set(us, "cost", rc);
      json_object_set_new(m, "usage", us);
      /* t_ms last, as everywhere else. */
      json_t *t = json_object_get(m, "t_ms");
      if (t) {
        json_incref(t);
        json_object_del(m, "t_ms");
        json_object_set_new(m, "t_ms", t);
      }
      /* 15 digits: costs are whole nano-USD below 1e6 USD, which 15
       * significant digits give back exactly (0.1, not 0.1000...01). */
      char *text = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
      if (text) {
        lg__free(ln[target].own);
        ln[target].own = text;
        ln[target].s = text;
        ln[target].n = strlen(text);
        ln[i].drop = 1;
      }
    }
    json_decref(m);
    json_decref(u);
  }
}

typedef struct replay_end {
  char *terminal;  /* the replay's terminal reason, or NULL */
} replay_end_t;

static int replay_cb(void *ud, const lg_replay_event_t *ev, const lg_replay_summary_t *sum) {
  (void)ev;
  replay_end_t *re = ud;
  if (sum && sum->terminal_reason) re->terminal = lg__strdup(sum->terminal_reason);
  return 0;
}

int lg_store_run_trace(lg_store_t *s, const char *run_id, char **text, size_t *len,
                       lg_error_t *err) {
  *text = NULL;
  if (len) *len = 0;
  lg_run_record_t rec = {0};
  int rc = lg_store_run_get(s, run_id, &rec, err);
  if (rc) return rc;
  lg__buf_t raw = {0}, out = {0};
  size_t nl = 0, cap = 0;
  tline_t *ln = NULL;
  if ((rc = lg__store_events_read(s, run_id, &raw, err))) goto done;
  /* Split into lines. */
  for (size_t p = 0; p < raw.len;) {
    const char *nlp = memchr(raw.data + p, '\n', raw.len - p);
    size_t end = nlp ? (size_t)(nlp - raw.data) : raw.len;
    if (nl == cap) {
      cap = cap ? cap * 2 : 32;
      tline_t *g = lg__realloc(ln, cap * sizeof *g);
      if (!g) {
        rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
        goto done;
      }
      ln = g;
    }
    ln[nl++] = (tline_t){raw.data + p, end - p, NULL, 0, 0};
    p = end + 1;
  }
  lg__json_begin();
  fold_usage(ln, nl);
  /* A run created before the store kept traces (schema 5) has no run line
   * and misses the events decided before the upgrade. */
  int has_run = nl && ln[0].n > 13 && !memcmp(ln[0].s, "{\"type\":\"run\"", 13);
  lg__buf_puts(&out, "# loopguard trace-v1 of run ");
  for (const char *p = run_id; *p; p++) lg__buf_putc(&out, *p == '\n' ? ' ' : *p);
  lg__buf_putc(&out, '\n');
  if (!has_run) { /* the run line, from the store */
    lg__buf_puts(&out, "# incomplete: this run was created before its store kept traces (schema "
                       "version 5), so the events decided before the upgrade are missing; "
                       "replaying this file may not reproduce every decision\n");
    lg__buf_puts(&out, "{\"type\":\"run\",\"run_id\":");
    lg__buf_json_str(&out, rec.run_id, strlen(rec.run_id));
    kv_str(&out, "group", rec.group);
    lg__buf_printf(&out, ",\"policy\":%s}\n", rec.policy_json ? rec.policy_json : "{}");
  }
  for (size_t i = 0; i < nl; i++) {
    if (ln[i].drop) continue;
    lg__buf_append(&out, ln[i].s, ln[i].n);
    lg__buf_putc(&out, '\n');
  }
  /* A stop made outside the decisions (loopguard runs cancel, which
   * writes the store directly) has no line: say it at the end, as the
   * cancel it was, when the replay does not already stop. */
  if (rec.stopped && !out.oom) {
    replay_end_t re = {NULL};
    lg_error_t re_err = {0};
    lg_replay_buffer(run_id, out.data, out.len, NULL, replay_cb, &re, &re_err);
    if (!re.terminal) {
      json_t *env = rec.envelope_json ? json_loads(rec.envelope_json, 0, NULL) : NULL;
      const char *guard = env ? json_string_value(json_object_get(env, "guard")) : NULL;
      json_t *at = env ? json_object_get(env, "stopped_at_ms") : NULL;
      if (guard && !strcmp(guard, "kill_switch")) {
        lg__buf_puts(&out, "{\"type\":\"cancel\"");
        kv_str(&out, "reason", rec.terminal_reason);
        if (json_is_integer(at))
          lg__buf_printf(&out, ",\"t_ms\":%lld", (long long)json_integer_value(at));
        lg__buf_puts(&out, "}\n");
      } else {
        lg__buf_puts(&out, "# the run stopped outside this trace: ");
        lg__buf_puts(&out, rec.terminal_reason ? rec.terminal_reason : "?");
        lg__buf_putc(&out, '\n');
      }
      json_decref(env);
    }
    lg__free(re.terminal);
  }
  if (out.oom || lg__json_oom()) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto done;
  }
  if (len) *len = out.len;
  *text = lg__buf_steal(&out, NULL);
  if (!*text) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
done:
  for (size_t i = 0; i < nl; i++) lg__free(ln[i].own);
  lg__free(ln);
  lg__buf_free(&raw);
  lg__buf_free(&out);
  lg_run_record_clear(&rec);
  return rc;
}
