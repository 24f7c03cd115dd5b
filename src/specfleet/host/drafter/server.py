"""The pipeline's private vLLM server: started for the stages that need one, then stopped.

It serves the target from the stack's own interpreter on a private port, in one of three
roles: plain (responses), hidden-state extraction, or with a drafter (evaluation).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfleet.host.drafter import CPU_COMPAT_CONNECTOR, CPU_COMPAT_MODULE
from specfleet.host.drafter.config import RunConfig


@dataclass(frozen=True)
class ServerSpec:
    """What one private server is started with (extra command-line words)."""

    name: str
    args: tuple[str, ...] = ()


def plain() -> ServerSpec:
    return ServerSpec("plain")


def hidden_states_extraction(config: RunConfig, layer_ids: list[int], staging: Path) -> ServerSpec:
    """vLLM's ``extract_hidden_states`` method writing through a hidden-states connector."""
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
    }
    connector: dict[str, Any] = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(staging)},
    }
    if config.cpu_compat:
        connector["kv_connector"] = CPU_COMPAT_CONNECTOR
        connector["kv_connector_module_path"] = CPU_COMPAT_MODULE
    return ServerSpec(
        "hidden-states",
        (
            "--speculative-config",
            json.dumps(speculative),
            "--kv-transfer-config",
            json.dumps(connector),
        ),
    )


def with_drafter(drafter: Path, num_speculative_tokens: int) -> ServerSpec:
    speculative = {
        "method": "eagle3",
        "model": str(drafter),
        "num_speculative_tokens": num_speculative_tokens,
    }
    return ServerSpec(f"drafter {drafter}", ("--speculative-config", json.dumps(speculative)))


class ServerError(RuntimeError):
    pass


class VllmServer:
    """A running private server; use :func:`serve` to start and stop one."""

    def __init__(self, config: RunConfig, spec: ServerSpec, log_path: Path) -> None:
        self.config = config
        self.spec = spec
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{config.server.port}"
        self.model = config.target  # served under its path, which speculators expects
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        settings = self.config.server
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.config.target,
            "--host",
            "127.0.0.1",
            "--port",
            str(settings.port),
            "--max-model-len",
            str(settings.max_model_len),
            "--seed",
            str(self.config.seed),
        ]
        # The accelerator profile's arguments (--enforce-eager for the CPU build;
        # tensor parallelism and GPU memory for cuda) come as data from the role.
        argv += settings.args
        return argv + list(self.spec.args) + list(settings.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env["VLLM_NO_USAGE_STATS"] = "1"
        env.update(self.config.server.environment)
        return env

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # its workers are stopped with it
        )
        log.close()
        deadline = time.monotonic() + self.config.server.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(
                    f"the private vLLM server ({self.spec.name}) exited with "
                    f"{self.process.returncode}; its log: {self.log_path}"
                )
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.base_url}/health", timeout=5).close()
                return
            time.sleep(2)
        self.stop()
        raise ServerError(
            f"the private vLLM server ({self.spec.name}) was not healthy after "
            f"{self.config.server.startup_timeout_s} s; its log: {self.log_path}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as response:
            return response.read().decode()

    def chat(self, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.base_url}/v1/chat/completions",
            body,
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer


@contextlib.contextmanager
def serve(config: RunConfig, spec: ServerSpec, log_path: Path) -> Iterator[VllmServer]:
    server = VllmServer(config, spec, log_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
