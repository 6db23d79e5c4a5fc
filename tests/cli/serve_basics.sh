#!/usr/bin/env bash
# serve_basics.sh — `loopguard serve` as an operator meets it: --help lists
# every flag with its default; the first lines say where it listens, which
# store (without a password) and whether auth is on; no tokens and a
# non-loopback address is a refusal to start; bad flags are usage errors;
# SIGHUP reopens the log; SIGTERM drains requests in flight and exits 0.
. "$(dirname "$0")/serve_lib.bash"

note "--help lists every flag with its default"
help=$("$LG_BIN" serve --help) || fail "serve --help failed"
for flag in --listen --store --tokens --prices --policy --threads --max-body --timeout --log; do
  grep -q -- "$flag" <<<"$help" || fail "--help does not mention $flag"
done
grep -q "127.0.0.1:8787" <<<"$help" || fail "--help lacks the default listen address"
grep -q "sqlite:loopguard.db" <<<"$help" || fail "--help lacks the default store"
grep -q "1048576" <<<"$help" || fail "--help lacks the default body limit"
grep -q "LOOPGUARD_GATEWAY_WORKERS" <<<"$help" || fail "--help does not name the gateway's variables"

note "bad usage exits 2"
rc=0; "$LG_BIN" serve --no-such-flag >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] || fail "unknown flag: exit $rc, wanted 2"
rc=0; "$LG_BIN" serve --threads zero >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] || fail "bad --threads: exit $rc, wanted 2"
# $LOOPGUARD_RESERVATION_TTL_MS is checked as --reservation-ttl is (it was
# read with atoll: 5, -5 and abc started a server).
for v in 5 -5 abc 86400001; do
  rc=0; timeout 10 "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --reservation-ttl "$v" >/dev/null 2>"$TMP/ttl.err" || rc=$?
  [ $rc = 2 ] || fail "--reservation-ttl $v: exit $rc, wanted 2"
  rc=0; LOOPGUARD_RESERVATION_TTL_MS=$v timeout 10 "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: >/dev/null 2>"$TMP/ttl.err" || rc=$?
  [ $rc = 2 ] && grep -q "LOOPGUARD_RESERVATION_TTL_MS: expected a number from 1000 to 86400000, got '$v'" "$TMP/ttl.err" ||
    fail "LOOPGUARD_RESERVATION_TTL_MS=$v: exit $rc, wanted 2 naming the variable: $(cat "$TMP/ttl.err")"
done

note "--trace-memory is ignored, whatever its value (it exited 2 below 1 MiB)"
for v in 1000 abc 4194304; do
  rc=0; timeout 10 "$LG_BIN" serve --listen 0.0.0.0:0 --store memory: --trace-memory "$v" >/dev/null 2>"$TMP/tm.err" || rc=$?
  [ $rc = 1 ] && grep -q refusing "$TMP/tm.err" || fail "--trace-memory $v: exit $rc, wanted the start to go on (to its refusal of 0.0.0.0): $(cat "$TMP/tm.err")"
done
rc=0; timeout 10 "$LG_BIN" serve --listen 0.0.0.0:0 --store memory: --trace-memory=1 >/dev/null 2>"$TMP/tm.err" || rc=$?
[ $rc = 1 ] || fail "--trace-memory=1: exit $rc: $(cat "$TMP/tm.err")"

note "no tokens and a non-loopback address: refused"
rc=0; "$LG_BIN" serve --listen 0.0.0.0:0 --store memory: >"$TMP/refuse.out" 2>&1 || rc=$?
[ $rc = 1 ] || fail "binding 0.0.0.0 without tokens: exit $rc, wanted 1"
grep -q "refusing" "$TMP/refuse.out" || fail "no reason given: $(cat "$TMP/refuse.out")"

note "a bad price file fails at start, naming the file"
echo '{}' >"$TMP/noprices.json"
rc=0; "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --prices "$TMP/noprices.json" >"$TMP/np.out" 2>&1 || rc=$?
[ $rc = 1 ] || fail "bad price file: exit $rc"
grep -q "noprices.json" "$TMP/np.out" || fail "bad price file not named: $(cat "$TMP/np.out")"

note "a bad store fails at start"
rc=0; "$LG_BIN" serve --listen 127.0.0.1:0 --store nosuch:x >"$TMP/bad.out" 2>&1 || rc=$?
[ $rc = 1 ] || fail "bad store: exit $rc"

note "the banner: URL, store, auth, policy, prices"
echo '{"repeat":{"block":4}}' >"$TMP/policy.json"
echo '{"models": {"small": {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.5}}}' >"$TMP/prices.json"
start_server A --store "sqlite:$TMP/a.db" --log "$TMP/a.log" --policy "$TMP/policy.json" \
  --prices "$TMP/prices.json" --threads 2
head -n 1 "$A_OUT" | grep_q "listening on http://127.0.0.1:" || fail "first line: $(head -n 1 "$A_OUT")"
grep -q "store:   sqlite:$TMP/a.db" "$A_OUT" || fail "no store line"
grep -q "auth:    off" "$A_OUT" || fail "no auth line"
grep -q "policy:  $TMP/policy.json" "$A_OUT" || fail "no policy line"
grep -q "prices:  1 models from $TMP/prices.json" "$A_OUT" || fail "no prices line: $(cat "$A_OUT")"
grep -q '"event":"start"' "$TMP/a.log" || fail "no start-up block in the log"
health=$(curl -sf "$A_URL/healthz") || fail "healthz failed"
grep -q '"status":"ok"' <<<"$health" || fail "healthz: $health"
block=$(curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d '{"run_id":"p1"}' | jq_py 'd["policy"]["repeat"]["block"]')
# serve_lib.bash's jq_url (the gateway tests' polls): GET and evaluate in
# the evaluator, and an error status fails it as curl -sf would
[ "$(jq_url "$A_URL/v1/runs/p1" 'd["run_id"]')" = p1 ] || fail "jq_url: $(jq_url "$A_URL/v1/runs/p1" 'd' 2>&1)"
jq_url "$A_URL/v1/runs/no-such-run" 'd' >/dev/null 2>&1 && fail "jq_url: a 404 did not fail"
[ "$block" = 4 ] || fail "--policy not applied to new runs: block=$block"

note "SIGHUP reopens the log"
curl -sf -XPOST "$A_URL/v1/runs/p1/cancel" -H 'Content-Type: application/json' -d '{"reason":"before rotation"}' >/dev/null || fail cancel
mv "$TMP/a.log" "$TMP/a.log.1"
kill -HUP "$A_PID"
for i in $(seq 50); do [ -s "$TMP/a.log" ] && break; sleep 0.05; done
grep -q '"event":"log_reopened"' "$TMP/a.log" || fail "the log was not reopened"
curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d '{"run_id":"p2"}' >/dev/null
curl -sf -XPOST "$A_URL/v1/runs/p2/cancel" -H 'Content-Type: application/json' -d '{"reason":"after rotation"}' >/dev/null
# the stop line may follow the answer: wait for it (up to 5 s), no fixed nap
for i in $(seq 100); do grep -q '"operator_note":"after rotation"' "$TMP/a.log" && break; sleep 0.05; done
grep -q '"operator_note":"after rotation"' "$TMP/a.log" || fail "a stop after SIGHUP went elsewhere"
grep -q '"operator_note":"before rotation"' "$TMP/a.log.1" || fail "the old log lost its stop line"
grep -q '"guard":"kill_switch"' "$TMP/a.log" || fail "the stop line does not name the guard"

note "SIGTERM drains requests in flight, closes the store, exits 0"
python3 - "$A_URL" >"$TMP/load.out" 2>&1 <<'EOF' &
import http.client, json, sys, threading, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
ok, refused, bad = [0], [0], []
def agent(i):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    run = "drain-%d" % i
    try:
        c.request("POST", "/v1/runs", json.dumps({"run_id": run}), {"Content-Type": "application/json"})
        c.getresponse().read()
        for k in range(100000):
            c.request("POST", "/v1/runs/%s/calls" % run, json.dumps({"tool": "t", "args": {"k": k}}), {"Content-Type": "application/json"})
            r = c.getresponse(); body = r.read()
            if r.status != 200: bad.append((r.status, body)); return
            ok[0] += 1
            c.request("POST", "/v1/runs/%s/results" % run, json.dumps({"status": "progress"}), {"Content-Type": "application/json"})
            r = c.getresponse(); r.read()
    except (ConnectionError, http.client.HTTPException, OSError):
        refused[0] += 1   # the server went away between requests: fine
ts = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("ok=%d refused=%d bad=%s" % (ok[0], refused[0], bad))
sys.exit(1 if bad else 0)
EOF
load=$!
sleep 0.7
stop_server A
wait $load || fail "requests in flight were cut or refused badly: $(cat "$TMP/load.out")"
grep -q '"event":"stop","drained":true' "$TMP/a.log" || fail "no drained stop in the log"

note "the store survived: a new server continues where it was"
start_server B --store "sqlite:$TMP/a.db"
st=$(curl -sf "$B_URL/v1/runs/p1" | jq_py 'd["status"]')
[ "$st" = stopped ] || fail "p1 is $st after restart"
stop_server B

note "tokens from the environment: auth on; a password is hidden"
LOOPGUARD_TOKENS="agent aaaaaaaaaaaaaaaaaaaa;operator bbbbbbbbbbbbbbbbbbbbbb" \
  start_server C --store "sqlite:$TMP/c.db"
grep -q "auth:    on (2 tokens" "$C_OUT" || fail "auth not on: $(cat "$C_OUT")"
grep -q "aaaaaaaaaaaaaaaaaaaa" "$C_OUT" "$TMP/C.err" && fail "a token was printed"
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$C_URL/v1/runs" -H 'Content-Type: application/json' -d '{}')
[ "$code" = 401 ] || fail "no token: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer aaaaaaaaaaaaaaaaaaaa' -XPOST "$C_URL/v1/runs" -H 'Content-Type: application/json' -d '{}')
[ "$code" = 201 ] || fail "agent token: $code"
stop_server C
echo "serve_basics: ok"
