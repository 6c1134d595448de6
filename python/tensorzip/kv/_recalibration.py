"""When KV tables stop paying: the recalibration rule shared by the vLLM offloading spec
(tensorzip.vllm.TensorZipOffloadingSpec) and the LMCache serde (tensorzip.lmcache).

Tables are calibrated on the first pages they code and then used for every page after. The data
can drift away from them (another model, another prompt mix, a long context's later layers):
every ``CHECK_PAGES`` pages coded with a set of tables, the ratio of those pages is compared with
the ratio the tables had on the pages they were calibrated from (their reference); below
``KEEP_RATIO`` times the reference, the tables are stale and the next pages calibrate new ones.
Tables loaded from a file have no reference: they are checked on the first pages they meet
against tables calibrated on those pages, and kept if they reach ``KEEP_RATIO`` times their ratio.
Pages keep the tables they were coded with (each names or carries them), so a change never
touches what is stored.
"""
from __future__ import annotations

#: Pages between two checks of a set of tables.
CHECK_PAGES = 64
#: Tables are stale when their pages' ratio falls below KEEP_RATIO x their reference ratio.
KEEP_RATIO = 0.9


def keeps_loaded(loaded_ratio: float, fresh_ratio: float) -> bool:
    """Whether tables loaded from a file are kept, given their ratio and that of tables calibrated
    on the same pages."""
    return loaded_ratio >= KEEP_RATIO * fresh_ratio


class RatioWindow:
    """The pages coded since a set of tables was taken (or last checked), and whether those tables
    are stale. A new window is stale: nothing is calibrated yet."""

    def __init__(self) -> None:
        self.reference = 0.0  # ratio of the tables on the pages they were calibrated from
        self.raw = self.coded = self.pages = 0
        self.stale = True

    def start(self, reference: float) -> None:
        """New tables (or tables kept after a check) with this reference ratio."""
        self.reference, self.stale = reference, False
        self.raw = self.coded = self.pages = 0

    def add(self, raw: int, coded: int, pages: int) -> None:
        """Pages coded with the current tables; every CHECK_PAGES pages, the check."""
        self.raw += raw
        self.coded += coded
        self.pages += pages
        if self.pages >= CHECK_PAGES:
            self.stale = self.raw / max(1, self.coded) < KEEP_RATIO * self.reference
            self.raw = self.coded = self.pages = 0
