"""The codecs bench/codec_bench.py runs, one class each with the same small interface
(prepare, compress, keep, decompress, close; name; multithreaded): tensorzip through ctypes on
libtensorzip.so (built into build-bench/ unless a library is given), zstd and lz4 through their
Python packages, ZipNN.
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np

from codec_data import REPO, Tensor

DEFAULT_BUILD = REPO / "build-bench"

# tensorzip dtype codes (include/tensorzip/tensorzip.h)
TZ_DTYPE = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4, "e5m2": 5}
ZIPNN_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32",
               "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


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
