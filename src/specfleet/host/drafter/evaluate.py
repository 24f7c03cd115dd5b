"""Acceptance of a drafter on held-out prompts, measured by vLLM's own counters.

The target is served with the drafter (EAGLE-3, ``num_speculative_tokens`` per step);
each held-out prompt is answered greedily; the ``vllm:spec_decode_*`` counters before and
after give acceptance rate (accepted / drafted tokens), mean acceptance length
(1 + accepted / drafts) and acceptance by position (accepted at position i / drafts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specfleet.host import metrics
from specfleet.host.drafter import server as servers
from specfleet.host.drafter.config import RunConfig


def measure(
    config: RunConfig, drafter: Path, prompts: list[list[dict[str, Any]]], log: Path
) -> dict[str, Any]:
    spec = servers.with_drafter(drafter, config.num_speculative_tokens)
    with servers.serve(config, spec, log) as server:
        before = metrics.spec_decode_counters(server.metrics())
        completion_tokens = 0
        for messages in prompts:
            answer = server.chat(messages, config.eval_max_tokens)
            completion_tokens += int(answer.get("usage", {}).get("completion_tokens", 0))
        after = metrics.spec_decode_counters(server.metrics())
    result = metrics.acceptance(before, after, config.num_speculative_tokens)
    return {"drafter": str(drafter), "completion_tokens": completion_tokens, **result}
