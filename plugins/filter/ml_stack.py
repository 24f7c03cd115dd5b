"""Filters for the ml_stack role: lock digests, wheelhouse coverage, flash-attn checks."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from specfleet.controller.stacklock import (
    lock_host_mismatches,
    normalise_name,
    parse_lock_text,
    pin_version,
    pins_digest,
)

# flash-attn's release wheels carry their build in the local version, e.g.
# flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl
_FLASH_ATTN_WHEEL = re.compile(
    r"^flash_attn-(?P<version>[^+-]+)\+cu(?P<cuda>\d+)torch(?P<torch>\d+\.\d+)"
    r"cxx11abi(?P<abi>TRUE|FALSE)-(?P<python>cp\d+)-(?P=python)-linux_x86_64\.whl$"
)
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")


def stack_pins(lock_text: str) -> list[str]:
    """The pins (`name==version`) of a lock file's text, read by the lock's own parser;
    a lock with anything but exact, hashed pins is refused."""
    try:
        pins, hashes, _ = parse_lock_text(lock_text)
    except ValueError as error:
        raise AnsibleFilterError(f"stack lock lines are not exact pins: {error}") from error
    bad = [pin for pin in pins if not _PIN.match(pin)]
    if bad:
        raise AnsibleFilterError(f"stack lock lines are not exact pins (name==version): {bad}")
    if not pins:
        raise AnsibleFilterError("stack lock has no pins")
    unhashed = [pin for pin in pins if not hashes.get(pin)]
    if unhashed:
        raise AnsibleFilterError(
            f"stack lock pins without a sha256 hash (nothing unhashed is installed): {unhashed}"
        )
    return pins


def stack_host_mismatches(lock_text: str, host: Mapping[str, str]) -> list[str]:
    """Why a lock does not fit a host (its python, glibc, arch); empty: it fits."""
    return lock_host_mismatches(
        lock_text, str(host["python"]), str(host["glibc"]), str(host.get("arch", ""))
    )


def stack_pin_sha256(lock_text: str, package: str) -> str:
    """The sha256 (hex) the lock accepts for `package`'s file: what names and checks a
    packaged model on the host (roles/packaged_model)."""
    pins, hashes, _ = parse_lock_text(lock_text)
    version = pin_version(pins, package)
    if not version:
        raise AnsibleFilterError(f"the lock does not pin {package}")
    pin = next(p for p in pins if pin_version([p], package) == version)
    found = hashes.get(pin) or ()
    if len(found) != 1 or not found[0].startswith("sha256:"):
        raise AnsibleFilterError(f"{pin}: the lock must give exactly one sha256, got {found}")
    return found[0].removeprefix("sha256:")


def stack_pins_without(pins: Iterable[str], packages: Iterable[str]) -> list[str]:
    """The pins except those of `packages` (built on the host after the rest)."""
    skip = {normalise_name(name) for name in packages}
    return [pin for pin in pins if normalise_name(pin.partition("==")[0]) not in skip]


def wheelhouse_missing(pins: Iterable[str], wheel_files: Iterable[str]) -> list[str]:
    """Pins that no wheel (or sdist) in the wheelhouse provides."""
    available = set()
    for path in wheel_files:
        filename = path.rsplit("/", 1)[-1]
        if filename.endswith(".whl"):
            name, version = filename.split("-")[:2]
        elif filename.endswith(".tar.gz"):
            name, _, version = filename.removesuffix(".tar.gz").rpartition("-")
        else:
            continue
        available.add((normalise_name(name), version))
    missing = []
    for pin in pins:
        match = _PIN.match(pin)
        if match is None or (normalise_name(match["name"]), match["version"]) not in available:
            missing.append(pin)
    return missing


def flash_attn_wheel_mismatches(wheel: str, venv: Mapping[str, Any]) -> list[str]:
    """Why a prebuilt flash-attn wheel does not fit the venv's torch (empty: it fits).

    `venv` holds what the venv's interpreter reported: torch (e.g. "2.8.0"),
    cuda (e.g. "12.8"), cxx11abi (bool) and python (e.g. "cp312").
    """
    # Release URLs quote the local version's "+" (flash_attn-2.8.3%2Bcu12torch2.8...).
    filename = urllib.parse.unquote(wheel.rsplit("/", 1)[-1])
    match = _FLASH_ATTN_WHEEL.match(filename)
    if match is None:
        return [f"{filename} is not named like a flash-attn release wheel"]
    problems = []
    torch_minor = ".".join(str(venv["torch"]).split("+")[0].split(".")[:2])
    if match["torch"] != torch_minor:
        problems.append(f"built for torch {match['torch']}, the venv has torch {venv['torch']}")
    cuda_major = str(venv.get("cuda") or "none").split(".")[0]
    if match["cuda"] != cuda_major:
        problems.append(f"built for CUDA {match['cuda']}, torch uses CUDA {venv.get('cuda')}")
    if (match["abi"] == "TRUE") != bool(venv["cxx11abi"]):
        problems.append(
            f"built with cxx11abi={match['abi']}, torch has cxx11abi={venv['cxx11abi']}"
        )
    if match["python"] != venv["python"]:
        problems.append(f"built for {match['python']}, the venv runs {venv['python']}")
    return problems


def flash_attn_import_state(result: Mapping[str, Any]) -> str:
    """Classify `python -c 'import flash_attn_2_cuda'`: ok, missing, abi_mismatch or broken.

    An undefined symbol means the extension was built against another torch
    (the classic state after torch was upgraded under it): rebuild it.
    """
    if result.get("rc") == 0:
        return "ok"
    stderr = str(result.get("stderr", ""))
    if "undefined symbol" in stderr:
        return "abi_mismatch"
    if re.search(r"No module named '?flash_attn", stderr):
        return "missing"
    return "broken"


def flash_attn_max_jobs(
    cores: int, memory_mib: int, gib_per_thread: int | float, nvcc_threads: int
) -> int:
    """Parallel compile jobs for a flash-attn build, bounded by cores and by memory.

    Each job runs ``nvcc_threads`` nvcc threads (NVCC_THREADS), each taking about
    ``gib_per_thread`` GiB at its peak, so a job needs their product.
    """
    per_job_mib = 1024 * max(1.0, float(gib_per_thread)) * max(1, int(nvcc_threads))
    by_memory = int(int(memory_mib) // per_job_mib)
    return max(1, min(int(cores) // max(1, int(nvcc_threads)) or 1, by_memory))


#: flash-attn 2.8's build targets (FLASH_ATTN_CUDA_ARCHS): SASS for sm_80 runs on every
#: 8.x GPU, likewise 10.x and 12.x; 9.0 is Hopper.
_FLASH_ATTN_ARCH_BY_MAJOR = {8: "80", 9: "90", 10: "100", 12: "120"}


def flash_attn_cuda_archs(capabilities: Iterable[str]) -> str:
    """FLASH_ATTN_CUDA_ARCHS for the host's GPUs, from their compute capabilities ("9.0")."""
    archs = set()
    for capability in capabilities:
        major = int(str(capability).split(".")[0])
        if major not in _FLASH_ATTN_ARCH_BY_MAJOR:
            raise AnsibleFilterError(
                f"flash-attn 2 has no build for compute capability {capability} "
                f"(it builds for {', '.join(_FLASH_ATTN_ARCH_BY_MAJOR.values())})"
            )
        archs.add(_FLASH_ATTN_ARCH_BY_MAJOR[major])
    if not archs:
        raise AnsibleFilterError("no GPU compute capability to build flash-attn for")
    return ";".join(sorted(archs, key=int))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "stack_digest": pins_digest,
            "stack_pins": stack_pins,
            "stack_host_mismatches": stack_host_mismatches,
            "stack_pin_version": pin_version,
            "stack_pin_sha256": stack_pin_sha256,
            "stack_pins_without": stack_pins_without,
            "wheelhouse_missing": wheelhouse_missing,
            "flash_attn_wheel_mismatches": flash_attn_wheel_mismatches,
            "flash_attn_import_state": flash_attn_import_state,
            "flash_attn_max_jobs": flash_attn_max_jobs,
            "flash_attn_cuda_archs": flash_attn_cuda_archs,
        }
