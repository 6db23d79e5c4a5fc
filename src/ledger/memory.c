/*
 * memory.c — the in-memory idempotency ledger: the lg_ledger_methods_t
 * interface over an open-addressing hash table of operations. It serves
 * replay and the tests; the durable stores implement the same interface
 * with the same semantics:
 *
 *   (absent) --claim--> CLAIMED --commit--> COMMITTED (replays its result)
 *                          |  \--fail(final)--> FAILED (replays a failure)
 *                          |  \--fail(retryable)--> (absent)
 *                          \--lease runs out--> reported as unknown_outcome
 *
 * Time is an argument (now_ms); the ledger never reads a clock.
 */
#include "../util/internal.h"

#include <stdio.h>

typedef enum op_state { OP_EMPTY = 0, OP_CLAIMED, OP_COMMITTED, OP_FAILED } op_state_t;

typedef struct op {
  char *key;            /* the idempotency key, NULL in an empty slot */
  uint64_t hash;        /* hash of key */
  op_state_t state;     /* where the operation is */
  char fp[LG__LEDGER_FP_MAX + 1]; /* request fingerprint of the claim */
  int64_t lease_until;  /* CLAIMED: the lease's end, ms */
  char *result;         /* COMMITTED: the saved result JSON */
  size_t result_len;
} op_t;

typedef struct mem_ledger {
  op_t *slots;  /* open addressing, linear probing */
  size_t cap;   /* a power of two */
  size_t used;  /* slots with a key (tombstones are keyless OP_EMPTY) */
} mem_ledger_t;

static op_t *find(mem_ledger_t *m, const char *key, uint64_t h) {
  if (!m->cap) return NULL;
  for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    op_t *o = &m->slots[i];
    if (!o->key) return NULL;
    if (o->hash == h && !strcmp(o->key, key)) return o;
  }
}

static int grow(mem_ledger_t *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  op_t *s = lg__calloc(cap, sizeof *s);
  if (!s) return LG_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    op_t *o = &m->slots[i];
    if (!o->key) continue;
    size_t j = o->hash & (cap - 1);
    while (s[j].key) j = (j + 1) & (cap - 1);
    s[j] = *o;
  }
  lg__free(m->slots);
  m->slots = s;
  m->cap = cap;
  return 0;
}

static void fill_claim(const op_t *o, const char *fp, int64_t now, lg_claim_t *out) {
  out->result = NULL;
  out->result_len = 0;
  out->failed = 0;
  if (!o) {
    out->outcome = LG_CLAIM_FREE;
    return;
  }
  if (strcmp(o->fp, fp)) {
    out->outcome = LG_CLAIM_MISMATCH;
    return;
  }
  switch (o->state) {
  case OP_CLAIMED:
    out->outcome = now < o->lease_until ? LG_CLAIM_IN_PROGRESS : LG_CLAIM_UNKNOWN_OUTCOME;
    return;
  case OP_FAILED: out->failed = 1; /* fall through */
  case OP_COMMITTED: out->outcome = LG_CLAIM_REPLAY; return;
  default: out->outcome = LG_CLAIM_FREE; return;
  }
}

static int copy_result(const op_t *o, lg_claim_t *out, lg_error_t *err) {
  if (out->outcome != LG_CLAIM_REPLAY || !o->result) return 0;
  out->result = lg__strndup(o->result, o->result_len);
  if (!out->result) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  out->result_len = o->result_len;
  return 0;
}

static int m_peek(void *self, const char *key, const char *fp, int64_t now,
                  lg_claim_t *out, lg_error_t *err) {
  mem_ledger_t *m = self;
  op_t *o = find(m, key, lg__hash_str(key));
  fill_claim(o, fp, now, out);
  return copy_result(o, out, err);
}

static int m_claim(void *self, const char *key, const char *fp, const char *run_id,
                   int64_t lease_ms, int64_t now, lg_claim_t *out, lg_error_t *err) {
  (void)run_id;
  mem_ledger_t *m = self;
  int rc = lg__ledger_check_fp(fp, err); /* as the durable ledger's */
  if (rc) return rc;
  uint64_t h = lg__hash_str(key);
  op_t *o = find(m, key, h);
  if (o) {
    fill_claim(o, fp, now, out);
    return copy_result(o, out, err);
  }
  if ((m->used + 1) * 2 > m->cap && grow(m))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  char *k = lg__strdup(key);
  if (!k) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  size_t i = h & (m->cap - 1);
  while (m->slots[i].key) i = (i + 1) & (m->cap - 1);
  o = &m->slots[i];
  memset(o, 0, sizeof *o);
  o->key = k;
  o->hash = h;
  o->state = OP_CLAIMED;
  snprintf(o->fp, sizeof o->fp, "%s", fp);
  /* Saturated: a lease of INT64_MAX ms is "for ever", not an overflow
   * into the past (which would make the claim unknown_outcome at once). */
  o->lease_until = now > 0 && lease_ms > INT64_MAX - now ? INT64_MAX : now + lease_ms;
  m->used++;
  out->outcome = LG_CLAIM_CLAIMED;
  out->result = NULL;
  out->result_len = 0;
  out->failed = 0;
  return 0;
}

static int m_commit(void *self, const char *key, const char *result, size_t len,
                    const char *operation_id, int64_t now, lg_error_t *err) {
  (void)operation_id;
  (void)now;
  mem_ledger_t *m = self;
  op_t *o = find(m, key, lg__hash_str(key));
  if (!o) return lg__err(err, LG_ENOTFOUND, "key", -1, "no claim for key \"%s\"", key);
  if (o->state == OP_COMMITTED || o->state == OP_FAILED) return 0; /* idempotent */
  char *r = NULL;
  if (result) {
    r = lg__strndup(result, len);
    if (!r) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  o->result = r;
  o->result_len = r ? len : 0;
  o->state = OP_COMMITTED;
  return 0;
}

/* Removes o, re-inserting the rest of its probe run (no tombstones). */
static void remove_op(mem_ledger_t *m, op_t *o) {
  lg__free(o->key);
  lg__free(o->result);
  memset(o, 0, sizeof *o);
  m->used--;
  size_t i = (size_t)(o - m->slots);
  for (size_t j = (i + 1) & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1)) {
    op_t moved = m->slots[j];
    memset(&m->slots[j], 0, sizeof moved);
    size_t k = moved.hash & (m->cap - 1);
    while (m->slots[k].key) k = (k + 1) & (m->cap - 1);
    m->slots[k] = moved;
  }
}

static int m_fail(void *self, const char *key, int retryable, int64_t now, lg_error_t *err) {
  (void)now;
  mem_ledger_t *m = self;
  op_t *o = find(m, key, lg__hash_str(key));
  if (!o) return lg__err(err, LG_ENOTFOUND, "key", -1, "no claim for key \"%s\"", key);
  if (o->state == OP_COMMITTED) return 0; /* an outcome is final */
  if (retryable) remove_op(m, o);
  else o->state = OP_FAILED;
  return 0;
}

static void m_destroy(void *self) {
  mem_ledger_t *m = self;
  if (!m) return;
  for (size_t i = 0; i < m->cap; i++) {
    lg__free(m->slots[i].key);
    lg__free(m->slots[i].result);
  }
  lg__free(m->slots);
  lg__free(m);
}

static const lg_ledger_methods_t memory_methods = {1, m_claim, m_peek, m_commit, m_fail, m_destroy};

lg_ledger_t *lg_ledger_memory_new(void) {
  lg_ledger_t *l = lg__calloc(1, sizeof *l);
  mem_ledger_t *m = lg__calloc(1, sizeof *m);
  if (!l || !m) {
    lg__free(l);
    lg__free(m);
    return NULL;
  }
  l->methods = &memory_methods;
  l->self = m;
  return l;
}

void lg_ledger_free(lg_ledger_t *l) {
  if (!l) return;
  if (l->methods && l->methods->destroy) l->methods->destroy(l->self);
  lg__free(l);
}

void lg_claim_clear(lg_claim_t *c) {
  if (!c) return;
  lg__free(c->result);
  c->result = NULL;
  c->result_len = 0;
}

const char *lg_claim_outcome_name(lg_claim_outcome_t o) {
  static const char *names[] = {"free", "claimed", "replay", "in_progress", "mismatch",
                                "unknown_outcome"};
  return (unsigned)o < LG__ARRAY_LEN(names) ? names[o] : "?";
}
