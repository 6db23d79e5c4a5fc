#!/usr/bin/env bash
# coding_agent_policy.sh — the shipped policy for coding agents
# (examples/policies/coding-agent.json, docs/policy.md "Coding agents")
# holds what its traces expect (`loopguard test`), and is needed: the
# default policy stops the edit/test cycles the recipe lets run, and lets
# through the retry loop whose Bash description changes each time.
# (tests/gateway/guard.sh runs the same recipe through the gateway.)
source "$(dirname "${BASH_SOURCE[0]}")/check_lib.bash"
SRC=${LG_SOURCE_DIR:?LG_SOURCE_DIR is not set}
POLICY="$SRC/examples/policies/coding-agent.json"
CASES="$SRC/examples/policies/coding-agent"

# Every trace of the folder holds with the recipe, and there are seven.
check "loopguard test with coding-agent.json" 0 "$bin" test --policy "$POLICY" "$CASES"
has "seven traces, all held" "7 passed, 0 failed, 0 skipped" "$out"

# summary_of FILE: the default policy's replay, as "reason executed blocked"
summary_of() {
  "$bin" replay --json "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("type") == "summary":
        print(d.get("terminal_reason"), d.get("executed_calls"), d.get("blocked_calls"))'
}
has "the default policy stops Claude Code's edit/test cycle" "failure_streak 11 2" \
  "$(summary_of "$CASES/claude-code-edit-test.jsonl")"
has "the default policy stops Codex's edit/test cycle" "same_call_repeat" \
  "$(summary_of "$CASES/codex-edit-test.jsonl")"
hasnt "without the Bash loop_key a reworded retry is no repeat" "same_call_repeat" \
  "$(summary_of "$CASES/retry-same-command.jsonl")"
# A build's polls, as the gateway records them (each that brought output
# with a progress_version), run with the default policy too; the same
# polls without them are the same call again and again.
has "the default policy lets a printing build's polls run" "None 10 0" \
  "$(summary_of "$CASES/codex-build-polls.jsonl")"
grep -v '^#' "$CASES/codex-build-polls.jsonl" | sed 's/"progress_version": [0-9]*, //' >"$tmp/no-pv.jsonl"
has "without the progress_versions the polls are a repeat" "same_call_repeat" "$(summary_of "$tmp/no-pv.jsonl")"

check "Bash's fingerprint, trimmed" 0 "$bin" fingerprint --policy "$POLICY" Bash '{"command":" pytest  -x ","description":"a"}'
a=$out
check "Bash's fingerprint, another description" 0 "$bin" fingerprint --policy "$POLICY" Bash '{"command":"pytest -x","description":"b"}'
[ "$a" = "$out" ]
ok "Bash's loop_key: the command, trimmed and collapsed, alone" $?

# docs/policy.md shows the recipe: the same JSON as the file.
python3 - "$SRC/docs/policy.md" "$POLICY" <<'PY'
import json, re, sys
doc = open(sys.argv[1]).read()
m = re.search(r"is a policy for such agents:\n\n```json\n(.*?)```", doc, re.S)
sys.exit(0 if m and json.loads(m.group(1)) == json.load(open(sys.argv[2])) else 1)
PY
ok "docs/policy.md shows coding-agent.json as it is" $?

summary coding_agent_policy
