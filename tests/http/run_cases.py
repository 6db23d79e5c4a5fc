#!/usr/bin/env python3
"""run_cases.py — the HTTP cases of tests/data/http/<case>/, against a real server.

For every case folder (sorted; or only the ones named on the command line)
this starts `$LG_BIN serve --listen 127.0.0.1:0` on a store of its own (a
new SQLite file in a temp folder; with LG_TEST_STORE=postgres a new
database on the server of LG_PG_URL), sends the requests of the case's
exchanges.jsonl in order on one keep-alive connection, compares each
answer with what the same line expects, stops the server with SIGTERM and
requires exit status 0 (a drained stop; under ASan, no leak). The format
is tests/data/http/README.md.

A failed exchange prints the case, the line, the request, every mismatch
with its path in the answer (`json.error.message: got "...", wanted it to
contain "..."`) and the whole answer; the other exchanges of that case are
still sent (a case's later lines may depend on earlier ones: their
failures follow from the first). Closes with `http cases: N passed, N
failed`; exits 1 if any failed, 2 on bad usage or a malformed case.

Environment: LG_BIN (the loopguard binary, required), LG_TEST_DATA (the
tests/data folder; default: next to this script), LG_TEST_STORE and
LG_PG_URL (PostgreSQL, under tests/pg/with-postgres.sh).
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
REQUEST_KEYS = {"body", "raw_body", "token", "request_headers"}
EXPECT_KEYS = {"status", "headers", "json", "body_contains", "body_lacks", "save"}
SERVER_KEYS = {"args", "tokens"}
SUB = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class CaseError(Exception):
    """A malformed case file: the runner cannot know what it means."""


# ---------------------------------------------------------------- the case

def read_exchanges(path):
    """The lines of exchanges.jsonl as (line number, dict); '#' lines and blank lines are comments."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                ex = json.loads(s)
            except json.JSONDecodeError as e:
                raise CaseError("%s:%d: not JSON: %s" % (path, n, e))
            if not isinstance(ex, dict):
                raise CaseError("%s:%d: expected a JSON object" % (path, n))
            methods = [k for k in ex if k in METHODS]
            if len(methods) != 1:
                raise CaseError("%s:%d: exactly one of %s must hold the path" % (path, n, ", ".join(METHODS)))
            unknown = set(ex) - REQUEST_KEYS - EXPECT_KEYS - set(methods)
            if unknown:
                raise CaseError("%s:%d: unknown field%s: %s" % (path, n, "s" if len(unknown) > 1 else "",
                                                               ", ".join(sorted(unknown))))
            if "status" not in ex:
                raise CaseError("%s:%d: status: this field is required" % (path, n))
            if "body" in ex and "raw_body" in ex:
                raise CaseError("%s:%d: body and raw_body: give one" % (path, n))
            out.append((n, ex))
    if not out:
        raise CaseError("%s: no exchanges" % path)
    return out


def read_server(case_dir):
    path = os.path.join(case_dir, "server.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise CaseError("%s: not JSON: %s" % (path, e))
    unknown = set(cfg) - SERVER_KEYS
    if unknown:
        raise CaseError("%s: unknown field: %s" % (path, ", ".join(sorted(unknown))))
    if not isinstance(cfg.get("args", []), list) or not isinstance(cfg.get("tokens", {}), dict):
        raise CaseError("%s: args is a list of strings, tokens an object of role: token" % path)
    return cfg


# ---------------------------------------------------------------- variables

def substitute(value, env, where):
    """${NAME} in every string of a request, from what earlier answers saved (and CASE, TMP)."""
    if isinstance(value, str):
        def one(m):
            if m.group(1) not in env:
                raise CaseError("%s: ${%s} was not saved by an earlier exchange" % (where, m.group(1)))
            v = env[m.group(1)]
            return v if isinstance(v, str) else json.dumps(v)
        return SUB.sub(one, value)
    if isinstance(value, list):
        return [substitute(v, env, where) for v in value]
    if isinstance(value, dict):
        return {substitute(k, env, where): substitute(v, env, where) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- matching

def show(v):
    return json.dumps(v, ensure_ascii=False)


def match(want, got, path, errs):
    """Appends to errs every way got differs from want (see README.md: "Matching")."""
    if isinstance(want, str) and want.startswith("$"):
        if want.startswith("$$"):
            want = want[1:]  # a literal string that starts with $
        elif want == "$any":
            return
        elif want.startswith("$contains:"):
            text = want[len("$contains:"):]
            if not isinstance(got, str) or text not in got:
                errs.append("%s: got %s, wanted it to contain %s" % (path, show(got), show(text)))
            return
        elif want.startswith("$regex:"):
            if not isinstance(got, str) or not re.search(want[len("$regex:"):], got):
                errs.append("%s: got %s, wanted it to match /%s/" % (path, show(got), want[len("$regex:"):]))
            return
        elif want in ("$string", "$number", "$object", "$array"):
            kinds = {"$string": (str,), "$number": (int, float), "$object": (dict,), "$array": (list,)}
            if not isinstance(got, kinds[want]) or isinstance(got, bool):
                errs.append("%s: got %s, wanted a %s" % (path, show(got), want[1:]))
            return
        else:
            raise CaseError("%s: unknown matcher %s (use $$ for a literal $)" % (path, show(want)))
    if isinstance(want, dict):
        if not isinstance(got, dict):
            errs.append("%s: got %s, wanted an object" % (path, show(got)))
            return
        for k, w in want.items():
            if w == "$absent":
                if k in got:
                    errs.append("%s.%s: got %s, wanted no such field" % (path, k, show(got[k])))
            elif k not in got:
                errs.append("%s.%s: missing, wanted %s" % (path, k, show(w)))
            else:
                match(w, got[k], "%s.%s" % (path, k), errs)
        return
    if isinstance(want, list):
        if not isinstance(got, list):
            errs.append("%s: got %s, wanted an array" % (path, show(got)))
            return
        if len(got) != len(want):
            errs.append("%s: got %d items, wanted %d: %s" % (path, len(got), len(want), show(got)))
            return
        for i, (w, g) in enumerate(zip(want, got)):
            match(w, g, "%s[%d]" % (path, i), errs)
        return
    # Scalars: equal, and of the same kind (1 is not true, 1 equals 1.0).
    if isinstance(want, bool) != isinstance(got, bool) or want != got:
        errs.append("%s: got %s, wanted %s" % (path, show(got), show(want)))


def lookup(doc, dotted):
    """doc's value at a.b[0].c, or raise KeyError."""
    cur = doc
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", dotted):
        if part.startswith("["):
            cur = cur[int(part[1:-1])]
        else:
            cur = cur[part]
    return cur


def check(ex, status, headers, body, env):
    """The mismatches of one answer, and what it saves into env."""
    errs = []
    if status != ex["status"]:
        errs.append("status: got %d, wanted %d" % (status, ex["status"]))
    for name, want in ex.get("headers", {}).items():
        got = headers.get(name.lower())
        if want == "$absent":
            if got is not None:
                errs.append("headers.%s: got %s, wanted no such header" % (name, show(got)))
        elif got is None:
            errs.append("headers.%s: missing, wanted %s" % (name, show(want)))
        else:
            match(want, got, "headers." + name, errs)
    text = body.decode("utf-8", "replace")
    for s in ex.get("body_contains", []):
        if s not in text:
            errs.append("body: lacks %s" % show(s))
    for s in ex.get("body_lacks", []):
        if s in text:
            errs.append("body: holds %s, wanted it not to" % show(s))
    doc = None
    if "json" in ex or "save" in ex:
        try:  # JSON is UTF-8 (RFC 8259): a byte that is not is an error, not replaced
            doc = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            errs.append("body: not UTF-8 (%s)" % e)
        except json.JSONDecodeError as e:
            errs.append("body: not JSON (%s)" % e)
    if doc is not None and "json" in ex:
        match(ex["json"], doc, "json", errs)
    if doc is not None:
        for name, dotted in ex.get("save", {}).items():
            try:
                env[name] = lookup(doc, dotted)
            except (KeyError, IndexError, TypeError):
                errs.append("save.%s: the answer has no %s" % (name, dotted))
    return errs


# ---------------------------------------------------------------- the server

class Server:
    def __init__(self, case_dir, cfg, tmp):
        self.tmp = tmp
        self.tokens = cfg.get("tokens", {})
        args = [os.environ["LG_BIN"], "serve", "--listen", "127.0.0.1:0",
                "--store", self.store_url(os.path.basename(case_dir)),
                "--log", os.path.join(tmp, "server.log")]
        if self.tokens:
            tf = os.path.join(tmp, "tokens")
            with open(tf, "w") as f:
                for role, tok in self.tokens.items():
                    f.write("%s %s\n" % (role, tok))
            args += ["--tokens", tf]
        args += substitute(cfg.get("args", []), {"CASE": case_dir, "TMP": tmp}, "server.json")
        self.out = os.path.join(tmp, "serve.out")
        self.err = os.path.join(tmp, "serve.err")
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(args, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        self.port = None
        deadline = time.monotonic() + 60  # an ASan build on a busy machine starts slowly
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.out).read())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.02)
        if self.port is None:
            self.kill()
            raise RuntimeError("the server did not start: %s %s" % (open(self.out).read(), open(self.err).read()))
        self.conn = None

    def store_url(self, name):
        if os.environ.get("LG_TEST_STORE") == "postgres":
            url = os.environ.get("LG_PG_URL")
            if not url:
                raise RuntimeError("LG_TEST_STORE=postgres without LG_PG_URL (run through tests/pg/with-postgres.sh)")
            db = "http_" + re.sub(r"[^a-z0-9]", "_", name.lower())
            conninfo = url[len("postgres:"):]
            subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", conninfo, "-c",
                            'DROP DATABASE IF EXISTS "%s"' % db, "-c", 'CREATE DATABASE "%s"' % db],
                           check=True, capture_output=True)
            return "postgres:" + re.sub(r"dbname=\S+", "dbname=" + db, conninfo)
        return "sqlite:" + os.path.join(self.tmp, "store.db")

    def request(self, method, path, headers, body):
        for attempt in (1, 2):  # once more on a fresh connection if the server closed the old one
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                r = self.conn.getresponse()
                data = r.read()
                hdrs = {k.lower(): v for k, v in r.getheaders()}
                if r.will_close:
                    self.conn.close()
                    self.conn = None
                return r.status, hdrs, data
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise

    def stop(self):
        """SIGTERM and wait; the exit status (0: drained)."""
        if self.conn:
            self.conn.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            return "no exit 60 s after SIGTERM"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- one case

def build_request(ex, server, env, where):
    method = next(k for k in ex if k in METHODS)
    path = substitute(ex[method], env, where)
    headers = dict(substitute(ex.get("request_headers", {}), env, where))
    body = None
    if "body" in ex:
        body = json.dumps(substitute(ex["body"], env, where)).encode()
    elif "raw_body" in ex:
        body = substitute(ex["raw_body"], env, where).encode()
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    if "token" in ex:
        tok = ex["token"]
        headers["Authorization"] = "Bearer " + server.tokens.get(tok, tok)
    return method, path, headers, body


def run_case(case_dir):
    name = os.path.basename(case_dir)
    exchanges = read_exchanges(os.path.join(case_dir, "exchanges.jsonl"))
    cfg = read_server(case_dir)
    tmp = tempfile.mkdtemp(prefix="lghttp.")
    failures = []
    server = None
    try:
        server = Server(case_dir, cfg, tmp)
        env = {"CASE": case_dir, "TMP": tmp}
        for n, ex in exchanges:
            where = "%s/exchanges.jsonl:%d" % (name, n)
            method, path, headers, body = build_request(ex, server, env, where)
            try:
                status, hdrs, data = server.request(method, path, headers, body)
            except (OSError, http.client.HTTPException) as e:
                failures.append("%s: %s %s: no answer (%s); the server's stderr:\n%s" % (
                    where, method, path, e, open(server.err).read()[-3000:]))
                break
            errs = check(ex, status, hdrs, data, env)
            if errs:
                shown = data.decode("utf-8", "replace")
                if len(shown) > 2000:
                    shown = shown[:2000] + "... (%d bytes)" % len(data)
                failures.append("%s: %s %s%s\n    %s\n  the answer: %d %s" % (
                    where, method, path, (" " + body.decode("utf-8", "replace")[:300]) if body else "",
                    "\n    ".join(errs), status, shown))
        rc = server.stop()
        if rc != 0:
            failures.append("%s: the server's exit status after SIGTERM: %s\n%s" % (
                name, rc, open(server.err).read()[-3000:]))
    except RuntimeError as e:
        failures.append("%s: %s" % (name, e))
    finally:
        if server:
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return len(exchanges), failures


def main(argv):
    if "LG_BIN" not in os.environ:
        print("run_cases.py: set LG_BIN to the loopguard binary", file=sys.stderr)
        return 2
    data = os.environ.get("LG_TEST_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
    root = os.path.join(data, "http")
    names = argv[1:] or sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    passed = failed = 0
    for name in names:
        case_dir = os.path.join(root, name)
        if not os.path.isdir(case_dir):
            print("run_cases.py: %s: no such case" % case_dir, file=sys.stderr)
            return 2
        try:
            n, failures = run_case(case_dir)
        except CaseError as e:
            print("run_cases.py: %s" % e, file=sys.stderr)
            return 2
        if failures:
            failed += 1
            print("FAIL %s (%d exchanges)" % (name, n))
            for f in failures:
                print("  " + f)
        else:
            passed += 1
            print("ok   %s (%d exchanges)" % (name, n))
    print("http cases: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
