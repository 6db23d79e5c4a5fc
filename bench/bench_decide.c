/*
 * bench_decide.c — how long loopguard takes to canonicalise, fingerprint and
 * decide one tool call of about 220 bytes, and where that time goes.
 *
 * Figures (one JSON line each, then a line for a person):
 *   decide             what DESIGN.md's bar names: canonicalise, fingerprint
 *                      and decide one call, that is lg_run_before with the
 *                      canonicaliser doing the work (call.fingerprint =
 *                      NULL). Each call is timed on its own, less the
 *                      median cost of a pair of clock reads; its result
 *                      (lg_run_after) is given outside the timed part. The
 *                      bar: 0.6 us median.
 *   decide_and_result  lg_run_before + lg_run_after (a progress result),
 *                      timed in batches: a whole step of an agent loop,
 *                      for information.
 *   engine             lg_run_before + lg_run_after with the fingerprint
 *                      given (call.fingerprint set): the engine without the
 *                      canonicaliser.
 *   canon_fingerprint  lg_canon_fingerprint alone (canonical JSON + SHA-256).
 *   canon_json         lg_canon_json alone (canonical JSON, no digest).
 *   sha256_240         lg_canon_sha256_hex over 240 bytes (reference: about
 *                      0.19 us here through a reused EVP context).
 *
 * Timing: clock_gettime(CLOCK_MONOTONIC) around batches of --per-batch calls
 * (1000); --batches batches (2000) after --warmup batches (200); the median
 * and the 99th percentile of the per-call time of the batches. The process
 * is pinned to the CPU it started on (--no-pin: not). Every call differs
 * from the previous ones (a pool of 1024 argument objects with their own
 * invoice and amount), so nothing is cached and the repeat guard never fires;
 * the policy lifts max_steps, max_wall_ms and max_model_calls so no cap
 * fires either. A decision other than execute / continue is an error.
 *
 * Usage: bench_decide [--quick] [--batches N] [--per-batch N] [--warmup N]
 *                     [--no-pin] [--only FIGURE]
 * (--only runs one figure, e.g. under perf record.)
 * Exit status: 0 whatever the figures; 1 when a call failed.
 */
#define _GNU_SOURCE
#include <sched.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loopguard.h"

#define POOL 1024
#define BAR_DECIDE_US 0.6
#define REF_SHA_US 0.19

static const char *const tools[] = {"charge_invoice", "search", "update_contact", "poll_job",
                                    "normalize_row"};

typedef struct bench {
  lg_policy_t *policy;
  lg_canon_t *canon;
  lg_run_t *run;
  char *args[POOL];
  size_t args_len[POOL];
  const char *tool[POOL];
  char fp[POOL][LG_FP_HEX];
  char sha_in[POOL][240];
  int64_t progress;
  int64_t turn;
  unsigned long errors;
} bench_t;

static uint64_t rng = 7;
static uint64_t next_rand(void) { /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 2685821657736338717ULL;
}

static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-quantile (0..1) of sorted v[0..n), by nearest rank. */
static double quantile(const double *v, size_t n, double q) {
  double r = q * (double)n;
  size_t i = (size_t)r;
  if ((double)i < r) i++; /* ceil */
  if (i > 0) i--;
  if (i >= n) i = n - 1;
  return v[i];
}

static void die(bench_t *b, const char *what, int rc, const lg_error_t *err) {
  char buf[1024];
  fprintf(stderr, "bench_decide: %s failed: %s (%s)\n", what, lg_strerror(rc),
          err ? lg_error_format(err, buf, sizeof buf) : "");
  (void)b;
  exit(1);
}

/* ---- the units of work ---- */

static inline void one_before(bench_t *b, unsigned i, int given_fp) {
  lg_call_t call = {0};
  lg_decision_t d;
  lg_error_t err;
  unsigned k = i % POOL;
  call.tool = b->tool[k];
  call.args = b->args[k];
  call.args_len = b->args_len[k];
  call.turn = b->turn++;
  call.t_ms = b->turn;
  call.fingerprint = given_fp ? b->fp[k] : NULL;
  int rc = lg_run_before(b->run, b->canon, &call, &d, &err);
  if (rc) die(b, "lg_run_before", rc, &err);
  if (d.action != LG_ACT_EXECUTE) {
    fprintf(stderr, "bench_decide: call %lld was not executed (%s, %s)\n", (long long)b->turn,
            lg_action_name(d.action), d.reason_text ? d.reason_text : "");
    exit(1);
  }
}

static inline void one_after(bench_t *b) {
  lg_decision_t d;
  lg_error_t err;
  lg_result_t res = {0};
  res.status = LG_STATUS_PROGRESS;
  res.has_progress_version = 1;
  res.progress_version = ++b->progress;
  res.side_effect_committed = -1;
  res.retry_after_ms = -1;
  res.value_kind = LG_VALUE_PRESENT;
  res.value = "{\"ok\":true}";
  res.value_len = 11;
  res.t_ms = b->turn;
  int rc = lg_run_after(b->run, &res, &d, &err);
  if (rc) die(b, "lg_run_after", rc, &err);
  if (d.action != LG_ACT_CONTINUE) {
    fprintf(stderr, "bench_decide: result %lld did not continue (%s, %s)\n", (long long)b->turn,
            lg_action_name(d.action), d.reason_text ? d.reason_text : "");
    exit(1);
  }
}

static void w_decide(bench_t *b, unsigned i) {
  one_before(b, i, 0);
  one_after(b);
}
static void w_engine(bench_t *b, unsigned i) {
  one_before(b, i, 1);
  one_after(b);
}

static void w_canon_fp(bench_t *b, unsigned i) {
  unsigned k = i % POOL;
  char hex[LG_FP_HEX];
  lg_error_t err;
  int rc = lg_canon_fingerprint(b->canon, b->policy, b->tool[k], b->args[k], b->args_len[k], hex,
                                NULL, NULL, &err);
  if (rc) die(b, "lg_canon_fingerprint", rc, &err);
}

static void w_canon_json(bench_t *b, unsigned i) {
  unsigned k = i % POOL;
  const char *out;
  size_t out_len;
  lg_error_t err;
  int rc = lg_canon_json(b->canon, b->args[k], b->args_len[k], &out, &out_len, &err);
  if (rc) die(b, "lg_canon_json", rc, &err);
}

static void w_sha(bench_t *b, unsigned i) {
  char hex[LG_FP_HEX];
  int rc = lg_canon_sha256_hex(b->canon, b->sha_in[i % POOL], 240, hex);
  if (rc) die(b, "lg_canon_sha256_hex", rc, NULL);
}

/* ---- timing and reporting ---- */

typedef struct opts {
  int batches, per_batch, warmup, pin;
  const char *only; /* one figure, or NULL for all */
} opts_t;

static int wanted(const opts_t *o, const char *name) { return !o->only || !strcmp(o->only, name); }

typedef struct figure {
  double median_us, p99_us, min_us, mean_us;
} figure_t;

static figure_t time_batches(bench_t *b, const opts_t *o, void (*work)(bench_t *, unsigned)) {
  unsigned i = 0;
  for (int w = 0; w < o->warmup; w++)
    for (int k = 0; k < o->per_batch; k++) work(b, i++);
  double *v = malloc(sizeof *v * (size_t)o->batches);
  if (!v) exit(1);
  double sum = 0;
  for (int n = 0; n < o->batches; n++) {
    int64_t t0 = now_ns();
    for (int k = 0; k < o->per_batch; k++) work(b, i++);
    int64_t t1 = now_ns();
    v[n] = (double)(t1 - t0) / o->per_batch / 1000.0;
    sum += v[n];
  }
  qsort(v, (size_t)o->batches, sizeof *v, cmp_double);
  figure_t f = {quantile(v, (size_t)o->batches, 0.5), quantile(v, (size_t)o->batches, 0.99), v[0],
                sum / o->batches};
  free(v);
  return f;
}

static void report(const char *name, const char *what, const figure_t *f, const opts_t *o,
                   size_t bytes, double bar_us, double ref_us, const char *method) {
  printf("{\"bench\":\"decide\",\"figure\":\"%s\",\"what\":\"%s\",\"unit\":\"us\","
         "\"median_us\":%.4f,\"p99_us\":%.4f,\"min_us\":%.4f,\"mean_us\":%.4f,"
         "\"method\":\"%s\",\"batches\":%d,\"per_batch\":%d,\"bytes\":%zu",
         name, what, f->median_us, f->p99_us, f->min_us, f->mean_us, method, o->batches,
         o->per_batch, bytes);
  if (bar_us > 0)
    printf(",\"bar_median_us\":%.3f,\"ratio_to_bar\":%.3f,\"status\":\"%s\"", bar_us,
           f->median_us / bar_us, f->median_us <= bar_us ? "ok" : "BELOW BAR");
  if (ref_us > 0) printf(",\"reference_us\":%.3f,\"ratio_to_reference\":%.3f", ref_us,
                         f->median_us / ref_us);
  printf("}\n");
  printf("  %-18s median %7.3f us  p99 %7.3f us  (%s)", name, f->median_us, f->p99_us, what);
  if (bar_us > 0)
    printf("\n  %-18s bar %.3f us median: median/bar = %.2f  %s", "", bar_us,
           f->median_us / bar_us, f->median_us <= bar_us ? "ok" : "BELOW BAR");
  if (ref_us > 0)
    printf("\n  %-18s reference %.3f us: median/reference = %.2f", "", ref_us,
           f->median_us / ref_us);
  printf("\n");
  fflush(stdout);
}

/* Each call's lg_run_before timed on its own, its result given untimed.
 * The cost of a pair of clock reads (its median) is taken off each
 * sample. */
static figure_t time_single(bench_t *b, int samples, double *clock_ns) {
  double *v = malloc(sizeof *v * (size_t)samples);
  if (!v) exit(1);
  for (int n = 0; n < samples; n++) {
    int64_t t0 = now_ns(), t1 = now_ns();
    v[n] = (double)(t1 - t0);
  }
  qsort(v, (size_t)samples, sizeof *v, cmp_double);
  double overhead = quantile(v, (size_t)samples, 0.5);
  *clock_ns = overhead;
  unsigned i = 0;
  for (int n = 0; n < samples / 10; n++) w_decide(b, i++);
  double sum = 0;
  for (int n = 0; n < samples; n++) {
    int64_t t0 = now_ns();
    one_before(b, i++, 0);
    int64_t t1 = now_ns();
    one_after(b);
    v[n] = ((double)(t1 - t0) - overhead) / 1000.0;
    sum += v[n];
  }
  qsort(v, (size_t)samples, sizeof *v, cmp_double);
  figure_t f = {quantile(v, (size_t)samples, 0.5), quantile(v, (size_t)samples, 0.99), v[0],
                sum / samples};
  free(v);
  return f;
}

static int parse_int(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*end || v < 1 || v > 100000000) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  opts_t o = {2000, 1000, 200, 1, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: bench_decide [--quick] [--batches N] [--per-batch N] [--warmup N] "
             "[--no-pin]\n                    [--only decide|decide_and_result|engine|"
             "canon_fingerprint|canon_json|sha256_240]\n");
      return 0;
    } else if (!strcmp(argv[i], "--quick")) {
      o.batches = 200;
      o.warmup = 20;
    } else if (!strcmp(argv[i], "--no-pin")) {
      o.pin = 0;
    } else if (i + 1 < argc && !strcmp(argv[i], "--batches")) {
      if (parse_int(argv[++i], &o.batches)) goto usage;
    } else if (i + 1 < argc && !strcmp(argv[i], "--per-batch")) {
      if (parse_int(argv[++i], &o.per_batch)) goto usage;
    } else if (i + 1 < argc && !strcmp(argv[i], "--only")) {
      o.only = argv[++i];
      static const char *const names[] = {"decide", "decide_and_result", "engine",
                                          "canon_fingerprint", "canon_json", "sha256_240"};
      int known = 0;
      for (size_t k = 0; k < sizeof names / sizeof *names; k++) known |= !strcmp(o.only, names[k]);
      if (!known) goto usage;
    } else if (i + 1 < argc && !strcmp(argv[i], "--warmup")) {
      if (parse_int(argv[++i], &o.warmup)) goto usage;
    } else {
      goto usage;
    }
  }

  int cpu = -1;
  if (o.pin) {
    cpu = sched_getcpu();
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu >= 0) CPU_SET(cpu, &set);
    if (cpu < 0 || sched_setaffinity(0, sizeof set, &set)) cpu = -1;
  }

  bench_t *b = calloc(1, sizeof *b);
  if (!b) return 1;
  lg_error_t err;
  static const char pol[] =
      "{\"limits\":{\"max_steps\":null,\"max_wall_ms\":null,\"max_model_calls\":null}}";
  b->policy = lg_policy_parse(pol, sizeof pol - 1, "bench-policy", &err);
  if (!b->policy) die(b, "lg_policy_parse", err.code, &err);
  b->canon = lg_canon_new();
  if (!b->canon) die(b, "lg_canon_new", LG_ENOMEM, NULL);
  b->run = lg_run_new("bench", NULL, b->policy, NULL, NULL, &err);
  if (!b->run) die(b, "lg_run_new", err.code, &err);

  /* The pool: arguments exactly as gen_trace.py writes them (Python's
   * json.dumps spacing); its call lines are 220 bytes on average. */
  size_t total = 0, line_total = 0, km_total = 0;
  for (unsigned k = 0; k < POOL; k++) {
    char buf[512];
    unsigned inv = 1 + (unsigned)(next_rand() % 5000);
    unsigned amt = 1 + (unsigned)(next_rand() % 100000);
    int n = snprintf(buf, sizeof buf,
                     "{\"invoice_id\": \"INV-%u\", \"note\": \"retry after timeout; customer "
                     "asked\", \"amount\": %u.%u, \"opts\": {\"dry_run\": "
                     "false, \"tags\": [\"a\", \"b\", \"c\"], \"limit\": 20}}",
                     inv, amt / 10, amt % 10);
    b->args[k] = strdup(buf);
    if (!b->args[k]) return 1;
    b->args_len[k] = (size_t)n;
    b->tool[k] = tools[next_rand() % 5];
    total += (size_t)n;
    line_total += (size_t)snprintf(NULL, 0, "{\"type\": \"call\", \"turn\": %u, \"tool\": \"%s\", "
                                   "\"args\": %s}", 100000 + k * 97, b->tool[k], b->args[k]);
    const char *km;
    size_t km_len;
    int rc = lg_canon_fingerprint(b->canon, b->policy, b->tool[k], b->args[k], b->args_len[k],
                                  b->fp[k], &km, &km_len, &err);
    if (rc) die(b, "lg_canon_fingerprint", rc, &err);
    km_total += strlen(b->tool[k]) + 1 + km_len;
    for (int j = 0; j < 240; j++) b->sha_in[k][j] = (char)(next_rand() & 0xff);
  }
  size_t call_bytes = line_total / POOL, args_bytes = total / POOL;
  size_t hashed_bytes = km_total / POOL;

  printf("# bench_decide: %d batches of %d calls after %d warm-up batches; a call is %zu bytes "
         "as a trace line on average (args %zu bytes, %zu bytes hashed); %s\n",
         o.batches, o.per_batch, o.warmup, call_bytes, args_bytes, hashed_bytes,
         cpu >= 0 ? "pinned to one CPU" : "not pinned");
  fflush(stdout);

  figure_t f;
  if (wanted(&o, "decide")) {
    double clock_ns = 0;
    int samples = o.batches * o.per_batch / 2;
    if (samples < 10000) samples = 10000;
    f = time_single(b, samples, &clock_ns);
    opts_t os = {samples, 1, samples / 10, o.pin, NULL};
    char what[160];
    snprintf(what, sizeof what,
             "canonicalise + fingerprint + before, each call timed alone less %.0f ns of clock "
             "reads",
             clock_ns);
    report("decide", what, &f, &os, call_bytes, BAR_DECIDE_US, 0, "single");
  }
  if (wanted(&o, "decide_and_result")) {
    f = time_batches(b, &o, w_decide);
    report("decide_and_result", "canonicalise + fingerprint + before + after", &f, &o,
           call_bytes, 0, 0, "batch");
  }
  if (wanted(&o, "engine")) {
    f = time_batches(b, &o, w_engine);
    report("engine", "before + after with the fingerprint given", &f, &o, call_bytes, 0, 0,
           "batch");
  }
  if (wanted(&o, "canon_fingerprint")) {
    f = time_batches(b, &o, w_canon_fp);
    report("canon_fingerprint", "lg_canon_fingerprint alone", &f, &o, call_bytes, 0, 0, "batch");
  }
  if (wanted(&o, "canon_json")) {
    f = time_batches(b, &o, w_canon_json);
    report("canon_json", "lg_canon_json alone, no digest", &f, &o, call_bytes, 0, 0, "batch");
  }
  if (wanted(&o, "sha256_240")) {
    f = time_batches(b, &o, w_sha);
    report("sha256_240", "lg_canon_sha256_hex over 240 bytes", &f, &o, 240, 0, REF_SHA_US,
           "batch");
  }

  lg_run_free(b->run);
  lg_canon_free(b->canon);
  lg_policy_free(b->policy);
  for (unsigned k = 0; k < POOL; k++) free(b->args[k]);
  free(b);
  return 0;

usage:
  fprintf(stderr, "usage: bench_decide [--quick] [--batches N] [--per-batch N] [--warmup N] "
                  "[--no-pin]\n                    [--only decide|decide_and_result|engine|"
                  "canon_fingerprint|canon_json|sha256_240]\n");
  return 2;
}
