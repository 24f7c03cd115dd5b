"""The drafter's CPU training computes in float32 where the CPU has no native bfloat16.

speculators trains under bfloat16 autocast by default; a CPU without AVX512-BF16 or AMX
emulates it, several times slower than float32 (``cpu_compat.train_args``). Runs in the
cached cpu stack venv (the pytest process has no torch or speculators): the arguments the
job adds are resolved by speculators' own configuration, as its trainer will read them.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json

from speculators.train.config import TrainConfig

from specfleet.host.drafter import cpu_compat

REQUIRED = ["--verifier-name-or-path", "target", "--data-path", "data"]
resolved = {
    str(bf16): TrainConfig.resolve(cpu_compat.train_args(bf16) + REQUIRED).model_dump()["data"]
    for bf16 in (True, False)
}
print(json.dumps({"resolved": resolved, "native_bf16": cpu_compat.native_bf16()}))
"""


@pytest.fixture(scope="module")
def resolved() -> dict:
    from specfleet.controller.stackvenv import run_json, stack_python

    return run_json(stack_python("cpu"), "-c", SCRIPT, timeout=300)


def test_without_native_bf16_the_trainer_reads_float32(resolved) -> None:
    assert resolved["resolved"]["False"]["hidden_states_dtype"] == "float32"


def test_with_native_bf16_speculators_default_stays(resolved) -> None:
    assert resolved["resolved"]["True"]["hidden_states_dtype"] == "bfloat16"


def test_cpu_arguments_hold_either_way(resolved) -> None:
    for data in resolved["resolved"].values():
        assert data["num_workers"] == 0


def test_the_host_reading_is_a_bool(resolved) -> None:
    assert isinstance(resolved["native_bf16"], bool)
