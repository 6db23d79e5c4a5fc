# lib.bash — what tests/gateway/run.sh, guard.sh and keys.sh share (sourced): the
# pinned npm clients installed when missing, and the fake upstream started.
# After it: HERE is the folder of the clients (the build's gateway-node),
# HERE_SRC the source folder, FAKE the fake upstream's URL, stats EXPR over
# what it saw.
source "$(dirname "${BASH_SOURCE[0]}")/../cli/serve_lib.bash"

command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
HERE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The clients live outside the source tree (the build's folder by default),
# installed from the lockfile when missing or when the lockfile changed.
# gateway_e2e, gateway_guard and gateway_keys may start together (ctest -j):
# one installs while the others wait on the lock, and .installed (the
# lockfile it installed) is written only once npm ci succeeded.
NODE_DIR=${LG_GATEWAY_NODE_DIR:-$PWD/gateway-node}
mkdir -p "$NODE_DIR"
exec {install_lock}>"$NODE_DIR/.install.lock"
flock "$install_lock"
if ! cmp -s "$HERE_SRC/package-lock.json" "$NODE_DIR/.installed"; then
  rm -f "$NODE_DIR/.installed"
  cp "$HERE_SRC/package.json" "$HERE_SRC/package-lock.json" "$NODE_DIR/"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { cat "$TMP/npm.log"; fail "npm ci"; }
  cp "$HERE_SRC/package-lock.json" "$NODE_DIR/.installed"
fi
# A client another test is running must not be rewritten under it: copy
# only what changed, under the lock.
for f in "$HERE_SRC"/*.mjs; do
  cmp -s "$f" "$NODE_DIR/${f##*/}" || cp "$f" "$NODE_DIR/"
done
flock -u "$install_lock"
exec {install_lock}>&-
HERE=$NODE_DIR

# start_fake VAR: starts a fake upstream (one more: each has its own
# stats) and sets VAR to its URL
FAKES=()
start_fake() {
  local port="$TMP/$1.port" i
  node "$HERE/fake-upstream.mjs" "$port" &
  ALL_PIDS+=($!)
  for i in $(seq 100); do [ -s "$port" ] && break; sleep 0.05; done
  [ -s "$port" ] || fail "the fake upstream $1 did not start"
  printf -v "$1" 'http://127.0.0.1:%s' "$(cat "$port")"
  FAKES+=("${!1}")
}
# fakes_clean: no fake upstream of this test was ever sent what a provider
# rejects (the issue's "the fake upstream never receives a conversation a
# provider would reject, in any test"): every test calls it before it
# passes, but mutate.sh, whose client sends such conversations on purpose
fakes_clean() {
  local u v
  for u in "${FAKES[@]}"; do
    v=$(jq_url "$u/stats" '"%d: %s" % (len(d["violations"]), json.dumps(d["violations"][:5])) if d["violations"] else ""')
    [ -z "$v" ] || fail "the fake upstream $u was sent what a provider rejects ($v)"
  done
}
start_fake FAKE
# stats EXPR: EXPR over the fake upstream's /stats (what it was sent, its
# counters), in the jq_py evaluator (jq_url: no curl a check)
stats() { jq_url "$FAKE/stats" "$1"; }

# The clients' host (host.mjs: the SDKs loaded once a test, not once a run).
node "$HERE/host.mjs" "$TMP/host.port" 2>"$TMP/host.err" &
ALL_PIDS+=($!)
# client SCRIPT [NAME=VALUE...]: runs the client SCRIPT (agent-guard.mjs,
# ...) with those variables in its environment, as `env NAME=VALUE...
# node $HERE/SCRIPT` would: what it prints to stdout and to stderr, and
# its exit status. In the host once it is up; else a node of its own.
# The host runs one client at a time: clients that must run at once (a
# load) start nodes of their own.
client_send() { # SCRIPT NAME=VALUE...: each ended by a NUL, then one more
  printf '%s\0' "$@"
  printf '\0'
}
client() {
  ask_helper "$TMP/host.port" client_send "$@"
  local rc=$?
  [ $rc = 2 ] || return $rc
  local script=$1
  shift
  env "$@" node "$HERE/$script"
}

# stopped LABEL JSON: an agent's JSON (agent-openai.mjs, agent-anthropic.mjs)
# says the gateway stopped it: the failing write ran twice at most, and the
# agent ended with the final message.
stopped() {
  [ "$(echo "$2" | jq_py 'd["executions"]["write_record"]')" -le 2 ] &&
    [ "$(echo "$2" | jq_py 'd["ended"]')" = final ] || fail "$1: not stopped: $2"
}
