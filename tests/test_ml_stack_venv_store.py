"""The venv store's host script (roles/ml_stack/files/venv_store.py), run as ml_stack runs it,
with GNU tar, on a venv of its own: packed, unpacked only when its sha256 is one the controller
recorded, and refused, with nothing left behind, when it was swapped, cut, absent or reaches
outside the venv."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from specfleet.controller.paths import repo_root

SCRIPT = repo_root() / "roles" / "ml_stack" / "files" / "venv_store.py"
DIGEST = "0123456789abcdef"


def store(*args: str | Path) -> tuple[int, dict]:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, check=False
    )
    lines = run.stdout.strip().splitlines()
    return run.returncode, (json.loads(lines[-1]) if lines else {"stderr": run.stderr})


def a_venv(venvs: Path) -> Path:
    """A venv's shape (as `python3 -m venv` makes it): its interpreter links to the base
    Python (python3 absolute, the others to python3), a relative lib64 link,
    packages with bytecode, and the manifest the host writes after its own probe."""
    venv = venvs / DIGEST
    site = venv / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("VALUE = 1\n")
    (site / "__pycache__").mkdir()
    (site / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(os.urandom(64))
    (venv / "bin").mkdir()
    (venv / "bin" / "python3").symlink_to(sys.executable)
    (venv / "bin" / "python").symlink_to("python3")
    (venv / "bin" / "python3.11").symlink_to("python3")
    (venv / "lib64").symlink_to("lib")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "specfleet-stack.json").write_text('{"host": "the builder"}\n')
    return venv


def tree(root: Path) -> dict[str, str]:
    found = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            found[key] = "-> " + os.readlink(path)
        elif path.is_file():
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def nothing_left(venvs: Path) -> bool:
    return not (venvs / DIGEST).exists() and not list(venvs.glob(".*unpacking"))


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Path, str]:
    built = a_venv(tmp_path / "builder")
    archive = tmp_path / "store" / f"{DIGEST}-platform.tar"
    rc, result = store("pack", built, archive)
    assert rc == 0, result
    assert result["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert not list(archive.parent.glob(".*partial"))
    return built, archive, result["sha256"]


def test_a_packed_venv_unpacks_whole_on_another_host(
    tmp_path: Path, packed: tuple[Path, Path, str]
) -> None:
    built, archive, sha = packed
    venvs = tmp_path / "other" / "venvs"
    venvs.mkdir(parents=True)
    rc, result = store("unpack", archive, f"{'0' * 64},{sha}", venvs / DIGEST)
    assert rc == 0, result
    unpacked = tree(venvs / DIGEST)
    origin = json.loads((venvs / DIGEST / "specfleet-venv-origin.json").read_text())
    assert origin == {"archive": str(archive), "sha256": sha}
    # Everything but the builder's manifest (each host writes its own after its probe).
    expected = {k: v for k, v in tree(built).items() if k != "specfleet-stack.json"}
    assert {k: v for k, v in unpacked.items() if k != "specfleet-venv-origin.json"} == expected
    assert not list(venvs.glob(".*unpacking"))


def swap_a_byte(data: bytes) -> bytes:
    return data.replace(b"VALUE = 1", b"VALUE = 2")


def cut_to_a_third(data: bytes) -> bytes:
    return data[: len(data) // 3]


@pytest.mark.parametrize(
    ("damage", "said"),
    [(swap_a_byte, "not one the controller recorded"), (cut_to_a_third, "")],
    ids=["swapped", "cut"],
)
def test_a_damaged_archive_is_refused_and_nothing_is_left(
    tmp_path: Path, packed: tuple[Path, Path, str], damage: Callable[[bytes], bytes], said: str
) -> None:
    _, archive, sha = packed
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    archive.write_bytes(damage(archive.read_bytes()))
    rc, result = store("unpack", archive, sha, venvs / DIGEST)
    assert rc == 3, result
    assert said in result["refused"]
    assert nothing_left(venvs)


def test_a_recorded_archive_that_reaches_outside_the_venv_is_refused(tmp_path: Path) -> None:
    """Even an archive whose sha256 is recorded must not plant a link out of the venv."""
    archive = tmp_path / "store" / "evil.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        folder = tarfile.TarInfo(DIGEST)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        link = tarfile.TarInfo(f"{DIGEST}/lib/python3.11/site-packages/evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(link)
        up = tarfile.TarInfo(f"{DIGEST}/lib/up")
        up.type, up.linkname = tarfile.SYMTYPE, "../.."
        tar.addfile(up)
        data = b"x = 1\n"
        member = tarfile.TarInfo(f"{DIGEST}/ok.py")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    rc, result = store("unpack", archive, sha, venvs / DIGEST)
    assert rc == 3, result
    assert "outside the venv" in result["refused"], result
    assert "-> /etc" in result["refused"] and "-> ../.." in result["refused"], result
    assert nothing_left(venvs)


def test_no_archive_in_the_store_is_its_own_exit(tmp_path: Path) -> None:
    venvs = tmp_path / "venvs"
    venvs.mkdir()
    rc, result = store("unpack", tmp_path / "store" / "none.tar", "0" * 64, venvs / DIGEST)
    assert rc == 4 and "absent" in result
    assert nothing_left(venvs)


def test_what_a_killed_unpack_left_is_removed_by_the_next(
    tmp_path: Path, packed: tuple[Path, Path, str]
) -> None:
    _, archive, sha = packed
    venvs = tmp_path / "venvs"
    leftover = venvs / f".{DIGEST}.4242.unpacking" / DIGEST
    leftover.mkdir(parents=True)
    (leftover / "half.py").write_text("")
    rc, result = store("unpack", archive, sha, venvs / DIGEST)
    assert rc == 0, result
    assert sorted(p.name for p in venvs.iterdir()) == [DIGEST]


def test_a_failed_pack_leaves_no_archive_and_no_partial(tmp_path: Path) -> None:
    archive = tmp_path / "store" / "gone.tar"
    rc, _ = store("pack", tmp_path / "no-such-venv", archive)
    assert rc != 0
    assert not archive.exists() and not list(archive.parent.glob(".*"))
