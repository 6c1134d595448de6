"""The LMCache serde ``tensorzip`` and its file-system adapter (tensorzip.lmcache; doc/kv.md "LMCache").

Unit tests drive LMCache's own interfaces (Serializer / Deserializer, AsyncSerdeProcessor, the
serde registry, the L2 adapter interface) on real KV chunks of the fixture GPT in LMCache's layout
(2, layers, tokens, hidden). The end-to-end test runs an LMCache server (``lmcache server``) with
the adapter and the serde, and vLLM's CPU build with ``LMCacheMPConnector`` serving the fixture
GPT as a GPT-2 folder: chunks are stored compressed, a restarted server serves them from disk, and
the tokens are those of vLLM without a connector. scripts/lmcache-test.sh runs them in a venv with
LMCache and vLLM; without LMCache (the main Python tests) they skip.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
REQUIRED = os.environ.get("TZ_LMCACHE_REQUIRED") == "1"
if not REQUIRED:
    pytest.importorskip("lmcache")
import tensorzip  # noqa: E402
import tensorzip.lmcache as tzl  # noqa: E402
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter, FSL2AdapterConfig  # noqa: E402
from lmcache.v1.distributed.serde import SerdeConfig, create_serde_processor, get_registered_serde_types  # noqa: E402
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parents[1] / "scripts"))
import _gpt  # noqa: E402
from _engines import need_module  # noqa: E402
from _lmcache_server import LMCacheServer, tensorzip_adapter  # noqa: E402
from make_kv_sample import fixture_kv  # noqa: E402

WORKER = TESTS / "_lmcache_worker.py"


# ---- real chunks in LMCache's layout ----

def real_chunks(n: int, tokens: int) -> torch.Tensor:
    """n KV chunks (n, 2, layers, tokens, hidden) of the fixture GPT (all blocks when ../shared has
    them, else block 0) over real Python source, BF16 as an engine holds them."""
    weights = _gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE
    ids = torch.cat([_gpt.real_text_ids(tokens, i * tokens) for i in range(n)])
    ks, vs = fixture_kv(_gpt.state_dict_of(weights), ids)
    kv = torch.stack([torch.stack(ks), torch.stack(vs)])            # (2, L, n, T, H, HD)
    return kv.permute(2, 0, 1, 3, 4, 5).reshape(n, 2, len(ks), tokens, -1).contiguous()


@pytest.fixture(scope="module")
def chunks():
    return real_chunks(4, 64)


def memobj(t: torch.Tensor) -> TensorMemoryObj:
    """An LMCache memory object holding the tensor's bytes (as L1 hands them to a serde)."""
    raw = t.contiguous().view(-1).view(torch.uint8).clone()
    meta = MemoryObjMetadata(shape=t.shape, dtype=t.dtype, address=0, phy_size=raw.numel(), ref_count=1,
                             shapes=[t.shape], dtypes=[t.dtype])
    return TensorMemoryObj(raw, meta, None)


def byte_buffer(n: int) -> TensorMemoryObj:
    return memobj(torch.zeros(n, dtype=torch.uint8))


def empty_like(t: torch.Tensor) -> TensorMemoryObj:
    return memobj(torch.zeros_like(t))


def key(i: int) -> ObjectKey:
    return ObjectKey(chunk_hash=bytes([i]) * 16, model_name="fixture-gpt", kv_rank=0)


def layout(t: torch.Tensor) -> MemoryLayoutDesc:
    return MemoryLayoutDesc(shapes=[t.shape], dtypes=[t.dtype])


def serde(mode="rans", tables=None):
    codecs = tzl._Codecs(mode, tables)
    return tzl.TensorZipSerializer(codecs), tzl.TensorZipDeserializer(codecs)


def encode(ser, chunk, k=0):
    dst = byte_buffer(ser.estimate_serialized_size(layout(chunk)))
    n = ser.serialize(memobj(chunk), dst, key(k))
    dst.set_used_size(n)  # as LMCache's AsyncSerdeProcessor does
    return dst, n


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


# ---- the serde ----

@pytest.mark.parametrize("mode, most", [("rans", 1 / 1.4), ("fixed", 1 / 1.35)])
def test_round_trip_is_lossless_and_smaller(chunks, mode, most):
    ser, _ = serde(mode)
    _, fresh = serde(mode)  # a deserializer that never saw the tables: as after a restart
    raw = chunks[0].numel() * chunks.element_size()
    for i, chunk in enumerate(chunks):
        dst, n = encode(ser, chunk, i)
        assert n <= raw * most, (mode, i, n, raw)
        out = empty_like(chunk)
        fresh.deserialize(dst, out, key(i))
        assert torch.equal(bits(out.tensor), bits(chunk)), (mode, i)


def test_tables_calibrated_once_and_stored_per_chunk(chunks):
    ser, _ = serde()
    first, n0 = encode(ser, chunks[0])
    later, n1 = encode(ser, chunks[2])
    g0 = tzl._read_chunk(tzl._bytes_of(first), "first")
    g1 = tzl._read_chunk(tzl._bytes_of(later), "later")
    dims, pages = g0[0]
    assert dims == tuple(chunks[0].shape) and len(pages) == 2 * chunks.shape[2]
    t0 = [bytes(t) for t, _ in pages]
    assert t0 == [bytes(t) for t, _ in g1[0][1]]      # the first chunk's tables, reused
    assert len(set(t0)) == len(t0)                    # one codec per layer and K/V


def test_estimate_bounds_incompressible_chunks(chunks):
    ser, de = serde()
    encode(ser, chunks[0])  # tables of real KV
    noise = torch.randint(-32768, 32767, chunks[1].shape, dtype=torch.int16, generator=torch.Generator().manual_seed(5))
    noise = noise.view(torch.bfloat16)
    est = ser.estimate_serialized_size(layout(noise))
    dst, n = encode(ser, noise)
    assert chunks[1].numel() * 2 < n <= est
    out = empty_like(noise)
    de.deserialize(dst, out, key(0))
    assert torch.equal(bits(out.tensor), bits(noise))


def test_async_processor_narrows_the_buffer(chunks):
    """Through LMCache's registry and AsyncSerdeProcessor: the buffer is narrowed to the chunk's length."""
    assert tzl.SERDE_NAME in get_registered_serde_types()
    proc = create_serde_processor(SerdeConfig(type="tensorzip", kwargs={"max_workers": 2}))
    try:
        srcs = [memobj(c) for c in chunks]
        est = proc.estimate_serialized_size(layout(chunks[0]))
        dsts = [byte_buffer(est) for _ in chunks]
        task = proc.submit_serialize(srcs, dsts, [key(i) for i in range(len(chunks))])
        deadline = time.monotonic() + 60
        while (done := proc.query_serialize_result(task)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert done is True
        for d in dsts:
            assert d.get_size() == tzl.chunk_bytes_of(bytes(d.byte_array[:16])) < est
        outs = [empty_like(c) for c in chunks]
        task = proc.submit_deserialize(dsts, outs, [key(i) for i in range(len(chunks))])
        while (done := proc.query_deserialize_result(task)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert done is True
        assert all(torch.equal(bits(o.tensor), bits(c)) for o, c in zip(outs, chunks))
    finally:
        proc.close()


def test_options_checked():
    with pytest.raises(ValueError, match="unknown option.*level"):
        create_serde_processor(SerdeConfig(type="tensorzip", kwargs={"level": 3}))
    with pytest.raises(ValueError, match="mode must be 'rans' or 'fixed'"):
        create_serde_processor(SerdeConfig(type="tensorzip", kwargs={"mode": "zstd"}))


def test_tables_file(chunks, tmp_path):
    path = tmp_path / "kv.tables"
    ser, _ = serde(tables=str(path))
    a, _ = encode(ser, chunks[0])
    saved = path.read_bytes()
    assert tzl.chunk_bytes_of(saved) == len(saved)
    ser2, _ = serde(tables=str(path))  # loads the file: the first chunk it sees is coded with those tables
    b, _ = encode(ser2, chunks[3])
    assert ser2._codecs.counters["loaded_kept"] == 1  # they pay on it (same model, other text)
    ta = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(a), "a")[0][1]]
    tb = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(b), "b")[0][1]]
    assert ta == tb
    assert path.read_bytes() == saved  # never replaced
    (tmp_path / "bad.tables").write_bytes(saved[:40])
    with pytest.raises(tzl.ChunkError, match=r"tables file .*bad.tables"):
        serde(tables=str(tmp_path / "bad.tables"))


def test_tables_file_published_first_elsewhere_is_used_not_replaced(chunks, tmp_path):
    """Two servers start on one tables path that does not exist yet: the first to calibrate
    publishes its tables; the second, calibrating on other KV, keeps that file and then codes with
    its tables."""
    path = tmp_path / "kv.tables"
    first, _ = serde(tables=str(path))
    second, _ = serde(tables=str(path))    # started before the file existed
    encode(first, chunks[0])
    saved = path.read_bytes()
    a, _ = encode(second, chunks[3])        # calibrates its own, finds the file taken
    assert path.read_bytes() == saved
    b, _ = encode(second, chunks[2])        # now with the published tables
    published = [bytes(t) for t, _ in tzl._read_chunk(np.frombuffer(saved, dtype=np.uint8), "file")[0][1]]
    own = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(a), "a")[0][1]]
    used = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(b), "b")[0][1]]
    assert own != published and used == published


def test_recalibrated_when_tables_stop_paying(chunks):
    """Chunks whose exponents the first tables never saw (the real KV times 2^64): after 64 pages of
    them the tables are stale, the next chunk is coded with tables calibrated on it (and smaller
    than with the old ones), and every chunk, old tables or new, decodes exactly."""
    from tensorzip.kv._recalibration import CHECK_PAGES

    ser, _ = serde()
    _, fresh = serde()
    shifted = (chunks.float() * 2.0 ** 64).to(chunks.dtype)
    assert torch.isfinite(shifted.float()).all() and not torch.equal(bits(shifted), bits(chunks))
    first, _ = encode(ser, chunks[0])
    pages_per_chunk = 2 * chunks.shape[2]
    stored = [(first, chunks[0])]
    # shifted chunks until the window (which holds the first chunk's pages too) is full
    n_stale = -(-(CHECK_PAGES - pages_per_chunk) // pages_per_chunk)
    for i in range(n_stale):
        dst, n = encode(ser, shifted[i % len(shifted)], i + 1)
        stored.append((dst, shifted[i % len(shifted)]))
    assert ser._codecs.counters["recalibrations"] == 0
    with_old = n
    after, n_after = encode(ser, shifted[n_stale % len(shifted)], 99)
    stored.append((after, shifted[n_stale % len(shifted)]))
    assert ser._codecs.counters["recalibrations"] == 1
    old_tables = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(first), "first")[0][1]]
    new_tables = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(after), "after")[0][1]]
    assert old_tables != new_tables
    assert n_after < with_old, (n_after, with_old)
    for k, (dst, want) in enumerate(stored):
        out = empty_like(want)
        fresh.deserialize(dst, out, key(k))
        assert torch.equal(bits(out.tensor), bits(want)), k


def test_loaded_tables_replaced_when_they_do_not_pay(chunks, tmp_path):
    """A tables file calibrated on other KV (here: the real KV times 2^64) is checked on the first
    chunk it meets and, far from paying there, replaced by tables calibrated on it; the file stays."""
    path = tmp_path / "kv.tables"
    shifted = (chunks.float() * 2.0 ** 64).to(chunks.dtype)
    writer, _ = serde(tables=str(path))
    encode(writer, shifted[0])
    saved = path.read_bytes()
    ser, de = serde(tables=str(path))
    dst, _ = encode(ser, chunks[1])
    assert ser._codecs.counters["loaded_replaced"] == 1 and ser._codecs.counters["loaded_kept"] == 0
    used = [bytes(t) for t, _ in tzl._read_chunk(tzl._bytes_of(dst), "dst")[0][1]]
    published = [bytes(t) for t, _ in tzl._read_chunk(np.frombuffer(saved, dtype=np.uint8), "file")[0][1]]
    assert used != published and path.read_bytes() == saved
    out = empty_like(chunks[1])
    de.deserialize(dst, out, key(1))
    assert torch.equal(bits(out.tensor), bits(chunks[1]))


def test_damaged_and_mismatched_chunks_refused(chunks):
    ser, de = serde()
    dst, n = encode(ser, chunks[0], 7)
    good = bytes(dst.byte_array)
    name = key(7).chunk_hash.hex()

    def decode(data: bytes, into=None):
        src = memobj(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        de.deserialize(src, into or empty_like(chunks[0]), key(7))

    decode(good)
    flipped = bytearray(good)
    flipped[n // 2] ^= 0x40  # inside a page: its checksum
    with pytest.raises((tzl.ChunkError, tensorzip.TensorZipError), match=name):
        decode(bytes(flipped))
    with pytest.raises(tzl.ChunkError, match=rf"{name}: the header records {n} bytes, only {n - 100} were read"):
        decode(good[:n - 100])
    with pytest.raises(tzl.ChunkError, match=rf"{name}: not a tensorzip chunk"):
        decode(bits(chunks[0]).numpy().tobytes())
    with pytest.raises(tzl.ChunkError, match=rf"{name}: group 0 stored with dims"):
        decode(good, empty_like(chunks[0][:, :, :32]))
    with pytest.raises(tzl.ChunkError, match="KV dtype torch.float32 is not supported"):
        ser.serialize(memobj(chunks[0].float()), byte_buffer(10 << 20), key(1))


# ---- the adapter ----

def _wait(poll, what):
    deadline = time.monotonic() + 30
    while (r := poll()) is None or r == {}:
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
    return r


def test_adapter_stores_fewer_bytes_and_loads_after_restart(chunks, tmp_path):
    ser, _ = serde()
    _, de = serde()
    stored = [encode(ser, c, i) for i, c in enumerate(chunks[:2])]
    adapter = tzl.TensorZipFSL2Adapter(tzl.TensorZipFSL2AdapterConfig.from_dict({"base_path": str(tmp_path)}))
    try:
        task = adapter.submit_store_task([key(0), key(1)], [d for d, _ in stored])
        res = _wait(adapter.pop_completed_store_tasks, "store")[task]
        assert res.is_successful() and res.bytes_transferred() == sum(n for _, n in stored)
    finally:
        adapter.close()
    files = sorted(tmp_path.glob("*.data"))
    assert sorted(f.stat().st_size for f in files) == sorted(n for _, n in stored)

    est = ser.estimate_serialized_size(layout(chunks[0]))
    plain = FSL2Adapter(FSL2AdapterConfig.from_dict({"base_path": str(tmp_path)}))
    try:  # LMCache's own fs adapter refuses a file shorter than the buffer
        task = plain.submit_load_task([key(0)], [byte_buffer(est)])
        bitmap = _wait(lambda: plain.query_load_result(task), "plain")
        assert not bitmap.test(0)
    finally:
        plain.close()

    restarted = tzl.TensorZipFSL2Adapter(tzl.TensorZipFSL2AdapterConfig.from_dict({"base_path": str(tmp_path)}))
    try:
        task = restarted.submit_lookup_and_lock_task([key(0), key(1), key(9)], {})
        found = _wait(lambda: restarted.query_lookup_and_lock_result(task), "lookup")
        assert [found.test(i) for i in range(3)] == [True, True, False]
        bufs = [byte_buffer(est) for _ in range(3)]
        task = restarted.submit_load_task([key(1), key(0), key(9)], bufs)
        loaded = _wait(lambda: restarted.query_load_result(task), "load")
        assert [loaded.test(i) for i in range(3)] == [True, True, False]
        for buf, i in zip(bufs, (1, 0)):
            out = empty_like(chunks[i])
            de.deserialize(buf, out, key(i))
            assert torch.equal(bits(out.tensor), bits(chunks[i]))
        assert bufs[2].get_size() == est  # a missing file: its buffer untouched
    finally:
        restarted.close()


# ---- end to end: an LMCache server with the serde, vLLM's CPU build with LMCacheMPConnector ----

CHUNK_TOKENS = 64      # the server's --chunk-size: a multiple of vLLM's block size
BLOCK_TOKENS = 32      # vLLM's CPU build takes block sizes that are multiples of 32
ENGINE_TIMEOUT = 600


def need_vllm():
    need_module("vllm", REQUIRED)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """The fixture GPT as a GPT-2 folder, as python/tests/test_vllm.py writes it: (folder, layers)."""
    need_vllm()
    from test_vllm import gpt2_state_dict, write_gpt2_folder

    sd = _gpt.state_dict_of(_gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE)
    folder = tmp_path_factory.mktemp("lmcache") / "gpt2"
    write_gpt2_folder(folder, gpt2_state_dict(sd), _gpt.n_layers_of(sd))
    return folder, _gpt.n_layers_of(sd)


def _env():
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", LMCACHE_TRACK_USAGE="false", LMCACHE_DISABLE_BANNER="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


class Server(LMCacheServer):
    """The server the end-to-end tests use: tensorzip's adapter and serde on ``l2``."""

    def __init__(self, l2: Path, log: Path) -> None:
        super().__init__(tensorzip_adapter(l2), log, CHUNK_TOKENS, env=_env())


def run_engine(tmp: Path, name: str, folder: Path, prompts, server=None):
    """vLLM's greedy tokens and cached-token counts for the prompts (through ``server`` when given)."""
    spec, out = tmp / f"spec-{name}.json", tmp / f"out-{name}.json"
    kv = None
    env = _env()
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if server is not None:
        kv = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": server.port,
                                            "lmcache.mp.mq_timeout": 120}}
        # vLLM's own process layout: in one process, vLLM's CPU kernel registration scans modules
        # that LMCache imported (numba's llvmlite) and fails.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    spec.write_text(json.dumps({"model": str(folder), "prompts": prompts, "max_tokens": 16,
                                "block_size": BLOCK_TOKENS, "kv_transfer_config": kv}))
    p = subprocess.run([sys.executable, str(WORKER), str(spec), str(out)], capture_output=True, text=True,
                       env=env, timeout=ENGINE_TIMEOUT)
    server_log = f"\nserver log:\n{server.tail()}" if server is not None else ""
    assert p.returncode == 0, f"vLLM ({name}) exited {p.returncode}:\n{p.stderr[-6000:]}{server_log}"
    return json.loads(out.read_text())


def test_restarted_server_serves_compressed_chunks_from_disk(gpt2_folder, tmp_path):
    folder, n_layers = gpt2_folder
    prompts = [_gpt.real_text_ids(160, off)[0].tolist() for off in (0, 2000, 4000)]
    full = len(prompts[0]) // CHUNK_TOKENS                  # whole chunks per prompt
    reference = run_engine(tmp_path, "plain", folder, prompts)
    l2 = tmp_path / "l2"

    server = Server(l2, tmp_path / "server-1.log")
    try:
        stored = run_engine(tmp_path, "store", folder, prompts, server)
    finally:
        server.stop()
    files = sorted(l2.glob("*.data"))
    raw = 2 * n_layers * CHUNK_TOKENS * 256 * 2             # (K, V) x layers x tokens x hidden x BF16
    assert len(files) == full * len(prompts), [f.name for f in files]
    sizes = [f.stat().st_size for f in files]
    for f, size in zip(files, sizes):
        with open(f, "rb") as fh:
            assert tzl.chunk_bytes_of(fh.read(16)) == size, f
    assert sum(sizes) <= len(files) * raw / 1.4, (sizes, raw)

    server = Server(l2, tmp_path / "server-2.log")           # a new server: its memory is empty
    try:
        loaded = run_engine(tmp_path, "load", folder, prompts, server)
    finally:
        server.stop()
    log = (tmp_path / "server-2.log").read_text(errors="replace")
    from_l2 = [(int(a), int(b)) for a, b in re.findall(r"\((\d+) L1, (\d+) L2\)", log)]
    assert sum(b for _, b in from_l2) == len(files) and sum(a for a, _ in from_l2) == 0, log[-4000:]
    assert "Serde task" not in log and "Incomplete read" not in log, log[-4000:]
    assert stored["cached"] == [0] * len(prompts)
    assert loaded["cached"] == [full * CHUNK_TOKENS] * len(prompts)
    assert stored["greedy"] == reference["greedy"] and loaded["greedy"] == reference["greedy"]
    assert len({tuple(g) for g in reference["greedy"]}) == len(prompts)
