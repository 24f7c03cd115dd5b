"""The progress file Ansible polls: stage, step of total, loss, tokens/s, ETA.

Written atomically (temp file, then rename), so a reader never sees half a file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically, readable by everyone (the service user and Ansible)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class Progress:
    """One run's progress record; each update rewrites the file."""

    def __init__(self, path: Path, run_id: str, stages: list[str]) -> None:
        self.path = path
        self.state: dict[str, Any] = {
            "run_id": run_id,
            "stages": stages,
            "state": "running",
            "stage": None,
            "started": time.time(),
            "stage_walls_s": {},
        }
        self._stage_started = time.monotonic()

    @classmethod
    def attach(cls, path: Path) -> Progress:
        """Continue the record another process started (the training subprocess)."""
        state = json.loads(path.read_text())
        progress = cls(path, state["run_id"], state["stages"])
        progress.state = state
        return progress

    def stage(self, name: str, *, skipped: bool = False) -> None:
        self.state.update(
            stage=name, step=None, total=None, loss=None, tokens_per_s=None, eta_s=None
        )
        self.state["stage_index"] = self.state["stages"].index(name) + 1
        self.state["message"] = "finished earlier, skipped" if skipped else "running"
        self._stage_started = time.monotonic()
        self.flush()

    def stage_done(self, name: str, wall_s: float) -> None:
        self.state["stage_walls_s"][name] = round(wall_s, 1)
        self.flush()

    def step(
        self,
        step: int,
        total: int | None,
        loss: float | None = None,
        tokens_per_s: float | None = None,
    ) -> None:
        elapsed = time.monotonic() - self._stage_started
        first = self.state.get("first_step")
        if first is None:
            first = self.state["first_step"] = (step, elapsed)
        done_here = step - first[0]
        eta = None
        if total and done_here > 0:
            eta = round((elapsed - first[1]) / done_here * (total - step), 1)
        self.state.update(step=step, total=total, loss=loss, tokens_per_s=tokens_per_s, eta_s=eta)
        self.flush()

    def note(self, message: str) -> None:
        self.state["message"] = message
        self.flush()

    def finish(self, state: str, message: str, **extra: Any) -> None:
        self.state.update(state=state, message=message, **extra)
        self.state["finished"] = time.time()
        self.flush()

    def flush(self) -> None:
        self.state["updated"] = time.time()
        write_json(self.path, self.state)


class TrainingMetricsHandler(logging.Handler):
    """Feeds speculators' metric records (``speculators.metrics``) into the progress file.

    The trainer logs one dict per logged step: ``{"train": {...}, "global_step": n}``.
    """

    def __init__(self, progress: Progress, loss_log: Path, total_steps: int | None = None) -> None:
        super().__init__(level=logging.INFO)
        self.progress = progress
        self.loss_log = loss_log
        self.total_steps = total_steps

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg
        if not isinstance(message, dict):
            return
        if isinstance(message.get("val"), dict):
            # After each epoch the trainer measures the loss on its held-out split
            # ({"val": {"loss_epoch": ...}, "epoch": e}): the report's held-out curve.
            self._append({"epoch": message.get("epoch"), "val_loss": _held_out(message["val"])})
            return
        if "train" not in message:
            return
        metrics = message["train"]
        step = int(message.get("global_step", 0))
        loss = _number(metrics.get("loss"))
        tokens = _number((message.get("profile") or {}).get("tokens_per_s"))
        line = {"step": step, "loss": loss, "tokens_per_s": tokens}
        if message.get("epoch") is not None:
            line["epoch"] = message["epoch"]
        self._append(line)
        self.progress.step(step + 1, self.total_steps, loss, tokens)

    def _append(self, line: dict[str, Any]) -> None:
        # Appended, not rewritten: the loss curve survives a resumed run.
        with self.loss_log.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


def _held_out(metrics: dict[str, Any]) -> float | None:
    """The epoch's held-out loss: ``loss_epoch`` (speculators 0.9), else ``loss``."""
    for key in ("loss_epoch", "loss"):
        if key in metrics:
            return _number(metrics[key])
    return None


def _number(value: Any) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
