"""src/specfleet/controller/hostpackage.py: the host-side Python as one content-addressed tarball.

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

from specfleet.controller import hostpackage

SRC = ROOT / "src"
#: What host-side modules may import besides the standard library and each other: the
#: stack venv's packages (every lock under locks/ pins huggingface_hub, which vLLM and
#: transformers need; the model fetch uses it for hf:// sources).
STACK_PACKAGES = {
    "torch", "vllm", "transformers", "tokenizers", "safetensors", "speculators", "datasets",
    "matplotlib", "numpy", "prometheus_client", "fastapi", "starlette", "huggingface_hub",
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
    with (copy / "specfleet" / "host" / "gate.py").open("a") as handle:
        handle.write("\n# changed\n")
    after = hostpackage.build_host_package(copy)
    assert after != before


def test_members_are_root_owned_sources_and_the_manifest_is_last(cache: Path) -> None:
    with tarfile.open(hostpackage.build_host_package(SRC)) as tar:
        members = tar.getmembers()
    names = [member.name for member in members]
    assert names[-1] == hostpackage.MANIFEST
    assert "specfleet/host/drafter/__main__.py" in names and "specfleet/host/gate.py" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert not [name for name in names if name.startswith(("/", "..")) or "/../" in name]
    assert {(m.uid, m.gid, m.mtime) for m in members} == {(0, 0, 0)}
    assert not [name for name in names if name.startswith("specfleet/controller")]
    # A fleet host's package has none of the lab's generators.
    assert not [name for name in names if name.startswith("specfleet/host/lab")]


def test_the_package_is_the_host_folder_and_lab_adds_only_its_own(cache: Path) -> None:
    def members(lab: bool) -> set[str]:
        with tarfile.open(hostpackage.build_host_package(SRC, lab=lab)) as tar:
            return {m.name for m in tar.getmembers() if m.isfile()} - {hostpackage.MANIFEST}

    on_disk = {
        path.relative_to(SRC).as_posix()
        for path in (SRC / "specfleet" / "host").rglob("*.py")
        if "__pycache__" not in path.parts
    } | {"specfleet/__init__.py"}
    fleet, lab = members(False), members(True)
    assert lab == on_disk
    assert lab - fleet == {name for name in on_disk if name.startswith("specfleet/host/lab/")}
    assert hostpackage.build_host_package(SRC) != hostpackage.build_host_package(SRC, lab=True)


@pytest.mark.parametrize("lab", [False, True], ids=["fleet", "lab"])
def test_host_modules_import_no_controller_package(lab: bool) -> None:
    """Nothing under host/ imports controller/ (or anything the stack venv lacks), and a
    fleet host's modules never import host/lab/, which its package does not carry."""
    files = hostpackage.host_files(SRC, lab=lab)
    host_modules = {
        ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for path in files
    }
    allowed = set(sys.stdlib_module_names) | STACK_PACKAGES
    for path in files:
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


ROLES_DEFAULTS = ROOT / "roles" / "specfleet" / "defaults" / "main.yml"


def test_every_host_module_the_roles_run_is_in_the_package_it_runs_from(cache: Path) -> None:
    """specfleet_host_modules, the roles' one map: each module is in the host package (the
    lab ones only in the lab's), so a module moved without its map entry fails here."""
    import yaml

    modules = yaml.safe_load(ROLES_DEFAULTS.read_text())["specfleet_host_modules"]

    def module_names(lab: bool) -> set[str]:
        with tarfile.open(hostpackage.build_host_package(SRC, lab=lab)) as tar:
            names = [m.name for m in tar.getmembers() if m.name.endswith(".py")]
        return {n.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for n in names}

    fleet, lab = module_names(False), module_names(True)
    for short, module in modules.items():
        assert module in (lab if module.startswith("specfleet.host.lab.") else fleet), short
        # Run with -m: a package needs its __main__.
        if (SRC / Path(*module.split("."))).is_dir():
            assert (SRC / Path(*module.split(".")) / "__main__.py").is_file(), short


def test_roles_and_playbooks_name_host_modules_only_through_the_map() -> None:
    """A module's dotted name in a role's or playbook's task, template or vars file (not in
    comments or docs) outside the map is a second place to change when it moves. The
    Molecule scenarios are tests: they name what they check on their own."""
    import re

    pattern = re.compile(r"specfleet\.host\.[\w.]+")
    offenders = []
    for folder in ("roles", "playbooks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".yml", ".j2"} or path == ROLES_DEFAULTS:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if "argument_specs" not in path.name and pattern.search(code):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("role", ["tiny_models", "packaged_model"])
def test_a_lab_role_on_a_host_without_the_lab_code_says_so_before_any_change(
    ansible, tmp_path: Path, role: str
) -> None:
    """A fleet host's package has no host/lab: a lab role applied to it stops at its first
    task with the setting's name, instead of failing later on a missing module."""
    play = [{"hosts": "localhost", "gather_facts": False, "roles": [{"role": role}]}]
    done = ansible.playbook(play, {"specfleet_accelerator": "cpu",
                                   "specfleet_host_package_lab": False})  # fmt: skip
    assert done.returncode != 0
    assert "specfleet_host_package_lab: true" in done.stdout, done.stdout[-3000:]
    assert "changed=0" in done.stdout
