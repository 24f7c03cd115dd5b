"""plugins/module_utils: the modules' pure logic, found by Ansible as the collection's, from
the checkout and from an installed copy alike.

- Nothing in module_utils imports Ansible (nor anything outside the standard library): the
  files load with ``python -S`` (no site-packages).
- A module imports a project module_utils file in one form only, the collection's
  (``ansible_collections.specfleet.fleet.plugins.module_utils.<name>``), at its top level:
  the checkout is that collection too (ansible.cfg's collections_path links it), so there
  is no second form to keep equal.
- Run through Ansible with the project's ansible.cfg, the whitelist module finds its
  module_utils through that link, and without it it does not (the control).

tests/test_collection.py runs the module from a built and installed copy of the collection.
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
COLLECTION_FORM = "ansible_collections.specfleet.fleet.plugins.module_utils."
SOURCES = sorted((ROOT / "plugins" / "modules").glob("*.py")) + sorted(UTILS.glob("*.py"))


def imports_of_ours(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import, anywhere in the file, that names a project module_utils file in any
    form (the collection's, or ansible.module_utils.<name>, a path only the checkout had)."""
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
            for prefix in ("ansible.module_utils.", COLLECTION_FORM)
        ):
            found.append(node)
    return found


def test_module_utils_need_nothing_but_the_standard_library() -> None:
    assert {"eagle3_shapes", "eagle3_probes", "safe_files"} <= OURS
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
def test_module_utils_are_imported_as_the_collections_at_the_top(path: Path) -> None:
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    wrong = [
        node.lineno
        for node in imports_of_ours(tree)
        if id(node) not in top_level
        or not isinstance(node, ast.ImportFrom)
        or not (node.module or "").startswith(COLLECTION_FORM)
    ]
    assert not wrong, (
        f"{path.name}: lines {wrong} import project module_utils otherwise than "
        f"`from {COLLECTION_FORM}<name> import ...` at the top level"
    )
    if path.name == "vllm_eagle3_whitelist.py":
        imported = {node.module.removeprefix(COLLECTION_FORM) for node in imports_of_ours(tree)}
        assert imported == {"eagle3_probes", "eagle3_shapes", "safe_files"}


def test_ansible_finds_the_module_utils_through_the_collection_link(
    ansible, tmp_path: Path
) -> None:
    """The module through ansible-playbook, with the project's ansible.cfg: it and its
    module_utils come from the checkout as the collection (collections_path). The control, an
    ansible.cfg that finds the module file by a library path but no collection, fails on the
    module_utils and changes nothing."""
    vllm = FakeVllm(tmp_path / "vllm", "0.21.0")
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "the whitelist module",
                    "specfleet.fleet.vllm_eagle3_whitelist": {
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
    bare.write_text(
        f"[defaults]\nlibrary = {ROOT / 'plugins' / 'modules'}\n"
        f"collections_path = {tmp_path / 'no-collections'}\n"
    )
    task = play[0]["tasks"][0]
    task["vllm_eagle3_whitelist"] = task.pop("specfleet.fleet.vllm_eagle3_whitelist")
    before = vllm.snapshot()
    control = ansible.playbook(play, json_output=True, env={"ANSIBLE_CONFIG": str(bare)})
    assert control.returncode != 0
    failed = json_result(control)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert failed.get("failed") is True, failed
    # Ansible could not build the module's payload: its module_utils are the collection's
    assert "unable to locate collection specfleet.fleet" in failed["msg"], failed
    assert vllm.snapshot() == before
