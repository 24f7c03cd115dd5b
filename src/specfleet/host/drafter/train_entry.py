"""The training process: speculators' trainer, reporting into the run's progress file.

``python -m specfleet.host.drafter.train_entry [--cpu-compat] --progress FILE --loss-log FILE
[--summary FILE] -- <speculators train arguments>``. A process of its own, so that the CPU
workarounds touch nothing but it and the memory it takes is returned when it ends.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import warnings
from pathlib import Path

from specfleet.host.drafter.progress import Progress, TrainingMetricsHandler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.drafter.train_entry")
    parser.add_argument(
        "--cpu-compat", action="store_true", help="train without an accelerator (cpu_compat)"
    )
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--loss-log", type=Path, required=True)
    parser.add_argument(
        "--summary", type=Path, help="JSON written at the end: the peak GPU memory (MiB)"
    )
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    train_args = [word for word in args.train_args if word != "--"]

    if args.cpu_compat:
        from specfleet.host.drafter import cpu_compat

        cpu_compat.patch_speculators_training()
        bf16 = cpu_compat.native_bf16()
        # Said in the stage log: the dtype decides how long the stage takes on a CPU.
        print(f"specfleet: training in {'bfloat16' if bf16 else 'float32'} on this CPU", flush=True)
        # Speculators' own float32 choice runs autocast with a dtype it does not support,
        # which torch disables (what is meant) with a warning once per process.
        warnings.filterwarnings("ignore", message="In CPU autocast, but the target dtype")
        train_args = cpu_compat.train_args(bf16) + train_args

    import speculators.train.trainer as trainer
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig

    handler = TrainingMetricsHandler(Progress.attach(args.progress), args.loss_log)

    # Hooked where the trainer is built: by then speculators has configured its metric
    # loggers (which replaces their handlers) and the total step count is known.
    original_init = trainer.Trainer.__init__

    def init_with_total(self: trainer.Trainer, *init_args: object, **kwargs: object) -> None:
        original_init(self, *init_args, **kwargs)
        handler.total_steps = len(self.train_loader) * self.config.num_epochs
        logging.getLogger("speculators.metrics").addHandler(handler)

    trainer.Trainer.__init__ = init_with_total  # type: ignore[method-assign]
    train(TrainConfig.resolve(train_args))
    # Under torchrun every process trains; the first one's figure is the summary's.
    if args.summary and os.environ.get("RANK", "0") == "0":
        peak = None if args.cpu_compat else peak_gpu_mib()  # a CPU run uses no GPU memory
        args.summary.write_text(json.dumps({"peak_gpu_mib": peak}) + "\n")
    return 0


def peak_gpu_mib() -> float | None:
    """The most GPU memory torch held at once in this process (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


if __name__ == "__main__":
    raise SystemExit(main())
