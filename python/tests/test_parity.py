"""safetensors parity of tensorzip.torch / tensorzip.numpy / safe_open: dtypes, refusals,
save_model, plain safetensors files, OS errors, messages, streaming save, user metadata."""
from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch

import tensorzip
import tensorzip._dtypes as D
import tensorzip.numpy as tzn
import tensorzip.torch as tzt
from _data import np_array, same_bits, torch_same_bits, torch_tensor

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")

# Every dtype safetensors 0.8 gives a torch type (safetensors.torch._TYPES / _SIZE).
TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
    "C64": torch.complex64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2,
}


def test_every_safetensors_torch_dtype_is_supported():
    assert set(TORCH_DTYPES) <= set(D.ALL_NAMES)
    for name, dt in TORCH_DTYPES.items():
        assert D.torch_dtype(name) is dt
        assert D.name_of_torch(dt) == name


def test_python_codec_table_is_the_containers():
    for name in D.ALL_NAMES:
        assert D.lookup(name).codec == tensorzip._tensorzip.codec_dtype_for(name), name
    assert tensorzip._tensorzip.codec_dtype_for("F6_E2M3") == 0
    assert tensorzip._tensorzip.codec_dtype_for("nope") == -1


def test_dtype_order_and_bytes_match_safetensors(tmp_path, rng, run_tzip):
    """One tensor of every dtype: the file decompresses to safetensors' own file, byte for byte
    (dtype strings, the dtype order of the data, packed F4 shapes), and safetensors reads back
    what tensorzip wrote, and the other way round."""
    d = {f"t.{n.lower()}": torch_tensor(n, (5, 6), rng) for n in TORCH_DTYPES}
    tz = tmp_path / "all.tzip"
    tzt.save_file(d, tz, metadata={"format": "pt"})
    ref = tmp_path / "ref.safetensors"
    safetensors.torch.save_file(d, str(ref), metadata={"format": "pt"})
    out = tmp_path / "out.safetensors"
    run_tzip("decompress", tz, "-o", out)
    assert out.read_bytes() == ref.read_bytes()
    with safetensors.safe_open(str(out), "pt") as f:
        for k in d:
            assert torch_same_bits(f.get_tensor(k), d[k]), k
    # safetensors' file, through tensorzip (plain .safetensors) and compressed by the CLI
    for path in (ref, tmp_path / "ref.tzip"):
        if path.suffix == ".tzip":
            run_tzip("compress", ref, "-o", path)
        back = tzt.load_file(path)
        assert set(back) == set(d)
        for k in d:
            assert torch_same_bits(back[k], d[k]), (path.name, k)


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_every_dtype_round_trips_torch_and_numpy(tmp_path, rng, name):
    t = torch_tensor(name, (3, 130_000), rng)  # more than one codec block
    p = tmp_path / "x.tzip"
    tzt.save_file({"x": t, "e": torch_tensor(name, (4, 0), rng)}, p)
    back = tzt.load_file(p)
    assert torch_same_bits(back["x"], t) and torch_same_bits(back["e"], torch_tensor(name, (4, 0), rng))
    with tensorzip.safe_open(p, framework="pt") as f:
        assert f.get_slice("x").get_dtype() == name
        assert torch_same_bits(f.get_slice("x")[1:3], t[1:3])
        assert torch_same_bits(f.get_slice("x")[:, 7:19], t[:, 7:19])
    a = np_array(name, (4, 1000), rng)
    q = tmp_path / "n.tzip"
    tzn.save_file({"a": a}, q)
    assert same_bits(tzn.load_file(q)["a"], a)
    with tensorzip.safe_open(q, framework="np") as f:
        assert same_bits(f.get_slice("a")[1:3, 10:20], a[1:3, 10:20])


def test_f4_packing_is_torchs(tmp_path):
    # float4_e2m1fn_x2 byte 0x21: element 0 = 0x1 (0.5) in the low nibble, element 1 = 0x2 (1.0)
    t = torch.tensor([[0x21, 0xF7]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    p = tmp_path / "f4.tzip"
    tzt.save_file({"w": t}, p)
    with tensorzip.safe_open(p, framework="np") as f:
        assert f.get_slice("w").get_shape() == [1, 4]  # the file counts 4-bit elements
        a = f.get_tensor("w")
    assert a.dtype == ml_dtypes.float4_e2m1fn and a.shape == (1, 4)
    assert a.astype(np.float32).tolist() == [[0.5, 1.0, 6.0, -6.0]]
    tzn.save_file({"w": a}, tmp_path / "f4n.tzip")
    assert torch_same_bits(tzt.load_file(tmp_path / "f4n.tzip")["w"], t)
    with pytest.raises(ValueError, match="even number"):
        tzn.save_file({"w": a[:, :3]}, tmp_path / "odd.tzip")
    with pytest.raises(ValueError, match="0-d"):
        tzt.save_file({"w": t[0, 0]}, tmp_path / "scalar.tzip")


def _message_and_class(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - comparing exactly what is raised
        return type(e), str(e)
    return None, None


def test_refusals_match_safetensors(tmp_path):
    a = torch.zeros(4, 4)
    cases = {
        "shared": {"a": a, "b": a[1]},
        "sparse": {"s": torch.eye(3).to_sparse()},
        "meta": {"m": torch.empty(3, device="meta")},
    }
    for what, d in cases.items():
        ours = _message_and_class(lambda: tzt.save_file(d, tmp_path / "x.tzip"))
        theirs = _message_and_class(lambda: safetensors.torch.save_file(d, str(tmp_path / "x.safetensors")))
        assert ours[0] is theirs[0], what
        if what == "shared":  # the names are printed as a set, in an order of its own
            assert ours[1].replace("'a', 'b'", "'b', 'a'") in (theirs[1], theirs[1].replace("'a', 'b'", "'b', 'a'"))
        else:
            assert ours[1] == theirs[1], what
    assert not (tmp_path / "x.tzip").exists()
    # views of one storage that do not overlap are fine (as in safetensors)
    tzt.save_file({"r0": a[0], "r1": a[1]}, tmp_path / "rows.tzip")
    safetensors.torch.save_file({"r0": a[0], "r1": a[1]}, str(tmp_path / "rows.safetensors"))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.emb.weight
        self.norm = torch.nn.LayerNorm(8)


def test_save_model_dedupes_shared_tensors_as_safetensors(tmp_path):
    torch.manual_seed(1)
    m = Tied()
    p = tmp_path / "tied.tzip"
    tzt.save_model(m, p)
    sp = tmp_path / "tied.safetensors"
    safetensors.torch.save_model(m, str(sp))
    with tensorzip.safe_open(p, framework="pt") as f, safetensors.safe_open(str(sp), "pt") as g:
        assert f.keys() == sorted(g.keys()) == ["emb.weight", "norm.bias", "norm.weight"]
        assert f.metadata() == g.metadata() == {"head.weight": "emb.weight"}
    m2 = Tied()
    assert tzt.load_model(m2, p) == ([], [])
    assert torch.equal(m2.head.weight, m.emb.weight) and m2.head.weight.data_ptr() == m2.emb.weight.data_ptr()
    with pytest.raises(RuntimeError, match="Missing key"):
        tzt.load_model(torch.nn.Sequential(torch.nn.Linear(8, 8)), p)


def test_load_file_and_safe_open_read_plain_safetensors(tmp_path, rng):
    d = {"w": torch_tensor("BF16", (300, 70), rng), "i": torch.arange(10), "s": torch.tensor(3.5)}
    sp = tmp_path / "plain.safetensors"
    safetensors.torch.save_file(d, str(sp), metadata={"format": "pt", "k": "v"})
    back = tzt.load_file(sp)
    assert set(back) == set(d) and all(torch_same_bits(back[k], d[k]) for k in d)
    with tensorzip.safe_open(sp, framework="pt") as f:
        assert f.file_format() == "safetensors" and f.format_version() is None
        assert f.metadata() == {"format": "pt", "k": "v"} and f.predictions() == {} and f.references() == []
        assert torch_same_bits(f.get_slice("w")[10:20, 5:9], d["w"][10:20, 5:9])
        assert f.keys() == ["i", "s", "w"]
    assert tensorzip.read_metadata(sp) == {"format": "pt", "k": "v"}
    npd = tzn.load_file(sp)
    assert npd["i"].tolist() == list(range(10))
    # a damaged header is refused by the container's parser
    bad = tmp_path / "bad.safetensors"
    raw = sp.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    bad.write_bytes(raw[:8] + raw[8:8 + n].replace(b'"I64"', b'"X64"') + raw[8 + n:])
    with pytest.raises(tensorzip.CorruptDataError, match="unknown dtype 'X64'"):
        tzt.load_file(bad)
    # a file cut short: header fine, data missing
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(raw[:-100])
    with pytest.raises(tensorzip.CorruptDataError):
        tzt.load_file(cut)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello, world")
    with pytest.raises(tensorzip.CorruptDataError, match="not a .tzip or safetensors file"):
        tzt.load_file(junk)


def test_os_errors_are_filenotfound_and_permission(tmp_path):
    missing = tmp_path / "missing.tzip"
    for fn in (lambda: tzt.load_file(missing), lambda: tensorzip.safe_open(missing, framework="np"),
               lambda: tensorzip.read_metadata(missing),
               lambda: tensorzip.compress_safetensors(tmp_path / "missing.safetensors", tmp_path / "o.tzip"),
               lambda: tzt.save_file({"a": torch.zeros(2)}, tmp_path / "no" / "dir" / "x.tzip")):
        with pytest.raises(FileNotFoundError) as ei:
            fn()
        e = ei.value
        assert isinstance(e, tensorzip.TensorZipIOError) and isinstance(e, tensorzip.TensorZipFileNotFoundError)
        assert e.errno == errno.ENOENT and e.filename and "No such file" in str(e)
    e = pytest.raises(FileNotFoundError, tzt.load_file, missing).value
    assert e.filename == str(missing) and str(missing) in str(e)
    # EACCES: a folder without write permission (as root, sysfs refuses file creation)
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "x.tzip"
    else:
        target = "/sys/tensorzip-test.tzip"
    with pytest.raises(PermissionError) as ei:
        tzt.save_file({"a": torch.zeros(2)}, target)
    assert isinstance(ei.value, tensorzip.TensorZipPermissionError)
    assert ei.value.errno in (errno.EACCES, errno.EPERM) and ei.value.filename == str(target)


def test_python_messages_have_no_temp_names_or_cli_flags(tmp_path):
    p = tmp_path / "a.tzip"
    tzt.save_file({"a": torch.zeros(3)}, p)
    out = tmp_path / "a.safetensors"
    tensorzip.export_safetensors(p, out)
    with pytest.raises(FileExistsError) as ei:
        tensorzip.export_safetensors(p, out)
    msg = str(ei.value)
    assert "-f" not in msg.split() and "use -f" not in msg and "overwrite=True" in msg
    assert ei.value.errno == errno.EEXIST and ei.value.filename == str(out)
    # bytes in, bytes out: no temporary path in the messages
    with pytest.raises(tensorzip.CorruptDataError) as ei:
        tzt.load(b"TZIP" + b"\0" * 200)
    assert "tensorzip-" not in str(ei.value) and "t.tzip" not in str(ei.value) and "given bytes" in str(ei.value)
    # a delta file whose reference is gone: the advice is Python's
    d1 = {"w": torch.randn(200_000)}
    a, b = tmp_path / "r1.tzip", tmp_path / "r2.tzip"
    tzt.save_file(d1, a)
    tzt.save_file(d1, b, ref=a)  # the same values: the delta pays
    with tensorzip.safe_open(b, framework="pt") as f:
        assert f.predictions()["w"]["kind"] == "delta"
    a.rename(tmp_path / "gone.tzip")
    with pytest.raises(tensorzip.TensorZipIOError) as ei:
        tzt.load_file(b)
    assert "--ref" not in str(ei.value) and "refs=" in str(ei.value)
    # a recorded reference path that climbs out of the file's folder tree: Python's advice too
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "c").mkdir(parents=True)
    tzt.save_file(d1, tmp_path / "a" / "r1.tzip")
    tzt.save_file(d1, tmp_path / "b" / "c" / "r2.tzip", ref=tmp_path / "a" / "r1.tzip")
    with pytest.raises(tensorzip.CorruptDataError) as ei:
        tzt.load_file(tmp_path / "b" / "c" / "r2.tzip")
    assert "climbs above" in str(ei.value) and "--ref" not in str(ei.value) and "refs=" in str(ei.value)
    assert tzt.load_file(tmp_path / "b" / "c" / "r2.tzip", refs=[tmp_path / "a" / "r1.tzip"])["w"].equal(d1["w"])


def test_user_metadata_is_visible(tmp_path, rng, run_tzip):
    d = {"w": torch_tensor("F32", (10,), rng)}
    st = tmp_path / "m.safetensors"
    safetensors.torch.save_file(d, str(st), metadata={"format": "pt"})
    tz = tmp_path / "m.tzip"
    run_tzip("compress", st, "-o", tz, "--meta", "run=exp-17", "--meta", "format=ignored")
    with tensorzip.safe_open(tz, framework="pt") as f:
        assert f.user_metadata() == {"run": "exp-17", "format": "ignored"}
        assert f.metadata() == {"run": "exp-17", "format": "pt"}  # __metadata__ wins on a shared key
    assert tensorzip.read_metadata(tz) == {"run": "exp-17", "format": "pt"}
    t2 = tmp_path / "m2.tzip"
    tensorzip.compress_safetensors(st, t2, user_metadata={"step": "400"})
    assert tensorzip.read_metadata(t2) == {"step": "400", "format": "pt"}
    # metadata= of save_file is the file's __metadata__
    t3 = tmp_path / "m3.tzip"
    tzt.save_file(d, t3, metadata={"a": "b"})
    with tensorzip.safe_open(t3, framework="pt") as f:
        assert f.metadata() == {"a": "b"} and f.user_metadata() == {}


SMALL_FS_SCRIPT = r"""
import os, resource, signal, sys, torch
import tensorzip.torch as tzt
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # writes past the limit fail with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # no file may grow past 1 MiB
out = sys.argv[1]
tzt.save_file({"zeros": torch.zeros(2 << 20)}, out)   # 8 MiB of raw data, a few KiB compressed
print(os.path.getsize(out))
"""


def test_save_file_streams_without_a_raw_temporary(tmp_path):
    """8 MiB of zeros saved while no file may exceed 1 MiB: works, since no raw copy is written."""
    out = tmp_path / "z.tzip"
    p = subprocess.run([sys.executable, "-c", SMALL_FS_SCRIPT, str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert 0 < int(p.stdout) < 100_000
    assert torch.equal(tzt.load_file(out)["zeros"], torch.zeros(2 << 20))
    assert sorted(os.listdir(tmp_path)) == ["z.tzip"]


def test_safetensors_header_is_checked_by_the_writer(tmp_path):
    w = tensorzip._tensorzip.TensorWriter(str(tmp_path / "h.tzip"), safetensors_header=json.dumps(
        {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}) + "  ")
    w.add("x", "F32", [3], np.zeros(3, np.float32))
    with pytest.raises(tensorzip.UsageError, match="differs from the added one"):
        w.finish()
    assert not (tmp_path / "h.tzip").exists()
