#!/usr/bin/env bash
# serve_retain.sh — `loopguard serve --retain-runs DURATION`: the server
# purges the runs not written to for DURATION by itself (a container's
# store is out of cron's reach). A run left alone goes, with its trace; a
# run still written to stays; the log says how many went; a bad duration
# is bad usage, naming the flag or the variable.
source "$(dirname "$0")/serve_lib.bash"

store="sqlite:$TMP/retain.db"
start_server a --store "$store" --retain-runs 2s --log "$TMP/a.log"
grep -q "runs:    purged 2s after their last write" "$TMP/a.out" || fail "the banner does not say: $(cat "$TMP/a.out")"
post() { curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$a_URL$1" -d "$2"; }
status() { curl -s -o /dev/null -w '%{http_code}' "$a_URL/v1/runs/$1"; }

[ "$(post /v1/runs '{"run_id":"left"}')" = 201 ] || fail "creating run left"
[ "$(post /v1/runs '{"run_id":"busy"}')" = 201 ] || fail "creating run busy"
[ "$(post /v1/runs/left/calls '{"tool":"lookup","args":{"id":1}}')" = 200 ] || fail "a call of left"
[ "$(status left)" = 200 ] || fail "run left is not there at first"
gone=
for i in $(seq 100); do # 10 s: the purge comes every second, for runs idle 2 s
  [ "$(post /v1/runs/busy/calls "{\"tool\":\"lookup\",\"args\":{\"id\":$i}}")" = 200 ] || fail "a call of busy"
  [ "$(status left)" = 404 ] && { gone=1; break; }
  sleep 0.1
done
[ -n "$gone" ] || fail "run left was never purged: $(cat "$TMP/a.log")"
[ "$(status busy)" = 200 ] || fail "run busy, written all along, was purged"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$a_URL/v1/runs/left/trace")" = 404 ] || fail "left's trace is still there"
grep '"runs_purged"' "$TMP/a.log" | grep_q '"older_than_ms":2000' || fail "no runs_purged line in the log: $(cat "$TMP/a.log")"
grep -q '"retain_runs_ms":2000' "$TMP/a.log" || fail "the start line does not say it"
stop_server a

for bad in soon 500ms; do
  out=$("$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --retain-runs "$bad" 2>&1)
  [ $? = 2 ] || fail "--retain-runs $bad was taken: $out"
  echo "$out" | grep >/dev/null -- "--retain-runs wants a duration of a second or more.*'$bad'" || fail "--retain-runs $bad: $out"
done
out=$(LOOPGUARD_RETAIN_RUNS=soon "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: 2>&1)
[ $? = 2 ] || fail "LOOPGUARD_RETAIN_RUNS=soon was taken: $out"
echo "$out" | grep >/dev/null "LOOPGUARD_RETAIN_RUNS wants" || fail "LOOPGUARD_RETAIN_RUNS=soon: $out"
echo "serve retain: ok"
