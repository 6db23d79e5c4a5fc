/*
 * engine.c — the per-run decision state machine.
 *
 * A run is in one of two states, ACTIVE and STOPPED, and moves from the
 * first to the second only through stop() below, which records why (the
 * reason, the guard that fired, the call it refused) so that the terminal
 * envelope and the logs can say what happened. Every event function reads
 * the run, decides, and then changes it; on an error (a malformed call, a
 * ledger that did not answer) nothing in the run has changed yet, so the
 * caller may simply try again.
 *
 * The engine is pure: no I/O, no clock, no globals. Time arrives with each
 * event (t_ms since the run started). The only thing it calls out to is the
 * idempotency ledger interface, which for replay is in memory and for the
 * server is a store.
 *
 * before(call) applies the rules of policy-v1 in their order:
 *   1 stopped → stop; 2 caps → stop; 3 ladder stop rung / short cycle →
 *   stop; 4 idempotency key committed → replay, held elsewhere → block;
 *   5 retry_after_ms not passed → block; 6 ladder block rung → block;
 *   7 execute (with a steer message at the observe rung).
 */
#include "engine.h"
#include "../canon/canon.h" /* lg__canon_fp_of: derived idempotency keys */

#include <stdio.h>

/* ------------------------------------------------------------------ */
/* Small helpers.                                                       */

static uint64_t fp64_of_hex(const char *hex) {
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) v = (v << 4) | lg__hex_value[(unsigned char)hex[i]];
  return v;
}


int lg__run_tool(lg_run_t *run, const char *name) {
  for (int i = 0; i < run->ntools; i++)
    if (run->tools[i].name[0] == name[0] && !strcmp(run->tools[i].name, name)) return i;
  if (run->ntools == run->captools) {
    int cap = run->captools ? run->captools * 2 : 4;
    lg__tool_t *t = lg__realloc(run->tools, (size_t)cap * sizeof *t);
    if (!t) return -1;
    run->tools = t;
    run->captools = cap;
  }
  char *n = lg__strdup(name);
  if (!n) return -1;
  run->tools[run->ntools] = (lg__tool_t){n, 0, 0};
  return run->ntools++;
}

static const char *tool_name(const lg_run_t *run, int i) {
  return i >= 0 && i < run->ntools ? run->tools[i].name : "?";
}

/* Resets a decision; borrowed strings of the previous one are released. */
static void reset(lg_run_t *run, lg_decision_t *d) {
  /* Field by field: a memset of the whole struct (its fingerprint array
   * included) costs more than the rest of a plain decision. */
  d->action = LG_ACT_EXECUTE;
  d->reason = LG_R_NONE;
  d->reason_text = "";
  d->guard = "";
  d->repeat = 0;
  d->fingerprint[0] = 0;
  d->call_id = d->idempotency_key = d->message = d->hide_tool = d->saved_result = NULL;
  d->hide_turns = 0;
  d->alternatives = 0;
  d->saved_result_len = 0;
  d->next_allowed_action = LG_NEXT_NONE;
  d->reservation = 0;
  d->escalate_model = NULL;
  d->escalate_turns = 0;
  d->operator_note = NULL;
  run->msg.len = 0;
  run->msg.oom = false; /* scratch reused per decision: a failure must not stick */
  if (run->msg.data) run->msg.data[0] = 0;
  lg_claim_clear(&run->claim);
}

/* Makes room in run->msg for the longest steer message a decision can
 * write, before the decision changes anything: writing the message later,
 * after counters and the ledger have moved, must not fail (a message lost
 * to out-of-memory would be a recovery hint silently gone, for good once
 * the run stops). `names` is the length of the names it may quote. */
static int msg_room(lg_run_t *run, size_t names) {
  return lg__buf_reserve(&run->msg, 448 + names);
}

static void set_message(lg_run_t *run, lg_decision_t *d) {
  d->message = run->msg.data && run->msg.len ? run->msg.data : NULL;
}

/* Loops may be resumed once something changed (lg_run_resume); a cap
 * would stop a resumed run again at once (the policy is the run's for
 * good), so caps, like every other stop, go to a person. */
static lg_next_t next_for(lg_reason_t r) {
  switch (r) {
  case LG_R_COMPLETE: return LG_NEXT_NONE;
  case LG_R_SAME_CALL_REPEAT:
  case LG_R_SHORT_CYCLE:
  case LG_R_NO_PROGRESS:
  case LG_R_FAILURE_STREAK:
  case LG_R_TEXT_REPEAT:
  case LG_R_MONOLOGUE:
  case LG_R_CONTEXT_LOOP:
  case LG_R_BLOCK_STREAK: return LG_NEXT_RESUME_AFTER_CHANGE;
  default: return LG_NEXT_HUMAN_REVIEW;
  }
}

/* Fills d with the run's stop (for any event after it). */
static void stopped_decision(lg_run_t *run, lg_decision_t *d) {
  d->action = LG_ACT_STOP;
  d->reason = run->reason;
  d->reason_text = lg_reason_name(run->reason);
  d->operator_note = run->reason_text;
  d->guard = run->guard;
  d->next_allowed_action = run->next;
  d->alternatives = run->alternatives;
  d->message = run->stop_message;
}

/* ACTIVE → STOPPED. The steer message in run->msg (if any) becomes the
 * envelope's message: the buffer is handed over rather than copied, so that
 * a stop decided after the run has already changed (after(), state()) can
 * not fail half-way. Returns 0, or LG_ENOMEM with the run unchanged (only
 * for an operator's own `text`, which no such caller passes). */
static int stop(lg_run_t *run, lg_decision_t *d, lg_reason_t reason, const char *guard,
                const char *text, int64_t t_ms) {
  char *rt = NULL, *sm = NULL;
  if (text && strcmp(text, lg_reason_name(reason)) && !(rt = lg__strdup(text)))
    return LG_ENOMEM;
  if (run->msg.len && run->msg.data) {
    sm = run->msg.data;
    run->msg = (lg__buf_t){0};
  }
  run->stopped = true;
  run->reason = reason;
  run->reason_text = rt;
  run->guard = guard;
  run->next = next_for(reason);
  run->stop_message = sm;
  run->stopped_at_ms = t_ms;
  run->alternatives = run->next == LG_NEXT_RESUME_AFTER_CHANGE
                          ? LG_ALT_ASK_HUMAN | LG_ALT_FINALIZE_PARTIAL | LG_ALT_ESCALATE_MODEL
                          : run->next == LG_NEXT_HUMAN_REVIEW ? LG_ALT_ASK_HUMAN : 0;
  stopped_decision(run, d);
  return 0;
}

/* Records the call a stop refused, for the envelope. */
static int refuse(lg_run_t *run, const char *tool, const char *call_id, const char *fp,
                  const char *km, size_t km_len, int64_t turn) {
  char *t = lg__strdup(tool), *c = lg__strdup(call_id);
  char *k = lg__strndup(km, km_len > LG__KM_MAX ? LG__KM_MAX : km_len);
  if (!t || !c || !k) {
    lg__free(t);
    lg__free(c);
    lg__free(k);
    return LG_ENOMEM;
  }
  /* A retry after a failure further on must not leak the first copies. */
  lg__free(run->refused_tool);
  lg__free(run->refused_call_id);
  lg__free(run->refused_km);
  run->refused_tool = t;
  run->refused_call_id = c;
  run->refused_km = k;
  memcpy(run->refused_fp, fp, LG_FP_HEX);
  run->refused_turn = turn;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Window.                                                              */

static const lg__win_t *win_at(const lg_run_t *run, int back) {
  /* back = 1 is the newest entry. */
  int i = run->win_head - back;
  if (i < 0) i += run->win_cap;
  return &run->win[i];
}

static void win_push(lg_run_t *run, uint64_t fp, int64_t turn) {
  run->win[run->win_head] = (lg__win_t){fp, turn};
  run->win_head = (run->win_head + 1) % run->win_cap;
  if (run->win_len < run->win_cap) run->win_len++;
}

/* Counts fp among the last `window` entries; *same_turn when one of them
 * was asked for in `turn`. */
static int64_t win_count(const lg_run_t *run, uint64_t fp, int64_t turn, bool *same_turn) {
  int64_t n = 0;
  int look = run->win_len < run->policy->rep_window ? run->win_len : (int)run->policy->rep_window;
  *same_turn = false;
  for (int b = 1; b <= look; b++) {
    const lg__win_t *w = win_at(run, b);
    if (w->fp != fp) continue;
    n++;
    if (w->turn == turn) *same_turn = true;
  }
  return n;
}

/* The period p (2..max_period) of a cycle that fp would complete for the
 * second time, or 0. */
static int win_cycle(const lg_run_t *run, uint64_t fp) {
  for (int p = 2; p <= run->policy->cycle_max_period; p++) {
    if (run->win_len < 2 * p - 1) break;
    /* x[0..2p) with x[2p-1] = fp and x[j] = win_at(2p-1-j). */
    uint64_t x[2 * LG__CYCLE_MAX];
    for (int j = 0; j < 2 * p - 1; j++) x[j] = win_at(run, 2 * p - 1 - j)->fp;
    x[2 * p - 1] = fp;
    bool ok = true;
    for (int j = 0; j < p && ok; j++) ok = x[j] == x[j + p];
    for (int a = 0; a < p && ok; a++)
      for (int b = a + 1; b < p && ok; b++) ok = x[a] != x[b];
    if (ok) return p;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Tried keys and operations (the envelope's memory of the run).        */

static void tried_note(lg_run_t *run, const char *hex, uint64_t fp64, int tool, int outcome,
                       bool count) {
  /* One scan finds the key, or the least recently seen entry to reuse. */
  lg__tried_t *t = NULL, *oldest = NULL;
  for (int i = 0; i < run->ntried; i++) {
    lg__tried_t *e = &run->tried[i];
    if (e->fp64 == fp64) {
      if (!memcmp(e->hex, hex, 64)) {
        t = e;
        break;
      }
    }
    if (!oldest || e->seq < oldest->seq) oldest = e;
  }
  if (!t) { /* a key not seen lately */
    t = run->ntried < LG__TRIED_MAX ? &run->tried[run->ntried++] : oldest;
    memset(t, 0, sizeof *t);
    memcpy(t->hex, hex, 64);
    t->fp64 = fp64;
    t->tool = tool;
  }
  if (count) t->count++;
  t->last = (uint8_t)outcome;
  t->seq = run->seq;
}

static void tried_status(lg_run_t *run, uint64_t fp, lg_status_t st) {
  for (int i = 0; i < run->ntried; i++)
    if (run->tried[i].fp64 == fp) run->tried[i].last = (uint8_t)st;
}

static void op_note(lg_run_t *run, const char *key, int state, const char *operation_id) {
  lg__op_t *o = NULL;
  for (int i = 0; i < run->nops; i++)
    if (!strcmp(run->ops[i].key, key)) o = &run->ops[i];
  if (!o) {
    char *k = lg__strdup(key);
    if (!k) return; /* the envelope loses a line, the decision stands */
    if (run->nops == LG__OPS_MAX) {
      lg__free(run->ops[0].key);
      lg__free(run->ops[0].operation_id);
      memmove(run->ops, run->ops + 1, (LG__OPS_MAX - 1) * sizeof *run->ops);
      run->nops--;
    }
    o = &run->ops[run->nops++];
    memset(o, 0, sizeof *o);
    o->key = k;
  }
  o->state = (uint8_t)state;
  if (operation_id) {
    char *id = lg__strdup(operation_id);
    if (id) {
      lg__free(o->operation_id);
      o->operation_id = id;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Life of a run.                                                       */

lg_run_t *lg_run_new(const char *run_id, const char *group, lg_policy_t *policy,
                     const int64_t *checkpoint, lg_ledger_t *ledger, lg_error_t *err) {
  if (!run_id || !*run_id) {
    lg__err(err, LG_EINVAL, "run_id", -1, "a run needs a non-empty run_id");
    return NULL;
  }
  lg_run_t *run = lg__calloc(1, sizeof *run);
  if (!run) goto oom;
  run->policy = policy ? lg_policy_ref(policy) : lg_policy_default();
  run->run_id = lg__strdup(run_id);
  run->group = group ? lg__strdup(group) : NULL;
  if (!run->policy || !run->run_id || (group && !run->group)) goto oom;
  int64_t w = run->policy->rep_window;
  if (w < 2 * run->policy->cycle_max_period) w = 2 * run->policy->cycle_max_period;
  run->win_cap = (int)(w < 1 ? 1 : w);
  run->win = lg__calloc((size_t)run->win_cap, sizeof *run->win);
  if (!run->win) goto oom;
  if (!ledger) {
    run->own_ledger = lg_ledger_memory_new();
    if (!run->own_ledger) goto oom;
    ledger = run->own_ledger;
  }
  run->ledger = ledger;
  run->hidden = -1;
  lg__text_clear(run);
  if (checkpoint) {
    run->has_best = true;
    run->best = *checkpoint;
  }
  return run;
oom:
  lg_run_free(run);
  lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return NULL;
}

void lg_run_free(lg_run_t *run) {
  if (!run) return;
  lg__free(run->run_id);
  lg__free(run->group);
  lg_policy_free(run->policy);
  lg_ledger_free(run->own_ledger);
  lg__free(run->win);
  for (int i = 0; i < run->ntools; i++) lg__free(run->tools[i].name);
  lg__free(run->tools);
  for (int i = 0; i < run->npending; i++) {
    lg__free(run->pending[i].call_id);
    lg__free(run->pending[i].key);
  }
  for (int i = 0; i < run->nops; i++) {
    lg__free(run->ops[i].key);
    lg__free(run->ops[i].operation_id);
  }
  lg__free(run->reason_text);
  lg__free(run->stop_message);
  lg__free(run->refused_tool);
  lg__free(run->refused_call_id);
  lg__free(run->refused_km);
  lg__free(run->answer);
  lg__buf_free(&run->msg);
  lg__buf_free(&run->call_id_buf);
  lg__buf_free(&run->key_buf);
  lg_claim_clear(&run->claim);
  lg__free(run);
}

const char *lg_run_id(const lg_run_t *run) { return run->run_id; }
const char *lg_run_group(const lg_run_t *run) { return run->group; }
const lg_policy_t *lg_run_policy(const lg_run_t *run) { return run->policy; }
int lg_run_stopped(const lg_run_t *run) { return run->stopped; }
const char *lg_run_terminal_reason(const lg_run_t *run) {
  if (!run->stopped) return NULL;
  return lg_reason_name(run->reason); /* one of the documented set, always */
}
void lg_run_counters(const lg_run_t *run, lg_counters_t *out) { *out = run->c; }

/* ------------------------------------------------------------------ */
/* The recovery cascade.                                                */

/* A block hides the blocked tool for cascade.hide_turns model calls and
 * offers cascade.offer meanwhile, and escalates for cascade.escalate.turns
 * model calls. One tool is hidden at a time: the latest block's. */
static void cascade_block(lg_run_t *run, lg_decision_t *d, int tool) {
  const lg_policy_t *p = run->policy;
  if (p->hide_turns > 0) {
    run->hidden = tool;
    run->hide_left = p->hide_turns;
    run->offer_live = true;
    d->hide_tool = tool_name(run, tool);
    d->hide_turns = (uint32_t)p->hide_turns;
    d->alternatives = p->offer;
  }
  if (p->escalate_model) {
    run->escalate_left = p->escalate_turns;
    d->escalate_model = p->escalate_model;
    d->escalate_turns = (uint32_t)p->escalate_turns;
  }
}

/* A model call let through: it carries what is still hidden (counting it
 * down) and the escalation. The offer is live for the tool calls of this
 * call's response exactly when it was shown the offer. */
static void cascade_model(lg_run_t *run, lg_decision_t *d) {
  const lg_policy_t *p = run->policy;
  run->offer_live = false;
  if (run->hidden >= 0 && run->hide_left > 0) {
    d->hide_tool = tool_name(run, run->hidden);
    d->hide_turns = (uint32_t)run->hide_left;
    d->alternatives = p->offer;
    run->offer_live = true;
    if (--run->hide_left == 0) run->hidden = -1;
  }
  if (run->escalate_left > 0 && p->escalate_model) {
    d->escalate_model = p->escalate_model;
    d->escalate_turns = (uint32_t)run->escalate_left;
    run->escalate_left--;
  }
}

/* The loop guards start again (a new episode, a resume): window, cycles,
 * no-progress, streaks, text, compactions and the cascade. Caps, counters,
 * cost, the best progress_version, retry waits and the ledger carry on. */
static void fresh_start(lg_run_t *run) {
  run->win_len = run->win_head = 0;
  run->np_count = 0;
  run->has_world = false;
  run->world = 0;
  run->world_same = 0;
  for (int i = 0; i < run->ntools; i++) run->tools[i].fail_streak = 0;
  run->block_streak = 0;
  run->compactions = 0;
  lg__text_clear(run);
  run->hidden = -1;
  run->hide_left = 0;
  run->offer_live = false;
  run->escalate_left = 0;
}

/* ms still to wait until not_before, without overflow. */
static int64_t wait_ms(int64_t not_before, int64_t t) {
  int64_t r;
  return __builtin_sub_overflow(not_before, t, &r) ? INT64_MAX : r;
}

/* ------------------------------------------------------------------ */
/* before(call)                                                         */

/* Sets a borrowed string of the decision (*out) from s, in buf. */
static int set_owned(lg__buf_t *buf, const char **out, const char *s) {
  *out = NULL;
  if (!s) return 0;
  buf->len = 0;
  buf->oom = false; /* an earlier failed append must not fail every later one */
  if (lg__buf_puts(buf, s)) return LG_ENOMEM;
  *out = buf->data;
  return 0;
}

static int claim_decision(lg_run_t *run, lg_decision_t *d, const lg_claim_t *cl,
                          const char *tool, const char *key) {
  switch (cl->outcome) {
  case LG_CLAIM_REPLAY:
    d->action = LG_ACT_REPLAY;
    d->reason = LG_R_ALREADY_COMMITTED;
    d->guard = "ledger";
    d->saved_result = run->claim.result;
    d->saved_result_len = run->claim.result_len;
    lg__buf_printf(&run->msg,
                   "I already did this %s operation (key %s); I am handing back its "
                   "saved result instead of doing it twice.",
                   tool, key);
    return 1;
  case LG_CLAIM_IN_PROGRESS:
    d->action = LG_ACT_BLOCK;
    d->reason = LG_R_IN_PROGRESS;
    d->guard = "ledger";
    lg__buf_printf(&run->msg,
                   "The same %s operation (key %s) is still running; running it again "
                   "could do it twice, so I will wait for its result instead.",
                   tool, key);
    return 1;
  case LG_CLAIM_MISMATCH:
    d->action = LG_ACT_BLOCK;
    d->reason = LG_R_IDEMPOTENCY_MISMATCH;
    d->guard = "ledger";
    lg__buf_printf(&run->msg,
                   "The key %s already belongs to a different %s request; I must not "
                   "reuse it for other arguments.",
                   key, tool);
    return 1;
  case LG_CLAIM_UNKNOWN_OUTCOME:
    d->action = LG_ACT_STOP;
    d->reason = LG_R_UNKNOWN_OUTCOME;
    d->guard = "ledger";
    lg__buf_printf(&run->msg,
                   "An earlier %s operation with key %s never reported whether it "
                   "happened; retrying blindly could do it twice, so a person has to "
                   "reconcile it first.",
                   tool, key);
    return 1;
  default: return 0;
  }
}

/* A call of a cascade.offer tool ("ask_human", "finalize_partial") while
 * it is offered ends the run: human_required with the question, or
 * complete with the partial answer; the call's arguments (canonical) go in
 * the envelope. Returns 1 when it did, 0 when the call is not one, or an
 * error with the run unchanged. */
static int offered_call(lg_run_t *run, lg_canon_t *canon, const lg_call_t *call, const char *km,
                        size_t km_len, lg_decision_t *d, lg_error_t *err) {
  unsigned bit = !strcmp(call->tool, "ask_human")          ? LG_ALT_ASK_HUMAN
                 : !strcmp(call->tool, "finalize_partial") ? LG_ALT_FINALIZE_PARTIAL
                                                           : 0;
  if (!bit || !run->offer_live || !(run->policy->offer & bit)) return 0;
  const char *cj = km_len ? km : "{}";
  size_t cl = km_len ? km_len : 2;
  if (canon && call->args && call->args_len) {
    int rc = lg_canon_json(canon, call->args, call->args_len, &cj, &cl, err);
    if (rc) {
      lg__err_field_prefix(err, "args");
      return rc;
    }
  }
  bool trunc = cl > LG__ANSWER_MAX;
  char *a = lg__strndup(cj, trunc ? LG__ANSWER_MAX : cl);
  if (!a) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  bool ask = bit == LG_ALT_ASK_HUMAN;
  lg__buf_puts(&run->msg, ask ? "I have asked a person for help; their answer decides what "
                                "happens next."
                              : "I am finishing with the partial answer I have.");
  stop(run, d, ask ? LG_R_HUMAN_REQUIRED : LG_R_COMPLETE, "cascade", NULL, call->t_ms);
  lg__free(run->answer);
  run->answer = a;
  run->answer_kind = ask ? LG__ANS_QUESTION : LG__ANS_PARTIAL;
  run->answer_trunc = trunc;
  run->c.calls++;
  run->c.last_t_ms = call->t_ms;
  d->call_id = run->call_id;
  d->idempotency_key = run->key;
  return 1;
}

int lg_run_before(lg_run_t *run, lg_canon_t *canon, const lg_call_t *call, lg_decision_t *d,
                  lg_error_t *err) {
  return lg__run_before(run, canon, call, false, d, err);
}

/* One call being decided: what before() works out once and every rule
 * reads. The strings are the caller's (call) or the run's (call_id, key). */
typedef struct bctx {
  const lg_call_t *call;
  const lg__toolpol_t *tp; /* the tool's policy, or NULL */
  int tool;                /* index into run->tools */
  char hex[LG_FP_HEX];     /* the fingerprint */
  uint64_t fp;             /* its first 8 bytes */
  const char *km;          /* key material (for the refused call), */
  size_t km_len;           /*   borrowed from the canonicaliser */
  const char *call_id;     /* given or "c<N>" (in idbuf) */
  char idbuf[32];
  const char *key;         /* idempotency key (run->key), or NULL */
  bool counted;            /* the call enters the repeat window */
  bool same_turn;          /* an identical call of its turn is in it */
  int64_t n;               /* the n-th identical call */
  int64_t t;               /* its time */
} bctx_t;

/* The fingerprint of the call (computed, or the caller's, checked unless
 * trusted). */
static int before_fingerprint(lg_run_t *run, lg_canon_t *canon, bctx_t *x, bool trusted_fp,
                              lg_error_t *err) {
  const lg_call_t *call = x->call;
  x->km = call->key_material ? call->key_material : "";
  x->km_len = call->key_material ? call->key_material_len : 0;
  if (call->fingerprint && trusted_fp) {
    memcpy(x->hex, call->fingerprint, LG_FP_HEX);
  } else if (call->fingerprint) {
    unsigned ok = 1;
    for (int k = 0; k < 64 && call->fingerprint[k]; k++) ok &= lg__hex_value[(unsigned char)call->fingerprint[k]] != 0xFF;
    if (!ok || strnlen(call->fingerprint, 65) != 64)
      return lg__err(err, LG_EINVAL, "fingerprint", -1, "a fingerprint is 64 lowercase hex digits");
    memcpy(x->hex, call->fingerprint, LG_FP_HEX);
  } else {
    int rc = lg_canon_fingerprint(canon, run->policy, call->tool, call->args, call->args_len,
                                  x->hex, &x->km, &x->km_len, err);
    if (rc) {
      lg__err_field_prefix(err, "args");
      return rc;
    }
  }
  return 0;
}

/* The call's tool, id and idempotency key, and its place on the ladder.
 * Changes nothing a retry would see but the tool table (a new name). */
static int before_prepare(lg_run_t *run, bctx_t *x, lg_decision_t *d, lg_error_t *err) {
  const lg_call_t *call = x->call;
  if (msg_room(run, strlen(call->tool) + (call->idempotency_key ? strlen(call->idempotency_key)
                                                                  : strlen(run->run_id) + 70)))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  x->tp = lg__policy_tool(run->policy, call->tool);
  x->tool = lg__run_tool(run, call->tool);
  if (x->tool < 0) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  x->call_id = call->call_id;
  if (!x->call_id) { /* "c<N>", without the cost of printf on the hot path */
    char digits[24];
    int nd = 0;
    for (uint64_t v = (uint64_t)run->c.calls + 1; v; v /= 10) digits[nd++] = (char)('0' + v % 10);
    x->idbuf[0] = 'c';
    for (int k = 0; k < nd; k++) x->idbuf[1 + k] = digits[nd - 1 - k];
    x->idbuf[1 + nd] = 0;
    x->call_id = x->idbuf;
  }
  char *derived = NULL;
  const char *key = call->idempotency_key;
  if (!key && x->tp && x->tp->side_effects) {
    /* A fixed length whatever the run id: "lg:" + SHA-256 hex of
     * run_id "\n" loop key (the loop key is 64 hex, so the split is
     * unambiguous). A key that embedded the run id passed the ledger's
     * 1024-byte limit for a long run id. */
    char kh[LG_FP_HEX];
    if (lg__canon_fp_of(NULL, run->run_id, x->hex, 64, kh) || !(derived = lg__malloc(3 + 64 + 1)))
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    memcpy(derived, "lg:", 3);
    memcpy(derived + 3, kh, 64);
    derived[67] = 0;
    key = derived;
  }
  if (set_owned(&run->call_id_buf, &run->call_id, x->call_id) ||
      set_owned(&run->key_buf, &run->key, key)) {
    lg__free(derived);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  lg__free(derived);
  d->call_id = run->call_id;
  d->idempotency_key = run->key;
  x->key = run->key;
  x->fp = fp64_of_hex(x->hex);
  x->counted = !(x->tp && x->tp->key_mode == LG__KEY_OFF);
  x->same_turn = false;
  x->n = x->counted ? win_count(run, x->fp, call->turn, &x->same_turn) : 0;
  if (x->counted && !x->same_turn) x->n++;
  d->repeat = (uint32_t)(x->counted ? x->n : 0);
  x->t = call->t_ms;
  return 0;
}

/* Rules 2 and 3: a cap, the ladder's stop rung, a short cycle. Returns the
 * reason (LG_R_NONE: none applies) with its guard and message written. */
static lg_reason_t before_halt(lg_run_t *run, const bctx_t *x, const char **guard) {
  const lg_policy_t *p = run->policy;
  const char *tool = x->call->tool;
  *guard = "caps";
  if (p->max_wall_ms >= 0 && x->t >= p->max_wall_ms) {
    lg__buf_printf(&run->msg, "This run has used its %lld ms of wall-clock time; I am stopping.",
                   (long long)p->max_wall_ms);
    return LG_R_WALL_CLOCK_CAP;
  }
  if (p->max_steps >= 0 && run->c.steps >= p->max_steps) {
    lg__buf_printf(&run->msg, "I have run %lld tool calls, the most this run allows; I am stopping.",
                   (long long)run->c.steps);
    return LG_R_STEP_CAP;
  }
  if (x->tp && x->tp->max_calls >= 0 && run->tools[x->tool].executed >= x->tp->max_calls) {
    lg__buf_printf(&run->msg, "I have run %s %lld times, the most this run allows; I am stopping.",
                   tool, (long long)run->tools[x->tool].executed);
    return LG_R_TOOL_CALL_CAP;
  }
  if (x->counted && p->rep_stop && x->n >= p->rep_stop) {
    *guard = "repeat";
    lg__buf_printf(&run->msg,
                   "I have asked to call %s with the same arguments %lld times without any "
                   "progress; asking again will not help, so I am stopping for someone to look "
                   "at it.",
                   tool, (long long)x->n);
    return LG_R_SAME_CALL_REPEAT;
  }
  int period = 0;
  if (x->counted && !x->same_turn && (period = win_cycle(run, x->fp))) {
    *guard = "cycle";
    lg__buf_printf(&run->msg,
                   "I keep going round the same %d calls (the last one %s) and nothing "
                   "changes; another round will not help, so I am stopping.",
                   period, tool);
    return LG_R_SHORT_CYCLE;
  }
  return LG_R_NONE;
}

/* A stop of before() (rules 2 and 3, unknown_outcome, block_streak): the
 * refused call is recorded and the run stops; only then is it counted, so
 * that on out-of-memory a retry sees the same run. `how`: STOP_AT_T moves
 * elapsed_ms to the call's time, STOP_TRIED lists the call among the tried
 * keys (as each of these stops always has, or not). */
enum { STOP_AT_T = 1, STOP_TRIED = 2 };
static int before_stop(lg_run_t *run, const bctx_t *x, lg_decision_t *d, lg_reason_t reason,
                       const char *guard, unsigned how, lg_error_t *err) {
  const lg_call_t *call = x->call;
  if (refuse(run, call->tool, x->call_id, x->hex, x->km, x->km_len, call->turn) ||
      stop(run, d, reason, guard, NULL, x->t)) {
    reset(run, d);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  run->c.calls++;
  if (how & STOP_AT_T) run->c.last_t_ms = x->t;
  if (how & STOP_TRIED) tried_note(run, x->hex, x->fp, x->tool, LG__OUT_BLOCKED, true);
  d->repeat = (uint32_t)(x->counted ? x->n : 0);
  memcpy(d->fingerprint, x->hex, LG_FP_HEX);
  d->call_id = run->call_id;
  d->idempotency_key = run->key;
  return 0;
}

/* Rules 4 to 6: the ledger's peek, retry_after_ms, the ladder's block
 * rung. Returns 1 when one decided (d filled), 0 when none applies, or a
 * ledger error. */
static int before_refuse(lg_run_t *run, const bctx_t *x, lg_decision_t *d, lg_error_t *err) {
  const lg_policy_t *p = run->policy;
  const char *tool = x->call->tool;
  if (x->key) {
    int rc = run->ledger->methods->peek(run->ledger->self, x->key, x->hex, x->t, &run->claim, err);
    if (rc) return rc;
    if (claim_decision(run, d, &run->claim, tool, x->key)) return 1;
  }
  for (int i = 0; i < run->nretry; i++) {
    if (run->retry[i].fp == x->fp && x->t < run->retry[i].not_before) {
      d->action = LG_ACT_BLOCK;
      d->reason = LG_R_RETRY_TOO_SOON;
      d->guard = "retry";
      lg__buf_printf(&run->msg,
                     "%s asked me to wait %lld ms more before I retry the same call; I will "
                     "do something else first or wait.",
                     tool, (long long)wait_ms(run->retry[i].not_before, x->t));
      return 1;
    }
  }
  if (x->counted && p->rep_block && x->n >= p->rep_block) {
    d->action = LG_ACT_BLOCK;
    d->reason = LG_R_SAME_CALL_REPEAT;
    d->guard = "repeat";
    lg__buf_printf(&run->msg,
                   "I have asked to call %s with the same arguments %lld times without any "
                   "progress, so this call was not run; asking again will not help. I will "
                   "change the arguments, use another tool, ask a person, or finish with what "
                   "I have.",
                   tool, (long long)x->n);
    return 1;
  }
  return 0;
}

/* Rule 7: execute, claiming the key first (the claim may still answer
 * otherwise: d filled by claim_decision). */
static int before_execute(lg_run_t *run, const bctx_t *x, lg_decision_t *d, lg_error_t *err) {
  const lg_policy_t *p = run->policy;
  const char *key = x->key;
  if (key) {
    lg_claim_clear(&run->claim);
    int rc = run->ledger->methods->claim(run->ledger->self, key, x->hex, run->run_id,
                                         p->max_wall_ms > 0 ? p->max_wall_ms : 600000, x->t,
                                         &run->claim, err);
    if (rc) {
      run->msg.len = 0;
      return rc;
    }
    if (claim_decision(run, d, &run->claim, x->call->tool, key)) return 0;
  }
  if (run->npending == LG__PENDING_MAX) {
    if (key) run->ledger->methods->fail(run->ledger->self, key, 1, x->t, NULL);
    return lg__err(err, LG_ESTATE, "call_id", -1,
                   "%d calls are already waiting for their results", LG__PENDING_MAX);
  }
  char *pid = lg__strdup(x->call_id);
  char *pkey = key ? lg__strdup(key) : NULL;
  if (!pid || (key && !pkey)) {
    lg__free(pid);
    lg__free(pkey);
    if (key) run->ledger->methods->fail(run->ledger->self, key, 1, x->t, NULL);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  run->pending[run->npending++] = (lg__pending_t){pid, pkey, x->fp, x->tool};
  d->action = LG_ACT_EXECUTE;
  run->c.steps++;
  run->tools[x->tool].executed++;
  run->block_streak = 0; /* an executed call ends every streak */
  run->compactions = 0;
  lg__text_call(run);
  if (key) op_note(run, key, LG__RUNOP_CLAIMED, NULL);
  if (x->counted && p->rep_observe && x->n >= p->rep_observe)
    lg__buf_printf(&run->msg,
                   "I have now called %s with the same arguments %lld times. If the last "
                   "answer did not help, repeating it will not either: I should change the "
                   "arguments or try something else.",
                   x->call->tool, (long long)x->n);
  return 0;
}

/* The decision of rules 4 to 7 becomes the run's: counters, the window,
 * the block streak and the cascade. */
static int before_commit(lg_run_t *run, const bctx_t *x, lg_decision_t *d, lg_error_t *err) {
  const lg_policy_t *p = run->policy;
  if (d->action == LG_ACT_STOP) /* unknown_outcome */
    return before_stop(run, x, d, d->reason, "ledger", STOP_AT_T, err);
  if (d->action == LG_ACT_BLOCK && p->block_streak && run->block_streak + 1 >= p->block_streak) {
    run->msg.len = 0;
    if (run->msg.data) run->msg.data[0] = 0;
    lg__buf_printf(&run->msg,
                   "My last %lld tool calls were all refused (this one %s: %s); I keep asking "
                   "for things that cannot run, so I am stopping for someone to look at it.",
                   (long long)run->block_streak + 1, x->call->tool, lg_reason_name(d->reason));
    return before_stop(run, x, d, LG_R_BLOCK_STREAK, "block_streak", STOP_AT_T | STOP_TRIED, err);
  }
  if (d->action == LG_ACT_BLOCK) {
    run->block_streak++;
    cascade_block(run, d, x->tool);
  }
  run->c.calls++;
  run->c.last_t_ms = x->t;
  if (d->action == LG_ACT_BLOCK) run->c.blocked++;
  if (d->action == LG_ACT_REPLAY) {
    run->c.replayed++;
    op_note(run, x->key, LG__RUNOP_REPLAYED, NULL);
  }
  if (d->action != LG_ACT_EXECUTE) d->reason_text = lg_reason_name(d->reason);
  if (x->counted && !x->same_turn) win_push(run, x->fp, x->call->turn);
  tried_note(run, x->hex, x->fp, x->tool,
             d->action == LG_ACT_EXECUTE  ? LG__OUT_EXECUTED
             : d->action == LG_ACT_REPLAY ? LG__OUT_REPLAYED
                                          : LG__OUT_BLOCKED,
             true);
  set_message(run, d);
  return 0;
}

int lg__run_before(lg_run_t *run, lg_canon_t *canon, const lg_call_t *call, bool trusted_fp,
                   lg_decision_t *d, lg_error_t *err) {
  reset(run, d);
  if (!call || !call->tool || !*call->tool)
    return lg__err(err, LG_EINVAL, "tool", -1, "a call needs a non-empty tool name");
  /* A zero-filled call does the obvious thing: args_len 0 means the args
   * are NUL-terminated, turn 0 a turn of its own (numbered below zero by
   * the run's event count, so that replay numbers it the same). */
  lg_call_t fixed;
  if ((call->args && !call->args_len) || !call->turn) {
    fixed = *call;
    if (fixed.args && !fixed.args_len) fixed.args_len = strlen(fixed.args);
    if (!fixed.turn) fixed.turn = -(int64_t)(run->seq + 1) - ((int64_t)1 << 40);
    call = &fixed;
  }
  /* trace-v1: a call's args is an object. The trace reader and the
   * sidecar's body check refuse anything else before it comes here; a
   * gateway call's arguments are a model's text, any JSON (or none). */
  size_t a0 = call->args ? lg__json_ws_end(call->args, 0, call->args_len) : 0;
  if (call->args && (a0 == call->args_len || call->args[a0] != '{'))
    return lg__err(err, LG_EINVAL, "args", -1, "args: expected an object");
  bctx_t x; /* before_fingerprint fills it from the call: no zeroing on the hot path */
  x.call = call;
  int rc = before_fingerprint(run, canon, &x, trusted_fp, err);
  if (rc) return rc;
  memcpy(d->fingerprint, x.hex, LG_FP_HEX);
  /* 1: stopped. */
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if ((rc = before_prepare(run, &x, d, err))) return rc;
  /* The cascade's offered tools, while offered, end the run. */
  if ((rc = offered_call(run, canon, call, x.km, x.km_len, d, err))) return rc < 0 ? rc : 0;
  run->seq++;
  /* 2, 3: caps, the stop rung, cycles. */
  const char *guard;
  lg_reason_t halt = before_halt(run, &x, &guard);
  if (halt) return before_stop(run, &x, d, halt, guard, STOP_TRIED, err);
  /* 4 to 6: replay or block; else 7: execute. */
  if ((rc = before_refuse(run, &x, d, err)) < 0) return rc;
  if (!rc && (rc = before_execute(run, &x, d, err))) return rc;
  return before_commit(run, &x, d, err);
}

/* ------------------------------------------------------------------ */
/* after(result)                                                        */

static lg_reason_t status_reason(lg_status_t s) {
  switch (s) {
  case LG_STATUS_COMPLETE: return LG_R_COMPLETE;
  case LG_STATUS_FATAL: return LG_R_FATAL;
  case LG_STATUS_PERMISSION_DENIED: return LG_R_PERMISSION_DENIED;
  case LG_STATUS_POLICY_BLOCKED: return LG_R_POLICY_BLOCKED;
  case LG_STATUS_HUMAN_REQUIRED: return LG_R_HUMAN_REQUIRED;
  default: return LG_R_NONE;
  }
}

/* The result's guards, once the ledger has its outcome and the call is no
 * longer pending: the validation gate, progress, terminal statuses, retry
 * waits, the failure streak, no-progress. Cannot fail but for the stop's
 * out-of-memory (which stop() never has without a text). */
static int after_guards(lg_run_t *run, const lg__pending_t *pc, const lg_result_t *res,
                        bool invalid, lg_decision_t *d, lg_error_t *err) {
  const lg_policy_t *p = run->policy;
  const char *tool = tool_name(run, pc->tool);
  int64_t t = res->t_ms;
  lg_status_t st = res->status;
  lg_reason_t halt = LG_R_NONE;
  const char *guard = "";
  if (invalid) {
    halt = LG_R_INVALID_TOOL_RESULT;
    guard = "validation";
    if (st == LG_STATUS_INVALID)
      lg__buf_printf(&run->msg,
                     "%s answered without a valid status, so I cannot tell whether it "
                     "worked; I am stopping rather than guessing.",
                     tool);
    else
      lg__buf_printf(&run->msg,
                     "%s answered with an empty value, which is a failure, not a success "
                     "without data; I am stopping rather than guessing.",
                     tool);
  }
  /* Progress bookkeeping. */
  bool progressed = false;
  if (!halt && res->has_progress_version) {
    if (!run->has_best || res->progress_version > run->best) {
      run->has_best = true;
      run->best = res->progress_version;
      run->np_count = 0;
      run->win_len = 0; /* confirmed progress: a new window */
      run->win_head = 0;
      progressed = true;
    } else {
      run->np_count++;
    }
  }
  if (!halt && (halt = status_reason(st))) {
    guard = "status";
    if (st == LG_STATUS_COMPLETE)
      lg__buf_printf(&run->msg, "%s reported the task complete.", tool);
    else
      lg__buf_printf(&run->msg,
                     "%s answered %s; waiting and retrying will not cure that, so I am "
                     "stopping for a person.",
                     tool, lg_status_name(st));
  }
  if (st == LG_STATUS_RETRYABLE) {
    run->tools[pc->tool].fail_streak++;
    if (res->retry_after_ms > 0) { /* 0 (or below): no wait asked for */
      int slot = -1;
      for (int i = 0; i < run->nretry; i++)
        if (run->retry[i].fp == pc->fp) slot = i;
      if (slot < 0) {
        if (run->nretry < LG__RETRY_MAX) slot = run->nretry++;
        else {
          slot = 0; /* replace the one that frees first */
          for (int i = 1; i < run->nretry; i++)
            if (run->retry[i].not_before < run->retry[slot].not_before) slot = i;
        }
      }
      run->retry[slot] = (lg__retry_t){pc->fp, lg__sat_add(t, res->retry_after_ms)};
    }
    if (!halt && p->failure_streak && run->tools[pc->tool].fail_streak >= p->failure_streak) {
      halt = LG_R_FAILURE_STREAK;
      guard = "failure_streak";
      lg__buf_printf(&run->msg,
                     "%s has failed %lld times in a row whatever arguments I gave it; it "
                     "looks broken right now, so I am stopping instead of trying variations.",
                     tool, (long long)run->tools[pc->tool].fail_streak);
    }
  } else if (st != LG_STATUS_INVALID) {
    run->tools[pc->tool].fail_streak = 0;
  }
  if (!halt && !progressed && p->np_results && run->np_count >= p->np_results) {
    halt = LG_R_NO_PROGRESS;
    guard = "no_progress";
    lg__buf_printf(&run->msg,
                   "The last %lld results did not move the work past version %lld; doing "
                   "more of the same will not either, so I am stopping.",
                   (long long)run->np_count, (long long)run->best);
  }
  if (halt) {
    if (stop(run, d, halt, guard, NULL, t)) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    d->call_id = run->call_id;
    return 0;
  }
  d->action = LG_ACT_CONTINUE;
  return 0;
}

/* lg_run_after's first two tests: the stop, then a call waiting. */
bool lg__run_awaits_result(const lg_run_t *run) { return run->stopped || run->npending > 0; }

int lg_run_after(lg_run_t *run, const lg_result_t *res, lg_decision_t *d, lg_error_t *err) {
  reset(run, d);
  lg_result_t fixed;
  if (res->value && !res->value_len) { /* value_len 0: NUL-terminated */
    fixed = *res;
    fixed.value_len = strlen(res->value);
    res = &fixed;
  }
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  int pi = run->npending - 1; /* none: refused (lg__run_awaits_result) */
  if (res->call_id) {
    for (pi = run->npending - 1; pi >= 0; pi--)
      if (!strcmp(run->pending[pi].call_id, res->call_id)) break;
  }
  if (pi < 0)
    return lg__err(err, LG_ENOTFOUND, "call_id", -1,
                   res->call_id ? "no executed call \"%s\" is waiting for a result"
                                : "no executed call is waiting for a result%s",
                   res->call_id ? res->call_id : "");
  lg__pending_t pc = run->pending[pi];
  const char *tool = tool_name(run, pc.tool);
  if (msg_room(run, strlen(tool))) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  const lg__toolpol_t *tp = lg__policy_tool(run->policy, tool);
  int64_t t = res->t_ms;
  lg_status_t st = res->status;
  bool blank = res->value_kind == LG_VALUE_NULL || res->value_kind == LG_VALUE_BLANK;
  bool invalid = st == LG_STATUS_INVALID || (blank && !(tp && tp->empty_ok));

  /* The ledger first: an outcome that is not recorded would leave the key
   * claimed. An invalid result leaves the claim to run out of its lease:
   * nobody knows whether the side effect happened. */
  if (pc.key) {
    int rc = 0;
    int state = 0;
    if (res->side_effect_committed == 1 ||
        (!invalid && (st == LG_STATUS_PROGRESS || st == LG_STATUS_COMPLETE))) {
      rc = run->ledger->methods->commit(run->ledger->self, pc.key,
                                        res->value_kind == LG_VALUE_ABSENT ? NULL : res->value,
                                        res->value_len, res->operation_id, t, err);
      state = LG__RUNOP_COMMITTED;
    } else if (!invalid) {
      rc = run->ledger->methods->fail(run->ledger->self, pc.key, st == LG_STATUS_RETRYABLE, t, err);
      state = st == LG_STATUS_RETRYABLE ? LG__RUNOP_RELEASED : LG__RUNOP_FAILED;
    }
    if (rc) return rc;
    if (state) op_note(run, pc.key, state, res->operation_id);
  }
  /* Remove it, keeping the order: the latest call stays last. */
  memmove(run->pending + pi, run->pending + pi + 1,
          (size_t)(run->npending - pi - 1) * sizeof *run->pending);
  run->npending--;
  /* On out-of-memory only the borrowed id is lost; the decision stands. */
  d->call_id = set_owned(&run->call_id_buf, &run->call_id, pc.call_id) ? NULL : run->call_id;
  lg__free(pc.call_id);
  lg__free(pc.key);
  run->c.results++;
  run->c.last_t_ms = t;
  run->seq++;
  tried_status(run, pc.fp, st);

  return after_guards(run, &pc, res, invalid, d, err);
}

/* ------------------------------------------------------------------ */
/* Model calls, usage, world state, handoffs, cancel.                    */

int lg_run_model(lg_run_t *run, const lg_model_call_t *m, lg_decision_t *d, lg_error_t *err) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (m->input_tokens < 0)
    return lg__err(err, LG_EINVAL, "input_tokens", -1, "input_tokens must not be negative");
  if (msg_room(run, 0)) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  const lg_policy_t *p = run->policy;
  int64_t t = m->t_ms;
  /* Every sum saturates: a worst case of INT64_MAX tokens must stop at the
   * cap, not wrap round to a small number and pass it. */
  int64_t out = m->max_tokens >= 0 ? m->max_tokens : m->output_tokens > 0 ? m->output_tokens : 0;
  int64_t worst_tokens = lg__sat_add(m->input_tokens, out);
  int64_t worst_cost = m->cost_nusd > 0 ? m->cost_nusd : 0;
  lg_reason_t halt = LG_R_NONE;
  if (p->max_wall_ms >= 0 && t >= p->max_wall_ms) {
    halt = LG_R_WALL_CLOCK_CAP;
    lg__buf_printf(&run->msg, "This run has used its %lld ms of wall-clock time; I am stopping.",
                   (long long)p->max_wall_ms);
  } else if (p->max_model_calls >= 0 && run->c.model_calls >= p->max_model_calls) {
    halt = LG_R_MODEL_CALL_CAP;
    lg__buf_printf(&run->msg, "I have made %lld model calls, the most this run allows; I am stopping.",
                   (long long)run->c.model_calls);
  } else if (p->max_cost_nusd >= 0 &&
             lg__sat_add(lg__sat_add(run->c.cost_nusd, run->held_cost), worst_cost) >
                 p->max_cost_nusd) {
    halt = LG_R_COST_CAP;
    /* Written in place: msg_room() made room for it. */
    lg__buf_puts(&run->msg, "This run has ");
    lg__buf_usd(&run->msg, lg__sat_add(run->c.cost_nusd, run->held_cost));
    lg__buf_puts(&run->msg, " USD spent or held; the next model call could cost ");
    lg__buf_usd(&run->msg, worst_cost);
    lg__buf_puts(&run->msg, " USD more, past the cap of ");
    lg__buf_usd(&run->msg, p->max_cost_nusd);
    lg__buf_puts(&run->msg, " USD, so I am stopping before making it.");
  } else if (p->max_tokens >= 0 &&
             lg__sat_add(lg__sat_add(run->c.tokens, run->held_tokens), worst_tokens) >
                 p->max_tokens) {
    halt = LG_R_TOKEN_CAP;
    lg__buf_printf(&run->msg,
                   "The next model call could use %lld tokens, which would take this run "
                   "past its cap of %lld; I am stopping before making it.",
                   (long long)worst_tokens, (long long)p->max_tokens);
  }
  if (halt) {
    if (stop(run, d, halt, "caps", NULL, t)) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return 0;
  }
  if (run->nresv == LG__RESV_MAX)
    return lg__err(err, LG_ESTATE, "reservation", -1,
                   "%d model calls are already waiting for their usage", LG__RESV_MAX);
  run->next_resv++;
  run->resv[run->nresv++] = (lg__resv_t){run->next_resv, worst_cost, worst_tokens};
  run->held_cost = lg__sat_add(run->held_cost, worst_cost);
  run->held_tokens = lg__sat_add(run->held_tokens, worst_tokens);
  run->c.model_calls = lg__sat_add(run->c.model_calls, 1);
  run->c.last_t_ms = t;
  run->seq++;
  d->action = LG_ACT_EXECUTE;
  d->reservation = run->next_resv;
  cascade_model(run, d);
  return 0;
}

int lg_run_usage(lg_run_t *run, int64_t reservation, int64_t input_tokens, int64_t output_tokens,
                 int64_t cost_nusd, int64_t t_ms) {
  int i = 0;
  if (reservation) {
    for (i = 0; i < run->nresv; i++)
      if (run->resv[i].id == reservation) break;
  }
  if (i >= run->nresv) return LG_ENOTFOUND;
  memmove(run->resv + i, run->resv + i + 1, (size_t)(run->nresv - i - 1) * sizeof *run->resv);
  run->nresv--;
  /* Summed again rather than subtracted: a saturated sum minus one of its
   * parts is not the sum of the others. */
  run->held_cost = run->held_tokens = 0;
  for (int k = 0; k < run->nresv; k++) {
    run->held_cost = lg__sat_add(run->held_cost, run->resv[k].cost);
    run->held_tokens = lg__sat_add(run->held_tokens, run->resv[k].tokens);
  }
  run->c.tokens = lg__sat_add(run->c.tokens, input_tokens > 0 ? input_tokens : 0);
  run->c.tokens = lg__sat_add(run->c.tokens, output_tokens > 0 ? output_tokens : 0);
  run->c.cost_nusd = lg__sat_add(run->c.cost_nusd, cost_nusd > 0 ? cost_nusd : 0);
  if (t_ms > run->c.last_t_ms) run->c.last_t_ms = t_ms;
  return 0;
}

int lg_run_state(lg_run_t *run, lg_canon_t *canon, const char *world, size_t len, int64_t t_ms,
                 lg_decision_t *d, lg_error_t *err) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (msg_room(run, 0)) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  char hex[LG_FP_HEX];
  const char *cw;
  size_t cl;
  int rc = lg_canon_json(canon, world, len, &cw, &cl, err);
  if (rc) {
    lg__err_field_prefix(err, "world");
    return rc;
  }
  if ((rc = lg_canon_sha256_hex(canon, cw, cl, hex)))
    return lg__err(err, rc, NULL, -1, "SHA-256 failed");
  uint64_t h = fp64_of_hex(hex);
  if (run->has_world && h == run->world) run->world_same++;
  else run->world_same = 0;
  run->has_world = true;
  run->world = h;
  run->seq++;
  if (run->policy->np_world_steps && run->world_same >= run->policy->np_world_steps) {
    lg__buf_printf(&run->msg,
                   "The world has looked exactly the same for the last %lld snapshots; "
                   "nothing I do is changing it, so I am stopping.",
                   (long long)run->world_same + 1);
    if (stop(run, d, LG_R_NO_PROGRESS, "no_progress", NULL, t_ms))
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return 0;
  }
  d->action = LG_ACT_CONTINUE;
  return 0;
}

int lg_run_handoff(lg_run_t *run, const char *from, const char *to, int64_t t_ms, lg_decision_t *d,
                   lg_error_t *err) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (msg_room(run, (from ? strlen(from) : 1) + (to ? strlen(to) : 1)))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  int64_t max = run->policy->max_handoffs;
  if (max >= 0 && run->c.handoffs >= max) {
    lg__buf_printf(&run->msg,
                   "The task has been handed between agents %lld times (now %s to %s), the "
                   "most this run allows; passing it on again will not finish it.",
                   (long long)run->c.handoffs, from ? from : "?", to ? to : "?");
    if (stop(run, d, LG_R_HANDOFF_CAP, "caps", NULL, t_ms))
      return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    return 0;
  }
  run->c.handoffs++;
  run->seq++;
  d->action = LG_ACT_EXECUTE;
  return 0;
}

int lg_run_stop(lg_run_t *run, lg_reason_t reason, const char *text, int64_t t_ms,
                lg_decision_t *d) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (reason <= LG_R_NONE || reason >= LG_R__COUNT) return LG_EINVAL;
  if (text && *text && lg__buf_puts(&run->msg, text)) return LG_ENOMEM;
  int rc = stop(run, d, reason, reason == LG_R_OPERATOR_CANCELLED ? "kill_switch" : "external",
                NULL, t_ms);
  return rc;
}

int lg_run_cancel(lg_run_t *run, const char *reason, int64_t t_ms, lg_decision_t *d) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  const char *text = reason && *reason ? reason : lg_reason_name(LG_R_OPERATOR_CANCELLED);
  if (lg__buf_printf(&run->msg, "An operator stopped this run (%s).", text)) return LG_ENOMEM;
  return stop(run, d, LG_R_OPERATOR_CANCELLED, "kill_switch", text, t_ms);
}

/* ------------------------------------------------------------------ */
/* Text, episodes, compactions, resume.                                 */

/* The current response's text is the whole text of the previous
 * mono_run responses, and that makes text.monologue of them. */
static bool monologue_now(const lg_run_t *run) {
  const lg__text_t *x = &run->text;
  int64_t need = run->policy->text_monologue;
  return need && run->mono_run > 0 && !x->mono_void && x->mono_len > 0 &&
         x->mono_len == run->mono_ref_len && x->mono == run->mono_ref &&
         lg__sat_add(run->mono_run, 1) >= need;
}

int lg_run_text(lg_run_t *run, int64_t turn, const char *text, size_t len, const char *agent,
                int64_t t_ms, lg_decision_t *d, lg_error_t *err) {
  (void)agent; /* text is the run's, whoever wrote it */
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (!text && len) return lg__err(err, LG_EINVAL, "text", -1, "text is NULL but len is not 0");
  if (msg_room(run, 0)) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  /* Nothing below can fail: the run changes from here on. */
  if (!run->text.open || run->text.turn != turn) lg__text_begin(run, turn);
  bool loop = lg__text_feed(run, text ? text : "", len);
  if (loop) run->text_loops = lg__sat_add(run->text_loops, 1);
  run->seq++;
  if (t_ms > run->c.last_t_ms) run->c.last_t_ms = t_ms;
  const lg_policy_t *p = run->policy;
  if (loop && p->text_stop && run->text_loops >= p->text_stop) {
    if (run->text_loops > 1)
      lg__buf_printf(&run->msg,
                     "I have fallen into repeating the same text again (%lld responses so "
                     "far); more of it will not help, so I am stopping.",
                     (long long)run->text_loops);
    else
      lg__buf_puts(&run->msg, "I have fallen into repeating the same text; more of it will not "
                              "help, so I am stopping.");
    stop(run, d, LG_R_TEXT_REPEAT, "text", NULL, t_ms);
  } else if (monologue_now(run)) {
    lg__buf_printf(&run->msg,
                   "I have written the same thing %lld turns in a row without doing "
                   "anything; saying it again will not move the task, so I am stopping.",
                   (long long)lg__sat_add(run->mono_run, 1));
    stop(run, d, LG_R_MONOLOGUE, "monologue", NULL, t_ms);
  } else if (loop && p->text_observe && run->text_loops >= p->text_observe) {
    lg__buf_puts(&run->msg, "I have been repeating the same text; I will stop and either call "
                            "a tool or give my answer.");
    d->action = LG_ACT_OBSERVE;
    d->reason = LG_R_TEXT_REPEAT;
    d->reason_text = lg_reason_name(LG_R_TEXT_REPEAT);
    d->guard = "text";
    set_message(run, d);
  } else {
    d->action = LG_ACT_CONTINUE;
  }
  return 0;
}

int lg_run_user(lg_run_t *run, int64_t t_ms, lg_decision_t *d) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  fresh_start(run);
  run->seq++;
  if (t_ms > run->c.last_t_ms) run->c.last_t_ms = t_ms;
  d->action = LG_ACT_CONTINUE;
  return 0;
}

int lg_run_compaction(lg_run_t *run, int64_t t_ms, lg_decision_t *d) {
  reset(run, d);
  if (run->stopped) {
    stopped_decision(run, d);
    return 0;
  }
  if (msg_room(run, 0)) return LG_ENOMEM;
  run->compactions = lg__sat_add(run->compactions, 1);
  run->seq++;
  if (t_ms > run->c.last_t_ms) run->c.last_t_ms = t_ms;
  int64_t max = run->policy->compaction_max;
  if (max && run->compactions >= max) {
    lg__buf_printf(&run->msg,
                   "My context has been compacted %lld times without a single tool call "
                   "between; I am going round in circles, so I am stopping.",
                   (long long)run->compactions);
    stop(run, d, LG_R_CONTEXT_LOOP, "compaction", NULL, t_ms);
    return 0;
  }
  d->action = LG_ACT_CONTINUE;
  return 0;
}

int lg_run_resume(lg_run_t *run, const int64_t *progress_version, int64_t t_ms, lg_decision_t *d,
                  lg_error_t *err) {
  reset(run, d);
  if (!run->stopped)
    return lg__err(err, LG_ESTATE, NULL, -1, "the run is active: there is no stop to resume from");
  if (run->next != LG_NEXT_RESUME_AFTER_CHANGE)
    return lg__err(err, LG_ESTATE, NULL, -1,
                   "a run stopped by %s cannot be resumed: its next_allowed_action is %s",
                   lg_run_terminal_reason(run), lg_next_name(run->next));
  /* ACTIVE again: the stop and the call it refused are forgotten. */
  lg__free(run->reason_text);
  lg__free(run->stop_message);
  lg__free(run->refused_tool);
  lg__free(run->refused_call_id);
  lg__free(run->refused_km);
  run->reason_text = run->stop_message = NULL;
  run->refused_tool = run->refused_call_id = run->refused_km = NULL;
  memset(run->refused_fp, 0, sizeof run->refused_fp);
  run->refused_turn = 0;
  run->stopped = false;
  run->reason = LG_R_NONE;
  run->guard = NULL;
  run->next = LG_NEXT_NONE;
  run->alternatives = 0;
  run->stopped_at_ms = 0;
  fresh_start(run);
  if (progress_version) {
    run->has_best = true;
    run->best = *progress_version;
  }
  run->seq++;
  if (t_ms > run->c.last_t_ms) run->c.last_t_ms = t_ms;
  d->action = LG_ACT_CONTINUE;
  return 0;
}

/* ------------------------------------------------------------------ */
/* Names.                                                               */

const char *lg_reason_name(lg_reason_t r) {
  static const char *names[] = {
#define LG__XX(name, text) text,
      LG_REASON_MAP(LG__XX)
#undef LG__XX
  };
  return (unsigned)r < LG__ARRAY_LEN(names) ? names[r] : "";
}

const char *lg_action_name(lg_action_t a) {
  static const char *names[] = {"execute", "block", "replay", "stop", "continue", "observe"};
  return (unsigned)a < LG__ARRAY_LEN(names) ? names[a] : "?";
}

const char *lg_next_name(lg_next_t n) {
  static const char *names[] = {"none", "human_review", "resume_after_change"};
  return (unsigned)n < LG__ARRAY_LEN(names) ? names[n] : "?";
}

static const char *status_names[] = {"",      "progress",          "complete",
                                     "retryable", "fatal", "permission_denied",
                                     "policy_blocked", "human_required"};

const char *lg_status_name(lg_status_t s) {
  return (unsigned)s < LG__ARRAY_LEN(status_names) ? status_names[s] : "";
}

lg_status_t lg_status_parse(const char *s, size_t len) {
  if (!s) return LG_STATUS_INVALID;
  for (size_t i = 1; i < LG__ARRAY_LEN(status_names); i++)
    if (strlen(status_names[i]) == len && !memcmp(status_names[i], s, len)) return (lg_status_t)i;
  return LG_STATUS_INVALID;
}
