#!/usr/bin/env bash
# monitoring.sh — the dashboard and the alert rules (monitoring/) against
# real parts: promtool checks the rules; every metric name the two files
# use exists in a live server's GET /metrics; a real Prometheus (Debian's)
# scrapes that server (temp config, a free port, --storage.tsdb.path in a
# temp dir), loads the rules, and its query API returns the series; every
# dashboard query parses and runs there. A missing prometheus or promtool
# is a failure, never a skip. Bounded: 60 s, every process ended.
LG_TEST_TIMEOUT=${LG_TEST_TIMEOUT:-60}
source "$(dirname "$0")/serve_lib.bash"
mon="$LG_SOURCE_DIR/monitoring"
pass=0 failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }
command -v prometheus >/dev/null || fail "no prometheus (apt-get install prometheus; make deps installs it)"
command -v promtool >/dev/null || fail "no promtool (Debian's prometheus package)"

promtool check rules "$mon/alerts.yml" >"$TMP/promtool.out" 2>&1 && ok || { bad "promtool check rules"; cat "$TMP/promtool.out"; }
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$mon/grafana-dashboard.json" && ok || bad "dashboard is not JSON"
# The rules' logic (promtool test rules): a provider's errors, which the
# gateway passes on (502, 503, a provider's 500), are the upstream alert's
# (LoopguardGatewayUpstreamFailing, its http_5xx answers too), not
# LoopguardServerErrors' ("check the store"); the gateway's own 500s
# are LoopguardGatewayFailing's; the sidecar's own 500s still fire
# LoopguardServerErrors.
cat >"$TMP/alerts-test.yml" <<EOF
rule_files: [$mon/alerts.yml]
evaluation_interval: 1m
tests:
  # a provider down: the gateway passes its 502s on; the sidecar's routes are fine
  - interval: 1m
    input_series:
      - series: 'loopguard_requests_total{route="calls",code="200"}'
        values: '0+100x30'
      - series: 'loopguard_requests_total{route="gateway",code="502"}'
        values: '0+50x30'
      - series: 'loopguard_requests_total{route="gateway",code="200"}'
        values: '0+10x30'
      - series: 'loopguard_gateway_failures_total'
        values: '0+0x30'
      - series: 'loopguard_gateway_upstream_errors_total{upstream="default",kind="http_5xx"}'
        values: '0+50x30'
      - series: 'loopguard_gateway_upstream_seconds_count{upstream="default"}'
        values: '0+60x30'
    promql_expr_test:
      - expr: ALERTS{alertname="LoopguardGatewayUpstreamFailing",alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="LoopguardGatewayUpstreamFailing",alertstate="firing",severity="critical",upstream="default"}'
            value: 1
    alert_rule_test:
      - eval_time: 20m
        alertname: LoopguardServerErrors
        exp_alerts: []
      - eval_time: 20m
        alertname: LoopguardGatewayFailing
        exp_alerts: []
  # the store down under the gateway: its own 500s
  - interval: 1m
    input_series:
      - series: 'loopguard_requests_total{route="gateway",code="500"}'
        values: '0+50x30'
      - series: 'loopguard_requests_total{route="gateway",code="200"}'
        values: '0+10x30'
      - series: 'loopguard_gateway_failures_total'
        values: '0+50x30'
    promql_expr_test:
      - expr: ALERTS{alertname="LoopguardGatewayFailing",alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="LoopguardGatewayFailing",alertstate="firing",severity="critical"}'
            value: 1
  # the sidecar's own 500s: still LoopguardServerErrors
  - interval: 1m
    input_series:
      - series: 'loopguard_requests_total{route="calls",code="200"}'
        values: '0+100x30'
      - series: 'loopguard_requests_total{route="calls",code="500"}'
        values: '0+10x30'
    promql_expr_test:
      - expr: ALERTS{alertname="LoopguardServerErrors",alertstate="firing"}
        eval_time: 20m
        exp_samples:
          - labels: 'ALERTS{alertname="LoopguardServerErrors",alertstate="firing",severity="critical"}'
            value: 1
  # the store stops answering for 5 minutes, then answers again
  - interval: 1m
    input_series:
      - series: 'loopguard_store_up{instance="a"}'
        values: '1 1 1 0 0 0 0 0 1 1 1'
    alert_rule_test:
      - eval_time: 2m
        alertname: LoopguardStoreDown
        exp_alerts: []
      - eval_time: 6m
        alertname: LoopguardStoreDown
        exp_alerts:
          - exp_labels: {severity: critical, instance: a}
            exp_annotations:
              summary: "the store does not answer a's reads"
              description: "Each scrape reads the store within 2 s; the log's request_failed lines with \"route\":\"metrics\" say why. Decisions fail (500) and /healthz answers 503 until it answers."
      - eval_time: 10m
        alertname: LoopguardStoreDown
        exp_alerts: []
EOF
promtool test rules "$TMP/alerts-test.yml" >"$TMP/promtool-test.out" 2>&1 && ok || { bad "promtool test rules"; cat "$TMP/promtool-test.out"; }

# A server with traffic: a stop, a budget, a refusal, latencies; its
# gateway's upstream is down (port 9: nothing listens), so a model request
# is an upstream failure.
start_server S --store "sqlite:$TMP/lg.db" --upstream "http://127.0.0.1:9/v1"
url=${S_URL%/}
post() { curl -s -XPOST -H 'Content-Type: application/json' "$url$1" -d "$2" >/dev/null; }
post /v1/chat/completions '{"model":"m","messages":[{"role":"user","content":"x"}]}'
post /v1/runs '{"run_id":"m1"}'
for i in 1 2 3 4 5 6; do post /v1/runs/m1/calls '{"tool":"t","args":{"a":1},"turn":'$i'}'; done
curl -s -XPUT -H 'Content-Type: application/json' "$url/v1/budgets/workspace:acme" -d '{"limit_usd":1,"period":"daily"}' >/dev/null
post /v1/budgets/reserve '{"scopes":["workspace:acme"],"amount_usd":0.8}'
post /v1/budgets/reserve '{"scopes":["workspace:acme"],"amount_usd":0.8}'
curl -s "$url/metrics" >"$TMP/metrics.txt"
# the gateway's requests under their own route (the provider's 502 here, not
# a failure of loopguard's: loopguard_gateway_failures_total stays 0)
grep -qx 'loopguard_requests_total{route="gateway",code="502"} 1' "$TMP/metrics.txt" &&
  grep -qx 'loopguard_gateway_failures_total 0' "$TMP/metrics.txt" && ok ||
  bad "the gateway's request is not route=\"gateway\" code 502, or counted a failure: $(grep -E 'requests_total|failures_total' "$TMP/metrics.txt")"
# Names in /metrics: every sample's, and a histogram's _bucket/_sum/_count.
have=$( { grep -v '^#' "$TMP/metrics.txt" | grep -oE '^[a-zA-Z_:][a-zA-Z0-9_:]*'
          awk '$1=="#" && $2=="TYPE" {print $3; if ($4=="histogram") {print $3"_bucket"; print $3"_sum"; print $3"_count"}}' "$TMP/metrics.txt"; } | sort -u)
used=$(grep -ohE 'loopguard_[a-z0-9_]+' "$mon/alerts.yml" "$mon/grafana-dashboard.json" | sort -u)
[ -n "$used" ] && ok || bad "no metric names found in monitoring/"
for m in $used; do
  if grep -qx "$m" <<<"$have"; then ok; else bad "metric $m is used in monitoring/ but not in GET /metrics"; fi
done
for m in loopguard_stops_total loopguard_budget_limit_usd loopguard_budget_spent_usd loopguard_request_duration_seconds_bucket; do
  grep -qx "$m" <<<"$used" && ok || bad "monitoring/ does not use $m"
done
grep -q 'loopguard_stops_total{reason="same_call_repeat"} 1' "$TMP/metrics.txt" && ok || bad "the stop is not in /metrics"

# A real Prometheus scrapes it, with the rules loaded.
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
target=${url#http://}
cat >"$TMP/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $mon/alerts.yml
scrape_configs:
  - job_name: loopguard
    metrics_path: /metrics
    static_configs:
      - targets: ["$target"]
YML
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$TMP/prom.log" 2>&1 &
prom_pid=$!
ALL_PIDS+=("$prom_pid")
papi="http://127.0.0.1:$pport"
query() { curl -s --max-time 2 --get "$papi/api/v1/query" --data-urlencode "query=$1"; }
got=
for i in $(seq 150); do
  got=$(query 'loopguard_stops_total{reason="same_call_repeat"}')
  grep -q '"value":\[[0-9.]*,"1"\]' <<<"$got" && break
  kill -0 "$prom_pid" 2>/dev/null || break
  sleep 0.2
done
if grep -q '"value":\[[0-9.]*,"1"\]' <<<"$got"; then ok; else bad "Prometheus has no loopguard_stops_total series: $got"; tail -5 "$TMP/prom.log"; fi
r=$(query 'loopguard_gateway_upstream_errors_total{kind="unreachable"}')
grep -q '"value":\[[0-9.]*,"1"\]' <<<"$r" && ok || bad "the gateway's upstream failure is not in Prometheus: $r"
for q in 'loopguard_budget_limit_usd{scope="workspace:acme"}' 'loopguard_budget_reserved_usd' \
         'loopguard_request_duration_seconds_bucket{route="calls",le="+Inf"}' 'loopguard_runs_active'; do
  r=$(query "$q")
  grep -q '"result":\[{' <<<"$r" && ok || bad "query $q: $r"
done
r=$(query 'loopguard_budget_reserved_usd{scope="workspace:acme"}')
grep -q '"0.8"' <<<"$r" && ok || bad "reserved is not 0.8: $r"
# The rules are loaded and evaluate without error.
for i in $(seq 25); do
  rules=$(curl -s --max-time 2 "$papi/api/v1/rules")
  n=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); r=[x for g in d["data"]["groups"] for x in g["rules"]]; print(len(r), sum(1 for x in r if x.get("health")=="ok"))' "$rules" 2>/dev/null)
  [ "${n% *}" -gt 0 ] 2>/dev/null && [ "${n% *}" = "${n#* }" ] && break
  sleep 0.2
done
want=$(grep -c '^ *- alert:' "$mon/alerts.yml")
[ "$n" = "$want $want" ] && ok || bad "rules loaded/healthy: $n, wanted $want $want"
# Every dashboard query runs in Prometheus.
python3 - "$mon/grafana-dashboard.json" >"$TMP/exprs" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["panels"]:
    for t in p.get("targets", []):
        print(t["expr"].replace("$__rate_interval", "1m"))
PY
while IFS= read -r e; do
  r=$(query "$e")
  grep -q '"status":"success"' <<<"$r" && ok || bad "dashboard query fails: $e: $r"
done <"$TMP/exprs"
kill -TERM "$prom_pid" 2>/dev/null
wait "$prom_pid" 2>/dev/null
# A client that hangs up before its answer is counted with code 0, and
# keeps it: the next new code took its slot and its count.
python3 - "${url#http://}" <<'PY'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
s.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"run")
s.close()
PY
hung=
for i in $(seq 50); do # the server sees the hang-up at its next read
  hung=$(curl -s "$url/metrics" | grep -E '^loopguard_requests_total\{.*code="0"\} 1$')
  [ -n "$hung" ] && break
  sleep 0.1
done
[ -n "$hung" ] && ok || bad "no request counted with code 0 after a hang-up"
curl -s -o /dev/null "$url/nope" # a 404, a code not seen yet
m=$(curl -s -w '\ncurl: %{http_code} %{size_download}' "$url/metrics"); mrc=$?
grep -qxF "$hung" <<<"$m" && ok ||
  bad "the hung-up request's series went away or changed: $hung; now (curl $mrc): $(grep -E '^loopguard_requests_total|^curl' <<<"$m")"
# runs_active: a run stopped and resumed is active again.
active() { curl -s "$url/metrics" | awk '$1=="loopguard_runs_active" {print $2}'; }
a0=$(active)
post /v1/runs '{"run_id":"m2"}'
for i in 1 2 3 4 5 6; do post /v1/runs/m2/calls '{"tool":"t","args":{"a":1},"turn":'$i'}'; done
post /v1/runs/m2/resume '{}'
[ "$(active)" = "$((a0 + 1))" ] && ok || bad "runs_active after a stop and a resume: $(active), wanted $((a0 + 1))"
stop_server S
echo "$pass passed, $failed failed"
[ $failed -eq 0 ]
