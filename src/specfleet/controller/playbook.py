"""Run the project's playbooks through ansible-runner's Python API.

A :class:`Session` is one CLI command: its playbook runs share the operator's options, one
log file with Ansible's full output, the progress view (an observer of ansible-runner's
events) and Ctrl-C. Each run's events are folded into a PlayResult by
:class:`specfleet.controller.events.Recorder`.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

import ansible_runner

from specfleet.controller.events import Event, PlayResult, Recorder
from specfleet.controller.interrupt import GRACE_SECONDS, stop_ansible
from specfleet.controller.paths import cache_dir, ensure_collection_link, repo_root
from specfleet.controller.runopts import BadInput, RunOptions

Observer = Callable[[Event], None]


def runner_env() -> dict[str, str]:
    """The environment ansible-playbook runs in: the project's ansible.cfg and venv."""
    # ansible-runner starts `ansible-playbook` from PATH: make it the one
    # installed beside this interpreter (the project venv).
    bin_dir = str(Path(sys.executable).parent)
    # The roles reach the project's plugins as specfleet.fleet.*, through this link.
    ensure_collection_link()
    return {
        "ANSIBLE_CONFIG": str(repo_root() / "ansible.cfg"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        # The log file is read by people and grep: no escape codes in it.
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        # An inventory Ansible cannot parse is an error, not an empty fleet that
        # "succeeds" by running nothing.
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "1",
    }


def log_path(command: str) -> Path:
    """A new file under ${SPECFLEET_CACHE:-~/.cache/specfleet}/logs for a command's output."""
    folder = cache_dir("logs")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = folder / f"{command}-{stamp}.log"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{command}-{stamp}-{n}.log"
    return path


def playbook_path(playbook: str) -> Path:
    path = repo_root() / "playbooks" / playbook
    if not path.is_file():
        raise BadInput(f"playbook not found: {path}")
    return path


class Session:
    """One command's playbook runs, with a shared log, observer and interruption."""

    def __init__(
        self,
        command: str,
        options: RunOptions | None = None,
        *,
        observer: Observer | None = None,
        log: Path | None = None,
    ) -> None:
        self.command = command
        self.options = options or RunOptions()
        self.observer = observer
        self.log_path = log or log_path(command)
        self.results: list[PlayResult] = []
        self.interrupted = False
        self._interrupted_at = 0.0
        self._log: TextIO | None = None
        self._running = False
        #: ansible-playbook's pid, from its events (ansible-runner does not expose it).
        self._ansible_pid: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Session:
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._log = os.fdopen(fd, "w", encoding="utf-8")
        now = datetime.now().isoformat(timespec="seconds")
        self.write_log(f"# specfleet {self.command}, {now}")
        # Signal handlers can only be set from the main thread.
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._interrupt)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._log:
            self._log.close()
            self._log = None

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        # Outside a run (image build, a probe) stop right here.
        if not self._running:
            self.interrupted = True
            raise KeyboardInterrupt
        if self.interrupted:
            # A second Ctrl-C: no more grace, ansible-runner kills it now.
            self._interrupted_at = float("-inf")
            return
        self.interrupted = True
        self._interrupted_at = time.monotonic()
        if self._ansible_pid:
            stop_ansible(self._ansible_pid)

    def _cancel(self) -> bool:
        """ansible-runner's cancel_callback: kill ansible-playbook when it has not stopped
        on its own within the grace period (or never started an event)."""
        if not self.interrupted:
            return False
        return not self._ansible_pid or time.monotonic() - self._interrupted_at > GRACE_SECONDS

    def write_log(self, text: str) -> None:
        if self._log:
            self._log.write(text.replace("\r\n", "\n").rstrip("\n") + "\n")
            self._log.flush()

    def run(
        self,
        playbook: str,
        *,
        extravars: Mapping[str, Any] | None = None,
        command_vars: Mapping[str, Any] | None = None,
    ) -> PlayResult:
        """Run playbooks/<playbook>. ``extravars`` are the CLI's own (win over -e);
        ``command_vars`` are the command's options as variables (``--lock``)."""
        path = playbook_path(playbook)
        opts = self.options
        recorder = Recorder(playbook)

        def handle(event: Event) -> bool:
            if event.get("event_data") and event.get("pid"):
                self._ansible_pid = int(event["pid"])
            recorder.add(event)
            if event.get("stdout"):
                self.write_log(str(event["stdout"]))
            if self.observer:
                self.observer(event)
            # Events live in the result, the log and the view: no job_events files.
            return False

        self.write_log(f"# playbook {playbook}: inventory {', '.join(opts.inventory_sources())}")
        started = time.monotonic()
        self._running = True
        self._ansible_pid = None
        try:
            with tempfile.TemporaryDirectory(prefix="specfleet-runner-") as private:
                runner = ansible_runner.run(
                    private_data_dir=private,
                    project_dir=str(repo_root()),
                    playbook=str(path),
                    inventory=opts.inventory_sources(),
                    limit=opts.limit,
                    extravars=dict(extravars or {}),
                    cmdline=opts.cmdline(command_vars) or None,
                    passwords=opts.passwords(),
                    verbosity=opts.verbosity or None,
                    envvars=runner_env(),
                    quiet=True,
                    suppress_env_files=True,
                    event_handler=handle,
                    cancel_callback=self._cancel,
                    # Check for Ctrl-C every second (the default is 5).
                    settings={"pexpect_timeout": 1, "suppress_ansible_output": True},
                )
        finally:
            self._running = False
        result = recorder.result(
            rc=int(runner.rc if runner.rc is not None else 1),
            status=str(runner.status),
            seconds=time.monotonic() - started,
        )
        self.write_log(f"# {playbook}: rc={result.rc} status={result.status}")
        self.results.append(result)
        return result
