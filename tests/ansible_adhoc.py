"""Run one module on localhost the way an operator would: `ansible localhost -m MODULE`.

The controller's own interpreter serves as the target's, so a broken system
Python (or pyenv shim) on the test machine cannot change the result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from specfleet.paths import repo_root

ANSIBLE = Path(sys.executable).with_name("ansible")


def run_adhoc(
    module: str,
    args: str,
    *,
    env: Mapping[str, str] | None = None,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`ansible localhost -c local -m MODULE -a ARGS` with the project's ansible.cfg."""
    root = repo_root()
    return subprocess.run(
        [
            str(ANSIBLE),
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            module,
            "-a",
            args,
            *options,
        ],
        cwd=root,
        env={**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
