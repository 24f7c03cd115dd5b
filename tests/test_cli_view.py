"""What a person sees: the live table, the plain lines, the training bar, the status table and
the summary whose last line names the log, rendered by rich into text."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from specfleet.controller.events import HostTally, PlayResult, TaskFailure
from specfleet.controller.progress_view import (
    TRAINING_TASK,
    FleetState,
    LiveView,
    PlainView,
    SilentView,
    make_view,
    parse_training_line,
)
from specfleet.controller.report import render_outcome
from specfleet.controller.status import fleet_status, status_table
from specfleet.controller.summary import ExitCode, Outcome


def ev(event: str, /, **data: Any) -> dict[str, Any]:
    return {"event": event, "event_data": data, "stdout": ""}


def console(width: int = 140) -> Console:
    return Console(file=io.StringIO(), record=True, width=width, color_system=None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SITE = [
    ev("playbook_on_start", playbook="/repo/playbooks/site.yml"),
    ev("playbook_on_play_start", name="Host stack (driver and CUDA, torch and vLLM)"),
    ev("runner_on_start", host="gpu-01", task="Create the service account", role="common"),
    ev(
        "runner_on_ok",
        host="gpu-01",
        task="Create the service account",
        role="common",
        res={"changed": True},
    ),
    ev("runner_on_start", host="gpu-01", task="Install the stack venv", role="ml_stack"),
    ev("runner_on_start", host="gpu-02", task="Create the service account", role="common"),
    ev(
        "runner_on_failed",
        host="gpu-02",
        task="Create the service account",
        role="common",
        res={"msg": "useradd: cannot lock /etc/passwd"},
    ),
]


def test_the_live_table_shows_each_hosts_role_task_counts_and_time() -> None:
    clock = Clock()
    state = FleetState(clock=clock)
    for event in SITE:
        state.update(event)
    clock.now += 75
    out = console()
    out.print(state.table())
    text = out.export_text()
    assert "site.yml: Host stack (driver and CUDA, torch and vLLM)  (1:15)" in text
    gpu01 = next(line for line in text.splitlines() if line.startswith("gpu-01"))
    assert gpu01.split() == [
        "gpu-01",
        "ml_stack",
        "Install",
        "the",
        "stack",
        "venv",
        "1",
        "1",
        "0",
        "0",
        "1:15",
    ]
    gpu02 = next(line for line in text.splitlines() if line.startswith("gpu-02"))
    assert gpu02.split()[-5:] == ["0", "0", "1", "0", "1:15"]


def test_the_live_view_prints_plays_and_failures_above_the_table() -> None:
    out = console()
    view = LiveView(out)
    for event in SITE:
        view(event)
    out.print(view)
    text = out.export_text()
    assert "== site.yml: Host stack (driver and CUDA, torch and vLLM)" in text
    assert "gpu-02: FAILED: common : Create the service account: useradd: cannot lock" in text
    # Roles and changes are in the table, not printed line by line.
    assert "gpu-01: changed" not in text


def test_plain_lines_when_stdout_is_not_a_terminal() -> None:
    out = console()
    view = make_view(out, quiet=False, machine=False)
    assert isinstance(view, PlainView)
    with view:
        for event in SITE:
            view(event)
    assert out.export_text().splitlines() == [
        "== site.yml: Host stack (driver and CUDA, torch and vLLM)",
        "gpu-01: common",
        "gpu-01: changed: common : Create the service account",
        "gpu-01: ml_stack",
        "gpu-02: common",
        "gpu-02: FAILED: common : Create the service account: useradd: cannot lock /etc/passwd",
    ]
    # No cursor movement or colour: fit for a CI log.
    assert "\x1b" not in out.file.getvalue()  # type: ignore[attr-defined]


def test_quiet_and_json_draw_nothing() -> None:
    out = console()
    for quiet, machine in ((True, False), (False, True)):
        view = make_view(out, quiet=quiet, machine=machine)
        assert isinstance(view, SilentView)
        with view:
            for event in SITE:
                view(event)
    assert out.export_text() == ""


def progress(msg: str) -> dict[str, Any]:
    return ev(
        "runner_on_ok",
        host="gpu-01",
        task=TRAINING_TASK,
        role="drafter_training",
        res={"msg": msg, "changed": False},
    )


def test_training_progress_lines_are_parsed() -> None:
    line = parse_training_line(
        "[4/6] train: step 40/120, loss 1.2e-05, 812 tok/s, ETA 95 s - training the drafter"
    )
    assert line is not None
    assert (line.stage, line.index, line.stages) == ("train", "4", 6)
    assert (line.step, line.total) == (40, 120)
    assert line.detail == "loss 1.2e-05, 812 tok/s, ETA 95 s"
    assert line.message == "training the drafter"
    stage = parse_training_line("[1/6] responses - generating on-policy responses")
    assert stage is not None and stage.total is None and stage.stage == "responses"
    assert parse_training_line("starting (activating)") is None


def test_training_steps_draw_a_bar() -> None:
    out = console()
    view = LiveView(out)
    view(progress("[1/6] responses - generating on-policy responses"))
    view(progress("[4/6] train: step 30/120, loss 2.31, 812 tok/s, ETA 95 s - training"))
    view(progress("[4/6] train: step 60/120, loss 1.90, 820 tok/s, ETA 60 s - training"))
    out.print(view)
    text = out.export_text()
    # A stage without steps is a line; a stage with steps is a bar, not a line per poll.
    assert "gpu-01: [1/6] responses - generating on-policy responses" in text
    assert "gpu-01: [4/6] train: step" not in text
    bar = next(line for line in text.splitlines() if "[4/6] train" in line)
    assert "60/120" in bar and "loss 1.90, 820 tok/s, ETA 60 s" in bar
    view(progress("[5/6] evaluate: step 1/4 - measuring acceptance"))
    out.print(view)
    text = out.export_text()
    assert any("[4/6] train" in line and "120/120" in line for line in text.splitlines())
    assert any("[5/6] evaluate" in line and "1/4" in line for line in text.splitlines())


def test_the_last_training_line_stays_when_the_live_display_ends() -> None:
    out = console()
    with LiveView(out) as view:
        view(progress("[4/6] train: step 120/120, loss 1.10, 820 tok/s, ETA 0 s - trained"))
    assert out.export_text().splitlines()[-1] == (
        "gpu-01: [4/6] train: step 120/120, loss 1.10, 820 tok/s, ETA 0 s - trained"
    )


STATUS_DATA = {
    "specfleet_fleet": {"servers": ["gpu-01", "gpu-02", "gpu-03"], "balancer": "lb-01"},
    "specfleet_status": {
        "gpu-01": {
            "endpoint": "http://10.0.0.1:8000",
            "model": "llama",
            "stack": {"lock": "cuda", "hash": "0123456789abcdef", "vllm": "0.32.0"},
            "whitelist": {"shape": "list", "entries": ["llama", "qwen"], "vllm": "0.32.0"},
            "preflight": {"verdict": "ok", "vllm": "0.32.0", "unverified": ["provenance"]},
            "drafter": "9f86d081884c7d659a2f",
            "unit": {"active": "active", "sub": "running", "main_pid": 4242, "restarts": 0},
            "health": "ok",
            "acceptance": {"drafts": 120, "accepted_tokens": 210, "mean_acceptance_length": 2.75},
        },
        "gpu-02": {
            "endpoint": "http://10.0.0.2:8000",
            "model": "llama",
            "stack": "absent",
            "whitelist": "absent",
            "drafter": "absent",
            "unit": "absent",
            "health": "absent",
            "acceptance": "absent",
        },
    },
    "specfleet_loadbalancer": {
        "host": "lb-01",
        "port": 8080,
        "tls": True,
        "backends": {"gpu-01": {"status": "UP", "sessions": 2, "queued": 0}},
    },
}


def status_result() -> PlayResult:
    return PlayResult(
        playbook="status.yml",
        rc=4,
        status="failed",
        hosts={
            "gpu-01": HostTally(ok=9),
            "gpu-02": HostTally(ok=9),
            "gpu-03": HostTally(ok=1, unreachable=1),
            "lb-01": HostTally(ok=2),
        },
        data=STATUS_DATA,
    )


def test_status_rows_map_the_balancers_view_by_inventory_name() -> None:
    status = fleet_status(status_result())
    assert list(status["servers"]) == ["gpu-01", "gpu-02", "gpu-03"]
    assert status["servers"]["gpu-01"]["loadbalancer"] == {
        "status": "UP",
        "sessions": 2,
        "queued": 0,
    }
    assert status["servers"]["gpu-02"]["loadbalancer"] == "absent"
    assert status["servers"]["gpu-03"] == {
        "reachable": False,
        "error": "unreachable",
        "loadbalancer": "absent",
    }
    assert status["loadbalancer"] == {"host": "lb-01", "reachable": True, "port": 8080, "tls": True}


def test_the_status_table() -> None:
    out = console(width=240)
    out.print(status_table(fleet_status(status_result())))
    text = out.export_text()
    gpu01 = next(line for line in text.splitlines() if "gpu-01" in line)
    for cell in (
        "cuda 0123456789ab · vLLM 0.32.0",
        "ok (unverified: provenance) ·",
        "9f86d081884c",
        "active/running pid 4242, 0 restarts",
        "ok",
        "2.75 since start (120 drafts)",
        "UP, 2 sessions, 0 queued",
    ):
        assert cell in gpu01
    assert "whitelist list, 2 entries" in text  # the EAGLE-3 cell's second line
    gpu02 = next(line for line in text.splitlines() if "gpu-02" in line)
    assert gpu02.count("absent") == 7
    assert "unreachable" in next(line for line in text.splitlines() if "gpu-03" in line)
    assert "balancer (lb-01)" in text


def test_status_without_a_balancer_has_no_balancer_column() -> None:
    data = {key: value for key, value in STATUS_DATA.items() if key != "specfleet_loadbalancer"}
    data["specfleet_fleet"] = {"servers": ["gpu-01"], "balancer": None}
    result = PlayResult(playbook="status.yml", rc=0, hosts={"gpu-01": HostTally(ok=9)}, data=data)
    status = fleet_status(result)
    assert status["loadbalancer"] is None
    assert "loadbalancer" not in status["servers"]["gpu-01"]
    out = console(width=200)
    out.print(status_table(status))
    assert "balancer" not in out.export_text()


def test_the_summary_names_failures_and_ends_with_the_log() -> None:
    failure = TaskFailure(
        "site.yml",
        "gpu-02",
        "Run the health gate",
        "vllm_server",
        "vllm_server health gate failed at health\njournal line",
    )
    result = PlayResult(
        playbook="site.yml",
        rc=2,
        status="failed",
        hosts={"gpu-01": HostTally(ok=40, changed=3), "gpu-02": HostTally(ok=30, failed=1)},
        failures=(failure,),
    )
    log = Path("/root/.cache/specfleet/logs/provision-20260101-120000.log")
    out = console()
    render_outcome(out, Outcome("provision", [result], ExitCode.FAILED, 200.0, log))
    lines = out.export_text().rstrip("\n").splitlines()
    assert lines[-1] == f"log: {log}"
    assert lines[-2] == "specfleet provision: failed (exit 3) in 200 s"
    assert "FAILED gpu-02: vllm_server : Run the health gate" in lines
    assert "    journal line" in lines
    assert any(line.split() == ["gpu-01", "40", "3", "0", "0", "0"] for line in lines)


def test_the_lab_summary_says_what_the_user_now_has() -> None:
    lab = {
        "servers": [
            {
                "host": "gpu-lab-01",
                "endpoint": "http://127.0.0.1:8000",
                "model": "tiny",
                "drafter": "ab12cd34ef56aa",
                "health": "ok",
            },
        ],
        "completion": {
            "via": "gpu-lab-01",
            "url": "http://127.0.0.1:8000",
            "model": "tiny",
            "prompt": "A speculative decoder",
            "text": " drafts tokens",
            "completion_tokens": 32,
            "drafts": 12,
            "draft_tokens": 36,
            "accepted_tokens": 20,
            "mean_acceptance_length": 2.667,
        },
        "next": ["specfleet status", "specfleet train"],
    }
    out = console()
    log = Path("/tmp/lab-up.log")
    render_outcome(out, Outcome("lab-up", [], ExitCode.OK, 30.0, log, details={"lab": lab}))
    text = out.export_text()
    assert "gpu-lab-01: http://127.0.0.1:8000 (inside the container), model tiny" in text
    assert "drafter ab12cd34ef56" in text
    assert "A completion through gpu-lab-01" in text
    assert "12 drafts, 36 draft tokens, 20 accepted (mean acceptance length 2.667)" in text
    assert "specfleet status" in text and "specfleet train" in text
    assert text.rstrip("\n").splitlines()[-1] == f"log: {log}"


def test_the_next_commands_carry_the_labs_own_inventory() -> None:
    """A lab brought up with -i (inventory/lab-smollm2) is driven with the same -i."""
    from specfleet.controller.lab_tour import tour
    from specfleet.controller.runopts import RunOptions

    default = tour(RunOptions(), {"servers": {}})
    assert default["next"][:2] == ["specfleet status", "specfleet train"]
    smollm2 = tour(RunOptions(inventories=("inventory/lab-smollm2",)), {"servers": {}})
    assert smollm2["next"] == [
        "specfleet status -i inventory/lab-smollm2",
        "specfleet train -i inventory/lab-smollm2",
        "specfleet lab down -i inventory/lab-smollm2",
    ]
