"""plugins/module_utils: the modules' pure logic, found by Ansible from the repository and from
the collection specfleet.fleet alike.

- Nothing in module_utils imports Ansible (nor anything outside the standard library): the
  files load with ``python -S`` (no site-packages).
- A module imports a project module_utils file only in one form: a top-level ``try`` that
  imports it as ``ansible.module_utils.<name>`` (ansible.cfg's ``module_utils`` path, a run
  from the checkout), whose one ``except ImportError`` imports the same names from
  ``ansible_collections.specfleet.fleet.plugins.module_utils.<name>`` (the installed
  collection). Ansible's dependency finder takes an import that is not at the top level as
  optional, so either may be missing from its payload; each needs the other.
- Run through Ansible with the project's ansible.cfg, the whitelist module finds its
  module_utils there, and without that setting it does not (the control).

The other form is exercised by every run of tests/vllm_releases.py's run_module, which lays
the files out as the installed collection does.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, json_result
from vllm_releases import FakeVllm

UTILS = ROOT / "plugins" / "module_utils"
OURS = {path.stem for path in UTILS.glob("*.py")}
REPO_FORM = "ansible.module_utils."
COLLECTION_FORM = "ansible_collections.specfleet.fleet.plugins.module_utils."
SOURCES = sorted((ROOT / "plugins" / "modules").glob("*.py")) + sorted(UTILS.glob("*.py"))


def names(node: ast.ImportFrom) -> list[tuple[str, str | None]]:
    return [(alias.name, alias.asname) for alias in node.names]


def imports_of_ours(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import, anywhere in the file, that names a project module_utils file."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            dotted = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(
            name.startswith(prefix) and name[len(prefix) :].split(".")[0] in OURS
            for name in dotted
            for prefix in (REPO_FORM, COLLECTION_FORM)
        ):
            found.append(node)
    return found


def both_forms(node: ast.stmt) -> str | None:
    """The module_utils file a top-level statement imports in both forms, or None."""
    if not (
        isinstance(node, ast.Try)
        and len(node.body) == 1
        and len(node.handlers) == 1
        and not node.orelse
        and not node.finalbody
    ):
        return None
    (first,), handler = node.body, node.handlers[0]
    if not (
        isinstance(handler.type, ast.Name)
        and handler.type.id == "ImportError"
        and len(handler.body) == 1
    ):
        return None
    (second,) = handler.body
    if not (
        isinstance(first, ast.ImportFrom)
        and isinstance(second, ast.ImportFrom)
        and first.level == second.level == 0
        and (first.module or "").startswith(REPO_FORM)
    ):
        return None
    name = (first.module or "")[len(REPO_FORM) :]
    if name not in OURS or second.module != COLLECTION_FORM + name:
        return None
    return name if names(first) == names(second) else None


def test_module_utils_need_nothing_but_the_standard_library() -> None:
    assert {"specfleet_eagle3_shapes", "specfleet_eagle3_probes", "specfleet_safe_files"} <= OURS
    for path in sorted(UTILS.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert top == "__future__" or top in sys.stdlib_module_names, (
                    f"{path.name} imports {module}"
                )
        assert "AnsibleModule" not in path.read_text(), path.name
    # and they load that way: no site-packages, so no Ansible to fall back on
    load = (
        "import importlib.util, sys\n"
        "for path in sys.argv[1:]:\n"
        "    name = path.rsplit('/', 1)[1][:-3]\n"
        "    spec = importlib.util.spec_from_file_location(name, path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[name] = module\n"
        "    spec.loader.exec_module(module)\n"
        "assert 'ansible' not in sys.modules\n"
    )
    files = [str(path) for path in sorted(UTILS.glob("*.py"))]
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-B", "-c", load, *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", SOURCES, ids=[path.name for path in SOURCES])
def test_module_utils_are_imported_in_both_forms(path: Path) -> None:
    tree = ast.parse(path.read_text())
    paired = {id(node): both_forms(node) for node in tree.body}
    allowed = {
        id(inner)
        for node in tree.body
        if paired[id(node)]
        for inner in ast.walk(node)
        if isinstance(inner, ast.ImportFrom)
    }
    stray = [node.lineno for node in imports_of_ours(tree) if id(node) not in allowed]
    assert not stray, (
        f"{path.name}: lines {stray} import project module_utils outside "
        f"`try: from {REPO_FORM}<name> import ... / except ImportError: from "
        f"{COLLECTION_FORM}<name> import (the same names)`"
    )
    imported = [name for name in paired.values() if name]
    assert len(imported) == len(set(imported)), f"{path.name} imports a file twice"
    if path.name == "vllm_eagle3_whitelist.py":
        assert set(imported) == {
            "specfleet_eagle3_probes",
            "specfleet_eagle3_shapes",
            "specfleet_safe_files",
        }


def test_ansible_finds_the_module_utils_through_ansible_cfg(ansible, tmp_path: Path) -> None:
    """The module through ansible-playbook, with the project's ansible.cfg: its module_utils
    come from `module_utils = plugins/module_utils`. The control, an ansible.cfg without that
    line, fails on the import (no collection specfleet.fleet is installed here)."""
    vllm = FakeVllm(tmp_path / "vllm", "0.21.0")
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "the whitelist module",
                    "vllm_eagle3_whitelist": {
                        "python": str(vllm.python),
                        "model_types": ["mistral"],
                    },
                }
            ],
        }
    ]
    done = ansible.playbook(play, json_output=True)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json_result(done)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["verified"] is True and result["added"] == ["mistral"], result

    bare = tmp_path / "bare.cfg"
    bare.write_text(f"[defaults]\nlibrary = {ROOT / 'plugins' / 'modules'}\n")
    before = vllm.snapshot()
    control = ansible.playbook(play, json_output=True, env={"ANSIBLE_CONFIG": str(bare)})
    assert control.returncode != 0
    failed = json_result(control)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert failed.get("failed") is True, failed
    # the repository form was missing, so the module fell back to the collection's
    assert "No module named 'ansible_collections.specfleet'" in failed["msg"], failed
    assert vllm.snapshot() == before
