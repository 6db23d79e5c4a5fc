/*
 * persist.c — a run's whole state as bytes, and back, so that a store can
 * save it after every decision and a restarted server continues exactly
 * where it was. The format is private to the library but versioned: a blob
 * starts with "LGR" and a format number (8 little-endian bytes), then every
 * field in a fixed order. The policy is not in the blob: the store keeps it
 * beside the state as policy JSON.
 *
 * One table (FIELDS below) describes every field once: where it lives in
 * lg_run_t, its kind, its range and its value in a fresh run. Saving and
 * loading both walk it, so the two cannot drift apart. How a kind is
 * written depends on the format:
 *
 *   format 1, 2  integers as 8 little-endian bytes, strings as a 4-byte
 *                length (all ones for NULL) and their bytes, every field
 *                always there. Format 2 appended the text, episode,
 *                compaction, block-streak and cascade guards (SINCE2); a
 *                format 1 blob loads with those guards starting from
 *                nothing, as they would have in the release that wrote it.
 *   format 3     (the one written) integers as zigzag LEB128 varints, strings
 *                as a varint of length + 1 (0 for NULL), and a GATE byte
 *                before each group of fields that a run mostly leaves at
 *                their fresh values (its stop, the text detector, the
 *                cascade): 0 says the group is all fresh and not written.
 *                Hashes keep their fixed width in every format.
 *
 * A typical active run is a few hundred bytes in format 3 (about 1.5 KB in
 * format 2), which keeps a run's row within one database page: saving is
 * on the server's decision path (every decision saves its run).
 */
#include "engine.h"

#include <endian.h>

#define FORMAT 3
#define FORMAT_MIN 1 /* the oldest format that still loads */

/* ---- the field table ---- */

typedef enum kind {
  K_I64,    /* int64_t or uint64_t counter: 8 bytes / varint */
  K_INT,    /* int (or an enum of that size) */
  K_U32,    /* uint32_t or unsigned */
  K_U8,     /* uint8_t */
  K_BOOL,   /* bool: written 0 or 1, loaded as != 0 */
  K_H64,    /* uint64_t hash: always 8 bytes */
  K_H32,    /* uint32_t hash (or word count beside them): always 4 bytes */
  K_BYTES,  /* n raw bytes (a char array) */
  K_STR,    /* char *, NULL allowed */
  K_GUARD,  /* const char *guard: a string, loaded as the static name */
  K_FPHEX,  /* char[LG_FP_HEX] (hex or ""): 65 bytes (1, 2) / a string (3) */
  K_FP32,   /* char hex[64] and its uint64_t at aux: 32 bytes of digest */
  K_GATE,   /* format 3: 0, or 1 and the next n fields (0: all fresh) */
  K_SINCE2, /* the fields after this one are in format 2 and later */
  K_WINDOW, /* the repeat window: cap, len, head, cap entries */
  K_TOOLS,  /* the tool table: count, then each name and sub's fields */
  K_ARRAY   /* count (an int at aux) and that many elements of sub */
} kind_t;

enum {
  F_RANGE = 1, /* the value must be in [lo, hi] */
  F_TOOL = 2,  /* ... with hi the run's tool count - 1 (an index) */
  F_REQ = 4    /* a string that must not be NULL */
};

typedef struct field field_t;
struct field {
  uint8_t kind;
  uint8_t flags;
  uint16_t n;          /* consecutive values (scalars), bytes (K_BYTES),
                          fields covered (K_GATE), the bound (K_ARRAY) */
  uint32_t off;        /* offset in lg_run_t (or in an element of sub) */
  uint32_t aux;        /* K_ARRAY: the count's offset; K_FP32: the uint64_t's;
                          K_TOOLS, K_ARRAY: the element size */
  uint32_t aux2;
  int64_t lo, hi;      /* the range (F_RANGE) */
  int64_t fresh;       /* the value in a fresh run (GATE groups) */
  const field_t *sub;  /* K_TOOLS, K_ARRAY: the element's fields */
  uint16_t nsub;
};

#define RUN(m) (uint32_t) offsetof(lg_run_t, m)
#define TXT(m) (uint32_t) offsetof(lg_run_t, text.m)
#define S(k, o) {.kind = (k), .n = 1, .off = (o)}
#define SN(k, o, cnt) {.kind = (k), .n = (cnt), .off = (o)}
#define R(k, o, l, h) {.kind = (k), .flags = F_RANGE, .n = 1, .off = (o), .lo = (l), .hi = (h)}
#define TOOLIX(o, l) {.kind = K_INT, .flags = F_RANGE | F_TOOL, .n = 1, .off = (o), .lo = (l), .hi = 0}
#define GATE(cnt) {.kind = K_GATE, .n = (cnt)}
#define ARRAY(cnt_m, arr_m, max, elem_t, sub_t)                                                  \
  {.kind = K_ARRAY, .n = (max), .off = RUN(arr_m), .aux = RUN(cnt_m), .aux2 = sizeof(elem_t),    \
   .sub = (sub_t), .nsub = LG__ARRAY_LEN(sub_t)}

_Static_assert(sizeof(lg_reason_t) == sizeof(int) && sizeof(lg_next_t) == sizeof(int),
               "enums are kept as K_INT");
_Static_assert(sizeof(unsigned) == sizeof(uint32_t), "alternatives is kept as K_U32");

static const field_t TOOL_F[] = {
    S(K_I64, offsetof(lg__tool_t, executed)),
    S(K_I64, offsetof(lg__tool_t, fail_streak)),
};
static const field_t TRIED_F[] = {
    {.kind = K_FP32, .n = 1, .off = offsetof(lg__tried_t, hex), .aux = offsetof(lg__tried_t, fp64)},
    TOOLIX(offsetof(lg__tried_t, tool), 0),
    S(K_U32, offsetof(lg__tried_t, count)),
    S(K_U8, offsetof(lg__tried_t, last)),
    S(K_I64, offsetof(lg__tried_t, seq)),
};
static const field_t PENDING_F[] = {
    {.kind = K_STR, .flags = F_REQ, .n = 1, .off = offsetof(lg__pending_t, call_id)},
    S(K_STR, offsetof(lg__pending_t, key)),
    S(K_H64, offsetof(lg__pending_t, fp)),
    TOOLIX(offsetof(lg__pending_t, tool), 0),
};
static const field_t RETRY_F[] = {
    S(K_H64, offsetof(lg__retry_t, fp)),
    S(K_I64, offsetof(lg__retry_t, not_before)),
};
static const field_t OP_F[] = {
    {.kind = K_STR, .flags = F_REQ, .n = 1, .off = offsetof(lg__op_t, key)},
    S(K_STR, offsetof(lg__op_t, operation_id)),
    S(K_U8, offsetof(lg__op_t, state)),
};
static const field_t RESV_F[] = {
    S(K_I64, offsetof(lg__resv_t, id)),
    S(K_I64, offsetof(lg__resv_t, cost)),
    S(K_I64, offsetof(lg__resv_t, tokens)),
};

/* Every field after the run id and group, in the order of the format. */
static const field_t FIELDS[] = {
    SN(K_I64, RUN(c), sizeof(lg_counters_t) / sizeof(int64_t)),
    S(K_I64, RUN(seq)),
    {.kind = K_WINDOW},
    S(K_BOOL, RUN(has_best)),
    S(K_I64, RUN(best)),
    S(K_I64, RUN(np_count)),
    S(K_BOOL, RUN(has_world)),
    S(K_H64, RUN(world)),
    S(K_I64, RUN(world_same)),
    {.kind = K_TOOLS, .aux2 = sizeof(lg__tool_t), .sub = TOOL_F, .nsub = LG__ARRAY_LEN(TOOL_F)},
    ARRAY(ntried, tried, LG__TRIED_MAX, lg__tried_t, TRIED_F),
    ARRAY(npending, pending, LG__PENDING_MAX, lg__pending_t, PENDING_F),
    ARRAY(nretry, retry, LG__RETRY_MAX, lg__retry_t, RETRY_F),
    ARRAY(nops, ops, LG__OPS_MAX, lg__op_t, OP_F),
    ARRAY(nresv, resv, LG__RESV_MAX, lg__resv_t, RESV_F),
    S(K_I64, RUN(next_resv)),
    S(K_I64, RUN(held_cost)),
    S(K_I64, RUN(held_tokens)),
    /* The stop. */
    GATE(13),
    S(K_BOOL, RUN(stopped)),
    R(K_INT, RUN(reason), 0, LG_R__COUNT - 1),
    S(K_STR, RUN(reason_text)),
    S(K_GUARD, RUN(guard)),
    R(K_INT, RUN(next), 0, LG_NEXT_RESUME_AFTER_CHANGE),
    S(K_U32, RUN(alternatives)),
    S(K_STR, RUN(stop_message)),
    S(K_STR, RUN(refused_tool)),
    S(K_STR, RUN(refused_call_id)),
    S(K_STR, RUN(refused_km)),
    S(K_FPHEX, RUN(refused_fp)),
    S(K_I64, RUN(refused_turn)),
    S(K_I64, RUN(stopped_at_ms)),
    {.kind = K_SINCE2},
    S(K_I64, RUN(block_streak)),
    S(K_I64, RUN(compactions)),
    /* The text detector: the current response. */
    GATE(20),
    S(K_BOOL, TXT(open)),
    S(K_I64, TXT(turn)),
    S(K_BOOL, TXT(looped)),
    R(K_U8, TXT(line), 0, LG__LINE_SKIP),
    S(K_BOOL, TXT(fence)),
    R(K_U8, TXT(head_len), 0, LG__LINE_HEAD - 1),
    R(K_U8, TXT(indent), 0, 67),
    SN(K_BYTES, TXT(head), LG__LINE_HEAD),
    {.kind = K_H32, .n = 1, .off = TXT(word), .fresh = LG__FNV32_OFF},
    SN(K_H32, TXT(word_len), 3), /* word_len, sent, sent_words */
    SN(K_H32, TXT(words), LG__TW_WORDS),
    R(K_INT, TXT(nwords), 0, LG__TW_WORDS),
    R(K_INT, TXT(whead), 0, LG__TW_WORDS - 1),
    SN(K_H32, TXT(sents), LG__TW_SENTS),
    SN(K_H32, TXT(sent_nw), LG__TW_SENTS),
    R(K_INT, TXT(nsents), 0, LG__TW_SENTS),
    R(K_INT, TXT(shead), 0, LG__TW_SENTS - 1),
    {.kind = K_H64, .n = 1, .off = TXT(mono), .fresh = (int64_t)LG__FNV64_OFF},
    S(K_I64, TXT(mono_len)),
    S(K_BOOL, TXT(mono_space)),
    S(K_BOOL, TXT(mono_void)), /* set by every executed call: in the group, it would open it */
    /* The text guards across responses, and the cascade. */
    GATE(11),
    S(K_I64, RUN(text_loops)),
    S(K_H64, RUN(mono_ref)),
    S(K_I64, RUN(mono_ref_len)),
    S(K_I64, RUN(mono_run)),
    {.kind = K_INT, .flags = F_RANGE | F_TOOL, .n = 1, .off = RUN(hidden), .lo = -1, .fresh = -1},
    S(K_I64, RUN(hide_left)),
    S(K_BOOL, RUN(offer_live)),
    S(K_I64, RUN(escalate_left)),
    R(K_U8, RUN(answer_kind), 0, LG__ANS_PARTIAL),
    S(K_BOOL, RUN(answer_trunc)),
    S(K_STR, RUN(answer)),
};


/* Scalars by kind: their size in the run, and their value as int64 (for
 * the fresh test; saving and loading use EACH below). */
static size_t ksize(int k) {
  switch (k) {
  case K_I64:
  case K_H64: return 8;
  case K_INT: return sizeof(int);
  case K_U32:
  case K_H32: return 4;
  case K_U8: return 1;
  case K_BOOL: return sizeof(bool);
  default: return 0;
  }
}
static int64_t kget(int k, const void *p) {
  switch (k) {
  case K_I64:
  case K_H64: { int64_t v; memcpy(&v, p, 8); return v; }
  case K_INT: return *(const int *)p;
  case K_U32:
  case K_H32: return *(const uint32_t *)p;
  case K_U8: return *(const uint8_t *)p;
  case K_BOOL: return *(const bool *)p;
  default: return 0;
  }
}

/* Each of a field's n values, as a T *q (the kind's C type). */
#define EACH(T, body)                                   \
  do {                                                  \
    T *q = (T *)(void *)p;                              \
    for (int i_ = 0; i_ < f->n; i_++, q++) { body; }    \
  } while (0)

/* True when a field holds its fresh value (a GATE's test). */
static bool fresh(const field_t *f, const char *base) {
  const char *p = base + f->off;
  switch (f->kind) {
  case K_STR: return *(char *const *)p == NULL;
  case K_GUARD: return !*(const char *const *)p || !**(const char *const *)p;
  case K_FPHEX: return p[0] == 0;
  case K_BYTES:
    for (int i = 0; i < f->n; i++)
      if (p[i]) return false;
    return true;
  default: {
    if (f->n == 1) return kget(f->kind, p) == f->fresh;
    static const char zeros[LG__TW_WORDS * 4];
    size_t n = (size_t)f->n * ksize(f->kind);
    return n <= sizeof zeros && !memcmp(p, zeros, n); /* arrays start zeroed */
  }
  }
}

/* ---- writing ---- */

typedef struct wr {
  lg__buf_t b;
} wr_t;

/* Room for n more bytes; after a failure the buffer is marked and every
 * write is dropped (lg__buf_steal then fails). */
static inline bool room(wr_t *w, size_t n) {
  return w->b.len + n + 1 <= w->b.cap || !lg__buf_reserve(&w->b, n);
}
static inline void put_fixed(wr_t *w, uint64_t v, int bytes) {
  if (!room(w, 8)) return;
  uint64_t le = htole64(v);
  memcpy(w->b.data + w->b.len, &le, 8);
  w->b.len += (size_t)bytes;
}
static inline void put_varint(wr_t *w, uint64_t v) {
  if (!room(w, 10)) return;
  uint8_t *p = (uint8_t *)w->b.data + w->b.len;
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  w->b.len += n;
}
static inline void put_int(wr_t *w, int64_t v) {
  put_varint(w, ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0)); /* zigzag (no signed shift) */
}
static void put_bytes(wr_t *w, const void *p, size_t n) {
  if (!room(w, n)) return;
  memcpy(w->b.data + w->b.len, p, n);
  w->b.len += n;
}
static void put_str(wr_t *w, const char *s, size_t n) {
  put_varint(w, s ? (uint64_t)n + 1 : 0);
  if (s) put_bytes(w, s, n);
}

static void save_fields(wr_t *w, const lg_run_t *run, const char *base, const field_t *t,
                        size_t nt);

static void save_one(wr_t *w, const lg_run_t *run, const char *base, const field_t *f) {
  const char *p = base + f->off;
  switch (f->kind) {
  case K_I64: EACH(const int64_t, put_int(w, *q)); break;
  case K_INT: EACH(const int, put_int(w, *q)); break;
  case K_U32: EACH(const uint32_t, put_int(w, *q)); break;
  case K_U8: EACH(const uint8_t, put_int(w, *q)); break;
  case K_BOOL: EACH(const bool, put_int(w, *q)); break;
  case K_H64: EACH(const uint64_t, put_fixed(w, *q, 8)); break;
  case K_H32: EACH(const uint32_t, put_fixed(w, *q, 4)); break;
  case K_BYTES: put_bytes(w, p, f->n); break;
  case K_STR:
  case K_GUARD: {
    const char *s = *(const char *const *)p;
    put_str(w, s, s ? strlen(s) : 0);
    break;
  }
  case K_FPHEX: put_str(w, p, strnlen(p, LG_FP_HEX - 1)); break;
  case K_FP32: { /* the format keeps the 32 bytes, not their hex */
    uint8_t fp[32];
    lg__unhex(p, 32, fp); /* the engine's own fingerprints: lowercase hex */
    put_bytes(w, fp, 32);
    break;
  }
  case K_WINDOW:
    put_int(w, run->win_cap);
    put_int(w, run->win_len);
    put_int(w, run->win_head);
    for (int i = 0; i < run->win_cap; i++) {
      put_fixed(w, run->win[i].fp, 8);
      put_int(w, run->win[i].turn);
    }
    break;
  case K_TOOLS:
    put_int(w, run->ntools);
    for (int i = 0; i < run->ntools; i++) {
      const char *name = run->tools[i].name;
      put_str(w, name, strlen(name));
      save_fields(w, run, (const char *)&run->tools[i], f->sub, f->nsub);
    }
    break;
  case K_ARRAY: {
    int n = *(const int *)(base + f->aux);
    put_int(w, n);
    for (int i = 0; i < n; i++) save_fields(w, run, p + (size_t)i * f->aux2, f->sub, f->nsub);
    break;
  }
  default: break; /* K_GATE, K_SINCE2: see save_fields */
  }
}

static void save_fields(wr_t *w, const lg_run_t *run, const char *base, const field_t *t,
                        size_t nt) {
  for (size_t i = 0; i < nt; i++) {
    const field_t *f = &t[i];
    if (f->kind == K_GATE) {
      bool all = true;
      for (size_t k = 1; k <= f->n && all; k++) all = fresh(&f[k], base);
      put_varint(w, !all);
      if (all) i += f->n;
      continue;
    }
    save_one(w, run, base, f);
  }
}

/* Saves in the newest format (older ones are only read). */
int lg_run_save(const lg_run_t *run, char **buf, size_t *len) {
  wr_t w = {{0}};
  /* Room for all but long strings: no growing while writing. */
  lg__buf_reserve(&w.b, 1024 + (size_t)run->win_cap * 18 + (size_t)run->ntried * 64 +
                            (size_t)run->ntools * 48 + (size_t)(run->npending + run->nops) * 96 +
                            (size_t)(run->nretry + run->nresv) * 32 + 1024);
  put_bytes(&w, "LGR", 3);
  put_fixed(&w, FORMAT, 8);
  put_str(&w, run->run_id, strlen(run->run_id));
  put_str(&w, run->group, run->group ? strlen(run->group) : 0);
  save_fields(&w, run, (const char *)run, FIELDS, LG__ARRAY_LEN(FIELDS));
  *buf = lg__buf_steal(&w.b, len);
  return *buf ? 0 : LG_ENOMEM;
}

/* ---- reading ---- */

typedef struct rd {
  const uint8_t *p;
  size_t n, i;
  int rc; /* first error */
  int format;
} rd_t;

static void bad(rd_t *r) { r->rc = r->rc ? r->rc : LG_EINVAL; }

static uint64_t get_fixed(rd_t *r, int bytes) {
  if (r->rc || r->n - r->i < (size_t)bytes) {
    bad(r);
    return 0;
  }
  uint64_t v;
  if (bytes == 8) {
    v = le64toh(lg__load64(r->p + r->i));
  } else {
    uint32_t w;
    memcpy(&w, r->p + r->i, 4);
    v = le32toh(w);
  }
  r->i += (size_t)bytes;
  return v;
}
static inline uint64_t get_varint(rd_t *r) {
  if (!r->rc && r->i < r->n && r->p[r->i] < 0x80) return r->p[r->i++]; /* most are one byte */
  uint64_t v = 0;
  for (int shift = 0; !r->rc; shift += 7) {
    if (r->i >= r->n || shift > 63) {
      bad(r);
      break;
    }
    uint8_t b = r->p[r->i++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  return 0;
}
static inline int64_t get_int(rd_t *r) {
  if (r->format >= 3) {
    uint64_t z = get_varint(r);
    return (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
  }
  return (int64_t)get_fixed(r, 8);
}
static void get_bytes(rd_t *r, void *out, size_t n) {
  if (r->rc || r->n - r->i < n) {
    bad(r);
    memset(out, 0, n);
    return;
  }
  memcpy(out, r->p + r->i, n);
  r->i += n;
}
/* A string (NULL for none), copied out; *len its length. */
static char *get_str(rd_t *r) {
  uint64_t len;
  if (r->format >= 3) {
    uint64_t v = get_varint(r);
    if (r->rc || v == 0) return NULL;
    len = v - 1;
  } else {
    len = get_fixed(r, 4);
    if (r->rc || len == 0xFFFFFFFFu) return NULL;
  }
  if (r->n - r->i < len) {
    bad(r);
    return NULL;
  }
  char *s = lg__strndup((const char *)r->p + r->i, (size_t)len);
  if (!s) r->rc = LG_ENOMEM;
  r->i += (size_t)len;
  return s;
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

/* An integer in the field's range (else an error, and 0). */
static inline int64_t in_range(rd_t *r, const lg_run_t *run, const field_t *f, int64_t v) {
  if (!(f->flags & F_RANGE)) return v;
  int64_t hi = f->flags & F_TOOL ? (int64_t)run->ntools - 1 : f->hi;
  if (v < f->lo || v > hi) {
    bad(r);
    return 0;
  }
  return v;
}

static void load_fields(rd_t *r, lg_run_t *run, char *base, const field_t *t, size_t nt);

static void load_window(rd_t *r, lg_run_t *run) {
  int64_t cap = get_int(r);
  if (cap < 0 || cap > 1000000) bad(r);
  if (!r->rc && cap != run->win_cap) {
    lg__win_t *w = lg__calloc((size_t)(cap ? cap : 1), sizeof *w);
    if (!w) r->rc = LG_ENOMEM;
    else {
      lg__free(run->win);
      run->win = w;
      run->win_cap = cap ? (int)cap : 1;
    }
  }
  int64_t len = get_int(r), head = get_int(r);
  if (len < 0 || len > run->win_cap || head < 0 || head > run->win_cap - 1) bad(r);
  if (r->rc) return;
  run->win_len = (int)len;
  run->win_head = (int)head;
  for (int64_t i = 0; i < cap && !r->rc; i++) {
    run->win[i].fp = get_fixed(r, 8);
    run->win[i].turn = get_int(r);
  }
}

static void load_tools(rd_t *r, lg_run_t *run, const field_t *f) {
  int64_t nt = get_int(r);
  if (nt < 0 || nt > (1 << 20)) bad(r);
  for (int64_t i = 0; i < nt && !r->rc; i++) {
    char *name = get_str(r);
    if (!name) {
      bad(r);
      break;
    }
    int k = lg__run_tool(run, name);
    lg__free(name);
    if (k != i) {
      r->rc = k < 0 ? LG_ENOMEM : LG_EINVAL;
      break;
    }
    load_fields(r, run, (char *)&run->tools[k], f->sub, f->nsub);
  }
}

static void load_one(rd_t *r, lg_run_t *run, char *base, const field_t *f) {
  char *p = base + f->off;
  switch (f->kind) {
  case K_I64: EACH(int64_t, *q = in_range(r, run, f, get_int(r))); break;
  case K_INT: EACH(int, *q = (int)in_range(r, run, f, get_int(r))); break;
  case K_U32: EACH(uint32_t, *q = (uint32_t)in_range(r, run, f, get_int(r))); break;
  case K_U8: EACH(uint8_t, *q = (uint8_t)in_range(r, run, f, get_int(r))); break;
  case K_BOOL: EACH(bool, *q = get_int(r) != 0); break;
  case K_H64: EACH(uint64_t, *q = get_fixed(r, 8)); break;
  case K_H32: EACH(uint32_t, *q = (uint32_t)get_fixed(r, 4)); break;
  case K_BYTES: get_bytes(r, p, f->n); break;
  case K_STR: {
    char *s = get_str(r);
    *(char **)p = s;
    if (!s && (f->flags & F_REQ)) bad(r);
    break;
  }
  case K_GUARD: {
    char *g = get_str(r);
    *(const char **)p = guard_static(g);
    lg__free(g);
    break;
  }
  case K_FPHEX:
    if (r->format >= 3) {
      char *s = get_str(r);
      size_t n = s ? strlen(s) : 0;
      if (n > LG_FP_HEX - 1) bad(r);
      memset(p, 0, LG_FP_HEX);
      if (!r->rc && s) memcpy(p, s, n);
      lg__free(s);
    } else {
      get_bytes(r, p, LG_FP_HEX);
    }
    p[LG_FP_HEX - 1] = 0;
    break;
  case K_FP32: {
    uint8_t fp[32];
    get_bytes(r, fp, 32);
    char hex[LG_FP_HEX];
    lg__hex(fp, 32, hex);
    memcpy(p, hex, 64); /* kept without its NUL */
    uint64_t v = be64toh(lg__load64(fp)); /* the first 8 bytes, big-endian */
    memcpy(base + f->aux, &v, 8);
    break;
  }
  case K_WINDOW: load_window(r, run); break;
  case K_TOOLS: load_tools(r, run, f); break;
  case K_ARRAY: {
    int64_t n = get_int(r);
    if (n < 0 || n > f->n) bad(r);
    if (r->rc) break;
    /* The count first: a failure part-way frees what was read (the
     * elements after it are still zero). */
    *(int *)(base + f->aux) = (int)n;
    for (int64_t i = 0; i < n && !r->rc; i++)
      load_fields(r, run, p + (size_t)i * f->aux2, f->sub, f->nsub);
    break;
  }
  default: break;
  }
}

/* A field a GATE left out: the run being loaded into is fresh from
 * lg_run_new, which holds every field at its fresh value already (the
 * saving side compared them with the table's; the reload tests would see a
 * difference). Only the guard is normalised, as a loaded active run's. */
static void set_fresh(const field_t *f, char *base) {
  if (f->kind == K_GUARD) *(const char **)(base + f->off) = "";
}

static void load_fields(rd_t *r, lg_run_t *run, char *base, const field_t *t, size_t nt) {
  for (size_t i = 0; i < nt && !r->rc; i++) {
    const field_t *f = &t[i];
    if (f->kind == K_SINCE2) {
      if (r->format < 2) return;
      continue;
    }
    if (f->kind == K_GATE) {
      if (r->format < 3) continue;
      uint64_t g = get_varint(r);
      if (g > 1) bad(r);
      if (g == 0 && !r->rc) {
        for (size_t k = 1; k <= f->n; k++) set_fresh(&f[k], base);
        i += f->n;
      }
      continue;
    }
    load_one(r, run, base, f);
  }
}

lg_run_t *lg_run_load(const char *buf, size_t len, lg_policy_t *policy, lg_ledger_t *ledger,
                      lg_error_t *err) {
  rd_t r = {(const uint8_t *)buf, len, 0, 0, 0};
  char magic[3];
  get_bytes(&r, magic, 3);
  int64_t format = r.rc ? 0 : (int64_t)get_fixed(&r, 8);
  if (r.rc || memcmp(magic, "LGR", 3) || format < FORMAT_MIN || format > FORMAT) {
    lg__err(err, LG_EINVAL, NULL, -1, "not a saved run, or a newer format");
    return NULL;
  }
  r.format = (int)format;
  char *id = get_str(&r);
  char *group = get_str(&r);
  bool asked = !r.rc && id;
  lg_run_t *run = asked ? lg_run_new(id, group, policy, NULL, ledger, err) : NULL;
  lg__free(id);
  lg__free(group);
  if (!run) {
    if (asked) return NULL; /* lg_run_new filled err */
    if (!r.rc) bad(&r);      /* a NULL run id */
    lg__err(err, r.rc, NULL, -1, r.rc == LG_ENOMEM ? "out of memory" : "saved run is truncated");
    return NULL;
  }
  load_fields(&r, run, (char *)run, FIELDS, LG__ARRAY_LEN(FIELDS));
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
