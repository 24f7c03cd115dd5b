"""Role drafter_training: its unit rendered by Ansible for each profile, checked by systemd.

The job runs as its own account in a sandbox like the server's: `systemd-analyze security`
must rate it 2.0 or less (it was 7.6 when the job shared the server's account with a
lighter sandbox), its folders are made by systemd, its restarts are bounded and, with
policy stop, a job that gives up hands the GPUs back to the server.
"""

from __future__ import annotations

import shutil

import pytest
from conftest import ROOT, systemd_verify

ROLE = ROOT / "roles" / "drafter_training"


def render(ansible, **extra) -> str:
    out = ansible.tmp_path / "specfleet-drafter-training.service"
    play = {
        "name": "Render the drafter_training unit",
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": [
            str(ROOT / "roles" / "specfleet" / "defaults" / "main.yml"),
            str(ROLE / "defaults" / "main.yml"),
            str(ROLE / "vars" / "main.yml"),
            str(ROLE / "vars") + "/{{ specfleet_accelerator }}.yml",
        ],
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
        "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "DevicePolicy=closed",
        "ReadOnlyPaths=-/var/lib/specfleet/models/target -/var/lib/specfleet/drafters",
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
