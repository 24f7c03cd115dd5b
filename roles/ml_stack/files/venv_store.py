"""The venv store: a stack venv built once, packed, and unpacked by every other host.

Run by ml_stack on a host, with the system interpreter, against a folder every
host of the fleet mounts (shared storage, as the wheelhouse is). A venv is
only usable on a host with the same interpreter, glibc and architecture at the
same path, so an archive is named by the venv's digest and those (the key).
The store is not trusted: the controller keeps the sha256 of every archive a
host of its own published, and a host unpacks only an archive whose sha256 is
one of those, computed while it unpacks (a swapped or cut archive is thrown
away, never half used).

  venv_store.py pack VENV ARCHIVE
      VENV (all but its manifest, which each host writes after its own probe)
      into ARCHIVE, written beside it and renamed into place: {"sha256", "bytes", "seconds"}
  venv_store.py unpack ARCHIVE SHA256[,SHA256...] VENV
      ARCHIVE into VENV (which must not exist), through a folder beside it that is
      renamed into place only once every byte hashed to one of the SHA256s and every
      entry stayed inside: {"sha256", "seconds"}; exit 3 (nothing left behind) when it
      does not, exit 4 when the store has no ARCHIVE.

One run at a time on a host (ml_stack holds the host's stack lock): what a run
killed midway left of its own (a partial archive, an unpacking folder) is
removed by the next.
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 1 << 20
# Written by ml_stack into each venv once this host proved it: never shared.
MANIFEST = "specfleet-stack.json"
# Written into a venv this script unpacked: which archive it came from.
ORIGIN = "specfleet-venv-origin.json"
UNTRUSTED = 3
ABSENT = 4


def pack(venv: Path, archive: Path) -> dict:
    """GNU tar of the venv's folder (its name is the digest), hashed as it is written."""
    started = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    # Named by host: other hosts may be packing the same venv into the same store.
    partial = archive.with_name(f".{archive.name}.{socket.gethostname()}.partial")
    digest = hashlib.sha256()
    size = 0
    try:
        excluded = [f"--exclude={venv.name}/{name}" for name in (MANIFEST, ORIGIN)]
        command = ["tar", "--create", "--file=-", "--directory", str(venv.parent), *excluded]
        tar = subprocess.Popen([*command, venv.name], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        with partial.open("wb") as out:
            while block := tar.stdout.read(CHUNK):
                digest.update(block)
                out.write(block)
                size += len(block)
            out.flush()
            os.fsync(out.fileno())
        if tar.wait() != 0:
            raise SystemExit(f"tar could not pack {venv} (exit {tar.returncode})")
        os.chmod(partial, 0o644)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    return {
        "sha256": digest.hexdigest(),
        "bytes": size,
        "seconds": round(time.monotonic() - started, 1),
    }


def escapes(root: Path) -> list[str]:
    """Entries of an unpacked venv that reach outside it: a link whose target, read as
    written, leaves the venv (but the interpreter links in bin/, which a venv points at its
    base Python: python3 -> /usr/bin/python3, python -> python3), or anything that is not a
    file, a folder or a link. Each link is judged by its own text: a link to a link is
    judged where that one points."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                target = os.readlink(path)
                landing = os.path.normpath(os.path.join(folder, target))
                inside = landing.startswith(str(root) + os.sep)
                interpreter = path.parent == root / "bin" and name.startswith("python")
                if not inside and not (interpreter and os.path.isabs(target)):
                    found.append(f"{path.relative_to(root)} -> {target}")
            elif not (path.is_file() or path.is_dir()):
                found.append(str(path.relative_to(root)))
    return found


def unpack(archive: Path, trusted: set[str], venv: Path) -> dict:
    started = time.monotonic()
    if venv.exists():
        raise SystemExit(f"{venv} exists: remove it before unpacking")
    for leftover in venv.parent.glob(f".{venv.name}.*.unpacking"):
        shutil.rmtree(leftover, ignore_errors=True)
    if not archive.is_file():
        print(json.dumps({"absent": str(archive)}))
        sys.exit(ABSENT)
    staging = venv.with_name(f".{venv.name}.{os.getpid()}.unpacking")
    staging.mkdir(mode=0o700)
    try:
        digest = hashlib.sha256()
        # GNU tar refuses members with '..' or a leading '/' and defers links that
        # could be written through; the folder is this run's own until the end.
        tar = subprocess.Popen(
            ["tar", "--extract", "--file=-", "--no-same-owner", "--directory", str(staging)],
            stdin=subprocess.PIPE,
        )
        assert tar.stdin is not None
        with archive.open("rb") as source:
            while block := source.read(CHUNK):
                digest.update(block)
                tar.stdin.write(block)
        tar.stdin.close()
        tar_rc = tar.wait()
        problem = None
        if digest.hexdigest() not in trusted:
            problem = f"its sha256 {digest.hexdigest()} is not one the controller recorded"
        elif tar_rc != 0:
            problem = f"tar could not unpack it (exit {tar_rc})"
        elif sorted(os.listdir(staging)) != [venv.name]:
            problem = f"it holds {sorted(os.listdir(staging))[:5]}, not the one folder {venv.name}"
        elif outside := escapes(staging / venv.name):
            problem = f"entries reach outside the venv: {outside[:5]}"
        if problem:
            print(json.dumps({"refused": f"{archive}: {problem}"}))
            sys.exit(UNTRUSTED)
        origin = {"archive": str(archive), "sha256": digest.hexdigest()}
        (staging / venv.name / ORIGIN).write_text(json.dumps(origin) + "\n")
        os.chmod(staging / venv.name, 0o755)
        os.rename(staging / venv.name, venv)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"sha256": digest.hexdigest(), "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "pack":
        result = pack(Path(args[0]), Path(args[1]))
    elif command == "unpack":
        result = unpack(Path(args[0]), set(args[1].split(",")), Path(args[2]))
    else:
        raise SystemExit(f"unknown command {command}: pack or unpack")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
