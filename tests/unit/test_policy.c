/*
 * test_policy.c — policy-v1 documents (lg_policy_*): the defaults, the
 * example of the spec, and above all the errors — a typo in a safety
 * setting must be an error that names the field, never silently ignored.
 *
 * The effective policy is observed through lg_policy_to_json (parsed back
 * with jansson), so the tests hold whatever the internal layout becomes;
 * only the tool lookup test reaches into policy.h, as the tests may.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loopguard.h"
#include "policy/policy.h"

#define S(lit) lit, sizeof(lit) - 1

/* The example of docs/reference/policy-v1.md, verbatim. */
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
    "  \"text\": { \"repeat\": { \"observe\": 1, \"stop\": 2 }, \"monologue\": 3 },\n"
    "  \"compaction\": { \"max\": 10 },\n"
    "  \"cascade\": {\n"
    "    \"hide_turns\": 2,\n"
    "    \"offer\": [\"ask_human\", \"finalize_partial\"],\n"
    "    \"escalate\": { \"model\": \"a-stronger-model\", \"turns\": 2 }\n"
    "  },\n"
    "  \"gateway\": { \"max_reasks\": 2, \"final_round\": false },\n"
    "  \"tools\": {\n"
    "    \"charge_invoice\": { \"loop_key\": { \"invoice_id\": [\"digits\"] }, "
    "\"side_effects\": true, \"max_calls\": 10 },\n"
    "    \"search\":         { \"loop_key\": { \"q\": [\"lower\", \"trim\", "
    "\"collapse_space\"] } },\n"
    "    \"lookup\":         { \"loop_key\": [\"customer_id\"] },\n"
    "    \"poll_job\":       { \"loop_key\": false },\n"
    "    \"run_shell\":      { \"empty_ok\": true }\n"
    "  }\n"
    "}\n";

/* ------------------------------------------------------------------ */
/* Helpers.                                                            */

/* The effective policy as a jansson object (new reference). */
static json_t *effective(const lg_policy_t *p) {
  char *s = lg_policy_to_json(p);
  assert_non_null(s);
  json_error_t je;
  json_t *j = json_loads(s, JSON_REJECT_DUPLICATES, &je);
  if (!j) fail_msg("lg_policy_to_json gave invalid JSON (%s): %s", je.text, s);
  lg_free(s);
  return j;
}

/* The value at a dotted path ("repeat.block"), borrowed from j. */
static json_t *at(json_t *j, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  json_t *v = j;
  for (char *save = NULL, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) {
    v = json_object_get(v, k);
    if (!v) fail_msg("no %s in the effective policy", path);
  }
  return v;
}

static void assert_int_at(json_t *j, const char *path, json_int_t want) {
  json_t *v = at(j, path);
  if (!json_is_integer(v) || json_integer_value(v) != want)
    fail_msg("%s: want %lld", path, (long long)want);
}

static void assert_json_at(json_t *j, const char *path, const char *want) {
  json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
  assert_non_null(w);
  json_t *v = at(j, path);
  if (!json_equal(v, w)) {
    char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_SORT_KEYS);
    fail_msg("%s: got %s, want %s", path, got, want);
  }
  json_decref(w);
}

static lg_policy_t *parse_ok(const char *json, int line) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(json, strlen(json), "test", &err);
  if (!p) fail_msg("line %d: %s rejected: %s: %s", line, json, err.field, err.message);
  return p;
}
#define PARSE_OK(json) parse_ok(json, __LINE__)

/* Expects `json` to be rejected with `code`, naming `field`. */
static void parse_err(const char *json, int code, const char *field, int line) {
  lg_error_t err;
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_parse(json, strlen(json), "my.policy", &err);
  if (p) {
    lg_policy_free(p);
    fail_msg("line %d: %s was accepted", line, json);
  }
  if (err.code != code || strcmp(err.field, field) != 0)
    fail_msg("line %d: %s: got %s field \"%s\" (%s), want %s field \"%s\"", line, json,
             lg_err_name(err.code), err.field, err.message, lg_err_name(code), field);
  if (!err.message[0]) fail_msg("line %d: no message", line);
  if (strcmp(err.source, "my.policy") != 0)
    fail_msg("line %d: source \"%s\", want my.policy", line, err.source);
  /* Without an lg_error_t it fails the same way. */
  assert_null(lg_policy_parse(json, strlen(json), NULL, NULL));
}
#define PARSE_ERR(json, field) parse_err(json, LG_EPOLICY, field, __LINE__)

/* ------------------------------------------------------------------ */

static void test_defaults(void **state) {
  (void)state;
  lg_policy_t *p = lg_policy_default();
  assert_non_null(p);
  json_t *j = effective(p);
  assert_int_at(j, "limits.max_steps", 50);
  assert_int_at(j, "limits.max_model_calls", 50);
  assert_int_at(j, "limits.max_wall_ms", 600000);
  assert_json_at(j, "limits.max_cost_usd", "null");
  assert_json_at(j, "limits.max_tokens", "null");
  assert_int_at(j, "limits.max_handoffs", 10);
  assert_int_at(j, "repeat.observe", 2);
  assert_int_at(j, "repeat.block", 3);
  assert_int_at(j, "repeat.stop", 6);
  assert_int_at(j, "repeat.window", 20);
  assert_int_at(j, "cycle.max_period", 4);
  assert_int_at(j, "no_progress.results", 3);
  assert_int_at(j, "no_progress.world_steps", 5);
  assert_int_at(j, "failure_streak", 5);
  assert_int_at(j, "block_streak", 5);
  assert_int_at(j, "text.repeat.observe", 1);
  assert_int_at(j, "text.repeat.stop", 2);
  assert_int_at(j, "text.monologue", 3);
  assert_int_at(j, "compaction.max", 10);
  assert_int_at(j, "cascade.hide_turns", 2);
  assert_json_at(j, "cascade.offer", "[]");
  assert_json_at(j, "cascade.escalate", "null");
  assert_int_at(j, "gateway.max_reasks", 2);
  assert_json_at(j, "gateway.final_round", "false");
  assert_json_at(j, "tools", "{}");
  /* Nothing else. */
  const char *top[] = {"limits", "repeat",     "cycle",   "no_progress", "failure_streak",
                       "block_streak", "text", "compaction", "cascade", "gateway", "tools"};
  assert_int_equal(json_object_size(j), sizeof top / sizeof top[0]);
  assert_int_equal(json_object_size(at(j, "limits")), 6);
  assert_int_equal(json_object_size(at(j, "repeat")), 4);
  assert_int_equal(json_object_size(at(j, "text")), 2);
  assert_int_equal(json_object_size(at(j, "cascade")), 3);
  assert_int_equal(json_object_size(at(j, "gateway")), 2);
  /* The empty policy is the default policy. */
  char *d = lg_policy_to_json(p);
  lg_policy_t *e = PARSE_OK("{}");
  char *de = lg_policy_to_json(e);
  assert_string_equal(d, de);
  lg_free(d);
  lg_free(de);
  lg_policy_free(e);
  e = PARSE_OK(" { \"limits\" : { } , \"tools\" : { } } ");
  de = lg_policy_to_json(e);
  d = lg_policy_to_json(p);
  assert_string_equal(d, de);
  lg_free(d);
  lg_free(de);
  lg_policy_free(e);
  json_decref(j);
  lg_policy_free(p);
}

static void test_example(void **state) {
  (void)state;
  lg_policy_t *p = PARSE_OK(EXAMPLE);
  json_t *j = effective(p);
  assert_int_at(j, "limits.max_steps", 50);
  assert_json_at(j, "limits.max_cost_usd", "null");
  assert_int_at(j, "repeat.stop", 6);
  assert_int_at(j, "failure_streak", 5);
  assert_json_at(j, "cascade.offer", "[\"ask_human\",\"finalize_partial\"]");
  assert_json_at(j, "cascade.escalate", "{\"model\":\"a-stronger-model\",\"turns\":2}");
  assert_int_equal(p->offer, LG_ALT_ASK_HUMAN | LG_ALT_FINALIZE_PARTIAL);
  assert_string_equal(p->escalate_model, "a-stronger-model");
  assert_int_equal(json_object_size(at(j, "tools")), 5);
  assert_json_at(j, "tools.charge_invoice.loop_key", "{\"invoice_id\":[\"digits\"]}");
  assert_json_at(j, "tools.charge_invoice.side_effects", "true");
  assert_int_at(j, "tools.charge_invoice.max_calls", 10);
  assert_json_at(j, "tools.charge_invoice.empty_ok", "false");
  assert_json_at(j, "tools.search.loop_key", "{\"q\":[\"lower\",\"trim\",\"collapse_space\"]}");
  assert_json_at(j, "tools.search.side_effects", "false");
  assert_json_at(j, "tools.search.max_calls", "null");
  /* A list of fields is the same as fields without normalizers. */
  assert_json_at(j, "tools.lookup.loop_key", "{\"customer_id\":[]}");
  assert_json_at(j, "tools.poll_job.loop_key", "false");
  assert_json_at(j, "tools.run_shell.empty_ok", "true");
  assert_json_at(j, "tools.run_shell.loop_key", "true");
  /* What lg_policy_to_json prints parses back to the same policy. */
  char *s1 = lg_policy_to_json(p);
  lg_policy_t *q = PARSE_OK(s1);
  char *s2 = lg_policy_to_json(q);
  assert_string_equal(s1, s2);
  lg_free(s1);
  lg_free(s2);
  lg_policy_free(q);
  json_decref(j);
  lg_policy_free(p);
}

static void test_values(void **state) {
  (void)state;
  lg_policy_t *p = PARSE_OK(
      "{\"limits\":{\"max_steps\":null,\"max_model_calls\":0,\"max_wall_ms\":1,"
      "\"max_cost_usd\":1.5,\"max_tokens\":100000,\"max_handoffs\":null},"
      "\"repeat\":{\"observe\":false,\"block\":4,\"stop\":false,\"window\":10000},"
      "\"cycle\":{\"max_period\":0},\"no_progress\":{\"results\":0,\"world_steps\":9},"
      "\"failure_streak\":0,"
      "\"tools\":{\"t\":{\"loop_key\":{\"id\":[\"strip_prefix:INV-\",\"upper\",\"strip_prefix:\"]},"
      "\"max_calls\":null,\"side_effects\":false,\"empty_ok\":false}}}");
  json_t *j = effective(p);
  assert_json_at(j, "limits.max_steps", "null");
  assert_int_at(j, "limits.max_model_calls", 0);
  assert_int_at(j, "limits.max_wall_ms", 1);
  assert_json_at(j, "limits.max_cost_usd", "1.5");
  assert_int_at(j, "limits.max_tokens", 100000);
  assert_json_at(j, "limits.max_handoffs", "null");
  assert_json_at(j, "repeat.observe", "false");
  assert_int_at(j, "repeat.block", 4);
  assert_json_at(j, "repeat.stop", "false");
  assert_int_at(j, "repeat.window", 10000);
  assert_int_at(j, "cycle.max_period", 0);
  assert_int_at(j, "no_progress.results", 0);
  assert_int_at(j, "no_progress.world_steps", 9);
  assert_int_at(j, "failure_streak", 0);
  assert_json_at(j, "tools.t.loop_key", "{\"id\":[\"strip_prefix:INV-\",\"upper\",\"strip_prefix:\"]}");
  json_decref(j);
  lg_policy_free(p);
  /* Small amounts of money survive. */
  p = PARSE_OK("{\"limits\":{\"max_cost_usd\":0.000042}}");
  j = effective(p);
  assert_json_at(j, "limits.max_cost_usd", "0.000042");
  json_decref(j);
  lg_policy_free(p);
  p = PARSE_OK("{\"limits\":{\"max_cost_usd\":0}}");
  j = effective(p);
  assert_json_at(j, "limits.max_cost_usd", "0");
  json_decref(j);
  lg_policy_free(p);
  p = PARSE_OK("{\"limits\":{\"max_cost_usd\":25}}");
  j = effective(p);
  assert_json_at(j, "limits.max_cost_usd", "25");
  json_decref(j);
  lg_policy_free(p);
  /* Every rung off, and equal rungs, are valid ladders. */
  lg_policy_free(PARSE_OK("{\"repeat\":{\"observe\":false,\"block\":false,\"stop\":false}}"));
  lg_policy_free(PARSE_OK("{\"repeat\":{\"observe\":3,\"block\":3,\"stop\":3}}"));
  lg_policy_free(PARSE_OK("{\"repeat\":{\"observe\":1,\"block\":false,\"stop\":2}}"));
  lg_policy_free(PARSE_OK("{\"repeat\":{\"observe\":false,\"block\":9,\"stop\":9}}"));
  lg_policy_free(PARSE_OK("{\"cycle\":{\"max_period\":8}}"));
  lg_policy_free(PARSE_OK("{\"tools\":{\"t\":{\"loop_key\":{\"f\":[\"lower\",\"lower\",\"lower\","
                          "\"lower\",\"lower\",\"lower\",\"lower\",\"lower\"]}}}}"));
}

/* The fields of the text, compaction, cascade and gateway guards, and
 * block_streak: values, printing, round trip, and errors naming the path. */
static void test_guard_fields(void **state) {
  (void)state;
  lg_policy_t *p = PARSE_OK(
      "{\"block_streak\":0,\"text\":{\"repeat\":{\"observe\":false,\"stop\":4},\"monologue\":0},"
      "\"compaction\":{\"max\":0},\"cascade\":{\"hide_turns\":0,\"offer\":[\"finalize_partial\"],"
      "\"escalate\":{\"model\":\"big \\\"one\\\"\"}},\"gateway\":{\"max_reasks\":0,\"final_round\":true}}");
  json_t *j = effective(p);
  assert_int_at(j, "block_streak", 0);
  assert_json_at(j, "text.repeat.observe", "false");
  assert_int_at(j, "text.repeat.stop", 4);
  assert_int_at(j, "text.monologue", 0);
  assert_int_at(j, "compaction.max", 0);
  assert_int_at(j, "cascade.hide_turns", 0);
  assert_json_at(j, "cascade.offer", "[\"finalize_partial\"]");
  /* turns defaults to 2 when only the model is named. */
  assert_json_at(j, "cascade.escalate", "{\"model\":\"big \\\"one\\\"\",\"turns\":2}");
  assert_int_at(j, "gateway.max_reasks", 0);
  assert_json_at(j, "gateway.final_round", "true");
  json_decref(j);
  char *s1 = lg_policy_to_json(p);
  lg_policy_t *q = PARSE_OK(s1);
  char *s2 = lg_policy_to_json(q);
  assert_string_equal(s1, s2);
  lg_free(s1);
  lg_free(s2);
  lg_policy_free(q);
  lg_policy_free(p);
  p = PARSE_OK("{\"text\":{\"repeat\":{\"stop\":false}},\"cascade\":{\"escalate\":null,\"offer\":[]}}");
  j = effective(p);
  assert_int_at(j, "text.repeat.observe", 1);
  assert_json_at(j, "text.repeat.stop", "false");
  assert_json_at(j, "cascade.escalate", "null");
  json_decref(j);
  lg_policy_free(p);
  p = PARSE_OK("{\"text\":{\"repeat\":{\"observe\":3,\"stop\":3},\"monologue\":2},"
               "\"cascade\":{\"escalate\":{\"turns\":5,\"model\":\"m\"}},\"block_streak\":1}");
  assert_int_equal(p->text_observe, 3);
  assert_int_equal(p->text_monologue, 2);
  assert_int_equal(p->escalate_turns, 5);
  assert_int_equal(p->block_streak, 1);
  lg_policy_free(p);
  PARSE_ERR("{\"block_streak\":-1}", "block_streak");
  PARSE_ERR("{\"block_streak\":null}", "block_streak");
  PARSE_ERR("{\"block_streak\":2000000}", "block_streak");
  PARSE_ERR("{\"text\":3}", "text");
  PARSE_ERR("{\"text\":{\"repat\":{}}}", "text.repat");
  PARSE_ERR("{\"text\":{\"repeat\":{\"observe\":0}}}", "text.repeat.observe");
  PARSE_ERR("{\"text\":{\"repeat\":{\"stop\":true}}}", "text.repeat.stop");
  PARSE_ERR("{\"text\":{\"repeat\":{\"block\":2}}}", "text.repeat.block");
  PARSE_ERR("{\"text\":{\"repeat\":{\"observe\":3,\"stop\":2}}}", "text.repeat.observe");
  PARSE_ERR("{\"text\":{\"repeat\":[]}}", "text.repeat");
  PARSE_ERR("{\"text\":{\"monologue\":false}}", "text.monologue");
  PARSE_ERR("{\"text\":{\"monologue\":1}}", "text.monologue");
  PARSE_ERR("{\"compaction\":{\"max\":-1}}", "compaction.max");
  PARSE_ERR("{\"compaction\":{\"min\":1}}", "compaction.min");
  PARSE_ERR("{\"compaction\":10}", "compaction");
  PARSE_ERR("{\"cascade\":{\"hide_turns\":\"2\"}}", "cascade.hide_turns");
  PARSE_ERR("{\"cascade\":{\"offer\":\"ask_human\"}}", "cascade.offer");
  PARSE_ERR("{\"cascade\":{\"offer\":[\"skip_current\"]}}", "cascade.offer.0");
  PARSE_ERR("{\"cascade\":{\"offer\":[\"ask_human\",\"ask_human\"]}}", "cascade.offer.1");
  PARSE_ERR("{\"cascade\":{\"offer\":[1]}}", "cascade.offer.0");
  PARSE_ERR("{\"cascade\":{\"escalate\":\"m\"}}", "cascade.escalate");
  PARSE_ERR("{\"cascade\":{\"escalate\":{\"turns\":2}}}", "cascade.escalate.model");
  PARSE_ERR("{\"cascade\":{\"escalate\":{\"model\":\"\"}}}", "cascade.escalate.model");
  PARSE_ERR("{\"cascade\":{\"escalate\":{\"model\":\"m\",\"turns\":0}}}", "cascade.escalate.turns");
  PARSE_ERR("{\"cascade\":{\"escalate\":{\"model\":\"m\",\"x\":1}}}", "cascade.escalate.x");
  PARSE_ERR("{\"cascade\":{\"hide\":1}}", "cascade.hide");
  PARSE_ERR("{\"gateway\":{\"max_reasks\":1.5}}", "gateway.max_reasks");
  PARSE_ERR("{\"gateway\":{\"max_reasks\":101}}", "gateway.max_reasks");
  PARSE_ERR("{\"gateway\":{\"final_round\":1}}", "gateway.final_round");
  PARSE_ERR("{\"gateway\":{\"rounds\":1}}", "gateway.rounds");
}

static void test_unknown_fields(void **state) {
  (void)state;
  PARSE_ERR("{\"repeat\":{\"blok\":3}}", "repeat.blok");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[\"nope\"]}}}}", "tools.x.loop_key.f");
  PARSE_ERR("{\"limit\":{}}", "limit");
  PARSE_ERR("{\"limits\":{\"max_step\":1}}", "limits.max_step");
  PARSE_ERR("{\"limits\":{\"max_steps\":1,\"max_cost\":1}}", "limits.max_cost");
  PARSE_ERR("{\"cycle\":{\"period\":2}}", "cycle.period");
  PARSE_ERR("{\"no_progress\":{\"result\":2}}", "no_progress.result");
  PARSE_ERR("{\"failure-streak\":5}", "failure-streak");
  PARSE_ERR("{\"tools\":{\"x\":{\"loopkey\":false}}}", "tools.x.loopkey");
  PARSE_ERR("{\"tools\":{\"a\":{},\"b.c\":{\"max_call\":1}}}", "tools.b.c.max_call");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[\"lower\",\"strip_prefix\"]}}}}",
            "tools.x.loop_key.f");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[\"Lower\"]}}}}", "tools.x.loop_key.f");
  /* The message names the bad normalizer. */
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_parse(S("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[\"nope\"]}}}}"), NULL,
                              &err));
  assert_non_null(strstr(err.message, "nope"));
  assert_string_equal(err.source, "<policy>");
}

static void test_wrong_types(void **state) {
  (void)state;
  PARSE_ERR("{\"limits\":{\"max_steps\":\"50\"}}", "limits.max_steps");
  PARSE_ERR("{\"limits\":{\"max_steps\":1.5}}", "limits.max_steps");
  PARSE_ERR("{\"limits\":{\"max_steps\":-1}}", "limits.max_steps");
  PARSE_ERR("{\"limits\":{\"max_steps\":true}}", "limits.max_steps");
  PARSE_ERR("{\"limits\":{\"max_wall_ms\":[]}}", "limits.max_wall_ms");
  PARSE_ERR("{\"limits\":{\"max_cost_usd\":\"1\"}}", "limits.max_cost_usd");
  PARSE_ERR("{\"limits\":{\"max_cost_usd\":-0.5}}", "limits.max_cost_usd");
  PARSE_ERR("{\"limits\":{\"max_cost_usd\":1e12}}", "limits.max_cost_usd");
  PARSE_ERR("{\"limits\":[]}", "limits");
  PARSE_ERR("{\"repeat\":3}", "repeat");
  PARSE_ERR("{\"repeat\":{\"window\":0}}", "repeat.window");
  PARSE_ERR("{\"repeat\":{\"window\":10001}}", "repeat.window");
  PARSE_ERR("{\"repeat\":{\"window\":false}}", "repeat.window");
  PARSE_ERR("{\"repeat\":{\"observe\":0}}", "repeat.observe");
  PARSE_ERR("{\"repeat\":{\"block\":-3}}", "repeat.block");
  PARSE_ERR("{\"repeat\":{\"stop\":true}}", "repeat.stop");
  PARSE_ERR("{\"repeat\":{\"stop\":null}}", "repeat.stop");
  PARSE_ERR("{\"repeat\":{\"stop\":6.5}}", "repeat.stop");
  PARSE_ERR("{\"cycle\":{\"max_period\":9}}", "cycle.max_period"); /* spec: at most 8 */
  PARSE_ERR("{\"cycle\":{\"max_period\":17}}", "cycle.max_period");
  PARSE_ERR("{\"cycle\":{\"max_period\":null}}", "cycle.max_period");
  PARSE_ERR("{\"no_progress\":{\"results\":\"3\"}}", "no_progress.results");
  PARSE_ERR("{\"failure_streak\":null}", "failure_streak");
  PARSE_ERR("{\"failure_streak\":{}}", "failure_streak");
  PARSE_ERR("{\"tools\":[]}", "tools");
  PARSE_ERR("{\"tools\":{\"x\":3}}", "tools.x");
  PARSE_ERR("{\"tools\":{\"x\":{\"side_effects\":1}}}", "tools.x.side_effects");
  PARSE_ERR("{\"tools\":{\"x\":{\"empty_ok\":\"yes\"}}}", "tools.x.empty_ok");
  PARSE_ERR("{\"tools\":{\"x\":{\"max_calls\":-2}}}", "tools.x.max_calls");
  PARSE_ERR("{\"tools\":{\"x\":{\"max_calls\":\"10\"}}}", "tools.x.max_calls");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":\"f\"}}}", "tools.x.loop_key");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":null}}}", "tools.x.loop_key");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":[\"a\",1]}}}", "tools.x.loop_key.1");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":[\"a\",\"b\",\"a\"]}}}", "tools.x.loop_key.2");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":\"lower\"}}}}", "tools.x.loop_key.f");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[1]}}}}", "tools.x.loop_key.f");
  PARSE_ERR("{\"tools\":{\"x\":{\"loop_key\":{\"f\":[\"lower\",\"lower\",\"lower\",\"lower\","
            "\"lower\",\"lower\",\"lower\",\"lower\",\"lower\"]}}}}",
            "tools.x.loop_key.f");
  /* A policy is an object. */
  PARSE_ERR("[]", "");
  PARSE_ERR("null", "");
  PARSE_ERR("\"policy\"", "");
}

static void test_rungs(void **state) {
  (void)state;
  lg_policy_t *p = PARSE_OK("{\"repeat\":{\"observe\":false}}");
  json_t *j = effective(p);
  assert_json_at(j, "repeat.observe", "false");
  assert_int_at(j, "repeat.block", 3);
  assert_int_at(j, "repeat.stop", 6);
  json_decref(j);
  lg_policy_free(p);
  /* The rungs must rise: observe <= block <= stop, those that are on. */
  PARSE_ERR("{\"repeat\":{\"observe\":4,\"block\":3}}", "repeat.observe");
  PARSE_ERR("{\"repeat\":{\"block\":7}}", "repeat.block");
  PARSE_ERR("{\"repeat\":{\"stop\":2}}", "repeat.block");
  PARSE_ERR("{\"repeat\":{\"observe\":7}}", "repeat.observe");
  PARSE_ERR("{\"repeat\":{\"observe\":5,\"block\":false,\"stop\":3}}", "repeat.observe");
  PARSE_ERR("{\"repeat\":{\"observe\":false,\"block\":5,\"stop\":4}}", "repeat.block");
}

static void test_malformed_json(void **state) {
  (void)state;
  static const char bad[] = "{\n  \"repeat\": {\n    \"block\" 3\n  }\n}\n";
  lg_error_t err;
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_parse(S(bad), "team.json", &err));
  assert_int_equal(err.code, LG_EPOLICY);
  assert_int_equal(err.line, 3);
  assert_string_equal(err.source, "team.json");
  assert_non_null(strstr(err.message, "line 3"));
  assert_non_null(strstr(err.message, "column"));
  /* The formatted error leads with file and line. */
  char buf[1024];
  lg_error_format(&err, buf, sizeof buf);
  assert_true(strncmp(buf, "team.json:3: ", 13) == 0);
  /* Other ways to be malformed. */
  const char *more[] = {"", "   ", "{", "{} x", "{\"repeat\":{\"block\":3,}}", "{'a':1}",
                        "{\"a\":01}", "{\"tools\":{\"\xc0\x80\":{}}}", "\xef\xbb\xbf{}"};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
    memset(&err, 0, sizeof err);
    if (lg_policy_parse(more[i], strlen(more[i]), "x", &err))
      fail_msg("[%s] was accepted", more[i]);
    if (err.code != LG_EPOLICY || err.line < 1 || !err.message[0])
      fail_msg("[%s]: %s line %ld", more[i], lg_err_name(err.code), err.line);
  }
  /* NULL input is empty input. */
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_parse(NULL, 0, NULL, &err));
  assert_int_equal(err.code, LG_EPOLICY);
}

static void test_duplicate_keys(void **state) {
  (void)state;
  const char *dups[] = {
      "{\"repeat\":{\"block\":3,\"block\":4}}",
      "{\"limits\":{},\"limits\":{}}",
      "{\"failure_streak\":1,\"failure_streak\":1}",
      "{\"tools\":{\"x\":{},\"x\":{}}}",
      "{\"tools\":{\"x\":{\"loop_key\":{\"f\":[],\"f\":[\"lower\"]}}}}",
      "{\"tools\":{\"x\":{\"loop_key\":false,\"loop_key\":true}}}",
  };
  for (size_t i = 0; i < sizeof dups / sizeof dups[0]; i++) {
    lg_error_t err;
    memset(&err, 0, sizeof err);
    if (lg_policy_parse(dups[i], strlen(dups[i]), "dup.json", &err))
      fail_msg("%s was accepted", dups[i]);
    if (err.code != LG_EPOLICY || !strstr(err.message, "duplicate"))
      fail_msg("%s: %s \"%s\"", dups[i], lg_err_name(err.code), err.message);
    assert_int_equal(err.line, 1);
  }
}

static void test_load_file(void **state) {
  (void)state;
  lg_error_t err;
  memset(&err, 0, sizeof err);
  const char *missing = "/nonexistent-dir/loopguard/no-such-policy.json";
  assert_null(lg_policy_load_file(missing, &err));
  assert_int_equal(err.code, LG_EIO);
  assert_string_equal(err.source, missing);
  char buf[1024];
  assert_non_null(strstr(lg_error_format(&err, buf, sizeof buf), missing));

  char path[] = "/tmp/lg-test-policy-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs(EXAMPLE, f);
  fclose(f);
  memset(&err, 0, sizeof err);
  lg_policy_t *p = lg_policy_load_file(path, &err);
  if (!p) fail_msg("%s: %s", path, err.message);
  lg_policy_t *q = PARSE_OK(EXAMPLE);
  char *a = lg_policy_to_json(p), *b = lg_policy_to_json(q);
  assert_string_equal(a, b);
  lg_free(a);
  lg_free(b);
  lg_policy_free(p);
  lg_policy_free(q);

  /* A bad file: the error names the file, the line and the field. */
  f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\n\"repeat\": {\"blok\": 3}\n}\n", f);
  fclose(f);
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_load_file(path, &err));
  assert_int_equal(err.code, LG_EPOLICY);
  assert_string_equal(err.source, path);
  assert_string_equal(err.field, "repeat.blok");
  assert_int_equal(err.line, 2);
  f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\n\n\"repeat\": {\"block\": }\n}\n", f);
  fclose(f);
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_load_file(path, &err));
  assert_int_equal(err.code, LG_EPOLICY);
  assert_string_equal(err.source, path);
  assert_int_equal(err.line, 3);
  /* An empty file is not a policy. */
  f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_load_file(path, &err));
  assert_int_equal(err.code, LG_EPOLICY);
  unlink(path);
  /* A directory cannot be read as a policy. */
  memset(&err, 0, sizeof err);
  assert_null(lg_policy_load_file("/tmp", &err));
  assert_true(err.code == LG_EIO || err.code == LG_EPOLICY);
  assert_string_equal(err.source, "/tmp");
}

/* ---- reference counting, watched through a counting allocator ---- */

static long g_live; /* allocations not yet freed */

static void *count_malloc(size_t n) {
  void *p = malloc(n);
  if (p) g_live++;
  return p;
}
static void *count_realloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (q && !p) g_live++;
  return q;
}
static void count_free(void *p) {
  if (p) g_live--;
  free(p);
}

static void test_refcount(void **state) {
  (void)state;
  lg_set_allocator(count_malloc, count_realloc, count_free);
  g_live = 0;
  lg_policy_t *p = PARSE_OK(EXAMPLE);
  long held = g_live;
  assert_true(held > 0);
  assert_ptr_equal(lg_policy_ref(p), p);
  assert_int_equal(g_live, held);
  lg_policy_free(p); /* one reference left: nothing is freed */
  assert_int_equal(g_live, held);
  char *s = lg_policy_to_json(p); /* still usable */
  assert_non_null(s);
  assert_non_null(strstr(s, "charge_invoice"));
  lg_free(s);
  lg_policy_free(p); /* the last one */
  assert_int_equal(g_live, 0);
  lg_set_allocator(NULL, NULL, NULL);
  g_live = 0;
}

static void test_refcount_exact(void **state) {
  (void)state;
  lg_set_allocator(count_malloc, count_realloc, count_free);
  g_live = 0;
  lg_policy_t *d = lg_policy_default();
  lg_policy_ref(d);
  lg_policy_ref(d);
  lg_policy_free(d);
  lg_policy_free(d);
  assert_true(g_live > 0);
  lg_policy_free(d);
  assert_int_equal(g_live, 0);
  lg_policy_free(NULL);
  assert_null(lg_policy_ref(NULL));
  const char *bad[] = {"{\"repeat\":{\"blok\":3}}", "{\"tools\":{\"a\":{\"loop_key\":[\"x\"]},"
                                                    "\"b\":{\"loop_key\":{\"y\":[\"strip_prefix:Q\","
                                                    "\"bogus\"]}}}}",
                       "{\"tools\":{\"a\":{},\"b\":{\"loop_key\":[\"x\",3]}}}", "{\"a\":", "[]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_null(lg_policy_parse(bad[i], strlen(bad[i]), NULL, NULL));
    if (g_live != 0) fail_msg("%s leaked %ld allocations", bad[i], g_live);
  }
  lg_set_allocator(NULL, NULL, NULL);
  g_live = 0;
}

/* The tool lookup (a binary search over the sorted tools) finds every tool
 * whatever the order of the file, and nothing else. */
static void test_tool_lookup(void **state) {
  (void)state;
  char json[8192];
  size_t n = (size_t)snprintf(json, sizeof json, "{\"tools\":{");
  const int N = 57;
  for (int i = 0; i < N; i++) {
    int k = (i * 37) % N; /* a permutation */
    n += (size_t)snprintf(json + n, sizeof json - n, "%s\"tool_%02d\":{\"max_calls\":%d}",
                          i ? "," : "", k, k);
  }
  snprintf(json + n, sizeof json - n, "}}");
  lg_policy_t *p = PARSE_OK(json);
  for (int k = 0; k < N; k++) {
    char name[32];
    snprintf(name, sizeof name, "tool_%02d", k);
    const lg__toolpol_t *t = lg__policy_tool(p, name);
    assert_non_null(t);
    assert_string_equal(t->name, name);
    assert_int_equal(t->max_calls, k);
  }
  assert_null(lg__policy_tool(p, "tool_"));
  assert_null(lg__policy_tool(p, "tool_99"));
  assert_null(lg__policy_tool(p, ""));
  assert_null(lg__policy_tool(p, "zzz"));
  lg_policy_free(p);
  lg_policy_t *d = lg_policy_default();
  assert_null(lg__policy_tool(d, "anything"));
  lg_policy_free(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),       cmocka_unit_test(test_example),
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_guard_fields),         cmocka_unit_test(test_unknown_fields),
      cmocka_unit_test(test_wrong_types),    cmocka_unit_test(test_rungs),
      cmocka_unit_test(test_malformed_json), cmocka_unit_test(test_duplicate_keys),
      cmocka_unit_test(test_load_file),      cmocka_unit_test(test_refcount),
      cmocka_unit_test(test_refcount_exact), cmocka_unit_test(test_tool_lookup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
