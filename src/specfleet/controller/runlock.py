"""Who a run is, and whether the run that holds a host's lock is still alive.

A lock on a host (the ml_stack role's ``/run/lock/specfleet-ml-stack``) records its owner:
the controller's host name, the ansible-playbook process and when that process started,
and when the lock was taken. A run that was interrupted (Ctrl-C, a lost connection, kill
-9) never released it; the next run asks here whether the owner is gone:

- an owner on this controller whose process no longer runs (or whose pid another process
  has taken since) is gone, at once;
- an owner on another controller cannot be asked: it is taken for gone when the lock is
  older than the role's limit (``ml_stack_lock_stale_after``);
- a lock with no owner recorded is gone once it is a minute old (a run killed between
  making the folder and writing its owner; a run takes both within a second).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

#: Seconds a lock without a recorded owner is left to the run that is writing it.
OWNERLESS_GRACE_S = 60


def process_started(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (stat field 22), None when gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[-1].split()[19])


def _runs_ansible_playbook(pid: int, proc: Path) -> bool:
    try:
        return b"ansible-playbook" in (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def _parent(pid: int, proc: Path) -> int:
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _playbook_pid(pid: int, proc: Path = Path("/proc")) -> int:
    """The ansible-playbook process ``pid`` runs under, else ``pid`` itself. Ansible's
    workers are forks of it, with its command line: the run is the topmost of them (a
    worker lives for one task only, and a lock outlives many)."""
    found: int | None = None
    current = pid
    for _ in range(32):
        if _runs_ansible_playbook(current, proc):
            found = current
        elif found is not None:
            break  # above the run's own processes
        parent = _parent(current, proc)
        if parent <= 1:
            break
        current = parent
    return pid if found is None else found


def this_run() -> dict[str, Any]:
    """The owner a lock taken by this run records."""
    pid = _playbook_pid(os.getpid())
    return {
        "controller": socket.gethostname(),
        "pid": pid,
        "pid_started": process_started(pid),
        "since": round(time.time(), 3),
    }


def stale_reason(found: dict[str, Any], stale_after_s: float, controller: str | None = None) -> str:
    """Why the lock in ``found`` ({"taken", "owner", "age"}) is held by a run that is gone,
    or "" while its owner may be alive (or the lock was just taken by this run)."""
    if found.get("taken"):
        return ""
    owner = found.get("owner")
    age = float(found.get("age") or 0)
    here = controller or socket.gethostname()
    if not isinstance(owner, dict):
        if age > OWNERLESS_GRACE_S:
            return f"it records no owner and is {age:.0f} s old (a run killed while taking it)"
        return ""
    pid = int(owner.get("pid") or 0)
    if owner.get("controller") == here:
        started = process_started(pid)
        if started is None:
            return f"its run (pid {pid} on {here}) is gone"
        if owner.get("pid_started") is not None and started != owner.get("pid_started"):
            return f"its run (pid {pid} on {here}) is gone; another process has that pid now"
        return ""
    if age > stale_after_s:
        return (
            f"it has been held for {age:.0f} s by a run on {owner.get('controller')}, which this"
            f" controller cannot ask, longer than the {stale_after_s:.0f} s a run may hold it"
        )
    return ""
