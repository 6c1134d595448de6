"""What a benchmark report says about where it ran: the CPU (model, family/model, SIMD flags),
and the git commit of the tree. Shared by bench/codec_bench.py and bench/run.py.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_family_model() -> str:
    """"family F, model M" of an x86 CPU (from /proc/cpuinfo); "" where it does not say."""
    fields: dict[str, str] = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if not line.strip():
                break  # the first CPU's block only
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    if "cpu family" in fields and "model" in fields:
        return f"family {fields['cpu family']}, model {fields['model']}"
    return ""


def cpu_simd_flags() -> str:
    want = ("sse4_2", "avx", "avx2", "bmi2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vbmi2",
            "asimd", "sve")
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in want if f in have) or "none of " + " ".join(want)
    except OSError:
        pass
    return "unknown"


def git_state() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + (" + uncommitted changes" if dirty else "")
    except Exception:
        return "unknown"


def load_average() -> list[str]:
    """The 1, 5 and 15 minute load averages ("?" where /proc/loadavg is missing)."""
    return open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"] * 3
