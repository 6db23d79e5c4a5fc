/*
 * policies.c — the named policies of `loopguard serve --policies DIR`
 * (gateway-v1 "Which run a request belongs to"): every NAME.json of the
 * folder is loaded at start, so a request's `X-Loopguard-Policy: NAME`
 * creates its run with that policy. A file that does not parse fails the
 * start, naming the file and the field, as --policy does. Other files
 * (not ending in .json, hidden ones) are skipped.
 */
#include "gw.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 128

static int by_name(const void *a, const void *b) {
  return strcmp(((const lg__gw_policy_t *)a)->name, ((const lg__gw_policy_t *)b)->name);
}

/* NAME of NAME.json, or 0 when the entry is not a policy file. */
static size_t policy_name(const char *file) {
  size_t n = strlen(file);
  if (file[0] == '.' || n <= 5 || strcmp(file + n - 5, ".json")) return 0;
  return n - 5;
}

static int add_policy(lg__gw_policies_t *ps, const char *dir, const char *file, size_t nlen,
                      lg_error_t *err) {
  if (nlen > MAX_NAME)
    return lg__err(err, LG_EINVAL, "policies", -1, "%s/%s: a policy name is at most %d bytes",
                   dir, file, MAX_NAME);
  lg__buf_t path = {0};
  lg__buf_printf(&path, "%s/%s", dir, file);
  if (path.oom) return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  lg_policy_t *p = lg_policy_load_file(path.data, err);
  lg__buf_free(&path);
  if (!p) return err && err->code ? err->code : LG_EINVAL;
  lg__gw_policy_t *v = lg__realloc(ps->v, (ps->n + 1) * sizeof *v);
  char *name = lg__strndup(file, nlen), *json = lg_policy_to_json(p);
  if (!v || !name || !json) {
    if (v) ps->v = v;
    lg__free(name);
    lg__free(json);
    lg_policy_free(p);
    return lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
  }
  ps->v = v;
  ps->v[ps->n++] = (lg__gw_policy_t){name, p, json};
  return 0;
}

int lg__gw_policies_load(lg__gw_policies_t *ps, const char *dir, lg_error_t *err) {
  if (!dir || !*dir) return 0;
  DIR *d = opendir(dir);
  if (!d)
    return lg__err(err, LG_EIO, "policies", -1, "--policies %s: cannot open the folder: %s", dir,
                   strerror(errno));
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    size_t n = policy_name(e->d_name);
    if (n) rc = add_policy(ps, dir, e->d_name, n, err);
  }
  closedir(d);
  if (rc) {
    lg__gw_policies_clear(ps);
    return rc;
  }
  if (ps->n) qsort(ps->v, ps->n, sizeof *ps->v, by_name);
  return 0;
}

const lg__gw_policy_t *lg__gw_policies_find(const lg__gw_policies_t *ps, const char *name) {
  if (!name || !ps->n) return NULL;
  lg__gw_policy_t key = {(char *)name, NULL, NULL};
  return bsearch(&key, ps->v, ps->n, sizeof *ps->v, by_name);
}

void lg__gw_policies_clear(lg__gw_policies_t *ps) {
  for (size_t i = 0; i < ps->n; i++) {
    lg__free(ps->v[i].name);
    lg__free(ps->v[i].json);
    lg_policy_free(ps->v[i].policy);
  }
  lg__free(ps->v);
  ps->v = NULL;
  ps->n = 0;
}
