"""ml_stack's flash-attn toolkit check, the task exactly as the role writes it, run by
Ansible on nvcc's real output format (nvcc itself needs a CUDA host; this branch runs
only there, which is how a regex error in it once went unseen)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from conftest import ROOT, Ansible

NVCC = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0"""


def _toolkit_check() -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / "roles/ml_stack/tasks/flash_attn.yml").read_text())
    pending = list(tasks)
    while pending:
        task = pending.pop()
        if task.get("name") == "Check that the toolkit's CUDA major is torch's":
            return dict(task)
        pending.extend(task.get("block", []))
    raise AssertionError("the toolkit check is gone from flash_attn.yml")


@pytest.mark.parametrize(("torch_cuda", "passes"), [("13.0", True), ("12.8", False)])
def test_the_toolkit_major_is_compared_with_torchs(
    ansible: Ansible, torch_cuda: str, passes: bool
) -> None:
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {
            "__ml_stack_nvcc": {"stdout": NVCC},
            "__ml_stack_torch": {"torch": "2.13.0", "cuda": torch_cuda},
            "ml_stack_cuda_home": "/usr/local/cuda-13.0",
        },
        "tasks": [_toolkit_check()],
    }
    run = ansible.playbook([play])
    output = run.stdout + run.stderr
    if passes:
        assert run.returncode == 0, output
    else:
        assert run.returncode == 2, output
        assert (
            "/usr/local/cuda-13.0 is CUDA 13.0 and torch 2.13.0 was built with CUDA 12.8" in output
        )
