#!/usr/bin/env python3
"""check_layers.py SRC_ROOT — fails when an include points up or across.

The library is layered (docs/architecture.md): a module may include the
headers of its own folder and of modules in lower layers, never of a
module above it or beside it. The tool (cli/) sees only the public
header. This reads every #include "..." of src/ and cli/ and checks it
against the table below, which is the one docs/architecture.md draws;
a new folder under src/ must be given a layer here, or the check fails.
"""
import os
import re
import sys

# Layer of each folder under src/. Equal numbers are siblings: they may
# not include each other.
LAYERS = {
    "util": 0,
    "policy": 1,
    "canon": 2,
    "engine": 3,
    "event": 4,
    "trace": 5,
    "store": 6,
    "ledger": 7,
    "budget": 7,
    "step": 8,
    "server": 9,
    "gateway": 10,
}
# Exceptions: the server hosts the gateway's routes (one server, one port:
# it starts the gateway and routes /v1/chat/completions & co. to it), while
# the gateway is built on the server's requests, workers and metrics.
ALLOWED = {("server", "gateway")}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main(root):
    src = os.path.join(root, "src")
    bad = []
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        if folder not in LAYERS:
            bad.append(f"src/{folder}/: no layer in tests/lint/check_layers.py (and docs/architecture.md)")
            continue
        for name in sorted(os.listdir(path)):
            if not name.endswith((".c", ".h")):
                continue
            with open(os.path.join(path, name), encoding="utf-8") as f:
                for no, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    where = f"src/{folder}/{name}:{no}"
                    if not inc.startswith("../"):
                        continue  # its own folder, or the public header
                    target = inc.split("/")[1]
                    if target not in LAYERS:
                        bad.append(f"{where}: includes {inc}, a folder with no layer")
                    elif target != folder and LAYERS[target] >= LAYERS[folder] and (folder, target) not in ALLOWED:
                        kind = "across" if LAYERS[target] == LAYERS[folder] else "up"
                        bad.append(f"{where}: {folder} (layer {LAYERS[folder]}) includes {inc}, "
                                   f"{kind} to {target} (layer {LAYERS[target]})")
    cli = os.path.join(root, "cli")
    for name in sorted(os.listdir(cli)):
        if not name.endswith((".c", ".h")):
            continue
        with open(os.path.join(cli, name), encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m and m.group(1) != "loopguard.h" and "/" in m.group(1):
                    bad.append(f"cli/{name}:{no}: includes {m.group(1)}; the tool uses only the public API")
    for b in bad:
        print(b)
    print(f"layers: {len(bad)} violations" if bad else "layers: every include points down")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
