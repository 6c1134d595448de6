#!/usr/bin/env bash
# Runs a command (as root) the way the GPU machine's image would build this
# project, as far as this machine can show it: in a mount namespace of its
# own where the Debian -dev packages of scripts/deps.sh are hidden (their
# headers, static libraries, CMake packages and pkg-config files,
# /usr/src/googletest) and pkg-config itself is gone. Their shared libraries'
# .so links stay (a mount cannot hide a symbolic link): after a build, check
# its link lines, e.g. `grep -E -- "-lzstd|-lxxhash|libzstd\.so|libxxhash\.so|libgtest" build-gpu/build.ninja`.
# Nothing outside the namespace changes.
#   bench/gpu/without_dev_packages.sh bash bench/gpu/run.sh tests
set -euo pipefail
if [ -z "${TZ_WITHOUT_DEV_NS:-}" ]; then
  exec unshare -m env TZ_WITHOUT_DEV_NS=1 bash "$0" "$@"
fi
mount --make-rprivate /
PKGS=(libzstd-dev:amd64 libxxhash-dev liburing-dev nlohmann-json3-dev libgtest-dev:amd64 libgmock-dev:amd64
      googletest libbenchmark-dev liblz4-dev pkgconf pkgconf-bin pkg-config)
FILES=$(dpkg -L "${PKGS[@]}" 2>/dev/null | sort -u)
SCRATCH=$(mktemp -d /tmp/tz-nodev.XXXXXX)
mount -t tmpfs tmpfs "$SCRATCH"
# /usr/include: a copy without those packages' headers.
cp -a /usr/include "$SCRATCH/include"
for f in $(echo "$FILES" | grep '^/usr/include/'); do
  [ -e "$f" ] && rm -rf "$SCRATCH/include/${f#/usr/include/}"
done
mount --bind "$SCRATCH/include" /usr/include
# Folders that only -dev packages fill: empty.
for d in /usr/lib/x86_64-linux-gnu/cmake /usr/share/cmake /usr/lib/x86_64-linux-gnu/pkgconfig /usr/share/pkgconfig \
         /usr/src/googletest /usr/src/gtest /usr/src/gmock; do
  [ -d "$d" ] && mount -t tmpfs tmpfs "$d"
done
# Their other regular files (static libraries, pkg-config's program): an
# empty file that is neither a library nor executable.
: >"$SCRATCH/empty"
for f in $(echo "$FILES" | grep -E '^/usr/(lib|bin)/'); do
  if [ -f "$f" ] && [ ! -L "$f" ]; then mount --bind "$SCRATCH/empty" "$f"; fi
done
exec "$@"
