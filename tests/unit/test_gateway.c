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
  assert_int_equal(lg__gw_config_pick(&cfg, "gpt-4o", LG__GW_ROUTE_OPENAI, &model), 0);
  assert_int_equal(lg__gw_config_pick(&cfg, "claude-x", LG__GW_ROUTE_ANTHROPIC, &model), 1); /* /v1/messages */
  lg__gw_config_clear(&cfg);

  /* an /openai/ path (an AzureOpenAI client's) goes to an Azure resource
   * whatever the default and a route say: no other upstream serves it,
   * and the client's api-key is that resource's */
  const char *az[] = {"https://api.openai.com/v1", "az=https://r.openai.azure.com/openai"};
  assert_int_equal(lg__gw_config_load(&cfg, az, 2, NULL, &e), 0);
  assert_int_equal(cfg.up[1].azure, 1);
  assert_int_equal(lg__gw_config_pick(&cfg, "gpt-4o", LG__GW_ROUTE_AZURE, &model), 1);
  assert_int_equal(lg__gw_config_pick(&cfg, NULL, LG__GW_ROUTE_AZURE, &model), 1); /* passed through */
  assert_int_equal(lg__gw_config_pick(&cfg, "gpt-4o", LG__GW_ROUTE_OPENAI, &model), 0);
  lg__gw_config_clear(&cfg);

  /* an Azure resource is known by its host and its path; other
   * OpenAI-compatible APIs whose path ends in /openai are not one (their
   * key goes in Authorization, their paths without Azure's) */
  static const struct {
    const char *url;
    int azure;
  } hosts[] = {
      {"https://r.openai.azure.com/openai", 1},
      {"https://r.cognitiveservices.azure.com/openai/", 1},
      {"https://R.Services.AI.Azure.com:443/openai", 1},
      {"https://r.openai.azure.us/openai", 1},
      {"https://r.openai.azure.com./openai", 1},
      {"https://contoso-apim.azure-api.net/openai", 1}, /* API Management before the resource */
      {"https://r.openai.azure.com/openai/v1", 0}, /* the resource's v1 API: plain OpenAI */
      {"https://generativelanguage.googleapis.com/v1beta/openai", 0},
      {"https://api.deepinfra.com/v1/openai", 0},
      {"https://gateway.ai.cloudflare.com/v1/acct/gw/openai", 0},
      {"https://azure.com.example.org/openai", 0},
      {"http://127.0.0.1:9000/openai", 0},
      {"https://user@notazure.com/openai", 0},
  };
  for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) {
    assert_int_equal(lg__gw_config_load(&cfg, &hosts[i].url, 1, NULL, &e), 0);
    if (cfg.up[0].azure != hosts[i].azure) fail_msg("%s: azure %d", hosts[i].url, cfg.up[0].azure);
    assert_int_equal(cfg.up[0].api, LG__GW_API_OPENAI);
    lg__gw_config_clear(&cfg);
  }

  /* a base URL every request would fail on is refused at the start, the
   * flag named and what is wrong said (until session 30 "http://" and
   * "http:///v1", an empty $HOST in a script, started a gateway that
   * answered every request 502) */
  static const struct {
    const char *url, *says;
  } urls[] = {
      {"ftp://x", "\"ftp://x\" is not an http:// or https:// URL"},
      {"http://", "has no host"},
      {"http:///v1", "has no host"},
      {"https://:443/v1", "has no host"},
      {"http://h:99999/v1", "Port number"},
      {"http://[::1/v1", "IPv6"},
      {"http://exa mple/v1", "libcurl"},
      {"http://h/v1?api-version=1", "has a query (?api-version=1)"},
      {"http://h/v1#x", "has a fragment"},
  };
  for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
    memset(&e, 0, sizeof e);
    if (lg__gw_config_load(&cfg, &urls[i].url, 1, NULL, &e) != LG_EINVAL)
      fail_msg("%s was taken", urls[i].url);
    assert_string_equal(e.field, "--upstream");
    if (!strstr(e.message, urls[i].says)) fail_msg("%s: %s", urls[i].url, e.message);
    lg__gw_config_clear(&cfg);
  }
  const char *ok[] = {"http://[::1]:8080/v1", "https://api.openai.com/v1/", "http://localhost"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    assert_int_equal(lg__gw_config_load(&cfg, &ok[i], 1, NULL, &e), 0);
    lg__gw_config_clear(&cfg);
  }
  /* one name twice: the second flag would hide the first */
  const char *twice[] = {"a=http://x/v1", "a=http://y/v1"};
  memset(&e, 0, sizeof e);
  assert_int_equal(lg__gw_config_load(&cfg, twice, 2, NULL, &e), LG_EINVAL);
  if (!strstr(e.message, "upstream \"a\" is given twice")) fail_msg("a twice: %s", e.message);
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
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "gpt-4o", LG__GW_ROUTE_ANTHROPIC, &model)].name, "anthropic");
  /* a route to an upstream that is not an Azure resource is not an Azure path's */
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "claude-3", LG__GW_ROUTE_AZURE, &model)].name, "openai");
  lg__gw_config_clear(&cfg);
  unlink(path);
  free(path);

  /* "api": "azure": an Azure resource's classic API under any URL (a
   * custom domain, an API Management front, a local stand-in) */
  path = write_tmp("{\"upstreams\": {\"o\": {\"base_url\": \"http://127.0.0.1:9/v1\"},"
                   " \"az\": {\"base_url\": \"https://aoai.example.com/openai\", \"api\": \"azure\"}}}");
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, path, &e), 0);
  assert_int_equal(cfg.up[0].azure, 0);
  assert_int_equal(cfg.up[1].azure, 1);
  assert_int_equal(cfg.up[1].api, LG__GW_API_OPENAI); /* its body and answers are OpenAI's */
  assert_string_equal(cfg.up[lg__gw_config_pick(&cfg, "gpt-4o", LG__GW_ROUTE_AZURE, &model)].name, "az");
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
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"api_key_env\": \"LG_TEST_GW_UNSET\"}}}", "upstreams.a.api_key_env"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"ftp://x/v1\"}}}", "upstreams.a.base_url"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"https:///v1\"}}}", "upstreams.a.base_url"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1?key=1\"}}}", "upstreams.a.base_url"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"ca_file\": 7}}}", "upstreams.a.ca_file"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"ca_file\": \"/nonexistent/ca.pem\"}}}", "upstreams.a.ca_file"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"ca_file\": \"/tmp\"}}}", "upstreams.a.ca_file"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"default\": \"b\"}", "default"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [{\"model_prefix\": \"x\", \"upstream\": \"b\"}]}", "routes[0].upstream"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [7]}", "routes[0]"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\", \"api_key_env\": 7}}}", "upstreams.a.api_key_env"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"default\": 7}", "default"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [{\"model_prefix\": 7, \"upstream\": \"a\"}]}", "routes[0].model_prefix"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [{\"model_prefix\": \"x\", \"upstream\": 7}]}", "routes[0].upstream"},
      {"{\"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}}, \"routes\": [{\"model_prefix\": \"x\", \"upstream\": \"a\", \"strip_prefix\": \"yes\"}]}", "routes[0].strip_prefix"},
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
    /* the field is named once, by its own member: the message says what is wrong */
    if (*e.field && !strncmp(e.message, e.field, strlen(e.field)))
      fail_msg("case %zu: the message repeats the field: %s", i, e.message);
    lg__gw_config_clear(&cfg);
    unlink(path);
    free(path);
  }
  lg__gw_config_t cfg = {0};
  lg_error_t e = {0};
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, "/nonexistent/ups.json", &e), LG_EIO);
  assert_string_equal(e.source, "/nonexistent/ups.json");
  lg__gw_config_clear(&cfg);
  /* The line of the field refused, and of a syntax error. */
  char *path = write_tmp("{\n  \"upstreams\": {\"a\": {\"base_url\": \"http://x/v1\"}},\n"
                         "  \"routes\": [\n    {\"model_prefix\": \"x\", \"upstream\": \"a\"},\n"
                         "    {\"model_prefix\": \"y\",\n     \"upstream\": \"b\"}]\n}\n");
  cfg = (lg__gw_config_t){0};
  e = (lg_error_t){0};
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, path, &e), LG_EINVAL);
  assert_string_equal(e.field, "routes[1].upstream");
  assert_int_equal(e.line, 6);
  lg__gw_config_clear(&cfg);
  unlink(path);
  free(path);
  path = write_tmp("{\n  \"upstreams\": {\n    \"a\": {\"base_url\": }}}\n");
  cfg = (lg__gw_config_t){0};
  e = (lg_error_t){0};
  assert_int_equal(lg__gw_config_load(&cfg, NULL, 0, path, &e), LG_EPARSE);
  assert_int_equal(e.line, 3);
  lg__gw_config_clear(&cfg);
  unlink(path);
  free(path);
}

/* The CAs an upstream's TLS is checked against: its ca_file alone; else
 * OpenSSL's SSL_CERT_FILE and SSL_CERT_DIR, each replacing its default;
 * else libcurl's (NULL). A path that cannot be read stops the start. */
static void upstream_cas(void **state) {
  (void)state;
  char *pem = write_tmp("-----BEGIN CERTIFICATE-----\n");
  char doc[600];
  snprintf(doc, sizeof doc, "{\"upstreams\": {\"a\": {\"base_url\": \"https://x/v1\", \"ca_file\": \"%s\"}}}", pem);
  char *file = write_tmp(doc);
  const char *spec[] = {"https://y/v1"};
  lg__gw_config_t cfg = {0};
  lg_error_t e = {0};
  unsetenv("SSL_CERT_FILE");
  unsetenv("SSL_CERT_DIR");
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, file, &e), 0);
  assert_null(cfg.up[0].ca_file); /* the system's */
  assert_null(cfg.up[0].ca_dir);
  assert_false(cfg.up[0].ca_alone);
  assert_null(cfg.up[0].proxy_ca_file);
  assert_null(cfg.up[1].proxy_ca_file);
  assert_string_equal(cfg.up[1].ca_file, pem);
  assert_true(cfg.up[1].ca_alone);
  lg__gw_config_clear(&cfg);

  setenv("SSL_CERT_FILE", pem, 1);
  setenv("SSL_CERT_DIR", "/tmp", 1);
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, file, &e), 0);
  assert_string_equal(cfg.up[0].ca_file, pem);
  assert_string_equal(cfg.up[0].ca_dir, "/tmp");
  assert_false(cfg.up[0].ca_alone);
  assert_string_equal(cfg.up[1].ca_file, pem); /* its own file: the variables do not apply */
  assert_null(cfg.up[1].ca_dir);
  assert_true(cfg.up[1].ca_alone);
  /* ... but to an https:// proxy, the environment's, they do, for every upstream */
  for (int i = 0; i < 2; i++) {
    assert_string_equal(cfg.up[i].proxy_ca_file, pem);
    assert_string_equal(cfg.up[i].proxy_ca_dir, "/tmp");
  }
  lg__gw_config_clear(&cfg);

  setenv("SSL_CERT_FILE", "/nonexistent/ca.pem", 1);
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, NULL, &e), LG_EINVAL);
  assert_string_equal(e.field, "SSL_CERT_FILE");
  assert_non_null(strstr(e.message, "/nonexistent/ca.pem"));
  lg__gw_config_clear(&cfg);
  setenv("SSL_CERT_FILE", pem, 1);
  setenv("SSL_CERT_DIR", pem, 1); /* a file, not a folder */
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, NULL, &e), LG_EINVAL);
  assert_string_equal(e.field, "SSL_CERT_DIR");
  lg__gw_config_clear(&cfg);
  /* folders split by ':', as OpenSSL reads the variable: each checked */
  setenv("SSL_CERT_DIR", "/tmp::/", 1);
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, NULL, &e), 0);
  assert_string_equal(cfg.up[0].ca_dir, "/tmp::/");
  lg__gw_config_clear(&cfg);
  char list[300];
  snprintf(list, sizeof list, "/tmp:%s", pem);
  setenv("SSL_CERT_DIR", list, 1);
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, NULL, &e), LG_EINVAL);
  assert_string_equal(e.field, "SSL_CERT_DIR");
  assert_non_null(strstr(e.message, "not a folder"));
  assert_non_null(strstr(e.message, pem));
  lg__gw_config_clear(&cfg);
  setenv("SSL_CERT_DIR", "/nonexistent:/tmp", 1);
  assert_int_equal(lg__gw_config_load(&cfg, spec, 1, NULL, &e), LG_EINVAL);
  assert_non_null(strstr(e.message, "cannot read /nonexistent:"));
  lg__gw_config_clear(&cfg);
  unsetenv("SSL_CERT_FILE");
  unsetenv("SSL_CERT_DIR");
  unlink(file);
  unlink(pem);
  free(file);
  free(pem);
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

/* A poll's output as its progress is compared: a clock's reading (a
 * time with seconds, a date) and a random id (a UUID, 32 hex digits or
 * more) are one '#'; a file's line and column, a count, a longer run of
 * digits, a short hash, a word are kept as they are. */
static void output_gist(void **state) {
  (void)state;
  static const char *const cases[][2] = {
      {"2026-12-07 01:02:03.125 waiting for the lock", "# # waiting for the lock"},
      {"[01:02:03] waiting", "[#] waiting"},
      {"1:02:03 up", "# up"},
      {"2026-12-07T01:02:03Z", "#T#Z"},
      {"2026/12/07,01:02:03,5", "#,#"},
      {"at 23:59:59, done", "at #, done"},
      {"main.c:12:5: error: expected ';'", "main.c:12:5: error: expected ';'"},
      {"src/a.c:120:15: warning", "src/a.c:120:15: warning"},
      {"12:34:567 and 112:03:04", "12:34:567 and 112:03:04"},
      {"12026-12-07 and 2026-12/07", "12026-12-07 and 2026-12/07"},
      {"[3/9] cc -c src/unit3.c", "[3/9] cc -c src/unit3.c"},
      {"x2026-12-07y", "x#y"},
      {"01:02:0", "01:02:0"},
      {"req 123e4567-e89b-12d3-a456-426614174000 waiting", "req # waiting"},
      {"trace_id=4BF92F3577B34DA6A3CE929D0E0E4736.", "trace_id=#."},
      {"sha256:" "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256:#"},
      {"HEAD is now at 3f2a9c1 fix", "HEAD is now at 3f2a9c1 fix"},
      {"x4bf92f3577b34da6a3ce929d0e0e4736 and 4bf92f3577b34da6a3ce929d0e0e4736g",
       "x4bf92f3577b34da6a3ce929d0e0e4736 and 4bf92f3577b34da6a3ce929d0e0e4736g"},
      {"123e4567-e89b-12d3-a456-42661417400", "123e4567-e89b-12d3-a456-42661417400"},
      {"deadbeef-cafe", "deadbeef-cafe"},
      {"", ""},
  };
  char out[128];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t n = lg__gw_output_gist(cases[i][0], strlen(cases[i][0]), out);
    assert_true(n <= strlen(cases[i][0]));
    out[n] = 0;
    assert_string_equal(out, cases[i][1]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(flags),
      cmocka_unit_test(file_and_routes),
      cmocka_unit_test(file_errors),
      cmocka_unit_test(upstream_cas),
      cmocka_unit_test(claims),
      cmocka_unit_test(named_policies),
      cmocka_unit_test(output_gist),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
