"""Helpers for the tests that bring up a lab of their own (tests/test_cli_lab.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from specfleet.controller.paths import repo_root

# The lab's second stack (the lab serves locks/cpu.txt): the fleet's upgrade tests switch to
# it and back, and the shared lab (conftest.cli_lab) mounts its wheelhouse.
LAB_PREVIOUS_STACK = "cpu-vllm-0.31"

# The tests' lab has two servers, and every run tests the fleet's upgrades on it
# (tests/test_fleet_upgrade.py, and a rolling upgrade under load through a restarted balancer in
# tests/test_fleet_faults.py). Four of the rollout's faults and the model's rollouts run on
# request (SPECFLEET_FLEET=1): with them CI is beyond its hour on two cores (README, "Running
# tests").
FLEET_ASKED = os.environ.get("SPECFLEET_FLEET") == "1"
FLEET_ON_REQUEST = "on request (SPECFLEET_FLEET=1): beyond CI's hour on two cores"


def lab_inventory_with(
    tmp_path: Path, prefix: str, subnet: str, servers: int = 1, monitoring: bool = True
) -> Path:
    """The lab inventory with one server (or two) of the test's own, its own network
    (`subnet`, the first three octets of a /24) and key, so a running lab is left alone;
    with the lab's Prometheus host unless ``monitoring`` is false (a lab whose tests do not
    read it need not install it)."""
    lab = repo_root() / "inventory" / "lab"
    shutil.copytree(lab / "group_vars", tmp_path / "group_vars")
    hosts = (lab / "hosts.yml").read_text()
    second = "            gpu-lab-02:\n              ansible_host: 172.30.240.12\n"
    prometheus = hosts[hosts.index("        # Prometheus over") : hosts.index("    gpu_hosts:")]
    assert second in hosts and "lab_network: specfleet-lab\n" in hosts
    hosts = (
        hosts.replace(second, "" if servers == 1 else second)
        .replace(prometheus, prometheus if monitoring else "")
        .replace("gpu-lab-", prefix)
        .replace("lab_network: specfleet-lab\n", f"lab_network: {prefix}net\n")
        .replace("172.30.240.", f"{subnet}.")
    )
    (tmp_path / "hosts.yml").write_text(hosts)
    return tmp_path / "hosts.yml"


def specfleet_json(*args: str, timeout: float = 1800) -> tuple[int, dict[str, Any]]:
    """Run `specfleet ARGS --json`; its exit code and its one JSON document."""
    run = subprocess.run(
        [sys.executable, "-m", "specfleet.controller.cli", *args, "--json"],
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


def remove_stale_containers(prefix: str) -> list[str]:
    """Remove the containers an earlier, interrupted run of the tests left under their own
    prefix (a lab not brought down): `lab up` would adopt those its inventory names, and one
    it does not name (a second server) would serve beside the tests, taking a core, and
    outlive their `lab down`. The names removed, so the run can say so."""
    stale = containers(prefix)
    if stale:
        subprocess.run(["docker", "rm", "-f", *stale], capture_output=True, check=True)
    return stale


class LabUnderTest:
    """A running lab as the tests see it: its inventory, its hosts' variables (as written,
    not templated), its balancer and servers, and a way to run a command in a host."""

    def __init__(self, inventory: Path) -> None:
        self.inventory = inventory
        listing = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-inventory"),
                "-i",
                str(inventory),
                "--list",
            ],
            cwd=repo_root(),
            capture_output=True,
            text=True,
            check=True,
        )
        data = json.loads(listing.stdout)
        self.hostvars: dict[str, dict[str, Any]] = data["_meta"]["hostvars"]
        self.balancer: str = data["loadbalancers"]["hosts"][0]
        self.servers: list[str] = sorted(data["lab_servers"]["hosts"])
        # Its Prometheus hosts (roles/monitoring), when it has any.
        self.monitors: list[str] = sorted(data.get("monitoring", {}).get("hosts", []))
        self.variables: dict[str, Any] = self.hostvars[self.servers[0]]

    def address(self, host: str) -> str:
        return str(self.hostvars[host]["ansible_host"])

    def exec(self, host: str, argv: list[str], timeout: float = 300) -> str:
        """``argv`` run as root in the lab host's container; its standard output."""
        return self.exec_input(host, argv, None, timeout)

    def fetch(self, host: str, url: str) -> str:
        """The body of a GET of ``url`` from inside the lab host (its system Python)."""
        return self.exec(host, ["python3", "-c", _FETCH, url])

    def exec_input(
        self, host: str, argv: list[str], stdin: str | None, timeout: float = 300
    ) -> str:
        """``argv`` run as root in the lab host's container with ``stdin``; its output."""
        run = subprocess.run(
            ["docker", "exec", *(["-i"] if stdin is not None else []), host, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert run.returncode == 0, f"{host}: {argv}: {run.stdout}{run.stderr}"
        return run.stdout


_FETCH = (
    "import sys, urllib.request; "
    "print(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
)
