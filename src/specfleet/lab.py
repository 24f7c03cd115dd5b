"""The local lab: systemd containers named like GPU hosts, run by site.yml.

Everything here is Ansible: `playbooks/lab.yml` creates or removes the
containers from the lab inventory, then `playbooks/site.yml` converges them
exactly as it would converge a real fleet.
"""

from __future__ import annotations

from pathlib import Path

from specfleet.image import ensure_image
from specfleet.paths import cache_dir
from specfleet.playbook import PlayResult, run_playbook
from specfleet.stacklock import StackLock, StackSpec
from specfleet.wheelhouse import ensure_wheelhouse

# The stack the lab hosts run (profile cpu); its wheelhouse is shared with
# them read-only, as a fleet would share it over NFS.
LAB_STACK = "cpu"


def lab_up(inventory: Path | None = None) -> list[PlayResult]:
    """Create the lab's containers, then converge them; stops at the first failure."""
    image = ensure_image()
    ensure_wheelhouse(StackSpec.load(LAB_STACK), StackLock.read(LAB_STACK))
    extravars = {
        "lab_state": "started",
        "lab_image": image,
        "lab_wheelhouse_root": str(cache_dir("wheelhouse")),
    }
    results = [run_playbook("lab.yml", inventory=inventory, extravars=extravars)]
    if results[-1].ok:
        results.append(run_playbook("site.yml", inventory=inventory))
    return results


def lab_down(inventory: Path | None = None) -> list[PlayResult]:
    return [run_playbook("lab.yml", inventory=inventory, extravars={"lab_state": "absent"})]
