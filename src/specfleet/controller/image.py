"""The Debian 12 systemd base image for Molecule scenarios and the lab.

No registry is reachable, so the image is built locally with debootstrap and
`docker import`. It is keyed by a hash of its recipe: an unchanged recipe
reuses the image (or the cached root tarball when Docker lost it), and any
change to the recipe builds a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from specfleet.controller.paths import cache_dir, cache_lock

IMAGE_REPOSITORY = "specfleet/debian12-systemd"


@dataclass(frozen=True)
class ImageRecipe:
    suite: str = "bookworm"
    variant: str = "minbase"
    # Empty: debootstrap's own default mirror for the suite.
    mirror: str = ""
    # What a bare cloud host has: systemd as PID 1, sshd (the lab is reached
    # over SSH, as a fleet is), Python for Ansible, sudo. python3-venv,
    # python3-apt (Ansible's apt module; Debian's cloud images ship it) and
    # iproute2 are there on every real Debian server image.
    include: tuple[str, ...] = (
        "systemd",
        "openssh-server",
        "systemd-sysv",
        "dbus",
        "python3",
        "python3-venv",
        "python3-apt",
        "sudo",
        "iproute2",
        "procps",
        "ca-certificates",
    )
    # `docker import` accepts only a few instructions (no STOPSIGNAL): the
    # stop signal for systemd is set where containers are created instead.
    docker_changes: tuple[str, ...] = ('CMD ["/lib/systemd/systemd"]',)

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def tag(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.digest()}"


def _docker(*args: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=check, text=True, **kwargs)  # type: ignore[call-overload]


def image_exists(tag: str) -> bool:
    result = _docker("image", "inspect", tag, check=False, capture_output=True)
    return result.returncode == 0


def _debootstrap_tarball(recipe: ImageRecipe, tarball: Path) -> None:
    """Build the root filesystem and store it as a tarball, atomically."""
    with tempfile.TemporaryDirectory(prefix="specfleet-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                f"--variant={recipe.variant}",
                f"--include={','.join(recipe.include)}",
                recipe.suite,
                str(rootfs),
                *([recipe.mirror] if recipe.mirror else []),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Debootstrap leaves the build host's name and apt lists behind; a
        # fresh host has neither.
        (rootfs / "etc/hostname").write_text("localhost\n")
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        # Never updated: Ansible's apt module judges the lists' age by this
        # folder's time, and would otherwise trust the empty lists for a day.
        os.utime(rootfs / "var/lib/apt/lists", (0, 0))
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)


def ensure_image(recipe: ImageRecipe | None = None, *, rebuild: bool = False) -> str:
    """Return the tag of the base image, building it only when needed."""
    recipe = recipe or ImageRecipe()
    tag = recipe.tag()
    if image_exists(tag) and not rebuild:
        _docker("tag", tag, f"{IMAGE_REPOSITORY}:latest")
        return tag
    # One build at a time: a second caller waits and finds the image (or its tarball).
    with cache_lock("images"):
        if image_exists(tag) and not rebuild:
            _docker("tag", tag, f"{IMAGE_REPOSITORY}:latest")
            return tag
        tarball = cache_dir("images") / f"{recipe.digest()}.tar"
        if rebuild or not tarball.exists():
            _debootstrap_tarball(recipe, tarball)
            for stale in tarball.parent.glob("*.tar"):
                if stale != tarball:
                    stale.unlink()
        changes = [arg for change in recipe.docker_changes for arg in ("--change", change)]
        _docker("import", *changes, str(tarball), tag, capture_output=True)
        _docker("tag", tag, f"{IMAGE_REPOSITORY}:latest")
    return tag
