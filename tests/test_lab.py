"""The README's first command, on a lab of its own: up, up again (no change), down."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from specfleet.lab import lab_down, lab_up
from specfleet.paths import repo_root


@pytest.fixture
def lab_inventory(tmp_path: Path) -> Path:
    """The lab inventory with one host of the test's own, so a running lab is left alone."""
    lab = repo_root() / "inventory" / "lab"
    shutil.copytree(lab / "group_vars", tmp_path / "group_vars")
    hosts = (lab / "hosts.yml").read_text()
    assert "        gpu-lab-02:\n" in hosts
    hosts = hosts.replace("        gpu-lab-02:\n", "").replace("gpu-lab-", "test-lab-")
    (tmp_path / "hosts.yml").write_text(hosts)
    return tmp_path / "hosts.yml"


@pytest.mark.docker
def test_lab_up_converges_then_changes_nothing(lab_inventory: Path):
    try:
        first = lab_up(lab_inventory)
        assert all(r.ok for r in first), first
        assert [r.playbook for r in first] == ["lab.yml", "site.yml"]
        assert first[1].changed, "the first converge of bare hosts must change them"

        second = lab_up(lab_inventory)
        assert all(r.ok for r in second), second
        assert [r.total_changed for r in second] == [0, 0], second
    finally:
        down = lab_down(lab_inventory)
    assert all(r.ok for r in down)
    names = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [n for n in names if n.startswith("test-lab-")]
