"""What vLLM and speculators need to run the drafter pipeline without an accelerator.

Used only when a run's ``cpu_compat`` is on (the ``cpu`` profile: the lab and CI). On GPU
hosts both libraries run as they are and nothing here is imported. Nothing here edits an
installed file: the connector is a subclass that vLLM loads by module path, and the training
workarounds are attribute replacements made in the training process alone, before
speculators' trainer is built.

Each workaround names the upstream behaviour it works around (vLLM 0.32.0 CPU build,
speculators 0.9.0, torch 2.13.0+cpu).
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

#: ``speculators train`` arguments without an accelerator: FlexAttention's backward and the
#: fused Triton loss kernel do not run on a CPU; dataloader worker processes only add
#: start-up time on a couple of cores.
TRAIN_ARGS = [
    "--draft-attn-impl",
    "sdpa",
    "--loss-implementation",
    "eager",
    "--num-workers",
    "0",
]


def native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def train_args(bf16: bool) -> list[str]:
    """``speculators train`` arguments for a CPU run, by whether it has native bfloat16.

    Upstream, the trainer computes under bfloat16 autocast (``--hidden-states-dtype``,
    default bfloat16; master weights stay float32). Without AVX512-BF16 or AMX, oneDNN
    emulates bfloat16 matmuls: measured here on an AVX2-only CPU, a training step took
    7.9 times as long as in float32 (1.5 against 12.0 steps/s). float32 is speculators'
    other documented choice: the hidden states load as float32 and autocast is off.
    """
    return TRAIN_ARGS if bf16 else [*TRAIN_ARGS, "--hidden-states-dtype", "float32"]


class _AlreadyDone:
    """Stands in for the CUDA event the parent waits on: a CPU copy is done when made."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's hidden-states connector with a plain CPU copy.

    Upstream: ``ExampleHiddenStatesConnector._submit_async_write`` copies the hidden
    states on a CUDA stream into pinned host memory (``pin_memory=True``) and records CUDA
    events; all three fail when torch has no accelerator. Here the KV cache already lives
    in host memory, so the slice is cloned directly and the rest of the parent's
    bookkeeping (lock file, writer thread, finished-request polling) is kept.
    """

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        hidden_states = extract_from_kv_cache(
            self._kv_cache, slot_mapping, pending.token_ids.shape[0]
        ).clone()
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}

        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _AlreadyDone()
        future = self._executor.submit(
            self._write_tensors, tensors, done, pending.filename, lock_fd
        )
        self._req_copy_events[pending.req_id] = done  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(lambda finished: self._on_write_done(pending.req_id, finished))


def patch_speculators_training() -> None:
    """Let speculators' single-process trainer run on the CPU.

    Call before ``speculators.train.cli.main``; affects this process only.
    """
    import speculators.train.checkpointer as checkpointer
    import speculators.train.trainer as trainer

    # Upstream: Trainer moves the model and every batch with `.to(self.local_rank)`, an
    # integer that torch reads as `cuda:<n>`. A device string works where an int did.
    trainer.get_local_rank = lambda: "cpu"  # type: ignore[assignment]

    # Upstream: Trainer picks the autocast device from
    # `torch.accelerator.current_accelerator()` and falls back to "cuda", which autocast
    # disables with a warning on a CPU-only torch; CPU autocast is what is meant.
    original_init = trainer.Trainer.__init__

    def init_on_cpu(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = init_on_cpu  # type: ignore[method-assign]

    # Upstream: the step timer calls `torch.accelerator.synchronize()`, which raises when
    # there is no accelerator; there is nothing to wait for on the CPU.
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *_args, **_kwargs: None  # type: ignore[assignment]

    # Upstream: resuming maps the checkpoint onto `get_current_device()`, which answers
    # "cuda:0" when there is no accelerator.
    checkpointer.get_current_device = lambda: "cpu"  # type: ignore[assignment]
