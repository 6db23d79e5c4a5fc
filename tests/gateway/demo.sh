#!/usr/bin/env bash
# demo.sh — the README's gateway demo, examples/gateway/demo.mjs (ctest
# gateway_demo), as a newcomer runs it:
#   - the example pins the `openai` the tests install (one version tested);
#   - the same agent runs to its own step cap straight at the demo's
#     stand-in provider, and through the gateway the charge runs twice at
#     most and the agent ends with the model's final answer;
#   - --keep leaves the gateway up: the run's trace replays to the run's
#     own counters, and SIGINT ends the demo and both its servers;
#   - a loopguard that is not there, and an unknown argument, are clear
#     errors.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the pinned clients: HERE
get() { jq_py "$1"; }
DEMO_SRC=$LG_SOURCE_DIR/examples/gateway

note "the example pins the openai package the tests install"
pin='d["packages"]["node_modules/openai"]["version"] + " " + d["packages"]["node_modules/openai"]["integrity"]'
demo_pin=$(get "$pin" <"$DEMO_SRC/package-lock.json") || fail "examples/gateway/package-lock.json: no openai"
test_pin=$(get "$pin" <"$HERE_SRC/package-lock.json") || fail "tests/gateway/package-lock.json: no openai"
[ "$demo_pin" = "$test_pin" ] || fail "the demo pins openai $demo_pin, the tests $test_pin"

# The demo beside the tests' node_modules, as `npm ci` would leave it.
mkdir "$TMP/demo"
cp "$DEMO_SRC/demo.mjs" "$TMP/demo/"
ln -s "$HERE/node_modules" "$TMP/demo/node_modules"
demo() { LOOPGUARD_BIN=$LG_BIN STEP_CAP=10 node "$TMP/demo/demo.mjs" "$@"; }

note "straight to the provider: the step cap; through the gateway: two charges and the final answer"
out=$(demo --json 2>"$TMP/demo.err") || fail "demo --json: $out $(cat "$TMP/demo.err")"
[ "$(echo "$out" | get 'd["direct"]["charges"]')" = 10 ] || fail "direct: $out"
[ "$(echo "$out" | get 'd["direct"]["ended"]')" = step_cap ] || fail "direct: $out"
[ "$(echo "$out" | get 'd["through_gateway"]["charges"]')" -le 2 ] || fail "through the gateway: $out"
[ "$(echo "$out" | get 'd["through_gateway"]["ended"]')" = final ] || fail "through the gateway: $out"
echo "$out" | get 'd["through_gateway"]["final"]' | grep_q "INV-1042" || fail "the final answer: $out"

note "the text a newcomer reads says the same"
text=$(demo 2>&1) || fail "demo: $text"
echo "$text" | grep >/dev/null "charge_card ran 10 times; the agent stopped at its own step cap" || fail "text (direct): $text"
echo "$text" | grep -Eq "charge_card ran [12] times?; the agent ended after" || fail "text (gateway): $text"
echo "$text" | grep >/dev/null "loopguard held 1 back before the agent saw it" || fail "text (the run): $text"

note "--keep: the run's trace replays to its counters; SIGINT ends the demo and its servers"
LOOPGUARD_BIN=$LG_BIN node "$TMP/demo/demo.mjs" --keep --json >"$TMP/keep.out" 2>"$TMP/keep.err" &
keep_pid=$! # node itself (a function run with & would be a subshell)
ALL_PIDS+=("$keep_pid")
for i in $(seq 200); do [ -s "$TMP/keep.out" ] && break; sleep 0.05; done
[ -s "$TMP/keep.out" ] || fail "demo --keep printed nothing: $(cat "$TMP/keep.err")"
trace_url=$(get 'd["through_gateway"]["trace"]' <"$TMP/keep.out")
gw=$(get 'd["gateway"]' <"$TMP/keep.out")
curl -sf "$trace_url" >"$TMP/run.jsonl" || fail "GET $trace_url"
curl -sf "${trace_url%/trace}" >"$TMP/run.json" || fail "GET ${trace_url%/trace}"
"$LG_BIN" replay --json "$TMP/run.jsonl" | tail -n 1 >"$TMP/replay.json" || fail "replay of the demo's trace"
same='{k: v for k, v in (d.get("envelope") or d)["counters"].items() if k != "elapsed_ms"}'
[ "$(get "$same" <"$TMP/replay.json")" = "$(get "$same" <"$TMP/run.json")" ] ||
  fail "the trace replays to $(cat "$TMP/replay.json"), the run is $(cat "$TMP/run.json")"
[ "$(get 'd["blocked_calls"]' <"$TMP/replay.json")" = 1 ] || fail "replay: $(cat "$TMP/replay.json")"
kill -INT "$keep_pid"
for i in $(seq 100); do kill -0 "$keep_pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$keep_pid" 2>/dev/null && fail "demo --keep still runs 5 s after SIGINT"
rc=0
wait "$keep_pid" || rc=$?
[ "$rc" = 0 ] || fail "demo --keep exited $rc on SIGINT: $(cat "$TMP/keep.err")"
for i in $(seq 100); do curl -s -o /dev/null "${gw%/v1}/healthz" || break; sleep 0.05; done
curl -s -o /dev/null "${gw%/v1}/healthz" && fail "the demo's loopguard still answers after SIGINT"

note "errors: the openai package not installed, no loopguard binary, an unknown argument"
mkdir "$TMP/bare"
cp "$DEMO_SRC/demo.mjs" "$TMP/bare/"
out=$(LOOPGUARD_BIN=$LG_BIN node "$TMP/bare/demo.mjs" 2>&1) && fail "ran without the openai package: $out"
echo "$out" | grep >/dev/null "the openai package is not installed beside it: run 'npm ci' in examples/gateway first" ||
  fail "no openai package: $out"
out=$(LOOPGUARD_BIN=$TMP/nothing-here node "$TMP/demo/demo.mjs" 2>&1) && fail "ran without a binary: $out"
echo "$out" | grep >/dev/null "did not start: no such program" || fail "no binary: $out"
out=$(demo --bogus 2>&1)
[ $? = 2 ] || fail "an unknown argument: $out"
echo "$out" | grep >/dev/null "unknown argument --bogus" || fail "an unknown argument: $out"
fakes_clean
echo "ok"
