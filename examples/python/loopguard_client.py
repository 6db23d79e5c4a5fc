"""loopguard_client — a small client of the loopguard HTTP sidecar (http-api-v1).

Standard library only (http.client, json, ssl): copy this one file next to
your agent. One Client keeps one keep-alive connection; use one per thread.
http:// and https:// URLs (a loopguard behind a TLS proxy; ssl_context=
sets the certificates to trust), with an optional path prefix.

    from loopguard_client import Client

    lg = Client("http://127.0.0.1:8787", token=None)
    # The policy says what "the same call" means for each tool: here the
    # invoice's case and spaces do not count, and a charge is a write.
    run = lg.create_run(policy={"tools": {"charge_card": {
        "side_effects": True, "loop_key": {"invoice": ["upper", "trim"], "amount": []}}}})
    d = lg.call(run["run_id"], "charge_card", {"invoice": "INV-1", "amount": 49})
    if d["action"] == "execute":
        ...run the tool...
        lg.result(run["run_id"], "progress", call_id=d["call_id"], value={"ok": True})
    elif d["action"] == "replay":
        use(d["saved_result"])          # the same operation already happened
    elif d["action"] == "block":
        tell_the_model(d["message"])    # do not run the tool
    else:                               # "stop"
        print(d["envelope"])            # the run is over; the envelope says why

Errors of the server (4xx, 5xx) raise LoopGuardError with the status, the
type ("invalid_request", "not_found", ...), the message and the field. The
operations ledger's claim is the exception: its outcomes (claimed, replay,
in_progress, mismatch, unknown_outcome) are answers, returned as a dict.
"""

import http.client
import json
import os
import ssl
import urllib.parse

__all__ = ["Client", "LoopGuardError", "RawJSON"]

_ABSENT = object()


class RawJSON:
    """JSON text sent as it is, byte for byte: a tool call's arguments as the
    model wrote them (`4.9e1` stays `4.9e1`; Python's json would send 49.0).
    The text must be one valid JSON value (checked here)."""

    def __init__(self, text):
        if isinstance(text, bytes):
            text = text.decode()
        json.loads(text)  # raises ValueError when it is not JSON
        self.text = text


def _encode(body):
    """json.dumps, with every RawJSON spliced in verbatim."""
    raws = []

    def default(o):
        if isinstance(o, RawJSON):
            raws.append(o.text)
            return "\x00raw%d\x00" % (len(raws) - 1)
        raise TypeError("%r is not JSON serializable" % (o,))

    out = json.dumps(body, separators=(",", ":"), default=default)
    for i, text in enumerate(raws):
        out = out.replace(json.dumps("\x00raw%d\x00" % i), text, 1)
    return out.encode()


class LoopGuardError(Exception):
    """An error answer of the server: {"error": {"code", "type", "message"}}."""

    def __init__(self, status, type_, message, field=None, body=None):
        super().__init__("%s %s: %s" % (status, type_, message))
        self.status = status
        self.type = type_
        self.message = message
        self.field = field
        self.body = body


class Client:
    """A connection to one loopguard server.

    base_url defaults to $LOOPGUARD_URL, else http://127.0.0.1:8787; token
    to $LOOPGUARD_TOKEN (a bearer token of role agent or operator), else
    none (a server without tokens, on loopback).
    """

    def __init__(self, base_url=None, token=None, timeout=10.0, ssl_context=None):
        base_url = base_url or os.environ.get("LOOPGUARD_URL") or "http://127.0.0.1:8787"
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError("loopguard URL %r: use http://HOST:PORT or https://HOST:PORT" % base_url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl_context = ssl_context
        self.token = token if token is not None else os.environ.get("LOOPGUARD_TOKEN")
        self.timeout = timeout
        self._conn = None

    # ---- plumbing ----

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, method, path, body):
        if self._conn is None:
            if self.https:
                ctx = self.ssl_context or ssl.create_default_context()
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                                         context=ctx)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = _encode(body)
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        self._conn.request(method, self.prefix + path, body=data, headers=headers)
        resp = self._conn.getresponse()
        raw = resp.read()
        if resp.getheader("Connection", "").lower() == "close":
            self.close()
        return resp.status, resp.getheader("Content-Type", ""), raw

    def request(self, method, path, body=None, ok=(200, 201)):
        """One request; returns (status, parsed JSON or text). Statuses not in
        `ok` raise LoopGuardError. A kept connection the server has closed
        meanwhile (it closes idle ones: a tool that ran longer than its
        timeout) is re-opened and the request sent again, once. Nothing
        else is sent twice: a timeout, or a new connection dropped, raises,
        since the server may have decided the request before its answer was
        lost, and a call sent again is a second call (its repeat counted
        once more)."""
        for attempt in (0, 1):
            kept = self._conn is not None
            try:
                status, ctype, raw = self._send(method, path, body)
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt or not kept:
                    raise
            except (http.client.HTTPException, OSError):
                self.close()
                raise
        if ctype.startswith("application/json"):
            doc = json.loads(raw.decode() or "null")
        else:
            doc = raw.decode()
        if status not in ok:
            err = doc.get("error", {}) if isinstance(doc, dict) else {}
            raise LoopGuardError(status, err.get("type", "?"), err.get("message", raw.decode()),
                                 err.get("field"), doc)
        return status, doc

    @staticmethod
    def _q(s):
        return urllib.parse.quote(s, safe="")

    @staticmethod
    def _fields(**kw):
        return {k: v for k, v in kw.items() if v is not None and v is not _ABSENT}

    # ---- runs and decisions ----

    def create_run(self, run_id=None, group=None, policy=None, progress_version=None,
                   scopes=None):
        """POST /v1/runs -> {"run_id", "policy"} (the effective policy).
        scopes: the shared budgets the run's model calls reserve against."""
        return self.request("POST", "/v1/runs", self._fields(
            run_id=run_id, group=group, policy=policy, progress_version=progress_version,
            scopes=scopes))[1]

    def run(self, run_id):
        """GET /v1/runs/{id} -> {run_id, group, status, counters, terminal_reason, envelope}."""
        return self.request("GET", "/v1/runs/" + self._q(run_id))[1]

    def call(self, run_id, tool, args=None, turn=None, call_id=None, idempotency_key=None,
             agent=None):
        """Before a tool runs: {"call_id", "action": execute|block|replay|stop, ...}.
        args is a dict, or the arguments' JSON text as the model wrote it (a
        str or RawJSON), sent as it is."""
        if isinstance(args, (str, bytes)):
            args = RawJSON(args)
        return self.request("POST", "/v1/runs/%s/calls" % self._q(run_id), self._fields(
            tool=tool, args=args if args is not None else {}, turn=turn, call_id=call_id,
            idempotency_key=idempotency_key, agent=agent))[1]

    def result(self, run_id, status, call_id=None, value=_ABSENT, progress_version=None,
               side_effect_committed=None, retry_after_ms=None, operation_id=None):
        """After a tool ran: {"action": continue|stop, ...}. status is one of
        progress, complete, retryable, fatal, permission_denied,
        policy_blocked, human_required."""
        body = self._fields(call_id=call_id, status=status, progress_version=progress_version,
                            side_effect_committed=side_effect_committed,
                            retry_after_ms=retry_after_ms, operation_id=operation_id)
        if value is not _ABSENT:
            body["value"] = value
        return self.request("POST", "/v1/runs/%s/results" % self._q(run_id), body)[1]

    def state(self, run_id, world):
        return self.request("POST", "/v1/runs/%s/state" % self._q(run_id), {"world": world})[1]

    def handoff(self, run_id, from_agent, to_agent):
        return self.request("POST", "/v1/runs/%s/handoffs" % self._q(run_id),
                            {"from": from_agent, "to": to_agent})[1]

    def model(self, run_id, input_tokens, max_tokens=None, cost_usd=None, model=None, turn=None):
        """Before a paid model call, with its worst case: {"action": execute|stop,
        "reservation_id"?}."""
        return self.request("POST", "/v1/runs/%s/model" % self._q(run_id), self._fields(
            input_tokens=input_tokens, max_tokens=max_tokens, cost_usd=cost_usd, model=model,
            turn=turn))[1]

    def usage(self, run_id, input_tokens, output_tokens, reservation_id=None, cost_usd=None):
        """After the model call: its real tokens and cost."""
        return self.request("POST", "/v1/runs/%s/usage" % self._q(run_id), self._fields(
            reservation_id=reservation_id, input_tokens=input_tokens,
            output_tokens=output_tokens, cost_usd=cost_usd))[1]

    def cancel(self, run_id, reason=None):
        """The kill switch (operator): {"envelope"}."""
        return self.request("POST", "/v1/runs/%s/cancel" % self._q(run_id),
                            self._fields(reason=reason))[1]

    def cancel_group(self, group, reason=None):
        """Every run of a group, now and later (operator): {"cancelled": [ids]}."""
        return self.request("POST", "/v1/groups/%s/cancel" % self._q(group),
                            self._fields(reason=reason))[1]

    def runs(self, status=None, reason=None, group=None, limit=None):
        """Runs, newest first (operator)."""
        q = urllib.parse.urlencode(self._fields(status=status, reason=reason, group=group,
                                                limit=limit))
        return self.request("GET", "/v1/runs" + ("?" + q if q else ""))[1]["runs"]

    def trace(self, run_id):
        """The run as a trace-v1 file (text): `loopguard replay` gives the same decisions."""
        return self.request("GET", "/v1/runs/%s/trace" % self._q(run_id))[1]

    # ---- the operations ledger ----

    def claim(self, key, request_fingerprint, run_id=None, lease_ms=None):
        """{"outcome": claimed|replay|in_progress|mismatch|unknown_outcome, "result"?}."""
        return self.request("POST", "/v1/operations/claim", self._fields(
            key=key, request_fingerprint=request_fingerprint, run_id=run_id, lease_ms=lease_ms),
            ok=(200, 201, 409, 422))[1]

    def commit(self, key, result, operation_id=None):
        return self.request("POST", "/v1/operations/%s/commit" % self._q(key), self._fields(
            result=result, operation_id=operation_id))[1]

    def fail(self, key, retryable):
        return self.request("POST", "/v1/operations/%s/fail" % self._q(key),
                            {"retryable": bool(retryable)})[1]

    def operation(self, key):
        return self.request("GET", "/v1/operations/" + self._q(key))[1]

    # ---- budgets (the spend gate) ----

    def set_budget(self, scope, limit_usd, period, max_in_flight_usd=None):
        """PUT /v1/budgets/{scope} (operator); period: daily, weekly, monthly, none."""
        return self.request("PUT", "/v1/budgets/" + self._q(scope), self._fields(
            limit_usd=limit_usd, period=period, max_in_flight_usd=max_in_flight_usd))[1]

    def budget(self, scope):
        return self.request("GET", "/v1/budgets/" + self._q(scope))[1]

    def budgets(self):
        """Every budget (operator)."""
        return self.request("GET", "/v1/budgets")[1]["budgets"]

    # ---- the server ----

    def healthz(self):
        return self.request("GET", "/healthz")[1]

    def metrics(self):
        return self.request("GET", "/metrics")[1]
