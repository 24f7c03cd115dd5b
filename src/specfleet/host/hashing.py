"""The one sha256 of a file the project computes (locks, wheelhouses, drafters, models)."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """The file's sha256 as hex, read in 1 MiB blocks (drafters and wheels are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
