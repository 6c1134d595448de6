#!/usr/bin/env python3
"""PyTorch Distributed Checkpoint storage: tensorzip.dcp vs DCP's FileSystemWriter (raw) vs DCP's zstd stream.

The fixture checkpoint (model BF16 + AdamW FP32 safetensors of one step) is tiled
until the state dict holds at least --target-gb GB; its tensors are split between
the ranks (each rank holds whole tensors, balanced by bytes, as plain tensors under
distinct keys). For each rank count, gloo processes on this machine save the state
dict with each storage and load it back into preallocated tensors; every loaded
tensor is checked byte for byte against the saved one (outside the timings).

Times are wall-clock on rank 0 between barriers (all ranks finished); the page cache
is not dropped, so loads read files that were just written (warm cache).

    python3 bench/dcp_bench.py --dir /work/bench-dcp --ranks 1,2,4 --target-gb 4 [--repeat 2] [--markdown out.md]

The checkpoint directories are deleted after each measurement. tensorzip.dcp rank files
are .tzip files written by TensorWriter; the I/O back end it used is printed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

FIXTURE_FILES = ("gpt-small-step400-model-bf16.safetensors", "gpt-small-step400-optim-fp32.safetensors")
STORAGES = ("tensorzip", "fs", "fs+zstd")


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def _my_tensors(fixtures: str, target_bytes: int, rank: int, world: int):
    """This rank's share of the tiled state dict: {name: tensor}, and the total raw bytes of all ranks."""
    from safetensors.torch import load_file

    base = {}
    for f in FIXTURE_FILES:
        tag = f.split("-")[3]  # model / optim
        base.update({f"{tag}.{k}": v for k, v in load_file(os.path.join(fixtures, f)).items()})
    base_bytes = sum(v.numel() * v.element_size() for v in base.values())
    copies = -(-target_bytes // base_bytes)
    names = [(f"tile{c:03d}.{k}", k) for c in range(copies) for k in sorted(base)]
    # Largest first onto the least loaded rank: every rank gets about the same bytes.
    names.sort(key=lambda nk: -base[nk[1]].numel() * base[nk[1]].element_size())
    loads = [0] * world
    mine = {}
    for name, k in names:
        r = loads.index(min(loads))
        loads[r] += base[k].numel() * base[k].element_size()
        if r == rank:
            mine[name] = base[k].clone()  # own memory per tile, as distinct tensors would have
    return mine, copies * base_bytes


def _storage(kind: str, path: str, writer: bool, threads: int):
    import torch.distributed.checkpoint as dcp
    import tensorzip.dcp

    if kind == "tensorzip":
        return tensorzip.dcp.StorageWriter(path, threads=threads) if writer else \
            tensorzip.dcp.StorageReader(path, threads=threads)
    if kind == "fs":
        return dcp.FileSystemWriter(path) if writer else dcp.FileSystemReader(path)
    if kind == "fs+zstd":
        from torch.distributed.checkpoint._extension import ZStandard

        return dcp.FileSystemWriter(path, _extensions=[ZStandard()]) if writer else dcp.FileSystemReader(path)
    raise ValueError(kind)


def worker(args) -> None:
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    rank, world = args.rank, args.world
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=3600))
    state, raw = _my_tensors(args.fixtures, int(args.target_gb * 1e9), rank, world)
    threads = max(1, (os.cpu_count() or 1) // world)
    rows = []
    for kind in args.storages.split(","):
        path = os.path.join(args.dir, f"{kind}-{world}")
        t_save = t_load = float("inf")
        verified = True
        for _ in range(args.repeat):  # best of --repeat: the machine is shared
            if rank == 0 and os.path.exists(path):
                shutil.rmtree(path)
            dist.barrier()
            t0 = time.perf_counter()
            writer = _storage(kind, path, True, threads)
            dcp.save(state, storage_writer=writer)
            dist.barrier()
            io_used = (getattr(writer, "last_write_stats", None) or {}).get("io", "")
            t_save = min(t_save, time.perf_counter() - t0)
            size = _dir_bytes(path) if rank == 0 else 0
            target = {k: torch.empty_like(v) for k, v in state.items()}
            dist.barrier()
            t0 = time.perf_counter()
            dcp.load(target, storage_reader=_storage(kind, path, False, threads))
            dist.barrier()
            t_load = min(t_load, time.perf_counter() - t0)
            for k, v in state.items():
                if not torch.equal(v.reshape(-1).view(torch.uint8), target[k].reshape(-1).view(torch.uint8)):
                    raise SystemExit(f"rank {rank}: {kind}: tensor {k} differs after load")
            del target
            ok = torch.tensor([1])
            dist.all_reduce(ok)
            verified = verified and int(ok.item()) == world
        if rank == 0:
            shutil.rmtree(path)
            rows.append({"ranks": world, "storage": kind, "raw_bytes": raw, "bytes": size, "save_s": t_save,
                         "load_s": t_load, "verified": verified, "repeat": args.repeat, "io": io_used})
            print("ROW " + json.dumps(rows[-1]), flush=True)
        dist.barrier()
    dist.destroy_process_group()
    # Gloo's worker thread can still be releasing its last work (and the tensors it holds) while
    # the interpreter finalises: that decref takes the GIL, the thread is made to exit, and the
    # process ends in std::terminate. Everything is written and closed: leave without finalising.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default="/work/shared/fixtures")
    ap.add_argument("--dir", default="/work/bench-dcp", help="scratch folder on a disk with room for one checkpoint")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--target-gb", type=float, default=4.0)
    ap.add_argument("--storages", default=",".join(STORAGES))
    ap.add_argument("--repeat", type=int, default=1, help="save and load this many times, report the fastest")
    ap.add_argument("--markdown", help="append the table to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", default="0", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    if "fs+zstd" in args.storages.split(","):
        try:
            from torch.distributed.checkpoint._extension import ZStandard

            available = ZStandard.is_available()
        except ImportError:  # a PyTorch without DCP stream extensions
            available = False
        if not available:
            print("dcp_bench: DCP's ZStandard extension is unavailable (no torch.distributed.checkpoint._extension, "
                  "or neither zstandard nor pyzstd installed): fs+zstd left out", file=sys.stderr)
            args.storages = ",".join(k for k in args.storages.split(",") if k != "fs+zstd")
    os.makedirs(args.dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rows = []
    for world in [int(x) for x in args.ranks.split(",")]:
        port = str(_free_port())
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--fixtures", args.fixtures, "--dir", args.dir,
               "--target-gb", str(args.target_gb), "--storages", args.storages, "--world", str(world),
               "--repeat", str(args.repeat),
               "--port", port]
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env,
                                  stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL) for r in range(world)]
        for line in procs[0].stdout:
            line = line.decode()
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                r = rows[-1]
                print(f"{r['ranks']} rank(s) {r['storage']:9s} {r['bytes'] / 1e9:.3f} GB "
                      f"save {r['save_s']:.1f} s load {r['load_s']:.1f} s"
                      + (f" (writes: {r['io']})" if r.get("io") else ""), flush=True)
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"dcp_bench: a worker of the {world}-rank run failed (exit {p.returncode})")
    if not rows:
        raise SystemExit("dcp_bench: no results")
    raw = rows[0]["raw_bytes"]
    names = {"tensorzip": "tensorzip.dcp StorageWriter/Reader", "fs": "DCP FileSystemWriter/Reader",
             "fs+zstd": "DCP FileSystemWriter + ZStandard extension"}
    ios = sorted({r["io"] for r in rows if r.get("io")})
    lines = [f"State dict: {raw / 1e9:.3f} GB (fixture step400 model BF16 + optimizer FP32, tiled), "
             f"split between the ranks; times: best of {args.repeat}."
             + (f" tensorzip.dcp writes through: {', '.join(ios)}." if ios else ""), "",
             "| ranks | storage | size (GB) | ratio | save (s) | load (s) | save GB/s | load GB/s | verified |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {names.get(r['storage'], r['storage'])} | {r['bytes'] / 1e9:.3f} | "
                     f"{raw / r['bytes']:.3f} | {r['save_s']:.1f} | {r['load_s']:.1f} | "
                     f"{raw / r['save_s'] / 1e9:.2f} | {raw / r['load_s'] / 1e9:.2f} | "
                     f"{'yes' if r['verified'] else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
