/*
 * test_replay_property.c — one event path, as a property: for thousands
 * of random runs, what the server decided over HTTP is what the replay of
 * the server's own trace decides (replay_check.h says exactly what is
 * compared), on every store backend (LG_STORE_BACKENDS; default memory
 * and sqlite, postgres under tests/pg/with-postgres.sh).
 *
 * Each run is generated from its own seed: a small random policy (repeat
 * rungs and window, cycle period, caps on steps, model calls, tokens,
 * cost, handoffs and wall clock, tools with loop keys, normalizers,
 * side effects, max_calls, empty_ok) and 5 to 60 events drawn from the
 * table `kinds` below, with the server's clock (the test's, ht_clock)
 * moved by a random amount before each. The alphabet of tools and
 * arguments is small, so repeats, repeats far apart and cycles happen;
 * results go to executed calls, to calls that were not executed (409,
 * nothing written) and to no call named; some requests are client errors
 * (4xx: nothing written). On sqlite: and postgres: a second server on the
 * same store (another replica) decides about a third of the events.
 *
 * Environment:
 *   LG_PROP_SEED=N   the seed of the first run (run i has seed N + i);
 *                    a failure prints the run's seed: LG_PROP_SEED=that
 *                    LG_PROP_RUNS=1 replays exactly it
 *   LG_PROP_RUNS=N   runs per backend (default 2000 on memory:, 600 on
 *                    sqlite:, 400 on postgres:; a quarter as many under
 *                    ASan, whose stage runs the same seeds' first quarter
 *                    after the plain build ran them all)
 *   LG_PROP_VERBOSE=1  print every run's log, not only a failing one's
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>

#include "replay_check.h"
#include "sanitized.h" /* a quarter of the runs under ASan: under 30 s there */


static char TMP[256];
static char PRICES[300];
static const char *URL;
static const char *BACKEND;
static int PORT; /* the server of this backend */

/* How the runs ended, to show what the generator reaches. */
static struct {
  char reason[64];
  int n;
} ENDS[48];
static int NENDS;

static void note_end(const char *reason) {
  for (int i = 0; i < NENDS; i++)
    if (!strcmp(ENDS[i].reason, reason)) {
      ENDS[i].n++;
      return;
    }
  if (NENDS < 48) {
    snprintf(ENDS[NENDS].reason, sizeof ENDS[NENDS].reason, "%s", reason);
    ENDS[NENDS++].n = 1;
  }
}

/* ------------------------------------------------------------------ */
/* A small, seeded random number generator (splitmix64).               */

typedef struct rng {
  uint64_t s;
} rng_t;

static uint64_t rnext(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
/* 0 .. n-1 */
static int rint_(rng_t *r, int n) { return n > 0 ? (int)(rnext(r) % (uint64_t)n) : 0; }
/* true with probability pct % */
static int chance(rng_t *r, int pct) { return rint_(r, 100) < pct; }
static const char *pick(rng_t *r, const char *const *v, int n) { return v[rint_(r, n)]; }
#define PICK(r, arr) pick(r, arr, (int)(sizeof arr / sizeof arr[0]))

/* ------------------------------------------------------------------ */
/* The generator's view of one run.                                    */

#define MAX_IDS 128

typedef struct gen {
  rng_t rng;
  rc_run_t *rc;
  const char *run_id;
  int has_scope;            /* the run reserves against a shared budget */
  int turn;                 /* the model turn calls are asked in */
  int pv;                   /* the highest progress_version sent */
  char exec[MAX_IDS][64];   /* executed calls waiting for a result */
  int nexec;
  char other[MAX_IDS][64];  /* calls that were not executed */
  int nother;
  char resv[MAX_IDS][32];   /* reservations that /model answered */
  int nresv;
  int calls;                /* calls answered (for the engine's ids) */
  int group;                /* the run has a group of its own (named as the run) */
} gen_t;

static void ids_push(char v[][64], int *n, const char *id) {
  if (!id || *n == MAX_IDS) return;
  snprintf(v[(*n)++], 64, "%s", id);
}

static void ids_del(char v[][64], int *n, int i) {
  memmove(v[i], v[i + 1], (size_t)(*n - i - 1) * 64);
  (*n)--;
}

/* ------------------------------------------------------------------ */
/* The event kinds. Each builds the route and body of one request and  */
/* hears its answer. To add a kind (text, user, compaction, resume are */
/* being built), write its make() and, when it must learn from the     */
/* answer, its heard(), and add one line to `kinds`; replay_check.h's  */
/* rc_route_type() must name the trace type its route writes.          */

typedef struct req {
  char route[16];     /* "calls", ...; "cancel" for POST /cancel */
  char body[2048];
  int client_error;   /* the body is malformed on purpose: 4xx */
  int not_executed;   /* a result for a call that did not execute: 409 */
  char call_id[64];   /* results: the call it names ("" none) */
} req_t;

typedef struct kind {
  const char *name;
  int weight;
  void (*make)(gen_t *g, req_t *q);
  void (*heard)(gen_t *g, const req_t *q, const ht_resp_t *a); /* may be NULL */
} kind_t;

static const char *const TOOLS[] = {"search", "charge", "poll", "lookup", "shell"};
static const char *const QS[] = {"a", "a", "A ", " a", "b", "b", "c", "x  y", "X Y"};

/* Arguments the canonicaliser and the normalizers must treat alike on
 * both sides: the server's (the request body, re-serialised) and the
 * trace reader's (which canonicalises while it scans). */
static const char *const ODD_ARGS[] = {
    "{\"q\":\"\u00c9t\u00e9  X\"}",
    "{\"q\":\"\u00c9T\u00c9 x\"}",
    "{\"q\":\"tab\\there\\n\"}",
    "{\"q\":\"a\\\"b\\\\c\"}",
    "{\"q\":\"\\u00e9\"}",
    "{\"q\":\"\u00e9\"}",
    "{\"q\":\"\\ud83d\\ude00 a\"}",
    "{\"n\":1e2,\"q\":\"a\"}",
    "{\"n\":100,\"q\":\"a\"}",
    "{\"n\":1.0,\"q\":\"b\"}",
    "{\"n\":-0,\"q\":\"b\"}",
    "{\"n\":12345678901234567890}",
    "{\"n\":0.1,\"m\":1e-7}",
    "{\"q\":[\"x\",\" y\"]}",
    "{\"q\":null}",
    "{\"q\":{\"z\":1,\"a\":2}}",
    "{\"id\":\"INV-0012\",\"q\":\"  A  \"}",
    "{\"b\":1,\"a\":2,\"q\":\"a\"}",
    "{\"\u00e9\":1,\"e\":2}",
};

static void args_json(gen_t *g, char *out, size_t n) {
  /* Mostly a tiny alphabet (so that repeats and cycles happen), now and
   * then something else (normalizers, numbers, nesting). */
  int shape = rint_(&g->rng, 14);
  if (shape < 9) snprintf(out, n, "{\"q\":\"%c\"}", "ab"[rint_(&g->rng, 2)]);
  else if (shape == 9) snprintf(out, n, "{}");
  else if (shape == 10) snprintf(out, n, "{\"q\":\"%s\",\"n\":%d}", PICK(&g->rng, QS), rint_(&g->rng, 3));
  else if (shape == 11) snprintf(out, n, "{\"id\":\"INV-%d\",\"amount\":%d}", rint_(&g->rng, 3), 10 * rint_(&g->rng, 2));
  else if (shape == 12) snprintf(out, n, "{\"n\":%d,\"q\":\"%s\",\"deep\":{\"k\":[1,2]}}", rint_(&g->rng, 2), PICK(&g->rng, QS));
  else if (shape == 13 && chance(&g->rng, 50)) snprintf(out, n, "%s", PICK(&g->rng, ODD_ARGS));
  else snprintf(out, n, "{\"q\":\"%s\",\"n\":1.5}", PICK(&g->rng, QS));
}

static void make_call(gen_t *g, req_t *q) {
  rng_t *r = &g->rng;
  char args[256], extra[256] = "";
  size_t k = 0;
  args_json(g, args, sizeof args);
  if (chance(r, 60)) {
    if (chance(r, 40)) g->turn++;
    k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"turn\":%d", g->turn);
  }
  if (chance(r, 15)) /* ids of its own, some used twice, some like the engine's "c<N>" */
    k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"call_id\":\"%s%d\"",
                          chance(r, 50) ? "k" : "c", 1 + rint_(r, 4));
  /* Keys of this run only. A key shared with another run makes the
   * server answer from that run's ledger rows (replay, in_progress,
   * idempotency_mismatch), which the replay of this run's trace alone,
   * with a ledger of its own, cannot know: it says execute. */
  if (chance(r, 10))
    k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"idempotency_key\":\"%s-key%d\"", g->run_id,
                          rint_(r, 3));
  if (chance(r, 10)) k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"agent\":\"ag%d\"", rint_(r, 2));
  snprintf(q->route, sizeof q->route, "calls");
  /* Two tools most of the time: A B A B cycles. */
  const char *tool = chance(r, 80) ? TOOLS[rint_(r, 2) ? 0 : 3] : PICK(r, TOOLS);
  snprintf(q->body, sizeof q->body, "{\"tool\":\"%s\",\"args\":%s%s}", tool, args, extra);
}

static void heard_call(gen_t *g, const req_t *q, const ht_resp_t *a) {
  (void)q;
  if (a->status != 200) return;
  g->calls++;
  const char *id = ht_str(a, "call_id"), *action = ht_str(a, "action");
  if (!id || !action) return;
  if (!strcmp(action, "execute")) ids_push(g->exec, &g->nexec, id);
  else ids_push(g->other, &g->nother, id);
}

/* Mostly progress: a run that stops on its first odd result explores
 * nothing; every status still comes up often enough. */
static const char *const STATUSES[] = {
    "progress", "progress", "progress", "progress", "progress", "progress", "progress",
    "progress", "progress", "progress", "progress", "progress", "progress", "progress",
    "progress", "progress", "progress", "progress", "retryable", "retryable", "retryable",
    "retryable", "complete", "fatal", "permission_denied", "policy_blocked", "human_required",
    "progress", "progress", "progress", "progress", "progress", "progress", "bogus"};

static void make_result(gen_t *g, req_t *q) {
  rng_t *r = &g->rng;
  char b[1024];
  size_t k = 0;
  int target = rint_(r, 10);
  snprintf(q->route, sizeof q->route, "results");
  b[0] = 0;
  if (target < 7 && g->nexec) { /* an executed call */
    int i = chance(r, 70) ? g->nexec - 1 : rint_(r, g->nexec);
    if (chance(r, 80) || i != g->nexec - 1) {
      snprintf(q->call_id, sizeof q->call_id, "%s", g->exec[i]);
      k += (size_t)snprintf(b + k, sizeof b - k, ",\"call_id\":\"%s\"", g->exec[i]);
    }
  } else if (target < 9 && g->nother) { /* a call that was not executed */
    int i = rint_(r, g->nother);
    snprintf(q->call_id, sizeof q->call_id, "%s", g->other[i]);
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"call_id\":\"%s\"", g->other[i]);
    q->not_executed = 1;
    for (int j = 0; j < g->nexec; j++) /* the same id may be waiting too */
      if (!strcmp(g->exec[j], g->other[i])) q->not_executed = 0;
  } /* else: no call named (the latest waiting one, if any) */
  int s = rint_(r, 80);
  if (s < 78) k += (size_t)snprintf(b + k, sizeof b - k, ",\"status\":\"%s\"", PICK(r, STATUSES));
  else if (s == 78) k += (size_t)snprintf(b + k, sizeof b - k, ",\"status\":null");
  /* else no status at all */
  if (chance(r, 50)) {
    int pv = chance(r, 50) ? ++g->pv : g->pv - rint_(r, 2);
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"progress_version\":%d", pv);
  }
  if (chance(r, 15)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"retry_after_ms\":%d", 100 * rint_(r, 30));
  if (chance(r, 15))
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"side_effect_committed\":%s", chance(r, 50) ? "true" : "false");
  static const char *const VALUES[] = {"{\"rows\":[1,2]}", "\"done\"", "0", "[]", "{\"r\":\"\"}",
                                       "false", "\"\\f\"", "\"\u00a0\"", "\"\\\\n\"", "\" \\r\\n x\"",
                                       "null", "\"\"", "\"  \"", "\" \\n\\t\""};
  /* the last four are null or blank: a failure unless empty_ok */
  if (chance(r, 70))
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"value\":%s",
                          chance(r, 93) ? VALUES[rint_(r, 10)] : VALUES[10 + rint_(r, 4)]);
  if (chance(r, 5)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"operation_id\":\"op%d\"", rint_(r, 9));
  snprintf(q->body, sizeof q->body, "{%s}", k ? b + 1 : "");
}

static void heard_result(gen_t *g, const req_t *q, const ht_resp_t *a) {
  if (a->status != 200) return;
  const char *id = ht_str(a, "call_id");
  if (!id) id = q->call_id;
  for (int i = g->nexec - 1; i >= 0; i--)
    if (!strcmp(g->exec[i], id)) {
      ids_del(g->exec, &g->nexec, i);
      break;
    }
}

static void make_state(gen_t *g, req_t *q) {
  snprintf(q->route, sizeof q->route, "state");
  if (chance(&g->rng, 70)) snprintf(q->body, sizeof q->body, "{\"world\":{\"cursor\":%d}}", rint_(&g->rng, 2));
  else snprintf(q->body, sizeof q->body, "{\"world\":{\"queue\":[%d],\"cursor\":%d}}", rint_(&g->rng, 5), rint_(&g->rng, 3));
}

static void make_handoff(gen_t *g, req_t *q) {
  static const char *const AG[] = {"planner", "coder", "critic"};
  snprintf(q->route, sizeof q->route, "handoffs");
  snprintf(q->body, sizeof q->body, "{\"from\":\"%s\",\"to\":\"%s\"}", PICK(&g->rng, AG), PICK(&g->rng, AG));
}

static void make_model(gen_t *g, req_t *q) {
  rng_t *r = &g->rng;
  char b[512];
  size_t k = 0;
  int m = rint_(r, 4);
  if (m == 1) k += (size_t)snprintf(b + k, sizeof b - k, ",\"model\":\"priced-m\"");
  else if (m == 2) k += (size_t)snprintf(b + k, sizeof b - k, ",\"model\":\"cheap-m\"");
  else if (m == 3) k += (size_t)snprintf(b + k, sizeof b - k, ",\"model\":\"unpriced-m\"");
  k += (size_t)snprintf(b + k, sizeof b - k, ",\"input_tokens\":%d", rint_(r, 3) * 500 + rint_(r, 100));
  if (chance(r, 60)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"max_tokens\":%d", 50 * rint_(r, 20));
  if (chance(r, 60)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"cost_usd\":%d.%03d", rint_(r, 2) ? 0 : 0, rint_(r, 400));
  if (chance(r, 50)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"turn\":%d", g->turn);
  snprintf(q->route, sizeof q->route, "model");
  snprintf(q->body, sizeof q->body, "{%s}", b + 1);
}

static void heard_model(gen_t *g, const req_t *q, const ht_resp_t *a) {
  (void)q;
  const char *id = a->status == 200 ? ht_str(a, "reservation_id") : NULL;
  if (id && g->nresv < MAX_IDS) snprintf(g->resv[g->nresv++], 32, "%s", id);
}

static void make_usage(gen_t *g, req_t *q) {
  rng_t *r = &g->rng;
  char b[512];
  size_t k = 0;
  if (g->nresv && chance(r, 60))
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"reservation_id\":\"%s\"", g->resv[rint_(r, g->nresv)]);
  else if (chance(r, 10))
    k += (size_t)snprintf(b + k, sizeof b - k, ",\"reservation_id\":\"%d\"", 50 + rint_(r, 9)); /* none: 409 */
  k += (size_t)snprintf(b + k, sizeof b - k, ",\"input_tokens\":%d,\"output_tokens\":%d", rint_(r, 1500),
                        rint_(r, 800));
  if (chance(r, 60)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"cost_usd\":0.%03d", rint_(r, 300));
  snprintf(q->route, sizeof q->route, "usage");
  snprintf(q->body, sizeof q->body, "{%s}", b + 1);
}

static void make_cancel(gen_t *g, req_t *q) {
  /* The run's group when it has one, now and then: the group's cancel. */
  snprintf(q->route, sizeof q->route, "%s", g->group && chance(&g->rng, 50) ? "group-cancel" : "cancel");
  if (chance(&g->rng, 50)) snprintf(q->body, sizeof q->body, "{\"reason\":\"enough-%d\"}", rint_(&g->rng, 3));
  else snprintf(q->body, sizeof q->body, "{}");
}

/* Malformed on purpose: each is a 4xx, and no line. */
static void make_bad(gen_t *g, req_t *q) {
  static const struct {
    const char *route, *body;
  } BAD[] = {
      {"calls", "{\"tool\":\"search\",\"args\":[1]}"},
      {"calls", "{\"args\":{}}"},
      {"calls", "{\"tool\":\"search\",\"tunr\":1}"},
      {"calls", "{\"tool\":\"search\",\"args\":{\"q\":1,\"q\":2}}"},
      {"results", "{\"status\":7}"},
      {"results", "{\"status\":\"progress\",\"retry_after_ms\":-1}"},
      {"state", "{\"world\":[]}"},
      {"state", "{}"},
      {"handoffs", "{\"from\":\"a\"}"},
      {"model", "{\"max_tokens\":10}"},
      {"model", "{\"input_tokens\":-5}"},
      {"usage", "{\"input_tokens\":1}"},
      {"usage", "{\"reservation_id\":\"abc\",\"input_tokens\":1,\"output_tokens\":1}"},
      {"calls", "{\"tool\":\"search\""},
  };
  int i = rint_(&g->rng, (int)(sizeof BAD / sizeof BAD[0]));
  snprintf(q->route, sizeof q->route, "%s", BAD[i].route);
  snprintf(q->body, sizeof q->body, "%s", BAD[i].body);
  q->client_error = 1;
}

/* Text: plain sentences, a chant (one block over and over), a code block
 * that repeats on purpose, and the same line again and again across
 * turns (a monologue); now and then in streamed pieces of one turn. */
static void make_text(gen_t *g, req_t *q) {
  static const char *const TX[] = {
      "Let me look at the invoice first.",
      "I will try again. I will try again. I will try again. I will try again. I will try again.",
      "Checking the queue now, then the cursor.",
      "```\nretry();\nretry();\nretry();\nretry();\n```",
      "Working on it.",
      "- Step 1: read\n- Step 2: read\n- Step 3: read\n- Step 4: read",
      "sorry sorry sorry sorry sorry sorry sorry sorry sorry sorry",
  };
  rng_t *r = &g->rng;
  snprintf(q->route, sizeof q->route, "text");
  const char *t = PICK(r, TX);
  if (chance(r, 60)) {
    if (chance(r, 30)) g->turn++;
    snprintf(q->body, sizeof q->body, "{\"text\":\"%s\",\"turn\":%d}", t, g->turn);
  } else {
    snprintf(q->body, sizeof q->body, "{\"text\":\"%s\"}", t);
  }
}

static void make_user(gen_t *g, req_t *q) {
  snprintf(q->route, sizeof q->route, "user");
  snprintf(q->body, sizeof q->body, chance(&g->rng, 50) ? "{\"text\":\"now do the next one\"}" : "{}");
}

static void make_compaction(gen_t *g, req_t *q) {
  (void)g;
  snprintf(q->route, sizeof q->route, "compaction");
  snprintf(q->body, sizeof q->body, "{}");
}

/* A resume: of a stopped run (allowed or refused, by its stop), or of an
 * active one (409): only an accepted one is a line. */
static void make_resume(gen_t *g, req_t *q) {
  rng_t *r = &g->rng;
  snprintf(q->route, sizeof q->route, "resume");
  if (chance(r, 50))
    snprintf(q->body, sizeof q->body, "{\"progress_version\":%d,\"note\":\"fixed\"}", 10 + rint_(r, 90));
  else
    snprintf(q->body, sizeof q->body, "{}");
}

static const kind_t kinds[] = {
    {"call", 40, make_call, heard_call},
    {"result", 25, make_result, heard_result},
    {"state", 6, make_state, NULL},
    {"handoff", 3, make_handoff, NULL},
    {"model", 9, make_model, heard_model},
    {"usage", 5, make_usage, NULL},
    {"cancel", 1, make_cancel, NULL},
    {"bad", 3, make_bad, NULL},
    {"text", 6, make_text, NULL},
    {"user", 2, make_user, NULL},
    {"compaction", 3, make_compaction, NULL},
    {"resume", 2, make_resume, NULL},
};

static const kind_t *pick_kind(rng_t *r) {
  int total = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) total += kinds[i].weight;
  int x = rint_(r, total);
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (x < kinds[i].weight) return &kinds[i];
    x -= kinds[i].weight;
  }
  return &kinds[0];
}

/* ------------------------------------------------------------------ */
/* Policies.                                                           */

static void tool_policy(rng_t *r, const char *tool, char *out, size_t n) {
  char b[512];
  size_t k = 0;
  int lk = rint_(r, 6);
  if (lk == 1) k += (size_t)snprintf(b + k, sizeof b - k, ",\"loop_key\":[\"q\"]");
  else if (lk == 2) k += (size_t)snprintf(b + k, sizeof b - k, ",\"loop_key\":{\"q\":[\"lower\",\"trim\",\"collapse_space\"]}");
  else if (lk == 3) k += (size_t)snprintf(b + k, sizeof b - k, ",\"loop_key\":false");
  else if (lk == 4) k += (size_t)snprintf(b + k, sizeof b - k, ",\"loop_key\":{\"id\":[\"digits\"],\"q\":[\"upper\"]}");
  if (chance(r, 25)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"side_effects\":true");
  if (chance(r, 20)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"max_calls\":%d", 1 + rint_(r, 6));
  if (chance(r, 25)) k += (size_t)snprintf(b + k, sizeof b - k, ",\"empty_ok\":true");
  snprintf(out, n, "\"%s\":{%s}", tool, k ? b + 1 : "");
}

static void make_policy(rng_t *r, char *out, size_t n) {
  char lim[512] = "", rep[256] = "", tools[2048] = "", misc[256] = "";
  size_t k = 0;
  if (chance(r, 40)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_steps\":%d", 2 + rint_(r, 20));
  if (chance(r, 30)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_model_calls\":%d", 1 + rint_(r, 5));
  if (chance(r, 30)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_wall_ms\":%d", 2000 + 1000 * rint_(r, 60));
  if (chance(r, 30)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_cost_usd\":0.%d", 1 + rint_(r, 9));
  if (chance(r, 30)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_tokens\":%d", 500 + 500 * rint_(r, 8));
  if (chance(r, 30)) k += (size_t)snprintf(lim + k, sizeof lim - k, ",\"max_handoffs\":%d", rint_(r, 3));
  k = 0;
  if (chance(r, 50)) {
    int obs = 1 + rint_(r, 3), blk = obs + rint_(r, 3), stp = blk + rint_(r, 4);
    char o[16], bl[16], st[16];
    snprintf(o, sizeof o, "%d", obs);
    snprintf(bl, sizeof bl, "%d", blk);
    snprintf(st, sizeof st, "%d", stp);
    /* each rung a number, or now and then off */
    k += (size_t)snprintf(rep + k, sizeof rep - k, "\"observe\":%s,\"block\":%s,\"stop\":%s",
                          chance(r, 20) ? "false" : o, chance(r, 20) ? "false" : bl,
                          chance(r, 10) ? "false" : st);
    if (chance(r, 50)) k += (size_t)snprintf(rep + k, sizeof rep - k, ",\"window\":%d", 2 + rint_(r, 10));
  }
  k = 0;
  for (size_t i = 0; i < sizeof TOOLS / sizeof TOOLS[0]; i++)
    if (chance(r, 50)) {
      char t[640];
      tool_policy(r, TOOLS[i], t, sizeof t);
      k += (size_t)snprintf(tools + k, sizeof tools - k, "%s%s", k ? "," : "", t);
    }
  k = 0;
  if (chance(r, 40)) k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"cycle\":{\"max_period\":%d}", rint_(r, 5));
  if (chance(r, 40))
    k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"no_progress\":{\"results\":%d,\"world_steps\":%d}",
                          1 + rint_(r, 4), 1 + rint_(r, 5));
  if (chance(r, 30)) k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"failure_streak\":%d", 1 + rint_(r, 4));
  if (chance(r, 30)) k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"block_streak\":%d", rint_(r, 4));
  if (chance(r, 40)) k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"compaction\":{\"max\":%d}", rint_(r, 4));
  if (chance(r, 40))
    k += (size_t)snprintf(misc + k, sizeof misc - k, ",\"text\":{\"monologue\":%d,\"repeat\":{\"observe\":%d,\"stop\":%d}}",
                          2 + rint_(r, 2), 1, 1 + rint_(r, 2));
  snprintf(out, n, "{\"limits\":{%s},\"repeat\":{%s},\"tools\":{%s}%s}", lim[0] ? lim + 1 : "", rep,
           tools, misc);
}

/* ------------------------------------------------------------------ */
/* One run.                                                            */

/* cb: a second server on the same store (another replica), or NULL:
 * some of a run's events are decided there. */
static int one_run(ht_conn_t *c, ht_conn_t *cb, uint64_t seed, int verbose) {
  static gen_t g;
  static rc_run_t rc;
  memset(&g, 0, sizeof g);
  g.rng.s = seed;
  char run_id[96];
  snprintf(run_id, sizeof run_id, "prop-%s-%llu", BACKEND, (unsigned long long)seed);
  rc_init(&rc, run_id);
  g.rc = &rc;
  g.run_id = rc.id;
  rc_logf(&rc, "seed %llu\n", (unsigned long long)seed);
  int failed = 0;
  char label[128];
  snprintf(label, sizeof label, "LG_PROP_SEED=%llu LG_PROP_RUNS=1 LG_STORE_BACKENDS=%s",
           (unsigned long long)seed, BACKEND);

  char policy[4096], body[8192], extra[512] = "";
  make_policy(&g.rng, policy, sizeof policy);
  ht_resp_t a;
  if (chance(&g.rng, 15)) { /* a shared budget this run reserves against */
    char path[256];
    snprintf(path, sizeof path, "/v1/budgets/team:%s", run_id);
    snprintf(body, sizeof body, "{\"limit_usd\":0.%d,\"period\":\"none\"}", 1 + rint_(&g.rng, 5));
    if (rc_send(c, &rc, "PUT", path, body, &a) || a.status != 200) {
      fprintf(stderr, "%s: PUT %s -> %d\n", label, path, a.status);
      failed = 1;
    }
    ht_resp_clear(&a);
    snprintf(extra, sizeof extra, ",\"scopes\":[\"team:%s\"]", run_id);
    g.has_scope = 1;
  }
  if (chance(&g.rng, 20)) {
    size_t l = strlen(extra);
    snprintf(extra + l, sizeof extra - l, ",\"group\":\"%s\"", run_id);
    g.group = 1;
  }
  if (chance(&g.rng, 20)) {
    g.pv = rint_(&g.rng, 3);
    size_t l = strlen(extra);
    snprintf(extra + l, sizeof extra - l, ",\"progress_version\":%d", g.pv);
  }
  snprintf(body, sizeof body, "{\"run_id\":\"%s\",\"policy\":%s%s}", run_id, policy, extra);
  if (rc_send(c, &rc, "POST", "/v1/runs", body, &a) || a.status != 201) {
    fprintf(stderr, "%s: POST /v1/runs -> %d %s\n", label, a.status, a.body ? a.body : "");
    ht_resp_clear(&a);
    rc_free(&rc);
    return 1;
  }
  ht_resp_clear(&a);

  int nev = 5 + rint_(&g.rng, 56);
  for (int i = 0; i < nev && !failed; i++) {
    /* The clock: mostly a little, sometimes a lot (wall-clock caps,
     * retry_after_ms, leases). */
    int t = rint_(&g.rng, 20);
    ht_advance(t < 10  ? rint_(&g.rng, 50)
               : t < 18 ? rint_(&g.rng, 2000)
               : t < 19 ? rint_(&g.rng, 30000)
                        : -rint_(&g.rng, 500)); /* a replica's clock behind: the run's time holds */
    const kind_t *k = pick_kind(&g.rng);
    static req_t q;
    memset(&q, 0, sizeof q);
    k->make(&g, &q);
    char path[256];
    int was_stopped = rc.stopped; /* then nothing but a resume changes the run */
    if (!strcmp(q.route, "cancel")) snprintf(path, sizeof path, "/v1/runs/%s/cancel", run_id);
    else if (!strcmp(q.route, "group-cancel")) snprintf(path, sizeof path, "/v1/groups/%s/cancel", run_id);
    else snprintf(path, sizeof path, "/v1/runs/%s/%s", run_id, q.route);
    ht_conn_t *to = cb && chance(&g.rng, 30) ? cb : c;
    if (to == cb) rc_logf(&rc, "(to the other replica)\n");
    if (rc_send(to, &rc, "POST", path, q.body, &a)) {
      fprintf(stderr, "%s: no answer to POST %s\n", label, path);
      failed = 1;
      break;
    }
    if (a.status >= 500 || !a.json) {
      rc_logf(&rc, "!! a server error\n");
      failed = 1;
    } else if (q.client_error && (a.status < 400 || a.status >= 500)) {
      rc_logf(&rc, "!! a malformed request was answered %d\n", a.status);
      failed = 1;
    } else if (q.not_executed && !rc.stopped && a.status != 409) {
      rc_logf(&rc, "!! a result for a call that did not execute was answered %d, not 409\n", a.status);
      failed = 1;
    }
    if (!strcmp(q.route, "cancel") || !strcmp(q.route, "group-cancel")) {
      if (a.status == 200) {
        json_t *cv = ht_get(&a, "cancelled");
        if (json_is_array(cv)) /* a group's: the runs it stopped */
          cv = json_array_size(cv) == 1 && json_string_value(json_array_get(cv, 0)) &&
                       !strcmp(json_string_value(json_array_get(cv, 0)), run_id)
                   ? json_true()
                   : json_false();
        const char *why = NULL;
        json_t *qb = json_loads(q.body, 0, NULL);
        if (qb) why = json_string_value(json_object_get(qb, "reason"));
        rc_note_cancel(&rc, json_is_true(cv), why);
        if (qb) json_decref(qb);
      }
    } else {
      rc_note(&rc, q.route, &a);
    }
    if (k->heard && !was_stopped) k->heard(&g, &q, &a);
    ht_resp_clear(&a);
  }
  if (failed) {
    fprintf(stderr, "\n==== %s: run %s\n%s", label, run_id, rc.log);
  } else if (rc_check(c, &rc, label)) {
    failed = 1;
  } else {
    note_end(rc.stopped ? rc.line[rc.stop_at].reason : "(no stop)");
    if (verbose) fprintf(stderr, "%s", rc.log);
  }
  rc_free(&rc);
  return failed;
}


/* A call id used twice: the engine's own "c1" for an executed call, then
 * the same id given by the client to a call that is blocked. The result
 * naming "c1" is the executed call's (the server takes it and writes it);
 * replay used to skip it as the result of the blocked call, and went on
 * with one call still waiting and the counters off by one result. */
static void test_reused_call_id(void **state) {
  (void)state;
  ht_conn_t c;
  ht_open(&c, PORT);
  static rc_run_t rc;
  char run_id[64];
  snprintf(run_id, sizeof run_id, "reused-id-%s", BACKEND);
  rc_init(&rc, run_id);
  static const struct {
    const char *route, *body;
    int status;
  } ev[] = {
      {"calls", "{\"tool\":\"lookup\",\"args\":{\"id\":1}}", 200},              /* c1: execute */
      {"calls", "{\"tool\":\"lookup\",\"args\":{\"id\":1},\"call_id\":\"c1\"}", 200}, /* block */
      {"results", "{\"call_id\":\"c1\",\"status\":\"progress\",\"value\":1}", 200}, /* c1's */
      {"results", "{\"call_id\":\"c1\",\"status\":\"progress\",\"value\":1}", 409}, /* none waits */
      {"calls", "{\"tool\":\"lookup\",\"args\":{\"id\":2}}", 200},
      {"results", "{\"status\":\"complete\"}", 200},
  };
  char body[512], path[256];
  snprintf(body, sizeof body,
           "{\"run_id\":\"%s\",\"policy\":{\"repeat\":{\"observe\":false,\"block\":2,\"stop\":false}}}",
           run_id);
  ht_resp_t a;
  assert_int_equal(rc_send(&c, &rc, "POST", "/v1/runs", body, &a), 0);
  assert_int_equal(a.status, 201);
  ht_resp_clear(&a);
  for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) {
    ht_advance(10);
    snprintf(path, sizeof path, "/v1/runs/%s/%s", run_id, ev[i].route);
    assert_int_equal(rc_send(&c, &rc, "POST", path, ev[i].body, &a), 0);
    if (a.status != ev[i].status) fail_msg("event %zu: %d, wanted %d: %s", i, a.status, ev[i].status, a.body);
    if (i == 1) assert_string_equal(ht_str(&a, "action"), "block");
    rc_note(&rc, ev[i].route, &a);
    ht_resp_clear(&a);
  }
  int bad = rc_check(&c, &rc, "reused call id");
  rc_free(&rc);
  ht_close(&c);
  assert_int_equal(bad, 0);
}

/* The server's clock goes back (a replica whose clock is behind the one
 * that decided the run's last event). The step dates an event no earlier
 * than the last one the run saw; that was the last call, result or model
 * call let through, so after a state snapshot, a handoff or a model call
 * stopped by a cap the next line could go back in time, and replay
 * refused the whole trace ("t_ms went backwards"). */
static void test_clock_behind(void **state) {
  (void)state;
  ht_conn_t c;
  ht_open(&c, PORT);
  static rc_run_t rc;
  char run_id[64];
  snprintf(run_id, sizeof run_id, "clock-behind-%s", BACKEND);
  rc_init(&rc, run_id);
  static const struct {
    int advance;
    const char *route, *body;
  } ev[] = {
      {10, "calls", "{\"tool\":\"lookup\",\"args\":{\"id\":1}}"},
      {10, "results", "{\"status\":\"progress\"}"},
      {600, "state", "{\"world\":{\"cursor\":1}}"},
      {-500, "handoffs", "{\"from\":\"a\",\"to\":\"b\"}"},
      {300, "state", "{\"world\":{\"cursor\":2}}"},
      {-400, "model", "{\"input_tokens\":10}"},
      {-50, "calls", "{\"tool\":\"lookup\",\"args\":{\"id\":2}}"},
  };
  char body[256], path[256];
  snprintf(body, sizeof body, "{\"run_id\":\"%s\"}", run_id);
  ht_resp_t a;
  assert_int_equal(rc_send(&c, &rc, "POST", "/v1/runs", body, &a), 0);
  assert_int_equal(a.status, 201);
  ht_resp_clear(&a);
  for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++) {
    ht_advance(ev[i].advance);
    snprintf(path, sizeof path, "/v1/runs/%s/%s", run_id, ev[i].route);
    assert_int_equal(rc_send(&c, &rc, "POST", path, ev[i].body, &a), 0);
    if (a.status != 200) fail_msg("event %zu: %d: %s", i, a.status, a.body);
    rc_note(&rc, ev[i].route, &a);
    ht_resp_clear(&a);
  }
  int bad = rc_check(&c, &rc, "clock behind");
  rc_free(&rc);
  ht_close(&c);
  assert_int_equal(bad, 0);
}

static void test_property(void **state) {
  (void)state;
  const char *s = getenv("LG_PROP_SEED");
  const char *n = getenv("LG_PROP_RUNS");
  const char *v = getenv("LG_PROP_VERBOSE");
  uint64_t seed = s && *s ? strtoull(s, NULL, 10) : 20261201ULL;
  int runs = n && *n ? atoi(n)
             : !strcmp(BACKEND, "memory") ? 2000 / LG_TEST_SLOW
             : !strcmp(BACKEND, "sqlite") ? 600 / LG_TEST_SLOW
                                          : 400 / LG_TEST_SLOW;
  ht_conn_t c, cb;
  ht_open(&c, PORT);
  /* memory: is private to its server; the others get a second server on
   * the same store, a replica, that decides some of every run's events. */
  lg_server_t *replica = NULL;
  if (strcmp(BACKEND, "memory")) {
    char log[300];
    snprintf(log, sizeof log, "%s/replica-%s.log", TMP, BACKEND);
    replica = rc_start(URL, PRICES, log);
    assert_non_null(replica);
    ht_open(&cb, lg_server_port(replica));
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int failed = 0;
  for (int i = 0; i < runs && failed < 3; i++) failed += one_run(&c, replica ? &cb : NULL, seed + (uint64_t)i, v && *v == '1');
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fprintf(stderr, "%s: %d runs from seed %llu in %.1f s, %d failed\n", BACKEND, runs,
          (unsigned long long)seed, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
          failed);
  for (int i = 0; i < NENDS; i++) fprintf(stderr, "  %-28s %d\n", ENDS[i].reason, ENDS[i].n);
  NENDS = 0;
  ht_close(&c);
  if (replica) {
    ht_close(&cb);
    lg_server_free(replica);
  }
  if (failed) fail_msg("%d runs differ from their replay (seeds above)", failed);
}

static void rm_tmp(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", TMP);
  if (system(cmd)) {
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(TMP, sizeof TMP, "/tmp/lgprop.XXXXXX");
  if (!mkdtemp(TMP)) return 1;
  atexit(rm_tmp);
  /* Prices: one model priced with an output cap, one without a cap (the
   * call then needs max_tokens), one not listed (no default). */
  snprintf(PRICES, sizeof PRICES, "%s/prices.json", TMP);
  FILE *f = fopen(PRICES, "w");
  if (!f) return 1;
  fputs("{\"models\":{\"priced-m\":{\"input_usd_per_mtok\":3,\"output_usd_per_mtok\":15,"
        "\"max_output_tokens\":1000},\"cheap-m\":{\"input_usd_per_mtok\":0.5,"
        "\"output_usd_per_mtok\":1.5}}}\n",
        f);
  fclose(f);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_reused_call_id),
                                     cmocka_unit_test(test_clock_behind),
                                     cmocka_unit_test(test_property)};
  const char *names[LGT_MAX_BACKENDS];
  int nb = lgt_backends(names, "memory,sqlite");
  int failed = 0;
  for (int i = 0; i < nb; i++) {
    BACKEND = names[i];
    URL = lgt_fresh_url(names[i]);
    fprintf(stderr, "== backend %s (%s)\n", names[i], URL);
    char log[300];
    snprintf(log, sizeof log, "%s/server-%s.log", TMP, BACKEND);
    lg_server_t *srv = rc_start(URL, PRICES, log);
    if (!srv) return 1;
    PORT = lg_server_port(srv);
    failed += cmocka_run_group_tests_name(names[i], tests, NULL, NULL);
    lg_server_free(srv);
  }
  return failed;
}
