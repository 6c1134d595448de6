"""tensorzip.dcp's block-level partial reads (resharding): a read of part of a stored tensor
decodes only the codec blocks it needs (the reader's counters prove it), finds damage in those
blocks, and the module functions behind it decode block ranges of a frame.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dcp_support import (  # noqa: E402,F401  (quiet_dcp: autouse; torch or the module is skipped)
    dcp, quiet_dcp, tensor_bytes, torch)

import tensorzip  # noqa: E402
import tensorzip.dcp as tzdcp  # noqa: E402


class _SliceLoader:
    """Minimal LoadPlanner for StorageReader.read_data: every request goes to one target tensor."""

    def __init__(self, target):
        self.target = target

    def resolve_tensor(self, req):
        return self.target

    def commit_tensor(self, req, tensor):
        pass


def _read_box(reader, fqn, offs, lens, dtype):
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    (index,) = [k for k in reader.storage_data if k.fqn == fqn]
    req = ReadItem(type=LoadItemType.TENSOR, dest_index=index, dest_offsets=torch.Size([0] * len(offs)),
                   storage_index=index, storage_offsets=torch.Size(offs), lengths=torch.Size(lens))
    target = torch.full(tuple(lens), 7, dtype=dtype)
    tzdcp.reset_read_stats()
    reader.read_data(LoadPlan([req]), _SliceLoader(target)).wait()
    return target, tzdcp.read_stats()


def _open_reader(path, **kw):
    reader = tzdcp.StorageReader(path, **kw)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    return reader


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_partial_read_decodes_only_needed_blocks(tmp_path, dtype):
    g = torch.Generator().manual_seed(4)
    state = {"rows": (torch.randn(512, 256, generator=g) * 0.02).to(dtype),      # 32 blocks of 16 rows
             "wide": (torch.randn(16, 16384, generator=g) * 0.02).to(dtype),     # 4 blocks per row
             "cube": (torch.randn(8, 64, 512, generator=g) * 0.02).to(dtype)}    # 8 blocks per [i]
    dcp.save(state, storage_writer=tzdcp.StorageWriter(tmp_path, block_elems=4096))
    reader = _open_reader(tmp_path)
    cases = [
        ("rows", (100, 0), (50, 256), 4),          # dim-0 slice: one contiguous run, rows 100..149 -> blocks 6..9
        ("rows", (0, 0), (1, 256), 1),             # first row
        ("rows", (511, 0), (1, 256), 1),           # last row
        ("rows", (17, 3), (2, 5), 1),              # small box inside one block
        ("wide", (0, 4096), (16, 4096), 16),       # column slice: one block per row
        ("wide", (3, 100), (9, 5000), 18),         # columns 100..5099 span blocks 0-1 of rows 3..11
        ("cube", (2, 0, 0), (3, 64, 512), 24),     # dim-0 slice of a 3-D chunk
        ("cube", (0, 8, 0), (8, 8, 512), 8),       # middle dim slice: one block per [i]
    ]
    for fqn, offs, lens, blocks in cases:
        got, st = _read_box(reader, fqn, offs, lens, dtype)
        want = state[fqn][tuple(slice(o, o + n) for o, n in zip(offs, lens))]
        assert tensor_bytes(got) == tensor_bytes(want), (fqn, offs, lens)
        # It really decoded and read only part of the chunk: a whole decode would fail these.
        assert st["partial_decodes"] == 1 and st["whole_decodes"] == 0, (fqn, offs, st)
        assert st["blocks_decoded"] == blocks, (fqn, offs, st)
        n_blocks = st["blocks_decoded"] + st["blocks_skipped"]
        assert n_blocks == state[fqn].numel() // 4096
        info = reader.storage_data[[k for k in reader.storage_data if k.fqn == fqn][0]]
        assert info.n_blocks == n_blocks and info.block_bytes == 4096 * state[fqn].element_size()
        assert 0 < st["bytes_decoded"] <= blocks * info.block_bytes, (fqn, st)
    # A request covering most blocks (all rows of a column slice of "rows") decodes the chunk whole.
    got, st = _read_box(reader, "rows", (0, 64), (512, 64), dtype)
    assert tensor_bytes(got) == tensor_bytes(state["rows"][:, 64:128])
    assert st["whole_decodes"] == 1 and st["partial_decodes"] == 0
    # partial_reads=False: always whole chunks, same bytes.
    got, st = _read_box(_open_reader(tmp_path, partial_reads=False), "rows", (100, 0), (50, 256), dtype)
    assert tensor_bytes(got) == tensor_bytes(state["rows"][100:150]) and st["whole_decodes"] == 1


def test_partial_read_detects_corrupt_block(tmp_path):
    full = (torch.randn(512, 256, generator=torch.Generator().manual_seed(5)) * 0.02).to(torch.bfloat16)
    dcp.save({"w": full}, storage_writer=tzdcp.StorageWriter(tmp_path, block_elems=4096))
    reader = _open_reader(tmp_path)
    (info,) = reader.storage_data.values()
    # Damage a byte inside block 20 (rows 320..335): a partial read of those rows must fail, naming 'w';
    # a partial read of other rows still works (the damage is outside what it reads).
    import tensorzip._tensorzip as C
    data_file = tmp_path / info.relative_path
    raw = bytearray(data_file.read_bytes())
    # The chunk is one tensor of the rank's .tzip, in one frame (it is smaller than chunk_bytes).
    prefix_size = C.frame_prefix_size(bytes(raw), info.offset)
    prefix = bytes(raw[info.offset:info.offset + prefix_size])
    off, size, _, _ = C.frame_block_range(prefix, 20, 1)
    raw[info.offset + off + size // 2] ^= 0x04
    data_file.write_bytes(bytes(raw))
    got, st = _read_box(reader, "w", (0, 0), (16, 256), torch.bfloat16)
    assert tensor_bytes(got) == tensor_bytes(full[:16]) and st["partial_decodes"] == 1
    with pytest.raises(tensorzip.CorruptDataError, match=r"'w'.*" + info.relative_path):
        _read_box(reader, "w", (320, 0), (16, 256), torch.bfloat16)
    # Damage in the frame's block index is caught too.
    raw[info.offset + prefix_size - 2] ^= 0x01
    data_file.write_bytes(bytes(raw))
    with pytest.raises(tensorzip.CorruptDataError, match=r"'w'.*" + info.relative_path):
        _read_box(reader, "w", (0, 0), (16, 256), torch.bfloat16)


def test_block_range_bindings():
    # The module functions the partial reads use: block i of a frame decodes to bytes of block i.
    import numpy as np
    import tensorzip._tensorzip as C

    x = (torch.randn(10 * 4096 + 100, generator=torch.Generator().manual_seed(8)) * 0.02).to(torch.bfloat16)
    payload = tensorzip.compress(x, block_elems=4096)
    start = tensorzip._core.parse_wrapper(payload)[3]  # the codec frame follows the wrapper header
    info = C.frame_info(payload, start)
    assert info["n_blocks"] == 11 and C.frame_prefix_size(payload, start) == info["prefix_size"]
    prefix = payload[start:start + info["prefix_size"]]
    raw = x.view(torch.uint8).numpy()
    for first, count in [(0, 1), (3, 4), (10, 1), (0, 11)]:
        off, size, raw_off, raw_len = C.frame_block_range(prefix, first, count)
        assert raw_off == first * 8192 and raw_len == min(count * 8192, raw.size - raw_off)
        out = np.zeros(raw.size, dtype=np.uint8)
        blocks = payload[start + off:start + off + size]
        assert C.decompress_blocks_into(prefix, blocks, first, count, out, raw_off) == raw_len
        assert out[raw_off:raw_off + raw_len].tobytes() == raw[raw_off:raw_off + raw_len].tobytes()
    with pytest.raises(tensorzip.TensorZipError):
        C.frame_block_range(prefix, 10, 2)  # past the last block
    with pytest.raises(tensorzip.CorruptDataError):
        bad = bytearray(payload[start + off:start + off + size])
        bad[len(bad) // 2] ^= 0x40
        C.decompress_blocks_into(prefix, bytes(bad), 0, 11, np.zeros(raw.size, dtype=np.uint8))
