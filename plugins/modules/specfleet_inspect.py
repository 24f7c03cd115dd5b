#!/usr/bin/python
"""Ansible module specfleet_inspect: read what a role needs to decide, in one call.

Why a module: a role's re-run that changes nothing was a round trip per question (a ``stat``
per path, a ``slurp`` per file, a ``getent`` per account, an ``apt`` run to learn that the
packages are there, a ``systemctl show`` per unit, a ``stat`` or ``find`` per checksum).
Over SSH each round trip is a Python start on the host; a no-op ``site.yml`` spent most of
its time there. This module answers all of one role's questions at once, and the role then
acts only where the answer says something differs, with the same builtin modules as before.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: specfleet_inspect
short_description: Paths, small files, checksums, accounts, packages and units, read in one call
description:
  - Reads only; changes nothing.
options:
  paths:
    description:
      - Paths to look at. Links are not followed for C(islink)/C(target), and are followed
        for C(exists), C(isfile) and C(isdir) (as C(ansible.builtin.stat) with C(follow)).
    type: list
    elements: path
    default: []
  read:
    description:
      - Small text files to read (at most 1 MiB each, UTF-8); a missing one reads as null.
    type: list
    elements: path
    default: []
  users:
    description: Accounts to look up in the password database.
    type: list
    elements: str
    default: []
  groups:
    description: Groups to look up in the group database.
    type: list
    elements: str
    default: []
  packages:
    description: Debian packages whose installed state is wanted (dpkg's database).
    type: list
    elements: str
    default: []
  units:
    description: >-
      systemd units whose ActiveState, SubState, UnitFileState, NeedDaemonReload and MainPID
      are wanted.
    type: list
    elements: str
    default: []
  globs:
    description: Shell patterns whose matches are wanted (sorted, newest first).
    type: list
    elements: str
    default: []
  checksums:
    description:
      - Files whose sha1 is wanted (links followed), as C(ansible.builtin.stat) reports it; a
        missing or unreadable one has none.
    type: list
    elements: path
    default: []
  processes:
    description:
      - systemd units whose running processes are wanted (the main process and every
        descendant), when the main process started, and the folders below
        O(process_roots) their executables and mapped files come from.
      - What a server runs is its processes, not the records of what it was given; a
        process that maps files from two venvs runs code from both.
    type: list
    elements: str
    default: []
  process_roots:
    description: Folders (venvs' parent) whose children O(processes) are matched against.
    type: list
    elements: path
    default: []
  urls:
    description:
      - URLs to GET once (3 s each, no redirects), for their HTTP status, or null when
        nothing answered. A health check, read with the rest of the host.
    type: list
    elements: str
    default: []
  checksum_folders:
    description:
      - Folders whose regular files (hidden ones too, links followed, as
        C(ansible.builtin.find) with C(recurse), C(follow) and C(hidden)) are checksummed.
      - A missing folder has no files.
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Read what the server role needs to decide
  specfleet.fleet.specfleet_inspect:
    paths: [/srv/models/target/config.json, /opt/specfleet/stack/current/bin/python]
    read: [/srv/models/drafter/config.json]
    users: [specfleet]
    units: [specfleet-vllm.service]
  register: __inspected
"""

RETURN = r"""
paths:
  description: >-
    For each of I(paths): exists, isfile, isdir (links followed), islink and target (the
    link's text, null when not a link), and the path's own mode (octal text), uid and gid
    (null when it does not exist).
  type: dict
  returned: always
read:
  description: For each of I(read), its text, or null when it is missing.
  type: dict
  returned: always
users:
  description: >-
    For each of I(users), null when absent, else uid, gid, group (the primary group's name,
    or null), home, shell and comment.
  type: dict
  returned: always
groups:
  description: For each of I(groups), null when absent, else gid.
  type: dict
  returned: always
packages:
  description: For each of I(packages), true when dpkg has it installed.
  type: dict
  returned: always
units:
  description: >-
    For each of I(units), ActiveState, SubState, UnitFileState, NeedDaemonReload and
    MainPID as C(systemctl show) reports them (empty strings when systemd does not answer).
  type: dict
  returned: always
globs:
  description: For each of I(globs), its matches with their mtime, newest first.
  type: dict
  returned: always
checksums:
  description: For each of I(checksums), its sha1, or null when it is missing or unreadable.
  type: dict
  returned: always
processes:
  description: >-
    For each of I(processes), C(main_pid) (0 when none runs), C(pids) (the main process and
    its descendants), C(started) (when the main process started, seconds since the epoch,
    or null), C(from) (for each of I(process_roots), the sorted names of its children that
    any of the processes' executable or mapped files are in) and C(deleted) (for each of
    I(process_roots), how many of those files are gone from disk: a venv built anew under
    the running server).
  type: dict
  returned: always
urls:
  description: For each of I(urls), the HTTP status it answered, or null.
  type: dict
  returned: always
folder_checksums:
  description: Every regular file of I(checksum_folders) with its sha1, sorted by path.
  type: list
  elements: dict
  returned: always
"""

import contextlib  # noqa: E402
import glob  # noqa: E402
import grp  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

READ_LIMIT = 1 << 20
UNIT_PROPERTIES = ("ActiveState", "SubState", "UnitFileState", "NeedDaemonReload", "MainPID")


def _path(path: str) -> dict:
    try:
        own = os.lstat(path)
    except OSError:
        own = None
    islink = own is not None and stat.S_ISLNK(own.st_mode)
    return {
        "exists": os.path.exists(path),
        "isfile": os.path.isfile(path),
        "isdir": os.path.isdir(path),
        "islink": islink,
        "target": os.readlink(path) if islink else None,
        # The path's own (a link's, not its target's), as the modules that set them see it.
        "mode": f"{stat.S_IMODE(own.st_mode):04o}" if own else None,
        "uid": own.st_uid if own else None,
        "gid": own.st_gid if own else None,
        # When what it names (a link's target) last changed: a process started before
        # that runs what it was given before.
        "mtime": _mtime(path),
    }


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _read(module: AnsibleModule, path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            content = handle.read(READ_LIMIT + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        module.fail_json(msg=f"cannot read {path}: {error}")
    if len(content) > READ_LIMIT:
        module.fail_json(msg=f"{path} is larger than {READ_LIMIT} bytes: not a small text file")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        module.fail_json(msg=f"{path} is not UTF-8 text")


def _user(name: str) -> dict | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = None
    return {
        "uid": entry.pw_uid,
        "gid": entry.pw_gid,
        "group": group,
        "home": entry.pw_dir,
        "shell": entry.pw_shell,
        "comment": entry.pw_gecos,
    }


def _group(name: str) -> dict | None:
    try:
        return {"gid": grp.getgrnam(name).gr_gid}
    except KeyError:
        return None


def _packages(module: AnsibleModule, names: list[str]) -> dict[str, bool]:
    if not names:
        return {}
    dpkg_query = module.get_bin_path("dpkg-query", required=True)
    # Unknown names make dpkg-query exit 1 and say so on stderr; the known ones are listed.
    _, out, _ = module.run_command(
        [dpkg_query, "--show", "--showformat=${Package}\t${db:Status-Abbrev}\n", *names]
    )
    installed = set()
    for line in out.splitlines():
        name, _, status = line.partition("\t")
        if status.startswith("ii"):
            installed.add(name.split(":")[0])
    return {name: name in installed for name in names}


def _units(module: AnsibleModule, names: list[str]) -> dict[str, dict[str, str]]:
    if not names:
        return {}
    empty = dict.fromkeys(UNIT_PROPERTIES, "")
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        return {name: dict(empty) for name in names}
    rc, out, _ = module.run_command(
        [systemctl, "show", "--property=" + ",".join(UNIT_PROPERTIES), *names]
    )
    if rc != 0:
        # No systemd to ask (a host being built, a container without it): unknown, and the
        # task that acts on the unit then says what systemd says.
        return {name: dict(empty) for name in names}
    # One block per unit, in order, separated by a blank line.
    blocks = out.strip("\n").split("\n\n") if out.strip() else []
    found = {}
    for name, block in zip(names, blocks, strict=False):
        values = dict(empty)
        for line in block.splitlines():
            key, _, value = line.partition("=")
            if key in values:
                values[key] = value
        found[name] = values
    return {name: found.get(name, dict(empty)) for name in names}


def _boot_time() -> float:
    with open("/proc/stat") as handle:
        for line in handle:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return text[text.rindex(")") + 2 :].split()


def _descendants(main_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(name))
    found, pending = [], [main_pid]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return sorted(found)


DELETED = " (deleted)"


def _files_of(pid: int) -> set[str]:
    """The executable and mapped files of a process; a file gone from disk keeps the
    kernel's " (deleted)" mark."""
    files = set()
    # The executable may not be readable as a link (a container's /proc): the maps say it too.
    with contextlib.suppress(OSError):
        files.add(os.readlink(f"/proc/{pid}/exe"))
    try:
        with open(f"/proc/{pid}/maps") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    files.add(parts[5].rstrip("\n"))
    except OSError:
        pass
    return files


def _processes(module: AnsibleModule, units: list[str], roots: list[str]) -> dict[str, dict]:
    found = {}
    states = _units(module, units)
    for unit in units:
        main_pid = int(states[unit].get("MainPID") or 0)
        entry: dict = {"main_pid": main_pid, "pids": [], "started": None, "from": {}}
        entry["deleted"] = dict.fromkeys(roots, 0)
        fields = _stat_fields(main_pid) if main_pid else None
        if fields:
            ticks = os.sysconf("SC_CLK_TCK")
            entry["started"] = _boot_time() + int(fields[19]) / ticks
            entry["pids"] = _descendants(main_pid)
            mapped = set().union(*(_files_of(pid) for pid in entry["pids"]))
            files = {path.removesuffix(DELETED) for path in mapped}
            for root in roots:
                prefix = root.rstrip("/") + "/"
                entry["from"][root] = sorted(
                    {
                        path[len(prefix) :].split("/", 1)[0]
                        for path in files
                        if path.startswith(prefix)
                    }
                )
                entry["deleted"][root] = sum(
                    1 for path in mapped if path.startswith(prefix) and path.endswith(DELETED)
                )
        else:
            entry["from"] = {root: [] for root in roots}
        found[unit] = entry
    return found


def _url_status(url: str) -> int | None:
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return None


def _glob(pattern: str) -> list[dict]:
    matches = []
    for path in glob.glob(pattern):
        try:
            matches.append({"path": path, "mtime": os.stat(path).st_mtime})
        except OSError:
            continue
    return sorted(matches, key=lambda match: match["mtime"], reverse=True)


def _sha1(path: str) -> str | None:
    # stat's and find's checksum (a change detector, not a security boundary).
    digest = hashlib.sha1()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _folder_files(folder: str) -> list[str]:
    found = []
    for parent, _, names in os.walk(folder, followlinks=True):
        found.extend(
            path for path in (os.path.join(parent, name) for name in names) if os.path.isfile(path)
        )
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "read": {"type": "list", "elements": "path", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "groups": {"type": "list", "elements": "str", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "globs": {"type": "list", "elements": "str", "default": []},
            "checksums": {"type": "list", "elements": "path", "default": []},
            "checksum_folders": {"type": "list", "elements": "path", "default": []},
            "processes": {"type": "list", "elements": "str", "default": []},
            "process_roots": {"type": "list", "elements": "path", "default": []},
            "urls": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    named = (
        params["paths"]
        + params["read"]
        + params["checksums"]
        + params["checksum_folders"]
        + params["process_roots"]
    )
    relative = [p for p in named if not os.path.isabs(p)]
    if relative:
        module.fail_json(msg=f"paths must be absolute: {', '.join(relative)}")
    module.exit_json(
        changed=False,
        paths={path: _path(path) for path in params["paths"]},
        read={path: _read(module, path) for path in params["read"]},
        users={name: _user(name) for name in params["users"]},
        groups={name: _group(name) for name in params["groups"]},
        packages=_packages(module, params["packages"]),
        units=_units(module, params["units"]),
        globs={pattern: _glob(pattern) for pattern in params["globs"]},
        checksums={path: _sha1(path) for path in params["checksums"]},
        processes=_processes(module, params["processes"], params["process_roots"]),
        urls={url: _url_status(url) for url in params["urls"]},
        folder_checksums=[
            {"path": path, "checksum": _sha1(path)}
            for path in sorted(
                path for folder in params["checksum_folders"] for path in _folder_files(folder)
            )
        ],
    )


if __name__ == "__main__":
    main()
