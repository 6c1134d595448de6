"""Nothing lost (doc/cli.md "Outputs"): cases for cli_test.py.

A file another .tzip file needs is never replaced (-f) or removed (--rm)
alone; standard input is checked as it arrives and spooled no further than
its structure declares; names from files never reach the terminal raw;
--rm refuses streams before any work; small refusals made before the work.
"""
import json
import os
import resource
import select
import shutil
import struct
import subprocess

import cli_test as T

check, run, one_line_error, sha = T.check, T.run, T.one_line_error, T.sha


def data(name):
    return os.path.join(T.ARGS.data, name)


def case_lost_refs(tmp):
    """-f never replaces a file that another .tzip in its folder records as its reference; --rm never removes it."""
    model, optim = T.checkpoint_pair(tmp)
    ck = os.path.join(tmp, "ck")
    os.mkdir(ck)
    run(["compress", "-q", model, optim, "-o", ck], 0)
    m, o = os.path.join(ck, "model.tzip"), os.path.join(ck, "optim.tzip")
    before = sha(o)
    other = os.path.join(tmp, "other.safetensors")
    T.write_st(other, [("x", "F32", [4], b"\0" * 16)])
    p = run(["compress", "-f", other, "-o", o], 4)
    one_line_error(p, o, m, "rebase")
    check(sha(o) == before, "-f replaced a file another file needs")
    run(["decompress", "-q", m, "-o", os.path.join(tmp, "m.safetensors")], 0)
    check(sha(os.path.join(tmp, "m.safetensors")) == sha(model), "the dependent file no longer decodes")
    # rebase writes to a reference too: refused the same way
    one_line_error(run(["rebase", "-f", m, "-o", o], 4), o, m)
    # replacing both together is fine: the new model.tzip needs the new optim.tzip
    run(["compress", "-q", "-f", model, optim, "-o", ck], 0)
    run(["verify", "-q", m, o], 0)
    # --rm of the reference alone: refused before any work, nothing removed or written
    out = os.path.join(tmp, "o.safetensors")
    one_line_error(run(["decompress", "--rm", o, "-o", out], 1), o, m)
    check(os.path.exists(o) and not os.path.exists(out), "decompress --rm of a needed file removed or wrote something")
    # with its dependent in the same command, both go
    r = os.path.join(tmp, "r")
    os.mkdir(r)
    run(["decompress", "-q", "--rm", o, m, "-o", r], 0)
    check(not os.path.exists(o) and not os.path.exists(m), "decompress --rm of both kept them")
    check(sha(os.path.join(r, "model.safetensors")) == sha(model), "decompress --rm of both: model differs")


def held_open_stdin(args, head, env=None, wait=20.0):
    """tzip reading `head` from a pipe that stays open: (exit status or None if still running
    after `wait` s, stderr). The pipe is closed and tzip killed if it has not exited."""
    p = subprocess.Popen([T.ARGS.tzip] + args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env)
    try:
        p.stdin.write(head)
        p.stdin.flush()
    except BrokenPipeError:
        pass
    try:
        rc = p.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        rc = None
        p.kill()
        p.wait()
    try:
        p.stdin.close()
    except BrokenPipeError:
        pass
    return rc, p.stderr.read().decode()


def case_lost_stdin(tmp):
    """Standard input is checked as it arrives: garbage is refused at once, the spool is bounded."""
    spool = os.path.join(tmp, "spool")
    os.mkdir(spool)
    env = dict(os.environ, TMPDIR=spool)
    # 16 zero bytes, the pipe held open: refused without waiting for its end
    rc, err = held_open_stdin(["compress", "-", "-o", os.path.join(tmp, "x.tzip")], b"\0" * 16, env)
    check(rc == 2, f"compress - of zeros on an open pipe: exit {rc}, stderr {err!r}")
    check("stdin" in err and "not a safetensors file" in err, f"message: {err!r}")
    rc, err = held_open_stdin(["decompress", "-", "-c"], b"\0" * 16, env)
    check(rc == 2 and "not a .tzip file" in err, f"decompress - of zeros: exit {rc}, {err!r}")
    # an endless stream: refused at its first bytes, nothing fills $TMPDIR
    for cmd in (["compress", "-", "-o", os.path.join(tmp, "y.tzip")], ["decompress", "-", "-c"]):
        with open("/dev/zero", "rb") as z:
            try:
                p = subprocess.run([T.ARGS.tzip] + cmd, stdin=z, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   env=env, timeout=30)
                check(p.returncode == 2, f"{cmd[0]} - < /dev/zero: exit {p.returncode}")
            except subprocess.TimeoutExpired:
                check(False, f"{cmd[0]} - < /dev/zero still reading after 30 s")
    check(os.listdir(spool) == [], f"spool folder not empty: {os.listdir(spool)}")
    # a valid header announcing more data than the stream holds, or less
    src = open(data("fixture-slice-bf16.safetensors"), "rb").read()
    p = subprocess.run([T.ARGS.tzip, "compress", "-", "-c"], input=src[:len(src) - 100], capture_output=True, env=env)
    check(p.returncode == 2 and b"ends after" in p.stderr, f"short stream: {p.returncode} {p.stderr!r}")
    p = subprocess.run([T.ARGS.tzip, "compress", "-", "-c"], input=src + b"extra", capture_output=True, env=env)
    check(p.returncode == 2 and b"more data than" in p.stderr, f"long stream: {p.returncode} {p.stderr!r}")
    # a huge declared header length: refused from the first 8 bytes
    rc, err = held_open_stdin(["compress", "-", "-c"], struct.pack("<Q", 1 << 40) + b"{", env)
    check(rc == 2 and "limit" in err, f"huge header length: exit {rc}, {err!r}")
    # the round trip through pipes still works, and a .tzip stream cut inside a frame is refused
    p = subprocess.run([T.ARGS.tzip, "compress", "-", "-c"], input=src, capture_output=True, env=env)
    check(p.returncode == 0, f"compress - -c: {p.returncode} {p.stderr!r}")
    z = p.stdout
    p = subprocess.run([T.ARGS.tzip, "decompress", "-", "-c"], input=z, capture_output=True, env=env)
    check(p.returncode == 0 and p.stdout == src, "pipe round trip differs")
    p = subprocess.run([T.ARGS.tzip, "decompress", "-", "-c"], input=z[:200], capture_output=True, env=env)
    check(p.returncode == 2 and b"inside the frame" in p.stderr, f"cut .tzip stream: {p.stderr!r}")
    p = subprocess.run([T.ARGS.tzip, "decompress", "-", "-c"], input=z[:64] + b"\1" + z[65:], capture_output=True,
                       env=env)
    check(p.returncode == 2, f"damaged first frame: {p.returncode}")
    check(os.listdir(spool) == [], f"spool folder not empty: {os.listdir(spool)}")


CONTROL = "lay\x1b[2Jer\n0\x7f\u009b"


def no_control(text, what):
    bad = [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
    check(not bad, f"{what}: control characters reach the terminal: {bad!r} in {text!r}")


def case_lost_escape(tmp):
    """Names and metadata from files are printed escaped; every error stays one line."""
    src = os.path.join(tmp, "c.safetensors")
    T.write_st(src, [(CONTROL, "F32", [2], b"\0" * 8)], meta={"k\x1b]0;title\x07": "v\nw"})
    z = os.path.join(tmp, "c.tzip")
    run(["compress", "-q", src, "-o", z, "--meta", "u\x1b=x\ny"], 0)
    p = run(["inspect", z], 0)
    no_control(p.stdout, "inspect")
    check("\\x1b[2J" in p.stdout, f"inspect does not show the escaped name: {p.stdout!r}")
    check(len([l for l in p.stdout.splitlines() if "lay" in l]) == 1, "a tensor's name is split over lines")
    p = run(["inspect", "--json", z], 0)
    no_control(p.stdout.replace("\n", " "), "inspect --json")
    j = json.loads(p.stdout)
    check(j["tensors"][0]["name"] == CONTROL, "inspect --json does not round-trip the name")
    # an error naming the tensor: one line, escaped
    bad = os.path.join(tmp, "bad.safetensors")
    T.write_st(bad, [], raw_header=json.dumps({CONTROL: {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode(),
               extra=b"\0" * 8)
    p = run(["compress", bad, "-o", os.path.join(tmp, "bad.tzip")], 2)
    one_line_error(p, "bad.safetensors", "\\x1b[2J")
    no_control(p.stderr, "error message")
    # a file name with a newline: one line
    weird = os.path.join(tmp, "a\nb\x1b[31m.safetensors")
    shutil.copyfile(bad, weird)
    p = run(["compress", weird], 2)
    one_line_error(p, "a\\x0ab\\x1b[31m.safetensors")
    no_control(p.stderr, "error naming a file")


def case_lost_rm_stream(tmp):
    """--rm with an output that is not a file is refused before any work."""
    src = os.path.join(tmp, "a.safetensors")
    shutil.copyfile(data("fixture-slice-bf16.safetensors"), src)
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that a writer would not block
    try:
        try:  # a tzip that wrote into the FIFO would block once its buffer is full: bounded wait
            p = subprocess.run([T.ARGS.tzip, "compress", "--rm", src, "-o", fifo], capture_output=True, text=True,
                               timeout=60)
            check(p.returncode == 1, f"compress --rm -o FIFO: exit {p.returncode}")
            one_line_error(p, "--rm", fifo)
        except subprocess.TimeoutExpired:
            check(False, "compress --rm -o FIFO wrote into the FIFO (blocked on its full buffer)")
        r, _, _ = select.select([rfd], [], [], 0)
        got = os.read(rfd, 1 << 16) if r else b""
        check(got == b"", f"the FIFO's reader got {len(got)} bytes from a refused --rm")
    finally:
        os.close(rfd)
    one_line_error(run(["compress", "--rm", src, "-o", "/dev/null"], 1), "--rm", "/dev/null")
    check(os.path.exists(src), "refused --rm removed the input")
    z = os.path.join(tmp, "a.tzip")
    run(["compress", "-q", src, "-o", z], 0)
    one_line_error(run(["decompress", "--rm", z, "-o", "/dev/null"], 1), "--rm")
    check(os.path.exists(z), "refused decompress --rm removed the input")


def big_header_file(path, n_tensors, name_len):
    """A valid safetensors file whose header is nearly 100 MiB: long names, 4-byte tensors."""
    h, off = {}, 0
    for i in range(n_tensors):
        h[f"{i:08d}" + "n" * (name_len - 8)] = {"dtype": "F32", "shape": [1], "data_offsets": [off, off + 4]}
        off += 4
    hb = json.dumps(h, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"\1\0\0\0" * n_tensors)
    return len(hb)


def case_lost_small(tmp):
    """-o ""; the disk-full message of several outputs; offsets' messages; an oversized table refused
    before the work; a folder compressed twice into its own output."""
    src = data("fixture-slice-bf16.safetensors")
    one_line_error(run(["compress", src, "-o", ""], 1), "-o", "empty")
    one_line_error(run(["verify", src, "--against", ""], 1), "--against", "empty")
    # disk full with several outputs: the output is named, not its hidden temporary
    a = os.path.join(tmp, "a.safetensors")
    b = os.path.join(tmp, "b.safetensors")
    shutil.copyfile(data("fixture-slice-bf16.safetensors"), a)
    shutil.copyfile(data("fixture-slice-fp32.safetensors"), b)
    out = os.path.join(tmp, "out")
    os.mkdir(out)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    p = run(["compress", a, b, "-o", out], 3, preexec=limit)
    one_line_error(p, "write failed")
    check(".tmp-" not in p.stderr and "out/" in p.stderr, f"disk-full message names a temporary: {p.stderr!r}")
    check(os.listdir(out) == [], f"disk full left files: {os.listdir(out)}")
    # offsets: what is wrong with them, said as it is
    for offsets, words in (([0, 2**64 + 8], "larger than 2^64 - 1"), ([0, -8], "negative"), ([0, 8.5], "not an integer"),
                           ([0, 2**64 - 8], "out of range")):
        f = os.path.join(tmp, "off.safetensors")
        T.write_st(f, [], raw_header=('{"t":{"dtype":"F32","shape":[2],"data_offsets":[%s,%s]}}' % tuple(offsets)).encode(),
                   extra=b"\0" * 8)
        one_line_error(run(["compress", "-f", f, "-o", os.path.join(tmp, "off.tzip")], 2), "off.safetensors", words)
    # a header of nearly 100 MiB: refused before any frame is written (with a 1 MiB file size
    # limit, a refusal after the work would be a write failure instead)
    big = os.path.join(tmp, "big.safetensors")
    hl = big_header_file(big, 46_000, 2_150)
    check(90 << 20 < hl < 100 << 20, f"test file's header is {hl} bytes")

    def limit_1m():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    p = run(["compress", big, "-o", os.path.join(tmp, "big.tzip")], 2, preexec=limit_1m)
    one_line_error(p, "big.safetensors", "too large for a .tzip header")
    check(not os.path.exists(os.path.join(tmp, "big.tzip")), "oversized header: output left")
    os.unlink(big)


def case_lost_own_output(tmp):
    """A folder compressed (or restored) twice to the same -o: the second run is refused, not nested."""
    m = os.path.join(tmp, "model")
    T.make_hf_folder(m)
    z = os.path.join(tmp, "model.tzip")
    run(["compress", "-q", m, "-o", z], 0)
    first = T.tree(z)
    one_line_error(run(["compress", m, "-o", z], 4), z, "already exists", "-f")
    check(T.tree(z) == first, f"second compress changed the output: {sorted(T.tree(z))}")
    run(["compress", "-q", "-f", m, "-o", z], 0)
    check(sorted(T.tree(z)) == sorted(first), f"compress -f nested or changed the output: {sorted(T.tree(z))}")
    back = os.path.join(tmp, "back")
    run(["decompress", "-q", z, "-o", back], 0)
    one_line_error(run(["decompress", z, "-o", back], 4), back, "already exists")
    check(T.tree(back) == T.tree(m), "second decompress changed the output")
    # a folder that holds other things is still a folder to write into
    into = os.path.join(tmp, "into")
    os.mkdir(into)
    open(os.path.join(into, "notes.txt"), "w").write("mine")
    run(["compress", "-q", m, "-o", into], 0)
    check(os.path.isdir(os.path.join(into, "model.tzip")), f"-o folder with other files: {os.listdir(into)}")
