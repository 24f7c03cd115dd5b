#!/usr/bin/python
# Copyright: (c) 2026, specfleet contributors
# Apache License 2.0 (see LICENSE in the project root)
"""Ansible facts module: NVIDIA GPUs, driver and CUDA versions, NVSwitch presence."""

from __future__ import annotations

import csv
import os
import re
import shlex
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Gather facts about NVIDIA GPUs, the driver, CUDA and NVSwitches
description:
  - Runs C(nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,compute_cap,
    pci.bus_id,persistence_mode --format=csv,noheader,nounits) and parses every row with
    Python's C(csv) module.
  - "Reads the CUDA version (the highest CUDA version the driver supports) from the
    C(CUDA Version: X.Y) field of the header of a plain C(nvidia-smi) run, because
    C(--query-gpu) has no CUDA version field."
  - Values that nvidia-smi prints as C([N/A]), C([Not Supported]), C([Unknown Error]) and
    similar bracketed placeholders become C(null).
  - When the driver is too old to know the C(compute_cap) field (it answers that the
    field is not a valid field to query), the query is repeated without it and every
    C(compute_capability) is C(null).
  - Detects NVSwitches from the PCI devices in sysfs (vendor C(0x10de), PCI class
    C(0x0680), "Bridge, other"), which is how the NVSwitches of HGX A100/H100/H200 boards
    appear to the host. This works before any driver is installed, so a play can decide
    whether to install nvidia-fabricmanager from it. Once the driver is loaded, the
    NVSwitches it registered (C(/proc/driver/nvidia-nvswitch/devices/)) count as well.
  - Reads the version and flavour (open or proprietary) of the loaded kernel module from
    C(/proc/driver/nvidia/version), which answers even when nvidia-smi does not (a
    version mismatch after an upgrade shows there as the old module's version).
  - Also lists NVIDIA GPUs on the PCI bus (classes C(0x0300) VGA and C(0x0302) 3D
    controller) with their PCI device ids, without the driver. When the sysfs directory
    cannot be read, C(lspci -Dnmm) is used instead if it is installed.
  - "An nvidia-smi that exists but cannot reach the driver (a reboot pending after a driver
    change, a failed DKMS build, C(Driver/library version mismatch), C(couldn't
    communicate with the NVIDIA driver)) does not fail the module: it reports
    C(present=false) with nvidia-smi's message in C(error), and the PCI scan still tells
    how many GPUs the host has, so a play can repair such a host."
  - Changes nothing on the host.
version_added: "0.1.0"
options:
  nvidia_smi_path:
    description:
      - Path of the nvidia-smi executable.
      - When not set, C(nvidia-smi) is looked up in E(PATH) and in C(/usr/bin) and C(/bin).
    type: path
  fail_on_missing:
    description:
      - What to do when nvidia-smi is not found.
      - When V(true), the module fails with a message naming the path it looked for.
      - When V(false), it returns C(present=false) and C(count=0), with the PCI counts
        from sysfs still filled in (useful before the driver is installed).
      - nvidia-smi that exists but fails (for example because the driver is not loaded)
        never fails the module; see C(error) in the returned facts.
    type: bool
    default: true
  sysfs_pci_path:
    description:
      - Directory of PCI devices in sysfs that is scanned for NVIDIA GPUs and NVSwitches.
    type: path
    default: /sys/bus/pci/devices
  procfs_path:
    description:
      - Mount point of procfs, where the loaded NVIDIA kernel modules report themselves.
    type: path
    default: /proc
  nvidia_smi_timeout:
    description:
      - Seconds each nvidia-smi call may take before it counts as failed.
    type: int
    default: 60
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - nvidia-smi is run with a timeout (O(nvidia_smi_timeout)); a GPU in a bad state can make
    it hang, which is then reported in C(error) like any other failure.
  - NVSwitch detection through PCI class C(0x0680) is not verified on NVLink-5 systems
    (HGX B200/GB200), whose switches are managed differently; set the fabric manager
    explicitly there.
author:
  - specfleet contributors
"""

EXAMPLES = r"""
- name: Gather NVIDIA GPU facts
  specfleet.fleet.nvidia_gpu_facts:

- name: Gather PCI facts before the driver is installed
  specfleet.fleet.nvidia_gpu_facts:
    fail_on_missing: false

- name: Use an nvidia-smi outside PATH
  specfleet.fleet.nvidia_gpu_facts:
    nvidia_smi_path: /usr/local/nvidia/bin/nvidia-smi

- name: Show the GPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpu.count }} x {{ ansible_facts.nvidia_gpu.gpus[0].name }}"
  when: ansible_facts.nvidia_gpu.count > 0
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: complex
  contains:
    nvidia_gpu:
      description: NVIDIA GPU facts.
      returned: always
      type: complex
      contains:
        present:
          description: Whether nvidia-smi was found and answered.
          type: bool
          returned: always
          sample: true
        error:
          description:
            - Why nvidia-smi did not answer (its command, exit code and message); null when
              it answered or was not found.
          type: str
          returned: always
          sample: null
        count:
          description: Number of GPUs nvidia-smi reports.
          type: int
          returned: always
          sample: 8
        driver_version:
          description: Driver version, from the first GPU's row; null when no GPU.
          type: str
          returned: always
          sample: "580.95.05"
        cuda_version:
          description: Highest CUDA version the driver supports, from nvidia-smi's header.
          type: str
          returned: always
          sample: "13.0"
        gpus:
          description: One entry per GPU, in nvidia-smi's order.
          type: list
          elements: dict
          returned: always
          sample:
            - index: 0
              name: NVIDIA H200
              uuid: GPU-5f0f8a3e-7f1c-2b6e-9f64-3c1b2d9a0e11
              memory_total_mib: 143771
              driver_version: "580.95.05"
              compute_capability: "9.0"
              pci_bus_id: "00000000:18:00.0"
              persistence_mode: true
        persistence_mode:
          description:
            - Whether persistence mode is on for every GPU; null when nvidia-smi did not
              answer or reports it for none.
          type: bool
          returned: always
          sample: true
        kernel_module_version:
          description: Version of the loaded nvidia kernel module; null when none is loaded.
          type: str
          returned: always
          sample: "580.95.05"
        kernel_module_flavour:
          description: C(open) or C(proprietary) for the loaded module; null when none is loaded.
          type: str
          returned: always
          sample: open
        nvidia_smi_path:
          description: The nvidia-smi that was run; null when none was found.
          type: str
          returned: always
          sample: /usr/bin/nvidia-smi
        pci_gpu_count:
          description: NVIDIA GPUs (PCI class 0x0300 or 0x0302) seen on the PCI bus.
          type: int
          returned: always
          sample: 8
        pci_gpus:
          description: The NVIDIA GPUs on the PCI bus, with no driver needed, in bus order.
          type: list
          elements: dict
          returned: always
          sample:
            - pci_bus_id: "0000:18:00.0"
              device_id: "0x2335"
              class: "0x030200"
        nvswitch_count:
          description: NVIDIA NVSwitches (PCI class 0x0680) seen in sysfs.
          type: int
          returned: always
          sample: 4
        nvswitch_driver_count:
          description: NVSwitches the loaded driver registered (/proc/driver/nvidia-nvswitch).
          type: int
          returned: always
          sample: 4
        nvswitch_present:
          description: Whether at least one NVSwitch was seen, on the PCI bus or by the driver.
          type: bool
          returned: always
          sample: true
"""

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "driver_version",
    "compute_cap",
    "pci.bus_id",
    "persistence_mode",
)
NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")
NVSWITCH_PCI_CLASS = "0x0680"
CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")
NO_DEVICES_RE = re.compile(r"No devices were found", re.IGNORECASE)
INVALID_FIELD_RE = re.compile(r'Field "compute_cap" is not a valid field', re.IGNORECASE)
# First line of /proc/driver/nvidia/version, e.g. "NVRM version: NVIDIA UNIX Open Kernel
# Module for x86_64  580.95.05  Release Build ..." or "NVRM version: NVIDIA UNIX x86_64
# Kernel Module  550.127.08  Tue Oct  8 ...".
NVRM_RE = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")


def clean_value(raw: str) -> str | None:
    """Strip a CSV cell; nvidia-smi's bracketed placeholders ([N/A], ...) become None."""
    value = raw.strip()
    if not value or (value.startswith("[") and value.endswith("]")) or value == "N/A":
        return None
    return value


def to_bool(value: str | None) -> bool | None:
    """nvidia-smi's Enabled/Disabled; None for anything else."""
    return {"enabled": True, "disabled": False}.get((value or "").lower())


def to_int(value: str | None) -> int | None:
    """Parse an integer cell (nounits), tolerating a unit suffix and decimals."""
    if value is None:
        return None
    match = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)", value)
    if match is None:
        return None
    return int(float(match.group(1)))


def parse_query_output(text: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output."""
    gpus: list[dict[str, Any]] = []
    lines = [line for line in text.splitlines() if line.strip()]
    for row in csv.reader(lines, skipinitialspace=True):
        if len(row) != len(fields):
            raise ValueError(
                f"expected {len(fields)} comma-separated values, got {len(row)}: {row!r}"
            )
        cells = dict(zip(fields, (clean_value(cell) for cell in row), strict=True))
        index = to_int(cells["index"])
        if index is None:
            raise ValueError(f"GPU row without an index: {row!r}")
        gpus.append(
            {
                "index": index,
                "name": cells["name"],
                "uuid": cells["uuid"],
                "memory_total_mib": to_int(cells["memory.total"]),
                "driver_version": cells["driver_version"],
                "compute_capability": cells.get("compute_cap"),
                "pci_bus_id": cells["pci.bus_id"],
                "persistence_mode": to_bool(cells["persistence_mode"]),
            }
        )
    return gpus


def parse_cuda_version(text: str) -> str | None:
    """Find `CUDA Version: X.Y` in nvidia-smi's header (or `-q` output)."""
    match = CUDA_VERSION_RE.search(text)
    return match.group(1) if match else None


def read_sysfs(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip().lower()
    except OSError:
        return ""


def loaded_kernel_module(procfs_path: str) -> tuple[str | None, str | None]:
    """(version, flavour) of the loaded nvidia.ko, from /proc/driver/nvidia/version."""
    try:
        with open(os.path.join(procfs_path, "driver", "nvidia", "version")) as handle:
            text = handle.read()
    except OSError:
        return None, None
    match = NVRM_RE.search(text)
    if match is None:
        return None, None
    return match.group(1), "open" if "Open Kernel Module" in match.group(0) else "proprietary"


def driver_nvswitches(procfs_path: str) -> int:
    """NVSwitches registered by the loaded driver (one directory each)."""
    try:
        return len(os.listdir(os.path.join(procfs_path, "driver", "nvidia-nvswitch", "devices")))
    except OSError:
        return 0


def pci_device(bus_id: str, device_id: str, pci_class: str) -> dict[str, str]:
    return {"pci_bus_id": bus_id, "device_id": device_id, "class": pci_class}


def scan_sysfs(sysfs_pci_path: str) -> list[dict[str, str]] | None:
    """NVIDIA PCI functions in sysfs; None when the directory cannot be read."""
    try:
        entries = sorted(os.listdir(sysfs_pci_path))
    except OSError:
        return None
    found = []
    for entry in entries:
        device = os.path.join(sysfs_pci_path, entry)
        if read_sysfs(os.path.join(device, "vendor")) != NVIDIA_PCI_VENDOR:
            continue
        found.append(
            pci_device(
                entry,
                read_sysfs(os.path.join(device, "device")),
                read_sysfs(os.path.join(device, "class"))[:8],
            )
        )
    return found


def scan_lspci(module: AnsibleModule) -> list[dict[str, str]]:
    """NVIDIA PCI functions from `lspci -Dnmm` (bus id, "class", "vendor", "device", ...)."""
    lspci = module.get_bin_path("lspci", opt_dirs=["/usr/bin", "/sbin", "/usr/sbin"])
    if lspci is None:
        return []
    rc, out, _ = module.run_command([lspci, "-Dnmm"])
    if rc != 0:
        return []
    found = []
    for line in out.splitlines():
        fields = shlex.split(line)
        if len(fields) < 4 or fields[2].lower() != NVIDIA_PCI_VENDOR[2:]:
            continue
        # lspci -n prints the class without its programming interface: 0302 -> 0x030200
        found.append(pci_device(fields[0], f"0x{fields[3].lower()}", f"0x{fields[1].lower()}00"))
    return found


def scan_pci(module: AnsibleModule) -> tuple[list[dict[str, str]], int]:
    """NVIDIA GPUs (with their device ids) and the number of NVSwitches on the PCI bus."""
    devices = scan_sysfs(module.params["sysfs_pci_path"])
    if devices is None:
        devices = scan_lspci(module)
    gpus = [d for d in devices if d["class"][:6] in GPU_PCI_CLASSES]
    switches = sum(1 for d in devices if d["class"][:6] == NVSWITCH_PCI_CLASS)
    return gpus, switches


def find_nvidia_smi(module: AnsibleModule) -> str | None:
    path = module.params["nvidia_smi_path"]
    if path:
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/bin"])


def all_enabled(values: list[bool | None]) -> bool | None:
    """True when every GPU reports True; None when none reports anything."""
    if all(value is None for value in values):
        return None
    return all(value is True for value in values)


class SmiError(Exception):
    """nvidia-smi ran and failed: the driver cannot be reached, or a GPU is in a bad state."""


def run_smi(module: AnsibleModule, cmd: list[str]) -> tuple[int, str, str]:
    # coreutils' timeout bounds a hung GPU; a minimal container may not have it
    timeout = module.get_bin_path("timeout", opt_dirs=["/usr/bin", "/bin"])
    if timeout is not None:
        cmd = [timeout, str(module.params["nvidia_smi_timeout"]), *cmd]
    try:
        return module.run_command(cmd)
    except OSError as exc:
        raise SmiError(f"{' '.join(cmd)} could not run: {exc}") from exc


def smi_failure(cmd: list[str], rc: int, out: str, err: str) -> SmiError:
    message = " ".join((err.strip() or out.strip() or "no output").splitlines())[:500]
    if rc == 124:
        message = f"no answer within the timeout; {message}"
    return SmiError(f"{' '.join(cmd)} failed (rc={rc}): {message}")


def query_gpus(module: AnsibleModule, smi: str) -> list[dict[str, Any]]:
    fields = QUERY_FIELDS
    while True:
        cmd = [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        rc, out, err = run_smi(module, cmd)
        if NO_DEVICES_RE.search(out) or NO_DEVICES_RE.search(err):
            return []
        if rc != 0 and "compute_cap" in fields and INVALID_FIELD_RE.search(out + err):
            fields = tuple(field for field in fields if field != "compute_cap")
            continue
        if rc != 0:
            raise smi_failure(cmd, rc, out, err)
        try:
            return parse_query_output(out, fields)
        except ValueError as exc:
            module.fail_json(msg=f"cannot parse nvidia-smi output: {exc}", stdout=out)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi_path": {"type": "path"},
            "fail_on_missing": {"type": "bool", "default": True},
            "sysfs_pci_path": {"type": "path", "default": "/sys/bus/pci/devices"},
            "procfs_path": {"type": "path", "default": "/proc"},
            "nvidia_smi_timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    pci_gpus, nvswitches = scan_pci(module)
    switches_in_driver = driver_nvswitches(module.params["procfs_path"])
    module_version, module_flavour = loaded_kernel_module(module.params["procfs_path"])
    facts: dict[str, Any] = {
        "present": False,
        "error": None,
        "count": 0,
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "persistence_mode": None,
        "nvidia_smi_path": None,
        "kernel_module_version": module_version,
        "kernel_module_flavour": module_flavour,
        "pci_gpu_count": len(pci_gpus),
        "pci_gpus": pci_gpus,
        "nvswitch_count": nvswitches,
        "nvswitch_driver_count": switches_in_driver,
        "nvswitch_present": nvswitches > 0 or switches_in_driver > 0,
    }
    smi = find_nvidia_smi(module)
    if smi is None:
        if module.params["fail_on_missing"]:
            where = module.params["nvidia_smi_path"] or "nvidia-smi in PATH"
            module.fail_json(
                msg=f"nvidia-smi not found ({where}): is the NVIDIA driver installed?",
                ansible_facts={"nvidia_gpu": facts},
            )
        module.exit_json(changed=False, ansible_facts={"nvidia_gpu": facts})

    facts["nvidia_smi_path"] = smi
    try:
        gpus = query_gpus(module, smi)
        rc, out, err = run_smi(module, [smi])
        if rc != 0 and gpus:
            raise smi_failure([smi], rc, out, err)
    except SmiError as exc:
        # The host this module exists to repair: report it, never fail on it.
        facts["error"] = str(exc)
        module.exit_json(changed=False, ansible_facts={"nvidia_gpu": facts})
    facts.update(
        present=True,
        count=len(gpus),
        driver_version=gpus[0]["driver_version"] if gpus else None,
        cuda_version=parse_cuda_version(out),
        gpus=gpus,
        persistence_mode=all_enabled([gpu["persistence_mode"] for gpu in gpus]),
    )
    module.exit_json(changed=False, ansible_facts={"nvidia_gpu": facts})


if __name__ == "__main__":
    main()
