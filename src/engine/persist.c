/*
 * persist.c — a run's whole state as bytes, and back, so that a store can
 * save it after every decision and a restarted server continues exactly
 * where it was. The format is private to the library but versioned: a blob
 * starts with "LGR" and a format number, then every field in a fixed order,
 * integers as 8 little-endian bytes, strings as a 4-byte length (all ones
 * for NULL) and their bytes. The policy is not in the blob: the store keeps
 * it beside the state as policy JSON.
 *
 * Format 2 appends the state of the text, episode, compaction, block-streak
 * and cascade guards after format 1's fields; a format 1 blob still loads
 * (those guards then start from nothing, as they would have in the release
 * that wrote it).
 */
#include "engine.h"

#include <endian.h>

#define FORMAT 2
#define FORMAT_MIN 1 /* the oldest format that still loads */

typedef struct wr {
  lg__buf_t b;
} wr_t;

/* Saving is on the server's decision path (every decision saves its run):
 * the buffer is sized once up front and an integer is a store, not a call. */
static inline void w64(wr_t *w, int64_t v) {
  lg__buf_t *b = &w->b;
  if (b->len + 9 > b->cap && lg__buf_reserve(b, 8)) return;
  uint64_t le = htole64((uint64_t)v);
  memcpy(b->data + b->len, &le, 8);
  b->len += 8;
}
static void wstr(wr_t *w, const char *s) {
  uint32_t n = s ? (uint32_t)strlen(s) : 0xFFFFFFFFu;
  uint8_t x[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  lg__buf_append(&w->b, x, 4);
  if (s) lg__buf_append(&w->b, s, n);
}
static void wbytes(wr_t *w, const void *p, size_t n) { lg__buf_append(&w->b, p, n); }
static void w32s(wr_t *w, const uint32_t *v, int n) {
  for (int i = 0; i < n; i++) {
    uint8_t x[4] = {(uint8_t)v[i], (uint8_t)(v[i] >> 8), (uint8_t)(v[i] >> 16),
                    (uint8_t)(v[i] >> 24)};
    lg__buf_append(&w->b, x, 4);
  }
}

/* Format 2's fields: the text detector, streaks and the cascade. */
static void save_v2(wr_t *w, const lg_run_t *run) {
  const lg__text_t *x = &run->text;
  w64(w, run->block_streak);
  w64(w, run->compactions);
  w64(w, x->open);
  w64(w, x->turn);
  w64(w, x->looped);
  w64(w, x->line);
  w64(w, x->fence);
  w64(w, x->head_len);
  w64(w, x->indent);
  wbytes(w, x->head, LG__LINE_HEAD);
  uint32_t cur[4] = {x->word, x->word_len, x->sent, x->sent_words};
  w32s(w, cur, 4);
  w32s(w, x->words, LG__TW_WORDS);
  w64(w, x->nwords);
  w64(w, x->whead);
  w32s(w, x->sents, LG__TW_SENTS);
  w32s(w, x->sent_nw, LG__TW_SENTS);
  w64(w, x->nsents);
  w64(w, x->shead);
  w64(w, (int64_t)x->mono);
  w64(w, x->mono_len);
  w64(w, x->mono_space);
  w64(w, x->mono_void);
  w64(w, run->text_loops);
  w64(w, (int64_t)run->mono_ref);
  w64(w, run->mono_ref_len);
  w64(w, run->mono_run);
  w64(w, run->hidden);
  w64(w, run->hide_left);
  w64(w, run->offer_live);
  w64(w, run->escalate_left);
  w64(w, run->answer_kind);
  w64(w, run->answer_trunc);
  wstr(w, run->answer);
}

int lg_run_save(const lg_run_t *run, char **buf, size_t *len) {
  wr_t w = {{0}};
  /* Room for all but long strings: no growing while writing. */
  lg__buf_reserve(&w.b, 1024 + (size_t)run->win_cap * 16 + (size_t)run->ntried * 64 +
                            (size_t)run->ntools * 48 + (size_t)(run->npending + run->nops) * 96 +
                            (size_t)(run->nretry + run->nresv) * 24 + 1024);
  wbytes(&w, "LGR", 3);
  w64(&w, FORMAT);
  wstr(&w, run->run_id);
  wstr(&w, run->group);
  const int64_t *cv = (const int64_t *)&run->c;
  for (size_t i = 0; i < sizeof run->c / sizeof(int64_t); i++) w64(&w, cv[i]);
  w64(&w, (int64_t)run->seq);
  w64(&w, run->win_cap);
  w64(&w, run->win_len);
  w64(&w, run->win_head);
  for (int i = 0; i < run->win_cap; i++) {
    w64(&w, (int64_t)run->win[i].fp);
    w64(&w, run->win[i].turn);
  }
  w64(&w, run->has_best);
  w64(&w, run->best);
  w64(&w, run->np_count);
  w64(&w, run->has_world);
  w64(&w, (int64_t)run->world);
  w64(&w, run->world_same);
  w64(&w, run->ntools);
  for (int i = 0; i < run->ntools; i++) {
    wstr(&w, run->tools[i].name);
    w64(&w, run->tools[i].executed);
    w64(&w, run->tools[i].fail_streak);
  }
  w64(&w, run->ntried);
  for (int i = 0; i < run->ntried; i++) {
    const lg__tried_t *t = &run->tried[i];
    uint8_t fp[32]; /* the format keeps the 32 bytes, not their hex */
    for (int k = 0; k < 32; k++)
      fp[k] = (uint8_t)(lg__hex_value[(uint8_t)t->hex[2 * k]] << 4 | lg__hex_value[(uint8_t)t->hex[2 * k + 1]]);
    wbytes(&w, fp, 32);
    w64(&w, t->tool);
    w64(&w, t->count);
    w64(&w, t->last);
    w64(&w, (int64_t)t->seq);
  }
  w64(&w, run->npending);
  for (int i = 0; i < run->npending; i++) {
    wstr(&w, run->pending[i].call_id);
    wstr(&w, run->pending[i].key);
    w64(&w, (int64_t)run->pending[i].fp);
    w64(&w, run->pending[i].tool);
  }
  w64(&w, run->nretry);
  for (int i = 0; i < run->nretry; i++) {
    w64(&w, (int64_t)run->retry[i].fp);
    w64(&w, run->retry[i].not_before);
  }
  w64(&w, run->nops);
  for (int i = 0; i < run->nops; i++) {
    wstr(&w, run->ops[i].key);
    wstr(&w, run->ops[i].operation_id);
    w64(&w, run->ops[i].state);
  }
  w64(&w, run->nresv);
  for (int i = 0; i < run->nresv; i++) {
    w64(&w, run->resv[i].id);
    w64(&w, run->resv[i].cost);
    w64(&w, run->resv[i].tokens);
  }
  w64(&w, run->next_resv);
  w64(&w, run->held_cost);
  w64(&w, run->held_tokens);
  w64(&w, run->stopped);
  w64(&w, run->reason);
  wstr(&w, run->reason_text);
  wstr(&w, run->guard);
  w64(&w, run->next);
  w64(&w, run->alternatives);
  wstr(&w, run->stop_message);
  wstr(&w, run->refused_tool);
  wstr(&w, run->refused_call_id);
  wstr(&w, run->refused_km);
  wbytes(&w, run->refused_fp, LG_FP_HEX);
  w64(&w, run->refused_turn);
  w64(&w, run->stopped_at_ms);
  save_v2(&w, run);
  *buf = lg__buf_steal(&w.b, len);
  return *buf ? 0 : LG_ENOMEM;
}

/* ---- reading ---- */

typedef struct rd {
  const uint8_t *p;
  size_t n, i;
  int rc; /* first error */
} rd_t;

static int64_t r64(rd_t *r) {
  if (r->rc || r->n - r->i < 8) {
    r->rc = r->rc ? r->rc : LG_EINVAL;
    return 0;
  }
  uint64_t v = le64toh(lg__load64(r->p + r->i));
  r->i += 8;
  return (int64_t)v;
}
/* A count in [0, max]. */
static int rcount(rd_t *r, int64_t max) {
  int64_t v = r64(r);
  if (v < 0 || v > max) {
    r->rc = r->rc ? r->rc : LG_EINVAL;
    return 0;
  }
  return (int)v;
}
static char *rstr(rd_t *r) {
  if (r->rc || r->n - r->i < 4) {
    r->rc = r->rc ? r->rc : LG_EINVAL;
    return NULL;
  }
  uint32_t len = (uint32_t)r->p[r->i] | (uint32_t)r->p[r->i + 1] << 8 |
                 (uint32_t)r->p[r->i + 2] << 16 | (uint32_t)r->p[r->i + 3] << 24;
  r->i += 4;
  if (len == 0xFFFFFFFFu) return NULL;
  if (r->n - r->i < len) {
    r->rc = LG_EINVAL;
    return NULL;
  }
  char *s = lg__strndup((const char *)r->p + r->i, len);
  if (!s) r->rc = LG_ENOMEM;
  r->i += len;
  return s;
}
static void rbytes(rd_t *r, void *out, size_t n) {
  if (r->rc || r->n - r->i < n) {
    r->rc = r->rc ? r->rc : LG_EINVAL;
    memset(out, 0, n);
    return;
  }
  memcpy(out, r->p + r->i, n);
  r->i += n;
}

static void r32s(rd_t *r, uint32_t *v, int n) {
  for (int i = 0; i < n; i++) {
    uint8_t x[4];
    rbytes(r, x, 4);
    v[i] = (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
  }
}

/* Format 2's fields (see save_v2), each checked against its range. */
static void load_v2(rd_t *r, lg_run_t *run) {
  lg__text_t *x = &run->text;
  run->block_streak = r64(r);
  run->compactions = r64(r);
  x->open = r64(r) != 0;
  x->turn = r64(r);
  x->looped = r64(r) != 0;
  x->line = (uint8_t)rcount(r, LG__LINE_SKIP);
  x->fence = r64(r) != 0;
  x->head_len = (uint8_t)rcount(r, LG__LINE_HEAD - 1);
  x->indent = (uint8_t)rcount(r, 67);
  rbytes(r, x->head, LG__LINE_HEAD);
  uint32_t cur[4];
  r32s(r, cur, 4);
  x->word = cur[0];
  x->word_len = cur[1];
  x->sent = cur[2];
  x->sent_words = cur[3];
  r32s(r, x->words, LG__TW_WORDS);
  x->nwords = rcount(r, LG__TW_WORDS);
  x->whead = rcount(r, LG__TW_WORDS - 1);
  r32s(r, x->sents, LG__TW_SENTS);
  r32s(r, x->sent_nw, LG__TW_SENTS);
  x->nsents = rcount(r, LG__TW_SENTS);
  x->shead = rcount(r, LG__TW_SENTS - 1);
  x->mono = (uint64_t)r64(r);
  x->mono_len = r64(r);
  x->mono_space = r64(r) != 0;
  x->mono_void = r64(r) != 0;
  run->text_loops = r64(r);
  run->mono_ref = (uint64_t)r64(r);
  run->mono_ref_len = r64(r);
  run->mono_run = r64(r);
  int64_t h = r64(r); /* -1 (none) or an index into tools */
  if (h < -1 || h >= run->ntools) r->rc = r->rc ? r->rc : LG_EINVAL;
  run->hidden = r->rc ? -1 : (int)h;
  run->hide_left = r64(r);
  run->offer_live = r64(r) != 0;
  run->escalate_left = r64(r);
  run->answer_kind = (uint8_t)rcount(r, LG__ANS_PARTIAL);
  run->answer_trunc = r64(r) != 0;
  run->answer = rstr(r);
}

/* The tables of format 1: tools, tried keys, pending calls, retry waits,
 * operations, reservations; each count checked against its bound. */
static void load_tables(rd_t *r, lg_run_t *run) {
  int nt = rcount(r, 1 << 20);
  for (int i = 0; i < nt && !r->rc; i++) {
    char *name = rstr(r);
    if (!name) {
      r->rc = r->rc ? r->rc : LG_EINVAL;
      break;
    }
    int k = lg__run_tool(run, name);
    lg__free(name);
    if (k != i) {
      r->rc = k < 0 ? LG_ENOMEM : LG_EINVAL;
      break;
    }
    run->tools[k].executed = r64(r);
    run->tools[k].fail_streak = r64(r);
  }
  run->ntried = rcount(r, LG__TRIED_MAX);
  for (int i = 0; i < run->ntried && !r->rc; i++) {
    lg__tried_t *t = &run->tried[i];
    uint8_t fp[32];
    rbytes(r, fp, 32);
    char hex[LG_FP_HEX];
    lg__hex(fp, 32, hex);
    memcpy(t->hex, hex, 64); /* kept without its NUL */
    for (int k = 0; k < 8; k++) t->fp64 = (t->fp64 << 8) | fp[k];
    /* An index into tools: with no tools there is none (a max of -1 fails
     * every value), or after() would dereference an empty table. */
    t->tool = rcount(r, run->ntools - 1);
    t->count = (uint32_t)r64(r);
    t->last = (uint8_t)r64(r);
    t->seq = (uint64_t)r64(r);
  }
  int np = rcount(r, LG__PENDING_MAX);
  for (int i = 0; i < np && !r->rc; i++) {
    lg__pending_t *pc = &run->pending[run->npending++];
    pc->call_id = rstr(r);
    pc->key = rstr(r);
    pc->fp = (uint64_t)r64(r);
    pc->tool = rcount(r, run->ntools - 1);
    if (!pc->call_id) r->rc = r->rc ? r->rc : LG_EINVAL;
  }
  run->nretry = rcount(r, LG__RETRY_MAX);
  for (int i = 0; i < run->nretry && !r->rc; i++) {
    run->retry[i].fp = (uint64_t)r64(r);
    run->retry[i].not_before = r64(r);
  }
  int no = rcount(r, LG__OPS_MAX);
  for (int i = 0; i < no && !r->rc; i++) {
    lg__op_t *o = &run->ops[run->nops++];
    o->key = rstr(r);
    o->operation_id = rstr(r);
    o->state = (uint8_t)r64(r);
    if (!o->key) r->rc = r->rc ? r->rc : LG_EINVAL;
  }
  run->nresv = rcount(r, LG__RESV_MAX);
  for (int i = 0; i < run->nresv && !r->rc; i++) {
    run->resv[i].id = r64(r);
    run->resv[i].cost = r64(r);
    run->resv[i].tokens = r64(r);
  }
}

/* The static guard name matching a saved one (guards are static strings). */
static const char *guard_static(const char *g) {
  static const char *known[] = {"repeat",     "cycle",      "caps",         "no_progress",
                                "failure_streak", "retry",  "validation",   "status",
                                "ledger",     "kill_switch", "external",    "text",
                                "monologue",  "compaction", "block_streak", "cascade"};
  if (!g) return "";
  for (size_t i = 0; i < LG__ARRAY_LEN(known); i++)
    if (!strcmp(known[i], g)) return known[i];
  return "";
}

lg_run_t *lg_run_load(const char *buf, size_t len, lg_policy_t *policy, lg_ledger_t *ledger,
                      lg_error_t *err) {
  rd_t r = {(const uint8_t *)buf, len, 0, 0};
  char magic[3];
  rbytes(&r, magic, 3);
  int64_t format = r.rc ? 0 : r64(&r);
  if (r.rc || memcmp(magic, "LGR", 3) || format < FORMAT_MIN || format > FORMAT) {
    lg__err(err, LG_EINVAL, NULL, -1, "not a saved run, or a newer format");
    return NULL;
  }
  char *id = rstr(&r);
  char *group = rstr(&r);
  lg_run_t *run = (!r.rc && id) ? lg_run_new(id, group, policy, NULL, ledger, err) : NULL;
  lg__free(id);
  lg__free(group);
  if (!run) {
    if (!r.rc) return NULL; /* lg_run_new filled err */
    lg__err(err, r.rc, NULL, -1, r.rc == LG_ENOMEM ? "out of memory" : "saved run is truncated");
    return NULL;
  }
  int64_t *cv = (int64_t *)&run->c;
  for (size_t i = 0; i < sizeof run->c / sizeof(int64_t); i++) cv[i] = r64(&r);
  run->seq = (uint64_t)r64(&r);
  int cap = rcount(&r, 1000000);
  if (!r.rc && cap != run->win_cap) {
    lg__win_t *w = lg__calloc((size_t)(cap ? cap : 1), sizeof *w);
    if (!w) r.rc = LG_ENOMEM;
    else {
      lg__free(run->win);
      run->win = w;
      run->win_cap = cap ? cap : 1;
    }
  }
  run->win_len = rcount(&r, run->win_cap);
  run->win_head = rcount(&r, run->win_cap - 1);
  for (int i = 0; i < cap && !r.rc; i++) {
    run->win[i].fp = (uint64_t)r64(&r);
    run->win[i].turn = r64(&r);
  }
  run->has_best = r64(&r) != 0;
  run->best = r64(&r);
  run->np_count = r64(&r);
  run->has_world = r64(&r) != 0;
  run->world = (uint64_t)r64(&r);
  run->world_same = r64(&r);
  load_tables(&r, run);
  run->next_resv = r64(&r);
  run->held_cost = r64(&r);
  run->held_tokens = r64(&r);
  run->stopped = r64(&r) != 0;
  run->reason = (lg_reason_t)rcount(&r, LG_R__COUNT - 1);
  run->reason_text = rstr(&r);
  char *g = rstr(&r);
  run->guard = guard_static(g);
  lg__free(g);
  run->next = (lg_next_t)rcount(&r, LG_NEXT_RESUME_AFTER_CHANGE);
  run->alternatives = (unsigned)r64(&r);
  run->stop_message = rstr(&r);
  run->refused_tool = rstr(&r);
  run->refused_call_id = rstr(&r);
  run->refused_km = rstr(&r);
  rbytes(&r, run->refused_fp, LG_FP_HEX);
  run->refused_fp[LG_FP_HEX - 1] = 0;
  run->refused_turn = r64(&r);
  run->stopped_at_ms = r64(&r);
  if (format >= 2) load_v2(&r, run);
  if (!r.rc && r.i != r.n) r.rc = LG_EINVAL;
  /* Only a stop sets these: an active run that has them was not saved by
   * lg_run_save (and its next stop would leak them). */
  if (!r.rc && !run->stopped &&
      (run->reason != LG_R_NONE || run->reason_text || run->stop_message || run->answer))
    r.rc = LG_EINVAL;
  if (r.rc) {
    lg_run_free(run);
    lg__err(err, r.rc, NULL, -1,
            r.rc == LG_ENOMEM ? "out of memory" : "saved run is corrupt or truncated");
    return NULL;
  }
  return run;
}
