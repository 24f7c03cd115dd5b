"""Action ``specfleet_converged_inputs``: everything the roles decide on, as one digest, on
the controller alone (no call to any host).

The digest covers:

- the project's tree that decides what a host becomes: roles (tasks, templates, files,
  defaults), playbooks, plugins, the host-side Python (``src/specfleet``) and the locks;
- every variable of every host in the inventory (inventory, group and extra vars), each as
  it templates: a key read from a file through a lookup counts by its value, not its
  path. A variable that cannot template yet (it needs facts) counts as written;
- the inventory's groups;
- the content of the controller's files the roles read from a path a variable names
  (``controller_files``: a model's manifest, a folder of locks), so a manifest pinned again
  at the same path is a new digest, as a key read through a lookup is.

So one digest serves the whole fleet: a change to any host's variables sends every host
through the full converge once (the balancer's configuration names every server, and
Prometheus' rules their floors). The names a run sets about itself (its tags, forks, check
mode, the ``omit`` placeholder, facts) are left out: they are not what a host must be.
Run once per play (``run_once``); its cost grows with the inventory, not with the hosts
times the inventory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
action: specfleet_converged_inputs
short_description: The digest of everything the roles decide on, computed on the controller
description:
  - Returns C(digest), the sha256 of the project's deciding tree, every host's variables as
    they template, and the inventory's groups. Contacts no host.
options:
  ignore:
    description: Variable names left out besides the run's own (the fast path's switch).
    type: list
    elements: str
    default: []
  controller_files:
    description:
      - Variable names whose value is a path on the controller that a role reads (a file,
        or a folder read whole); its content counts, not only its path. A host that does not
        set one, or a path that is not there, counts as absent.
    type: list
    elements: str
    default: []
"""

PROJECT = Path(__file__).resolve().parents[2]
DECIDING = ("roles", "playbooks", "plugins", "src/specfleet", "locks")

# What a run says about itself, not what a host must be. Facts are gathered after this
# runs (and a fact cache would make them change from run to run).
RUN_NAMES = frozenset(
    {
        "ansible_check_mode",
        "ansible_collection_name",
        "ansible_config_file",
        "ansible_dependent_role_names",
        "ansible_diff_mode",
        "ansible_facts",
        "ansible_forks",
        "ansible_inventory_sources",
        "ansible_limit",
        "ansible_local",
        "ansible_loop",
        "ansible_loop_var",
        "ansible_parent_role_names",
        "ansible_parent_role_paths",
        "ansible_play_batch",
        "ansible_play_hosts",
        "ansible_play_hosts_all",
        "ansible_play_name",
        "ansible_play_role_names",
        "ansible_playbook_python",
        "ansible_role_name",
        "ansible_role_names",
        "ansible_run_tags",
        "ansible_search_path",
        "ansible_skip_tags",
        "ansible_verbosity",
        "ansible_version",
        "environment",
        "group_names",
        "groups",
        "hostvars",
        "inventory_dir",
        "inventory_file",
        "omit",
        "play_hosts",
        "playbook_dir",
        "role_name",
        "role_names",
        "role_path",
        "vars",
    }
)


def folder_digest(digest: Any, root: Path, folder: Path) -> None:
    """Every file under folder, by path and content (bytecode caches left out)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(f"{path.relative_to(root)}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())


def tree_digest(root: Path) -> str:
    """The deciding folders of the project."""
    digest = hashlib.sha256()
    for name in DECIDING:
        folder_digest(digest, root, root / name)
    return digest.hexdigest()


def content_digest(path: Path) -> str:
    """A controller file's or folder's content, or "absent"."""
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if path.is_dir():
        digest = hashlib.sha256()
        folder_digest(digest, path, path)
        return digest.hexdigest()
    return "absent"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def _value(self, host_vars: Any, name: str) -> Any:
        try:
            return host_vars[name]
        except Exception:  # one that needs facts counts as written
            return host_vars.raw_get(name) if hasattr(host_vars, "raw_get") else repr(name)

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        ignore = set(self._task.args.get("ignore") or []) | RUN_NAMES
        controller_files = list(self._task.args.get("controller_files") or [])
        # One read a path, however many hosts name it (a fleet shares its manifest).
        contents: dict[str, str] = {}
        groups = task_vars.get("groups", {})
        hostvars = task_vars["hostvars"]
        fleet: dict[str, Any] = {
            "groups": {name: sorted(hosts) for name, hosts in sorted(groups.items())}
        }
        for host in sorted(groups.get("all", [])):
            host_vars = hostvars[host]
            facts = host_vars.get("ansible_facts", {})
            names = sorted(
                name
                for name in host_vars
                if name not in ignore and not (name.startswith("ansible_") and name[8:] in facts)
            )
            fleet[host] = {name: self._value(host_vars, name) for name in names}
            for name in controller_files:
                path = fleet[host].get(name)
                if isinstance(path, str) and path:
                    if path not in contents:
                        contents[path] = content_digest(Path(path))
                    fleet[host][f"content of {name}"] = contents[path]
        document = json.dumps(fleet, sort_keys=True, default=repr).encode()
        result.update(
            changed=False,
            digest=hashlib.sha256(tree_digest(PROJECT).encode() + b"\n" + document).hexdigest(),
        )
        return result
