"""A command's outcome: the exit code scripts branch on and the JSON document they read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from specfleet.controller.events import COUNTERS, HostTally, PlayResult


class ExitCode(IntEnum):
    """specfleet's exit codes (`specfleet --help` and the README list them)."""

    OK = 0
    #: Ansible stopped on an error that is no host's (e.g. inside a play), or a bug.
    ERROR = 1
    #: Nothing ran: bad option, inventory, extra vars or vault input; playbook not found.
    BAD_INPUT = 2
    #: A task failed on at least one host.
    FAILED = 3
    #: At least one host was unreachable, and no task failed.
    UNREACHABLE = 4
    #: `status`, `lab status`: every host was read, and at least one serving host is not
    #: healthy (its unit not active, its processes not on the stack's venv, /health not ok).
    UNHEALTHY = 5
    #: Ctrl-C or SIGTERM (128 + SIGINT).
    INTERRUPTED = 130


EXIT_CODES_HELP = """\
exit codes:
  0    ok: every host succeeded
  1    error: Ansible stopped on an error that is not a host's
  2    bad input: bad option, inventory, extra vars or vault password, playbook not found
       (nothing ran)
  3    failed: a task failed on at least one host (also when others were unreachable)
  4    unreachable: at least one host could not be reached, and no task failed
  5    unhealthy (status, lab status): every host was read, and at least one serving host
       is not healthy (unit not active, processes not on the stack's venv, /health not ok)
  130  interrupted (Ctrl-C, SIGTERM)
"""


def exit_code(
    results: Sequence[PlayResult], *, interrupted: bool = False, unhealthy: bool = False
) -> ExitCode:
    """The code for a command's runs: interrupted > failed > unreachable > bad input > error >
    unhealthy (``unhealthy``: a command that reads status found a serving host not healthy)."""
    if interrupted or any(result.interrupted for result in results):
        return ExitCode.INTERRUPTED
    if any(result.failed_hosts for result in results):
        return ExitCode.FAILED
    if any(result.unreachable_hosts for result in results):
        return ExitCode.UNREACHABLE
    if any(result.refused for result in results):
        return ExitCode.BAD_INPUT
    if any(result.rc != 0 for result in results):
        return ExitCode.ERROR
    if unhealthy:
        return ExitCode.UNHEALTHY
    return ExitCode.OK


def host_totals(results: Sequence[PlayResult]) -> dict[str, HostTally]:
    """Each host's counters summed over the command's playbooks."""
    totals: dict[str, HostTally] = {}
    for result in results:
        for host, tally in result.hosts.items():
            total = totals.setdefault(host, HostTally())
            for counter in COUNTERS:
                total.add(counter, getattr(tally, counter))
    return dict(sorted(totals.items()))


@dataclass
class Outcome:
    """What a command did: its runs, its exit code, where its log is."""

    command: str
    results: list[PlayResult]
    code: ExitCode
    seconds: float
    log: Path | None
    error: str | None = None
    #: The command's own findings (status rows, the lab's servers), in JSON form.
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def error_text(self) -> str | None:
        """The error to show: the command's own, else what Ansible printed."""
        if self.error:
            return self.error
        lines = [line for result in self.results for line in result.errors]
        if lines and self.code in (ExitCode.BAD_INPUT, ExitCode.ERROR):
            return "\n".join(lines)
        return None


def document(outcome: Outcome) -> dict[str, Any]:
    """The one JSON document `--json` prints."""
    hosts = host_totals(outcome.results)
    return {
        "command": outcome.command,
        "playbooks": [result.playbook for result in outcome.results],
        "rc": int(outcome.code),
        "result": outcome.code.name.lower(),
        "duration_s": round(outcome.seconds, 1),
        "log": str(outcome.log) if outcome.log else None,
        "error": outcome.error_text,
        "hosts": {host: tally.as_dict() for host, tally in hosts.items()},
        "failed_hosts": sorted(h for h, tally in hosts.items() if tally.failed),
        "unreachable_hosts": sorted(h for h, tally in hosts.items() if tally.unreachable),
        "failed_tasks": [f.as_dict() for result in outcome.results for f in result.failures],
        "runs": [
            {
                "playbook": result.playbook,
                "ansible_rc": result.rc,
                "status": result.status,
                "duration_s": result.seconds,
            }
            for result in outcome.results
        ],
        **outcome.details,
    }
