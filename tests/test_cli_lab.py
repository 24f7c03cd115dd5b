"""The README's first command and the CLI end to end against lab containers (Docker): the
tests' own lab (conftest.cli_lab: cli-lab-01 and cli-lab-02 behind
their balancer, cli-lab-lb, all reached over SSH on a network of their own), brought up once with
`specfleet lab up --json` as `bin/lab` runs it, brought up again (nothing changes), read,
probed with an unreachable host and a bad inventory, and removed (`lab down` leaves no
container).

Run: `.venv/bin/pytest tests/test_cli_lab.py` (about 5 min on 2 cores with the image and the
wheelhouse cached; `bin/lab up` builds them).
"""

from __future__ import annotations

import json
import os
import shlex
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from labs import LabUnderTest, containers, specfleet_json

from specfleet.controller.paths import repo_root

HOST = "cli-lab-01"
GHOST = "cli-lab-ghost"

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def lab(cli_lab: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The tests' lab (conftest.cli_lab), shared with tests/test_front_door.py."""
    return cli_lab


def test_lab_up_says_what_the_lab_serves(lab: tuple[Path, dict[str, Any]]) -> None:
    inventory, up = lab
    assert up["rc"] == 0 and up["result"] == "ok"
    assert up["playbooks"] == ["lab.yml", "site.yml", "status.yml"]
    assert up["hosts"][HOST]["changed"], "the first converge must change bare hosts"
    assert Path(up["log"]).is_file()
    row = up["status"]["servers"][HOST]
    assert row["health"] == "ok"
    assert row["stack"]["lock"] == "cpu" and row["stack"]["vllm"]
    assert row["drafter"] != "absent"
    server = next(server for server in up["lab"]["servers"] if server["host"] == HOST)
    assert {server["host"] for server in up["lab"]["servers"]} == set(servers_of(inventory))
    assert server == {
        "host": HOST,
        "endpoint": row["endpoint"],
        "model": "tiny",
        "drafter": row["drafter"],
        "health": "ok",
    }
    assert row["endpoint"].startswith("http://") and row["endpoint"].endswith(":8000")
    completion = up["lab"]["completion"]
    assert "error" not in completion, completion
    # Through the lab's door, its balancer (TLS, self-signed).
    assert completion["via"] == "cli-lab-lb" and completion["url"].startswith("https://")
    assert completion["completion_tokens"] > 0 and completion["text"]
    assert completion["drafts"] > 0 and completion["draft_tokens"] > 0
    assert completion["accepted_tokens"] >= 0
    # The door as this machine reaches it (the balancer's address, not its loopback), and a
    # line to paste that does the same.
    assert completion["url"] == "https://172.30.242.10:8080"
    assert completion_of_curl_line(completion["curl"])["choices"][0]["text"]
    # The lab's Prometheus, named with a link to its graph of acceptance by position.
    prometheus = up["lab"]["prometheus"]
    assert prometheus["url"] == "http://172.30.242.20:9090" and prometheus["ready"]
    assert prometheus["graph"].startswith(prometheus["url"] + "/graph?g0.expr=")
    # The next commands drive this lab: they carry its inventory.
    assert up["lab"]["next"][:2] == [
        f"specfleet status -i {inventory}",
        f"specfleet train -i {inventory}",
    ]


def servers_of(inventory: Path) -> list[str]:
    """The lab's servers (one, or two when the fleet's upgrades are asked for)."""
    return LabUnderTest(inventory).servers


def completion_of_curl_line(line: str) -> dict[str, Any]:
    """What the tour's `curl` line answers, sent as curl would send it (curl itself may not
    be on this machine)."""
    words = shlex.split(line)
    assert words[:2] == ["curl", "-sk"], words
    url = words[2]
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    body = words[words.index("-d") + 1].encode()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, body, headers)
    with urllib.request.urlopen(request, timeout=300, context=context) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_lab_up_again_changes_nothing(lab: tuple[Path, dict[str, Any]]) -> None:
    inventory, _ = lab
    rc, again = specfleet_json("lab", "up", "-i", str(inventory))
    assert rc == 0, again
    assert {host: n["changed"] for host, n in again["hosts"].items()} == {
        "localhost": 0,
        "cli-lab-lb": 0,
        "cli-lab-mon": 0,
        **dict.fromkeys(servers_of(inventory), 0),
    }
    assert again["status"]["servers"][HOST]["health"] == "ok"


def test_status_reads_the_lab_and_changes_nothing(lab: tuple[Path, dict[str, Any]]) -> None:
    inventory, _ = lab
    rc, status = specfleet_json("status", "-i", str(inventory))
    assert rc == 0, status
    assert status["hosts"][HOST]["changed"] == 0 and status["hosts"][HOST]["failed"] == 0
    row = status["status"]["servers"][HOST]
    assert row["unit"]["active"] == "active" and row["unit"]["sub"] == "running"
    assert row["unit"]["main_pid"] > 0
    assert row["whitelist"] != "absent"
    assert row["acceptance"]["drafts"] > 0, "lab up's gate and completion drafted tokens"
    assert row["acceptance"]["mean_acceptance_length"] >= 1
    # The lab's balancer (cli-lab-lb) sends to the server and says so.
    balancer = status["status"]["loadbalancer"]
    assert balancer["host"] == "cli-lab-lb" and balancer["reachable"] and balancer["tls"]
    assert row["loadbalancer"]["status"] == "UP", row["loadbalancer"]
    # Acceptance over Prometheus' window too (the lab's: 1 minute), from its monitoring host.
    assert status["status"]["prometheus"]["ready"], status["status"]["prometheus"]
    assert row["acceptance_window"]["source"] == "prometheus"
    assert row["acceptance_window"]["window"] == "1m"
    assert status["status"]["unhealthy_hosts"] == []


def test_an_unreachable_host_is_named_and_has_its_exit_code(
    lab: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    inventory, _ = lab
    hosts = yaml.safe_load(inventory.read_text())
    # In gpu_hosts, not in `lab`: `lab up` never made a container for it.
    hosts["all"]["children"]["gpu_hosts"]["hosts"] = {
        GHOST: {
            "ansible_connection": "community.docker.docker",
            "ansible_python_interpreter": "/usr/bin/python3",
        }
    }
    ghost_inventory = inventory.parent / "with-ghost.yml"
    ghost_inventory.write_text(yaml.safe_dump(hosts))
    rc, status = specfleet_json("status", "-i", str(ghost_inventory))
    assert rc == 4, status
    assert status["result"] == "unreachable"
    assert status["unreachable_hosts"] == [GHOST]
    assert {t["host"] for t in status["failed_tasks"]} == {GHOST}
    # Not among the balancer's servers either: the lab's site.yml run never knew it.
    assert status["status"]["servers"][GHOST] == {
        "reachable": False,
        "error": "unreachable",
        "loadbalancer": "absent",
    }
    assert status["status"]["servers"][HOST]["health"] == "ok"


def _served(inventory: Path) -> dict[str, Any]:
    rc, status = specfleet_json("status", "-i", str(inventory))
    assert rc == 0, status
    unit: dict[str, Any] = status["status"]["servers"][HOST]["unit"]
    return unit


def test_a_bad_inventory_is_exit_2_and_changes_nothing(
    lab: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    inventory, _ = lab
    before = _served(inventory), containers("cli-lab-")
    broken = inventory.parent / "broken.yml"
    broken.write_text(inventory.read_text().replace("children:", "children: [", 1))
    rc, run = specfleet_json("provision", "-i", str(broken))
    assert rc == 2, run
    assert run["result"] == "bad_input" and str(broken) in run["error"]
    assert run["hosts"] == {}
    rc, run = specfleet_json("provision", "-i", str(inventory.parent / "missing.yml"))
    assert rc == 2 and "inventory not found" in run["error"] and run["runs"] == []
    after = _served(inventory), containers("cli-lab-")
    # Same server process, no restart, same containers.
    assert after == before


def test_provision_piped_prints_plain_lines_and_changes_nothing(
    lab: tuple[Path, dict[str, Any]],
) -> None:
    inventory, _ = lab
    # --full: the whole converge's lines (a re-run without it ends each host in one call:
    # tests/test_converge_fast_path.py).
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "specfleet.controller.cli",
            "provision",
            "-i",
            str(inventory),
            "--full",
        ],
        env={**os.environ, "SPECFLEET_ROOT": str(repo_root())},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.rstrip("\n").splitlines()
    assert "\x1b" not in run.stdout
    assert lines[0] == "== site.yml: Fast path, hosts already converged end here (one call each)"
    assert "fast path: off (--full), every host took the full converge" in lines
    assert f"{HOST}: vllm_server" in lines
    assert not [line for line in lines if ": changed: " in line], "a re-run changes nothing"
    assert len(lines) < 60, "a converge reads in one screen"
    assert lines[-2].startswith("specfleet provision: ok (exit 0)")
    assert Path(lines[-1].removeprefix("log: ")).is_file()
