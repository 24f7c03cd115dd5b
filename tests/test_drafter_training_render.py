"""Role drafter_training: its unit rendered by Ansible for each profile, checked by systemd.

The job runs as its own account in a sandbox like the server's: `systemd-analyze security`
must rate it 2.0 or less (it was 7.6 when the job shared the server's account with a
lighter sandbox), its folders are made by systemd, its restarts are bounded and, with
policy stop, a job that gives up hands the GPUs back to the server.
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from conftest import ROOT, role_vars_files, systemd_verify

ROLE = ROOT / "roles" / "drafter_training"


def render(ansible, **extra) -> str:
    out = ansible.tmp_path / "specfleet-drafter-training.service"
    play = {
        "name": "Render the drafter_training unit",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("drafter_training"),
        "tasks": [
            {
                "name": "Render the unit",
                "ansible.builtin.template": {
                    "src": str(ROLE / "templates" / "drafter-training.service.j2"),
                    "dest": str(out),
                    "mode": "0600",
                },
            }
        ],
    }
    result = ansible.playbook([play], extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return out.read_text()


def test_the_job_has_its_own_account_folders_and_bounded_restarts(ansible):
    unit = render(ansible).splitlines()
    for line in (
        "User=specfleet-train",
        "Group=specfleet-train",
        "StateDirectory=specfleet/drafter-training",
        "CacheDirectory=specfleet/drafter-training",
        "WorkingDirectory=/var/lib/specfleet/drafter-training",
        "StartLimitBurst=5",
        "StartLimitIntervalSec=1800",
        "Conflicts=specfleet-vllm.service",
        "OnFailure=specfleet-vllm.service",
        "Requires=specfleet-nvidia-devices.service",
        # As the server: after fabric manager (CUDA error 802 before it) and persistenced.
        "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service"
        " specfleet-nvidia-devices.service",
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "DevicePolicy=closed",
        "ReadOnlyPaths=-/var/lib/specfleet/models/target -/var/lib/specfleet/drafters -/run/lock",
    ):
        assert line in unit, line
    assert not [line for line in unit if line.startswith("ReadWritePaths")]


def test_policy_share_keeps_the_server(ansible):
    unit = render(ansible, drafter_training_server_policy="share", specfleet_accelerator="cpu")
    assert "Conflicts=" not in unit and "OnFailure=" not in unit
    assert "PrivateDevices=yes" in unit.splitlines()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
@pytest.mark.parametrize("accelerator", ["cpu", "cuda"])
def test_systemd_accepts_the_unit_and_its_exposure(ansible, tmp_path, accelerator):
    unit = render(ansible, specfleet_accelerator=accelerator)
    needs = ["specfleet-nvidia-devices.service", "specfleet-vllm.service"]
    assert systemd_verify(tmp_path, "specfleet-drafter-training.service", unit, needs) <= 2.0


def _gpu_set_check() -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / "check.yml").read_text())
    (task,) = [
        t for t in tasks if t["name"] == "Check that a job beside the server gets GPUs of its own"
    ]
    return task


@pytest.mark.parametrize(
    ("accelerator", "job", "server", "refused"),
    [
        ("cuda", "4,5,6,7", "0,1,2,3", None),
        ("cuda", "", "0,1,2,3", 'job "", server "0,1,2,3"'),
        ("cuda", "4,5", "", 'job "4,5", server ""'),
        ("cuda", "3, 4", "0,1,2,3", "both use 3"),
        # CPU cores are the scheduler's to share: nothing to split.
        ("cpu", "", "", None),
    ],
)
def test_sharing_a_host_needs_gpu_sets_that_do_not_overlap(
    ansible, accelerator: str, job: str, server: str, refused: str | None
) -> None:
    """check.yml's task as the role writes it, before anything changes (install.yml)."""
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("drafter_training"),
        "tasks": [_gpu_set_check()],
    }
    run = ansible.playbook(
        [play],
        {
            "specfleet_accelerator": accelerator,
            "drafter_training_server_policy": "share",
            "drafter_training_gpus": job,
            "specfleet_server_gpus": server,
        },
    )
    output = run.stdout + run.stderr
    if refused is None:
        assert run.returncode == 0, output
    else:
        assert run.returncode == 2, output
        assert "set drafter_training_gpus and specfleet_server_gpus" in output and refused in output
