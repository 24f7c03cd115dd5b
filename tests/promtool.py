"""Prometheus' own promtool, for the monitoring role's tests: the same binary that checks the
role's files on the monitoring host before they are put in place.

It comes from Debian's ``prometheus`` package, the one the role installs. The controller
needs no Prometheus service, so the package is not installed here: ``apt-get download``
fetches it and ``dpkg-deb`` unpacks it under
``${SPECFLEET_CACHE:-~/.cache/specfleet}/promtool/<package version>/``, kept between runs
(a new package version gets a folder of its own). A ``promtool`` already on PATH wins.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

from specfleet.controller.paths import cache_dir, cache_lock


def _candidate_version() -> str | None:
    policy = subprocess.run(
        ["apt-cache", "policy", "prometheus"], capture_output=True, text=True, check=False
    ).stdout
    for line in policy.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            return None if version == "(none)" else version
    return None


@functools.cache
def promtool() -> Path:
    """The path of promtool; fetched and unpacked on first use."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    version = _candidate_version()
    if version is None:
        # A machine whose package lists were never fetched knows no candidate yet.
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        version = _candidate_version()
    if version is None:
        raise RuntimeError("Debian's prometheus package is not known to apt here")
    folder = cache_dir("promtool", version.replace(":", "_"))
    binary = folder / "usr" / "bin" / "promtool"
    with cache_lock("promtool"):
        if not binary.is_file():
            with tempfile.TemporaryDirectory(prefix="specfleet-promtool-") as tmp:
                subprocess.run(
                    ["apt-get", "download", f"prometheus={version}"],
                    cwd=tmp,
                    check=True,
                    capture_output=True,
                )
                (package,) = Path(tmp).glob("prometheus_*.deb")
                unpacked = Path(tmp) / "root"
                subprocess.run(["dpkg-deb", "-x", str(package), str(unpacked)], check=True)
                staged = folder.with_name(folder.name + ".partial")
                shutil.rmtree(staged, ignore_errors=True)
                (staged / "usr" / "bin").mkdir(parents=True)
                shutil.copy2(unpacked / "usr" / "bin" / "promtool", staged / "usr" / "bin")
                # Renamed into place whole: a cut fetch never leaves a promtool behind.
                shutil.rmtree(folder)
                staged.rename(folder)
    return binary
