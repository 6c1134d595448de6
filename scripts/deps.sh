#!/usr/bin/env bash
# Installs everything the build, the tests and the benchmarks need on a fresh
# Debian machine (apt-get for system packages, pip for Python ones).
# Idempotent: skips what is already present.
set -euo pipefail

APT_PKGS=(cmake ninja-build pkg-config g++ clang libzstd-dev liblz4-dev libgtest-dev libgmock-dev
          libbenchmark-dev nlohmann-json3-dev libxxhash-dev liburing-dev zstd lz4)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# AArch64 check (scripts/test-aarch64.sh): Debian's cross compiler, qemu's
# user-mode emulator and the arm64 builds of zstd and GoogleTest (multiarch).
# TZ_AARCH64=0 skips it.
if [ "${TZ_AARCH64:-1}" != "0" ]; then
  AARCH64_PKGS=(g++-aarch64-linux-gnu qemu-user libzstd-dev:arm64 libgtest-dev:arm64)
  missing=()
  for p in "${AARCH64_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# Python packages used by tests and benchmarks (kept in one list).
if [ "${TZ_SKIP_PIP:-0}" != "1" ]; then
  python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../requirements-dev.txt"
fi
