"""The shipped inventories parse, and the example fleet's secret comes from its vault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specfleet.controller.paths import repo_root

ROOT = repo_root()
BIN = Path(sys.executable).parent


def inventory(*args: str) -> dict:
    result = subprocess.run(
        [str(BIN / "ansible-inventory"), *args, "--list"],
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def test_lab_hosts_are_cpu_containers_with_the_tiny_models():
    data = inventory("-i", "inventory/lab/hosts.yml")
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == ["gpu-lab-01", "gpu-lab-02", "gpu-lab-lb", "gpu-lab-mon"]
    assert data["loadbalancers"]["hosts"] == ["gpu-lab-lb"]
    assert data["monitoring"]["hosts"] == ["gpu-lab-mon"]
    # The balancer lets the lab's Prometheus read metrics (and itself, for the tests).
    assert hostvars["gpu-lab-lb"]["loadbalancer_monitoring_clients"].count("monitoring") == 1
    assert data["lab_servers"]["hosts"] == ["gpu-lab-01", "gpu-lab-02"]
    addresses = {name: host["ansible_host"] for name, host in hostvars.items()}
    assert len(set(addresses.values())) == len(addresses), "one address per host"
    for host in hostvars.values():
        assert host["specfleet_accelerator"] == "cpu"
        # Reached as a fleet is: SSH as root with the lab's key, at the inventory address.
        assert host["ansible_connection"] == "ssh" and host["ansible_user"] == "root"
        assert host["ansible_ssh_private_key_file"] == "{{ lab_ssh_key }}"
        assert host["ansible_host"].startswith(host["lab_subnet"].rsplit(".", 1)[0] + ".")
        assert host["specfleet_model"] == "/var/lib/specfleet/lab/target"


def test_the_smollm2_lab_is_the_lab_with_the_real_model_on_its_servers():
    data = inventory("-i", "inventory/lab-smollm2")
    hostvars = data["_meta"]["hostvars"]
    assert sorted(hostvars) == ["gpu-lab-01", "gpu-lab-02", "gpu-lab-lb", "gpu-lab-mon"]
    # Converted once, on the first server (the trainer), published onto the balancer's
    # mirror; every server fetches it, pinned, and makes its untrained drafter from it.
    assert data["packaged_models"]["hosts"] == ["gpu-lab-01"]
    assert data["drafter_trainers"]["hosts"] == ["gpu-lab-01"]
    assert data["pinned_models"]["children"] == ["lab_servers"]
    assert data["untrained_drafters"]["children"] == ["lab_servers"]
    assert data["model_mirrors"]["children"] == ["loadbalancers"]
    publisher = hostvars["gpu-lab-01"]
    assert publisher["packaged_model_manifest"] == "{{ pinned_model_manifest }}"
    assert publisher["packaged_model_link"] != publisher["specfleet_model"]
    for name in ("gpu-lab-01", "gpu-lab-02"):
        server = hostvars[name]
        # its group's settings win over the lab's own
        assert server["specfleet_model"] == "/var/lib/specfleet/models/target"
        assert server["pinned_model_manifest"] == "{{ inventory_dir }}/.models/smollm2.json"
        assert server["vllm_server_served_model_name"] == "smollm2"
        assert server["lab_wheelhouses"] == ["smollm2"]
        assert server["drafter_training_settings"]["dataset"] == publisher["packaged_model_prompts"]
    assert hostvars["gpu-lab-lb"]["specfleet_accelerator"] == "cpu"


def test_example_fleet_reads_its_api_key_from_the_vault():
    data = inventory(
        "-i",
        "inventory/example/hosts.yml",
        "--vault-password-file",
        "inventory/example/vault-password.example",
    )
    node = data["_meta"]["hostvars"]["gpu-node-01"]
    assert node["specfleet_accelerator"] == "cuda"
    assert node["specfleet_server_api_key"] == "{{ vault_specfleet_server_api_key }}"
    assert node["vault_specfleet_server_api_key"] == "sk-example-not-a-real-key"
    vault = (ROOT / "inventory/example/group_vars/all/vault.yml").read_text()
    assert vault.startswith("$ANSIBLE_VAULT;1.1;AES256")
    assert "sk-example" not in vault
