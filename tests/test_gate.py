"""src/specfleet/host/gate.py, the vllm_server health gate, against a stub vLLM on loopback.

The real gate runs against the real vLLM server in the vllm_server and drafter_training
Molecule scenarios; here a stub of vLLM's three endpoints (named as such) makes each way the
gate can fail happen on purpose. systemd is not PID 1 on the test machine, so the unit's
state is given by the test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specfleet.host import gate

KEY = "sk-test"


class StubVllm:
    """/health, /metrics and /v1/completions as vLLM answers them, with knobs."""

    def __init__(self) -> None:
        self.drafts = 0
        self.drafted = 0
        self.accepted = 0
        self.speculating = True
        self.accept_per_draft = 1
        self.health = 200
        # vLLM 0.31's CPU build without a C++ compiler: a sampled request kills the engine.
        self.sampling_kills_the_engine = False
        self.prompts: list[str] = []

    def metrics(self) -> str:
        return (
            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}\n'
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.drafted}\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}\n'
        )

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.prompts.append(body["prompt"])
        tokens = int(body["max_tokens"])
        if self.speculating:
            drafts = tokens // (1 + self.accept_per_draft)
            self.drafts += drafts
            self.drafted += drafts * 3
            self.accepted += drafts * self.accept_per_draft
        return {"choices": [{"text": " the" * tokens}], "usage": {"completion_tokens": tokens}}


@pytest.fixture
def stub() -> Iterator[tuple[StubVllm, str]]:
    vllm = StubVllm()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            return None

        def reply(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(vllm.health, "")
            elif self.path == "/metrics":
                self.reply(200, vllm.metrics(), "text/plain")
            else:
                self.reply(404, "{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self.reply(401, '{"error": "Unauthorized"}')
            elif body.get("temperature", 1.0) > 0 and vllm.sampling_kills_the_engine:
                vllm.health = 503
                self.reply(500, '{"error": "EngineCore encountered an issue"}')
            else:
                self.reply(200, json.dumps(vllm.complete(body)))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield vllm, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture(autouse=True)
def unit(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    state = {"ActiveState": "active", "NRestarts": "0", "ExecMainStartTimestampMonotonic": "0"}
    monkeypatch.setattr(gate, "unit_state", lambda _unit: dict(state))
    monkeypatch.setattr(gate, "journal_tail", lambda _unit: ["(journal of the stub)"])
    return state


def run(base_url: str, key: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple:
    args = ["--unit", "u.service", "--base-url", base_url, "--model", "m", "--speculative"]
    args += ["--health-timeout", "10", *extra]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", _Stdin(key))
        code = gate.main([*args, "--api-key-stdin"])
    return code, json.loads(capsys.readouterr().out)


class _Stdin:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


def test_a_speculating_server_passes_with_its_figures(stub, capsys) -> None:
    _, url = stub
    code, report = run(url, KEY, capsys=capsys)
    assert code == 0, report
    assert report["passed"] is True
    assert report["completion_tokens"] == 16
    assert report["draft_tokens"] == 24 and report["accepted_tokens"] == 8
    assert report["mean_acceptance_length"] == 2.0
    assert report["sampled_completion_tokens"] == 16


def test_acceptance_is_measured_over_every_prompt(stub, capsys) -> None:
    vllm, url = stub
    prompts = ["--prompt", "How do tides work?", "--prompt", "Name a prime", "--prompt", "Hi"]
    code, report = run(url, KEY, *prompts, capsys=capsys)
    assert code == 0, report
    assert report["prompts"] == 3 and report["completion_tokens"] == 48
    assert report["draft_tokens"] == 72 and report["accepted_tokens"] == 24
    assert vllm.prompts[:3] == ["How do tides work?", "Name a prime", "Hi"]


def test_a_server_that_does_not_speculate_fails(stub, capsys) -> None:
    vllm, url = stub
    vllm.speculating = False
    code, report = run(url, KEY, capsys=capsys)
    assert code == 1
    assert report["step"] == "speculation" and "did not grow" in report["reason"]
    assert report["journal"] == ["(journal of the stub)"]


def test_a_wrong_key_fails_at_the_completion(stub, capsys) -> None:
    _, url = stub
    code, report = run(url, "sk-wrong", capsys=capsys)
    assert code == 1
    assert report["step"] == "completion" and "HTTP 401" in report["reason"]


def test_acceptance_below_the_floor_fails(stub, capsys) -> None:
    _, url = stub
    code, report = run(url, KEY, "--min-mean-acceptance-length", "2.5", capsys=capsys)
    assert code == 1
    assert report["step"] == "acceptance" and "below 2.5" in report["reason"]


def test_a_failed_unit_ends_the_wait_at_once(stub, unit, capsys) -> None:
    vllm, url = stub
    vllm.health = 503
    unit["ActiveState"] = "failed"
    code, report = run(url, KEY, capsys=capsys)
    assert code == 1
    assert report["step"] == "health" and "failed" in report["reason"]


def test_no_health_within_the_timeout_fails(stub, capsys) -> None:
    vllm, url = stub
    vllm.health = 503
    code, report = run(url, KEY, "--health-timeout", "1", capsys=capsys)
    assert code == 1
    assert report["step"] == "health" and "no 200" in report["reason"]


def test_a_server_whose_sampling_kills_the_engine_fails(stub, capsys) -> None:
    vllm, url = stub
    vllm.sampling_kills_the_engine = True
    code, report = run(url, KEY, capsys=capsys)
    assert code == 1
    assert report["step"] == "sampling" and "HTTP 500" in report["reason"]
