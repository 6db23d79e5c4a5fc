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

/* Prints "loopguard: " + the formatted error to stderr. */
void cli_error(const lg_error_t *err);
/* Prints a usage error and returns 2. */
int cli_usage(const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The store URL: --store, else $LOOPGUARD_STORE, else sqlite:loopguard.db. */
const char *cli_store_url(const char *flag);
/* 1 when colour may be used on `f` (a terminal, NO_COLOR unset). */
int cli_color(FILE *f);

#endif
