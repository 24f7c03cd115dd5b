"""Role monitoring in a running lab: the lab's Prometheus (a container of its own) over its
real vLLM servers and its real HAProxy.

- every server and the balancer are scraped, each target up;
- the recording rules give what vLLM's own counters give over the same window;
- every query of the Grafana dashboard runs on the real Prometheus, and the speculative ones
  return series;
- the lab's drafter (untrained: it accepts almost nothing) under real load alerts as a poor
  drafter at the floor; a stopped server alerts; both clear afterwards (the server back,
  the poor drafter's window past).

The lab's Prometheus scrapes every 5 s over 1-minute windows, its alerts after 10-15 s
(inventory/lab/group_vars/monitoring.yml), so that this runs in about three minutes. It uses
the lab of tests/test_cli_lab.py, or ``SPECFLEET_TEST_LAB=inventory/lab/hosts.yml`` for a lab
already up (``bin/lab up``), which it leaves as it found it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from doorclient import Door, send
from labs import LabUnderTest

from specfleet.host import metrics

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "specfleet-vllm-dashboard.json"
UNIT = "specfleet-vllm"


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        return self.api("query", query=expr, **params)["result"]

    def alerts(self, name: str) -> dict[str, str]:
        """Each instance's state of the alert ``name`` (pending or firing)."""
        return {
            alert["labels"]["instance"]: alert["state"]
            for alert in self.api("alerts")["alerts"]
            if alert["labels"]["alertname"] == name
        }


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(2)


@pytest.fixture(scope="module")
def prometheus(lab_under_test: LabUnderTest) -> Prometheus:
    lab = lab_under_test
    if not lab.monitors:
        pytest.skip("this lab has no monitoring host")
    return Prometheus(f"http://{lab.address(lab.monitors[0])}:9090")


@pytest.fixture(scope="module")
def door(lab_under_test: LabUnderTest) -> Door:
    return Door.of(lab_under_test)


def complete(door: Door, requests: int, tokens: int = 32) -> None:
    """Real completions through the front door, one at a time (bounded: ``requests``)."""
    connection = door.connection()
    body = json.dumps(
        {"model": door.model, "prompt": "The drafter", "max_tokens": tokens, "temperature": 0}
    ).encode()
    headers = {"Authorization": f"Bearer {door.client_key}", "Content-Type": "application/json"}
    for _ in range(requests):
        answer = send(connection, "POST", "/v1/completions", headers, body)
        assert answer.status == 200, answer
    connection.close()


def test_every_server_and_the_balancer_are_scraped(
    lab_under_test: LabUnderTest, prometheus: Prometheus
) -> None:
    lab = lab_under_test
    expected = {("vllm", server) for server in lab.servers} | {("haproxy", lab.balancer)}

    def all_up() -> dict[tuple[str, str], str] | None:
        targets = {
            (t["labels"]["job"], t["labels"]["instance"]): t["health"]
            for t in prometheus.api("targets", state="active")["activeTargets"]
        }
        return targets if set(targets.values()) == {"up"} else None

    targets = wait_for("every target up", all_up, timeout=60)
    assert set(targets) == expected


def test_the_recording_rules_give_what_vllms_own_counters_give(
    lab_under_test: LabUnderTest, prometheus: Prometheus, door: Door
) -> None:
    """Each server's recorded mean acceptance length at the rules' last evaluation, set
    beside vLLM's own counters over that evaluation's window (the first and last of their
    samples in it); and the last of those samples is what vLLM itself says now (no traffic
    since). The balancer chooses the servers: each one that drafted in the window counts."""
    lab = lab_under_test
    complete(door, 6)
    checked = [check_server(lab, prometheus, server) for server in lab.servers]
    assert any(checked), "no server drafted in the window"


DRAFTS = "vllm:spec_decode_num_drafts_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
RULE = "instance:vllm_spec_decode_mean_acceptance_length:ratio_rate"


def samples(prometheus: Prometheus, expr: str, **params: Any) -> list[tuple[float, float]]:
    """The (timestamp, value) samples of a range query's one series."""
    result = prometheus.query(expr, **params)
    return [(float(at), float(value)) for at, value in result[0]["values"]] if result else []


def samples_at(prometheus: Prometheus, expr: str, at: float) -> list[tuple[float, float]]:
    """An instant query's (timestamp, value) for each series, at ``at``."""
    return [(float(r["value"][0]), float(r["value"][1])) for r in prometheus.query(expr, time=at)]


def rule_window(prometheus: Prometheus) -> int:
    """The range, in seconds, of the rule as Prometheus loaded it (it is the lab's
    monitoring_rate_window): read from the rule, not restated here."""
    [query] = [
        rule["query"]
        for group in prometheus.api("rules")["groups"]
        for rule in group["rules"]
        if rule["name"] == RULE
    ]
    ranges = set(re.findall(r"\[([0-9a-z]+)\]", query))
    assert len(ranges) == 1, query  # both counters over one window
    # Prometheus' durations: units from largest to smallest, e.g. 1m or 1m30s.
    units = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    [duration] = ranges
    parts = re.findall(r"(\d+)(ms|[ywdhms])", duration)
    assert "".join(a + u for a, u in parts) == duration, query
    return round(sum(int(amount) * units[unit] for amount, unit in parts))


def increase_as_rate_sees_it(points: list[tuple[float, float]], start: float, end: float) -> float:
    """A counter's increase over [start, end] as Prometheus' rate() and increase() compute it
    from the samples in the window (promql's extrapolatedRate, Prometheus 2.x): the increase
    between the first and last samples, stretched to each edge when the edge is within 1.1
    sample intervals (else by half an interval), the stretch back no further than where the
    counter would reach zero. No resets here: the servers run throughout."""
    # In whole milliseconds, as Prometheus keeps time: seconds since 1970 as floats are off
    # by a few parts in 10^8 over a scrape interval.
    ms = [round(at * 1000) for at, _ in points]
    first, last = points[0][1], points[-1][1]
    increase = last - first
    sampled = (ms[-1] - ms[0]) / 1000
    spacing = sampled / (len(points) - 1)
    to_start = (ms[0] - round(start * 1000)) / 1000
    to_end = (round(end * 1000) - ms[-1]) / 1000
    if increase > 0 and first >= 0:
        to_start = min(to_start, sampled * first / increase)
    stretched = sampled
    for gap in (to_start, to_end):
        stretched += gap if gap < spacing * 1.1 else spacing / 2
    return increase * stretched / sampled


def check_server(lab: LabUnderTest, prometheus: Prometheus, server: str) -> bool:
    own = own_counters(lab, server)
    selector = f'{{instance="{server}"}}'

    def scraped_and_evaluated() -> tuple[float, float] | None:
        """The first rule evaluation after Prometheus scraped the counters as they are now."""
        scraped = samples(prometheus, f"{DRAFTS}{selector}[20s]")
        if not scraped or scraped[-1][1] != own[DRAFTS]:
            return None
        # The first scrape that saw them (no traffic since: every later one agrees), not the
        # last: scrapes and rule runs interleave, and a later scrape is often newer than
        # the latest rule run.
        seen = min(at for at, value in scraped if value == own[DRAFTS])
        later = [s for s in samples(prometheus, f"{RULE}{selector}[20s]") if s[0] > seen]
        return later[0] if later else None

    window_s = rule_window(prometheus)
    evaluated_at, recorded = wait_for(
        f"{server}: a scrape of today's counters, then a rule run", scraped_and_evaluated, 60
    )
    window = {
        name: samples(prometheus, f"{name}{selector}[{window_s}s]", time=evaluated_at)
        for name in (DRAFTS, ACCEPTED)
    }
    assert window[DRAFTS][-1][1] == own[DRAFTS] and window[ACCEPTED][-1][1] == own[ACCEPTED]
    drafts = window[DRAFTS][-1][1] - window[DRAFTS][0][1]
    accepted = window[ACCEPTED][-1][1] - window[ACCEPTED][0][1]
    if drafts == 0:
        # No drafts in the window: no figure (NaN), and no alert can come of it.
        assert recorded != recorded, recorded
        return False
    # rate() stretches each counter's increase to the window's edges, each counter by its own
    # factor (the stretch back stops where that counter would reach zero), so the rule's
    # figure is the ratio of the two stretched increases: computed here from the same samples.
    # A scrape that started in the last second before the rule ran may have been stored
    # after it (a scrape's samples bear its start): the figure without it is the rule's too.
    start = evaluated_at - window_s

    def ratio(cutoff: float) -> float:
        seen = {name: [p for p in points if p[0] <= cutoff] for name, points in window.items()}
        if len(seen[DRAFTS]) < 2:
            return float("nan")
        return 1 + increase_as_rate_sees_it(
            seen[ACCEPTED], start, evaluated_at
        ) / increase_as_rate_sees_it(seen[DRAFTS], start, evaluated_at)

    # The helper is Prometheus' own rate(), on these samples (queried now, as they were):
    for name, points in window.items():
        [(_, theirs)] = samples_at(
            prometheus, f"increase({name}{selector}[{window_s}s])", evaluated_at
        )
        assert theirs == pytest.approx(
            increase_as_rate_sees_it(points, start, evaluated_at), rel=1e-9
        )
    candidates = [ratio(evaluated_at), ratio(evaluated_at - 1)]
    assert any(recorded == pytest.approx(c, rel=1e-9) for c in candidates), (recorded, candidates)
    # The stretches move the figure by less than a sample interval's share of the window:
    # this is vLLM's own ratio, not another (draft tokens for drafts would be k times off).
    assert recorded - 1 == pytest.approx(accepted / drafts, rel=0.25)
    print(
        f"{server}: recorded {recorded:.4f} at {evaluated_at:.0f}; vLLM's own counters over"
        f" its window: {accepted:.0f} accepted / {drafts:.0f} drafts"
    )
    return True


def own_counters(lab: LabUnderTest, server: str) -> dict[str, float]:
    """The counters as vLLM itself reports them, read on the server host and parsed by the
    project's one reader of /metrics (specfleet.host.metrics), by Prometheus series name."""
    text = lab.fetch(server, f"http://{lab.address(server)}:8000/metrics")
    counters = metrics.spec_decode_counters(text)
    return {
        DRAFTS: counters.get((metrics.DRAFTS, ""), 0.0),
        ACCEPTED: counters.get((metrics.ACCEPTED, ""), 0.0),
    }


def test_every_dashboard_query_runs_on_the_real_prometheus(prometheus: Prometheus) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$instance", ".*")
            if not prometheus.query(expr):
                empty.append(f"{panel['title']}, {target['legendFormat']}: {expr}")
    # Only the parts no lab traffic makes may be empty: servers without speculation, and
    # the balancer's retries and errors (the lab's servers served every request).
    allowed = ("servers that do not", "haproxy_backend_retries", "haproxy_backend_errors")
    unexpected = [line for line in empty if not any(word in line for word in allowed)]
    assert not unexpected, unexpected


def test_a_poor_drafter_and_a_stopped_server_alert_then_clear(
    lab_under_test: LabUnderTest, prometheus: Prometheus, door: Door
) -> None:
    """The lab serves an untrained drafter (mean acceptance length about 1.0, under the
    floor of 1.5) until a trained one is published, as `lab up` leaves it: under load it
    alerts. A stopped server alerts. Both clear: the server
    started again, and the poor drafter's drafts out of the window."""
    lab = lab_under_test
    server = lab.servers[0]
    poor = "SpecfleetAcceptanceBelowFloor"
    down = "SpecfleetServerDown"

    def poor_firing() -> bool:
        complete(door, 2)
        return prometheus.alerts(poor).get(server) == "firing"

    wait_for(f"{poor} firing for {server}", poor_firing, timeout=120)
    lab.exec(server, ["systemctl", "stop", UNIT])
    try:
        wait_for(
            f"{down} firing for {server}",
            lambda: prometheus.alerts(down).get(server) == "firing",
            timeout=90,
        )
    finally:
        lab.exec(server, ["systemctl", "start", UNIT])
    wait_for(f"{down} cleared", lambda: server not in prometheus.alerts(down), timeout=240)
    wait_for(f"{poor} cleared", lambda: server not in prometheus.alerts(poor), timeout=120)
    # Back in service: a completion through the door.
    wait_for("the door serving again", lambda: _serves(door), timeout=120)


def _serves(door: Door) -> bool:
    try:
        complete(door, 1, tokens=4)
    except AssertionError:
        return False
    return True
