"""Progress a person can follow, drawn with rich from ansible-runner's events.

:class:`FleetState` keeps what the views show (per host: current role and task, counters,
the time on the current task; the training job's progress); the views draw it:

- :class:`LiveView` on a terminal: one live table, a bar per training stage, and the plays
  and failures printed above it as they happen;
- :class:`PlainView` when stdout is not a terminal: one plain line per play, per role a
  host enters, per change and per failure (no redraws, fit for CI logs);
- :class:`SilentView` for --quiet and --json.

Each view is the session's observer (called with every event) and a context manager.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from specfleet.controller.events import Event, HostTally, outcome
from specfleet.controller.events import message as result_message

#: The drafter_training role's debug task that prints the job's progress line.
TRAINING_TASK = "Show the job's progress"
# "[3/6] train: step 40/120, loss 2.31, 812 tok/s, ETA 95 s - training the drafter"
# (roles/drafter_training/files/drafter-training-wait writes it; " - " starts the message).
_TRAINING_HEAD = re.compile(
    r"^\[(?P<index>\d+|\?)/(?P<stages>\d+)\]\s+(?P<stage>[^:]+?)"
    r"(?::\s+step\s+(?P<step>\d+)/(?P<total>\d+|\?)(?P<detail>.*))?$"
)


@dataclass(frozen=True)
class TrainingLine:
    stage: str
    index: str
    stages: int
    step: int | None
    total: int | None
    #: "loss 2.31, 812 tok/s, ETA 95 s"
    detail: str
    message: str
    #: The line as the role printed it.
    text: str


def parse_training_line(text: str) -> TrainingLine | None:
    head, _, tail = text.strip().partition(" - ")
    match = _TRAINING_HEAD.match(head.strip())
    if not match:
        return None
    total = match["total"]
    return TrainingLine(
        stage=match["stage"].strip(),
        index=match["index"],
        stages=int(match["stages"]),
        step=int(match["step"]) if match["step"] else None,
        total=int(total) if total and total.isdigit() else None,
        detail=(match["detail"] or "").strip(" ,"),
        message=tail.strip(),
        text=text.strip(),
    )


#: (kind, text): a line FleetState.update found worth printing.
Line = tuple[str, str]


@dataclass
class HostState:
    role: str = ""
    task: str = ""
    task_started: float = field(default_factory=time.monotonic)
    tally: HostTally = field(default_factory=HostTally)
    done: bool = False


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class FleetState:
    """What the views draw, updated from events. Returns the lines worth printing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.hosts: dict[str, HostState] = {}
        self.play = ""
        self.playbook = ""
        self.training: dict[str, TrainingLine] = {}
        self.lock = threading.Lock()
        self.started = clock()

    def update(self, event: Event) -> list[Line]:
        """Apply an event; the lines a person may want to see for it, by kind: play, role
        (a host enters one), changed, failed, unreachable, training."""
        with self.lock:
            return self._update(event)

    def _update(self, event: Event) -> list[Line]:
        name = event.get("event")
        data = event.get("event_data") or {}
        host = str(data.get("host") or "")
        if name == "playbook_on_start":
            self.playbook = Path(str(data.get("playbook") or "")).name
            return []
        if name == "playbook_on_play_start":
            self.play = str(data.get("name") or data.get("play") or "")
            return [("play", f"== {self.playbook}: {self.play}")]
        if name == "playbook_on_stats":
            for state in self.hosts.values():
                state.done, state.task, state.role = True, "done", ""
            return []
        if not host:
            return []
        state = self.hosts.setdefault(host, HostState(task_started=self.clock()))
        if name == "runner_on_start":
            role = str(data.get("role") or "")
            entered = role and role != state.role
            state.role, state.task = role, str(data.get("task") or "")
            state.task_started = self.clock()
            return [("role", f"{host}: {role}")] if entered else []
        counter = outcome(event)
        if counter is None:
            return []
        state.tally.count(counter)
        where = f"{state.role} : {state.task}" if state.role else state.task
        result = data.get("res") or {}
        if counter == "changed":
            return [("changed", f"{host}: changed: {where}")]
        if counter == "failed":
            return [("failed", f"{host}: FAILED: {where}: {_short(result_message(result))}")]
        if counter == "unreachable":
            return [("unreachable", f"{host}: UNREACHABLE: {_short(result_message(result))}")]
        if counter == "ok" and data.get("task") == TRAINING_TASK:
            text = str(result.get("msg") or "")
            line = parse_training_line(text)
            if line:
                self.training[host] = line
            else:
                self.training.pop(host, None)
            return [("training", f"{host}: {text}")]
        return []

    def table(self) -> Table:
        """Per host: role, task, counters and the time on the current task."""
        now = self.clock()
        table = Table(expand=False, box=None, pad_edge=False, title_justify="left")
        where = ": ".join(part for part in (self.playbook, self.play) if part) or "starting"
        table.title = f"{where}  ({_clock(now - self.started)})"
        for column in ("host", "role", "task"):
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=40)
        for column in ("ok", "changed", "failed", "unreach."):
            table.add_column(column, justify="right")
        table.add_column("time", justify="right")
        with self.lock:
            rows = sorted(self.hosts.items())
            for host, state in rows:
                tally = state.tally
                table.add_row(
                    host,
                    state.role,
                    state.task,
                    str(tally.ok),
                    Text(str(tally.changed), style="yellow" if tally.changed else ""),
                    Text(str(tally.failed), style="bold red" if tally.failed else ""),
                    Text(str(tally.unreachable), style="bold red" if tally.unreachable else ""),
                    "" if state.done else _clock(now - state.task_started),
                )
        return table


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class View(Protocol):
    def __call__(self, event: Event) -> None: ...

    def note(self, text: str) -> None: ...

    def __enter__(self) -> View: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None: ...


class SilentView:
    """--quiet and --json: nothing while it runs."""

    def __call__(self, event: Event) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def __enter__(self) -> SilentView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class PlainView:
    """Not a terminal: plain lines, never a redraw."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.state = FleetState()

    def __call__(self, event: Event) -> None:
        for _, text in self.state.update(event):
            self.note(text)

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class LiveView:
    """A terminal: a live table of the hosts and a bar per training stage."""

    def __init__(self, console: Console, refresh_per_second: float = 2) -> None:
        self.console = console
        self.state = FleetState()
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
        )
        self._bars: dict[tuple[str, str], TaskID] = {}
        self._host_bars: dict[str, list[TaskID]] = {}
        # Refreshed from rich's thread (the elapsed times move while a task runs);
        # the state's lock keeps the table consistent with the event thread.
        self.live = Live(
            self, console=console, refresh_per_second=refresh_per_second, transient=True
        )

    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = [self.state.table()]
        if self._bars:
            parts.append(self.progress)
        return Group(*parts)

    #: What is printed above the table (it shows roles and counts itself).
    PRINTED = frozenset({"play", "failed", "unreachable", "training"})

    def __call__(self, event: Event) -> None:
        lines = self.state.update(event)
        data = event.get("event_data") or {}
        host = str(data.get("host") or "")
        training = self.state.training.get(host)
        if training and training.total and data.get("task") == TRAINING_TASK:
            # A bar shows the steps; print only the lines of stages without one.
            self._bar(host, training)
            lines = []
        for kind, text in lines:
            if kind in self.PRINTED:
                self.note(text)

    def _bar(self, host: str, line: TrainingLine) -> None:
        key = (host, line.stage)
        description = f"{host} [{line.index}/{line.stages}] {line.stage}"
        if key not in self._bars:
            # The host moved on to a new stage: its earlier bars are done.
            for task in self.progress.tasks:
                if task.id in self._host_bars.get(host, ()):
                    self.progress.update(task.id, completed=task.total or 0)
            self._bars[key] = self.progress.add_task(description, total=line.total, detail="")
            self._host_bars.setdefault(host, []).append(self._bars[key])
        self.progress.update(
            self._bars[key],
            total=line.total,
            completed=line.step or 0,
            detail=line.detail or line.message,
        )

    def note(self, text: str) -> None:
        # Printed above the live table, which redraws below it.
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> LiveView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()
        # The bars go with the live display: keep where each training job got to.
        for host, line in sorted(self.state.training.items()):
            self.note(f"{host}: {line.text}")


def make_view(console: Console, *, quiet: bool, machine: bool) -> View:
    """The view for the output mode: silent (--quiet/--json), live (terminal), plain."""
    if quiet or machine:
        return SilentView()
    if console.is_terminal:
        return LiveView(console)
    return PlainView(console)
