"""The project's host-side Python as one content-addressed tarball.

Some of ``specfleet`` runs on the hosts, inside the stack venv: the drafter pipeline, the
health gate, the speculative-counter reader, the tiny-model generator, the packaged model's
converter and prompts. The ``common`` role installs exactly that part (never the
controller's modules, which need Ansible) under ``/opt/specfleet/lib/<hash>/``. The
tarball is byte-identical for identical sources (sorted members, fixed owner, mode and
time), so its name, the hash of its content, says whether a host already has it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

from specfleet.paths import cache_dir

#: The modules that run on hosts (standard library plus the stack venv's packages).
#: tests/test_hostpackage.py checks that none of them imports a controller module.
HOST_MODULES: tuple[str, ...] = (
    "specfleet/__init__.py",
    "specfleet/hashing.py",
    "specfleet/speculative.py",
    "specfleet/metrics.py",
    "specfleet/gate.py",
    "specfleet/serve.py",
    "specfleet/routes.py",
    "specfleet/journal.py",
    "specfleet/drafter_store.py",
    "specfleet/tinymodels.py",
    "specfleet/ggufmodel.py",
    "specfleet/drafter_init.py",
    "specfleet/docprompts.py",
    "specfleet/drafter/*.py",
)


#: Written last into the tarball (see build_host_package).
MANIFEST = "specfleet-host-package.json"


def host_files(src: Path) -> list[Path]:
    """The host-side source files under ``src`` (the folder holding ``specfleet/``)."""
    files = sorted({path for pattern in HOST_MODULES for path in src.glob(pattern)})
    if not files:
        raise FileNotFoundError(f"no specfleet sources under {src}")
    return files


def content_hash(src: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(src).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _member(name: str, data: bytes | None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = len(data)
        info.mode = 0o644
    return info


def build_host_package(src: Path) -> Path:
    """Return ``<cache>/host-package/specfleet-<hash>.tar``, writing it when it is new."""
    files = host_files(src)
    digest = content_hash(src, files)
    target = cache_dir("host-package") / f"specfleet-{digest}.tar"
    if target.is_file():
        return target
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        folders = sorted({parent for path in files for parent in path.relative_to(src).parents})
        for folder in folders:
            if folder != Path("."):
                tar.addfile(_member(folder.as_posix(), None))
        for path in files:
            data = path.read_bytes()
            tar.addfile(_member(path.relative_to(src).as_posix(), data), io.BytesIO(data))
        # Last member: tar extracts in order, so its presence means the rest is there.
        manifest = json.dumps({"hash": digest, "files": len(files)}).encode()
        tar.addfile(_member(MANIFEST, manifest), io.BytesIO(manifest))
    # Several forks of one run build it at once: each writes its own temporary file and
    # replaces the target atomically (identical bytes, so the last one in wins nothing).
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".partial-", delete=False) as tmp:
        tmp.write(buffer.getvalue())
    os.replace(tmp.name, target)
    return target
