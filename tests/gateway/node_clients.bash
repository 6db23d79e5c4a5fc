# node_clients.bash — sourced by the gateway's tests (after serve_lib.bash,
# with HERE their folder): skips the test (exit 77) when node is not
# installed; else installs the pinned clients (package-lock.json, npm ci)
# into NODE_DIR — outside the source tree, the build's folder by default —
# when they are missing or the lockfile changed, and copies the tests'
# .mjs files there. Under a lock: tests that run at once share the folder.
command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
NODE_DIR=${LG_GATEWAY_NODE_DIR:-$PWD/gateway-node}
mkdir -p "$NODE_DIR"
(
  flock 9
  if ! cmp -s "$HERE/package-lock.json" "$NODE_DIR/package-lock.json" || [ ! -d "$NODE_DIR/node_modules/openai" ]; then
    cp "$HERE/package.json" "$HERE/package-lock.json" "$NODE_DIR/"
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { cat "$TMP/npm.log"; exit 1; }
  fi
  cp "$HERE"/*.mjs "$NODE_DIR/"
) 9>"$NODE_DIR/.lock" || fail "npm ci"
