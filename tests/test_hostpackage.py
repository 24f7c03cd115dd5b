"""src/specfleet/hostpackage.py: the host-side Python as one content-addressed tarball.

The common role installs it on every host by its hash, so it must be byte-identical for
identical sources, change when a source changes, end with its manifest (a partly unpacked
tarball is recognisable), and hold no module that needs the controller's packages.
"""

from __future__ import annotations

import ast
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT

from specfleet import hostpackage

SRC = ROOT / "src"
#: What host-side modules may import besides the standard library and each other: the
#: stack venv's packages.
STACK_PACKAGES = {
    "torch", "vllm", "transformers", "tokenizers", "safetensors", "speculators", "datasets",
    "matplotlib", "numpy", "prometheus_client", "fastapi", "starlette",
}  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_same_sources_same_bytes_and_name(cache: Path, tmp_path: Path) -> None:
    first = hostpackage.build_host_package(SRC)
    data = first.read_bytes()
    first.unlink()
    second = hostpackage.build_host_package(SRC)
    assert second == first and second.read_bytes() == data


def test_a_changed_source_is_a_new_package(cache: Path, tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(
        SRC / "specfleet", copy / "specfleet", ignore=shutil.ignore_patterns("__pycache__")
    )
    before = hostpackage.build_host_package(copy)
    with (copy / "specfleet" / "gate.py").open("a") as handle:
        handle.write("\n# changed\n")
    after = hostpackage.build_host_package(copy)
    assert after != before


def test_members_are_root_owned_sources_and_the_manifest_is_last(cache: Path) -> None:
    with tarfile.open(hostpackage.build_host_package(SRC)) as tar:
        members = tar.getmembers()
    names = [member.name for member in members]
    assert names[-1] == hostpackage.MANIFEST
    assert "specfleet/drafter/__main__.py" in names and "specfleet/gate.py" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert not [name for name in names if name.startswith(("/", "..")) or "/../" in name]
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, 0)}
    for controller_module in ("cli.py", "lab.py", "playbook.py", "image.py", "hostpackage.py"):
        assert f"specfleet/{controller_module}" not in names


def test_host_modules_import_no_controller_package() -> None:
    host_modules = {
        ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for path in hostpackage.host_files(SRC)
    }
    allowed = set(sys.stdlib_module_names) | STACK_PACKAGES
    for path in hostpackage.host_files(SRC):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.startswith("specfleet"):
                    assert name in host_modules or name == "specfleet", (path.name, name)
                else:
                    assert name.split(".")[0] in allowed, (path.name, name)


def test_forks_building_it_at_once_all_get_it(cache: Path) -> None:
    """Ansible's forks run the lookup at the same time, one per host."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: hostpackage.build_host_package(SRC), range(16)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    assert not list(paths[0].parent.glob(".partial-*"))
