/*
 * upstream.c — where the gateway sends model requests: the upstreams of
 * --upstream URL / NAME=URL and --upstreams FILE (gateway-v1 "Starting
 * it"), the choice of one for a request, and one HTTP exchange with it
 * through libcurl.
 *
 * Each gateway worker thread keeps one curl easy handle for its life, and
 * each thread that runs requests on fibers keeps the handles of its
 * finished ones (gateway.c, "spares"), so connections (and TLS sessions)
 * to an upstream are reused across requests. TLS is verified (libcurl's
 * default, kept; an upstream's ca_file, or SSL_CERT_FILE and
 * SSL_CERT_DIR, for a private CA), HTTP/1.1
 * (see lg__gw_http_do), proxies come from the environment (http_proxy,
 * https_proxy, no_proxy: libcurl reads them),
 * and every exchange has a connect timeout and a total one (the
 * upstream's timeout_ms). A stop flag (shutdown, a client that went away)
 * aborts an exchange from its progress callback, and so does a client
 * whose socket says it hung up (look_at_client).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "gw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#define DEFAULT_TIMEOUT_MS 600000

/* ---- configuration ---- */

static void upstream_free(lg__gw_upstream_t *u) {
  lg__free(u->name);
  lg__free(u->base_url);
  lg__free(u->api_key);
  lg__free(u->ca_file);
  lg__free(u->ca_dir);
  lg__free(u->proxy_ca_file);
  lg__free(u->proxy_ca_dir);
}

/* A CA file (or folders) given for an upstream's TLS: read at start, so
 * that a wrong path is an error then, not every request's 502. Folders
 * are a list split by ':', as OpenSSL reads SSL_CERT_DIR (and libcurl's
 * CAPATH passes to it): each must be one. */
static int ca_check(const char *path, int dir, const char *where, lg_error_t *err) {
  const char *end = dir ? strchr(path, ':') : NULL;
  if (end) {
    char one[PATH_MAX];
    size_t n = (size_t)(end - path);
    if (!n) return ca_check(end + 1, dir, where, err); /* "a::b": an empty one, as OpenSSL skips it */
    if (n >= sizeof one)
      return lg__err(err, LG_EINVAL, where, -1, "a folder in the list is longer than %d bytes", PATH_MAX - 1);
    memcpy(one, path, n);
    one[n] = '\0';
    return ca_check(one, dir, where, err) || ca_check(end + 1, dir, where, err) ? LG_EINVAL : 0;
  }
  if (dir && !*path) return 0; /* a list's empty end ("a:") */
  struct stat st;
  if (stat(path, &st) || access(path, R_OK))
    return lg__err(err, LG_EINVAL, where, -1, "cannot read %s: %s", path, strerror(errno));
  if (dir != !!S_ISDIR(st.st_mode))
    return lg__err(err, LG_EINVAL, where, -1, "%s is %s", path,
                   dir ? "not a folder" : "a folder, not a file of PEM certificates");
  return 0;
}

/* An upstream's CAs: its ca_file alone, else OpenSSL's variables (each
 * replaces the default it names, as for other programs on OpenSSL:
 * SSL_CERT_FILE alone keeps the system's folder), else libcurl's defaults
 * (the system's). An https:// proxy's own certificate is checked against
 * the variables' CAs (the proxy is the environment's, not the upstream's:
 * its ca_file does not apply), else the system's. */
static int upstream_cas(lg__gw_upstream_t *u, const char *ca_file, const char *where,
                        lg_error_t *err) {
  char field[220];
  const char *ef = getenv("SSL_CERT_FILE"), *ed = getenv("SSL_CERT_DIR");
  if (ef && !*ef) ef = NULL;
  if (ed && !*ed) ed = NULL;
  if (ef && ca_check(ef, 0, "SSL_CERT_FILE", err)) return LG_EINVAL;
  if (ed && ca_check(ed, 1, "SSL_CERT_DIR", err)) return LG_EINVAL;
  if (ca_file) {
    snprintf(field, sizeof field, "%s.ca_file", where);
    if (ca_check(ca_file, 0, field, err)) return LG_EINVAL;
    u->ca_alone = 1;
  }
  const char *f = ca_file ? ca_file : ef, *d = ca_file ? NULL : ed;
  if ((f && !(u->ca_file = lg__strdup(f))) || (d && !(u->ca_dir = lg__strdup(d))) ||
      (ef && !(u->proxy_ca_file = lg__strdup(ef))) || (ed && !(u->proxy_ca_dir = lg__strdup(ed))))
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  return 0;
}

/* An upstream's "api": "azure" (the file's): an Azure OpenAI resource's
 * classic API under any URL (a custom domain, an API Management front).
 * It speaks OpenAI's API (u->api) with Azure's paths and key (u->azure). */
#define API_AZURE 2

/* Whether a host is Azure's (RESOURCE.openai.azure.com,
 * .cognitiveservices.azure.com, .services.ai.azure.com; Azure
 * Government's .azure.us, China's .azure.cn; an API Management front's
 * .azure-api.net, as enterprises put one before the resource). A base URL
 * whose path ends in /openai is a resource's classic API only on such a
 * host: other OpenAI-compatible APIs end in /openai too (Gemini's
 * generativelanguage.googleapis.com/v1beta/openai, DeepInfra's
 * api.deepinfra.com/v1/openai, a Cloudflare AI Gateway's .../openai), and
 * take their key in Authorization, their paths without Azure's. */
static int azure_host(const char *host) {
  static const char *const azure[] = {".azure.com", ".azure.us", ".azure.cn", ".azure-api.net"};
  size_t hl = strlen(host);
  while (hl && host[hl - 1] == '.') hl--; /* a fully qualified name's dot */
  for (size_t i = 0; i < sizeof azure / sizeof *azure; i++) {
    size_t sl = strlen(azure[i]);
    if (hl > sl && !strncasecmp(host + hl - sl, azure[i], sl)) return 1;
  }
  return 0;
}

/* A base URL the API's paths can be appended to: http:// or https://, a
 * host, a port libcurl takes, no query nor fragment (the path goes after
 * the base, so "?x=1" would end up before it, and "#x" would drop it).
 * Caught at the start: it failed every request with a 502 before.
 * *azure: whether its host is Azure's (azure_host). */
static int check_url(const char *url, const char *field, int *azure, lg_error_t *err) {
  if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
    return lg__err(err, LG_EINVAL, field, -1, "\"%s\" is not an http:// or https:// URL", url);
  CURLU *u = curl_url();
  if (!u) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  char *host = NULL, *query = NULL, *frag = NULL;
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (!uc) uc = curl_url_get(u, CURLUPART_HOST, &host, 0);
  int rc = 0;
  const char *at = strstr(url, "://") + 3; /* libcurl reads "http:///v1" as the host v1 */
  if (uc == CURLUE_NO_HOST || !*at || strchr("/?#", *at) || (!uc && (!host || !*host)))
    rc = lg__err(err, LG_EINVAL, field, -1, "\"%s\" has no host (for example http://127.0.0.1:9000/v1)",
                 url);
  else if (uc)
    rc = lg__err(err, LG_EINVAL, field, -1, "\"%s\" is not a URL libcurl can use: %s", url,
                 curl_url_strerror(uc));
  else if (curl_url_get(u, CURLUPART_QUERY, &query, 0) == CURLUE_OK && query)
    rc = lg__err(err, LG_EINVAL, field, -1,
                 "\"%s\" has a query (?%s): the API's path (/chat/completions, ...) is added "
                 "after the base URL, so a base URL ends with its path",
                 url, query);
  else if (curl_url_get(u, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK && frag)
    rc = lg__err(err, LG_EINVAL, field, -1,
                 "\"%s\" has a fragment (#%s): a base URL ends with its path", url, frag);
  *azure = !rc && azure_host(host);
  curl_free(host);
  curl_free(query);
  curl_free(frag);
  curl_url_cleanup(u);
  return rc;
}

static int add_upstream(lg__gw_config_t *cfg, const char *name, size_t nlen, const char *url,
                        int api, const char *key_env, int64_t timeout_ms, const char *ca_file,
                        const char *where, lg_error_t *err) {
  char ufield[220], kfield[220]; /* a flag's mistakes name the flag, a file's the field */
  int flag = !strncmp(where, "--", 2);
  snprintf(ufield, sizeof ufield, flag ? "%s" : "%s.base_url", where);
  snprintf(kfield, sizeof kfield, "%s.api_key_env", where);
  int azure_at = 0;
  if (check_url(url, ufield, &azure_at, err)) return LG_EINVAL;
  for (size_t i = 0; i < cfg->nup; i++)
    if (strlen(cfg->up[i].name) == nlen && !memcmp(cfg->up[i].name, name, nlen))
      return lg__err(err, LG_EINVAL, where, -1, "upstream \"%.*s\" is given twice", (int)nlen, name);
  lg__gw_upstream_t *v = lg__realloc(cfg->up, (cfg->nup + 1) * sizeof *v);
  if (!v) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  cfg->up = v;
  lg__gw_upstream_t *u = &v[cfg->nup];
  memset(u, 0, sizeof *u);
  u->name = lg__strndup(name, nlen);
  size_t ul = strlen(url);
  while (ul && url[ul - 1] == '/') ul--;
  u->base_url = lg__strndup(url, ul);
  u->api = api == API_AZURE ? LG__GW_API_OPENAI : api;
  u->azure = api == API_AZURE ||
             (api == LG__GW_API_OPENAI && azure_at && ul >= 7 && !memcmp(url + ul - 7, "/openai", 7));
  u->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
  int rc = 0;
  if (!u->name || !u->base_url) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (key_env) {
    const char *k = getenv(key_env);
    if (!k || !*k)
      rc = lg__err(err, LG_EINVAL, kfield, -1, "the environment variable %s is not set", key_env);
    else if (!(u->api_key = lg__strdup(k)))
      rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  if (!rc) rc = upstream_cas(u, ca_file, where, err);
  if (rc) {
    upstream_free(u);
    return rc;
  }
  cfg->nup++;
  return 0;
}

/* The index of the upstream named name, or cfg->nup. */
static size_t upstream_index(const lg__gw_config_t *cfg, const char *name) {
  size_t i;
  for (i = 0; i < cfg->nup; i++)
    if (!strcmp(cfg->up[i].name, name)) break;
  return i;
}

/* One entry of the file's "upstreams": its fields checked, then added. */
static int file_upstream(lg__gw_config_t *cfg, const char *k, json_t *v, lg_error_t *err) {
  char field[200];
  snprintf(field, sizeof field, "upstreams.%s", k);
  if (!json_is_object(v)) return lg__err(err, LG_EINVAL, field, -1, "expected an object");
  const char *fk;
  json_t *fv;
  json_object_foreach(v, fk, fv) {
    if (strcmp(fk, "base_url") && strcmp(fk, "api") && strcmp(fk, "api_key_env") &&
        strcmp(fk, "timeout_ms") && strcmp(fk, "ca_file")) {
      snprintf(field, sizeof field, "upstreams.%s.%s", k, fk);
      return lg__err(err, LG_EINVAL, field, -1,
                     "unknown field (known: base_url, api, api_key_env, timeout_ms, ca_file)");
    }
  }
  json_t *url = json_object_get(v, "base_url"), *api = json_object_get(v, "api"),
         *kenv = json_object_get(v, "api_key_env"), *to = json_object_get(v, "timeout_ms"),
         *ca = json_object_get(v, "ca_file");
  snprintf(field, sizeof field, "upstreams.%s.base_url", k);
  if (!json_is_string(url)) return lg__err(err, LG_EINVAL, field, -1, "expected a URL string");
  snprintf(field, sizeof field, "upstreams.%s.api", k);
  const char *av = json_string_value(api);
  if (api && (!av || (strcmp(av, "anthropic") && strcmp(av, "openai") && strcmp(av, "azure"))))
    return lg__err(err, LG_EINVAL, field, -1, "expected \"openai\", \"anthropic\" or \"azure\"");
  int apiv = !av || !strcmp(av, "openai") ? LG__GW_API_OPENAI
             : !strcmp(av, "azure")       ? API_AZURE
                                          : LG__GW_API_ANTHROPIC;
  snprintf(field, sizeof field, "upstreams.%s.api_key_env", k);
  if (kenv && !json_is_string(kenv))
    return lg__err(err, LG_EINVAL, field, -1, "expected the name of a variable");
  snprintf(field, sizeof field, "upstreams.%s.timeout_ms", k);
  if (to && (!json_is_integer(to) || json_integer_value(to) < 1))
    return lg__err(err, LG_EINVAL, field, -1, "expected a positive integer");
  snprintf(field, sizeof field, "upstreams.%s.ca_file", k);
  if (ca && (!json_is_string(ca) || !*json_string_value(ca)))
    return lg__err(err, LG_EINVAL, field, -1, "expected the path of a PEM file");
  snprintf(field, sizeof field, "upstreams.%s", k);
  return add_upstream(cfg, k, strlen(k), json_string_value(url), apiv,
                      kenv ? json_string_value(kenv) : NULL, to ? json_integer_value(to) : 0,
                      ca ? json_string_value(ca) : NULL, field, err);
}

/* The file's "default" (the --upstream flags, when given, win). */
static int file_default(lg__gw_config_t *cfg, json_t *def, size_t first, lg_error_t *err) {
  if (!def) return 0;
  if (!json_is_string(def))
    return lg__err(err, LG_EINVAL, "default", -1, "expected the name of an upstream");
  size_t i = upstream_index(cfg, json_string_value(def));
  if (i == cfg->nup || i < first)
    return lg__err(err, LG_EINVAL, "default", -1, "no upstream \"%s\"", json_string_value(def));
  if (first == 0) cfg->def = i;
  return 0;
}

/* "routes[R].LEAF" in buf. */
static const char *sub(char *buf, size_t size, size_t r, const char *leaf) {
  snprintf(buf, size, "routes[%zu].%s", r, leaf);
  return buf;
}

/* One entry of the file's "routes". */
static int file_route(lg__gw_config_t *cfg, size_t r, json_t *ro, lg_error_t *err) {
  char field[64];
  snprintf(field, sizeof field, "routes[%zu]", r);
  if (!json_is_object(ro)) return lg__err(err, LG_EINVAL, field, -1, "expected an object");
  json_t *mp = json_object_get(ro, "model_prefix"), *us = json_object_get(ro, "upstream"),
         *sp = json_object_get(ro, "strip_prefix");
  if (!json_is_string(mp))
    return lg__err(err, LG_EINVAL, sub(field, sizeof field, r, "model_prefix"), -1, "expected a string");
  if (!json_is_string(us))
    return lg__err(err, LG_EINVAL, sub(field, sizeof field, r, "upstream"), -1,
                   "expected the name of an upstream");
  if (sp && !json_is_boolean(sp))
    return lg__err(err, LG_EINVAL, sub(field, sizeof field, r, "strip_prefix"), -1,
                   "expected true or false");
  size_t i = upstream_index(cfg, json_string_value(us));
  if (i == cfg->nup)
    return lg__err(err, LG_EINVAL, sub(field, sizeof field, r, "upstream"), -1, "no upstream \"%s\"",
                   json_string_value(us));
  lg__gw_route_t *nv = lg__realloc(cfg->routes, (cfg->nroutes + 1) * sizeof *nv);
  if (!nv) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  cfg->routes = nv;
  nv[cfg->nroutes] = (lg__gw_route_t){lg__strdup(json_string_value(mp)), i, sp && json_is_true(sp)};
  if (!nv[cfg->nroutes].model_prefix) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  cfg->nroutes++;
  return 0;
}

/* The whole file: upstreams, default, routes. */
static int file_fields(lg__gw_config_t *cfg, json_t *root, lg_error_t *err) {
  if (!json_is_object(root)) return lg__err(err, LG_EINVAL, "", -1, "the upstreams file must be a JSON object");
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    if (strcmp(k, "upstreams") && strcmp(k, "default") && strcmp(k, "routes"))
      return lg__err(err, LG_EINVAL, k, -1, "unknown field (known: upstreams, default, routes)");
  }
  json_t *ups = json_object_get(root, "upstreams");
  if (!json_is_object(ups) || !json_object_size(ups))
    return lg__err(err, LG_EINVAL, "upstreams", -1, "expected an object of at least one upstream");
  size_t first = cfg->nup;
  int rc = 0;
  json_object_foreach(ups, k, v) {
    if ((rc = file_upstream(cfg, k, v, err))) return rc;
  }
  if ((rc = file_default(cfg, json_object_get(root, "default"), first, err))) return rc;
  json_t *routes = json_object_get(root, "routes");
  if (routes && !json_is_array(routes)) return lg__err(err, LG_EINVAL, "routes", -1, "expected an array");
  for (size_t r = 0; !rc && routes && r < json_array_size(routes); r++)
    rc = file_route(cfg, r, json_array_get(routes, r), err);
  return rc;
}

static int load_file(lg__gw_config_t *cfg, const char *file, lg_error_t *err) {
  lg__buf_t b = {0};
  int rc = lg__buf_read_file(&b, file, "upstreams file", err);
  if (rc) return rc;
  json_error_t je;
  lg__json_begin();
  json_t *root = json_loadb(b.data ? b.data : "", b.len, JSON_REJECT_DUPLICATES, &je);
  if (lg__json_oom()) {
    json_decref(root);
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  } else if (!root) {
    rc = lg__err(err, LG_EPARSE, NULL, je.position, "%s", je.text);
    if (err) err->line = je.line;
    lg__err_where(err, file, je.line);
  } else {
    rc = file_fields(cfg, root, err);
    if (rc && rc != LG_ENOMEM) {
      lg__err_json_line(err, b.data, b.len);
      lg__err_where(err, file, 0);
    }
    json_decref(root);
  }
  lg__buf_free(&b);
  return rc;
}

int lg__gw_config_load(lg__gw_config_t *cfg, const char *const *specs, size_t n,
                       const char *file, lg_error_t *err) {
  for (size_t i = 0; i < n; i++) {
    const char *s = specs[i], *eq = strchr(s, '=');
    const char *sch = strstr(s, "://");
    int rc;
    if (eq && (!sch || eq < sch)) /* NAME=URL */
      rc = add_upstream(cfg, s, (size_t)(eq - s), eq + 1, LG__GW_API_OPENAI, NULL, 0, NULL,
                        "--upstream", err);
    else
      rc = add_upstream(cfg, i ? "upstream" : "default", i ? 8 : 7, s, LG__GW_API_OPENAI, NULL,
                        0, NULL, "--upstream", err);
    if (rc) return rc;
    /* An upstream whose URL names Anthropic speaks its API. */
    if (strstr(cfg->up[cfg->nup - 1].base_url, "anthropic.com"))
      cfg->up[cfg->nup - 1].api = LG__GW_API_ANTHROPIC;
  }
  if (file && *file) return load_file(cfg, file, err);
  return 0;
}

void lg__gw_config_clear(lg__gw_config_t *cfg) {
  for (size_t i = 0; i < cfg->nup; i++) upstream_free(&cfg->up[i]);
  for (size_t i = 0; i < cfg->nroutes; i++) lg__free(cfg->routes[i].model_prefix);
  lg__free(cfg->up);
  lg__free(cfg->routes);
  memset(cfg, 0, sizeof *cfg);
}

size_t lg__gw_config_pick(const lg__gw_config_t *cfg, const char *model, int route,
                          const char **model_out) {
  int azure = route == LG__GW_ROUTE_AZURE;
  if (model_out) *model_out = model;
  for (size_t i = 0; model && i < cfg->nroutes; i++) {
    size_t pl = strlen(cfg->routes[i].model_prefix);
    if (azure && !cfg->up[cfg->routes[i].upstream].azure) continue;
    if (!strncmp(model, cfg->routes[i].model_prefix, pl)) {
      if (cfg->routes[i].strip_prefix && model_out) *model_out = model + pl;
      return cfg->routes[i].upstream;
    }
  }
  for (size_t i = 0; route != LG__GW_ROUTE_OPENAI && i < cfg->nup; i++)
    if (azure ? cfg->up[i].azure : cfg->up[i].api == LG__GW_API_ANTHROPIC) return i;
  return cfg->def;
}

const char *lg__gw_upstream_label(const lg__gw_upstream_t *u, char *buf, size_t size) {
  const char *h = strstr(u->base_url, "://");
  h = h ? h + 3 : u->base_url;
  size_t hl = strcspn(h, "/");
  snprintf(buf, size, "%s (%.*s)", u->name, (int)hl, h);
  return buf;
}

/* ---- one exchange ---- */

/* Shutting down, or the client went away: the exchange is aborted. */
static int stopped(const lg__gw_http_t *x) {
  return (x->stop && atomic_load(x->stop)) || (x->gone && atomic_load(x->gone));
}

#define CLIENT_POLL_MS 100 /* how often an exchange looks whether its client hung up */

/* Whether the client hung up while its answer is awaited: its socket's
 * end shut (POLLRDHUP: it closed, even with bytes of its own unread, as a
 * proxy reads a client's abort), reset or in error. libmicrohttpd does
 * not look at a parked connection, and a stream's response sees a hang-up
 * only once it has begun: without this look, a client that left before
 * its answer began (an SDK's timeout, a person's Ctrl-C) left the model
 * generating to its end, and its reservation charged. Looked at every
 * CLIENT_POLL_MS from the exchange's start: a quick exchange never is. A
 * hang-up is the job's own flag (*gone), as a stream's response sets it:
 * stopped() reads one, and a later exchange of the request (a re-ask)
 * stops at once. */
static void look_at_client(lg__gw_http_t *x, uint64_t now) {
  if (x->client_fd < 0 || !x->gone || atomic_load(x->gone) || now < x->client_due_ns) return;
  x->client_due_ns = now + CLIENT_POLL_MS * 1000000u;
  struct pollfd p = {.fd = x->client_fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
    atomic_store(x->gone, 1);
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
  lg__gw_http_t *x = ud;
  size_t n = size * nmemb;
  if (stopped(x)) return 0;
  if (x->on_data && x->status >= 200 && x->status < 300) {
    /* its client has not read the last megabyte: libcurl keeps this piece
     * and reads no more until unpaused (unpause) */
    if (x->pausable && x->stream && lg__gw_stream_backlog(x->stream) > LG__GW_STREAM_HIGH) {
      x->paused = 1;
      return CURL_WRITEFUNC_PAUSE;
    }
    int r = x->on_data(x->ud, p, n);
    if (r == LG__GW_OVER) x->over = 1;
    else if (r) x->cut = 1;
    return r ? 0 : n;
  }
  if (x->max_bytes && x->body_out.len + n > x->max_bytes) { /* a broken upstream: memory is not its */
    x->over = 1;
    return 0;
  }
  return lg__buf_append(&x->body_out, p, n) ? 0 : n;
}

/* 1 for a header the gateway does not pass on: hop-by-hop (RFC 9110
 * 7.6.1), the framing and encoding of the upstream's bytes (libcurl
 * decodes them; the server frames its own), what the server writes
 * itself (Date, Content-Type), the upstream's Server and cookies (of
 * another origin), and X-Loopguard-* (the gateway's own). */
static int not_passed(const char *k, size_t kl) {
  static const char *const drop[] = {"connection", "keep-alive", "proxy-connection",
                                     "transfer-encoding", "te", "trailer", "upgrade",
                                     "proxy-authenticate", "content-length", "content-encoding",
                                     "content-type", "date", "server", "set-cookie"};
  if (kl >= 12 && !strncasecmp(k, "x-loopguard-", 12)) return 1;
  for (size_t i = 0; i < LG__ARRAY_LEN(drop); i++)
    if (strlen(drop[i]) == kl && !strncasecmp(k, drop[i], kl)) return 1;
  return 0;
}

/* A field name's byte (RFC 9110 5.1, a token). */
static int tchar(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* A header line ("Name: value\r\n", as libcurl hands it) as a field: its
 * name's length (a token before the first ':') and its value without the
 * blanks around it and the line's end. 0 when it is not a field (an
 * obsolete fold starts with white space). */
static int header_field(const char *p, size_t n, size_t *kl, const char **v, size_t *vl) {
  const char *colon = memchr(p, ':', n);
  if (!colon || colon == p) return 0;
  *kl = (size_t)(colon - p);
  for (size_t i = 0; i < *kl; i++)
    if (!tchar((unsigned char)p[i])) return 0;
  const char *b = colon + 1, *e = p + n;
  while (b < e && (*b == ' ' || *b == '\t')) b++;
  while (e > b && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t')) e--;
  *v = b;
  *vl = (size_t)(e - b);
  return 1;
}

/* Field k: v into out as "k\0v\0", unless the gateway does not pass it
 * on, or its value would not stay on one line. */
static int keep_field(lg__buf_t *out, const char *k, size_t kl, const char *v, size_t vl) {
  if (not_passed(k, kl) || memchr(v, '\r', vl) || memchr(v, '\n', vl) || memchr(v, 0, vl)) return 0;
  lg__buf_append(out, k, kl);
  lg__buf_putc(out, 0);
  lg__buf_append(out, v, vl);
  lg__buf_putc(out, 0);
  return 1;
}

int lg__gw_header_keep(lg__buf_t *out, const char *p, size_t n) {
  size_t kl, vl;
  const char *v;
  return header_field(p, n, &kl, &v, &vl) && keep_field(out, p, kl, v, vl);
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
  lg__gw_http_t *x = ud;
  size_t n = size * nmemb, kl, vl;
  const char *v;
  if (n >= 5 && !strncmp(p, "HTTP/", 5)) {
    /* a response's status line: "HTTP/1.1 200 OK" (a 100 Continue comes
     * first at times, its headers then not the answer's) */
    const char *sp = memchr(p, ' ', n);
    long st = sp ? strtol(sp + 1, NULL, 10) : 0;
    if (st >= 200) x->status = st;
    if (x->hdrs) x->hdrs->len = 0;
  } else if (header_field(p, n, &kl, &v, &vl)) {
    if (kl == 12 && !strncasecmp(p, "content-type", 12)) {
      if (vl >= sizeof x->ctype) vl = sizeof x->ctype - 1;
      memcpy(x->ctype, v, vl);
      x->ctype[vl] = 0;
    } else if (x->hdrs) {
      keep_field(x->hdrs, p, kl, v, vl);
    }
  }
  return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  lg__gw_http_t *x = ud;
  if (!x->pausable) look_at_client(x, lg__mono_ns()); /* curl_easy_perform's: no loop of ours looks */
  return stopped(x);
}

/* libcurl's sockets of a fiber's transfer in the leader's epoll. */
static int on_sock(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp) {
  (void)e;
  lg__gw_wait_t *w = userp;
  lg__gw_sock_t *k = socketp;
  if (!w) return 0; /* between two transfers (the handle's cleanup) */
  if (what == CURL_POLL_REMOVE) {
    if (k) {
      epoll_ctl(w->ep, EPOLL_CTL_DEL, fd, NULL);
      k->fd = -1;
      k->ev = 0;
      curl_multi_assign(w->m, fd, NULL);
    }
    return 0;
  }
  struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) |
                                     (what & CURL_POLL_OUT ? EPOLLOUT : 0u)};
  if (k) {
    ev.data.ptr = k;
    return epoll_ctl(w->ep, EPOLL_CTL_MOD, fd, &ev) ? -1 : 0;
  }
  for (size_t i = 0; i < LG__ARRAY_LEN(w->socks) && !k; i++)
    if (w->socks[i].fd < 0) k = &w->socks[i];
  if (!k) return -1; /* more sockets than a transfer opens */
  k->w = w;
  k->fd = fd;
  k->ev = 0;
  ev.data.ptr = k;
  if (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev)) {
    k->fd = -1;
    return -1;
  }
  curl_multi_assign(w->m, fd, k);
  return 0;
}

static int on_timer(CURLM *m, long ms, void *userp) {
  (void)m;
  lg__gw_wait_t *w = userp;
  if (w) w->due_ns = ms < 0 ? 0 : lg__mono_ns() + (uint64_t)ms * 1000000u;
  return 0;
}

/* A transfer paused for its stream's client (on_body) goes on once the
 * client has read down to LOW, or is gone (the abort is then libcurl's
 * next callback's). 1 when it went on. */
static int unpause(CURL *h, lg__gw_http_t *x) {
  if (!x->paused || (!stopped(x) && lg__gw_stream_backlog(x->stream) > LG__GW_STREAM_LOW)) return 0;
  x->paused = 0;
  curl_easy_pause(h, CURLPAUSE_CONT); /* hands on the piece it kept, at once */
  return 1;
}
#define PAUSED_POLL_MS 2 /* how often a paused transfer looks at its client */

/* A transfer on a gateway fiber: libcurl driven by its sockets' events
 * (curl_multi_socket_action), the fiber stopped between them while its
 * thread goes on with the loop and the other fibers. */
static CURLcode perform_fiber(CURL *h, CURLM *m, int ep, lg__gw_http_t *x) {
  lg__gw_wait_t w = {.ep = ep, .m = m};
  for (size_t i = 0; i < LG__ARRAY_LEN(w.socks); i++) w.socks[i].fd = -1;
  x->pausable = 1;
  curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, on_sock);
  curl_multi_setopt(m, CURLMOPT_SOCKETDATA, &w);
  curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, on_timer);
  curl_multi_setopt(m, CURLMOPT_TIMERDATA, &w);
  CURLcode cc = CURLE_OK;
  CURLMcode mc = curl_multi_add_handle(m, h);
  int running = 1;
  if (mc == CURLM_OK) mc = curl_multi_socket_action(m, CURL_SOCKET_TIMEOUT, 0, &running);
  while (mc == CURLM_OK && running) {
    uint64_t now = lg__mono_ns();
    look_at_client(x, now);
    if (stopped(x)) {
      cc = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    /* paused: no socket of its own to wait for, a look at the client soon;
     * else the next look at the client's socket */
    uint64_t due = w.due_ns, soon = x->paused ? now + PAUSED_POLL_MS * 1000000u : 0;
    if (x->client_fd >= 0 && (!soon || soon > x->client_due_ns)) soon = x->client_due_ns;
    if (soon && (!due || due > soon)) w.due_ns = soon;
    lg__gw_fiber_wait(&w);
    w.due_ns = due; /* libcurl's own timer back (no call of libcurl ran meanwhile) */
    unpause(h, x);
    int acted = 0;
    for (size_t i = 0; i < LG__ARRAY_LEN(w.socks) && mc == CURLM_OK; i++) {
      uint32_t ev = w.socks[i].ev;
      int fd = w.socks[i].fd;
      if (!ev || fd < 0) continue;
      w.socks[i].ev = 0;
      int mask = (ev & EPOLLIN ? CURL_CSELECT_IN : 0) | (ev & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                 (ev & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      mc = curl_multi_socket_action(m, fd, mask, &running);
      acted = 1;
    }
    /* A socket's action runs the timers due too (libcurl's multi_socket):
     * the timeout's own only when no socket woke the fiber (without the
     * socket's bits libcurl would poll it to know). */
    if (mc == CURLM_OK && running && !acted)
      mc = curl_multi_socket_action(m, CURL_SOCKET_TIMEOUT, 0, &running);
  }
  if (mc != CURLM_OK) cc = mc == CURLM_OUT_OF_MEMORY ? CURLE_OUT_OF_MEMORY : CURLE_RECV_ERROR;
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(m, &left)))
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == h && cc == CURLE_OK) cc = msg->data.result;
  curl_multi_remove_handle(m, h);
  for (size_t i = 0; i < LG__ARRAY_LEN(w.socks); i++) /* what libcurl did not take back */
    if (w.socks[i].fd >= 0) {
      epoll_ctl(ep, EPOLL_CTL_DEL, w.socks[i].fd, NULL);
      curl_multi_assign(m, w.socks[i].fd, NULL);
    }
  curl_multi_setopt(m, CURLMOPT_SOCKETDATA, NULL);
  curl_multi_setopt(m, CURLMOPT_TIMERDATA, NULL);
  return cc;
}

/* curl_easy_perform's transfer, through m: the same loop, and, while
 * this thread leads a server loop, a wait on that loop too, whose turns
 * are taken meanwhile (its other connections go on while the upstream
 * thinks). */
static CURLcode perform(CURL *h, CURLM *m, lg__gw_http_t *x) {
  int ep = m ? lg__gw_fiber_ep() : -1;
  if (ep >= 0) return perform_fiber(h, m, ep, x);
  if (!m || curl_multi_add_handle(m, h) != CURLM_OK) return curl_easy_perform(h); /* not pausable */
  x->pausable = 1;
  CURLcode cc = CURLE_OK;
  CURLMcode mc;
  int running = 1;
  while ((mc = curl_multi_perform(m, &running)) == CURLM_OK && running) {
    look_at_client(x, lg__mono_ns());
    if (stopped(x)) {
      cc = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    struct curl_waitfd w = {lg__loop_wait_fd(), CURL_WAIT_POLLIN, 0};
    int ready = 0;
    int ms = x->paused ? PAUSED_POLL_MS : x->client_fd >= 0 ? CLIENT_POLL_MS : 1000;
    if ((mc = curl_multi_wait(m, &w, w.fd >= 0, ms, &ready)) != CURLM_OK) break;
    unpause(h, x);
    /* the loop's work, or a quiet moment: its timers (idle connections) */
    if (w.fd >= 0 && (w.revents || !ready)) lg__loop_turn();
  }
  if (mc != CURLM_OK) cc = mc == CURLM_OUT_OF_MEMORY ? CURLE_OUT_OF_MEMORY : CURLE_RECV_ERROR;
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(m, &left)))
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == h) cc = msg->data.result;
  curl_multi_remove_handle(m, h);
  return cc;
}

int lg__gw_http_do(CURL *h, CURLM *m, lg__gw_http_t *x) {
  lg__buf_t url = {0};
  lg__buf_puts(&url, x->up->base_url);
  if (x->v1 && x->up->azure) lg__buf_puts(&url, "/v1");
  lg__buf_puts(&url, x->path);
  if (x->query) lg__buf_puts(&url, x->query);
  if (url.oom) {
    lg__buf_free(&url);
    return LG_ENOMEM;
  }
  struct curl_slist *hd = NULL, *t;
  int typed = 0; /* a passed-through body's own Content-Type is among them */
  /* The upstream's own key (or the loopguard key's provider key) is the
   * only credential sent with it: the client's are not (an Anthropic
   * SDK's placeholder x-api-key beside the real one). */
  const char *key = x->provider_key ? x->provider_key : x->up->api_key;
  for (const struct curl_slist *s = x->headers; s; s = s->next) {
    if (key && lg__auth_key_header(s->data)) continue;
    typed |= !strncasecmp(s->data, "Content-Type:", 13);
    if ((t = curl_slist_append(hd, s->data))) hd = t;
  }
  /* as long as the credential is (a JWT of a few KB; the client's head
   * is bounded by the server's) */
  lg__buf_t auth = {0};
  if (key && x->up->api == LG__GW_API_ANTHROPIC) lg__buf_printf(&auth, "x-api-key: %s", key);
  else if (key && x->up->azure) lg__buf_printf(&auth, "api-key: %s", key);
  else if (key) lg__buf_printf(&auth, "Authorization: Bearer %s", key);
  else if (x->client_auth) lg__buf_printf(&auth, "Authorization: %s", x->client_auth);
  if (auth.oom) {
    curl_slist_free_all(hd);
    lg__buf_free(&url);
    return LG_ENOMEM;
  }
  if (auth.len && (t = curl_slist_append(hd, auth.data))) hd = t;
  lg__buf_free(&auth);
  if (x->body && !typed && (t = curl_slist_append(hd, "Content-Type: application/json"))) hd = t;
  if ((t = curl_slist_append(hd, "Expect:"))) hd = t; /* no 100-continue round trip */
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, url.data);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)x->up->timeout_ms);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, ""); /* what libcurl can decode */
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  /* HTTP/1.1, as the providers' own SDKs speak, even where TLS offers
   * HTTP/2: an exchange aborted (its client hung up) then closes its
   * connection, which a provider takes as a cancel. Over HTTP/2, libcurl
   * 7.88 queues the stream's reset until the connection is next used, and
   * on an idle gateway the model went on generating (and billing) to its
   * end (tests/gateway/tls.sh). */
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  if (x->up->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, x->up->ca_file);
  if (x->up->ca_dir || x->up->ca_alone) curl_easy_setopt(h, CURLOPT_CAPATH, x->up->ca_dir);
  if (x->up->proxy_ca_file) curl_easy_setopt(h, CURLOPT_PROXY_CAINFO, x->up->proxy_ca_file);
  if (x->up->proxy_ca_dir) curl_easy_setopt(h, CURLOPT_PROXY_CAPATH, x->up->proxy_ca_dir);
  if (x->body) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body_len);
  }
  if (!strcmp(x->method, "HEAD")) /* an answer without a body: libcurl waits for none */
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  else if (strcmp(x->method, "GET") && strcmp(x->method, "POST"))
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, x->method);
  x->errbuf[0] = 0;
  uint64_t t0 = lg__mono_ns();
  x->client_due_ns = t0 + CLIENT_POLL_MS * 1000000u;
  x->cc = perform(h, m, x);
  x->ns = lg__mono_ns() - t0;
  long st = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
  if (st) x->status = st;
  x->head_len = -1;
  if (!strcmp(x->method, "HEAD"))
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &x->head_len);
  long pv = 0; /* an https:// proxy's own certificate: its check's X509 result */
  x->proxy_cert = x->cc == CURLE_PEER_FAILED_VERIFICATION &&
                  curl_easy_getinfo(h, CURLINFO_PROXY_SSL_VERIFYRESULT, &pv) == CURLE_OK && pv;
  curl_slist_free_all(hd);
  lg__buf_free(&url);
  if (x->cc != CURLE_OK && !x->errbuf[0])
    snprintf(x->errbuf, sizeof x->errbuf, "%s", curl_easy_strerror(x->cc));
  return x->cc == CURLE_OK ? 0 : LG_EIO;
}

const char *const lg__gw_http_failure_names[LG__GW_UP__KINDS] = {
    "", "unreachable", "timeout", "broken", "too_large", "http_4xx", "http_5xx"};

int lg__gw_http_failure(const lg__gw_http_t *x) {
  if (x->cc == CURLE_OK)
    return x->status >= 500 ? LG__GW_UP_HTTP_5XX : x->status >= 400 ? LG__GW_UP_HTTP_4XX : LG__GW_UP_OK;
  if (x->over) return LG__GW_UP_TOO_LARGE;
  if (x->cut || stopped(x)) return LG__GW_UP_OK;
  if (x->cc == CURLE_OPERATION_TIMEDOUT) return LG__GW_UP_TIMEOUT;
  return x->status ? LG__GW_UP_BROKEN : LG__GW_UP_UNREACHABLE; /* it had begun to answer, or never did */
}

int lg__gw_http_hung_up(const lg__gw_http_t *x) {
  if (x->cc == CURLE_OK || x->cut || (x->stop && atomic_load(x->stop))) return 0;
  return x->gone && atomic_load(x->gone);
}

void lg__gw_http_clear(lg__gw_http_t *x) { lg__buf_free(&x->body_out); }
