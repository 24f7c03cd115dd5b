"""ansible-runner's event stream, folded into what a run did on each host.

Events are the dicts ansible-runner hands its ``event_handler`` (the same documents it
writes to ``artifacts/<ident>/job_events``): ``event`` names the callback
(``runner_on_ok``, ``playbook_on_stats``, ...), ``event_data`` holds the host, task, role
and module result, ``stdout`` the text Ansible printed for it. The fold is pure data in,
data out, so the summary, the exit code and the JSON are tested from recorded events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Event = Mapping[str, Any]

#: The counters of a host, named as in Ansible's PLAY RECAP (ok includes changed).
COUNTERS = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
#: playbook_on_stats' names for them.
_STATS_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "failed": "failures",
    "unreachable": "dark",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}
#: What Ansible prints for an error that is not a task's (bad inventory, syntax, vault),
#: and the warning that names an inventory source it could not parse.
_ERROR_LINE = re.compile(
    r"^(?:(?:\[ERROR\]:|ERROR!)\s*(?P<text>.*)"
    r"|\[WARNING\]:\s*(?P<source>Unable to parse .* as an inventory source))$"
)
#: ansible-playbook's exit codes for input it refused (AnsibleError, parser, options).
_REFUSED_RCS = frozenset({1, 4, 5})
#: ansible-playbook's exit code when it was interrupted (Ctrl-C).
ANSIBLE_INTERRUPTED_RC = 99


def outcome(event: Event) -> str | None:
    """The counter a per-host task event adds to, as in the PLAY RECAP; None for others."""
    name = event.get("event")
    data = event.get("event_data") or {}
    if name == "runner_on_ok":
        return "changed" if (data.get("res") or {}).get("changed") else "ok"
    if name == "runner_on_failed":
        return "ignored" if data.get("ignore_errors") else "failed"
    if name == "runner_on_unreachable":
        return "unreachable"
    if name == "runner_on_skipped":
        return "skipped"
    return None


def message(result: Mapping[str, Any]) -> str:
    """A failed task's message: msg, else stderr, else stdout (no_log output stays hidden)."""
    if "censored" in result:
        return str(result["censored"])
    for key in ("msg", "stderr", "stdout", "reason"):
        value = result.get(key)
        if isinstance(value, list):
            value = "\n".join(str(item) for item in value)
        if value:
            return str(value).strip()
    return "(no message)"


@dataclass
class HostTally:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0

    def add(self, counter: str, n: int = 1) -> None:
        setattr(self, counter, getattr(self, counter) + n)

    def count(self, counter: str) -> None:
        """One task result, counted as the recap does: a change is also an ok."""
        self.add(counter)
        if counter == "changed":
            self.add("ok")

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}


@dataclass(frozen=True)
class TaskFailure:
    playbook: str
    host: str
    task: str
    role: str | None
    message: str
    unreachable: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "host": self.host,
            "role": self.role,
            "task": self.task,
            "message": self.message,
            "unreachable": self.unreachable,
        }


@dataclass(frozen=True)
class PlayResult:
    """One playbook run: ansible-playbook's rc and runner status, and each host's counters."""

    playbook: str
    rc: int
    #: ansible-runner's final status: successful, failed, canceled, timeout.
    status: str = "successful"
    hosts: Mapping[str, HostTally] = field(default_factory=dict)
    failures: tuple[TaskFailure, ...] = ()
    #: Errors Ansible printed outside any task (bad inventory, syntax, vault).
    errors: tuple[str, ...] = ()
    #: set_stats data (the playbook's output for the CLI, e.g. status rows).
    data: Mapping[str, Any] = field(default_factory=dict)
    #: Whether a play started: an error before that is Ansible refusing the input.
    played: bool = True
    seconds: float = 0.0

    @property
    def changed(self) -> dict[str, int]:
        return {host: tally.changed for host, tally in self.hosts.items()}

    @property
    def total_changed(self) -> int:
        return sum(tally.changed for tally in self.hosts.values())

    @property
    def failed_hosts(self) -> tuple[str, ...]:
        return tuple(sorted(h for h, tally in self.hosts.items() if tally.failed))

    @property
    def unreachable_hosts(self) -> tuple[str, ...]:
        return tuple(sorted(h for h, tally in self.hosts.items() if tally.unreachable))

    @property
    def interrupted(self) -> bool:
        return self.status == "canceled" or self.rc == ANSIBLE_INTERRUPTED_RC

    @property
    def refused(self) -> bool:
        """Ansible stopped before any play: it refused the input (inventory, syntax, vault)."""
        return self.rc in _REFUSED_RCS and not self.played

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failed_hosts and not self.unreachable_hosts


class Recorder:
    """Folds one playbook's events into a PlayResult, as they arrive."""

    def __init__(self, playbook: str) -> None:
        self.playbook = playbook
        self.live: dict[str, HostTally] = {}
        self.stats: dict[str, HostTally] | None = None
        self.failures: list[TaskFailure] = []
        self.errors: list[str] = []
        self.data: dict[str, Any] = {}
        self.played = False

    def add(self, event: Event) -> None:
        name = event.get("event")
        data = event.get("event_data") or {}
        if name == "playbook_on_play_start":
            self.played = True
        elif name == "playbook_on_stats":
            self._stats(data)
        elif name == "verbose":
            for line in str(event.get("stdout") or "").splitlines():
                match = _ERROR_LINE.match(line.strip())
                if match and (match["text"] or match["source"]):
                    self.errors.append(match["text"] or match["source"])
        counter = outcome(event)
        if counter is None or not data.get("host"):
            return
        host = str(data["host"])
        self.live.setdefault(host, HostTally()).count(counter)
        if counter in ("failed", "unreachable"):
            self.failures.append(
                TaskFailure(
                    playbook=self.playbook,
                    host=host,
                    task=str(data.get("task") or ""),
                    role=data.get("role"),
                    message=message(data.get("res") or {}),
                    unreachable=counter == "unreachable",
                )
            )

    def _stats(self, data: Mapping[str, Any]) -> None:
        tallies: dict[str, HostTally] = {}
        for counter, key in _STATS_KEYS.items():
            for host, n in (data.get(key) or {}).items():
                tallies.setdefault(str(host), HostTally()).add(counter, int(n))
        self.stats = tallies
        self.data = dict(data.get("artifact_data") or {})

    def result(self, rc: int, status: str, seconds: float = 0.0) -> PlayResult:
        hosts = self.stats if self.stats is not None else self.live
        # A failure a block rescued is not in the recap's failures: keep only the
        # failures of hosts the recap still counts as failed (or unreachable).
        failures = tuple(
            failure
            for failure in self.failures
            if self.stats is None or _still_counted(hosts.get(failure.host), failure)
        )
        return PlayResult(
            playbook=self.playbook,
            rc=rc,
            status=status,
            hosts=hosts,
            failures=failures,
            errors=tuple(self.errors),
            data=self.data,
            played=self.played,
            seconds=round(seconds, 1),
        )


def _still_counted(tally: HostTally | None, failure: TaskFailure) -> bool:
    if tally is None:
        return True
    return bool(tally.unreachable if failure.unreachable else tally.failed)
