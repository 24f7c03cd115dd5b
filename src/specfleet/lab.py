"""The local lab: systemd containers named like GPU hosts, run by site.yml.

Everything here is Ansible: `playbooks/lab.yml` creates or removes the
containers from the lab inventory, then `playbooks/site.yml` converges them
exactly as it would converge a real fleet.
"""

from __future__ import annotations

from specfleet.image import ensure_image
from specfleet.playbook import PlayResult, run_playbook


def lab_up() -> PlayResult:
    image = ensure_image()
    created = run_playbook("lab.yml", extravars={"lab_state": "started", "lab_image": image})
    if not created.ok:
        return created
    return run_playbook("site.yml")


def lab_down() -> PlayResult:
    return run_playbook("lab.yml", extravars={"lab_state": "absent"})
