"""Acceptance against training data: SmolLM2's drafter trained on more and more prompts.

One command, from the repository, with the controller's venv::

    .venv/bin/python benchmarks/acceptance_curve.py [--sizes 300,600,1200,all] \
        [--label NAME] [real_model.py's training options, e.g. --epochs 8 --train-args ...]

For each size it runs ``benchmarks/real_model.py --train-only --prompts SIZE`` (the drafter
pipeline, exactly as the drafter_training job runs it): every size is measured on the same
held-out documentation topics, and a larger training set holds the smaller ones, so the
curve measures the data, not the draw. Each point is a pipeline run cached by content under
real_model's ``--work``: a command cut short (a session's end, a reboot) resumes from the
stages and checkpoints it reached, and a finished point costs nothing the next time.

It reads each run's own evaluation (vLLM's counters on every held-out prompt, k=3),
records the point under ``--label`` in ``curve.json`` beside the runs (other labels, e.g.
another ``--train-args``, are kept: the plot draws each as a line), fits mean acceptance
length against the logarithm of the training prompts, says how many prompts the fit
predicts for ``--goal``, and draws ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import real_model  # noqa: E402  (beside this file)

DEFAULT_PLOT = real_model.ROOT / "docs" / "real-model" / "acceptance-vs-prompts.png"


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default="300,600,1200,all",
        help="training prompts, a list (all: every prompt not held out)",
    )
    parser.add_argument("--label", default="defaults", help="this line's name in the plot")
    parser.add_argument("--goal", type=float, default=3.0, help="mean acceptance length")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT)
    # Internal: draw the plot with the stack's interpreter (it has matplotlib).
    parser.add_argument("--draw", type=Path, help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def point(config_file: Path) -> dict[str, Any]:
    """A finished run's figures, from its stages' manifests."""
    from specfleet.host.drafter.config import RunConfig
    from specfleet.host.drafter.inputs import TargetFacts
    from specfleet.host.drafter.progress import Progress
    from specfleet.host.drafter.stages import STAGES, Context, plan

    config = RunConfig.load(config_file)
    scratch = config_file.with_suffix(".plan-progress.json")
    ctx = Context(config, TargetFacts.read(Path(config.target)), Progress(scratch, "", []))
    plan(ctx)
    scratch.unlink(missing_ok=True)
    manifest = {stage.name: ctx.manifest(stage.name) for stage in STAGES}
    candidate = manifest["evaluate"]["outputs"]["candidate"]
    walls = {name: m["wall_s"] for name, m in manifest.items()}
    return {
        "train_prompts": manifest["prompts"]["outputs"]["train_rows"],
        "heldout_prompts": manifest["prompts"]["outputs"]["heldout_rows"],
        "heldout_topics": manifest["prompts"]["outputs"]["heldout_groups"],
        "mean_acceptance_length": candidate["mean_acceptance_length"],
        "acceptance_by_position": candidate["acceptance_by_position"],
        "train_tokens_per_s": manifest["train"]["outputs"].get("tokens_per_s"),
        "final_held_out_loss": manifest["train"]["outputs"].get("final_held_out_loss"),
        "stage_wall_s": walls,
        "cpu_hours": round(sum(walls.values()) * (os.cpu_count() or 1) / 3600, 2),
        "config": str(config_file),
    }


def fit(points: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Least squares of mean acceptance length against ln(training prompts): (a, b)."""
    xs = [math.log(p["train_prompts"]) for p in points]
    ys = [p["mean_acceptance_length"] for p in points]
    if len(set(xs)) < 2:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return mean_y - slope * mean_x, slope


def prompts_for(goal: float, line: tuple[float, float] | None) -> int | None:
    """The training prompts the fitted line reaches ``goal`` at (None: it never does)."""
    if line is None or line[1] <= 0:
        return None
    return round(math.exp((goal - line[0]) / line[1]))


def draw(curve: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for label, points in sorted(curve["lines"].items()):
        ordered = sorted(points.values(), key=lambda p: p["train_prompts"])
        xs = [p["train_prompts"] for p in ordered]
        ys = [p["mean_acceptance_length"] for p in ordered]
        if len(xs) == 1:  # a setting tried at one size: its figure goes in the legend
            axes.plot(xs, ys, marker="D", ls="", label=f"{label}: {ys[0]:.2f}")
            continue
        (line,) = axes.plot(xs, ys, marker="o", label=label)
        for p in ordered:
            axes.annotate(f"{p['mean_acceptance_length']:.2f}\n{p['cpu_hours']} CPU-h",
                          (p["train_prompts"], p["mean_acceptance_length"]),
                          textcoords="offset points", xytext=(6, -4), ha="left", va="top",
                          fontsize=7)  # fmt: skip
        fitted = fit(ordered)
        if fitted:
            span = [min(xs), max(max(xs) * 4, prompts_for(curve["goal"], fitted) or 0)]
            grid = [span[0] * (span[1] / span[0]) ** (i / 40) for i in range(41)]
            axes.plot(grid, [fitted[0] + fitted[1] * math.log(x) for x in grid], ls=":",
                      color=line.get_color(), lw=1)  # fmt: skip
    axes.axhline(curve["goal"], color="grey", ls="--", lw=1)
    axes.set_xscale("log")
    axes.set_xlabel("training prompts (documentation topics; log scale)")
    axes.set_ylabel("mean acceptance length, k=3")
    held = next(iter(next(iter(curve["lines"].values())).values()))
    axes.set_title(
        f"SmolLM2-135M's EAGLE-3 drafter: {held['heldout_prompts']} held-out prompts "
        f"({len(held['heldout_topics'])} topics), vLLM's counters",
        fontsize=10,
    )
    axes.legend(title="dotted: fit a + b ln(prompts)", fontsize=8, title_fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    args, passed = _parse(argv)
    if args.draw:
        draw(json.loads(args.draw.read_text()), args.plot)
        return 0
    sys.path.insert(0, str(real_model.SRC))
    options = real_model._parse(passed)
    curve_file = options.work / "curve.json"
    curve = json.loads(curve_file.read_text()) if curve_file.exists() else {"lines": {}}
    curve["goal"] = args.goal
    line = curve["lines"].setdefault(args.label, {})
    for size in args.sizes.split(","):
        print(f"[curve] {args.label}: {size} training prompts", file=sys.stderr)
        trained = real_model.train(real_model._parse([*passed, "--prompts", size]))
        line[size] = point(trained["config"])
        curve_file.write_text(json.dumps(curve, indent=2, sort_keys=True) + "\n")
    for label, points in sorted(curve["lines"].items()):
        ordered = sorted(points.values(), key=lambda p: p["train_prompts"])
        fitted = fit(ordered)
        predicted = prompts_for(args.goal, fitted)
        print(f"{label}:")
        for p in ordered:
            print(
                f"  {p['train_prompts']:>5} prompts: mean acceptance length "
                f"{p['mean_acceptance_length']:.3f}, by position {p['acceptance_by_position']}, "
                f"{p['cpu_hours']} CPU-hours"
            )
        if fitted:
            print(
                f"  fit: {fitted[0]:.3f} + {fitted[1]:.3f} ln(prompts); {args.goal} at about "
                f"{predicted if predicted else 'never'} prompts"
            )
    python = real_model._stack_python()
    env = dict(os.environ, PYTHONPATH=str(real_model.SRC))
    draw_argv = [str(Path(__file__)), "--draw", str(curve_file), "--plot", str(args.plot)]
    subprocess.run([str(python), *draw_argv], env=env, check=True)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
