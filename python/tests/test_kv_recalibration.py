"""The recalibration rule of KV tables (tensorzip.kv._recalibration), shared by the vLLM offloading
spec and the LMCache serde: when a window of pages marks tables stale, and when loaded tables are
kept. The engines' own tests (test_vllm_offload.py, test_lmcache.py) check it on real KV."""
from __future__ import annotations

import pytest

pytest.importorskip("tensorzip._tensorzip")
from tensorzip.kv._recalibration import CHECK_PAGES, KEEP_RATIO, RatioWindow, keeps_loaded  # noqa: E402


def test_a_new_window_is_stale_until_tables_start():
    w = RatioWindow()
    assert w.stale
    w.start(1.5)
    assert not w.stale and w.reference == 1.5


def test_checked_every_check_pages_pages():
    w = RatioWindow()
    w.start(1.5)
    # Pages at 1.0x (far below 0.9 x 1.5): nothing is decided before CHECK_PAGES of them.
    for _ in range(CHECK_PAGES - 1):
        w.add(1000, 1000, 1)
    assert not w.stale
    w.add(1000, 1000, 1)
    assert w.stale
    # A window at exactly KEEP_RATIO x the reference keeps the tables; just below, it does not.
    w.start(2.0)
    w.add(int(1000 * 2.0 * KEEP_RATIO), 1000, CHECK_PAGES)
    assert not w.stale
    w.add(int(1000 * 2.0 * KEEP_RATIO) - 1, 1000, CHECK_PAGES)
    assert w.stale


def test_each_window_judged_on_its_own_pages():
    w = RatioWindow()
    w.start(1.5)
    w.add(100, 1000, CHECK_PAGES)  # a bad window
    assert w.stale
    w.start(1.5)                   # new tables: the counts start again
    w.add(1500, 1000, CHECK_PAGES)
    assert not w.stale


def test_loaded_tables_kept_within_keep_ratio_of_fresh_ones():
    assert keeps_loaded(1.5, 1.5)
    assert keeps_loaded(KEEP_RATIO * 1.6, 1.6)
    assert not keeps_loaded(KEEP_RATIO * 1.6 - 1e-9, 1.6)
