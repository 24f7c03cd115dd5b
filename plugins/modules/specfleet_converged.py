#!/usr/bin/python
"""Ansible module specfleet_converged: prove in one call that a host is what its last full
converge left, or record what it left.

Why: a ``site.yml`` that changes nothing still asked each server 7 questions over 30 tasks.
At fleet scale the controller's CPU, not the hosts, decides how often a fleet can be
converged. The controller says what the host must be as one digest of its inputs (the
project's tree and every variable: specfleet_converged_inputs). The full converge ends by
recording that digest here, with what the roles manage on this host (each role's
``tasks/managed.yml``) and a digest of each managed thing as the converge left it. A later
run sends its inputs digest; when both the inputs and every managed thing are unchanged,
the host has nothing to converge, and its run ends at once.

Any difference removes the record, so only a full converge that ends writes one again: a
run that fails half way never leaves a record that a later run could trust.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: specfleet_converged
short_description: Check or record what a host's last full converge left, in one call
description:
  - C(check) reads the record, recomputes every managed thing it names and compares, and
    removes the record when anything differs (the inputs or the host).
  - C(record) computes every managed thing and writes the record atomically (root's, 0600).
  - C(absent) sets the record aside as C(check) does when something differs (a forced full
    converge), after noting the trees changed in place.
  - A tree whose files changed while it stayed where it was (a venv or a model, built once
    and never edited) is named in O(rebuild_marker), which the roles that build those trees read
    with the rest of the host, to build them anew. C(record) refuses to take such a change as
    the new normal unless a role built the tree in this run (C(manages.rebuilt)).
options:
  state:
    description: What to do.
    type: str
    choices: [check, record, absent]
    default: check
  inputs:
    description: The controller's digest of everything the roles decide on (C(check), C(record)).
    type: str
    default: ""
  record:
    description: Where the record lives (a root-owned folder).
    type: path
    default: /etc/specfleet/converged.json
  rebuild_marker:
    description: Where the trees changed in place are named for the roles (root's).
    type: path
    default: ""
  manages:
    description:
      - What the roles manage on this host (C(record) only), by kind. C(files) (content,
        owner, mode; a link's target), C(trees) (every entry's path, type, owner, mode, size
        and modification time, links not followed below the top), C(units) (systemd's
        states, main PID and whether a reload is due), C(packages) (dpkg's status and
        version), C(users) and C(groups) (the account databases), C(urls) (the HTTP status
        of one GET), C(balancers) (which servers an HAProxy admin socket has out of
        rotation, as C(SOCKET BACKEND)).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: End here when nothing changed since the last full converge
  specfleet.fleet.specfleet_converged:
    inputs: "{{ __inputs.digest }}"
  register: __converged
"""

RETURN = r"""
converged:
  description: The inputs and every managed thing equal the record (C(check)).
  type: bool
  returned: always
rebuild:
  description: The trees changed in place, named in O(rebuild_marker) (C(check), C(absent)).
  type: list
  elements: str
  returned: always
drift:
  description: >-
    What differs, one line each (the inputs, a managed thing by kind and name, or why there
    is no record to trust). Empty when converged.
  type: list
  elements: str
  returned: always
"""

import contextlib  # noqa: E402
import grp  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

KINDS = ("files", "trees", "units", "packages", "users", "groups", "urls", "balancers")
# Not things on the host: the trees a role built in this run (their new content is the
# baseline), and why a host must always take the full converge (a role whose state cannot
# be read in one call, the NVIDIA driver's).
NOTES = ("rebuilt", "full_only")
DRIFTED = ".drifted"
# 2: trees leave bytecode caches out. A record of another version is not compared with.
RECORD_VERSION = 2
UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "MainPID",
    "NeedDaemonReload",
    "FragmentPath",
    "DropInPaths",
)


def _owner_mode(found: os.stat_result) -> str:
    return f"{found.st_uid}:{found.st_gid}:{stat.S_IMODE(found.st_mode):o}"


def file_state(path: str) -> str:
    """A file's content and owner; a link's target (its target is a thing of its own)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(found.st_mode):
        return "link " + os.readlink(path)
    if stat.S_ISDIR(found.st_mode):
        return "folder " + _owner_mode(found)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return f"file {_owner_mode(found)} {digest.hexdigest()}"


def tree_state(path: str, managed_files: frozenset[str] = frozenset()) -> str:
    """Every entry below a folder (a venv, a model), by its metadata: a venv holds tens of
    thousands of files and a model hundreds of GB, so their bytes are not read. A file
    rewritten keeps its path but not its size or modification time; the README says what
    this cannot see, and bytecode caches are left out. A file some role manages as a file of
    its own (the whitelist edit's source) is checked by its content there, and left out
    here: its own role rewrites it."""
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        return "missing"
    skipped = set()
    for managed in managed_files:
        # A regular file only: a folder or a link named as a file is not read by content.
        if os.path.isfile(managed) and os.path.realpath(managed).startswith(real + os.sep):
            skipped.add(os.path.split(os.path.realpath(managed)))
    digest = hashlib.sha256(real.encode())
    pending = [real]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda each: each.name):
                # Bytecode caches: Python writes them on a first import as root (a
                # preflight, a gate), so they change without anyone changing the tree.
                if entry.name == "__pycache__" or (folder, entry.name) in skipped:
                    continue
                found = entry.stat(follow_symlinks=False)
                line = f"{entry.path[len(real) :]} {_owner_mode(found)}"
                if entry.is_symlink():
                    line += " link " + os.readlink(entry.path)
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    line += " folder"
                else:
                    line += f" {found.st_size} {found.st_mtime_ns}"
                digest.update(line.encode(errors="surrogateescape") + b"\n")
    return f"{real} {digest.hexdigest()}"


def units_state(module: AnsibleModule, names: list[str]) -> dict[str, str]:
    """systemd's view of each unit, in one systemctl call for all of them."""
    if not names:
        return {}
    rc, out, err = module.run_command(
        ["systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), "--", *names]
    )
    if rc != 0:
        module.fail_json(msg=f"systemctl show failed: {err.strip()}")
    blocks = out.strip("\n").split("\n\n")
    found = {}
    for name, block in zip(names, blocks, strict=False):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        found[name] = " ".join(f"{key}={values.get(key, '')}" for key in UNIT_PROPERTIES)
    return found


def packages_state(names: list[str]) -> dict[str, str]:
    """dpkg's status and version of each package, from its database (no dpkg run)."""
    wanted = set(names)
    found = dict.fromkeys(names, "absent")
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return found
    for paragraph in text.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        name = fields.get("Package")
        if name in wanted and fields.get("Status", "").endswith(" installed"):
            # One paragraph per installed architecture (multiarch): all of them count.
            entry = f"{fields.get('Version', '')}:{fields.get('Architecture', '')}"
            found[name] = entry if found[name] == "absent" else f"{found[name]} {entry}"
    return found


def user_state(name: str) -> str:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return "absent"
    return f"{entry.pw_uid}:{entry.pw_gid}:{entry.pw_dir}:{entry.pw_shell}:{entry.pw_gecos}"


def group_state(name: str) -> str:
    try:
        entry = grp.getgrnam(name)
    except KeyError:
        return "absent"
    return f"{entry.gr_gid}:{','.join(sorted(entry.gr_mem))}"


def url_state(url: str) -> str:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return str(answer.status)
    except urllib.error.HTTPError as error:
        return str(error.code)
    except (OSError, ValueError):
        return "no answer"


def balancer_state(spec: str) -> str:
    """The servers an HAProxy admin socket has out of rotation (MAINT or DRAIN): an
    interrupted rollout leaves one there, and only a full converge puts it back."""
    path, backend = spec.split(" ", 1)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(3)
            connection.connect(path)
            connection.sendall(b"show stat\n")
            text = b"".join(iter(lambda: connection.recv(65536), b"")).decode()
    except OSError as error:
        return f"no answer ({error.strerror or error})"
    header, *rows = text.lstrip("# ").splitlines()
    columns = header.split(",")
    out = []
    for row in rows:
        values = dict(zip(columns, row.split(","), strict=False))
        name = values.get("svname", "")
        if values.get("pxname") == backend and name not in ("FRONTEND", "BACKEND", ""):
            status = values.get("status", "")
            out.append(f"{name}={'out' if status.startswith(('MAINT', 'DRAIN')) else 'in'}")
    return " ".join(sorted(out))


def host_state(module: AnsibleModule, manages: dict[str, list[str]]) -> dict[str, str]:
    """Every managed thing, keyed by kind and name."""
    state: dict[str, str] = {}
    for path in manages.get("files", []):
        state[f"files {path}"] = file_state(path)
    managed_files = frozenset(manages.get("files", []))
    for path in manages.get("trees", []):
        state[f"trees {path}"] = tree_state(path, managed_files)
    for name, value in units_state(module, manages.get("units", [])).items():
        state[f"units {name}"] = value
    for name, value in packages_state(manages.get("packages", [])).items():
        state[f"packages {name}"] = value
    for name in manages.get("users", []):
        state[f"users {name}"] = user_state(name)
    for name in manages.get("groups", []):
        state[f"groups {name}"] = group_state(name)
    for url in manages.get("urls", []):
        state[f"urls {url}"] = url_state(url)
    for spec in manages.get("balancers", []):
        state[f"balancers {spec}"] = balancer_state(spec)
    return state


def _trusted(path: str) -> str:
    """Why a record at path cannot be trusted, or '' (only this account, root under become,
    may have written it or its folder)."""
    places = (("record", path), ("record's folder", os.path.dirname(path)))
    for what, place in places:
        entry = os.lstat(place)
        if entry.st_uid != os.geteuid() or entry.st_mode & 0o022:
            return f"the {what} is not root's alone"
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return "the record is not a regular file"
    return ""


def read_record(path: str) -> tuple[dict | None, str]:
    """The record, or None and why it cannot be trusted."""
    if not os.path.lexists(path):
        return None, "no record of a full converge on this host"
    why = _trusted(path)
    if why:
        return None, why
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError) as error:
        return None, f"the record cannot be read ({error})"
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return None, "the record is of another version"
    return record, ""


def normalized(manages: dict) -> dict[str, list[str]]:
    unknown = sorted(set(manages) - set(KINDS) - set(NOTES))
    if unknown:
        raise ValueError(f"unknown kinds {unknown}; known: {list(KINDS + NOTES)}")
    return {kind: sorted({str(each) for each in manages.get(kind) or []}) for kind in KINDS + NOTES}


def write_record(path: str, record: dict) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".converged-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def set_aside(module: AnsibleModule, path: str) -> bool:
    """The record stops counting: kept beside it for its trees' baselines (record())."""
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.replace(path, path + DRIFTED)
    return True


def trees_changed_in_place(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The folders (real paths) of trees whose files changed while the tree stayed where it
    was: not a new venv or drafter behind a moved link, an edit of one that was built."""
    found = []
    for key, value in now.items():
        previous = before.get(key)
        if (
            not key.startswith("trees ")
            or previous in (None, value)
            or "missing" in (previous, value)
        ):
            continue
        if previous.split(" ")[0] == value.split(" ")[0]:
            found.append(value.split(" ")[0])
    return sorted(set(found))


def write_marker(module: AnsibleModule, marker: str, trees: list[str]) -> None:
    """Tell the roles which of their trees to build anew (ml_stack's venv, the lab's models
    read it with the rest of the host): a converge repairs a tree by building it again."""
    if trees and marker and not module.check_mode:
        write_record(marker, {"version": RECORD_VERSION, "trees": trees})


def check(module: AnsibleModule, path: str, marker: str, inputs: str, full: bool) -> dict:
    record, why = read_record(path)
    in_place: list[str] = []
    if record is None:
        drift = [why]
    else:
        manages = normalized(record.get("manages", {}))
        recorded = record.get("state", {})
        now = host_state(module, manages)
        in_place = trees_changed_in_place(recorded, now)
        drift = (
            (
                ["inputs: the project's tree or a variable changed since the last full converge"]
                if record.get("inputs") != inputs
                else []
            )
            + list(manages["full_only"])
            + [
                f"{key}: {recorded.get(key)} -> {now.get(key)}"
                for key in sorted(set(recorded) | set(now))
                if recorded.get(key) != now.get(key)
            ]
        )
    write_marker(module, marker, in_place)
    changed = (bool(drift) or full) and record is not None and set_aside(module, path)
    converged = not drift and not full
    return {"converged": converged, "drift": drift, "changed": changed, "rebuild": in_place}


def previous_record(path: str) -> dict | None:
    """The last record (in force, or set aside by a check that found a difference)."""
    for candidate in (path, path + DRIFTED):
        if os.path.lexists(candidate):
            record, _ = read_record(candidate)
            if record is not None:
                return record
    return None


def record_host(module: AnsibleModule, path: str, marker: str, inputs: str) -> None:
    try:
        manages = normalized(module.params["manages"])
    except ValueError as error:
        module.fail_json(msg=f"manages: {error}. Nothing was recorded.")
    record = {
        "version": RECORD_VERSION,
        "inputs": inputs,
        "manages": manages,
        "state": host_state(module, manages),
    }
    previous = previous_record(path)
    # A tree inside one a role built anew (the lab's drafter inside its models' folder)
    # was built with it.
    rebuilt = [os.path.realpath(each) for each in manages["rebuilt"]]
    in_place = [
        tree
        for tree in trees_changed_in_place((previous or {}).get("state", {}), record["state"])
        if not any(tree == each or tree.startswith(each + os.sep) for each in rebuilt)
    ]
    if in_place:
        write_marker(module, marker, in_place)
        module.fail_json(
            msg=(
                f"{', '.join(in_place)} changed in place since a full converge recorded "
                "them, and no role built them anew in this run (a venv or a model is built "
                "once and never edited). They are marked: the next converge builds the "
                "ones a role of site.yml builds (a stack's venv, the lab's models); a "
                "published drafter is put right by publishing it again. No record was "
                "written, so every run takes the full converge until then."
            ),
            changed_trees=in_place,
        )
    if not module.check_mode:
        write_record(path, record)
        for leftover in (path + DRIFTED, marker):
            with contextlib.suppress(FileNotFoundError):
                if leftover:
                    os.unlink(leftover)
    module.exit_json(changed=False, converged=True, drift=[], recorded=len(record["state"]))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record", "absent"], "default": "check"},
            "inputs": {"type": "str", "default": ""},
            "record": {"type": "path", "default": "/etc/specfleet/converged.json"},
            "rebuild_marker": {"type": "path", "default": ""},
            "manages": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    state, path, marker, inputs = (
        params[key] for key in ("state", "record", "rebuild_marker", "inputs")
    )
    if len(inputs) != 64:
        module.fail_json(msg="inputs must be the controller's sha256 digest (64 hex digits)")
    if state == "record":
        record_host(module, path, marker, inputs)
    module.exit_json(**check(module, path, marker, inputs, full=state == "absent"))


if __name__ == "__main__":
    main()
