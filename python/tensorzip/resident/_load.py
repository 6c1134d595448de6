"""Loading a model straight into resident form from ``.tzip`` files.

The frames of each weight that stays compressed are read from the file as
they are (``pread`` and the frame's recorded xxh64, no decoding) into a
buffer on the target device; only the tensors that stay plain (norms,
biases, small or integer tensors) are decoded. With the model built on the
meta device (``torch.device("meta")``, or ``empty_parameters()`` below), the
plain model is never materialised.

``from_pretrained`` is the thin transformers layer: config from the folder,
the model built with empty (meta) parameters, then ``load_resident``. The
transformers integration of ``tensorzip.transformers`` (when present) can
call ``load_resident`` on the model it builds in the same way.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .. import _dtypes
from .. import _tensorzip as _C
from .._core import UsageError
from .._frame_layout import pack_frames
from ._select import Held, _distinct_tensors, _selected, _selection
from ._state import _attach
from ._tensor import CODEC_OF, Frame, _encode



@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Within it, every parameter a module registers is put on the meta device (buffers stay real).

    Module constructors then allocate and initialise no weights; load_resident fills them.
    """
    old = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        old(self, name, param)
        if param is not None and param.device.type != "meta":
            p = self._parameters[name]
            assert p is not None
            self._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = old  # type: ignore[method-assign]


def _files(path: Any) -> List[str]:
    p = Path(os.fspath(path))
    if p.is_dir():
        files: Optional[List[str]] = None
        try:  # a model folder: its weight files as tensorzip.transformers finds them (index, shards)
            from ..transformers import weight_files

            files = weight_files(str(p))
        except ImportError:  # no transformers: every .tzip file of the folder
            pass
        if files is None:
            files = sorted(str(f) for f in p.glob("*.tzip") if f.is_file())
        if not files:
            raise UsageError(f"load_resident: {p} holds no .tzip file")
        plain = [f for f in files if not f.endswith(".tzip")]
        if plain:
            raise UsageError(f"load_resident: {plain[0]} is not compressed (compress it with tzip first)")
        return files
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory", str(p))
    return [str(p)]


class _Entry:
    __slots__ = ("file", "index", "name", "dtype", "shape", "predicted", "frames")

    def __init__(self, file: str, index: int, row: Tuple[Any, ...]):
        self.file, self.index = file, index
        self.name, self.dtype, shape, self.predicted, self.frames = row
        self.shape = tuple(int(s) for s in shape)


def _table(files: Sequence[str]) -> Dict[str, _Entry]:
    out: Dict[str, _Entry] = {}
    for f in files:
        for i, row in enumerate(_C.tzip_frame_table(f)):
            e = _Entry(f, i, row)
            if e.name in out:
                raise UsageError(f"load_resident: tensor '{e.name}' is in both {out[e.name].file} and {f}")
            out[e.name] = e
    return out


def _read_frames(e: _Entry, device: torch.device) -> Tuple[torch.Tensor, List[Frame]]:
    """The entry's frames, as stored, in one uint8 buffer on device (checked against their xxh64)."""
    frames, reads, pos = pack_frames(e.frames)
    host = torch.empty(max(1, pos), dtype=torch.uint8, pin_memory=device.type == "cuda")
    _C.read_frames_into(e.file, reads, host.data_ptr(), host.numel())
    for f in frames:  # each frame's prefix checked here (on the CPU engine again when the plan is built)
        info = _C.frame_info(host[f.offset:f.offset + f.size].numpy())
        if info["raw_size"] != f.raw_size or info["frame_size"] != f.size:
            raise UsageError(f"{e.file}: tensor '{e.name}': frame sizes differ from the file's index")
    return (host.to(device, non_blocking=False) if device.type != "cpu" else host), frames


def _decode_plain(e: _Entry, readers: Dict[str, Any], threads: int) -> torch.Tensor:
    dtype = _dtypes.torch_dtype(e.dtype)
    out = torch.empty(e.shape, dtype=dtype)
    r = readers.get(e.file)
    if r is None:
        r = readers[e.file] = _C.Reader(e.file, threads, [], True)
    if out.numel():
        r.read_tensor(e.index, out.reshape(-1).view(torch.uint8).numpy())
    return out


def load_resident(model: nn.Module, path: Any, *, device: Any = None, strict: bool = True, include: Any = None,
                  exclude: Any = None, types: Any = None, min_numel: int = 4096, buffers: bool = False,
                  groups: Any = None, threads: int = 0, prefetch: bool = True, level: int = 0,
                  block_elems: int = 0, embedding_rows: bool = True) -> nn.Module:
    """Fills ``model`` from a ``.tzip`` file or a folder of them, keeping the chosen weights compressed.

    ``model`` is best built on the meta device (``with torch.device("meta"): model = Net()``, or
    ``with tensorzip.resident.empty_parameters(): ...`` to keep buffers real): its tensors give names
    and shapes; dtypes come from the file (as ``load_state_dict(assign=True)``). The selection
    options are those of ``compress_model``; a chosen weight stored as a plain frame is kept as
    read (no decode, no re-encode); one stored as a prediction (cast/delta residual) is decoded
    and re-encoded. ``device``: where everything goes (default: the model's device, CPU for meta).
    ``strict``: every parameter and persistent buffer of the model must be in the file(s).
    Returns ``model`` (its ``resident_stats(model)["load"]`` says what was kept, decoded, re-encoded).
    """
    from ._state import is_resident

    if is_resident(model):
        raise UsageError("load_resident: the model is already compressed (decompress_model first)")
    files = _files(path)
    table = _table(files)
    sel = _selection(include, exclude, types, min_numel, buffers)
    prefix = getattr(model, "base_model_prefix", "") or ""

    def find(name: str) -> Optional[_Entry]:
        if name in table:
            return table[name]
        if prefix and name.startswith(prefix + ".") and name[len(prefix) + 1:] in table:
            return table[name[len(prefix) + 1:]]
        if prefix and f"{prefix}.{name}" in table:
            return table[f"{prefix}.{name}"]
        return None

    held = _distinct_tensors(model)
    if device is None:
        devs = {h.tensor.device for h in held if h.tensor.device.type != "meta"}
        device = devs.pop() if len(devs) == 1 else torch.device("cpu")
    device = torch.device(device)

    # Check everything before changing the model.
    plan: List[Tuple[Held, _Entry, bool]] = []
    missing: List[str] = []
    for h in held:
        names, t, is_buffer, binds = h.names, h.tensor, h.is_buffer, h.binds
        e = next((x for x in map(find, names) if x is not None), None)
        if e is None:
            missing.append(names[0])
            continue
        if e.shape != tuple(t.shape):
            raise UsageError(f"load_resident: '{names[0]}' has shape {list(e.shape)} in {e.file}, "
                             f"{list(t.shape)} in the model")
        file_dtype = _dtypes.torch_dtype(e.dtype)
        proxy = torch.empty(e.shape, dtype=file_dtype, device="meta")
        keep = _selected(sel, binds[0][0], names[0], proxy, is_buffer) and file_dtype in CODEC_OF
        plan.append((h, e, keep))
    if missing and strict:
        raise UsageError(f"load_resident: {len(missing)} tensor(s) of the model are not in {path}: "
                         f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")

    report: Dict[str, List[str]] = {"kept": [], "decoded": [], "reencoded": [], "missing": missing}
    items = []
    readers: Dict[str, Any] = {}
    try:
        _fill(plan, device, readers, threads, level, block_elems, items, report)
    finally:
        for r in readers.values():
            r.close()
    if not items:
        raise UsageError("load_resident: no tensor of the file is chosen to stay compressed")
    _attach(model, items, groups, threads, prefetch, level, block_elems, embedding_rows)
    model.__dict__["_tz_resident"].load_report = report
    return model


def _fill(plan: List[Tuple[Held, _Entry, bool]], device: torch.device,
          readers: Dict[str, Any], threads: int, level: int, block_elems: int, items: List[Any],
          report: Dict[str, List[str]]) -> None:
    """Reads what stays compressed (frames as stored) and decodes the rest into the model."""
    with torch.no_grad():
        for h, e, keep in plan:
            names, t, is_buffer, binds = h.names, h.tensor, h.is_buffer, h.binds
            rg = bool(getattr(t, "requires_grad", False))
            if keep and not e.predicted:
                buf, frames = _read_frames(e, device)
                items.append((names[0], buf, frames, _dtypes.torch_dtype(e.dtype), e.shape, rg, is_buffer, binds))
                report["kept"].append(names[0])
                continue
            value = _decode_plain(e, readers, threads)
            if keep:
                buf, frames = _encode(value, level, block_elems, threads)
                items.append((names[0], buf.to(device), frames, value.dtype, e.shape, rg, is_buffer, binds))
                report["reencoded"].append(names[0])
                continue
            value = value.to(device)
            new: torch.Tensor = value if is_buffer else nn.Parameter(value, requires_grad=rg)
            for m, aname in binds:
                (m._buffers if is_buffer else m._parameters)[aname] = new
            report["decoded"].append(names[0])


def from_pretrained(model_class: Any, path: Any, *, device: Any = "cpu", dtype: Any = None,
                    **kwargs: Any) -> nn.Module:
    """A transformers model from a folder compressed by ``tzip compress`` or
    ``tensorzip.transformers.save_pretrained`` (config.json + .tzip weights, sharded or not), with
    its weights kept compressed.

    ``model_class``: e.g. ``transformers.AutoModel`` or ``BertModel``. The model is built with
    empty (meta) parameters, then filled by :func:`load_resident` (keyword arguments: its options);
    ``dtype``: compute dtype (frames stay in the file's dtype, weights are cast on use). Returns
    the model in eval mode. (``tensorzip.transformers.from_pretrained`` is the drop-in loader that
    decodes every weight into a plain model.)
    """
    import transformers

    config = transformers.AutoConfig.from_pretrained(os.fspath(path))
    with empty_parameters():
        if hasattr(model_class, "from_config"):
            model = model_class.from_config(config)
        else:
            model = model_class._from_config(config)
    load_resident(model, path, device=device, **kwargs)
    if dtype is not None:
        model.to(dtype)
    return model.eval()
