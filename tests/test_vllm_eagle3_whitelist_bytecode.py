"""Cached bytecode: what the import system serves before and after the module runs.

All three PEP 552 invalidation modes are written with the real interpreter (py_compile);
what the import system would execute is asked of that interpreter through the same finder
and loader an `import` uses (the parent packages are stood in by bare package objects,
because the real ``vllm/config/__init__.py`` imports torch).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_releases import SERVED, FakeVllm

MODES = ("TIMESTAMP", "CHECKED_HASH", "UNCHECKED_HASH")

COMPILE = r"""
import json, py_compile, sys
source, mode, optimize = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(py_compile.compile(source, doraise=True, optimize=optimize,
                         invalidation_mode=py_compile.PycInvalidationMode[mode]))
"""


def served_strings(vllm: FakeVllm, pycache_prefix: Path | None = None) -> set[str]:
    env = dict(os.environ)
    if pycache_prefix is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache_prefix)
    out = subprocess.run(
        [str(vllm.python), "-B", "-c", SERVED, str(vllm.site)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return set(json.loads(out.stdout))


def compile_cache(vllm: FakeVllm, mode: str, optimize: int = 0) -> Path:
    out = subprocess.run(
        [str(vllm.python), "-c", COMPILE, str(vllm.source), mode, str(optimize)],
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"},
    )
    return Path(out.stdout.strip())


def pyc_flags(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[4:8], "little")


@pytest.fixture
def vllm(tmp_path: Path) -> FakeVllm:
    return FakeVllm(tmp_path / "0.21.0", "0.21.0")


@pytest.mark.parametrize("mode", MODES)
def test_plain_text_edit_versus_the_module(vllm: FakeVllm, mode: str) -> None:
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    cache = compile_cache(vllm, mode)
    assert pyc_flags(cache) == {"TIMESTAMP": 0, "CHECKED_HASH": 3, "UNCHECKED_HASH": 1}[mode]
    assert "mistral" not in served_strings(vllm)

    # what the seed did by hand, minus the cache removal: a text edit of the list
    edited = original.replace(b'            "laguna",\n', b'            "laguna",\n"mistral",\n', 1)
    assert edited != original
    vllm.source.write_bytes(edited)
    served = served_strings(vllm)
    if mode == "UNCHECKED_HASH":
        # never re-validated: the old code keeps running although the source changed
        assert "mistral" not in served
    else:
        assert "mistral" in served

    # back to the original file, its cache in this mode, then the module
    vllm.source.write_bytes(original)
    cache = compile_cache(vllm, mode)
    result = vllm.run(model_types=["mistral"])
    assert result["changed"] is True and result["verified"] is True
    assert str(cache) in result["pyc_removed"]
    assert not cache.exists()
    assert "mistral" in served_strings(vllm)


def test_every_cache_of_the_source_is_removed(vllm: FakeVllm) -> None:
    assert vllm.source is not None
    folder = vllm.source.parent
    compile_cache(vllm, "CHECKED_HASH")
    compile_cache(vllm, "CHECKED_HASH", optimize=1)
    compile_cache(vllm, "CHECKED_HASH", optimize=2)
    pycache = folder / "__pycache__"
    # caches other interpreters left, and a legacy cache beside the source
    others = [
        pycache / "speculative.cpython-312.pyc",
        pycache / "speculative.cpython-310.opt-1.pyc",
        pycache / "speculative.pypy310.pyc",
        folder / "speculative.pyc",
    ]
    for path in others:
        path.write_bytes(b"stale")
    # caches of other modules stay
    unrelated = [pycache / "speculative_utils.cpython-311.pyc", pycache / "model.cpython-311.pyc"]
    for path in unrelated:
        path.write_bytes(b"keep")
    before = {p for p in pycache.iterdir()} | {folder / "speculative.pyc"}

    preview = vllm.run(check=True, model_types=["mistral"])
    assert {p for p in pycache.iterdir()} | {folder / "speculative.pyc"} == before
    result = vllm.run(model_types=["mistral"])
    assert result["pyc_removed"] == preview["pyc_removed"]
    removed = {Path(p) for p in result["pyc_removed"]}
    assert removed == before - set(unrelated)
    assert not any(p.exists() for p in removed)
    assert all(p.read_bytes() == b"keep" for p in unrelated)


@pytest.mark.parametrize("mode", MODES)
def test_recompile_keeps_the_invalidation_mode(vllm: FakeVllm, mode: str) -> None:
    cache = compile_cache(vllm, mode)
    opt2 = compile_cache(vllm, mode, optimize=2)
    result = vllm.run(model_types=["mistral"], recompile=True)
    assert result["verified"] is True
    assert sorted((r["optimize"], r["mode"]) for r in result["recompiled"]) == [
        (0, mode),
        (2, mode),
    ]
    assert cache.exists() and opt2.exists()
    assert (
        pyc_flags(cache)
        == pyc_flags(opt2)
        == {"TIMESTAMP": 0, "CHECKED_HASH": 3, "UNCHECKED_HASH": 1}[mode]
    )
    assert "mistral" in served_strings(vllm)


def test_stale_cache_under_a_patched_source_is_found(vllm: FakeVllm) -> None:
    """A second run notices that the import system serves other code than the file holds."""
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    vllm.run(model_types=["mistral"])
    patched = vllm.source.read_bytes()
    # an unchecked cache of the original, as if someone restored one by hand
    vllm.source.write_bytes(original)
    cache = compile_cache(vllm, "UNCHECKED_HASH")
    vllm.source.write_bytes(patched)
    assert "mistral" not in served_strings(vllm)

    result = vllm.run(model_types=["mistral"])
    assert result["changed"] is True and result["verified"] is True
    assert result["pyc_removed"] == [str(cache)]
    assert vllm.source.read_bytes() == patched
    assert "mistral" in served_strings(vllm)
    assert vllm.run(model_types=["mistral"])["changed"] is False


def test_pycache_prefix_is_honoured(vllm: FakeVllm, tmp_path: Path, monkeypatch) -> None:
    prefix = tmp_path / "pycache-prefix"
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    cache = compile_cache(vllm, "UNCHECKED_HASH")
    assert str(cache).startswith(str(prefix))
    result = vllm.run(model_types=["mistral"])
    assert str(cache) in result["pyc_removed"] and not cache.exists()
    assert "mistral" in served_strings(vllm)


@pytest.mark.parametrize("recompile", [False, True])
def test_pycache_prefix_of_the_serving_process(
    vllm: FakeVllm, tmp_path: Path, monkeypatch, recompile: bool
) -> None:
    """The server runs with PYTHONPYCACHEPREFIX, the module's own environment has none:
    the option names the server's prefix, and the proof is made for that process."""
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    prefix = tmp_path / "server-pycache"
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    cache = compile_cache(vllm, "UNCHECKED_HASH")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    assert str(cache).startswith(str(prefix))
    assert "mistral" not in served_strings(vllm, prefix)

    result = vllm.run(model_types=["mistral"], pycache_prefix=str(prefix), recompile=recompile)
    assert result["changed"] is True and result["verified"] is True
    assert str(cache) in result["pyc_removed"]
    if recompile:
        assert [(r["path"], r["mode"]) for r in result["recompiled"]] == [
            (str(cache), "UNCHECKED_HASH")
        ]
        assert pyc_flags(cache) == 1
    else:
        assert not cache.exists()
    assert "mistral" in served_strings(vllm, prefix)
    patched = vllm.source.read_bytes()

    # a stale unchecked cache under the server's prefix alone, the source already right
    vllm.source.write_bytes(original)
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    cache = compile_cache(vllm, "UNCHECKED_HASH")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    vllm.source.write_bytes(patched)
    assert "mistral" in served_strings(vllm) and "mistral" not in served_strings(vllm, prefix)
    result = vllm.run(model_types=["mistral"], pycache_prefix=str(prefix))
    assert result["changed"] is True and result["verified"] is True
    assert result["pyc_removed"] == [str(cache)]
    assert vllm.source.read_bytes() == patched
    assert "mistral" in served_strings(vllm, prefix)
    assert vllm.run(model_types=["mistral"], pycache_prefix=str(prefix))["changed"] is False
    assert "absolute" in vllm.fail(model_types=["mistral"], pycache_prefix="pycache")["msg"]
