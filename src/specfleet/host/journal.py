"""The lines of a vLLM unit's journal that say why it failed.

A dying vLLM logs hundreds of lines after the error that killed it, and at every exit the
Triton bindings print nanobind's leak report ("nanobind: leaked 4 instances!", then a line
per leaked instance, type and function): none of it says anything about the failure, and
it pushes the cause out of a short tail. So the report is dropped, and the last Python
traceback is kept in front of the tail when it scrolled out of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# "nanobind: leaked 4 instances!", " - leaked type "...", " - ... skipped remainder",
# "nanobind: this is likely caused by ...", "See https://nanobind.readthedocs.io/...":
# each may carry the journal's "unit[pid]: " prefix.
_NANOBIND = re.compile(
    r"nanobind: "
    r"|^\s*(\S+\[\d+\]: )?\s*- (leaked (instance|type|function) |\.\.\. skipped remainder)"
    r"|nanobind\.readthedocs\.io"
)


def is_noise(line: str) -> bool:
    return bool(_NANOBIND.search(line))


def cause_lines(lines: Iterable[str], tail: int = 40) -> list[str]:
    """The last ``tail`` lines that are not noise, preceded by the last traceback (40 lines)
    when it is older than those."""
    kept = [line for line in lines if not is_noise(line)]
    last = kept[-tail:]
    starts = [i for i, line in enumerate(kept) if "Traceback (most recent call last)" in line]
    if not starts or starts[-1] >= len(kept) - tail:
        return last
    first = starts[-1]
    return [*kept[first : first + 40], "...", *last]
