"""vLLM's ``--speculative-config``: the settings specfleet sets, validated once.

The server's command line gets its speculative settings as one JSON argument. Building that
string by pasting values into a template breaks on quoting and lets typos through silently
(vLLM reports a bad value only after minutes of model loading). :func:`speculative_config`
validates the few keys specfleet sets and returns a compact JSON string with sorted keys, so
the same settings always render the same unit file (idempotence). The Ansible filter of the
same name (``plugins/filter/speculative.py``) and the drafter pipeline both use this module:
the bounds live here only.

Example::

    speculative_config({'method': 'eagle3', 'model': '/srv/drafter', 'num_speculative_tokens': 3})
    -> '{"method":"eagle3","model":"/srv/drafter","num_speculative_tokens":3}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class SpeculativeConfigError(ValueError):
    """The speculative settings are unusable; the message says which and why."""


#: Speculative methods that vLLM's ``SpeculativeConfig.method`` accepts (its ``Literal``
#: types, gathered across releases 0.10 - 0.32; model-specific MTP heads included).
VLLM_SPECULATIVE_METHODS: frozenset[str] = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "medusa",
        "mlp_speculator",
        "draft_model",
        "suffix",
        "custom_class",
        "eagle",
        "eagle3",
        "extract_hidden_states",
        "dflash",
        "dspark",
        "mtp",
        "deepseek_mtp",
        "mimo_mtp",
        "ernie_mtp",
        "glm4_moe_mtp",
        "qwen3_next_mtp",
        "longcat_flash_mtp",
    }
)

#: Methods that run a separate draft checkpoint and therefore need ``model``.
DRAFT_CHECKPOINT_METHODS: frozenset[str] = frozenset(
    {"eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "dflash", "dspark"}
)

ALLOWED_KEYS: frozenset[str] = frozenset(
    {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size"}
)

#: Bounds for ``num_speculative_tokens``. vLLM itself only requires a positive integer.
#: The upper bound is specfleet's: the drafter runs one forward pass per proposed token,
#: sequentially, and a token is kept only if every token before it was accepted, so the
#: expected gain shrinks geometrically with the position (EAGLE-3 drafters are trained and
#: published for 3-8 steps). Past 16 the draft passes cost more than they can save, and
#: each step reserves ``(k + 1) x batch`` slots of the scheduler's token budget; a value
#: that large is almost always a typo (30 for 3).
MIN_SPECULATIVE_TOKENS = 1
MAX_SPECULATIVE_TOKENS = 16


def _as_int(name: str, value: object) -> int:
    """An integer from an int or a string of digits (extra-vars arrive as strings)."""
    if isinstance(value, bool):
        raise SpeculativeConfigError(
            f"speculative_config: {name} must be an integer, got {value!r}"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise SpeculativeConfigError(f"speculative_config: {name} must be an integer, got {value!r}")


def speculative_config(settings: Mapping[str, Any]) -> str:
    """Validate ``settings`` and return the JSON for ``--speculative-config``.

    Keys: ``method`` (required, one of vLLM's methods), ``model`` (absolute path of the
    draft checkpoint; required for methods with a separate drafter such as ``eagle3``),
    ``num_speculative_tokens`` (required, 1..16), ``draft_tensor_parallel_size``
    (optional, >= 1; omitted when None). Unknown keys are an error.
    """
    if not isinstance(settings, Mapping):
        raise SpeculativeConfigError(
            f"speculative_config expects a dict, got {type(settings).__name__}"
        )
    unknown = sorted(str(key) for key in settings if key not in ALLOWED_KEYS)
    if unknown:
        raise SpeculativeConfigError(
            f"speculative_config: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(ALLOWED_KEYS))}"
        )

    method = settings.get("method")
    if not isinstance(method, str) or not method:
        raise SpeculativeConfigError("speculative_config: 'method' is required (e.g. eagle3)")
    if method not in VLLM_SPECULATIVE_METHODS:
        raise SpeculativeConfigError(
            f"speculative_config: unknown method {method!r}; vLLM knows "
            f"{', '.join(sorted(VLLM_SPECULATIVE_METHODS))}"
        )
    result: dict[str, Any] = {"method": method}

    model = settings.get("model")
    if model is None or model == "":
        if method in DRAFT_CHECKPOINT_METHODS:
            raise SpeculativeConfigError(
                f"speculative_config: method {method} needs 'model', the drafter's directory"
            )
    elif not isinstance(model, str) or not model.startswith("/"):
        raise SpeculativeConfigError(
            f"speculative_config: 'model' must be an absolute path on the host, got {model!r}"
        )
    else:
        result["model"] = model.rstrip("/") or "/"

    if "num_speculative_tokens" not in settings:
        raise SpeculativeConfigError("speculative_config: 'num_speculative_tokens' is required")
    result["num_speculative_tokens"] = check_num_speculative_tokens(
        settings["num_speculative_tokens"]
    )

    draft_tp = settings.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp != "":
        size = _as_int("draft_tensor_parallel_size", draft_tp)
        if size < 1:
            raise SpeculativeConfigError(
                f"speculative_config: draft_tensor_parallel_size must be >= 1, got {size}"
            )
        result["draft_tensor_parallel_size"] = size

    return json.dumps(result, separators=(",", ":"), sort_keys=True)


def check_num_speculative_tokens(value: object) -> int:
    """``value`` as an int within the bounds, or :class:`SpeculativeConfigError`."""
    tokens = _as_int("num_speculative_tokens", value)
    if not MIN_SPECULATIVE_TOKENS <= tokens <= MAX_SPECULATIVE_TOKENS:
        raise SpeculativeConfigError(
            f"speculative_config: num_speculative_tokens must be in "
            f"{MIN_SPECULATIVE_TOKENS}..{MAX_SPECULATIVE_TOKENS}, got {tokens}"
        )
    return tokens
