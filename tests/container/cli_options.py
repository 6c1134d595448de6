"""zstd-style habits of tzip (doc/cli.md "Options"): cases for cli_test.py.

Standard input and output, -T0, -k/--rm, -1..-3, bundled short flags,
several inputs for every command, one input into an existing folder, the
dependency summary and --independent, --version, the bench table header.
"""
import json
import os
import shutil
import subprocess

import cli_test as T

check, run, one_line_error, sha, tree = T.check, T.run, T.one_line_error, T.sha, T.tree


def tzip():
    return T.ARGS.tzip


def data(name):
    return os.path.join(T.ARGS.data, name)


def local_copy(tmp, name):
    p = os.path.join(tmp, name)
    shutil.copyfile(data(name), p)
    return p


def piped(args, stdin_bytes=None, stdin_file=None, stdout_file=None, env=None):
    """tzip with stdin from bytes (a pipe) or a file, stdout to a pipe or a file."""
    kw = dict(stderr=subprocess.PIPE, env=env)
    if stdin_file is not None:
        kw["stdin"] = stdin_file
    else:
        kw["input"] = stdin_bytes if stdin_bytes is not None else b""
    kw["stdout"] = stdout_file if stdout_file is not None else subprocess.PIPE
    return subprocess.run([tzip()] + args, **kw)


def case_stdio(tmp):
    """'-' reads standard input, -c / --stdout / -o - write standard output; terminals refused."""
    src = local_copy(tmp, "fixture-slice-bf16.safetensors")
    raw = open(src, "rb").read()
    ref = os.path.join(tmp, "ref.tzip")
    run(["compress", "-q", src, "-o", ref], 0)
    want = open(ref, "rb").read()
    # cat x | tzip compress - > y  (a pipe in: spooled; out: stdout by default)
    p = piped(["compress", "-q", "-"], stdin_bytes=raw)
    check(p.returncode == 0 and p.stdout == want, f"compress - from a pipe: {p.returncode} {p.stderr[-300:]}")
    # stdin redirected from a file, -o FILE
    with open(src, "rb") as f:
        p = piped(["compress", "-q", "-", "-o", os.path.join(tmp, "s.tzip")], stdin_file=f)
    check(p.returncode == 0 and sha(os.path.join(tmp, "s.tzip")) == sha(ref), f"compress - -o: {p.stderr}")
    for flag in (["-c"], ["--stdout"], ["-o", "-"]):
        p = piped(["compress", "-q"] + flag + [src])
        check(p.returncode == 0 and p.stdout == want, f"compress {flag}: {p.stderr[-300:]}")
    check(not os.path.exists(os.path.join(tmp, "fixture-slice-bf16.tzip")), "-c also wrote a file")
    # decompress from a pipe to a pipe, and into a file
    p = piped(["decompress", "-q", "-"], stdin_bytes=want)
    check(p.returncode == 0 and p.stdout == raw, f"decompress - | : {p.stderr[-300:]}")
    with open(os.path.join(tmp, "out.safetensors"), "wb") as f:
        p = piped(["decompress", "-q", "-c", ref], stdout_file=f)
    check(p.returncode == 0 and sha(os.path.join(tmp, "out.safetensors")) == sha(src), "decompress -c > file")
    # a damaged stream: one line naming stdin, non-zero exit
    p = piped(["decompress", "-"], stdin_bytes=want[: len(want) // 2])
    lines = [l for l in p.stderr.decode().splitlines() if l.strip()]
    check(p.returncode == 2 and len(lines) == 1 and "stdin" in lines[0] and "/proc/" not in lines[0],
          f"damaged stdin: {p.returncode} {lines}")
    # not a safetensors file on stdin
    p = piped(["compress", "-"], stdin_bytes=b"hello, not a safetensors file")
    check(p.returncode == 2 and b"stdin" in p.stderr, f"bad stdin: {p.returncode} {p.stderr}")
    # several inputs with -c, a folder with -c, stdin twice: refused
    one_line_error(run(["compress", "-c", src, src], 1), "standard output")
    m = os.path.join(tmp, "m")
    T.make_hf_folder(m)
    one_line_error(run(["compress", "-c", m], 1), "folder")
    one_line_error(run(["compress", "-", "-"], 1), "standard input")
    # standard output appended to the input itself: refused, input intact
    before = sha(src)
    with open(src, "ab") as f:
        p = piped(["compress", "-c", src], stdout_file=f)
    check(p.returncode == 1 and sha(src) == before, f"-c >> input: {p.returncode} {p.stderr}")
    # a terminal on stdout or stdin: refused
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.run([tzip(), "compress", "-c", src], stdout=slave, stderr=subprocess.PIPE)
        check(p.returncode == 1 and b"terminal" in p.stderr, f"-c to a terminal: {p.returncode} {p.stderr}")
        p = subprocess.run([tzip(), "compress", "-"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        check(p.returncode == 1 and b"terminal" in p.stderr, f"- from a terminal: {p.returncode} {p.stderr}")
    finally:
        os.close(master)
        os.close(slave)


def case_threads_levels(tmp):
    """-T0 = all cores (same bytes), -1..-3 = -l 1..3, -4/-19 refused, bundled short flags."""
    src = data("fixture-slice-fp32.safetensors")
    outs = {}
    for name, args in {"T1": ["-T1"], "T0": ["-T0"], "T 0": ["-T", "0"], "threads=0": ["--threads=0"]}.items():
        o = os.path.join(tmp, name.replace(" ", "_").replace("=", "_") + ".tzip")
        run(["compress", "-q", src, "-o", o] + args, 0)
        outs[name] = sha(o)
    check(len(set(outs.values())) == 1, f"-T0 output differs: {outs}")
    for n in ("1", "2", "3"):
        a, b = os.path.join(tmp, f"l{n}.tzip"), os.path.join(tmp, f"d{n}.tzip")
        run(["compress", "-q", "-l", n, src, "-o", a], 0)
        run(["compress", "-q", "-" + n, src, "-o", b], 0)
        check(sha(a) == sha(b), f"-{n} differs from -l {n}")
        j = json.loads(run(["inspect", "--json", b], 0).stdout)
        check(all(t["level"] == int(n) for t in j["tensors"]), f"-{n}: levels {set(t['level'] for t in j['tensors'])}")
    check(sha(os.path.join(tmp, "l1.tzip")) != sha(os.path.join(tmp, "l3.tzip")), "levels 1 and 3 give the same bytes")
    one_line_error(run(["compress", "-19", src], 1), "-19", "levels")
    one_line_error(run(["compress", "-4", src], 1), "-4")
    one_line_error(run(["decompress", "-3", src], 1), "-3")
    run(["compress", "-q", "-l", "-1", src, "-o", os.path.join(tmp, "store.tzip")], 0)
    j = json.loads(run(["inspect", "--json", os.path.join(tmp, "store.tzip")], 0).stdout)
    check(all(t["level"] == -1 for t in j["tensors"]), "-l -1 is not store")
    # bundled short flags
    o = os.path.join(tmp, "b.tzip")
    p = run(["compress", "-qfT1", src, "-o", o], 0)
    check(p.stderr == "", f"-qfT1 not quiet: {p.stderr}")
    p = run(["compress", "-fq2", "-o" + o, src], 0)
    check(sha(o) == sha(os.path.join(tmp, "l2.tzip")), "-fq2 -oFILE differs from -l 2")
    p = run(["compress", "-vf", "-T", "1", src, "-o", o], 0)
    check("threads" in p.stderr, f"-vf not verbose: {p.stderr}")
    p = run(["inspect", "-qv", o], 0)  # the last one wins: verbose columns
    check("codec" in p.stdout, "-qv: inspect not verbose")
    one_line_error(run(["compress", "-qZ", src], 1), "-Z")


def case_rm(tmp):
    """-k keeps inputs (the default); --rm removes each input once its output is verified and on disk."""
    src = local_copy(tmp, "fixture-slice-fp32.safetensors")
    orig = sha(src)
    run(["compress", "-q", "-k", src], 0)
    check(os.path.exists(src), "-k removed the input")
    os.unlink(src[:-12] + ".tzip")
    p = run(["compress", "--rm", src], 0)
    z = src[:-12] + ".tzip"
    check(not os.path.exists(src) and os.path.exists(z), "compress --rm: input not removed")
    check("removed" in p.stderr, "--rm does not say what it removed")
    p = run(["decompress", "--rm", z], 0)
    check(os.path.exists(src) and sha(src) == orig and not os.path.exists(z), "decompress --rm")
    # a failure keeps the input: the output exists (no -f)
    open(z, "wb").write(b"old")
    run(["compress", "--rm", src], 4)
    check(os.path.exists(src) and open(z, "rb").read() == b"old", "failed compress --rm lost a file")
    # several inputs: all verified, then all removed
    a, b = local_copy(tmp, "fixture-slice-bf16.safetensors"), local_copy(tmp, "fixture-slice-adam-v-q.safetensors")
    out = os.path.join(tmp, "out")
    os.mkdir(out)
    run(["compress", "-q", "--rm", a, b, "-o", out], 0)
    check(not os.path.exists(a) and not os.path.exists(b), "multi-input --rm kept inputs")
    run(["verify", "-q", os.path.join(out, "fixture-slice-bf16.tzip"), os.path.join(out, "fixture-slice-adam-v-q.tzip")], 0)
    # refused combinations
    m = os.path.join(tmp, "m")
    T.make_hf_folder(m)
    one_line_error(run(["compress", "--rm", m], 1), "--rm")
    one_line_error(run(["compress", "--rm", "-c", src], 1), "--rm")
    check(os.path.isdir(m) and os.path.exists(src), "refused --rm removed something")


def case_many(tmp):
    """Several inputs for every command; one input into a folder; a folder without .tzip files is an error."""
    a, b = data("fixture-slice-bf16.safetensors"), data("fixture-slice-fp32.safetensors")
    d = os.path.join(tmp, "z")
    os.mkdir(d)
    run(["compress", "-q", a, "-o", d], 0)  # one input into an existing folder
    run(["compress", "-q", b, "-o", d + "/"], 0)
    za, zb = os.path.join(d, "fixture-slice-bf16.tzip"), os.path.join(d, "fixture-slice-fp32.tzip")
    check(os.path.isfile(za) and os.path.isfile(zb), f"one input into a folder: {os.listdir(d)}")
    p = run(["inspect", za, zb], 0)
    check(za in p.stdout and zb in p.stdout, "inspect of two files")
    j = json.loads(run(["inspect", "--json", za, zb], 0).stdout)
    check(isinstance(j, list) and len(j) == 2, "inspect --json of two files is not a list of two")
    p = run(["verify", za, zb], 0)
    check(p.stderr.count(": OK") == 2, f"verify of two files: {p.stderr}")
    bad = os.path.join(tmp, "bad.tzip")
    raw = bytearray(open(zb, "rb").read())
    raw[len(raw) // 2] ^= 1
    open(bad, "wb").write(bytes(raw))
    p = run(["verify", za, bad, zb], 2)
    check(p.stderr.count(": OK") == 2 and "bad.tzip" in p.stderr, f"verify a bad b: {p.stderr}")
    # decompress a b without -o: beside them
    run(["decompress", "-q", za, zb], 0)
    check(sha(os.path.join(d, "fixture-slice-bf16.safetensors")) == sha(a), "decompress a b: a")
    check(sha(os.path.join(d, "fixture-slice-fp32.safetensors")) == sha(b), "decompress a b: b")
    # decompress a b -o folder; a folder and a file together
    o = os.path.join(tmp, "o")
    os.mkdir(o)
    run(["decompress", "-q", za, zb, "-o", o], 0)
    check(sorted(os.listdir(o)) == ["fixture-slice-bf16.safetensors", "fixture-slice-fp32.safetensors"], "-o folder")
    m = os.path.join(tmp, "m")
    T.make_hf_folder(m)
    run(["compress", "-q", m], 0)
    o2 = os.path.join(tmp, "o2")
    os.mkdir(o2)
    run(["decompress", "-q", m + ".tzip", za, "-o", o2], 0)
    check(tree(os.path.join(o2, "m")) == tree(m), "decompress folder + file: folder")
    # rebase and bench of several
    run(["rebase", "-q", za, zb, "-o", o2], 0)
    check(os.path.isfile(os.path.join(o2, "fixture-slice-bf16.tzip")), "rebase of two files into a folder")
    p = run(["bench", "--levels", "1", "-T1", a, b], 0)
    check("2 file(s)" in p.stdout, f"bench of two files: {p.stdout[:200]}")
    # a folder without .tzip files: an error, not silence
    e = os.path.join(tmp, "empty")
    os.mkdir(e)
    open(os.path.join(e, "README"), "w").write("x")
    one_line_error(run(["inspect", e], 1), "empty", "no .tzip")
    one_line_error(run(["verify", e], 1), "empty", "no .tzip")
    one_line_error(run(["inspect", os.path.join(tmp, "missing.tzip")], 3), "missing.tzip")


def case_depends(tmp):
    """Outputs that depend on each other are named in the summary; --independent prevents it."""
    model, optim = T.checkpoint_pair(tmp)
    c1 = os.path.join(tmp, "c1")
    os.mkdir(c1)
    p = run(["compress", model, optim, "-o", c1], 0)
    check("model.tzip needs optim.tzip" in p.stderr and "--independent" in p.stderr,
          f"no dependency summary: {p.stderr}")
    c2 = os.path.join(tmp, "c2")
    os.mkdir(c2)
    p = run(["compress", "--independent", model, optim, "-o", c2], 0)
    check("needs" not in p.stderr, f"--independent still depends: {p.stderr}")
    j = json.loads(run(["inspect", "--json", os.path.join(c2, "model.tzip")], 0).stdout)
    check(j["references"] == [], f"--independent: references {j['references']}")
    os.unlink(os.path.join(c2, "optim.tzip"))
    run(["decompress", "-q", os.path.join(c2, "model.tzip"), "-o", os.path.join(tmp, "alone.safetensors")], 0)
    check(sha(model) == sha(os.path.join(tmp, "alone.safetensors")), "independent model file does not decode alone")
    # a folder compress reports it too
    f = os.path.join(tmp, "f")
    os.mkdir(f)
    shutil.copy(model, f)
    shutil.copy(optim, f)
    p = run(["compress", f], 0)
    check("needs optim.tzip" in p.stderr, f"folder: no dependency summary: {p.stderr}")
    p = run(["compress", "-q", "-f", f], 0)
    check(p.stderr == "", "-q still prints the summary")


def case_version(tmp):
    """--version: version, the SIMD path in use (TZ_SIMD forces one), CUDA availability."""
    p = run(["--version"], 0)
    lines = p.stdout.splitlines()
    check(lines and lines[0].startswith("tzip ") and "container format" in lines[0], f"version line: {lines}")
    check(any(l.startswith("CPU kernels: ") for l in lines), f"no SIMD path: {lines}")
    check(any(l.startswith("CUDA: ") for l in lines), f"no CUDA line: {lines}")
    env = dict(os.environ, TZ_SIMD="portable")
    p = run(["-V"], 0, env=env)
    check("CPU kernels: portable" in p.stdout, f"TZ_SIMD=portable not shown: {p.stdout}")


def case_bench_header(tmp):
    """The bench table's column titles are not cut ("BF16 rati")."""
    p = run(["bench", "-T1", "--levels", "1", data("fixture-slice-bf16.safetensors"),
             data("fixture-slice-fp32.safetensors")], 0)
    lines = p.stdout.splitlines()
    head = [l for l in lines if l.startswith("level")]
    check(head and "BF16 ratio" in head[0] and "F32 ratio" in head[0], f"bench header: {head}")
    row = [l for l in lines if l.startswith("1 ")]
    check(row and len(row[0].split()) == len(head[0].replace(" ratio", "_ratio").replace(" GB/s", "_GB/s").split()),
          f"bench columns: {head} {row}")
