"""The CLI end to end without containers: the real `specfleet` process, ansible-runner and
ansible-playbook, against this machine over the local connection.

- `status` runs the project's playbooks/status.yml on localhost, with the project-level
  paths pointed at a temporary folder holding a stack manifest, a whitelist record, a
  published drafter and a small HTTP server answering /health and /metrics like vLLM;
  one more inventory host cannot be reached (a closed port).
- The other commands run a checkout of their own (SPECFLEET_ROOT) whose playbooks change,
  fail, print training progress or sleep, so the exit codes, the output modes, the log and
  Ctrl-C are seen on real runs.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from specfleet.controller.interrupt import child_groups
from specfleet.controller.lab_tour import tour
from specfleet.controller.paths import repo_root
from specfleet.controller.playbook import Session
from specfleet.controller.runopts import RunOptions

ROOT = repo_root()
METRICS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 70.0
"""


def specfleet(
    *args: str, cache: Path, root: Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECFLEET_CACHE": str(cache), "SPECFLEET_ROOT": str(root)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "specfleet.controller.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def local_host(**variables: Any) -> dict[str, Any]:
    return {
        "ansible_connection": "local",
        # This test runs as whoever runs pytest: no sudo.
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        **variables,
    }


# The closed port makes ssh fail at once: "unreachable", without a timeout.
GHOST = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_connection": "ssh"}


class FakeVllm(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"/health": b"", "/metrics": METRICS.encode()}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def fake_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def served_host(tmp_path: Path, fake_server: int) -> dict[str, Any]:
    """The project-level paths of a host that serves, in a temporary folder."""
    config = tmp_path / "etc"
    config.mkdir()
    (config / "stack.json").write_text(
        json.dumps({"lock": "cpu", "lock_digest": "0123456789abcdef", "vllm": "0.32.0"})
    )
    (config / "eagle3-whitelist.json").write_text(
        json.dumps({"vllm_version": "0.32.0", "whitelist": "list", "entries": ["llama", "tiny"]})
    )
    (config / "eagle3-preflight.json").write_text(
        json.dumps(
            {
                "verdict": "ok",
                "vllm": "0.32.0",
                "checks": [
                    {"name": "hidden size", "outcome": "ok"},
                    {"name": "provenance", "outcome": "unverified"},
                ],
            }
        )
    )
    store = tmp_path / "drafters"
    (store / "9f86d081884c7d65").mkdir(parents=True)
    (store / "current").symlink_to(store / "9f86d081884c7d65")
    return local_host(
        specfleet_stack_manifest=str(config / "stack.json"),
        specfleet_whitelist_record=str(config / "eagle3-whitelist.json"),
        specfleet_eagle3_preflight_record=str(config / "eagle3-preflight.json"),
        specfleet_drafter_store=str(store),
        specfleet_server_port=fake_server,
        specfleet_server_unit="specfleet-test-no-such-unit",
        specfleet_stack_python=sys.executable,
        specfleet_pythonpath=str(ROOT / "src"),
        vllm_server_served_model_name="tiny",
    )


def write_inventory(path: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}))
    return path


def test_status_reads_a_host_and_names_the_unreachable_one(
    tmp_path: Path, served_host: dict[str, Any]
) -> None:
    bare = local_host(
        specfleet_stack_manifest=str(tmp_path / "none" / "stack.json"),
        specfleet_whitelist_record=str(tmp_path / "none" / "whitelist.json"),
        specfleet_eagle3_preflight_record=str(tmp_path / "none" / "preflight.json"),
        specfleet_drafter_store=str(tmp_path / "none" / "drafters"),
        # Nothing listens on port 1.
        specfleet_server_port=1,
        specfleet_stack_python=str(tmp_path / "none" / "python"),
    )
    inventory = write_inventory(
        tmp_path / "hosts.yml", {"served": served_host, "bare": bare, "ghost": GHOST}
    )
    run = specfleet("status", "-i", str(inventory), "--json", cache=tmp_path / "cache")

    doc = json.loads(run.stdout)  # exactly one JSON document, nothing else
    assert run.returncode == 4, run.stderr
    assert doc["rc"] == 4 and doc["result"] == "unreachable"
    assert doc["unreachable_hosts"] == ["ghost"]
    assert [(t["host"], t["unreachable"]) for t in doc["failed_tasks"]] == [("ghost", True)]
    assert all(counts["changed"] == 0 for counts in doc["hosts"].values()), doc["hosts"]
    assert doc["playbooks"] == ["status.yml"]

    servers = doc["status"]["servers"]
    assert servers["ghost"] == {"reachable": False, "error": "unreachable"}
    served = servers["served"]
    assert served["stack"] == {
        "lock": "cpu",
        "hash": "0123456789abcdef",
        "vllm": "0.32.0",
        "python": sys.executable,
        "pythonpath": str(ROOT / "src"),
    }
    assert served["whitelist"]["shape"] == "list"
    assert served["whitelist"]["entries"] == ["llama", "tiny"]
    assert served["preflight"] == {"verdict": "ok", "vllm": "0.32.0", "unverified": ["provenance"]}
    assert served["drafter"] == "9f86d081884c7d65"
    assert served["unit"] == "absent"
    assert served["health"] == "ok"
    assert served["model"] == "tiny"
    assert served["acceptance"] == {
        "drafts": 40,
        "accepted_tokens": 70,
        "mean_acceptance_length": 2.75,
    }
    for part in ("stack", "whitelist", "preflight", "drafter", "unit", "health", "acceptance"):
        assert servers["bare"][part] == "absent", part
    # Not healthy, and why; the unreachable host's exit code (4) wins over unhealthy (5).
    assert served["unhealthy"] == ["unit absent"]
    assert servers["bare"]["unhealthy"] == ["unit absent", "health absent"]
    assert doc["status"]["unhealthy_hosts"] == ["bare", "ghost", "served"]
    assert doc["status"]["prometheus"] is None and "acceptance_window" not in served
    assert doc["status"]["loadbalancer"] is None

    log = Path(doc["log"])
    assert log.parent == tmp_path / "cache" / "logs" and log.name.startswith("status-")
    assert "TASK [Read the stack manifest]" in log.read_text()


def test_status_quiet_prints_only_the_table_and_the_summary(
    tmp_path: Path, served_host: dict[str, Any]
) -> None:
    inventory = write_inventory(tmp_path / "hosts.yml", {"served": served_host})
    run = specfleet("status", "-i", str(inventory), "--quiet", cache=tmp_path / "cache")
    # It answers /health, but no unit runs it: read, and not healthy (5), and the table says why.
    assert run.returncode == 5, run.stdout + run.stderr
    lines = run.stdout.rstrip("\n").splitlines()
    assert lines[0].rstrip() == "specfleet status"
    assert any("served" in line and "2.75 since start (40 drafts)" in line for line in lines)
    assert "not healthy: served: unit absent" in [line.rstrip() for line in lines]
    assert lines[-2].startswith("specfleet status: unhealthy (exit 5)")
    assert lines[-1].startswith("log: ")
    assert not any(line.startswith("==") for line in lines), "no progress with --quiet"


# ----------------------------------------------------------------- a checkout of its own
SITE = """\
- name: Converge
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
    - name: Show the job's progress
      ansible.builtin.debug:
        msg: "[4/6] train: step 60/120, loss 1.9, 800 tok/s, ETA 60 s - training"
    - name: Break on the second host
      ansible.builtin.fail:
        msg: the disk is full
      when: inventory_hostname == 'second'
"""
SLEEP = """\
- name: Wait
  hosts: all
  gather_facts: false
  tasks:
    - name: Sleep for a long time
      ansible.builtin.command: sleep 61.37
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "playbooks").mkdir(parents=True)
    (root / "ansible.cfg").write_text("[defaults]\nstdout_callback = ansible.builtin.default\n")
    (root / "playbooks" / "site.yml").write_text(SITE)
    (root / "playbooks" / "train_drafter.yml").write_text(SLEEP)
    return root


def test_a_failed_host_is_exit_3_with_its_task_and_message(tmp_path: Path, checkout: Path) -> None:
    inventory = write_inventory(
        tmp_path / "hosts.yml", {"first": local_host(), "second": local_host()}
    )
    run = specfleet(
        "provision", "-i", str(inventory), "--json", cache=tmp_path / "cache", root=checkout
    )
    doc = json.loads(run.stdout)
    assert run.returncode == 3 and doc["result"] == "failed"
    assert doc["failed_hosts"] == ["second"]
    assert doc["failed_tasks"] == [
        {
            "playbook": "site.yml",
            "host": "second",
            "role": None,
            "task": "Break on the second host",
            "message": "the disk is full",
            "unreachable": False,
        }
    ]
    assert doc["hosts"]["first"]["changed"] == 1 and doc["hosts"]["first"]["failed"] == 0


def test_piped_output_is_plain_lines_and_ends_with_the_log(tmp_path: Path, checkout: Path) -> None:
    inventory = write_inventory(
        tmp_path / "hosts.yml", {"first": local_host(), "second": local_host()}
    )
    run = specfleet("provision", "-i", str(inventory), cache=tmp_path / "cache", root=checkout)
    assert run.returncode == 3, run.stdout + run.stderr
    lines = run.stdout.rstrip("\n").splitlines()
    assert "\x1b" not in run.stdout
    assert lines[0] == "== site.yml: Converge"
    assert "first: changed: Change something" in lines
    assert "second: FAILED: Break on the second host: the disk is full" in lines
    assert "FAILED second: Break on the second host" in lines
    assert "first: [4/6] train: step 60/120, loss 1.9, 800 tok/s, ETA 60 s - training" in lines
    log = Path(lines[-1].removeprefix("log: "))
    assert log.is_file() and log.parent == tmp_path / "cache" / "logs"
    text = log.read_text()
    assert "TASK [Change something]" in text and "PLAY RECAP" in text


@pytest.fixture
def checkout_passing(checkout: Path) -> Path:
    site = checkout / "playbooks" / "site.yml"
    site.write_text(site.read_text().replace("== 'second'", "== 'nobody'"))
    return checkout


def test_a_clean_run_is_exit_0(tmp_path: Path, checkout_passing: Path) -> None:
    inventory = write_inventory(tmp_path / "hosts.yml", {"first": local_host()})
    run = specfleet(
        "provision", "-i", str(inventory), "--quiet", cache=tmp_path / "cache",
        root=checkout_passing,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-2].startswith("specfleet provision: ok (exit 0)")
    # --quiet: the recap table and the two last lines, no progress.
    assert "first: changed" not in run.stdout


def test_an_inventory_ansible_cannot_parse_is_exit_2(tmp_path: Path, checkout: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: [unbalanced\n")
    run = specfleet(
        "provision", "-i", str(inventory), "--json", cache=tmp_path / "cache", root=checkout
    )
    doc = json.loads(run.stdout)
    assert run.returncode == 2 and doc["result"] == "bad_input"
    # "Completely failed to parse inventory source <path>" (ansible-core 2.19).
    assert "parse inventory source" in doc["error"] and str(inventory) in doc["error"]
    assert doc["hosts"] == {} and doc["runs"][0]["ansible_rc"] == 1


def test_ctrl_c_stops_ansible_and_is_exit_130(tmp_path: Path, checkout: Path) -> None:
    inventory = write_inventory(tmp_path / "hosts.yml", {"first": local_host()})
    env = {
        **os.environ,
        "SPECFLEET_CACHE": str(tmp_path / "cache"),
        "SPECFLEET_ROOT": str(checkout),
        "PYTHONPATH": str(ROOT / "src"),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "specfleet.controller.cli", "train", "-i", str(inventory), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not _sleeping():
        assert time.monotonic() < deadline, "the sleep task never started"
        assert process.poll() is None, process.communicate()
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    doc = json.loads(out)
    assert process.returncode == 130, err
    assert doc["result"] == "interrupted"
    # 99: ansible-playbook stopped on the SIGINT ("User interrupted execution");
    # 254: ansible-runner had to kill it.
    assert doc["runs"][0]["ansible_rc"] == 99, doc
    time.sleep(1)
    assert not _sleeping(), "ansible-playbook's task outlived the interruption"


def _sleeping() -> bool:
    found = subprocess.run(["pgrep", "-f", "sleep 61.37"], capture_output=True, check=False)
    return found.returncode == 0


def test_the_workers_groups_are_found_from_proc(tmp_path: Path) -> None:
    # ansible-playbook (100, group 100) and two workers that called setsid() (groups 101,
    # 102); 103 is a child in ansible-playbook's own group, 200 someone else's process.
    for pid, ppid, pgid in ((100, 1, 100), (101, 100, 101), (102, 100, 102), (103, 100, 100),
                            (200, 1, 200)):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (ansible (x)) S {ppid} {pgid} {pgid} 0")
    (tmp_path / "self").mkdir()
    assert child_groups(100, proc=tmp_path) == {101, 102}


# ----------------------------------------------------------------- lab up's tour
class FakeServing(http.server.BaseHTTPRequestHandler):
    """/metrics and /v1/completions like vLLM: each completion drafts 4 times."""

    counters: ClassVar[dict[str, int]] = {"drafts": 40, "draft_tokens": 120, "accepted": 70}

    def do_GET(self) -> None:
        c = self.counters
        text = (
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {c["drafts"]}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {c["draft_tokens"]}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {c["accepted"]}\n'
        )
        self.send_response(200 if self.path == "/metrics" else 404)
        self.end_headers()
        self.wfile.write(text.encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != "Bearer lab-key" or body["model"] != "tiny":
            self.send_response(401)
            self.end_headers()
            return
        for name, n in (("drafts", 4), ("draft_tokens", 12), ("accepted", 7)):
            self.counters[name] += n
        answer = {"choices": [{"text": " checks the output."}], "usage": {"completion_tokens": 16}}
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.mark.parametrize("through_balancer", [False, True], ids=["direct", "balancer"])
def test_lab_up_sends_a_completion_and_reads_the_counters_it_moved(
    tmp_path: Path, through_balancer: bool
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeServing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    inventory = write_inventory(
        tmp_path / "hosts.yml",
        {
            # An SSH address: the containers are named after the inventory hosts.
            "lab-x": {"ansible_host": "192.0.2.7", "specfleet_server_api_key": "lab-key"},
            # The front door's client key (the fake server checks the same value).
            "lb": {"lab_client_api_key": "lab-key"},
        },
    )
    status = {
        "servers": {
            "lab-x": {
                "reachable": True,
                "health": "ok",
                "endpoint": url,
                "model": "tiny",
                "drafter": "9f86d081884c",
                "stack": {"python": sys.executable, "pythonpath": str(ROOT / "src")},
            }
        },
        "loadbalancer": {
            "host": "lb",
            "reachable": True,
            "port": server.server_address[1],
            "tls": False,
            "address": "127.0.0.1",
        }
        if through_balancer
        else None,
    }
    containers: list[str] = []

    def here(container: str, argv: list[str], stdin: str, timeout: float) -> str:
        # `docker exec` runs argv in the lab host's container; this machine stands in for it.
        containers.append(container)
        run = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert run.returncode == 0, run.stderr
        return run.stdout

    leftovers = set(Path(tempfile.gettempdir()).glob(".ansible-runner-*"))
    try:
        lab = tour(RunOptions(inventories=(str(inventory),)), status, exec_in=here)
    finally:
        server.shutdown()
    # ansible-inventory's output holds the API key: no copy of it is left behind.
    assert set(Path(tempfile.gettempdir()).glob(".ansible-runner-*")) == leftovers
    completion = lab["completion"]
    assert completion == {
        "via": "lb" if through_balancer else "lab-x",
        "url": url,
        "model": "tiny",
        "prompt": completion["prompt"],
        "text": " checks the output.",
        "completion_tokens": 16,
        "drafts": 4,
        "draft_tokens": 12,
        "accepted_tokens": 7,
        "mean_acceptance_length": 2.75,
        "curl": completion["curl"],
    }
    # Counters read in the server's container; the request sent from here to the door (a
    # line to paste says the same), or from inside the server's container without one.
    assert containers == (["lab-x", "lab-x"] if through_balancer else ["lab-x"] * 3)
    if through_balancer:
        words = shlex.split(completion["curl"])
        assert words[:3] == ["curl", "-sk", f"{url}/v1/completions"]
        assert "Authorization: Bearer lab-key" in words
    else:
        assert completion["curl"] is None
    assert lab["servers"] == [
        {"host": "lab-x", "endpoint": url, "model": "tiny", "drafter": "9f86d081884c",
         "health": "ok"}
    ]  # fmt: skip


VAULTED = """\
- name: Use a vaulted value
  hosts: all
  gather_facts: false
  tasks:
    - name: Check the secret
      ansible.builtin.assert:
        that: secret_value == 'hello-secret'
"""


def test_ask_vault_pass_answers_ansible_playbooks_prompt(tmp_path: Path, checkout: Path) -> None:
    # What --ask-vault-pass does after asking the operator: ansible-playbook prompts
    # "Vault password:" on its terminal and ansible-runner answers it.
    password_file = tmp_path / "password"
    password_file.write_text("pw123\n")
    vaulted = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-vault"), "encrypt_string", "hello-secret",
         "--name", "secret_value", "--vault-password-file", str(password_file)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (tmp_path / "secret.yml").write_text(vaulted)
    (checkout / "playbooks" / "site.yml").write_text(VAULTED)
    inventory = write_inventory(tmp_path / "hosts.yml", {"first": local_host()})
    results = {}
    for password in ("pw123", "wrong"):
        options = RunOptions(
            inventories=(str(inventory),),
            extra_vars=(f"@{tmp_path}/secret.yml",),
            ask_vault_pass=True,
            vault_password=password,
        )
        env = {"SPECFLEET_ROOT": str(checkout), "SPECFLEET_CACHE": str(tmp_path / "cache")}
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            with Session("provision", options) as session:
                results[password] = session.run("site.yml")
    assert results["pw123"].ok, results["pw123"]
    assert results["wrong"].failed_hosts == ("first",)
    assert "Decryption failed" in results["wrong"].failures[0].message
