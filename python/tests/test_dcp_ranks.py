"""tensorzip.dcp across processes (gloo on CPU; python/tests/_dcp_worker.py): a 2-rank save loaded
by one process, N -> M rank resharding of DTensor model + optimizer state, multi-rank async_save,
FSDP2, async_save while training, a rank killed mid-save; CUDA tensors over NCCL when a GPU is
present.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dcp_support import (  # noqa: E402,F401  (quiet_dcp: autouse; torch or the module is skipped)
    assert_identical, dcp, dist, quiet_dcp, tensor_bytes, torch)
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402

import tensorzip  # noqa: E402
import tensorzip.dcp as tzdcp  # noqa: E402


_WORKER = textwrap.dedent('''
    import os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.checkpoint.state_dict import get_state_dict
    import tensorzip.dcp

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # same model and data on every rank (replicated training)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 64, generator=g), torch.randn(8, 16, generator=g)
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    msd, osd = get_state_dict(model, opt)
    full = (torch.randn(1000, 48, generator=g) * 0.02).to(torch.bfloat16)
    state = {"model": msd, "optim": osd, "sharded": distribute_tensor(full, mesh, [Shard(0)]),
             "rank_count": world}
    dcp.save(state, storage_writer=tensorzip.dcp.StorageWriter(os.path.join(out, "ckpt")))
    if rank == 0:
        torch.save({"model": msd, "optim": osd, "sharded": full}, os.path.join(out, "expected.pt"))
    dist.barrier()
    # Resharded read: load into Shard(1) columns; every rank reads part of both stored row shards.
    other = {"sharded": distribute_tensor(torch.zeros(1000, 48, dtype=torch.bfloat16), mesh, [Shard(1)])}
    dcp.load(other, storage_reader=tensorzip.dcp.StorageReader(os.path.join(out, "ckpt")))
    mine = other["sharded"].to_local()
    want = full[:, rank * 24:(rank + 1) * 24]
    assert mine.shape == want.shape and torch.equal(mine.view(torch.int16), want.view(torch.int16))
    print("resharded-ok", rank, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's worker thread can still be releasing its last work (and the tensors it holds) while
    # the interpreter finalises: that decref takes the GIL, the thread is made to exit, and the
    # process ends in std::terminate. Everything is written and closed: leave without finalising.
    sys.stdout.flush(); sys.stderr.flush(); os._exit(0)
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_save_one_rank_load(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = dict(os.environ)
    # The worker must import the same tensorzip as this test.
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tensorzip.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only; hostname may not resolve in CI
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("2-rank save timed out")
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]

    files = sorted(f.name for f in (tmp_path / "ckpt").iterdir())
    data_files = sorted(f for f in files if f.endswith(tzdcp.SUFFIX))
    assert len(data_files) == 2 and data_files[0].startswith("__0_") and data_files[1].startswith("__1_"), files
    # Each rank wrote its shard of the DTensor into its own file.
    with open(tmp_path / "ckpt" / ".metadata", "rb") as f:
        md = pickle.load(f)
    shard_files = {info.relative_path for idx, info in md.storage_data.items() if idx.fqn == "sharded"}
    assert shard_files == set(data_files)

    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    # Load with one process (no process group): the two shards are assembled into one plain tensor.
    model, opt = _make_worker_model()
    msd, osd = get_state_dict(model, opt)
    out = {"model": msd, "optim": osd, "sharded": torch.zeros(1000, 48, dtype=torch.bfloat16), "rank_count": 0}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "ckpt"))
    assert out["rank_count"] == 2
    assert_identical(expected, {k: out[k] for k in expected})

    assert "resharded-ok" in outs[0] and "resharded-ok" in outs[1], outs


def _make_worker_model():
    torch.manual_seed(123)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _x = torch.randn(2, 64)
    opt.zero_grad()
    model(_x).sum().backward()
    opt.step()
    return model, opt


_WORKER_FILE = Path(__file__).with_name("_dcp_worker.py")


def _worker_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tensorzip.__file__).parents[1]), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.pop(tzdcp._STALL_ENV, None)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _spawn(scenario: str, world: int, out: Path):
    port = _free_port()
    return [subprocess.Popen([sys.executable, str(_WORKER_FILE), scenario, str(r), str(world), str(port), str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_worker_env())
            for r in range(world)]


def _wait_all(procs, timeout: float):
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"worker timed out: {p.args}")
    return outs


def test_reshard_save_n_load_m_async_fsdp2(tmp_path):
    """4 gloo processes: save with 4/3/2 ranks, load with 2/2/4/4 ranks (rows <-> columns), model + AdamW
    + non-tensor items byte-identical; multi-rank async_save loaded by 3 ranks; FSDP2 4 -> 2 ranks."""
    procs = _spawn("reshard", 4, tmp_path)
    outs = _wait_all(procs, 240)
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-6000:]
    for check, ranks in [("load-r4-on-2-cols", 2), ("load-c3-on-2-rows", 2), ("load-r2-on-4-rows", 4),
                         ("load-c3-on-4-cols", 4), ("async_save-4-load-3", 3), ("fsdp2-4-load-2", 2)]:
        assert all(f"ok {check}" in outs[r] for r in range(ranks)), (check, outs[0][-3000:])
    # The 3-rank save wrote three files, and a checkpoint is readable by one process as plain tensors.
    assert len(list((tmp_path / "c3").glob("*" + tzdcp.SUFFIX))) == 3
    out = {"emb": torch.zeros(2048, 64, dtype=torch.bfloat16), "step_count": 0, "blob": b"",
           "cfg": {"name": "", "sizes": [], "ratio": 0.0}}
    dcp.load(out, storage_reader=tzdcp.StorageReader(tmp_path / "c3"))
    g = torch.Generator().manual_seed(2)
    assert tensor_bytes(out["emb"]) == tensor_bytes((torch.randn(2048, 64, generator=g) * 0.02).to(torch.bfloat16))
    assert out["step_count"] == 3 and out["blob"] == bytes([0, 0, 255]) * 5
    assert out["cfg"] == {"name": "run-0", "sizes": [64, 256], "ratio": 0.5}


def test_async_save_while_fsdp2_trains_gloo_only(tmp_path):
    """The README's async_save: gloo-only FSDP2 training continues while the save runs on its own
    gloo group; the checkpoint equals the state at the time of the save."""
    procs = _spawn("async_train", 2, tmp_path)
    outs = _wait_all(procs, 240)
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-6000:]
    assert all("ok async-save-while-training" in o and "ok async-train-load" in o for o in outs), outs[0][-3000:]


def _wait_for(path: Path, procs, timeout: float):
    import time
    deadline = time.monotonic() + timeout
    while not path.exists():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            for q in procs:
                q.kill()
            outs = [q.communicate()[0].decode(errors="replace") for q in procs]
            pytest.fail(f"worker did not reach {path.name}: " + "\n---\n".join(o[-3000:] for o in outs))
        time.sleep(0.05)


def test_rank_killed_mid_save_leaves_previous_checkpoint(tmp_path):
    import signal

    fresh = tmp_path / "single"
    fresh.mkdir()
    procs = _spawn("crash", 2, tmp_path)
    single = subprocess.Popen([sys.executable, str(_WORKER_FILE), "single_crash", "0", "1", "0", str(fresh)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_worker_env())
    _wait_for(tmp_path / "stalled", procs, 120)
    procs[1].send_signal(signal.SIGKILL)  # rank 1 dies with its new data file half-written
    procs[1].wait()
    procs[0].kill()  # the job dies with it (rank 0 would wait on rank 1 until the gloo timeout)
    procs[0].wait()
    _wait_for(fresh / "stalled-fresh", [single], 120)
    single.send_signal(signal.SIGKILL)
    single.wait()

    # Reused directory: the new save's files are there, .metadata is still the previous save's.
    ckpt = tmp_path / "ckpt"
    with open(ckpt / ".metadata", "rb") as f:
        finished = {info.relative_path for info in pickle.load(f).storage_data.values()}
    names = sorted(f.name for f in ckpt.iterdir())
    # The finished save's two files; rank 1 of the interrupted one left only its writer's temporary
    # (nothing is at a rank file's final name before TensorWriter.finish); rank 0's may be complete.
    temps = [n for n in names if n.startswith(".__1_") and tzdcp.SUFFIX + ".tmp-" in n]
    data_files = [n for n in names if n.endswith(tzdcp.SUFFIX)] + temps
    assert len(finished) == 2 and finished <= set(data_files) and len(temps) == 1, names
    assert not [n for n in names if n.startswith("__1_") and n not in finished], names
    # clear_interrupted on a copy: only the interrupted save's files go; the checkpoint still loads.
    import shutil
    copy = tmp_path / "ckpt-copy"
    shutil.copytree(ckpt, copy)
    removed = tzdcp.clear_interrupted(copy)
    assert set(removed) == set(data_files) - finished and removed, (removed, names)
    assert sorted(f.name for f in copy.iterdir()) == sorted(finished | {".metadata"})
    assert tzdcp.clear_interrupted(copy) == []
    expected = torch.load(tmp_path / "expected_a.pt", weights_only=True)
    out = {"model": {k: torch.zeros_like(v) for k, v in expected["model"].items()},
           "emb": torch.zeros_like(expected["emb"]), "step_count": 0, "blob": b""}
    dcp.load(out, storage_reader=tzdcp.StorageReader(ckpt))
    assert_identical({k: expected[k] for k in out}, out)

    # The next save into that directory succeeds and removes every older data file.
    dcp.save({"w": torch.ones(3)}, storage_writer=tzdcp.StorageWriter(ckpt))
    left = sorted(f.name for f in ckpt.iterdir())
    assert len([f for f in left if f.endswith(tzdcp.SUFFIX)]) == 1 and not set(left) & set(data_files), left
    assert not [f for f in left if f.endswith(".tmp") or ".tmp-" in f], left

    # Fresh directory: nothing to load, and the error says why: a CorruptDataError in the caller's
    # code (not wrapped by DCP), from the reader's constructor and from dcp.load(checkpoint_id=).
    fresh_ck = fresh / "fresh"
    with pytest.raises(tensorzip.CorruptDataError, match="no finished checkpoint") as ei:
        tzdcp.StorageReader(fresh_ck)
    assert "interrupted" in str(ei.value) and str(fresh_ck) in str(ei.value) and "clear_interrupted" in str(ei.value)
    with pytest.raises(tensorzip.CorruptDataError, match="no finished checkpoint"):
        dcp.load({"emb": torch.zeros(2048, 64, dtype=torch.bfloat16)}, checkpoint_id=fresh_ck,
                 storage_reader=tzdcp.StorageReader(ckpt))
    # clear_interrupted: removes the leftovers of the interrupted save, nothing else.
    (fresh_ck / "notes.txt").write_text("mine")
    left_before = sorted(f.name for f in fresh_ck.iterdir())
    removed = tzdcp.clear_interrupted(fresh_ck)
    assert removed and sorted(removed) == [n for n in left_before if n != "notes.txt"], (removed, left_before)
    assert sorted(f.name for f in fresh_ck.iterdir()) == ["notes.txt"]
    tzdcp.StorageReader(fresh_ck)  # nothing unfinished left (and nothing to load: DCP's own error then)


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs a CUDA GPU and NCCL")
def test_cuda_tensors_nccl_single_rank(tmp_path):
    """CUDA tensors over NCCL: with a tensorzip module built with CUDA, encoded on the GPU (the writer's
    gpu_bytes count every tensor byte), reloaded byte-identical onto the GPU, and the rank file equals
    the one of gpu_encode=False (CPU encode) byte for byte; dcp.async_save (staged to CPU memory by
    DCP) encodes on the CPU. A module without CUDA takes the CPU path (TZ_REQUIRE_GPU_ENCODE=1, as
    bench/gpu/run.sh sets, makes that a failure)."""
    procs = _spawn("cuda", 1, tmp_path)
    (out,) = _wait_all(procs, 240)
    assert procs[0].returncode == 0 and "ok cuda" in out, out[-6000:]
    assert "ok cuda-cpu-path-same-file" in out and "ok cuda-async-staged-cpu" in out, out[-6000:]
    if tensorzip._tensorzip.HAVE_CUDA:
        assert "ok cuda-gpu-encode" in out, out[-6000:]
