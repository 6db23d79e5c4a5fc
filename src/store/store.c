/*
 * store.c — the generic half of the stores: opening by URL, the handle's
 * lock, transactions with their depth and durability kind, run records,
 * deny rules, lg_store_with_run, and the JSON forms of records. Everything
 * here calls the backend only through its table (store.h), so the rules
 * written here hold for memory:, sqlite: and postgres: alike. The ledger's
 * rules live beside it in src/ledger/ledger.c; what needs the engine
 * (saving and loading an lg_run_t, cancelling) in store_run.c.
 */
#include "driver.h"
#include "group.h"
#include "store.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <time.h>

int lg__store_schema_target = LG_STORE_SCHEMA_VERSION;

void lg__store_set_fault(lg_store_t *s, lg__store_fault_fn fn, void *ud) {
  s->fault = fn;
  s->fault_ud = ud;
}

/* ---- small helpers ---- */

void lg__op_row_clear(lg__op_row_t *r) {
  if (!r) return;
  lg__free(r->key);
  lg__free(r->request_fp);
  lg__free(r->run_id);
  lg__free(r->result);
  lg__free(r->operation_id);
  lg__free(r->claim_token);
  lg__free(r->resolved_by);
  memset(r, 0, sizeof *r);
}

void lg__bud_row_clear(lg__bud_row_t *r) {
  if (!r) return;
  lg__free(r->scope);
  memset(r, 0, sizeof *r);
}

void lg__key_row_clear(lg__key_row_t *r) {
  if (!r) return;
  lg__free(r->id);
  lg__free(r->hash);
  lg__free(r->name);
  lg__free(r->workspace);
  lg__free(r->models);
  lg__free(r->byok);
  memset(r, 0, sizeof *r);
}

void lg__resv_row_clear(lg__resv_row_t *r) {
  if (!r) return;
  lg__free(r->id);
  lg__free(r->scopes);
  lg__free(r->run_id);
  lg__free(r->model);
  memset(r, 0, sizeof *r);
}

void lg_run_record_clear(lg_run_record_t *r) {
  if (!r) return;
  lg__free(r->run_id);
  lg__free(r->group);
  lg__free(r->terminal_reason);
  lg__free(r->policy_json);
  lg__free(r->state);
  lg__free(r->envelope_json);
  memset(r, 0, sizeof *r);
}

static int dup_opt(char **dst, const char *src, size_t n) {
  *dst = NULL;
  if (!src) return 0;
  *dst = lg__strndup(src, n);
  return *dst ? 0 : LG_ENOMEM;
}

int lg__run_record_copy(lg_run_record_t *out, const lg_run_record_t *in) {
  memset(out, 0, sizeof *out);
  out->stopped = in->stopped;
  out->created_ms = in->created_ms;
  out->updated_ms = in->updated_ms;
  out->state_len = in->state ? in->state_len : 0;
  if (dup_opt(&out->run_id, in->run_id, in->run_id ? strlen(in->run_id) : 0) ||
      dup_opt(&out->group, in->group, in->group ? strlen(in->group) : 0) ||
      dup_opt(&out->terminal_reason, in->terminal_reason,
              in->terminal_reason ? strlen(in->terminal_reason) : 0) ||
      dup_opt(&out->policy_json, in->policy_json,
              in->policy_json ? strlen(in->policy_json) : 0) ||
      dup_opt(&out->state, in->state, in->state_len) ||
      dup_opt(&out->envelope_json, in->envelope_json,
              in->envelope_json ? strlen(in->envelope_json) : 0)) {
    lg_run_record_clear(out);
    return LG_ENOMEM;
  }
  return 0;
}

/* Hides a password in a libpq conninfo (key=value or URI) for messages. */
static char *redact(const char *url) {
  lg__buf_t b = {0};
  const char *p = url;
  const char *at = strchr(url, '@');
  const char *scheme_end = strstr(url, "://");
  if (scheme_end && at && at > scheme_end) {
    /* URI: scheme://user:password@host... */
    const char *colon = memchr(scheme_end + 3, ':', (size_t)(at - scheme_end - 3));
    if (colon) {
      lg__buf_append(&b, url, (size_t)(colon - url));
      lg__buf_puts(&b, ":***");
      lg__buf_puts(&b, at);
      return lg__buf_steal(&b, NULL);
    }
  }
  while (*p) {
    const char *hit = strstr(p, "password=");
    if (!hit) break;
    lg__buf_append(&b, p, (size_t)(hit - p) + 9);
    lg__buf_puts(&b, "***");
    p = hit + 9;
    if (*p == '\'') {
      for (p++; *p && *p != '\''; p++)
        if (*p == '\\' && p[1]) p++;
      if (*p) p++;
    } else {
      while (*p && *p != ' ' && *p != '&') p++;
    }
  }
  lg__buf_puts(&b, p);
  return lg__buf_steal(&b, NULL);
}

/* ---- the handle ---- */

void lg__store_lock(lg_store_t *s) { pthread_mutex_lock(&s->mu); }

int lg__store_read_begin(lg_store_t *s) {
  if (s->drv->reader) {
    if (pthread_mutex_trylock(&s->mu) == 0) {
      /* Free, or ours: inside our own transaction the read must see its
       * writes, so it stays on the handle. */
      if (s->depth > 0) return 0;
      pthread_mutex_unlock(&s->mu);
    }
    if (lg__sql_reader(s, 1, NULL) == 0) return 1;
  }
  lg__store_lock(s);
  return 0;
}

int lg__store_write_probe(lg_store_t *s, int64_t now_ms, lg_error_t *err) {
  return lg__sql_write_probe(s, now_ms, err);
}

void lg__store_deadline(lg_store_t *s, int ms, const char *why) {
  /* only PostgreSQL waits on a server; the others' handles may be shared
   * by threads, so nothing of theirs is written */
  if (strcmp(s->scheme, "postgres")) return;
  int shorter = ms > 0 && (s->query_timeout_ms <= 0 || ms < s->query_timeout_ms);
  s->deadline_ms = shorter ? ms : 0;
  s->deadline_why = shorter ? why : NULL;
}

void lg__store_read_end(lg_store_t *s, int reader) {
  if (reader) lg__sql_reader(s, 0, NULL);
  else lg__store_unlock(s);
}
void lg__store_unlock(lg_store_t *s) { pthread_mutex_unlock(&s->mu); }

/* Defined in ledger.c: the methods behind lg_store_ledger(). */
extern const lg_ledger_methods_t lg__store_ledger_methods;

/* The URL's scheme names the backend: the rows over which driver. */
typedef struct scheme {
  const char *prefix;         /* the URL starts with it */
  int keep;                   /* the backend sees the prefix too */
  const char *scheme;
  const lg__driver_t *drv;
} scheme_t;

static const scheme_t schemes[] = {
    {"memory:", 0, "memory", &lg__driver_sqlite_memory},
    {"sqlite:", 0, "sqlite", &lg__driver_sqlite},
    {"postgres://", 1, "postgres", &lg__driver_pg},
    {"postgresql://", 1, "postgres", &lg__driver_pg},
    {"postgres:", 0, "postgres", &lg__driver_pg},
};

static const scheme_t *find_scheme(const char *url, lg_error_t *err) {
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if (!strncmp(url, schemes[i].prefix, strlen(schemes[i].prefix))) return &schemes[i];
  lg__err(err, LG_EINVAL, "url", -1,
          "unknown store URL \"%s\": use memory:, sqlite:PATH or postgres:CONNINFO", url);
  return NULL;
}

/* A parameter of the store URL for every backend, NAME=VALUE
 * (sqlite:PATH?NAME=V, postgres://...?a=b&NAME=V, postgres:host=h NAME=V),
 * taken out before the backend sees the rest (libpq would refuse an
 * unknown key). Returns 1 with VALUE in val (cut to valsz - 1 bytes) and
 * *arg pointed at *argbuf (made on the first parameter taken) without
 * the parameter and one separator ("?n&x" -> "?x", "a&n" -> "a",
 * "?n" -> "", "h n" -> "h"); 0 when the URL has none; -1 out of memory. */
static int take_param(const char **arg, char **argbuf, const char *name, char *val,
                      size_t valsz) {
  size_t nl = strlen(name);
  const char *hit = NULL;
  for (const char *d = *arg; (d = strstr(d, name)); d += nl)
    if (d[nl] == '=' && (d == *arg || d[-1] == '?' || d[-1] == '&' || d[-1] == ' ')) hit = d;
  if (!hit) return 0;
  size_t off = (size_t)(hit - *arg);
  if (!*argbuf) {
    if (!(*argbuf = lg__strdup(*arg))) return -1;
    *arg = *argbuf;
  }
  char *buf = *argbuf, *from = buf + off, *v = from + nl + 1, *to = v + strcspn(v, "& ");
  size_t vl = (size_t)(to - v) < valsz ? (size_t)(to - v) : valsz - 1;
  memcpy(val, v, vl);
  val[vl] = 0;
  if (*to == '&' || *to == ' ') to++;
  else if (from > buf && (from[-1] == '&' || from[-1] == ' ' || from[-1] == '?')) from--;
  memmove(from, to, strlen(to) + 1);
  return 1;
}

/* Milliseconds from 0 to an hour, as a URL parameter's value; -1 if not. */
static long url_ms(const char *v) {
  char *end;
  long ms = strtol(v, &end, 10);
  return !*v || *end || *v == '-' || *v == '+' || ms > 3600000 ? -1 : ms;
}

/* The URL's parameters: durability=full|relaxed (*durability set),
 * busy_timeout_ms=N (*busy_ms: N, or -1 for 0: do not wait) and, for
 * PostgreSQL, query_timeout_ms=N (*query_ms: N, 0 for no deadline; left
 * as it was when the URL has none). */
static int take_params(const char **arg, char **argbuf, int *durability, int *busy_ms,
                       int *query_ms, const char *scheme, lg_error_t *err) {
  char v[32];
  int rc = take_param(arg, argbuf, "durability", v, sizeof v);
  if (rc == 1) {
    if (!strcmp(v, "full")) *durability = LG_STORE_DURABLE;
    else if (!strcmp(v, "relaxed")) *durability = LG_STORE_RELAXED;
    else
      return lg__err(err, LG_EINVAL, "url", -1,
                     "durability=%s: expected durability=full or durability=relaxed", v);
  }
  if (rc >= 0) rc = take_param(arg, argbuf, "busy_timeout_ms", v, sizeof v);
  if (rc == 1) {
    long ms = url_ms(v);
    if (ms < 0)
      return lg__err(err, LG_EINVAL, "url", -1,
                     "busy_timeout_ms=%s: expected milliseconds from 0 (do not wait) to 3600000",
                     v);
    *busy_ms = ms ? (int)ms : -1;
  }
  if (rc >= 0) rc = take_param(arg, argbuf, "query_timeout_ms", v, sizeof v);
  if (rc == 1) {
    long ms = url_ms(v);
    if (strcmp(scheme, "postgres"))
      return lg__err(err, LG_EINVAL, "url", -1,
                     "query_timeout_ms: a postgres: store's parameter (a %s: store waits on no "
                     "server)", scheme);
    if (ms < 0)
      return lg__err(err, LG_EINVAL, "url", -1,
                     "query_timeout_ms=%s: expected milliseconds from 0 (no deadline) to 3600000",
                     v);
    *query_ms = (int)ms;
  }
  return rc < 0 ? lg__err(err, LG_ENOMEM, NULL, -1, "out of memory opening store") : 0;
}

/* The options with their defaults filled in. */
static void fill_options(lg_store_t *s, const lg_store_options_t *opts, int durability,
                         int busy_ms) {
  if (opts) s->opts = *opts;
  if (busy_ms) s->opts.busy_timeout_ms = busy_ms;
  if (s->opts.retention_ms <= 0) s->opts.retention_ms = LG_STORE_DEFAULT_RETENTION_MS;
  if (s->opts.lease_ms <= 0) s->opts.lease_ms = LG_STORE_DEFAULT_LEASE_MS;
  if (s->opts.busy_timeout_ms == 0) s->opts.busy_timeout_ms = LG_STORE_DEFAULT_BUSY_TIMEOUT_MS;
  if (s->opts.busy_timeout_ms < 0) s->opts.busy_timeout_ms = 0;
  s->opts.durability = durability == LG_STORE_RELAXED ? LG_STORE_RELAXED : LG_STORE_DURABLE;
}

lg_store_t *lg_store_open(const char *url, const lg_store_options_t *opts,
                          lg_error_t *err) {
  return lg__store_open_within(url, opts, 0, NULL, err);
}

lg_store_t *lg__store_open_within(const char *url, const lg_store_options_t *opts, int ms,
                                  const char *why, lg_error_t *err) {
  if (!url) {
    lg__err(err, LG_EINVAL, "url", -1, "no store URL given");
    return NULL;
  }
  const scheme_t *sc = find_scheme(url, err);
  if (!sc) return NULL;
  const char *arg = url + (sc->keep ? 0 : strlen(sc->prefix));
  int durability = opts ? opts->durability : LG_STORE_DURABLE;
  int busy_ms = 0; /* the URL's busy_timeout_ms, if it has one */
  int query_ms = LG__STORE_DEFAULT_QUERY_TIMEOUT_MS;
  char *argbuf = NULL;
  if (take_params(&arg, &argbuf, &durability, &busy_ms, &query_ms, sc->scheme, err)) {
    lg__free(argbuf);
    return NULL;
  }
  lg_store_t *s = lg__calloc(1, sizeof *s);
  if (!s) goto fail_oom;
  s->name = redact(url);
  if (!s->name) goto fail_oom;
  s->drv = sc->drv;
  s->scheme = sc->scheme;
  fill_options(s, opts, durability, busy_ms);
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  int mrc = pthread_mutex_init(&s->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  if (mrc) goto fail_oom;
  s->ledger.methods = &lg__store_ledger_methods;
  s->ledger.self = s;
  lg__store_deadline(s, ms, why); /* the open's own (query_timeout_ms is 0 until it is done) */
  int rc = lg__sql_open(s, arg, err);
  lg__store_deadline(s, 0, NULL);
  lg__free(argbuf);
  if (rc) {
    lg__err_where(err, s->name, 0);
    pthread_mutex_destroy(&s->mu);
    lg__free(s->name);
    lg__free(s);
    return NULL;
  }
  s->query_timeout_ms = query_ms; /* from here: a migration at the open may take long */
  return s;

fail_oom:
  lg__free(argbuf);
  if (s) lg__free(s->name);
  lg__free(s);
  lg__err(err, LG_ENOMEM, NULL, -1, "out of memory opening store");
  return NULL;
}

void lg_store_close(lg_store_t *s) {
  if (!s) return;
  lg__sql_close(s);
  OPENSSL_cleanse(s->key_secret, sizeof s->key_secret);
  pthread_mutex_destroy(&s->mu);
  lg__free(s->name);
  lg__free(s);
}

const char *lg_store_scheme(const lg_store_t *s) { return s->scheme; }
const char *lg_store_name(const lg_store_t *s) { return s->name; }

/* Names the store in an error that a backend filled. */
static int where(lg_store_t *s, int rc, lg_error_t *err) {
  if (rc && err && !err->source[0]) lg__err_where(err, s->name, 0);
  return rc;
}

int lg_store_schema_version(lg_store_t *s, int *version, lg_error_t *err) {
  int r = lg__store_read_begin(s);
  int rc = lg__sql_schema_version(s, version, err);
  lg__store_read_end(s, r);
  return where(s, rc, err);
}

/* ---- transactions ---- */

int lg__store_begin(lg_store_t *s, int kind, lg_error_t *err) {
  int nested = s->depth > 0;
  int upgrade = nested && kind == LG__TXN_LEDGER && s->outer_kind == LG__TXN_RUN;
  int rc = lg__sql_begin(s, kind, nested, upgrade, err);
  if (rc) return where(s, rc, err);
  if (!nested) s->outer_kind = kind;
  else if (upgrade) s->outer_kind = LG__TXN_LEDGER;
  s->depth++;
  return 0;
}

int lg__store_end(lg_store_t *s, int commit, lg_error_t *err) {
  if (s->depth <= 0) return lg__err(err, LG_ESTATE, NULL, -1, "no transaction is open");
  s->depth--;
  lg_error_t scratch;
  /* A rollback's own failure must not hide the error that caused it. */
  int rc = lg__sql_end(s, commit, s->depth > 0, commit ? err : &scratch);
  if (s->depth == 0) s->outer_kind = 0;
  return commit ? where(s, rc, err) : 0;
}

/* ---- runs ---- */

static int check_id(const char *what, const char *id, size_t max, lg_error_t *err) {
  if (!id || !*id) return lg__err(err, LG_EINVAL, what, -1, "%s is empty", what);
  if (strlen(id) > max)
    return lg__err(err, LG_EINVAL, what, -1, "%s is longer than %zu bytes", what, max);
  return 0;
}

static int check_record(const lg_run_record_t *rec, lg_error_t *err) {
  if (!rec) return lg__err(err, LG_EINVAL, NULL, -1, "no run record given");
  return check_id("run_id", rec->run_id, 1024, err);
}

int lg_store_run_create(lg_store_t *s, const lg_run_record_t *rec, lg_error_t *err) {
  return lg__store_run_create_ev(s, rec, NULL, 0, err);
}

int lg__store_run_create_ev(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                            size_t len, lg_error_t *err) {
  int rc = check_record(rec, err);
  if (rc) return rc;
  lg__store_lock(s);
  int inserted = 0;
  rc = lg__store_begin(s, LG__TXN_RUN, err);
  if (!rc) {
    rc = lg__sql_run_insert(s, rec, lines, len, &inserted, err);
    if (!rc && !inserted)
      rc = lg__err(err, LG_ECONFLICT, "run_id", -1, "run \"%s\" is already stored",
                   rec->run_id);
    int erc = lg__store_end(s, rc == 0, err);
    if (!rc) rc = erc;
  }
  lg__store_unlock(s);
  return where(s, rc, err);
}

int lg_store_run_put(lg_store_t *s, const lg_run_record_t *rec, lg_error_t *err) {
  return lg__store_run_put_events(s, rec, NULL, 0, err);
}

int lg__store_run_put_events(lg_store_t *s, const lg_run_record_t *rec, const char *lines,
                             size_t len, lg_error_t *err) {
  int rc = check_record(rec, err);
  if (rc) return rc;
  lg__store_lock(s);
  /* Inside a transaction (a decision's) no savepoint of its own: each
   * statement is atomic, and a failure fails the enclosing transaction. */
  int own = s->depth == 0;
  rc = own ? lg__store_begin(s, LG__TXN_RUN, err) : 0;
  if (!rc) {
    int updated = 0, inserted = 0;
    /* A run lg__store_with_run_born has not written yet: no row to
     * update; inserted once below, its creation's lines first. */
    lg__store_born_t *born = s->born && !strcmp(s->born->rec->run_id, rec->run_id) ? s->born : NULL;
    lg__buf_t all = {0};
    if (born && len) {
      if (lg__buf_append(&all, born->lines, born->len) || lg__buf_append(&all, lines, len))
        rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
      lines = all.data;
      len = all.len;
    } else if (born) {
      lines = born->lines;
      len = born->len;
    } else {
      rc = len ? lg__sql_run_update_ev(s, rec, lines, len, &updated, err)
               : lg__sql_run_update(s, rec, &updated, err);
    }
    if (!rc && !updated) {
      rc = lg__sql_run_insert(s, rec, lines, len, &inserted, err); /* with its lines */
      /* Inserted by someone else in between: only possible without the
       * run's lock, so say so rather than overwrite blindly. */
      if (!rc && !inserted)
        rc = lg__err(err, LG_EBUSY, "run_id", -1,
                     "run \"%s\" was created concurrently; try again", rec->run_id);
      if (!rc && born) s->born = NULL;
    }
    lg__buf_free(&all);
    int erc = own ? lg__store_end(s, rc == 0, err) : 0;
    if (!rc) rc = erc;
  }
  lg__store_unlock(s);
  return where(s, rc, err);
}

int lg_store_run_get(lg_store_t *s, const char *run_id, lg_run_record_t *out,
                     lg_error_t *err) {
  memset(out, 0, sizeof *out);
  int rc = check_id("run_id", run_id, 1024, err);
  if (rc) return rc;
  int found = 0;
  int r = lg__store_read_begin(s);
  rc = lg__sql_run_read(s, run_id, 0, out, &found, err);
  lg__store_read_end(s, r);
  if (!rc && !found)
    rc = lg__err(err, LG_ENOTFOUND, "run_id", -1, "no run \"%s\" in the store", run_id);
  if (rc) lg_run_record_clear(out);
  return where(s, rc, err);
}

int lg_store_run_list(lg_store_t *s, const lg_run_filter_t *f, lg_store_run_cb cb,
                      void *ud, lg_error_t *err) {
  lg_run_filter_t none = {0};
  if (!f) f = &none;
  if (f->status && strcmp(f->status, "active") && strcmp(f->status, "stopped"))
    return lg__err(err, LG_EINVAL, "status", -1,
                   "status \"%s\" is neither \"active\" nor \"stopped\"", f->status);
  int r = lg__store_read_begin(s);
  int rc = lg__sql_run_list(s, f, cb, ud, err);
  lg__store_read_end(s, r);
  return rc < 0 ? where(s, rc, err) : rc;
}

static int with_run(lg_store_t *s, const char *run_id, lg__store_born_t *born, lg_store_run_fn fn,
                    void *ud, lg_error_t *err) {
  int rc = check_id("run_id", run_id, 1024, err);
  if (rc) return rc;
  lg__store_lock(s);
  if (s->in_with_run) {
    lg__store_unlock(s);
    return lg__err(err, LG_ESTATE, NULL, -1,
                   "lg_store_with_run called from inside another one");
  }
  /* the batch's transaction is the job's own when it runs alone (group.c) */
  int own = !(s->alone && s->depth == 1);
  s->alone = 0;
  rc = own ? lg__store_begin(s, LG__TXN_RUN, err) : 0;
  if (rc) goto out;
  lg_run_record_t rec = {0};
  int found = 0;
  rc = lg__sql_run_read(s, run_id, 1, &rec, &found, err);
  if (!rc && !found && !born)
    rc = lg__err(err, LG_ENOTFOUND, "run_id", -1, "no run \"%s\" in the store", run_id);
  if (!rc) {
    if (!found) s->born = born; /* its first save inserts the row */
    if (born) born->created = !found;
    s->in_with_run = 1;
    rc = fn(ud, s, found || !born ? &rec : born->rec); /* (!found: born, above) */
    s->in_with_run = 0;
    if (rc && err && !err->code) lg__err(err, rc, NULL, -1, "%s", lg_strerror(rc));
    if (!rc && s->born) rc = lg__store_run_put_events(s, s->born->rec, NULL, 0, err); /* fn saved nothing */
    s->born = NULL;
    if (!rc) rc = lg__store_fault_at(s, "with_run.before_commit", err);
    if (rc && born) born->created = 0; /* undone: below, or with the batch */
  }
  lg_run_record_clear(&rec);
  int erc = own ? lg__store_end(s, rc == 0, err) : 0;
  if (!rc) rc = erc;
out:
  lg__store_unlock(s);
  return where(s, rc, err);
}

/* ---- purging runs ---- */

enum { PURGE_BATCH = 256 };

/* One transaction: a batch of runs (keys 0), or the orphaned keys. */
static int purge_step(lg_store_t *s, int keys, int64_t before_ms, lg__store_purge_cursor_t *at,
                      int64_t *n, int *more, lg_error_t *err) {
  lg__store_lock(s);
  int rc = lg__store_begin(s, LG__TXN_RUN, err);
  if (!rc) {
    rc = keys ? lg__sql_gw_keys_purge(s, before_ms, n, err)
              : lg__sql_runs_purge(s, before_ms, at, PURGE_BATCH, n, more, err);
    int erc = lg__store_end(s, rc == 0, err);
    if (!rc) rc = erc;
  }
  lg__store_unlock(s);
  if (rc) *n = 0; /* rolled back */
  return rc;
}

int lg_store_purge_runs(lg_store_t *s, int64_t older_than_ms, int64_t now_ms,
                        lg_store_progress_fn progress, void *ud, int64_t *purged,
                        lg_error_t *err) {
  int64_t done = 0;
  if (purged) *purged = 0;
  if (older_than_ms < 0)
    return lg__err(err, LG_EINVAL, "older_than", -1, "older_than is negative (%lld ms)",
                   (long long)older_than_ms);
  int64_t before = now_ms - older_than_ms, n = 0;
  lg__store_purge_cursor_t at = {INT64_MIN, INT64_MIN};
  int more = 1, rc = 0;
  while (more && !rc) {
    rc = purge_step(s, 0, before, &at, &n, &more, err);
    done += n;
    if (purged) *purged = done;
    if (!rc && progress && progress(ud, done)) break;
  }
  if (!rc) rc = purge_step(s, 1, before, NULL, &n, &more, err);
  return where(s, rc, err);
}

int lg_store_with_run(lg_store_t *s, const char *run_id, lg_store_run_fn fn, void *ud,
                      lg_error_t *err) {
  return with_run(s, run_id, NULL, fn, ud, err);
}

int lg__store_with_run_born(lg_store_t *s, lg__store_born_t *born, lg_store_run_fn fn, void *ud,
                            lg_error_t *err) {
  int rc = check_record(born->rec, err);
  return rc ? rc : with_run(s, born->rec->run_id, born, fn, ud, err);
}

/* ---- trace lines ---- */

int lg__store_events_append(lg_store_t *s, const char *run_id, const char *lines, size_t len,
                            lg_error_t *err) {
  int rc = check_id("run_id", run_id, 1024, err);
  if (rc || !len) return rc;
  lg__store_lock(s);
  rc = lg__sql_ev_append(s, run_id, lines, len, err);
  lg__store_unlock(s);
  return where(s, rc, err);
}

int lg__store_events_read(lg_store_t *s, const char *run_id, lg__buf_t *out, lg_error_t *err) {
  int rc = check_id("run_id", run_id, 1024, err);
  if (rc) return rc;
  int r = lg__store_read_begin(s); /* never behind a write */
  rc = lg__sql_ev_read(s, run_id, out, err);
  lg__store_read_end(s, r);
  return where(s, rc, err);
}

/* ---- deny rules ---- */

int lg__store_deny(lg_store_t *s, int scope, const char *id, const char *reason,
                   int64_t now_ms, lg_error_t *err) {
  int rc = check_id(scope == LG__DENY_RUN ? "run_id" : "group", id, 1024, err);
  if (rc) return rc;
  lg__store_lock(s);
  rc = lg__sql_deny_put(s, scope, id, reason, now_ms, err);
  lg__store_unlock(s);
  return where(s, rc, err);
}

int lg_store_denied(lg_store_t *s, const char *run_id, const char *group, char **reason,
                    lg_error_t *err) {
  if (reason) *reason = NULL;
  int rc = check_id("run_id", run_id, 1024, err);
  if (rc) return rc;
  int found = 0;
  char *r = NULL;
  lg__store_lock(s);
  rc = lg__sql_deny_get(s, run_id, group && *group ? group : NULL, &found, &r, err);
  lg__store_unlock(s);
  if (rc) return where(s, rc, err);
  if (reason) *reason = r;
  else lg__free(r);
  return found ? 1 : 0;
}

/* ---- JSON forms ---- */

static void json_str_or_null(lg__buf_t *b, const char *s) {
  if (s) lg__buf_json_str(b, s, strlen(s));
  else lg__buf_puts(b, "null");
}

static void json_time(lg__buf_t *b, int64_t ms) {
  char t[32];
  lg__time_rfc3339(ms, t);
  lg__buf_printf(b, "\"%s\"", t);
}

char *lg_run_record_to_json(const lg_run_record_t *r) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"run_id\":");
  json_str_or_null(&b, r->run_id);
  lg__buf_puts(&b, ",\"group\":");
  json_str_or_null(&b, r->group);
  lg__buf_printf(&b, ",\"status\":\"%s\",\"terminal_reason\":",
                 r->stopped ? "stopped" : "active");
  json_str_or_null(&b, r->terminal_reason);
  lg__buf_puts(&b, ",\"created_at\":");
  json_time(&b, r->created_ms);
  lg__buf_puts(&b, ",\"updated_at\":");
  json_time(&b, r->updated_ms);
  lg__buf_puts(&b, ",\"envelope\":");
  lg__buf_puts(&b, r->envelope_json && *r->envelope_json ? r->envelope_json : "null");
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}

const char *lg_op_state_name(lg_op_state_t st) {
  switch (st) {
  case LG_OP_IN_PROGRESS: return "in_progress";
  case LG_OP_UNKNOWN_OUTCOME: return "unknown_outcome";
  case LG_OP_COMMITTED: return "committed";
  case LG_OP_FAILED: return "failed";
  case LG_OP_FREE: return "free";
  }
  return "?";
}

void lg_operation_clear(lg_operation_t *op) {
  if (!op) return;
  lg__free(op->key);
  lg__free(op->request_fp);
  lg__free(op->run_id);
  lg__free(op->result);
  lg__free(op->operation_id);
  lg__free(op->resolved_by);
  memset(op, 0, sizeof *op);
}

char *lg_operation_to_json(const lg_operation_t *op) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"key\":");
  json_str_or_null(&b, op->key);
  lg__buf_printf(&b, ",\"state\":\"%s\",\"run_id\":", lg_op_state_name(op->state));
  json_str_or_null(&b, op->run_id);
  lg__buf_puts(&b, ",\"request_fingerprint\":");
  json_str_or_null(&b, op->request_fp);
  if (op->state == LG_OP_COMMITTED) {
    lg__buf_puts(&b, ",\"result\":");
    if (op->result && op->result_len) lg__buf_append(&b, op->result, op->result_len);
    else lg__buf_puts(&b, "null");
  }
  lg__buf_puts(&b, ",\"operation_id\":");
  json_str_or_null(&b, op->operation_id);
  lg__buf_puts(&b, ",\"created_at\":");
  json_time(&b, op->created_ms);
  lg__buf_puts(&b, ",\"updated_at\":");
  json_time(&b, op->updated_ms);
  lg__buf_puts(&b, ",\"lease_until\":");
  json_time(&b, op->lease_until_ms);
  lg__buf_puts(&b, ",\"resolved_by\":");
  json_str_or_null(&b, op->resolved_by);
  lg__buf_puts(&b, ",\"resolved_at\":");
  if (op->resolved_by) json_time(&b, op->resolved_ms);
  else lg__buf_puts(&b, "null");
  lg__buf_putc(&b, '}');
  return lg__buf_steal(&b, NULL);
}
