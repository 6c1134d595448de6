"""Compressed KV offloading (tensorzip._kv_offload; tensorzip.vllm.TensorZipOffloadingSpec; doc/kv.md
"vLLM KV offloading").

Without vLLM (the main Python tests): the block store (round trip on real KV pages of the fixture
GPT, bytes held, slot sizes, tables calibrated, saved, loaded and recalibrated by the rule), the
index (byte budget charged with the bytes held, LRU eviction, readers, failures) and both together.
With vLLM (scripts/vllm-test.sh): vLLM's CPU build serves the fixture GPT (GPT-2 layout, as
test_vllm.py writes it) with prefix caching and the spec, each engine in a process of its own
(_vllm_offload_worker.py): the tokens equal those of the engine without a connector, blocks are
stored, then loaded from the spec after ``llm.reset_prefix_cache()``, and the bytes held are at most
the raw bytes / 1.4.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorzip
from tensorzip import _kv_offload as ko

sys.path.insert(0, str(Path(__file__).parent))
from _engines import need_module  # noqa: E402

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "kv-fixture-l0.safetensors"
TOKENS = 32  # tokens per block (vLLM's CPU build: a multiple of 32)


def real_blocks(tokens: int = TOKENS) -> np.ndarray:
    """Real KV blocks as vLLM holds them: per block, the K then V bytes of `tokens` tokens of layer 0
    of the fixture GPT (2 sequences of 256 tokens, 8 heads of 32, BF16): uint8 (16, 32 KiB)."""
    from safetensors.torch import load_file

    d = load_file(str(DATA))
    k = d["k"].reshape(-1, tokens, 8, 32).view(torch.int16)
    v = d["v"].reshape(-1, tokens, 8, 32).view(torch.int16)
    pages = torch.cat([k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], dim=1)
    return pages.contiguous().numpy().view(np.uint8)


def make_store(tmp_path, **kw):
    blocks = real_blocks()
    sizes = ko.SlotSizes(f"test-{os.getpid()}-{id(kw)}", 1, 128, folder=str(tmp_path))
    kw.setdefault("threads", 2)
    return blocks, sizes, ko.CompressedBlockStore("BF16", [blocks.shape[1], blocks.shape[1]], sizes=sizes, **kw)


# ---- the block store ----

def test_store_round_trip_and_bytes_held(tmp_path):
    blocks, sizes, store = make_store(tmp_path)
    slots = list(range(10, 10 + len(blocks)))
    raw = store.store(slots, {0: blocks, 1: blocks[::-1]})
    assert raw == 2 * blocks.size
    got = store.load(slots[3:9], [0, 1])
    assert np.array_equal(got[0], blocks[3:9]) and np.array_equal(got[1], blocks[::-1][3:9])
    held = store.held_bytes()
    assert store.held_raw_bytes() == raw and held * 1.4 <= raw, (raw, held)
    for s in slots:
        assert sizes.total(s) == store.slot_bytes(s) > 0
    assert sum(sizes.total(s) for s in slots) == held
    st = store.stats()
    assert st["blocks_stored"] == 16 and st["pages_stored"] == 32 and st["blocks_loaded"] == 6
    assert st["calibrations"] == 2 and st["recalibrations"] == 0 and st["blocks_held"] == 16
    store.drop(slots[:8])
    assert store.stats()["blocks_held"] == 8 and store.held_bytes() < held
    with pytest.raises(tensorzip.UsageError, match="slot 10 holds no block"):
        store.load([10], [0])
    store.clear(generation=1)
    assert store.held_bytes() == 0 and store.generation == 1
    sizes.unlink()


def test_blocks_taken_from_and_put_into_a_host_kv_cache(tmp_path):
    blocks, _, store = make_store(tmp_path)
    page = blocks.shape[1]
    kv = torch.zeros((32, page + 64), dtype=torch.int8)  # rows padded past the page
    kv[:16, :page] = torch.from_numpy(blocks).view(torch.int8)
    rows = ko.take_blocks(kv, np.arange(4, 12), page, on_device=False)
    assert isinstance(rows, np.ndarray) and np.array_equal(rows, blocks[4:12])
    store.store(range(8), {0: rows})
    assert ko.put_blocks(kv, np.arange(20, 28), store.load(range(8), [0])[0]) == 8 * page
    assert torch.equal(kv[20:28], kv[4:12]) and not kv[20:28, page:].any()


def test_store_uncompressed_and_wrong_shapes(tmp_path):
    blocks, sizes, store = make_store(tmp_path, compress=False)
    store.store([0, 1], {0: blocks[:2]})
    assert store.held_bytes() == blocks[:2].size == sizes.total(0) + sizes.total(1)
    assert np.array_equal(store.load([1, 0], [0])[0], blocks[[1, 0]])
    with pytest.raises(tensorzip.UsageError, match=r"tensor 1: blocks of shape \(2, 100\)"):
        store.store([0, 1], {1: np.zeros((2, 100), np.uint8)})


def test_recalibration_when_tables_stop_paying(tmp_path):
    """Pages whose exponents the tables never saw (the real KV times 2^64): after CHECK_PAGES
    of them the tables are stale, the next pages calibrate new ones; old pages still decode
    with their own tables, which are forgotten once no held page names them."""
    blocks, sizes, store = make_store(tmp_path)
    store.store(range(16), {0: blocks})
    first = store.stats()["tables"][0]
    shifted = (torch.from_numpy(blocks.copy()).view(torch.bfloat16) * 2.0 ** 64).view(torch.uint8).numpy()
    assert not np.array_equal(shifted, blocks)
    slot = 16
    for _ in range(ko.CHECK_PAGES // 16 - 1):  # the window: 16 real pages, then shifted ones
        store.store(range(slot, slot + 16), {0: shifted})
        slot += 16
    assert store.stats()["recalibrations"] == 0 and store._tables[0].window.stale
    bad_bytes = store.slot_bytes(slot - 1)
    store.store(range(slot, slot + 16), {0: shifted})
    st = store.stats()
    assert st["recalibrations"] == 1 and st["tables"][0] != first
    assert store.slot_bytes(slot) * 1.3 < bad_bytes  # the new tables pay again
    assert np.array_equal(store.load(range(16), [0])[0], blocks)
    assert np.array_equal(store.load(range(slot, slot + 16), [0])[0], shifted)
    assert first in store._tables[0].by_id
    store.drop(range(slot))
    assert list(store._tables[0].by_id) == [st["tables"][0]]


def test_tables_saved_then_loaded(tmp_path):
    folder = tmp_path / "tables"
    blocks, _, store = make_store(tmp_path, tables_dir=str(folder))
    store.store(range(8), {0: blocks[:8]})
    saved = folder / "tensor-0.tzkv"
    assert saved.is_file() and not (folder / "tensor-1.tzkv").exists()
    before = saved.read_bytes()
    _, _, again = make_store(tmp_path, tables_dir=str(folder))
    again.store(range(8), {0: blocks[8:]})
    st = again.stats()
    assert st["tables_loaded"] == 1 and st["calibrations"] == 0 and st["tables"][0] == store.stats()["tables"][0]
    assert np.array_equal(again.load(range(8), [0])[0], blocks[8:])
    assert saved.read_bytes() == before
    bad = tmp_path / "f16"
    bad.mkdir()
    f16 = tensorzip.kv.PageCodec.calibrate(np.ones(64, np.float16))
    f16.save(str(bad / "tensor-0.tzkv"))
    with pytest.raises(tensorzip.UsageError, match=r"f16/tensor-0.tzkv: KV tables for F16, the KV cache is BF16"):
        make_store(tmp_path, tables_dir=str(bad))
    (bad / "tensor-0.tzkv").write_bytes(b"not tables at all, just some bytes")
    with pytest.raises(tensorzip.CorruptDataError, match=r"f16/tensor-0.tzkv: KV tables: .*bad magic"):
        make_store(tmp_path, tables_dir=str(bad))


def test_tables_published_by_another_engine_are_not_replaced(tmp_path):
    """Two engines start on one empty tables folder: the first to calibrate publishes its tables;
    the second calibrates on other pages and leaves that file as it is."""
    folder = tmp_path / "tables"
    blocks, _, first = make_store(tmp_path, tables_dir=str(folder))
    _, _, second = make_store(tmp_path, tables_dir=str(folder))  # started before any file existed
    first.store(range(8), {0: blocks[:8]})
    saved = (folder / "tensor-0.tzkv").read_bytes()
    shifted = (torch.from_numpy(blocks[8:].copy()).view(torch.bfloat16) * 2.0 ** 64).view(torch.uint8).numpy()
    second.store(range(8), {0: shifted})
    assert second.stats()["tables"][0] != first.stats()["tables"][0]  # its own tables, for its pages
    assert (folder / "tensor-0.tzkv").read_bytes() == saved
    assert sorted(p.name for p in folder.iterdir()) == ["tensor-0.tzkv"]
    assert np.array_equal(second.load(range(8), [0])[0], shifted)


def test_tables_of_each_worker_rank_kept_apart(tmp_path):
    """Two workers of one engine (each holding the KV of its own heads) on one tables folder: each
    publishes its own tables (tensor-0.rank-<r>.tzkv) and, in the next run, loads its own."""
    folder = tmp_path / "tables"
    blocks = real_blocks()
    shifted = (torch.from_numpy(blocks.copy()).view(torch.bfloat16) * 2.0 ** 64).view(torch.uint8).numpy()
    pages = {0: blocks, 1: shifted}  # the two ranks' pages differ
    ids = {}
    for rank in (0, 1):
        store = ko.CompressedBlockStore("BF16", [blocks.shape[1]], threads=2, tables_dir=str(folder),
                                        rank=rank, ranks=2)
        store.store(range(8), {0: pages[rank][:8]})
        ids[rank] = store.stats()["tables"][0]
    assert ids[0] != ids[1]
    assert sorted(p.name for p in folder.iterdir()) == ["tensor-0.rank-0.tzkv", "tensor-0.rank-1.tzkv"]
    for rank in (0, 1):
        again = ko.CompressedBlockStore("BF16", [blocks.shape[1]], threads=2, tables_dir=str(folder),
                                        rank=rank, ranks=2)
        again.store(range(8), {0: pages[rank][8:]})
        st = again.stats()
        assert st["tables_loaded"] == 1 and st["calibrations"] == 0 and st["tables"][0] == ids[rank], (rank, st)
        assert np.array_equal(again.load(range(8), [0])[0], pages[rank][8:])
    with pytest.raises(tensorzip.UsageError, match="worker rank 2 of 2"):
        ko.CompressedBlockStore("BF16", [blocks.shape[1]], rank=2, ranks=2)


def test_kv_dtypes():
    assert ko.kv_dtype_of("bfloat16") == ko.kv_dtype_of("torch.bfloat16") == "BF16"
    assert ko.kv_dtype_of("fp8_e4m3") == "F8_E4M3" and ko.kv_dtype_of("float16") == "F16"
    with pytest.raises(tensorzip.UsageError, match="'float32' is not one the KV page codec codes"):
        ko.kv_dtype_of("float32")


# ---- the index ----

def test_index_budget_charged_with_bytes_held():
    ix = ko.OffloadIndex(budget=1000, reserve=100, slots=40)
    plan = ix.prepare_store(list("abcdefghij"))
    assert plan.keys == list("abcdefghij") and sorted(plan.slots) == list(range(10)) and not plan.evicted
    assert ix.held == 1000 and ix.prepare_store(["k"]) is None  # all pending: nothing to evict
    assert ix.state("a") == "pending"
    done = ix.complete_store(list("abcdefghij"), {s: 40 for s in range(10)})
    assert len(done) == 10 and ix.held == 400 and ix.state("a") == "ready"
    plan = ix.prepare_store(list("klmnop"))  # 6 x 100 reserved on 400 held: fits without eviction
    assert not plan.evicted and ix.held == 1000
    ix.complete_store(list("klmnop"), {s: 40 for s in plan.slots})
    assert len(ix) == 16 and ix.held == 640  # 16 blocks where raw copies would fit 10


def test_index_evicts_least_recently_used_and_protects_readers():
    ix = ko.OffloadIndex(budget=300, reserve=100, slots=10)
    for key in "abc":
        plan = ix.prepare_store([key])
        ix.complete_store([key], {plan.slots[0]: 100})
    ix.touch(["a"])                       # LRU order now b, c, a
    assert ix.prepare_load(["b"]) == [1]  # b is being read: not evictable
    plan = ix.prepare_store(["d", "a"])    # a is named by the store: not evictable either
    assert plan.keys == ["d"] and plan.evicted == ["c"] and plan.drop == [2] and plan.slots == [2]
    assert ix.held == 300
    assert ix.prepare_store(["e", "b", "a", "d"]) is None  # b read, a and d named, d pending
    ix.complete_load(["b"])
    plan = ix.prepare_store(["e", "a"])
    assert plan.evicted == ["b"] and plan.drop == [1]
    with pytest.raises(tensorzip.UsageError, match="not offloaded"):
        ix.prepare_load(["b"])
    ix.complete_store(["e"], success=False)  # a failed store frees its slot
    assert "e" not in ix and ix.held == 200
    assert ix.prepare_store(["x"]).drop == [1]
    with pytest.raises(tensorzip.UsageError, match="more than the 100 reserved"):
        ix.complete_store(["x"], {1: 101})


def test_index_and_store_together(tmp_path):
    """A stream of real blocks through a budget that holds 16 raw blocks: the bytes held never pass the
    budget, more than 1.4 x as many blocks are held as raw copies would fit in the budget less one
    store's reservation, and every ready block loads bit for bit."""
    blocks, sizes, store = make_store(tmp_path)
    page = blocks.shape[1]
    reserve = ko.reserve_bytes([page])
    ix = ko.OffloadIndex(budget=16 * page, reserve=reserve, slots=64)
    keys = [f"k{i}" for i in range(48)]
    data = {}
    for i in range(0, len(keys), 2):
        plan = ix.prepare_store(keys[i:i + 2])
        assert plan is not None
        store.drop(plan.drop)
        rows = blocks[[i % 16, (i + 5) % 16]]
        store.store(plan.slots, {0: rows})
        data.update(zip(plan.keys, rows))
        ix.complete_store(plan.keys, ko_sizes(sizes))
        assert store.held_bytes() <= ix.held <= ix.budget
        assert ix.held == ix.ready_bytes() == store.held_bytes()
    ready = [k for k in keys if ix.state(k) == "ready"]
    assert len(ready) >= 1.4 * (ix.budget - 2 * reserve) / page, len(ready)
    assert len(ready) > 16
    slots = ix.prepare_load(ready)
    assert np.array_equal(store.load(slots, [0])[0], np.stack([data[k] for k in ready]))


def ko_sizes(sizes):
    class _S:
        def __getitem__(self, slot):
            return sizes.total(slot)
    return _S()


# ---- vLLM engines ----

REQUIRED = os.environ.get("TZ_VLLM_REQUIRED") == "1"
WORKER = Path(__file__).parent / "_vllm_offload_worker.py"
# One CPU per worker (vLLM's automatic binding wants a NUMA node per worker; these machines have one).
TP_THREADS_BIND = "0|1"


def need_vllm():
    need_module("vllm", REQUIRED)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    need_vllm()
    sys.path.insert(0, str(Path(__file__).parent))
    import _gpt
    from test_vllm import gpt2_state_dict, write_gpt2_folder

    src = _gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE
    sd = _gpt.state_dict_of(src)
    folder = tmp_path_factory.mktemp("offload") / "gpt2"
    write_gpt2_folder(folder, gpt2_state_dict(sd), _gpt.n_layers_of(sd))
    return folder


def run_offload_engine(tmp_path: Path, folder: Path, offload: str, **spec_keys) -> dict:
    spec = tmp_path / f"spec-{offload}.json"
    out = tmp_path / f"out-{offload}.json"
    spec.write_text(json.dumps({"model": str(folder), "offload": offload, **spec_keys}))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if spec_keys.get("tensor_parallel_size", 1) > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", TP_THREADS_BIND)
    p = subprocess.run([sys.executable, str(WORKER), str(spec), str(out)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert p.returncode == 0, f"vLLM with offload={offload} exited {p.returncode}:\n{(p.stdout + p.stderr)[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def no_connector(gpt2_folder, tmp_path_factory):
    return run_offload_engine(tmp_path_factory.mktemp("none"), gpt2_folder, "none")


def check_offloaded_and_reused(got: dict, workers: int = 1) -> None:
    """Every worker stored every full prompt block, compressed, and after the prefix cache reset
    loaded them all back; the scheduler's index charged exactly the bytes the workers hold."""
    stored, reused = got["after_first"], got["after_again"]
    assert len(stored["ranks"]) == len(reused["ranks"]) == workers
    for first, again in zip(stored["ranks"], reused["ranks"]):
        assert first["blocks_stored"] >= got["prompt_blocks"] and first["blocks_loaded"] == 0, first
        assert again["blocks_loaded"] >= got["prompt_blocks"], again
        assert again["held_bytes"] * 1.4 <= again["held_raw_bytes"], again
        assert again["calibrations"] >= 1 and again["compress"]
        assert again["blocks_held"] == reused["index_blocks"]
    # The shared slot sizes: the index is charged the bytes of every worker's pages.
    assert reused["index_held"] == sum(r["held_bytes"] for r in reused["ranks"])
    assert got["cached_tokens_first"] == 0 and got["cached_tokens_again"] == got["prompt_blocks"] * 32


def test_engine_offloads_compressed_blocks_and_reuses_them(gpt2_folder, no_connector, tmp_path):
    got = run_offload_engine(tmp_path, gpt2_folder, "tensorzip")
    assert got["first"] == no_connector["first"] and got["again"] == no_connector["again"]
    assert len({tuple(x) for x in no_connector["first"]}) == len(no_connector["first"])  # distinct prompts
    # The KV cache was overwritten between the runs; a block that kept the overwrite changes the tokens.
    assert got["poisoned_bytes"] > 0 and got["poisoned"] != got["again"]
    check_offloaded_and_reused(got)
    assert no_connector["cached_tokens_again"] == 0 and no_connector["after_again"] is None


def test_engine_uncompressed_baseline(gpt2_folder, no_connector, tmp_path):
    got = run_offload_engine(tmp_path, gpt2_folder, "plain")
    assert got["first"] == no_connector["first"] and got["again"] == no_connector["again"]
    st = got["after_again"]
    (worker,) = st["ranks"]
    assert worker["blocks_loaded"] >= got["prompt_blocks"] and worker["held_bytes"] == worker["held_raw_bytes"]
    assert st["index_held"] == worker["held_bytes"]
    assert not worker["compress"]


def test_engine_two_workers(gpt2_folder, no_connector, tmp_path, tzip_cli):
    """Tensor parallelism over two worker processes (vLLM's "mp" executor, gloo on the CPU), in one
    engine: the compressed folder through the load format, its weights kept compressed
    (quantization="tensorzip"), KV offloaded by the spec. Each worker holds its shard of the
    weights and of the KV heads; the tokens are the one-worker plain engine's."""
    folder = tmp_path / "gpt2.tzip"
    subprocess.run([tzip_cli, "compress", str(gpt2_folder), "-o", str(folder)], check=True, capture_output=True,
                   timeout=600)
    got = run_offload_engine(tmp_path, folder, "tensorzip", tensor_parallel_size=2, load_format="tensorzip",
                             quantization="tensorzip")
    assert got["first"] == no_connector["first"] and got["again"] == no_connector["again"]
    assert got["poisoned_bytes"] > 0 and got["poisoned"] != got["again"]
    check_offloaded_and_reused(got, workers=2)
    ranks = got["after_again"]["ranks"]
    # Each worker coded its own KV heads with its own tables.
    assert ranks[0]["tables"] != ranks[1]["tables"]
    # Each worker kept its shard of every weight matrix compressed (about half of them; the position
    # embeddings are whole in each).
    res = got["resident"]
    matrices = [t for t in _gpt2_weights(gpt2_folder).values() if t.dim() == 2]
    raw = sum(t.numel() * t.element_size() for t in matrices)
    assert len(res) == 2 and all(r is not None and r["tensors"] == len(matrices) for r in res), res
    assert all(0 < r["compressed_bytes"] < 0.7 * r["plain_bytes"] for r in res), res
    assert res[0]["plain_bytes"] == res[1]["plain_bytes"] < 0.6 * raw, (res, raw)


def test_openai_server_offloads_and_reuses_compressed_blocks(gpt2_folder, no_connector, tmp_path):
    """The server form of the configuration (--kv-transfer-config), in vLLM's default process layout:
    completions of the worker's prompts (token ids) give the tokens of the engine without a
    connector; after POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1) and the KV cache overwritten,
    they come back from the spec. The worker's stores are read through POST /collective_rpc."""
    from _vllm_offload_worker import BLOCK, text_prompts
    from test_vllm import _post, _vllm_env, openai_server

    config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"spec_name": "TensorZipOffloadingSpec", "spec_module_path": "tensorzip.vllm",
                                            "cpu_bytes_to_use": 64 << 20, "block_size": BLOCK}}
    args = ["--model", str(gpt2_folder), "--dtype", "bfloat16", "--max-model-len", "256", "--max-num-seqs", "8",
            "--enforce-eager", "--seed", "0", "--block-size", str(BLOCK), "--enable-prefix-caching",
            "--kv-transfer-config", json.dumps(config), "--worker-extension-cls", "_vllm_worker_probe.OffloadProbe"]
    tests = str(Path(__file__).parent)  # the probe, imported in the worker process
    env = dict(_vllm_env(), VLLM_SERVER_DEV_MODE="1",
               PYTHONPATH=os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p))
    prompts = text_prompts(150, 3)
    with openai_server(args, tmp_path / "server.log", env) as url:
        def complete():
            got = []
            for ids in prompts:
                r = _post(f"{url}/v1/completions", {"model": str(gpt2_folder), "prompt": ids, "max_tokens": 16,
                                                   "temperature": 0, "ignore_eos": True, "return_token_ids": True})
                got.append(r["choices"][0]["token_ids"])
            return got

        def rpc(method):
            return _post(f"{url}/collective_rpc", {"method": method})["results"]

        first = complete()
        (stored,) = rpc("tz_offload_stats")
        for _ in range(50):  # refused while transfers are in flight: retried
            if _post(f"{url}/reset_prefix_cache", {})["success"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("POST /reset_prefix_cache kept failing")
        assert sum(map(int, rpc("tz_poison_kv_cache"))) > 0  # the server sends other results than dicts as text
        again = complete()
        (reused,) = rpc("tz_offload_stats")
    assert first == no_connector["first"] and again == no_connector["again"]
    blocks = len(prompts) * ((150 - 1) // BLOCK)
    (st1,), (st2,) = stored["stores"], reused["stores"]
    assert st1["blocks_stored"] >= blocks and st1["blocks_loaded"] == 0, st1
    assert st2["blocks_loaded"] >= blocks and st2["held_bytes"] * 1.4 <= st2["held_raw_bytes"], st2
    assert st2["compress"] and st2["calibrations"] >= 1
    log = (tmp_path / "server.log").read_text()
    assert "tensorzip: KV offloading to host memory, 67108864 bytes, compressed" in log


def _gpt2_weights(folder: Path):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def offloading_config(extra, dtype="bfloat16", blocks_per_chunk=1, engine_id="tz-test"):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                           OffloadingModelConfig, OffloadingParallelConfig)

    layers = tuple(f"model.layers.{i}.attn" for i in range(6))
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=32, layer_names=layers, group_id=0),),
        worker_kv_bytes_per_block=6 * 32768, enable_kv_cache_events=False, extra_config=extra,
        engine_id=engine_id, model=OffloadingModelConfig(name="gpt2", dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))


def test_spec_found_by_vllm_and_options_checked():
    need_vllm()
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    extra = {"spec_name": "TensorZipOffloadingSpec", "spec_module_path": "tensorzip.vllm", "cpu_bytes_to_use": 1 << 24}
    cls = OffloadingSpecFactory.get_spec_cls(extra)
    import tensorzip.vllm as tzv
    assert cls is tzv.TensorZipOffloadingSpec
    spec = cls(offloading_config(extra))
    assert spec.reserve == 6 * 32768 + 6 * ko.PAGE_HEADER_BYTES and spec.num_slots == 4 * (1 << 24) // (6 * 32768)
    manager = spec.get_manager()
    try:
        assert manager.index.budget == 1 << 24 and manager.prepare_store([b"k"], None).keys_to_store == [b"k"]
    finally:
        manager.shutdown()
    for bad, match in [({"compress": "yes"}, "compress must be true or false"),
                       ({"mode": "zstd"}, 'mode must be "rans" or "fixed"'),
                       ({"threads": -1}, "threads must be a number >= 0"),
                       ({"device_codec": "no"}, "device_codec must be true or false"),
                       ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use must be a positive integer")]:
        with pytest.raises(tensorzip.UsageError, match=match):
            cls(offloading_config(dict(extra, **bad)))
    with pytest.raises(tensorzip.UsageError, match="block_size must equal the KV cache's block size 32"):
        cls(offloading_config(extra, blocks_per_chunk=2))
    with pytest.raises(tensorzip.UsageError, match="KV cache dtype 'float32'"):
        cls(offloading_config(extra, dtype="float32"))
    assert cls(offloading_config(dict(extra, compress=False), dtype="float32")).reserve == 6 * 32768
    assert spec.device_codec is True and cls(offloading_config(dict(extra, device_codec=False))).device_codec is False


def worker_on(device, tmp_path, device_codec=True):
    """A worker over a KV cache of two tensors (32 blocks of real K|V pages, the first 16 filled) on
    `device`, with a store of its own: (worker, kv tensors, store, slot sizes)."""
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

    from tensorzip import _vllm_offload as vo

    blocks = real_blocks()
    page = blocks.shape[1]
    kv = [torch.zeros((32, page), dtype=torch.int8) for _ in range(2)]
    kv[0][:16] = torch.from_numpy(blocks).view(torch.int8)
    kv[1][:16] = torch.from_numpy(blocks[::-1].copy()).view(torch.int8)
    kv = [t.to(device) for t in kv]
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, page) for t in kv],
                               [[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    os.makedirs(tmp_path, exist_ok=True)
    _, sizes, store = make_store(tmp_path)
    return vo.TensorZipOffloadingWorker(caches, store, device_codec), kv, store, sizes


def test_worker_codes_on_the_cpu_for_a_host_kv_cache_or_when_told(tmp_path):
    need_vllm()
    from tensorzip import _vllm_offload as vo

    worker, kv, store, _ = worker_on("cpu", tmp_path)
    assert not worker.on_device  # a host KV cache: the CPU codec
    assert not vo.device_codec_usable(kv, store, True)
    if torch.cuda.is_available():
        assert not worker_on("cuda", tmp_path, device_codec=False)[0].on_device
        from tensorzip.kv import cuda_available

        assert worker_on("cuda", tmp_path)[0].on_device == cuda_available()


def test_worker_device_path_round_trips_blocks(tmp_path):
    """On a GPU with the KV CUDA kernels: stores gather and encode blocks on the device, loads decode
    them there into other KV blocks, bit for bit; the store holds the bytes the CPU path holds."""
    need_vllm()
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    from tensorzip import _vllm_offload as vo
    from tensorzip.kv import cuda_available

    if not (cuda_available() and torch.cuda.is_available()):
        if os.environ.get("TZ_REQUIRE_KV_CUDA") == "1":
            pytest.fail("TZ_REQUIRE_KV_CUDA=1: no CUDA device with the KV codec's CUDA kernels")
        pytest.skip("no CUDA device with the KV codec's CUDA kernels")
    worker, kv, store, sizes = worker_on("cuda", tmp_path / "gpu")
    cpu_worker, _, cpu_store, _ = worker_on("cuda", tmp_path / "cpu", device_codec=False)
    assert worker.on_device and not cpu_worker.on_device
    src = GPULoadStoreSpec(list(range(4, 12)), group_sizes=[8], block_indices=[0])
    for w in (worker, cpu_worker):
        assert w.submit_store(7, src, vo.TensorZipSlots(range(100, 108)))
    assert all(store._slots[s] == cpu_store._slots[s] for s in range(100, 108))  # the same store format
    assert sizes.total(100) == store.slot_bytes(100) > 0
    dst = GPULoadStoreSpec(list(range(20, 28)), group_sizes=[8], block_indices=[0])
    assert worker.submit_load(8, vo.TensorZipSlots(range(100, 108)), dst)
    assert [r.job_id for r in worker.get_finished()] == [7, 8]
    for t in kv:
        assert t.is_cuda and torch.equal(t[20:28], t[4:12]) and t[20:28].any()


def test_worker_moves_blocks_between_kv_cache_and_store(tmp_path):
    """The worker on a KV cache of real blocks: stored blocks load back bit for bit into other KV
    blocks; a store planned before an index reset stores nothing; a newer generation frees all."""
    need_vllm()
    from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,
                                         GPULoadStoreSpec)

    from tensorzip import _vllm_offload as vo

    blocks = real_blocks()
    page = blocks.shape[1]
    kv = [torch.zeros((32, page), dtype=torch.int8) for _ in range(2)]
    kv[0][:16] = torch.from_numpy(blocks).view(torch.int8)
    kv[1][:16] = torch.from_numpy(blocks[::-1].copy()).view(torch.int8)
    caches = CanonicalKVCaches([CanonicalKVCacheTensor(t, page) for t in kv],
                               [[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    _, sizes, store = make_store(tmp_path)
    worker = vo.TensorZipOffloadingWorker(caches, store)
    gpu = GPULoadStoreSpec(list(range(4, 12)), group_sizes=[8], block_indices=[0])
    assert worker.submit_store(7, gpu, vo.TensorZipSlots(range(100, 108)))
    assert store.stats()["blocks_stored"] == 8 and sizes.total(100) == store.slot_bytes(100) > 0
    dst = GPULoadStoreSpec(list(range(20, 28)), group_sizes=[8], block_indices=[0])
    assert worker.submit_load(8, vo.TensorZipSlots(range(100, 108)), dst)
    assert [r.job_id for r in worker.get_finished()] == [7, 8] and worker.get_finished() == []
    for t in kv:
        assert torch.equal(t[20:28], t[4:12]) and t[20:28].any()
    worker.submit_store(9, GPULoadStoreSpec([0], [1], [0]), vo.TensorZipSlots([1], drop=[100], generation=1))
    assert store.generation == 1 and store.stats()["blocks_held"] == 1  # a reset freed every block
    worker.submit_store(10, GPULoadStoreSpec([2], [1], [0]), vo.TensorZipSlots([2], generation=0))
    assert store.stats()["blocks_held"] == 1 and len(worker.get_finished()) == 2  # the stale store: done, nothing held
    with pytest.raises(tensorzip.UsageError, match="one offloaded block per KV block"):
        worker.submit_load(11, vo.TensorZipSlots([1, 2]), GPULoadStoreSpec([0], [1], [0]))


def test_slot_sizes_never_written_through_a_link_or_into_another_file(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    name = "tensorzip-kv-offload-eng-1x4"
    os.symlink(victim, tmp_path / name)
    with pytest.raises(OSError):
        ko.SlotSizes("eng", 1, 4, folder=str(tmp_path))
    (tmp_path / name).unlink()
    (tmp_path / name).write_bytes(b"someone else's file")  # not 0 or 1 x 4 x 8 bytes
    with pytest.raises(tensorzip.UsageError, match="not this engine's slot-sizes file"):
        ko.SlotSizes("eng", 1, 4, folder=str(tmp_path))
    assert victim.read_bytes() == b"keep me"
    assert (tmp_path / name).read_bytes() == b"someone else's file"
    (tmp_path / name).unlink()
    s = ko.SlotSizes("eng", 1, 4, folder=str(tmp_path))
    s.write(0, 2, 123)
    assert ko.SlotSizes("eng", 1, 4, folder=str(tmp_path)).total(2) == 123
    s.unlink()
