"""vLLM's speculative-decoding counters, read with prometheus_client's own text parser.

The one reader of ``/metrics`` in the project: the health gate, the drafter pipeline's
evaluation, ``specfleet status`` and the tests all use :func:`spec_decode_counters` and
:func:`acceptance`. prometheus_client comes with vLLM on hosts and is in the controller lock.

Acceptance from two snapshots: rate = accepted / drafted tokens; mean acceptance length =
1 + accepted / drafts; by position i = accepted at position i / drafts.

``python -m specfleet.host.metrics URL`` prints the counters of a running server as JSON.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: Requests the engine is working on: a drained server is idle when both are 0.
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"

#: Counter key: (family name without ``_total``, position label or "").
Counters = dict[tuple[str, str], float]


def spec_decode_counters(text: str) -> Counters:
    """The ``vllm:spec_decode_*`` counters of a ``/metrics`` text, summed over engines."""
    values: Counters = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # Counters only: their _created timestamps are samples of the same family.
            if sample.name.startswith("vllm:spec_decode_") and sample.name.endswith("_total"):
                key = (sample.name.removesuffix("_total"), sample.labels.get("position", ""))
                values[key] = values.get(key, 0.0) + sample.value
    return values


def finite(value: Any) -> float | None:
    """A Prometheus figure as a float; None for none, NaN (a ratio of no drafts: 0/0), an
    infinity or not a number. Prometheus' API gives figures as strings."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def gauge(text: str, name: str) -> float:
    """A gauge summed over its label sets (0 when absent)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for sample in family.samples
    )


def delta(before: Counters, after: Counters, name: str, position: str = "") -> float:
    return after.get((name, position), 0.0) - before.get((name, position), 0.0)


def acceptance(before: Counters, after: Counters, positions: int) -> dict[str, Any]:
    """The acceptance figures between two snapshots; raises when nothing was drafted."""
    drafts = delta(before, after, DRAFTS)
    drafted = delta(before, after, DRAFT_TOKENS)
    accepted = delta(before, after, ACCEPTED)
    if drafts <= 0:
        raise RuntimeError("the server made no drafts: speculative decoding did not run")
    return {
        "drafts": int(drafts),
        "draft_tokens": int(drafted),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "mean_acceptance_length": round(1 + accepted / drafts, 4),
        "acceptance_by_position": [
            round(delta(before, after, ACCEPTED_PER_POSITION, str(index)) / drafts, 4)
            for index in range(positions)
        ],
    }


def fetch(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m specfleet.host.metrics http://HOST:PORT/metrics", file=sys.stderr)
        return 64
    text = fetch(argv[0])
    counters = {
        f"{name}{'@' + pos if pos else ''}": v
        for (name, pos), v in spec_decode_counters(text).items()
    }
    counters[REQUESTS_RUNNING] = gauge(text, REQUESTS_RUNNING)
    counters[REQUESTS_WAITING] = gauge(text, REQUESTS_WAITING)
    print(json.dumps(counters, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
