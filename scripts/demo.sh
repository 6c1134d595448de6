#!/usr/bin/env bash
# Builds tensorzip and runs the main job on the sample checkpoint shipped in
# sample/ (a few MB of a real BF16 model + FP32 AdamW state): compress the
# folder, inspect it, verify it, restore it and check the bytes are identical.
set -euo pipefail
cd "$(dirname "$0")/.."
TZ_SKIP_PIP=1 TZ_AARCH64=0 ./scripts/deps.sh   # the compiler and libraries only: no Python packages, no AArch64 cross tools
JOBS="${TZ_JOBS:-$(nproc)}"
. scripts/build-steps.sh
tz_configure_demo build            # only the tzip target is built; the test suite stays configured
cmake --build build -j "$JOBS" --target tzip
TZIP=build/programs/tzip

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r sample "$work/checkpoint"

echo "== compress the sample checkpoint folder"
"$TZIP" compress "$work/checkpoint" -o "$work/checkpoint.tzip"
echo "== what is inside"
for f in "$work"/checkpoint.tzip/*.tzip; do "$TZIP" inspect "$f" | tail -n 4; done
echo "== verify checksums and compare with the original"
"$TZIP" verify "$work/checkpoint.tzip" --against "$work/checkpoint"
echo "== restore and compare byte for byte"
"$TZIP" decompress "$work/checkpoint.tzip" -o "$work/restored"
diff -r "$work/checkpoint" "$work/restored"
echo "identical: $(du -sb "$work/checkpoint" | cut -f1) bytes -> $(du -sb "$work/checkpoint.tzip" | cut -f1) bytes compressed"
