"""The module's observable behaviour on every release of the matrix, pinned.

For each release a fixed sequence of runs (check mode, present, present again, absent in
check mode, absent, absent again, then present and absent with a stale unchecked-hash
cache and ``recompile``) is traced: each run's JSON result, normalised for what differs
from one run to the next (the temporary root, the interpreter's cache tag, the echo of
options that were not passed), the source's bytes and the names of the files under
``vllm/`` afterwards. The digest of each release's trace was recorded from the module
before its restructuring; a refactoring must leave it unchanged.

To see a trace (after an intended change of behaviour, to record new digests):
``SPECFLEET_GOLDEN_SHOW=1 pytest tests/test_vllm_eagle3_whitelist_golden.py -s``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from vllm_releases import EXPECTED_FILE, RELEASES, FakeVllm

TYPES = ["mistral", "qwen3_moe", "kimi_k2"]

# sha256 of each release's normalised trace, recorded from the module as it was before the
# restructuring of issue 10 (at commit ee8436f).
GOLDEN: dict[str, str] = {
    "0.8.5": "9122e0527d1a6797e971b5d6bd6b2fde59712723c78df8beda6182d56c44b751",
    "0.10.0": "6cf491a090acf14def5aa6952be20a82ca3d109761263bcb440b1a021e37c562",
    "0.10.1.1": "2d28a2df75a7fc0c5c522fc6d909a538238684a48d0838fc7f7fe90042974bc3",
    "0.11.0": "1f69c39497e575233687bd6c2c2ab31fe541c0b62e54a814836171724dd3713a",
    "0.16.0": "291d3cb8ec6694b82aacbc5dea547c0b6f10d1534c9a8b9a47dc961e91cb71e0",
    "0.17.1": "a165169736b8e049191715bdf5ded7eb8cdca43e2fb875cce304d642210dd025",
    "0.18.0": "51310c7ce2e2d5f5de5b9c2797381498b479085897630570459f415134a2359c",
    "0.20.2": "f2beddb06ebc3de796373208fdfdaa35262380372bb2e50bc053396a81926dbb",
    "0.21.0": "18927c3532db9c41bc0700e9ae895b87e9a2adb447d174e393a0d0342584fd19",
    "0.22.0": "7c1c4e8720b80488d77b8ce3c659c0323020b52c796e345625ab14b8bafbc068",
    "0.32.0": "82508ba661b42ebf39e8a1ec0cdcc5e2ca19c52fcfa3eda976260c55c394e47b",
}

# Options added after the recording; the invocation echo lists them as null.
NEW_OPTIONS = ("pycache_prefix", "record")


def _normalise(value: object, root: str, tag: str) -> object:
    if isinstance(value, str):
        return value.replace(root, "<root>").replace(tag, "<tag>")
    if isinstance(value, list):
        return [_normalise(v, root, tag) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v, root, tag) for k, v in sorted(value.items())}
    return value


def _result(result: dict[str, object], root: str, tag: str) -> object:
    result = dict(result)
    invocation = result.get("invocation")
    if isinstance(invocation, dict):
        args = dict(invocation.get("module_args", {}))
        for name in NEW_OPTIONS:
            if args.get(name) is None:
                args.pop(name, None)
        result["invocation"] = {**invocation, "module_args": args}
    return _normalise(result, root, tag)


def _files(vllm: FakeVllm, tag: str) -> list[str]:
    return sorted(
        str(p.relative_to(vllm.site)).replace(tag, "<tag>")
        for p in (vllm.site / "vllm").rglob("*")
        if p.is_file()
    )


def _unchecked_cache(vllm: FakeVllm) -> None:
    vllm.write_unchecked_cache()


def trace(root: Path, version: str) -> list[object]:
    vllm = FakeVllm(root / version, version)
    tag = sys.implementation.cache_tag
    steps: list[tuple[str, dict[str, object], bool]] = [
        ("present check", {"model_types": TYPES}, True),
        ("present", {"model_types": TYPES}, False),
        ("present again", {"model_types": TYPES}, False),
        ("absent check", {"state": "absent"}, True),
        ("absent", {"state": "absent"}, False),
        ("absent again", {"state": "absent"}, False),
    ]
    out: list[object] = []

    def step(name: str, args: dict[str, object], check: bool) -> None:
        result = vllm.run(check=check, diff=True, **args)
        source = vllm.source.read_bytes() if vllm.source else b""
        out.append(
            {
                "step": name,
                "result": _result(result, str(root), tag),
                "source_sha256": hashlib.sha256(source).hexdigest(),
                "files": _files(vllm, tag),
            }
        )

    for name, args, check in steps:
        step(name, args, check)
    if EXPECTED_FILE[version] is not None:
        _unchecked_cache(vllm)
        step("present recompile", {"model_types": ["mistral"], "recompile": True}, False)
        _unchecked_cache(vllm)  # stale again: a cache of the patched source, before absent
        step("absent recompile", {"state": "absent", "recompile": True}, False)
    return out


def digest(steps: list[object]) -> str:
    return hashlib.sha256(json.dumps(steps, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("version", RELEASES)
def test_trace_is_unchanged(tmp_path: Path, version: str) -> None:
    steps = trace(tmp_path, version)
    if os.environ.get("SPECFLEET_GOLDEN_SHOW"):
        print(json.dumps({"version": version, "digest": digest(steps), "steps": steps}))
    assert digest(steps) == GOLDEN[version], json.dumps(steps, indent=1)
