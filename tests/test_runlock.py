"""The host's stack lock and whether its owner is gone (src/specfleet/controller/runlock.py,
roles/ml_stack/files/ml-stack-lock): a run interrupted while it held the lock must not
block the next one, and a run that is alive must not lose it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

from specfleet.controller.runlock import process_started, stale_reason, this_run

SCRIPT = ROOT / "roles" / "ml_stack" / "files" / "ml-stack-lock"
HERE = socket.gethostname()


def lock(*args: str) -> dict:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True
    )
    found: dict = json.loads(run.stdout)
    return found


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_first_run_takes_it_and_the_second_learns_who_holds_it(tmp_path: Path) -> None:
    folder = str(tmp_path / "specfleet-ml-stack")
    first = {"controller": HERE, "pid": os.getpid(), "pid_started": process_started(os.getpid())}
    assert lock("take", folder, json.dumps(first))["taken"]
    second = lock("take", folder, json.dumps({"controller": HERE, "pid": 1}))
    assert second["taken"] is False and second["owner"] == first and second["age"] >= 0
    # This run is alive: its lock is not anybody's to take.
    assert stale_reason(second, 3600) == ""


def test_a_lock_of_a_run_of_this_controller_that_is_gone_is_taken_over_at_once(
    tmp_path: Path,
) -> None:
    folder = str(tmp_path / "lock")
    gone = {"controller": HERE, "pid": dead_pid(), "pid_started": 1}
    lock("take", folder, json.dumps(gone))
    found = lock("take", folder, json.dumps(this_run()))
    reason = stale_reason(found, 3600)
    assert reason == f"its run (pid {gone['pid']} on {HERE}) is gone"
    taken = lock("take-over", folder, json.dumps(this_run()))
    assert taken["taken"] and taken["previous"] == gone
    assert json.loads((Path(folder) / "owner.json").read_text())["pid"] == this_run()["pid"]


def test_a_pid_taken_by_another_process_since_is_not_the_owner() -> None:
    found = {
        "taken": False,
        "owner": {"controller": HERE, "pid": os.getpid(), "pid_started": -1},
        "age": 5,
    }
    assert "another process has that pid now" in stale_reason(found, 3600)


def test_another_controllers_lock_waits_until_it_is_older_than_the_limit() -> None:
    owner = {"controller": "elsewhere", "pid": 4242, "pid_started": 7}
    assert stale_reason({"taken": False, "owner": owner, "age": 100}, 3600) == ""
    assert "held for 4000 s by a run on elsewhere" in stale_reason(
        {"taken": False, "owner": owner, "age": 4000}, 3600
    )


def test_a_lock_without_an_owner_is_left_a_minute_to_the_run_writing_it() -> None:
    assert stale_reason({"taken": False, "owner": None, "age": 2}, 3600) == ""
    assert "records no owner" in stale_reason({"taken": False, "owner": None, "age": 90}, 3600)


def test_this_run_names_its_ansible_playbook_process_or_itself() -> None:
    run = this_run()
    assert run["controller"] == HERE and run["pid"] > 0
    assert run["pid_started"] == process_started(run["pid"])


def fake_proc(tmp_path: Path, processes: dict[int, tuple[int, str]]) -> Path:
    """A /proc of {pid: (parent, command line)}."""
    proc = tmp_path / "proc"
    for pid, (parent, command) in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(command.replace(" ", "\0").encode())
        (proc / str(pid) / "stat").write_text(f"{pid} (python3) S {parent} {pid} 0")
    return proc


def test_the_run_is_the_topmost_ansible_playbook_not_the_worker_taking_the_lock(
    tmp_path: Path,
) -> None:
    # A worker is a fork of ansible-playbook with its command line; it ends with its task,
    # while the lock it takes must outlive it (two runs of one controller found each other's
    # worker gone and both built the same venv).
    from specfleet.controller.runlock import _playbook_pid

    playbook = "/venv/bin/python3 /venv/bin/ansible-playbook -i hosts site.yml"
    proc = fake_proc(
        tmp_path,
        {
            10: (1, "python3 -m specfleet.controller.cli provision"),
            20: (10, playbook),
            30: (20, playbook),
        },
    )
    assert _playbook_pid(30, proc) == 20
    assert _playbook_pid(20, proc) == 20
    # Not under a run at all (a test): itself.
    assert _playbook_pid(10, proc) == 10
