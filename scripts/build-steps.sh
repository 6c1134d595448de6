# Build steps shared by scripts/demo.sh, test.sh, python-test.sh and vllm-test.sh (sourced, not run),
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

tz_find_tzip() {  # JOBS: exports TZIP, the CLI the tests drive (build/programs/tzip, built if missing) unless set
  if [ -z "${TZIP:-}" ]; then
    TZIP="$PWD/build/programs/tzip"
    if [ ! -x "$TZIP" ]; then
      cmake --preset default
      cmake --build --preset default -j "$1" --target tzip
    fi
  fi
  export TZIP
}
