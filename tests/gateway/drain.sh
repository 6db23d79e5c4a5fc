#!/usr/bin/env bash
# drain.sh — the gateway at SIGTERM (a deploy, a node drained): model calls
# in flight finish within --drain, then the server exits.
#
# Asserts: with --drain 8, a model call in flight when SIGTERM comes (the
# fake's "slow" model answers after 3 s), stream false and true, gets its
# whole answer (200, the stream's [DONE]); the listening socket is closed
# at once; stderr says what the server waits for; the log's stop line says
# drained; exit 0. A request on a connection kept open, sent during the
# drain, is answered with Connection: close. With a drain shorter than the call
# (LOOPGUARD_DRAIN_SECONDS=1), the call is cut at the bound and the exit
# status is 1, stderr naming --drain. A second SIGTERM cuts a long drain at
# once (exit 1). A bad --drain is refused before the start (exit 2).
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the fake upstream: FAKE
hdr=(-H 'Content-Type: application/json')
slow='{"model":"slow","messages":[{"role":"user","content":"x"}]'

# call NAME STREAM: a slow model call to server NAME in the background; its
# status in $TMP/NAME.STREAM.code, its body in $TMP/NAME.STREAM.body
call() {
  local url_var="${1}_URL"
  curl -s -N -o "$TMP/$1.$2.body" -w '%{http_code}' "${hdr[@]}" -d "$slow,\"stream\":$2}" \
    "${!url_var}/v1/chat/completions" >"$TMP/$1.$2.code" &
  CALLS+=($!)
}
# sigterm NAME: SIGTERM to server NAME, once its calls reached the upstream
sigterm() {
  local pid_var="${1}_PID" i
  for i in $(seq 40); do
    [ "$(stats 'd["models"].count("slow")')" -ge "$2" ] && break
    sleep 0.05
  done
  kill -TERM "${!pid_var}"
}
# wait_server NAME: its exit status in NAME_RC, the seconds it took since now in NAME_S
wait_server() {
  local pid_var="${1}_PID" rc=0 t0
  t0=$(date +%s.%N)
  wait "${!pid_var}" || rc=$?
  printf -v "${1}_RC" '%s' "$rc"
  printf -v "${1}_S" '%s' "$(python3 -c "print(round($(date +%s.%N) - $t0, 2))")"
}
seen=0

note "--drain 8: the model calls in flight at SIGTERM finish, stream and not; exit 0"
start_server long --store memory: --upstream "$FAKE/v1" --drain 8 --log "$TMP/long.log"
CALLS=()
call long false
call long true
seen=$((seen + 2))
sigterm long $seen
for i in $(seq 30); do # the listening socket closes at once (a moment for the signal's thread)
  code=$(curl -s -o /dev/null -w '%{http_code}' "$long_URL/healthz")
  [ "$code" = 000 ] && break
  sleep 0.1
done
[ "$code" = 000 ] || fail "a new connection was still taken 3 s into the drain: $code"
wait_server long
for p in "${CALLS[@]}"; do wait "$p"; done
[ "$long_RC" = 0 ] || fail "drained: exit $long_RC: $(tail -5 "$TMP/long.err")"
[ "$(cat "$TMP/long.false.code")" = 200 ] && grep -q '"choices"' "$TMP/long.false.body" ||
  fail "the call in flight (stream false): $(cat "$TMP/long.false.code") $(cat "$TMP/long.false.body")"
[ "$(cat "$TMP/long.true.code")" = 200 ] && grep -q '^data: \[DONE\]' "$TMP/long.true.body" ||
  fail "the call in flight (stream true): $(cat "$TMP/long.true.code") $(cat "$TMP/long.true.body")"
grep -q 'waiting up to 8 s for the requests in flight' "$TMP/long.err" ||
  fail "stderr does not say what the server waits for: $(cat "$TMP/long.err")"
grep -q '"event":"stop","drained":true' "$TMP/long.log" || fail "no drained stop line: $(tail -3 "$TMP/long.log")"

note "a request on a connection the agent kept open, sent during the drain: answered, with Connection: close"
# An SDK reuses its pooled connection: a request on it after SIGTERM (a
# slow call keeps the server draining) is served and the connection
# closed, not dropped.
start_server keep --store memory: --upstream "$FAKE/v1" --drain 8 --log "$TMP/keep.log"
python3 - "$keep_URL" "$keep_PID" "$FAKE" <<'PY' || fail "a kept connection during the drain"
import http.client, json, os, signal, sys, threading, time, urllib.parse, urllib.request
url, pid, fake = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = urllib.parse.urlparse(url)
hdr = {"Content-Type": "application/json"}
def body(model):
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]})
def slow_seen():
    with urllib.request.urlopen(fake + "/stats") as r:
        return json.load(r)["models"].count("slow")
kept = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
kept.request("POST", "/v1/chat/completions", body("finish"), hdr)
r = kept.getresponse(); r.read()
assert r.status == 200, "the first request: %d" % r.status
out = {}
def slow():
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    c.request("POST", "/v1/chat/completions", body("slow"), hdr)
    r = c.getresponse(); r.read(); out["slow"] = r.status
before = slow_seen()
t = threading.Thread(target=slow); t.start()
for _ in range(100):  # the slow call reached the upstream: the server will drain
    if slow_seen() > before: break
    time.sleep(0.05)
os.kill(pid, signal.SIGTERM)
time.sleep(0.3)
kept.request("POST", "/v1/chat/completions", body("finish"), hdr)
r = kept.getresponse(); b = r.read()
assert r.status == 200 and b'"choices"' in b, "during the drain: %d %r" % (r.status, b[:300])
assert (r.getheader("Connection") or "").lower() == "close", "during the drain: Connection %r" % r.getheader("Connection")
t.join()
assert out.get("slow") == 200, "the slow call in flight: %r" % out
PY
wait_server keep
[ "$keep_RC" = 0 ] || fail "the keep server exited $keep_RC: $(tail -5 "$TMP/keep.err")"
seen=$((seen + 1)) # its slow call, for the next sigterm's count

note "a drain shorter than the call (LOOPGUARD_DRAIN_SECONDS=1): cut at the bound, exit 1"
LOOPGUARD_DRAIN_SECONDS=1 start_server short --store memory: --upstream "$FAKE/v1" --log "$TMP/short.log"
CALLS=()
call short false
seen=$((seen + 1))
sigterm short $seen
wait_server short
for p in "${CALLS[@]}"; do wait "$p"; done
[ "$short_RC" = 1 ] || fail "a drain cut: exit $short_RC, wanted 1: $(tail -5 "$TMP/short.err")"
grep -q 'still in flight after 1 s (--drain); they were cut' "$TMP/short.err" || fail "stderr: $(cat "$TMP/short.err")"
[ "$(cat "$TMP/short.false.code")" != 200 ] || fail "a call cut by the drain answered 200: $(cat "$TMP/short.false.body")"
grep -q '"event":"stop","drained":false' "$TMP/short.log" || fail "the stop line: $(tail -3 "$TMP/short.log")"

note "a second SIGTERM cuts a long drain at once: exit 1"
start_server twice --store memory: --upstream "$FAKE/v1" --drain 600
CALLS=()
call twice true
seen=$((seen + 1))
sigterm twice $seen
sleep 0.3
kill -TERM "$twice_PID"
wait_server twice
for p in "${CALLS[@]}"; do wait "$p"; done
[ "$twice_RC" = 1 ] || fail "a second signal: exit $twice_RC, wanted 1: $(tail -5 "$TMP/twice.err")"
[ "$(python3 -c "print(int($twice_S < 5))")" = 1 ] || fail "a second signal: the server took $twice_S s to stop"
grep -q 'a second signal: the requests still in flight were cut' "$TMP/twice.err" || fail "stderr: $(cat "$TMP/twice.err")"

note "a bad --drain is refused before the start"
for v in 0 x 86401; do
  "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --drain "$v" >"$TMP/bad.out" 2>&1
  rc=$?
  [ "$rc" = 2 ] && grep -q -- "--drain: expected a number from 1 to 86400, got '$v'" "$TMP/bad.out" ||
    fail "--drain $v: exit $rc: $(cat "$TMP/bad.out")"
done
fakes_clean
echo "gateway drain: OK"
