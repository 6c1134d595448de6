"""The GPU path of the vLLM load format ``tensorzip`` (tensorzip/_vllm_device.py; doc/vllm.md).

Everywhere: the option ``device_decode`` is checked; the path is chosen (the CPU for a CPU model,
``device_decode: false``, no CUDA build or device; a refusal with one line for an explicit true
that cannot run); and the device path's Python side runs over host stand-ins of the CUDA calls
(the CUDA plan replaced by one that decodes the same frames with the CPU codec into the same
pointers, the streams by no-ops): bit for bit the CPU path's tensors, the host path kept for
delta-coded tensors, a damaged frame (at its checksum, and behind it, reported by the plan's
status) raised as CorruptDataError naming the file and the tensor; in a CUDA build without a
device, the real CUDA plan takes the frames and its refusal to start is raised naming them too.
On a GPU (skipped without one; ``TZ_REQUIRE_VLLM_CUDA=1`` makes a missing device a failure): the
same on the device itself.
No vLLM, transformers or tzip CLI needed (the delta-coded folder alone is made by the CLI).
"""
import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

import tensorzip  # noqa: E402
import tensorzip.vllm as tzv  # noqa: E402
from tensorzip import _tensorzip as _C  # noqa: E402
from tensorzip import _vllm_device, _vllm_weights  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import _gpt  # noqa: E402
import _weight_folders  # noqa: E402

REQUIRED = os.environ.get("TZ_REQUIRE_VLLM_CUDA") == "1"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The fixture GPT's weights (real trained BF16 tensors) as a plain folder and compressed single-file
    and sharded folders (tensorzip.compress_folder: no tzip CLI or transformers needed)."""
    sd = _gpt.state_dict_of(_gpt.FULL if _gpt.FULL.is_file() else _gpt.SAMPLE)
    root = tmp_path_factory.mktemp("vllm-device")
    out = {"plain": root / "gpt"}
    _weight_folders.write_weights(out["plain"], sd, 1)
    _weight_folders.write_weights(root / "gpt-sharded", sd, 2)
    for key, src in (("tzip", out["plain"]), ("tzip_sharded", root / "gpt-sharded")):
        out[key] = root / (src.name + ".tzip")
        tensorzip.compress_folder(src, out[key])
    assert len(list(out["tzip_sharded"].glob("*.tzip"))) == 2
    return out


@pytest.fixture(scope="module")
def delta(folders, tmp_path_factory, tzip_cli):
    """(folder, refs): the weights compressed as a delta against a previous version of them (every
    third element's lowest bit flipped), whose .tzip folder was then moved away."""
    root = tmp_path_factory.mktemp("vllm-device-delta")
    prev = {}
    for name, t in reference(folders).items():
        bits = t.view(torch.int16).clone().view(-1)
        bits[::3] ^= 1
        prev[name] = bits.view(t.shape).view(t.dtype)
    _weight_folders.write_weights(root / "prev", prev, 1)
    for args in (["compress", root / "prev", "-o", root / "prev.tzip"],
                 ["compress", folders["plain"], "-o", root / "delta.tzip", "--ref", root / "prev.tzip"]):
        subprocess.run([tzip_cli, *map(str, args)], check=True, capture_output=True, timeout=600)
    moved = root / "elsewhere" / "prev-moved.tzip"
    moved.parent.mkdir()
    shutil.move(str(root / "prev.tzip"), str(moved))
    return root / "delta.tzip", moved


def corrupt_copy(folders, tmp_path):
    return _weight_folders.corrupt_copy(folders["tzip"], tmp_path)


def largest_tensor(path: str) -> str:
    return max(_C.tzip_frame_table(path), key=lambda row: sum(f[2] for f in row[4]))[0]


def reference(folders):
    return load_file(str(folders["plain"] / "model.safetensors"))


def assert_same(got, want, device_type):
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        g = got[name]
        assert g.device.type == device_type and g.dtype == t.dtype and g.shape == t.shape, name
        assert torch.equal(g.cpu().view(torch.int16), t.view(torch.int16)), name


# ---- options and the choice of path ----

def test_option_checked():
    assert tzv._options({"device_decode": False}) == {"device_decode": False}
    assert tzv._options({"device_decode": True, "threads": 2}) == {"device_decode": True, "threads": 2}
    for bad in ("yes", 1, 0, "false"):
        with pytest.raises(tensorzip.UsageError, match="device_decode must be true or false"):
            tzv._options({"device_decode": bad})
    assert "device_decode" in tzv.OPTIONS


def test_cpu_model_takes_the_cpu_path():
    model = torch.nn.Linear(4, 4)
    assert _vllm_device.model_device(model) == torch.device("cpu")
    assert tzv._decode_device({}, model) is None
    assert tzv._decode_device({"device_decode": False}, model) is None
    with pytest.raises(tensorzip.UsageError, match="device_decode is true .* on cpu, not a CUDA device"):
        tzv._decode_device({"device_decode": True}, model)
    with torch.device("meta"):
        empty = torch.nn.Linear(4, 4)
    assert _vllm_device.model_device(empty) is None


def test_cuda_model_without_build_or_device(monkeypatch):
    cuda = torch.device("cuda", 0)
    why = _vllm_device.unavailable_reason(cuda)
    if why is None:
        pytest.skip("a CUDA device and a CUDA build are here")
    assert _vllm_device.decode_device(None, cuda) == (None, why)  # the default falls back to the CPU
    assert _vllm_device.decode_device(False, cuda) == (None, "device_decode is false")
    with pytest.raises(tensorzip.UsageError, match="device_decode is true but .*: " + why.split(" (")[0]):
        _vllm_device.decode_device(True, cuda)
    # Each missing piece is named, in the order they are checked.
    monkeypatch.setattr(_C, "HAVE_RESIDENT_CUDA", False, raising=False)
    assert "no CUDA decoder" in _vllm_device.unavailable_reason(cuda)
    monkeypatch.setattr(_C, "HAVE_RESIDENT_CUDA", True, raising=False)
    monkeypatch.setattr(_C, "cuda_available", lambda: False)
    assert "no CUDA device is visible" in _vllm_device.unavailable_reason(cuda)
    monkeypatch.setattr(_C, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "torch sees no CUDA device" in _vllm_device.unavailable_reason(cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _vllm_device.decode_device(None, cuda) == (cuda, "decoded on cuda:0")
    assert _vllm_device.decode_device(None, torch.device("cpu"))[0] is None  # a CPU model still on the CPU


# ---- the device path over host stand-ins of the CUDA calls ----

class HostCalls(_vllm_device._CudaCalls):
    """The CUDA runtime calls of the device path, done on host memory."""
    handed: list = []

    def stream(self):
        return "host-stream"

    def using(self, stream):
        import contextlib
        return contextlib.nullcontext()

    def pinned(self, nbytes):
        return torch.empty(max(1, nbytes), dtype=torch.uint8)

    def handle(self, stream):
        return 0

    def wait(self, stream):
        pass

    def consumer_stream(self):
        return "consumer"

    def hand_over(self, t, consumer):
        assert consumer == "consumer"
        HostCalls.handed.append(t.data_ptr())


def _host_bytes(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * max(1, n)).from_address(ptr))[:n]


class HostPlan:
    """ResidentPlanCuda's calls, decoding each frame with the CPU codec from and into the same
    pointers; per-frame decoded sizes and statuses written where the device's would be."""
    decoded: list = []

    def __init__(self):
        self.items, self.final = [], False
        self.temp_bytes = 4096

    def add(self, group, name, frame_ptr, frame_size, raw_size, dst_offset):
        assert group == 0 and not self.final
        self.items.append((name, frame_ptr, frame_size, raw_size, dst_offset))

    def finalize(self):
        self.final = True

    def decode(self, group, dst_ptr, capacity, temp_ptr, temp_size, sizes_ptr, status_ptr, stream):
        assert self.final and temp_size >= self.temp_bytes
        for i, (name, ptr, size, raw, off) in enumerate(self.items):
            assert off + raw <= capacity
            try:
                n, code = _C.decompress_into(_host_bytes(ptr, size), 0, _host_bytes(dst_ptr + off, raw), 1), 0
            except tensorzip.CorruptDataError:
                n, code = 0, 7  # TZ_ERROR_CORRUPT_BLOCK, as the device reports it
            ctypes.c_int64.from_address(sizes_ptr + 8 * i).value = n
            ctypes.c_int32.from_address(status_ptr + 4 * i).value = code
            HostPlan.decoded.append(name)


@pytest.fixture
def host_device(monkeypatch):
    """The device path with host stand-ins: iter_weights(..., device=torch.device("cpu"))."""
    monkeypatch.setattr(_vllm_device, "_CudaCalls", HostCalls)
    monkeypatch.setattr(_C, "ResidentPlanCuda", HostPlan, raising=False)
    HostPlan.decoded, HostCalls.handed = [], []
    return torch.device("cpu")


@pytest.mark.parametrize("kind", ["tzip", "tzip_sharded"])
def test_device_path_stand_in_bit_identical(folders, host_device, kind):
    files = _vllm_weights.model_weight_files(str(folders[kind]))
    got = dict(_vllm_weights.iter_weights(files, threads=3, device=host_device))
    assert_same(got, reference(folders), "cpu")
    # Every tensor of the fixture (bf16) went through the plan, and was handed over once.
    assert sorted(set(HostPlan.decoded)) == sorted(got)
    assert len(HostCalls.handed) == len(got)


def test_device_path_stand_in_keeps_delta_on_host(folders, delta, host_device):
    folder, moved = delta
    files = _vllm_weights.model_weight_files(str(folder))
    refs = tzv._options({"refs": str(moved)})["refs"]
    got = dict(_vllm_weights.iter_weights(files, threads=2, refs=refs, device=host_device))
    assert_same(got, reference(folders), "cpu")
    assert HostPlan.decoded == [] and HostCalls.handed == []  # delta-coded: all decoded on the host path


def test_device_path_stand_in_window(folders, host_device, monkeypatch):
    """At most `window` tensors decoded that the consumer has not taken, on the device path too."""
    files = _vllm_weights.model_weight_files(str(folders["tzip"]))
    taken, decoded, most = _weight_folders.most_decoded_ahead(monkeypatch, _vllm_device.DeviceDecoder, "decode",
                                                              files, threads=2, window=3, device=host_device)
    assert taken == decoded > 3 and most <= 3


def test_device_path_stand_in_corrupt_frame(folders, tmp_path, host_device):
    """A damaged frame (its xxh64 no longer matches): CorruptDataError naming file and tensor."""
    folder, tensor = corrupt_copy(folders, tmp_path)
    msg = _weight_folders.corrupt_stream_message(folder, tensor, threads=2, device=host_device)
    assert "checksum" in msg, msg


def damaged_behind_checksum(monkeypatch, victim):
    """read_frames_into that reads as the module does, then flips a byte in the middle of the first
    frame of the tensor whose frames start at `victim`'s offset: the damage the device decoder
    itself must report (the xxh64 check has passed)."""
    real = _C.read_frames_into

    def read(path, frames, out_ptr, out_size):
        real(path, frames, out_ptr, out_size)
        off, size, _xxh, out_off = frames[0]
        if off == victim:
            _host_bytes(out_ptr, out_size)[out_off + size // 2] ^= 0x10
    monkeypatch.setattr(_C, "read_frames_into", read)


def first_frame_offset(path, name):
    row = next(r for r in _C.tzip_frame_table(path) if r[0] == name)
    return row[4][0][0]


def stream_with_damage_behind_checksum(folders, device, monkeypatch, what: str) -> None:
    """The largest tensor's first frame damaged after its checksum passed: the device's status for
    it raises CorruptDataError ``<file>: tensor 'x': frame 0 of N failed to decode on <device> <what>``."""
    path = str(folders["tzip"] / "model.tzip")
    name = largest_tensor(path)
    damaged_behind_checksum(monkeypatch, first_frame_offset(path, name))
    want = re.escape(f"{path}: tensor {name!r}: ") + rf"frame 0 of \d+ failed to decode on {device} " + what
    with pytest.raises(tensorzip.CorruptDataError, match=want):
        for _ in _vllm_weights.iter_weights([path], threads=2, device=device):
            pass


def test_device_path_stand_in_status_names_tensor(folders, host_device, monkeypatch):
    stream_with_damage_behind_checksum(folders, host_device, monkeypatch, r"\(tz error code 7\)")


@pytest.mark.skipif(not _vllm_device.built_with_cuda(), reason="a build without the CUDA plan")
def test_cuda_plan_binding_without_a_device(folders, monkeypatch):
    """The module's real CUDA plan, driven by the device path (host stand-ins for the streams) where
    no device is visible: the plan takes the frames (host arithmetic) and its decode cannot start,
    which is raised naming the file and the tensor."""
    if _C.cuda_available():
        pytest.skip("a CUDA device is here")
    monkeypatch.setattr(_vllm_device, "_CudaCalls", HostCalls)
    path = str(folders["tzip"] / "model.tzip")
    with pytest.raises(tensorzip.UsageError) as e:
        for _ in _vllm_weights.iter_weights([path], threads=1, device=torch.device("cpu")):
            pass
    msg = str(e.value)
    assert msg.startswith(f"{path}: tensor '") and "CUDA decode of group 0 could not start" in msg, msg


# ---- on a GPU ----

@pytest.fixture
def cuda():
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda", 0)
    why = _vllm_device.unavailable_reason(dev)
    if why is None:
        return dev
    if REQUIRED:
        pytest.fail(f"TZ_REQUIRE_VLLM_CUDA=1: the device path cannot run here: {why}")
    pytest.skip(why)


@pytest.mark.parametrize("kind", ["tzip", "tzip_sharded"])
def test_gpu_bit_identical_to_cpu_path(folders, cuda, kind):
    files = _vllm_weights.model_weight_files(str(folders[kind]))
    on_cpu = dict(_vllm_weights.iter_weights(files, threads=2))
    got = dict(_vllm_weights.iter_weights(files, threads=3, device=cuda))
    assert_same(got, on_cpu, "cuda")
    assert_same(got, reference(folders), "cuda")


def test_gpu_loader_chooses_the_device(cuda):
    model = torch.nn.Linear(4, 4).to(cuda)
    assert tzv._decode_device({}, model) == cuda
    assert tzv._decode_device({"device_decode": True}, model) == cuda
    assert tzv._decode_device({"device_decode": False}, model) is None


def test_gpu_delta_stays_on_host(folders, delta, cuda):
    folder, moved = delta
    files = _vllm_weights.model_weight_files(str(folder))
    refs = tzv._options({"refs": str(moved)})["refs"]
    got = dict(_vllm_weights.iter_weights(files, threads=2, refs=refs, device=cuda))
    assert_same(got, reference(folders), "cpu")


def test_gpu_corrupt_frame(folders, tmp_path, cuda):
    folder, tensor = corrupt_copy(folders, tmp_path)
    _weight_folders.corrupt_stream_message(folder, tensor, threads=2, device=cuda)


def test_gpu_damage_behind_checksum_reported_by_device(folders, cuda, monkeypatch):
    stream_with_damage_behind_checksum(folders, cuda, monkeypatch, "")
