# Copyright: specfleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""File safety for an edit that must leave nothing half done: pure standard-library helpers.

The whitelist module (plugins/modules/vllm_eagle3_whitelist.py) proves every step of its
write possible before it writes, and undoes the write after a failure. These helpers answer
the questions that takes, without Ansible: the inode flags of a path (chattr's immutable and
append-only, which stop root too: inode_flags and the FS_* constants), why entries of a
folder cannot be created or removed (folder_problem), why a file cannot be deleted
(deletion_problem), every cached bytecode file of a source under every pycache prefix
(cache_files) and the invalidation mode each was written in (pyc_modes), and putting a
file's original bytes back atomically, its owner, mode and extended attributes kept
(put_back).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
import re
import shutil
import stat
import struct
import sys
import tempfile
from typing import Any

PYC_MODES = {0: "TIMESTAMP", 1: "UNCHECKED_HASH", 3: "CHECKED_HASH"}

# Linux inode flags (chattr): an immutable or append-only file or folder refuses deletion,
# root included. FS_IOC_GETFLAGS is _IOR('f', 1, long) in the generic ioctl encoding, which
# these machines use (others are not asked: the rollback still covers them).
FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20
GENERIC_IOCTL = ("x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "riscv64", "s390x")


def cache_files(source: str, prefixes: list[str | None]) -> list[str]:
    """Every bytecode file that may cache source, whatever interpreter wrote it, beside it
    and under each pycache prefix."""
    folder, name = os.path.split(source)
    stem = name[:-3] if name.endswith(".py") else name
    pattern = re.compile(r"^" + re.escape(stem) + r"\.[A-Za-z0-9_\-]+(\.opt-[12])?\.pyc$")
    places = [os.path.join(folder, "__pycache__")]
    for prefix in prefixes:
        place = os.path.join(prefix, folder.lstrip(os.sep)) if prefix else None
        if place and place not in places:
            places.append(place)
    found = []
    for place in places:
        try:
            names = sorted(os.listdir(place))
        except OSError:
            continue
        found += [os.path.join(place, n) for n in names if pattern.match(n)]
    for legacy in (stem + ".pyc", stem + ".pyo"):
        path = os.path.join(folder, legacy)
        if os.path.isfile(path):
            found.append(path)
    return found


def inode_flags(path: str) -> int:
    """The chattr flags of path (not followed when a link); 0 when unknown."""
    if not sys.platform.startswith("linux") or platform.machine().lower() not in GENERIC_IOCTL:
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        answer = fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(8))
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int.from_bytes(answer[:4], sys.byteorder)  # the kernel writes an int


def flag_problem(path: str, what: str) -> str | None:
    flags = inode_flags(path)
    for flag, name in ((FS_IMMUTABLE_FL, "immutable"), (FS_APPEND_FL, "append-only")):
        if flags & flag:
            return f"{os.strerror(errno.EPERM)} ({what} {path} is {name})"
    return None


def folder_problem(folder: str) -> str | None:
    """Why entries of folder cannot be created, replaced or deleted (None: they can)."""
    problem = flag_problem(folder, "the folder")
    effective = os.access in os.supports_effective_ids
    if problem is None and not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
        problem = f"{os.strerror(errno.EACCES)} (the folder {folder} is not writable)"
    return problem


def deletion_problem(path: str) -> str | None:
    """Why path cannot be deleted (None: it can, as far as can be told without deleting)."""
    if not os.path.lexists(path):
        return None
    if os.path.isdir(path) and not os.path.islink(path):
        return f"{os.strerror(errno.EISDIR)} ({path} is a folder)"
    folder = os.path.dirname(path)
    problem = folder_problem(folder) or flag_problem(path, "the file")
    if problem is None and os.geteuid() != 0:
        held = os.stat(folder)
        owner = os.lstat(path).st_uid
        if held.st_mode & stat.S_ISVTX and os.geteuid() not in (held.st_uid, owner):
            problem = f"{os.strerror(errno.EPERM)} (sticky folder {folder}, another user's file)"
    return problem


def put_back(path: str, data: bytes) -> None:
    """Replace path's content with data atomically, keeping the current file's owner, mode
    and extended attributes (an SELinux label among them)."""
    real = os.path.realpath(path)
    current = os.stat(real)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".specfleet-restore-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        shutil.copystat(real, tmp)
        with contextlib.suppress(PermissionError):
            os.chown(tmp, current.st_uid, current.st_gid)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pyc_modes(files: list[str], cache_tag: str) -> list[dict[str, Any]]:
    """Invalidation mode and optimisation level of each cache file of the target's tag."""
    items: dict[int, str] = {}
    fallback: str | None = None
    for path in files:
        name = os.path.basename(path)
        try:
            with open(path, "rb") as handle:
                flags = int.from_bytes(handle.read(8)[4:8], "little")
        except OSError:
            continue
        mode = PYC_MODES.get(flags)
        if mode is None:
            continue
        fallback = fallback or mode
        match = re.search(r"\." + re.escape(cache_tag) + r"(\.opt-([12]))?\.pyc$", name)
        if match:
            items[int(match.group(2) or 0)] = mode
    if not items:
        items[0] = fallback or "TIMESTAMP"
    return [{"optimize": level, "mode": mode} for level, mode in sorted(items.items())]
