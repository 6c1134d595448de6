#!/usr/bin/env bash
# AArch64 check: cross-builds the codec and KV page codec libraries and their
# test binaries (CUDA off, nothing else) with Debian's g++-aarch64-linux-gnu
# and runs them under qemu-aarch64: the NEON kernels against the portable
# code, the CRC32C (ARMv8 CRC instructions) and block checksum against the
# table, the round-trip, corruption and lane-context suites on an AArch64
# build, and the KV page codec's kernel, checksum and escape suites.
# Correctness only: speed under an emulator means nothing.
# Called by scripts/test.sh; needs what scripts/deps.sh installs
# (TZ_AARCH64=1, the default there).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${TZ_AARCH64_BUILD:-build-aarch64}"
JOBS="${TZ_JOBS:-$(nproc)}"
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  command -v "$tool" >/dev/null || { echo "test-aarch64.sh: $tool not found (run scripts/deps.sh)" >&2; exit 1; }
done
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" -DTZ_CODEC_ONLY=ON >/dev/null
cmake --build "$BUILD" --target tz_tests tz_kv_tests fuzz_replay_kv_page -j "$JOBS"
# The suites that exercise architecture-specific code (every kernel against
# the portable one, round trips of every dtype and level, lane contexts, real
# data, random access, the corruption checks that decode) and stay within a
# few minutes under the emulator; TZ_AARCH64_FILTER overrides.
DEFAULT_FILTER="Crc32c.*:BlockChecksum.*:Simd.*:SimdPath.*:LaneCtx.*:SeededLanes.*:SelfSeeded.*:RawRuns.*:ZeroElision.*:RansCoder.*:RansTable.*:PrefixCode.*:PrefixDecodeRuns.*:Fields.*:FrameApi.*:Inspect.*:Errors.*"
DEFAULT_FILTER+=":CppApi.*:RoundTripOdd.*:AllDtypesAllLevels/RoundTrip.*:SpecialValues.*:RandomAccess.*:RealData.*"
DEFAULT_FILTER+=":Corruption.TruncationAtEveryLength:Corruption.HeaderFieldsValidated:Corruption.VerifyReportsTheBadBlock"
FILTER="${TZ_AARCH64_FILTER:-$DEFAULT_FILTER}"
echo "qemu-aarch64 $BUILD/tests/tz_tests --gtest_filter=$FILTER"  # loader and libc: multiarch arm64 (cmake/aarch64-linux-gnu.cmake)
time qemu-aarch64 "$BUILD/tests/tz_tests" --gtest_filter="$FILTER" --gtest_brief=1
# The KV page codec: its NEON kernels against the portable ones (real pages of
# every dtype and mode, every fixed width, damaged pages), checksums, escapes,
# the C API; and the page decoder's fuzz corpus.
KV_FILTER="${TZ_AARCH64_KV_FILTER:-KvPaths.*:KvChecksum.*:KvUnseenValues.*:KvCApi.*}"
echo "qemu-aarch64 $BUILD/tests/kv/tz_kv_tests --gtest_filter=$KV_FILTER"
time qemu-aarch64 "$BUILD/tests/kv/tz_kv_tests" --gtest_filter="$KV_FILTER" --gtest_brief=1
time qemu-aarch64 "$BUILD/tests/kv/fuzz_replay_kv_page" tests/fuzz/corpus/kv_page
