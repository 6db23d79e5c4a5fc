/*
 * store_memory.c — the memory: backend: three hash tables (ledger rows,
 * runs, deny rules) private to one handle, for tests and replay. It keeps
 * the same contract as the durable backends, transactions included: every
 * change made inside a transaction records the value it replaced in an undo
 * log, and a rollback (of the transaction or of a savepoint) puts those
 * values back, newest first. The generic layer's lock is the only lock:
 * one handle is the whole database.
 */
#include "store.h"

#include <stdlib.h>

/* ---- a string-keyed hash table (open addressing, linear probing) ---- */

typedef struct mslot {
  char *key;  /* NULL: empty */
  uint64_t h; /* hash of key */
  void *val;  /* the table's value */
} mslot_t;

typedef struct mmap {
  mslot_t *slots; /* cap slots */
  size_t cap;     /* a power of two, or 0 */
  size_t used;    /* slots in use */
} mmap_t;

static mslot_t *mm_find(mmap_t *m, const char *key, uint64_t h) {
  if (!m->cap) return NULL;
  for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    mslot_t *sl = &m->slots[i];
    if (!sl->key) return NULL;
    if (sl->h == h && !strcmp(sl->key, key)) return sl;
  }
}

static void *mm_get(mmap_t *m, const char *key) {
  mslot_t *sl = mm_find(m, key, lg__hash_str(key));
  return sl ? sl->val : NULL;
}

static int mm_grow(mmap_t *m) {
  size_t cap = m->cap ? m->cap * 2 : 16;
  mslot_t *s = lg__calloc(cap, sizeof *s);
  if (!s) return LG_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slots[i].key) continue;
    size_t j = m->slots[i].h & (cap - 1);
    while (s[j].key) j = (j + 1) & (cap - 1);
    s[j] = m->slots[i];
  }
  lg__free(m->slots);
  m->slots = s;
  m->cap = cap;
  return 0;
}

/* Sets key to val; *old receives the value replaced (NULL when new). The
 * table takes val; on LG_ENOMEM nothing changed. */
static int mm_put(mmap_t *m, const char *key, void *val, void **old) {
  uint64_t h = lg__hash_str(key);
  mslot_t *sl = mm_find(m, key, h);
  *old = NULL;
  if (sl) {
    *old = sl->val;
    sl->val = val;
    return 0;
  }
  if ((m->used + 1) * 2 > m->cap && mm_grow(m)) return LG_ENOMEM;
  char *k = lg__strdup(key);
  if (!k) return LG_ENOMEM;
  size_t i = h & (m->cap - 1);
  while (m->slots[i].key) i = (i + 1) & (m->cap - 1);
  m->slots[i] = (mslot_t){k, h, val};
  m->used++;
  return 0;
}

/* Removes key and returns its value (NULL when absent). */
static void *mm_del(mmap_t *m, const char *key) {
  mslot_t *sl = mm_find(m, key, lg__hash_str(key));
  if (!sl) return NULL;
  void *val = sl->val;
  lg__free(sl->key);
  memset(sl, 0, sizeof *sl);
  m->used--;
  size_t i = (size_t)(sl - m->slots);
  for (size_t j = (i + 1) & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1)) {
    mslot_t moved = m->slots[j];
    memset(&m->slots[j], 0, sizeof moved);
    size_t k = moved.h & (m->cap - 1);
    while (m->slots[k].key) k = (k + 1) & (m->cap - 1);
    m->slots[k] = moved;
  }
  return val;
}

/* ---- the values ---- */

enum { T_OPS = 0, T_RUNS, T_DENY, T_BUD, T_RESV, T_RUNSCOPES, T_EVENTS, T__N };

/* A run's trace lines: one growing block. Appends are undone by cutting
 * the block back (see undo_t), not by keeping a copy of it. */
typedef struct mev {
  char *data;
  size_t len, cap;
} mev_t;

typedef struct mrun {
  lg_run_record_t rec; /* the stored run */
  uint64_t seq;        /* insertion order: newest first within a ms */
} mrun_t;

typedef struct mdeny {
  char *reason;       /* may be NULL */
  int64_t created_ms; /* when it was written */
} mdeny_t;

/* One hold of an open reservation on a budget. */
typedef struct mhold {
  char *id;             /* the reservation */
  int64_t amount_micro; /* held */
  int64_t expires_ms;   /* until */
} mhold_t;

/* A budget: its stored fields and the holds on it (a value is replaced
 * whole on every change, so that the undo log can put the old one back). */
typedef struct mbud {
  lg__bud_row_t row; /* stored fields; the computed ones are not used */
  mhold_t *holds;    /* nholds of them */
  size_t nholds;
} mbud_t;

static void mbud_free(mbud_t *b) {
  lg__bud_row_clear(&b->row);
  for (size_t i = 0; i < b->nholds; i++) lg__free(b->holds[i].id);
  lg__free(b->holds);
}

static void free_val(int table, void *v) {
  if (!v) return;
  switch (table) {
  case T_OPS: lg__op_row_clear(v); break;
  case T_RUNS: lg_run_record_clear(&((mrun_t *)v)->rec); break;
  case T_BUD: mbud_free(v); break;
  case T_RESV: lg__resv_row_clear(v); break;
  case T_RUNSCOPES: break; /* the value is the string itself */
  case T_EVENTS: lg__free(((mev_t *)v)->data); break;
  default: lg__free(((mdeny_t *)v)->reason); break;
  }
  lg__free(v);
}

/* One undo entry: in `table`, `key` had `old` (NULL: was absent); or,
 * with `cut`, the trace lines of `key` were old_len bytes long. */
typedef struct undo {
  int table;
  char *key;
  void *old;
  int cut;
  size_t old_len;
} undo_t;

typedef struct mem {
  mmap_t t[T__N];     /* ops, runs, deny rules */
  uint64_t next_seq;  /* for runs */
  undo_t *undo;       /* the undo log of the open transaction */
  size_t nundo, capundo;
  size_t marks[64];   /* undo length at each open savepoint level */
  int depth;          /* transactions/savepoints open here */
} mem_t;

/* Writes val to table[key], logging what it replaces when inside a
 * transaction. val NULL deletes. Takes val (freed on failure). */
static int mem_set(mem_t *m, int table, const char *key, void *val) {
  void *old = NULL;
  char *ukey = NULL;
  if (m->depth > 0) {
    if (m->nundo == m->capundo) {
      size_t cap = m->capundo ? m->capundo * 2 : 16;
      undo_t *u = lg__realloc(m->undo, cap * sizeof *u);
      if (!u) goto oom;
      m->undo = u;
      m->capundo = cap;
    }
    if (!(ukey = lg__strdup(key))) goto oom;
  }
  if (val) {
    if (mm_put(&m->t[table], key, val, &old)) goto oom;
  } else {
    old = mm_del(&m->t[table], key);
  }
  if (m->depth > 0) m->undo[m->nundo++] = (undo_t){table, ukey, old, 0, 0};
  else free_val(table, old);
  return 0;
oom:
  lg__free(ukey);
  free_val(table, val);
  return LG_ENOMEM;
}

/* Rolls the undo log back to length n. */
static void undo_to(mem_t *m, size_t n) {
  while (m->nundo > n) {
    undo_t *u = &m->undo[--m->nundo];
    void *cur = NULL;
    if (u->cut) { /* an append: cut the lines back */
      mev_t *e = mm_get(&m->t[T_EVENTS], u->key);
      if (e && u->old_len) e->len = u->old_len;
      else if (e) free_val(T_EVENTS, mm_del(&m->t[T_EVENTS], u->key));
      lg__free(u->key);
      continue;
    }
    if (u->old) {
      /* Putting back a deleted key may need memory; a rollback cannot
       * report a failure, so under out-of-memory that value is lost. */
      if (mm_put(&m->t[u->table], u->key, u->old, &cur)) free_val(u->table, u->old);
    } else {
      cur = mm_del(&m->t[u->table], u->key);
    }
    free_val(u->table, cur);
    lg__free(u->key);
  }
}

static void undo_forget(mem_t *m) {
  for (size_t i = 0; i < m->nundo; i++) {
    free_val(m->undo[i].table, m->undo[i].old);
    lg__free(m->undo[i].key);
  }
  m->nundo = 0;
}

/* ---- the table of functions ---- */

static int m_open(lg_store_t *s, const char *arg, lg_error_t *err) {
  if (arg && *arg)
    return lg__err(err, LG_EINVAL, "url", -1,
                   "memory: takes nothing after the colon (got \"%s\")", arg);
  mem_t *m = lg__calloc(1, sizeof *m);
  if (!m) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  s->impl = m;
  return 0;
}

static void m_close(lg_store_t *s) {
  mem_t *m = s->impl;
  if (!m) return;
  undo_to(m, 0);
  for (int t = 0; t < T__N; t++) {
    for (size_t i = 0; i < m->t[t].cap; i++) {
      lg__free(m->t[t].slots[i].key);
      free_val(t, m->t[t].slots[i].val);
    }
    lg__free(m->t[t].slots);
  }
  lg__free(m->undo);
  lg__free(m);
  s->impl = NULL;
}

static int m_schema_version(lg_store_t *s, int *version, lg_error_t *err) {
  (void)s;
  (void)err;
  *version = LG_STORE_SCHEMA_VERSION;
  return 0;
}

static int m_begin(lg_store_t *s, int kind, int nested, int upgrade, lg_error_t *err) {
  (void)kind;
  (void)nested;
  (void)upgrade;
  mem_t *m = s->impl;
  if (m->depth >= (int)LG__ARRAY_LEN(m->marks))
    return lg__err(err, LG_ESTATE, NULL, -1, "transactions nested too deeply");
  m->marks[m->depth++] = m->nundo;
  return 0;
}

static int m_end(lg_store_t *s, int commit, int nested, lg_error_t *err) {
  (void)err;
  mem_t *m = s->impl;
  if (m->depth <= 0) return 0;
  size_t mark = m->marks[--m->depth];
  if (!commit) undo_to(m, mark);
  else if (!nested) undo_forget(m);
  return 0;
}

static int copy_op(lg__op_row_t *out, const lg__op_row_t *in) {
  memset(out, 0, sizeof *out);
  out->state = in->state;
  out->lease_until_ms = in->lease_until_ms;
  out->created_ms = in->created_ms;
  out->updated_ms = in->updated_ms;
  out->result_len = in->result ? in->result_len : 0;
  out->key = lg__strdup(in->key);
  out->request_fp = lg__strdup(in->request_fp);
  if (in->run_id) out->run_id = lg__strdup(in->run_id);
  if (in->result) out->result = lg__strndup(in->result, in->result_len);
  if (in->operation_id) out->operation_id = lg__strdup(in->operation_id);
  out->resolved_ms = in->resolved_ms;
  out->freed = in->freed;
  if (in->claim_token) out->claim_token = lg__strdup(in->claim_token);
  if (in->resolved_by) out->resolved_by = lg__strdup(in->resolved_by);
  if (!out->key || !out->request_fp || (in->run_id && !out->run_id) ||
      (in->result && !out->result) || (in->operation_id && !out->operation_id) ||
      (in->claim_token && !out->claim_token) || (in->resolved_by && !out->resolved_by)) {
    lg__op_row_clear(out);
    return LG_ENOMEM;
  }
  return 0;
}

static int oom(lg_error_t *err) { return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory"); }

static int m_op_read(lg_store_t *s, const char *key, int lock, lg__op_row_t *row, int *found,
                     lg_error_t *err) {
  (void)lock;
  mem_t *m = s->impl;
  lg__op_row_t *r = mm_get(&m->t[T_OPS], key);
  *found = r != NULL;
  if (r && copy_op(row, r)) return oom(err);
  return 0;
}

static int put_op(mem_t *m, const lg__op_row_t *row, lg_error_t *err) {
  lg__op_row_t *v = lg__malloc(sizeof *v);
  if (!v || copy_op(v, row)) {
    lg__free(v);
    return oom(err);
  }
  return mem_set(m, T_OPS, row->key, v) ? oom(err) : 0;
}

static int m_op_insert(lg_store_t *s, const lg__op_row_t *row, int *inserted,
                       lg_error_t *err) {
  mem_t *m = s->impl;
  *inserted = 0;
  if (mm_get(&m->t[T_OPS], row->key)) return 0;
  int rc = put_op(m, row, err);
  if (!rc) *inserted = 1;
  return rc;
}

static int m_op_update(lg_store_t *s, const lg__op_row_t *row, lg_error_t *err) {
  mem_t *m = s->impl;
  if (!mm_get(&m->t[T_OPS], row->key)) return 0;
  return put_op(m, row, err);
}

static int m_op_delete(lg_store_t *s, const char *key, lg_error_t *err) {
  mem_t *m = s->impl;
  if (!mm_get(&m->t[T_OPS], key)) return 0;
  return mem_set(m, T_OPS, key, NULL) ? oom(err) : 0;
}

static int m_op_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  mem_t *m = s->impl;
  *purged = 0;
  /* Collect first: deleting shifts slots under the scan. */
  size_t n = 0;
  char **keys = lg__calloc(m->t[T_OPS].used + 1, sizeof *keys);
  if (!keys) return oom(err);
  for (size_t i = 0; i < m->t[T_OPS].cap; i++) {
    lg__op_row_t *r = m->t[T_OPS].slots[i].val;
    if (m->t[T_OPS].slots[i].key && r->state != LG__OP_PENDING && r->updated_ms <= before_ms)
      keys[n++] = m->t[T_OPS].slots[i].key;
  }
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    char *k = lg__strdup(keys[i]);
    if (!k) {
      rc = oom(err);
      break;
    }
    /* keys[i] is the slot's own string, which the delete frees. */
    rc = mem_set(m, T_OPS, k, NULL) ? oom(err) : 0;
    lg__free(k);
    if (!rc) (*purged)++;
  }
  lg__free(keys);
  return rc;
}

static int m_op_settle(lg_store_t *s, const char *key, int state, const char *result,
                       size_t result_len, const char *operation_id, int64_t now_ms,
                       int *changed, lg_error_t *err) {
  mem_t *m = s->impl;
  lg__op_row_t *cur = mm_get(&m->t[T_OPS], key);
  *changed = 0;
  if (!cur || cur->state != LG__OP_PENDING) return 0;
  int rc;
  if (!state) {
    rc = mem_set(m, T_OPS, key, NULL) ? oom(err) : 0;
  } else {
    lg__op_row_t next = *cur;
    next.state = state;
    next.result = (char *)result;
    next.result_len = result ? result_len : 0;
    next.operation_id = (char *)operation_id;
    next.updated_ms = now_ms;
    rc = put_op(m, &next, err);
  }
  if (!rc) *changed = 1;
  return rc;
}

static int m_run_read(lg_store_t *s, const char *run_id, int lock, lg_run_record_t *rec,
                      int *found, lg_error_t *err) {
  (void)lock;
  mem_t *m = s->impl;
  mrun_t *r = mm_get(&m->t[T_RUNS], run_id);
  *found = r != NULL;
  if (r && lg__run_record_copy(rec, &r->rec)) return oom(err);
  return 0;
}

static int put_run(mem_t *m, const lg_run_record_t *rec, uint64_t seq, int64_t created_ms,
                   lg_error_t *err) {
  mrun_t *v = lg__calloc(1, sizeof *v);
  if (!v || lg__run_record_copy(&v->rec, rec)) {
    lg__free(v);
    return oom(err);
  }
  v->rec.created_ms = created_ms;
  v->seq = seq;
  return mem_set(m, T_RUNS, rec->run_id, v) ? oom(err) : 0;
}

static int m_run_insert(lg_store_t *s, const lg_run_record_t *rec, int *inserted,
                        lg_error_t *err) {
  mem_t *m = s->impl;
  *inserted = 0;
  if (mm_get(&m->t[T_RUNS], rec->run_id)) return 0;
  int rc = put_run(m, rec, ++m->next_seq, rec->created_ms, err);
  if (!rc) *inserted = 1;
  return rc;
}

static int m_run_update(lg_store_t *s, const lg_run_record_t *rec, int *updated,
                        lg_error_t *err) {
  mem_t *m = s->impl;
  mrun_t *cur = mm_get(&m->t[T_RUNS], rec->run_id);
  *updated = 0;
  if (!cur) return 0;
  int rc = put_run(m, rec, cur->seq, cur->rec.created_ms, err);
  if (!rc) *updated = 1;
  return rc;
}

static int newest_first(const void *a, const void *b) {
  const mrun_t *x = *(mrun_t *const *)a, *y = *(mrun_t *const *)b;
  if (x->rec.created_ms != y->rec.created_ms) return x->rec.created_ms > y->rec.created_ms ? -1 : 1;
  return x->seq > y->seq ? -1 : x->seq < y->seq ? 1 : 0;
}

static int m_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb, void *ud,
                      lg_error_t *err) {
  mem_t *m = s->impl;
  mmap_t *t = &m->t[T_RUNS];
  mrun_t **all = lg__calloc(t->used + 1, sizeof *all);
  if (!all) return oom(err);
  size_t n = 0;
  for (size_t i = 0; i < t->cap; i++) {
    mrun_t *r = t->slots[i].val;
    if (!t->slots[i].key) continue;
    if (f->status && r->rec.stopped != !strcmp(f->status, "stopped")) continue;
    if (f->reason && (!r->rec.terminal_reason || strcmp(f->reason, r->rec.terminal_reason)))
      continue;
    if (f->group && (!r->rec.group || strcmp(f->group, r->rec.group))) continue;
    all[n++] = r;
  }
  qsort(all, n, sizeof *all, newest_first);
  if (f->limit && n > f->limit) n = f->limit;
  /* Copies, so that the callback may write to the store meanwhile. */
  lg_run_record_t *copies = lg__calloc(n + 1, sizeof *copies);
  int rc = copies ? 0 : oom(err);
  for (size_t i = 0; i < n && !rc; i++) {
    lg_run_record_t view = all[i]->rec;
    view.policy_json = NULL;
    view.state = NULL;
    view.state_len = 0;
    if (lg__run_record_copy(&copies[i], &view)) rc = oom(err);
  }
  lg__free(all);
  for (size_t i = 0; i < n && !rc; i++) rc = cb(ud, &copies[i]);
  for (size_t i = 0; copies && i < n; i++) lg_run_record_clear(&copies[i]);
  lg__free(copies);
  return rc;
}

static char *deny_name(int scope, const char *id) {
  lg__buf_t b = {0};
  lg__buf_putc(&b, scope == LG__DENY_RUN ? 'r' : 'g');
  lg__buf_putc(&b, ':');
  lg__buf_puts(&b, id);
  return lg__buf_steal(&b, NULL);
}

static int m_deny_put(lg_store_t *s, int scope, const char *id, const char *reason,
                      int64_t now_ms, lg_error_t *err) {
  mem_t *m = s->impl;
  char *k = deny_name(scope, id);
  mdeny_t *v = lg__calloc(1, sizeof *v);
  if (!k || !v || (reason && !(v->reason = lg__strdup(reason)))) {
    lg__free(k);
    if (v) lg__free(v->reason);
    lg__free(v);
    return oom(err);
  }
  v->created_ms = now_ms;
  int rc = mem_set(m, T_DENY, k, v) ? oom(err) : 0;
  lg__free(k);
  return rc;
}

static int m_deny_get(lg_store_t *s, const char *run_id, const char *group, int *found,
                      char **reason, lg_error_t *err) {
  mem_t *m = s->impl;
  *found = 0;
  *reason = NULL;
  for (int scope = LG__DENY_RUN; scope <= LG__DENY_GROUP; scope++) {
    const char *id = scope == LG__DENY_RUN ? run_id : group;
    if (!id) continue;
    char *k = deny_name(scope, id);
    if (!k) return oom(err);
    mdeny_t *d = mm_get(&m->t[T_DENY], k);
    lg__free(k);
    if (!d) continue;
    *found = 1;
    if (d->reason && !(*reason = lg__strdup(d->reason))) return oom(err);
    return 0;
  }
  return 0;
}

/* ---- budgets ---- */

/* A copy of b, holds included, whose hold array has room for `extra`
 * more. */
static mbud_t *mbud_copy(const mbud_t *b, size_t extra) {
  mbud_t *c = lg__calloc(1, sizeof *c);
  if (!c) return NULL;
  c->row = b->row;
  c->row.scope = lg__strdup(b->row.scope);
  c->holds = lg__calloc(b->nholds + extra + 1, sizeof *c->holds);
  if (!c->row.scope || !c->holds) goto oom;
  for (size_t i = 0; i < b->nholds; i++) {
    c->holds[i] = b->holds[i];
    if (!(c->holds[i].id = lg__strdup(b->holds[i].id))) goto oom;
    c->nholds = i + 1;
  }
  return c;
oom:
  mbud_free(c);
  lg__free(c);
  return NULL;
}

/* A budget's stored fields and what its hold rows say as of now_ms, into
 * *out (a new row). */
static int mbud_view(const mbud_t *b, int64_t now_ms, lg__bud_row_t *out) {
  *out = b->row;
  out->scope = lg__strdup(b->row.scope);
  if (!out->scope) return LG_ENOMEM;
  out->live_micro = 0;
  out->live_holds = 0;
  out->live_min_expiry_ms = -1;
  out->expired_holds = 0;
  for (size_t i = 0; i < b->nholds; i++) {
    const mhold_t *h = &b->holds[i];
    if (h->expires_ms <= now_ms) {
      out->expired_holds++;
      continue;
    }
    out->live_micro += h->amount_micro;
    out->live_holds++;
    if (out->live_min_expiry_ms < 0 || h->expires_ms < out->live_min_expiry_ms)
      out->live_min_expiry_ms = h->expires_ms;
  }
  return 0;
}

static int m_bud_read(lg_store_t *s, const char *scope, int lock, int64_t now_ms,
                      lg__bud_row_t *row, int *found, lg_error_t *err) {
  (void)lock;
  mem_t *m = s->impl;
  mbud_t *b = mm_get(&m->t[T_BUD], scope);
  *found = b != NULL;
  if (b && mbud_view(b, now_ms, row)) {
    *found = 0;
    return oom(err);
  }
  return 0;
}

static int drop_holds(mem_t *m, mbud_t *cur, const char *id, int64_t now_ms, lg_error_t *err);

static int m_bud_read_drop(lg_store_t *s, const char *scope, int64_t now_ms, const char *id,
                           lg__bud_row_t *row, int *found, int *dropped, lg_error_t *err) {
  mem_t *m = s->impl;
  *dropped = 0;
  int rc = m_bud_read(s, scope, 1, now_ms, row, found, err);
  if (rc || !*found) return rc;
  mbud_t *cur = mm_get(&m->t[T_BUD], scope);
  for (size_t i = 0; i < cur->nholds; i++)
    if (!strcmp(cur->holds[i].id, id)) *dropped = 1;
  if (*dropped && (rc = drop_holds(m, cur, id, 0, err))) {
    lg__bud_row_clear(row);
    *found = *dropped = 0;
  }
  return rc;
}

static int m_bud_put(lg_store_t *s, const lg__bud_row_t *row, lg_error_t *err) {
  mem_t *m = s->impl;
  mbud_t *cur = mm_get(&m->t[T_BUD], row->scope);
  mbud_t empty = {.row = *row};
  mbud_t *next = mbud_copy(cur ? cur : &empty, 0);
  if (!next) return oom(err);
  char *scope = next->row.scope;
  int64_t created = cur ? cur->row.created_ms : row->created_ms;
  next->row = *row;
  next->row.scope = scope;
  next->row.created_ms = created;
  return mem_set(m, T_BUD, row->scope, next) ? oom(err) : 0;
}

static int by_scope(const void *a, const void *b) {
  return strcmp((*(mbud_t *const *)a)->row.scope, (*(mbud_t *const *)b)->row.scope);
}

static int m_bud_list(lg_store_t *s, int64_t now_ms, int (*cb)(void *, const lg__bud_row_t *),
                      void *ud, lg_error_t *err) {
  mem_t *m = s->impl;
  mmap_t *t = &m->t[T_BUD];
  mbud_t **all = lg__calloc(t->used + 1, sizeof *all);
  if (!all) return oom(err);
  size_t n = 0;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i].key) all[n++] = t->slots[i].val;
  qsort(all, n, sizeof *all, by_scope);
  /* Views first: the callback may write to the store meanwhile. */
  lg__bud_row_t *views = lg__calloc(n + 1, sizeof *views);
  int rc = views ? 0 : oom(err);
  size_t got = 0;
  for (; got < n && !rc; got++)
    if (mbud_view(all[got], now_ms, &views[got])) rc = oom(err);
  if (rc && got) got--;
  lg__free(all);
  for (size_t i = 0; i < got && !rc; i++) rc = cb(ud, &views[i]);
  for (size_t i = 0; views && i < got; i++) lg__bud_row_clear(&views[i]);
  lg__free(views);
  return rc;
}

static int m_hold_put(lg_store_t *s, const char *scope, const char *id, int64_t amount,
                      int64_t expires_ms, lg_error_t *err) {
  mem_t *m = s->impl;
  mbud_t *cur = mm_get(&m->t[T_BUD], scope);
  if (!cur) return lg__err(err, LG_ENOTFOUND, "scope", -1, "no budget \"%s\"", scope);
  mbud_t *next = mbud_copy(cur, 1);
  if (!next) return oom(err);
  mhold_t *h = &next->holds[next->nholds];
  if (!(h->id = lg__strdup(id))) {
    mbud_free(next);
    lg__free(next);
    return oom(err);
  }
  h->amount_micro = amount;
  h->expires_ms = expires_ms;
  next->nholds++;
  return mem_set(m, T_BUD, scope, next) ? oom(err) : 0;
}

/* Replaces a budget by a copy without the holds that `drop` selects. */
static int drop_holds(mem_t *m, mbud_t *cur, const char *id, int64_t now_ms,
                      lg_error_t *err) {
  size_t keep = 0;
  for (size_t i = 0; i < cur->nholds; i++)
    if (id ? strcmp(cur->holds[i].id, id) : cur->holds[i].expires_ms > now_ms) keep++;
  if (keep == cur->nholds) return 0;
  mbud_t *next = mbud_copy(cur, 0);
  if (!next) return oom(err);
  size_t j = 0;
  for (size_t i = 0; i < next->nholds; i++) {
    mhold_t *h = &next->holds[i];
    if (id ? strcmp(h->id, id) : h->expires_ms > now_ms) next->holds[j++] = *h;
    else lg__free(h->id);
  }
  next->nholds = j;
  char *k = lg__strdup(cur->row.scope);
  if (!k) {
    mbud_free(next);
    lg__free(next);
    return oom(err);
  }
  int rc = mem_set(m, T_BUD, k, next) ? oom(err) : 0;
  lg__free(k);
  return rc;
}

static int m_holds_expire(lg_store_t *s, const char *scope, int64_t now_ms, lg_error_t *err) {
  mem_t *m = s->impl;
  mbud_t *cur = mm_get(&m->t[T_BUD], scope);
  return cur ? drop_holds(m, cur, NULL, now_ms, err) : 0;
}

static int copy_resv(lg__resv_row_t *out, const lg__resv_row_t *in) {
  *out = *in;
  out->id = lg__strdup(in->id);
  out->scopes = lg__strdup(in->scopes);
  out->run_id = in->run_id ? lg__strdup(in->run_id) : NULL;
  out->model = in->model ? lg__strdup(in->model) : NULL;
  if (!out->id || !out->scopes || (in->run_id && !out->run_id) || (in->model && !out->model)) {
    lg__resv_row_clear(out);
    return LG_ENOMEM;
  }
  return 0;
}

static int put_resv(mem_t *m, const lg__resv_row_t *row, lg_error_t *err) {
  lg__resv_row_t *v = lg__calloc(1, sizeof *v);
  if (!v || copy_resv(v, row)) {
    lg__free(v);
    return oom(err);
  }
  return mem_set(m, T_RESV, row->id, v) ? oom(err) : 0;
}

static int m_resv_insert(lg_store_t *s, const lg__resv_row_t *row, lg_error_t *err) {
  mem_t *m = s->impl;
  if (mm_get(&m->t[T_RESV], row->id))
    return lg__err(err, LG_ECONFLICT, "reservation_id", -1, "reservation \"%s\" exists already",
                   row->id);
  return put_resv(m, row, err);
}

static int m_resv_read(lg_store_t *s, const char *id, int lock, lg__resv_row_t *row,
                       int *found, lg_error_t *err) {
  (void)lock;
  mem_t *m = s->impl;
  lg__resv_row_t *r = mm_get(&m->t[T_RESV], id);
  *found = r != NULL;
  if (r && copy_resv(row, r)) {
    *found = 0;
    return oom(err);
  }
  return 0;
}

static int m_resv_of_run(lg_store_t *s, const char *run_id, int64_t run_seq, int lock,
                         lg__resv_row_t *row, int *found, lg_error_t *err) {
  (void)lock;
  mem_t *m = s->impl;
  mmap_t *t = &m->t[T_RESV];
  lg__resv_row_t *best = NULL;
  for (size_t i = 0; i < t->cap; i++) {
    lg__resv_row_t *r = t->slots[i].val;
    if (!t->slots[i].key || !r->run_id || strcmp(r->run_id, run_id)) continue;
    if (run_seq > 0 ? r->run_seq == run_seq
                    : !r->settled && (!best || r->run_seq < best->run_seq))
      best = r;
  }
  *found = best != NULL;
  if (best && copy_resv(row, best)) {
    *found = 0;
    return oom(err);
  }
  return 0;
}

static int m_resv_update(lg_store_t *s, const lg__resv_row_t *row, lg_error_t *err) {
  mem_t *m = s->impl;
  if (!mm_get(&m->t[T_RESV], row->id)) return 0;
  return put_resv(m, row, err);
}

static int m_resv_purge(lg_store_t *s, int64_t before_ms, int64_t *purged, lg_error_t *err) {
  mem_t *m = s->impl;
  mmap_t *t = &m->t[T_RESV];
  *purged = 0;
  char **keys = lg__calloc(t->used + 1, sizeof *keys);
  if (!keys) return oom(err);
  size_t n = 0;
  int rc = 0;
  for (size_t i = 0; i < t->cap && !rc; i++) {
    lg__resv_row_t *r = t->slots[i].val;
    if (t->slots[i].key && r->expires_ms <= before_ms && !(keys[n++] = lg__strdup(r->id)))
      rc = oom(err);
  }
  for (size_t i = 0; i < n && !rc; i++) {
    rc = mem_set(m, T_RESV, keys[i], NULL) ? oom(err) : 0;
    if (!rc) (*purged)++;
  }
  for (size_t i = 0; i < n; i++) lg__free(keys[i]);
  lg__free(keys);
  return rc;
}

static int m_runscopes_put(lg_store_t *s, const char *run_id, const char *scopes,
                           lg_error_t *err) {
  mem_t *m = s->impl;
  if (!scopes || !*scopes)
    return mm_get(&m->t[T_RUNSCOPES], run_id) && mem_set(m, T_RUNSCOPES, run_id, NULL)
               ? oom(err)
               : 0;
  char *v = lg__strdup(scopes);
  if (!v) return oom(err);
  return mem_set(m, T_RUNSCOPES, run_id, v) ? oom(err) : 0;
}

static int m_runscopes_get(lg_store_t *s, const char *run_id, char **scopes, int *found,
                           lg_error_t *err) {
  mem_t *m = s->impl;
  const char *v = mm_get(&m->t[T_RUNSCOPES], run_id);
  *found = v != NULL;
  *scopes = NULL;
  if (v && !(*scopes = lg__strdup(v))) {
    *found = 0;
    return oom(err);
  }
  return 0;
}

static int m_ev_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                       lg_error_t *err) {
  mem_t *m = s->impl;
  mev_t *e = mm_get(&m->t[T_EVENTS], run_id);
  size_t old_len = e ? e->len : 0;
  if (m->depth > 0 && m->nundo == m->capundo) {
    size_t cap = m->capundo ? m->capundo * 2 : 16;
    undo_t *u = lg__realloc(m->undo, cap * sizeof *u);
    if (!u) return oom(err);
    m->undo = u;
    m->capundo = cap;
  }
  char *ukey = NULL;
  if (m->depth > 0 && !(ukey = lg__strdup(run_id))) return oom(err);
  if (!e) {
    e = lg__calloc(1, sizeof *e);
    void *old = NULL;
    if (!e || mm_put(&m->t[T_EVENTS], run_id, e, &old)) {
      lg__free(e);
      lg__free(ukey);
      return oom(err);
    }
  }
  if (e->len + len > e->cap) {
    size_t cap = e->cap ? e->cap : 256;
    while (cap < e->len + len) cap *= 2;
    char *d = lg__realloc(e->data, cap);
    if (!d) {
      if (!e->len) free_val(T_EVENTS, mm_del(&m->t[T_EVENTS], run_id));
      lg__free(ukey);
      return oom(err);
    }
    e->data = d;
    e->cap = cap;
  }
  memcpy(e->data + e->len, lines, len);
  e->len += len;
  if (m->depth > 0) m->undo[m->nundo++] = (undo_t){T_EVENTS, ukey, NULL, 1, old_len};
  return 0;
}

static int m_ev_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err) {
  mem_t *m = s->impl;
  const mev_t *e = mm_get(&m->t[T_EVENTS], run_id);
  if (e && e->len && lg__buf_append(out, e->data, e->len)) return oom(err);
  return 0;
}

const lg__store_vtab_t lg__store_memory = {
    .version = 3,
    .scheme = "memory",
    .open = m_open,
    .close = m_close,
    .schema_version = m_schema_version,
    .begin = m_begin,
    .end = m_end,
    .op_read = m_op_read,
    .op_insert = m_op_insert,
    .op_update = m_op_update,
    .op_delete = m_op_delete,
    .op_purge = m_op_purge,
    .op_settle = m_op_settle,
    .run_read = m_run_read,
    .run_insert = m_run_insert,
    .run_update = m_run_update,
    .run_list = m_run_list,
    .deny_put = m_deny_put,
    .deny_get = m_deny_get,
    .bud_read = m_bud_read,
    .bud_read_drop = m_bud_read_drop,
    .bud_put = m_bud_put,
    .bud_list = m_bud_list,
    .hold_put = m_hold_put,
    .holds_expire = m_holds_expire,
    .resv_insert = m_resv_insert,
    .resv_read = m_resv_read,
    .resv_of_run = m_resv_of_run,
    .resv_update = m_resv_update,
    .resv_purge = m_resv_purge,
    .runscopes_put = m_runscopes_put,
    .runscopes_get = m_runscopes_get,
    .ev_append = m_ev_append,
    .ev_read = m_ev_read,
};
