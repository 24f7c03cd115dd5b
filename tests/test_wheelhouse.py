"""The offline wheelhouse, built for real from PyPI on a one-wheel lock."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.wheelhouse import (
    WheelhouseError,
    ensure_wheelhouse,
    sha256_prefixed,
    wheelhouse_path,
)

SIX = "six==1.16.0"
SIX_SHA256 = "sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
SPEC = StackSpec(
    name="tiny",
    profile="cpu",
    python_version="3.11",
    glibc="2.36",
    arch="x86_64",
    requirements=(SIX,),
    exclude={},
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow
def test_wheelhouse_is_built_once_then_reused(cache: Path):
    lock = StackLock(name="tiny", pins=(SIX,), hashes={SIX: (SIX_SHA256,)})
    first = ensure_wheelhouse(SPEC, lock)
    assert not first.reused
    assert first.path == wheelhouse_path(lock)
    assert first.path.parent == cache / "wheelhouse"
    assert [w.name for w in first.path.glob("*.whl")] == ["six-1.16.0-py2.py3-none-any.whl"]
    # what hosts install with `pip install --require-hashes --requirement`
    assert (first.path / "requirements.txt").read_text() == f"{SIX} --hash={SIX_SHA256}\n"
    # Nothing half-built is left beside it.
    assert sorted(p.name for p in first.path.parent.iterdir()) == [first.path.name]

    second = ensure_wheelhouse(SPEC, lock)
    assert second.reused
    assert second.wheels == 1
    assert second.size_bytes == first.size_bytes


@pytest.mark.slow
def test_a_wheel_whose_hash_differs_from_the_lock_fails_clearly(cache: Path):
    wrong = "sha256:" + "0" * 64
    lock = StackLock(name="tiny", pins=(SIX,), hashes={SIX: (wrong,)})
    with pytest.raises(WheelhouseError) as failure:
        ensure_wheelhouse(SPEC, lock)
    message = str(failure.value)
    assert "six-1.16.0-py2.py3-none-any.whl" in message
    assert SIX_SHA256 in message  # what it is
    assert wrong in message  # what the lock says
    assert not wheelhouse_path(lock).exists()
    assert list((cache / "wheelhouse").iterdir()) == []


def test_a_lock_without_hashes_is_refused_before_any_download(cache: Path):
    lock = StackLock(name="tiny", pins=(SIX,))
    with pytest.raises(WheelhouseError, match=r"no sha256 for six==1\.16\.0.*specfleet lock tiny"):
        ensure_wheelhouse(SPEC, lock)
    assert list((cache / "wheelhouse").iterdir()) == []


@pytest.mark.slow
def test_a_failed_download_leaves_no_wheelhouse(cache: Path):
    spec = StackSpec("bad", "cpu", "3.11", "2.36", "x86_64", ("six==0.0.0",), {})
    lock = StackLock(name="bad", pins=("six==0.0.0",), hashes={"six==0.0.0": ("sha256:00",)})
    with pytest.raises(Exception):  # noqa: B017 - pip's failure, surfaced by subprocess
        ensure_wheelhouse(spec, lock)
    assert not wheelhouse_path(lock).exists()
    assert list((cache / "wheelhouse").iterdir()) == []


def _published_wheelhouse(cache: Path, name: str, wheel: str, content: bytes) -> Path:
    """A wheelhouse as ensure_wheelhouse publishes it, holding one file."""
    house = cache / "wheelhouse" / name
    house.mkdir(parents=True)
    (house / wheel).write_bytes(content)
    return house / wheel


@pytest.fixture
def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download fails at once: pip is pointed at a closed port on loopback."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")


def test_a_wheel_another_wheelhouse_holds_is_linked_not_downloaded(cache: Path, no_index: None):
    wheel = "six-1.16.0-py2.py3-none-any.whl"
    held = _published_wheelhouse(cache, "older-0123456789abcdef", wheel, b"the wheel's bytes")
    lock = StackLock(name="newer", pins=(SIX,), hashes={SIX: (sha256_prefixed(held),)})

    house = ensure_wheelhouse(SPEC, lock)  # with no index reachable: nothing was downloaded

    assert not house.reused
    assert house.linked == 1
    assert (house.path / wheel).stat().st_ino == held.stat().st_ino
    assert (
        house.path / "requirements.txt"
    ).read_text() == f"{SIX} --hash={sha256_prefixed(held)}\n"


def test_a_wheel_changed_in_another_wheelhouse_is_downloaded_not_trusted(
    cache: Path, no_index: None
):
    wheel = "six-1.16.0-py2.py3-none-any.whl"
    _published_wheelhouse(cache, "older-0123456789abcdef", wheel, b"changed since it was published")
    lock = StackLock(name="newer", pins=(SIX,), hashes={SIX: (SIX_SHA256,)})

    with pytest.raises(subprocess.CalledProcessError):  # it went to the (closed) index
        ensure_wheelhouse(SPEC, lock)

    assert not wheelhouse_path(lock).exists()
    assert sorted(p.name for p in (cache / "wheelhouse").iterdir()) == ["older-0123456789abcdef"]
