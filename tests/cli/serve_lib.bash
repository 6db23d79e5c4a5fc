# serve_lib.bash — what the tests/cli/serve_*.sh scripts share (sourced;
# not a test itself: CTest runs tests/cli/*.sh only).
#
#   start_server NAME ARGS...   starts `loopguard serve --listen 127.0.0.1:0
#                               ARGS...` in the background, waits for its
#                               banner, and sets NAME_URL, NAME_PID, NAME_OUT
#   stop_server NAME            SIGTERM, then waits (exit status in NAME_RC);
#                               fails when it is not 0
#   jq_py EXPR                  evaluates a Python expression over the JSON
#                               on stdin (bound to `d`; json and sys at hand,
#                               not the caller's environment: one python
#                               answers them all) and prints it
#   jq_url URL EXPR             the same over the answer to GET URL (http://),
#                               failing on a status of 400 or more: curl -sf
#                               URL | jq_py EXPR without the two processes
#   fail MSG                    prints FAIL and exits 1
#   grep_q [FLAGS] PATTERN      grep -q that reads its input to the end:
#                               under pipefail, `producer | grep -q` fails
#                               when grep has its match and exits while the
#                               producer still writes (SIGPIPE; a log or a
#                               body written in more than one piece)
#
# Every server started is killed (-9) at exit, and the scratch folder $TMP
# removed, whatever happens (a test that would pass fails when a server it
# started is still running then: stop_server each); a test that runs past $LG_TEST_TIMEOUT seconds
# (170) fails. Tests bind ephemeral ports only.
set -u -o pipefail

grep_q() { grep "$@" >/dev/null; }

LG_BIN=${LG_BIN:?set LG_BIN to the loopguard binary}
LG_SOURCE_DIR=${LG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
TMP=$(mktemp -d /tmp/lgserve.XXXXXX)
ALL_PIDS=()
declare -A LIVE_SERVERS=() # NAME -> pid: started by start_server, not yet stopped

cleanup() {
  local rc=$? p n left=()
  kill "$WATCHDOG" 2>/dev/null
  # A test that passes has stopped every server it started (stop_server):
  # one still running would be killed below, its exit status (under ASan,
  # its leak report) never read. One that is gone (a test's own kill -9)
  # is not counted.
  for n in "${!LIVE_SERVERS[@]}"; do
    kill -0 "${LIVE_SERVERS[$n]}" 2>/dev/null && left+=("$n")
  done
  if [ "$rc" = 0 ] && [ ${#left[@]} -gt 0 ]; then
    echo "FAIL: server(s) ${left[*]} still running at the end: stop_server each (its exit status, and under ASan its leak report, are checked there)" >&2
    rc=1
  fi
  for p in "${ALL_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${ALL_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' TERM INT
# A test that hangs fails in bounded time, and cleans up after itself.
watchdog() {
  local main=$1 secs=$2
  sleep "$secs" &
  local sp=$!
  trap 'kill $sp 2>/dev/null; exit 0' TERM
  wait "$sp"
  echo "FAIL: timed out after $secs s" >&2
  kill -TERM "$main"
}
watchdog $$ "${LG_TEST_TIMEOUT:-170}" </dev/null &
WATCHDOG=$!

fail() {
  echo "FAIL: $*" >&2
  # What the servers said (a sanitizer's report, a crash): the folder goes.
  local e
  for e in "$TMP"/*.err; do
    [ -s "$e" ] || continue
    if grep -q "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$e"; then # the report, from its start
      echo "---- ${e##*/} (the sanitizer's report) ----"
      grep -m1 -A 80 "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" "$e"
    else
      echo "---- ${e##*/} (last lines) ----"
      tail -n 40 "$e"
    fi >&2
  done
  # and what they logged as warnings or errors (--log files)
  for e in "$TMP"/*.log; do
    [ -s "$e" ] && grep -q '"level":"\(warn\|error\)"' "$e" || continue
    echo "---- ${e##*/} (warnings and errors) ----"
    grep '"level":"\(warn\|error\)"' "$e" | tail -n 20
  done >&2
  exit 1
}

note() { echo "-- $*"; }

start_server() { # NAME ARGS...
  local name=$1
  shift
  local out="$TMP/$name.out"
  # Emptied here, not by the redirection below: that runs in the child, and
  # the loop could read a restarted server's old URL before it does.
  : >"$out"
  "$LG_BIN" serve --listen 127.0.0.1:0 "$@" >"$out" 2>"$TMP/$name.err" &
  local pid=$!
  ALL_PIDS+=("$pid")
  local i url=
  for i in $(seq 100); do
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$out" 2>/dev/null | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$url" ]; then
    cat "$out" "$TMP/$name.err" >&2
    fail "server $name did not start"
  fi
  printf -v "${name}_URL" '%s' "$url"
  printf -v "${name}_PID" '%s' "$pid"
  LIVE_SERVERS[$name]=$pid
  printf -v "${name}_OUT" '%s' "$out"
}

stop_server() { # NAME
  local pid_var="${1}_PID"
  local pid=${!pid_var}
  kill -TERM "$pid" 2>/dev/null
  local rc=0
  wait "$pid" || rc=$?
  unset "LIVE_SERVERS[$1]"
  printf -v "${1}_RC" '%s' "$rc"
  # A server stopped by SIGTERM exits 0 when all went well: anything else
  # is an error, or under ASan a leak or another sanitizer's report at exit
  # (fail prints it from NAME.err). Until session 53 most tests did not
  # look, and a leak in the gateway's replicas went unseen.
  [ "$rc" = 0 ] || fail "server $1 exited $rc at SIGTERM, not 0 (under ASan: a leak or a sanitizer's report)"
}

# ask_helper PORTFILE SEND [ARGS...]: one request to a helper process of
# this script that listens on loopback (its port in PORTFILE): SEND ARGS
# writes the request to stdout, the helper answers its exit status and a
# newline, stdout, a NUL, stderr; printed as they came, the status
# returned (1 when it did not answer). 2 when the helper is not up (or
# died): nothing was sent, the caller runs the work itself. No process a
# call: read, not cat (the answers are small).
ask_helper() {
  local port= fd rc out err
  [ -s "$1" ] && read -r port <"$1"
  [ -n "$port" ] && { exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 2
  "${@:2}" >&"$fd"
  # -u, not <&: a redirection would put the socket on this shell's fd 0
  # while read waits, where jq_py's evaluator reads the document
  IFS= read -r -u "$fd" rc
  IFS= read -r -d '' -u "$fd" out
  IFS= read -r -d '' -u "$fd" err
  exec {fd}<&-
  printf '%s' "$out"
  printf '%s' "$err" >&2
  [ -n "$rc" ] || echo "${1##*/}: the helper did not answer: ${*:2}" >&2
  [ "$rc" = 0 ] || return 1
}

# jq_py's evaluator: one python for the whole script (jq_py.py says why);
# a call before it is up, or after it died, starts a python of its own.
# The evaluator reads the document from this shell's standard input
# itself (/proc/BASHPID/fd/0: the pipe or file jq_py was given): bash's
# read takes a pipe a byte at a time, a system call a byte, and the
# gateway tests pipe 14 MB of JSON through jq_py (23 s of CPU, half of
# gateway_e2e's).
python3 "$LG_SOURCE_DIR/tests/cli/jq_py.py" >"$TMP/jq_py.port" 2>"$TMP/jq_py.err" </dev/null &
ALL_PIDS+=("$!")
jq_py_send() { # EXPR, then where the document is, then a NUL
  printf '%s\n/proc/%s/fd/0\0' "$1" "$BASHPID"
}
jq_py() { # EXPR over the JSON document on stdin, bound to d
  ask_helper "$TMP/jq_py.port" jq_py_send "$1"
  local rc=$?
  [ $rc = 2 ] || return $rc
  python3 -c "import json,sys; d=json.load(sys.stdin); r=($1); print(json.dumps(r) if not isinstance(r,str) else r)"
}
jq_url_send() { # URL EXPR
  printf '%s\n%s\0' "$2" "$1"
}
# jq_url URL EXPR: `curl -sf URL | jq_py EXPR` in the evaluator, without a
# curl (nor a pipe's subshell): the checks that poll a server's JSON
jq_url() {
  ask_helper "$TMP/jq_py.port" jq_url_send "$1" "$2"
  local rc=$?
  [ $rc = 2 ] || return $rc
  curl -sf "$1" | jq_py "$2"
}

# The store of these tests: a SQLite file, or PostgreSQL under
# tests/pg/with-postgres.sh (LG_TEST_STORE=postgres and LG_PG_URL).
test_store_url() { # NAME
  if [ "${LG_TEST_STORE:-}" = postgres ]; then
    [ -n "${LG_PG_URL:-}" ] || fail "LG_TEST_STORE=postgres without LG_PG_URL (run through tests/pg/with-postgres.sh)"
    echo "$LG_PG_URL"
  else
    echo "sqlite:$TMP/$1.db"
  fi
}
