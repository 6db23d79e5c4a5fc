"""replica-memory.py FAKE TAG URL... — what the upstream is sent for a
looping conversation whose requests go to the gateways URL... in turn
(tests/gateway/replicas.sh runs it on two replicas of one store and on one
of them alone, and compares).

On each API (Chat Completions, Anthropic Messages, Responses with the
whole input each time), a client with the fake's `stubborn` model answers
every write with the same failure until the answer has no call: the
guard observes (a steer note on the next result), blocks (the refused
calls restored in the conversation the upstream sees from then on) and
stops. The replica a request comes to must send upstream what one gateway
would: the steer note another replica decided, the calls another replica
restored. Prints one JSON object: for each API the actions
(X-Loopguard-Action) and, for each request, the last body the upstream
got for it, its ids replaced by their order of appearance (the fake
numbers its ids across requests). TAG makes the person's first message,
and so the derived run, this invocation's own; with RUN=NAME in the
environment the runs are named instead (X-Loopguard-Run: NAME-API), which
a replica that never saw the run meets as a run it makes in memory."""
import json
import os
import re
import sys
import urllib.request

fake, tag, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
FAILED = "Error: the storage is read-only."
ASK = "Write record 7 with value A (%s)." % tag


def post(url, path, body, api):
    h = {"content-type": "application/json", "anthropic-version": "2023-06-01", "authorization": "Bearer sk-test"}
    if os.environ.get("RUN"):
        h["X-Loopguard-Run"] = "%s-%s" % (os.environ["RUN"], api)
    with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), h)) as r:
        return json.load(r), r.headers.get("X-Loopguard-Action")


def last_upstream():
    with urllib.request.urlopen(fake + "/stats") as r:
        raw = json.load(r)["raw"][-1]
    ids = {}
    return re.sub(r"\b(call|toolu|fc|resp|msg|rs)_[A-Za-z0-9]+",
                  lambda m: ids.setdefault(m.group(0), "ID%d" % len(ids)), raw)


def chat(conv, a):
    m = a["choices"][0]["message"]
    calls = m.get("tool_calls") or []
    conv.append({"role": "assistant", "content": m.get("content"), **({"tool_calls": calls} if calls else {})})
    conv += [{"role": "tool", "tool_call_id": c["id"], "content": FAILED} for c in calls]
    return bool(calls)


def messages(conv, a):
    uses = [b for b in a["content"] if b["type"] == "tool_use"]
    conv.append({"role": "assistant", "content": a["content"]})
    if uses:
        conv.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": FAILED}
                                                 for u in uses]})
    return bool(uses)


def responses(conv, a):
    out = [o for o in a["output"] if o["type"] in ("message", "function_call")]
    conv += out
    calls = [o for o in out if o["type"] == "function_call"]
    conv += [{"type": "function_call_output", "call_id": c["call_id"], "output": FAILED} for c in calls]
    return bool(calls)


APIS = {
    "chat": ("/v1/chat/completions", chat, [{"role": "user", "content": ASK}],
             lambda conv: {"model": "stubborn", "messages": conv,
                           "tools": [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]}),
    "messages": ("/v1/messages", messages, [{"role": "user", "content": ASK}],
                 lambda conv: {"model": "stubborn", "max_tokens": 100, "messages": conv,
                               "tools": [{"name": "write_record", "input_schema": {"type": "object"}}]}),
    "responses": ("/v1/responses", responses, [{"role": "user", "content": ASK}],
                  lambda conv: {"model": "stubborn", "input": conv, "store": False,
                                "tools": [{"type": "function", "name": "write_record", "parameters": {"type": "object"}}]}),
}

out = {}
for api, (path, take, conv, body) in APIS.items():
    seen = {"actions": [], "upstream": []}
    for i in range(8):
        a, action = post(urls[i % len(urls)], path, body(conv), api)
        seen["actions"].append(action)
        seen["upstream"].append(last_upstream())
        if not take(conv, a):
            break
    out[api] = seen
print(json.dumps(out))
