#!/usr/bin/env bash
# docs.sh — keeps the documentation true where a test can:
#   - a group's --help (runs, ledger, budget, keys) shows, on each
#     subcommand's line, every flag of that subcommand's --help;
#   - every subcommand that `loopguard --help` and the group helps name has
#     its section in docs/reference/cli.md, and each section's flags are
#     exactly the flags its `--help` prints (no flag undocumented, no
#     documented flag missing);
#   - every path and method of docs/openapi.json is in
#     docs/reference/http-api.md, whose route reference is up to date with
#     the document (scripts/api-docs --check);
#   - every relative link of README.md and docs/ names a file that exists,
#     and a heading of it when it has an anchor (#...);
#   - no file a user's clone has cites the project's private folders
#     (the shared contracts folder beside the repository, its design
#     notes): the repository owns its contracts under docs/reference/.
#     Only bench/ (and `make bench`) may read the benchmark anchors there.
set -u -o pipefail
bin=${LG_BIN:?LG_BIN must name the loopguard binary}
src=${LG_SOURCE_DIR:?LG_SOURCE_DIR must name the source folder}
export LG_BIN
python3 - "$src" <<'PY'
import json, os, re, subprocess, sys
src = sys.argv[1]; binp = os.environ["LG_BIN"]
bad = []
def help_of(cmd):
    r = subprocess.run([binp] + cmd.split() + ["--help"], capture_output=True, text=True)
    if r.returncode != 0: bad.append("%s --help exited %d" % (cmd, r.returncode))
    return r.stdout
FLAG = re.compile(r"(?<![\w$'-])(--[a-z][a-z-]*[a-z]|-[a-z])(?![\w-])")
def flags(text): return set(FLAG.findall(text)) - {"-h"}

cli = open(os.path.join(src, "docs/reference/cli.md")).read()
sections = {}
for m in re.finditer(r"^### `loopguard ([a-z ]+)`\n(.*?)(?=^### |^## |\Z)", cli, re.S | re.M):
    sections[m.group(1)] = m.group(2)
# The subcommands, from the tool itself.
cmds = set()
top = help_of("")
for name in ("replay", "fingerprint", "serve", "test"):
    if re.search(r"^  %s\b" % name, top, re.M): cmds.add(name)
    else: bad.append("loopguard --help does not list %s" % name)
for group in ("runs", "ledger", "budget", "keys"):
    if not re.search(r"^  %s [a-z|]+" % group, top, re.M): bad.append("loopguard --help does not list %s" % group)
    for m in re.finditer(r"loopguard %s ([a-z]+)" % group, help_of(group)):
        cmds.add(group + " " + m.group(1))
if len(cmds) < 16: bad.append("only %d subcommands found: %s" % (len(cmds), sorted(cmds)))
for c in sorted(cmds):
    if c not in sections:
        bad.append("docs/reference/cli.md has no section for `loopguard %s`" % c); continue
    h = flags(help_of(c))
    rows = "\n".join(l for l in sections[c].splitlines() if l.startswith("| `-"))
    d = flags(rows)
    for f in sorted(h - d): bad.append("`loopguard %s`: %s is in --help but not in docs/reference/cli.md" % (c, f))
    for f in sorted(d - h): bad.append("`loopguard %s`: docs/reference/cli.md documents %s, which --help does not have" % (c, f))
    if "Exit status" not in sections[c]: bad.append("`loopguard %s`: no exit status in docs/reference/cli.md" % c)
# A group's --help prints the usage of every subcommand (cli.md): each
# subcommand's line there has every flag of its own --help ("[the flags of
# create]" stands for create's line).
for group in ("runs", "ledger", "budget", "keys"):
    text, cur = {}, None
    for l in help_of(group).split("\n\n")[0].splitlines():
        m = re.search(r"loopguard %s ([a-z]+)" % group, l)
        if m: cur = m.group(1)
        if cur: text[cur] = text.get(cur, "") + l + "\n"
    for sub in sorted(text):
        have = flags(text[sub])
        for other in re.findall(r"the flags of ([a-z]+)", text[sub]): have |= flags(text.get(other, ""))
        for f in sorted(flags(help_of(group + " " + sub)) - have - {"--help"}):
            bad.append("`loopguard %s --help`: the line of %s lacks %s, which `loopguard %s %s --help` has" % (group, sub, f, group, sub))
for c in sorted(set(sections) - cmds): bad.append("docs/reference/cli.md documents `loopguard %s`, which does not exist" % c)
for code in ("10", "11", "12", "13"):
    if "**%s**" % code not in sections.get("ledger claim", ""): bad.append("ledger claim's exit %s is not documented" % code)

# HTTP: every documented operation is in the reference page.
api = json.load(open(os.path.join(src, "docs/openapi.json")))
http = open(os.path.join(src, "docs/reference/http-api.md")).read()
for path, item in api["paths"].items():
    for meth in item:
        if meth == "parameters": continue
        if "`%s %s" % (meth.upper(), path) not in http:
            bad.append("docs/reference/http-api.md does not document %s %s" % (meth.upper(), path))
r = subprocess.run([sys.executable, os.path.join(src, "scripts/api-docs"), "--check"], capture_output=True, text=True)
if r.returncode: bad.append((r.stderr or r.stdout).strip())

# Links.
mds = [os.path.join(src, "README.md")]
for root, _, files in os.walk(os.path.join(src, "docs")):
    mds += [os.path.join(root, f) for f in files if f.endswith(".md")]
def anchors_of(md): # its headings' anchors, as GitHub makes them (code blocks skipped)
    out, seen, fence = set(), {}, False
    for line in open(md):
        if line.startswith("```"): fence = not fence
        m = None if fence else re.match(r"#{1,6}\s+(.*)", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(a if a not in seen else "%s-%d" % (a, seen[a]))
            seen[a] = seen.get(a, 0) + 1
    return out
for md in mds:
    for target, frag in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", open(md).read()):
        if re.match(r"[a-z]+:", target) or not (target or frag): continue
        path = os.path.normpath(os.path.join(os.path.dirname(md), target)) if target else md
        if not os.path.exists(path):
            bad.append("%s: broken link %s" % (os.path.relpath(md, src), target))
        elif frag and path.endswith(".md") and frag not in anchors_of(path):
            bad.append("%s: link %s#%s: no such heading there" % (os.path.relpath(md, src), target, frag))

# Private folders (in our files: not in what npm installed under tests/).
def walk_ours(top):
    out = []
    for r, ds, fs in os.walk(top):
        ds[:] = [d for d in ds if d != "node_modules"]
        out += [os.path.join(r, f) for f in fs]
    return out

shared = "../" + "shared"; design = "DESIGN" + ".md"; style = "STYLE" + ".md"
pat = re.compile(r"(%s|(?<![\w/])shared/(spec|tools|vectors|fixtures|anchors|notes)|%s|%s)" % (re.escape(shared), re.escape(design), re.escape(style)))
for top_dir in ("README.md", "docs", "src", "include", "cli", "tests", "examples", "scripts", "CMakeLists.txt"):
    p = os.path.join(src, top_dir)
    files = [p] if os.path.isfile(p) else walk_ours(p)
    for f in files:
        try: text = open(f, encoding="utf-8").read()
        except (UnicodeDecodeError, IsADirectoryError): continue
        for n, line in enumerate(text.splitlines(), 1):
            if pat.search(line):
                bad.append("%s:%d cites a folder a clone does not have: %s" % (os.path.relpath(f, src), n, line.strip()[:100]))
for b in bad: print("FAIL:", b)
print("docs.sh: %d subcommands, %d failures" % (len(cmds), len(bad)))
sys.exit(1 if bad else 0)
PY
