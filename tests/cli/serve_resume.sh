#!/usr/bin/env bash
# serve_resume.sh — resuming a stopped run, over HTTP and from the CLI:
# a run stopped by a repeat is resumed (`loopguard runs resume` on the
# server's store, and POST /v1/runs/{id}/resume), its window starts again,
# the resume is a line of its trace and the trace replays to the same end;
# a run stopped by a cap or a cancel is refused by the CLI, with the
# reason, and nothing changes. The HTTP route's own answers (refusals
# included) are tests/data/http/resume (ctest http_cases).
source "$(dirname "$0")/serve_lib.bash"

store="sqlite:$TMP/resume.db"
start_server a --store "$store"
post() { curl -s -X POST -H 'Content-Type: application/json' "$a_URL$1" -d "$2"; }
code() { curl -s -o "$TMP/body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$a_URL$1" -d "$2"; }
call() { post "/v1/runs/$1/calls" '{"tool":"lookup","args":{"id":7}}' | jq_py 'd["action"]+"/"+d.get("reason","")'; }

post /v1/runs '{"run_id":"r1","policy":{"repeat":{"observe":false,"block":false,"stop":3}}}' >/dev/null
for i in 1 2; do [ "$(call r1)" = "execute/" ] || fail "call $i of r1 should execute"; done
[ "$(call r1)" = "stop/same_call_repeat" ] || fail "the third identical call should stop r1"

# From the CLI, on the server's own store.
out=$("$LG_BIN" runs resume r1 --progress-version 4 --note "new input file" --store "$store") ||
  fail "runs resume r1 failed: $out"
echo "$out" | grep >/dev/null "resumed run r1" || fail "runs resume says: $out"
[ "$(call r1)" = "execute/" ] || fail "after the resume the window starts again"
[ "$(call r1)" = "execute/" ] || fail "second call after the resume"
[ "$(call r1)" = "stop/same_call_repeat" ] || fail "the third identical call after the resume stops again"

# Over HTTP, as the operator (open mode).
[ "$(code /v1/runs/r1/resume '{"note":"again"}')" = 200 ] || fail "POST /resume: $(cat "$TMP/body")"
[ "$(jq_py 'd["action"]' <"$TMP/body")" = continue ] || fail "resume answers continue: $(cat "$TMP/body")"
[ "$(call r1)" = "execute/" ] || fail "after the HTTP resume"

# The trace holds both resumes and replays to the same decisions.
curl -s "$a_URL/v1/runs/r1/trace" >"$TMP/r1.jsonl"
[ "$(grep -c '"type":"resume"' "$TMP/r1.jsonl")" = 2 ] || fail "two resume lines: $(cat "$TMP/r1.jsonl")"
grep -q '"note":"new input file"' "$TMP/r1.jsonl" || fail "the note is in the trace"
"$LG_BIN" replay --json "$TMP/r1.jsonl" >"$TMP/r1.replay" || fail "replay of r1's trace"
actions=$(python3 -c 'import json,sys
print(" ".join(r["action"] for r in map(json.loads, sys.stdin) if r.get("type") == "call"))' <"$TMP/r1.replay")
[ "$actions" = "execute execute stop execute execute stop execute" ] || fail "replayed calls: $actions"

# Refused from the CLI: a cap, a cancel, a missing run. Nothing changes.
# (The same refusals over HTTP are tests/data/http/resume.)
post /v1/runs '{"run_id":"r2","policy":{"limits":{"max_steps":1}}}' >/dev/null
call r2 >/dev/null
[ "$(call r2)" = "stop/step_cap" ] || fail "r2 stops at its step cap"
if out=$("$LG_BIN" runs resume r2 --store "$store" 2>&1); then fail "runs resume r2 succeeded: $out"; fi
echo "$out" | grep >/dev/null "step_cap" || fail "the CLI's refusal names the stop: $out"
post /v1/runs '{"run_id":"r3"}' >/dev/null
post /v1/runs/r3/cancel '{"reason":"done for today"}' >/dev/null
if out=$("$LG_BIN" runs resume r3 --store "$store" 2>&1); then fail "a cancelled run was resumed: $out"; fi
[ "$(call r3)" = "stop/operator_cancelled_loop" ] || fail "r3 stays cancelled"
if out=$("$LG_BIN" runs resume nope --store "$store" 2>&1); then fail "a missing run was resumed"; fi
echo "$out" | grep >/dev/null '"nope"' || fail "names the missing run: $out"
"$LG_BIN" runs resume --store "$store" >/dev/null 2>&1
[ $? = 2 ] || fail "runs resume without a run id is bad usage"

stop_server a
echo "serve resume: ok"
