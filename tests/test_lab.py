"""The README's first command, on a lab of its own: up, up again (no change), down, through
the `specfleet` command line as `bin/lab` runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specfleet.paths import repo_root


def lab_inventory_with(tmp_path: Path, prefix: str, subnet: str) -> Path:
    """The lab inventory with one server of the test's own, its own network (`subnet`, the
    first three octets of a /24) and key, so a running lab is left alone."""
    lab = repo_root() / "inventory" / "lab"
    shutil.copytree(lab / "group_vars", tmp_path / "group_vars")
    hosts = (lab / "hosts.yml").read_text()
    second = "            gpu-lab-02:\n              ansible_host: 172.30.240.12\n"
    assert second in hosts and "lab_network: specfleet-lab\n" in hosts
    hosts = (
        hosts.replace(second, "")
        .replace("gpu-lab-", prefix)
        .replace("lab_network: specfleet-lab\n", f"lab_network: {prefix}net\n")
        .replace("172.30.240.", f"{subnet}.")
    )
    (tmp_path / "hosts.yml").write_text(hosts)
    return tmp_path / "hosts.yml"


def specfleet_json(*args: str, timeout: float = 1800) -> tuple[int, dict[str, Any]]:
    """Run `specfleet ARGS --json`; its exit code and its one JSON document."""
    run = subprocess.run(
        [sys.executable, "-m", "specfleet.cli", *args, "--json"],
        env={**os.environ, "SPECFLEET_ROOT": str(repo_root())},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    document: dict[str, Any] = json.loads(run.stdout)
    return run.returncode, document


def containers(prefix: str) -> list[str]:
    names = subprocess.run(
        ["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True
    ).stdout.split()
    return [name for name in names if name.startswith(prefix)]


@pytest.fixture
def lab_inventory(tmp_path: Path) -> Path:
    return lab_inventory_with(tmp_path, "test-lab-", "172.30.241")


@pytest.mark.docker
def test_lab_up_converges_then_changes_nothing(lab_inventory: Path):
    try:
        rc, first = specfleet_json("lab", "up", "-i", str(lab_inventory))
        assert rc == 0, first
        assert first["playbooks"] == ["lab.yml", "site.yml", "status.yml"]
        assert first["hosts"]["test-lab-01"]["changed"], "the first converge must change bare hosts"
        completion = first["lab"]["completion"]
        assert "error" not in completion, completion
        assert completion["draft_tokens"] > 0, "the lab's completion must be speculative"

        rc, second = specfleet_json("lab", "up", "-i", str(lab_inventory))
        assert rc == 0, second
        assert {host: n["changed"] for host, n in second["hosts"].items()} == {
            "localhost": 0,
            "test-lab-01": 0,
            "test-lab-lb": 0,
        }
    finally:
        rc, down = specfleet_json("lab", "down", "-i", str(lab_inventory))
    assert rc == 0, down
    assert not containers("test-lab-")
