# loopguard — the two commands, and a few more.
#
#   make run     install what is missing, build, run the main job
#                (LISTEN=HOST:PORT to pick the address, ARGS='...' for
#                more flags of loopguard serve)
#   make test    install what is missing, build, run every test: the unit
#                and CLI suites, the same under ASan + UBSan, and a short
#                run of every fuzzer (TEST_JOBS=N tests at once, FUZZ_SECONDS)
#   make bench   benchmarks beside their anchors (reads ../shared/anchors)
#   make install install the library, header, pkg-config file and tool
#   make coverage the lines of src/ the tests run, least covered first
#                (TESTS=REGEX: only the tests whose names match)
#   make analyze clang's static analyzer (scan-build) on the library and
#                the CLI: fails on any report, which it leaves in build-analyze
#
# Dependencies are Debian packages, installed with apt-get when missing
# (as root; otherwise the missing ones are listed and make stops).

SHELL := /bin/bash
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Tests at once: one more than the cores, as most tests spend their time
# waiting (servers, Node clients, timeouts): on 2 cores the unit suite
# alone took 323 s at -j2 and 295 s at -j3 (docs/testing.md, session 38).
TEST_JOBS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
COV_BUILD ?= build-cov
ANALYZE_BUILD ?= build-analyze
FUZZ_SECONDS ?= 8
PREFIX ?= /usr/local
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DLG_WERROR=ON
endif

# Build and test dependencies (Debian package names).
DEPS := gcc make cmake pkg-config clang libclang-rt-14-dev \
        libjansson-dev libssl-dev libsqlite3-dev libpq-dev postgresql \
        libmicrohttpd-dev libcmocka-dev libcurl4-openssl-dev python3 curl \
        chromium prometheus nodejs openssl
BENCH_DEPS := wrk nodejs python3 socat
ANALYZE_DEPS := clang-tools
# npm installs the pinned clients of the gateway's tests and benchmark:
# Debian's nodejs comes without it (NodeSource's has its own), so
# Debian's npm package only when there is no npm.
ENSURE_NPM := command -v npm >/dev/null || ./scripts/ensure-deps npm

.PHONY: all deps bench-deps build build-asan build-fuzz run test test-unit \
        test-asan test-fuzz bench install coverage analyze clean help

all: build

help:
	@sed -n '1,18p' Makefile | sed 's/^# \{0,1\}//'

deps:
	@./scripts/ensure-deps $(DEPS)

bench-deps:
	@./scripts/ensure-deps $(BENCH_DEPS)
	@$(ENSURE_NPM)
	@./bench/gateway/install.sh "$(BUILD)" || echo "loopguard: the gateway benchmark will run without Portkey" >&2

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLG_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DLG_FUZZ=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

# Builds by itself, quietly (one line; the whole log only on failure).
run: deps
	@BUILD="$(BUILD)" JOBS="$(JOBS)" CMAKE_FLAGS="$(CMAKE_FLAGS)" LISTEN="$(LISTEN)" ARGS="$(ARGS)" ./scripts/run

test: build
	@$(ENSURE_NPM)
	@TEST_JOBS="$(TEST_JOBS)" ./scripts/test-all "$(BUILD)" "$(ASAN_BUILD)" "$(FUZZ_BUILD)" "$(FUZZ_SECONDS)"

# The parts of make test, one at a time.
test-unit: build
	@cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)

test-asan: build-asan
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(TEST_JOBS)

test-fuzz: build-fuzz
	@./scripts/fuzz-smoke "$(FUZZ_BUILD)" "$(FUZZ_SECONDS)"

bench: build bench-deps
	@./bench/run "$(BUILD)"

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

# Each report is a path the analyzer could not rule out; the ones it could
# not see through are ruled out in the code (docs/testing.md, "Static
# analysis"), so a new one is a finding.
analyze: deps
	@./scripts/ensure-deps $(ANALYZE_DEPS)
	@rm -rf $(ANALYZE_BUILD)
	@scan-build -o $(ANALYZE_BUILD)/reports cmake -S . -B $(ANALYZE_BUILD) -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@scan-build --status-bugs -o $(ANALYZE_BUILD)/reports $(MAKE) --no-print-directory -C $(ANALYZE_BUILD) -j $(JOBS) loopguard >$(ANALYZE_BUILD)/scan.log 2>&1 \
	  && echo "loopguard: scan-build found nothing ($(ANALYZE_BUILD)/scan.log)" \
	  || { grep -E 'warning:|scan-build:' $(ANALYZE_BUILD)/scan.log; echo "loopguard: scan-build reports above; scan-view $(ANALYZE_BUILD)/reports/* shows each path" >&2; exit 1; }

coverage: deps
	@$(ENSURE_NPM)
	@./scripts/coverage "$(COV_BUILD)" "$(TESTS)"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(COV_BUILD) $(ANALYZE_BUILD)
