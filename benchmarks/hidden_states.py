"""Hidden-state extraction throughput: transformers (the fallback) next to vLLM.

Run it with the interpreter of a venv that has torch, transformers, datasets and
safetensors (the stack venv on a host, or the test suite's cached one)::

    python benchmarks/hidden_states.py PREPARED_DIR TARGET_DIR \\
        [--manifest STAGE_DIR/manifest.json] [--hidden STAGE_DIR/hidden] [--limit N]

``PREPARED_DIR`` is the prepare stage's ``data`` directory (a ``datasets`` dir with
``input_ids``), ``TARGET_DIR`` the target model. It prints, in tokens/s:

* a bare transformers forward over the prepared rows (the decoder stack, no LM head,
  no ``output_hidden_states``): the floor for any transformers extraction;
* the transformers extraction of :mod:`specfleet.host.drafter.hidden_states_hf`, into a
  temporary directory, files written;
* with ``--manifest`` (the vLLM hidden_states stage's ``manifest.json``), vLLM's figure
  from its ``outputs`` (tokens / extraction_s, server start-up excluded).

Model loading is timed apart from both transformers figures, as vLLM's excludes server
start-up. With ``--hidden`` (vLLM's ``hs_<i>.safetensors`` directory) it also compares
the two extractions' files, layer by layer. Layer ids default to the manifest's
settings, else EAGLE-3's default taps, plus the last layer.

On a machine other work shares, pass ``--threads``: torch's default (one thread per
core) spin-waits against the other processes, and a small target's forward then runs
tens of times slower than on one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prepared", type=Path, help="the prepare stage's data dir")
    parser.add_argument("target", type=Path, help="the target model dir")
    parser.add_argument("--manifest", type=Path, help="vLLM hidden_states manifest.json")
    parser.add_argument("--hidden", type=Path, help="vLLM's hs_<i>.safetensors dir")
    parser.add_argument("--limit", type=int, help="only the first N prepared rows")
    parser.add_argument(
        "--layer-ids",
        type=lambda text: [int(part) for part in text.split(",")],
        help="comma-separated, vLLM numbering, the last one included (default: as the run)",
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser.parse_args(argv)


def _layer_ids(args: argparse.Namespace, manifest: dict[str, Any] | None) -> list[int]:
    from specfleet.host.drafter.inputs import TargetFacts, default_layer_ids

    if args.layer_ids:
        return list(args.layer_ids)
    num_layers = TargetFacts.read(args.target).num_layers
    taps = (manifest or {}).get("settings", {}).get("layer_ids")
    return [*(taps or default_layer_ids(num_layers)), num_layers]


def _compare(ours: Path, theirs: Path, count: int, layer_ids: list[int]) -> dict[str, Any]:
    """Per layer id: worst max-abs difference and worst cosine over the shared files."""
    import torch
    from safetensors.torch import load_file

    worst_diff = [0.0] * len(layer_ids)
    worst_cos = [1.0] * len(layer_ids)
    compared = 0
    token_mismatch = 0
    for index in range(count):
        other = theirs / f"hs_{index}.safetensors"
        if not other.is_file():
            continue
        a, b = load_file(ours / f"hs_{index}.safetensors"), load_file(other)
        if not torch.equal(a["token_ids"], b["token_ids"]):
            token_mismatch += 1
            continue
        if a["hidden_states"].shape != b["hidden_states"].shape:
            raise SystemExit(
                f"hs_{index}: shapes differ, {list(a['hidden_states'].shape)} here and "
                f"{list(b['hidden_states'].shape)} in {theirs}; pass the run's --layer-ids"
            )
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        for j in range(len(layer_ids)):
            diff = (x[:, j] - y[:, j]).abs().max().item()
            cos = torch.nn.functional.cosine_similarity(x[:, j], y[:, j], dim=-1).min().item()
            worst_diff[j] = max(worst_diff[j], diff)
            worst_cos[j] = min(worst_cos[j], cos)
        compared += 1
    return {
        "files": compared,
        "token_mismatch": token_mismatch,
        "layers": {
            str(k): {"max_abs_diff": worst_diff[j], "min_cosine": worst_cos[j]}
            for j, k in enumerate(layer_ids)
        },
    }


def _figure(label: str, tokens: float, seconds: float) -> str:
    rate = tokens / seconds if seconds else float("nan")
    return f"{label:<34} {rate:>12,.1f} tokens/s  ({int(tokens)} tokens in {seconds:.3f} s)"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        import specfleet.host.drafter  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(SRC))

    import torch
    from datasets import load_from_disk

    from specfleet.host.drafter.hidden_states_hf import extract_rows, load_target, time_bare_forward

    if args.threads:
        torch.set_num_threads(args.threads)
    manifest = json.loads(args.manifest.read_text()) if args.manifest else None
    layer_ids = _layer_ids(args, manifest)
    rows = load_from_disk(str(args.prepared))
    if args.limit is not None:
        rows = rows.select(range(min(args.limit, len(rows))))

    started = time.perf_counter()
    model = load_target(args.target)
    load_s = time.perf_counter() - started
    bare = time_bare_forward(model, rows)
    with tempfile.TemporaryDirectory(prefix="hidden-states-bench-") as temp:
        hidden = Path(temp) / "hidden"
        started = time.perf_counter()
        tokens = extract_rows(model, rows, hidden, layer_ids)
        extract_s = time.perf_counter() - started
        written = sum(path.stat().st_size for path in hidden.glob("hs_*.safetensors"))
        comparison = _compare(hidden, args.hidden, len(rows), layer_ids) if args.hidden else None

    result: dict[str, Any] = {
        "rows": len(rows),
        "layer_ids": layer_ids,
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "bare_forward": bare,
        "extraction": {
            "tokens": tokens,
            "seconds": extract_s,
            "tokens_per_s": tokens / extract_s if extract_s else 0.0,
            "bytes": written,
        },
    }
    if manifest is not None:
        result["vllm"] = {
            key: manifest.get("outputs", {}).get(key)
            for key in ("tokens", "extraction_s", "tokens_per_s", "files")
        }
    if comparison is not None:
        result["comparison"] = comparison

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{len(rows)} rows, layer ids {layer_ids}, {torch.get_num_threads()} CPU threads, "
        f"target loaded in {load_s:.2f} s (not counted below)"
    )
    print(_figure("transformers bare forward", bare["tokens"], bare["seconds"]))
    print(_figure("transformers hidden states", tokens, extract_s) + f", {written:,} bytes")
    if manifest is not None:
        vllm = result["vllm"]
        if vllm["tokens"] and vllm["extraction_s"]:
            print(_figure("vLLM hidden states (manifest)", vllm["tokens"], vllm["extraction_s"]))
        else:
            print(f"{'vLLM hidden states (manifest)':<34} no figure in {args.manifest}")
        if args.limit is not None:
            print("  (vLLM's figure covers the whole prepared set, not --limit rows)")
    if comparison is not None:
        print(
            f"against {args.hidden}: {comparison['files']} files compared, "
            f"{comparison['token_mismatch']} with other token ids"
        )
        for layer, figures in comparison["layers"].items():
            print(
                f"  layer {layer:>3}: max |diff| {figures['max_abs_diff']:.4g}, "
                f"min cosine {figures['min_cosine']:.6f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
