#!/usr/bin/env python3
"""check_test_env.py CTEST BUILD_DIR — fails when a test does not get the
suite's environment.

Every test gets, from lg_test_env() in tests/CMakeLists.txt:
  - /usr/bin first on its PATH: a tool manager's shim earlier on a
    developer's PATH (pyenv's python3 is a bash script: 0.35 s a call,
    against 0.02 s) slows the suite by minutes and runs the tests on
    tools nobody installed for them;
  - LG_PG_TEMPLATE, the build's template cluster (tests/pg/with-postgres.sh).
A test's properties are set in the folder that added it, so a folder
that adds tests and forgets the call leaves its tests without them:
until session 42 every PostgreSQL test (tests/pg/) did. This reads the
tests as CTest has them (ctest --show-only=json-v1) and names each one
without them.
"""
import json
import subprocess
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_test_env.py CTEST BUILD_DIR")
    build = sys.argv[2]
    want = ["PATH=path_list_prepend:/usr/bin", f"LG_PG_TEMPLATE=set:{build}/pg-template"]
    out = subprocess.run([sys.argv[1], "--show-only=json-v1"], cwd=build,
                         capture_output=True, text=True, check=True).stdout
    tests = json.loads(out)["tests"]
    if not tests:
        sys.exit("check_test_env: ctest listed no test in " + build)
    missing = []
    for t in tests:
        mods = [v for p in t.get("properties", []) if p["name"] == "ENVIRONMENT_MODIFICATION"
                for v in p["value"]]
        lacks = [w for w in want if w not in mods]
        if lacks:
            missing.append(f"{t['name']}: lacks {', '.join(lacks)}")
    if missing:
        print(f"check_test_env: {len(missing)} of {len(tests)} tests lack the suite's environment "
              f"(call lg_test_env() at the end of the CMakeLists.txt that adds them):")
        for line in missing:
            print("  " + line)
        sys.exit(1)
    print(f"check_test_env: all {len(tests)} tests have the suite's environment")


main()
