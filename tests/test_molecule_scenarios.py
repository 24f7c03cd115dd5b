"""Every Molecule scenario, run for real on systemd containers.

Each scenario's sequence (shared base config) is destroy, create, prepare,
converge, idempotence, verify, destroy: a role that changes anything on its
second converge fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.controller.image import ensure_image
from specfleet.controller.paths import cache_dir, repo_root
from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.wheelhouse import ensure_wheelhouse

ROOT = repo_root()
# Every scenario in every run. The fleet's upgrades are not a scenario: they run on the tests'
# shared lab, on request (tests/test_fleet_upgrade.py, tests/test_fleet_faults.py).
# bin/test runs the scenarios beside the tests without a lab (pytest --stream=rest). A scenario
# keeps about one core busy, but the drafter's training wants both: it runs last, when those
# tests are done (beside them it took 1,256 s instead of about 850, on a cold run).
BOTH_CORES = {"drafter_training"}
SCENARIOS = sorted(
    (p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")),
    key=lambda name: (name in BOTH_CORES, name),
)


@pytest.fixture(scope="session")
def base_image() -> str:
    return ensure_image()


@pytest.fixture(scope="session")
def wheelhouse_root() -> Path:
    """The cpu stacks' and the models' wheelhouses: scenarios install offline from them
    (the project's locks, and the locks a scenario keeps for itself in molecule/*/locks)."""
    for folder in [ROOT / "locks", *sorted((ROOT / "molecule").glob("*/locks"))]:
        for lock_file in sorted(folder.glob("*.toml")):
            spec = StackSpec.load(lock_file.stem, folder)
            if spec.profile in ("cpu", "model"):
                ensure_wheelhouse(spec, StackLock.read(spec.name, folder))
    return cache_dir("wheelhouse")


@pytest.mark.docker
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(
    scenario: str, base_image: str, wheelhouse_root: Path, capsys: pytest.CaptureFixture[str]
):
    log_dir = ROOT / ".cache" / "molecule-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{scenario}.log"
    env = dict(
        os.environ,
        SPECFLEET_IMAGE=base_image,
        SPECFLEET_WHEELHOUSE_ROOT=str(wheelhouse_root),
        # Each lock's venv is built by the first scenario host that needs it, and unpacked
        # by the others (ml_stack_venv_store; the ml_stack scenario builds its own).
        SPECFLEET_VENV_STORE=str(cache_dir("venv-store")),
        PY_COLORS="0",
        ANSIBLE_FORCE_COLOR="0",
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    with log.open("w") as out:
        result = subprocess.run(
            ["molecule", "test", "-s", scenario],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    text = log.read_text()
    recap = text[text.rfind("DETAILS") :] if "DETAILS" in text else text[-3000:]
    with capsys.disabled():
        print(f"\n--- molecule {scenario} (full log: {log})\n{recap.strip()}")
    assert result.returncode == 0, f"molecule {scenario} failed; last lines:\n{text[-6000:]}"
