"""Action ``specfleet_converged_inputs``: everything the roles decide on, as one digest, on
the controller alone (no call to any host).

The digest covers:

- the project's tree that decides what a host becomes: roles (tasks, templates, files,
  defaults), playbooks, plugins, the host-side Python (``src/specfleet``) and the locks;
- every variable of every host in the inventory (inventory, group and extra vars), each as
  it templates: a key read from a file through a lookup counts by its value, not its
  path. A variable that cannot template yet (it needs facts) counts as written;
- the inventory's groups.

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


def tree_digest(root: Path) -> str:
    """Every file of the deciding folders, by path and content (bytecode caches left out)."""
    digest = hashlib.sha256()
    for name in DECIDING:
        for path in sorted((root / name).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(f"{path.relative_to(root)}\n".encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


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
        document = json.dumps(fleet, sort_keys=True, default=repr).encode()
        result.update(
            changed=False,
            digest=hashlib.sha256(tree_digest(PROJECT).encode() + b"\n" + document).hexdigest(),
        )
        return result
