"""Jinja2 filter ``drafter_digest``: a drafter folder's content hash, on the controller.

The same identity the training host and the serving hosts compute
(``specfleet.host.drafter_store.digest_of_files``: sha256 over each drafter file's name and
sha256), so the controller re-checks the bytes it carries between them. A link or anything
but a regular file in place of a drafter file is an error.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from ansible.errors import AnsibleFilterError

from specfleet.host.drafter_store import DRAFTER_FILES, digest_of_files
from specfleet.host.hashing import sha256_file


def drafter_digest(folder: str) -> str:
    hashes = {}
    for name in DRAFTER_FILES:
        path = Path(folder) / name
        try:
            info = os.lstat(path)
        except OSError as error:
            raise AnsibleFilterError(f"drafter_digest: {path}: {error.strerror}") from error
        if not stat.S_ISREG(info.st_mode):
            raise AnsibleFilterError(f"drafter_digest: {path} is not a regular file")
        hashes[name] = sha256_file(path)
    return digest_of_files(hashes)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., str]]:
        return {"drafter_digest": drafter_digest}
