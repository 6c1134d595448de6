# Build steps shared by scripts/demo.sh and scripts/test.sh (sourced, not run),
# so that the two README commands work in either order on one checkout:
# the demo builds only `tzip` and never changes what the build folder builds;
# the test script always configures the test suite (also over a cache left by
# an older demo that turned it off) and fails when ctest finds no test.
# Extra arguments go to cmake's configure step.
# tests/scripts/first_run_test.sh checks both.

tz_configure_demo() {  # DIR [cmake args...]
  local dir="$1"; shift
  cmake --preset default -B "$dir" "$@" >/dev/null
}

tz_configure_tests() {  # DIR [cmake args...]
  local dir="$1"; shift
  cmake --preset default -B "$dir" -DTZ_BUILD_TESTS=ON "$@"
}

tz_run_ctest() {  # DIR [ctest args...]
  local dir="$1"; shift
  ctest --test-dir "$dir" --output-on-failure --no-tests=error "$@"
}
