#!/usr/bin/env bash
# python_client.sh — when examples/python/loopguard_client.py sends a
# request twice, against a scripted HTTP server that counts what it gets:
#   - a kept connection the server closed while idle (as loopguard serve
#     closes one after its timeout) is re-opened and the request sent
#     again: the agent's next call goes through;
#   - a timeout raises, the request not sent again: the server may have
#     decided it (a call sent twice counts twice: until session 45 the
#     client re-sent it);
#   - a new connection dropped without an answer raises, not sent again.
source "$(dirname "$0")/serve_lib.bash"
PYTHONPATH="$LG_SOURCE_DIR/examples/python" python3 - <<'PY' || fail "the client's re-sends (above)"
import socket, threading, time
from loopguard_client import Client

class Server:
    """Answers each request by `how(n)`, n counting requests from 1:
    'ok' (200, kept open), 'ok-close' (200, then closed), 'slow' (the
    answer after 1.5 s), 'drop' (closed without an answer)."""
    def __init__(self, how):
        self.how, self.got = how, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()
    def accept(self):
        while True:
            c, _ = self.sock.accept()
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()
    def serve(self, c):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    c.close()
                    return
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0] or 0)
            while len(buf) < n:
                buf += c.recv(65536)
            body, buf = buf[:n], buf[n:]
            self.got.append(body)
            how = self.how(len(self.got))
            if how == "drop":
                c.close()
                return
            if how == "slow":
                time.sleep(1.5)
            doc = b'{"call_id":"c%d","action":"execute"}' % len(self.got)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(doc), doc))
            if how == "ok-close":
                time.sleep(0.2)  # the client reads its answer and keeps the connection
                c.close()
                return

bad = []
# 1. the kept connection closed by the server while idle: the next call re-opened and sent once more
s = Server(lambda n: "ok-close" if n == 1 else "ok")
lg = Client(s.url, timeout=5)
lg.call("r1", "search", {"q": "a"})
time.sleep(0.5)
try:
    d = lg.call("r1", "search", {"q": "b"})
    if d.get("action") != "execute": bad.append("stale: answer %r" % d)
except Exception as e:
    bad.append("stale: a kept connection the server closed raised %r" % e)
if len(s.got) != 2: bad.append("stale: the server got %d requests, wanted 2" % len(s.got))
def raises_once(name, how, timeout, exc, settle):
    """A call to a server that answers `how` raises exc, and the server got it once."""
    s = Server(lambda n: how)
    try:
        Client(s.url, timeout=timeout).call("r-" + name, "charge", {"amount": 49})
        bad.append("%s: no exception" % name)
    except exc:
        pass
    except Exception as e:
        bad.append("%s: %r, wanted %s" % (name, e, exc))
    time.sleep(settle)  # time for a second copy to arrive, if one were sent
    if len(s.got) != 1: bad.append("%s: the server got the call %d times, wanted once" % (name, len(s.got)))
# 2. a timeout raises; 3. a new connection dropped without an answer raises
raises_once("timeout", "slow", 0.5, TimeoutError, 2)
raises_once("drop", "drop", 5, (ConnectionError, OSError), 0.3)
for b in bad: print("FAIL:", b)
raise SystemExit(1 if bad else 0)
PY
echo "ok: python_client"
