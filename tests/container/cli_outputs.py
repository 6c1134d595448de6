"""tzip output rules, temporaries and signals (doc/cli.md "Outputs", "Signals").

Cases for cli_test.py (which provides run/check/... and ARGS): an existing
folder given as -o is written into; -f replaces only a regular file or a
folder of the command's own output; outputs that are, contain or lie inside
an input are refused; /dev/null and FIFOs are written through, links and
terminals refused; mode and times carry over; SIGINT/SIGTERM at random
moments leave no temporary and an existing output untouched; kill -9 at
random moments never leaves an output that looks complete and is not, and
its leftovers are recognisable and removed by the next run.
"""
import json
import os
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time

import cli_test as T

check, run, one_line_error, sha, tree = T.check, T.run, T.one_line_error, T.sha, T.tree


def tzip():
    return T.ARGS.tzip


def temps_under(root):
    """Every temporary (hidden '.NAME.tmp-...' name) anywhere under root."""
    out = []
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            if n.startswith(".") and ".tmp-" in n:
                out.append(os.path.join(d, n))
    return out


def state(path):
    """Content and identity of a file or folder tree: replaced files get new inodes."""
    if not os.path.lexists(path):
        return None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return ("file", sha(path), st.st_ino, st.st_mtime_ns)
    out = {}
    for d, dirs, files in os.walk(path):
        for n in dirs:
            p = os.path.join(d, n)
            out[os.path.relpath(p, path)] = ("dir", os.lstat(p).st_ino)
        for n in files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, path)] = ("file", sha(p), os.lstat(p).st_ino)
    return ("dir", st.st_ino, out)


def content(path):
    """Content only (what a complete output must equal)."""
    if not os.path.lexists(path):
        return None
    if os.path.isdir(path):
        return tree(path)
    return sha(path)


def write_st(path, tensors):
    T.write_st(path, tensors)


def make_inputs(tmp):
    """A ~12 MB file of real tensors, a model folder, and their .tzip forms."""
    t = T.real_tensors()
    names = sorted(t)
    big = os.path.join(tmp, "big.safetensors")
    write_st(big, [(f"{k}.{n}",) + t[n] for k in range(6) for n in names])
    model = os.path.join(tmp, "model")
    T.make_hf_folder(model)
    run(["compress", "-q", big, "-o", os.path.join(tmp, "big.tzip")], 0)
    run(["compress", "-q", model, "-o", os.path.join(tmp, "model.tzip")], 0)
    return big, model


# ---------------------------------------------------------------------------
def case_outputs_folder(tmp):
    """An existing folder given as -o is a folder to write into, never a file to replace (issue 13)."""
    work = os.path.join(tmp, "work")
    m = os.path.join(work, "minilm")
    T.make_hf_folder(m)
    open(os.path.join(work, "notes.txt"), "w").write("my notes\n")
    before_m, before_notes = tree(m), sha(os.path.join(work, "notes.txt"))
    for force in ([], ["-f"]):
        run(["compress", "-q", m, "-o", work] + force, 0 if not force else None)
        check(tree(m) == before_m, "compress -o FOLDER touched the input folder")
        check(sha(os.path.join(work, "notes.txt")) == before_notes, "compress -o FOLDER touched a file beside")
        check(os.path.isdir(os.path.join(work, "minilm.tzip")), "compress -o FOLDER: no FOLDER/minilm.tzip")
    run(["verify", "-q", os.path.join(work, "minilm.tzip"), "--against", m], 0)
    # decompress models/m.tzip -o models/ -f: writes models/m.safetensors, keeps the rest
    models = os.path.join(tmp, "models")
    os.mkdir(models)
    src = os.path.join(T.ARGS.data, "fixture-slice-bf16.safetensors")
    z = os.path.join(models, "m.tzip")
    run(["compress", "-q", src, "-o", z], 0)
    open(os.path.join(models, "keep.txt"), "w").write("keep\n")
    zs = sha(z)
    run(["decompress", "-q", z, "-o", models + "/", "-f"], 0)
    check(sha(z) == zs and os.path.exists(os.path.join(models, "keep.txt")), "decompress -o models/ -f lost files")
    check(sha(os.path.join(models, "m.safetensors")) == sha(src), "decompress -o FOLDER: wrong output")
    # one input into an existing folder (file), several inputs into a folder
    d = os.path.join(tmp, "into")
    os.mkdir(d)
    run(["compress", "-q", src, "-o", d], 0)
    check(os.listdir(d) == ["fixture-slice-bf16.tzip"], f"one input into a folder: {os.listdir(d)}")
    # a -o that ends in '/' but is no folder: no file's name (refused, nothing created),
    # the new output folder of a folder input (as cp -r)
    one_line_error(run(["compress", src, "-o", os.path.join(tmp, "nofolder") + "/"], 3), "nofolder", "no such folder")
    check(not os.path.exists(os.path.join(tmp, "nofolder")), "created a folder for -o DIR/")
    run(["decompress", "-q", os.path.join(work, "minilm.tzip"), "-o", os.path.join(tmp, "restored") + "/"], 0)
    check(tree(os.path.join(tmp, "restored")) == before_m, "decompress FOLDER -o new/ differs")


def case_outputs_force(tmp):
    """-f replaces only what the command would itself write: a regular file, or a folder of its own output."""
    m = os.path.join(tmp, "m")
    T.make_hf_folder(m)
    z = os.path.join(tmp, "m.tzip")
    run(["compress", "-q", m], 0)
    first = tree(z)
    one_line_error(run(["compress", m], 4), "m.tzip", "already exists", "-f")
    run(["compress", "-q", "-f", m], 0)  # its own output: replaced
    check(tree(z) == first, "compress -f of the same folder differs")
    # a file the command would not write: refused even with -f, folder untouched
    open(os.path.join(z, "notes.txt"), "w").write("mine\n")
    before = state(z)
    one_line_error(run(["compress", "-f", m], 4), "m.tzip", "notes.txt", "own output")
    check(state(z) == before, "refused -f changed the folder")
    os.unlink(os.path.join(z, "notes.txt"))
    # a subfolder of the user's, a link inside: refused too
    os.mkdir(os.path.join(z, "extra"))
    one_line_error(run(["compress", "-f", m], 4), "extra")
    os.rmdir(os.path.join(z, "extra"))
    os.symlink("/etc/hostname", os.path.join(z, "config.json.link"))
    one_line_error(run(["compress", "-f", m], 4), "config.json.link")
    os.unlink(os.path.join(z, "config.json.link"))
    # fewer files than the new output (an older, partial one): replaced
    os.unlink(os.path.join(z, "tokenizer.json"))
    run(["compress", "-q", "-f", m], 0)
    check(tree(z) == first, "compress -f over a partial own output")
    # decompress -f: the restored folder replaces an own output
    r = os.path.join(tmp, "r")
    run(["decompress", "-q", z, "-o", r], 0)
    open(os.path.join(r, "config.json"), "w").write("edited\n")
    # -o r exists and holds nothing but this command's output: it is the output itself
    # (written into, it would nest a second copy r/m): replaced with -f
    run(["decompress", "-q", "-f", z, "-o", r], 0)
    check(not os.path.exists(os.path.join(r, "m")), "decompress -f into its own output nested a copy")
    check(open(os.path.join(r, "config.json")).read() != "edited\n", "decompress -f did not replace its own output")
    # a file output whose name is a folder (default name): refused, with -f too
    src = os.path.join(T.ARGS.data, "fixture-slice-fp32.safetensors")
    fz = os.path.join(tmp, "f.tzip")
    run(["compress", "-q", src, "-o", fz], 0)
    os.mkdir(os.path.join(tmp, "f.safetensors"))
    open(os.path.join(tmp, "f.safetensors", "mine"), "w").write("x")
    one_line_error(run(["decompress", "-f", fz], 1), "f.safetensors", "folder")
    check(os.listdir(os.path.join(tmp, "f.safetensors")) == ["mine"], "folder replaced by a file output")
    # a regular file: replaced with -f
    out = os.path.join(tmp, "a.tzip")
    open(out, "wb").write(b"old")
    run(["compress", "-q", "-f", src, "-o", out], 0)
    run(["verify", "-q", out, "--against", src], 0)
    check(not temps_under(tmp), f"temporaries left: {temps_under(tmp)}")


def case_outputs_inputs(tmp):
    """Outputs that are, contain or lie inside an input are refused (inodes, not strings); 'compress .'."""
    m = os.path.join(tmp, "model")
    T.make_hf_folder(m)
    before = tree(m)
    # lies inside the input folder, also through a link and through '..'
    one_line_error(run(["compress", m, "-o", os.path.join(m, "out.tzip")], 1), "inside the input")
    os.symlink(m, os.path.join(tmp, "alias"))
    one_line_error(run(["compress", m, "-o", os.path.join(tmp, "alias", "out.tzip")], 1), "inside the input")
    one_line_error(run(["compress", m, "-o", os.path.join(m, "onnx", "..", "x.tzip")], 1), "inside the input")
    check(tree(m) == before, "input folder changed")
    # is the input (a hard link to it, a link to it)
    src = os.path.join(tmp, "a.safetensors")
    shutil.copyfile(os.path.join(T.ARGS.data, "fixture-slice-fp32.safetensors"), src)
    z = os.path.join(tmp, "a.tzip")
    run(["compress", "-q", src], 0)
    os.link(z, os.path.join(tmp, "hard.safetensors"))
    one_line_error(run(["decompress", "-f", z, "-o", os.path.join(tmp, "hard.safetensors")], 1), "input")
    check(sha(z) == sha(os.path.join(tmp, "hard.safetensors")), "hard link to the input replaced")
    run(["verify", "-q", z], 0)
    # an output folder that contains the input: D/m.tzip/m compressed into D -> D/m.tzip
    d = os.path.join(tmp, "D")
    inner = os.path.join(d, "m.tzip", "m")
    T.make_hf_folder(inner)
    one_line_error(run(["compress", "-f", inner, "-o", d], 1), "contains the input")
    check(os.path.isdir(inner) and tree(inner) == tree(m), "input inside the output folder lost")
    # compress . -> ../NAME.tzip; decompress . -> ../NAME
    run(["compress", "-q", "."], 0, cwd=m)
    check(os.path.isdir(os.path.join(tmp, "model.tzip")), "compress . did not give ../model.tzip")
    check(not os.path.exists(os.path.join(m, "..tzip")) and tree(m) == before, "compress . wrote into its input")
    cp = os.path.join(tmp, "copy.tzip")
    shutil.copytree(os.path.join(tmp, "model.tzip"), cp)
    run(["decompress", "-q", "."], 0, cwd=cp)
    check(tree(os.path.join(tmp, "copy")) == before, "decompress . did not give ../copy")
    one_line_error(run(["compress", "/"], 1), "/")


def case_outputs_special(tmp):
    """/dev/null and FIFOs are written through; links (also /dev/stdout as a link to a file) and terminals refused."""
    src = os.path.join(T.ARGS.data, "fixture-slice-bf16.safetensors")
    z = os.path.join(tmp, "m.tzip")
    run(["compress", "-q", src, "-o", z], 0)
    ref = open(z, "rb").read()
    # /dev/null: written through, still a device, no -f needed
    run(["compress", "-q", src, "-o", "/dev/null"], 0)
    run(["decompress", "-q", z, "-o", "/dev/null", "-f"], 0)
    check(stat.S_ISCHR(os.stat("/dev/null").st_mode), "/dev/null is no longer a device")
    # a FIFO: written through in order, the FIFO stays a FIFO
    fifo = os.path.join(tmp, "pipe")
    os.mkfifo(fifo)
    got = {}
    def reader():
        with open(fifo, "rb") as f:
            got["b"] = f.read()
    th = threading.Thread(target=reader)
    th.start()
    run(["compress", "-q", src, "-o", fifo, "-f"], 0)
    th.join(30)
    check(got.get("b") == ref, "compress into a FIFO: bytes differ")
    check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "FIFO replaced")
    # /dev/stdout when stdout is a pipe: written through (the link is not replaced)
    p = subprocess.run([tzip(), "decompress", "-q", z, "-o", "/dev/stdout", "-f"], capture_output=True)
    check(p.returncode == 0 and p.stdout == open(src, "rb").read(), f"-o /dev/stdout into a pipe: {p.stderr}")
    check(os.path.islink("/dev/stdout") or stat.S_ISCHR(os.stat("/dev/stdout").st_mode), "/dev/stdout replaced")
    # a symbolic link to a file: neither the link nor its target replaced, with or without -f
    target = os.path.join(tmp, "target.safetensors")
    open(target, "wb").write(b"precious")
    link = os.path.join(tmp, "link.safetensors")
    os.symlink(target, link)
    for force in ([], ["-f"]):
        one_line_error(run(["decompress", z, "-o", link] + force, 1), "link.safetensors", "symbolic link")
        check(os.path.islink(link) and open(target, "rb").read() == b"precious", "link or its target replaced")
    dangling = os.path.join(tmp, "dangling.tzip")
    os.symlink(os.path.join(tmp, "nowhere"), dangling)
    one_line_error(run(["compress", "-f", src, "-o", dangling], 1), "symbolic link")
    check(os.path.islink(dangling) and not os.path.exists(os.path.join(tmp, "nowhere")), "dangling link followed")
    # stdout redirected to a file: /dev/stdout is a link to that file -> refused, use -c
    with open(os.path.join(tmp, "redirected"), "wb") as f:
        p = subprocess.run([tzip(), "decompress", z, "-o", "/dev/stdout", "-f"], stdout=f, stderr=subprocess.PIPE)
    check(p.returncode == 1 and b"symbolic link" in p.stderr, f"/dev/stdout to a file: {p.returncode} {p.stderr}")
    # a terminal: refused
    import pty
    master, slave = pty.openpty()
    try:
        one_line_error(run(["decompress", z, "-o", os.ttyname(slave), "-f"], 1), "terminal")
    finally:
        os.close(master)
        os.close(slave)
    check(not temps_under(tmp), f"temporaries left: {temps_under(tmp)}")


def case_outputs_mode(tmp):
    """Permission bits and times carry over to outputs (files, folders, back again), as zstd does."""
    src = os.path.join(tmp, "private.safetensors")
    shutil.copyfile(os.path.join(T.ARGS.data, "fixture-slice-fp32.safetensors"), src)
    os.chmod(src, 0o600)
    os.utime(src, ns=(1_600_000_000_000_000_000, 1_500_000_000_123_456_789))
    run(["compress", "-q", src], 0)
    z = src[:-12] + ".tzip"
    st = os.stat(z)
    check(stat.S_IMODE(st.st_mode) == 0o600, f"0600 input gave a {oct(stat.S_IMODE(st.st_mode))} output")
    check(st.st_mtime_ns == 1_500_000_000_123_456_789, "mtime not carried over")
    os.chmod(z, 0o640)
    out = os.path.join(tmp, "back.safetensors")
    run(["decompress", "-q", z, "-o", out], 0)
    check(stat.S_IMODE(os.stat(out).st_mode) == 0o640, "decompress: mode of the .tzip not carried over")
    check(os.stat(out).st_mtime_ns == 1_500_000_000_123_456_789, "decompress: mtime not carried over")
    # -f over a 0644 file: the output has the input's mode, not the replaced file's
    open(os.path.join(tmp, "x.tzip"), "wb").write(b"old")
    os.chmod(os.path.join(tmp, "x.tzip"), 0o644)
    run(["compress", "-q", "-f", src, "-o", os.path.join(tmp, "x.tzip")], 0)
    check(stat.S_IMODE(os.stat(os.path.join(tmp, "x.tzip")).st_mode) == 0o600, "-f output kept the old mode")
    # folders: every file and folder takes its input's mode and mtime
    m = os.path.join(tmp, "m")
    T.make_hf_folder(m)
    os.chmod(os.path.join(m, "config.json"), 0o600)
    os.chmod(os.path.join(m, "onnx"), 0o700)
    os.utime(os.path.join(m, "onnx"), ns=(1_400_000_000_000_000_000, 1_400_000_000_000_000_000))
    os.chmod(m, 0o750)
    run(["compress", "-q", m], 0)
    mz = m + ".tzip"
    check(stat.S_IMODE(os.stat(mz).st_mode) == 0o750, "folder output mode")
    check(stat.S_IMODE(os.stat(os.path.join(mz, "config.json")).st_mode) == 0o600, "copied file mode")
    check(stat.S_IMODE(os.stat(os.path.join(mz, "onnx")).st_mode) == 0o700, "subfolder mode")
    check(os.stat(os.path.join(mz, "onnx")).st_mtime_ns == 1_400_000_000_000_000_000, "subfolder mtime")
    # a file made from nothing (stdin, no input file): the usual 0666 & ~umask
    old = os.umask(0o027)
    try:
        with open(src, "rb") as f:
            p = subprocess.run([tzip(), "compress", "-q", "-", "-o", os.path.join(tmp, "s.tzip")], stdin=f,
                               capture_output=True)
    finally:
        os.umask(old)
    check(p.returncode == 0, f"compress - -o: {p.stderr}")
    check(stat.S_IMODE(os.stat(os.path.join(tmp, "s.tzip")).st_mode) in (0o640, 0o600), "stdin output mode")


# ---------------------------------------------------------------------------
# Signals and kill -9 at random moments.
class Op:
    """One command whose output already exists (so -f is needed and 'untouched' can be checked)."""

    def __init__(self, name, args, out, make_old, expect):
        self.name, self.args, self.out, self.make_old, self.expect = name, args, out, make_old, expect


def make_ops(tmp):
    big, model = make_inputs(tmp)
    bz, mz = os.path.join(tmp, "big.tzip"), os.path.join(tmp, "model.tzip")
    o = os.path.join(tmp, "out")
    os.mkdir(o)
    # A .tzip with a large header (5000 tensors): the signal also lands while it is parsed.
    many = os.path.join(tmp, "many.safetensors")
    write_st(many, [(f"t{i}", "BF16", [2], struct.pack("<2H", i & 0xFFFF, 7)) for i in range(5000)])
    manyz = os.path.join(tmp, "many.tzip")
    run(["compress", "-q", "--no-predict", many, "-o", manyz], 0)

    def old_file(path):
        def f():
            if os.path.isdir(path):
                shutil.rmtree(path)
            open(path, "wb").write(b"an older output")
        return f

    def old_folder(path, like):
        # An own output of an earlier run (same names), with other bytes.
        def f():
            if os.path.lexists(path):
                shutil.rmtree(path)
            shutil.copytree(like, path)
            for d, _, files in os.walk(path):
                for n in files:
                    open(os.path.join(d, n), "wb").write(b"older " + n.encode())
        return f

    # -o names the existing folder `out`: each output is written into it, replacing
    # (-f) an older output of the same name there.
    ops = [
        Op("compress file", ["compress", "-q", "-f", "-T1", "--chunk-mib", "1", big, "-o", o],
           o + "/big.tzip", old_file(o + "/big.tzip"), None),
        Op("decompress file", ["decompress", "-q", "-f", "-T1", bz, "-o", o],
           o + "/big.safetensors", old_file(o + "/big.safetensors"), content(big)),
        Op("compress folder", ["compress", "-q", "-f", "-T1", model, "-o", o],
           o + "/model.tzip", old_folder(o + "/model.tzip", mz), content(mz)),
        Op("decompress folder", ["decompress", "-q", "-f", "-T1", mz, "-o", o],
           o + "/model", old_folder(o + "/model", model), content(model)),
        Op("decompress large header", ["decompress", "-q", "-f", manyz, "-o", o],
           o + "/many.safetensors", old_file(o + "/many.safetensors"), content(many)),
    ]
    for op in ops:  # how long each takes, unsignalled
        op.make_old()
        t0 = time.monotonic()
        run(op.args, 0)
        op.seconds = time.monotonic() - t0
        if op.expect is None:
            op.expect = content(op.out)
        check(content(op.out) == op.expect, f"{op.name}: unsignalled output wrong")
    return ops


def signalled_run(op, sig, delay):
    op.make_old()
    before = state(op.out)
    p = subprocess.Popen([tzip()] + op.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(delay)
    t_sig = time.monotonic()
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    return p.returncode, before, time.monotonic() - t_sig, err


def signal_runs(tmp, sig, n):
    ops = make_ops(tmp)
    rng = random.Random(1234 + sig)
    outcomes = {"interrupted": 0, "finished first": 0}
    slowest = 0.0
    for i in range(n):
        op = ops[i % len(ops)]
        rc, before, took, err = signalled_run(op, sig, rng.uniform(0, op.seconds))
        slowest = max(slowest, took)
        left = temps_under(tmp)
        check(not left, f"{op.name}, signal {sig} run {i}: temporaries left: {left}")
        if rc == 0:  # done before the signal came: the new output, complete
            outcomes["finished first"] += 1
            check(content(op.out) == op.expect, f"{op.name} run {i}: finished but output wrong")
        else:
            outcomes["interrupted"] += 1
            check(rc == -sig, f"{op.name} run {i}: exit {rc}, expected death by signal {sig}; {err[-300:]!r}")
            check(state(op.out) == before, f"{op.name}, signal {sig} run {i}: existing output touched")
        check(took < 5, f"{op.name} run {i}: {took:.1f} s from the signal to the exit")
    print(f"signal {sig}: {n} runs, {outcomes}, slowest exit after the signal {slowest:.2f} s")
    check(outcomes["interrupted"] >= n // 3, f"too few runs were interrupted mid-way: {outcomes}")


def case_signal_int(tmp):
    signal_runs(tmp, signal.SIGINT, 60)


def case_signal_term(tmp):
    signal_runs(tmp, signal.SIGTERM, 60)


def case_kill9(tmp):
    """kill -9 at random moments: the output is the old one or the complete new one, never a partial one;
    leftovers are hidden '.NAME.tmp-...' names (never *.tzip / *.safetensors), removed by the next run."""
    ops = make_ops(tmp)
    rng = random.Random(99)
    seen = {"old": 0, "new": 0, "leftovers": 0}
    for i in range(60):
        op = ops[i % len(ops)]
        op.make_old()
        old = content(op.out)
        rc, _, _, _ = signalled_run(op, signal.SIGKILL, rng.uniform(0, 1.2 * op.seconds))
        now = content(op.out)
        if now == op.expect:
            seen["new"] += 1
        else:
            check(now == old, f"{op.name}, kill -9 run {i}: output neither the old one nor the complete new one")
            seen["old"] += 1
        left = temps_under(tmp)
        for t in left:
            n = os.path.basename(t)
            check(n.startswith(".") and not n.endswith(".tzip") and not n.endswith(".safetensors"),
                  f"leftover {t} could pass for an output")
        seen["leftovers"] += bool(left)
        # The next run of the same command removes what the killed one left.
        run(op.args, 0)
        check(content(op.out) == op.expect, f"{op.name}: rerun after kill -9 gave a wrong output")
        left = temps_under(tmp)
        check(not left, f"{op.name}: leftovers of the killed run not removed by the next: {left}")
    print(f"kill -9: 60 runs, {seen}")
