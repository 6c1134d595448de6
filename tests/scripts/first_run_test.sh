#!/usr/bin/env bash
# The README's two commands, in either order, on one checkout (issue 16 item 5):
# scripts/test.sh configures the tests even over a cache in which an older
# demo turned them off, and its ctest step fails when it finds no test
# (instead of "No tests were found!!!" and exit 0). Configure steps only
# (the real ones, from scripts/build-steps.sh), in scratch build folders.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$src"
. scripts/build-steps.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fast=(-DTZ_CUDA=OFF -DTZ_BUILD_BENCH=OFF)
fail() { echo "FAIL: $*"; exit 1; }

# 1. The cache an older demo.sh left: tests off. ctest there finds nothing: must fail.
cmake --preset default -B "$work/b" -DTZ_BUILD_TESTS=OFF "${fast[@]}" >/dev/null
if tz_run_ctest "$work/b" >/dev/null 2>&1; then fail "ctest with no tests exited 0"; fi
# 2. The demo's configure keeps whatever the folder builds (does not turn tests off).
tz_configure_demo "$work/b" "${fast[@]}"
grep -q '^TZ_BUILD_TESTS:BOOL=OFF' "$work/b/CMakeCache.txt" || fail "demo configure changed TZ_BUILD_TESTS"
# 3. The test script's configure turns them on over that cache; ctest then lists tests.
tz_configure_tests "$work/b" "${fast[@]}" >/dev/null
grep -q '^TZ_BUILD_TESTS:BOOL=ON' "$work/b/CMakeCache.txt" || fail "test configure did not turn the tests on"
n=$(tz_run_ctest "$work/b" -N | sed -n 's/^Total Tests: //p')
[ "${n:-0}" -gt 10 ] || fail "ctest lists ${n:-0} tests after the test configure"
# 4. And a demo configure after it keeps them on (either order works).
tz_configure_demo "$work/b" "${fast[@]}"
grep -q '^TZ_BUILD_TESTS:BOOL=ON' "$work/b/CMakeCache.txt" || fail "demo configure turned the tests off"
echo "ok: $n tests configured"
