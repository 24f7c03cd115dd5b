"""The settings of one drafter training run, read from the JSON file the role writes.

Only the standard library is used here, so the controller's tests and the role's
preflight can read a run without torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

PROFILES = ("cpu", "cuda")
HIDDEN_STATES_BACKENDS = ("vllm", "transformers")


class ConfigError(ValueError):
    """The run's settings are unusable; the message says which and why."""


@dataclass(frozen=True)
class ServerSettings:
    """The private vLLM server the pipeline starts for responses, hidden states, evaluation."""

    port: int = 8390
    max_model_len: int = 2048
    # KV cache of the CPU build in GiB (VLLM_CPU_KVCACHE_SPACE; profile cpu only).
    cpu_kvcache_space: int = 1
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    startup_timeout_s: int = 900
    extra_args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; its hash (with the inputs' fingerprints) is the run id."""

    target: str
    dataset: str
    baseline_drafter: str | None = None
    profile: str = "cuda"
    work_dir: str = "/var/lib/specfleet/drafter-training"
    store_dir: str = "/var/lib/specfleet/drafters"
    heldout_prompts: int = 20
    seed: int = 0
    # responses
    response_max_tokens: int = 128
    response_temperature: float = 0.0
    concurrency: int = 32
    # prepared data and hidden states
    seq_length: int = 1024
    draft_vocab_size: int = 512
    # Target layers whose inputs the drafter reads (vLLM's numbering); empty: the
    # EAGLE-3 default taps 2, N//2 and N-3.
    layer_ids: list[int] = field(default_factory=list)
    hidden_states_backend: str = "vllm"
    # training
    epochs: int = 10
    learning_rate: float = 1e-3
    train_extra_args: list[str] = field(default_factory=list)
    # evaluation
    num_speculative_tokens: int = 3
    eval_max_tokens: int = 128
    server: ServerSettings = field(default_factory=ServerSettings)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        for required in ("target", "dataset"):
            if not data.get(required):
                raise ConfigError(f"'{required}' must be set")
        values = dict(data)
        server = values.pop("server", None) or {}
        server_known = {item.name for item in fields(ServerSettings)}
        if set(server) - server_known:
            raise ConfigError(f"unknown server setting(s): {sorted(set(server) - server_known)}")
        config = cls(**values, server=ServerSettings(**server))
        config.check()
        return config

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read the run settings {path}: {error}") from error
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        return cls.from_dict(data)

    def check(self) -> None:
        """Checks that need no files: ranges and choices."""
        if self.profile not in PROFILES:
            raise ConfigError(f"profile must be one of {PROFILES}, got {self.profile!r}")
        if self.hidden_states_backend not in HIDDEN_STATES_BACKENDS:
            raise ConfigError(
                f"hidden_states_backend must be one of {HIDDEN_STATES_BACKENDS}, "
                f"got {self.hidden_states_backend!r}"
            )
        positive = {
            "heldout_prompts": self.heldout_prompts,
            "response_max_tokens": self.response_max_tokens,
            "seq_length": self.seq_length,
            "draft_vocab_size": self.draft_vocab_size,
            "epochs": self.epochs,
            "eval_max_tokens": self.eval_max_tokens,
            "concurrency": self.concurrency,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ConfigError(
                f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}"
            )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
