"""The local lab: systemd containers named like GPU hosts, run by site.yml.

Everything here is Ansible: `playbooks/lab.yml` creates or removes the
containers from the lab inventory, then `playbooks/site.yml` converges them
exactly as it would converge a real fleet, and `playbooks/status.yml` reads
what they serve. `lab up` ends with the tour (specfleet.controller.lab_tour): one real
completion through the lab and the speculative counters it moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specfleet.controller.image import ensure_image
from specfleet.controller.lab_tour import tour
from specfleet.controller.paths import cache_dir
from specfleet.controller.playbook import Session
from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.status import fleet_status
from specfleet.controller.wheelhouse import ensure_wheelhouse

# The stack the lab hosts run (profile cpu); its wheelhouse is shared with
# them read-only, as a fleet would share it over NFS.
LAB_STACK = "cpu"

Note = Callable[[str], None]


def lab_up(session: Session, note: Note = print) -> dict[str, Any]:
    """Create the lab's containers, converge them, read their status and try them.

    Stops at the first run that did not succeed. Returns the command's details for the
    summary (``status``, ``lab``), empty when it stopped early.
    """
    note("lab: the host image and the stack's wheelhouse (built once, then reused)")
    image = ensure_image()
    ensure_wheelhouse(StackSpec.load(LAB_STACK), StackLock.read(LAB_STACK))
    extravars = {
        "lab_state": "started",
        "lab_image": image,
        "lab_wheelhouse_root": str(cache_dir("wheelhouse")),
        "lab_venv_store": str(cache_dir("venv-store")),
    }
    for playbook, own_vars in (("lab.yml", extravars), ("site.yml", None)):
        if not session.run(playbook, extravars=own_vars).ok:
            return {}
    status = fleet_status(session.run("status.yml"))
    return {"status": status, "lab": tour(session.options, status)}


def lab_down(session: Session) -> dict[str, Any]:
    session.run("lab.yml", extravars={"lab_state": "absent"})
    return {}
