"""Tests for plugins/modules/nvidia_gpu_facts.py.

This machine has no NVIDIA GPU. Every test that stands in for real hardware puts a fake
`nvidia-smi` executable on a temporary path that prints what nvidia-smi prints on such a
host (the CSV rows of `--query-gpu=... --format=csv,noheader,nounits` and the header of a
plain run), and a fake sysfs PCI tree; those tests say `fake_nvidia_smi` in their names.
The module runs the way Ansible runs it: through the `ansible` CLI with the repo's
ansible.cfg, or as a module process reading its arguments from a JSON file.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import Ansible
from fixtures.fake_nvidia_smi import install_fake_nvidia_smi

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "plugins" / "modules" / "nvidia_gpu_facts.py"
VENV_BIN = Path(sys.executable).parent

H200_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


def gpu_row(index: int, name: str, uuid: str, memory: str, driver: str, cc: str, bus: str, **extra):
    """One GPU as the fake nvidia-smi reports it (field name -> value, as nvidia-smi prints)."""
    return {
        "index": index,
        "name": name,
        "uuid": uuid,
        "memory.total": memory,
        "driver_version": driver,
        "compute_cap": cc,
        "pci.bus_id": f"00000000:{bus}:00.0",
        "persistence_mode": "Enabled",
        **extra,
    }


H200_ROWS = [
    gpu_row(i, "NVIDIA H200", f"GPU-5f0f8a3e-7f1c-2b6e-9f64-3c1b2d9a0e1{i}", "143771",
            "570.124.06", "9.0", bus)
    for i, bus in enumerate(H200_BUSES)
]  # fmt: skip
H100_ROWS = [
    gpu_row(i, "NVIDIA H100 80GB HBM3", f"GPU-0c3a9d52-11aa-4f3e-8b0d-6e2f7a41c9d{i}", "81559",
            "550.127.08", "9.0", bus, persistence_mode="Disabled")
    for i, bus in enumerate(H200_BUSES)
]  # fmt: skip
# An A100 whose driver cannot give some values: nvidia-smi prints bracketed placeholders.
A100_NA_ROWS = [
    gpu_row(0, "NVIDIA A100-SXM4-80GB", "GPU-8d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "[N/A]",
            "535.216.03", "[N/A]", "07"),
    gpu_row(1, "NVIDIA A100-SXM4-80GB", "GPU-8d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5e", "81920",
            "535.216.03", "[Not Supported]", "0F"),
]  # fmt: skip
# Driver 470 knows no compute_cap field (the fake rejects it in mode old_driver).
A100_OLD_ROWS = [
    gpu_row(0, "NVIDIA A100-SXM4-40GB", "GPU-11111111-2222-3333-4444-555555555555", "40536",
            "470.256.02", "8.0", "07"),
]  # fmt: skip


def write_fake_nvidia_smi(
    directory: Path,
    rows: list[dict[str, object]],
    *,
    driver: str = "570.124.06",
    cuda: str = "12.8",
    mode: str = "ok",
) -> Path:
    """A FAKE nvidia-smi (tests/fixtures/fake_nvidia_smi.py) answering with these GPUs.

    mode "ok": normal; "no_driver": fails like nvidia-smi without a loaded driver (rc 9);
    "mismatch": NVML's driver/library version mismatch (rc 18); "old_driver": rejects
    the compute_cap field like drivers before 510 do; "no_devices": "No devices were found".
    """
    return install_fake_nvidia_smi(
        directory, {"mode": mode, "driver": driver, "cuda": cuda, "gpus": rows}
    )


def write_fake_sysfs(directory: Path, devices: dict[str, tuple[str, ...]]) -> Path:
    """A fake /sys/bus/pci/devices: {bdf: (vendor, class[, device id])}."""
    root = directory / "pci_devices"
    root.mkdir()
    for bdf, (vendor, pci_class, *device_id) in devices.items():
        device = root / bdf
        device.mkdir()
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(pci_class + "\n")
        (device / "device").write_text((device_id[0] if device_id else "0x0000") + "\n")
    return root


def hgx_sysfs(directory: Path, gpus: int, switches: int, gpu_device: str = "0x2335") -> Path:
    """An HGX board's PCI devices: H200 GPUs (0x2335) and H100-generation NVSwitches (0x22a3)."""
    devices: dict[str, tuple[str, ...]] = {
        "0000:00:00.0": ("0x8086", "0x060000", "0x09a2"),  # host bridge (not NVIDIA)
        "0000:01:00.0": ("0x15b3", "0x020700", "0x1021"),  # ConnectX-7 NIC
        "0000:02:00.0": ("0x10de", "0x040300", "0x22ba"),  # NVIDIA audio function: neither
    }
    for i in range(gpus):
        devices[f"0000:{0x18 + i:02x}:00.0"] = ("0x10de", "0x030200", gpu_device)
    for i in range(switches):
        devices[f"0000:{0x05 + i:02x}:00.0"] = ("0x10de", "0x068000", "0x22a3")
    return write_fake_sysfs(directory, devices)


def run_module_process(
    args: dict[str, object], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, dict]:
    """Run the module as its own process with its arguments in a JSON file."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, json.loads(proc.stdout)


def run_module_ansible(args: dict[str, object], tmp_path: Path) -> tuple[int, dict]:
    """Run the module through `ansible localhost -m nvidia_gpu_facts` (AnsiballZ)."""
    tree = tmp_path / "tree"
    proc = Ansible(tmp_path).adhoc(
        "specfleet.fleet.nvidia_gpu_facts",
        json.dumps(args),
        env={
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
            "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
        },
    )
    result_file = tree / "localhost"
    assert result_file.exists(), proc.stdout + proc.stderr
    return proc.returncode, json.loads(result_file.read_text())


def test_eight_h200_with_fake_nvidia_smi_via_ansible_cli(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS, driver="570.124.06", cuda="12.8")
    sysfs = hgx_sysfs(tmp_path, gpus=8, switches=4)
    rc, result = run_module_ansible(
        {"nvidia_smi_path": str(smi), "sysfs_pci_path": str(sysfs)}, tmp_path
    )
    assert rc == 0, result
    assert result["changed"] is False
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is True
    assert facts["count"] == 8
    assert facts["driver_version"] == "570.124.06"
    assert facts["cuda_version"] == "12.8"
    assert facts["nvidia_smi_path"] == str(smi)
    assert facts["pci_gpu_count"] == 8
    assert facts["nvswitch_count"] == 4
    assert facts["nvswitch_present"] is True
    assert [gpu["index"] for gpu in facts["gpus"]] == list(range(8))
    first = facts["gpus"][0]
    assert first == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-5f0f8a3e-7f1c-2b6e-9f64-3c1b2d9a0e10",
        "memory_total_mib": 143771,
        "driver_version": "570.124.06",
        "compute_capability": "9.0",
        "pci_bus_id": "00000000:18:00.0",
        "persistence_mode": True,
    }
    assert isinstance(first["memory_total_mib"], int)
    assert isinstance(first["compute_capability"], str)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == (
        "--query-gpu=index,name,uuid,memory.total,driver_version,compute_cap,pci.bus_id,"
        "persistence_mode --format=csv,noheader,nounits"
    )


def test_eight_h100_sxm_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, H100_ROWS, driver="550.127.08", cuda="12.4")
    sysfs = hgx_sysfs(tmp_path, gpus=8, switches=4)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(smi), "sysfs_pci_path": str(sysfs)}, tmp_path
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["count"] == 8
    assert {gpu["name"] for gpu in facts["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert {gpu["memory_total_mib"] for gpu in facts["gpus"]} == {81559}
    assert facts["driver_version"] == "550.127.08"
    assert facts["cuda_version"] == "12.4"
    assert facts["gpus"][7]["pci_bus_id"] == "00000000:DB:00.0"


def test_a100_placeholders_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, A100_NA_ROWS, driver="535.216.03", cuda="12.2")
    sysfs = hgx_sysfs(tmp_path, gpus=2, switches=0)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(smi), "sysfs_pci_path": str(sysfs)}, tmp_path
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["count"] == 2
    assert facts["gpus"][0]["memory_total_mib"] is None
    assert facts["gpus"][0]["compute_capability"] is None
    assert facts["gpus"][1]["memory_total_mib"] == 81920
    assert facts["gpus"][1]["compute_capability"] is None
    assert facts["nvswitch_present"] is False
    assert facts["nvswitch_count"] == 0


def test_old_driver_without_compute_cap_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(
        tmp_path, A100_OLD_ROWS, driver="470.256.02", cuda="11.4", mode="old_driver"
    )
    rc, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["count"] == 1
    assert facts["gpus"][0]["memory_total_mib"] == 40536
    assert facts["gpus"][0]["compute_capability"] is None
    assert facts["gpus"][0]["pci_bus_id"] == "00000000:07:00.0"
    assert facts["cuda_version"] == "11.4"
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert "compute_cap" in calls[0]
    assert "compute_cap" not in calls[1]


def test_driver_not_loaded_reports_absent_with_fake_nvidia_smi(tmp_path: Path) -> None:
    # A host the role must repair (pending reboot, failed DKMS build): nvidia-smi exists
    # but cannot reach the driver. The facts say so and fall back to the PCI bus.
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS, mode="no_driver")
    sysfs = hgx_sysfs(tmp_path, gpus=8, switches=4)
    rc, result = run_module_ansible(
        {"nvidia_smi_path": str(smi), "sysfs_pci_path": str(sysfs)}, tmp_path
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is False
    assert "rc=9" in facts["error"]
    assert "couldn't communicate with the NVIDIA driver" in facts["error"]
    assert facts["count"] == 0
    assert facts["gpus"] == []
    assert facts["nvidia_smi_path"] == str(smi)
    assert facts["pci_gpu_count"] == 8
    assert facts["pci_gpus"][0] == {
        "pci_bus_id": "0000:18:00.0",
        "device_id": "0x2335",
        "class": "0x030200",
    }
    assert {gpu["device_id"] for gpu in facts["pci_gpus"]} == {"0x2335"}
    assert facts["nvswitch_present"] is True


def test_driver_library_mismatch_reports_absent_with_fake_nvidia_smi(tmp_path: Path) -> None:
    # After a driver upgrade without reboot: the new libraries, the old module.
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS, mode="mismatch")
    sysfs = hgx_sysfs(tmp_path, gpus=2, switches=0)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(smi), "sysfs_pci_path": str(sysfs)}, tmp_path
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is False
    assert "Driver/library version mismatch" in facts["error"]
    assert facts["pci_gpu_count"] == 2
    assert [gpu["pci_bus_id"] for gpu in facts["pci_gpus"]] == ["0000:18:00.0", "0000:19:00.0"]


FAKE_LSPCI = """\
#!/bin/sh
# A FAKE lspci: `lspci -Dnmm` of two H200 GPUs, an H100 NVSwitch and a NIC.
[ "$*" = "-Dnmm" ] || {{ echo "fake lspci: unexpected arguments: $*" >&2; exit 2; }}
cat <<'END'
0000:00:00.0 "0600" "8086" "09a2" "" "" "8086" "0000"
0000:05:00.0 "0680" "10de" "22a3" -ra1 "" ""
0000:18:00.0 "0302" "10de" "2335" -ra1 "10de" "18be"
0000:19:00.0 "0302" "10de" "2335" -ra1 "10de" "18be"
0000:1a:00.0 "0403" "10de" "22ba" -ra1 "10de" "0000"
0000:2b:00.0 "0207" "15b3" "1021" "15b3" "0041"
END
"""


def test_pci_scan_falls_back_to_fake_lspci_without_sysfs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lspci").write_text(FAKE_LSPCI.format())
    (bin_dir / "lspci").chmod(0o755)
    rc, result = run_module_process(
        {
            "nvidia_smi_path": str(tmp_path / "nope"),
            "fail_on_missing": False,
            "sysfs_pci_path": str(tmp_path / "no-such-dir"),
        },
        tmp_path,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["pci_gpu_count"] == 2
    assert facts["pci_gpus"] == [
        {"pci_bus_id": "0000:18:00.0", "device_id": "0x2335", "class": "0x030200"},
        {"pci_bus_id": "0000:19:00.0", "device_id": "0x2335", "class": "0x030200"},
    ]
    assert facts["nvswitch_count"] == 1


def test_persistence_mode_with_fake_nvidia_smi(tmp_path: Path) -> None:
    on = write_fake_nvidia_smi(tmp_path / "on", H200_ROWS)
    rc, result = run_module_process({"nvidia_smi_path": str(on)}, tmp_path)
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["persistence_mode"] is True
    assert {gpu["persistence_mode"] for gpu in facts["gpus"]} == {True}

    # Ubuntu's nvidia-persistenced unit passes --no-persistence-mode: one GPU left off
    # is enough for the fact to be false.
    mixed = [*H200_ROWS[:7], {**H200_ROWS[7], "persistence_mode": "Disabled"}]
    off = write_fake_nvidia_smi(tmp_path / "off", mixed)
    rc, result = run_module_process({"nvidia_smi_path": str(off)}, tmp_path)
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["persistence_mode"] is False
    assert [gpu["persistence_mode"] for gpu in facts["gpus"]] == [True] * 7 + [False]


NVRM_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
NVRM_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.08  Tue Oct  8 13:52:05 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def fake_procfs(directory: Path, nvrm: str | None, nvswitches: int = 0) -> Path:
    """A fake /proc with the files the NVIDIA kernel modules create."""
    proc = directory / "proc"
    if nvrm is not None:
        (proc / "driver" / "nvidia").mkdir(parents=True)
        (proc / "driver" / "nvidia" / "version").write_text(nvrm)
    if nvswitches:
        devices = proc / "driver" / "nvidia-nvswitch" / "devices"
        for i in range(nvswitches):
            (devices / f"0000:{0x05 + i:02x}:00.0").mkdir(parents=True)
    proc.mkdir(exist_ok=True)
    return proc


@pytest.mark.parametrize(
    ("nvrm", "version", "flavour"),
    [(NVRM_OPEN, "580.95.05", "open"), (NVRM_PROPRIETARY, "550.127.08", "proprietary"),
     (None, None, None)],
)  # fmt: skip
def test_loaded_kernel_module_from_fake_procfs(
    tmp_path: Path, nvrm: str | None, version: str | None, flavour: str | None
) -> None:
    proc = fake_procfs(tmp_path, nvrm)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(tmp_path / "nope"), "fail_on_missing": False,
         "procfs_path": str(proc)},
        tmp_path,
    )  # fmt: skip
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["kernel_module_version"] == version
    assert facts["kernel_module_flavour"] == flavour


def test_nvswitches_seen_by_the_driver_in_fake_procfs(tmp_path: Path) -> None:
    # NVSwitches the driver registered count even when sysfs shows no class 0x0680
    # function (a VM with the switches passed through under another class, say).
    proc = fake_procfs(tmp_path, NVRM_OPEN, nvswitches=4)
    sysfs = hgx_sysfs(tmp_path, gpus=8, switches=0)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(tmp_path / "nope"), "fail_on_missing": False,
         "procfs_path": str(proc), "sysfs_pci_path": str(sysfs)},
        tmp_path,
    )  # fmt: skip
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["nvswitch_count"] == 0
    assert facts["nvswitch_driver_count"] == 4
    assert facts["nvswitch_present"] is True


def test_no_devices_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, [], mode="no_devices")
    rc, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is True
    assert facts["count"] == 0
    assert facts["gpus"] == []
    assert facts["driver_version"] is None


def test_garbled_output_fails_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = install_fake_nvidia_smi(
        tmp_path, {"driver": "570.124.06", "cuda": "12.8", "raw_query": "0, NVIDIA H200, GPU-x\n"}
    )
    rc, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc != 0
    assert "cannot parse nvidia-smi output" in result["msg"]
    assert "expected 8" in result["msg"]


def test_missing_nvidia_smi_fails_by_default(tmp_path: Path) -> None:
    rc, result = run_module_ansible({"nvidia_smi_path": str(tmp_path / "nope")}, tmp_path)
    assert rc != 0
    assert "nvidia-smi not found" in result["msg"]
    assert str(tmp_path / "nope") in result["msg"]


def test_missing_nvidia_smi_reports_absent_when_allowed(tmp_path: Path) -> None:
    sysfs = hgx_sysfs(tmp_path, gpus=8, switches=6)
    rc, result = run_module_process(
        {
            "nvidia_smi_path": str(tmp_path / "nope"),
            "fail_on_missing": False,
            "sysfs_pci_path": str(sysfs),
        },
        tmp_path,
    )
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is False
    assert facts["count"] == 0
    assert facts["nvidia_smi_path"] is None
    assert facts["pci_gpu_count"] == 8
    assert facts["nvswitch_count"] == 6


def test_check_mode_with_fake_nvidia_smi_changes_nothing(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS)
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, result = run_module_process(
        {"nvidia_smi_path": str(smi), "_ansible_check_mode": True}, tmp_path
    )
    assert rc == 0, result
    assert result["changed"] is False
    assert result["ansible_facts"]["nvidia_gpu"]["count"] == 8
    after = sorted(p.name for p in tmp_path.iterdir())
    # only the test's own bookkeeping appears: the args file and the fake's call log
    assert set(after) - set(before) <= {"args.json", "calls.log"}


def test_unreadable_sysfs_counts_zero(tmp_path: Path) -> None:
    rc, result = run_module_process(
        {
            "nvidia_smi_path": str(tmp_path / "nope"),
            "fail_on_missing": False,
            "sysfs_pci_path": str(tmp_path / "no-such-dir"),
        },
        tmp_path,
    )
    assert rc == 0
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert (facts["pci_gpu_count"], facts["nvswitch_count"]) == (0, 0)


# --- documentation ------------------------------------------------------------------


def module_constants() -> dict[str, object]:
    tree = ast.parse(MODULE.read_text())
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in {
                "DOCUMENTATION",
                "EXAMPLES",
                "RETURN",
            }:
                constants[target.id] = ast.literal_eval(node.value)
    return constants


def module_argument_spec() -> dict[str, dict[str, object]]:
    """The argument_spec literal passed to AnsibleModule(...) in main()."""
    tree = ast.parse(MODULE.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "AnsibleModule"
        ):
            for keyword in node.keywords:
                if keyword.arg == "argument_spec":
                    return ast.literal_eval(keyword.value)
    raise AssertionError("no AnsibleModule(argument_spec=...) call found")


def test_documentation_matches_argument_spec() -> None:
    constants = module_constants()
    doc = yaml.safe_load(constants["DOCUMENTATION"])
    spec = module_argument_spec()
    assert doc["module"] == "nvidia_gpu_facts"
    assert set(doc["options"]) == set(spec)
    for name, option in doc["options"].items():
        assert option["type"] == spec[name]["type"], name
        assert option.get("default") == spec[name].get("default"), name
        assert bool(option.get("required", False)) == bool(spec[name].get("required")), name
        assert option["description"], name


def test_examples_and_return_parse_and_match_facts(tmp_path: Path) -> None:
    constants = module_constants()
    examples = yaml.safe_load(constants["EXAMPLES"])
    fqcn = "specfleet.fleet.nvidia_gpu_facts"
    assert all(fqcn in task or "ansible.builtin.debug" in task for task in examples)
    for task in examples:
        for key in set(task.get(fqcn) or {}):
            assert key in module_argument_spec()
    returned = yaml.safe_load(constants["RETURN"])
    documented = set(returned["ansible_facts"]["contains"]["nvidia_gpu"]["contains"])
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS)
    _, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert documented == set(facts)
    sample = returned["ansible_facts"]["contains"]["nvidia_gpu"]["contains"]["gpus"]["sample"]
    assert set(sample[0]) == set(facts["gpus"][0])


def test_ansible_doc_renders() -> None:
    ansible_doc = VENV_BIN / "ansible-doc"
    if not ansible_doc.exists():
        found = shutil.which("ansible-doc")
        assert found, "ansible-doc not found"
        ansible_doc = Path(found)
    proc = subprocess.run(
        [str(ansible_doc), "-t", "module", "specfleet.fleet.nvidia_gpu_facts"],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[ERROR]" not in proc.stderr
    for text in ("nvidia_smi_path", "fail_on_missing", "sysfs_pci_path", "RETURN VALUES"):
        assert text in proc.stdout


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (" 143771", 143771),
        ("[N/A]", None),
        ("  [Not Supported] ", None),
        ("81920 MiB", 81920),
    ],
)
def test_value_cleaning(raw: str, expected: int | None) -> None:
    sys.path.insert(0, str(MODULE.parent))
    try:
        import nvidia_gpu_facts
    finally:
        sys.path.remove(str(MODULE.parent))
    assert nvidia_gpu_facts.to_int(nvidia_gpu_facts.clean_value(raw)) == expected


def test_works_without_the_timeout_command_with_fake_nvidia_smi(tmp_path: Path) -> None:
    # a minimal container may lack coreutils' timeout: nvidia-smi then runs without it
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS)
    rc, result = run_module_process(
        {"nvidia_smi_path": str(smi)}, tmp_path, env={"PATH": str(tmp_path)}
    )
    assert rc == 0, result
    assert result["ansible_facts"]["nvidia_gpu"]["count"] == 8
