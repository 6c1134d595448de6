"""Shared fixtures of the tensorzip Python tests.

The package under test is the installed one (scripts/python-test.sh runs
`pip install .` first). The CLI is $TZIP or build/programs/tzip; tests that
need it fail (not skip) when it is missing, unless TZ_PY_ALLOW_NO_CLI=1.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tensorzip

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"


def pytest_report_header(config):
    return [f"tensorzip {tensorzip.__version__} from {Path(tensorzip.__file__).parent}, "
            f"container: {tensorzip.HAVE_CONTAINER}, CUDA: {getattr(tensorzip._tensorzip, 'HAVE_CUDA', False)}"]


@pytest.fixture(scope="session")
def tzip_cli() -> str:
    cand = os.environ.get("TZIP") or str(REPO / "build" / "programs" / "tzip")
    if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
        found = shutil.which("tzip")
        if found:
            cand = found
        elif os.environ.get("TZ_PY_ALLOW_NO_CLI") == "1":
            pytest.skip("tzip CLI not built (TZ_PY_ALLOW_NO_CLI=1)")
        else:
            pytest.fail(f"tzip CLI not found at {cand}: build it (cmake --preset default && cmake --build "
                        f"--preset default) or set TZIP=/path/to/tzip")
    return cand


@pytest.fixture(scope="session")
def run_tzip(tzip_cli):
    def run(*args, check=True):
        p = subprocess.run([tzip_cli, *map(str, args)], capture_output=True, text=True, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"tzip {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p
    return run


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
