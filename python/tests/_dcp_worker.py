"""Worker process of test_dcp_ranks.py: several of these run together on CPU (gloo).

    python _dcp_worker.py <scenario> <rank> <world> <port> <out dir>

Scenarios:
- reshard (4 ranks): a model + AdamW state sharded by rows or columns (DTensor) saved
  with 4, 3 and 2 ranks and loaded with 2, 2 and 4 ranks; a multi-rank dcp.async_save;
  an FSDP2 (fully_shard) model + optimizer saved with 4 ranks and loaded with 2.
- cuda (1 rank per GPU, NCCL): CUDA tensors saved and loaded.
- async_train (2 ranks, gloo only): FSDP2 training that goes on while dcp.async_save writes
  the checkpoint, the README's way (process_group=dist.new_group(backend="gloo"), created once);
  the checkpoint is then loaded into a fresh FSDP2 model and compared with the state at the save.
- crash (2 ranks): a checkpoint saved, then a second save into the same directory
  in which rank 1 stops half-way (tensorzip.dcp test hook: its .tzip only a temporary) and is
  killed by the test.

Each check that passes prints "ok <name>"; any failure raises (non-zero exit).
"""
from __future__ import annotations

import datetime
import os
import sys
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402

import tensorzip.dcp as tzdcp  # noqa: E402

BLOCK = 4096  # small codec blocks, so that resharded loads of these small tensors can skip blocks


def trained(seed: int, steps: int = 3):
    """Same model, data and AdamW state on every rank (replicated training)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        x, y = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def full_state(seed: int):
    model, opt = trained(seed)
    msd, osd = get_state_dict(model, opt)
    g = torch.Generator().manual_seed(seed + 2)
    emb = (torch.randn(2048, 64, generator=g) * 0.02).to(torch.bfloat16)
    return {"model": msd, "optim": osd, "emb": emb, "step_count": 3 + seed, "blob": bytes([seed, 0, 255]) * 5,
            "cfg": {"name": f"run-{seed}", "sizes": [64, 256], "ratio": 0.5}}


def mapped(obj, fn):
    if isinstance(obj, dict):
        return {k: mapped(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mapped(v, fn) for v in obj]
    return fn(obj)


def sharded(state, mesh, how: str, blank: bool = False):
    """Tensors of ndim >= 1 as DTensors split by rows (Shard(0)) or columns (Shard(1) for matrices).

    blank: zeros and dummy values instead (a load target)."""
    def one(x):
        if isinstance(x, torch.Tensor):
            t = torch.zeros_like(x) if blank else x
            if t.ndim == 0:
                return t
            dim = 1 if how == "cols" and t.ndim >= 2 else 0
            return distribute_tensor(t, mesh, [Shard(dim)])
        if not blank:
            return x
        if isinstance(x, bool):
            return not x
        if isinstance(x, (int, float)):
            return -1
        if isinstance(x, (str, bytes)):
            return type(x)()
        return x
    return mapped(state, one)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def check_equal(expected, loaded, what: str) -> int:
    """Byte-identical tensors (DTensors gathered with full_tensor: collective) and equal other leaves."""
    n = 0
    if isinstance(expected, dict):
        assert isinstance(loaded, dict) and sorted(expected) == sorted(loaded), (what, sorted(loaded))
        for k in expected:
            n += check_equal(expected[k], loaded[k], f"{what}.{k}")
        return n
    if isinstance(expected, list):
        assert isinstance(loaded, list) and len(expected) == len(loaded), what
        return sum(check_equal(e, v, f"{what}.{i}") for i, (e, v) in enumerate(zip(expected, loaded)))
    if isinstance(expected, torch.Tensor):
        got = loaded.full_tensor() if isinstance(loaded, DTensor) else loaded
        exp = expected.full_tensor() if isinstance(expected, DTensor) else expected
        assert same_bytes(exp, got), f"{what}: tensor bytes differ"
        return 1
    assert expected == loaded, (what, expected, loaded)
    return 0


def init(rank: int, world: int, port: str, backend: str = "gloo"):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def reshard(rank: int, world: int, out: str) -> None:
    assert world == 4
    groups = {4: dist.group.WORLD, 3: dist.new_group([0, 1, 2]), 2: dist.new_group([0, 1])}
    meshes = {n: DeviceMesh.from_group(g, "cpu") for n, g in groups.items() if rank < n}
    full = full_state(0)

    # Save with N ranks, split by rows or columns (uneven splits for 3 ranks).
    saves = [(4, "rows", "r4"), (3, "cols", "c3"), (2, "rows", "r2")]
    for n, how, name in saves:
        if rank < n:
            dcp.save(sharded(full, meshes[n], how),
                     storage_writer=tzdcp.StorageWriter(os.path.join(out, name), block_elems=BLOCK),
                     process_group=groups[n])
    dist.barrier()
    # Load with M != N ranks, split the other way or finer.
    loads = [("r4", 2, "cols"), ("c3", 2, "rows"), ("r2", 4, "rows"), ("c3", 4, "cols")]
    for name, m, how in loads:
        if rank < m:
            tzdcp.reset_read_stats()
            target = sharded(full, meshes[m], how, blank=True)
            dcp.load(target, storage_reader=tzdcp.StorageReader(os.path.join(out, name)), process_group=groups[m])
            st = tzdcp.read_stats()
            n_tensors = check_equal(full, target, name)
            assert n_tensors >= 4 + 4 * 3 + 1, n_tensors
            if name == "r2":
                # Each rank loads half of a stored row shard: block-level partial reads, no whole decode
                # of the large tensors (the biases fit in one block and are decoded whole).
                assert st["partial_decodes"] >= 7 and st["blocks_skipped"] >= 7, st
            print(f"ok load-{name}-on-{m}-{how}", st, flush=True)
        dist.barrier()

    # Multi-rank async_save (its own gloo group, as DCP recommends), then a load with 3 ranks.
    async_pg = dist.new_group(backend="gloo")
    state1 = full_state(1)
    to_save = sharded(state1, meshes[4], "rows")
    fut = dcp.async_save(to_save, storage_writer=tzdcp.StorageWriter(os.path.join(out, "async")),
                         process_group=async_pg)
    to_save["emb"].to_local().add_(1)  # staged (copied) before async_save returned
    to_save["model"]["0.weight"].to_local().zero_()
    fut.result(timeout=120)
    dist.barrier()
    if rank < 3:
        target = sharded(state1, meshes[3], "cols", blank=True)
        dcp.load(target, storage_reader=tzdcp.StorageReader(os.path.join(out, "async")), process_group=groups[3])
        check_equal(state1, target, "async")
        print("ok async_save-4-load-3", flush=True)
    dist.barrier()

    # FSDP2: fully_shard on 4 ranks, save model + AdamW; load into an FSDP2 model on 2 ranks.
    from torch.distributed.fsdp import fully_shard

    def fsdp_model(mesh):
        torch.manual_seed(5 + rank)  # different initial weights on purpose: the load must overwrite them
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(9)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 64, generator=g)).square().mean().backward()
            opt.step()
        return model, opt

    model, opt = fsdp_model(meshes[4])
    msd, osd = get_state_dict(model, opt)
    assert isinstance(msd["0.weight"], DTensor) and msd["0.weight"].placements == (Shard(0),)
    def gathered(x):
        if isinstance(x, DTensor):
            return x.full_tensor()
        return x.clone() if isinstance(x, torch.Tensor) else x

    expected = mapped({"model": msd, "optim": osd}, gathered)
    dcp.save({"model": msd, "optim": osd}, storage_writer=tzdcp.StorageWriter(os.path.join(out, "fsdp")))
    dist.barrier()
    if rank < 2:
        model2, opt2 = fsdp_model(meshes[2])
        msd2, osd2 = get_state_dict(model2, opt2)
        state2 = {"model": msd2, "optim": osd2}
        dcp.load(state2, storage_reader=tzdcp.StorageReader(os.path.join(out, "fsdp")), process_group=groups[2])
        set_state_dict(model2, opt2, model_state_dict=state2["model"], optim_state_dict=state2["optim"])
        msd3, osd3 = get_state_dict(model2, opt2)
        n = check_equal(expected, {"model": msd3, "optim": osd3}, "fsdp")
        assert n >= 4 + 4 * 3, n
        print("ok fsdp2-4-load-2", flush=True)
    dist.barrier()


def async_train(rank: int, world: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    ckpt_group = dist.new_group(backend="gloo")  # the README: once, for every async_save

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    model, opt = build(11)
    g = torch.Generator().manual_seed(rank)

    def step():
        opt.zero_grad()
        model(torch.randn(32, 128, generator=g)).square().mean().backward()  # FSDP2 collectives on WORLD
        opt.step()

    for _ in range(2):
        step()
    msd, osd = get_state_dict(model, opt)
    expected = mapped({"model": msd, "optim": osd},
                      lambda x: x.full_tensor() if isinstance(x, DTensor) else (x.clone() if isinstance(x, torch.Tensor) else x))
    path = os.path.join(out, "async")
    fut = dcp.async_save({"model": msd, "optim": osd}, storage_writer=tzdcp.StorageWriter(path),
                         process_group=ckpt_group)
    for _ in range(6):  # training goes on while the checkpoint is written in the background
        step()
    fut.result(timeout=120)
    print("ok async-save-while-training", flush=True)
    dist.barrier()
    model2, opt2 = build(99)
    msd2, osd2 = get_state_dict(model2, opt2)
    state2 = {"model": msd2, "optim": osd2}
    dcp.load(state2, storage_reader=tzdcp.StorageReader(path))
    set_state_dict(model2, opt2, model_state_dict=state2["model"], optim_state_dict=state2["optim"])
    msd3, osd3 = get_state_dict(model2, opt2)
    n = check_equal(expected, {"model": msd3, "optim": osd3}, "async_train")
    assert n >= 4 + 4 * 2, n
    print("ok async-train-load", flush=True)
    dist.barrier()


def crash(rank: int, world: int, out: str) -> None:
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    ckpt = os.path.join(out, "ckpt")
    state_a = full_state(0)
    dcp.save(sharded(state_a, mesh, "rows"), storage_writer=tzdcp.StorageWriter(ckpt))
    if rank == 0:
        torch.save(state_a, os.path.join(out, "expected_a.pt"))
    dist.barrier()
    print("ok saved-a", flush=True)
    if rank == 1:  # stop before this rank's TensorWriter finishes its new file; the test kills the process
        os.environ[tzdcp._STALL_ENV] = f"1:1:{os.path.join(out, 'stalled')}"
    dcp.save(sharded(full_state(1), mesh, "rows"), storage_writer=tzdcp.StorageWriter(ckpt))
    raise AssertionError("the interrupted save finished")


def single_crash(out: str) -> None:
    """One process, no process group: a save into a fresh directory stopped half-way."""
    torch.set_num_threads(1)
    os.environ[tzdcp._STALL_ENV] = f"0:1:{os.path.join(out, 'stalled-fresh')}"
    dcp.save(full_state(0), storage_writer=tzdcp.StorageWriter(os.path.join(out, "fresh")))
    raise AssertionError("the interrupted save finished")


def cuda(rank: int, world: int, out: str) -> None:
    """NCCL, one rank per GPU: CUDA model + AdamW state and a DTensor saved and loaded back onto the GPU."""
    from tensorzip import _tensorzip as tzc

    device = torch.device("cuda", rank)
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
    full = mapped(full_state(0), lambda x: x.to(device) if isinstance(x, torch.Tensor) else x)
    writer = tzdcp.StorageWriter(os.path.join(out, "cuda"))
    dcp.save(sharded(full, mesh, "rows"), storage_writer=writer)
    st = writer.last_write_stats
    print("write stats", {k: v for k, v in st.items() if k != "path"}, flush=True)
    if os.environ.get("TZ_REQUIRE_GPU_ENCODE") == "1":
        assert tzc.HAVE_CUDA, "TZ_REQUIRE_GPU_ENCODE=1 but the tensorzip module was built without CUDA"
    if tzc.HAVE_CUDA:
        # Every tensor of the state is a float tensor on the GPU: all of them encoded there.
        assert tzc.cuda_available()
        tensors = []
        mapped(full, lambda x: tensors.append(x) if isinstance(x, torch.Tensor) else None)
        want = sum(t.numel() * t.element_size() for t in tensors) if world == 1 else None
        assert st["gpu_tensors"] >= 1 and st["gpu_bytes"] > 0 and st["gpu_host_bytes"] == 0, st
        assert want is None or st["gpu_bytes"] == want, (st, want)
        print("ok cuda-gpu-encode", st["gpu_bytes"], flush=True)
    else:
        assert st["gpu_bytes"] == 0 and st["gpu_tensors"] == 0, st
    target = sharded(full, mesh, "cols", blank=True)
    dcp.load(target, storage_reader=tzdcp.StorageReader(os.path.join(out, "cuda")))
    assert target["emb"].to_local().device.type == "cuda"
    check_equal(full, target, "cuda")
    print("ok cuda", flush=True)
    # The CPU path (gpu_encode=False: copies to the host, CPU encode) writes the same file.
    cpu_writer = tzdcp.StorageWriter(os.path.join(out, "cuda-cpu"), gpu_encode=False)
    dcp.save(sharded(full, mesh, "rows"), storage_writer=cpu_writer)
    assert cpu_writer.last_write_stats["gpu_bytes"] == 0 and cpu_writer.last_write_stats["gpu_tensors"] == 0
    with open(st["path"], "rb") as f_gpu, open(cpu_writer.last_write_stats["path"], "rb") as f_cpu:
        assert f_gpu.read() == f_cpu.read(), "rank files of GPU and CPU encode differ"
    print("ok cuda-cpu-path-same-file", flush=True)
    # dcp.async_save stages the state into CPU memory first (StorageWriter is DCP's AsyncStager):
    # the writer sees CPU tensors only (CPU encode); the checkpoint loads back onto the GPU.
    async_pg = dist.new_group(backend="gloo")  # async_save needs a CPU backend
    async_writer = tzdcp.StorageWriter(os.path.join(out, "cuda-async"))
    fut = dcp.async_save(sharded(full, mesh, "rows"), storage_writer=async_writer, process_group=async_pg)
    fut.result()
    ast = async_writer.last_write_stats
    assert ast["gpu_tensors"] == 0 and ast["gpu_bytes"] == 0, ast
    target = sharded(full, mesh, "cols", blank=True)
    dcp.load(target, storage_reader=tzdcp.StorageReader(os.path.join(out, "cuda-async")))
    check_equal(full, target, "cuda-async")
    print("ok cuda-async-staged-cpu", flush=True)


def main() -> None:
    scenario, rank, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    if scenario == "single_crash":
        single_crash(out)
        return
    init(rank, world, port, "nccl" if scenario == "cuda" else "gloo")
    {"reshard": reshard, "crash": crash, "cuda": cuda, "async_train": async_train}[scenario](rank, world, out)
    dist.destroy_process_group()
    # Gloo's worker thread can still be releasing its last work (and the tensors it holds) while
    # the interpreter finalises: that decref takes the GIL, the thread is made to exit, and the
    # process ends in std::terminate. Everything is written and closed: leave without finalising.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
