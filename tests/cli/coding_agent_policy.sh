#!/usr/bin/env bash
# coding_agent_policy.sh — the shipped policy for coding agents
# (examples/policies/coding-agent.json, docs/policy.md "Coding agents")
# holds what its traces expect (`loopguard test`), and is needed: the
# default policy stops the edit/test cycles the recipe lets run, and lets
# through the retry loop whose Bash description changes each time.
# (tests/gateway/guard.sh runs the same recipe through the gateway.)
# Prints "N passed, N failed"; exits 1 on any failure.

BIN=${LG_BIN:?LG_BIN is not set}
SRC=${LG_SOURCE_DIR:?LG_SOURCE_DIR is not set}
POLICY="$SRC/examples/policies/coding-agent.json"
CASES="$SRC/examples/policies/coding-agent"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lg-coding-agent.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }

# Every trace of the folder holds with the recipe, and there are six.
"$BIN" test --policy "$POLICY" "$CASES" >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -qx '6 passed, 0 failed, 0 skipped' "$TMP/out"; then
  ok "loopguard test with coding-agent.json: 6 passed"
else
  bad "loopguard test with coding-agent.json (exit $rc): $(cat "$TMP/out")"
fi

# summary FILE [--policy P]: the replay's summary line, as "reason executed blocked"
summary() {
  local f=$1
  shift
  "$BIN" replay --json "$@" "$f" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("type") == "summary":
        print(d.get("terminal_reason"), d.get("executed_calls"), d.get("blocked_calls"))'
}

got=$(summary "$CASES/claude-code-edit-test.jsonl")
[ "$got" = "failure_streak 11 2" ] && ok "the default policy stops the edit/test cycle ($got)" ||
  bad "the default policy on claude-code-edit-test: $got, expected failure_streak 11 2"
got=$(summary "$CASES/codex-edit-test.jsonl")
[ "${got%% *}" = same_call_repeat ] && ok "the default policy stops the Codex cycle ($got)" ||
  bad "the default policy on codex-edit-test: $got, expected a same_call_repeat stop"
got=$(summary "$CASES/retry-same-command.jsonl")
[ "${got%% *}" != same_call_repeat ] && ok "without the Bash loop_key a reworded retry is no repeat ($got)" ||
  bad "the default policy on retry-same-command: $got (the loop_key would not be needed)"

# The recipe is a valid policy for the server too.
"$BIN" fingerprint --policy "$POLICY" Bash '{"command":" pytest  -x ","description":"a"}' >"$TMP/a" &&
  "$BIN" fingerprint --policy "$POLICY" Bash '{"command":"pytest -x","description":"b"}' >"$TMP/b" &&
  cmp -s "$TMP/a" "$TMP/b" && ok "Bash's loop_key: the command, trimmed and collapsed, alone" ||
  bad "Bash's fingerprints differ: $(cat "$TMP/a" "$TMP/b")"

# docs/policy.md shows the recipe: the same JSON as the file.
if python3 - "$SRC/docs/policy.md" "$POLICY" <<'PY'
import json, re, sys
doc = open(sys.argv[1]).read()
m = re.search(r"is a policy for such agents:\n\n```json\n(.*?)```", doc, re.S)
sys.exit(0 if m and json.loads(m.group(1)) == json.load(open(sys.argv[2])) else 1)
PY
then ok "docs/policy.md shows coding-agent.json as it is"; else bad "docs/policy.md's recipe differs from coding-agent.json"; fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
