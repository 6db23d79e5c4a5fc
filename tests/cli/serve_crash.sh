#!/usr/bin/env bash
# serve_crash.sh — kill -9 under load loses no acknowledged decision.
#
# Agents drive runs through a server on a SQLite file (or PostgreSQL under
# tests/pg/with-postgres.sh): calls, results, ledger claims and cancels,
# and write down every answer they got, as soon as they got it. The server
# is killed with SIGKILL in the middle of that. A new server on the same
# store must then show everything that was acknowledged: each run has at
# least the calls it was answered for (at most one more per agent: the
# request in flight may have been stored and not answered), every claim
# answered "claimed" is in the ledger, every run whose cancel was answered
# is stopped; and each run continues where it was: the next identical call
# gets the next rung of the ladder.
. "$(dirname "$0")/serve_lib.bash"
STORE=$(test_store_url crash)

start_server A --store "$STORE"
note "load on $A_URL, then kill -9"
python3 - "$A_URL" "$TMP/acked.jsonl" >"$TMP/load.out" 2>&1 <<'EOF' &
import http.client, json, os, sys, threading, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
log = open(sys.argv[2], "a", buffering=1)
lock = threading.Lock()
def ack(**kw):
    with lock:
        log.write(json.dumps(kw) + "\n")   # one line per acknowledged answer, at once
def agent(i):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    def req(method, path, body):
        c.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    try:
        n = 0
        while True:
            n += 1
            run = "crash-%d-%d-%d" % (os.getpid(), i, n)
            st, _ = req("POST", "/v1/runs", {"run_id": run})
            if st != 201: raise SystemExit("create %d" % st)
            ack(kind="run", run=run)
            for k in range(6):
                # two different calls, then the same one again and again
                args = {"q": "same"} if k >= 2 else {"q": "k%d" % k}
                st, d = req("POST", "/v1/runs/%s/calls" % run, {"tool": "search", "args": args})
                if st != 200: raise SystemExit("call %d %s" % (st, d))
                ack(kind="call", run=run, action=d["action"], repeat=d.get("repeat"), same=k >= 2)
                if d["action"] == "execute":
                    st, d = req("POST", "/v1/runs/%s/results" % run, {"status": "progress"})
                    if st != 200: raise SystemExit("result %d %s" % (st, d))
                    ack(kind="result", run=run)
            key = "crash-key-%d-%d-%d" % (os.getpid(), i, n)
            st, d = req("POST", "/v1/operations/claim", {"key": key, "request_fingerprint": "fp"})
            if st == 201: ack(kind="claim", key=key)
            if n % 3 == 0:
                st, d = req("POST", "/v1/runs/%s/cancel" % run, {"reason": "crash-test"})
                if st == 200: ack(kind="cancel", run=run)
    except (ConnectionError, http.client.HTTPException, OSError):
        return  # the server died: expected
ts = [threading.Thread(target=agent, args=(i,)) for i in range(6)]
[t.start() for t in ts]; [t.join() for t in ts]
EOF
load=$!
# The kill comes once the load is going (more than 50 answers, however
# slow the machine: a sanitizer build beside other tests took more than
# the 1.5 s this waited before), and a moment later, in mid-flight.
for _ in $(seq 600); do
  [ "$(wc -l <"$TMP/acked.jsonl" 2>/dev/null || echo 0)" -gt 50 ] && break
  sleep 0.05
done
sleep 0.3
kill -9 "$A_PID"
wait "$load"
wait "$A_PID" 2>/dev/null
acked=$(wc -l <"$TMP/acked.jsonl")
[ "$acked" -gt 50 ] || fail "too little load before the kill ($acked answers): $(cat "$TMP/load.out")"
note "$acked answers acknowledged before the kill"

start_server B --store "$STORE"
note "checking every acknowledged answer on the restarted server $B_URL"
python3 - "$B_URL" "$TMP/acked.jsonl" <<'EOF' || fail "an acknowledged decision was lost"
import collections, http.client, json, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
def get(path, body=None, method="GET"):
    c.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")
calls = collections.Counter(); results = collections.Counter()
last_same = {}; runs = set(); cancelled = set(); claims = []
for line in open(sys.argv[2]):
    a = json.loads(line)
    if a["kind"] == "run": runs.add(a["run"])
    elif a["kind"] == "call":
        calls[a["run"]] += 1
        if a["same"] and a["action"] != "stop": last_same[a["run"]] = a["repeat"]
    elif a["kind"] == "result": results[a["run"]] += 1
    elif a["kind"] == "claim": claims.append(a["key"])
    elif a["kind"] == "cancel": cancelled.add(a["run"])
bad = []
for run in runs:
    st, d = get("/v1/runs/" + run)
    if st != 200: bad.append("run %s lost (%d)" % (run, st)); continue
    k = d["counters"]
    # at least what was answered, at most one more (answered to nobody)
    if not (calls[run] <= k["calls"] <= calls[run] + 1):
        bad.append("run %s: %d calls answered, %d stored" % (run, calls[run], k["calls"]))
    if not (results[run] <= k["results"] <= results[run] + 1):
        bad.append("run %s: %d results answered, %d stored" % (run, results[run], k["results"]))
    if run in cancelled and d["status"] != "stopped":
        bad.append("run %s: cancel answered but the run is %s" % (run, d["status"]))
    # the run continues where it was: the next identical call is the next rung
    if d["status"] == "active" and run in last_same:
        st, n = get("/v1/runs/%s/calls" % run, {"tool": "search", "args": {"q": "same"}}, "POST")
        if st != 200 or n["action"] != "stop" and n["repeat"] < last_same[run] + 1:
            bad.append("run %s: after restart repeat %s, before %d" % (run, n.get("repeat"), last_same[run]))
for key in claims:
    st, d = get("/v1/operations/" + key)
    if st != 200 or d["state"] not in ("in_progress", "unknown_outcome"):
        bad.append("claim %s lost: %d %s" % (key, st, d))
print("checked %d runs, %d calls, %d claims, %d cancels" % (len(runs), sum(calls.values()), len(claims), len(cancelled)))
if bad:
    print("\n".join(bad[:20])); sys.exit(1)
EOF
note "the traces survived too: whole, and replaying to the stored outcome"
python3 - "$B_URL" "$TMP/acked.jsonl" "$LG_BIN" "$TMP" <<'EOF' || fail "a trace lost lines in the crash"
import collections, http.client, json, subprocess, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
lg, tmp = sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
def get(path):
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()
calls = collections.Counter(); runs = []
for line in open(sys.argv[2]):
    a = json.loads(line)
    if a["kind"] == "run": runs.append(a["run"])
    elif a["kind"] == "call": calls[a["run"]] += 1
bad = []
sample = runs[:: max(1, len(runs) // 15)]  # about 15 runs, old and new
for run in sample:
    st, trace = get("/v1/runs/%s/trace" % run)
    if st != 200: bad.append("trace of %s: %d" % (run, st)); continue
    if "# incomplete" in trace: bad.append("trace of %s is incomplete" % run)
    n = sum('"type":"call"' in l for l in trace.splitlines())
    # what was answered, the one in flight at the kill, and the probe call
    if not calls[run] <= n <= calls[run] + 2:
        bad.append("trace of %s: %d calls, %d answered" % (run, n, calls[run]))
    path = "%s/%s.jsonl" % (tmp, run)
    open(path, "w").write(trace)
    p = subprocess.run([lg, "replay", "--json", path], capture_output=True, text=True)
    if p.returncode not in (0, 3):
        bad.append("replay of %s: exit %d %s" % (run, p.returncode, p.stderr[:300])); continue
    summary = [json.loads(l) for l in p.stdout.splitlines() if '"type":"summary"' in l][-1]
    st, d = get("/v1/runs/" + run)
    d = json.loads(d)
    want = d.get("terminal_reason") if d["status"] == "stopped" else None
    if summary.get("terminal_reason") != want:
        bad.append("replay of %s ends with %s, the store says %s" % (run, summary.get("terminal_reason"), want))
print("checked the traces of %d runs" % len(sample))
if bad:
    print("\n".join(bad[:20])); sys.exit(1)
EOF
stop_server B
echo "serve_crash: ok"
