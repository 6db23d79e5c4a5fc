#!/usr/bin/env bash
# serve_locked.sh — reads do not wait for writes, and /healthz tells the
# truth about writes (SQLite). Another process holds the store file's
# write lock (BEGIN IMMEDIATE) while a decision waits for it in the
# server's committer: GET /v1/runs/{id}, its trace, an operation, the run
# list and a budget answer at once (they read on the store's read-only
# connection, not behind the waiting write); /healthz answers 503 with a
# reason, and without the store's URL or path; once the lock is released,
# the waiting decision is made and /healthz is 200 again.
. "$(dirname "$0")/serve_lib.bash"
[ "${LG_TEST_STORE:-sqlite}" = sqlite ] || { echo "serve_locked: SQLite only"; exit 0; }
DB="$TMP/locked.db"
start_server A --store "sqlite:$DB"
U=$A_URL
curl -sf -H 'Content-Type: application/json' -XPOST "$U/v1/runs" -d '{"run_id":"r1"}' >/dev/null || fail "create run"
curl -sf -H 'Content-Type: application/json' -XPOST "$U/v1/runs/r1/calls" -d '{"tool":"t","args":{"a":1}}' >/dev/null || fail "call"
curl -sf -H 'Content-Type: application/json' -XPOST "$U/v1/operations/claim" -d '{"key":"k1","request_fingerprint":"f"}' >/dev/null || fail "claim"
curl -sf -H 'Content-Type: application/json' -XPUT "$U/v1/budgets/key:a" -d '{"limit_usd":1,"period":"daily"}' >/dev/null || fail "budget"
r=$(curl -s "$U/healthz")
echo "$r" | grep >/dev/null '"status":"ok"' || fail "healthz before: $r"
echo "$r" | grep >/dev/null '"writable":true' || fail "healthz before: $r"

note "another process takes the write lock until the checks are done (4.5 s at most: writes wait 5 s)"
python3 - "$DB" "$TMP/locked" "$TMP/release" <<'EOF' &
import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
c.execute("BEGIN IMMEDIATE")
open(sys.argv[2], "w").close()
end = time.monotonic() + 4.5
while time.monotonic() < end and not os.path.exists(sys.argv[3]):
    time.sleep(0.02)
c.execute("ROLLBACK")
EOF
holder=$!
for i in $(seq 100); do [ -e "$TMP/locked" ] && break; sleep 0.02; done
[ -e "$TMP/locked" ] || fail "the lock holder did not start"
# A decision that must wait for the lock, in the committer.
curl -s -o "$TMP/waiting.out" -w '%{http_code}' -H 'Content-Type: application/json' -XPOST "$U/v1/runs/r1/calls" \
  -d '{"tool":"t","args":{"a":2}}' >"$TMP/waiting.code" &
waiting=$!
sleep 0.5
t() { # NAME URL: prints the status and the seconds
  curl -s -o "$TMP/$1.out" -w '%{http_code} %{time_total}' "$2"
}
for probe in "run $U/v1/runs/r1" "trace $U/v1/runs/r1/trace" "op $U/v1/operations/k1" \
             "list $U/v1/runs" "budget $U/v1/budgets/key:a"; do
  set -- $probe
  r=$(t "$1" "$2")
  code=${r%% *} secs=${r#* }
  [ "$code" = 200 ] || fail "$1 while locked: HTTP $code: $(cat "$TMP/$1.out")"
  awk -v s="$secs" 'BEGIN { exit !(s < 0.1) }' || fail "$1 waited $secs s behind the write lock"
  note "$1 answered in $secs s while the write waits"
done
for i in 1 2 3 4 5; do
  r=$(t health "$U/healthz")
  [ "${r%% *}" = 503 ] && break
  note "healthz said ${r%% *} while the lock is held (try $i): $(cat "$TMP/health.out")"
  sleep 0.1
done
[ "${r%% *}" = 503 ] || fail "healthz while writes cannot proceed: ${r%% *} $(cat "$TMP/health.out")"
body=$(cat "$TMP/health.out")
echo "$body" | grep >/dev/null '"reason":"the store.s write lock has been held' || fail "healthz gives no reason: $body"
echo "$body" | grep >/dev/null "$DB" && fail "healthz shows the store's path: $body"
echo "$body" | grep >/dev/null 'sqlite:' && fail "healthz shows the store's URL: $body"
note "healthz: $body"
awk -v s="${r#* }" 'BEGIN { exit !(s < 0.5) }' || fail "healthz took ${r#* } s"
touch "$TMP/release"
wait "$holder"
wait "$waiting"
[ "$(cat "$TMP/waiting.code")" = 200 ] || fail "the waiting decision: $(cat "$TMP/waiting.code") $(cat "$TMP/waiting.out")"
r=$(curl -s -w ' %{http_code}' "$U/healthz")
[ "${r##* }" = 200 ] || fail "healthz after the lock was released: $r"
stop_server A
echo "serve_locked: all passed"
