#!/usr/bin/env bash
# serve_pg_crash.sh — a crash of PostgreSQL loses no acknowledged decision.
#
# Run under tests/pg/with-postgres.sh (pg_serve_pg_crash). Agents drive
# runs through `loopguard serve` on PostgreSQL and write down every answer
# as soon as they get it; in the middle of that PostgreSQL is restarted
# with `pg_ctl restart -m immediate` (the postmaster and every backend quit
# at once, without flushing: what a crash of the database server does).
# Every run must then have at least the calls and results it was answered
# for. With run transactions at synchronous_commit=off (the old default)
# the answers of the last WAL writer interval were lost.
. "$(dirname "$0")/../cli/serve_lib.bash"
[ "${LG_TEST_STORE:-}" = postgres ] && [ -n "${LG_PG_URL:-}" ] ||
  fail "run through tests/pg/with-postgres.sh with LG_TEST_STORE=postgres"
pgdir=${LG_PG_DIR:?run under tests/pg/with-postgres.sh}
[ -d "$pgdir/data" ] || fail "no data folder under $pgdir"

start_server A --store "$LG_PG_URL" ${LG_CRASH_SERVE_ARGS:-}
note "load on $A_URL, then pg_ctl restart -m immediate"
# The load runs until $TMP/stop appears (60 s at most); the crash comes
# once 100 answers are acknowledged (a fixed 2 s gave 42 on a machine
# busy with other tests), and the load goes on for 3 s after it.
python3 - "$A_URL" "$TMP/acked.jsonl" "$TMP/stop" >"$TMP/load.out" 2>&1 <<'EOF' &
import http.client, json, os, sys, threading, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
log = open(sys.argv[2], "a", buffering=1)
lock = threading.Lock()
give_up = time.time() + 60
def going():
    return time.time() < give_up and not os.path.exists(sys.argv[3])
def ack(**kw):
    with lock:
        log.write(json.dumps(kw) + "\n")   # one line per acknowledged answer, at once
def agent(i):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    def req(method, path, body):
        c.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    n = 0
    while going():
        n += 1
        run = "pgc-%d-%d" % (i, n)
        try:
            st, _ = req("POST", "/v1/runs", {"run_id": run})
            if st != 201: time.sleep(0.05); continue  # the database is down: try on
            ack(kind="run", run=run)
            for k in range(4):
                st, d = req("POST", "/v1/runs/%s/calls" % run, {"tool": "search", "args": {"q": "k%d" % k}})
                if st != 200: break
                ack(kind="call", run=run)
                st, d = req("POST", "/v1/runs/%s/results" % run, {"status": "progress"})
                if st != 200: break
                ack(kind="result", run=run)
        except (ConnectionError, http.client.HTTPException, OSError):
            c.close(); time.sleep(0.05)
ts = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
EOF
load=$!
for i in $(seq 300); do
  [ -s "$TMP/acked.jsonl" ] && [ "$(wc -l <"$TMP/acked.jsonl")" -ge 100 ] && break
  kill -0 "$load" 2>/dev/null || break
  sleep 0.1
done
before=$(wc -l <"$TMP/acked.jsonl")
[ "$before" -ge 100 ] || { touch "$TMP/stop"; fail "too little load before the crash ($before answers in 30 s): $(cat "$TMP/load.out")"; }
"$LG_PG_CTL" -m immediate -w -t 60 \
  -o "-k $pgdir -c listen_addresses= -c max_connections=60" restart >"$TMP/restart.log" 2>&1 ||
  { cat "$TMP/restart.log"; fail "pg_ctl restart failed"; }
note "PostgreSQL restarted with $before answers acknowledged before"
sleep 3
touch "$TMP/stop"
wait "$load"
acked=$(wc -l <"$TMP/acked.jsonl")
note "$acked answers acknowledged in all"

python3 - "$A_URL" "$TMP/acked.jsonl" <<'EOF' || fail "an acknowledged decision was lost in the crash of PostgreSQL"
import collections, http.client, json, sys, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
def get(path):
    for attempt in range(50):  # the server reconnects on its next call
        c.request("GET", path)
        r = c.getresponse()
        d = json.loads(r.read() or b"null")
        if r.status != 500: return r.status, d
        time.sleep(0.1)
    return r.status, d
calls = collections.Counter(); results = collections.Counter(); runs = []
for line in open(sys.argv[2]):
    a = json.loads(line)
    if a["kind"] == "run": runs.append(a["run"])
    elif a["kind"] == "call": calls[a["run"]] += 1
    elif a["kind"] == "result": results[a["run"]] += 1
bad = []
for run in runs:
    st, d = get("/v1/runs/" + run)
    if st != 200: bad.append("run %s lost (%d)" % (run, st)); continue
    k = d["counters"]
    if k["calls"] < calls[run]:
        bad.append("run %s: %d calls answered, %d stored" % (run, calls[run], k["calls"]))
    if k["results"] < results[run]:
        bad.append("run %s: %d results answered, %d stored" % (run, results[run], k["results"]))
print("checked %d runs, %d calls, %d results" % (len(runs), sum(calls.values()), sum(results.values())))
if bad:
    print("%d lost:" % len(bad)); print("\n".join(bad[:20])); sys.exit(1)
EOF

note "PostgreSQL down: a 500 that names it, not the store's URL or socket; the log has both"
# (docs/server.md "Errors": a client's answer never carries the store's
# connection string, nor libpq's words, which name its host or socket)
"$LG_PG_CTL" -m fast -w stop >/dev/null || fail "pg_ctl stop"
run=$(head -n 1 "$TMP/acked.jsonl" | jq_py 'd["run"]')
for i in 1 2 3; do # the first meets the lost connection, the next reconnect and fail
  curl -s -o "$TMP/down.json" -w '%{http_code}' "$A_URL/v1/runs/$run" >"$TMP/down.code"
  [ "$(cat "$TMP/down.code")" = 500 ] || fail "PostgreSQL down: GET the run: $(cat "$TMP/down.code") $(cat "$TMP/down.json")"
  msg=$(jq_py 'd["error"]["message"]' <"$TMP/down.json")
  case $msg in # (the first may be PostgreSQL's own FATAL at its shutdown, 57P01)
  "reading the run: "*"safe to retry"*) ;;
  *) fail "PostgreSQL down: the 500 does not say what failed: $msg" ;;
  esac
  case $msg in
  *"$pgdir"* | *dbname=* | *postgres:* | *libpq*) fail "PostgreSQL down: the 500 shows the operator's detail: $msg" ;;
  esac
done
[ "$(grep '"event":"request_failed"' "$TMP/A.err" | grep -c "libpq: connection to server on socket .*${pgdir##*/}")" -ge 1 ] ||
  fail "PostgreSQL down: no request_failed line with libpq's words: $(grep request_failed "$TMP/A.err" | tail -n 3)"
"$LG_PG_CTL" -l "$pgdir/server.log" -m fast -w restart >/dev/null 2>&1 || fail "pg_ctl restart"
stop_server A

note "PostgreSQL silent (its backends stopped): a 500 once query_timeout_ms has passed, not a hang; served again once it answers"
# (a stalled disk or a paused machine: the connection stays, no keepalive
# sees it; docs/store.md)
start_server B --store "$LG_PG_URL query_timeout_ms=1000"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{"run_id":"silent"}' "$B_URL/v1/runs")
[ "$code" = 201 ] || fail "PostgreSQL silent: the run was not created ($code)"
psql_q() { "$LG_PGBIN/psql" -h "$pgdir" -U "${LG_PG_URL##*user=}" -d lgtest -Atc "$1"; }
pids=$(psql_q "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()") ||
  fail "PostgreSQL silent: psql"
[ -n "$pids" ] || fail "PostgreSQL silent: no backend of B's"
kill -STOP $pids
call() { curl -s -o "$TMP/silent.json" -w '%{http_code}' --max-time 30 -H 'Content-Type: application/json' \
  -d '{"tool":"search","args":{"q":"x"}}' "$B_URL/v1/runs/silent/calls"; }
code=$(call)
kill -CONT $pids
[ "$code" = 500 ] || fail "PostgreSQL silent: a call answered $code, not 500 (000: no answer in 30 s): $(cat "$TMP/silent.json")"
grep_q "did not answer within 1000 ms" "$TMP/silent.json" || fail "PostgreSQL silent: the 500 does not name the deadline: $(cat "$TMP/silent.json")"
grep_q "nothing was decided or stored" "$TMP/silent.json" || # it waited on its BEGIN
  fail "PostgreSQL silent: the 500 does not say nothing was stored: $(cat "$TMP/silent.json")"
for i in $(seq 50); do code=$(call); [ "$code" = 200 ] && break; sleep 0.1; done
[ "$code" = 200 ] || fail "PostgreSQL answering again: a call answered $code: $(cat "$TMP/silent.json")"

note "a COMMIT slower than query_timeout_ms: a 500 that says the outcome is unknown, not that nothing was stored; the call was"
# (a commit that waits on a stalled disk or a synchronous standby: the
# deadline drops the connection after the COMMIT was sent, and the
# database commits anyway; here a deferred trigger sleeps at COMMIT)
psql_q "CREATE FUNCTION lg_test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS
  'BEGIN PERFORM pg_sleep(2); RETURN NULL; END';
CREATE CONSTRAINT TRIGGER lg_test_slow_commit AFTER UPDATE ON lg_runs DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.run_id = 'slowcommit') EXECUTE FUNCTION lg_test_slow_commit()" >/dev/null ||
  fail "slow COMMIT: creating the trigger"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{"run_id":"slowcommit"}' "$B_URL/v1/runs")
[ "$code" = 201 ] || fail "slow COMMIT: the run was not created ($code)"
code=$(curl -s -o "$TMP/slow.json" -w '%{http_code}' --max-time 30 -H 'Content-Type: application/json' \
  -d '{"tool":"search","args":{"q":"x"}}' "$B_URL/v1/runs/slowcommit/calls")
[ "$code" = 500 ] || fail "slow COMMIT: a call answered $code, not 500: $(cat "$TMP/slow.json")"
grep_q "did not answer within 1000 ms.*may have been stored.*the outcome is unknown" "$TMP/slow.json" ||
  fail "slow COMMIT: the 500 does not say the outcome is unknown: $(cat "$TMP/slow.json")"
! grep_q "nothing was decided or stored" "$TMP/slow.json" || fail "slow COMMIT: the 500 says nothing was stored: $(cat "$TMP/slow.json")"
for i in $(seq 50); do # the backend commits once its sleep is over
  calls=$(curl -s "$B_URL/v1/runs/slowcommit" | jq_py 'd["counters"]["calls"]')
  [ "$calls" = 1 ] && break
  sleep 0.1
done
[ "$calls" = 1 ] || fail "slow COMMIT: the call was not stored after all ($calls calls): the test no longer shows a lost answer"
psql_q "DROP TRIGGER lg_test_slow_commit ON lg_runs; DROP FUNCTION lg_test_slow_commit()" >/dev/null ||
  fail "slow COMMIT: dropping the trigger"
stop_server B

note "a PostgreSQL host gone silent: /healthz answers 503 within its own deadline (2 s), not query_timeout_ms's 60 s nor connect_timeout's 10 s; 200 once it answers"
# (a load balancer's probe gives up after a few seconds: a database that
# does not answer must read as unhealthy, not as a probe with no answer.)
# The host: a TCP relay to PostgreSQL's socket that, on SIGUSR1, stops
# relaying and answers no new connection (a paused machine, a network
# split: the kernel still takes the connection); on SIGUSR2 relays again.
python3 - "$pgdir/.s.PGSQL.5432" "$TMP/relay.port" <<'PY' &
import signal, socket, sys, threading
quiet = threading.Event()
signal.signal(signal.SIGUSR1, lambda *a: quiet.set())
signal.signal(signal.SIGUSR2, lambda *a: quiet.clear())
def pump(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            while quiet.is_set():  # held, as by a host that does not answer
                threading.Event().wait(0.05)
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve(c):
    while quiet.is_set():
        threading.Event().wait(0.05)
    u = socket.socket(socket.AF_UNIX)
    u.connect(sys.argv[1])
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(64)
open(sys.argv[2], "w").write(str(l.getsockname()[1]))
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
PY
relay=$!
ALL_PIDS+=($relay)
for i in $(seq 100); do [ -s "$TMP/relay.port" ] && break; sleep 0.05; done
[ -s "$TMP/relay.port" ] || fail "the relay did not start"
# one HTTP thread, so that every probe finds the connection the first made
start_server C --threads 1 --store "postgres:host=127.0.0.1 port=$(cat "$TMP/relay.port") dbname=lgtest user=${LG_PG_URL##*user=}"
code=$(curl -s -o "$TMP/health.json" -w '%{http_code}' "$C_URL/healthz")
[ "$code" = 200 ] || fail "PostgreSQL answering: /healthz $code: $(cat "$TMP/health.json")"
kill -USR1 $relay
timed_get() { # PATH OUT: GET C's PATH into OUT (30 s at most) -> $code, $ms
  local t0
  t0=$(date +%s%N)
  code=$(curl -s -o "$2" -w '%{http_code}' --max-time 30 "$C_URL$1")
  ms=$((($(date +%s%N) - t0) / 1000000))
}
probe() { # WHAT: /healthz is 503 within 6 s, its reason the store's silence
  timed_get /healthz "$TMP/health.json"
  [ "$code" = 503 ] || fail "$1: /healthz answered $code in $ms ms, not 503 (000: no answer in 30 s): $(cat "$TMP/health.json")"
  [ "$ms" -lt 6000 ] || fail "$1: /healthz took $ms ms (its deadline is 2 s)"
  grep_q '"reason":"the store does not answer' "$TMP/health.json" || fail "$1: /healthz's reason: $(cat "$TMP/health.json")"
}
probe "the host silent, the connection open"
grep_q "did not answer within 2000 ms (the probes' deadline)" "$TMP/C.err" ||
  fail "the host silent: the log does not name the probes' deadline: $(grep request_failed "$TMP/C.err" | tail -n 3)"
probe "the host silent, connecting again"
grep_q "reconnecting: PostgreSQL did not answer within 2000 ms" "$TMP/C.err" ||
  fail "the host silent, connecting again: the log does not say so: $(grep request_failed "$TMP/C.err" | tail -n 3)"
# a scrape too: answered in time, the server's own counters sent, and
# loopguard_store_up 0 (Prometheus gives up after 10 s by default)
timed_get /metrics "$TMP/metrics.txt"
[ "$code" = 200 ] || fail "the host silent: /metrics answered $code in $ms ms: $(head -c 300 "$TMP/metrics.txt")"
[ "$ms" -lt 6000 ] || fail "the host silent: /metrics took $ms ms (its store reads' deadline is 2 s)"
grep_q '^loopguard_store_up 0$' "$TMP/metrics.txt" || fail "the host silent: /metrics: $(grep store_up "$TMP/metrics.txt")"
grep_q '^loopguard_requests_total{route="healthz",code="503"} 2$' "$TMP/metrics.txt" ||
  fail "the host silent: /metrics lacks the server's own counters: $(grep 'requests_total{route="healthz"' "$TMP/metrics.txt")"
grep_q '"route":"metrics".*did not answer within 2000 ms' "$TMP/C.err" ||
  fail "the host silent: no request_failed line for /metrics: $(grep request_failed "$TMP/C.err" | tail -n 3)"
kill -USR2 $relay
for i in $(seq 50); do code=$(curl -s -o "$TMP/health.json" -w '%{http_code}' "$C_URL/healthz"); [ "$code" = 200 ] && break; sleep 0.1; done
[ "$code" = 200 ] || fail "PostgreSQL answering again: /healthz $code: $(cat "$TMP/health.json")"
curl -s "$C_URL/metrics" | grep_q '^loopguard_store_up 1$' || fail "PostgreSQL answering again: /metrics' loopguard_store_up is not 1"
stop_server C
echo "serve_pg_crash: all passed"
