"""Run the project's playbooks through ansible-runner."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner

from specfleet.paths import repo_root


@dataclass(frozen=True)
class PlayResult:
    playbook: str
    rc: int
    changed: dict[str, int]
    failed_hosts: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failed_hosts

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())


def run_playbook(
    playbook: str,
    *,
    inventory: Path | None = None,
    extravars: Mapping[str, Any] | None = None,
    limit: str | None = None,
    quiet: bool = False,
) -> PlayResult:
    """Run `playbooks/<playbook>` with the project's ansible.cfg."""
    root = repo_root()
    # ansible-runner starts `ansible-playbook` from PATH: make it the one
    # installed beside this interpreter (the project venv).
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_FORCE_COLOR": "1" if sys.stdout.isatty() else "0",
    }
    with tempfile.TemporaryDirectory(prefix="specfleet-runner-") as private:
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(root),
            playbook=str(root / "playbooks" / playbook),
            inventory=str(inventory or root / "inventory" / "lab" / "hosts.yml"),
            extravars=dict(extravars or {}),
            limit=limit,
            envvars=env,
            quiet=quiet,
            suppress_env_files=True,
        )
        stats = result.stats or {}
    failed = set(stats.get("failures", {})) | set(stats.get("dark", {}))
    return PlayResult(
        playbook=playbook,
        rc=result.rc,
        changed={host: int(n) for host, n in stats.get("changed", {}).items()},
        failed_hosts=tuple(sorted(failed)),
    )
