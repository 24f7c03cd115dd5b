"""plugins/filter/rollout.py: the seconds each step of a host's rollout took."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from conftest import load_plugin

rollout = load_plugin("plugins/filter/rollout.py", "specfleet_rollout_filter")


def test_each_step_lasts_until_the_next_one_starts_in_time_order() -> None:
    marks = {"done": 170.0, "build": 100.0, "restart and gate": 160.5, "drain": 150.0}
    assert rollout.step_seconds(marks) == {
        "build": 50.0,
        "drain": 10.5,
        "restart and gate": 9.5,
        "total": 70.0,
    }


def test_one_mark_is_not_a_duration() -> None:
    with pytest.raises(AnsibleFilterError, match="at least two marks"):
        rollout.step_seconds({"build": 1.0})
