"""Filter ``lock_stale_reason``: why a host's lock is held by a run that is gone (""
while its owner may be alive). The rules are src/specfleet/controller/runlock.py's."""

from __future__ import annotations

from typing import Any

from specfleet.controller.runlock import stale_reason


def lock_stale_reason(found: dict[str, Any], stale_after_s: float) -> str:
    return stale_reason(found, float(stale_after_s))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"lock_stale_reason": lock_stale_reason}
