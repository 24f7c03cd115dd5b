"""Stopping a running ansible-playbook on Ctrl-C, tasks included.

ansible-runner's cancel kills ansible-playbook's process group, but each of Ansible's
workers calls setsid() (ansible-core's WorkerProcess._detach), so the workers, and the
module processes they run (a `sleep`, a pip install under the local or docker
connection), are in groups of their own and outlive the cancel (ansible-runner issue
#973). Here the workers' groups are ended first, then ansible-playbook gets SIGINT and
stops as on a Ctrl-C in its own terminal ("User interrupted execution", rc 99).
ansible-runner's cancel (SIGKILL) stays the fallback when that does not end it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

#: Seconds ansible-playbook gets to stop after SIGINT before ansible-runner kills it.
GRACE_SECONDS = 15.0


def child_groups(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The process groups of pid's children, other than pid's own (Linux /proc)."""
    own = _stat(proc / str(pid))
    groups: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(entry)
        if fields and fields[0] == pid and (not own or fields[1] != own[1]):
            groups.add(fields[1])
    return groups


def _stat(entry: Path) -> tuple[int, int] | None:
    """(parent pid, process group) from /proc/<pid>/stat, None when it is gone."""
    try:
        text = (entry / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = text.rsplit(")", 1)[-1].split()
    return int(fields[1]), int(fields[2])


def stop_ansible(pid: int) -> None:
    """End ansible-playbook's workers and their tasks, then ask it to stop (SIGINT)."""
    # A process that is already gone is fine.
    for group in child_groups(pid):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGTERM)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGINT)
