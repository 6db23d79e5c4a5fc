/*
 * cli.h — the subcommands of the `loopguard` tool. The tool is built on the
 * public API only (include/loopguard.h); each subcommand lives in its own
 * cli/cmd_*.c and returns the process exit status: 0 success, 1 an error
 * (a message on stderr that says what and where), 2 bad usage.
 */
#ifndef LG_CLI_H
#define LG_CLI_H

#include <stdio.h>

#include "loopguard.h"

int cmd_replay(int argc, char **argv);
int cmd_fingerprint(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_runs(int argc, char **argv);
int cmd_ledger(int argc, char **argv);
int cmd_budget(int argc, char **argv);
int cmd_keys(int argc, char **argv);        /* cmd_keys.c */
int cmd_test(int argc, char **argv);        /* cmd_test.c */
int cmd_runs_export(int argc, char **argv); /* cmd_export.c: `runs export` */

/* Prints "loopguard: " + the formatted error to stderr. */
void cli_error(const lg_error_t *err);
/* Prints a usage error and returns 2. */
int cli_usage(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The store URL: --store, else $LOOPGUARD_STORE, else sqlite:loopguard.db
 * in the current folder; a relative sqlite: path is made absolute (static
 * storage, valid until the next call). */
const char *cli_store_url(const char *flag);
/* A flag of a subcommand; a NULL name ends a list. */
typedef struct cli_flag {
  const char *name;   /* "--store" */
  int takes_value;    /* 1: "--store URL" or "--store=URL" */
  const char **value; /* where the value goes ("1" for a switch) */
} cli_flag_t;
/* Parses argv[1..] (argv[0] is the subcommand): flags anywhere, the
 * positionals into pos[] (at most maxpos; "--" ends the flags). With
 * `missing` (the error, e.g. "ledger claim needs a KEY") all maxpos are
 * required. Returns -1 to go on, else the exit status for the caller to
 * return: 0 after printing `usage` for --help, 2 after printing what was
 * wrong. */
int cli_parse(int argc, char **argv, cli_flag_t *flags, const char **pos, int maxpos,
              const char *missing, int *npos, const char *usage);
/* Text given on the command line that a command puts in JSON (a tool
 * name, a key's name, a note): it must be valid UTF-8. -1 when it is,
 * else 2 after printing "WHAT is not valid UTF-8" and `usage` (`what`
 * names the flag or argument: "--note", "TOOL"). */
int cli_check_utf8(const char *what, const char *s, const char *usage);
/* An id given on the command line (a run id, a group, a ledger key), as
 * the HTTP API takes one: 1 to 1024 bytes of UTF-8 without control
 * characters. Returns as cli_check_utf8. */
int cli_check_id(const char *what, const char *s, const char *usage);
/* Opens the store of --store (see cli_store_url); NULL after printing the
 * error. */
lg_store_t *cli_open_store(const char *flag);
/* The same for read-only commands: a store that does not exist is not
 * created; "no store at PATH (set --store or LOOPGUARD_STORE)" instead. */
lg_store_t *cli_open_store_existing(const char *flag);
/* An amount of USD given to `flag` ("25", "0.50") into micro-dollars;
 * else prints the usage error and returns 2 (cmd_budget.c). */
int cli_parse_usd(const char *flag, const char *text, int64_t *micro, const char *usage);
/* A duration into milliseconds: numbers each with a unit (ms s m h d w),
 * "500ms", "24h", "1h30m"; -1 when malformed. */
int64_t cli_parse_duration(const char *s);
/* The time of day, epoch milliseconds: the CLI's clock for the store. */
int64_t cli_now_ms(void);
/* 1 when colour may be used on `f` (a terminal, NO_COLOR unset). */
int cli_color(FILE *f);

#endif
