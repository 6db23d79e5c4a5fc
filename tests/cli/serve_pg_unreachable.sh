#!/usr/bin/env bash
# serve_pg_unreachable.sh — a PostgreSQL host that does not answer fails
# `loopguard serve` in seconds, with libpq's reason, instead of holding it
# for the kernel's own bound (a connect retries its SYN for about two
# minutes): the store's connection defaults (connect_timeout 10 s, TCP
# keepalives, tcp_user_timeout; src/store/driver_pg.c), the URL's own
# connect_timeout over them, and PGCONNECT_TIMEOUT over the default. While
# it waits, it says so after two seconds, and SIGTERM or Ctrl-C (SIGINT)
# ends it at once (cmd_serve.c, the start on a thread of its own).
#
# The host that does not answer: a listener on loopback whose accept queue
# (listen backlog 0) is held full by one connection it never accepts, so
# every later SYN is dropped, as by a host that is gone. No PostgreSQL
# server is needed: libpq never gets past the connect.
. "$(dirname "$0")/serve_lib.bash"

python3 - "$TMP/dead.port" <<'PY' &
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(0)
held = socket.create_connection(l.getsockname())  # the queue's one place, never accepted
open(sys.argv[1], "w").write(str(l.getsockname()[1]))
time.sleep(300)
PY
ALL_PIDS+=($!)
for i in $(seq 100); do [ -s "$TMP/dead.port" ] && break; sleep 0.05; done
port=$(cat "$TMP/dead.port") || fail "the unanswering listener did not start"
base="host=127.0.0.1 port=$port dbname=lg user=lg"

# try NAME LOW HIGH VAR=VALUE...: serve in that environment (its store
# LOOPGUARD_STORE's) fails (exit 1, libpq's "timeout expired") after LOW to
# HIGH seconds; at 60 s it is the kernel's bound, cut short (exit 124)
try() {
  local name=$1 low=$2 high=$3 t0=$SECONDS rc secs
  shift 3
  env "$@" timeout -k 5 60 "$LG_BIN" serve --listen 127.0.0.1:0 >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
  secs=$((SECONDS - t0))
  [ "$rc" = 1 ] || fail "$name: serve exited $rc after $secs s, not 1 (124: still connecting at 60 s): $(cat "$TMP/$name.err")"
  grep_q 'cannot connect to PostgreSQL (libpq: .*timeout expired' "$TMP/$name.err" ||
    fail "$name: not libpq's timeout: $(cat "$TMP/$name.err")"
  [ "$secs" -ge "$low" ] && [ "$secs" -le "$high" ] ||
    fail "$name: failed after $secs s, not $low to $high: $(cat "$TMP/$name.err")"
  note "$name: exit 1 after $secs s, $(head -c 200 "$TMP/$name.err")"
}
note "a host that does not answer: the default connect_timeout (10 s)"
try default 9 40 LOOPGUARD_STORE="postgres:$base"
note "the URL's connect_timeout wins"
try url 1 8 LOOPGUARD_STORE="postgres:$base connect_timeout=3"
note "PGCONNECT_TIMEOUT wins over the default"
try env 1 8 PGCONNECT_TIMEOUT=3 LOOPGUARD_STORE="postgres:$base"
# stopped SIG AFTER: serve, sent SIG AFTER seconds into its connect, exits 1
# within two seconds of it, saying it did not start (and, past two seconds,
# what it was waiting for)
stopped() {
  local sig=$1 after=$2 t0 secs pid
  t0=$SECONDS
  LOOPGUARD_STORE="postgres:$base" "$LG_BIN" serve --listen 127.0.0.1:0 >"$TMP/$sig.out" 2>"$TMP/$sig.err" &
  pid=$!
  sleep "$after"
  kill -"$sig" "$pid"
  wait "$pid"
  local rc=$?
  secs=$((SECONDS - t0))
  [ "$rc" = 1 ] || fail "$sig while connecting: exit $rc, not 1: $(cat "$TMP/$sig.err")"
  [ "$secs" -le $((${after%.*} + 2)) ] || fail "$sig while connecting: exited after $secs s"
  grep_q "while starting: not started" "$TMP/$sig.err" || fail "$sig: $(cat "$TMP/$sig.err")"
  if [ "${after%.*}" -ge 3 ]; then
    grep_q 'still starting: opening the PostgreSQL store (Ctrl-C gives up)' "$TMP/$sig.err" ||
      fail "$sig: no word of the wait: $(cat "$TMP/$sig.err")"
  else
    ! grep_q 'still starting' "$TMP/$sig.err" || fail "$sig: the wait told before two seconds"
  fi
  note "$sig after $after s: exit 1 after $secs s: $(tr '\n' ' ' <"$TMP/$sig.err")"
}
stopped TERM 3
stopped INT 1.5
echo "PASS serve_pg_unreachable.sh"
