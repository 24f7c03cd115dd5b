"""The run's inputs: fingerprints that identify them, facts about the target, preflight.

The preflight says everything that is wrong with a run before the job starts, so a bad
dataset or a mismatched drafter shape costs seconds, not a failed job an hour in.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfleet.host.drafter.config import RunConfig
from specfleet.host.drafter_store import digest_of_files
from specfleet.host.hashing import sha256_file

#: Hidden states are stored in bfloat16.
HIDDEN_STATE_BYTES = 2
#: Files that define a Hugging Face model besides its weights.
_MODEL_DEFINITION_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def digest_of(value: Any) -> str:
    """A short, stable hash of a JSON-able value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_fingerprint(model_dir: Path) -> str:
    """Identify a model directory without reading its weights.

    Definition files (config, tokenizer, chat template) are hashed by content; weight
    files by name and size, because hashing a trillion-parameter checkpoint would take
    longer than the stages it guards. Replacing weights with same-sized ones therefore
    needs a new ``run_tag``.
    """
    parts: list[object] = []
    for path in sorted(model_dir.iterdir()):
        if path.name in _MODEL_DEFINITION_FILES:
            parts.append([path.name, sha256_file(path)])
        elif path.suffix in (".safetensors", ".bin", ".pt"):
            parts.append([path.name, path.stat().st_size])
    return digest_of(parts)


def directory_digest(root: Path) -> str:
    """Content hash of every file under root (names and bytes): a drafter's identity, the
    one publication computes again as root (specfleet.host.drafter_store)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return digest_of_files({path.relative_to(root).as_posix(): sha256_file(path) for path in files})


@dataclass(frozen=True)
class TargetFacts:
    """What the pipeline needs to know of the target, read from its config.json."""

    num_layers: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def read(cls, model_dir: Path) -> TargetFacts:
        config = json.loads((model_dir / "config.json").read_text())
        text = config.get("text_config", config)
        return cls(
            num_layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            vocab_size=int(text["vocab_size"]),
        )


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default taps, in vLLM's numbering (input of decoder layer k)."""
    return [2, num_layers // 2, num_layers - 3]


def layer_ids(config: RunConfig, facts: TargetFacts) -> list[int]:
    return list(config.layer_ids) or default_layer_ids(facts.num_layers)


def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """A JSONL dataset written whole: beside it first, then one rename (a reader, or a run
    cut short, never sees half a file)."""
    staged = path.with_name(f".{path.name}.tmp")
    with staged.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
    staged.replace(path)


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL dataset, each a chat (``messages`` or ``conversations``) or ``prompt``."""
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON: {error}") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: each line must be a JSON object")
            yield row


def user_text(row: dict[str, Any]) -> str:
    """The user-visible prompt text of a row (for token estimates)."""
    turns = row.get("messages") or row.get("conversations") or []
    texts = [str(turn.get("content") or turn.get("value") or "") for turn in turns]
    return " ".join(texts) or str(row.get("prompt", ""))


@dataclass(frozen=True)
class Preflight:
    """Every reason the run cannot start (empty when it can), and what was counted."""

    problems: list[str]
    rows: int = 0
    hidden_states_bytes: int | None = None


def _heldout_group_problems(
    dataset: Path, rows: list[dict[str, Any]], wanted: list[str]
) -> list[str]:
    """Fixed held-out groups must each be in the dataset and leave rows for training."""
    groups = Counter(str(row.get("group")) for row in rows if "group" in row)
    missing = sorted(set(wanted) - set(groups))
    if missing:
        return [f"heldout_groups {missing} are not groups of dataset {dataset}"]
    if sum(groups[group] for group in set(wanted)) >= len(rows):
        return [
            f"heldout_groups {sorted(wanted)} hold every row of {dataset}: "
            "none is left for training"
        ]
    return []


def preflight(config: RunConfig, count_tokens: Any = None) -> Preflight:
    """Check the run's inputs; the estimate is made once, with the tokenizer if given.

    ``count_tokens`` maps a prompt text to its token count (the target's tokenizer on
    the host); without it a prompt is estimated at one token per 3 bytes.
    """
    problems: list[str] = []
    if config.server.port in config.reserved_ports:
        problems.append(
            f"server.port {config.server.port} is taken: the speculative server listens on "
            "it; give the job's private server another port"
        )
    dataset = Path(config.dataset)
    target = Path(config.target)
    rows: list[dict[str, Any]] = []
    if not dataset.is_file():
        problems.append(f"dataset {dataset} does not exist")
    else:
        try:
            rows = list(read_rows(dataset))
        except ValueError as error:
            problems.append(str(error))
        if not rows and not problems:
            problems.append(f"dataset {dataset} is empty: it has no prompt rows")
        elif rows and config.heldout_groups:
            problems += _heldout_group_problems(dataset, rows, config.heldout_groups)
        elif rows and len(rows) <= config.heldout_prompts:
            problems.append(
                f"dataset {dataset} has {len(rows)} rows: more than heldout_prompts "
                f"({config.heldout_prompts}) are needed to leave any for training"
            )
    if config.baseline_drafter and not (Path(config.baseline_drafter) / "config.json").is_file():
        problems.append(f"baseline drafter {config.baseline_drafter} has no config.json")
    if not (target / "config.json").is_file():
        problems.append(f"target {target} has no config.json")
        return Preflight(problems, len(rows))
    facts = TargetFacts.read(target)

    taps = layer_ids(config, facts)
    if sorted(set(taps)) != taps or taps[0] < 1 or taps[-1] >= facts.num_layers:
        source = "the configured layer_ids" if config.layer_ids else "the default taps"
        problems.append(
            f"target has {facts.num_layers} layers, too few for {source} {taps}: the taps "
            f"must be distinct, increasing and within 1..{facts.num_layers - 1} "
            "(EAGLE-3's defaults 2, N//2, N-3 need at least 8 layers)"
        )
    if config.draft_vocab_size > facts.vocab_size:
        problems.append(
            f"draft_vocab_size {config.draft_vocab_size} is larger than the target's "
            f"vocabulary ({facts.vocab_size})"
        )

    need = None
    if rows:
        need = hidden_states_bytes(config, facts, rows, count_tokens)
        work = _existing_parent(Path(config.work_dir))
        free = shutil.disk_usage(work).free
        if need > free:
            problems.append(
                f"too little disk for the hidden states: about {_gib(need)} needed "
                f"(tokens x {len(taps) + 1} x hidden size {facts.hidden_size} x "
                f"{HIDDEN_STATE_BYTES} bytes), {_gib(free)} free under {work}"
            )
    return Preflight(problems, len(rows), need)


def hidden_states_bytes(
    config: RunConfig,
    facts: TargetFacts,
    rows: list[dict[str, Any]],
    count_tokens: Any = None,
) -> int:
    """Upper estimate: every row's prompt plus a full-length response."""
    counter = count_tokens or (lambda text: len(text.encode()) // 3 + 1)
    tokens = sum(
        min(counter(user_text(row)) + config.response_max_tokens, config.seq_length) for row in rows
    )
    stored_layers = len(layer_ids(config, facts)) + 1
    return tokens * stored_layers * facts.hidden_size * HIDDEN_STATE_BYTES


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB" if size >= 1 << 26 else f"{size / (1 << 20):.1f} MiB"
