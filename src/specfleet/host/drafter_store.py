"""Drafters between the training host and the fleet: collected, hashed and checked by root
without trusting the account that trained them.

The training job runs as its own unprivileged account and writes its exported drafter into
its own folder. Publication must not follow a link that account planted, must not take its
word for the drafter's digest, and must not serve a checkpoint that asks vLLM to import
Python from the drafter folder. So, as root:

* ``collect``: open the exported drafter beneath a root-owned anchor one path component at a
  time without following links (``O_NOFOLLOW`` on every component below the anchor), copy
  exactly the drafter's files (regular files only) into a root-owned folder, hash the bytes
  as they are copied, check ``config.json``, and name the result by the digest computed here.
  A digest the trainer claims must equal it. A drafter over the publication bound
  (``--max-bytes``) is refused from its files' sizes before a byte is copied; ``--keep N``
  removes the copies earlier runs collected beyond the newest N.
* ``prune``: the same pruning of any folder of drafters (the controller's cache, a serving
  host's store), keeping what ``--protect`` names.
* ``verify``: on a serving host, re-hash a stored drafter (regular, root-owned files, no
  links) and compare with the digest it was published under, before ``current`` moves.

``python -m specfleet.host.drafter_store collect --anchor A --path P --into D [--expect DIGEST]``
and ``... verify --dir D --digest DIGEST`` print JSON; exit 0, or 1 with the problems.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specfleet.host.hashing import sha256_file

#: The files of a deployable drafter (a checkpoint's optimizer state stays behind).
DRAFTER_FILES = ("config.json", "model.safetensors")
DIGEST = re.compile(r"^[0-9a-f]{64}$")
#: config.json keys that make transformers (and so vLLM) import Python shipped with the
#: checkpoint: a drafter is data, never code.
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code", "custom_pipelines")
EAGLE3_ARCHITECTURE = re.compile(r"^Eagle3|Eagle3$")
CHUNK = 1 << 20


class StoreError(Exception):
    """The drafter cannot be published; the message says why."""


def digest_of_files(hashes: dict[str, str]) -> str:
    """A drafter's identity: sha256 over each file's name and sha256, in name order."""
    digest = hashlib.sha256()
    for name in sorted(hashes):
        digest.update(name.encode() + b"\0" + hashes[name].encode() + b"\n")
    return digest.hexdigest()


def config_problems(config: Any) -> list[str]:
    """Why a drafter's config.json must not be served (empty: it may)."""
    if not isinstance(config, dict):
        return ["config.json is not a JSON object"]
    problems = [
        f"config.json sets {key}: a drafter that asks vLLM to import its own Python is refused"
        for key in REMOTE_CODE_KEYS
        if key in config
    ]
    for section in ("transformer_layer_config", "speculators_config", "text_config"):
        if isinstance(config.get(section), dict) and "auto_map" in config[section]:
            problems.append(f"config.json sets {section}.auto_map: refused (remote code)")
    architectures = config.get("architectures") or []
    eagle3 = any(EAGLE3_ARCHITECTURE.search(str(name)) for name in architectures)
    if not eagle3 and config.get("speculators_model_type") != "eagle3":
        problems.append(f"config.json is not an EAGLE-3 drafter (architectures {architectures})")
    return problems


@contextmanager
def open_beneath(anchor: Path, relative: str) -> Iterator[int]:
    """A directory fd for anchor/relative, refusing a link or non-directory in any component
    below the anchor (the anchor itself is root's and trusted)."""
    parts = [part for part in Path(relative).parts if part not in ("", ".")]
    if Path(relative).is_absolute() or ".." in parts:
        raise StoreError(f"{relative!r} must be a relative path below {anchor} without '..'")
    fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                raise StoreError(
                    f"{anchor}/{relative}: {part} is a link or not a folder ({error.strerror})"
                ) from error
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_regular(dir_fd: int, name: str) -> tuple[int, int]:
    """Open one regular file (no link) beneath dir_fd; its fd and its size."""
    try:
        source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as error:
        raise StoreError(
            f"{name}: cannot open without following links ({error.strerror})"
        ) from error
    info = os.fstat(source)
    if not stat.S_ISREG(info.st_mode):
        os.close(source)
        raise StoreError(f"{name} is not a regular file")
    return source, info.st_size


def _copy_open(source: int, name: str, size: int, target: Path) -> str:
    """Copy an open file into target, streaming, never more than the size it had when it was
    measured (the training account may still be writing it); return its sha256."""
    digest = hashlib.sha256()
    copied = 0
    with open(target, "xb") as out:
        while block := os.read(source, CHUNK):
            copied += len(block)
            if copied > size:
                raise StoreError(f"{name} grew while it was copied: refused")
            digest.update(block)
            out.write(block)
    os.chmod(target, 0o644)
    return digest.hexdigest()


def prune(into: Path, keep: int, protect: list[str]) -> list[str]:
    """Remove the drafters of ``into`` (folders named by a digest) beyond ``keep`` in all:
    the ``protect``ed ones (digests or paths: what is served, what was served before, the
    one just collected) always stay and count first, then the newest others. What later
    runs superseded goes; the names removed."""
    kept = {Path(name).name for name in protect if name}
    others = sorted(
        (entry for entry in into.iterdir() if DIGEST.match(entry.name) and entry.name not in kept),
        key=lambda entry: entry.lstat().st_mtime,
        reverse=True,
    )
    removed = others[max(keep - len(kept), 0) :]
    for entry in removed:
        shutil.rmtree(entry)
    return sorted(entry.name for entry in removed)


def collect(
    anchor: Path,
    relative: str,
    into: Path,
    expect: str | None = None,
    max_bytes: int | None = None,
    keep: int | None = None,
) -> dict[str, Any]:
    """Copy the drafter at anchor/relative into ``into/<digest>`` (root-owned); return it.

    ``max_bytes`` bounds what may be published: the files' sizes are read first, and a
    drafter over the bound is refused before a byte is copied (a file the training account
    planted, sparse or not, costs nothing). ``keep`` prunes the drafters collected earlier
    to that many, this one included."""
    if expect is not None and not DIGEST.match(expect):
        raise StoreError(f"the claimed digest {expect!r} is not 64 hexadecimal characters")
    into.mkdir(parents=True, exist_ok=True)
    # Readable by the connection's own account: the controller fetches the copy without
    # privilege escalation, which streams it (under become, Ansible reads a file whole).
    into.chmod(0o755)
    staging = into / ".collecting"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    try:
        with open_beneath(anchor, relative) as dir_fd:
            opened: dict[str, tuple[int, int]] = {}
            try:
                for name in DRAFTER_FILES:
                    opened[name] = _open_regular(dir_fd, name)
                sizes = {name: size for name, (_, size) in opened.items()}
                total = sum(sizes.values())
                if max_bytes is not None and total > max_bytes:
                    listed = ", ".join(f"{name} {size}" for name, size in sizes.items())
                    raise StoreError(
                        f"the drafter is {total} bytes ({listed}), over the publication bound "
                        f"of {max_bytes} (drafter_training_max_publish_bytes): nothing copied"
                    )
                hashes = {
                    name: _copy_open(fd, name, size, staging / name)
                    for name, (fd, size) in opened.items()
                }
            finally:
                for fd, _ in opened.values():
                    os.close(fd)
        problems = config_problems(_read_json(staging / "config.json"))
        if problems:
            raise StoreError("; ".join(problems))
        digest = digest_of_files(hashes)
        if expect is not None and expect != digest:
            raise StoreError(
                f"the bytes hash to {digest}, not to the claimed {expect}: the run's record "
                "does not describe this drafter"
            )
        final = into / digest
        if final.exists():
            shutil.rmtree(staging)
            os.utime(final)
        else:
            staging.chmod(0o755)
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    pruned = prune(into, keep, [digest]) if keep is not None else []
    return {"digest": digest, "dir": str(final), "files": hashes, "bytes": total, "pruned": pruned}


def verify(folder: Path, digest: str) -> dict[str, Any]:
    """Re-hash a stored drafter; it must be exactly the drafter files, regular, root's."""
    if not DIGEST.match(digest):
        raise StoreError(f"{digest!r} is not 64 hexadecimal characters")
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise StoreError(f"{folder} is not a root-owned folder")
    names = sorted(os.listdir(folder))
    if names != sorted(DRAFTER_FILES):
        raise StoreError(f"{folder} holds {names}, expected {sorted(DRAFTER_FILES)}")
    hashes = {}
    for name in names:
        path = folder / name
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0:
            raise StoreError(f"{path} is not a regular root-owned file")
        hashes[name] = sha256_file(path)
    problems = config_problems(_read_json(folder / "config.json"))
    if problems:
        raise StoreError("; ".join(problems))
    actual = digest_of_files(hashes)
    if actual != digest:
        raise StoreError(f"{folder} hashes to {actual}, not {digest}")
    return {"digest": digest, "dir": str(folder), "files": hashes}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"{path.name} is not readable JSON: {error}") from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specfleet.host.drafter_store", description=__doc__
    )
    commands = parser.add_subparsers(dest="command", required=True)
    collect_cmd = commands.add_parser("collect")
    collect_cmd.add_argument("--anchor", type=Path, required=True)
    collect_cmd.add_argument("--path", required=True)
    collect_cmd.add_argument("--into", type=Path, required=True)
    collect_cmd.add_argument("--expect")
    collect_cmd.add_argument("--max-bytes", type=int)
    collect_cmd.add_argument("--keep", type=int)
    prune_cmd = commands.add_parser("prune")
    prune_cmd.add_argument("--into", type=Path, required=True)
    prune_cmd.add_argument("--keep", type=int, required=True)
    prune_cmd.add_argument("--protect", action="append", default=[])
    verify_cmd = commands.add_parser("verify")
    verify_cmd.add_argument("--dir", type=Path, required=True)
    verify_cmd.add_argument("--digest", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "collect":
            result = collect(
                args.anchor, args.path, args.into, args.expect, args.max_bytes, args.keep
            )
        elif args.command == "prune":
            result = {"pruned": prune(args.into, args.keep, args.protect)}
        else:
            result = verify(args.dir, args.digest)
    except (StoreError, OSError) as error:
        print(json.dumps({"ok": False, "problem": str(error)}))
        return 1
    print(json.dumps({"ok": True, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
