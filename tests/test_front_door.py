"""The front door, attacked: every route of the served vLLM, through the lab's balancer.

The routes come from the installed vLLM itself (``python -m specfleet.host.routes --every-task``
on a server host: vLLM's own ``build_app`` for every task, plus every router in its
``*api_router`` modules), not from a list written here, so a route a new vLLM release adds
is attacked too. Each is sent through the balancer's TLS front door with every method it
takes (and, for the routes the door lets through, the methods it does not), in odd
spellings (percent-encoding, dot segments, doubled slashes, letter case, a query string, a
path parameter, absolute form), with no key, a wrong key, the servers' own key (vLLM's second
lock, never a client's) and a valid client key. What the balancer refused carries its
``X-Specfleet-Refused`` header; anything else was forwarded to vLLM.

Then a client key is rotated under load (``specfleet frontdoor`` with the new key added,
clients switched to it, the old one removed): no request fails, and the old key is refused
afterwards. The refusals are counted by reason at the balancer and named in its log.

Runs against the lab of tests/test_cli_lab.py (two servers behind their balancer, brought up
once for both modules); ``SPECFLEET_TEST_LAB=inventory/lab/hosts.yml`` points it at a lab
already running instead (``bin/lab up``), which it leaves running.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from doorclient import REFUSED, Door, Load, send
from labs import LabUnderTest, specfleet_json

pytestmark = pytest.mark.docker

#: What a client may do through the door by default (the loadbalancer role's defaults).
ALLOWED = {
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
}
#: Methods tried on the allowed paths besides the one each allows.
OTHER_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def spellings(path: str, authority: str) -> dict[str, str]:
    """The same route written the ways a parser might disagree about."""
    head, _, rest = path[1:].partition("/")
    first = path[1]
    variants = {
        "as served": path,
        "query string": path + "?x=1",
        "percent-encoded letter": f"/%{ord(first):02x}{path[2:]}",
        "percent-encoded letter (upper hex)": f"/%{ord(first):02X}{path[2:]}",
        "upper case": path.upper(),
        "doubled slash": "/" + path,
        "dot segment": "/." + path,
        "dot-dot segment": "/x/.." + path,
        "encoded dot segment": "/%2e" + path,
        "trailing slash": path + "/",
        "path parameter": path + ";x",
        "absolute form": f"https://{authority}{path}",
        "fragment": path + "#x",
    }
    if rest:
        variants["encoded slash"] = f"/{head}%2F{rest}"
        variants["doubled inner slash"] = f"/{head}//{rest}"
    return variants


def concrete(path: str) -> str:
    """A route path with each {parameter} filled in."""
    out, depth = [], 0
    for char in path:
        if char == "{":
            depth += 1
            out.append("x")
        elif char == "}":
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


@pytest.fixture(scope="module")
def door(lab_under_test: LabUnderTest) -> Door:
    return Door.of(lab_under_test)


@pytest.fixture(scope="module")
def routes(lab_under_test: LabUnderTest) -> list[dict[str, Any]]:
    """Every route the lab's vLLM could answer, from vLLM itself on the server host."""
    lab = lab_under_test
    server = lab.servers[0]
    pid = lab.exec(server, ["systemctl", "show", "-p", "MainPID", "--value", "specfleet-vllm"])
    table: list[dict[str, Any]] = json.loads(
        lab.exec(
            server,
            [
                "env",
                "PYTHONPATH=/opt/specfleet/lib/current",
                "/opt/specfleet/venvs/current/bin/python",
                "-m",
                "specfleet.host.routes",
                "--pid",
                pid.strip(),
                "--every-task",
            ],
        )
    )
    paths = {route["path"] for route in table}
    # vLLM's own table, not a short one: the served API and the routes the issue found open.
    assert {"/v1/chat/completions", "/invocations", "/tokenize", "/metrics", "/docs"} <= paths
    assert len(table) > 40, table
    return table


def probes(routes: list[dict[str, Any]], authority: str) -> Iterator[tuple[str, str, str]]:
    """(method, target, how) for every route, method and spelling."""
    for route in routes:
        path = concrete(route["path"])
        methods = set(route["methods"]) - {"HEAD"}
        if any((method, path) in ALLOWED for method in methods):
            methods |= set(OTHER_METHODS)
        for method in sorted(methods):
            for how, target in spellings(path, authority).items():
                yield method, target, how


def chat_body(model: str) -> bytes:
    """A body that computes on any route that takes one (one token at most)."""
    return json.dumps(
        {
            "model": model,
            "prompt": "hello",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1,
            "input": "hello",
            "text": "hello",
        }
    ).encode()


def attack(door: Door, routes: list[dict[str, Any]], headers: dict[str, str]) -> list[str]:
    """Every probe with ``headers``; what got past the balancer, as lines."""
    authority = f"{door.host}:{door.port}"
    body = chat_body(door.model)
    passed = []
    connection = door.connection()
    for method, target, how in probes(routes, authority):
        answer = send(connection, method, target, headers, body if method == "POST" else None)
        if answer.forwarded:
            passed.append(f"{method} {target} ({how}): {answer.status} {answer.body[:80]!r}")
    connection.close()
    return passed


def test_nothing_passes_without_a_valid_key(door: Door, routes: list[dict[str, Any]]) -> None:
    wrong = "sk-" + "0" * 40
    for who, headers in {
        "no key": {},
        "a wrong key": {"Authorization": f"Bearer {wrong}"},
        "the servers' own key": {"Authorization": f"Bearer {door.server_key}"},
        "a valid key beside a wrong one": {
            "Authorization": f"Bearer {door.client_key}, Bearer {wrong}"
        },
    }.items():
        passed = attack(door, routes, headers)
        assert not passed, f"{len(passed)} requests with {who} got past the door:\n" + "\n".join(
            passed
        )


def test_the_door_answers_its_own_health_without_a_key(door: Door) -> None:
    connection = door.connection()
    answer = send(connection, "GET", "/health", {})
    # vLLM's /health has an empty body: this one is the balancer's.
    assert (answer.status, answer.door, answer.body.strip()) == (200, "health", b"ok"), answer


def test_with_a_valid_key_only_the_allowed_routes_pass(
    door: Door, routes: list[dict[str, Any]]
) -> None:
    authority = f"{door.host}:{door.port}"
    body = chat_body(door.model)
    headers = {"Authorization": f"Bearer {door.client_key}"}
    connection = door.connection()
    wrong: list[str] = []
    for method, target, how in probes(routes, authority):
        answer = send(connection, method, target, headers, body if method == "POST" else None)
        # The same route: a query string after it, or the absolute form HTTP allows.
        path = target.partition("?")[0].removeprefix(f"https://{authority}")
        same_route = how in ("as served", "query string", "absolute form")
        expected_to_pass = (method, path) in ALLOWED and same_route
        if expected_to_pass and (not answer.forwarded or answer.status != 200):
            wrong.append(
                f"refused: {method} {target} ({how}): {answer.status} {answer.body[:120]!r}"
            )
        if not expected_to_pass and answer.forwarded:
            wrong.append(f"passed: {method} {target} ({how}): {answer.status} {answer.body[:80]!r}")
    connection.close()
    assert not wrong, f"{len(wrong)} wrong answers:\n" + "\n".join(wrong)


def test_the_door_refuses_a_body_too_large_and_one_without_a_length(door: Door) -> None:
    """Refused on its headers alone: the body is never read, let alone forwarded."""
    key = f"Bearer {door.client_key}"
    for framing, expected in [
        # The lab's limit is the role's default, 4 MiB.
        ({"Content-Length": str(5 << 20)}, (413, "body_size")),
        ({"Transfer-Encoding": "chunked"}, (411, "chunked")),
    ]:
        connection = door.connection()
        connection.putrequest("POST", "/v1/completions")
        connection.putheader("Authorization", key)
        for name, value in framing.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        assert (response.status, response.getheader(REFUSED)) == expected, framing
        connection.close()


def refusal_counts(lab: LabUnderTest) -> Counter[str]:
    """What the front door refused, by reason, as `specfleet status` shows it."""
    rc, status = specfleet_json("status", "-i", str(lab.inventory))
    assert rc == 0, status
    return Counter(status["status"]["loadbalancer"]["refusals"])


def test_refusals_are_counted_and_logged_by_reason(
    door: Door, lab_under_test: LabUnderTest
) -> None:
    before = refusal_counts(lab_under_test)
    connection = door.connection()
    send(connection, "GET", "/v1/models", {})
    send(connection, "GET", "/v1/models", {"Authorization": "Bearer sk-wrong-key-for-the-log"})
    send(connection, "POST", "/invocations", {"Authorization": f"Bearer {door.client_key}"}, b"{}")
    after = refusal_counts(lab_under_test)
    assert after - before == Counter({"no_key": 1, "bad_key": 1, "route": 1}), (before, after)
    log = lab_under_test.exec(
        lab_under_test.balancer,
        ["journalctl", "-u", "haproxy.service", "-n", "50", "--no-pager", "-o", "cat"],
    )
    assert "refused=no_key" in log and "refused=bad_key" in log, log
    assert 'key=lab refused=route "POST /invocations' in log or "refused=route" in log, log
    # The keys themselves are never in the log, nor in the balancer's configuration.
    assert door.client_key not in log and "sk-wrong-key-for-the-log" not in log
    config = lab_under_test.exec(lab_under_test.balancer, ["cat", "/etc/haproxy/haproxy.cfg"])
    assert door.client_key not in config and door.server_key not in config


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def frontdoor(lab: LabUnderTest, tmp_path: Path, keys: list[dict[str, str]]) -> dict[str, Any]:
    extra = tmp_path / f"keys-{len(keys)}-{time.monotonic_ns()}.yml"
    extra.write_text(yaml.safe_dump({"loadbalancer_api_keys": keys}))
    rc, run = specfleet_json("frontdoor", "-i", str(lab.inventory), "-e", f"@{extra}")
    assert rc == 0, run
    return run


def test_a_key_is_rotated_under_load_without_a_failed_request(
    door: Door, lab_under_test: LabUnderTest, tmp_path: Path
) -> None:
    lab = lab_under_test
    rc, made = specfleet_json("key", "new", name := f"rotated-{time.time_ns()}")
    assert rc == 0, made
    new_key, entry = made["key"], made["entry"]
    assert entry == {"name": name, "sha256": sha256(new_key)}
    old_entry = {"name": "lab", "sha256": sha256(door.client_key)}
    try:
        with Load(door, door.client_key) as load:
            time.sleep(5)
            both = frontdoor(lab, tmp_path, [old_entry, entry])
            assert both["hosts"][lab.balancer]["changed"] > 0
            load.key = new_key
            time.sleep(5)
            frontdoor(lab, tmp_path, [entry])
            time.sleep(5)
        assert load.results["200"] > 20, load.results
        assert not load.failures, (load.results, load.failures[:10])
        connection = door.connection()
        old = send(connection, "GET", "/v1/models", {"Authorization": f"Bearer {door.client_key}"})
        new = send(connection, "GET", "/v1/models", {"Authorization": f"Bearer {new_key}"})
        assert (old.status, old.refused) == (401, "bad_key")
        assert new.status == 200 and new.forwarded
    finally:
        # The lab's own key again, for whatever runs next.
        frontdoor(lab, tmp_path, [old_entry])


def test_a_key_over_its_rate_is_refused_and_counted(
    door: Door, lab_under_test: LabUnderTest, tmp_path: Path
) -> None:
    lab = lab_under_test
    rc, made = specfleet_json("key", "new", f"limited-{time.time_ns()}")
    assert rc == 0, made
    lab_entry = {"name": "lab", "sha256": sha256(door.client_key)}
    frontdoor(lab, tmp_path, [lab_entry, made["entry"] | {"requests_per_minute": 5}])
    try:
        connection = door.connection()
        answers = [
            send(connection, "GET", "/v1/models", {"Authorization": f"Bearer {made['key']}"})
            for _ in range(8)
        ]
        assert [a.status for a in answers] == [200] * 5 + [429] * 3, answers
        assert {a.refused for a in answers[5:]} == {"rate"}
        # Another key's budget is its own.
        other = send(
            connection, "GET", "/v1/models", {"Authorization": f"Bearer {door.client_key}"}
        )
        assert other.status == 200
    finally:
        frontdoor(lab, tmp_path, [lab_entry])


def test_the_metrics_listener_answers_monitoring_addresses_only(
    door: Door, lab_under_test: LabUnderTest
) -> None:
    """/metrics never at the front door (above); on the metrics port only the monitoring
    addresses the inventory names get an answer: the lab names the balancer itself."""
    lab = lab_under_test
    balancer = lab.address(lab.balancer)
    inside = lab.fetch(lab.balancer, f"http://{balancer}:8405/servers/{lab.servers[0]}/metrics")
    assert "vllm:" in inside
    own = lab.fetch(lab.balancer, f"http://{balancer}:8405/metrics")
    assert "haproxy_" in own
    # From the controller, which is not a monitoring address: the connection is refused.
    connection = http.client.HTTPConnection(balancer, 8405, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        connection.request("GET", "/metrics")
        connection.getresponse().read()


#: Sends each (method, target) of a JSON list on standard input to host:port over one
#: connection each, and prints [status, X-Specfleet-Refused] for each, as JSON.
_PROBE = """
import http.client, json, sys
host, port = sys.argv[1], int(sys.argv[2])
answers = []
for method, target in json.load(sys.stdin):
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request(method, target, body=b"{}" if method == "POST" else None)
    response = connection.getresponse()
    response.read()
    answers.append([response.status, response.getheader("X-Specfleet-Refused")])
    connection.close()
print(json.dumps(answers))
"""


def test_from_the_monitoring_address_the_metrics_listener_passes_metrics_alone(
    lab_under_test: LabUnderTest, routes: list[dict[str, Any]]
) -> None:
    """The monitoring host may read metrics and nothing else: every route of the served vLLM
    (its own table), with every method it takes, asked of the metrics listener from the
    monitoring host, at the listener's root and under each server's prefix, is refused at
    the balancer, but GET of the metrics paths."""
    lab = lab_under_test
    if not lab.monitors:
        pytest.skip("this lab has no monitoring host")
    monitor = lab.monitors[0]
    balancer, server = lab.address(lab.balancer), lab.servers[0]
    metrics = {"/metrics", f"/servers/{server}/metrics"}
    asked = []
    for route in routes:
        path = concrete(route["path"])
        for method in sorted(set(route["methods"]) - {"HEAD"}):
            for target in (path, f"/servers/{server}{path}"):
                asked.append([method, target])
    asked += [["POST", target] for target in sorted(metrics)]
    answers = json.loads(
        lab.exec_input(monitor, ["python3", "-c", _PROBE, balancer, "8405"], json.dumps(asked))
    )
    passed = [
        f"{method} {target}: {status}"
        for (method, target), (status, refused) in zip(asked, answers, strict=True)
        if refused is None and not (method == "GET" and target in metrics)
    ]
    assert not passed, passed
    served = {
        target: status
        for (method, target), (status, refused) in zip(asked, answers, strict=True)
        if method == "GET" and target in metrics
    }
    assert served == dict.fromkeys(metrics, 200), served


def test_a_direct_request_to_vllm_from_the_controller_is_refused(
    lab_under_test: LabUnderTest,
) -> None:
    """The server side stays as tight as it was: only the balancer (and the host) reach vLLM."""
    lab = lab_under_test
    connection = http.client.HTTPConnection(lab.address(lab.servers[0]), 8000, timeout=10)
    with pytest.raises(OSError):
        connection.request("POST", "/invocations", body=b"{}")
        connection.getresponse().read()
