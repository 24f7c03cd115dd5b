"""A model change rolled across the fleet, on request (SPECFLEET_FLEET=1), on the tests'
shared lab (conftest.cli_lab: two servers behind their balancer), through the CLI an operator
runs, under load through the front door, in this order:

- the lab's model published on a mirror (Debian's nginx on the balancer, the model_mirror
  role) and pinned on the controller (`specfleet model pin`) in three revisions: ``tiny-a``,
  the lab's own target; ``tiny-b``, the same with a README added (another digest: another
  folder; the same target for the drafter); ``tiny-c``, whose tokenizer vLLM cannot read
  (its first byte);
- `specfleet provision` with the servers in ``pinned_models``: each fetches ``tiny-a`` from
  the mirror and its server restarts onto it, a wave at a time behind the balancer;
- `specfleet upgrade --model tiny-b`: every server serves ``tiny-b`` (the unit names its
  folder, the link names it), ``tiny-a`` is kept for rollback;
- `specfleet upgrade --model tiny-c`: the canary fetches it, fails its gate, rolls back to
  ``tiny-b`` restarted and gated, and the rollout stops; the other host is never touched;
- no request through the door fails during any of them;
- the lab back as `lab up` left it (its own model folder), by `specfleet provision` on the
  lab's own inventory.

The model's folder under another name is the only thing a model change moves; the server's
unit names the folder, so what the server loads is what the link named when it started.
Run: `SPECFLEET_FLEET=1 .venv/bin/pytest tests/test_fleet_model.py` (brings the lab up).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from doorclient import Door, Load
from fleetlab import Upgrade, balancer_states, main_pid, run_in, wait_for
from labs import FLEET_ASKED, FLEET_ON_REQUEST, LabUnderTest, specfleet_json

# After the modules that switch the lab's stack: this one moves its model, and puts it back.
pytestmark = [
    pytest.mark.docker,
    pytest.mark.changes_lab_stack(3),
    pytest.mark.skipif(not FLEET_ASKED, reason=FLEET_ON_REQUEST),
]

LAB_TARGET = "/var/lib/specfleet/lab/target"
LINK = "/var/lib/specfleet/models/target"
MIRROR_ROOT = "/srv/specfleet/models"
LOAD_PER_SECOND = 0.25


def model_of_unit(lab: LabUnderTest, host: str) -> str:
    """The folder the server's unit loads (its --model)."""
    unit = run_in(lab, host, ["systemctl", "cat", "specfleet-vllm.service"]).replace("\\\n", " ")
    words = unit.split()
    return words[words.index("--model") + 1]


def link_of(lab: LabUnderTest, host: str) -> str:
    return run_in(lab, host, ["readlink", LINK]).strip()


def all_up(lab: LabUnderTest) -> bool:
    return all(state.startswith("UP") for state in balancer_states(lab).values())


@pytest.fixture(scope="module")
def lab(lab_under_test: LabUnderTest) -> LabUnderTest:
    assert len(lab_under_test.servers) >= 2, "a rollout needs a canary and another server"
    return lab_under_test


@pytest.fixture(scope="module")
def revisions(lab: LabUnderTest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three revisions on the controller, on the mirror's folder, and pinned."""
    folder = tmp_path_factory.mktemp("models")
    first = lab.servers[0]
    subprocess.run(["docker", "cp", f"{first}:{LAB_TARGET}", str(folder / "tiny-a")], check=True)
    shutil.copytree(folder / "tiny-a", folder / "tiny-b")
    # Another file, the same target (config and weights): the drafter still fits it.
    (folder / "tiny-b" / "README.md").write_text("tiny, revision b\n")
    shutil.copytree(folder / "tiny-b", folder / "tiny-c")
    tokenizer = folder / "tiny-c" / "tokenizer.json"
    tokenizer.write_bytes(b"#" + tokenizer.read_bytes()[1:])
    mirror = f"http://{lab.address(lab.balancer)}:8090"
    pinned = {}
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        run_in(lab, lab.balancer, ["mkdir", "-p", MIRROR_ROOT])
        subprocess.run(
            ["docker", "cp", str(folder / name), f"{lab.balancer}:{MIRROR_ROOT}/{name}"],
            check=True,
        )
        manifest = folder / f"{name}.json"
        rc, pin = specfleet_json(
            "model", "pin", str(folder / name), "--name", "tiny",
            "--source", f"{mirror}/{name}/", "--revision", name, "-o", str(manifest),
        )  # fmt: skip
        assert rc == 0, pin
        pinned[name] = {
            "manifest": manifest,
            "folder": f"/var/lib/specfleet/models/{pin['folder']}",
            "files": pin["files"],
        }
    return pinned


@pytest.fixture(scope="module")
def pinned_lab(lab: LabUnderTest, revisions: dict[str, Any]) -> LabUnderTest:
    """The lab's inventory with its servers in pinned_models (tiny-a) and its balancer the
    mirror, beside the lab's own (its group_vars and its key apply)."""
    data = yaml.safe_load(lab.inventory.read_text())
    data["all"]["children"]["model_mirrors"] = {"children": {"loadbalancers": None}}
    data["all"]["children"]["pinned_models"] = {"children": {"lab_servers": None}}
    inventory = lab.inventory.with_name("hosts-pinned.yml")
    inventory.write_text(yaml.safe_dump(data))
    # A group_vars file, as the lab's own model is set (an inventory file's group vars rank
    # below every group_vars file); over the lab group's, by priority. The lab's inventory
    # has no such group: this file is the pinned inventory's alone.
    group_vars = {
        "ansible_group_priority": 10,
        "specfleet_model": LINK,
        "pinned_model_manifest": str(revisions["tiny-a"]["manifest"]),
    }
    (lab.inventory.parent / "group_vars" / "pinned_models.yml").write_text(
        yaml.safe_dump(group_vars)
    )
    return LabUnderTest(inventory)


@pytest.fixture(scope="module")
def door(lab: LabUnderTest) -> Door:
    return Door.of(lab)


def test_a_model_reaches_every_server_through_the_mirror_and_moves_by_upgrade(
    lab: LabUnderTest, pinned_lab: LabUnderTest, revisions: dict[str, Any], door: Door,
    tmp_path: Path,
) -> None:  # fmt: skip
    canary, other = lab.servers[:2]
    a, b, c = (revisions[name] for name in ("tiny-a", "tiny-b", "tiny-c"))
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        started = time.monotonic()
        rc, converged = specfleet_json("provision", "-i", str(pinned_lab.inventory))
        assert rc == 0, converged.get("failed_tasks") or converged
        print(f"\nprovision onto tiny-a from the mirror: {time.monotonic() - started:.0f} s")
        for host in lab.servers:
            assert (link_of(lab, host), model_of_unit(lab, host)) == (a["folder"], a["folder"])
        log = ["grep", "-c", '"GET /tiny-a/', "/var/log/nginx/access.log"]
        fetched = int(run_in(lab, lab.balancer, log))
        assert fetched == len(lab.servers) * a["files"], fetched  # each server, each file once

        started = time.monotonic()
        rc, upgraded = Upgrade(
            pinned_lab, None, tmp_path / "b.json", "--model", str(b["manifest"])
        ).finish()
        assert rc == 0, upgraded.get("failed_tasks") or upgraded
        print(f"upgrade to tiny-b: {time.monotonic() - started:.0f} s")
        for host in lab.servers:
            assert (link_of(lab, host), model_of_unit(lab, host)) == (b["folder"], b["folder"])
            # The previous model is kept: the rollback's target.
            run_in(lab, host, ["test", "-f", f"{a['folder']}/.specfleet-model.json"])
        wait_for("every server UP", lambda: all_up(lab), timeout=120)

        before_other = main_pid(lab, other)
        started = time.monotonic()
        rc, failing = Upgrade(
            pinned_lab, None, tmp_path / "c.json", "--model", str(c["manifest"])
        ).finish()
        print(f"upgrade to tiny-c, rolled back: {time.monotonic() - started:.0f} s")
        assert rc != 0, failing
        message = json.dumps(failing.get("failed_tasks") or failing)
        assert f"stopped on {canary}" in message and "again, restarted and gated" in message, (
            message
        )
        assert Path(b["folder"]).name in message, message
        assert (link_of(lab, canary), model_of_unit(lab, canary)) == (b["folder"], b["folder"])
        assert main_pid(lab, other) == before_other and link_of(lab, other) == b["folder"]
        wait_for("every server UP after the rollback", lambda: all_up(lab), timeout=120)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])
    print(f"requests: {dict(load.results)}, retried {load.retried}")


def test_the_lab_serves_its_own_model_again(lab: LabUnderTest, door: Door) -> None:
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        rc, back = specfleet_json("provision", "-i", str(lab.inventory))
        assert rc == 0, back.get("failed_tasks") or back
    assert not load.failures, load.failures[:5]
    for host in lab.servers:
        assert model_of_unit(lab, host) == LAB_TARGET
