#!/usr/bin/env python3
"""at-once.py N URL BODY OUT: N POST requests to URL at once, from one
process: a thread each, all connected before any sends (a barrier), so
the server has N requests in hand together. Request i (1..N) carries
BODY (JSON) and X-Loopguard-Run: <OUT's last part>-i; its answer's body
goes to OUT-i.json and "STATUS SECONDS" to OUT-i.code (status 000 when
it failed, as curl writes), SECONDS its own time from its sending to the
end of its answer, as curl's time_total counts.

guard.sh's slow_at_once used to start N curls: 120 processes at once
take seconds of a loaded 2-core machine to start (0.025 s of CPU each),
which the requests' times then carried (session 42)."""
import http.client
import sys
import threading
import time
from urllib.parse import urlsplit

n, url, body, out = int(sys.argv[1]), urlsplit(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]
name = out.rsplit("/", 1)[-1]
ready = threading.Barrier(n)


def one(i):
    code, took, data = "000", 0.0, b""
    try:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.connect()
    except OSError as e:
        conn, data = None, str(e).encode()
    try:
        ready.wait(30)
    except threading.BrokenBarrierError:
        pass
    if conn:
        t0 = time.monotonic()
        try:
            conn.request("POST", url.path, body, {"Content-Type": "application/json",
                                                  "X-Loopguard-Run": f"{name}-{i}"})
            r = conn.getresponse()
            data = r.read()
            code = str(r.status)
        except OSError as e:
            data = str(e).encode()
        took = time.monotonic() - t0
        conn.close()
    with open(f"{out}-{i}.json", "wb") as f:
        f.write(data)
    with open(f"{out}-{i}.code", "w") as f:
        f.write(f"{code} {took:.6f}")


threads = [threading.Thread(target=one, args=(i,)) for i in range(1, n + 1)]
for t in threads:
    t.start()
for t in threads:
    t.join()
