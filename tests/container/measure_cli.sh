#!/usr/bin/env bash
# Measures the tzip CLI beside zstd -T0 on the same files: ratio, wall-clock
# throughput (GB/s of original bytes, output fsync'd for tzip; zstd does not
# fsync) and peak RSS (/usr/bin/time -v). Warm page cache (each input read once
# first). Usage: measure_cli.sh TZIP FILE...   (prints a Markdown table)
set -euo pipefail
TZIP=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
measure() {  # measure cmd... -> sets T (wall s), C (user+sys CPU s) and R (peak RSS KiB)
  /usr/bin/time -v -o "$tmp/time" "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  T=$(awk -F': ' '/Elapsed \(wall clock\)/{n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$tmp/time")
  C=$(awk -F': ' '/User time|System time/{s+=$2} END{printf "%.2f", s}' "$tmp/time")
  R=$(awk -F': ' '/Maximum resident set size/{print $2}' "$tmp/time")
}
gbps() { awk -v b="$1" -v t="$2" 'BEGIN{ if (t<=0) t=0.005; printf "%.3f", b/t/1e9 }'; }
echo "| file | size | tool | ratio | compress GB/s (CPU s) | decompress GB/s (CPU s) | peak RSS compress / decompress |"
echo "|---|---|---|---|---|---|---|"
for f in "$@"; do
  size=$(stat -c %s "$f"); cat "$f" >/dev/null
  name=$(basename "$f")
  measure "$TZIP" compress -q -f "$f" -o "$tmp/x.tzip"; tc=$T; cc=$C; rc=$R
  measure "$TZIP" decompress -q -f "$tmp/x.tzip" -o "$tmp/x.safetensors"; td=$T; cd=$C; rd=$R
  cmp -s "$f" "$tmp/x.safetensors" || { echo "round trip differs: $f" >&2; exit 1; }
  csize=$(stat -c %s "$tmp/x.tzip")
  echo "| $name | $(awk -v s=$size 'BEGIN{printf "%.1f MB", s/1e6}') | tzip ($(nproc) threads) | $(awk -v a=$size -v b=$csize 'BEGIN{printf "%.3f", a/b}') | $(gbps $size $tc) ($cc) | $(gbps $size $td) ($cd) | $((rc/1024)) MiB / $((rd/1024)) MiB |"
  rm -f "$tmp/x.tzip" "$tmp/x.safetensors"
  for lvl in 3 19; do
    [ "$lvl" = 19 ] && [ "$size" -gt 20000000 ] && continue  # minutes per file
    measure zstd -q -f -T0 -$lvl "$f" -o "$tmp/x.zst"; tc=$T; cc=$C; rc=$R
    measure zstd -q -f -d -T0 "$tmp/x.zst" -o "$tmp/x.out"; td=$T; cd=$C; rd=$R
    csize=$(stat -c %s "$tmp/x.zst")
    echo "| $name | | zstd -T0 -$lvl | $(awk -v a=$size -v b=$csize 'BEGIN{printf "%.3f", a/b}') | $(gbps $size $tc) ($cc) | $(gbps $size $td) ($cd) | $((rc/1024)) MiB / $((rd/1024)) MiB |"
    rm -f "$tmp/x.zst" "$tmp/x.out"
  done
done
