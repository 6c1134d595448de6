#!/usr/bin/env bash
# Builds everything (CUDA code too when nvcc is installed) and runs every test.
# This is the command .ci/run calls. GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
JOBS="${TZ_JOBS:-$(nproc)}"
. scripts/build-steps.sh
tz_configure_tests build           # tests on, whatever an earlier configure left in the cache
cmake --build build -j "$JOBS"
tz_run_ctest build -j "$JOBS"      # no test found is a failure, not "0 tests passed"
# The codec on AArch64: cross-built, tests under qemu (TZ_AARCH64=0 skips).
if [ "${TZ_AARCH64:-1}" != "0" ]; then
  TZ_JOBS="$JOBS" ./scripts/test-aarch64.sh
fi
if [ -d python/tests ]; then
  ./scripts/python-test.sh
  [ "${TZ_VLLM:-1}" = "0" ] || ./scripts/vllm-test.sh         # vLLM: load format, resident mode, KV offloading (own venv)
  [ "${TZ_LMCACHE:-1}" = "0" ] || ./scripts/lmcache-test.sh   # LMCache serde, own venv (doc/kv.md 7.3)
fi
