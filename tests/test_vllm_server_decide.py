"""Role vllm_server's restart decision (tasks/decide.yml), run by Ansible on what
validate.yml's read and install.yml's write would have returned: the record says what the
server was given, its processes what it runs, and either can call for a restart."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import ROOT, json_result, role_vars_files

DECIDE = ROOT / "roles" / "vllm_server" / "tasks" / "decide.yml"
VENVS = "/opt/specfleet/venvs"
UNIT = "specfleet-vllm.service"
HEALTH = "http://127.0.0.1:8000/health"
SERVED = "/etc/specfleet/specfleet-vllm.served-sha1"
FILES = [
    "/etc/systemd/system/specfleet-vllm.service",
    "/etc/specfleet/specfleet-vllm.env",
    "/etc/specfleet/specfleet-vllm.api-key",
    "/opt/specfleet/bin/vllm-server-shm-clean",
    "/opt/specfleet/bin/vllm-server-stop",
    "/etc/specfleet/stack.json",
    "/etc/specfleet/eagle3-whitelist.json",
    "/etc/specfleet/eagle3-preflight.json",
]


def host(**change: Any) -> dict[str, Any]:
    """What validate.yml's read finds on a server that serves what it must: venv aaaa,
    started at 2000 after its files changed at 1000, answering /health."""
    found: dict[str, Any] = {
        "read": {"/etc/specfleet/stack.json": json.dumps({"venv": f"{VENVS}/aaaa"}), SERVED: None},
        "paths": {path: {"mtime": 1000.0} for path in FILES}
        | {"/opt/specfleet/lib/current": {"islink": False}},
        "checksums": {path: "c" for path in FILES},
        "folder_checksums": [],
        "units": {UNIT: {"ActiveState": "active", "MainPID": "42"}},
        "processes": {UNIT: {"main_pid": 42, "started": 2000.0, "from": {VENVS: ["aaaa"]}}},
        "urls": {HEALTH: 200},
    }
    for key, value in change.items():
        found[key] = found[key] | value
    return found


def decide(ansible, found: dict[str, Any], record_matches: bool = True, **extra: Any):
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("vllm_server", profile=False),
        "vars": {
            "specfleet_accelerator": "cpu",
            "__vllm_server_host": found,
            "__vllm_server_installed": {"checksums": {path: "c" for path in FILES}},
        },
        "tasks": [
            {"ansible.builtin.import_tasks": str(DECIDE)},
            {
                "name": "Write the record, then decide again as a run after a passed gate",
                "ansible.builtin.set_fact": {
                    "__vllm_server_host": "{{ __vllm_server_host | combine({'read': "
                    "__vllm_server_host.read | combine({'"
                    + SERVED
                    + "': __vllm_server_record})}) }}"
                },
                "when": record_matches,
            },
            {"ansible.builtin.import_tasks": str(DECIDE), "when": record_matches},
            {"ansible.builtin.debug": {"var": "vllm_server_restart_reasons"}},
        ],
    }
    result = ansible.playbook([play], extra, json_output=True)
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = json_result(result)["plays"][0]["tasks"]
    reasons: list[str] = tasks[-1]["hosts"]["localhost"]["vllm_server_restart_reasons"]
    return reasons


def test_a_server_that_runs_what_it_must_is_left_alone(ansible):
    assert decide(ansible, host()) == []


def test_no_record_of_a_passed_gate_restarts(ansible):
    assert decide(ansible, host(), record_matches=False) == [
        "what it runs differs from the record of its last passed gate"
    ]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        # A restart systemd made on its own while `current` moved: files of both venvs.
        (
            {
                "processes": {
                    UNIT: {"main_pid": 42, "started": 2000.0, "from": {VENVS: ["aaaa", "bbbb"]}}
                }
            },
            "its processes run code from aaaa, bbbb, not only from aaaa",
        ),
        # The records were restored by a rollback, the process is the new venv's.
        (
            {"processes": {UNIT: {"main_pid": 42, "started": 2000.0, "from": {VENVS: ["bbbb"]}}}},
            "its processes run code from bbbb, not only from aaaa",
        ),
        (
            {"paths": {"/etc/specfleet/eagle3-whitelist.json": {"mtime": 2500.0}}},
            "it started before its files last changed",
        ),
        # The model built anew at the same path (its files had changed in place).
        (
            {"paths": {"/var/lib/specfleet/models/target/config.json": {"mtime": 2500.0}}},
            "it started before its files last changed",
        ),
        # Its venv was built anew under it (site.yml's fast path found its files changed in
        # place; the store's archive keeps the files' times): what it runs is gone from disk.
        (
            {
                "processes": {
                    UNIT: {
                        "main_pid": 42,
                        "started": 2000.0,
                        "from": {VENVS: ["aaaa"]},
                        "deleted": {VENVS: 12},
                    }
                }
            },
            "12 files its processes run are gone from disk (its venv was built anew)",
        ),
        ({"urls": {HEALTH: 503}}, "it does not answer /health (503)"),
        ({"urls": {HEALTH: None}}, "it does not answer /health (no answer)"),
    ],
)
def test_a_server_whose_processes_do_not_run_what_they_must_restarts(ansible, change, reason):
    assert decide(ansible, host(**change)) == [reason]


def test_a_stopped_server_is_left_to_start_yml(ansible):
    stopped = host(
        units={UNIT: {"ActiveState": "failed", "MainPID": "0"}},
        processes={UNIT: {"main_pid": 0, "started": None, "from": {VENVS: []}}},
        urls={HEALTH: None},
    )
    assert decide(ansible, stopped) == []


def test_a_rollback_forces_the_restart(ansible):
    assert decide(ansible, host(), vllm_server_restart_forced=True) == [
        "a restart is forced (vllm_server_restart_forced)"
    ]
