"""What the engine tests (test_vllm.py, test_vllm_offload.py, test_lmcache.py) share."""
from __future__ import annotations

import importlib

import pytest


def need_module(name: str, required: bool) -> None:
    """Skips the calling test when `name` does not import; where the stage's script requires the
    engine (`required`: TZ_VLLM_REQUIRED=1, TZ_LMCACHE_REQUIRED=1), the ImportError fails it."""
    if required:
        importlib.import_module(name)
    else:
        pytest.importorskip(name)
