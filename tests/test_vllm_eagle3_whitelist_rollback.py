"""A failed run leaves the source byte-identical and says `changed` truthfully.

The module proves every deletion possible before it writes (write permission on each cache
folder, no immutable or append-only flag on the folders, the caches and the source) and puts
the original bytes back after any failure that follows the write. Root ignores permission
bits, so the tests make files and folders immutable (``chattr +i``) or append-only
(``chattr +a``), which stop root too.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_releases import SERVED, FakeVllm


def serves_mistral(vllm: FakeVllm) -> bool:
    out = subprocess.run(
        [str(vllm.python), "-B", "-c", SERVED, str(vllm.site)],
        check=True,
        capture_output=True,
        text=True,
    )
    return '"mistral"' in out.stdout


def unchecked_cache(vllm: FakeVllm) -> Path:
    assert vllm.source is not None
    vllm.write_unchecked_cache()
    (cache,) = (vllm.source.parent / "__pycache__").glob("speculative.*.pyc")
    return cache


@contextlib.contextmanager
def attribute(path: Path, flag: str) -> Iterator[None]:
    """chattr +flag on path for the block (root included)."""
    done = subprocess.run(["chattr", f"+{flag}", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +{flag} is not available here: {done.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", f"-{flag}", str(path)], check=True)


@pytest.fixture
def vllm(tmp_path: Path) -> FakeVllm:
    return FakeVllm(tmp_path / "0.21.0", "0.21.0")


@pytest.mark.parametrize("flag", ["i", "a"], ids=["immutable", "append-only"])
def test_a_cache_folder_that_forbids_deletion(vllm: FakeVllm, flag: str) -> None:
    cache = unchecked_cache(vllm)
    before = vllm.snapshot()
    with attribute(cache.parent, flag):
        result = vllm.fail(model_types=["mistral"])
    assert "cannot remove" in result["msg"] and str(cache) in result["msg"], result["msg"]
    assert vllm.snapshot() == before
    assert result["changed"] is False
    assert cache.exists() and not serves_mistral(vllm)
    # nothing was left half-done: the next run, allowed to delete, does the whole job
    result = vllm.run(model_types=["mistral"])
    assert result["verified"] is True and serves_mistral(vllm)


@pytest.mark.parametrize("flag", ["i", "a"], ids=["immutable", "append-only"])
def test_a_cache_file_that_forbids_deletion(vllm: FakeVllm, flag: str) -> None:
    cache = unchecked_cache(vllm)
    before = vllm.snapshot()
    with attribute(cache, flag):
        result = vllm.fail(model_types=["mistral"])
    assert "cannot remove" in result["msg"] and str(cache) in result["msg"], result["msg"]
    assert vllm.snapshot() == before
    assert result["changed"] is False


@pytest.mark.parametrize("state", ["present", "absent"])
def test_an_immutable_source(vllm: FakeVllm, state: str) -> None:
    assert vllm.source is not None
    if state == "absent":
        vllm.run(model_types=["mistral"])
    before = vllm.snapshot()
    with attribute(vllm.source, "i"):
        result = vllm.fail(model_types=["mistral"], state=state)
    assert "not writable" in result["msg"] and str(vllm.source) in result["msg"]
    assert vllm.snapshot() == before
    assert result["changed"] is False


@pytest.mark.parametrize("flag", ["i", "a"], ids=["immutable", "append-only"])
def test_a_source_folder_that_forbids_the_replace(vllm: FakeVllm, flag: str) -> None:
    assert vllm.source is not None
    before = vllm.snapshot()
    with attribute(vllm.source.parent, flag):
        result = vllm.fail(model_types=["mistral"])
    assert str(vllm.source.parent) in result["msg"]
    assert vllm.snapshot() == before
    assert result["changed"] is False


def test_a_cache_folder_that_forbids_the_recompile(vllm: FakeVllm) -> None:
    assert vllm.source is not None
    pycache = vllm.source.parent / "__pycache__"
    pycache.mkdir()
    before = vllm.snapshot()
    with attribute(pycache, "i"):
        result = vllm.fail(model_types=["mistral"], recompile=True)
    assert "cannot recompile" in result["msg"] and str(pycache) in result["msg"], result["msg"]
    assert vllm.snapshot() == before
    assert result["changed"] is False


def wrapper(vllm: FakeVllm, tmp_path: Path, marker: str) -> Path:
    """A target interpreter that fails the one helper script holding marker (a failure
    the module cannot foresee, after it has written)."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{marker}*) echo "injected failure" >&2; exit 3;; esac\n'
        f'exec {vllm.python} "$@"\n'
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("marker", "args"),
    [
        ("py_compile", {"recompile": True}),  # the recompile step
        ("get_instructions", {}),  # the served-code proof
    ],
    ids=["recompile", "proof"],
)
def test_a_failure_after_the_write_puts_the_original_back(
    vllm: FakeVllm, tmp_path: Path, marker: str, args: dict[str, object]
) -> None:
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    python = wrapper(vllm, tmp_path, marker)
    from vllm_releases import run_module

    rc, result = run_module(
        {"python": str(python), "model_types": ["mistral"], **args}, tmpdir=vllm.tmp
    )
    assert rc != 0 and result.get("failed"), result
    assert "injected failure" in result["msg"]
    assert "original file was put back" in result["msg"], result["msg"]
    assert vllm.source.read_bytes() == original
    assert result["changed"] is False  # no cache existed: nothing on disk differs
    assert not serves_mistral(vllm)
