#!/usr/bin/env python3
"""Real KV-cache pages for the KV codec tests (tests/kv, doc/kv.md).

Runs the fixture GPT (architecture of ../shared/fixtures/make_fixture.py:
d_model 256, 8 heads of 32, context 256, pre-LayerNorm blocks) in BF16, as a
BF16 inference engine would, over real Python source text, and keeps the
keys and values each layer would put in its KV cache, token-major:
(sequences, tokens, heads, head_dim). The weights are the step-400 BF16
checkpoint: sample/ has the embeddings and block 0 (so layer 0's K and V are
exact), ../shared/fixtures all 6 blocks.

Output (committed): tests/data/kv-fixture-l0.safetensors, K and V of layer 0
over 2 sequences of 256 tokens (512 KiB), text = the standard library's
json package sources concatenated in sorted order (the file list is recorded
in the metadata).

Usage: python3 scripts/make_kv_sample.py [WEIGHTS.safetensors] [OUT]
Needs torch and safetensors. Deterministic for a given text and torch build.
"""
import glob
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D, H, HD, T = 256, 8, 32, 256


def source_text():
    import json as json_pkg
    files = sorted(glob.glob(os.path.join(os.path.dirname(json_pkg.__file__), "*.py")))
    return b"".join(open(f, "rb").read() for f in files), [os.path.basename(f) for f in files]


def text_ids(n_seq):
    """(n_seq, T) byte ids of real text for the KV benchmarks, and the files they come from: the
    sources of the standard library's email and json packages, in file order."""
    import email
    import json as json_pkg
    import torch
    files = sorted(glob.glob(os.path.join(os.path.dirname(email.__file__), "*.py")))
    files += sorted(glob.glob(os.path.join(os.path.dirname(json_pkg.__file__), "*.py")))
    text = b"".join(open(f, "rb").read() for f in files)
    if len(text) < n_seq * T:
        raise SystemExit(f"only {len(text)} bytes of text for {n_seq} sequences")
    return torch.frombuffer(bytearray(text[: n_seq * T]), dtype=torch.uint8).long().view(n_seq, T), files


def fixture_kv(weights, ids, layers=None):
    """K and V of each block for token ids (B, T) in BF16: lists of (B, T, H, HD)."""
    import torch
    import torch.nn.functional as F
    W = weights
    bf = torch.bfloat16
    n_blocks = len({k.split(".")[1] for k in W if k.startswith("blocks.")})
    layers = n_blocks if layers is None else min(layers, n_blocks)

    def w(name):
        return W[name].to(bf)

    def ln(x, p):
        return F.layer_norm(x, (D,), w(p + ".weight"), w(p + ".bias"))

    B, t = ids.shape
    ks, vs = [], []
    with torch.no_grad():
        x = w("tok.weight")[ids] + w("pos.weight")[:t]
        for layer in range(layers):
            p = f"blocks.{layer}"
            qkv = F.linear(ln(x, p + ".ln1"), w(p + ".qkv.weight"), w(p + ".qkv.bias"))
            q, k, v = (z.reshape(B, t, H, HD) for z in qkv.split(D, 2))
            ks.append(k.contiguous())
            vs.append(v.contiguous())
            if layer + 1 == layers:
                break
            qt, kt, vt = (z.transpose(1, 2) for z in (q, k, v))
            a = (qt @ kt.transpose(-1, -2)) / math.sqrt(HD)
            a = a.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
            x = x + F.linear((a @ vt).transpose(1, 2).reshape(B, t, D), w(p + ".proj.weight"), w(p + ".proj.bias"))
            x = x + F.linear(F.gelu(F.linear(ln(x, p + ".ln2"), w(p + ".fc1.weight"), w(p + ".fc1.bias"))),
                             w(p + ".fc2.weight"), w(p + ".fc2.bias"))
    return ks, vs


def main():
    import torch
    from safetensors.torch import load_file, save_file
    weights = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "sample", "gpt-small-step400-model-bf16.safetensors")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests", "data", "kv-fixture-l0.safetensors")
    text, files = source_text()
    n_seq = 2
    ids = torch.frombuffer(bytearray(text[:n_seq * T]), dtype=torch.uint8).long().view(n_seq, T)
    ks, vs = fixture_kv(load_file(weights), ids, layers=1)
    meta = {"source": "fixture GPT step 400 (BF16), layer 0 K/V, token-major (seq, token, head, head_dim)",
            "text": "stdlib json/*.py: " + ",".join(files), "weights": os.path.basename(weights)}
    tmp = out + ".tmp"
    save_file({"k": ks[0], "v": vs[0]}, tmp, metadata=meta)
    os.replace(tmp, out)
    print(f"{os.path.relpath(out, ROOT)}: k, v {tuple(ks[0].shape)} bf16, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
