#!/usr/bin/env bash
# regression.sh — incidents as regression tests: `loopguard runs export`
# writes the runs a real server stopped as traces behind `# expect` lines
# computed by replay, `loopguard test` passes on them and on the project's
# field fixtures, and fails — with a diff naming the key, the line and the
# call — on expectations broken on purpose: a wrong reason, a wrong stop
# call, a wrong count, an unknown key, a malformed line. Traces without an
# expectation are skipped, not passed. GET /v1/runs/{id}/regression gives
# the same bytes as the export, and a run resumed and stopped again gives a
# file that passes too.
source "$(dirname "$0")/serve_lib.bash"
pass=0 failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
expect_rc() { # NAME WANT CMD... ; stdout in $out, stderr in $err
  local name=$1 want=$2
  shift 2
  out=$("$@" 2>"$TMP/stderr"); local got=$?
  err=$(cat "$TMP/stderr")
  if [ "$got" = "$want" ]; then ok; else bad "$name: exit $got, wanted $want"; echo "$out"; echo "$err"; fi
}
has() { # NAME TEXT PATTERN
  if grep -qE -- "$3" <<<"$2"; then ok; else bad "$1: no /$3/ in: $2"; fi
}
post() { curl -sf -XPOST -H 'Content-Type: application/json' "$S_URL$1" -d "$2" >/dev/null || bad "POST $1"; }

start_server S --store "sqlite:$TMP/lg.db"
# A repeat loop, stopped on its 6th identical call.
post /v1/runs '{"run_id":"loop-1","group":"billing"}'
for i in 1 2 3 4 5 6; do
  post /v1/runs/loop-1/calls '{"tool":"charge_invoice","args":{"invoice_id":"INV-7"},"turn":'$i'}'
  [ $i -le 2 ] && post /v1/runs/loop-1/results '{"status":"progress","value":{"ok":false}}'
done
# A run stopped on a result (permission_denied), not on a call.
post /v1/runs '{"run_id":"perm x:1"}'
post '/v1/runs/perm%20x:1/calls' '{"tool":"delete_repo","args":{"name":"prod"}}'
post '/v1/runs/perm%20x:1/results' '{"status":"permission_denied"}'
# An active run: not exported.
post /v1/runs '{"run_id":"live-1"}'
post /v1/runs/live-1/calls '{"tool":"search","args":{"q":"a"}}'
stop_server S

db="sqlite:$TMP/lg.db"
expect_rc "export" 0 "$LG_BIN" runs export --store "$db" -o "$TMP/inc"
has "export progress" "$err" "exported 2 stopped runs"
n=$(ls "$TMP/inc" | wc -l)
[ "$n" = 2 ] && ok || bad "export wrote $n files, wanted 2: $(ls "$TMP/inc")"
[ -f "$TMP/inc/loop-1.jsonl" ] && ok || bad "no loop-1.jsonl"
perm=$(ls "$TMP/inc" | grep '^perm' || true)
has "unsafe id made safe" "$perm" '^perm_x_1-[0-9a-f]{8}\.jsonl$'
l1=$(head -n 1 "$TMP/inc/loop-1.jsonl")
has "expect line of the loop" "$l1" '^# expect \{"terminal_reason":"same_call_repeat","stopped_at_call":6,"executed_calls":2,"blocked_calls":3,'
has "per-call actions" "$l1" '"call_3_action":"block".*"call_6_action":"stop"'
lp=$(head -n 1 "$TMP/inc/$perm")
has "stop on a result: no stopped_at_call" "$lp" '^# expect \{"terminal_reason":"permission_denied","executed_calls":1,'
if grep -q stopped_at_call <<<"$lp"; then bad "stopped_at_call on a stop that was not a call"; else ok; fi
expect_rc "export --reason" 0 "$LG_BIN" runs export --store "$db" --reason permission_denied -o "$TMP/perm"
[ "$(ls "$TMP/perm" | wc -l)" = 1 ] && ok || bad "--reason kept $(ls "$TMP/perm")"
expect_rc "export --since 1h" 0 "$LG_BIN" runs export --store "$db" --since 1h -o "$TMP/recent"
[ "$(ls "$TMP/recent" | wc -l)" = 2 ] && ok || bad "--since 1h kept $(ls "$TMP/recent")"
expect_rc "export --since future" 0 "$LG_BIN" runs export --store "$db" --since 2999-01-01T00:00:00Z -o "$TMP/none"
[ "$(ls "$TMP/none" | wc -l)" = 0 ] && ok || bad "--since future kept $(ls "$TMP/none")"
expect_rc "export --since bad" 2 "$LG_BIN" runs export --store "$db" --since yesterday -o "$TMP/x"
expect_rc "export --bogus" 2 "$LG_BIN" runs export --bogus
expect_rc "export from no store" 1 "$LG_BIN" runs export --store "sqlite:$TMP/none.db" -o "$TMP/x2"
[ ! -e "$TMP/none.db" ] && ok || bad "export created a store"
[ ! -e "$TMP/x2" ] && ok || bad "export from no store made its folder"

# The exported tests hold.
expect_rc "test exported" 0 "$LG_BIN" test "$TMP/inc"
has "summary" "$out" '^2 passed, 0 failed, 0 skipped$'
# The field fixtures hold.
expect_rc "test fixtures" 0 "$LG_BIN" test "$LG_SOURCE_DIR/tests/data/fixtures"
has "fixtures summary" "$out" '^[1-9][0-9]* passed, 0 failed, 0 skipped$'

# Broken on purpose, one way per file, in a nested folder.
b="$TMP/broken/deeper"
mkdir -p "$b"
body=$(tail -n +2 "$TMP/inc/loop-1.jsonl")
mk() { { echo "$1"; echo "$body"; } >"$b/$2.jsonl"; }
mk '# expect {"terminal_reason":"cycle_detected"}' reason
mk '# expect {"terminal_reason":"same_call_repeat","stopped_at_call":4}' stopcall
mk '# expect {"executed_calls":3,"blocked_calls":3}' count
mk '# expect {"terminal_reason":"same_call_repeat","stoped_at_call":6}' typo
mk '# expect {"terminal_reason": same_call_repeat}' malformed
mk '# expect {"call_3_action":"execute"}' action
mk '# expect {"terminal_reason":null}' nostop
echo "$body" >"$b/noexpect.jsonl"
cp "$TMP/inc/loop-1.jsonl" "$TMP/broken/good.jsonl"
expect_rc "test broken" 1 "$LG_BIN" test "$TMP/broken"
has "broken summary" "$out" '^1 passed, 7 failed, 1 skipped$'
has "diff: reason" "$out" 'terminal_reason: expected cycle_detected, got same_call_repeat at line [0-9]+ \(call 6\)'
has "diff: stop call" "$out" 'stopped_at_call: expected the stop at call 4 \(line [0-9]+\), got same_call_repeat at line [0-9]+ \(call 6\)'
has "diff: count" "$out" 'executed_calls: expected 3, got 2'
has "diff: unknown key" "$out" 'unknown expectation key "stoped_at_call"'
has "diff: malformed" "$out" 'the # expect line is not a JSON object'
has "diff: action" "$out" 'call 3 \(line [0-9]+\): expected execute, got block'
has "diff: no stop" "$out" 'terminal_reason: expected no stop \(null\), got same_call_repeat'
has "skip reported" "$out" 'skip .*noexpect.jsonl \(no # expect line\)'
has "FAIL names the file" "$out" 'FAIL .*/deeper/typo.jsonl'
expect_rc "test --json" 1 "$LG_BIN" test --json "$TMP/broken"
has "json summary" "$out" '\{"type":"summary","passed":1,"failed":7,"skipped":1\}'
has "json failure" "$out" '"status":"fail","failures":\[\{"key":"stopped_at_call".*"expected":4,"got":6,"line":[0-9]+,"call":6'
expect_rc "only skipped" 0 "$LG_BIN" test "$b/noexpect.jsonl"
has "only skipped summary" "$out" '^0 passed, 0 failed, 1 skipped$'
expect_rc "test no args" 2 "$LG_BIN" test
expect_rc "test bad flag" 2 "$LG_BIN" test --nope "$TMP/inc"
expect_rc "test missing path" 1 "$LG_BIN" test "$TMP/does-not-exist"
mkdir -p "$TMP/empty"
expect_rc "test empty folder" 1 "$LG_BIN" test "$TMP/empty"
expect_rc "test --help" 0 "$LG_BIN" test --help
# Symbolic links: one to a file is read, once; one to a folder is not
# followed (a link to . counted every trace again at each of 32 levels,
# and two of them never ended).
mkdir -p "$TMP/links/sub"
cp "$TMP/inc/loop-1.jsonl" "$TMP/links/sub/a.jsonl"
ln -s sub/a.jsonl "$TMP/links/b.jsonl"
ln -s . "$TMP/links/sub/loop"
ln -s .. "$TMP/links/sub/up"
ln -s "$TMP/links" "$TMP/links/sub/abs"
expect_rc "test with links to folders" 0 timeout 20 "$LG_BIN" test "$TMP/links"
has "links: each trace once" "$out" '^2 passed, 0 failed, 0 skipped$'

# The server's route gives the file the export wrote.
if [ -n "${LG_REGRESSION_ROUTE:-1}" ]; then
  start_server S2 --store "$db"
  curl -sf "$S2_URL/v1/runs/loop-1/regression" -o "$TMP/route.jsonl" && ok || bad "GET regression"
  cmp -s "$TMP/route.jsonl" "$TMP/inc/loop-1.jsonl" && ok || { bad "route and export differ"; diff "$TMP/route.jsonl" "$TMP/inc/loop-1.jsonl" | head; }
  code=$(curl -s -o /dev/null -w '%{http_code}' "$S2_URL/v1/runs/nope/regression")
  [ "$code" = 404 ] && ok || bad "regression of a missing run: $code"
  # A run stopped, resumed by an operator and stopped again: its stop is
  # the last one, and the file it gives passes `loopguard test` (the
  # first stop's call was written before, and the test failed).
  S_URL=$S2_URL # post's server
  post /v1/runs '{"run_id":"again-1"}'
  for i in 1 2 3 4 5 6; do post /v1/runs/again-1/calls '{"tool":"t","args":{"a":1}}'; done
  post /v1/runs/again-1/resume '{}'
  for i in 1 2 3 4 5 6; do post /v1/runs/again-1/calls '{"tool":"t","args":{"a":1}}'; done
  curl -sf "$S2_URL/v1/runs/again-1/regression" -o "$TMP/again.jsonl" && ok || bad "GET regression of a resumed run"
  has "a resumed run's stop is its last" "$(head -n 1 "$TMP/again.jsonl")" '"stopped_at_call":12,'
  expect_rc "test a resumed run's file" 0 "$LG_BIN" test "$TMP/again.jsonl"
  stop_server S2
fi
echo "$pass passed, $failed failed"
[ $failed -eq 0 ]
