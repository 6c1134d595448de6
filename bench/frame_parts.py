#!/usr/bin/env python3
"""Where a data kind's compressed bytes go: every tensor of a bench/codec_bench.py kind compressed
alone (one thread, --level), its frames parsed per doc/format.md (header, table section, block
index, block headers, rANS lane states, rANS words, raw payloads, padding) and summed.

    python3 bench/frame_parts.py --lib build/libtensorzip.so minilm_f16,minilm_e5m2,master

Lane states are counted at 128 bytes per coded stream and block; seeded frames (format 5.8, 5.9)
give back up to 64 of them as fewer raw or coded bytes, which the raw and words columns show.
"""
import argparse
import ctypes
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import codec_data  # noqa: E402
from codec_runners import DEFAULT_BUILD  # noqa: E402

DT = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4, "e5m2": 5}


class Params(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("level", ctypes.c_int), ("block_elems", ctypes.c_uint),
                ("threads", ctypes.c_uint)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kinds", help="comma list of codec_bench.py kinds")
    ap.add_argument("--lib", type=Path, default=DEFAULT_BUILD / "libtensorzip.so")
    ap.add_argument("--level", type=int, default=0)
    args = ap.parse_args()
    lib = ctypes.CDLL(str(args.lib))
    lib.tz_compress_bound.restype = ctypes.c_size_t
    lib.tz_compress.restype = ctypes.c_size_t
    lib.tz_is_error.restype = ctypes.c_int
    kinds = codec_data.load_kinds(codec_data.DEFAULT_FIXTURES, args.kinds.split(","))
    for kind in kinds.values():
        acc = dict(header=0, tables=0, index=0, block_headers=0, lane_states=0, words=0, raw=0, padding=0)
        blocks = coded = total = 0
        for t in kind.tensors:
            src = np.frombuffer(t.data, np.uint8)
            cap = lib.tz_compress_bound(ctypes.c_size_t(len(src)))
            dst = np.empty(cap, np.uint8)
            p = Params(DT[t.dtype], args.level, 0, 1)
            n = lib.tz_compress(ctypes.c_void_p(dst.ctypes.data), ctypes.c_size_t(cap),
                                ctypes.c_void_p(src.ctypes.data), ctypes.c_size_t(len(src)), ctypes.byref(p))
            if lib.tz_is_error(ctypes.c_size_t(n)):
                raise SystemExit(f"{t.name}: compression failed")
            f = dst[:n].tobytes()
            total += n
            version, n_streams = f[4], f[6]
            n_blocks, tables_size = struct.unpack_from("<II", f, 20)
            acc["header"] += 32
            acc["tables"] += tables_size
            acc["index"] += 4 * n_blocks
            sizes = struct.unpack_from(f"<{n_blocks}I", f, 32 + tables_size)
            pos = 32 + tables_size + 4 * n_blocks
            size_mask = (1 << 22) - 1 if version == 3 else (1 << 30) - 1
            for b in range(n_blocks):
                acc["block_headers"] += 4 + 4 * n_streams
                for w in struct.unpack_from(f"<{n_streams}I", f, pos + 4):
                    mode, size = w >> 30, w & size_mask
                    if mode == 1:
                        acc["lane_states"] += 128
                        acc["words"] += size - 128
                        coded += 1
                    else:
                        acc["raw"] += size
                    acc["padding"] += ((size + 3) & ~3) - size
                pos += sizes[b]
                blocks += 1
        parts = ", ".join(f"{k} {v} ({100 * v / total:.3f} %)" for k, v in acc.items())
        print(f"{kind.label}: {total} bytes, {blocks} blocks, {coded} coded block streams; {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
