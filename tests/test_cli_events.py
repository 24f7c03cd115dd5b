"""From ansible-runner's events to what scripts read: per-host counters, failed tasks, the exit
code and the --json document.

The events are small dicts shaped like the ones ansible-runner 2.4 hands its event_handler
(recorded from a real run: `event`, `event_data` with host, task, role and the module's
`res`, `stdout`); they are data, not a stand-in for anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specfleet.controller.events import PlayResult, Recorder
from specfleet.controller.summary import ExitCode, Outcome, document, exit_code


def ev(event: str, /, **data: Any) -> dict[str, Any]:
    stdout = data.pop("stdout", "")
    return {"event": event, "event_data": data, "stdout": stdout, "uuid": "u", "counter": 1}


def task(event: str, host: str, name: str, role: str | None = None, **res: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"host": host, "task": name, "playbook": "site.yml"}
    if role:
        data["role"] = role
    if event == "runner_on_failed":
        data["ignore_errors"] = res.pop("ignore_errors", None)
    return ev(event, **data, res=res)


def stats(**counters: dict[str, int]) -> dict[str, Any]:
    keys = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
    return ev(
        "playbook_on_stats",
        **{key: counters.get(key, {}) for key in keys},
        artifact_data=counters.get("artifact_data", {}),
    )


def fold(events: list[dict[str, Any]], rc: int = 0, status: str = "successful") -> PlayResult:
    recorder = Recorder("site.yml")
    for event in events:
        recorder.add(event)
    return recorder.result(rc=rc, status=status, seconds=12.34)


PLAY = ev("playbook_on_play_start", name="Host stack", play="Host stack")


def test_a_clean_run_counts_as_the_recap_does() -> None:
    result = fold(
        [
            PLAY,
            task("runner_on_ok", "gpu-01", "Create the account", "common", changed=True),
            task("runner_on_ok", "gpu-01", "Layout", "common", changed=False),
            task("runner_on_skipped", "gpu-01", "Driver", "nvidia_gpu"),
            stats(ok={"gpu-01": 2}, changed={"gpu-01": 1}, skipped={"gpu-01": 1}),
        ]
    )
    assert result.ok
    assert result.hosts["gpu-01"].as_dict() == {
        "ok": 2,
        "changed": 1,
        "failed": 0,
        "unreachable": 0,
        "skipped": 1,
        "rescued": 0,
        "ignored": 0,
    }
    assert result.total_changed == 1
    assert exit_code([result]) == ExitCode.OK


def test_a_failed_task_is_named_with_its_host_role_and_message() -> None:
    result = fold(
        [
            PLAY,
            task(
                "runner_on_failed",
                "gpu-02",
                "Run the health gate",
                "vllm_server",
                msg=["vllm_server health gate failed at health: no 200", "unit: {}"],
            ),
            task("runner_on_ok", "gpu-01", "Run the health gate", "vllm_server"),
            stats(ok={"gpu-01": 1}, failures={"gpu-02": 1}),
        ],
        rc=2,
        status="failed",
    )
    assert result.failed_hosts == ("gpu-02",)
    (failure,) = result.failures
    assert (failure.host, failure.role, failure.task) == (
        "gpu-02",
        "vllm_server",
        "Run the health gate",
    )
    assert failure.message == "vllm_server health gate failed at health: no 200\nunit: {}"
    assert exit_code([result]) == ExitCode.FAILED


def test_ignored_and_rescued_failures_are_not_failures() -> None:
    result = fold(
        [
            PLAY,
            task("runner_on_failed", "gpu-01", "Probe", ignore_errors=True, msg="ignored"),
            task("runner_on_failed", "gpu-01", "In a block", msg="rescued later"),
            stats(ok={"gpu-01": 2}, ignored={"gpu-01": 1}, rescued={"gpu-01": 1}),
        ]
    )
    assert result.failures == ()
    assert result.failed_hosts == ()
    assert exit_code([result]) == ExitCode.OK


def test_no_log_output_stays_hidden_in_the_failure() -> None:
    secret = {"censored": "the output has been hidden due to the fact that 'no_log: true'"}
    result = fold([PLAY, task("runner_on_failed", "gpu-01", "Write the key", **secret)], rc=2)
    assert result.failures[0].message == secret["censored"]


def test_unreachable_hosts_have_their_own_code() -> None:
    message = "Failed to create temporary directory. No such container: gpu-ghost"
    result = fold(
        [
            PLAY,
            task("runner_on_unreachable", "gpu-ghost", "Read the stack manifest", msg=message),
            task("runner_on_ok", "gpu-01", "Read the stack manifest"),
            stats(ok={"gpu-01": 1}, dark={"gpu-ghost": 1}),
        ],
        rc=4,
        status="failed",
    )
    assert result.unreachable_hosts == ("gpu-ghost",)
    assert result.failures[0].unreachable
    assert result.failures[0].message == message
    assert exit_code([result]) == ExitCode.UNREACHABLE


def test_a_failed_host_wins_over_an_unreachable_one() -> None:
    result = fold(
        [
            PLAY,
            task("runner_on_unreachable", "gpu-ghost", "Read", msg="gone"),
            task("runner_on_failed", "gpu-01", "Read", msg="broken"),
            stats(dark={"gpu-ghost": 1}, failures={"gpu-01": 1}),
        ],
        rc=2,
    )
    assert exit_code([result]) == ExitCode.FAILED


def test_an_inventory_ansible_cannot_parse_is_bad_input() -> None:
    # ANSIBLE_INVENTORY_UNPARSED_FAILED: ansible-playbook stops before any play, rc 1.
    warning = "[WARNING]: Unable to parse /tmp/x/hosts.yml as an inventory source"
    error = "[ERROR]: No inventory was parsed, please check your configuration and options."
    result = fold(
        [ev("verbose", stdout=warning), ev("verbose", stdout=error)],
        rc=1,
        status="failed",
    )
    assert result.refused
    assert result.errors == (
        "Unable to parse /tmp/x/hosts.yml as an inventory source",
        "No inventory was parsed, please check your configuration and options.",
    )
    assert exit_code([result]) == ExitCode.BAD_INPUT


def test_an_error_after_a_play_started_is_an_error() -> None:
    error = ev("verbose", stdout="ERROR! 'drafter_trainers' is undefined")
    result = fold([PLAY, error], rc=1, status="failed")
    assert not result.refused
    assert exit_code([result]) == ExitCode.ERROR


@pytest.mark.parametrize(
    ("rc", "status"), [(254, "canceled"), (99, "failed")], ids=["runner-cancel", "ansible-sigint"]
)
def test_an_interrupted_run_is_interrupted(rc: int, status: str) -> None:
    result = fold([PLAY, task("runner_on_failed", "gpu-01", "x", msg="killed")], rc, status)
    assert exit_code([result]) == ExitCode.INTERRUPTED
    assert exit_code([fold([PLAY])], interrupted=True) == ExitCode.INTERRUPTED


def test_the_exit_codes_are_distinct() -> None:
    assert len({int(code) for code in ExitCode}) == len(ExitCode)


def test_the_json_document_sums_hosts_over_the_commands_playbooks() -> None:
    lab = Recorder("lab.yml")
    for event in [
        PLAY,
        task("runner_on_ok", "localhost", "Run each lab host", changed=True),
        stats(ok={"localhost": 1, "gpu-01": 1}, changed={"localhost": 1}),
    ]:
        lab.add(event)
    site = fold(
        [
            PLAY,
            task("runner_on_failed", "gpu-01", "Install", "ml_stack", msg="pip failed"),
            stats(ok={"gpu-01": 7}, changed={"gpu-01": 3}, failures={"gpu-01": 1}),
        ],
        rc=2,
        status="failed",
    )
    results = [lab.result(0, "successful", 3.0), site]
    outcome = Outcome(
        command="lab-up",
        results=results,
        code=exit_code(results),
        seconds=65.43,
        log=Path("/var/log/x/lab-up-20260101-120000.log"),
        details={"status": {"servers": {}}},
    )
    doc = json.loads(json.dumps(document(outcome)))
    assert doc["command"] == "lab-up"
    assert doc["playbooks"] == ["lab.yml", "site.yml"]
    assert doc["rc"] == 3 and doc["result"] == "failed"
    assert doc["duration_s"] == 65.4
    assert doc["log"] == "/var/log/x/lab-up-20260101-120000.log"
    assert doc["hosts"]["gpu-01"] == {
        "ok": 8,
        "changed": 3,
        "failed": 1,
        "unreachable": 0,
        "skipped": 0,
        "rescued": 0,
        "ignored": 0,
    }
    assert doc["hosts"]["localhost"]["changed"] == 1
    assert doc["failed_hosts"] == ["gpu-01"] and doc["unreachable_hosts"] == []
    assert doc["failed_tasks"] == [
        {
            "playbook": "site.yml",
            "host": "gpu-01",
            "role": "ml_stack",
            "task": "Install",
            "message": "pip failed",
            "unreachable": False,
        }
    ]
    assert [run["playbook"] for run in doc["runs"]] == ["lab.yml", "site.yml"]
    assert doc["runs"][1] == {
        "playbook": "site.yml",
        "ansible_rc": 2,
        "status": "failed",
        "duration_s": 12.3,
    }
    assert doc["status"] == {"servers": {}}
    assert doc["error"] is None


def test_set_stats_data_reaches_the_result() -> None:
    rows = {"specfleet_status": {"gpu-01": {"health": "ok"}}}
    result = fold([PLAY, stats(ok={"gpu-01": 1}, artifact_data=rows)])
    assert result.data == rows


def test_without_a_recap_the_live_counts_stand() -> None:
    # A run killed before its recap still says what it did so far.
    result = fold(
        [PLAY, task("runner_on_ok", "gpu-01", "Create", "common", changed=True)],
        rc=254,
        status="canceled",
    )
    assert result.hosts["gpu-01"].changed == 1
    assert result.hosts["gpu-01"].ok == 1, "a change is also an ok, as in the recap"
