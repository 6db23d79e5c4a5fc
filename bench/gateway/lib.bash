# bench/gateway/lib.bash — what the gateway's benchmarks share (run.sh,
# keys.sh), sourced with the benchmark's arguments (BUILD_DIR): BUILD, LG
# (the loopguard binary), UP_BIN (the fake upstream), SECONDS_PER (a run's
# seconds: LG_GW_SECONDS, 5, or 2 with LG_BENCH_QUICK=1), a scratch folder
# $WORK removed at exit with every process in PIDS, note, calcf, median,
# start_upstream (the fake upstream, $UP its URL) and serve_url (loopguard
# in front of it, $URL).
BUILD=$(cd "${1:?usage: $(basename "$0") BUILD_DIR}" && pwd) || exit 2
LG=$BUILD/loopguard
UP_BIN=$BUILD/bench/gw_bench_upstream
SECONDS_PER=${LG_GW_SECONDS:-5}
[[ ${LG_BENCH_QUICK:-0} == 1 ]] && SECONDS_PER=${LG_GW_SECONDS:-2}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lg-gwbench.XXXXXX") || exit 1
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
note() { printf '%s\n' "$*"; }
calcf() { awk "BEGIN { printf \"$1\", $2 }" </dev/null; }
median() { printf '%s\n' "$@" | grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; } # of the non-empty arguments
start_upstream() { # NAME: the fake upstream -> $UP
  "$UP_BIN" "$WORK/up.port" 2>"$WORK/up.err" &
  PIDS+=($!)
  for _ in $(seq 100); do [[ -s $WORK/up.port ]] && break; sleep 0.05; done
  [[ -s $WORK/up.port ]] || { note "$1: FAILED: the fake upstream did not start: $(cat "$WORK/up.err")"; exit 1; }
  UP="http://127.0.0.1:$(cat "$WORK/up.port")"
}
serve_url() { # WHAT [FLAGS...]: loopguard serve --upstream $UP/v1 (store memory:) with FLAGS -> $URL, or exit 1
  local what=$1
  shift
  "$LG" serve --listen 127.0.0.1:0 --store memory: --upstream "$UP/v1" --log "$WORK/lg.log" "$@" \
    >"$WORK/lg.out" 2>"$WORK/lg.err" &
  PIDS+=($!)
  URL=
  for _ in $(seq 200); do
    URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/lg.out" 2>/dev/null | head -n 1)
    [[ -n $URL ]] && break
    sleep 0.05
  done
  [[ -n $URL ]] || { note "$what: FAILED: loopguard did not start: $(head -c 300 "$WORK/lg.err")"; exit 1; }
}
