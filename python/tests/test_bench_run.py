"""bench/run.py, the command that regenerates doc/benchmarks.md's tables: what can be checked
without running a benchmark. The marker rewriting (bench/page_tables.py) replaces exactly the
tables asked for and keeps every other byte; the one-thread codec summary adds up its data kinds
and bolds a unique best; a run with a stand-in benchmark stamps and writes the page, and a failed
one leaves it alone; the real page's markers pair up.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import page_tables  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_run", BENCH / "run.py")
bench_run = importlib.util.module_from_spec(_spec)
sys.modules["bench_run"] = bench_run  # (dataclasses look their module up)
_spec.loader.exec_module(bench_run)

PAGE = (
    "# Benchmarks\r\n"            # a CRLF line, kept as it is
    "\n"
    "Prose before, with an inline `<!-- table:codec-1t -->` that is not a marker.\n"
    "\n"
    "<!-- table:codec-1t -->\n"
    "old stamp\n"
    "\n"
    "| a | b |\n"
    "|---|---|\n"
    "| 1 | 2 |\n"
    "\n"
    "<!-- /table -->\n"
    "\n"
    "```\n"
    "    <!-- table:in-a-code-block -->\n"
    "```\n"
    "<!-- table:vllm-load -->\n"
    "| untouched | table |\n"
    "<!-- /table -->\n"
    "Trailing text without a final newline"
)


def test_one_table_replaced_everything_else_byte_identical():
    new = "\nnew stamp\n\n| x |\n|---|\n| 9 |\n\n"
    out = page_tables.replace_tables(PAGE, {"codec-1t": new}, "page.md")
    start = PAGE.index("<!-- table:codec-1t -->\n") + len("<!-- table:codec-1t -->\n")
    end = PAGE.index("<!-- /table -->\n\n```")
    assert out == PAGE[:start] + new + PAGE[end:]
    assert "| 1 | 2 |" not in out and "old stamp" not in out and "| 9 |" in out
    assert out.startswith("# Benchmarks\r\n") and out.endswith("Trailing text without a final newline")
    assert "| untouched | table |" in out
    # Rewriting again with the same content is a fixed point; both tables at once work too.
    assert page_tables.replace_tables(out, {"codec-1t": new}, "page.md") == out
    both = page_tables.replace_tables(PAGE, {"codec-1t": new, "vllm-load": "| v |"}, "page.md")
    assert "| v |\n<!-- /table -->\nTrailing" in both and "| untouched |" not in both


def test_markers_found_only_as_whole_lines():
    regions = page_tables.find_tables(PAGE, "page.md")
    assert sorted(regions) == ["codec-1t", "vllm-load"]  # not the inline one, not the indented one


@pytest.mark.parametrize("text, message", [
    ("<!-- table:a -->\nx\n", r"page.md:1: table 'a' is not closed"),
    ("<!-- table:a -->\n<!-- table:b -->\n<!-- /table -->\n", r"page.md:2: table 'b' opens inside table 'a'"),
    ("x\n<!-- /table -->\n", r"page.md:2: <!-- /table --> without a table"),
    ("<!-- table:a -->\n<!-- /table -->\n<!-- table:a -->\n<!-- /table -->\n",
     r"page.md:3: table 'a' is on the page twice"),
])
def test_bad_markers_named_with_their_line(text, message):
    with pytest.raises(page_tables.PageError, match=message):
        page_tables.find_tables(text, "page.md")


def test_a_table_missing_from_the_page_is_refused():
    with pytest.raises(page_tables.PageError, match=r"page.md: no table marker <!-- table:codec-all -->"):
        page_tables.replace_tables(PAGE, {"codec-all": "| x |\n"}, "page.md")


def _cell(codec, kind, size, comp_s, dec_s, threads=1):
    return {"codec": codec, "name": codec, "threads": threads, "kind": kind, "size": size, "comp_s": comp_s,
            "dec_s": dec_s, "reps": 1}


def test_codec_summary_adds_up_kinds_and_bolds_a_unique_best():
    kinds = {k: {"label": k, "nbytes": 1_000_000_000, "tensors": 1} for k in ("bf16w", "master", "adam_m", "adam_v")}
    cells = []
    for k in kinds:
        cells += [_cell("tz", k, 800_000_000, 1.0, 0.5), _cell("zipnn", k, 800_000_000, 2.0, 1.0),
                  _cell("zstd3", k, 900_000_000, 2.0, 1.0), _cell("tz", k, 1, 9.0, 9.0, threads=2)]
    table = bench_run.codec_summary({"kinds": kinds, "cells": cells})
    lines = table.splitlines()
    assert lines[0].startswith("| data | tensorzip ratio | comp | dec | ZipNN ratio |")
    # Equal ratios (1.250): neither in bold; speeds: tensorzip's in bold. Two-thread cells are not used.
    assert lines[2] == ("| BF16 model weights | 1.250 | **1.00** | **2.00** | 1.250 | 0.50 | 1.00 | 1.111 | 0.50 "
                        "| 1.00 |")
    # Three FP32 kinds added up: 3 GB raw, 2.4 GB coded, 3 s to compress.
    assert lines[3].startswith("| FP32 optimizer state | 1.250 | **1.00** |")
    assert lines[4].startswith("| whole checkpoint | 1.250 |")
    assert len(lines) == 5  # no MiniLM kind in this run: no MiniLM row


def test_codec_avx2_gives_the_speed_ratios_of_the_avx2_targets():
    kinds = {k: {"label": k.upper(), "nbytes": 1_000_000_000, "tensors": 1}
             for k in ("bf16w", "master", "adam_m", "adam_v", "minilm_bf16", "whole")}
    cells = []
    for k in kinds:
        cells += [_cell("tz@avx2", k, 800_000_000, 1.0, 0.25), _cell("zipnn", k, 810_000_000, 2.0, 1.0),
                  _cell("zstd3", k, 900_000_000, 2.0, 0.5), _cell("tz@avx2", k, 1, 9.0, 9.0, threads=2)]
    cells[-8] = _cell("tz@avx2", "minilm_bf16", 800_000_000, 1.0, 1.0)  # one kind decodes at ZipNN's speed
    lines = bench_run.codec_avx2({"kinds": kinds, "cells": cells}).splitlines()
    assert lines[0].startswith("| data | tensorzip ratio | comp | dec | ZipNN ratio |")
    assert lines[2] == ("| BF16W | 1.250 | 1.00 | 4.00 | 1.235 | 0.50 | 1.00 | 2.00 | 4.00x | 2.00x | 2.00x |")
    assert lines[6].startswith("| MINILM_BF16 | 1.250 | 1.00 | 1.00 | 1.235 |")
    assert lines[6].endswith("| 1.00x | 0.50x | 2.00x |")
    # Every kind of the run is a row, in the run's order (codec_bench.py's added-up "whole" kind too).
    assert lines[7].startswith("| WHOLE | 1.250 |")
    assert len(lines) == 8
    with pytest.raises(SystemExit, match="no one-thread zstd3 cell for BF16W"):
        bench_run.codec_avx2({"kinds": kinds, "cells": [c for c in cells if c["codec"] != "zstd3"]})


def test_run_with_a_stand_in_benchmark_stamps_and_rewrites(tmp_path, monkeypatch, capsys):
    page = tmp_path / "b.md"
    page.write_bytes(PAGE.encode())
    writer = ("import sys, pathlib; out = pathlib.Path(sys.argv[1]); "
              "out.write_text('| fresh | row |\\n|---|---|\\n| 3 | 4 |\\n')")
    fake = bench_run.Benchmark(
        "fake", ("codec-1t",), lambda args: [sys.executable, "-c", writer],
        lambda out: [str(out / "t.md")], lambda out, args: ({"codec-1t": (out / "t.md").read_text()}, "avx512"))
    monkeypatch.setattr(bench_run, "BENCHMARKS", [fake])
    monkeypatch.setattr(bench_run, "TABLES", ["codec-1t"])

    assert bench_run.main(["--dry-run", "--page", str(page)]) == 0
    assert "# -> codec-1t" in capsys.readouterr().out and page.read_bytes() == PAGE.encode()

    assert bench_run.main(["--page", str(page)]) == 0
    out = page.read_bytes().decode()
    start = PAGE.index("<!-- table:codec-1t -->\n") + len("<!-- table:codec-1t -->\n")
    end = PAGE.index("<!-- /table -->\n\n```")
    assert page.read_bytes().startswith(PAGE[:start].encode()) and page.read_bytes().endswith(PAGE[end:].encode())
    block = out[start:out.index("<!-- /table -->")]
    assert block.startswith("\n_Measured at commit ") and "SIMD path `avx512`" in block and "logical CPUs" in block
    assert block.endswith("\n\n| fresh | row |\n|---|---|\n| 3 | 4 |\n\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.md"]  # no temporary left

    # A benchmark that fails leaves the page as it was.
    before = page.read_bytes()
    failing = bench_run.Benchmark("fake", ("codec-1t",), lambda args: [sys.executable, "-c", "raise SystemExit(3)"],
                                  lambda out: [], fake.collect)
    monkeypatch.setattr(bench_run, "BENCHMARKS", [failing])
    with pytest.raises(SystemExit, match="exited 3; the page is unchanged"):
        bench_run.main(["--page", str(page)])
    assert page.read_bytes() == before


def test_the_benchmark_page_has_every_table():
    page = BENCH.parent / "doc" / "benchmarks.md"
    assert sorted(page_tables.find_tables(page.read_text(), str(page))) == sorted(bench_run.TABLES)


def test_kv_tables_run_with_the_lmcache_python(capsys, tmp_path):
    page = tmp_path / "b.md"
    page.write_text("<!-- table:kv-offload -->\n<!-- /table -->\n<!-- table:lmcache -->\n<!-- /table -->\n")
    assert bench_run.main(["--dry-run", "--page", str(page), "--only", "kv-offload,lmcache",
                           "--lmcache-python", "/opt/py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["/opt/py bench/kv_offload_bench.py --out OUT/kv-offload.md    # -> kv-offload",
                     "/opt/py bench/lmcache_bench.py --out OUT/lmcache.md    # -> lmcache"]
    assert bench_run.main(["--dry-run", "--quick", "--page", str(page), "--only", "lmcache"]) == 0
    assert capsys.readouterr().out.startswith("build-py/venv-lmcache/bin/python bench/lmcache_bench.py --seqs 4 "
                                              "--reps 1 --ttft-rounds 1 --out")
    page.write_text("<!-- table:kv-offload-tiled -->\n<!-- /table -->\n<!-- table:lmcache-tiled -->\n<!-- /table -->\n")
    assert bench_run.main(["--dry-run", "--page", str(page), "--only", "kv-offload-tiled,lmcache-tiled",
                           "--lmcache-python", "/opt/py"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "/opt/py bench/kv_offload_bench.py --model tiled --ttft-only --out OUT/kv-offload-tiled.md    # -> kv-offload-tiled",
        "/opt/py bench/lmcache_bench.py --model tiled --ttft-only --out OUT/lmcache-tiled.md    # -> lmcache-tiled"]


def test_a_reports_own_commit_line_is_dropped():
    report = "- Commit abc, 2026-01-01, x86_64, 2 CPUs; command: `x`.\n\nHost memory:\n\n| a |\n- Commit note\n"
    assert bench_run.without_commit_line(report) == "Host memory:\n\n| a |\n- Commit note\n"
    assert bench_run.without_commit_line("Host memory:\n") == "Host memory:\n"
