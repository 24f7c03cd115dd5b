"""Download every wheel of a stack lock on the controller, for offline hosts.

Hosts install with `pip install --no-index --no-deps --require-hashes`, so they
need no network and get exactly the locked set, byte for byte. Every
downloaded file is checked against the lock's sha256 before the wheelhouse is
published: a mismatch (a re-uploaded file, a tampered mirror or cache) fails
with the file, its hash and the lock's. The wheelhouse lives in the cache under
the lock's digest and is published atomically: a folder that exists is
complete and verified. Its requirements.txt is the lock's pins with hashes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specfleet.hashing import sha256_file
from specfleet.paths import cache_dir
from specfleet.stacklock import StackLock, StackSpec


class WheelhouseError(RuntimeError):
    """The lock cannot be turned into a trustworthy wheelhouse."""


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    wheels: int
    size_bytes: int
    seconds: float
    reused: bool


def wheelhouse_path(lock: StackLock) -> Path:
    return cache_dir("wheelhouse") / f"{lock.name}-{lock.digest}"


def _measure(path: Path, seconds: float, reused: bool) -> Wheelhouse:
    wheels = list(path.glob("*.whl"))
    return Wheelhouse(
        path=path,
        wheels=len(wheels),
        size_bytes=sum(w.stat().st_size for w in wheels),
        seconds=seconds,
        reused=reused,
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


def verify_against_lock(folder: Path, lock: StackLock) -> None:
    """Every pin has exactly one file in folder, whose sha256 is one the lock records."""
    files: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(folder.iterdir()):
        key = _artifact_pin(path.name)
        if key is not None:
            files.setdefault(key, []).append(path)
    problems = []
    for pin in lock.pins:
        name, _, version = pin.partition("==")
        found = files.get((_normalise(name), version), [])
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
    missing = lock.missing_hashes()
    if missing:
        raise WheelhouseError(
            f"no sha256 for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} in "
            f"lock {lock.name}: re-resolve it with `specfleet lock {lock.name}`"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
        staging = Path(tmp) / "wheels"
        pins = Path(tmp) / "pins.txt"
        pins.write_text("\n".join(lock.pins) + "\n")
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
    return _measure(target, time.monotonic() - started, reused=False)


def sha256_prefixed(path: Path) -> str:
    """A wheel's hash as locks write it ("sha256:<hex>")."""
    return f"sha256:{sha256_file(path)}"
