"""vLLM (CPU build) weight load: the default safetensors loader vs the load format ``tensorzip`` and
ZipNN's vLLM route.

    sudo python bench/vllm_load_bench.py --tzip build/programs/tzip --out vllm-load.md

(root: it drops the page cache, makes a loop device and a blkio cgroup.) Run it with a Python
that has vLLM and tensorzip installed.

The model: bench/gpt2_models.py's ``tiled`` GPT-2 folder (GPT2LMHeadModel, vocab 256, n_positions
256, n_embd 2048, n_layer 12, n_head 16, n_inner 8192, untied lm_head, BF16: 1.21 GB of weights),
every tensor of it made of the real trained BF16 values of the fixture GPT of the same kind, tiled;
no random numbers. The folder is compressed with `tzip compress`, and written a third time in ZipNN's
compressed safetensors layout (bench/zipnn_folder.py: ZipNN's public compress API and safetensors'
save_file, as zipnn's package ships no writer; every tensor read back bit-exactly through ZipNN's
SafeOpen before any measurement).

ZipNN's route (zipnn 0.5.4, its documented vLLM integration): the measuring process calls
`zipnn.zipnn_safetensors()` before it imports vLLM (vLLM's weight_utils imports `safe_open` from
safetensors.torch by name), then vLLM's default loader (load format "auto") reads the ZipNN folder
through the patched `safe_open(...).get_tensor`. ZipNN decodes with its default thread count,
min(CPU count, 16): the route has no thread option.

The three folders are put on an ext4 filesystem in a loop-device file kept in RAM (tmpfs,
`--data`), so the loop device's reads cost nothing but the limit set on them. Each measurement is
a fresh process (VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_KVCACHE_SPACE=1, enforce_eager) that
builds `LLM(...)`: "load" is the wall time of the model's `load_weights` (vLLM's GPT-2
load_weights, wrapped, for both loaders: reading, decoding and copying every weight), "ready" the
time of `LLM(...)` construction, "peak RSS" the process's VmHWM (/proc/self/status: the high-water
mark of its own address space; ru_maxrss is not used, as Linux carries the parent's peak over into
a child through fork and exec, and the parent holds the model it wrote). Settings: (a) page cache
(the files read once before each run), (b) cold storage: the folder's files dropped from the page
cache (`posix_fadvise(POSIX_FADV_DONTNEED)`, then checked with `fincore`: no page of them
resident) and the loop device's buffers flushed, and the loop device's reads limited by the
child's blkio cgroup (`blkio.throttle.read_bps_device`; the child writes its pid to the cgroup's
cgroup.procs before it imports vLLM). Only the model's files are cold: vLLM's and torch's code
stay in the page cache, as on a server that loads a model it has not read since boot. (Dropping
every cache instead, `echo 3 > /proc/sys/vm/drop_caches`, with the image on the VM's disk, made the
rows depend on that disk, slower than the limit and varying from run to run, and on the code pages
of vLLM read back during the load.) Configurations are
interleaved over rounds; the table gives medians. Each child also generates 16 greedy tokens for
one prompt; they must equal those of the plain folder.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2_models  # noqa: E402
CGROUP = Path("/sys/fs/cgroup/blkio/tzip_vllm_bench")
PROMPT = [ord(c) for c in "def load_file(path):\n    with open(path"]
CONFIGS = [("safetensors (vLLM default)", "plain", "auto", {}),
           ("tensorzip threads=1", "tzip", "tensorzip", {"threads": 1}),
           ("tensorzip threads=2", "tzip", "tensorzip", {"threads": 2}),
           ("ZipNN (zipnn_safetensors)", "zipnn", "auto", {})]
CFG = gpt2_models.TILED


# ---- the folders ----

def make_folders(root: Path, tzip: str) -> dict:
    from safetensors.torch import save_file
    import zipnn_folder
    plain, packed, znn = root / "gpt2-big", root / "gpt2-big.tzip", root / "gpt2-big.znn"
    for d in (plain, znn):
        gpt2_models.write_gpt2_config(d, CFG, tokenizer=False)
    sd = gpt2_models.tiled_state_dict(CFG)
    save_file(sd, str(plain / "model.safetensors"), metadata={"format": "pt"})
    t0 = time.perf_counter()
    subprocess.run([tzip, "compress", str(plain), "-o", str(packed)], check=True, capture_output=True)
    secs = time.perf_counter() - t0
    t0 = time.perf_counter()
    counts = zipnn_folder.write(sd, znn / "model.znn.safetensors", {"format": "pt"})
    znn_secs = time.perf_counter() - t0
    zipnn_folder.verify(znn / "model.znn.safetensors", sd)
    a, b = (plain / "model.safetensors").stat().st_size, (packed / "model.tzip").stat().st_size
    return {"plain": plain, "tzip": packed, "zipnn": znn, "sizes": (a, b), "compress_s": secs,
            "zipnn_size": (znn / "model.znn.safetensors").stat().st_size, "zipnn_s": znn_secs,
            "zipnn_counts": counts}


# ---- one measurement (child process) ----

def child(spec: dict) -> None:
    if spec.get("cgroup"):
        Path(spec["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
    if spec.get("zipnn"):  # ZipNN's route: patch safetensors before vLLM imports safe_open
        from zipnn import zipnn_safetensors
        zipnn_safetensors()
    from vllm import LLM, SamplingParams
    from vllm.model_executor.model_loader import weight_utils
    if spec.get("zipnn") and weight_utils.safe_open.__module__ != "zipnn.zipnn":
        raise RuntimeError(f"vLLM reads safetensors through {weight_utils.safe_open!r}, not ZipNN's SafeOpen")
    from vllm.model_executor.models import gpt2
    timed = {}
    real = gpt2.GPT2LMHeadModel.load_weights

    def load_weights(self, weights):
        t0 = time.perf_counter()
        try:
            return real(self, weights)
        finally:
            timed["load"] = time.perf_counter() - t0

    gpt2.GPT2LMHeadModel.load_weights = load_weights
    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], load_format=spec["load_format"], model_loader_extra_config=spec["extra"],
              skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16", max_model_len=256, seed=0)
    ready = time.perf_counter() - t0
    out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(temperature=0.0, max_tokens=16,
                                                                       detokenize=False), use_tqdm=False)
    rss_mib = int(re.search(r"^VmHWM:\s*(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1)) / 1024
    print("RESULT " + json.dumps({"load": timed.get("load"), "ready": ready, "rss_mib": rss_mib,
                                  "tokens": list(out[0].outputs[0].token_ids)}), flush=True)


def resident_pages(files) -> int:
    """Pages of ``files`` in the page cache (util-linux fincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "PAGES"] + [str(f) for f in files],
                         check=True, capture_output=True, text=True).stdout
    return sum(int(x) for x in out.split())


def drop_cached(files, dev) -> None:
    """The cold setting: ``files`` out of the page cache and the loop device's buffers flushed; refuses
    to measure if a page of them stays resident."""
    subprocess.run(["sync"], check=True)
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    subprocess.run(["blockdev", "--flushbufs", dev], check=True)
    left = resident_pages(files)
    if left:
        raise RuntimeError(f"{left} pages of {[str(f) for f in files]} still in the page cache after dropping them")


def measure(name, folder, load_format, extra, bps, files, dev, zipnn=False):
    """Runs one child: {"load", "ready", "rss_mib", "tokens"}."""
    if bps is None:
        for f in files:  # the page cache setting: the folder's files read once first
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    else:
        drop_cached(files, dev)
    spec = {"model": str(folder), "load_format": load_format, "extra": extra,
            "cgroup": str(CGROUP) if bps else None, "zipnn": zipnn}
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                       env=env, timeout=1200)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{name} exited {p.returncode}:\n{p.stderr[-4000:]}")
    r = json.loads(lines[-1][7:])
    print(f"  {name:28s} load {r['load']:.2f} s  ready {r['ready']:.2f} s  peak RSS {r['rss_mib']:.0f} MiB",
          flush=True)
    return r


# ---- storage: loop device + blkio cgroup ----

class Storage:
    def __init__(self, data: Path, size_gib: int):
        self.data, self.size_gib, self.dev, self.mnt = data, size_gib, None, data / "mnt"

    def __enter__(self):
        try:  # a folder of its own: __exit__ removes it with everything in it
            self.data.mkdir(parents=True)
        except FileExistsError:
            raise SystemExit(f"vllm_load_bench.py: {self.data} exists; --data must name a folder the bench can "
                             "create (and remove at the end): remove it or name another") from None
        img = self.data / "fs.img"
        subprocess.run(["truncate", "-s", f"{self.size_gib}G", str(img)], check=True)
        self.dev = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True,
                                  text=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", "-F", self.dev], check=True)
        self.mnt.mkdir(exist_ok=True)
        subprocess.run(["mount", self.dev, str(self.mnt)], check=True)
        CGROUP.mkdir(exist_ok=True)
        rdev = os.stat(self.dev).st_rdev
        self.majmin = f"{os.major(rdev)}:{os.minor(rdev)}"
        return self

    def limit(self, bps):
        (CGROUP / "blkio.throttle.read_bps_device").write_text(f"{self.majmin} {int(bps) if bps else 0}\n")

    def __exit__(self, *exc):
        steps = [lambda: subprocess.run(["umount", str(self.mnt)], check=True),
                 lambda: subprocess.run(["losetup", "-d", self.dev], check=True),
                 lambda: CGROUP.rmdir() if CGROUP.exists() else None,
                 lambda: shutil.rmtree(self.data)]
        for step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - go on cleaning up
                print(f"cleanup: {e}", file=sys.stderr)


# ---- the table ----

def cpu_line():
    info = Path("/proc/cpuinfo").read_text()
    get = lambda k: re.search(rf"^{k}\s*:\s*(.*)$", info, re.M).group(1)  # noqa: E731
    return f"{get('model name')} (family {get('cpu family')}, model {get('model')}), {os.cpu_count()} CPUs"


def table(results, settings, folders, args, elapsed):
    a, b = folders["sizes"]
    z, zc = folders["zipnn_size"], folders["zipnn_counts"]
    from importlib.metadata import version
    zver = version("zipnn")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    rows = ["| storage | loader | load (s) | vs safetensors | ready (s) | peak RSS (MiB) | tokens |",
            "|---|---|---:|---:|---:|---:|---|"]
    for sname, _ in settings:
        base = statistics.median(r["load"] for r in results[(sname, CONFIGS[0][0])])
        for cname, *_ in CONFIGS:
            rs = results[(sname, cname)]
            load = statistics.median(r["load"] for r in rs)
            same = "same" if all(r["same"] for r in rs) else "DIFFERENT"
            rows.append(f"| {sname} | {cname} | {load:.2f} | {load / base:.2f}x | "
                        f"{statistics.median(r['ready'] for r in rs):.2f} | "
                        f"{statistics.median(r['rss_mib'] for r in rs):.0f} | {same} |")
    notes = [f"Machine: {cpu_line()}, {platform.system()} {platform.release()}; vLLM CPU build "
             f"{__import__('vllm').__version__}, tensorzip {__import__('tensorzip').__version__}.",
             f"Commit {head}, {datetime.date.today().isoformat()}; "
             f"command: `{' '.join(['python'] + sys.argv)}`; {args.rounds} rounds, medians; "
             f"total run time {elapsed / 60:.1f} min.",
             f"Model: GPT-2 layout, {CFG}, BF16, {a / 1e9:.2f} GB of safetensors; every tensor tiled from the "
             "real trained BF16 values of the fixture GPT of the same kind (bench/vllm_load_bench.py's docstring). "
             f"`tzip compress`: {b / 1e9:.2f} GB, ratio {a / b:.3f} ({100 * b / a:.1f}% of the size), "
             f"{folders['compress_s']:.1f} s. ZipNN's layout (zipnn {zver}, HUFFMAN, default threads): "
             f"{z / 1e9:.2f} GB, ratio {a / z:.3f} ({100 * z / a:.1f}% of the size), {folders['zipnn_s']:.1f} s "
             f"(ZipNN's compress API in Python; {zc['compressed']} tensors compressed, {zc['stored']} stored as "
             "they are).",
             "load: wall time of the model's load_weights (reading, decoding, copying all weights); ready: "
             "`LLM(...)` construction; peak RSS: the process's VmHWM; tokens: 16 greedy tokens vs the "
             "plain folder's. Storage: ext4 on a loop device whose image is in RAM (tmpfs); cold: the folder's files "
             "dropped from the page cache before each run (checked with fincore) and the device's reads limited by "
             "a blkio cgroup (v1 throttle.read_bps_device) holding the measuring process; vLLM's own code stays cached.",
             "ZipNN (zipnn_safetensors): ZipNN's documented vLLM route, `zipnn.zipnn_safetensors()` in the "
             "measuring process before `import vllm`, then vLLM's default loader (load format auto) on the ZipNN "
             "folder; ZipNN decodes each tensor with its default thread count, min(CPU count, 16) = "
             f"{min(os.cpu_count(), 16)} here (the route takes no thread option). The ZipNN file is written by "
             "bench/zipnn_folder.py (zipnn's package ships no writer) and every tensor was read back bit-exactly "
             "through ZipNN's SafeOpen before the runs."]
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--tzip", default="tzip")
    ap.add_argument("--data", default="/dev/shm/tzip-vllm-bench",
                    help="a new folder for the loop device's image (created, and removed at the end): on tmpfs, so only "
                         "the read limit costs time")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bandwidths", default="1e9,5e8", help="read limits in bytes/s (comma-separated)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    start = time.perf_counter()
    settings = [("page cache", None)] + [(f"{float(b) / 1e9:g} GB/s, cold", float(b))
                                         for b in args.bandwidths.split(",") if b]
    with Storage(Path(args.data), 4) as st:
        folders = make_folders(st.mnt, args.tzip)
        subprocess.run(["sync"], check=True)  # the folders written back before any run is timed
        print(f"sizes {folders['sizes']}, compress {folders['compress_s']:.1f} s; ZipNN {folders['zipnn_size']}, "
              f"{folders['zipnn_s']:.1f} s, {folders['zipnn_counts']}", flush=True)
        results, want = {}, None
        for rnd in range(args.rounds):
            for sname, bps in settings:
                st.limit(bps)
                print(f"round {rnd + 1}, {sname}", flush=True)
                for cname, key, fmt, extra in CONFIGS:
                    files = [p for p in folders[key].iterdir() if p.is_file()]
                    r = measure(cname, folders[key], fmt, extra, bps, files, st.dev, zipnn=key == "zipnn")
                    want = want or r["tokens"]
                    r["same"] = r["tokens"] == want
                    results.setdefault((sname, cname), []).append(r)
        st.limit(None)
    text = table(results, settings, folders, args, time.perf_counter() - start)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
