#!/usr/bin/env bash
# serve_curl.sh — the examples work as written: every ```sh block of
# examples/curl.md runs, in order, in one shell, against a real server,
# and says what the document says it says; then the Python demo agent of
# examples/python/ runs against it and is stopped by the guard.
. "$(dirname "$0")/serve_lib.bash"
start_server A --store "sqlite:$TMP/curl.db"

note "examples/curl.md, block by block"
awk '/^```sh$/ { on = 1; next } /^```/ { on = 0 } on' "$LG_SOURCE_DIR/examples/curl.md" >"$TMP/curl.sh"
[ "$(wc -l <"$TMP/curl.sh")" -gt 20 ] || fail "no sh blocks found in examples/curl.md"
TMPDIR=$TMP LG=$A_URL LOOPGUARD=$LG_BIN bash -e "$TMP/curl.sh" >"$TMP/curl.out" 2>&1 || {
  cat "$TMP/curl.out"
  fail "a block of examples/curl.md failed"
}
out="$TMP/curl.out"
grep -q '"action":"block","reason":"same_call_repeat"' "$out" || fail "no block in the curl tour"
grep -q '"action":"stop","reason":"same_call_repeat"' "$out" || fail "no stop in the curl tour"
grep -q 'stopped at line' "$out" || fail "the trace did not replay to a stop"
grep -q '"terminal_reason":"operator_cancelled_loop","operator_note":"runaway spend"' "$out" ||
  fail "the cancel did not stop the run"
grep -q '"outcome":"replay"' "$out" || fail "the ledger did not replay"
grep -q '"message":"args: expected an object, got an array"' "$out" || fail "the error example"
grep -q 'loopguard_decisions_total' "$out" || fail "no metrics"

note "examples/python/demo.py is stopped by the guard"
python3 "$LG_SOURCE_DIR/examples/python/demo.py" --url "$A_URL" >"$TMP/demo.out" 2>&1 ||
  { cat "$TMP/demo.out"; fail "demo.py exit $?"; }
grep -q '"terminal_reason": "same_call_repeat"' "$TMP/demo.out" || fail "demo: no terminal envelope"
grep -q 'guard: BLOCK' "$TMP/demo.out" || fail "demo: never blocked"
rid=$(sed -n 's/^run \([^ ]*\) .*/\1/p' "$TMP/demo.out")
curl -sf "$A_URL/v1/runs/$rid/trace" >"$TMP/demo.jsonl" || fail "demo trace"
timeline=$("$LG_BIN" replay "$TMP/demo.jsonl") # whole: grep -q would close the pipe early
grep -q "stopped at line .*: same_call_repeat" <<<"$timeline" || fail "demo trace replay"

note "the demo says so when no server is there"
rc=0; python3 "$LG_SOURCE_DIR/examples/python/demo.py" --url http://127.0.0.1:9 >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] || fail "demo without a server: exit $rc, wanted 2"
stop_server A
echo "serve_curl: ok"
