#!/usr/bin/env bash
# with-postgres.sh CMD [ARG...] — runs CMD against a throwaway PostgreSQL.
#
# Starts a real PostgreSQL server for one command and removes it after:
# initdb into a new folder under /tmp, a server that listens only on a unix
# socket in that folder (no TCP at all), a database "lgtest", then CMD with
#   LG_PG_URL=postgres:host=FOLDER dbname=lgtest user=postgres
# in its environment; then the server is stopped, the folder removed, and
# the script exits with CMD's status.
#
# The server refuses to run as root, so as root it runs as the `postgres`
# system user (Debian's postgresql package creates it) and the folder is
# given to that user; as anyone else it runs as the caller.
#
# When the server cannot be had: with CI=true that is a failure (exit 1);
# otherwise the script prints SKIP loudly and exits 77, which CTest shows
# as "Skipped" (SKIP_RETURN_CODE), never as passed.
#
# CMD also gets LG_PG_DIR (the folder), LG_PGBIN and LG_PG_CTL (pg-ctl.sh:
# pg_ctl on this cluster as its user).
#
# Environment: LG_PGBIN (server binaries; default the newest
# /usr/lib/postgresql/*/bin), LG_PG_FSYNC (on|off, default on: benchmarks
# need real commits), LG_PG_KEEP=1 (keep the folder for a post-mortem),
# LG_PG_TEMPLATE (a folder for a template cluster copied for each test;
# every CTest test gets BUILD/pg-template: tests/CMakeLists.txt, lg_test_env).
set -u

if [ $# -eq 0 ]; then
  echo "usage: with-postgres.sh CMD [ARG...]" >&2
  exit 2
fi

unavailable() {
  if [ "${CI:-}" = "true" ]; then
    echo "with-postgres.sh: FAILED: $* (CI=true: a missing PostgreSQL is a failure)" >&2
    exit 1
  fi
  echo "" >&2
  echo "************************************************************" >&2
  echo "SKIP: PostgreSQL tests not run: $*" >&2
  echo "************************************************************" >&2
  exit 77
}

pgbin=${LG_PGBIN:-}
if [ -z "$pgbin" ]; then
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
fi
[ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] && [ -x "$pgbin/pg_ctl" ] ||
  unavailable "no PostgreSQL server binaries (install postgresql, or set LG_PGBIN)"

as_pg() { "$@"; }
user=$(id -un)
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || unavailable "running as root and there is no postgres user"
  as_pg() { runuser -u postgres -- "$@"; }
  user=postgres
fi

dir=$(mktemp -d /tmp/lgpg.XXXXXX) || unavailable "cannot make a folder under /tmp"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
started=0
cleanup() {
  if [ "$started" = 1 ]; then
    as_pg "$pgbin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
  fi
  if [ "${LG_PG_KEEP:-0}" = 1 ]; then
    echo "with-postgres.sh: kept $dir" >&2
  else
    rm -rf "$dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The cluster: a copy of a template made once (LG_PG_TEMPLATE, a folder
# CTest gives: its build folder's pg-template), under a lock, by the
# first test that needs it; a cluster made by initdb is the same every
# time, and a copy takes 0.1 s where initdb takes 1.1 (48 of them in a
# make test). The template holds the empty database lgtest too (since
# session 48: a createdb was 0.4 s a test). Without LG_PG_TEMPLATE, or
# when the template cannot be had, initdb and createdb make the test's
# own, as before.
# WAL in segments of 1 MB, not 16: a copy of the template is 16 MB less.
initdb_into() { # DIR: a new cluster in DIR/data, its log in DIR/initdb.log
  as_pg "$pgbin/initdb" -D "$1/data" -A trust -U "$user" -E UTF8 --no-sync --wal-segsize=1 >"$1/initdb.log" 2>&1
}
# DIR's cluster started, its log in DIR/server.log, listening on a socket
# in the test's folder only (no TCP; a socket's path has at most 107
# bytes, more than a build folder's may leave), with the test's settings
pg_start() { # DIR
  as_pg "$pgbin/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 \
    -o "-k $dir -c listen_addresses= -c fsync=${LG_PG_FSYNC:-on} -c max_connections=60" start >/dev/null 2>&1
}
createdb_in() { # DIR: the database lgtest in the cluster started, its log in DIR/createdb.log
  as_pg "$pgbin/createdb" -h "$dir" -U "$user" lgtest >"$1/createdb.log" 2>&1
}
from_template() {
  local t=${LG_PG_TEMPLATE:-} v
  [ -n "$t" ] && command -v flock >/dev/null || return 1
  v=$("$pgbin/postgres" -V | tr -c 'A-Za-z0-9.\n' '_')
  t="$t/$v-$user-lgtest" # (-lgtest: the template holds the database too)
  mkdir -p "$(dirname "$t")" || return 1
  (
    flock 9 || exit 1
    [ -f "$t/ready" ] && exit 0
    # a template's server left running by a test killed while it made one
    [ -f "$t/data/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" -D "$t/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$t"
    mkdir -p "$t" && { [ "$(id -u)" != 0 ] || chown postgres "$t"; } && initdb_into "$t" || exit 1
    # lgtest made once here, not a createdb a test (0.4 s each)
    pg_start "$t" || exit 1
    createdb_in "$t"
    rc=$?
    as_pg "$pgbin/pg_ctl" -D "$t/data" -m fast -w stop >/dev/null 2>&1 || rc=1
    [ $rc = 0 ] && touch "$t/ready"
  ) 9>"$t.lock" || return 1
  cp -a "$t/data" "$dir/data"
}
templated=1
if ! from_template; then
  templated=0
  if ! { rm -rf "$dir/data"; initdb_into "$dir"; }; then
    cat "$dir/initdb.log" >&2
    unavailable "initdb failed (log above)"
  fi
fi

if ! pg_start "$dir"; then
  cat "$dir/server.log" >&2 2>/dev/null
  unavailable "the server did not start (log above)"
fi
started=1

if [ $templated = 0 ] && ! createdb_in "$dir"; then
  cat "$dir/createdb.log" >&2
  unavailable "createdb failed (log above)"
fi

export LG_PG_URL="postgres:host=$dir dbname=lgtest user=$user"
# for a test that stops or restarts its server: "$LG_PG_CTL" ARG... (pg-ctl.sh)
export LG_PG_DIR="$dir" LG_PGBIN="$pgbin" LG_PG_CTL="$(cd "$(dirname "$0")" && pwd)/pg-ctl.sh"
echo "with-postgres.sh: PostgreSQL $("$pgbin/postgres" -V | awk '{print $3}') at $dir" >&2
"$@"
rc=$?
if [ $rc -ne 0 ] && [ -f "$dir/server.log" ]; then
  echo "---- last lines of the server log ----" >&2
  tail -n 20 "$dir/server.log" >&2
fi
exit $rc
