"""The evaluation report: JSON figures and two PNG plots, written next to the drafter.

The loss records are the training log's lines (``loss.jsonl``): ``{"step", "loss"}`` per
logged step, with ``"epoch"`` (0-based, as speculators counts) where the log keeps it. A
record with ``"epoch"`` and ``"val_loss"`` is the held-out loss after that epoch (speculators'
validation split); the loss plot draws it when there is one.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specfleet.host.drafter.progress import write_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The key of the served drafter the job measures beside the candidate (``baseline_drafter``).
BASELINE = "baseline"


def write_report(
    out: Path,
    results: dict[str, dict[str, Any]],
    *,
    losses: list[dict[str, Any]],
    stage_walls: dict[str, float],
    figures: dict[str, Any],
    heldout_prompts: int,
) -> Path:
    """Write ``report.json``, ``report-loss.png`` and ``report-acceptance.png`` under out."""
    epochs = _epoch_count(losses, figures)
    report = out / "report.json"
    write_json(
        report,
        {
            "heldout_prompts": heldout_prompts,
            "acceptance": results,
            "stage_walls_s": stage_walls,
            "figures": figures,
            "loss_points": len(losses),
            "loss_by_epoch": loss_by_epoch(losses, epochs),
        },
    )
    loss_figure(losses, epochs).savefig(out / "report-loss.png", dpi=100)
    acceptance_figure(results, heldout_prompts).savefig(out / "report-acceptance.png", dpi=100)
    return report


def acceptance_figure(results: dict[str, dict[str, Any]], heldout_prompts: int) -> Figure:
    """Bars per draft position 1..k, one per drafter (the baseline first), each labelled."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8), layout="tight")
    axes = figure.subplots()
    names = sorted(results, key=lambda name: name != BASELINE)
    k = max((len(results[name]["acceptance_by_position"]) for name in names), default=0)
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        by_position = results[name]["acceptance_by_position"]
        offset = (index - (len(names) - 1) / 2) * width
        bars = axes.bar(
            [position + offset for position in range(1, len(by_position) + 1)],
            by_position,
            width=width,
            color="tab:gray" if name == BASELINE else None,
            label=f"{name}: mean acceptance length {results[name]['mean_acceptance_length']:.2f}",
        )
        axes.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
    axes.set_xticks(range(1, k + 1), [str(position) for position in range(1, k + 1)])
    axes.set_yticks([0, 0.25, 0.5, 0.75, 1])
    axes.set(
        xlabel="draft position",
        ylabel="accepted / drafts",
        ylim=(0, 1.15),  # room for the labels over a bar at 1
        title=f"Acceptance by draft position ({heldout_prompts} held-out prompts)",
    )
    axes.legend(loc="upper right", fontsize=8)
    return figure


def loss_figure(losses: list[dict[str, Any]], epochs: int | None = None) -> Figure:
    """Mean training loss per epoch, the held-out loss per epoch, the steps' moving average.

    Without epochs (none in the records, none known) the smoothed loss over global steps.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.8), layout="tight")
    axes = figure.subplots()
    records = _train_records(losses)
    smoothed = _ema([item["loss"] for item in records])
    placed = _on_epochs(records, epochs)
    if placed:
        rows = loss_by_epoch(losses, epochs)
        trained = [
            (row["epoch"], row["train_loss"]) for row in rows if row["train_loss"] is not None
        ]
        held = [(row["epoch"], row["val_loss"]) for row in rows if row["val_loss"] is not None]
        axes.plot(
            [x for _, x in placed],
            smoothed,
            color="tab:blue",
            alpha=0.3,
            linewidth=1,
            label="training, per step (moving average)",
        )
        axes.plot(
            *zip(*trained, strict=True), "o-", color="tab:blue", label="training, mean per epoch"
        )
        if held:
            axes.plot(
                *zip(*held, strict=True),
                "s-",
                color="tab:orange",
                label="held-out (validation split), after each epoch",
            )
        else:
            axes.text(
                0.98,
                0.97,
                "no held-out loss logged",
                transform=axes.transAxes,
                ha="right",
                va="top",
                fontsize=8,
                color="gray",
            )
        last = max(row["epoch"] for row in rows)
        axes.set_xticks(range(1, last + 1))
        axes.set(xlim=(0.5, last + 0.5), xlabel="epoch", title="Drafter loss per epoch")
    else:
        steps = [item["step"] for item in records]
        if records:
            axes.plot(
                steps, [item["loss"] for item in records], color="tab:blue", alpha=0.2, linewidth=1
            )
            axes.plot(steps, smoothed, color="tab:blue", label="training (moving average)")
        axes.set(xlabel="global step", title="Drafter training loss (smoothed)")
    if records:
        axes.set_yscale("log")
        axes.legend(loc="lower left", fontsize=8)
    axes.set_ylabel("loss")
    return figure


def loss_by_epoch(losses: list[dict[str, Any]], epochs: int | None) -> list[dict[str, Any]]:
    """Per epoch (1-based): the mean training loss and the held-out loss, where known."""
    records = _train_records(losses)
    trained: dict[int, list[float]] = {}
    for item, (epoch, _) in zip(records, _on_epochs(records, epochs) or [], strict=False):
        trained.setdefault(epoch, []).append(item["loss"])
    held = {
        item["epoch"] + 1: float(item["val_loss"])
        for item in losses
        if _finite(item.get("val_loss")) and isinstance(item.get("epoch"), int)
    }
    return [
        {
            "epoch": epoch,
            "train_loss": round(math.fsum(trained[epoch]) / len(trained[epoch]), 6)
            if epoch in trained
            else None,
            "val_loss": held.get(epoch),
        }
        for epoch in sorted(trained.keys() | held.keys())
    ]


def _train_records(losses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The logged training steps in step order; a step logged again (a resumed run) keeps
    its last record."""
    last = {
        item["step"]: item
        for item in losses
        if isinstance(item.get("step"), int) and _finite(item.get("loss"))
    }
    return [last[step] for step in sorted(last)]


def _on_epochs(records: list[dict[str, Any]], epochs: int | None) -> list[tuple[int, float]] | None:
    """Each step's epoch (1-based) and x, epoch n spanning n - 0.5 to n + 0.5; None when
    neither the records nor the run tell the epochs."""
    if records and all(isinstance(item.get("epoch"), int) for item in records):
        counts = Counter(item["epoch"] for item in records)
        seen: Counter[int] = Counter()
        placed = []
        for item in records:
            epoch = item["epoch"]
            seen[epoch] += 1
            placed.append((epoch + 1, epoch + 0.5 + seen[epoch] / counts[epoch]))
        return placed
    if records and epochs:
        total = records[-1]["step"] + 1  # speculators' steps are even across epochs
        return [
            (
                min(item["step"] * epochs // total, epochs - 1) + 1,
                0.5 + (item["step"] + 1) * epochs / total,
            )
            for item in records
        ]
    return None


def _epoch_count(losses: list[dict[str, Any]], figures: dict[str, Any]) -> int | None:
    """The run's epochs: the train stage's own figure, its final checkpoint ``ckpt/<epochs - 1>``
    (speculators names a checkpoint by its epoch), else the held-out records' last epoch."""
    train = figures.get("train") or {}
    if isinstance(train.get("epochs"), int):
        return int(train["epochs"])
    final = Path(str(train.get("checkpoint") or "")).name
    if final.isdigit():
        return int(final) + 1
    held = [item["epoch"] for item in losses if isinstance(item.get("epoch"), int)]
    return max(held) + 1 if held else None


def _ema(values: list[float]) -> list[float]:
    """An exponential moving average spanning about a fiftieth of the run."""
    alpha = min(1.0, 50 / max(len(values), 1))
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else alpha * value + (1 - alpha) * smoothed[-1])
    return smoothed


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
