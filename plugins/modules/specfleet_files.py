#!/usr/bin/python
"""Ansible module specfleet_files: a role's small files (content rendered on the controller),
written in one call, each atomically, only where they differ.

Why a module: a role that installs a unit, its environment file, a helper and a
configuration did it with a ``template`` or ``copy`` task each, and on a re-run each task
is a round trip to learn that nothing differs. Here the controller renders the content
(``lookup('template')``, ``lookup('file')``) and one call compares and writes them all.

Every file is written to a temporary file beside it and validated before any file is
renamed into place: a bad file (its ``validate`` command fails, an owner does not exist)
fails the task with nothing changed. A link at a destination is replaced, never followed.
A file whose state is ``absent`` is removed in the same call (a secret that is no longer
configured), after every new file is in place.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: specfleet_files
short_description: Write several small files in one call, atomically, where they differ
options:
  files:
    description: The files.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute destination; its folder must exist.
        type: path
        required: true
      content:
        description:
          - The whole content (UTF-8 text). Never echoed in results (no_log); C(--diff) shows
            a unified diff of what changed, unless O(files[].diff=false).
          - Required when O(files[].state=present).
        type: str
      state:
        description: V(absent) removes the file (or a link in its place); content is not read.
        type: str
        choices: [present, absent]
        default: present
      diff:
        description:
          - V(false) leaves the file out of C(--diff) output (a secret); its path is still
            listed in RV(changed_paths).
        type: bool
        default: true
      owner:
        type: str
        default: root
      group:
        type: str
        default: root
      mode:
        description: Octal mode as a string (C("0644")); required when O(files[].state=present).
        type: str
      validate:
        description: A command run on the new content before it is put in place; C(%s) is its path.
        type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Install the unit and its environment
  specfleet.fleet.specfleet_files:
    files:
      - path: /etc/systemd/system/specfleet-vllm.service
        content: "{{ lookup('ansible.builtin.template', 'vllm-server.service.j2') }}"
        mode: "0644"
      - path: /etc/specfleet/specfleet-vllm.env
        content: "{{ lookup('ansible.builtin.template', 'vllm-server.env.j2') }}"
        mode: "0600"
      # A secret: written when set, removed when not, never shown by --diff.
      - path: /etc/specfleet/specfleet-vllm.api-key
        content: "{{ specfleet_server_api_key }}"
        state: "{{ 'present' if specfleet_server_api_key | length > 0 else 'absent' }}"
        diff: false
        mode: "0440"
"""

RETURN = r"""
changed_paths:
  description: >-
    The files whose content, owner, group or mode was (or in check mode would be) set, and
    those removed.
  type: list
  elements: str
  returned: always
checksums:
  description: >-
    For each file, the sha1 of its content after the call (in check mode, of the content it
    would have), null for one that is absent: what C(ansible.builtin.stat) would report
    next, without another round trip.
  type: dict
  returned: always
"""

import difflib  # noqa: E402
import grp  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import shlex  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _ids(module: AnsibleModule, wanted: dict) -> tuple[int, int]:
    try:
        uid = pwd.getpwnam(wanted["owner"]).pw_uid
    except KeyError:
        module.fail_json(msg=f"{wanted['path']}: no user {wanted['owner']}; nothing was changed")
    try:
        gid = grp.getgrnam(wanted["group"]).gr_gid
    except KeyError:
        module.fail_json(msg=f"{wanted['path']}: no group {wanted['group']}; nothing was changed")
    return uid, gid


def _mode(module: AnsibleModule, wanted: dict) -> int:
    try:
        mode = int(wanted["mode"], 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        module.fail_json(msg=f"{wanted['path']}: mode {wanted['mode']!r} is not octal")
    return mode


def _current(path: str) -> tuple[os.stat_result | None, bytes | None]:
    """The file's lstat and content; a link or a non-file reads as absent (it is replaced)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None, None
    if not stat.S_ISREG(info.st_mode):
        return info, None
    with open(path, "rb") as handle:
        return info, handle.read()


def _plan_removal(module: AnsibleModule, wanted: dict) -> dict:
    path = wanted["path"]
    info, _ = _current(path)
    if info is not None and stat.S_ISDIR(info.st_mode):
        module.fail_json(msg=f"{path} is a folder; nothing was changed")
    return {"path": path, "remove": info is not None, "write": False, "chmod": False}


def _plan(module: AnsibleModule, wanted: dict) -> dict:
    path = wanted["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"{path}: the path must be absolute; nothing was changed")
    if wanted["state"] == "absent":
        return _plan_removal(module, wanted)
    for required in ("content", "mode"):
        if wanted[required] is None:
            module.fail_json(msg=f"{path}: {required} is required unless state is absent")
    if not os.path.isdir(os.path.dirname(path)):
        module.fail_json(msg=f"{path}: its folder does not exist; nothing was changed")
    uid, gid = _ids(module, wanted)
    mode = _mode(module, wanted)
    content = wanted["content"].encode("utf-8")
    info, before = _current(path)
    if info is not None and stat.S_ISDIR(info.st_mode):
        module.fail_json(msg=f"{path} is a folder; nothing was changed")
    same_content = before == content
    same_attributes = (
        info is not None
        and stat.S_ISREG(info.st_mode)
        and (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, mode)
    )
    return {
        "path": path,
        "content": content,
        "before": before,
        "uid": uid,
        "gid": gid,
        "mode": mode,
        "write": not same_content,
        "chmod": same_content and not same_attributes,
        "remove": False,
        "validate": wanted.get("validate"),
        "diff": wanted["diff"],
    }


def _stage(module: AnsibleModule, plan: dict) -> str:
    """The new content in a temporary file beside its destination, owned and moded."""
    folder, name = os.path.split(plan["path"])
    handle, staged = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        os.fchmod(handle, plan["mode"])
        os.fchown(handle, plan["uid"], plan["gid"])
        os.write(handle, plan["content"])
        os.fsync(handle)
    finally:
        os.close(handle)
    if plan["validate"]:
        if "%s" not in plan["validate"]:
            os.unlink(staged)
            module.fail_json(msg=f"{plan['path']}: validate must contain %s")
        command = [part.replace("%s", staged) for part in shlex.split(plan["validate"])]
        rc, out, err = module.run_command(command)
        if rc != 0:
            os.unlink(staged)
            raise ValueError(
                f"{plan['path']}: the new content failed `{plan['validate']}`: "
                f"{(err or out).strip()}; nothing was changed"
            )
    return staged


def _diff(plan: dict) -> dict:
    # A unified diff, prepared here: the content option is no_log (an environment file may
    # hold a token), and Ansible masks a no_log value wherever it appears whole in a result.
    before = (plan["before"] or b"").decode("utf-8", "replace").splitlines(keepends=True)
    after = plan["content"].decode("utf-8").splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, f"{plan['path']} (before)", plan["path"])
    return {"prepared": "".join(lines)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "content": {"type": "str", "no_log": True},
                    "state": {
                        "type": "str",
                        "choices": ["present", "absent"],
                        "default": "present",
                    },
                    "diff": {"type": "bool", "default": True},
                    "owner": {"type": "str", "default": "root"},
                    "group": {"type": "str", "default": "root"},
                    "mode": {"type": "str"},
                    "validate": {"type": "str"},
                },
            }
        },
        supports_check_mode=True,
    )
    plans = [_plan(module, wanted) for wanted in module.params["files"]]
    paths = [plan["path"] for plan in plans]
    if len(set(paths)) != len(paths):
        module.fail_json(msg="a path is listed twice; nothing was changed")
    changed = [plan for plan in plans if plan["write"] or plan["chmod"] or plan["remove"]]
    result = {
        "changed": bool(changed),
        "changed_paths": [plan["path"] for plan in changed],
        # A change detector's checksum (stat's), not a security boundary.
        "checksums": {
            plan["path"]: hashlib.sha1(plan["content"]).hexdigest() if "content" in plan else None
            for plan in plans
        },
    }
    # Only under --diff, as the template and copy modules: a file's text stays out of
    # results and logs otherwise (an environment file may hold a token; the option itself
    # is no_log, so the invocation Ansible echoes does not carry it either).
    if module._diff:
        result["diff"] = [_diff(plan) for plan in changed if plan["write"] and plan["diff"]]
    if module.check_mode or not changed:
        module.exit_json(**result)

    # Every new file staged and validated first; only then is anything renamed.
    staged: dict[str, str] = {}
    try:
        for plan in changed:
            if plan["write"]:
                staged[plan["path"]] = _stage(module, plan)
    except (OSError, ValueError) as error:
        for path in staged.values():
            os.unlink(path)
        module.fail_json(msg=str(error))
    for plan in changed:
        if plan["write"]:
            os.replace(staged[plan["path"]], plan["path"])
        elif plan["chmod"]:
            os.chown(plan["path"], plan["uid"], plan["gid"], follow_symlinks=False)
            os.chmod(plan["path"], plan["mode"])
    for plan in changed:
        if plan["remove"]:
            os.unlink(plan["path"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
