#!/usr/bin/env bash
# tls.sh — the gateway in front of an HTTPS upstream, as in production:
# the fake upstream serves TLS with a certificate of a CA made here, and
# offers HTTP/2 or HTTP/1.1 by ALPN, as api.openai.com and
# api.anthropic.com do; an egress proxy of our own (connect-proxy.mjs)
# stands for an operator's.
#
# Asserts: an upstream whose CA is not trusted is never sent a request and
# its client gets a 502 in the API's shape that says how to trust the CA
# (the server keeps serving); a CA given by the upstreams file's `ca_file`
# or by SSL_CERT_FILE or SSL_CERT_DIR (a list of folders) is trusted, and a
# wrong path stops the start naming it; agents on the real `openai` and
# `@anthropic-ai/sdk` packages are stopped, stream and not, sixteen at
# once too; the gateway speaks HTTP/1.1 upstream (as the providers' SDKs
# do), so that a client that hangs up mid-stream ends its upstream request
# at once; https_proxy and http_proxy from the environment carry the
# upstream requests, no_proxy bypasses them; an https:// proxy's own
# certificate is checked against SSL_CERT_FILE's CAs.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash" # the clients, the (plain) fake upstream: HERE, FAKE
get() { jq_py "$1"; }
command -v openssl >/dev/null || fail "openssl is not installed (make deps)"

# A CA, and the upstream's certificate for 127.0.0.1 that it signs.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/ca.key" -out "$TMP/ca.pem" -days 2 \
  -subj "/CN=loopguard test CA" >"$TMP/openssl.log" 2>&1 || fail "openssl (CA): $(cat "$TMP/openssl.log")"
openssl req -newkey rsa:2048 -nodes -keyout "$TMP/srv.key" -out "$TMP/srv.csr" -subj "/CN=127.0.0.1" \
  >"$TMP/openssl.log" 2>&1 || fail "openssl (request): $(cat "$TMP/openssl.log")"
printf 'subjectAltName=IP:127.0.0.1\n' >"$TMP/san.cnf"
openssl x509 -req -in "$TMP/srv.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" -CAcreateserial \
  -out "$TMP/srv.pem" -days 2 -extfile "$TMP/san.cnf" >"$TMP/openssl.log" 2>&1 ||
  fail "openssl (certificate): $(cat "$TMP/openssl.log")"

FAKE_TLS_CERT="$TMP/srv.pem" FAKE_TLS_KEY="$TMP/srv.key" node "$HERE/fake-upstream.mjs" "$TMP/tls.port" &
ALL_PIDS+=($!)
node "$HERE/connect-proxy.mjs" "$TMP/proxy.port" &
ALL_PIDS+=($!)
# an https:// proxy, its own certificate of the same private CA
PROXY_TLS_CERT="$TMP/srv.pem" PROXY_TLS_KEY="$TMP/srv.key" node "$HERE/connect-proxy.mjs" "$TMP/sproxy.port" &
ALL_PIDS+=($!)
for i in $(seq 100); do [ -s "$TMP/tls.port" ] && [ -s "$TMP/proxy.port" ] && [ -s "$TMP/sproxy.port" ] && break; sleep 0.05; done
[ -s "$TMP/tls.port" ] || fail "the HTTPS fake upstream did not start"
[ -s "$TMP/proxy.port" ] && [ -s "$TMP/sproxy.port" ] || fail "a proxy did not start"
TLS="https://127.0.0.1:$(cat "$TMP/tls.port")"
PROXY="http://127.0.0.1:$(cat "$TMP/proxy.port")"
SPROXY="https://127.0.0.1:$(cat "$TMP/sproxy.port")"
tstats() { curl -sf --cacert "$TMP/ca.pem" "$TLS/stats" | get "$1"; }
proxied() { curl -sf "$PROXY/count" | get "d['$1'].get('$2', 0)"; } # KIND HOST:PORT

hdr=(-H 'Content-Type: application/json')
chat='{"model":"finish","messages":[{"role":"user","content":"x"}]}'
msgs='{"model":"finish","max_tokens":50,"messages":[{"role":"user","content":"x"}]}'

note "an upstream's CA the system does not trust: no request sent, a 502 in the API's shape that says what to do"
start_server untrusted --store memory: --upstream "$TLS/v1" --log "$TMP/untrusted.log"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$untrusted_URL/v1/chat/completions")
[ "$code" = 502 ] || fail "untrusted (chat): $code $(cat "$TMP/e.json")"
get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "certificate.*ca_file.*SSL_CERT_FILE" ||
  fail "untrusted (chat): the message does not say how to trust the CA: $(cat "$TMP/e.json")"
[ "$(get 'd["error"]["code"]' <"$TMP/e.json")" = upstream_unreachable ] || fail "untrusted (chat): $(cat "$TMP/e.json")"
code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' "${hdr[@]}" -H 'anthropic-version: 2023-06-01' -d "$msgs" \
  "$untrusted_URL/v1/messages")
[ "$code" = 502 ] && [ "$(get 'd["type"] + "/" + d["error"]["type"]' <"$TMP/e.json")" = error/api_error ] &&
  get 'd["error"]["message"]' <"$TMP/e.json" | grep_q "certificate" || fail "untrusted (messages): $code $(cat "$TMP/e.json")"
[ "$(tstats 'len(d["models"])')" = 0 ] || fail "a request reached an upstream whose certificate was not trusted: $(tstats 'd["models"]')"
grep -q '^loopguard_gateway_upstream_errors_total{upstream="default",kind="unreachable"} 2$' <<<"$(curl -sf "$untrusted_URL/metrics")" ||
  fail "untrusted: not counted: $(curl -s "$untrusted_URL/metrics" | grep upstream_errors)"
grep '"event":"upstream_failed"' "$TMP/untrusted.log" | grep '"kind":"unreachable"' | grep_q 'certificate' ||
  fail "untrusted: no log line that says why: $(cat "$TMP/untrusted.log")"
curl -sf -o /dev/null "$untrusted_URL/healthz" || fail "the server stopped serving"

note "a CA path that cannot be read stops the start, naming it"
echo '{"upstreams":{"tls":{"base_url":"'"$TLS"'/v1","ca_file":"'"$TMP"'/none.pem"}}}' >"$TMP/bad.json"
"$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstreams "$TMP/bad.json" >"$TMP/bad.out" 2>&1 &&
  fail "a missing ca_file started: $(cat "$TMP/bad.out")"
grep -q "upstreams.tls.ca_file: cannot read $TMP/none.pem" "$TMP/bad.out" || fail "missing ca_file: $(cat "$TMP/bad.out")"
SSL_CERT_FILE="$TMP/none.pem" "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$TLS/v1" \
  >"$TMP/bad.out" 2>&1 && fail "a missing SSL_CERT_FILE started: $(cat "$TMP/bad.out")"
grep -q "SSL_CERT_FILE: cannot read $TMP/none.pem" "$TMP/bad.out" || fail "missing SSL_CERT_FILE: $(cat "$TMP/bad.out")"

note "the upstreams file's ca_file: agents (openai, @anthropic-ai/sdk) stopped, stream and not, over HTTP/1.1"
echo '{"upstreams":{"tls":{"base_url":"'"$TLS"'/v1","ca_file":"'"$TMP"'/ca.pem"},' \
  '"tls-anthropic":{"base_url":"'"$TLS"'/v1","api":"anthropic","ca_file":"'"$TMP"'/ca.pem"}}}' >"$TMP/ups.json"
start_server gw --store memory: --upstreams "$TMP/ups.json" --log "$TMP/gw.log"
h1_before=$(tstats 'd["http_versions"].get("1.1", 0)')
h2_before=$(tstats 'd["http_versions"].get("2.0", 0) + 1') # and this /stats
for stream in 0 1; do
  out=$(client agent-openai.mjs BASE_URL="$gw_URL/v1" MODEL=loop-write STREAM=$stream) || fail "openai stream=$stream: $out"
  stopped "openai stream=$stream" "$out"
  out=$(client agent-anthropic.mjs BASE_URL="$gw_URL" MODEL=loop-write STREAM=$stream) || fail "anthropic stream=$stream: $out"
  stopped "anthropic stream=$stream" "$out"
done
out=$(client agent-openai.mjs BASE_URL="$gw_URL/v1" MODEL=finish) || fail "finish: $out"
[ "$(echo "$out" | get 'd["ended"]')" = final ] && [ "$(echo "$out" | get 'd["executions"]["lookup"]')" = 1 ] ||
  fail "an agent that does not loop, over TLS: $out"
# HTTP/2 would hold a hung-up client's cancel until the connection's next use (see below)
[ "$(tstats 'int(d["http_versions"].get("1.1", 0) - '"$h1_before"' >= 12 and d["http_versions"]["2.0"] == '"$h2_before"')')" = 1 ] ||
  fail "the upstream requests did not go over HTTP/1.1: $(tstats 'd["http_versions"]') (before: 1.1 $h1_before, 2.0 $h2_before)"

note "sixteen agents at once: every one stopped"
pids=()
for i in $(seq 16); do
  BASE_URL="$gw_URL/v1" MODEL=loop-write STREAM=$((i % 2)) node "$HERE/agent-openai.mjs" >"$TMP/many.$i" 2>&1 &
  pids+=($!)
done
for i in $(seq 16); do
  wait "${pids[$((i - 1))]}" || fail "agent $i of 16: $(cat "$TMP/many.$i")"
  stopped "agent $i of 16" "$(cat "$TMP/many.$i")"
done
[ "$(tstats 'len(d["violations"])')" = 0 ] || fail "the upstream got a conversation a provider rejects: $(tstats 'd["violations"]')"

note "a client that hangs up mid-stream: its upstream request ends at once (on an idle gateway too)"
before=$(tstats 'd["aborted"]')
curl -s -N --max-time 1 -o /dev/null "${hdr[@]}" \
  -d '{"model":"drip-long","stream":true,"messages":[{"role":"user","content":"x"}]}' "$gw_URL/v1/chat/completions"
for i in $(seq 50); do [ "$(tstats 'd["aborted"]')" -gt "$before" ] && break; sleep 0.1; done
[ "$(tstats 'd["aborted"]')" -gt "$before" ] || fail "the upstream request went on after the client left"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$gw_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "after a hang-up: $code $(cat "$TMP/a.json")"
# the client left, the upstream did not fail: no upstream error counted, none logged; a hang-up
# counted (once the exchange's end is noted, a moment after the upstream saw its connection close)
for i in $(seq 20); do
  m=$(curl -sf "$gw_URL/metrics")
  grep -q '^loopguard_gateway_client_hangups_total{upstream="tls"} 1$' <<<"$m" && break
  sleep 0.05
done
nz=$(grep '^loopguard_gateway_upstream_errors_total' <<<"$m" | grep -v ' 0$')
[ -z "$nz" ] || fail "a client's hang-up counted as an upstream error: $nz"
grep -q '^loopguard_gateway_client_hangups_total{upstream="tls"} 1$' <<<"$m" ||
  fail "the hang-up not counted: $(grep client_hangups <<<"$m")"
grep -q '"event":"upstream_failed"' "$TMP/gw.log" && fail "a client's hang-up logged as an upstream failure: $(grep upstream_failed "$TMP/gw.log")"

note "SSL_CERT_FILE trusts the CA for an upstream given by --upstream"
SSL_CERT_FILE="$TMP/ca.pem" start_server env --store memory: --upstream "$TLS/v1" --log "$TMP/env.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$env_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "SSL_CERT_FILE: $code $(cat "$TMP/a.json")"

note "SSL_CERT_DIR, folders split by ':' as OpenSSL reads it: the CA found in the second"
mkdir -p "$TMP/cas.empty" "$TMP/cas"
cp "$TMP/ca.pem" "$TMP/cas/"
openssl rehash "$TMP/cas" >"$TMP/openssl.log" 2>&1 || fail "openssl rehash: $(cat "$TMP/openssl.log")"
SSL_CERT_DIR="$TMP/cas.empty:$TMP/cas" start_server dir --store memory: --upstream "$TLS/v1" --log "$TMP/dir.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$dir_URL/v1/chat/completions")
[ "$code" = 200 ] || fail "SSL_CERT_DIR as a list: $code $(cat "$TMP/a.json")"
SSL_CERT_DIR="$TMP/cas:$TMP/none" "$LG_BIN" serve --listen 127.0.0.1:0 --store memory: --upstream "$TLS/v1" \
  >"$TMP/bad.out" 2>&1 && fail "a missing folder in SSL_CERT_DIR started: $(cat "$TMP/bad.out")"
grep -q "SSL_CERT_DIR: cannot read $TMP/none" "$TMP/bad.out" || fail "missing SSL_CERT_DIR folder: $(cat "$TMP/bad.out")"

note "a proxy from the environment: https_proxy tunnels the upstream's TLS (CONNECT), http_proxy forwards, no_proxy bypasses"
at="127.0.0.1:$(cat "$TMP/tls.port")"
plain_at=${FAKE#http://}
https_proxy="$PROXY" http_proxy="$PROXY" no_proxy= NO_PROXY= SSL_CERT_FILE="$TMP/ca.pem" \
  start_server px --store memory: --upstream "$TLS/v1" --log "$TMP/px.log"
out=$(client agent-openai.mjs BASE_URL="$px_URL/v1" MODEL=loop-write STREAM=1) || fail "through the proxy: $out"
stopped "through the proxy" "$out"
[ "$(proxied connect "$at")" -ge 1 ] || fail "https_proxy: no CONNECT to $at: $(curl -s "$PROXY/count")"
curl -sf -o /dev/null "$px_URL/v1/models" || fail "the models list through the proxy"
# the second upstream, plain HTTP, named by the request's route: forwarded by http_proxy
echo '{"upstreams":{"plain":{"base_url":"'"$FAKE"'/v1"}}}' >"$TMP/plain.json"
http_proxy="$PROXY" no_proxy= NO_PROXY= start_server pp --store memory: --upstreams "$TMP/plain.json" --log "$TMP/pp.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$pp_URL/v1/chat/completions")
[ "$code" = 200 ] && [ "$(proxied forward "$plain_at")" -ge 1 ] ||
  fail "http_proxy: $code $(cat "$TMP/a.json") $(curl -s "$PROXY/count")"
n=$(proxied connect "$at")
https_proxy="$PROXY" no_proxy=127.0.0.1 SSL_CERT_FILE="$TMP/ca.pem" \
  start_server np --store memory: --upstream "$TLS/v1" --log "$TMP/np.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$np_URL/v1/chat/completions")
[ "$code" = 200 ] && [ "$(proxied connect "$at")" = "$n" ] ||
  fail "no_proxy: $code $(cat "$TMP/a.json"), CONNECTs $n -> $(proxied connect "$at")"

note "an https:// proxy behind the private CA: SSL_CERT_FILE checks its certificate too (an upstream's ca_file does not)"
at="127.0.0.1:$(cat "$TMP/tls.port")"
https_proxy="$SPROXY" no_proxy= NO_PROXY= SSL_CERT_FILE="$TMP/ca.pem" \
  start_server sp --store memory: --upstream "$TLS/v1" --log "$TMP/sp.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$sp_URL/v1/chat/completions")
sproxied=$(curl -sf --cacert "$TMP/ca.pem" "$SPROXY/count")
[ "$code" = 200 ] && [ "$(get "d['connect'].get('$at', 0)" <<<"$sproxied")" -ge 1 ] ||
  fail "through an https:// proxy: $code $(cat "$TMP/a.json") $sproxied"
# the upstream trusted by its ca_file alone: the proxy's certificate is the system's to check, and fails
echo '{"upstreams":{"tls":{"base_url":"'"$TLS"'/v1","ca_file":"'"$TMP"'/ca.pem"}}}' >"$TMP/ups1.json"
https_proxy="$SPROXY" no_proxy= NO_PROXY= start_server spf --store memory: --upstreams "$TMP/ups1.json" --log "$TMP/spf.log"
code=$(curl -s -o "$TMP/a.json" -w '%{http_code}' "${hdr[@]}" -d "$chat" "$spf_URL/v1/chat/completions")
[ "$code" = 502 ] && get 'd["error"]["message"]' <"$TMP/a.json" | grep_q "https:// proxy's own certificate.*SSL_CERT_FILE" ||
  fail "an https:// proxy whose CA only an upstream's ca_file names: $code $(cat "$TMP/a.json")"

for s in untrusted gw env dir px pp np sp spf; do stop_server $s; done
fakes_clean
echo "gateway tls: OK"
