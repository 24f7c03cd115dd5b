"""The cache's build lock: while one process holds it, another cannot take it; once the
holder is gone (even killed), the next one does."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.controller.paths import cache_dir, cache_lock

HOLD = """
import time
from specfleet.controller.paths import cache_lock
with cache_lock("test-lock"):
    print("held", flush=True)
    time.sleep(60)
"""


def try_lock(path: Path) -> bool:
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def test_a_held_lock_blocks_another_until_its_holder_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock_file = cache_dir("locks") / "test-lock.lock"
        assert not try_lock(lock_file)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert try_lock(lock_file)
    with cache_lock("test-lock"):
        assert not try_lock(lock_file)
