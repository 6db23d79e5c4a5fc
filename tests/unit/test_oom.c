/*
 * test_oom.c — out-of-memory at every allocation (docs/internals/style.md: "failing
 * allocation N, then N+1, ... through every constructor and parser, with a
 * clean error and no leak each time").
 *
 * A counting allocator is installed with lg_set_allocator (it also carries
 * jansson's allocations). For N = 1, 2, 3, ... an operation runs with its
 * Nth allocation failing — once ("only N"), or from N on ("N and after") —
 * until it completes without reaching N. Each time:
 *   - a failure is a clean error: NULL or LG_ENOMEM, with err->code set;
 *   - when the call reported ENOMEM, the object it was given is left as it
 *     was: retried with memory back, it gives what it gives without any
 *     failure (the reference computed first);
 *   - a success despite the failure (an allocation the library could do
 *     without) gives the reference result too;
 *   - once everything is freed, no allocation is outstanding.
 * Objects are always created and freed under the same allocator, so the
 * live count is exact.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loopguard.h"

/* ------------------------------------------------------------------ */
/* The failing allocator.                                              */

static long g_calls;     /* allocation attempts since arm() */
static long g_fail_at;   /* the attempt that fails (1-based), 0: none */
static bool g_fail_rest; /* fail every attempt from g_fail_at on */
static long g_failed;    /* attempts that were made to fail */
static long g_live;      /* successful allocations not yet freed */

static bool should_fail(void) {
  g_calls++;
  if (g_fail_at && (g_calls == g_fail_at || (g_fail_rest && g_calls > g_fail_at))) {
    g_failed++;
    return true;
  }
  return false;
}
static void *t_malloc(size_t n) {
  if (should_fail()) return NULL;
  void *p = malloc(n);
  if (p) g_live++;
  return p;
}
static void *t_realloc(void *p, size_t n) {
  if (should_fail()) return NULL;
  void *q = realloc(p, n);
  if (q && !p) g_live++;
  return q;
}
static void t_free(void *p) {
  if (p) g_live--;
  free(p);
}

static void install(void) {
  g_calls = g_fail_at = g_failed = g_live = 0;
  g_fail_rest = false;
  lg_set_allocator(t_malloc, t_realloc, t_free);
}
static void uninstall(void) { lg_set_allocator(NULL, NULL, NULL); }
static void arm(long n, bool rest) {
  g_calls = 0;
  g_failed = 0;
  g_fail_at = n;
  g_fail_rest = rest;
}
static void disarm(void) { g_fail_at = 0; }

/* Upper bound on N: a runaway loop is a failure, not a hang. */
#define MAX_N 100000

/* ------------------------------------------------------------------ */
/* Canonicaliser and fingerprint.                                      */

static const char CANON_POLICY[] =
    "{\"tools\":{\"t\":{\"loop_key\":{"
    "\"q\":[\"lower\",\"trim\",\"collapse_space\"],"
    "\"invoice_id\":[\"strip_prefix:INV-\",\"digits\"],"
    "\"caf\\u00e9\":[\"upper\"],"
    "\"nested\":[],\"k07\":[],\"k33\":[\"trim\"],"
    "\"long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_tail\":[\"lower\"]}}}}";

/* A nested argument object that exercises every buffer of lg_canon_t:
 * more than 32 members in reverse order (member stack, sort scratch),
 * selected keys written with escapes, normalized strings, a number literal
 * of more than 128 characters, and a long string (output growth). Its
 * length is chosen so that the output buffer is nearly full when the last
 * key, a long selected one written with an escape, is compared with the
 * policy's field names (that comparison needs room of its own). */
static char *make_args(size_t *len) {
  size_t cap = 16384, n = 0;
  char *a = malloc(cap);
  assert_non_null(a);
  n += (size_t)snprintf(a + n, cap - n, "{");
  for (int i = 39; i >= 0; i--)
    n += (size_t)snprintf(a + n, cap - n,
                          "\"k%02d\":{\"z\":[%d,{\"y\":\" v%d \",\"x\":null}],\"a\":%d.50},", i,
                          i, i, i);
  n += (size_t)snprintf(a + n, cap - n,
                        "\"q\":\"  Hello   World \\u0041 \","
                        "\"invoice\\u005fid\":\"INV-22 91\","
                        "\"caf\\u00e9\":\"cr\\u00e8me x\","
                        "\"nested\":{\"b\":[1,2,{\"d\":1,\"c\":2}],\"a\":\"\\ud83d\\ude00\"},"
                        "\"num\":0.");
  for (int i = 0; i < 150; i++) a[n++] = (char)('1' + i % 9);
  n += (size_t)snprintf(a + n, cap - n, ",\"long\":\"");
  static const char tail[] = "\",\"long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_tail\\u0020\":\"X\","
                             "\"long_field_name_long_field_name_long_field_name_lo\\u006eg_field_name_long_field_name_long_field_name_tail\":\"Y\"}";
  size_t target = 7990 - (sizeof tail - 1);
  for (int i = 0; n < target; i++) a[n++] = (char)('a' + i % 26);
  n += (size_t)snprintf(a + n, cap - n, "%s", tail);
  assert_true(n < cap);
  *len = n;
  return a;
}

typedef struct canon_ref {
  char hex_t[LG_FP_HEX]; /* fingerprint of tool "t" (selects fields) */
  char *km_t;            /* its key material */
  char hex_u[LG_FP_HEX]; /* fingerprint of tool "u" (all arguments) */
  char *canon;           /* lg_canon_json of the arguments */
} canon_ref_t;

/* Runs the three canonicaliser operations on c, each retried once with
 * memory back when it reports ENOMEM; compares with ref (when given) or
 * fills it. */
static void canon_ops(lg_canon_t *c, const lg_policy_t *pol, const char *args, size_t len,
                      canon_ref_t *ref, bool fill) {
  char hex[LG_FP_HEX];
  const char *km;
  size_t kml;
  for (int op = 0; op < 3; op++) {
    for (int attempt = 0; attempt < 2; attempt++) {
      lg_error_t err;
      memset(&err, 0, sizeof err);
      int rc;
      if (op == 2)
        rc = lg_canon_json(c, args, len, &km, &kml, &err);
      else
        rc = lg_canon_fingerprint(c, pol, op == 0 ? "t" : "u", args, len, hex, &km, &kml, &err);
      if (rc == LG_ENOMEM) {
        if (attempt || fill) fail_msg("op %d: ENOMEM with memory back", op);
        if (err.code != LG_ENOMEM) fail_msg("op %d: err.code %s", op, lg_err_name(err.code));
        disarm();
        continue;
      }
      if (rc) fail_msg("op %d: %s (%s), not a clean ENOMEM", op, lg_err_name(rc), err.message);
      if (fill) {
        if (op == 0) {
          memcpy(ref->hex_t, hex, LG_FP_HEX);
          ref->km_t = strndup(km, kml);
        } else if (op == 1) {
          memcpy(ref->hex_u, hex, LG_FP_HEX);
        } else {
          ref->canon = strndup(km, kml);
        }
      } else if (op == 0) {
        assert_string_equal(hex, ref->hex_t);
        assert_int_equal(kml, strlen(ref->km_t));
        assert_memory_equal(km, ref->km_t, kml);
      } else if (op == 1) {
        assert_string_equal(hex, ref->hex_u);
      } else {
        assert_int_equal(kml, strlen(ref->canon));
        assert_memory_equal(km, ref->canon, kml);
      }
      break;
    }
  }
}

static void test_oom_canon(void **state) {
  (void)state;
  size_t len;
  char *args = make_args(&len);
  canon_ref_t ref = {0};
  install();
  lg_policy_t *pol = lg_policy_parse(CANON_POLICY, strlen(CANON_POLICY), NULL, NULL);
  assert_non_null(pol);
  lg_canon_t *c = lg_canon_new();
  assert_non_null(c);
  canon_ops(c, pol, args, len, &ref, true);
  lg_canon_free(c);
  /* The selection did its work (so the test covers it). */
  assert_non_null(strstr(ref.km_t, "\"q\":\"hello world a\""));
  assert_non_null(strstr(ref.km_t, "\"invoice_id\":\"2291\""));
  assert_non_null(strstr(ref.km_t, "\"caf\xc3\xa9\":\"CR\xc3\xa8ME X\""));
  assert_null(strstr(ref.km_t, "\"long\""));
  assert_non_null(strstr(ref.km_t, "\"long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_long_field_name_tail\":\"y\""));
  assert_null(strstr(ref.km_t, "\"X\""));
  assert_non_null(strstr(ref.canon, "\"long\""));

  for (int rest = 0; rest <= 1; rest++) {
    long n;
    for (n = 1; n < MAX_N; n++) {
      long before = g_live;
      arm(n, rest);
      c = lg_canon_new();
      if (!c) {
        assert_true(g_failed > 0);
        disarm();
        assert_int_equal(g_live, before);
        continue;
      }
      canon_ops(c, pol, args, len, &ref, false);
      lg_canon_free(c);
      bool reached = g_failed > 0;
      disarm();
      if (g_live != before) fail_msg("N=%ld%s: %ld allocations leaked", n, rest ? "+" : "",
                                     g_live - before);
      if (!reached) break;
    }
    assert_true(n > 5 && n < MAX_N);
  }
  lg_policy_free(pol);
  assert_int_equal(g_live, 0);
  uninstall();
  free(ref.km_t);
  free(ref.canon);
  free(args);
}

/* A canonicaliser that ran out of memory once is not broken for good. */
static void test_oom_canon_recovers(void **state) {
  (void)state;
  size_t len;
  char *args = make_args(&len);
  install();
  lg_policy_t *pol = lg_policy_parse(CANON_POLICY, strlen(CANON_POLICY), NULL, NULL);
  assert_non_null(pol);
  canon_ref_t ref = {0};
  lg_canon_t *c = lg_canon_new();
  assert_non_null(c);
  canon_ops(c, pol, args, len, &ref, true);
  lg_canon_free(c);
  for (long n = 1; n < 40; n++) {
    c = lg_canon_new();
    assert_non_null(c);
    char hex[LG_FP_HEX];
    const char *km;
    size_t kml;
    arm(n, true); /* everything fails from the Nth allocation on */
    int rc = lg_canon_fingerprint(c, pol, "t", args, len, hex, &km, &kml, NULL);
    assert_true(rc == 0 || rc == LG_ENOMEM);
    rc = lg_canon_fingerprint(c, pol, "u", args, len, hex, &km, &kml, NULL);
    assert_true(rc == 0 || rc == LG_ENOMEM);
    disarm();
    canon_ops(c, pol, args, len, &ref, false);
    lg_canon_free(c);
  }
  lg_policy_free(pol);
  assert_int_equal(g_live, 0);
  uninstall();
  free(ref.km_t);
  free(ref.canon);
  free(args);
}

/* ------------------------------------------------------------------ */
/* Policies.                                                           */

static const char EXAMPLE[] =
    "{\n"
    "  \"limits\": {\n"
    "    \"max_steps\": 50,\n"
    "    \"max_model_calls\": 50,\n"
    "    \"max_wall_ms\": 600000,\n"
    "    \"max_cost_usd\": null,\n"
    "    \"max_tokens\": null,\n"
    "    \"max_handoffs\": 10\n"
    "  },\n"
    "  \"repeat\": { \"observe\": 2, \"block\": 3, \"stop\": 6, \"window\": 20 },\n"
    "  \"cycle\": { \"max_period\": 4 },\n"
    "  \"no_progress\": { \"results\": 3, \"world_steps\": 5 },\n"
    "  \"failure_streak\": 5,\n"
    "  \"tools\": {\n"
    "    \"charge_invoice\": { \"loop_key\": { \"invoice_id\": [\"digits\"] }, "
    "\"side_effects\": true, \"max_calls\": 10 },\n"
    "    \"search\":         { \"loop_key\": { \"q\": [\"lower\", \"trim\", "
    "\"collapse_space\"] } },\n"
    "    \"lookup\":         { \"loop_key\": [\"customer_id\"] },\n"
    "    \"poll_job\":       { \"loop_key\": false },\n"
    "    \"run_shell\":      { \"empty_ok\": true },\n"
    "    \"strip\":          { \"loop_key\": { \"id\": [\"strip_prefix:INV-\", \"upper\"] } }\n"
    "  }\n"
    "}\n";

/* Runs f(N) for N = 1, 2, ... in both modes until it no longer reaches N;
 * f returns whether it succeeded and checks its own result. */
static void each_n(const char *what, bool (*f)(const char *ref), const char *ref) {
  for (int rest = 0; rest <= 1; rest++) {
    long n;
    for (n = 1; n < MAX_N; n++) {
      long before = g_live;
      arm(n, rest);
      bool ok = f(ref);
      bool reached = g_failed > 0;
      disarm();
      if (g_live != before)
        fail_msg("%s, N=%ld%s: %ld allocations leaked", what, n, rest ? "+" : "",
                 g_live - before);
      if (!ok && !reached) fail_msg("%s failed without a failed allocation", what);
      if (!reached) break;
    }
    if (n < 2 || n >= MAX_N) fail_msg("%s: N ran to %ld", what, n);
  }
}

/* jansson reports some failed allocations as syntax errors and can drop a
 * byte when growing a buffer fails; util.c's hooks note every failed
 * allocation during a parse, so lg_policy_parse must say LG_ENOMEM each
 * time, never LG_EPOLICY, and never return a policy that differs. */
static bool parse_example(const char *ref) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(EXAMPLE, strlen(EXAMPLE), "example.json", &err);
  if (!p) {
    if (err.code != LG_ENOMEM)
      fail_msg("parse under OOM: %s (%s), not LG_ENOMEM", lg_err_name(err.code), err.message);
    return false;
  }
  disarm(); /* the result is checked with memory back */
  char *s = lg_policy_to_json(p);
  assert_non_null(s);
  assert_string_equal(s, ref);
  lg_free(s);
  lg_policy_free(p);
  return true;
}

static lg_policy_t *g_pol; /* for to_json_example */

static bool to_json_example(const char *ref) {
  char *s = lg_policy_to_json(g_pol);
  if (!s) return false;
  assert_string_equal(s, ref);
  lg_free(s);
  return true;
}

static bool default_policy(const char *ref) {
  lg_policy_t *p = lg_policy_default();
  if (!p) return false;
  disarm();
  char *s = lg_policy_to_json(p);
  assert_string_equal(s, ref);
  lg_free(s);
  lg_policy_free(p);
  return true;
}

static char g_path[64];

static bool load_example(const char *ref) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_load_file(g_path, &err);
  if (!p) {
    if (err.code == LG_EPOLICY && g_failed > 0 && (err.line >= 1 || err.field[0]))
      return false; /* as parse_example */
    if (err.code != LG_ENOMEM)
      fail_msg("load under OOM: %s (%s), not LG_ENOMEM", lg_err_name(err.code), err.message);
    return false;
  }
  disarm();
  char *s = lg_policy_to_json(p);
  assert_string_equal(s, ref);
  lg_free(s);
  lg_policy_free(p);
  return true;
}

static void test_oom_policy(void **state) {
  (void)state;
  install();
  lg_policy_t *p = lg_policy_parse(EXAMPLE, strlen(EXAMPLE), NULL, NULL);
  assert_non_null(p);
  char *ref = lg_policy_to_json(p);
  assert_non_null(ref);
  each_n("lg_policy_parse", parse_example, ref);
  g_pol = p;
  each_n("lg_policy_to_json", to_json_example, ref);

  snprintf(g_path, sizeof g_path, "/tmp/lg-oom-policy-XXXXXX");
  int fd = mkstemp(g_path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, EXAMPLE, strlen(EXAMPLE)), (ssize_t)strlen(EXAMPLE));
  close(fd);
  each_n("lg_policy_load_file", load_example, ref);
  unlink(g_path);
  lg_free(ref);
  lg_policy_free(p);

  p = lg_policy_default();
  ref = lg_policy_to_json(p);
  lg_policy_free(p);
  /* lg_policy_default makes one allocation: N = 1 fails it, N = 2 is not
   * reached. */
  for (int rest = 0; rest <= 1; rest++) {
    arm(1, rest);
    assert_false(default_policy(ref));
    disarm();
    arm(2, rest);
    assert_true(default_policy(ref));
    disarm();
  }
  lg_free(ref);
  assert_int_equal(g_live, 0);
  uninstall();
}

/* ------------------------------------------------------------------ */
/* The engine: lg_run_new, lg_run_before, lg_run_after,                */
/* lg_run_envelope_json over a short script with a repeat, a block, a   */
/* side effect and its replay.                                          */

typedef struct step {
  int kind; /* 0 before, 1 after */
  lg_call_t call;
  lg_result_t res;
} step_t;

#define CALL(tool_, args_, turn_, t_)                                                        \
  {                                                                                          \
    0, {.tool = tool_, .args = args_, .args_len = sizeof(args_) - 1, .turn = turn_,          \
        .t_ms = t_},                                                                         \
    {0}                                                                                      \
  }
#define RESULT(pv_, value_, committed_, t_)                                                  \
  {                                                                                          \
    1, {0},                                                                                  \
    {.status = LG_STATUS_PROGRESS, .has_progress_version = (pv_) >= 0,                      \
     .progress_version = (pv_) >= 0 ? (pv_) : 0,                                            \
     .side_effect_committed = committed_, .retry_after_ms = -1,                              \
     .value_kind = LG_VALUE_PRESENT, .value = value_, .value_len = sizeof(value_) - 1,       \
     .t_ms = t_}                                                                             \
  }

static const step_t SCRIPT[] = {
    CALL("search", "{\"q\":\"Hello World\",\"page\":1}", 1, 10),
    RESULT(-1, "{\"hits\":3}", -1, 20),
    CALL("search", "{\"q\":\"  hello   world \",\"page\":2}", 2, 30),
    RESULT(-1, "{\"hits\":3}", -1, 40),
    CALL("search", "{\"page\":3,\"q\":\"HELLO WORLD\"}", 3, 50),
    CALL("lookup", "{\"customer_id\":\"c-1\",\"x\":[1,2,3]}", 4, 60),
    RESULT(2, "{\"name\":\"Ada\"}", -1, 70),
    CALL("charge_invoice", "{\"invoice_id\":\"INV-7\",\"amount\":12.50}", 5, 80),
    RESULT(3, "{\"charged\":true,\"id\":\"ch_1\"}", 1, 90),
    CALL("charge_invoice", "{\"amount\":12.5,\"invoice_id\":\"inv 7\"}", 6, 100),
    CALL("poll_job", "{\"job\":\"j-1\"}", 7, 110),
    RESULT(4, "{\"state\":\"done\"}", -1, 120),
};
#define NSTEPS (sizeof SCRIPT / sizeof SCRIPT[0])

static void describe(const lg_decision_t *d, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s/%s/%s rep=%u fp=%s id=%s key=%s msg=%s hide=%s:%u alt=%u saved=%.*s",
           lg_action_name(d->action), lg_reason_name(d->reason),
           d->reason_text ? d->reason_text : "-", d->guard ? d->guard : "-", d->repeat,
           d->fingerprint, d->call_id ? d->call_id : "-",
           d->idempotency_key ? d->idempotency_key : "-", d->message ? d->message : "-",
           d->hide_tool ? d->hide_tool : "-", d->hide_turns, d->alternatives,
           d->saved_result ? (int)d->saved_result_len : 1, d->saved_result ? d->saved_result : "-");
}

typedef struct engine_ref {
  char steps[NSTEPS][1024]; /* each decision, described */
  char *envelope;
} engine_ref_t;

/* Plays the script. With fill, records the reference; otherwise compares.
 * A step that fails with ENOMEM is retried once with memory back. Returns
 * false when lg_run_new or lg_canon_new failed. */
static bool play(const lg_policy_t *pol, engine_ref_t *ref, bool fill) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_run_t *run = lg_run_new("run-oom", "group-1", (lg_policy_t *)pol, NULL, NULL, &err);
  if (!run) {
    if (fill || err.code != LG_ENOMEM)
      fail_msg("lg_run_new: %s (%s)", lg_err_name(err.code), err.message);
    return false;
  }
  lg_canon_t *canon = lg_canon_new();
  if (!canon) {
    lg_run_free(run);
    if (fill) fail_msg("lg_canon_new failed");
    return false;
  }
  for (size_t s = 0; s < NSTEPS; s++) {
    lg_decision_t d;
    for (int attempt = 0;; attempt++) {
      memset(&d, 0, sizeof d);
      memset(&err, 0, sizeof err);
      int rc = SCRIPT[s].kind == 0 ? lg_run_before(run, canon, &SCRIPT[s].call, &d, &err)
                                   : lg_run_after(run, &SCRIPT[s].res, &d, &err);
      if (rc == 0) break;
      if (rc != LG_ENOMEM || attempt || fill)
        fail_msg("step %zu (attempt %d): %s (%s)", s, attempt, lg_err_name(rc), err.message);
      if (err.code != LG_ENOMEM) fail_msg("step %zu: err.code %s", s, lg_err_name(err.code));
      disarm();
    }
    char desc[1024];
    describe(&d, desc, sizeof desc);
    if (fill)
      snprintf(ref->steps[s], sizeof ref->steps[s], "%s", desc);
    else if (strcmp(desc, ref->steps[s]) != 0)
      fail_msg("step %zu decided\n  %s\nnot\n  %s", s, desc, ref->steps[s]);
  }
  char *env = lg_run_envelope_json(run);
  if (!env) {
    if (fill) fail_msg("no envelope");
    disarm();
    env = lg_run_envelope_json(run);
    assert_non_null(env);
  }
  if (fill)
    ref->envelope = strdup(env);
  else if (strcmp(env, ref->envelope) != 0)
    fail_msg("envelope\n  %s\nnot\n  %s", env, ref->envelope);
  lg_free(env);
  lg_canon_free(canon);
  lg_run_free(run);
  return true;
}

static void test_oom_engine(void **state) {
  (void)state;
  install();
  lg_policy_t *pol = lg_policy_parse(EXAMPLE, strlen(EXAMPLE), NULL, NULL);
  assert_non_null(pol);
  long held = g_live; /* the policy's own allocations */
  engine_ref_t *ref = calloc(1, sizeof *ref);
  assert_non_null(ref);
  play(pol, ref, true);
  if (getenv("LG_TEST_VERBOSE"))
    for (size_t s = 0; s < NSTEPS; s++) print_message("step %zu: %s\n", s, ref->steps[s]);
  /* The script does what it is meant to: an observe (with its steer
   * message), a block, a replay. */
  assert_true(strncmp(ref->steps[0], "execute/", 8) == 0);
  assert_true(strncmp(ref->steps[2], "execute/", 8) == 0);
  assert_null(strstr(ref->steps[2], "msg=-"));
  assert_true(strncmp(ref->steps[4], "block/same_call_repeat", 22) == 0);
  assert_true(strncmp(ref->steps[7], "execute/", 8) == 0);
  assert_true(strncmp(ref->steps[9], "replay/", 7) == 0);
  assert_int_equal(g_live, held); /* a whole run leaves nothing behind */
  for (int rest = 0; rest <= 1; rest++) {
    long n;
    for (n = 1; n < MAX_N; n++) {
      long before = g_live;
      arm(n, rest);
      play(pol, ref, false);
      bool reached = g_failed > 0;
      disarm();
      if (g_live != before)
        fail_msg("engine, N=%ld%s: %ld allocations leaked", n, rest ? "+" : "", g_live - before);
      if (!reached) break;
    }
    assert_true(n > 5 && n < MAX_N);
  }
  lg_policy_free(pol);
  assert_int_equal(g_live, 0);
  uninstall();
  free(ref->envelope);
  free(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oom_canon),
      cmocka_unit_test(test_oom_canon_recovers),
      cmocka_unit_test(test_oom_policy),
      cmocka_unit_test(test_oom_engine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
