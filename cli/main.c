/*
 * main.c — the `loopguard` command: dispatch to a subcommand, and the
 * helpers the subcommands share (errors, usage, the store URL, colour).
 * Every subcommand lives in cli/cmd_*.c and uses the public API only.
 */
#include "cli.h"

#include <jansson.h>

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *usage_text =
    "usage: loopguard COMMAND [ARGS...]\n"
    "\n"
    "Stops AI agents that loop on tool calls.\n"
    "\n"
    "commands:\n"
    "  replay [--policy FILE] [--json] [--quiet] TRACE...\n"
    "                                    replay traces through the guard ('-': stdin)\n"
    "  fingerprint [--policy FILE] [--json] TOOL ARGS_JSON\n"
    "                                    canonical key material and fingerprint of a call\n"
    "  serve [--listen HOST:PORT] [--store URL] ...\n"
    "                                    the HTTP sidecar\n"
    "  runs list|show|trace|cancel|resume|export|purge ...\n"
    "                                    runs in a store, a run's trace, the kill switch,\n"
    "                                    stopped runs as regression tests, old runs deleted\n"
    "  test DIR|TRACE...                 check the # expect lines of traces (CI)\n"
    "  ledger claim|commit|fail|show|purge ...\n"
    "                                    the idempotency ledger\n"
    "  budget set|show|list|reset ...    shared spend budgets\n"
    "  keys create|list|show|update|disable|rotate ...\n"
    "                                    loopguard keys with spend limits (the gateway)\n"
    "  --version                         the version\n"
    "\n"
    "Run 'loopguard COMMAND --help' (or 'loopguard runs list --help') for the flags.\n"
    "A store is a URL: memory:, sqlite:PATH or postgres:CONNINFO; the default is\n"
    "$LOOPGUARD_STORE, else sqlite:loopguard.db in the current folder. Read-only\n"
    "commands (runs list/show/trace, ledger show, budget show/list) never create a\n"
    "store. Reference: docs/reference/cli.md.\n"
    "Exit status: 0 success, 1 an error, 2 bad usage; 'ledger claim' adds 10-13\n"
    "(see 'loopguard ledger claim --help').\n";

void cli_error(const lg_error_t *err) {
  char buf[1024];
  fprintf(stderr, "loopguard: %s\n", lg_error_format(err, buf, sizeof buf));
}

int cli_usage(const char *usage, const char *fmt, ...) {
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loopguard: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
  if (usage) fputs(usage, stderr);
  return 2;
}

/* A sqlite: store named by a relative path is made absolute against the
 * current folder, so that every message (and the server's banner) names
 * the file itself, wherever the command was run. */
const char *cli_store_url(const char *flag) {
  static char abs_url[PATH_MAX + 16];
  const char *url = flag && *flag ? flag : getenv("LOOPGUARD_STORE");
  if (!url || !*url) url = "sqlite:loopguard.db";
  if (strncmp(url, "sqlite:", 7)) return url;
  const char *path = url + 7;
  if (!*path || path[0] == '/' || path[0] == ':') return url;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) return url;
  while (path[0] == '.' && path[1] == '/') path += 2;
  int n = snprintf(abs_url, sizeof abs_url, "sqlite:%s%s%s", cwd,
                   strcmp(cwd, "/") ? "/" : "", path);
  return n > 0 && (size_t)n < sizeof abs_url ? abs_url : url;
}

int cli_parse(int argc, char **argv, cli_flag_t *flags, const char **pos, int maxpos,
              const char *missing, int *npos, const char *usage) {
  *npos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(usage, stdout), 0;
    if (!strcmp(a, "--")) {
      for (i++; i < argc; i++) {
        if (*npos >= maxpos) return cli_usage(usage, "unexpected argument '%s'", argv[i]);
        pos[(*npos)++] = argv[i];
      }
      break;
    }
    if (a[0] == '-' && a[1]) {
      cli_flag_t *f = flags;
      size_t n = strcspn(a, "=");
      for (; f->name; f++)
        if (strlen(f->name) == n && !strncmp(f->name, a, n)) break;
      if (!f->name) return cli_usage(usage, "unknown flag '%s'", a);
      if (!f->takes_value) {
        if (a[n]) return cli_usage(usage, "%s takes no value", f->name);
        *f->value = "1";
      } else if (a[n] == '=') {
        *f->value = a + n + 1;
      } else if (i + 1 < argc) {
        *f->value = argv[++i];
      } else {
        return cli_usage(usage, "%s needs a value", f->name);
      }
      continue;
    }
    if (*npos >= maxpos) return cli_usage(usage, "unexpected argument '%s'", a);
    pos[(*npos)++] = a;
  }
  if (missing && *npos < maxpos) return cli_usage(usage, "%s", missing);
  return -1;
}

/* jansson's check of UTF-8 (RFC 3629), the one every JSON text the
 * library reads or writes goes through: a string it cannot hold is not
 * UTF-8. */
int cli_check_utf8(const char *what, const char *s, const char *usage) {
  json_t *t = json_string(s);
  if (t) {
    json_decref(t);
    return -1;
  }
  return cli_usage(usage, "%s is not valid UTF-8", what);
}

int cli_check_id(const char *what, const char *s, const char *usage) {
  size_t n = strlen(s);
  if (!n) return cli_usage(usage, "%s must not be empty", what);
  if (n > 1024) return cli_usage(usage, "%s is longer than 1024 bytes", what);
  int rc = cli_check_utf8(what, s, usage);
  if (rc >= 0) return rc;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
      return cli_usage(usage, "%s must not hold control characters (0x%02x at offset %zu)", what,
                       (unsigned char)s[i], i);
  return -1;
}

lg_store_t *cli_open_store(const char *flag) {
  lg_error_t err = {0};
  lg_store_t *s = lg_store_open(cli_store_url(flag), NULL, &err);
  if (!s) cli_error(&err);
  return s;
}

lg_store_t *cli_open_store_existing(const char *flag) {
  lg_error_t err = {0};
  lg_store_options_t opts = {0};
  opts.no_create = 1;
  const char *url = cli_store_url(flag);
  lg_store_t *s = lg_store_open(url, &opts, &err);
  if (s) return s;
  if (err.code == LG_ENOTFOUND && !strncmp(url, "sqlite:", 7))
    fprintf(stderr, "loopguard: no store at %s (set --store or LOOPGUARD_STORE)\n", url + 7);
  else
    cli_error(&err);
  return NULL;
}

int64_t cli_parse_duration(const char *s) {
  const int64_t max = INT64_MAX / 2; /* room for the callers' now - age */
  int64_t total = 0;
  if (!*s) return -1;
  while (*s) {
    if (*s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno || n < 0) return -1;
    int64_t unit;
    if (!strncmp(end, "ms", 2)) unit = 1, end += 2;
    else if (*end == 's') unit = 1000, end++;
    else if (*end == 'm') unit = 60000, end++;
    else if (*end == 'h') unit = 3600000, end++;
    else if (*end == 'd') unit = 86400000, end++;
    else if (*end == 'w') unit = 604800000, end++;
    else return -1;
    /* The sum, not each term: terms of the maximum each wrapped round to
     * a small age ("...ms...ms5ms" was 1 ms and purged every run). */
    if (n > (max - total) / unit) return -1;
    total += n * unit;
    s = end;
  }
  return total;
}

int64_t cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cli_color(FILE *f) {
  const char *nc = getenv("NO_COLOR");
  if (nc && *nc) return 0;
  const char *term = getenv("TERM");
  if (term && !strcmp(term, "dumb")) return 0;
  return isatty(fileno(f));
}


int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } cmds[] = {{"replay", cmd_replay}, {"fingerprint", cmd_fingerprint}, {"serve", cmd_serve},
              {"runs", cmd_runs},     {"ledger", cmd_ledger},           {"budget", cmd_budget}, {"keys", cmd_keys},
              {"test", cmd_test}};
  if (argc < 2) return cli_usage(usage_text, NULL);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("loopguard %s\n", lg_version());
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  return cli_usage(usage_text, "unknown command '%s'", argv[1]);
}
