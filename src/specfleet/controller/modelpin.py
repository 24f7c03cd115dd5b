"""`specfleet model pin`: write a served model's manifest (specfleet.host.model_manifest) on
the controller, from the files themselves or from the Hugging Face Hub's own record.

- From a folder (the mirror's or the shared folder's copy, or a download): every regular
  file below it, read and hashed here. Hidden entries (``.git``, huggingface_hub's
  ``.cache``) are not part of a model. Links are followed: the controller trusts its own
  folder (a Hub cache's snapshot is links to its blobs), and the hosts check every byte
  against the manifest anyway.
- From the Hub (``hf://OWNER/NAME``): the revision is resolved to its commit, so a branch
  name never reaches the inventory; large files carry their sha256 in the Hub's record (Git
  LFS), and the others (configs, tokenizers: small) are downloaded at that commit and
  hashed here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specfleet.host.hashing import sha256_file
from specfleet.host.model_manifest import FORMAT, Manifest, ManifestError, from_document


def files_of(folder: Path) -> list[dict[str, Any]]:
    """Every non-hidden regular file below ``folder`` (links followed), with its size and
    sha256, by path relative to it."""
    if not folder.is_dir():
        raise ManifestError(f"{folder}: not a folder")
    entries = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if name.startswith(".") or not path.is_file():
                continue
            relative = path.relative_to(folder).as_posix()
            entries.append(
                {"path": relative, "size": path.stat().st_size, "sha256": sha256_file(path)}
            )
    if not entries:
        raise ManifestError(f"{folder}: no files to pin")
    return entries


def pin_folder(folder: Path, name: str, source: str, revision: str = "") -> Manifest:
    return from_document(
        {
            "format": FORMAT,
            "name": name,
            "source": source,
            "revision": revision,
            "files": files_of(folder),
        }
    )


def pin_hub(
    repo_id: str,
    revision: str,
    name: str,
    *,
    api: Any = None,
    download: Callable[..., str] | None = None,
) -> Manifest:
    """The manifest of ``repo_id`` at ``revision`` (resolved to its commit) from the Hub
    (``HF_ENDPOINT`` for an organisation's own). ``api`` and ``download`` default to
    huggingface_hub's HfApi and hf_hub_download."""
    if api is None or download is None:
        try:
            from huggingface_hub import HfApi, hf_hub_download
        except ImportError as error:
            raise ManifestError(
                "pinning from the Hub needs huggingface_hub on the controller"
                " (.venv/bin/pip install huggingface_hub); or pin a downloaded folder"
            ) from error

        api = api or HfApi()
        download = download or hf_hub_download
    info = api.model_info(repo_id, revision=revision or None, files_metadata=True)
    commit = info.sha
    entries = []
    for sibling in info.siblings:
        if sibling.rfilename.startswith(".") or "/." in sibling.rfilename:
            continue
        lfs = getattr(sibling, "lfs", None)
        if lfs is not None:
            entries.append({"path": sibling.rfilename, "size": lfs.size, "sha256": lfs.sha256})
            continue
        local = Path(download(repo_id=repo_id, filename=sibling.rfilename, revision=commit))
        entries.append(
            {"path": sibling.rfilename, "size": local.stat().st_size, "sha256": sha256_file(local)}
        )
    return from_document(
        {
            "format": FORMAT,
            "name": name,
            "source": f"hf://{repo_id}",
            "revision": commit,
            "files": entries,
        }
    )


def write(manifest: Manifest, path: Path) -> Path:
    """Write the manifest's canonical text atomically (a reader never sees half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(manifest.dumps())
    os.replace(staged, path)
    return path
