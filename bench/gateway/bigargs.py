"""bench/gateway/bigargs.py PORTFILE N — a fake upstream for bigargs.sh: every
POST is answered with one streamed answer, built once at the start, whose
one tool call's arguments (a file to write, 5 bytes a delta) come in N
deltas: Chat Completions on /v1/chat/completions, Anthropic Messages on
/v1/messages. It writes the port it took to PORTFILE."""
import http.server
import json
import socketserver
import sys

N = int(sys.argv[2])


def chat():
    base = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1, "model": "big"}
    out = []

    def ev(choices, **kw):
        out.append("data: " + json.dumps(dict(base, choices=choices, **kw)) + "\n\n")

    def args(a):
        ev([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": a}}]}, "finish_reason": None}])

    ev([{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}])
    ev([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_big", "type": "function",
                                               "function": {"name": "write_file", "arguments": ""}}]},
         "finish_reason": None}])
    args('{"path":"a.txt","content":"')
    for _ in range(N):
        args("abcde")
    args('"}')
    ev([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
    ev([], usage={"prompt_tokens": 10, "completion_tokens": N, "total_tokens": N + 10})
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def messages():
    out = []

    def ev(t, d):
        out.append("event: %s\ndata: %s\n\n" % (t, json.dumps(dict(d, type=t))))

    def args(a):
        ev("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": a}})

    ev("message_start", {"message": {"id": "msg_big", "type": "message", "role": "assistant", "model": "big",
                                     "content": [], "stop_reason": None,
                                     "usage": {"input_tokens": 10, "output_tokens": 1}}})
    ev("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "toolu_big",
                                                             "name": "write_file", "input": {}}})
    args('{"path":"a.txt","content":"')
    for _ in range(N):
        args("abcde")
    args('"}')
    ev("content_block_stop", {"index": 0})
    ev("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": N}})
    ev("message_stop", {})
    return "".join(out).encode()


BODIES = {"/v1/chat/completions": chat(), "/v1/messages": messages()}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = BODIES.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True


s = Server(("127.0.0.1", 0), Handler)
with open(sys.argv[1], "w") as f:
    f.write(str(s.server_address[1]))
s.serve_forever()
