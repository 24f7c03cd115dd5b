"""Tiny local models for the lab and the tests: a target, its tokenizer, an EAGLE-3 drafter.

Everything is generated from a seed, offline, on a CPU, in a few seconds:

* ``OUT/target``: a Llama (or Mistral) causal LM with random weights in safetensors,
  8 or more decoder layers, hidden size 128, and a byte-level BPE tokenizer trained here
  on a seeded synthetic corpus, saved in Hugging Face format with a chat template;
* ``OUT/drafter``: an untrained EAGLE-3 drafter in vLLM's native checkpoint format
  (``LlamaForCausalLMEagle3``: one ``midlayer`` whose q/k/v projections take the
  embedding and the hidden state concatenated, ``fc`` folding three target hidden states
  into one, a reduced draft vocabulary with its ``d2t`` offsets);
* ``OUT/prompts.jsonl``: a seeded chat dataset (one user turn per row) for the drafter
  training pipeline, which regenerates the answers from the served target;
* ``OUT/tinymodels.json``: what was generated, with the seed, for the record.

The same seed, architecture and layer count give byte-identical files, so a re-run does not
change a drafter checksum (the ``vllm_server`` role restarts the server when it changes).

Only ``torch``, ``transformers``, ``tokenizers`` and ``safetensors`` are needed (all in the
vLLM virtualenv); they are imported inside the functions that use them, so the controller
can import this module without them.

Usage::

    python -m specfleet.host.lab.tinymodels OUT_DIR [--arch llama|mistral] [--layers 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
}
#: vLLM taps the inputs of target layers 2, N//2 and N-3 for EAGLE-3 by default; below
#: 8 layers two taps coincide and the drafter fails on a shape error.
MIN_LAYERS = 8
DRAFTER_ARCHITECTURE = "LlamaForCausalLMEagle3"

BOS = "<s>"
EOS = "</s>"
PAD = "<pad>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Shape of the generated models (the defaults are what the lab serves)."""

    arch: str = "llama"
    layers: int = MIN_LAYERS
    seed: int = 0
    # Seed of the drafter's weights alone (None: follow `seed`). Another value
    # gives a drafter with the same shapes and vocabulary but other weights,
    # as a retrained drafter would be.
    drafter_seed: int | None = None
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 1024
    draft_vocab_size: int = 512
    max_position_embeddings: int = 2048
    dtype: str = "bfloat16"
    corpus_sentences: int = 3000
    prompts: int = 440

    def check(self) -> None:
        """Raise ValueError for a shape vLLM could not serve as EAGLE-3 target + drafter."""
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {self.arch!r}")
        if self.layers < MIN_LAYERS:
            raise ValueError(
                f"layers must be >= {MIN_LAYERS}: vLLM's default EAGLE-3 taps (layers 2, N//2, "
                f"N-3) collide below that; got {self.layers}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError("draft_vocab_size must be in 1..vocab_size")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class TinyModels:
    """Where the generated models are."""

    root: Path
    target: Path
    drafter: Path
    vocab_size: int
    draft_vocab_size: int


# --------------------------------------------------------------------------- corpus

_SUBJECTS = (
    "the operator",
    "a small cluster",
    "the scheduler",
    "every host",
    "the drafter",
    "the target model",
    "our fleet",
    "the kernel",
    "a request",
    "the cache",
    "the team",
    "a new driver",
    "the load balancer",
    "the engineer",
    "each replica",
    "the service",
)
_VERBS = (
    "starts",
    "drains",
    "serves",
    "checks",
    "rebuilds",
    "restarts",
    "measures",
    "predicts",
    "accepts",
    "rejects",
    "verifies",
    "loads",
    "writes",
    "reads",
    "upgrades",
    "schedules",
)
_OBJECTS = (
    "the tokens",
    "a speculative draft",
    "the hidden states",
    "its configuration",
    "the shared memory",
    "a warm cache",
    "the metrics",
    "every completion",
    "the weights",
    "a health check",
    "the virtual environment",
    "the whitelist",
    "three candidates",
    "the longest prefix",
    "a quiet queue",
    "the journal",
)
_ADVERBS = (
    "quickly",
    "carefully",
    "again",
    "before noon",
    "after the upgrade",
    "without a reboot",
    "in parallel",
    "on every host",
    "one step at a time",
    "under load",
    "at night",
    "within a minute",
)
_QUESTIONS = (
    "What does the drafter predict next?",
    "How many tokens were accepted?",
    "Why did the service restart?",
    "Which host answers the health check?",
    "When does the cache warm up?",
    "Where are the weights stored?",
)
_PARAGRAPHS = (
    "Speculative decoding lets a small draft model propose several tokens that the large "
    "target model then verifies in a single forward pass. When the draft agrees with the "
    "target, several tokens are produced for the price of one step.",
    "An operator installs the driver, the toolkit, the framework and the server, checks that "
    "the service answers, and writes down every step so that the next host takes minutes "
    "instead of days.",
    "Numbers help: one, two, three, four, five, six, seven, eight, nine, ten. Counting is "
    "easy, and so is a list of colours: red, green, blue, yellow, black and white.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump!",
)


def corpus(seed: int = 0, sentences: int = 3000) -> Iterator[str]:
    """Yield a deterministic synthetic English-like corpus, one line at a time."""
    rng = random.Random(seed)
    yield from _PARAGRAPHS
    for index in range(sentences):
        kind = rng.random()
        if kind < 0.1:
            yield rng.choice(_QUESTIONS)
        elif kind < 0.2:
            yield f"Step {index % 97}: {rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {index}."
        else:
            words = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
            if rng.random() < 0.6:
                words.append(rng.choice(_ADVERBS))
            sentence = " ".join(words)
            yield sentence[0].upper() + sentence[1:] + rng.choice((".", ".", "!", "?"))


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(spec: TinySpec) -> Tokenizer:
    """Train a byte-level BPE tokenizer on :func:`corpus` (no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(spec.seed, spec.corpus_sentences), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _save_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=TinySpec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


# --------------------------------------------------------------------------- target


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def build_target(spec: TinySpec, tokenizer: Tokenizer, out: Path) -> int:
    """Write a randomly initialised target model and its tokenizer; return its vocab size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    vocab_size = tokenizer.get_vocab_size()
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": [tokenizer.token_to_id(EOS), tokenizer.token_to_id(IM_END)],
        "pad_token_id": tokenizer.token_to_id(PAD),
    }
    model: torch.nn.Module
    torch.manual_seed(spec.seed)
    if spec.arch == "mistral":
        config = MistralConfig(sliding_window=None, **common)
        config.architectures = [ARCHITECTURES["mistral"]]
        model = MistralForCausalLM(config)
    else:
        config = LlamaConfig(**common)
        config.architectures = [ARCHITECTURES["llama"]]
        model = LlamaForCausalLM(config)
    model = model.to(_torch_dtype(spec.dtype))
    model.save_pretrained(str(out))
    return vocab_size


# --------------------------------------------------------------------------- drafter


def draft_vocabulary(tokenizer: Tokenizer, spec: TinySpec) -> list[int]:
    """The target ids the drafter may propose: special tokens, then the most frequent ones.

    Returned sorted ascending, as EAGLE-3 training tools do; ``d2t[i] = ids[i] - i``.
    """
    counts: Counter[int] = Counter()
    for line in corpus(spec.seed, spec.corpus_sentences):
        counts.update(tokenizer.encode(line).ids)
    chosen = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    for token_id, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= spec.draft_vocab_size:
            break
        if token_id not in chosen:
            chosen.append(token_id)
    for token_id in range(tokenizer.get_vocab_size()):  # a corpus smaller than the vocab
        if len(chosen) >= spec.draft_vocab_size:
            break
        if token_id not in chosen:
            chosen.append(token_id)
    return sorted(chosen)


def drafter_tensors(spec: TinySpec, draft_ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """Untrained EAGLE-3 weights in vLLM's native names and shapes."""
    import torch

    weights_seed = spec.seed if spec.drafter_seed is None else spec.drafter_seed
    generator = torch.Generator().manual_seed(weights_seed + 1)
    hidden, inter = spec.hidden_size, spec.intermediate_size
    q_out = spec.num_attention_heads * spec.head_dim
    kv_out = spec.num_key_value_heads * spec.head_dim
    dtype = _torch_dtype(spec.dtype)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(dtype)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=dtype)

    ids = torch.tensor(list(draft_ids), dtype=torch.int64)
    return {
        "midlayer.hidden_norm.weight": ones(hidden),
        "midlayer.input_layernorm.weight": ones(hidden),
        "midlayer.post_attention_layernorm.weight": ones(hidden),
        # q/k/v read [embedding ; hidden state]: twice the hidden size.
        "midlayer.self_attn.q_proj.weight": normal(q_out, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": normal(kv_out, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": normal(kv_out, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": normal(hidden, q_out),
        "midlayer.mlp.gate_proj.weight": normal(inter, hidden),
        "midlayer.mlp.up_proj.weight": normal(inter, hidden),
        "midlayer.mlp.down_proj.weight": normal(hidden, inter),
        # Three tapped target hidden states folded into one.
        "fc.weight": normal(hidden, 3 * hidden),
        "norm.weight": ones(hidden),
        "lm_head.weight": normal(len(draft_ids), hidden),
        # target id = draft index + d2t[draft index]
        "d2t": ids - torch.arange(len(draft_ids), dtype=torch.int64),
    }


def drafter_config(spec: TinySpec, vocab_size: int, tokenizer: Tokenizer) -> dict[str, Any]:
    """config.json of the drafter: a one-layer Llama with EAGLE-3 fields."""
    special_ids = {
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "pad_token_id": tokenizer.token_to_id(PAD),
    }
    return drafter_config_with(spec, vocab_size, special_ids)


def drafter_config_with(
    spec: TinySpec, vocab_size: int, special_ids: dict[str, Any]
) -> dict[str, Any]:
    """The drafter's config.json, given its target's special token ids."""
    return {
        "architectures": [DRAFTER_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.hidden_size,
        **special_ids,
        "torch_dtype": spec.dtype,
    }


def build_drafter(spec: TinySpec, tokenizer: Tokenizer, vocab_size: int, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = drafter_tensors(spec, draft_vocabulary(tokenizer, spec))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = drafter_config(spec, vocab_size, tokenizer)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- prompts


def prompt_rows(seed: int = 0, rows: int = 440) -> Iterator[dict[str, Any]]:
    """Yield chat rows (``{"id", "messages": [user turn]}``) drawn from :func:`corpus`.

    Each prompt asks for a continuation of two or three corpus lines, so the target's
    answers are in-distribution for its tokenizer.
    """
    rng = random.Random(seed + 1)
    lines = list(corpus(seed, max(rows * 3, 300)))
    for index in range(rows):
        picked = " ".join(rng.sample(lines, rng.choice((2, 3))))
        ask = rng.choice(("Continue:", "Go on:", "Say more:", "Next:"))
        yield {"id": f"tiny-{index}", "messages": [{"role": "user", "content": f"{ask} {picked}"}]}


def write_prompts(path: Path, seed: int, rows: int) -> None:
    with path.open("w") as handle:
        for row in prompt_rows(seed, rows):
            handle.write(json.dumps(row, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- entry points


def generate(out_dir: Path | str, spec: TinySpec | None = None) -> TinyModels:
    """Generate target, tokenizer and drafter under ``out_dir`` (created if missing)."""
    spec = spec or TinySpec()
    spec.check()
    root = Path(out_dir).resolve()
    target, drafter = root / "target", root / "drafter"
    target.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(spec)
    if tokenizer.get_vocab_size() < spec.draft_vocab_size:
        raise ValueError(
            f"the corpus gave only {tokenizer.get_vocab_size()} tokens, fewer than "
            f"draft_vocab_size {spec.draft_vocab_size}"
        )
    _save_tokenizer(tokenizer, target)
    vocab_size = build_target(spec, tokenizer, target)
    build_drafter(spec, tokenizer, vocab_size, drafter)
    write_prompts(root / "prompts.jsonl", spec.seed, spec.prompts)

    result = TinyModels(root, target, drafter, vocab_size, spec.draft_vocab_size)
    manifest = {
        "spec": asdict(spec),
        "target": "target",
        "drafter": "drafter",
        "prompts": "prompts.jsonl",
        "vocab_size": vocab_size,
    }
    (root / "tinymodels.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    # safetensors writes 0600; a service user must be able to read what the lab copies.
    for path in (target, drafter, *target.rglob("*"), *drafter.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (root / "tinymodels.json").chmod(0o644)
    (root / "prompts.jsonl").chmod(0o644)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet.host.lab.tinymodels",
        description="Generate a tiny random target model, its tokenizer and an untrained "
        "EAGLE-3 drafter (vLLM native format), deterministically and offline.",
    )
    parser.add_argument(
        "out_dir", type=Path, metavar="OUT_DIR", help="writes OUT_DIR/target and OUT_DIR/drafter"
    )
    parser.add_argument(
        "--arch",
        choices=sorted(ARCHITECTURES),
        default="llama",
        help="target architecture (mistral: for the whitelist test)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=MIN_LAYERS,
        help=f"target decoder layers (>= {MIN_LAYERS}, default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--drafter-seed",
        type=int,
        default=None,
        help="seed of the drafter's weights alone (default: --seed); same shapes, other weights",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    spec = TinySpec(
        arch=args.arch, layers=args.layers, seed=args.seed, drafter_seed=args.drafter_seed
    )
    try:
        spec.check()
    except ValueError as error:
        parser.error(str(error))
    models = generate(args.out_dir, spec)
    print(
        json.dumps(
            {
                "target": str(models.target),
                "drafter": str(models.drafter),
                "vocab_size": models.vocab_size,
                "draft_vocab_size": models.draft_vocab_size,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
