"""What the module takes as its own: only what carries its marker, in exactly the form it
writes. Everything else in the check is vLLM's and is never removed or re-marked; a marked
part in any other form is an unknown shape, and the file is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_releases import FakeVllm, run_real_check

# vLLM 0.14.1's own line, and the same list built by concatenation
LITERAL = b'eagle3_target_supported = ["llama", "qwen", "minicpm", "gpt_oss"]'
CONCATENATED = b'eagle3_target_supported = ["llama"] + ["qwen", "minicpm", "gpt_oss"]'


@pytest.fixture
def concatenated(tmp_path: Path) -> FakeVllm:
    vllm = FakeVllm(tmp_path / "0.14.1", "0.14.1")
    assert vllm.source is not None
    data = vllm.source.read_bytes()
    assert data.count(LITERAL) == 1
    vllm.source.write_bytes(data.replace(LITERAL, CONCATENATED))
    return vllm


def test_a_concatenation_by_vllm_is_vllm_s(concatenated: FakeVllm) -> None:
    vllm = concatenated
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    vllm_types = ["llama", "qwen", "minicpm", "gpt_oss"]

    result = vllm.run(model_types=["mistral"])
    assert result["verified"] is True
    assert result["added"] == ["mistral"]
    assert result["specfleet_entries"] == ["mistral"]
    assert result["entries"] == [*vllm_types, "mistral"]
    patched = vllm.source.read_bytes()
    # the header line and the one addition: vLLM's entries are not marked
    assert patched.count(b"# specfleet") == 2
    assert CONCATENATED + b" + [  # specfleet" in patched
    for model_type in ["mistral", "qwen3_moe", "minicpm3", "gpt_oss", "llama"]:
        assert run_real_check(patched, model_type) is None, model_type

    # absent removes only the marked addition: vLLM's own concatenation stays whole
    removed = vllm.run(state="absent")
    assert removed["removed"] == ["mistral"]
    assert removed["entries"] == vllm_types and removed["specfleet_entries"] == []
    assert vllm.source.read_bytes() == original
    for model_type in ["qwen3_moe", "minicpm3", "gpt_oss"]:
        assert run_real_check(vllm.source.read_bytes(), model_type) is None, model_type


def test_absent_never_takes_vllm_s_concatenation(concatenated: FakeVllm) -> None:
    vllm = concatenated
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    result = vllm.run(state="absent")
    assert result["changed"] is False and result["removed"] == []
    assert result["specfleet_entries"] == []
    assert vllm.source.read_bytes() == original


@pytest.mark.parametrize("version", ["0.8.5", "0.21.0"])
@pytest.mark.parametrize(
    "tamper",
    [
        # the marker taken off an addition
        (b'"mistral",  # specfleet\n', b'"mistral",\n'),
        # an entry slipped into the marked list by hand, without the marker
        (b'"mistral",  # specfleet\n', b'"mistral",  # specfleet\n"phi3",\n'),
    ],
    ids=["marker-removed", "unmarked-entry"],
)
def test_a_marked_part_in_another_form_is_an_unknown_shape(
    tmp_path: Path, version: str, tamper: tuple[bytes, bytes]
) -> None:
    vllm = FakeVllm(tmp_path / version, version)
    assert vllm.source is not None
    vllm.run(model_types=["mistral"])
    data = vllm.source.read_bytes()
    old, new = tamper
    assert data.count(old) == 1
    vllm.source.write_bytes(data.replace(old, new))
    before = vllm.snapshot()
    for args in ({"model_types": ["gemma3"]}, {"state": "absent"}):
        result = vllm.fail(**args)
        assert "unknown shape" in result["msg"], result["msg"]
        assert str(vllm.source) in result["msg"]
        assert result["changed"] is False
        assert vllm.snapshot() == before
