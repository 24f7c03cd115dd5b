"""The settings of one drafter training run: the one source of their names, defaults and docs.

The ``drafter_training`` role writes a JSON file of the settings it knows (the target, the
store, the accelerator profile's data) combined with the operator's
``drafter_training_settings``; everything not given takes the default declared here.
``python -m specfleet.host.drafter settings`` prints this table. Only the standard library is
used, so the controller's tests and the role's preflight read a run without torch.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from specfleet.host.speculative import SpeculativeConfigError, check_num_speculative_tokens

HIDDEN_STATES_BACKENDS = ("vllm", "transformers")


class ConfigError(ValueError):
    """The run's settings are unusable; the message says which and why."""


def doc(text: str) -> dict[str, str]:
    """A field's documentation, printed by ``python -m specfleet.host.drafter settings``."""
    return {"doc": text}


@dataclass(frozen=True)
class ServerSettings:
    """The private vLLM server the pipeline starts for responses, hidden states, evaluation."""

    port: int = field(default=8390, metadata=doc("port of the private server on 127.0.0.1"))
    max_model_len: int = field(default=2048, metadata=doc("context length of the private server"))
    startup_timeout_s: int = field(
        default=900, metadata=doc("seconds the private server may take to start")
    )
    args: list[str] = field(
        default_factory=list,
        metadata=doc("the accelerator profile's server arguments (the role's vars/<profile>.yml)"),
    )
    environment: dict[str, str] = field(
        default_factory=dict,
        metadata=doc(
            "the accelerator profile's server environment (e.g. the CPU build's KV cache)"
        ),
    )
    extra_args: list[str] = field(
        default_factory=list, metadata=doc("further arguments of the private server")
    )


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; its hash (with the inputs' fingerprints) is the run id."""

    target: str = field(default="", metadata=doc("local folder of the target model (required)"))
    dataset: str = field(
        default="", metadata=doc("prompts, JSONL of chats; the target answers them (required)")
    )
    baseline_drafter: str | None = field(
        default=None,
        metadata=doc("drafter measured next to the candidate (a fixed folder); none when empty"),
    )
    cpu_compat: bool = field(
        default=False,
        metadata=doc("load the CPU compatibility layer (the cpu profile: no accelerator)"),
    )
    work_dir: str = field(default="", metadata=doc("stages, logs, progress (required)"))
    store_dir: str = field(default="", metadata=doc("exported drafters by content hash (required)"))
    heldout_prompts: int = field(
        default=20, metadata=doc("prompts kept out of training, used to measure acceptance")
    )
    heldout_groups: list[str] = field(
        default_factory=list,
        metadata=doc(
            "the dataset's groups (its rows' `group`) to hold out, whole; empty: groups drawn "
            "with the seed until heldout_prompts rows. Fixed groups keep runs comparable"
        ),
    )
    seed: int = field(default=0, metadata=doc("seed of the held-out split and of training"))
    response_max_tokens: int = field(
        default=128, metadata=doc("tokens the target writes per training prompt")
    )
    response_temperature: float = field(default=0.0, metadata=doc("temperature of those answers"))
    concurrency: int = field(default=32, metadata=doc("requests in flight to the private server"))
    seq_length: int = field(default=1024, metadata=doc("longest training sequence in tokens"))
    draft_vocab_size: int = field(
        default=512, metadata=doc("draft vocabulary: the most frequent target tokens")
    )
    layer_ids: list[int] = field(
        default_factory=list,
        metadata=doc("target layers the drafter reads (vLLM numbering); empty: 2, N//2 and N-3"),
    )
    hidden_states_backend: str = field(
        default="vllm",
        metadata=doc("vllm (as speculators does it) or transformers (small targets only)"),
    )
    epochs: int = field(default=10, metadata=doc("training epochs"))
    train_processes: int = field(
        default=1,
        metadata=doc(
            "training processes on the host, one per GPU the job may use (torchrun "
            "--nproc-per-node; speculators' data-parallel trainer); 1 trains in one process"
        ),
    )
    learning_rate: float = field(default=1e-3, metadata=doc("learning rate"))
    train_extra_args: list[str] = field(
        default_factory=list, metadata=doc("further `speculators train` arguments")
    )
    reserved_ports: list[int] = field(
        default_factory=list,
        metadata=doc("ports the private server must not take (the role: the served port)"),
    )
    num_speculative_tokens: int = field(
        default=3, metadata=doc("tokens proposed per step when measuring")
    )
    eval_max_tokens: int = field(
        default=128, metadata=doc("tokens generated per held-out prompt when measuring")
    )
    server: ServerSettings = field(
        default_factory=ServerSettings, metadata=doc("the private vLLM server")
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        for required in ("target", "dataset", "work_dir", "store_dir"):
            if not data.get(required):
                raise ConfigError(f"'{required}' must be set")
        values = dict(data)
        server = values.pop("server", None) or {}
        server_known = {item.name for item in fields(ServerSettings)}
        if set(server) - server_known:
            raise ConfigError(f"unknown server setting(s): {sorted(set(server) - server_known)}")
        _check_types(cls, values)
        _check_types(ServerSettings, server, prefix="server.")
        try:
            config = cls(**values, server=ServerSettings(**server))
        except TypeError as error:
            raise ConfigError(str(error)) from error
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
            "train_processes": self.train_processes,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.cpu_compat and self.train_processes > 1:
            # speculators.train.distributed sets up torch.distributed on an accelerator
            # only: without one, selecting the rank's device fails ("Cannot access
            # accelerator device when none is available"); it never falls back to gloo.
            raise ConfigError(
                f"train_processes={self.train_processes} needs GPUs: speculators' distributed "
                "trainer finds no accelerator on a cpu host; set it to 1 there"
            )
        try:
            check_num_speculative_tokens(self.num_speculative_tokens)
        except SpeculativeConfigError as error:
            raise ConfigError(str(error)) from error

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a setting's declared type (``int``, ``list[str]``, ...)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (UnionType, Union):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _fits(key, args[0]) and _fits(item, args[1]) for key, item in value.items()
        )
    if isinstance(value, bool):  # JSON's true is no number
        return hint is bool
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


def _check_types(cls: type, values: dict[str, Any], prefix: str = "") -> None:
    """Refuse a setting whose value is not of its declared type, naming both."""
    hints = get_type_hints(cls)
    for name, value in values.items():
        if name in hints and name != "server" and not _fits(value, hints[name]):
            hint = hints[name]
            wanted = str(hint) if get_origin(hint) else hint.__name__
            raise ConfigError(
                f"{prefix}{name} must be {wanted}, got {json.dumps(value)} ({type(value).__name__})"
            )


def describe() -> list[tuple[str, str, str]]:
    """(name, default, description) of every setting, ``server.*`` included."""
    rows = []
    for cls, prefix in ((RunConfig, ""), (ServerSettings, "server.")):
        for item in fields(cls):
            if item.name == "server" and cls is RunConfig:
                continue
            if item.default is not MISSING:
                default = item.default
            elif item.default_factory is not MISSING:
                default = item.default_factory()
            else:
                default = None
            rows.append((prefix + item.name, json.dumps(default), item.metadata.get("doc", "")))
    return rows
