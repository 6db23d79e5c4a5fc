#!/usr/bin/env bash
# make_run.sh — `make run` as a newcomer types it (with LG_RUN_NO_BUILD=1 and
# BUILD= naming this build, so the test neither builds nor touches build/):
#   - a port that is taken: exit 1 before starting anything, and a message
#     naming the port and the `make run LISTEN=...` that would work;
#   - LISTEN= picks the address and ARGS= passes flags to loopguard serve:
#     the banner says where it listens, /healthz answers there, and a
#     SIGTERM stops it cleanly.
source "$(dirname "$0")/serve_lib.bash"
src=$LG_SOURCE_DIR
build=$(cd "$(dirname "$LG_BIN")" && pwd)
mk() { make --no-print-directory -s -C "$src" run LG_RUN_NO_BUILD=1 BUILD="$build" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

note "a busy port"
start_server busy --store memory:
busy_port=${busy_URL##*:}
out=$(mk LISTEN="127.0.0.1:$busy_port" ARGS="--store memory:" 2>"$TMP/busy.err" </dev/null)
rc=$?
[ $rc != 0 ] || fail "make run on a busy port exited 0: $out"
grep -q "port $busy_port is in use" "$TMP/busy.err" || fail "no 'port $busy_port is in use' in: $(cat "$TMP/busy.err")"
grep -q "run \`make run LISTEN=127.0.0.1:[0-9]*\`" "$TMP/busy.err" || fail "no make run LISTEN= hint in: $(cat "$TMP/busy.err")"
hint=$(grep -o 'LISTEN=127.0.0.1:[0-9]*' "$TMP/busy.err" | head -n 1)
[ "$hint" != "LISTEN=127.0.0.1:$busy_port" ] || fail "the hint names the busy port again"
! grep -q "listening on" <<<"$out" || fail "a server started anyway: $out"
stop_server busy

note "LISTEN= and ARGS="
port=$(free_port)
setsid bash -c 'exec make --no-print-directory -s -C "$1" run LG_RUN_NO_BUILD=1 BUILD="$2" LISTEN="127.0.0.1:$3" ARGS="--store memory: --threads 2"' \
  _ "$src" "$build" "$port" >"$TMP/run.out" 2>"$TMP/run.err" </dev/null &
runpid=$!
ALL_PIDS+=("$runpid")
for _ in $(seq 100); do
  grep -q "listening on" "$TMP/run.out" 2>/dev/null && break
  sleep 0.1
done
grep -q "listening on http://127.0.0.1:$port" "$TMP/run.out" || fail "no banner for port $port: $(cat "$TMP/run.out" "$TMP/run.err")"
grep -q "store:   memory:" "$TMP/run.out" || fail "ARGS did not reach serve: $(cat "$TMP/run.out")"
grep -q "threads: 2" "$TMP/run.out" || fail "ARGS' second flag did not reach serve: $(cat "$TMP/run.out")"
grep -q "the field incidents" "$TMP/run.out" || fail "no incidents before the banner"
[ "$(head -n 1 "$TMP/run.out")" = "loopguard: the field incidents, replayed (tests/data/fixtures/):" ] ||
  fail "something before the first line: $(head -n 3 "$TMP/run.out")"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")
[ "$code" = 200 ] || fail "/healthz on $port: $code"
# SIGTERM to the server itself (Ctrl-C would signal make too, which then
# reports the interrupt): it drains, and make run exits 0.
srv=$(pgrep -g "$runpid" -x loopguard | head -n 1)
[ -n "$srv" ] || fail "no loopguard process under make run"
kill -TERM "$srv"
wait "$runpid"
rc=$?
[ $rc = 0 ] || fail "make run exited $rc after SIGTERM to the server: $(cat "$TMP/run.err")"
echo "make_run.sh: passed"
