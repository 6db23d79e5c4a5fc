/*
 * test_gateway.c — the gateway's configuration (src/gateway/upstream.c):
 * --upstream values and the --upstreams file, the choice of an upstream
 * for a request, and the errors, which name the field as policy files do.
 * The gateway end to end (real clients, a fake upstream) is
 * tests/gateway/run.sh (ctest gateway_e2e).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/gw.h"

static char *write_tmp(const char *text) {
  char *path = strdup("/tmp/lg_gw_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

static void flags(void **state) {
  (void)state;
  lg__gw_config_t cfg = {0};
  lg_error_t e = {0};
  const char *specs[] = {"http://127.0.0.1:9000/v1/", "claude=https://api.anthropic.com/v1"};
  assert_int_equal(lg__gw_config_load(&cfg, specs, 2, NULL, &e), 0);
  assert_int_equal(cfg.nup, 2);
  assert_string_equal(cfg.up[0].name, "default");
  assert_string_equal(cfg.up[0].base_url, "http://127.0.0.1:9000/v1"); /* no trailing slash */
  assert_int_equal(cfg.up[0].api, LG__GW_API_OPENAI);
  assert_string_equal(cfg.up[1].name, "claude");
  assert_int_equal(cfg.up[1].api, LG__GW_API_ANTHROPIC); /* by its host */
  assert_null(cfg.up[0].api_key); /* the client's own key */
  const char *model;
  assert_int_equal(lg__gw_config_pick(&cfg, "gpt-4o", 0, &model), 0);
  assert_int_equal(lg__gw_config_pick(&cfg, "claude-x", 1, &model), 1); /* /v1/messages */
  lg__gw_config_clear(&cfg);

  const char *bad[] = {"ftp://x"};
  assert_int_equal(lg__gw_config_load(&cfg, bad, 1, NULL, &e), LG_EINVAL);
  assert_non_null(strstr(e.message, "ftp://x"));
  lg__gw_config_clear(&cfg);
}

static void file_and_routes(void **state) {
  (void)state;
  setenv("LG_TEST_GW_KEY", "sk-secret", 1);
  char *path = write_tmp(
      "{\"upstreams\": {\"openai\": {\"base_url\": \"https://api.openai.com/v1\", \"api\": \"openai\","
      " \"api_key_env\": \"LG_TEST_GW_KEY\", \"timeout_ms\": 5000},"
      " \"anthropic\": {\"base_url\": \"https://api.anthropic.com/v1\", \"api\": \"anthropic\"}},"
      " \"default\": \"openai\","
      " \"routes\": [{\"model_prefix\": \"claude-\", \"upstream\": \"anthropic\"},"
      "              {\"model_prefix\": \"oss/\", \"upstream\": \"openai\", \"strip_prefix\": true}]}");
  lg__gw_config_t cfg = {0};
  lg_error_t e = {0};
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, path, &e), 0);
  assert_int_equal(cfg.nup, 2);
  assert_string_equal(cfg.up[cfg.def].name, "openai");
  assert_string_equal(cfg.up[0].api_key, "sk-secret");
  assert_int_equal(cfg.up[0].timeout_ms, 5000);
  const char *model;
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "claude-3", 0, &model)].name, "anthropic");
  assert_string_equal(model, "claude-3");
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "oss/llama", 0, &model)].name, "openai");
  assert_string_equal(model, "llama"); /* strip_prefix */
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "gpt-4o", 0, &model)].name, "openai");
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "gpt-4o", 1, &model)].name, "anthropic");
  lg__gw_config_clear(&cfg);
  unlink(path);
  free(path);
}

/* Each mistake names its field. */
static void file_errors(void **state) {
  (void)state;
  static const struct {
    const char *doc, *field;
  } cases[] = {
      {"[]", ""},
      {"{\"upstream\": {}}", "upstream"},
      {"{\"upstreams\": {}}", "upstreams"},
      {"{\"upstreams\": {\"a\": {\"base_url\": 7}}}", "upstreams.a.base_url"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"api\": \"gemini\"}}}", "upstreams.a.api"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"timeout_ms\": 0}}}", "upstreams.a.timeout_ms"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"key\": 1}}}", "upstreams.a.key"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"api_key_env\": \"LG_TEST_GW_UNSET\"}}}", "api_key_env"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"default\": \"b\"}", "default"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [{\"model_prefix\": \"x\", \"upstream\": \"b\"}]}", "routes[0]"},
  };
  unsetenv("LG_TEST_GW_UNSET");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *path = write_tmp(cases[i].doc);
    lg__gw_config_t cfg = {0};
    lg_error_t e = {0};
    int rc = lg__gw_config_load(&cfg, NULL, 0, path, &e);
    if (rc == 0) fail_msg("case %zu (%s) loaded", i, cases[i].doc);
    assert_string_equal(e.field, cases[i].field);
    assert_string_equal(e.source, path); /* the file named */
    lg__gw_config_clear(&cfg);
    unlink(path);
    free(path);
  }
  lg__gw_config_t cfg = {0};
  lg_error_t e = {0};
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, "/nonexistent/ups.json", &e), LG_EPARSE);
  lg__gw_config_clear(&cfg);
}

/* The gateway answers /v1/ paths that are not loopguard's own API. */
static void claims(void **state) {
  (void)state;
  assert_true(lg__gw_claims(NULL, "/v1/chat/completions"));
  assert_true(lg__gw_claims(NULL, "/v1/models"));
  assert_true(lg__gw_claims(NULL, "/v1/runsx"));
  assert_false(lg__gw_claims(NULL, "/v1/runs"));
  assert_false(lg__gw_claims(NULL, "/v1/runs/r1/trace"));
  assert_false(lg__gw_claims(NULL, "/v1/budgets/key:a"));
  assert_false(lg__gw_claims(NULL, "/v1/keys"));
  assert_false(lg__gw_claims(NULL, "/healthz"));
}

/* --policies DIR: every NAME.json loaded, found by name; a bad file fails
 * the whole load, naming the file and the field. */
static void named_policies(void **state) {
  (void)state;
  char dir[] = "/tmp/lg_gw_pol_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  const char *files[][2] = {{"strict.json", "{\"repeat\":{\"block\":2}}"},
                            {"loose.json", "{}"},
                            {"README.txt", "not a policy"},
                            {".hidden.json", "not json"}};
  for (size_t i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i][0]);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(files[i][1], f);
    fclose(f);
  }
  lg__gw_policies_t ps = {0};
  lg_error_t e = {0};
  assert_int_equal(lg__gw_policies_load(&ps, dir, &e), 0);
  assert_int_equal(ps.n, 2);
  const lg__gw_policy_t *p = lg__gw_policies_find(&ps, "strict");
  assert_non_null(p);
  assert_non_null(strstr(p->json, "\"block\":2"));
  assert_non_null(lg__gw_policies_find(&ps, "loose"));
  assert_null(lg__gw_policies_find(&ps, "README"));
  assert_null(lg__gw_policies_find(&ps, "nope"));
  assert_null(lg__gw_policies_find(&ps, NULL));
  lg__gw_policies_clear(&ps);

  snprintf(path, sizeof path, "%s/bad.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"repeat\":{\"block\":\"three\"}}", f);
  fclose(f);
  assert_int_not_equal(lg__gw_policies_load(&ps, dir, &e), 0);
  assert_int_equal(ps.n, 0);
  assert_non_null(strstr(e.field, "repeat.block"));
  assert_non_null(strstr(e.source, "bad.json"));
  unlink(path);

  assert_int_not_equal(lg__gw_policies_load(&ps, "/nonexistent/policies", &e), 0);
  assert_string_equal(e.field, "policies");
  assert_int_equal(lg__gw_policies_load(&ps, NULL, &e), 0); /* none given */
  for (size_t i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i][0]);
    unlink(path);
  }
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flags),
      cmocka_unit_test(file_and_routes),
      cmocka_unit_test(file_errors),
      cmocka_unit_test(claims),
      cmocka_unit_test(named_policies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
