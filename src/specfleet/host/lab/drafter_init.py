"""An untrained EAGLE-3 drafter shaped for a given target: what a lab serves before training.

vLLM serves a target with EAGLE-3 only beside a drafter of matching shapes. Before a
drafter is trained for a real target (SmolLM2 in the lab), this writes one with seeded
random weights in vLLM's native format: the target's hidden size, heads and MLP width,
one decoder layer, and the whole target vocabulary as its draft vocabulary (so no
``d2t`` mapping). It accepts almost nothing; it is the baseline a trained drafter is measured
against, and what keeps the server's configuration the same before and after training.

Usage: ``python -m specfleet.host.lab.drafter_init TARGET_DIR OUT_DIR [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specfleet.host.lab.tinymodels import MIN_LAYERS, TinySpec, drafter_config_with, drafter_tensors


def spec_for(text: dict[str, Any], seed: int) -> TinySpec:
    """The drafter's shapes, read from the target's (text) config."""
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    if int(text.get("head_dim") or hidden // heads) * heads != hidden:
        raise ValueError("the target's head_dim times heads is not its hidden size: not supported")
    spec = TinySpec(
        layers=max(int(text["num_hidden_layers"]), MIN_LAYERS),
        seed=seed,
        hidden_size=hidden,
        intermediate_size=int(text["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(text.get("num_key_value_heads") or heads),
        vocab_size=int(text["vocab_size"]),
        draft_vocab_size=int(text["vocab_size"]),
        max_position_embeddings=int(text.get("max_position_embeddings", 2048)),
    )
    spec.check()
    return spec


def write(target: Path, out: Path, seed: int = 0) -> dict[str, Any]:
    from safetensors.torch import save_file

    target_config = json.loads((target / "config.json").read_text())
    text = target_config.get("text_config", target_config)
    spec = spec_for(text, seed)
    special = {key: text.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    staged = out.with_name(f".{out.name}.tmp")
    staged.mkdir(parents=True, exist_ok=True)
    tensors = drafter_tensors(spec, range(spec.vocab_size))
    # The draft vocabulary is the whole target vocabulary: vLLM then makes no draft-to-
    # target mapping, and refuses a `d2t` it has no parameter for.
    del tensors["d2t"]
    save_file(tensors, str(staged / "model.safetensors"), metadata={"format": "pt"})
    config = drafter_config_with(spec, spec.vocab_size, special)
    (staged / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in (staged, *staged.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    staged.rename(out)
    return {"drafter": str(out), "hidden_size": spec.hidden_size, "vocab": spec.vocab_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="the target model folder")
    parser.add_argument("out", type=Path, help="the drafter folder to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"drafter_init: {args.out} exists", file=sys.stderr)
        return 2
    try:
        result = write(args.target, args.out, args.seed)
    except (OSError, KeyError, ValueError) as error:
        print(f"drafter_init: {args.target}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
