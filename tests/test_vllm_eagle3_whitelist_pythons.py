"""The target interpreter is not the one running the module: discovery, the served-code
proof and the cache handling must hold for every CPython a vLLM stack may use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from vllm_releases import FakeVllm, run_module

PYENV = Path.home() / ".pyenv" / "versions"
# vLLM 0.8.5 supports Python 3.9-3.12; recent releases 3.10-3.13
PYTHONS = ["3.9", "3.10", "3.12", "3.13"]


def interpreter(version: str) -> str | None:
    for candidate in sorted(PYENV.glob(f"{version}.*"), reverse=True):
        path = candidate / "bin" / f"python{version}"
        if path.exists():
            return str(path)
    return shutil.which(f"python{version}")


@pytest.mark.parametrize("release", ["0.8.5", "0.21.0"])
@pytest.mark.parametrize("python", PYTHONS)
def test_other_target_interpreters(tmp_path: Path, python: str, release: str) -> None:
    base = interpreter(python)
    if base is None:
        pytest.skip(f"no python{python} here")
    vllm = FakeVllm(tmp_path / "vllm", release, base=base)
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    # a stale unchecked-hash cache written by that interpreter
    vllm.write_unchecked_cache()
    tag = f"cpython-{python.replace('.', '')}"
    result = vllm.run(model_types=["mistral"], recompile=True)
    assert result["verified"] is True and result["added"] == ["mistral"]
    assert result["vllm_version"] == release
    assert any(tag in p for p in result["pyc_removed"])
    assert [(r["optimize"], r["mode"]) for r in result["recompiled"]] == [(0, "UNCHECKED_HASH")]
    assert vllm.run(model_types=["mistral"])["changed"] is False
    assert vllm.run(state="absent")["verified"] is True
    assert vllm.source.read_bytes() == original


@pytest.mark.parametrize("python", ["3.9", "3.12", "3.13"])
def test_module_runs_under_the_target_interpreter(tmp_path: Path, python: str) -> None:
    """ansible_python_interpreter set to the stack's python: the module parses with it."""
    base = interpreter(python)
    if base is None:
        pytest.skip(f"no python{python} here")
    vllm = FakeVllm(tmp_path / "vllm", "0.18.0", base=base)
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    args = {"python": str(vllm.python), "model_types": ["mistral"]}
    rc, result = run_module(args, tmpdir=vllm.tmp, interpreter=base)
    assert rc == 0 and result["verified"] is True and result["added"] == ["mistral"], result
    rc, result = run_module({**args, "state": "absent"}, tmpdir=vllm.tmp, interpreter=base)
    assert rc == 0 and result["changed"] is True, result
    assert vllm.source.read_bytes() == original
