#!/usr/bin/env python3
"""Cuts small, valid safetensors files out of the real training checkpoint in
../shared/fixtures (see its README): whole tensors only, bytes copied
unchanged, so the slices keep the statistics of real BF16 weights and FP32
AdamW state.

Outputs (committed in the repo):
  tests/data/fixture-slice-bf16.safetensors   test data for the codec suite
  tests/data/fixture-slice-fp32.safetensors
  sample/gpt-small-step400-model-bf16.safetensors   README demo
  sample/gpt-small-step400-optim-fp32.safetensors

Usage: python3 scripts/make_sample.py [FIXTURES_DIR]
Standard library only (json + struct). Deterministic: rerunning it gives the
same bytes.
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FIXTURES = os.path.join(ROOT, "..", "shared", "fixtures")
HEADER_CAP = 100 * 1024 * 1024  # same cap as the safetensors reference parser
DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "I8": 1, "BOOL": 1}


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > HEADER_CAP:
            raise ValueError(f"{path}: header of {n} bytes is too large")
        hdr = json.loads(f.read(n))
    return hdr, 8 + n


def check_entry(name, e):
    count = 1
    for d in e["shape"]:
        count *= d
    begin, end = e["data_offsets"]
    if end - begin != count * DTYPE_SIZE[e["dtype"]]:
        raise ValueError(f"{name}: data_offsets do not match dtype and shape")


def write_slice(src, dst, names):
    """Writes the tensors `names` of src, in that order, to dst."""
    hdr, data_start = read_header(src)
    out_hdr = {}
    if "__metadata__" in hdr:
        out_hdr["__metadata__"] = hdr["__metadata__"]
    chunks = []
    pos = 0
    with open(src, "rb") as f:
        for name in names:
            e = hdr[name]
            check_entry(name, e)
            begin, end = e["data_offsets"]
            f.seek(data_start + begin)
            data = f.read(end - begin)
            if len(data) != end - begin:
                raise ValueError(f"{src}: {name} is truncated")
            out_hdr[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [pos, pos + len(data)]}
            chunks.append(data)
            pos += len(data)
    # Same encoding as the originals: compact JSON, padded with spaces so that
    # the data section starts on an 8-byte boundary.
    h = json.dumps(out_hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
    os.replace(tmp, dst)
    print(f"{os.path.relpath(dst, ROOT)}: {len(names)} tensors, {8 + len(h) + pos} bytes")


def optim_names(params):
    return [f"{kind}.{p}" for p in params for kind in ("master", "exp_avg", "exp_avg_sq")]


def main():
    fixtures = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_FIXTURES
    model = os.path.join(fixtures, "gpt-small-step400-model-bf16.safetensors")
    optim = os.path.join(fixtures, "gpt-small-step400-optim-fp32.safetensors")

    # Test slices (~1.4 MB). blocks.2.proj.weight is in both files, so a test
    # can check that the BF16 weight is the round-to-nearest-even of its FP32
    # master copy (a property of the real checkpoint, see its README).
    write_slice(model, os.path.join(ROOT, "tests", "data", "fixture-slice-bf16.safetensors"), [
        "tok.weight",               # 256 x 256 embedding
        "blocks.2.qkv.weight",      # 768 x 256
        "blocks.2.proj.weight",     # 256 x 256
        "blocks.2.ln1.weight",      # 1-D
        "blocks.2.ln1.bias",
        "blocks.2.qkv.bias",
        "blocks.2.fc1.bias",
        "lnf.weight",
    ])
    write_slice(optim, os.path.join(ROOT, "tests", "data", "fixture-slice-fp32.safetensors"), optim_names([
        "blocks.2.proj.weight",
        "blocks.2.ln1.weight",
        "blocks.2.qkv.bias",
        "blocks.2.fc1.bias",
    ]))

    # README demo (~6 MB): embeddings, head and the whole first block in
    # BF16; the optimizer state of the embeddings and block 0's attention.
    block0 = [f"blocks.0.{p}" for p in (
        "ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
        "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")]
    write_slice(model, os.path.join(ROOT, "sample", "gpt-small-step400-model-bf16.safetensors"),
                ["tok.weight", "pos.weight"] + block0 + ["lnf.weight", "lnf.bias", "head.weight"])
    write_slice(optim, os.path.join(ROOT, "sample", "gpt-small-step400-optim-fp32.safetensors"), optim_names([
        "tok.weight", "pos.weight",
        "blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.qkv.weight", "blocks.0.qkv.bias",
        "blocks.0.proj.bias", "blocks.0.ln2.weight", "blocks.0.ln2.bias",
    ]))


if __name__ == "__main__":
    main()
