#!/usr/bin/env python3
"""slow-reader.py URL PID STALL_S: downloads URL (GET, HTTP/1.1, chunked or
with Content-Length) the way a slow client does: reads 1 MiB, then reads
nothing for STALL_S seconds while watching the process PID (the gateway),
then reads the rest. Prints one JSON line: the bytes read, whether they are
the fake upstream's file-big content (a 16-byte line counted in hex), the
gateway's resident memory before and at most during the stall (KiB), and
its CPU seconds during the stall (a transfer that spins while paused would
burn them)."""
import json, socket, sys, time
from urllib.parse import urlsplit

url, pid, stall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def rss_kb():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def cpu_s():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in ticks of 1/100 s


u = urlsplit(url)
s = socket.create_connection((u.hostname, u.port))
s.sendall(f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
rss0 = rss_kb()
raw = bytearray()
while len(raw) < (1 << 20):
    b = s.recv(65536)
    if not b:
        break
    raw += b
cpu0, peak, t_end = cpu_s(), rss0, time.time() + stall
while time.time() < t_end:
    peak = max(peak, rss_kb())
    time.sleep(0.05)
stall_cpu = cpu_s() - cpu0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    raw += b
head, _, body = bytes(raw).partition(b"\r\n\r\n")
status = int(head.split(b" ")[1])
if b"transfer-encoding: chunked" in head.lower():  # undo the chunking
    out, i, done = bytearray(), 0, False
    while True:
        j = body.find(b"\r\n", i)
        if j < 0:
            break
        n = int(body[i:j].split(b";")[0], 16)
        if n == 0:
            done = True
            break
        out += body[j + 2 : j + 2 + n]
        i = j + 2 + n + 2
    body, complete = bytes(out), done
else:
    complete = True
# every 997th line and the last: a piece lost, doubled or moved shifts every line after it
lines = list(range(0, len(body) - 15, 16 * 997)) + ([(len(body) // 16 - 1) * 16] if len(body) >= 16 else [])
ok = all(body[o : o + 16] == (format(o, "015x") + "\n").encode() for o in lines)
print(json.dumps({"status": status, "bytes": len(body), "complete": complete, "content_ok": ok,
                  "rss0_kb": rss0, "stall_peak_kb": peak, "stall_cpu_s": stall_cpu}))
