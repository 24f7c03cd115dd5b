"""Drafters the served vLLM would not speculate with, each refused by a publication
(`playbooks/publish_drafter.yml -e specfleet_publish_drafter=DIR`) on a running lab, while
requests flow through its front door:

- aux layer ids beyond the target's layers (a drafter made for a deeper model);
- a hidden size that is not the target's;
- a drafter whose training record names another target.

Each is made from the drafter the lab serves, with one thing changed in its config.json.
The EAGLE-3 preflight refuses each on the first host with the mismatch named, before
anything served changes: `current` does not move, no server restarts (the same MainPID),
the refused copy is gone from the host's store, the preflight's record is unchanged, and no
request through the balancer fails.

It uses the lab of tests/test_cli_lab.py, or ``SPECFLEET_TEST_LAB=inventory/lab/hosts.yml``
for a lab already up (``bin/lab up``), which it leaves as it found it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from doorclient import Door, Load
from labs import LabUnderTest

from specfleet.controller.paths import repo_root
from specfleet.host.drafter_store import DRAFTER_FILES, digest_of_files
from specfleet.host.hashing import sha256_file

pytestmark = pytest.mark.docker

STORE = "/var/lib/specfleet/drafters"
UNIT = "specfleet-vllm.service"
PREFLIGHT_RECORD = "/etc/specfleet/eagle3-preflight.json"


def served_drafter(lab: LabUnderTest, host: str, into: Path) -> Path:
    """A copy of the drafter ``host`` serves (its store's `current`), on the controller."""
    folder = lab.exec(host, ["readlink", "-f", f"{STORE}/current"]).strip()
    into.mkdir()
    for name in DRAFTER_FILES:
        subprocess.run(["docker", "cp", f"{host}:{folder}/{name}", str(into / name)], check=True)
    return into


def target_config(lab: LabUnderTest, host: str) -> dict[str, Any]:
    model = str(lab.variables["specfleet_model"])
    config: dict[str, Any] = json.loads(lab.exec(host, ["cat", f"{model}/config.json"]))
    return config


def variant(base: Path, into: Path, change: dict[str, Any]) -> Path:
    """The drafter at ``base`` with ``change`` merged into its config.json."""
    shutil.copytree(base, into)
    config = json.loads((into / "config.json").read_text())
    (into / "config.json").write_text(json.dumps(config | change, indent=2))
    return into


def bad_drafters(target: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(name, the change to the served drafter's config.json, what the refusal must say)."""
    layers, hidden = int(target["num_hidden_layers"]), int(target["hidden_size"])
    other_target = hashlib.sha256(b"another target's config.json and weights").hexdigest()
    return [
        (
            "aux-layers",
            {"eagle_aux_hidden_state_layer_ids": [2, layers // 2, layers + 4]},
            "are not distinct layers of the target",
        ),
        (
            "hidden-size",
            {"hidden_size": hidden * 2, "target_hidden_size": hidden * 2},
            f"the drafter reads hidden states of size {hidden * 2}; the target's are {hidden}",
        ),
        (
            "other-target",
            {"specfleet_training": {"target_identity": other_target}},
            f"the drafter was trained for target {other_target[:12]}",
        ),
    ]


def server_state(lab: LabUnderTest, host: str) -> dict[str, Any]:
    """What a publication must leave alone on a serving host."""
    return {
        "main_pid": lab.exec(host, ["systemctl", "show", "-P", "MainPID", UNIT]).strip(),
        "current": lab.exec(host, ["readlink", f"{STORE}/current"]).strip(),
        "store": sorted(lab.exec(host, ["ls", "-A", STORE]).split()),
        "preflight": lab.exec(host, ["sha256sum", PREFLIGHT_RECORD]).split()[0],
    }


def publish(
    lab: LabUnderTest, drafter: Path, only: str | None = None
) -> subprocess.CompletedProcess[str]:
    """playbooks/publish_drafter.yml as an operator runs it; ``only``: to that serving host
    alone (``--limit``, the controller's own plays kept)."""
    limit = ["--limit", f"localhost,{only}"] if only else []
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(lab.inventory),
            "playbooks/publish_drafter.yml",
            "-e",
            f"specfleet_publish_drafter={drafter}",
            *limit,
        ],
        cwd=repo_root(),
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_bad_drafters_are_refused_before_anything_served_changes(
    lab_under_test: LabUnderTest, tmp_path: Path
) -> None:
    lab = lab_under_test
    first = lab.servers[0]
    base = served_drafter(lab, first, tmp_path / "served")
    cases = bad_drafters(target_config(lab, first))
    before = {host: server_state(lab, host) for host in lab.servers}
    cache = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet")).joinpath(
        "drafters"
    )
    door = Door.of(lab)
    staged = []
    try:
        with Load(door, door.client_key, threads=1, per_second=1, minutes=15) as load:
            for name, change, reason in cases:
                drafter = variant(base, tmp_path / name, change)
                digest = digest_of_files({n: sha256_file(drafter / n) for n in DRAFTER_FILES})
                staged.append(cache / digest)
                started = time.monotonic()
                run = publish(lab, drafter)
                seconds = time.monotonic() - started
                out = run.stdout + run.stderr
                assert run.returncode != 0, f"{name}: published\n{out[-3000:]}"
                assert "EAGLE-3 preflight on " + first in out, f"{name}\n{out[-3000:]}"
                assert reason in out, f"{name}: the refusal does not say {reason!r}\n{out[-3000:]}"
                assert f"Publication refused on {first}: current did not move" in out, name
                said = next(line for line in out.splitlines() if reason in line)
                start = max(0, said.index(reason) - 60)
                print(f"{name}: refused in {seconds:.0f} s: ...{said[start : start + 260]}")
                after = {host: server_state(lab, host) for host in lab.servers}
                assert after == before, f"{name}: a serving host changed: {before} -> {after}"
                assert digest not in after[first]["store"]
        print(f"load through the front door: {dict(load.results)}, retried {load.retried}")
        assert not load.failures, load.failures
        assert load.results["200"] >= len(cases), load.results
    finally:
        for folder in staged:
            shutil.rmtree(folder, ignore_errors=True)
