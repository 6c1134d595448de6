"""Reading files ahead of their use: ``posix_fadvise(POSIX_FADV_WILLNEED)`` starts reads into the page
cache and returns at once, so storage reads run while the caller works on the bytes before them
(the vLLM load format's weight stream, tensorzip._vllm_weights, decodes while its files are read).
The calls run on a thread of their own: asking for pages not in the cache costs the caller their
allocation and the submission of their reads, which is then off the decoding and loading threads.

The kernel reads at most one read-ahead window per call (``max(read_ahead_kb, max_sectors_kb)`` of
the file's block device; anything past it in one call is dropped), so a range is asked for in
pieces of that size: the device's own values from sysfs where the file's device has them, else
128 KiB (Linux's default read-ahead). Only a hint: where a file cannot be opened, posix_fadvise is
missing or it fails, nothing changes but speed.
"""
from __future__ import annotations

import os
import threading
from typing import List, Optional, Tuple

__all__ = ["ReadAhead", "advise_piece"]

#: A range is asked for in calls of at least this many bytes of the sequence (fewer system calls).
ADVISE_STEP = 8 << 20
_DEFAULT_PIECE = 128 << 10
_MAX_PIECE = 64 << 20


def advise_piece(fd: int) -> int:
    """Bytes the kernel reads for one WILLNEED call on ``fd``'s file: the larger of its block
    device's read_ahead_kb and max_sectors_kb (sysfs; a partition: its disk's), else 128 KiB."""
    try:
        dev = os.fstat(fd).st_dev
    except OSError:
        return _DEFAULT_PIECE
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for queue in (base + "/queue", base + "/../queue"):
        try:
            kbs = [int(open(f"{queue}/{key}").read()) for key in ("read_ahead_kb", "max_sectors_kb")]
        except (OSError, ValueError):
            continue
        if max(kbs) > 0:
            return min(_MAX_PIECE, max(kbs) << 10)
    return _DEFAULT_PIECE


class ReadAhead:
    """Files read ahead as one sequence, in the order they are added.

    Each file comes with the stored sizes of its parts (a weight file's tensors in data order); a
    part's end in its file is estimated as the sum of the sizes up to it plus every byte of the file
    that is not in a part (header, padding), an estimate never short of the real end.
    :meth:`reached` (part k about to be read) asks for the sequence up to ``ahead`` bytes past part
    k's end, in calls of at least ADVISE_STEP bytes (each split into the kernel's pieces)."""

    def __init__(self, ahead: int):
        self._ahead = ahead
        self._spans: List[Tuple[int, int, int, int]] = []  # (fd or -1, start in the sequence, size, piece)
        self._part_end: List[int] = []  # estimated end of each part in the sequence
        self._total = 0
        self._wanted = 0  # the sequence is to be asked for up to here (reached)
        self._advised = 0  # and is asked for up to here (the thread)
        self._cv = threading.Condition()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    def add_file(self, path: str, sizes: List[int]) -> None:
        """The next file of the sequence and the stored sizes of its parts, in order (before the
        first reached)."""
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            size = os.fstat(fd).st_size
        except OSError:  # the caller's reader has the file open: only the read-ahead is lost
            size = sum(sizes)
            if fd >= 0:
                os.close(fd)
                fd = -1
        start, slack, pos = self._total, max(0, size - sum(sizes)), 0
        for n in sizes:
            pos += n
            self._part_end.append(start + min(size, pos + slack))
        self._spans.append((fd, start, size, advise_piece(fd) if fd >= 0 else 0))
        self._total += size

    def reached(self, part: int) -> None:
        """Part ``part`` (counted over all files) is about to be read: the thread asks for the
        sequence up to ``ahead`` bytes past its end."""
        target = min(self._total, self._part_end[part] + self._ahead)
        with self._cv:
            if target - self._wanted < ADVISE_STEP and target < self._total or target <= self._wanted:
                return
            self._wanted = target
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tensorzip-read-ahead", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and self._advised >= self._wanted:
                    self._cv.wait()
                if self._stop:
                    return
                lo, hi = self._advised, self._wanted
            for fd, start, size, piece in self._spans:
                a, b = max(lo, start), min(hi, start + size)
                if fd < 0 or a >= b:
                    continue
                for off in range(a - start, b - start, piece):
                    if self._stop:
                        return
                    try:
                        os.posix_fadvise(fd, off, min(piece, b - start - off), os.POSIX_FADV_WILLNEED)
                    except (OSError, AttributeError):  # a hint only
                        break
            with self._cv:
                self._advised = hi

    def close(self) -> None:
        """Stops the thread (after the call it is in) and closes the files."""
        with self._cv:
            self._stop = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        spans, self._spans = self._spans, []
        for fd, _start, _size, _piece in spans:
            if fd >= 0:
                os.close(fd)
