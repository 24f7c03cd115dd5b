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
# Scenarios that run only when asked (SPECFLEET_SCENARIOS_ALSO=fleet), each with the reason.
# fleet: three vLLM servers, constant load and seven venv builds on two cores took 1,609 s
# alone, and the rollout's faults that come with it 1,229 s (the README's "Where the time
# goes"); CI without them took 2,325 s at its last landing (3,986 s at the one after, with
# the lab's servers unbound: see benchmarks/thread_binding.py). Two pytest streams side by
# side did not bring all of it within 60 minutes (the README's "What has been tried"); the
# fleet is two servers now, each on a core of its own, and has to cost less still.
# Its load once failed every request: vLLM 0.31's CPU sampler needed a C++ compiler the
# hosts lacked, and upgrade.yml pointed HAProxy at loopback; both are fixed, and the gate
# and the balancer's checks now catch each.
OPT_IN = {"fleet": "about 27 minutes on two cores, beyond CI's budget (see the comment above)"}
_ASKED = set(os.environ.get("SPECFLEET_SCENARIOS_ALSO", "").split(","))
SCENARIOS = [
    pytest.param(
        name,
        marks=[pytest.mark.skip(reason=f"opt-in (SPECFLEET_SCENARIOS_ALSO={name}): {OPT_IN[name]}")]
        if name in OPT_IN and name not in _ASKED
        else [],
    )
    for name in sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
]


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
