"""The drafter job's loss log (specfleet.host.drafter.progress.TrainingMetricsHandler): the
trainer's records as speculators logs them, each training step with its epoch, and each
epoch's held-out loss, for the report's per-epoch curves."""

from __future__ import annotations

import json
import logging

from specfleet.host.drafter.progress import Progress, TrainingMetricsHandler


def test_training_steps_and_held_out_losses_reach_the_loss_log(tmp_path):
    log = tmp_path / "loss.jsonl"
    handler = TrainingMetricsHandler(Progress(tmp_path / "p.json", "r", ["train"]), log, 4)
    logger = logging.getLogger("speculators.metrics.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for step, epoch in ((0, 0), (1, 0), (2, 1), (3, 1)):
            logger.info({"train": {"loss": 2.0 - step / 4}, "global_step": step, "epoch": epoch})
            if step % 2 == 1:
                logger.info({"val": {"loss_epoch": 1.9 - step / 8}, "epoch": epoch})
        logger.info("a line that is not a record")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["step"], line["epoch"], line["loss"]) for line in lines if "step" in line] == [
        (0, 0, 2.0),
        (1, 0, 1.75),
        (2, 1, 1.5),
        (3, 1, 1.25),
    ]
    assert [line for line in lines if "val_loss" in line] == [
        {"epoch": 0, "val_loss": 1.775},
        {"epoch": 1, "val_loss": 1.525},
    ]
