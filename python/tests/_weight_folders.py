"""Compressed weight folders for the weight-stream tests (test_vllm.py, test_vllm_device.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import tensorzip


def corrupt_copy(tzip_folder: Path, tmp_path: Path):
    """A copy of a compressed folder (model.tzip) with one byte of one tensor's frame flipped:
    (folder, tensor)."""
    dst = tmp_path / "corrupt.tzip"
    shutil.copytree(tzip_folder, dst)
    path = dst / "model.tzip"
    data = bytearray(path.read_bytes())
    for frac in (0.5, 0.4, 0.6, 0.3, 0.7):
        pos = int(len(data) * frac)
        data[pos] ^= 0x10
        path.write_bytes(bytes(data))
        bad = []
        with tensorzip.safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                try:
                    f.get_tensor(name)
                except tensorzip.CorruptDataError:
                    bad.append(name)
        if len(bad) == 1:
            return dst, bad[0]
        data[pos] ^= 0x10
    raise AssertionError("no byte found whose flip damages exactly one tensor")
