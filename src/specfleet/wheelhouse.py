"""Download every wheel of a stack lock on the controller, for offline hosts.

Hosts install with `pip install --no-index --no-deps`, so they need no network
and get exactly the locked set. The wheelhouse lives in the cache under the
lock's digest and is published atomically: a folder that exists is complete.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specfleet.paths import cache_dir
from specfleet.stacklock import StackLock, StackSpec


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


def ensure_wheelhouse(spec: StackSpec, lock: StackLock) -> Wheelhouse:
    """Return the wheelhouse of `lock`, downloading it only when absent."""
    target = wheelhouse_path(lock)
    if target.is_dir():
        return _measure(target, 0.0, reused=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
        staging = Path(tmp) / "wheels"
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("\n".join(lock.pins) + "\n")
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                *spec.pip_target_args(), "--dest", str(staging), "--requirement", str(requirements),
            ],
            check=True,
        )  # fmt: skip
        shutil.copy(requirements, staging / "requirements.txt")
        staging.rename(target)
    return _measure(target, time.monotonic() - started, reused=False)
