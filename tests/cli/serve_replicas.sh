#!/usr/bin/env bash
# serve_replicas.sh — two `loopguard serve` processes on one store behave
# as one server.
#
# Under tests/pg/with-postgres.sh (LG_TEST_STORE=postgres, LG_PG_URL) the
# store is a real PostgreSQL, which is what replicas on several machines
# share; run alone it is one SQLite file that two processes share. Checks:
# the calls of one run spread across the replicas get the decisions one
# server gives (the third identical call is blocked wherever it lands,
# also when twelve identical calls race on both at once); a cancel through
# one replica stops the run on the other; a group cancelled on one stops a
# run created later on the other; a ledger claim on one is held on the
# other; a shared budget spent through both at once is never overshot;
# and the trace of a run decided on both replicas, read from
# either, is whole and replays to the same decisions (traces are rows of
# the store).
. "$(dirname "$0")/serve_lib.bash"
STORE=$(test_store_url replicas)
P="rep$$-" # run ids, groups and keys of this invocation
start_server A --store "$STORE" --threads 2
start_server B --store "$STORE" --threads 2
note "replicas $A_URL and $B_URL on $(sed -n 's/^  store: *//p' "$A_OUT")"

act() { # URL RUN BODY -> action/reason/repeat
  curl -sf -XPOST "$1/v1/runs/$2/calls" -H 'Content-Type: application/json' -d "$3" |
    jq_py '"%s/%s/%s" % (d["action"], d.get("reason", ""), d.get("repeat"))'
}

note "one run, calls alternating between the replicas"
curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d "{\"run_id\":\"${P}1\"}" >/dev/null || fail create
call='{"tool":"charge","args":{"invoice":"INV-7"}}'
got1=$(act "$A_URL" ${P}1 "$call")
curl -sf -XPOST "$B_URL/v1/runs/${P}1/results" -H 'Content-Type: application/json' -d '{"status":"retryable"}' >/dev/null || fail result
got2=$(act "$B_URL" ${P}1 "$call")
curl -sf -XPOST "$A_URL/v1/runs/${P}1/results" -H 'Content-Type: application/json' -d '{"status":"retryable"}' >/dev/null || fail result
got3=$(act "$A_URL" ${P}1 "$call")
got4=$(act "$B_URL" ${P}1 "$call")
[ "$got1" = "execute//1" ] || fail "call 1 on A: $got1"
[ "$got2" = "execute//2" ] || fail "call 2 on B: $got2"
[ "$got3" = "block/same_call_repeat/3" ] || fail "call 3 on A: $got3"
[ "$got4" = "block/same_call_repeat/4" ] || fail "call 4 on B: $got4"

note "twelve identical calls racing on both replicas"
curl -sf -XPOST "$B_URL/v1/runs" -H 'Content-Type: application/json' -d "{\"run_id\":\"${P}race\"}" >/dev/null || fail create
racers=()
for i in $(seq 12); do
  if [ $((i % 2)) = 0 ]; then url=$A_URL; else url=$B_URL; fi
  act "$url" ${P}race '{"tool":"search","args":{"q":"x"}}' >"$TMP/race.$i" &
  racers+=($!)
done
wait "${racers[@]}" # not a bare wait: the servers are jobs too
sort "$TMP"/race.* | cut -d/ -f1 | uniq -c | awk '{print $2"="$1}' | tr '\n' ' ' >"$TMP/racesum"
# One server: calls 1-2 execute, 3-5 block, 6 and after stop.
[ "$(cat "$TMP/racesum")" = "block=3 execute=2 stop=7 " ] || fail "race: $(cat "$TMP/racesum")"
# The repeat counts of the calls decided before the stop: 1 to 6, once each.
repeats=$(cat "$TMP"/race.* | grep -v '^stop' | cut -d/ -f3 | sort -n | tr '\n' ' ')
[ "$repeats" = "1 2 3 4 5 " ] || fail "race repeats: $repeats"

note "a cancel through A stops the run on B"
curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d "{\"run_id\":\"${P}2\",\"group\":\"${P}g\"}" >/dev/null || fail create
[ "$(act "$B_URL" ${P}2 '{"tool":"t"}')" = "execute//1" ] || fail "${P}2 first call"
curl -sf -XPOST "$A_URL/v1/runs/${P}2/cancel" -H 'Content-Type: application/json' -d '{"reason":"stop it"}' >/dev/null || fail cancel
[ "$(act "$B_URL" ${P}2 '{"tool":"u"}' | cut -d/ -f1,2)" = "stop/operator_cancelled_loop" ] || fail "B did not stop ${P}2"

note "a group cancelled on B stops a run created later on A"
curl -sf -XPOST "$B_URL/v1/groups/${P}g2/cancel" -H 'Content-Type: application/json' -d '{}' >/dev/null || fail "group cancel"
curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d "{\"run_id\":\"${P}3\",\"group\":\"${P}g2\"}" >/dev/null || fail create
[ "$(act "$A_URL" ${P}3 '{"tool":"t"}' | cut -d/ -f1,2)" = "stop/operator_cancelled_loop" ] ||
  fail "A did not see the group's cancel"

note "a claim on A is held on B"
code=$(curl -s -o /dev/null -w '%{http_code}' -XPOST "$A_URL/v1/operations/claim" -H 'Content-Type: application/json' -d "{\"key\":\"${P}k\",\"request_fingerprint\":\"fp\"}")
[ "$code" = 201 ] || fail "claim on A: $code"
out=$(curl -s -XPOST "$B_URL/v1/operations/claim" -H 'Content-Type: application/json' -d "{\"key\":\"${P}k\",\"request_fingerprint\":\"fp\"}" | jq_py 'd["outcome"]')
[ "$out" = in_progress ] || fail "claim on B: $out"

note "a run decided on both replicas: its trace, read from either, replays the same"
curl -sf -XPOST "$A_URL/v1/runs" -H 'Content-Type: application/json' -d "{\"run_id\":\"${P}4\"}" >/dev/null || fail create
: >"$TMP/server.actions"
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 0 ]; then url=$B_URL; else url=$A_URL; fi
  act "$url" ${P}4 '{"tool":"lookup","args":{"id":9}}' | cut -d/ -f1,2 >>"$TMP/server.actions"
done
for side in A B; do
  url_var="${side}_URL"
  curl -sf "${!url_var}/v1/runs/${P}4/trace" >"$TMP/rep-4.$side.jsonl" || fail "trace from $side"
  ! grep -q '^# incomplete' "$TMP/rep-4.$side.jsonl" || fail "the trace from $side is incomplete"
  "$LG_BIN" replay --json "$TMP/rep-4.$side.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("type") == "call": print("%s/%s" % (d["action"], d.get("reason", "")))' >"$TMP/replay.actions"
  diff "$TMP/server.actions" "$TMP/replay.actions" || fail "the replay of the trace from $side differs from the servers"
done

note "one shared budget, spent through both replicas at once, is never overshot"
python3 - "$A_URL" "$B_URL" "$P" <<'EOF' || fail "the shared budget across replicas"
import http.client, json, sys, threading, urllib.parse
urls, P = sys.argv[1:3], sys.argv[3]
def conn(u):
    u = urllib.parse.urlsplit(u)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=30)
def req(c, method, path, body=None):
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")
scope = "team:%srace" % P
c = conn(urls[0])
st, _ = req(c, "PUT", "/v1/budgets/" + scope, {"limit_usd": 1.0, "period": "none"})
assert st == 200, st
runs = ["%sspend%d" % (P, i) for i in range(8)]
for i, run in enumerate(runs):
    st, d = req(conn(urls[i % 2]), "POST", "/v1/runs", {"run_id": run, "scopes": [scope]})
    assert st == 201, (st, d)
executed, errors, lock = [0], [], threading.Lock()
def agent(i, run):
    cs = [conn(u) for u in urls]
    k = 0
    try:
        while True:
            k += 1  # every request goes to the other replica than the last
            st, d = req(cs[k % 2], "POST", "/v1/runs/%s/model" % run,
                        {"input_tokens": 100, "max_tokens": 100, "cost_usd": 0.05})
            if st != 200: raise RuntimeError("model %d %s" % (st, d))
            if d["action"] != "execute":
                if d.get("reason") != "budget_exceeded": raise RuntimeError("stopped: %s" % d)
                return
            with lock: executed[0] += 1
            k += 1
            st, d = req(cs[k % 2], "POST", "/v1/runs/%s/usage" % run,
                        {"reservation_id": d["reservation_id"], "input_tokens": 100,
                         "output_tokens": 100, "cost_usd": 0.05})
            if st != 200: raise RuntimeError("usage %d %s" % (st, d))
    except Exception as e:
        with lock: errors.append("agent %d: %r" % (i, e))
ts = [threading.Thread(target=agent, args=(i, r)) for i, r in enumerate(runs)]
[t.start() for t in ts]; [t.join() for t in ts]
st, b = req(conn(urls[1]), "GET", "/v1/budgets/" + scope)
print("%d model calls executed across both replicas; the budget: %s" % (executed[0], b))
bad = errors[:5]
if executed[0] * 0.05 > 1.0 + 1e-9: bad.append("overshot: %d calls of 0.05 on a limit of 1.00" % executed[0])
if executed[0] < 19: bad.append("only %d of the 20 affordable calls ran" % executed[0])
if abs(b["spent_usd"] - executed[0] * 0.05) > 1e-9 or b["reserved_usd"] != 0:
    bad.append("the budget does not add up: %s" % b)
if bad:
    print("\n".join(bad)); sys.exit(1)
EOF

stop_server A
stop_server B
echo "serve_replicas: ok"
