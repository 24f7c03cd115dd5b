"""Hidden states with Hugging Face transformers: the fallback for small targets.

The hidden-states stage normally runs vLLM (speculators ``generate-offline-data``). This
module is the fallback for targets small enough to load whole on one device (here the
CPU): one plain transformers forward per sample, no server. It writes the very files
vLLM does, so training cannot tell them apart: ``<hidden>/hs_<i>.safetensors`` holding
``token_ids`` (int64 ``[T]``) and ``hidden_states`` (bfloat16 ``[T, L, H]``, one slice
per requested layer id, in the order given).

Layer ids are vLLM's numbering: id ``k`` is the *input* of decoder layer ``k``, which is
transformers' ``output_hidden_states[k]`` (index 0 is the embeddings). The last id,
``num_hidden_layers``, is the last decoder layer's output *before* the final norm. That
one transformers does not give: its ``output_hidden_states[-1]`` is taken after the final
norm. So a forward hook on the last decoder layer captures it instead.

A sample whose file exists and opens is skipped, and each file is written under a
temporary name in the same directory and renamed into place, so an interrupted run
resumes where it stopped and never leaves a half-written ``hs_<i>.safetensors``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specfleet.host.drafter.progress import Progress

#: Rows between two progress updates.
PROGRESS_EVERY = 10


def load_target(target: Path) -> Any:
    """The whole target in bfloat16 on the CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    model.to("cpu")
    model.eval()
    return model


def _rows(prepared: Path) -> Any:
    from datasets import load_from_disk

    return load_from_disk(str(prepared))


def _token_ids(rows: Any, index: int) -> Any:
    import torch

    return torch.tensor(list(rows[index]["input_ids"]), dtype=torch.int64)


def _decoder_layers(model: Any) -> Any:
    """The decoder's layer list (``model.model.layers`` for Llama and its kin)."""
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find the decoder layers")
    return layers


def _readable(path: Path) -> bool:
    """True when path exists and safetensors can open it (the header is intact)."""
    from safetensors import safe_open

    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt"):
            return True
    except Exception:
        return False


def _save_atomic(tensors: dict[str, Any], path: Path) -> None:
    """Write under a temporary name in path's directory, then rename into place.

    The temporary name does not match ``hs_*.safetensors``, so neither this module nor
    speculators ever counts a half-written file as done.
    """
    from safetensors.torch import save_file

    fd, temp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, temp)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _last_layer_output(layers: Any) -> Iterator[list[Any]]:
    """Capture the last decoder layer's output (before the final norm) on each forward."""
    captured: list[Any] = []

    def hook(_module: Any, _inputs: Any, output: Any) -> None:
        captured.clear()
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = layers[-1].register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def extract(
    target: Path,
    prepared: Path,
    hidden: Path,
    layer_ids: list[int],
    progress: Progress | None = None,
) -> int:
    """Write ``hs_<i>.safetensors`` for every prepared row not yet written.

    Returns the number of tokens run through the target by this call (rows skipped
    because their file was already there count nothing).
    """
    rows = _rows(prepared)
    return extract_rows(load_target(target), rows, hidden, layer_ids, progress)


def extract_rows(
    model: Any,
    rows: Any,
    hidden: Path,
    layer_ids: list[int],
    progress: Progress | None = None,
) -> int:
    """:func:`extract` with the target already loaded and the rows already read."""
    import torch

    layers = _decoder_layers(model)
    num_layers = len(layers)
    bad = [k for k in layer_ids if not 0 <= k <= num_layers]
    if not layer_ids or bad:
        raise ValueError(f"layer ids must be in 0..{num_layers}, got {layer_ids}")
    # The last id is served by the hook; every other one needs the per-layer states.
    need_all = any(k < num_layers for k in layer_ids)

    hidden.mkdir(parents=True, exist_ok=True)
    for stale in hidden.glob(".hs_*.tmp"):
        stale.unlink(missing_ok=True)

    total = len(rows)
    tokens = 0
    started = time.monotonic()
    with torch.inference_mode(), _last_layer_output(layers) as last:
        for index in range(total):
            path = hidden / f"hs_{index}.safetensors"
            if not _readable(path):
                token_ids = _token_ids(rows, index)
                last.clear()
                out = model.base_model(
                    input_ids=token_ids.unsqueeze(0).to(model.device),
                    output_hidden_states=need_all,
                    use_cache=False,
                )
                states = [
                    last[0][0] if k == num_layers else out.hidden_states[k][0] for k in layer_ids
                ]
                # Saved from host memory, whatever device the target runs on.
                stacked = torch.stack(states, dim=1).to("cpu", torch.bfloat16).contiguous()
                _save_atomic({"token_ids": token_ids, "hidden_states": stacked}, path)
                tokens += token_ids.numel()
            done = index + 1
            if progress is not None and (done % PROGRESS_EVERY == 0 or done == total):
                elapsed = time.monotonic() - started
                rate = round(tokens / elapsed, 1) if tokens and elapsed else None
                progress.step(done, total, tokens_per_s=rate)
    return tokens


def bare_forward_tokens_per_s(
    target: Path, prepared: Path, limit: int | None = None
) -> dict[str, float]:
    """Time plain forwards over the prepared rows (the first ``limit`` of them).

    The same forward :func:`extract` runs (the decoder stack, no LM head, CPU,
    bfloat16), without ``output_hidden_states``, the hook or any writing: the floor
    extraction is measured against. Loading the model is not timed.
    """
    return time_bare_forward(load_target(target), _rows(prepared), limit)


def time_bare_forward(model: Any, rows: Any, limit: int | None = None) -> dict[str, float]:
    """:func:`bare_forward_tokens_per_s` with the target loaded; one untimed warm-up."""
    import torch

    count = len(rows) if limit is None else min(limit, len(rows))
    tokens = 0
    seconds = 0.0
    with torch.inference_mode():
        if count:  # untimed: first-call allocations are not throughput
            model.base_model(input_ids=_token_ids(rows, 0).unsqueeze(0), use_cache=False)
        for index in range(count):
            token_ids = _token_ids(rows, index)
            started = time.perf_counter()
            model.base_model(input_ids=token_ids.unsqueeze(0), use_cache=False)
            seconds += time.perf_counter() - started
            tokens += token_ids.numel()
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
    }
