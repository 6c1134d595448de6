"""Compressed weight folders for the weight-stream tests (test_vllm.py, test_vllm_device.py)."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import tensorzip
from tensorzip import _vllm_weights


def write_weights(folder: Path, sd, shards: int = 1) -> None:
    """model.safetensors in ``folder`` (made if missing), or ``shards`` shards and
    model.safetensors.index.json (Hugging Face's sharded layout)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(sd)
    per = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        part = names[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: sd[n] for n in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def corrupt_copy(tzip_folder: Path, tmp_path: Path):
    """A copy of a compressed folder (model.tzip) with one byte of one tensor's frame flipped:
    (folder, tensor)."""
    dst = tmp_path / "corrupt.tzip"
    shutil.copytree(tzip_folder, dst)
    path = dst / "model.tzip"
    data = bytearray(path.read_bytes())
    for frac in (0.5, 0.4, 0.6, 0.3, 0.7):
        pos = int(len(data) * frac)
        data[pos] ^= 0x10
        path.write_bytes(bytes(data))
        bad = []
        with tensorzip.safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                try:
                    f.get_tensor(name)
                except tensorzip.CorruptDataError:
                    bad.append(name)
        if len(bad) == 1:
            return dst, bad[0]
        data[pos] ^= 0x10
    raise AssertionError("no byte found whose flip damages exactly one tensor")


def most_decoded_ahead(monkeypatch, owner, method: str, files, **kw):
    """Consumes ``iter_weights(files, **kw)`` slowly, counting the calls of ``owner.method`` (the
    per-tensor decode): (tensors taken, tensors decoded, most decoded that were not taken yet)."""
    decoded = []
    real = getattr(owner, method)

    def counting(self, *a):
        t = real(self, *a)
        decoded.append(a)
        return t

    monkeypatch.setattr(owner, method, counting)
    taken = most = 0
    for _name, _t in _vllm_weights.iter_weights(files, **kw):
        taken += 1
        time.sleep(0.01)  # a slow consumer: the workers would run ahead without the window
        most = max(most, len(decoded) - taken + 1)
    return taken, len(decoded), most


def corrupt_stream_message(folder: Path, tensor: str, **kw) -> str:
    """The CorruptDataError of streaming a folder whose one tensor is damaged (corrupt_copy), checked
    to name the file and that tensor once."""
    files = _vllm_weights.model_weight_files(str(folder))
    with pytest.raises(tensorzip.CorruptDataError) as e:
        for _ in _vllm_weights.iter_weights(files, **kw):
            pass
    msg = str(e.value)
    assert str(folder / "model.tzip") in msg and msg.count(f"tensor {tensor!r}") == 1, msg
    return msg
