"""The C++ output rules, as the Python package meets them (doc/cli.md "Outputs"):
links are never replaced nor written through, a folder is never replaced by a
file, modes and times carry over from the input, no temporaries are left."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import tensorzip
import tensorzip.numpy as tzn


def _names(d):
    return sorted(os.listdir(d))


def test_save_file_never_replaces_a_link_or_its_target(tmp_path):
    target = tmp_path / "target.tzip"
    target.write_bytes(b"precious")
    link = tmp_path / "link.tzip"
    link.symlink_to(target)
    with pytest.raises(tensorzip.TensorZipError, match="symbolic link"):
        tzn.save_file({"a": np.arange(10, dtype=np.float32)}, link)
    assert link.is_symlink() and target.read_bytes() == b"precious"
    assert _names(tmp_path) == ["link.tzip", "target.tzip"]  # no temporary left


def test_a_folder_is_not_replaced_by_a_file(tmp_path):
    (tmp_path / "x.tzip").mkdir()
    (tmp_path / "x.tzip" / "mine").write_text("keep")
    with pytest.raises(tensorzip.TensorZipError, match="folder"):
        tzn.save_file({"a": np.zeros(4, dtype=np.float32)}, tmp_path / "x.tzip")
    assert (tmp_path / "x.tzip" / "mine").read_text() == "keep"


def test_mode_and_times_carry_over(tmp_path):
    src = tmp_path / "m.safetensors"
    import safetensors.numpy
    safetensors.numpy.save_file({"w": np.linspace(0, 1, 5000, dtype=np.float32)}, str(src))
    os.chmod(src, 0o600)
    os.utime(src, ns=(1_600_000_000_000_000_000, 1_500_000_000_000_000_123))
    z = tmp_path / "m.tzip"
    tensorzip.compress_safetensors(src, z)
    st = os.stat(z)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_mtime_ns == 1_500_000_000_000_000_123
    back = tmp_path / "back.safetensors"
    tensorzip.export_safetensors(z, back)
    assert stat.S_IMODE(os.stat(back).st_mode) == 0o600
    assert back.read_bytes() == src.read_bytes()
    # A file written from memory: 0666 & ~umask, as open() would give.
    old = os.umask(0o027)
    try:
        tzn.save_file({"a": np.ones(3, dtype=np.float32)}, tmp_path / "new.tzip")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.tzip").st_mode) == 0o640
    assert not [n for n in _names(tmp_path) if ".tmp-" in n]


def test_output_inside_the_input_is_refused(tmp_path):
    src = tmp_path / "m.safetensors"
    import safetensors.numpy
    safetensors.numpy.save_file({"w": np.ones(100, dtype=np.float32)}, str(src))
    os.link(src, tmp_path / "same.tzip")
    with pytest.raises(tensorzip.TensorZipError, match="input"):
        tensorzip.compress_safetensors(src, tmp_path / "same.tzip", overwrite=True)
    assert (tmp_path / "same.tzip").read_bytes() == src.read_bytes()
