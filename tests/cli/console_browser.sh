#!/usr/bin/env bash
# console_browser.sh — the console in Debian's chromium, driven by
# playwright-core (tests/browser/, pinned in its package-lock.json and
# installed here with `npm ci` when node_modules is missing): see
# tests/browser/console.test.mjs for what it checks. `loopguard serve`
# runs on a free port with tokens on and a temp SQLite store. Screenshots
# are kept in <build>/test-artifacts/console/. A missing chromium or
# node is a failure, never a skip. Bounded: 60 s, every process ended.
LG_TEST_TIMEOUT=${LG_TEST_TIMEOUT:-60}
source "$(dirname "$0")/serve_lib.bash"
browser_dir="$LG_SOURCE_DIR/tests/browser"
art="$(cd "$(dirname "$LG_BIN")" && pwd)/test-artifacts/console"
mkdir -p "$art"
chromium=${LG_CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || fail "no chromium at $chromium (apt-get install chromium; make deps installs it)"
command -v node >/dev/null || fail "no node (apt-get install nodejs)"
if [ ! -d "$browser_dir/node_modules/playwright-core" ]; then
  (cd "$browser_dir" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci in tests/browser failed"
fi

printf 'operator operator-token-%s-0123456789\nagent agent-token-%s-0123456789\n' "$$" "$$" >"$TMP/tokens"
chmod 600 "$TMP/tokens"
OP="operator-token-$$-0123456789" AG="agent-token-$$-0123456789"
start_server S --store "sqlite:$TMP/lg.db" --tokens "$TMP/tokens"
post() { curl -sf -XPOST -H "Authorization: Bearer $AG" -H 'Content-Type: application/json' "$S_URL$1" -d "$2" >/dev/null || fail "POST $1"; }
post /v1/runs '{"run_id":"loop-1","group":"billing"}'
post /v1/runs/loop-1/model '{"model":"gpt-x","input_tokens":1200,"max_tokens":300,"cost_usd":0.004,"turn":1}'
# each model call's usage costs half its worst case: the console's cost
# chart is the settled cost ($0.008), not the worst cases ($0.016)
post /v1/runs/loop-1/usage '{"input_tokens":1200,"output_tokens":100,"cost_usd":0.002}'
for i in 1 2 3 4 5 6; do
  post /v1/runs/loop-1/calls '{"tool":"charge_invoice","args":{"invoice_id":"INV-7"},"turn":'$i'}'
  [ $i -le 2 ] && post /v1/runs/loop-1/results '{"status":"progress","value":{"ok":false}}'
  [ $i -le 2 ] && post /v1/runs/loop-1/model '{"model":"gpt-x","input_tokens":1500,"max_tokens":300,"cost_usd":0.006,"turn":'$((i + 1))'}'
  [ $i -le 2 ] && post /v1/runs/loop-1/usage '{"input_tokens":1500,"output_tokens":120,"cost_usd":0.003}'
done
sleep 0.01
post /v1/runs '{"run_id":"live-1","group":"support"}'
post /v1/runs/live-1/calls '{"tool":"search","args":{"q":"refund policy"}}'
post /v1/runs/live-1/results '{"status":"progress","value":{"hits":3}}'
# A run stopped, resumed by an operator (with a note) and going on; its
# identical calls written with their keys in either order.
post /v1/runs '{"run_id":"again-1"}'
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then a='{"invoice_id":"INV-9","amount":5}'; else a='{"amount":5,"invoice_id":"INV-9"}'; fi
  post /v1/runs/again-1/calls '{"tool":"charge_invoice","args":'"$a"',"turn":'$i'}'
done
curl -sf -XPOST -H "Authorization: Bearer $OP" -H 'Content-Type: application/json' "$S_URL/v1/runs/again-1/resume" \
  -d '{"note":"fixed the invoice"}' >/dev/null || fail "POST resume"
post /v1/runs/again-1/calls '{"tool":"lookup","args":{"id":1},"turn":7}'
post /v1/runs/again-1/calls '{"tool":"lookup","args":{"id":2},"turn":8}'
# A run whose id and tool are long strings without a space.
long=$(printf 'r%.0s' $(seq 300))
post /v1/runs '{"run_id":"'"$long"'"}'
post "/v1/runs/$long/calls" '{"tool":"'"$(printf 't%.0s' $(seq 200))"'","args":{}}'
curl -sf -XPUT -H "Authorization: Bearer $OP" -H 'Content-Type: application/json' "$S_URL/v1/budgets/workspace:acme" \
  -d '{"limit_usd":5,"period":"daily"}' >/dev/null || fail "PUT budget"

setsid env LG_URL="${S_URL%/}" LG_OPERATOR_TOKEN="$OP" LG_AGENT_TOKEN="$AG" LG_ARTIFACTS="$art" LG_CHROMIUM="$chromium" \
  node "$browser_dir/console.test.mjs" >"$TMP/node.out" 2>&1 &
node_pid=$!
ALL_PIDS+=("$node_pid")
rc=0
wait "$node_pid" || rc=$?
kill -9 -- "-$node_pid" 2>/dev/null # chromium and anything else of its group
cat "$TMP/node.out"
stop_server S
echo "screenshots: $art"
[ "$rc" = 0 ] || exit 1
# The regression test the console downloaded holds as a regression test.
"$LG_BIN" test "$art/loop-1.jsonl" >"$TMP/lgtest.out" 2>&1 ||
  fail "loopguard test on the console's download: $(cat "$TMP/lgtest.out")"
grep -q "1 passed, 0 failed" "$TMP/lgtest.out" || fail "loopguard test: $(cat "$TMP/lgtest.out")"
