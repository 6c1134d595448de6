"""The generated tables of a markdown page (doc/benchmarks.md): each sits between two marker lines

    <!-- table:NAME -->
    ...
    <!-- /table -->

and bench/run.py replaces what is between them, leaving every other byte of the page as it was.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OPEN = re.compile(r"<!-- table:([A-Za-z0-9_.-]+) -->")
CLOSE = "<!-- /table -->"


class PageError(ValueError):
    """A page whose markers do not pair up, or that lacks a table asked for (the message names the
    page and the line)."""


@dataclass
class Region:
    name: str
    start: int  # offset of the first byte after the opening marker's line
    end: int    # offset of the closing marker's line


def find_tables(text: str, page: str) -> dict[str, Region]:
    """The page's tables by name. A marker is a whole line (an indented one, e.g. in a code block,
    is not); every opening marker is closed before the next one, and a name is used once."""
    regions: dict[str, Region] = {}
    current: tuple[str, int, int] | None = None  # name, content start, line number
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        body = line.rstrip("\r\n")
        opening = OPEN.fullmatch(body)
        if opening:
            if current is not None:
                raise PageError(f"{page}:{number}: table '{opening.group(1)}' opens inside table '{current[0]}' "
                                f"(opened at line {current[2]}, not closed)")
            if opening.group(1) in regions:
                raise PageError(f"{page}:{number}: table '{opening.group(1)}' is on the page twice")
            current = (opening.group(1), offset + len(line), number)
        elif body == CLOSE:
            if current is None:
                raise PageError(f"{page}:{number}: {CLOSE} without a table opened before it")
            regions[current[0]] = Region(current[0], current[1], offset)
            current = None
        offset += len(line)
    if current is not None:
        raise PageError(f"{page}:{current[2]}: table '{current[0]}' is not closed ({CLOSE})")
    return regions


def replace_tables(text: str, tables: dict[str, str], page: str) -> str:
    """The page with the content of each named table replaced by tables[name] (which ends with a
    newline; one is added otherwise). Every byte outside those tables is kept."""
    regions = find_tables(text, page)
    missing = sorted(set(tables) - set(regions))
    if missing:
        raise PageError(f"{page}: no table marker <!-- table:{missing[0]} --> (tables on the page: "
                        f"{', '.join(sorted(regions)) or 'none'})")
    out, at = [], 0
    for region in sorted((regions[n] for n in tables), key=lambda r: r.start):
        content = tables[region.name]
        out += [text[at:region.start], content if content.endswith("\n") else content + "\n"]
        at = region.end
    out.append(text[at:])
    return "".join(out)
