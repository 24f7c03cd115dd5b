"""bin/gpu-check on a machine without a GPU.

Here every check SKIPs with its reason. The DeviceAllow= matching is checked against a
/proc of a 580 driver on an HGX H200 (tests/fixtures/proc-nvidia-580-hgx-h200) and the
/proc/devices of an older driver; the facts comparison against a FAKE nvidia-smi
(tests/fixtures/fake_nvidia_smi.py). The GPU itself, torch on CUDA, the systemd sandbox and
vLLM run only on a GPU host (see the script's docstring).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
from fixtures.fake_nvidia_smi import install_fake_nvidia_smi

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bin" / "gpu-check"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROC_580 = FIXTURES / "proc-nvidia-580-hgx-h200"
DEVICES_535 = FIXTURES / "proc-devices-nvidia-535.txt"
CHECKS = [
    "device-nodes",
    "device-allow",
    "nvidia-gpu-facts",
    "torch-import",
    "torch-cuda",
    "torch-device-count",
    "torch-bf16-matmul",
    "driver-cuda-version",
    "systemd-sandbox",
    "vllm-eagle3",
]


def load_script() -> object:
    loader = SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


gc = load_script()
DEVICES_580 = gc.parse_proc_devices((PROC_580 / "devices").read_text())
MINORS = list(range(8))

# DeviceAllow= lists as units write them.
ALLOW_NAMES_SINCE_550 = """\
[Service]
DevicePolicy=closed
DeviceAllow=char-nvidia rw
DeviceAllow=char-nvidiactl rw
DeviceAllow=char-nvidia-uvm rw
DeviceAllow=char-nvidia-caps r
NoNewPrivileges=yes
PrivateDevices=no
"""
# The list of drivers before 550: major 195 only under the name they gave it.
ALLOW_FRONTEND_ONLY = """\
[Service]
DevicePolicy=closed
DeviceAllow=char-nvidia-frontend rw
DeviceAllow=char-nvidia-uvm rw
DeviceAllow=char-nvidia-caps r
DeviceAllow=char-nvidia-nvswitch rw
"""


def coverage(unit: str, devices: dict = DEVICES_580, mig: bool = False, rdev=None):
    return gc.device_allow_coverage(gc.parse_unit(unit), devices, MINORS, mig, rdev or {})


# --- this machine ---------------------------------------------------------------------


def no_nvidia_driver_here() -> bool:
    devices = Path("/proc/devices").read_text()
    return " nvidia" not in devices and shutil.which("nvidia-smi") is None


@pytest.mark.skipif(not no_nvidia_driver_here(), reason="this machine has an NVIDIA driver")
def test_everything_skips_here_with_its_reason():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == f"0 passed, 0 failed, {len(CHECKS)} skipped"
    for line, check in zip(lines[:-1], CHECKS, strict=True):
        status, name, reason = line.split(" ", 2)
        assert (status, name) == ("SKIP", f"{check}:")
        assert len(reason) > 10, line


@pytest.mark.skipif(not no_nvidia_driver_here(), reason="this machine has an NVIDIA driver")
def test_json_lists_every_check():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0
    results = json.loads(proc.stdout)
    assert [r["check"] for r in results] == CHECKS
    assert {r["status"] for r in results} == {"SKIP"}
    assert all(r["detail"] for r in results)


# --- DeviceAllow= against the /proc/devices of a 580 driver ----------------------------


def test_proc_devices_fixture_parsed():
    assert gc.char_major(DEVICES_580, "nvidia") == 195
    assert gc.char_major(DEVICES_580, "nvidiactl") == 195
    assert gc.char_major(DEVICES_580, "nvidia-uvm") == 238
    assert gc.char_major(DEVICES_580, "nvidia-caps") == 237
    assert gc.char_major(DEVICES_580, "nvidia-frontend") is None
    assert (8, "sd") in DEVICES_580["block"]
    assert gc.gpu_minors_of(PROC_580) == MINORS


def test_the_rendered_units_allow_every_device_of_a_580_driver(ansible):
    """The server's and the training job's units, as their roles render them for `cuda`."""
    from test_drafter_training_render import render as render_job
    from test_vllm_server_render import render as render_server

    server, _ = render_server(ansible)
    for unit in (server, render_job(ansible, specfleet_accelerator="cuda")):
        ok, detail = coverage(unit)
        assert ok, detail
        assert "nvidia-uvm by char-nvidia-uvm rw" in detail


def test_names_since_550_allow_every_device():
    ok, detail = coverage(ALLOW_NAMES_SINCE_550)
    assert ok, detail
    assert "nvidia by char-nvidia rw" in detail
    assert "nvidia-uvm by char-nvidia-uvm rw" in detail


def test_frontend_name_allows_nothing_on_a_580_driver():
    ok, detail = coverage(ALLOW_FRONTEND_ONLY)
    assert not ok
    assert "not allowed: nvidia (major 195" in detail
    assert "DeviceAllow=char-nvidia rw" in detail
    assert "not allowed: nvidiactl" in detail
    assert "nvidia-uvm" not in detail.split("not allowed")[-1]


def test_frontend_name_allows_major_195_on_older_drivers():
    devices_535 = gc.parse_proc_devices(DEVICES_535.read_text())
    ok, detail = coverage(ALLOW_FRONTEND_ONLY, devices=devices_535)
    assert ok, detail
    assert "nvidia by char-nvidia-frontend rw" in detail


def test_read_only_is_not_enough_for_uvm():
    ok, detail = coverage(ALLOW_NAMES_SINCE_550.replace("char-nvidia-uvm rw", "char-nvidia-uvm r"))
    assert not ok
    assert "not allowed: nvidia-uvm (major 238, needs rw" in detail


def test_device_paths_match_their_nodes():
    unit = """\
[Service]
DevicePolicy=strict
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia-uvm rw
""" + "".join(f"DeviceAllow=/dev/nvidia{m} rw\n" for m in MINORS)
    rdev = {"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (238, 0)}
    rdev |= {f"/dev/nvidia{m}": (195, m) for m in MINORS}
    ok, detail = coverage(unit, rdev=rdev)
    assert ok, detail
    # one GPU's node missing from the list: that GPU cannot be opened
    ok, detail = coverage(unit.replace("DeviceAllow=/dev/nvidia7 rw\n", ""), rdev=rdev)
    assert not ok
    assert "not allowed: nvidia" in detail


def test_glob_and_mig():
    ok, detail = coverage("[Service]\nDevicePolicy=closed\nDeviceAllow=char-nvidia* rw\n", mig=True)
    assert ok, detail
    assert "nvidia-caps by char-nvidia* rw" in detail
    # MIG needs nvidia-caps, which this list leaves out
    without_caps = ALLOW_NAMES_SINCE_550.replace("DeviceAllow=char-nvidia-caps r\n", "")
    ok, detail = coverage(without_caps, mig=True)
    assert not ok
    assert "not allowed: nvidia-caps (major 237" in detail


def test_empty_device_allow_resets_and_private_devices_hides_all():
    ok, _ = coverage(ALLOW_NAMES_SINCE_550 + "DeviceAllow=\nDeviceAllow=char-nvidia-uvm rw\n")
    assert not ok
    ok, detail = coverage(ALLOW_NAMES_SINCE_550.replace("PrivateDevices=no", "PrivateDevices=yes"))
    assert not ok
    assert "PrivateDevices=yes" in detail
    ok, _ = coverage("[Service]\nExecStart=/bin/true\n")
    assert ok  # no device restrictions at all


def test_missing_uvm_module_is_named():
    devices = gc.parse_proc_devices(
        (PROC_580 / "devices").read_text().replace("238 nvidia-uvm\n", "")
    )
    ok, detail = coverage(ALLOW_NAMES_SINCE_550, devices=devices)
    assert not ok
    assert "is nvidia-uvm loaded?" in detail


# --- the facts module against a FAKE nvidia-smi ----------------------------------------

H200 = [
    {
        "index": i,
        "name": "NVIDIA H200",
        "uuid": f"GPU-5f0f8a3e-7f1c-2b6e-9f64-3c1b2d9a0e1{i}",
        "memory.total": "143771",
        "driver_version": "580.95.05",
        "compute_cap": "9.0",
        "pci.bus_id": f"00000000:{bus}:00.0",
        "persistence_mode": "Enabled",
        "mig.mode.current": "Disabled",
    }
    for i, bus in enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"])
]


def test_facts_compared_with_nvidia_smi_rows():
    smi = gc.Smi("/usr/bin/nvidia-smi", rows=[
        {"index": "0", "name": "NVIDIA H200", "driver_version": "580.95.05", "compute_cap": "9.0"},
        {"index": "1", "name": "NVIDIA H200", "driver_version": "580.95.05", "compute_cap": "9.0"},
    ])  # fmt: skip
    gpu = {"name": "NVIDIA H200", "driver_version": "580.95.05", "compute_capability": "9.0"}
    ok, detail = gc.compare_facts({"count": 2, "gpus": [gpu, gpu]}, smi)
    assert ok, detail
    ok, detail = gc.compare_facts({"count": 1, "gpus": [gpu]}, smi)
    assert not ok and "count 1 != nvidia-smi's 2" in detail
    other = {**gpu, "compute_capability": None}
    ok, detail = gc.compare_facts({"count": 2, "gpus": [gpu, other]}, smi)
    assert not ok and "GPU 1: compute_capability None != '9.0'" in detail
    # nvidia-smi fails: the facts must say so too
    broken = gc.Smi("/usr/bin/nvidia-smi", error="rc=18: Driver/library version mismatch")
    assert gc.compare_facts({"present": False, "error": "rc=18 ..."}, broken)[0]
    assert not gc.compare_facts({"present": True, "count": 8}, broken)[0]


def pythons_for_the_facts_module() -> list[str]:
    """This venv's (Ansible importable) and, when it has no Ansible, the system's."""
    found = [sys.executable]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and subprocess.run([system, "-c", "import ansible"], capture_output=True).returncode:
        found.append(system)
    return found


def fixture_dev(tmp_path: Path) -> Path:
    """A /dev with the nodes a 580 driver makes for 8 GPUs (real mknod)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    nodes = {f"nvidia{m}": (195, m) for m in MINORS}
    nodes |= {"nvidiactl": (195, 255), "nvidia-uvm": (238, 0), "nvidia-uvm-tools": (238, 1)}
    try:
        for name, (major, minor) in nodes.items():
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("creating device nodes needs root (CAP_MKNOD)")
    return dev


@pytest.mark.parametrize("python", pythons_for_the_facts_module())
def test_end_to_end_with_fixtures_and_fake_nvidia_smi(tmp_path: Path, python: str):
    smi = install_fake_nvidia_smi(
        tmp_path / "smi", {"driver": "580.95.05", "cuda": "13.0", "gpus": H200}
    )
    dev = fixture_dev(tmp_path)
    unit = tmp_path / "specfleet-vllm.service"
    unit.write_text(ALLOW_NAMES_SINCE_550)
    argv = [python, str(SCRIPT), "--proc", str(PROC_580), "--dev", str(dev), "--unit", str(unit),
            "--nvidia-smi", str(smi), "--venv", str(tmp_path / "no-venv"), "--json"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["check"]: r for r in json.loads(proc.stdout)}
    for check in ("device-nodes", "device-allow", "nvidia-gpu-facts"):
        assert results[check]["status"] == "PASS", results[check]
    assert (
        "8 x NVIDIA H200, driver 580.95.05, compute capability 9.0, CUDA 13.0"
        in (results["nvidia-gpu-facts"]["detail"])
    )

    # the same host with vllm_server's frontend-only list: that check fails, and the run
    unit.write_text(ALLOW_FRONTEND_ONLY)
    proc = subprocess.run(argv[:-1], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert (
        "FAIL device-allow: specfleet-vllm.service: not allowed: nvidia (major 195" in proc.stdout
    )
    assert (
        proc.stdout.splitlines()[-1].startswith("3 passed, 1 failed,")
        or "1 failed" in (proc.stdout.splitlines()[-1])
    )


def test_missing_uvm_node_fails_device_nodes(tmp_path: Path):
    dev = fixture_dev(tmp_path)
    (dev / "nvidia-uvm").unlink()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--proc", str(PROC_580), "--dev", str(dev), "--json",
         "--unit", str(tmp_path / "none"), "--nvidia-smi", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    result = next(r for r in json.loads(proc.stdout) if r["check"] == "device-nodes")
    assert result["status"] == "FAIL"
    assert "/dev/nvidia-uvm is missing" in result["detail"]


def test_speculative_counters_summed_from_prometheus_text():
    metrics = (
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n"
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 96.0\n'
        'vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="m"} 1.7e9\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 40.0\n'
    )
    assert gc.metric_sum(metrics, gc.SPEC_DRAFT_TOKENS) == 96.0
    assert gc.metric_sum(metrics, gc.SPEC_ACCEPTED) == 40.0


def test_gpu_minors_from_dev_when_proc_does_not_list_them(tmp_path: Path):
    # a container given some GPUs may not see /proc/driver/nvidia
    dev = fixture_dev(tmp_path)
    proc = tmp_path / "proc"
    proc.mkdir()
    shutil.copy(PROC_580 / "devices", proc / "devices")
    proc_run = subprocess.run(
        [sys.executable, str(SCRIPT), "--proc", str(proc), "--dev", str(dev), "--json",
         "--unit", str(tmp_path / "none"), "--nvidia-smi", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    result = next(r for r in json.loads(proc_run.stdout) if r["check"] == "device-nodes")
    assert result["status"] == "PASS", result
    assert "GPU minors [0, 1, 2, 3, 4, 5, 6, 7] from" in result["detail"]
