#!/usr/bin/python
"""Ansible module specfleet_directories: a list of folders with one owner and mode, in one call.

Why a module: ``ansible.builtin.file`` in a loop costs one connection round trip per
folder, and the check that none of them is a planted link costs another loop of
``stat``; on a re-run that changes nothing, those two loops were the slowest part of a
host's converge. Here every folder is examined first; a link or a non-folder where a
folder belongs fails the run before anything changes; then the missing folders are made
and the owner and mode set, without ever following a link.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: specfleet_directories
short_description: Folders with one owner and mode, refusing links, in one call
description:
  - Examines every path first. A symbolic link, or anything but a folder, where a folder
    belongs fails the run before anything changes (a link planted where root would chown
    or write must never be followed).
  - Then makes the missing folders (with their missing parents) and sets owner, group and
    mode on each listed folder without following links.
options:
  paths:
    description: Absolute paths of the folders, parents before children.
    type: list
    elements: path
    required: true
  owner:
    description: Owner of every listed folder.
    type: str
    default: root
  group:
    description: Group of every listed folder.
    type: str
    default: root
  mode:
    description: Mode of every listed folder, octal, as a string.
    type: str
    default: "0755"
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: The layout, root-owned
  specfleet.fleet.specfleet_directories:
    paths: [/opt/specfleet, /opt/specfleet/venvs, /etc/specfleet]
"""

RETURN = r"""
created:
  description: The folders made (listed ones only).
  type: list
  elements: str
  returned: always
fixed:
  description: Existing folders whose owner, group or mode was set.
  type: list
  elements: str
  returned: always
"""

import grp  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _problems(paths: list[str]) -> list[str]:
    """Every listed path that is a link or not a folder; nothing is changed."""
    problems = []
    for path in paths:
        if not os.path.isabs(path):
            problems.append(f"{path} is not an absolute path")
            continue
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            problems.append(
                f"{path} is a symbolic link, not a folder: remove it (and check who planted it)"
            )
        elif not stat.S_ISDIR(info.st_mode):
            problems.append(f"{path} is not a folder: remove it or move it away")
    return problems


def _settings(info: os.stat_result) -> tuple[int, int, int]:
    return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)


def _set(path: str, uid: int, gid: int, mode: int) -> None:
    """Owner, group and mode of the folder itself: opened without following a link that
    could have replaced it since it was examined (and mode set whatever the umask)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(descriptor, uid, gid)
        os.fchmod(descriptor, mode)
    finally:
        os.close(descriptor)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0755"},
        },
        supports_check_mode=True,
    )
    paths: list[str] = module.params["paths"]
    try:
        mode = int(module.params["mode"], 8)
        uid = pwd.getpwnam(module.params["owner"]).pw_uid
        gid = grp.getgrnam(module.params["group"]).gr_gid
    except (ValueError, KeyError) as error:
        module.fail_json(msg=f"bad owner, group or mode: {error}. Nothing was changed.")
    problems = _problems(paths)
    if problems:
        module.fail_json(msg="; ".join(problems) + ". Nothing was changed.", problems=problems)

    created = [path for path in paths if not os.path.lexists(path)]
    fixed = [
        path
        for path in paths
        if path not in created and _settings(os.lstat(path)) != (uid, gid, mode)
    ]
    if not module.check_mode:
        for path in paths:
            if path in created:
                os.makedirs(path, mode=mode, exist_ok=True)
            if path in created or path in fixed:
                _set(path, uid, gid, mode)
    module.exit_json(changed=bool(created or fixed), created=created, fixed=fixed)


if __name__ == "__main__":
    main()
