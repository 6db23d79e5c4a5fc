#!/usr/bin/env python3
"""demo.py — an agent loop that loops, and the guard that stops it.

A scripted fake model wants to charge an invoice. The fake payment tool
times out every time. The model does what models do: it retries, and to get
past a repeat check it writes the same call a little differently each turn
(49 / 49.0 / 4.9e1, keys in another order, "inv-1042 " for "INV-1042").
The arguments go to the sidecar as the model wrote them (JSON text, sent
byte for byte), before every tool call. Numbers are compared by value, so
49, 49.0 and 4.9e1 are one amount by themselves; the invoice's case and
spaces are one invoice only because the POLICY below says so (loop_key:
upper, trim) — with the default policy "inv-1042 " would be another call.
The guard lets the first two through, blocks the next three with a message
for the model, stops the run at the sixth, and the demo prints each step
and the terminal envelope.

    python3 examples/python/demo.py            # server at $LOOPGUARD_URL or 127.0.0.1:8787
    python3 examples/python/demo.py --url http://127.0.0.1:9000 --token TOKEN

Exit status: 0 when the guard stopped the run (the point of the demo), 1
when the loop ran out of turns without a stop, 2 when the server could not
be reached.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopguard_client import Client, LoopGuardError  # noqa: E402

POLICY = {
    "tools": {"charge_card": {
        # The payment tool writes to the world: the guard keys each charge,
        # so an identical charge that did go through is replayed, never run
        # again.
        "side_effects": True,
        # What makes two charges "the same call": the invoice, upper-cased
        # and trimmed (so "inv-1042 " is INV-1042), and the amount.
        "loop_key": {"invoice": ["upper", "trim"], "amount": []}}},
    "limits": {"max_cost_usd": 1.0},
}


class FakeModel:
    """Asks for the same charge every turn, dressed differently."""

    # The arguments as a model writes them: JSON text (what OpenAI's and
    # Anthropic's APIs hand an agent), passed to the guard untouched.
    variants = [
        '{"invoice": "INV-1042", "amount": 49}',
        '{"amount": 49.0, "invoice": "INV-1042"}',
        '{"invoice": "inv-1042 ", "amount": 4.9e1}',
        '{"invoice":"INV-1042","amount":49.00}',
    ]

    def __init__(self):
        self.turn = 0

    def next_call(self, last_observation):
        self.turn += 1
        args = self.variants[(self.turn - 1) % len(self.variants)]
        thought = "The charge failed; let me try again." if last_observation else "Charge the invoice."
        return thought, "charge_card", args


class PaymentTimeout(Exception):
    pass


def charge_card(invoice, amount):
    """The fake payment provider: it never answers in time."""
    time.sleep(0.05)
    raise PaymentTimeout("payment provider did not answer within 30 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("LOOPGUARD_URL", "http://127.0.0.1:8787"))
    ap.add_argument("--token", default=os.environ.get("LOOPGUARD_TOKEN"))
    ap.add_argument("--turns", type=int, default=12, help="the fake model's patience")
    ap.add_argument("--quiet", action="store_true", help="print only the envelope")
    a = ap.parse_args()
    say = (lambda *x: None) if a.quiet else print

    lg = Client(a.url, token=a.token)
    try:
        lg.healthz()
    except (OSError, LoopGuardError) as e:
        print("demo: cannot reach loopguard at %s: %s" % (a.url, e), file=sys.stderr)
        print("demo: start it with `make run` (or build/loopguard serve)", file=sys.stderr)
        return 2
    run = lg.create_run(policy=POLICY)
    run_id = run["run_id"]
    say("run %s (guarded by %s)" % (run_id, a.url))
    model = FakeModel()
    observation = None
    for _ in range(a.turns):
        # The model call itself is paid: the guard checks the run's caps first.
        m = lg.model(run_id, input_tokens=1200, max_tokens=300, cost_usd=0.004, model="fake-1",
                     turn=model.turn + 1)
        if m["action"] == "stop":
            envelope = m["envelope"]
            break
        thought, tool, args = model.next_call(observation)
        lg.usage(run_id, input_tokens=1200, output_tokens=40, cost_usd=0.0031,
                 reservation_id=m.get("reservation_id"))
        say("\nturn %d  model: %s  -> %s(%s)" % (model.turn, thought, tool, args))
        d = lg.call(run_id, tool, args, turn=model.turn)
        action = d["action"]
        if action == "execute":
            if d.get("message"):
                say("  guard: execute, with a word for the model: %s" % d["message"])
            else:
                say("  guard: execute")
            try:
                value = charge_card(**json.loads(args))
                r = lg.result(run_id, "complete", call_id=d["call_id"], value=value)
            except PaymentTimeout as e:
                say("  tool:  %s" % e)
                r = lg.result(run_id, "retryable", call_id=d["call_id"])
                observation = "error: %s" % e
            if r["action"] == "stop":
                envelope = r["envelope"]
                break
        elif action == "replay":
            say("  guard: replay: the charge already happened: %s" % json.dumps(d["saved_result"]))
            observation = json.dumps(d["saved_result"])
        elif action == "block":
            say("  guard: BLOCK (%s): %s" % (d["reason"], d["message"]))
            observation = "blocked: %s" % d["message"]  # what the model is told instead
        else:
            say("  guard: STOP (%s, guard %s)" % (d["reason"], d.get("guard")))
            envelope = d["envelope"]
            break
    else:
        print("demo: the loop ran %d turns and was never stopped" % a.turns, file=sys.stderr)
        return 1
    say("\nThe guard stopped the run. Terminal envelope:")
    print(json.dumps(envelope, indent=2))
    say("\nreplay it: curl -s %s/v1/runs/%s/trace > run.jsonl && build/loopguard replay run.jsonl"
        % (a.url.rstrip("/"), run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
