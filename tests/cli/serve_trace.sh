#!/usr/bin/env bash
# serve_trace.sh — GET /v1/runs/{id}/trace replays, with `loopguard replay`,
# to every decision the server made.
#
# Sessions of every kind of event (calls with and without turns and ids,
# results of every status, state snapshots, handoffs, model calls and their
# usage, the ledger through /calls, a cancel) are driven through the
# Python client; each answer is written down; then the run's trace is
# fetched and replayed by the CLI, and the two lists of decisions must be
# the same, event for event, reason for reason.
. "$(dirname "$0")/serve_lib.bash"
STORE=$(test_store_url trace)
start_server A --store "$STORE"

PYTHONPATH="$LG_SOURCE_DIR/examples/python" python3 - "$A_URL" "$TMP" "$LG_BIN" <<'EOF' || fail "replay differs"
import json, os, random, subprocess, sys
from loopguard_client import Client
url, tmp, lg_bin = sys.argv[1:4]
lg = Client(url)
random.seed(11)

def session(name, policy, steps):
    run = lg.create_run(run_id="%s-%d" % (name, os.getpid()), policy=policy, group="trace-tests",
                        progress_version=1)["run_id"]
    said = []   # "type action reason" of every decision the server answered
    def note(kind, d):
        said.append("%s %s %s" % (kind, d["action"], d.get("reason", "")))
    for step in steps:
        kind, kw = step
        if kind == "call":
            note("call", lg.call(run, **kw))
        elif kind == "result":
            try:
                note("result", lg.result(run, **kw))
            except Exception as e:   # 409: no call waiting (that call was not executed)
                if getattr(e, "status", 0) != 409: raise
        elif kind == "state":
            lg.state(run, kw["world"])   # replay --json prints no line for state
        elif kind == "handoff":
            note("handoff", lg.handoff(run, kw["from"], kw["to"]))
        elif kind == "model":
            d = lg.model(run, **kw)
            note("model", d)
            if d["action"] == "execute" and kw.get("usage"):
                pass
        elif kind == "usage":
            try:
                lg.usage(run, **kw)
            except Exception as e:
                if getattr(e, "status", 0) != 409: raise
        elif kind == "cancel":
            d = lg.cancel(run, reason=kw.get("reason"))
            # the reason is the kill switch's; the operator's words are a note
            if d.get("cancelled"): said.append("cancel stop operator_cancelled_loop")
    path = os.path.join(tmp, run + ".jsonl")
    with open(path, "w") as f:
        f.write(lg.trace(run))
    out = subprocess.run([lg_bin, "replay", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr); print(open(path).read()); sys.exit(1)
    got = []
    for line in out.stdout.splitlines():
        e = json.loads(line)
        if e["type"] == "summary": continue
        got.append("%s %s %s" % (e["type"], e["action"], e.get("reason", "")))
    # After a stop the server answers stop to everything; replay reads
    # those events without acting on them (events_after_stop).
    first_stop = next((i for i, x in enumerate(said) if " stop " in x + " "), len(said))
    tail = said[first_stop + 1:]
    if any(" stop " not in x + " " for x in tail):
        print("session %s: an answer after the stop was not a stop: %s" % (name, tail)); sys.exit(1)
    said = said[:first_stop + 1]
    if got != said:
        print("session %s: the server and the replay of its trace differ" % name)
        for i in range(max(len(got), len(said))):
            a = said[i] if i < len(said) else "-"
            b = got[i] if i < len(got) else "-"
            print("%s %-45s %s" % ("  " if a == b else "!!", a, b))
        print(open(path).read())
        sys.exit(1)
    print("session %-10s %3d decisions replayed the same" % (name, len(said)))

# 1. the ladder, turns, ids, progress windows
steps = []
for i in range(9):
    steps.append(("call", dict(tool="search", args={"q": "shoes", "page": 1 + (i > 4)}, turn=i // 2)))
    steps.append(("result", dict(status="progress", value={"rows": i})))
    if i == 3:
        steps.append(("result", dict(status="progress", progress_version=5)))
session("ladder", None, steps)

# 2. every status, retry_after, failure streaks, world snapshots, handoffs
steps = [("call", dict(tool="fetch", args={"u": 1}, call_id="f1")),
         ("result", dict(status="retryable", retry_after_ms=50, call_id="f1")),
         ("call", dict(tool="fetch", args={"u": 1})),
         ("state", dict(world={"cursor": 1})), ("state", dict(world={"cursor": 1})),
         ("handoff", {"from": "planner", "to": "coder"}),
         ("call", dict(tool="fetch", args={"u": 2})),
         ("result", dict(status="retryable")),
         ("call", dict(tool="fetch", args={"u": 3})),
         ("result", dict(status="retryable", value=None)),
        ]
for i in range(6):
    steps.append(("call", dict(tool="fetch", args={"u": 10 + i})))
    steps.append(("result", dict(status="retryable")))
session("statuses", None, steps)

# 3. the ledger through /calls: a committed write replays
pol = {"tools": {"charge": {"side_effects": True, "loop_key": {"invoice": ["digits"]}}}}
steps = [("call", dict(tool="charge", args={"invoice": "INV-7", "amount": 5})),
         ("result", dict(status="progress", value={"charge": "ch_1"}, operation_id="op-1")),
         ("call", dict(tool="charge", args={"invoice": "inv 7", "amount": 5})),
         ("call", dict(tool="charge", args={"invoice": "8"}, idempotency_key="given-%d" % os.getpid())),
         ("result", dict(status="fatal", side_effect_committed=False)),
        ]
session("ledger", pol, steps)

# 4. model calls and their usage against the run's caps, then a cancel
pol = {"limits": {"max_cost_usd": 0.1, "max_tokens": 5000, "max_model_calls": 20}}
steps = []
for i in range(8):
    steps.append(("model", dict(input_tokens=400, max_tokens=200, cost_usd=0.02, turn=i)))
    steps.append(("usage", dict(input_tokens=380 + i, output_tokens=50 + 7 * i, cost_usd=0.011)))
    steps.append(("call", dict(tool="step", args={"i": i}, turn=i)))
    steps.append(("result", dict(status="progress")))
steps.append(("cancel", dict(reason="enough for today")))
session("spend", pol, steps)

# 5. a cancel in the middle, events after it
steps = [("call", dict(tool="a", args={})), ("result", dict(status="progress")),
         ("cancel", dict(reason=None)), ("call", dict(tool="b", args={}))]
session("cancel", None, steps)
EOF
stop_server A

note "loopguard runs trace writes the same files from the store, without a server"
n=0
for f in "$TMP"/*.jsonl; do
  run=$(basename "$f" .jsonl)
  "$LG_BIN" runs trace "$run" --store "$STORE" -o "$TMP/cli-$run.trace" || fail "runs trace $run"
  cmp -s "$f" "$TMP/cli-$run.trace" || fail "runs trace $run differs from GET /v1/runs/$run/trace"
  n=$((n + 1))
done
[ "$n" -ge 5 ] || fail "only $n traces were written"
"$LG_BIN" runs trace no-such-run --store "$STORE" >/dev/null 2>"$TMP/nosuch.err" && fail "a trace of no run"
grep -q 'no-such-run' "$TMP/nosuch.err" || fail "the error does not name the run: $(cat "$TMP/nosuch.err")"
echo "serve_trace: ok"
