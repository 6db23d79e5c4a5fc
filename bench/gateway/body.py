#!/usr/bin/env python3
"""body.py SIZE STREAM — the request body of the gateway benchmark.

A Chat Completions request of exactly SIZE bytes: a system prompt, the
user's task, then turns of an agent at work (an assistant message with a
tool call, the tool's result), as many as fit, with the tools the agent
offers; the system prompt is padded so the body has exactly SIZE bytes.
STREAM 1 adds "stream": true and stream_options.include_usage.
"""
import json
import sys

size, stream = int(sys.argv[1]), sys.argv[2] == "1"
tools = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a customer up.",
     "parameters": {"type": "object", "properties": {"customer_id": {"type": "string"}}, "required": ["customer_id"]}}},
    {"type": "function", "function": {"name": "write_record", "description": "Write a record.",
     "parameters": {"type": "object", "properties": {"record_id": {"type": "integer"}, "value": {"type": "string"}},
                    "required": ["record_id", "value"]}}},
]


def body(turns, pad):
    msgs = [{"role": "system", "content": "You are a careful agent. " + "x" * pad},
            {"role": "user", "content": "Update the records of the customers in the list, then report."}]
    for i in range(turns):
        cid = "call_%06d" % i
        if i % 2 == 0:
            call = {"name": "lookup", "arguments": json.dumps({"customer_id": "c-%d" % i})}
            result = json.dumps({"customer_id": "c-%d" % i, "name": "Customer %d" % i, "tier": "gold"})
        else:
            call = {"name": "write_record", "arguments": json.dumps({"record_id": i, "value": "v%d" % i})}
            result = json.dumps({"ok": True, "record_id": i})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": call}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
    req = {"model": "bench", "messages": msgs, "tools": tools}
    if stream:
        req["stream"] = True
        req["stream_options"] = {"include_usage": True}
    return json.dumps(req, separators=(",", ":"))


turns = 0
while len(body(turns + 1, 0)) <= size:
    turns += 1
base = len(body(turns, 0))
if base > size:
    sys.exit("body.py: %d bytes is too small for a request" % size)
out = body(turns, size - base)
assert len(out) == size
sys.stdout.write(out)
