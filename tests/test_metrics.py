"""src/specfleet/host/metrics.py: the one reader of vLLM's speculative counters (prometheus_client's
text parser), and the acceptance figures from two snapshots."""

from __future__ import annotations

import pytest

from specfleet.host.metrics import REQUESTS_RUNNING, acceptance, gauge, spec_decode_counters

METRICS = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafted}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
"""


def test_acceptance_comes_from_the_counter_deltas() -> None:
    before = spec_decode_counters(
        METRICS.format(drafts=10, drafted=30, accepted=5, p0=3, p1=1, p2=1)
    )
    after = spec_decode_counters(
        METRICS.format(drafts=948, drafted=2844, accepted=1627, p0=766, p1=458, p2=403)
    )
    figures = acceptance(before, after, positions=3)
    assert figures["drafts"] == 938
    assert figures["acceptance_rate"] == round(1622 / 2814, 4)
    assert figures["mean_acceptance_length"] == round(1 + 1622 / 938, 4)
    assert figures["acceptance_by_position"] == [round(n / 938, 4) for n in (763, 457, 402)]


def test_no_drafts_means_speculation_did_not_run() -> None:
    same = spec_decode_counters(METRICS.format(drafts=4, drafted=12, accepted=0, p0=0, p1=0, p2=0))
    with pytest.raises(RuntimeError, match="no drafts"):
        acceptance(same, same, positions=3)


SERVED = """\
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 69.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="tiny"} 3.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="tiny"} 1.7959702470090735e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
"""


def test_counters_are_summed_over_engines_without_created_timestamps() -> None:
    counters = spec_decode_counters(SERVED)
    assert counters == {("vllm:spec_decode_num_draft_tokens", ""): 72.0}


def test_gauges_are_summed_and_absent_ones_are_zero() -> None:
    assert gauge(SERVED, REQUESTS_RUNNING) == 3.0
    assert gauge(SERVED, "vllm:num_requests_waiting") == 0.0
