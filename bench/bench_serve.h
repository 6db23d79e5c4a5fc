/*
 * bench_serve.h — what the server benchmarks share: a `loopguard serve`
 * started from a shell command line, and its port read from the banner
 * ("listening on http://127.0.0.1:PORT"), and its CPU time. Header-only, for bench_server.c
 * and server_ir.c; each defines die() before including it.
 */
#ifndef LG_BENCH_SERVE_H
#define LG_BENCH_SERVE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct server {
  pid_t pid; /* the shell's, which exec'd the command */
  int port;
} server_t;

static void die(const char *what);

/* Runs cmd (it should `exec` the server) with its stdout on a pipe, and
 * waits for the banner line that names the port. */
static server_t serve_spawn(const char *cmd) {
  int fds[2];
  if (pipe(fds)) die("pipe");
  server_t s = {0, 0};
  s.pid = fork();
  if (s.pid < 0) die("fork");
  if (s.pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  char line[512];
  const char *tag = "listening on http://127.0.0.1:";
  while (fgets(line, sizeof line, f)) {
    const char *u = strstr(line, tag);
    if (u) {
      s.port = atoi(u + strlen(tag));
      break;
    }
  }
  fclose(f); /* the rest of the banner is not needed */
  if (!s.port) die("the server did not start");
  return s;
}

/* The CPU time (user + system, all threads) a process has used so far, in
 * seconds, from /proc/PID/stat (fields 14 and 15, after the parenthesised
 * name); -1 when it cannot be read. */
static double cpu_s(pid_t pid) {
  char p[64], line[1024];
  snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  char *ok = fgets(line, sizeof line, f);
  fclose(f);
  char *t = ok ? strrchr(line, ')') : NULL;
  unsigned long ut = 0, st = 0;
  if (!t || sscanf(t + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#endif
