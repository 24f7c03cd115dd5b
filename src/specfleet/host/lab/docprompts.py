"""A prompt set written by people, without a download: instructions about Python's own docs.

Every Python ships its language reference as text (``pydoc_data.topics``; in 3.11, 588
distinct paragraphs of 200-900 characters in 60 topics). Each prompt pairs one paragraph
with one kind of instruction (explain, summarise, give an example, answer a question about
it), drawn with a seed, so the same seed and Python give the same file everywhere.

Each row is a one-turn chat with the topic it came from::

    {"messages": [{"role": "user", "content": "..."}], "group": "for"}

The drafter pipeline keeps whole groups out of training (``heldout_prompts`` is filled with
entire topics), so its acceptance is measured on topics the drafter never saw, not on
other instructions about a paragraph it trained on.

Usage: ``python -m specfleet.host.lab.docprompts OUT.jsonl [--count 1500|all] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specfleet.host.drafter.inputs import write_rows

#: Paragraphs shorter than this say too little to ask about; longer ones make long prompts.
MIN_CHARS = 200
MAX_CHARS = 900

#: The kinds of instruction, each a template over one passage.
KINDS: dict[str, str] = {
    "explain": (
        "Explain the following passage from Python's documentation in plain words, "
        "for someone new to Python.\n\n{passage}"
    ),
    "summarise": (
        "Summarise this passage from Python's documentation in two or three sentences.\n\n{passage}"
    ),
    "example": (
        "Give a short Python example that illustrates this passage, and say what it shows."
        "\n\n{passage}"
    ),
    "question": (
        "Read this passage from Python's documentation.\n\n{passage}\n\nQuestion: {question}"
    ),
}

#: Questions about a passage, filled with a term the passage itself uses.
QUESTIONS = (
    "What does the passage say about {term}?",
    "Why does {term} matter here, according to the passage?",
    "How is {term} used, according to the passage?",
)

# A term worth asking about: a quoted or dotted identifier, or a word of 6+ letters.
_CODE_TERM = re.compile(r'"([A-Za-z_][\w.]*)"|\b([a-z_]+\.[a-z_]\w*|__\w+__)\b')
_WORD = re.compile(r"\b[a-z]{6,}\b")


@dataclass(frozen=True)
class Passage:
    topic: str
    text: str


def passages() -> list[Passage]:
    """The reference's paragraphs of a useful length, each once, in a stable order.

    Some paragraphs appear under several topics; each is kept under the first topic (by
    name) only, or a held-out topic would share passages with the training ones.
    """
    from pydoc_data.topics import topics

    found: dict[str, Passage] = {}
    for topic in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[topic]):
            text = re.sub(r"\s+", " ", block).strip()
            if MIN_CHARS <= len(text) <= MAX_CHARS and text not in found:
                found[text] = Passage(topic, text)
    return list(found.values())


def question_about(passage: str, rng: random.Random) -> str:
    terms = [a or b for a, b in _CODE_TERM.findall(passage)] or _WORD.findall(passage)
    term = rng.choice(sorted(set(terms))) if terms else "this"
    return rng.choice(QUESTIONS).format(term=term)


def prompt(passage: Passage, kind: str, rng: random.Random) -> str:
    question = question_about(passage.text, rng) if kind == "question" else ""
    return KINDS[kind].format(passage=passage.text, question=question)


def build(count: int, seed: int) -> Iterator[dict]:
    """``count`` distinct (paragraph, kind) prompts, drawn with ``seed``."""
    found = passages()
    pairs = [(index, kind) for index in range(len(found)) for kind in KINDS]
    if count > len(pairs):
        raise ValueError(f"count={count}: this Python's reference gives at most {len(pairs)}")
    rng = random.Random(seed)
    for index, kind in sorted(rng.sample(pairs, count)):
        passage = found[index]
        content = prompt(passage, kind, rng)
        yield {"messages": [{"role": "user", "content": content}], "group": passage.topic}


def most() -> int:
    """How many distinct prompts this Python's reference gives (every paragraph, every kind)."""
    return len(passages()) * len(KINDS)


def nested(
    rows: list[dict], heldout: int, train: int | None, seed: int = 0
) -> tuple[list[dict], list[str]]:
    """A dataset of ``train`` training rows beside fixed held-out topics, and those topics.

    The topics are drawn once from the whole of ``rows`` (whole topics, seeded, until they
    hold ``heldout`` rows, as the drafter pipeline draws them); the training rows are the
    first ``train`` (None: all) of one seeded order of the rest. So the datasets of two sizes share
    their held-out topics, and the larger one's training rows hold the smaller one's: a
    curve of acceptance against training prompts measures the data, not the draw.
    """
    from specfleet.host.drafter.stages import heldout_groups

    groups = [row["group"] for row in rows]
    held = heldout_groups(groups, heldout, seed)
    rest = [row for row in rows if row["group"] not in held]
    train = len(rest) if train is None else train
    if train > len(rest):
        raise ValueError(f"{train} training prompts asked for; {len(rest)} are not held out")
    random.Random(seed).shuffle(rest)
    return [row for row in rows if row["group"] in held] + rest[:train], sorted(held)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument(
        "--count",
        type=lambda text: most() if text == "all" else int(text),
        default=1500,
        help="prompts to write, or 'all' (every paragraph with every kind of instruction)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw")
    args = parser.parse_args(argv)
    try:
        rows = list(build(args.count, args.seed))
    except ValueError as error:
        print(f"docprompts: {error}", file=sys.stderr)
        return 2
    write_rows(args.out, rows)
    topics = len({row["group"] for row in rows})
    print(json.dumps({"prompts": len(rows), "topics": topics, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
