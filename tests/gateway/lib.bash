# lib.bash — what tests/gateway/run.sh, guard.sh and keys.sh share (sourced): the
# pinned npm clients installed when missing, and the fake upstream started.
# After it: HERE is the folder of the clients (the build's gateway-node),
# HERE_SRC the source folder, FAKE the fake upstream's URL.
source "$(dirname "${BASH_SOURCE[0]}")/../cli/serve_lib.bash"

command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
HERE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The clients live outside the source tree (the build's folder by default),
# installed from the lockfile when missing or when the lockfile changed.
NODE_DIR=${LG_GATEWAY_NODE_DIR:-$PWD/gateway-node}
mkdir -p "$NODE_DIR"
if ! cmp -s "$HERE_SRC/package-lock.json" "$NODE_DIR/package-lock.json" || [ ! -d "$NODE_DIR/node_modules/openai" ]; then
  cp "$HERE_SRC/package.json" "$HERE_SRC/package-lock.json" "$NODE_DIR/"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { cat "$TMP/npm.log"; fail "npm ci"; }
fi
cp "$HERE_SRC"/*.mjs "$NODE_DIR/"
HERE=$NODE_DIR

node "$HERE/fake-upstream.mjs" "$TMP/fake.port" &
ALL_PIDS+=($!)
for i in $(seq 100); do [ -s "$TMP/fake.port" ] && break; sleep 0.05; done
[ -s "$TMP/fake.port" ] || fail "the fake upstream did not start"
FAKE="http://127.0.0.1:$(cat "$TMP/fake.port")"
