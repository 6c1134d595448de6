#!/usr/bin/env python3
"""Regenerates the tables of doc/benchmarks.md: runs the benchmark behind each table and rewrites
the table in place, between its marker lines (`<!-- table:NAME -->` ... `<!-- /table -->`,
bench/page_tables.py), above it a line that says where and how it was measured: the commit, the
date, the machine (CPU model, family/model, logical CPUs, the SIMD path tensorzip ran) and the
benchmark's command. Everything else on the page stays as it was.

    python3 bench/run.py                      # every table (the codec tables ~5 min; vllm-load needs root)
    python3 bench/run.py --only codec-1t,codec-all
    python3 bench/run.py --quick --page /tmp/b.md   # smoke run: small data, into a copy of the page
    python3 bench/run.py --dry-run            # the commands only

Tables: codec-1t and codec-all (bench/codec_bench.py), codec-avx2 (bench/codec_bench.py with
tensorzip on its AVX2 kernels, beside ZipNN and zstd -3: the table of an AVX2-only CPU), vllm-load
(bench/vllm_load_bench.py, root, a Python with vLLM's CPU build: --vllm-python, default build-py/venv-vllm/bin/python as
scripts/vllm-test.sh makes it), kv-offload (bench/kv_offload_bench.py) and lmcache
(bench/lmcache_bench.py), both with a Python that has vLLM's CPU build and LMCache: --lmcache-python,
default build-py/venv-lmcache/bin/python as scripts/lmcache-test.sh makes it), and their
time-to-first-token rows again with the 1.21 GB tiled GPT-2 of bench/gpt2_models.py
(kv-offload-tiled, lmcache-tiled). A benchmark runs once for all of its tables that are asked for.
If a benchmark fails, the page is not touched.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from codec_report import gbps  # noqa: E402
from machine import REPO, cpu_family_model, cpu_model, git_state  # noqa: E402
from page_tables import PageError, find_tables, replace_tables  # noqa: E402

DEFAULT_PAGE = REPO / "doc" / "benchmarks.md"
DEFAULT_VLLM_PYTHON = Path("build-py/venv-vllm/bin/python")  # relative to the repository (commands run there)
DEFAULT_LMCACHE_PYTHON = Path("build-py/venv-lmcache/bin/python")  # vLLM's CPU build and LMCache


# ---- the one-thread summary of the codec benchmark ----

# (row label, codec_bench data kinds it adds up)
SUMMARY_ROWS = [("BF16 model weights", ["bf16w"]),
                ("FP32 optimizer state", ["master", "adam_m", "adam_v"]),
                ("whole checkpoint", ["bf16w", "master", "adam_m", "adam_v"]),
                ("MiniLM FP32", ["minilm_f32"])]
SUMMARY_CODECS = [("tensorzip", "tz"), ("ZipNN", "zipnn"), ("zstd -3", "zstd3")]


def _bold_unique_best(values: list[str]) -> list[str]:
    """The largest of these numbers in bold, where exactly one value (as printed) is the largest."""
    nums = [float(v) if v not in ("—", "") else None for v in values]
    present = [n for n in nums if n is not None]
    if not present or nums.count(max(present)) != 1:
        return values
    best = max(present)
    return [f"**{v}**" if n == best else v for v, n in zip(values, nums)]


def _one_thread_sums(run: dict, key: str, kinds: list[str]) -> tuple[int, int, float, float] | None:
    """(raw bytes, coded bytes, compress s, decompress s) of codec ``key``'s one-thread cells of
    these data kinds added up; None when one is missing."""
    cells = {(c["codec"], c["threads"], c["kind"]): c for c in run["cells"]}
    parts = [cells.get((key, 1, k)) for k in kinds]
    if any(p is None for p in parts):
        return None
    return (sum(run["kinds"][k]["nbytes"] for k in kinds), sum(p["size"] for p in parts),
            sum(p["comp_s"] for p in parts), sum(p["dec_s"] for p in parts))


def codec_summary(run: dict) -> str:
    """Ratio and one-thread compress / decompress GB/s of tensorzip, ZipNN and zstd -3 per summary
    row (sizes and median times of the row's data kinds added up); the best of each in bold."""
    head = "| data | " + " | ".join(f"{name} ratio | comp | dec" for name, _ in SUMMARY_CODECS) + " |"
    lines = [head, "|---|" + "---:|" * (3 * len(SUMMARY_CODECS))]
    for label, kinds in SUMMARY_ROWS:
        if not all(k in run["kinds"] for k in kinds):
            continue  # a run of fewer kinds (--quick, --kinds)
        ratio, comp, dec = [], [], []
        for _, key in SUMMARY_CODECS:
            sums = _one_thread_sums(run, key, kinds)
            if sums is None:
                for column in (ratio, comp, dec):
                    column.append("—")
                continue
            raw, size, comp_s, dec_s = sums
            ratio.append(f"{raw / size:.3f}")
            comp.append(gbps(raw, comp_s))
            dec.append(gbps(raw, dec_s))
        columns = list(zip(_bold_unique_best(ratio), _bold_unique_best(comp), _bold_unique_best(dec)))
        lines.append(f"| {label} | " + " | ".join(" | ".join(c) for c in columns) + " |")
    if len(lines) == 2:
        raise SystemExit("bench/run.py: codec-1t: the run has none of the summary's data kinds")
    return "\n".join(lines) + "\n"


def codec_all(run: dict) -> str:
    return run["table"].rstrip("\n") + "\n\n" + "".join(f"- {n}\n" for n in run["notes"])


def codec_avx2(run: dict) -> str:
    """tensorzip on the AVX2 kernels beside ZipNN and zstd -3, one thread, every data kind of the run
    (the whole checkpoint among them where codec_bench.py added it up): GB/s and the ratios of speed
    the AVX2 targets are stated in."""
    lines = ["| data | tensorzip ratio | comp | dec | ZipNN ratio | comp | dec | zstd -3 dec "
             "| dec vs ZipNN | dec vs zstd -3 | comp vs ZipNN |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, info in run["kinds"].items():
        got = {}
        for key in ("tz@avx2", "zipnn", "zstd3"):
            got[key] = _one_thread_sums(run, key, [kind])
            if got[key] is None:
                raise SystemExit(f"bench/run.py: codec-avx2: no one-thread {key} cell for {info['label']}")
        (raw, tz_size, tz_c, tz_d), (_, zn_size, zn_c, zn_d), (_, _, _, zs_d) = got.values()
        lines.append(f"| {info['label']} | {raw / tz_size:.3f} | {gbps(raw, tz_c)} | {gbps(raw, tz_d)} "
                     f"| {raw / zn_size:.3f} | {gbps(raw, zn_c)} | {gbps(raw, zn_d)} | {gbps(raw, zs_d)} "
                     f"| {zn_d / tz_d:.2f}x | {zs_d / tz_d:.2f}x | {zn_c / tz_c:.2f}x |")
    return "\n".join(lines) + "\n"


# ---- the benchmarks ----

@dataclass
class Benchmark:
    name: str
    tables: tuple[str, ...]
    command: Callable[[argparse.Namespace], list[str]]           # as the page shows it
    output: Callable[[Path], list[str]]                           # options that write the results under a folder
    collect: Callable[[Path, argparse.Namespace], tuple[dict[str, str], str]]  # -> ({table: markdown}, SIMD path)


def _codec_command(args) -> list[str]:
    return ["python3", "bench/codec_bench.py", "--warm-heap"] + (["--quick"] if args.quick else [])


def _codec_collect(out: Path, args) -> tuple[dict[str, str], str]:
    run = json.loads((out / "codec.json").read_text())
    return {"codec-1t": codec_summary(run), "codec-all": codec_all(run)}, run["simd_path"]


def _codec_avx2_command(args) -> list[str]:
    return (["python3", "bench/codec_bench.py", "--warm-heap", "--threads", "1", "--simd", "avx2",
             "--codecs", "tz,zipnn,zstd3"] + (["--quick"] if args.quick else []))


def _codec_avx2_collect(out: Path, args) -> tuple[dict[str, str], str]:
    run = json.loads((out / "codec.json").read_text())
    return {"codec-avx2": codec_avx2(run)}, "avx2"


def _vllm_command(args) -> list[str]:
    cmd = [str(args.vllm_python), "bench/vllm_load_bench.py", "--tzip", "build/programs/tzip"]
    cmd += ["--rounds", "1", "--bandwidths", "1e9"] if args.quick else ["--rounds", "3"]  # medians of 3
    return cmd if os.geteuid() == 0 else ["sudo"] + cmd


def _simd_path_of(python: Path) -> str:
    """The SIMD path the tensorzip that this Python imports runs."""
    return subprocess.run([str(python), "-c", "import tensorzip._tensorzip as C; print(C.simd_path())"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def _vllm_collect(out: Path, args) -> tuple[dict[str, str], str]:
    return {"vllm-load": (out / "vllm-load.md").read_text()}, _simd_path_of(args.vllm_python)


def _kv_offload_command(args) -> list[str]:
    return [str(args.lmcache_python), "bench/kv_offload_bench.py"] + (["--reps", "1"] if args.quick else [])


def without_commit_line(report: str) -> str:
    """A report without the "- Commit ..." line it starts with (the stamp above the table says it)."""
    first, _, rest = report.partition("\n")
    return rest.lstrip("\n") if first.startswith("- Commit ") else report


def _kv_offload_collect(out: Path, args) -> tuple[dict[str, str], str]:
    return ({"kv-offload": without_commit_line((out / "kv-offload.md").read_text())},
            _simd_path_of(args.lmcache_python))


def _lmcache_command(args) -> list[str]:
    quick = ["--seqs", "4", "--reps", "1", "--ttft-rounds", "1"] if args.quick else []
    return [str(args.lmcache_python), "bench/lmcache_bench.py"] + quick


def _lmcache_collect(out: Path, args) -> tuple[dict[str, str], str]:
    return {"lmcache": (out / "lmcache.md").read_text()}, _simd_path_of(args.lmcache_python)


def _kv_offload_tiled_command(args) -> list[str]:
    return [str(args.lmcache_python), "bench/kv_offload_bench.py", "--model", "tiled", "--ttft-only"] + \
        (["--reps", "1"] if args.quick else [])


def _kv_offload_tiled_collect(out: Path, args) -> tuple[dict[str, str], str]:
    return ({"kv-offload-tiled": without_commit_line((out / "kv-offload-tiled.md").read_text())},
            _simd_path_of(args.lmcache_python))


def _lmcache_tiled_command(args) -> list[str]:
    return [str(args.lmcache_python), "bench/lmcache_bench.py", "--model", "tiled", "--ttft-only"] + \
        (["--ttft-rounds", "1"] if args.quick else [])


def _lmcache_tiled_collect(out: Path, args) -> tuple[dict[str, str], str]:
    return {"lmcache-tiled": (out / "lmcache-tiled.md").read_text()}, _simd_path_of(args.lmcache_python)


BENCHMARKS = [
    Benchmark("codec", ("codec-1t", "codec-all"), _codec_command, lambda out: ["--json", str(out / "codec.json")],
              _codec_collect),
    Benchmark("codec-avx2", ("codec-avx2",), _codec_avx2_command, lambda out: ["--json", str(out / "codec.json")],
              _codec_avx2_collect),
    Benchmark("vllm-load", ("vllm-load",), _vllm_command, lambda out: ["--out", str(out / "vllm-load.md")],
              _vllm_collect),
    Benchmark("kv-offload", ("kv-offload",), _kv_offload_command, lambda out: ["--out", str(out / "kv-offload.md")],
              _kv_offload_collect),
    Benchmark("lmcache", ("lmcache",), _lmcache_command, lambda out: ["--out", str(out / "lmcache.md")],
              _lmcache_collect),
    Benchmark("kv-offload-tiled", ("kv-offload-tiled",), _kv_offload_tiled_command,
              lambda out: ["--out", str(out / "kv-offload-tiled.md")], _kv_offload_tiled_collect),
    Benchmark("lmcache-tiled", ("lmcache-tiled",), _lmcache_tiled_command,
              lambda out: ["--out", str(out / "lmcache-tiled.md")], _lmcache_tiled_collect),
]
TABLES = [t for b in BENCHMARKS for t in b.tables]


def stamp(command: list[str], simd: str) -> str:
    """Where and how a table was measured (the line above it)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    family = cpu_family_model()
    cpu = cpu_model() + (f" ({family})" if family else "")
    return (f"_Measured at commit {git_state()}, {now}, on {cpu}, {os.cpu_count()} logical CPUs, SIMD path "
            f"`{simd}`; command: `{shlex.join(command)}`._")


def table_block(stamp_line: str, table: str) -> str:
    """What stands between a table's markers: blank line, stamp, blank line, table, blank line."""
    return f"\n{stamp_line}\n\n{table.rstrip(chr(10))}\n\n"


def run_benchmark(bench: Benchmark, args, wanted: list[str]) -> dict[str, str]:
    """Runs one benchmark; its tables that are asked for, stamped."""
    command = bench.command(args)
    with tempfile.TemporaryDirectory(prefix=f"tz-bench-{bench.name}-") as tmp:
        full = command + bench.output(Path(tmp))
        print(f"bench/run.py: {bench.name}: {shlex.join(full)}", file=sys.stderr, flush=True)
        done = subprocess.run(full, cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(f"bench/run.py: {bench.name}: `{shlex.join(full)}` exited {done.returncode}; "
                             f"the page is unchanged")
        tables, simd = bench.collect(Path(tmp), args)
    line = stamp(command, simd)
    return {name: table_block(line, tables[name]) for name in bench.tables if name in wanted}


def read_page(page: Path) -> str:
    """The page as it is, line ends included (no newline translation)."""
    return page.read_bytes().decode("utf-8")


def write_page(page: Path, text: str) -> None:
    """Writes the page through a temporary beside it (created exclusively under a random name, so
    nothing already there is written through), renamed over it in one step."""
    fd, tmp = tempfile.mkstemp(prefix=f".{page.name}.tmp-", dir=page.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, page)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma list of tables: " + ",".join(TABLES) + " (default: all)")
    ap.add_argument("--quick", action="store_true", help="smoke run: small data, few repetitions")
    ap.add_argument("--dry-run", action="store_true", help="print the commands; run nothing, write nothing")
    ap.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="the page to rewrite (default doc/benchmarks.md)")
    ap.add_argument("--vllm-python", type=Path, default=DEFAULT_VLLM_PYTHON,
                    help="a Python with vLLM's CPU build and tensorzip (vllm-load)")
    ap.add_argument("--lmcache-python", type=Path, default=DEFAULT_LMCACHE_PYTHON,
                    help="a Python with vLLM's CPU build, LMCache and tensorzip (kv-offload, lmcache)")
    args = ap.parse_args(argv)
    args.wanted = args.only.split(",") if args.only else list(TABLES)
    for name in args.wanted:
        if name not in TABLES:
            ap.error(f"unknown table {name!r} (tables: {', '.join(TABLES)})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    page = args.page.resolve()
    try:
        text = read_page(page)
        on_page = find_tables(text, str(args.page))
    except (OSError, PageError) as e:
        raise SystemExit(f"bench/run.py: {e}")
    absent = [n for n in args.wanted if n not in on_page]
    if absent:
        raise SystemExit(f"bench/run.py: {args.page}: no table marker <!-- table:{absent[0]} -->")
    benches = [b for b in BENCHMARKS if any(t in args.wanted for t in b.tables)]
    if args.dry_run:
        for b in benches:
            tables = ", ".join(t for t in b.tables if t in args.wanted)
            print(f"{shlex.join(b.command(args) + b.output(Path('OUT')))}    # -> {tables}")
        return 0
    new: dict[str, str] = {}
    for b in benches:
        new.update(run_benchmark(b, args, args.wanted))
    try:
        write_page(page, replace_tables(read_page(page), new, str(args.page)))
    except PageError as e:  # the page changed meanwhile
        raise SystemExit(f"bench/run.py: {e}")
    print(f"bench/run.py: rewrote {', '.join(new)} in {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
