"""Download every wheel of a stack lock on the controller, for offline hosts.

Hosts install with `pip install --no-index --no-deps --require-hashes`, so they
need no network and get exactly the locked set, byte for byte. Every
downloaded file is checked against the lock's sha256 before the wheelhouse is
published: a mismatch (a re-uploaded file, a tampered mirror or cache) fails
with the file, its hash and the lock's. The wheelhouse lives in the cache under
the lock's digest and is published atomically: a folder that exists is
complete and verified. Its requirements.txt is the lock's pins with hashes.

Locks share most of their wheels (two vLLM releases share torch, triton and
a hundred more): a wheel another published wheelhouse already holds, with a
hash this lock accepts, is hard-linked instead of downloaded again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specfleet.controller.paths import cache_dir, cache_lock
from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.host.hashing import sha256_file


class WheelhouseError(RuntimeError):
    """The lock cannot be turned into a trustworthy wheelhouse."""


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    wheels: int
    size_bytes: int
    seconds: float
    reused: bool
    # Wheels taken by content from other wheelhouses instead of downloaded.
    linked: int = 0


def wheelhouse_path(lock: StackLock) -> Path:
    return cache_dir("wheelhouse") / f"{lock.name}-{lock.digest}"


def _measure(path: Path, seconds: float, reused: bool, linked: int = 0) -> Wheelhouse:
    wheels = list(path.glob("*.whl"))
    return Wheelhouse(
        path=path,
        wheels=len(wheels),
        size_bytes=sum(w.stat().st_size for w in wheels),
        seconds=seconds,
        reused=reused,
        linked=linked,
    )


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _artifact_pin(filename: str) -> tuple[str, str] | None:
    """(normalised name, version) of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        name, version = filename.split("-")[:2]
    elif filename.endswith(".tar.gz"):
        name, _, version = filename.removesuffix(".tar.gz").rpartition("-")
    else:
        return None
    return _normalise(name), version


def _pin_key(pin: str) -> tuple[str, str]:
    """(normalised name, version) of a "name==version" pin, as _artifact_pin gives a file's."""
    name, _, version = pin.partition("==")
    return _normalise(name), version


def _link_from_other_wheelhouses(staging: Path, lock: StackLock, own: Path) -> set[str]:
    """Hard-link into staging every pin's file that a published wheelhouse other
    than `own` holds with a hash the lock accepts; return the pins so found.

    Published wheelhouses (no leading dot) were verified when published; each
    file is hashed again here all the same, so a file changed in the cache since
    is downloaded afresh instead of trusted."""
    wanted = {_pin_key(pin): pin for pin in lock.pins}
    found: set[str] = set()
    for house in sorted(own.parent.iterdir()):
        if house == own or house.name.startswith(".") or not house.is_dir():
            continue
        for path in sorted(house.iterdir()):
            pin = wanted.get(_artifact_pin(path.name) or ("", ""))
            if pin is None or pin in found:
                continue
            if sha256_prefixed(path) not in lock.hashes.get(pin, ()):
                continue
            try:
                os.link(path, staging / path.name)
            except OSError:  # another file system: copy instead
                shutil.copy2(path, staging / path.name)
            found.add(pin)
    return found


def verify_against_lock(folder: Path, lock: StackLock) -> None:
    """Every pin has exactly one file in folder, whose sha256 is one the lock records."""
    files: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(folder.iterdir()):
        key = _artifact_pin(path.name)
        if key is not None:
            files.setdefault(key, []).append(path)
    problems = []
    for pin in lock.pins:
        found = files.get(_pin_key(pin), [])
        if len(found) != 1:
            problems.append(f"{pin}: expected one file, found {[p.name for p in found]}")
            continue
        actual = sha256_prefixed(found[0])
        expected = lock.hashes.get(pin, ())
        if actual not in expected:
            problems.append(
                f"{found[0].name}: {actual}, but the lock says {' or '.join(expected)} ({pin})"
            )
    if problems:
        raise WheelhouseError(
            f"the downloaded files do not match lock {lock.name}; nothing was published:\n  "
            + "\n  ".join(problems)
        )


def ensure_wheelhouse(spec: StackSpec, lock: StackLock) -> Wheelhouse:
    """Return the wheelhouse of `lock`, downloading and verifying it only when absent."""
    target = wheelhouse_path(lock)
    if target.is_dir():
        return _measure(target, 0.0, reused=True)
    # One download of a lock at a time: a second caller waits and finds it published.
    with cache_lock(f"wheelhouse-{target.name}"):
        if target.is_dir():
            return _measure(target, 0.0, reused=True)
        return _download(spec, lock, target)


def _download(spec: StackSpec, lock: StackLock, target: Path) -> Wheelhouse:
    missing = lock.missing_hashes()
    if missing:
        raise WheelhouseError(
            f"no sha256 for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} in "
            f"lock {lock.name}: re-resolve it with `specfleet lock {lock.name}`"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
        staging = Path(tmp) / "wheels"
        staging.mkdir()
        linked = _link_from_other_wheelhouses(staging, lock, target)
        to_download = [pin for pin in lock.pins if pin not in linked]
        if to_download:
            pins = Path(tmp) / "pins.txt"
            pins.write_text("\n".join(to_download) + "\n")
            # pip checks nothing here; verify_against_lock does, and says what differs.
            subprocess.run(
                [
                    sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    *spec.pip_target_args(), "--dest", str(staging), "--requirement", str(pins),
                ],
                check=True,
            )  # fmt: skip
        verify_against_lock(staging, lock)
        (staging / "requirements.txt").write_text("\n".join(lock.requirement_lines()) + "\n")
        staging.rename(target)
    return _measure(target, time.monotonic() - started, reused=False, linked=len(linked))


def sha256_prefixed(path: Path) -> str:
    """A wheel's hash as locks write it ("sha256:<hex>")."""
    return f"sha256:{sha256_file(path)}"
