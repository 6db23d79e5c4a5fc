"""steer-parts.py URL FAKE — the observe rung's steer note on a tool result
given as a list of parts (tests/gateway/guard.sh). On each API the fake's
`stubborn` model asks for the same write twice (execute, then observe);
the client answers the second call with a list of parts (on Anthropic and
Responses a text and an image, as a screenshot tool does), and the result
the upstream gets must keep every part and end with the note as a text
part of the API's own type (Chat Completions and Anthropic: text;
Responses: input_text, the only text part a function_call_output takes).
Exits 1 saying what is wrong."""
import json
import sys
import urllib.error
import urllib.request

url, fake = sys.argv[1], sys.argv[2]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
FAILED = "Error: the storage is read-only."


class Refused(Exception):
    pass


def post(path, body, run):
    h = {"content-type": "application/json", "X-Loopguard-Run": run, "anthropic-version": "2023-06-01"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(), h)) as r:
            return json.load(r), r.headers.get("X-Loopguard-Action")
    except urllib.error.HTTPError as e:
        raise Refused("%s answered %d: %s" % (path, e.code, e.read()[:300].decode(errors="replace")))


# Each API: its path, its request, the call of an answer ({id, item to
# append}), a result item, how to find a result in a request, its parts.
def chat_call(a):
    m = a["choices"][0]["message"]
    return m["tool_calls"][0]["id"], [{"role": "assistant", "content": None, "tool_calls": m["tool_calls"]}]


def msg_call(a):
    tu = [b for b in a["content"] if b["type"] == "tool_use"][0]
    return tu["id"], [{"role": "assistant", "content": a["content"]}]


def resp_call(a):
    fc = [o for o in a["output"] if o["type"] == "function_call"][0]
    return fc["call_id"], [fc]


def chat_found(item, cid):
    return item.get("content") if item.get("role") == "tool" and item.get("tool_call_id") == cid else None


def msg_found(item, cid):
    for bl in item.get("content") if item.get("role") == "user" and isinstance(item.get("content"), list) else []:
        if isinstance(bl, dict) and bl.get("type") == "tool_result" and bl.get("tool_use_id") == cid:
            return bl.get("content")
    return None


def resp_found(item, cid):
    return item.get("output") if item.get("type") == "function_call_output" and item.get("call_id") == cid else None


APIS = {
    "chat": dict(
        path="/v1/chat/completions", text="text",
        body=lambda conv: {"model": "stubborn", "messages": conv,
                           "tools": [{"type": "function", "function": {"name": "write_record", "parameters": {"type": "object"}}}]},
        call=chat_call, found=chat_found, list="messages",
        result=lambda cid, out: {"role": "tool", "tool_call_id": cid, "content": out},
        parts=[{"type": "text", "text": FAILED}]),
    "messages": dict(
        path="/v1/messages", text="text",
        body=lambda conv: {"model": "stubborn", "max_tokens": 100, "messages": conv,
                           "tools": [{"name": "write_record", "input_schema": {"type": "object"}}]},
        call=msg_call, found=msg_found, list="messages",
        result=lambda cid, out: {"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": out}]},
        parts=[{"type": "text", "text": FAILED},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]),
    "responses": dict(
        path="/v1/responses", text="input_text",
        body=lambda conv: {"model": "stubborn", "input": conv,
                           "tools": [{"type": "function", "name": "write_record", "parameters": {"type": "object"}}]},
        call=resp_call, found=resp_found, list="input",
        result=lambda cid, out: {"type": "function_call_output", "call_id": cid, "output": out},
        parts=[{"type": "input_text", "text": FAILED},
               {"type": "input_image", "image_url": "data:image/png;base64," + PNG}]),
}


def sent_result(api, cid):
    """The result of call cid in the newest request the upstream got that holds it."""
    with urllib.request.urlopen(fake + "/stats") as r:
        raws = json.load(r)["raw"]
    for raw in reversed(raws):
        for item in json.loads(raw).get(api["list"], []):
            out = api["found"](item, cid)
            if out is not None:
                return out
    return None


bad = []
for name, api in APIS.items():
    conv, actions = [{"role": "user", "content": "Write record 7."}], []
    try:
        for out in (FAILED, api["parts"]):  # the first call's result, then the second's
            a, action = post(api["path"], api["body"](conv), "steer-parts-" + name)
            actions.append(action)
            cid, items = api["call"](a)
            conv += items + [api["result"](cid, out)]
        post(api["path"], api["body"](conv), "steer-parts-" + name)  # the second result, noted
    except Refused as e:
        bad.append("%s: %s" % (name, e))
        continue
    res = sent_result(api, cid)
    if actions != ["execute", "observe"]:
        bad.append("%s: the actions were %s, not execute then observe" % (name, actions))
    elif not isinstance(res, list) or res[:-1] != api["parts"]:
        bad.append("%s: the result's parts were not all kept: %s" % (name, json.dumps(res)[:300]))
    elif res[-1].get("type") != api["text"] or not res[-1].get("text", "").startswith("[loopguard] "):
        bad.append("%s: the note is not a %s part at the end: %s" % (name, api["text"], json.dumps(res[-1])[:300]))
if bad:
    sys.exit("\n".join(bad))
