#!/usr/bin/env bash
# replay_cli.sh — black-box tests of `loopguard replay` and
# `loopguard fingerprint` (docs/reference/cli.md, trace-v1.md): output
# formats, exit codes (0 read and replayed, 1 unreadable or malformed input,
# 2 bad usage) and error messages that name the file, the line and the
# field. Needs $LG_BIN (the built binary), $LG_TEST_DATA and python3 (to
# parse the JSON output). Prints "N passed, N failed"; exits 1 on any
# failure. Deliberately no `set -e`: every check is explicit.

BIN=${LG_BIN:?LG_BIN is not set}
DATA=${LG_TEST_DATA:?LG_TEST_DATA is not set}
PY=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lg-replay-cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }

# run CMD... : runs it, keeping stdout in $TMP/out, stderr in $TMP/err and
# the exit status in $rc.
run() {
  "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
}
expect_rc() { # NAME WANT
  if [ "$rc" -eq "$2" ]; then ok "$1 (exit $rc)"; else bad "$1: exit $rc, expected $2; stderr: $(head -c 300 "$TMP/err")"; fi
}
expect_err() { # NAME TEXT : stderr contains TEXT
  if grep -qF -- "$2" "$TMP/err"; then ok "$1"; else bad "$1: stderr does not contain '$2': $(head -c 300 "$TMP/err")"; fi
}

command -v "$PY" >/dev/null 2>&1 || { echo "FAIL python3 is needed"; echo "0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL $BIN is not executable"; echo "0 passed, 1 failed"; exit 1; }

# ---------------------------------------------------------------------
# replay --json on every fixture: exit 0, one valid JSON object per line,
# one per call/model/handoff/result/cancel event acted on, and a summary
# that agrees with the `# expect` line's terminal reason.
nfix=0
for f in "$DATA"/fixtures/*.jsonl; do
  [ -e "$f" ] || continue
  nfix=$((nfix + 1))
  name=$(basename "$f")
  run "$BIN" replay --json "$f"
  expect_rc "replay --json $name" 0
  if "$PY" - "$f" "$TMP/out" >"$TMP/check" 2>&1 <<'EOF'
import json, re, sys
trace, out = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in open(out, encoding="utf-8") if l.strip()]
assert recs, "no output"
summ = recs[-1]
assert summ.get("type") == "summary", "the last line is not the summary"
assert sum(1 for r in recs if r.get("type") == "summary") == 1, "more than one summary"
for k in ("trace", "run_id", "terminal_reason", "stopped_at_line", "executed_calls", "blocked_calls",
          "replayed_calls", "model_calls", "cost_usd", "tokens", "events_after_stop", "envelope"):
    assert k in summ, "summary lacks " + k
assert summ["trace"] == trace, "summary names %r" % summ["trace"]
assert isinstance(summ["envelope"], dict), "the envelope is not an object"
assert summ["envelope"].get("terminal_reason") == summ["terminal_reason"], "envelope and summary disagree"
lines = open(trace, encoding="utf-8").read().split("\n")
types = {}
for i, l in enumerate(lines, 1):
    if l.strip().startswith("{"):
        types[i] = json.loads(l).get("type")
acts = {"execute", "block", "replay", "stop", "continue"}
calls = 0
for r in recs[:-1]:
    # trace-v1 lists call, model, handoff, result and cancel; the CLI also
    # prints state events (a snapshot can be where the run stops).
    assert r["type"] in ("call", "model", "handoff", "result", "cancel", "state"), "record of type %r" % r["type"]
    assert types.get(r["line"]) == r["type"], "line %d is not a %s" % (r["line"], r["type"])
    assert r["action"] in acts, "action %r" % r["action"]
    if r["action"] in ("execute", "continue"):
        assert "reason" not in r, "reason on %s" % r["action"]
    elif r["action"] in ("block", "stop"):
        assert r.get("reason"), "no reason on line %d" % r["line"]
    # (replay: trace-v1 says every action but execute and continue has a
    # reason, but names no reason for a replay; the CLI prints none)
    if r["type"] == "call":
        calls += 1
        assert re.fullmatch(r"[0-9a-f]{64}", r["fingerprint"]), "bad fingerprint"
        assert isinstance(r.get("repeat"), int)
    if r["type"] == "result":
        assert r["action"] in ("continue", "stop")
assert summ["executed_calls"] + summ["blocked_calls"] + summ["replayed_calls"] <= calls
exp = json.loads(lines[0][len("# expect "):]) if lines[0].startswith("# expect ") else {}
if "terminal_reason" in exp:
    assert summ["terminal_reason"] == exp["terminal_reason"], "terminal_reason %r" % summ["terminal_reason"]
if summ["terminal_reason"] is not None:
    assert types.get(summ["stopped_at_line"]), "stopped_at_line is not an event"
    stop = [r for r in recs[:-1] if r["line"] == summ["stopped_at_line"]]
    assert stop and stop[0]["action"] == "stop", "no stop record at stopped_at_line"
else:
    assert summ["stopped_at_line"] is None
EOF
  then ok "replay --json $name: records and summary"
  else bad "replay --json $name: $(tail -c 300 "$TMP/check")"
  fi
done
[ "$nfix" -gt 0 ] && ok "found $nfix fixtures" || bad "no fixtures in $DATA/fixtures"

# Several traces: one summary each, in order.
set -- "$DATA"/fixtures/*.jsonl
run "$BIN" replay --json "$1" "$2"
expect_rc "replay --json of two traces" 0
n=$(grep -c '"type":"summary"' "$TMP/out")
[ "$n" -eq 2 ] && ok "two traces, two summaries" || bad "two traces gave $n summaries"

# The human timeline and --quiet also exit 0 and say how it ended.
run "$BIN" replay "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "replay (timeline)" 0
grep -q "same_call_repeat" "$TMP/out" && ok "timeline names the stop" || bad "timeline lacks the stop: $(head -c 300 "$TMP/out")"
run "$BIN" replay -q "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "replay -q" 0
[ "$(wc -l <"$TMP/out")" -eq 1 ] && ok "replay -q prints one line" || bad "replay -q printed $(wc -l <"$TMP/out") lines"

# ---------------------------------------------------------------------
# Malformed and missing input: exit 1, stderr names file and line.
printf '%s\n' '{"type":"run","run_id":"r"}' '# fine' '{"type":"call","tool":"a","args":{"x":}}' >"$TMP/bad-json.jsonl"
run "$BIN" replay --json "$TMP/bad-json.jsonl"
expect_rc "malformed JSON" 1
expect_err "malformed JSON names file:line" "bad-json.jsonl:3"
[ ! -s "$TMP/out" ] || ! grep -q '"type":"summary"' "$TMP/out" && ok "no summary for a malformed trace" || bad "a malformed trace got a summary"

printf '%s\n' '{"type":"run","run_id":"r"}' '{"type":"call","turn":"one","tool":"a"}' >"$TMP/bad-type.jsonl"
run "$BIN" replay "$TMP/bad-type.jsonl"
expect_rc "wrong field type" 1
expect_err "wrong field type names file:line" "bad-type.jsonl:2"
expect_err "wrong field type names the field" "turn"

printf '%s\n' '{"type":"call","tool":"a"}' '{"type":"run","run_id":"r"}' >"$TMP/late-run.jsonl"
run "$BIN" replay "$TMP/late-run.jsonl"
expect_rc "run event not first" 1
expect_err "run event not first names file:line" "late-run.jsonl:2"

printf '%s\n' '{"type":"run","run_id":"r","policy":{"repeat":{"blok":3}}}' >"$TMP/bad-policy-in-trace.jsonl"
run "$BIN" replay "$TMP/bad-policy-in-trace.jsonl"
expect_rc "unknown policy field in the run event" 1
expect_err "unknown policy field in the trace is named" "repeat.blok"
expect_err "unknown policy field in the trace: file:line" "bad-policy-in-trace.jsonl:1"

printf '%s\n' '{"type":"run","run_id":"r"}' '{"type":"call","tool":"a","t_ms":10}' '{"type":"result","status":"progress","t_ms":5}' >"$TMP/back.jsonl"
run "$BIN" replay "$TMP/back.jsonl"
expect_rc "t_ms going backwards" 1
expect_err "t_ms going backwards: file:line" "back.jsonl:3"

run "$BIN" replay "$TMP/does-not-exist.jsonl"
expect_rc "missing file" 1
expect_err "missing file is named" "does-not-exist.jsonl"

# A bad trace among good ones: exit 1, the good ones still replayed.
run "$BIN" replay --json "$DATA/fixtures/seed000-permission.jsonl" "$TMP/bad-json.jsonl" "$DATA/fixtures/seed000-polling.jsonl"
expect_rc "one bad trace among good ones" 1
n=$(grep -c '"type":"summary"' "$TMP/out")
[ "$n" -eq 2 ] && ok "the good traces were still replayed" || bad "got $n summaries, expected 2"

# An empty trace and one of comments only are fine.
: >"$TMP/empty.jsonl"
run "$BIN" replay --json "$TMP/empty.jsonl"
expect_rc "empty trace" 0
"$PY" -c 'import json,sys; s=json.loads(open(sys.argv[1]).read().strip().split("\n")[-1]); assert s["type"]=="summary" and s["terminal_reason"] is None and s["executed_calls"]==0' "$TMP/out" \
  && ok "empty trace: a summary with no stop" || bad "empty trace summary: $(head -c 300 "$TMP/out")"

# From a pipe.
run sh -c "cat '$DATA/fixtures/seed000-permission.jsonl' | '$BIN' replay --json /dev/stdin"
expect_rc "replay from a pipe" 0
grep -q '"terminal_reason":"permission_denied"' "$TMP/out" && ok "pipe: replayed" || bad "pipe: $(tail -c 300 "$TMP/out")"

# ---------------------------------------------------------------------
# --policy.
printf '%s\n' '{"repeat":{"blok":3}}' >"$TMP/typo.json"
run "$BIN" replay --policy "$TMP/typo.json" "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "--policy with an unknown field" 1
expect_err "--policy unknown field is named" "repeat.blok"
expect_err "--policy unknown field: the file is named" "typo.json"

printf '{\n  "limits": {\n    "max_model_calls": 5,\n    "max_steps": "ten"\n  }\n}\n' >"$TMP/mistyped.json"
run "$BIN" replay --policy "$TMP/mistyped.json" "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "--policy with a mistyped field" 1
expect_err "--policy mistyped field is named" "limits.max_steps"
expect_err "--policy mistyped field: file:line of the field" "mistyped.json:4: limits.max_steps"

run "$BIN" replay --policy "$TMP/no-such-policy.json" "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "--policy file missing" 1

# An override applies: the ladder off and a step cap of 1.
printf '%s\n' '{"limits":{"max_steps":1},"repeat":{"observe":false,"block":false,"stop":false}}' >"$TMP/cap1.json"
run "$BIN" replay --json --policy "$TMP/cap1.json" "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "--policy override" 0
grep -q '"terminal_reason":"step_cap"' "$TMP/out" && ok "--policy override decides" || bad "--policy override ignored: $(tail -c 300 "$TMP/out")"
run "$BIN" replay --json "--policy=$TMP/cap1.json" "$DATA/fixtures/seed000-same-call.jsonl"
expect_rc "--policy=FILE" 0
grep -q '"terminal_reason":"step_cap"' "$TMP/out" && ok "--policy=FILE decides" || bad "--policy=FILE ignored"

# The events trace-v1.md says replay acts on beyond call/model/result:
# text, user, compaction and budget each get their records and stops.
ENG="$DATA/engine"
for c in "text-repeat-stop text text_repeat" "compaction-max-3 compaction context_loop" \
         "budget-exceeded budget budget_exceeded" "user-restarts-repeat-count user null"; do
  read -r d ty want <<<"$c"
  run "$BIN" replay --json "$ENG/$d/trace.jsonl"
  expect_rc "replay --json $d" 0
  if "$PY" - "$TMP/out" "$ty" "$want" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert any(r.get("type") == sys.argv[2] for r in recs), "no %s record" % sys.argv[2]
want = None if sys.argv[3] == "null" else sys.argv[3]
assert recs[-1]["terminal_reason"] == want, recs[-1]["terminal_reason"]
EOF
  then ok "replay acts on $ty events ($d)"; else bad "replay of $d: $(head -c 300 "$TMP/out")"; fi
done

# Long tool names are compared whole: three plain calls of one 64-byte
# tool fold into "(TOOL)", not "(several tools)"; two tools that differ
# only at byte 101 each get their steer message.
t64=$(printf 'x%.0s' $(seq 64))
{ echo '{"type":"run","run_id":"long"}'
  for i in 1 2 3; do echo "{\"type\":\"call\",\"tool\":\"$t64\",\"args\":{\"i\":$i},\"turn\":$i}"; done
} >"$TMP/long-tool.jsonl"
run "$BIN" replay "$TMP/long-tool.jsonl"
expect_rc "replay of a 64-byte tool" 0
grep -qF "3 calls executed ($t64)" "$TMP/out" && ok "a 64-byte tool folds under its name" || bad "a 64-byte tool: $(cat "$TMP/out")"
a100=$(printf 'a%.0s' $(seq 100))
{ echo '{"type":"run","run_id":"long2"}'
  for t in 1 2; do for i in 1 2; do
    echo "{\"type\":\"call\",\"tool\":\"$a100$t\",\"args\":{},\"turn\":$t$i}"
    echo '{"type":"result","status":"retryable","value":{"error":"timeout"}}'
  done; done
} >"$TMP/long-tools.jsonl"
run "$BIN" replay "$TMP/long-tools.jsonl"
expect_rc "replay of two 101-byte tools" 0
[ "$(grep -c '"I have now called' "$TMP/out")" = 2 ] && ok "two long tools: a message each" || bad "two long tools: $(cut -c 1-140 "$TMP/out")"

# ---------------------------------------------------------------------
# Usage.
run "$BIN" replay
expect_rc "replay without a trace" 2
run "$BIN" replay --bogus "$DATA/fixtures/seed000-permission.jsonl"
expect_rc "replay with an unknown option" 2
expect_err "unknown option is named" "--bogus"
run "$BIN" replay --policy
expect_rc "replay --policy without a file" 2
run "$BIN" no-such-command
expect_rc "unknown command" 2
run "$BIN" fingerprint
expect_rc "fingerprint without arguments" 2
run "$BIN" fingerprint bash
expect_rc "fingerprint without ARGS_JSON" 2
run "$BIN" fingerprint bash '{}' extra
expect_rc "fingerprint with too many arguments" 2

# Flags the documented way (cli.md): before or after the positionals,
# --flag=VALUE, and `--` ending the flags (a trace whose name starts with
# '-'); a flag after TOOL is a flag, not ARGS_JSON.
cp "$DATA/fixtures/seed000-same-call.jsonl" "$TMP/-dash.jsonl"
cd "$TMP" && run "$BIN" replay -q -- -dash.jsonl
cd - >/dev/null
expect_rc "replay -q -- -dash.jsonl" 0
grep -q '^-dash.jsonl: same_call_repeat' "$TMP/out" && ok "replay after --: the trace is replayed" || bad "replay after --: $(head -c 300 "$TMP/out")"
run "$BIN" replay "$DATA/fixtures/seed000-same-call.jsonl" --quiet "--policy=$TMP/cap1.json"
expect_rc "replay TRACE --quiet --policy=FILE" 0
grep -q 'step_cap' "$TMP/out" && ok "replay: flags after the trace apply" || bad "replay: flags after the trace: $(head -c 300 "$TMP/out")"
run "$BIN" fingerprint -- t '{}'
expect_rc "fingerprint -- TOOL ARGS_JSON" 0
printf '{}\n' >"$TMP/empty-policy.json"
run "$BIN" fingerprint "--policy=$TMP/empty-policy.json" t '{}'
expect_rc "fingerprint --policy=FILE" 0
run "$BIN" fingerprint t '{}' --json
expect_rc "fingerprint TOOL ARGS_JSON --json" 0
grep -q '"tool":"t"' "$TMP/out" && ok "fingerprint: --json after the positionals" || bad "fingerprint --json after: $(head -c 300 "$TMP/out")"
run "$BIN" fingerprint t --bogus
expect_rc "fingerprint TOOL --bogus" 2
expect_err "fingerprint: a flag after TOOL is an unknown flag, not ARGS_JSON" "unknown flag '--bogus'"

# --json is JSON: a TOOL that is not UTF-8 is refused, named, not echoed.
run "$BIN" fingerprint $'\xff' '{}' --json
expect_rc "fingerprint of a TOOL that is not UTF-8" 2
expect_err "a TOOL that is not UTF-8 is named" "TOOL is not valid UTF-8"
[ -s "$TMP/out" ] && bad "a TOOL that is not UTF-8: output $(head -c 100 "$TMP/out")" || ok "a TOOL that is not UTF-8: no output"
run "$BIN" fingerprint $'t\xc3\xa9' '{}' --json
expect_rc "fingerprint of a UTF-8 TOOL" 0

run "$BIN" replay --help
expect_rc "replay --help" 0
grep -q "usage: loopguard replay" "$TMP/out" && ok "replay --help prints the usage" || bad "replay --help: $(head -c 200 "$TMP/out")"
run "$BIN" fingerprint --help
expect_rc "fingerprint --help" 0
grep -q "usage: loopguard fingerprint" "$TMP/out" && ok "fingerprint --help prints the usage" || bad "fingerprint --help: $(head -c 200 "$TMP/out")"

# ---------------------------------------------------------------------
# fingerprint: every tool-call vector of the cross-port file, through the
# binary, in text and --json form.
VEC="$DATA/vectors/openrouter-doom-loop-fingerprints.json"
if "$PY" - "$BIN" "$VEC" >"$TMP/check" 2>&1 <<'EOF'
import json, subprocess, sys
binp, vec = sys.argv[1], sys.argv[2]
v = json.load(open(vec, encoding="utf-8"))
canon = lambda x: json.dumps(x, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
n = 0
for t in v["toolCallVectors"]:
    n += 1
    args = json.dumps(t["keyMaterial"], ensure_ascii=True)  # escapes keep lone surrogates in argv
    p = subprocess.run([binp, "fingerprint", "--json", t["toolName"], args], capture_output=True)
    assert p.returncode == 0, "%s: exit %d: %s" % (t["name"], p.returncode, p.stderr[:200])
    o = json.loads(p.stdout.decode("utf-8", "surrogateescape"))
    assert set(o) == {"tool", "key_material", "fingerprint"}, sorted(o)
    assert o["tool"] == t["toolName"], (t["name"], o["tool"])
    assert o["fingerprint"] == t["fingerprint"], (t["name"], o["fingerprint"])
    assert canon(o["key_material"]) == canon(json.loads(t["jcs"])), (t["name"], o["key_material"])
    p = subprocess.run([binp, "fingerprint", t["toolName"], args], capture_output=True)
    assert p.returncode == 0 and t["fingerprint"].encode() in p.stdout, "%s: text form" % t["name"]
assert n > 0, "no vectors"
print(n)
EOF
then ok "fingerprint: all $(cat "$TMP/check") tool-call vectors, --json and text"
else bad "fingerprint vectors: $(tail -c 400 "$TMP/check")"
fi

# A loop key from --policy changes the key material.
printf '%s\n' '{"tools":{"charge_invoice":{"loop_key":{"invoice_id":["digits"]}}}}' >"$TMP/lk.json"
run "$BIN" fingerprint --json --policy "$TMP/lk.json" charge_invoice '{"invoice_id":"INV-2291","note":"x"}'
expect_rc "fingerprint --policy" 0
a=$(cat "$TMP/out")
run "$BIN" fingerprint --json --policy "$TMP/lk.json" charge_invoice '{"invoice_id":"inv 2291"}'
[ "$a" = "$(cat "$TMP/out")" ] && ok "fingerprint --policy: normalised loop keys agree" || bad "fingerprint --policy: $a vs $(cat "$TMP/out")"
grep -qF '"key_material":{"invoice_id":"2291"}' "$TMP/out" && ok "fingerprint --policy: key material narrowed" || bad "key material: $(cat "$TMP/out")"

run "$BIN" fingerprint --json bash '{"command":'
expect_rc "fingerprint of malformed ARGS_JSON" 1
[ -s "$TMP/err" ] && ok "malformed ARGS_JSON: a message" || bad "malformed ARGS_JSON: no message"
run "$BIN" fingerprint --policy "$TMP/typo.json" bash '{}'
expect_rc "fingerprint --policy with an unknown field" 1
expect_err "fingerprint --policy unknown field is named" "repeat.blok"

# A model call's cost: up to 1e9 USD, as the server takes it (so every trace
# it writes replays); past that, an error naming the line and the field.
printf '{"type":"run","run_id":"c1"}\n{"type":"model","turn":1,"input_tokens":1,"output_tokens":1,"cost":1e9}\n' >"$TMP/cost-max.jsonl"
run "$BIN" replay "$TMP/cost-max.jsonl"
expect_rc "a model cost of 1e9 USD replays" 0
printf '{"type":"run","run_id":"c1"}\n{"type":"model","turn":1,"input_tokens":1,"output_tokens":1,"cost":1.5e9}\n' >"$TMP/cost-over.jsonl"
run "$BIN" replay "$TMP/cost-over.jsonl"
expect_rc "a model cost over 1e9 USD" 1
expect_err "a model cost over 1e9 USD: the line and the bound" "cost-over.jsonl:2"

# A number's whole text is read, however long: 2.000...0e8 (140 zeros) is
# 2e8 USD, not 2 (its text was cut at 127 bytes).
printf '{"type":"run","run_id":"c1"}\n{"type":"model","turn":1,"input_tokens":1,"output_tokens":1,"cost":2.%se8}\n' \
  "$(printf '0%.0s' $(seq 140))" >"$TMP/cost-long.jsonl"
run "$BIN" replay --json "$TMP/cost-long.jsonl"
expect_rc "a cost written with 140 digits" 0
if [ "$(tail -n 1 "$TMP/out" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["cost_usd"])')" = 200000000 ]; then
  ok "a cost written with 140 digits is read whole"
else bad "a cost written with 140 digits: $(tail -n 1 "$TMP/out" | head -c 300)"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
