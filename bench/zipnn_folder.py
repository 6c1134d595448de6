"""ZipNN's compressed safetensors layout, for bench/vllm_load_bench.py's ZipNN rows.

ZipNN's documented vLLM route is `from zipnn import zipnn_safetensors; zipnn_safetensors()` before
`import vllm`: it replaces `safetensors.torch.safe_open` with ZipNN's `SafeOpen`, whose `get_tensor`
decodes a tensor listed in the file's metadata key `znn_compressed_vectors` (JSON {name: {dtype,
shape}}) from a uint8 tensor of ZipNN's compressed bytes, and returns other tensors as stored.

zipnn 0.5.4's package ships no writer for this layout (ZipNN's repository has a command-line
script, scripts/zipnn_compress_safetensors.py, that `pip install zipnn` does not install), so this
module writes it with ZipNN's public API: `ZipNN(input_format="torch", bytearray_dtype=<the
tensor's dtype>, method=COMPRESSION_METHOD)` ("HUFFMAN") `.compress(tensor)` per floating-point
tensor, stored as a `COMPRESSED_DTYPE` (uint8) tensor; `build_compressed_tensor_info` and
`set_compressed_tensors_metadata` (zipnn.util_safetensors) for the metadata; safetensors'
`save_file`. As ZipNN's script does, a tensor whose compressed bytes are not smaller, and a tensor
that is not floating point, is stored as it is, and the file is named `<base>.znn.safetensors`.
ZipNN's `compress` rewrites its input tensor in place, so it is handed a copy.

`verify` reads the written file back through ZipNN's own reader class (`zipnn.zipnn.SafeOpen`, the
class the route installs) and compares every tensor's dtype, shape and bytes with the source.
"""
from __future__ import annotations

import os
from pathlib import Path


def _compress_one(tensor):
    """(stored tensor, info or None): ZipNN's uint8 bytes and their metadata, or the tensor as is."""
    import torch
    from zipnn import ZipNN
    from zipnn.util_safetensors import COMPRESSED_DTYPE, COMPRESSION_METHOD, build_compressed_tensor_info
    if not tensor.is_floating_point():
        return tensor, None
    znn = ZipNN(input_format="torch", bytearray_dtype=tensor.dtype, method=COMPRESSION_METHOD)
    packed = znn.compress(tensor.clone())  # ZipNN reorders its input's bytes in place
    if len(packed) >= tensor.numel() * tensor.element_size():
        return tensor, None
    return torch.frombuffer(bytearray(packed), dtype=COMPRESSED_DTYPE), build_compressed_tensor_info(tensor)


def write(state_dict: dict, path: Path, metadata: dict) -> dict:
    """Writes `state_dict` to `path` in ZipNN's layout (temp name, then renamed).

    Returns {"compressed": n, "stored": m}: how many tensors ZipNN compressed and kept as they are.
    """
    from safetensors.torch import save_file
    from zipnn.util_safetensors import set_compressed_tensors_metadata
    if not metadata:
        raise ValueError(f"{path}: ZipNN's set_compressed_tensors_metadata ignores empty metadata; give one key")
    tensors, infos = {}, {}
    for name, tensor in state_dict.items():
        tensors[name], info = _compress_one(tensor)
        if info is not None:
            infos[name] = info
    meta = dict(metadata)
    set_compressed_tensors_metadata(infos, meta)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return {"compressed": len(infos), "stored": len(tensors) - len(infos)}


def verify(path: Path, state_dict: dict) -> None:
    """Raises unless ZipNN's SafeOpen returns every tensor of `state_dict` bit for bit from `path`."""
    import torch
    from zipnn.zipnn import SafeOpen
    with SafeOpen(str(path), "pt") as f:
        names = set(f.keys())
        if names != set(state_dict):
            raise ValueError(f"{path}: tensor names differ from the source's: {sorted(names ^ set(state_dict))[:5]}")
        for name, want in state_dict.items():
            got = f.get_tensor(name)
            if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
                raise ValueError(f"{path}: tensor {name}: {got.dtype} {tuple(got.shape)} read back, "
                                 f"{want.dtype} {tuple(want.shape)} written")
            if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
                raise ValueError(f"{path}: tensor {name}: ZipNN's decode differs from the bytes written")
