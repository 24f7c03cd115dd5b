"""The offline wheelhouse, built for real from PyPI on a one-wheel lock."""

from __future__ import annotations

from pathlib import Path

import pytest

from specfleet.stacklock import StackLock, StackSpec
from specfleet.wheelhouse import ensure_wheelhouse, wheelhouse_path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow
def test_wheelhouse_is_built_once_then_reused(cache: Path):
    spec = StackSpec(
        name="tiny",
        profile="cpu",
        python_version="3.11",
        glibc="2.36",
        arch="x86_64",
        requirements=("six==1.16.0",),
        exclude={},
    )
    lock = StackLock(name="tiny", pins=("six==1.16.0",))
    first = ensure_wheelhouse(spec, lock)
    assert not first.reused
    assert first.path == wheelhouse_path(lock)
    assert first.path.parent == cache / "wheelhouse"
    assert [w.name for w in first.path.glob("*.whl")] == ["six-1.16.0-py2.py3-none-any.whl"]
    assert (first.path / "requirements.txt").read_text() == "six==1.16.0\n"
    # Nothing half-built is left beside it.
    assert sorted(p.name for p in first.path.parent.iterdir()) == [first.path.name]

    second = ensure_wheelhouse(spec, lock)
    assert second.reused
    assert second.wheels == 1
    assert second.size_bytes == first.size_bytes


@pytest.mark.slow
def test_a_failed_download_leaves_no_wheelhouse(cache: Path):
    spec = StackSpec("bad", "cpu", "3.11", "2.36", "x86_64", ("six==0.0.0",), {})
    lock = StackLock(name="bad", pins=("six==0.0.0",))
    with pytest.raises(Exception):  # noqa: B017 - pip's failure, surfaced by subprocess
        ensure_wheelhouse(spec, lock)
    assert not wheelhouse_path(lock).exists()
    assert list((cache / "wheelhouse").iterdir()) == []
