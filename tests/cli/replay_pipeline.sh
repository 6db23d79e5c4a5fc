#!/usr/bin/env bash
# replay_pipeline.sh — a large trace (over 1 MiB) replays on two threads (a
# reader and the decider); the decisions must be exactly those of one
# thread (LOOPGUARD_REPLAY_THREADS=1), record for record, with and without
# a stop, and a malformed line must give the same error either way.
set -u
LG_BIN=${LG_BIN:?}
TMP=$(mktemp -d /tmp/lgpipe.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAIL: $1"; fi; }

python3 - "$TMP" <<'PY'
import json, random, sys
d = sys.argv[1]
random.seed(11)
def write(name, n, bad_at=None, bad_line=None, policy_extra=None):
    with open(f"{d}/{name}", "w") as f:
        f.write(json.dumps({"type": "run", "run_id": name,
                            "policy": {**(policy_extra or {}),
                                       "limits": {"max_steps": None, "max_model_calls": None,
                                                  "max_wall_ms": None},
                                       "tools": {"pay": {"side_effects": True,
                                                         "loop_key": {"inv": ["digits"]}}}}}) + "\n")
        v = 0
        for i in range(n):
            tool = random.choice(["search", "pay", "poll", "lookup"])
            args = {"inv": "INV-%d" % random.randint(1, 40), "q": "x" * random.randint(0, 30),
                    "n": random.randint(1, 3) / 2}
            if i == bad_at:
                f.write(bad_line or '{"type":"call","turn":%d,"tool":"search","args":{"q":01}}\n' % i)
                continue
            f.write(json.dumps({"type": "call", "turn": i // 2, "tool": tool, "args": args}) + "\n")
            st = random.choice(["progress", "progress", "retryable"])
            res = {"type": "result", "status": st, "value": {"ok": st == "progress"}}
            if random.random() < 0.5:
                v += 1
                res["progress_version"] = v
            f.write(json.dumps(res) + "\n")
write("loops.jsonl", 12000)             # repeats, blocks, replays; may stop
write("bad.jsonl", 12000, bad_at=11000) # a malformed line late in the file
# errors the deciding side finds (a field of the wrong type, a second run
# event) and one the reading side finds first (the run's own policy)
write("badturn.jsonl", 12000, bad_at=11000,
      bad_line='{"type":"call","turn":"seven","tool":"search","args":{"q":1}}\n')
write("tworuns.jsonl", 12000, bad_at=11000, bad_line='{"type":"run","run_id":"again"}\n')
write("badpolicy.jsonl", 12000, policy_extra={"repeat": {"blok": 1}})
PY
for t in loops; do
  one=$(LOOPGUARD_REPLAY_THREADS=1 "$LG_BIN" replay --json "$TMP/$t.jsonl" | md5sum)
  two=$("$LG_BIN" replay --json "$TMP/$t.jsonl" | md5sum)
  size=$(stat -c %s "$TMP/$t.jsonl")
  check "$t.jsonl is over 1 MiB ($size bytes)" '[ "$size" -gt 1048576 ]'
  check "$t: one thread and two give the same records" '[ "$one" = "$two" ]'
done
LOOPGUARD_REPLAY_THREADS=1 "$LG_BIN" replay --quiet "$TMP/bad.jsonl" >/dev/null 2>"$TMP/e1"; rc1=$?
"$LG_BIN" replay --quiet "$TMP/bad.jsonl" >/dev/null 2>"$TMP/e2"; rc2=$?
check "malformed line: exit 1 on one thread ($rc1)" '[ $rc1 = 1 ]'
check "malformed line: exit 1 on two ($rc2)" '[ $rc2 = 1 ]'
check "the same error either way" 'cmp -s "$TMP/e1" "$TMP/e2"'
check "the error names the line" 'grep -q "bad.jsonl:22002" "$TMP/e2"'
# name, the place and the field the message must name
for spec in "badturn:22002:turn" "tworuns:22002:type" "badpolicy:1:policy.repeat.blok"; do
  IFS=: read -r t line field <<<"$spec"
  LOOPGUARD_REPLAY_THREADS=1 "$LG_BIN" replay --quiet "$TMP/$t.jsonl" >/dev/null 2>"$TMP/e1"; rc1=$?
  "$LG_BIN" replay --quiet "$TMP/$t.jsonl" >/dev/null 2>"$TMP/e2"; rc2=$?
  check "$t: exit 1 on one thread ($rc1) and on two ($rc2)" '[ $rc1 = 1 ] && [ $rc2 = 1 ]'
  check "$t: the same error either way" 'cmp -s "$TMP/e1" "$TMP/e2"'
  check "$t: the error names $t.jsonl:$line and $field: $(head -c 300 "$TMP/e2")" \
    'grep -q "$t.jsonl:$line" "$TMP/e2" && grep -q "$field" "$TMP/e2"'
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
