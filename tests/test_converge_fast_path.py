"""site.yml's fast path on a running lab: a lab that has converged ends each host's run in one
call; every drift the issue names is made by hand, one at a time, and after each the host's
one call (the module, in check mode, which sets nothing aside) names it beside the ones
before; then `specfleet provision` names them all in its `fast_path` report, its full
converge repairs every one, and the same command ends every host at once again, changing
nothing. One repairing converge for all of them: each repair restarts the server on two
shared cores, and the repairs do not depend on each other.

The drifts: a unit file edited, the service stopped, a file in the venv changed, the
whitelist reverted (on a vLLM that has one: the lab's 0.31 and 0.32 have none, and
tests/test_specfleet_converged.py reverts a real release's), the drafter link moved, a
package removed, a line of the balancer's configuration changed, the model folder's files
altered.

It uses the tests' lab (conftest.cli_lab), or ``SPECFLEET_TEST_LAB=inventory/lab/hosts.yml``
for a lab already up (``bin/lab up``), which it leaves converged (the drafter link on a copy
of the drafter it served, moved back at the end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from labs import LabUnderTest, specfleet_json

from specfleet.controller.paths import repo_root

pytestmark = pytest.mark.docker

UNIT = "/etc/systemd/system/specfleet-vllm.service"
HAPROXY_CFG = "/etc/haproxy/haproxy.cfg"
DRAFTER_LINK = "/var/lib/specfleet/drafters/current"
MODELS = "/var/lib/specfleet/lab"


def provision(lab: LabUnderTest, *args: str) -> dict[str, Any]:
    rc, run = specfleet_json("provision", "-i", str(lab.inventory), *args)
    assert rc == 0, json.dumps(run, indent=1)[-4000:]
    return run


def ended_at_once(run: dict[str, Any]) -> list[str]:
    return sorted(host for host, row in run["fast_path"].items() if row["ends_here"])


def main_pid(lab: LabUnderTest, host: str) -> int:
    return int(lab.exec(host, ["systemctl", "show", "-P", "MainPID", "specfleet-vllm"]))


def sha256(lab: LabUnderTest, host: str, path: str) -> str:
    return lab.exec(host, ["sha256sum", path]).split()[0]


def health(lab: LabUnderTest, host: str) -> str:
    """The HTTP status of the server's /health, asked from its host."""
    url = f"http://{lab.address(host)}:8000/health"
    code = (
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=30).status)"
    )
    return lab.exec(host, ["python3", "-c", code, url]).strip()


def whitelist_record(lab: LabUnderTest, host: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(
        lab.exec(host, ["cat", "/etc/specfleet/eagle3-whitelist.json"])
    )
    return record


def venv_of(lab: LabUnderTest, host: str) -> str:
    return lab.exec(host, ["readlink", "-f", "/opt/specfleet/venvs/current"]).strip()


@pytest.fixture(scope="module")
def lab(lab_under_test: LabUnderTest) -> LabUnderTest:
    """The lab, converged and recorded: the same command ends every host at once."""
    run = provision(lab_under_test)
    if ended_at_once(run) != sorted(run["fast_path"]):
        run = provision(lab_under_test)
    assert ended_at_once(run) == sorted(run["fast_path"]), run["fast_path"]
    return lab_under_test


def test_a_converged_lab_ends_each_host_in_one_call(lab: LabUnderTest) -> None:
    run = provision(lab)
    hosts = [*lab.servers, lab.balancer, *lab.monitors]
    assert ended_at_once(run) == sorted(hosts)
    assert all(run["hosts"][host]["changed"] == 0 for host in hosts)
    # The host's one call, the grouping, the project settings' check; the digest of the
    # inputs and the report run once (on the first host).
    tasks = {host: run["hosts"][host]["ok"] + run["hosts"][host]["skipped"] for host in hosts}
    assert max(tasks.values()) <= 5 and sorted(tasks.values())[0] <= 3, tasks


def test_full_takes_every_host_through_the_converge_and_changes_nothing(
    lab: LabUnderTest,
) -> None:
    pid = main_pid(lab, lab.servers[0])
    run = provision(lab, "--full")
    assert ended_at_once(run) == []
    assert all(row["changed"] == 0 for row in run["hosts"].values()), run["hosts"]
    # The full converge's own tasks ran (its ~30 a server), and the server kept serving.
    assert run["hosts"][lab.servers[0]]["ok"] > 20
    assert main_pid(lab, lab.servers[0]) == pid
    assert ended_at_once(provision(lab)) == sorted(run["fast_path"])


@dataclass(frozen=True)
class Drift:
    """One thing a role manages, changed by hand on one host."""

    host: str  # "server" or "balancer"
    expected: Callable[[LabUnderTest, str], str]  # the start of the line the fast path names
    make: Callable[[LabUnderTest, str], None]
    # The file the drift changes, which the repair must put back byte for byte ("" for none).
    changes: Callable[[LabUnderTest, str], str] = lambda lab, host: ""


def venv_file(lab: LabUnderTest, host: str) -> str:
    return lab.exec(host, ["find", venv_of(lab, host), "-path", "*/vllm/envs.py"]).split()[0]


def whitelist_source(lab: LabUnderTest, host: str) -> str:
    return str(whitelist_record(lab, host)["path"])


def whitelist_line(lab: LabUnderTest, host: str) -> str:
    """A vLLM with a whitelist: its source is managed by its content, and the module edits it
    again. The lab's vLLMs (0.31, 0.32) have none (EAGLE-3 is decided per architecture):
    there the source is a file of the venv like any other, which the case of a file in the
    venv covers; tests/test_specfleet_converged.py reverts a real release's whitelist."""
    return f"files {whitelist_source(lab, host)}"


def append_comment(
    path_of: Callable[[LabUnderTest, str], str],
) -> Callable[[LabUnderTest, str], None]:
    return lambda lab, host: lab.exec(host, ["sed", "-i", "$a # drifted", path_of(lab, host)])


def stop_service(lab: LabUnderTest, host: str) -> None:
    lab.exec(host, ["systemctl", "stop", "specfleet-vllm"])


def move_drafter_link(lab: LabUnderTest, host: str) -> None:
    served = lab.exec(host, ["readlink", "-f", DRAFTER_LINK]).strip()
    copy = "/var/lib/specfleet/drafters/moved-by-hand"
    assert served != copy, "an earlier run left the link moved: move it back first"
    lab.exec(host, ["rm", "-rf", copy])
    lab.exec(host, ["cp", "-a", served, copy])
    lab.exec(host, ["ln", "-sfn", copy, DRAFTER_LINK])


def remove_package(lab: LabUnderTest, host: str) -> None:
    lab.exec(host, ["dpkg", "--remove", "--force-depends", "openssl"])


def change_balancer_line(lab: LabUnderTest, host: str) -> None:
    lab.exec(host, ["sed", "-i", "0,/timeout client .*/s//timeout client 1s/", HAPROXY_CFG])


def alter_model(lab: LabUnderTest, host: str) -> None:
    lab.exec(host, ["sh", "-c", f"printf ' ' >> {MODELS}/target/config.json"])


def fixed(text: str) -> Callable[[LabUnderTest, str], str]:
    return lambda lab, host: text


DRIFTS = {
    "a unit file edited": Drift(
        "server", fixed(f"files {UNIT}"), append_comment(fixed(UNIT)), fixed(UNIT)
    ),
    "the service stopped": Drift("server", fixed("units specfleet-vllm.service"), stop_service),
    "a file in the venv changed": Drift(
        "server",
        lambda lab, host: f"trees {venv_of(lab, host)}",
        append_comment(venv_file),
        venv_file,
    ),
    "the whitelist reverted": Drift(
        "server", whitelist_line, append_comment(whitelist_source), whitelist_source
    ),
    # Served after the full converge: the link is publication's to move; the converge
    # serves what it names, after the preflight (here a copy of the same drafter).
    "the drafter link moved": Drift("server", fixed(f"files {DRAFTER_LINK}"), move_drafter_link),
    "a package removed": Drift("balancer", fixed("packages openssl"), remove_package),
    "a line of the balancer's configuration changed": Drift(
        "balancer", fixed(f"files {HAPROXY_CFG}"), change_balancer_line, fixed(HAPROXY_CFG)
    ),
    "the model folder's files altered": Drift(
        "server", fixed(f"trees {MODELS}"), alter_model, fixed(f"{MODELS}/target/config.json")
    ),
}


def noticed(lab: LabUnderTest, host: str) -> list[str]:
    """What the host's one call finds, in check mode: nothing set aside or marked, so the
    next drift is found beside this one. The inputs are those its record holds (nothing
    changed on the controller)."""
    record = json.loads(lab.exec(host, ["cat", "/etc/specfleet/converged.json"]))
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            host,
            "-i",
            str(lab.inventory),
            "--become",
            "--check",
            "-m",
            "specfleet.fleet.specfleet_converged",
            "-a",
            f"inputs={record['inputs']}",
        ],
        cwd=repo_root(),
        env={**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # raw_decode: profile_tasks prints its recap around the json callback's document.
    document = json.JSONDecoder().raw_decode(run.stdout[run.stdout.index("{") :])[0]
    result = document["plays"][0]["tasks"][0]["hosts"][host]
    assert not result.get("failed"), result
    return [str(line) for line in result["drift"]]


def test_each_drift_is_noticed_in_one_call_and_the_full_converge_repairs_them(
    lab: LabUnderTest,
) -> None:
    server = lab.servers[0]
    drifts = {
        name: drift
        for name, drift in DRIFTS.items()
        if name != "the whitelist reverted"
        or whitelist_record(lab, server)["whitelist"] != "absent"
    }
    pid = main_pid(lab, server)
    before: dict[tuple[str, str], str] = {}
    expected: dict[str, list[str]] = {server: [], lab.balancer: []}
    for name, drift in drifts.items():
        host = server if drift.host == "server" else lab.balancer
        changed = drift.changes(lab, host)
        if changed:
            before[(host, changed)] = sha256(lab, host, changed)
        expected[host].append(drift.expected(lab, host))
        drift.make(lab, host)
        found = noticed(lab, host)
        # Named, beside what was made before it.
        for line in expected[host]:
            assert any(each.startswith(line) for each in found), (name, line, found)

    run = provision(lab)

    # The command names every one of them, host by host.
    for host, lines in expected.items():
        why = run["fast_path"][host]["why"]
        assert not run["fast_path"][host]["ends_here"]
        for line in lines:
            assert any(each.startswith(line) for each in why), (line, why)
    # The hosts they work with took the full converge too.
    assert not any(row["ends_here"] for row in run["fast_path"].values())
    # Repaired: each file as it was, byte for byte, the server restarted and serving, the
    # package back, the venv and the model built anew.
    for (host, path), digest in before.items():
        assert sha256(lab, host, path) == digest, path
    unit = ["systemctl", "show", "-P", "NeedDaemonReload", "specfleet-vllm"]
    assert lab.exec(server, unit) == "no\n"
    assert lab.exec(server, ["systemctl", "is-active", "specfleet-vllm"]) == "active\n"
    assert main_pid(lab, server) != pid
    assert health(lab, server) == "200"
    status = ["dpkg-query", "-W", "-f", "${Status}", "openssl"]
    assert lab.exec(lab.balancer, status) == "install ok installed"
    assert lab.exec(server, ["readlink", DRAFTER_LINK]).strip().endswith("/moved-by-hand")
    # And the same command again ends every host at once, changing nothing.
    again = provision(lab)
    assert ended_at_once(again) == sorted(again["fast_path"]), again["fast_path"]
    assert all(row["changed"] == 0 for row in again["hosts"].values())


def test_the_drafter_link_moved_back_is_served_again(lab: LabUnderTest) -> None:
    """Leaves the lab as it found it: the link back on the drafter it served."""
    server = lab.servers[0]
    copy = lab.exec(server, ["readlink", DRAFTER_LINK]).strip()
    if not copy.endswith("/moved-by-hand"):
        pytest.skip("the drafter link was not moved by this module")
    original = lab.exec(server, ["readlink", "-f", f"{MODELS}/drafter"]).strip()
    lab.exec(server, ["ln", "-sfn", original, DRAFTER_LINK])
    lab.exec(server, ["rm", "-rf", copy])
    run = provision(lab)
    assert not run["fast_path"][server]["ends_here"]
    assert ended_at_once(provision(lab)) == sorted(run["fast_path"])
