"""The evaluation report: JSON figures and two PNG plots, written next to the drafter."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from specfleet.host.drafter.progress import write_json


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
    report = out / "report.json"
    write_json(
        report,
        {
            "heldout_prompts": heldout_prompts,
            "acceptance": results,
            "stage_walls_s": stage_walls,
            "figures": figures,
            "loss_points": len(losses),
        },
    )
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    points = [(p["step"], p["loss"]) for p in losses if _finite(p.get("loss"))]
    if points:
        axes.plot(*zip(*points, strict=True), linewidth=1)
        axes.set_yscale("log")
    axes.set(xlabel="global step", ylabel="training loss", title="Drafter training loss")
    figure.tight_layout()
    figure.savefig(out / "report-loss.png", dpi=100)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(len(results), 1)
    for index, (name, result) in enumerate(results.items()):
        by_position = result["acceptance_by_position"]
        xs = [
            position + 1 + (index - (len(results) - 1) / 2) * width
            for position in range(len(by_position))
        ]
        label = f"{name} (mean length {result['mean_acceptance_length']:.2f})"
        axes.bar(xs, by_position, width=width, label=label)
    axes.set(
        xlabel="draft position",
        ylabel="accepted / drafts",
        ylim=(0, 1),
        title=f"Acceptance by position ({heldout_prompts} held-out prompts)",
    )
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "report-acceptance.png", dpi=100)
    plt.close(figure)
    return report


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
