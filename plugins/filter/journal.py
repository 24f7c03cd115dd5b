"""Filter ``journal_cause``: the lines of a unit's journal that say why it failed, without
vLLM's exit noise (src/specfleet/host/journal.py)."""

from __future__ import annotations

from typing import Any

from specfleet.host.journal import cause_lines


def journal_cause(lines: list[str], tail: int = 40) -> list[str]:
    return cause_lines(lines, tail)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"journal_cause": journal_cause}
