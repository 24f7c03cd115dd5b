"""The drafter job's report: its two plots read at a glance (specfleet.host.drafter.report).

The pytest process has no matplotlib (the hosts' stack venv has it): one script runs in the
cached cpu stack venv, draws every figure below from the synthetic records this module
builds, writes the report twice and prints what the assertions read as one JSON document.
The per-epoch table (``loss_by_epoch``) is plain Python and is checked here directly.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from specfleet.host.drafter import report

RESULTS = {
    "candidate": {"mean_acceptance_length": 2.22, "acceptance_by_position": [0.6, 0.37, 0.24]},
    "baseline": {"mean_acceptance_length": 1.5, "acceptance_by_position": [0.3, 0.15, 0.05]},
}
EPOCHS, STEPS_PER_EPOCH = 4, 25
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def train_losses(*, with_epoch: bool) -> list[dict[str, Any]]:
    """What the training log holds: one record per step, the loss falling."""
    return [
        {"step": step, "loss": 10 * math.exp(-step / 30), "tokens_per_s": 800.0}
        | ({"epoch": step // STEPS_PER_EPOCH} if with_epoch else {})
        for step in range(EPOCHS * STEPS_PER_EPOCH)
    ]


HELD_OUT = [{"epoch": epoch, "val_loss": 5.0 - epoch} for epoch in range(EPOCHS)]


def report_losses(*, held_out: bool) -> list[dict[str, Any]]:
    """The losses the report is written from: steps without epochs, the held-out or not."""
    return train_losses(with_epoch=False) + (HELD_OUT if held_out else [])


# Runs in the stack venv: argv[1] is the cases file (written by the fixture), argv[2] the
# folder the reports are written under. Prints one JSON line: each figure as the tests read it.
SCRIPT = r"""
import json, sys
from pathlib import Path

import matplotlib

from specfleet.host.drafter import report

spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(sys.argv[2])
results, epochs, magic = spec["results"], spec["epochs"], bytes.fromhex(spec["png_magic"])


def described(figure):
    axes = figure.axes[0]
    legend = axes.get_legend()
    return {
        "axes": len(figure.axes),
        "title": axes.get_title(),
        "xlabel": axes.get_xlabel(),
        "xticks": [float(tick) for tick in axes.get_xticks()],
        "xticklabels": [label.get_text() for label in axes.get_xticklabels()],
        "texts": [text.get_text() for text in axes.texts],
        "legend": None if legend is None else [text.get_text() for text in legend.get_texts()],
        "bars_x": [float(bar.get_x()) for bar in axes.patches],
        "lines": [
            {"label": line.get_label(), "ydata": [float(y) for y in line.get_ydata()]}
            for line in axes.get_lines()
        ],
    }


found = {
    "matplotlib": matplotlib.__version__,
    "acceptance": described(report.acceptance_figure(results, heldout_prompts=79)),
    "acceptance_candidate_only": described(
        report.acceptance_figure({"candidate": results["candidate"]}, heldout_prompts=5)
    ),
    "loss": {name: described(report.loss_figure(losses, epochs))
             for name, losses in spec["loss_cases"].items()},
    "loss_steps": described(report.loss_figure(spec["steps_only"], None)),
    "write_report": {},
}
for name, losses in spec["report_cases"].items():
    folder = out / name
    folder.mkdir(parents=True)
    written = report.write_report(
        folder,
        results,
        losses=losses,
        stage_walls={"train": 12.5},
        # As the train stage reports it: the final checkpoint is ckpt/<epochs - 1>.
        figures={"train": {"checkpoint": f"/run/stages/train-x/ckpt/{epochs - 1}"}},
        heldout_prompts=79,
    )
    found["write_report"][name] = {
        "written": str(written.relative_to(folder)),
        "files": sorted(path.name for path in folder.iterdir()),
        "png": {path.name: path.read_bytes()[:8] == magic for path in folder.glob("*.png")},
        "data": json.loads(written.read_text()),
        "loss_figure": described(report.loss_figure(losses, epochs)),
    }
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every figure of the tests below, drawn once in the cpu stack venv."""
    from specfleet.controller.stackvenv import run_json, stack_python

    work = tmp_path_factory.mktemp("drafter-report")
    cases = work / "cases.json"
    cases.write_text(
        json.dumps(
            {
                "results": RESULTS,
                "epochs": EPOCHS,
                "png_magic": PNG_MAGIC.hex(),
                "loss_cases": {
                    f"with_epoch={with_epoch}": train_losses(with_epoch=with_epoch) + HELD_OUT
                    for with_epoch in (True, False)
                },
                "steps_only": train_losses(with_epoch=False),
                "report_cases": {
                    f"held_out={held_out}": report_losses(held_out=held_out)
                    for held_out in (True, False)
                },
            }
        )
    )
    return run_json(stack_python("cpu"), "-c", SCRIPT, str(cases), str(work / "out"), timeout=300)


@pytest.mark.slow
def test_acceptance_plot_has_integer_positions_and_a_label_per_bar(drawn):
    axes = drawn["acceptance"]
    assert axes["axes"] == 1
    assert axes["xticklabels"] == ["1", "2", "3"]
    assert axes["xticks"] == [1, 2, 3]
    bars_x = axes["bars_x"]
    assert len(bars_x) == 6
    assert sorted(axes["texts"]) == sorted(
        f"{value:.2f}" for item in RESULTS.values() for value in item["acceptance_by_position"]
    )
    # The baseline first (left of the candidate at each position), each with its mean length.
    assert axes["legend"] == [
        "baseline: mean acceptance length 1.50",
        "candidate: mean acceptance length 2.22",
    ]
    baseline_x, candidate_x = bars_x[:3], bars_x[3:]
    assert all(b < c for b, c in zip(baseline_x, candidate_x, strict=True))
    assert "79 held-out prompts" in axes["title"]


@pytest.mark.slow
def test_acceptance_plot_without_a_baseline(drawn):
    axes = drawn["acceptance_candidate_only"]
    assert axes["axes"] == 1
    assert len(axes["bars_x"]) == 3 and len(axes["texts"]) == 3
    assert axes["xticklabels"] == ["1", "2", "3"]


@pytest.mark.parametrize("with_epoch", [True, False])
def test_loss_per_epoch_with_the_held_out_values(with_epoch):
    losses = train_losses(with_epoch=with_epoch) + HELD_OUT
    rows = report.loss_by_epoch(losses, EPOCHS)
    assert [row["epoch"] for row in rows] == [1, 2, 3, 4]
    assert [row["val_loss"] for row in rows] == [5.0, 4.0, 3.0, 2.0]
    expected = [
        sum(10 * math.exp(-s / 30) for s in range(e * 25, e * 25 + 25)) / 25 for e in range(4)
    ]
    assert [row["train_loss"] for row in rows] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("with_epoch", [True, False])
def test_loss_plot_per_epoch_with_the_held_out_curve(drawn, with_epoch):
    axes = drawn["loss"][f"with_epoch={with_epoch}"]
    assert axes["axes"] == 1
    assert [line["label"] for line in axes["lines"]] == [
        "training, per step (moving average)",
        "training, mean per epoch",
        "held-out (validation split), after each epoch",
    ]
    assert axes["xlabel"] == "epoch"
    assert axes["xticks"] == [1, 2, 3, 4]
    assert axes["lines"][2]["ydata"] == [5.0, 4.0, 3.0, 2.0]


def test_loss_without_epochs_has_no_epoch_table():
    assert report.loss_by_epoch(train_losses(with_epoch=False), None) == []


@pytest.mark.slow
def test_loss_without_epochs_falls_back_to_smoothed_steps(drawn):
    axes = drawn["loss_steps"]
    assert axes["axes"] == 1
    assert axes["xlabel"] == "global step"
    assert "training (moving average)" in [line["label"] for line in axes["lines"]]


def test_a_resumed_run_counts_each_step_once():
    losses = train_losses(with_epoch=False)
    resumed = losses + [dict(item, loss=1.0) for item in losses[50:]]  # epochs 3-4 again
    rows = report.loss_by_epoch(resumed, EPOCHS)
    assert [row["train_loss"] for row in rows[2:]] == [1.0, 1.0]


@pytest.mark.slow
@pytest.mark.parametrize("held_out", [True, False])
def test_write_report(drawn, held_out):
    losses = report_losses(held_out=held_out)
    found = drawn["write_report"][f"held_out={held_out}"]
    assert found["written"] == "report.json"
    assert found["files"] == ["report-acceptance.png", "report-loss.png", "report.json"]
    data = found["data"]
    assert data["acceptance"] == RESULTS and data["heldout_prompts"] == 79
    assert data["loss_points"] == len(losses)
    assert [row["epoch"] for row in data["loss_by_epoch"]] == [1, 2, 3, 4]
    assert all((row["val_loss"] is not None) == held_out for row in data["loss_by_epoch"])
    assert found["png"] == {"report-loss.png": True, "report-acceptance.png": True}
    axes = found["loss_figure"]
    assert axes["axes"] == 1
    assert ("no held-out loss logged" in axes["texts"]) is not held_out
