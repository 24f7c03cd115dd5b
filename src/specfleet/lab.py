"""The local lab: systemd containers named like GPU hosts, run by site.yml.

Everything here is Ansible: `playbooks/lab.yml` creates or removes the
containers from the lab inventory, then `playbooks/site.yml` converges them
exactly as it would converge a real fleet.
"""

from __future__ import annotations

from pathlib import Path

from specfleet.image import ensure_image
from specfleet.playbook import PlayResult, run_playbook


def lab_up(inventory: Path | None = None) -> list[PlayResult]:
    """Create the lab's containers, then converge them; stops at the first failure."""
    image = ensure_image()
    results = [
        run_playbook(
            "lab.yml",
            inventory=inventory,
            extravars={"lab_state": "started", "lab_image": image},
        )
    ]
    if results[-1].ok:
        results.append(run_playbook("site.yml", inventory=inventory))
    return results


def lab_down(inventory: Path | None = None) -> list[PlayResult]:
    return [run_playbook("lab.yml", inventory=inventory, extravars={"lab_state": "absent"})]
