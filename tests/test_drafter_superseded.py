"""Drafters published one after another onto one of a running lab's servers
(`playbooks/publish_drafter.yml -e specfleet_publish_drafter=DIR --limit localhost,HOST`),
each served behind the gate, while requests flow through the front door; a serving host's
store keeps what it serves and what it served before (the next rollback's target), and a
drafter two publications behind is removed from it:

- ``a`` and ``b``: the drafter the lab serves with a note added to its config.json (the
  same weights and shapes: each serves as well as the lab's own, under another digest);
- then the lab's own drafter again, under its digest: ``b`` stays (served before), ``a``,
  superseded, leaves the store, and so does its copy in the controller's cache.

One host, as an operator canaries a drafter: the store's history is a host's own, and each
publication restarts its host behind the gate (about a minute here), so three of them on
every server would add nothing but minutes (rolling across hosts under load is the fleet
upgrade's test, through the same serve_one_host.yml). The other servers must not move.
With two servers or more, requests flow through the front door all along and none may
fail (the published host is drained while the others serve); a lab of one server has
nothing to serve while its only server restarts, so it sends none. The lab ends
serving its own drafter's bytes. It uses the lab of tests/test_cli_lab.py, or
``SPECFLEET_TEST_LAB=inventory/lab/hosts.yml`` for a lab already up (``bin/lab up``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from doorclient import Door, Load
from labs import LabUnderTest
from test_drafter_refused import STORE, publish, served_drafter, variant

from specfleet.host.drafter_store import DRAFTER_FILES, digest_of_files
from specfleet.host.hashing import sha256_file

# After the modules that meet the lab as `lab up` left it (its drafter moves, and back).
pytestmark = [pytest.mark.docker, pytest.mark.changes_lab_stack(1)]


def digest_of(drafter: Path) -> str:
    return digest_of_files({name: sha256_file(drafter / name) for name in DRAFTER_FILES})


def store_of(lab: LabUnderTest, host: str) -> list[str]:
    return sorted(lab.exec(host, ["ls", "-A", STORE]).split())


def current_of(lab: LabUnderTest, host: str) -> str:
    return lab.exec(host, ["readlink", f"{STORE}/current"]).strip()


def test_a_drafter_two_publications_behind_leaves_the_store(
    lab_under_test: LabUnderTest, tmp_path: Path
) -> None:
    lab = lab_under_test
    first = lab.servers[0]
    own = served_drafter(lab, first, tmp_path / "own")
    drafters = {
        "a": variant(own, tmp_path / "a", {"specfleet_note": "superseded-test a"}),
        "b": variant(own, tmp_path / "b", {"specfleet_note": "superseded-test b"}),
        "own": own,
    }
    digests = {name: digest_of(folder) for name, folder in drafters.items()}
    cache = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    door = Door.of(lab)
    under_load = len(lab.servers) >= 2
    load = Load(door, door.client_key, threads=1, per_second=1, minutes=20)
    others = {host: (current_of(lab, host), store_of(lab, host)) for host in lab.servers[1:]}
    with load if under_load else contextlib.nullcontext():
        for name in ("a", "b", "own"):
            started = time.monotonic()
            run = publish(lab, drafters[name], only=first)
            out = run.stdout + run.stderr
            assert run.returncode == 0, f"{name}: not published\n{out[-4000:]}"
            print(f"published {name} ({digests[name][:12]}) in {time.monotonic() - started:.0f} s")
            assert current_of(lab, first) == f"{STORE}/{digests[name]}", name
            if name == "b":  # a is what b's host served before: kept for a rollback
                assert {digests["a"], digests["b"]} <= set(store_of(lab, first))
    if under_load:
        print(f"load through the front door: {dict(load.results)}, retried {load.retried}")
        assert not load.failures, load.failures
        assert load.results["200"] >= 3, load.results
    store = store_of(lab, first)
    assert digests["own"] in store and digests["b"] in store, store
    assert digests["a"] not in store, f"the superseded drafter is still there: {store}"
    assert not (cache / "drafters" / digests["a"]).exists(), "the controller's cache kept a"
    for host, before in others.items():
        assert (current_of(lab, host), store_of(lab, host)) == before, f"{host} moved"
