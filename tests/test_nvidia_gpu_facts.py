"""Tests for library/nvidia_gpu_facts.py.

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
import textwrap
from pathlib import Path

import pytest
import yaml
from ansible_adhoc import run_adhoc

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "library" / "nvidia_gpu_facts.py"
VENV_BIN = Path(sys.executable).parent

# nvidia-smi header as driver 570 prints it (plain `nvidia-smi`, first lines only).
HEADER_TEMPLATE = """\
Sat Nov 29 16:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
"""

H200_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
H200_ROWS = "".join(
    f"{i}, NVIDIA H200, GPU-5f0f8a3e-7f1c-2b6e-9f64-3c1b2d9a0e1{i}, 143771, 570.124.06, "
    f"9.0, 00000000:{bus}:00.0\n"
    for i, bus in enumerate(H200_BUSES)
)
H100_ROWS = "".join(
    f"{i}, NVIDIA H100 80GB HBM3, GPU-0c3a9d52-11aa-4f3e-8b0d-6e2f7a41c9d{i}, 81559, "
    f"550.127.08, 9.0, 00000000:{bus}:00.0\n"
    for i, bus in enumerate(H200_BUSES)
)
# An A100 whose driver cannot give some values: nvidia-smi prints bracketed placeholders.
A100_NA_ROWS = (
    "0, NVIDIA A100-SXM4-80GB, GPU-8d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5d, [N/A], "
    "535.216.03, [N/A], 00000000:07:00.0\n"
    "1, NVIDIA A100-SXM4-80GB, GPU-8d1c2b3a-4e5f-6a7b-8c9d-0e1f2a3b4c5e, 81920, "
    "535.216.03, [Not Supported], 00000000:0F:00.0\n"
)
# Driver 470 knows no compute_cap field: the same query without it.
A100_OLD_ROWS = (
    "0, NVIDIA A100-SXM4-40GB, GPU-11111111-2222-3333-4444-555555555555, 40536, "
    "470.256.02, 00000000:07:00.0\n"
)
NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def write_fake_nvidia_smi(
    directory: Path,
    rows: str,
    *,
    driver: str = "570.124.06",
    cuda: str = "12.8",
    mode: str = "ok",
) -> Path:
    """A fake nvidia-smi: prints the given CSV rows for --query-gpu, the header otherwise.

    mode "ok": normal; "no_driver": fails like nvidia-smi without a loaded driver (rc 9);
    "old_driver": rejects the compute_cap field like drivers before 510 do;
    "no_devices": prints "No devices were found" (rc 6).
    """
    (directory / "rows.csv").write_text(rows)
    (directory / "header.txt").write_text(HEADER_TEMPLATE.format(driver=driver, cuda=cuda))
    (directory / "no_driver.txt").write_text(NO_DRIVER_MESSAGE)
    script = directory / "nvidia-smi"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            here="{directory}"
            echo "$*" >> "$here/calls.log"
            mode="{mode}"
            if [ "$mode" = no_driver ]; then cat "$here/no_driver.txt"; exit 9; fi
            if [ "$mode" = no_devices ]; then echo "No devices were found"; exit 6; fi
            case "$1" in
              --query-gpu=*compute_cap*)
                if [ "$mode" = old_driver ]; then
                  echo 'Field "compute_cap" is not a valid field to query.'
                  echo
                  echo 'Run "nvidia-smi --help-query-gpu" for more information.'
                  exit 2
                fi
                cat "$here/rows.csv" ;;
              --query-gpu=*) cat "$here/rows.csv" ;;
              "") cat "$here/header.txt" ;;
              *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
            esac
            """
        )
    )
    script.chmod(0o755)
    return script


def write_fake_sysfs(directory: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A fake /sys/bus/pci/devices: {bdf: (vendor, class)}."""
    root = directory / "pci_devices"
    root.mkdir()
    for bdf, (vendor, pci_class) in devices.items():
        device = root / bdf
        device.mkdir()
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(pci_class + "\n")
    return root


def hgx_sysfs(directory: Path, gpus: int, switches: int) -> Path:
    devices: dict[str, tuple[str, str]] = {
        "0000:00:00.0": ("0x8086", "0x060000"),  # host bridge (not NVIDIA)
        "0000:01:00.0": ("0x15b3", "0x020700"),  # ConnectX NIC
        "0000:02:00.0": ("0x10de", "0x040300"),  # NVIDIA audio function: neither
    }
    for i in range(gpus):
        devices[f"0000:{0x18 + i:02x}:00.0"] = ("0x10de", "0x030200")
    for i in range(switches):
        devices[f"0000:{0x05 + i:02x}:00.0"] = ("0x10de", "0x068000")
    return write_fake_sysfs(directory, devices)


def run_module_process(args: dict[str, object], tmp_path: Path) -> tuple[int, dict]:
    """Run the module as its own process with its arguments in a JSON file."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def run_module_ansible(args: dict[str, object], tmp_path: Path) -> tuple[int, dict]:
    """Run the module through `ansible localhost -m nvidia_gpu_facts` (AnsiballZ)."""
    tree = tmp_path / "tree"
    proc = run_adhoc(
        "nvidia_gpu_facts",
        json.dumps(args),
        env={
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
            "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
            "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
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
    }
    assert isinstance(first["memory_total_mib"], int)
    assert isinstance(first["compute_capability"], str)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == (
        "--query-gpu=index,name,uuid,memory.total,driver_version,compute_cap,pci.bus_id "
        "--format=csv,noheader,nounits"
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


def test_driver_not_loaded_fails_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, H200_ROWS, mode="no_driver")
    rc, result = run_module_ansible({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc != 0
    assert "rc=9" in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]


def test_no_devices_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, "", mode="no_devices")
    rc, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia_gpu"]
    assert facts["present"] is True
    assert facts["count"] == 0
    assert facts["gpus"] == []
    assert facts["driver_version"] is None


def test_garbled_output_fails_with_fake_nvidia_smi(tmp_path: Path) -> None:
    smi = write_fake_nvidia_smi(tmp_path, "0, NVIDIA H200, GPU-x\n")
    rc, result = run_module_process({"nvidia_smi_path": str(smi)}, tmp_path)
    assert rc != 0
    assert "cannot parse nvidia-smi output" in result["msg"]
    assert "expected 7" in result["msg"]


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
    assert all("nvidia_gpu_facts" in task or "ansible.builtin.debug" in task for task in examples)
    for task in examples:
        for key in set(task.get("nvidia_gpu_facts") or {}):
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
        [str(ansible_doc), "-t", "module", "nvidia_gpu_facts"],
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
