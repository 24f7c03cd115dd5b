"""Jinja2 filter ``step_seconds``: how long each step of a host's rollout took.

playbooks/upgrade.yml notes the time each step starts (build, drain, stop, switch,
restart and gate, enable) and when the host is done; this turns those marks into the
seconds each step took, in the order they ran, and their total.

Example::

    {{ {'build': 100.0, 'drain': 160.5, 'done': 170.0} | step_seconds }}
    -> {'build': 60.5, 'drain': 9.5, 'total': 70.0}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise

from ansible.errors import AnsibleFilterError


def step_seconds(marks: Mapping[str, float]) -> dict[str, float]:
    """Seconds from each mark to the next one; the last mark only ends the one before it."""
    if len(marks) < 2:
        raise AnsibleFilterError(f"step_seconds needs at least two marks, got {dict(marks)}")
    ordered = sorted(marks.items(), key=lambda item: float(item[1]))
    seconds = {
        step: round(float(ended) - float(started), 1)
        for (step, started), (_, ended) in pairwise(ordered)
    }
    seconds["total"] = round(float(ordered[-1][1]) - float(ordered[0][1]), 1)
    return seconds


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., dict[str, float]]]:
        return {"step_seconds": step_seconds}
