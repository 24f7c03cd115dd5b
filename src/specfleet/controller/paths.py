"""Where specfleet finds its checkout and keeps its content-addressed caches."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The checkout holding ansible.cfg (the CLI runs playbooks from there)."""
    override = os.environ.get("SPECFLEET_ROOT")
    if override:
        return Path(override).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "ansible.cfg").is_file() and (parent / "playbooks").is_dir():
            return parent
    return Path.cwd()


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root, created on demand.

    The cache lives outside the checkout so that a fresh clone (CI) reuses
    the debootstrap image, the wheelhouse and fetched vLLM releases.
    """
    root = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
