#!/usr/bin/env bash
# bench/gateway/install.sh BUILD_DIR — installs the gateway benchmark's
# peer, Portkey's gateway, from the npm registry with `npm ci` (the
# versions of bench/gateway/package-lock.json) into BUILD_DIR/bench-gateway-node
# ($LG_GW_NODE_DIR), when it is missing or the lockfile changed. Run by
# `make bench-deps` and, when needed, by bench/gateway/run.sh.
# Prints why on failure and exits 1; the benchmark then skips Portkey.
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:?usage: bench/gateway/install.sh BUILD_DIR}
NODE_DIR=${LG_GW_NODE_DIR:-$BUILD/bench-gateway-node}
command -v node >/dev/null && command -v npm >/dev/null || { echo "node and npm are not installed"; exit 1; }
if cmp -s "$HERE/package-lock.json" "$NODE_DIR/package-lock.json" &&
  [[ -f $NODE_DIR/node_modules/@portkey-ai/gateway/build/start-server.js ]]; then
  exit 0
fi
mkdir -p "$NODE_DIR" || exit 1
NODE_DIR=$(cd "$NODE_DIR" && pwd) # absolute: npm ci runs in it, and its log is written from there
cp "$HERE/package.json" "$HERE/package-lock.json" "$NODE_DIR/" || exit 1
log=$NODE_DIR/npm-ci.log
if ! (cd "$NODE_DIR" && npm ci --no-audit --no-fund >"$log" 2>&1); then
  rm -f "$NODE_DIR/package-lock.json" # so that the next run tries again
  echo "npm ci of @portkey-ai/gateway failed ($log): $(tail -n 3 "$log" | tr '\n' ' ')"
  exit 1
fi
