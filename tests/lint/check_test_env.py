#!/usr/bin/env python3
"""check_test_env.py CTEST BUILD_DIR — fails when a test does not run on
Debian's tools.

Every test's PATH must start with /usr/bin (tests/CMakeLists.txt,
lg_debian_tools_first): a tool manager's shim earlier on a developer's
PATH (pyenv's python3 is a bash script: 0.35 s a call, against 0.02 s)
slows the suite by minutes and runs the tests on tools nobody installed
for them. A test's properties are set in the folder that added it, so a
folder that adds tests and forgets the call leaves its tests without it:
until session 42 every PostgreSQL test (tests/pg/) did. This reads the
tests as CTest has them (ctest --show-only=json-v1) and names each one
without the PATH change.
"""
import json
import subprocess
import sys

WANT = "PATH=path_list_prepend:/usr/bin"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_test_env.py CTEST BUILD_DIR")
    out = subprocess.run([sys.argv[1], "--show-only=json-v1"], cwd=sys.argv[2],
                         capture_output=True, text=True, check=True).stdout
    tests = json.loads(out)["tests"]
    missing = []
    for t in tests:
        mods = [v for p in t.get("properties", []) if p["name"] == "ENVIRONMENT_MODIFICATION"
                for v in p["value"]]
        if WANT not in mods:
            missing.append(t["name"])
    if not tests:
        sys.exit("check_test_env: ctest listed no test in " + sys.argv[2])
    if missing:
        print(f"check_test_env: {len(missing)} of {len(tests)} tests lack {WANT} "
              f"(call lg_debian_tools_first() at the end of the CMakeLists.txt that adds them):")
        for name in missing:
            print("  " + name)
        sys.exit(1)
    print(f"check_test_env: all {len(tests)} tests put /usr/bin first on their PATH")


main()
