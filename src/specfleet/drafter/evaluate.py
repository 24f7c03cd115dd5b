"""Acceptance of a drafter on held-out prompts, measured by vLLM's own counters.

The target is served with the drafter (EAGLE-3, ``num_speculative_tokens`` per step);
each held-out prompt is answered greedily; the ``vllm:spec_decode_*`` counters before and
after give acceptance rate (accepted / drafted tokens), mean acceptance length
(1 + accepted / drafts) and acceptance by position (accepted at position i / drafts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specfleet.drafter import server as servers
from specfleet.drafter.config import RunConfig

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def acceptance(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], positions: int
) -> dict[str, Any]:
    """The acceptance figures from two counter snapshots."""

    def delta(name: str, position: str = "") -> float:
        return after.get((name, position), 0.0) - before.get((name, position), 0.0)

    drafts, drafted, accepted = delta(DRAFTS), delta(DRAFT_TOKENS), delta(ACCEPTED)
    if drafts <= 0:
        raise RuntimeError("the server made no drafts: speculative decoding did not run")
    return {
        "drafts": int(drafts),
        "draft_tokens": int(drafted),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / drafted, 4),
        "mean_acceptance_length": round(1 + accepted / drafts, 4),
        "acceptance_by_position": [
            round(delta(ACCEPTED_PER_POSITION, str(index)) / drafts, 4)
            for index in range(positions)
        ],
    }


def measure(
    config: RunConfig, drafter: Path, prompts: list[list[dict[str, Any]]], log: Path
) -> dict[str, Any]:
    spec = servers.with_drafter(drafter, config.num_speculative_tokens)
    with servers.serve(config, spec, log) as server:
        before = servers.counters(server.metrics())
        completion_tokens = 0
        for messages in prompts:
            answer = server.chat(messages, config.eval_max_tokens)
            completion_tokens += int(answer.get("usage", {}).get("completion_tokens", 0))
        after = servers.counters(server.metrics())
    result = acceptance(before, after, config.num_speculative_tokens)
    return {"drafter": str(drafter), "completion_tokens": completion_tokens, **result}
