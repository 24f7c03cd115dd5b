"""Role vllm_server's helper scripts, run for real on this host.

vllm-server-shm-clean runs as an unused uid (setpriv, no account needed) against the real
/dev/shm: it must remove that uid's stale segments, keep the ones a process of that uid
still has open or mapped, and never touch another user's files.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from conftest import ROOT

FILES = ROOT / "roles" / "vllm_server" / "files"
UID = 61234  # no account; nothing else runs as it

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not Path("/dev/shm").is_dir(),
    reason="needs root, setpriv and /dev/shm",
)

HOLD = r"""
import mmap, sys, time
opened = open(sys.argv[1], "w"); opened.write("x" * 4096); opened.flush()
with open(sys.argv[2], "r+b") as mapped_file:
    mapped = mmap.mmap(mapped_file.fileno(), 0)   # file closed, mapping kept
print("ready", flush=True)
time.sleep(120)
"""


def as_uid(*argv: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


@pytest.fixture
def shm_clean_for_anyone():
    """The cleaner copied where another uid can read it (the checkout may be root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="specfleet-test-"))
    folder.chmod(0o755)
    script = folder / "vllm-server-shm-clean"
    shutil.copyfile(FILES / "vllm-server-shm-clean", script)
    script.chmod(0o644)
    yield script
    shutil.rmtree(folder)


def test_shm_clean_removes_only_stale_segments_of_its_user(shm_clean_for_anyone):
    with pytest.raises(KeyError):
        pwd.getpwuid(UID)
    tag = uuid.uuid4().hex[:8]
    stale = Path(f"/dev/shm/specfleet-test-stale-{tag}")
    live = Path(f"/dev/shm/specfleet-test-live-{tag}")
    mapped = Path(f"/dev/shm/specfleet-test-mapped-{tag}")
    foreign = Path(f"/dev/shm/specfleet-test-root-{tag}")
    holder = None
    try:
        for path in (stale, mapped):
            result = as_uid(sys.executable, "-c", f"open({str(path)!r}, 'wb').write(b'x' * 4096)")
            assert result.returncode == 0, result.stderr
        foreign.write_bytes(b"root")
        holder = subprocess.Popen(
            [
                "setpriv",
                f"--reuid={UID}",
                f"--regid={UID}",
                "--clear-groups",
                sys.executable,
                "-c",
                HOLD,
                str(live),
                str(mapped),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"

        result = as_uid(sys.executable, str(shm_clean_for_anyone))
        assert result.returncode == 0, result.stderr
        assert f"removed stale {stale}" in result.stdout
        assert not stale.exists()
        assert live.exists(), "open segment removed"
        assert mapped.exists(), "mapped segment removed"
        assert foreign.exists(), "another user's file removed"

        # As root it refuses outright.
        result = subprocess.run(
            [sys.executable, str(FILES / "vllm-server-shm-clean")],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0
        assert "refusing to run as root" in result.stdout
        assert foreign.exists()

        # Once the holder is gone, its segments are stale too.
        holder.kill()
        holder.wait(timeout=30)
        result = as_uid(sys.executable, str(shm_clean_for_anyone))
        assert not live.exists() and not mapped.exists(), result.stdout
    finally:
        if holder and holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
        for path in (stale, live, mapped, foreign):
            path.unlink(missing_ok=True)
