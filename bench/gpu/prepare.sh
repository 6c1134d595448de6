#!/usr/bin/env bash
# Prepares what bench/gpu/run.sh needs on the GPU machine and cannot find
# there (its image has CUDA, CMake, ninja and python3 with torch, but none of
# the Debian -dev packages, maybe not pkg-config, and no registry to fetch
# from). Run it here, on the build machine, once per session, in the checkout
# that the device tool sends (the session's own: a helper's worktree is not
# sent), then call the device tool with exactly:
#
#   run(command="bash bench/gpu/run.sh tests", carry=[".device-deps", ".device-data"], timeout_s=540)
#   run(command="bash bench/gpu/run.sh bench", carry=[".device-deps", ".device-data"], timeout_s=540)
#
# (the two stages, doc/cuda.md "First GPU session"; `run.sh all` does both in
# one call when the device time left allows it). Both folders are git-ignored:
#   .device-deps/deps.tar.xz    sources and headers run.sh builds against
#                               (-DTZ_DEPS_DIR, cmake/TzDependencies.cmake):
#                               zstd's lib/ (Debian's source package), GoogleTest
#                               (libgtest-dev's /usr/src/googletest, without
#                               GoogleMock), nlohmann-json's headers and CMake
#                               package, xxhash.h, liburing's headers and
#                               static library (PIC)
#   .device-deps/nvcomp.tar.xz  nvCOMP's headers and libnvcomp.so from the
#                               nvidia-libnvcomp-cu13 wheel (its command-line
#                               tool left out), for the benchmark's nvCOMP rows;
#                               TZ_PREP_NVCOMP=0 leaves it out
#   .device-data/               real fixture slices (make_device_data.py), sized
#                               to what is left of the 64 MiB a call may send
# The total sent (tracked and untracked-not-ignored files plus both folders)
# is printed and kept under TZ_PREP_LIMIT_MIB (default 63 of the 64 MiB).
# Needs: tar, xz, python3 (pip for the wheel), apt-get (source and .deb
# downloads when the -dev packages are not installed here), ../shared/fixtures.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
LIMIT_MIB="${TZ_PREP_LIMIT_MIB:-63}"
WORK=$(mktemp -d /tmp/tz-prepare.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/deps"
mkdir -p "$STAGE" "$ROOT/.device-deps"

# The files of a Debian package: from this machine when it is installed, else
# from its .deb (apt-get download, dpkg -x). Prints the root to copy from.
package_root() {  # PKG
  if dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; then
    echo /
  else
    mkdir -p "$WORK/debs/$1"
    (cd "$WORK/debs" && apt-get download "$1" >&2) && dpkg -x "$WORK"/debs/"${1%%:*}"_*.deb "$WORK/debs/$1"
    echo "$WORK/debs/$1"
  fi
}

echo "== zstd sources (Debian source package libzstd)"
APT_SRC="$WORK/apt-src"
mkdir -p "$APT_SRC/lists/partial"
echo "deb-src http://deb.debian.org/debian bookworm main" >"$APT_SRC/sources.list"
APT_O=(-o "Dir::Etc::SourceList=$APT_SRC/sources.list" -o Dir::Etc::SourceParts=/nonexistent
       -o "Dir::State::Lists=$APT_SRC/lists")
apt-get "${APT_O[@]}" update -qq
(cd "$APT_SRC" && apt-get "${APT_O[@]}" source --download-only -qq libzstd 2>&1 | grep -v "unsandboxed" || true)
ORIG=$(ls "$APT_SRC"/libzstd_*.orig.tar.* | head -1)
mkdir -p "$WORK/zstd-src" && tar -xf "$ORIG" -C "$WORK/zstd-src"
ZLIB=$(ls -d "$WORK"/zstd-src/*/lib)
mkdir -p "$STAGE/zstd"
cp -r "$ZLIB"/common "$ZLIB"/compress "$ZLIB"/decompress "$ZLIB"/zstd.h "$ZLIB"/zdict.h "$ZLIB"/zstd_errors.h "$STAGE/zstd/"
cp "$ZLIB"/../LICENSE "$STAGE/zstd/LICENSE"
echo "$(basename "$ORIG")" >"$STAGE/zstd/VERSION"

echo "== GoogleTest sources (libgtest-dev / googletest)"
R=$(package_root googletest)
G="$R/usr/src/googletest"
mkdir -p "$STAGE/googletest/googletest"
cp "$G/CMakeLists.txt" "$STAGE/googletest/"
cp -r "$G/googletest/CMakeLists.txt" "$G/googletest/cmake" "$G/googletest/include" "$G/googletest/src" \
  "$STAGE/googletest/googletest/"
cp "$R/usr/share/doc/googletest/copyright" "$STAGE/googletest/COPYRIGHT"

echo "== headers and static libraries (nlohmann-json3-dev, libxxhash-dev, liburing-dev)"
R=$(package_root nlohmann-json3-dev)
mkdir -p "$STAGE/include" "$STAGE/share/cmake" "$STAGE/lib"
cp -r "$R/usr/include/nlohmann" "$STAGE/include/"
cp -r "$R/usr/share/cmake/nlohmann_json" "$STAGE/share/cmake/"
R=$(package_root libxxhash-dev)
mkdir -p "$STAGE/xxhash"
cp "$R/usr/include/xxhash.h" "$R/usr/include/xxh3.h" "$STAGE/xxhash/"
R=$(package_root liburing-dev)
cp -r "$R/usr/include/liburing.h" "$R/usr/include/liburing" "$STAGE/include/"
cp "$R/usr/lib/x86_64-linux-gnu/liburing.a" "$STAGE/lib/"
tar -cJf "$ROOT/.device-deps/deps.tar.xz" -C "$STAGE" .

if [ "${TZ_PREP_NVCOMP:-1}" != 0 ]; then
  echo "== nvCOMP (wheel nvidia-libnvcomp-cu13: headers and libnvcomp.so)"
  WHEEL=$(ls "$ROOT"/.whl/nvidia_libnvcomp_cu13-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$WHEEL" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$WORK/whl" nvidia-libnvcomp-cu13
    WHEEL=$(ls "$WORK"/whl/nvidia_libnvcomp_cu13-*.whl | head -1)
  fi
  mkdir -p "$WORK/nvcomp"
  python3 -m zipfile -e "$WHEEL" "$WORK/nvcomp"
  N="$WORK/nvcomp/nvidia/libnvcomp"
  mkdir -p "$WORK/nvcomp-slim/lib64"
  cp -r "$N/include" "$N/LICENSE" "$WORK/nvcomp-slim/"
  cp "$N"/lib64/libnvcomp.so.* "$WORK/nvcomp-slim/lib64/"
  (cd "$WORK/nvcomp-slim/lib64" && ln -sf "$(ls libnvcomp.so.* | head -1)" libnvcomp.so)
  basename "$WHEEL" >"$WORK/nvcomp-slim/VERSION"
  tar -cf - -C "$WORK/nvcomp-slim" . | xz -6 -T2 >"$ROOT/.device-deps/nvcomp.tar.xz"
else
  rm -f "$ROOT/.device-deps/nvcomp.tar.xz"
fi

# What one call sends besides .device-data: the tracked and untracked-not-
# ignored files, and .device-deps.
tree_bytes() {
  git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1
}
TREE=$(tree_bytes)
DEPS=$(du -cb .device-deps/* | tail -1 | cut -f1)
LEFT=$(( LIMIT_MIB * 1048576 - TREE - DEPS ))
# .device-data: the 9.9 MB model file, then one share per optimizer kind
# (master, exp_avg, exp_avg_sq) and one for the step-200 masters.
MODEL=$(stat -c %s ../shared/fixtures/gpt-small-step400-model-bf16.safetensors)
PER_KIND=$(awk -v l="$LEFT" -v m="$MODEL" 'BEGIN { k = (l - m - 65536) / 4 / 1048576; printf "%.2f", (k > 3.7 ? 3.7 : k) }')
if awk -v k="$PER_KIND" 'BEGIN { exit !(k < 0.5) }'; then
  echo "only ${PER_KIND} MiB per optimizer kind would be left for .device-data: TZ_PREP_NVCOMP=0 leaves nvCOMP out" >&2
  exit 1
fi
echo "== fixture slices (.device-data, --per-kind-mib $PER_KIND)"
rm -rf .device-data
python3 bench/gpu/make_device_data.py --per-kind-mib "$PER_KIND" >/dev/null
DATA=$(du -cb .device-data | tail -1 | cut -f1)
SENT=$(( TREE + DEPS + DATA ))
mib() { awk -v b="$1" 'BEGIN { printf "%6.1f MiB", b / 1048576 }'; }
echo "tree (tracked, untracked)  $(mib "$TREE")"
echo ".device-deps               $(mib "$DEPS")"
echo ".device-data               $(mib "$DATA")"
echo "one call sends             $(mib "$SENT") (at most 64 MiB)"
if [ "$SENT" -gt $(( 64 * 1048576 )) ]; then
  echo "OVER the 64 MiB a device call may send: TZ_PREP_NVCOMP=0, or lower TZ_PREP_LIMIT_MIB" >&2
  exit 1
fi
echo 'carry=[".device-deps", ".device-data"]'
