"""Where the test run's time goes: per test file, per Molecule scenario and phase, per task.

It reads what a run leaves behind and runs nothing itself:
- pytest's output with ``--durations=0`` (every test's setup, call and teardown seconds);
- the Molecule logs in ``.cache/molecule-logs/`` (one a scenario). profile_tasks stamps
  each task's start with the seconds the previous task took, so every task's duration is
  in the log.

Usage (the second command prints three tables in Markdown)::

    bin/test --durations=0 2>&1 | tee /tmp/ci.log
    .venv/bin/python benchmarks/ci_time.py /tmp/ci.log [--molecule-logs .cache/molecule-logs]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: ``12.34s call     tests/test_x.py::test_y[param]``, pytest's --durations lines.
DURATION = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/[^:\s]+)::(\S+)")
#: ``INFO     [fleet > converge] Executing``, Molecule's phase markers.
PHASE = re.compile(r"\[(\w+) > (\w+)\] Executing")
TASK = re.compile(r"^TASK \[(.*)\] \*+$")
#: profile_tasks: ``Tuesday 01 December 2026  17:03:03 +0000 (0:00:00.099)  0:00:00.099 ***``,
#: the parenthesised figure being the previous task's duration.
STAMP = re.compile(r"\((\d+):(\d\d):(\d\d(?:\.\d+)?)\)\s+\d+:\d\d:\d\d")
RECAP = re.compile(r"^PLAY RECAP \*+")


@dataclass
class Scenario:
    phases: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tasks: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def seconds(match: re.Match[str]) -> float:
    hours, minutes, secs = match.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(secs)


def read_scenario(log: Path) -> Scenario:
    """Every task's seconds, summed by phase and by the task's name."""
    scenario = Scenario()
    phase = "?"
    running: tuple[str, str] | None = None  # (phase, task) the next stamp closes
    starting: str | None = None  # the task whose header came last
    for line in log.read_text(errors="replace").splitlines():
        if marker := PHASE.search(line):
            phase, running, starting = marker.group(2), None, None
        elif named := TASK.match(line):
            starting = named.group(1)
        elif RECAP.match(line):
            starting = None  # the stamp after the recap closes the play's last task
        elif stamp := STAMP.search(line):
            if running:
                scenario.phases[running[0]] += seconds(stamp)
                scenario.tasks[running[1]] += seconds(stamp)
            running = (phase, starting) if starting else None
            starting = None
    return scenario


def read_durations(log: Path) -> dict[str, float]:
    per_file: dict[str, float] = defaultdict(float)
    for line in log.read_text(errors="replace").splitlines():
        if found := DURATION.match(line):
            per_file[found.group(3)] += float(found.group(1))
    return per_file


def table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pytest_log", type=Path, help="pytest's output, run with --durations=0")
    parser.add_argument("--molecule-logs", type=Path, default=Path(".cache/molecule-logs"))
    parser.add_argument("--tasks", type=int, default=15, help="how many of the slowest tasks")
    args = parser.parse_args()

    per_file = read_durations(args.pytest_log)
    total = sum(per_file.values())
    slowest = sorted(per_file.items(), key=lambda kv: -kv[1])
    rows = [(name, f"{secs:,.0f}", f"{100 * secs / max(total, 1):.0f}%")
            for name, secs in slowest if secs >= 5]  # fmt: skip
    print(f"Per test file (seconds; {total:,.0f} s in all):\n")
    print(table(("test file", "seconds", "share"), rows))

    scenarios = {log.stem: read_scenario(log) for log in sorted(args.molecule_logs.glob("*.log"))}
    phases = ("create", "prepare", "converge", "idempotence", "verify", "destroy")
    print("\nPer Molecule scenario and phase (seconds in tasks):\n")
    print(table(("scenario", *phases, "in all"), [
        (name, *(f"{s.phases.get(p, 0):,.0f}" for p in phases), f"{sum(s.phases.values()):,.0f}")
        for name, s in scenarios.items()
    ]))  # fmt: skip

    everything: list[tuple[float, str, str]] = [
        (secs, name, task) for name, s in scenarios.items() for task, secs in s.tasks.items()
    ]
    print(f"\nThe {args.tasks} slowest tasks (seconds, summed over a scenario's runs of them):\n")
    print(table(("scenario", "task", "seconds"), [
        (name, task, f"{secs:,.0f}") for secs, name, task in sorted(everything)[::-1][: args.tasks]
    ]))  # fmt: skip


if __name__ == "__main__":
    main()
