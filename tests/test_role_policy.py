"""Conventions every role keeps, checked over all of them (no container needed).

- every variable in defaults/main.yml is declared in meta/argument_specs.yml, has a comment
  above it and appears in the role's README; declared defaults equal the real ones;
- variables are prefixed with the role's name (project-level settings live in the
  ``specfleet`` role, prefixed ``specfleet_``); internal ones are ``__<role>_*``;
- every task uses a fully qualified module name, every command says when it changed
  something, no task restarts a service behind a handler's back;
- a role whose behaviour differs per accelerator profile has vars/<profile>.yml for every
  profile (the profiles: specfleet_accelerator's choices, listed once);
- each README follows one skeleton, and each role names the Molecule scenario that covers it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT

#: The accelerator profiles: the choices of specfleet_accelerator, their one list.
PROFILES = tuple(
    yaml.safe_load((ROOT / "roles" / "specfleet" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]["main"]["options"]["specfleet_accelerator"]["choices"]
)
ROLES = sorted(path.name for path in (ROOT / "roles").iterdir() if (path / "meta").is_dir())
README_SECTIONS = ("## Requirements", "## Role Variables", "## Example Playbook", "## Tested on")
TASK_KEYS = {
    "name", "when", "block", "rescue", "always", "register", "notify", "loop", "listen",
    "changed_when", "failed_when", "tags", "vars", "loop_control", "environment", "no_log",
    "become", "become_user", "delegate_to", "run_once", "until", "retries", "delay",
    "async", "poll", "check_mode", "ignore_errors", "args", "throttle",
}  # fmt: skip
# The project's own modules: plugins/modules/*.py, by their names in the collection.
MODULES_OF_OURS = {
    f"specfleet.fleet.{path.stem}" for path in (ROOT / "plugins" / "modules").glob("*.py")
}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def tasks_of(items: list[dict] | None) -> list[dict]:
    found = []
    for item in items or []:
        found.append(item)
        for key in ("block", "rescue", "always"):
            found.extend(tasks_of(item.get(key)))
    return found


def test_every_role_is_covered() -> None:
    assert set(ROLES) >= {
        "specfleet", "common", "nvidia_gpu", "ml_stack", "vllm_eagle3_patch",
        "vllm_server", "drafter_training", "tiny_models",
    }  # fmt: skip


@pytest.mark.parametrize("role", ROLES)
def test_defaults_documented_and_declared(role: str) -> None:
    base = ROOT / "roles" / role
    defaults = load(base / "defaults" / "main.yml") or {}
    specs = load(base / "meta" / "argument_specs.yml")
    options = specs["argument_specs"]["main"]["options"] or {}
    assert set(defaults) == set(options), set(defaults) ^ set(options)
    prefix = "specfleet_" if role == "specfleet" else f"{role}_"
    assert all(name.startswith(prefix) for name in defaults), prefix
    lines = (base / "defaults" / "main.yml").read_text().splitlines() if defaults else []
    readme = (base / "README.md").read_text()
    for name, value in defaults.items():
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
        # A comment above the variable, or above the group of variables it belongs to.
        while index > 0 and lines[index - 1] and not lines[index - 1].startswith("#"):
            index -= 1
        assert lines[index - 1].startswith("#"), f"{name} has no comment above it"
        assert f"`{name}`" in readme, f"{name} missing from {role}/README.md"
        if isinstance(value, str) and "{{" in value:
            continue
        if "default" in options[name]:
            assert options[name]["default"] == value, name


@pytest.mark.parametrize("role", ROLES)
def test_internal_variables_are_marked(role: str) -> None:
    base = ROOT / "roles" / role
    for path in sorted((base / "vars").glob("*.yml")):
        for name in load(path) or {}:
            assert name.startswith(f"__{role}_"), f"{path.name}: {name}"
    for path in sorted((base / "tasks").glob("*.yml")):
        for task in tasks_of(load(path)):
            registered = task.get("register")
            if registered:
                assert registered.startswith(f"__{role}_"), f"{path.name}: {registered}"
            facts = task.get("ansible.builtin.set_fact") or {}
            for name in facts:
                public = name.startswith(f"{role}_")  # a documented output of the role
                assert public or name.startswith(f"__{role}_"), f"{path.name}: {name}"


@pytest.mark.parametrize("role", ROLES)
def test_fqcn_and_changed_when_everywhere(role: str) -> None:
    base = ROOT / "roles" / role
    files = sorted((base / "tasks").glob("*.yml")) + sorted((base / "handlers").glob("*.yml"))
    for path in files:
        for task in tasks_of(load(path)):
            if "block" in task:
                continue
            actions = [key for key in task if key not in TASK_KEYS]
            assert len(actions) == 1, (path.name, task)
            action = actions[0]
            assert action.startswith(("ansible.builtin.", "community.")) or (
                action in MODULES_OF_OURS
            ), action
            if action in ("ansible.builtin.command", "ansible.builtin.shell"):
                assert "changed_when" in task or "creates" in str(task), (path.name, task["name"])


@pytest.mark.parametrize("role", ROLES)
def test_profile_vars_for_every_profile(role: str) -> None:
    """A role with one profile's vars file has them all, each setting the same names."""
    found = {path.stem for path in (ROOT / "roles" / role / "vars").glob("*.yml")}
    if not found & set(PROFILES):
        return
    assert set(PROFILES) <= found, f"{role}: vars for {sorted(set(PROFILES) - found)} missing"
    names = {p: frozenset(load(ROOT / "roles" / role / "vars" / f"{p}.yml")) for p in PROFILES}
    assert len(set(names.values())) == 1, f"{role}: profiles set different names: {names}"
    tasks = "".join(p.read_text() for p in (ROOT / "roles" / role / "tasks").glob("*.yml"))
    loads = (
        'include_vars: "{{ specfleet_accelerator | specfleet.fleet.profile_vars_file(role_path) }}"'
    )
    assert loads in tasks, f"{role} never loads them (or not through profile_vars_file)"


@pytest.mark.parametrize("role", ROLES)
def test_readme_skeleton_and_scenario(role: str) -> None:
    readme = (ROOT / "roles" / role / "README.md").read_text()
    positions = [readme.find(section) for section in README_SECTIONS]
    assert all(position >= 0 for position in positions), (role, positions)
    assert positions == sorted(positions), f"{role}: sections out of order"
    assert "## Not tested" in readme
    scenarios = {p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")}
    named = set(re.findall(r"molecule/([a-z_]+)/", readme)) | set(
        re.findall(r"molecule test -s ([a-z_]+)", readme)
    )
    # A role no container can run (kernel modules) says so instead, and why.
    assert named & scenarios or "No Molecule scenario:" in readme, (
        f"{role}: README names no Molecule scenario that covers it"
    )


@pytest.mark.parametrize("role", ROLES)
def test_meta_platforms_are_the_tested_ones(role: str) -> None:
    meta = load(ROOT / "roles" / role / "meta" / "main.yml")
    platforms = {p["name"]: set(p["versions"]) for p in meta["galaxy_info"]["platforms"]}
    readme = (ROOT / "roles" / role / "README.md").read_text()
    tested = readme[readme.find("## Tested on") :]
    for name, versions in platforms.items():
        for version in versions:
            assert version in tested, f"{role} claims {name} {version}, its README never tested it"


def test_no_role_reaches_into_the_project_tree() -> None:
    for path in (ROOT / "roles").rglob("*.yml"):
        text = path.read_text()
        assert "role_path ~ '/../" not in text and "role_path }}/../" not in text, path


def test_regex_groups_are_read_with_regex_findall() -> None:
    """A backreference argument to regex_search ('\\1') is read two ways by Ansible: a
    bare expression (``that:``, ``when:``) unescapes it to the byte \\x01 ("Unknown
    argument"), a ``{{ }}`` template keeps it, and '\\\\1' there fails with "'NoneType'
    object has no attribute 'group'". regex_findall returns the groups with no argument
    to escape. Only the branch that runs shows the error (flash-attn's toolkit check on
    a GPU host, `specfleet status`), so it is checked here, everywhere."""
    backreference = re.compile(r"""regex_search.*'\\+(?:[0-9]|g<)""")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("roles", "playbooks", "molecule")
        for path in sorted((ROOT / folder).rglob("*.yml"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if backreference.search(line)
    ]
    assert not offenders, offenders


# Entry points that deliberately have no spec: they run only after another entry point
# of the same role checked the same options earlier in the play.
ENTRY_POINTS_WITHOUT_SPEC = {("vllm_server", "start")}


def _role_entries(items: Any) -> list[tuple[str, str]]:
    """(role, tasks_from) of every include_role / import_role below ``items``."""
    found = []
    if isinstance(items, dict):
        for key, value in items.items():
            is_role = key.endswith(("include_role", "import_role")) and isinstance(value, dict)
            if is_role and "tasks_from" in value:
                found.append((value["name"], value["tasks_from"]))
            found.extend(_role_entries(value))
    elif isinstance(items, list):
        for item in items:
            found.extend(_role_entries(item))
    return found


def test_every_role_entry_point_is_checked_by_its_spec() -> None:
    """Ansible checks a role's argument spec for ``tasks_from: X`` only when the spec has an
    entry point named X: ``tasks_from: prepare.yml`` silently checks nothing."""
    entries = {
        entry
        for folder in ("playbooks", "roles", "molecule")
        for path in (ROOT / folder).rglob("*.yml")
        for entry in _role_entries(yaml.safe_load(path.read_text()))
    }
    assert entries, "no include_role with tasks_from found"
    for role, entry in sorted(entries):
        specs = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
        assert (role, entry) in ENTRY_POINTS_WITHOUT_SPEC or entry in specs, (
            f"tasks_from: {entry} of role {role} is not an entry point of its argument spec"
            f" ({', '.join(specs)}): Ansible would check none of its variables"
        )


@pytest.mark.parametrize("module", sorted(MODULES_OF_OURS))
def test_every_module_documents_itself(module: str) -> None:
    """`ansible-doc <module>` is how operators read a module: its DOCUMENTATION must parse
    (a ': ' inside a plain YAML scalar does not, and nothing else would notice)."""
    run = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-doc"), "-t", "module", "-j", module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)[module]["doc"]["options"]
