"""The project's host-side Python as one content-addressed tarball.

What runs on the hosts, inside the stack venv, is ``specfleet/host/``: the drafter
pipeline, the health gate, the speculative-counter reader, the server's entry point; and,
for lab hosts only, ``specfleet/host/lab/`` (the tiny models' and the packaged model's
generators). The ``common`` role installs exactly that folder (never ``controller/``, which
needs Ansible) under ``/opt/specfleet/lib/<hash>/``. The tarball is byte-identical for
identical sources (sorted members, fixed owner, mode and time), so its name, the hash of its
content, says whether a host already has it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

from specfleet.controller.paths import cache_dir

#: The folder that runs on hosts, and the part of it only lab hosts get. The package is
#: this folder (with ``specfleet/__init__.py`` above it), so a module's path says where it
#: runs. tests/test_hostpackage.py checks that nothing in it imports the controller's code.
HOST_DIR = Path("specfleet") / "host"
LAB_DIR = HOST_DIR / "lab"


#: Written last into the tarball (see build_host_package).
MANIFEST = "specfleet-host-package.json"


def host_files(src: Path, *, lab: bool) -> list[Path]:
    """The host-side source files under ``src`` (the folder holding ``specfleet/``): every
    ``.py`` under ``specfleet/host/``, less ``host/lab/`` unless ``lab``."""
    host = src / HOST_DIR
    if not (host / "__init__.py").is_file():
        raise FileNotFoundError(f"no specfleet host sources under {src}")
    files = [src / "specfleet" / "__init__.py", *host.rglob("*.py")]
    if not lab:
        files = [path for path in files if (src / LAB_DIR) not in path.parents]
    return sorted(path for path in files if "__pycache__" not in path.parts)


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


def build_host_package(src: Path, *, lab: bool = False) -> Path:
    """Return ``<cache>/host-package/specfleet-<hash>.tar``, writing it when it is new.

    ``lab`` adds ``specfleet/host/lab/`` (the lab's model generators): a fleet host's
    package has none of it, and the two packages have different hashes."""
    files = host_files(src, lab=lab)
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
