"""The fleet as its upgrade tests read it: what each host runs (its manifest, `current`, the
venvs its server's processes map files from), the balancer's view, and `specfleet upgrade`
run in the background. Used by tests/test_fleet_faults.py and tests/test_fleet_upgrade.py on
the shared lab (conftest.cli_lab)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labs import LabUnderTest, specfleet_json

from specfleet.controller.paths import repo_root

UNIT = "specfleet-vllm.service"
# What the lab's servers' processes are (the whitelist record and the gate's record).
WHITELIST_RECORD = "/etc/specfleet/eagle3-whitelist.json"
GATE_RECORD = "/etc/specfleet/specfleet-vllm.served-sha1"


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
    """`specfleet upgrade --lock LOCK [ARGS]` in the background, its JSON document at the end
    (``lock=None``: no --lock, for a lock the ARGS name with -e)."""

    def __init__(self, lab: LabUnderTest, lock: str | None, log: Path, *args: str) -> None:
        self.log = log
        command = ["upgrade", "-i", str(lab.inventory), *(["--lock", lock] if lock else [])]
        command += [*args, "--json"]
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


def starting(
    lab: LabUnderTest, canary: str, runs: Callable[[str], bool], since: int
) -> Callable[[], bool]:
    """The canary's server is a process started after ``since`` from a venv ``runs``
    accepts, that does not answer yet: its gate is waiting for it. The process's own venv,
    not the unit's or `current`: while the rollback writes the old unit, a restart systemd
    made on its own after a kill still runs the new venv."""

    def now() -> bool:
        pid = main_pid(lab, canary)
        return (
            pid not in (0, since)
            and runs(process_venv(lab, canary, pid))
            and not serves(lab, canary)
        )

    return now


def kill_the_canarys_new_server(lab: LabUnderTest, canary: str, before: str, started: int) -> int:
    """Wait until the canary's server on another venv than ``before`` starts behind its
    gate (after the process ``started``), and kill it (-9); return its pid."""
    wait_for(
        "the canary's new server starting behind its gate",
        starting(lab, canary, lambda venv: venv != before, since=started),
    )
    pid = main_pid(lab, canary)
    run_in(lab, canary, ["kill", "-9", str(pid)])
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
        # The whitelist settled for the vLLM it serves, and the gate passed on what it runs.
        whitelist = json.loads(run_in(lab, host, ["cat", WHITELIST_RECORD]))
        if whitelist.get("vllm_version") != manifest["vllm"]:
            wrong.append(f"{host}: whitelist record of vLLM {whitelist.get('vllm_version')}")
        if "/etc/specfleet/stack.json" not in run_in(lab, host, ["cat", GATE_RECORD]):
            wrong.append(f"{host}: the gate's record does not cover the stack it serves")
    return wrong


def repaired(lab: LabUnderTest, lock: str, tmp_path: Path) -> dict[str, Any]:
    """The same command again ends well, and the fleet is verified; its JSON document.
    Under the callers' load this is the fleet's rolling upgrade to ``lock``."""
    started = time.monotonic()
    rc, again = Upgrade(lab, lock, tmp_path / "again.json").finish()
    assert rc == 0, again.get("failed_tasks") or again
    print(f"\nthe repair, a rolling upgrade to {lock}: {time.monotonic() - started:.0f} s")
    assert not verified(lab, lock), verified(lab, lock)
    return again
