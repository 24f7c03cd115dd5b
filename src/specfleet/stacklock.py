"""Host stack locks: what every GPU host of a profile runs, pinned exactly.

A stack is specified in `locks/<name>.toml` (top-level requirements, the
packages left out and why) and resolved into `locks/<name>.txt`, one
`name==version` pin a line. The hash of the resolved pins names both the
wheelhouse on the controller and the venv on each host, so an unchanged lock
reuses both and a changed one builds new ones beside the old.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from specfleet.paths import repo_root


@dataclass(frozen=True)
class StackSpec:
    name: str
    profile: str
    python_version: str
    glibc: str
    arch: str
    requirements: tuple[str, ...]
    exclude: dict[str, str]

    @classmethod
    def load(cls, name: str, locks_dir: Path | None = None) -> StackSpec:
        path = (locks_dir or repo_root() / "locks") / f"{name}.toml"
        if not path.is_file():
            raise FileNotFoundError(f"no stack spec {path}")
        data = tomllib.loads(path.read_text())
        return cls(
            name=name,
            profile=data["profile"],
            python_version=data["python_version"],
            glibc=data["glibc"],
            arch=data["arch"],
            requirements=tuple(data["requirements"]),
            exclude=dict(data.get("exclude", {})),
        )

    def pip_target_args(self) -> list[str]:
        """pip options that select wheels for the hosts, not the controller.

        pip matches each given platform tag exactly, so every manylinux tag
        the hosts' glibc accepts is listed (PEP 600 and the legacy aliases).
        """
        major, minor = (int(part) for part in self.glibc.split("."))
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 4, -1)]
        tags += [f"manylinux{legacy}_{self.arch}" for legacy in ("2014", "2010", "1")]
        platform_args = [arg for tag in tags for arg in ("--platform", tag)]
        return [
            "--only-binary=:all:",
            "--python-version", self.python_version,
            "--implementation", "cp",
            *platform_args,
        ]  # fmt: skip


@dataclass(frozen=True)
class StackLock:
    name: str
    pins: tuple[str, ...]

    @property
    def digest(self) -> str:
        """Content hash of the pins; names the wheelhouse and the host venv."""
        return hashlib.sha256("\n".join(self.pins).encode()).hexdigest()[:16]

    def version_of(self, package: str) -> str | None:
        key = _normalise(package)
        for pin in self.pins:
            pin_name, _, version = pin.partition("==")
            if _normalise(pin_name) == key:
                return version
        return None

    @classmethod
    def read(cls, name: str, locks_dir: Path | None = None) -> StackLock:
        path = (locks_dir or repo_root() / "locks") / f"{name}.txt"
        if not path.is_file():
            raise FileNotFoundError(f"no stack lock {path}: run `specfleet lock {name}`")
        pins = tuple(
            line.strip()
            for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        )
        return cls(name=name, pins=pins)

    def write(self, locks_dir: Path | None = None) -> Path:
        path = (locks_dir or repo_root() / "locks") / f"{self.name}.txt"
        header = f"# Written by `specfleet lock {self.name}` from {self.name}.toml; do not edit.\n"
        path.write_text(header + "\n".join(self.pins) + "\n")
        return path


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def resolve(spec: StackSpec) -> StackLock:
    """Resolve the spec's requirements with pip, without installing anything."""
    with tempfile.TemporaryDirectory(prefix="specfleet-lock-") as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                "--ignore-installed", "--target", str(Path(tmp) / "unused"),
                *spec.pip_target_args(), "--report", str(report), *spec.requirements,
            ],
            check=True,
        )  # fmt: skip
        resolved = json.loads(report.read_text())["install"]
    excluded = {_normalise(name) for name in spec.exclude}
    pins = sorted(
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in resolved
        if _normalise(item["metadata"]["name"]) not in excluded
    )
    return StackLock(name=spec.name, pins=tuple(pins))
