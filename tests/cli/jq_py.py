"""jq_py.py: one python for every jq_py call of a test script.

serve_lib.bash starts it when sourced. A python started a call costs 45 ms
here, 90 under the suite's load, and a gateway test makes 180 calls; this
one answers each over a loopback connection in a millisecond or two.

It prints its port on its first line, then for each connection reads
EXPR, a newline, a path, a NUL byte; reads the JSON document from the
path to its end (the caller's standard input, /proc/PID/fd/0: a pipe
read here in 64 KB pieces, where bash's read would make a system call
of each byte); evaluates EXPR with the document bound to `d` (json and
sys importable as in `python3 -c`), and
answers as serve_lib.bash's ask_helper reads: "0" and a newline, what
`print` would write (the value as JSON, a string as itself) and a NUL;
or "1", a newline, a NUL and the traceback when the document is not
JSON or EXPR fails. It exits with its parent's script
(killed by serve_lib.bash's cleanup).

A path that starts with http:// is a URL (serve_lib.bash's jq_url): the
document is its answer to a GET, and an answer of 400 or more, or none,
fails the call as `curl -sf URL | jq_py EXPR` would. One process fewer a
check (curl is 20 to 28 ms of CPU a start on the 2-core VM; docs/testing.md,
session 48).
"""
import json
import socket
import sys
import threading
import traceback
import urllib.request


def answer(conn):
    with conn:
        data = bytearray()
        while not data.endswith(b"\0"):
            chunk = conn.recv(65536)
            if not chunk:
                return  # the client went: nothing to answer
            data += chunk
        expr, _, path = bytes(data[:-1]).partition(b"\n")
        try:
            if path.startswith(b"http://"):
                with urllib.request.urlopen(path.decode(), timeout=60) as r:
                    doc = r.read()
            else:
                with open(path, "rb") as f:
                    doc = f.read()
            d = json.loads(doc)
            r = eval("(" + expr.decode() + ")", {"json": json, "sys": sys, "d": d})
            out = b"0\n" + ((r if isinstance(r, str) else json.dumps(r)) + "\n").encode() + b"\0"
        except Exception:  # what `python3 -c` would have printed, and its failure
            out = b"1\n\0" + traceback.format_exc().encode()
        conn.sendall(out)


def main():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


main()
