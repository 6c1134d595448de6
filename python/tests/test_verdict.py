"""One verdict from every reader (doc/container.md section 6, doc/python.md "Damaged files").

Every .tzip input of the container fuzz corpus (tests/container/corpus, decoded as the fuzz
target decodes it; its ``hostile_forged_*`` seeds are a wrong frame hash with the header and
file hashes recomputed, and non-zero padding bytes between frames and after the preamble) is
read by ``tzip verify``, ``tzip decompress``, ``tensorzip.numpy.load_file``,
``tensorzip.torch.load_file`` and ``safe_open(...).get_tensor`` of every name: all accept or
all refuse. The one documented difference: what only the whole-file checksum covers (its own
trailer field, the frames of gaps) is not read by safe_open, which reads only tensors.
"""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

import tensorzip
import tensorzip.numpy as tzn
import tensorzip.torch as tzt
from conftest import REPO

pytestmark = pytest.mark.skipif(not tensorzip.HAVE_CONTAINER, reason="built without the container")

CORPUS = REPO / "tests" / "container" / "corpus"
FORGED = ["hostile_forged_frame_hash", "hostile_forged_padding", "hostile_forged_preamble_padding"]

# ---- XXH64 (seed 0), for the corpus inputs whose checksums the fuzz target recomputes ----
_M = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes) -> int:
    n, i = len(data), 0
    if n >= 32:
        v = [(_P1 + _P2) & _M, _P2, 0, (-_P1) & _M]
        lanes = struct.unpack_from(f"<{n // 32 * 4}Q", data)
        for k in range(0, len(lanes), 4):
            v = [_round(v[j], lanes[k + j]) for j in range(4)]
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
        i = n // 32 * 32
    else:
        h = _P5
    h = (h + n) & _M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from("<I", data, i)[0] * _P1) & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def fix_checksums(f: bytearray) -> None:
    """As fuzz_container.cpp: the trailer's header and file checksums recomputed."""
    if len(f) < 112:
        return
    t = len(f) - 48
    ho, hs = struct.unpack_from("<QQ", f, t)
    if ho <= len(f) and hs <= len(f) - ho:
        struct.pack_into("<Q", f, t + 16, xxh64(bytes(f[ho:ho + hs])))
    struct.pack_into("<Q", f, t + 32, xxh64(bytes(f[:-16])))


def materialize(data: bytes, d: Path):
    """The .tzip file(s) of a corpus input written into d; the one to read, or None."""
    if not data:
        return None
    sel, rest = data[0], bytearray(data[1:])
    if sel & 0x80:  # two files: u32le size of a.tzip, a.tzip, b.tzip
        if len(rest) < 4:
            return None
        na = struct.unpack_from("<I", rest)[0]
        if na > len(rest) - 4:
            return None
        a, b = bytearray(rest[4:4 + na]), bytearray(rest[4 + na:])
        if sel & 1:
            fix_checksums(a)
            fix_checksums(b)
        (d / "b.tzip").write_bytes(b)
        (d / "a.tzip").write_bytes(a)
        return d / "a.tzip"
    if sel & 3 == 0:
        return None
    if sel & 3 >= 2:
        fix_checksums(rest)
    (d / "f.tzip").write_bytes(rest)
    return d / "f.tzip"


def outcome(fn) -> str:
    """"" when fn() succeeds, else the message of the tensorzip error it raised."""
    try:
        fn()
        return ""
    except tensorzip.TensorZipError as e:
        return str(e) or "(empty message)"


def cli(tzip: str, *args) -> str:
    p = subprocess.run([tzip, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 2, 3), f"tzip {args[0]}: exit {p.returncode}: {p.stderr}"
    if p.returncode == 0:
        return ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr  # one line, naming the file
    return lines[0]


def each_tensor(path: Path) -> None:
    with tensorzip.safe_open(path, framework="np", threads=1) as f:
        for name in f.keys():
            f.get_tensor(name)


def verdicts(tzip: str, path: Path, out: Path):
    full = {
        "tzip verify": cli(tzip, "verify", "-T1", path),
        "tzip decompress": cli(tzip, "decompress", "-T1", path, "-o", out),
        "numpy.load_file": outcome(lambda: tzn.load_file(path, threads=1)),
        "torch.load_file": outcome(lambda: tzt.load_file(path, threads=1)),
    }
    return full, outcome(lambda: each_tensor(path))


def same_words(msg: str) -> str:
    """The message without the CLI's "tzip: " and without the hints each front end words its own
    way (where to give a reference: "(tzip --ref, Python refs=)" / "(refs=)", "with refs=")."""
    msg = msg.removeprefix("tzip: ")
    for hint in ("; give its location", " (tzip --ref", " (refs=)"):
        msg = msg.split(hint)[0]
    return msg


def worded_alike(py: str, cli: str) -> bool:
    # Python tells .tzip from safetensors files by their first bytes before any reader opens
    # them: a file that is neither gets that front end's own message.
    return "not a .tzip or safetensors file" in py or same_words(py) == same_words(cli)


def only_whole_file_sum(msg: str) -> bool:
    return "whole-file checksum mismatch" in msg or ": gap at data offset " in msg


def corpus_inputs():
    names = sorted(p.name for p in CORPUS.iterdir() if not p.name.startswith("."))
    return [n for n in names if (CORPUS / n).read_bytes()[:1] and ((CORPUS / n).read_bytes()[0] & 0x83) != 0]


def test_xxh64_matches_the_files_trailers(tmp_path):
    import numpy as np
    tzn.save_file({"a": np.arange(1000, dtype=np.float32)}, tmp_path / "a.tzip")
    b = (tmp_path / "a.tzip").read_bytes()
    assert xxh64(b[:-16]) == struct.unpack_from("<Q", b, len(b) - 16)[0]
    assert xxh64(b"") == 0xEF46DB3751D8E999


def test_every_reader_gives_the_same_verdict_on_the_corpus(tmp_path, tzip_cli):
    names = corpus_inputs()
    assert len(names) > 300 and all(n in names for n in FORGED)
    counts = {"accepted": 0, "refused": 0, "whole-file sum only": 0}
    problems = []
    for n in names:
        d = tmp_path / n
        d.mkdir()
        path = materialize((CORPUS / n).read_bytes(), d)
        if path is None:
            continue
        out = d / "out.safetensors"
        full, each = verdicts(tzip_cli, path, out)
        accepted = {k for k, m in full.items() if not m}
        if accepted and len(accepted) != len(full):
            problems.append(f"{n}: full reads disagree: {full}")
        elif not accepted and not worded_alike(full["numpy.load_file"], full["tzip verify"]):
            problems.append(f"{n}: load_file and tzip verify word it differently: {full}")
        elif out.exists() and full["tzip decompress"]:
            problems.append(f"{n}: decompress failed and left {out}")
        elif not accepted and not each:
            if only_whole_file_sum(full["tzip verify"]):
                counts["whole-file sum only"] += 1
            else:
                problems.append(f"{n}: safe_open reads every tensor, full reads refuse: {full['tzip verify']}")
        elif accepted and each:
            problems.append(f"{n}: full reads accept, safe_open refuses: {each}")
        else:
            counts["accepted" if accepted else "refused"] += 1
        if n in FORGED and (accepted or not each):
            problems.append(f"{n}: a forged seed accepted: {full}, safe_open: {each!r}")
    print(counts)
    assert not problems, "\n".join(problems)
    assert counts["accepted"] > 0 and counts["refused"] > 200


@pytest.mark.parametrize("name", FORGED)
def test_forged_seeds_are_refused_naming_the_file(tmp_path, tzip_cli, name):
    path = materialize((CORPUS / name).read_bytes(), tmp_path)
    full, each = verdicts(tzip_cli, path, tmp_path / "out.safetensors")
    for what, msg in list(full.items()) + [("safe_open", each)]:
        assert msg, f"{what} accepted {name}"
        assert str(path) in msg and "\n" not in msg, f"{what}: {msg}"
    assert not (tmp_path / "out.safetensors").exists()
