"""A served model pinned like a stack: its manifest, the one description of what a host must
hold before the model counts.

A manifest names the model, where it comes from (``source``: a shared folder, an HTTP(S)
mirror's base URL, or ``hf://OWNER/NAME`` for the Hugging Face Hub), the revision it was
pinned at, and every file with its size and sha256. The controller writes it
(`specfleet model pin`, specfleet.controller.modelpin); every host reads it before it fetches
a byte (specfleet.host.model_fetch), and its digest names the model's folder on the hosts,
so two manifests that differ in one byte of one file can never share a folder.

Read by root on the hosts from the controller's copy, so everything in it is checked here:
a file's path must stay inside the model's folder (relative, no ``..``, no empty or hidden
component, no duplicates), sizes are whole numbers, digests 64 hexadecimal characters.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT = 1
DIGEST = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: The folder a model lands in on a host: its name and the first 16 hex of its manifest's
#: digest (as a stack's venv is named by its lock).
FOLDER_DIGEST_CHARS = 16


class ManifestError(ValueError):
    """The manifest cannot be used; the message says which entry and why."""


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    name: str
    source: str
    revision: str
    files: tuple[ModelFile, ...]

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.files)

    def document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "source": self.source,
            "revision": self.revision,
            "files": [
                {"path": entry.path, "size": entry.size, "sha256": entry.sha256}
                for entry in self.files
            ],
        }

    def dumps(self) -> str:
        """The canonical text: sorted keys, files sorted by path. What is hashed and written."""
        return json.dumps(self.document(), sort_keys=True, indent=2) + "\n"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.digest[:FOLDER_DIGEST_CHARS]}"


def safe_relative_path(path: Any) -> str:
    """``path`` as a relative POSIX path inside a folder, or ManifestError."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"file path {path!r}: not a non-empty string")
    if "\\" in path or "\0" in path or path.startswith("/"):
        raise ManifestError(f"file path {path!r}: must be relative, with / between components")
    parts = PurePosixPath(path).parts
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts) or "//" in path:
        raise ManifestError(f"file path {path!r}: no '.', '..' or hidden components")
    return path


def from_document(document: Any) -> Manifest:
    """A checked Manifest from its parsed JSON; ManifestError names the first problem."""
    if not isinstance(document, dict):
        raise ManifestError("not a JSON object")
    if document.get("format") != FORMAT:
        raise ManifestError(f"format {document.get('format')!r}: this version reads {FORMAT}")
    name = document.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ManifestError(f"name {name!r}: letters, digits, '.', '_' and '-' only")
    for key in ("source", "revision"):
        if not isinstance(document.get(key), str):
            raise ManifestError(f"{key}: not a string")
    entries = document.get("files")
    if not isinstance(entries, list) or not entries:
        raise ManifestError("files: not a non-empty list")
    files = []
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise ManifestError(f"file entry {entry!r}: not an object")
        path = safe_relative_path(entry.get("path"))
        size, sha256 = entry.get("size"), entry.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ManifestError(f"{path}: size {size!r} is not a whole number of bytes")
        if not isinstance(sha256, str) or not DIGEST.match(sha256):
            raise ManifestError(f"{path}: sha256 {sha256!r} is not 64 hexadecimal characters")
        folded = path.casefold()
        if folded in seen or any(other.startswith(folded + "/") for other in seen):
            raise ManifestError(f"{path}: named twice, or both a file and a folder")
        if any(folded.startswith(other + "/") for other in seen):
            raise ManifestError(f"{path}: named twice, or both a file and a folder")
        seen.add(folded)
        files.append(ModelFile(path, size, sha256))
    files.sort(key=lambda entry: entry.path)
    return Manifest(name, document["source"], document["revision"], tuple(files))


def load(path: Path | str) -> Manifest:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ManifestError(f"{path}: {error}") from error
    try:
        return from_document(document)
    except ManifestError as error:
        raise ManifestError(f"{path}: {error}") from error
