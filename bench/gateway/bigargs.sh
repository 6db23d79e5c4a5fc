#!/usr/bin/env bash
# bench/gateway/bigargs.sh BUILD_DIR — a tool call whose arguments are
# large and streamed in many deltas (a file a coding agent writes): the
# gateway holds the call until its arguments are complete, then decides
# it. One streamed answer (bigargs.py) whose arguments, 300 KB, come in
# LG_BIG_DELTAS (60,000) deltas of 5 bytes, on Chat Completions and on
# Anthropic Messages:
#
#   direct     curl -> the fake upstream (the bytes alone)
#   loopguard  curl -> loopguard serve --upstream (store memory:) -> the same
#
# The median of LG_BIG_RUNS (3) answers each, wall time; one JSON line a
# route ({"bench":"gateway","figure":"big_arguments",...}) and a line for a
# person, with the gateway's time per delta. The cost must grow with the
# deltas, not with their square (session 22 found 44 s for this answer on
# /v1/messages: every delta copied the arguments so far). Run by bench/run
# after the key gate. Exit 1 only when it could not run.
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.bash" # BUILD, LG, WORK, PIDS, note, calcf, median, serve_url
N=${LG_BIG_DELTAS:-60000}
RUNS=${LG_BIG_RUNS:-3}
[[ ${LG_BENCH_QUICK:-0} == 1 ]] && RUNS=${LG_BIG_RUNS:-1}
[[ -x $LG ]] || { note "big arguments: FAILED: $LG is missing (build first)"; exit 1; }

python3 "$HERE/bigargs.py" "$WORK/up.port" "$N" 2>"$WORK/up.err" &
PIDS+=($!)
for _ in $(seq 200); do [[ -s $WORK/up.port ]] && break; sleep 0.05; done
[[ -s $WORK/up.port ]] || { note "big arguments: FAILED: the fake upstream did not start: $(cat "$WORK/up.err")"; exit 1; }
UP="http://127.0.0.1:$(cat "$WORK/up.port")"
serve_url "big arguments"

# one TARGET_URL PATH BODY RUN: one answer; its wall time in ms, or "" when
# it did not come whole (the call's 300 KB of arguments not all there)
one() {
  local out=$WORK/answer.sse t
  t=$(curl -s -o "$out" -w '%{time_total}' --max-time 300 -H 'Content-Type: application/json' \
    -H "X-Loopguard-Run: big-$4" -d "$3" "$1$2") || return 0
  [[ $(grep -o abcde "$out" | wc -l) -ge $N ]] || return 0
  calcf "%.1f" "$t * 1000"
}

note "big arguments: one streamed tool call of $((N * 5 / 1000)) KB in $N deltas, median of $RUNS answers"
rc=0
for route in chat messages; do
  if [[ $route == chat ]]; then
    path=/v1/chat/completions
    body='{"model":"big","stream":true,"messages":[{"role":"user","content":"write it"}],"tools":[{"type":"function","function":{"name":"write_file"}}]}'
  else
    path=/v1/messages
    body='{"model":"big","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"write it"}],"tools":[{"name":"write_file","input_schema":{"type":"object"}}]}'
  fi
  d=() l=()
  for r in $(seq "$RUNS"); do
    d+=("$(one "$UP" "$path" "$body" "d$route$r")")
    l+=("$(one "$URL" "$path" "$body" "l$route$r")")
  done
  dm=$(median "${d[@]}")
  lm=$(median "${l[@]}")
  if [[ -z $dm || -z $lm ]]; then
    note "big arguments ($route): FAILED: an answer did not come whole (direct: ${d[*]}; loopguard: ${l[*]})"
    rc=1
    continue
  fi
  per=$(calcf "%.2f" "($lm - $dm) * 1000 / $N")
  printf '{"bench":"gateway","figure":"big_arguments","route":"%s","deltas":%d,"runs":%d,"direct_ms":%s,"loopguard_ms":%s,"added_us_per_delta":%s}\n' \
    "$route" "$N" "$RUNS" "$dm" "$lm" "$per"
  printf '  %-9s direct %9s ms   loopguard %9s ms   added %6s us a delta\n' "$route" "$dm" "$lm" "$per"
done
exit $rc
