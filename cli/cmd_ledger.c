/*
 * cmd_ledger.c — `loopguard ledger claim|commit|fail|show|purge`: the
 * idempotency ledger of a store, for executors that manage their keys
 * directly and for the operator who resolves an unknown_outcome.
 *
 * Each subcommand opens the store named by --store (else $LOOPGUARD_STORE,
 * else sqlite:loopguard.db), does one ledger call with the real clock as
 * now_ms, and prints for a person, or one JSON object with --json. `claim`
 * says its outcome in its exit status too: 0 claimed, 10 replay,
 * 11 in_progress, 12 mismatch, 13 unknown_outcome; everywhere 1 is an
 * error (a message on stderr naming the store) and 2 bad usage.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *ledger_usage =
    "usage: loopguard ledger claim KEY --fingerprint FP [--lease-ms N] [--run RUN_ID]\n"
    "                               [--store URL] [--json]\n"
    "       loopguard ledger commit KEY --result JSON [--operation-id ID] [--store URL]\n"
    "       loopguard ledger fail KEY [--retryable] [--store URL]\n"
    "       loopguard ledger show KEY [--store URL] [--json]\n"
    "       loopguard ledger purge [--older-than DURATION] [--store URL]\n"
    "\n"
    "The idempotency ledger: a side effect runs at most once per key. Run\n"
    "'loopguard ledger SUBCOMMAND --help' for each one's flags.\n"
    "\n"
    "A store is a URL: memory:, sqlite:PATH or postgres:CONNINFO; the default is\n"
    "$LOOPGUARD_STORE, else sqlite:loopguard.db in the current folder; read-only\n"
    "subcommands never create it.\n"
    "\n"
    "Exit status: 0 success, 1 an error, 2 bad usage; ledger claim also exits 10\n"
    "replay, 11 in_progress, 12 mismatch, 13 unknown_outcome.\n";

static const char *claim_usage =
    "usage: loopguard ledger claim KEY --fingerprint FP [--lease-ms N] [--run RUN_ID]\n"
    "                              [--store URL] [--json]\n"
    "\n"
    "Claims KEY before a side effect. Exactly one of any number of concurrent\n"
    "claimants wins; run the side effect only when this prints \"claimed\", then\n"
    "record its outcome with 'ledger commit' or 'ledger fail'.\n"
    "\n"
    "  --fingerprint FP  the request's fingerprint (normally 64 hex digits, as\n"
    "                    'loopguard fingerprint' prints): the same key with a\n"
    "                    different fingerprint is a mismatch\n"
    "  --lease-ms N      how long the claim holds without an outcome, 0 to\n"
    "                    604800000 ms (7 days; 0: the store's, 60000) [0];\n"
    "                    after it, the key is unknown_outcome\n"
    "  --run RUN_ID      the run the claim belongs to (shown by 'ledger show')\n"
    "  --store URL       the store (default $LOOPGUARD_STORE, else\n"
    "                    sqlite:loopguard.db)\n"
    "  --json            print {\"outcome\": ..., \"result\"?: ...}\n"
    "  --help            this text\n"
    "\n"
    "Exit status: 0 claimed (run the side effect), 10 replay (it already ran:\n"
    "the saved result is printed), 11 in_progress (someone else holds the key),\n"
    "12 mismatch (the key was used for another request), 13 unknown_outcome (a\n"
    "claim's lease ran out with no outcome: reconcile, then commit or fail the\n"
    "key), 1 an error, 2 bad usage.\n";

static const char *commit_usage =
    "usage: loopguard ledger commit KEY --result JSON [--operation-id ID] [--store URL]\n"
    "\n"
    "Records that the side effect of KEY happened: from now on a claim of KEY\n"
    "replays RESULT instead of running it again. Also resolves a key in\n"
    "unknown_outcome once you have checked that the side effect did happen. A\n"
    "key already committed or failed keeps its first outcome.\n"
    "\n"
    "  --result JSON        the outcome to replay (any JSON value)\n"
    "  --operation-id ID    the side effect's own id (a payment id, ...)\n"
    "  --store URL          the store (default $LOOPGUARD_STORE, else\n"
    "                       sqlite:loopguard.db)\n"
    "  --help               this text\n"
    "\n"
    "Exit status: 0 recorded (or already finished), 1 an error (KEY not in the\n"
    "ledger, the store unreachable), 2 bad usage.\n";

static const char *fail_usage =
    "usage: loopguard ledger fail KEY [--retryable] [--store URL]\n"
    "\n"
    "Records that the side effect of KEY failed. Without --retryable the failure\n"
    "is final: the key is kept and every later claim replays the failure, never\n"
    "running it again. With --retryable the key is freed and the next claim runs\n"
    "the side effect. Also resolves a key in unknown_outcome once you have\n"
    "checked that the side effect did not happen; --retryable also frees a key\n"
    "that failed for good. A committed key is never changed.\n"
    "\n"
    "  --retryable   free the key for another attempt\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 recorded, 1 an error (KEY not in the ledger, ...), 2 bad usage.\n";

static const char *show_usage =
    "usage: loopguard ledger show KEY [--store URL] [--json]\n"
    "\n"
    "Shows KEY's state — in_progress, unknown_outcome, committed or failed — its\n"
    "run, request fingerprint, result, and when it was claimed, last changed and\n"
    "when its lease ends. Changes nothing.\n"
    "\n"
    "  --store URL   the store (default $LOOPGUARD_STORE, else sqlite:loopguard.db)\n"
    "  --json        print the object of GET /v1/operations/{key}\n"
    "  --help        this text\n"
    "\n"
    "Exit status: 0 shown, 1 an error (KEY not in the ledger, ...), 2 bad usage.\n";

static const char *purge_usage =
    "usage: loopguard ledger purge [--older-than DURATION] [--store URL]\n"
    "\n"
    "Deletes committed and failed keys whose last change is older than DURATION\n"
    "(default 24h, the ledger's retention; such keys no longer replay anyway).\n"
    "Claims still waiting for an outcome (in_progress, unknown_outcome) are\n"
    "never purged: resolve them with 'ledger commit' or 'ledger fail'.\n"
    "\n"
    "  --older-than DURATION  numbers with units (ms s m h d w): 90s, 24h, 1h30m\n"
    "  --store URL            the store (default $LOOPGUARD_STORE, else\n"
    "                         sqlite:loopguard.db)\n"
    "  --help                 this text\n"
    "\n"
    "Exit status: 0 done, 1 an error, 2 bad usage.\n";

/* ---- helpers ---- */

static void fmt_time(int64_t ms, char buf[40]) {
  time_t s = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&s, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, 40, "%s.%03dZ", day, (int)(ms % 1000));
}

/* ---- claim ---- */

static int do_claim(int argc, char **argv) {
  const char *store = NULL, *fp = NULL, *lease = NULL, *run = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--fingerprint", 1, &fp}, {"--lease-ms", 1, &lease}, {"--run", 1, &run},
                    {"--store", 1, &store},    {"--json", 0, &json},      {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "ledger claim needs a KEY", &npos, claim_usage);
  if (rc >= 0) return rc;
  if (!fp || !*fp) return cli_usage(claim_usage, "ledger claim needs --fingerprint FP");
  /* What the HTTP API takes: these go into the store and into JSON. */
  if ((rc = cli_check_id("KEY", pos[0], claim_usage)) >= 0 ||
      (rc = cli_check_id("--fingerprint", fp, claim_usage)) >= 0 ||
      (run && (rc = cli_check_id("--run", run, claim_usage)) >= 0))
    return rc;
  int64_t lease_ms = 0;
  if (lease) {
    char *end;
    errno = 0;
    lease_ms = strtoll(lease, &end, 10);
    /* The HTTP API's range of lease_ms (a week at most): a lease beyond it
     * would hold the key, unknown_outcome never reached, for ever. */
    if (errno || *end || end == lease || lease_ms < 0 || lease_ms > 604800000)
      return cli_usage(claim_usage,
                       "--lease-ms wants a whole number of milliseconds from 0 (the store's "
                       "lease) to 604800000 (7 days), not '%s'",
                       lease);
  }
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  lg_claim_t c = {0};
  lg_error_t err = {0};
  int64_t now = cli_now_ms();
  rc = lg_store_claim(s, pos[0], fp, run, lease_ms, now, &c, &err);
  if (rc) {
    cli_error(&err);
    lg_store_close(s);
    return 1;
  }
  int status = 1;
  switch (c.outcome) {
  case LG_CLAIM_CLAIMED: status = 0; break;
  case LG_CLAIM_REPLAY: status = 10; break;
  case LG_CLAIM_IN_PROGRESS: status = 11; break;
  case LG_CLAIM_MISMATCH: status = 12; break;
  case LG_CLAIM_UNKNOWN_OUTCOME: status = 13; break;
  default: break;
  }
  if (json) {
    printf("{\"outcome\":\"%s\"", lg_claim_outcome_name(c.outcome));
    if (c.outcome == LG_CLAIM_REPLAY) {
      printf(",\"result\":");
      if (c.result && c.result_len) fwrite(c.result, 1, c.result_len, stdout);
      else fputs("null", stdout);
      if (c.failed) printf(",\"failed\":true");
    }
    puts("}");
  } else {
    lg_operation_t op = {0};
    int have = lg_store_operation(s, pos[0], now, &op, NULL) == 0;
    char t[40];
    switch (c.outcome) {
    case LG_CLAIM_CLAIMED:
      fmt_time(have ? op.lease_until_ms : now, t);
      printf("claimed %s: run the side effect now, then 'ledger commit' or 'ledger fail' "
             "(lease until %s)\n",
             pos[0], t);
      break;
    case LG_CLAIM_REPLAY:
      if (c.failed)
        printf("replay %s: it failed for good; do not run it again\n", pos[0]);
      else
        printf("replay %s: it already ran; its result:\n%.*s\n", pos[0],
               (int)(c.result ? c.result_len : 4), c.result ? c.result : "null");
      break;
    case LG_CLAIM_IN_PROGRESS:
      fmt_time(have ? op.lease_until_ms : now, t);
      printf("in_progress %s: held by %s%s, lease until %s; do not run it\n", pos[0],
             have && op.run_id ? "run " : "", have && op.run_id ? op.run_id : "another worker",
             t);
      break;
    case LG_CLAIM_MISMATCH:
      printf("mismatch %s: the key was claimed for request fingerprint %s, not %s; use "
             "another key for another request\n",
             pos[0], have ? op.request_fp : "(unknown)", fp);
      break;
    case LG_CLAIM_UNKNOWN_OUTCOME:
      fmt_time(have ? op.lease_until_ms : now, t);
      printf("unknown_outcome %s: a claim's lease ran out at %s with no outcome; nobody "
             "knows whether the side effect happened.\n"
             "Check it, then: 'loopguard ledger commit %s --result JSON' if it happened, "
             "'loopguard ledger fail %s' if it did not and must not run, or "
             "'loopguard ledger fail %s --retryable' to let it run again.\n",
             pos[0], t, pos[0], pos[0], pos[0]);
      break;
    default: break;
    }
    lg_operation_clear(&op);
  }
  lg_claim_clear(&c);
  lg_store_close(s);
  return status;
}

/* The CLI has the store itself: it acts as an operator, and its outcomes
 * are recorded as "cli:USER" (docs/security.md, "Who may undo what"). */
static void cli_operator(lg_op_actor_t *as, char *who, size_t n) {
  const char *user = getenv("USER");
  if (!user || !*user) user = getenv("LOGNAME");
  snprintf(who, n, "cli:%s", user && *user ? user : "operator");
  memset(as, 0, sizeof *as);
  as->operator = 1;
  as->who = who;
}

/* ---- commit ---- */

static int do_commit(int argc, char **argv) {
  const char *store = NULL, *result = NULL, *opid = NULL;
  cli_flag_t flags[] = {{"--result", 1, &result},
                    {"--operation-id", 1, &opid},
                    {"--store", 1, &store},
                    {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "ledger commit needs a KEY", &npos, commit_usage);
  if (rc >= 0) return rc;
  if (!result) return cli_usage(commit_usage, "ledger commit needs --result JSON");
  if (opid && (rc = cli_check_id("--operation-id", opid, commit_usage)) >= 0) return rc;
  /* The result is replayed as JSON: refuse what is not. */
  lg_canon_t *canon = lg_canon_new();
  if (!canon) {
    fprintf(stderr, "loopguard: out of memory\n");
    return 1;
  }
  const char *out;
  size_t outlen;
  lg_error_t err = {0};
  rc = lg_canon_json(canon, result, strlen(result), &out, &outlen, &err);
  lg_canon_free(canon);
  if (rc) {
    snprintf(err.source, sizeof err.source, "--result");
    cli_error(&err);
    return 2;
  }
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  int64_t now = cli_now_ms();
  lg_operation_t before = {0};
  int had = lg_store_operation(s, pos[0], now, &before, NULL) == 0;
  lg_op_actor_t as;
  char who[96];
  cli_operator(&as, who, sizeof who);
  rc = lg_store_commit_as(s, pos[0], result, strlen(result), opid, &as, now, &err);
  if (rc) {
    cli_error(&err);
  } else if (had && (before.state == LG_OP_COMMITTED || before.state == LG_OP_FAILED)) {
    printf("%s was already %s; its first outcome stands\n", pos[0],
           lg_op_state_name(before.state));
  } else {
    printf("committed %s: claims of it replay this result from now on\n", pos[0]);
  }
  lg_operation_clear(&before);
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- fail ---- */

static int do_fail(int argc, char **argv) {
  const char *store = NULL, *retryable = NULL;
  cli_flag_t flags[] = {{"--retryable", 0, &retryable}, {"--store", 1, &store}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "ledger fail needs a KEY", &npos, fail_usage);
  if (rc >= 0) return rc;
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  int64_t now = cli_now_ms();
  lg_operation_t before = {0};
  int had = lg_store_operation(s, pos[0], now, &before, NULL) == 0;
  lg_error_t err = {0};
  lg_op_actor_t as;
  char who[96];
  cli_operator(&as, who, sizeof who);
  rc = lg_store_fail_as(s, pos[0], retryable != NULL, &as, now, &err);
  if (rc) cli_error(&err);
  else if (had && before.state == LG_OP_COMMITTED)
    printf("%s was already committed; a committed key is never changed\n", pos[0]);
  else if (retryable)
    printf("released %s: the next claim runs the side effect again\n", pos[0]);
  else
    printf("failed %s: kept as a final failure; claims of it replay the failure\n", pos[0]);
  lg_operation_clear(&before);
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- show ---- */

static int do_show(int argc, char **argv) {
  const char *store = NULL, *json = NULL;
  cli_flag_t flags[] = {{"--store", 1, &store}, {"--json", 0, &json}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 1, "ledger show needs a KEY", &npos, show_usage);
  if (rc >= 0) return rc;
  lg_store_t *s = cli_open_store_existing(store);
  if (!s) return 1;
  lg_operation_t op = {0};
  lg_error_t err = {0};
  rc = lg_store_operation(s, pos[0], cli_now_ms(), &op, &err);
  if (rc) {
    cli_error(&err);
  } else if (json) {
    char *j = lg_operation_to_json(&op);
    if (j) puts(j);
    else rc = LG_ENOMEM;
    lg_free(j);
  } else {
    char c[40], u[40], l[40];
    fmt_time(op.created_ms, c);
    fmt_time(op.updated_ms, u);
    fmt_time(op.lease_until_ms, l);
    printf("key          %s\n", op.key);
    printf("state        %s\n", lg_op_state_name(op.state));
    printf("run          %s\n", op.run_id ? op.run_id : "-");
    printf("fingerprint  %s\n", op.request_fp);
    printf("claimed      %s\n", c);
    printf("updated      %s\n", u);
    if (op.state == LG_OP_IN_PROGRESS || op.state == LG_OP_UNKNOWN_OUTCOME)
      printf("lease until  %s\n", l);
    if (op.operation_id) printf("operation    %s\n", op.operation_id);
    if (op.resolved_by) {
      char r[40];
      fmt_time(op.resolved_ms, r);
      printf("resolved by  %s at %s\n", op.resolved_by, r);
    }
    if (op.state == LG_OP_COMMITTED)
      printf("result       %.*s\n", (int)(op.result ? op.result_len : 4),
             op.result ? op.result : "null");
    if (op.state == LG_OP_UNKNOWN_OUTCOME)
      printf("\nThe lease ran out with no outcome. Check whether the side effect happened,\n"
             "then: ledger commit %s --result JSON (it did), ledger fail %s (it did not;\n"
             "never retry), or ledger fail %s --retryable (it did not; run it again).\n",
             op.key, op.key, op.key);
  }
  lg_operation_clear(&op);
  lg_store_close(s);
  return rc ? 1 : 0;
}

/* ---- purge ---- */

static int do_purge(int argc, char **argv) {
  const char *store = NULL, *older = NULL;
  cli_flag_t flags[] = {{"--older-than", 1, &older}, {"--store", 1, &store}, {NULL, 0, NULL}};
  const char *pos[1];
  int npos, rc = cli_parse(argc, argv, flags, pos, 0, NULL, &npos, purge_usage);
  if (rc >= 0) return rc;
  int64_t age = -1; /* the store's retention */
  if (older && (age = cli_parse_duration(older)) < 0)
    return cli_usage(purge_usage, "--older-than wants a duration like 30m, 24h or 7d, not '%s'",
                     older);
  lg_store_t *s = cli_open_store(store);
  if (!s) return 1;
  int64_t n = 0;
  lg_error_t err = {0};
  rc = lg_store_purge(s, age, cli_now_ms(), &n, &err);
  if (rc) cli_error(&err);
  else
    printf("purged %lld finished operation%s older than %s\n", (long long)n, n == 1 ? "" : "s",
           older ? older : "24h");
  lg_store_close(s);
  return rc ? 1 : 0;
}

int cmd_ledger(int argc, char **argv) {
  if (argc < 2) return cli_usage(ledger_usage, "ledger needs a subcommand");
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(ledger_usage, stdout);
    return 0;
  }
  if (!strcmp(sub, "claim")) return do_claim(argc - 1, argv + 1);
  if (!strcmp(sub, "commit")) return do_commit(argc - 1, argv + 1);
  if (!strcmp(sub, "fail")) return do_fail(argc - 1, argv + 1);
  if (!strcmp(sub, "show")) return do_show(argc - 1, argv + 1);
  if (!strcmp(sub, "purge")) return do_purge(argc - 1, argv + 1);
  return cli_usage(ledger_usage, "unknown ledger subcommand '%s'", sub);
}
