"""`specfleet status` judges the fleet: exit 5 when every host was read and a serving host is
not healthy (with its reasons in the JSON document and the table), and the acceptance over
Prometheus's window beside the one since each server started.

The status run is synthetic: a PlayResult whose set_stats data is shaped like
playbooks/status.yml's (as in tests/test_cli_view.py); the CLI runs it through a session that
hands that result back instead of starting ansible-playbook.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text

from specfleet.controller import cli
from specfleet.controller.events import HostTally, PlayResult
from specfleet.controller.status import fleet_status, status_table, unhealthy_reasons
from specfleet.controller.summary import ExitCode, exit_code

STACK = {"lock": "cuda", "hash": "0123456789abcdef", "vllm": "0.32.0"}
UNIT = {
    "active": "active",
    "sub": "running",
    "main_pid": 4242,
    "restarts": 0,
    "runs_from": ["0123456789abcdef"],
}
PROMETHEUS = {
    "host": "gpu-lab-mon",
    "url": "http://172.30.240.20:9090",
    "ready": True,
    "window": "5m",
    "acceptance": {"gpu-01": 1.42, "gpu-02": None},
    "by_position": {"gpu-01": [0.3, 0.1, 0.02]},
    "up": {"gpu-01": 1, "gpu-02": 0},
}


def row(**changes: Any) -> dict[str, Any]:
    """A serving host's row as playbooks/status.yml hands it over: healthy unless changed."""
    return {
        "endpoint": "http://10.0.0.1:8000",
        "model": "llama",
        "stack": STACK,
        "whitelist": {"shape": "list", "entries": ["llama"], "vllm": "0.32.0"},
        "drafter": "9f86d081884c7d659a2f",
        "unit": UNIT,
        "health": "ok",
        "acceptance": {"drafts": 120, "accepted_tokens": 46, "mean_acceptance_length": 1.383},
        **changes,
    }


def run(
    rows: Mapping[str, Mapping[str, Any]],
    *,
    unreachable: tuple[str, ...] = (),
    prometheus: Mapping[str, Any] | None = None,
) -> PlayResult:
    """The status run: rows for the hosts it read, nothing for the unreachable ones."""
    servers = sorted([*rows, *unreachable])
    data: dict[str, Any] = {
        "specfleet_fleet": {"servers": servers, "balancer": None},
        "specfleet_status": dict(rows),
    }
    if prometheus is not None:
        data["specfleet_prometheus"] = dict(prometheus)
    hosts = {host: HostTally(ok=9) for host in rows}
    hosts |= {host: HostTally(ok=1, unreachable=1) for host in unreachable}
    return PlayResult(
        playbook="status.yml",
        rc=4 if unreachable else 0,
        status="failed" if unreachable else "successful",
        hosts=hosts,
        data=data,
    )


def table_text(status: Mapping[str, Any]) -> str:
    out = Console(file=io.StringIO(), record=True, width=250, color_system=None)
    out.print(status_table(status))
    return out.export_text()


def line_of(text: str, host: str) -> str:
    return next(line for line in text.splitlines() if f" {host} " in line)


class FakeSession:
    """What cli.run_job needs of a Session, handing back prepared results."""

    results_by_playbook: Mapping[str, PlayResult] = {}

    def __init__(self, command: str, options: Any, observer: Any = None) -> None:
        self.options = options
        self.results: list[PlayResult] = []
        self.interrupted = False
        self.log_path = None

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, playbook: str, **_: Any) -> PlayResult:
        result = self.results_by_playbook[playbook]
        self.results.append(result)
        return result


Specfleet = Callable[..., tuple[int, dict[str, Any]]]


@pytest.fixture
def specfleet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Specfleet:
    """`specfleet ARGS --json` on a status run that returns ``result``: (rc, its document)."""

    def call(*args: str, result: PlayResult) -> tuple[int, dict[str, Any]]:
        session = type("Session", (FakeSession,), {"results_by_playbook": {"status.yml": result}})
        monkeypatch.setattr(cli, "Session", session)
        rc = cli.main([*args, "-i", ",".join(result.data["specfleet_fleet"]["servers"]) + ","])
        out = capsys.readouterr().out
        return rc, json.loads(out) if "--json" in args else {"text": out}

    return call


# ----------------------------------------------------------------- health and its exit code
def test_a_healthy_fleet_is_exit_0(specfleet: Specfleet) -> None:
    rc, doc = specfleet("status", "--json", result=run({"gpu-01": row(), "gpu-02": row()}))
    assert rc == 0 and doc["result"] == "ok"
    assert doc["status"]["unhealthy_hosts"] == []
    assert all(r["unhealthy"] == [] for r in doc["status"]["servers"].values())
    assert "not healthy" not in table_text(doc["status"])


def test_an_inactive_unit_is_exit_5_with_its_reason(specfleet: Specfleet) -> None:
    inactive = row(unit={**UNIT, "active": "inactive", "sub": "dead", "main_pid": 0})
    rc, doc = specfleet("status", "--json", result=run({"gpu-01": row(), "gpu-02": inactive}))
    assert rc == 5 and doc["rc"] == 5 and doc["result"] == "unhealthy"
    assert doc["status"]["unhealthy_hosts"] == ["gpu-02"]
    assert doc["status"]["servers"]["gpu-02"]["unhealthy"] == ["unit inactive/dead"]
    assert doc["status"]["servers"]["gpu-01"]["unhealthy"] == []
    assert "not healthy: gpu-02: unit inactive/dead" in table_text(doc["status"])


def test_health_not_ok_is_exit_5(specfleet: Specfleet) -> None:
    rc, doc = specfleet("status", "--json", result=run({"gpu-01": row(health="HTTP 503")}))
    assert rc == 5
    assert doc["status"]["servers"]["gpu-01"]["unhealthy"] == ["health HTTP 503"]


def test_a_host_with_nothing_installed_says_all_that_is_wrong() -> None:
    absent = row(stack="absent", unit="absent", health="absent", acceptance="absent")
    assert unhealthy_reasons({"reachable": True, **absent}) == ["unit absent", "health absent"]


def test_processes_on_another_venv_are_unhealthy_and_their_unit_red() -> None:
    mixed = row(unit={**UNIT, "runs_from": ["0123456789abcdef", "fedcba9876543210"]})
    status = fleet_status(run({"gpu-01": mixed, "gpu-02": row()}))
    assert status["servers"]["gpu-01"]["unhealthy"] == [
        "runs code from 0123456789abcdef, fedcba9876543210, not the stack's venv"
    ]
    # The unit's cell is red exactly when its part of the reasons is not empty.
    unit_cells = list(status_table(status).columns[4].cells)
    assert [cell.style for cell in unit_cells if isinstance(cell, Text)] == ["red", "green"]


def test_the_table_shows_the_verdict_without_the_recap(specfleet: Specfleet) -> None:
    rc, out = specfleet("status", "--quiet", result=run({"gpu-01": row(health="no answer")}))
    assert rc == 5
    lines = out["text"].rstrip("\n").splitlines()
    assert "not healthy: gpu-01: health no answer" in [line.rstrip() for line in lines]
    assert lines[-1].startswith("specfleet status: unhealthy (exit 5)")
    assert not any(line.split()[:2] == ["host", "ok"] for line in lines), "no recap table"


def test_an_unreachable_host_is_still_exit_4(specfleet: Specfleet) -> None:
    result = run({"gpu-01": row(health="absent")}, unreachable=("gpu-02",))
    rc, doc = specfleet("status", "--json", result=result)
    assert rc == 4 and doc["result"] == "unreachable"
    # Its row is as before (no new keys), and it counts among the hosts not healthy.
    assert doc["status"]["servers"]["gpu-02"] == {"reachable": False, "error": "unreachable"}
    assert doc["status"]["unhealthy_hosts"] == ["gpu-01", "gpu-02"]


def test_lab_status_is_exit_5_and_lab_up_keeps_its_own_success(
    specfleet: Specfleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run({"gpu-01": row(health="HTTP 500")})
    rc, doc = specfleet("lab", "status", "--json", result=result)
    assert rc == 5 and doc["command"] == "lab-status"

    def lab_up(session: Any, note: Any = None) -> dict[str, Any]:
        return {"status": fleet_status(session.run("status.yml")), "lab": {}}

    monkeypatch.setattr(cli, "lab_up", lab_up)
    rc, doc = specfleet("lab", "up", "--json", result=result)
    assert rc == 0 and doc["status"]["unhealthy_hosts"] == ["gpu-01"]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (PlayResult("status.yml", rc=0), ExitCode.UNHEALTHY),
        (PlayResult("status.yml", rc=2, hosts={"gpu-01": HostTally(failed=1)}), ExitCode.FAILED),
        (
            PlayResult("status.yml", rc=4, hosts={"gpu-01": HostTally(unreachable=1)}),
            ExitCode.UNREACHABLE,
        ),
        (PlayResult("status.yml", rc=4, played=False), ExitCode.BAD_INPUT),
        (PlayResult("status.yml", rc=1), ExitCode.ERROR),
        (PlayResult("status.yml", rc=0, status="canceled"), ExitCode.INTERRUPTED),
    ],
    ids=["ok", "failed", "unreachable", "bad-input", "error", "interrupted"],
)
def test_unhealthy_only_replaces_ok(result: PlayResult, expected: ExitCode) -> None:
    assert exit_code([result], unhealthy=True) == expected
    assert ExitCode.UNHEALTHY == 5


# ----------------------------------------------------------------- Prometheus's window
def test_the_acceptance_over_prometheus_window_comes_first() -> None:
    rows = {"gpu-01": row(), "gpu-02": row(), "gpu-03": row()}
    status = fleet_status(run(rows, prometheus=PROMETHEUS))
    assert status["prometheus"] == {
        "host": "gpu-lab-mon",
        "url": "http://172.30.240.20:9090",
        "ready": True,
        "window": "5m",
        "error": None,
    }
    servers = status["servers"]
    assert servers["gpu-01"]["acceptance_window"] == {
        "mean_acceptance_length": 1.42,
        "window": "5m",
        "source": "prometheus",
        "by_position": [0.3, 0.1, 0.02],
        "up": True,
    }
    assert servers["gpu-02"]["acceptance_window"] == {
        "mean_acceptance_length": None,
        "window": "5m",
        "source": "prometheus",
        "up": False,
    }
    assert "acceptance_window" not in servers["gpu-03"], "Prometheus does not have it"
    # The since-start figure stays as it was.
    assert servers["gpu-01"]["acceptance"]["mean_acceptance_length"] == 1.383

    text = table_text(status)
    assert "1.42 over 5m (Prometheus); 1.38 since start (120 drafts)" in line_of(text, "gpu-01")
    assert "no drafts in 5m (Prometheus, target down); 1.38 since start" in line_of(text, "gpu-02")
    gpu03 = line_of(text, "gpu-03")
    assert "1.38 since start (120 drafts)" in gpu03 and "Prometheus" not in gpu03
    assert "acceptance over 5m: Prometheus http://172.30.240.20:9090 (gpu-lab-mon)" in text


def test_prometheus_not_ready_leaves_the_since_start_figure_and_names_the_error() -> None:
    down = {"host": "gpu-lab-mon", "url": "http://172.30.240.20:9090", "ready": False}
    down["error"] = "connection refused"
    status = fleet_status(run({"gpu-01": row()}, prometheus=down))
    assert status["prometheus"] == {
        "host": "gpu-lab-mon",
        "url": "http://172.30.240.20:9090",
        "ready": False,
        "window": None,
        "error": "connection refused",
    }
    assert "acceptance_window" not in status["servers"]["gpu-01"]
    text = table_text(status)
    assert "over 5m" not in text and "1.38 since start (120 drafts)" in line_of(text, "gpu-01")
    assert (
        "Prometheus http://172.30.240.20:9090 (gpu-lab-mon) could not be read: "
        "connection refused; acceptance since each server started only"
    ) in text


def test_without_monitoring_there_is_no_window() -> None:
    status = fleet_status(run({"gpu-01": row(acceptance={"drafts": 0, "accepted_tokens": 0})}))
    assert status["prometheus"] is None
    assert "acceptance_window" not in status["servers"]["gpu-01"]
    text = table_text(status)
    assert "no drafts since start" in line_of(text, "gpu-01")
    assert "Prometheus" not in text


def test_a_window_without_drafts_may_come_as_nan() -> None:
    nan = {**PROMETHEUS, "acceptance": {"gpu-01": "NaN"}, "by_position": {"gpu-01": ["NaN"]}}
    window = fleet_status(run({"gpu-01": row()}, prometheus=nan))["servers"]["gpu-01"]
    assert window["acceptance_window"]["mean_acceptance_length"] is None
    assert window["acceptance_window"]["by_position"] == [None]
