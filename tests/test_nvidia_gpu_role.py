"""Tests for roles/nvidia_gpu.

Nothing here installs a driver: this machine has no GPU and cannot reach NVIDIA's
repository. What is covered: ansible-lint (production profile) and a syntax check; the
role's templates rendered by Ansible with the role's own defaults and vars for each
supported distribution (facts injected by a test-only fact module, named as such) and
checked by apt itself; argument_specs and variable checks failing before any task that
changes something; the `cpu` profile and container skips run for real on localhost; the
reboot handlers' conditions exercised in check mode.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Ansible

REPO = Path(__file__).resolve().parents[1]
ROLE = REPO / "roles" / "nvidia_gpu"
VENV_BIN = Path(sys.executable).parent

# Facts of the three supported platforms, as `setup` reports them (the fields the role reads).
PLATFORMS: dict[str, dict[str, str]] = {
    "ubuntu2204": {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "distribution_major_version": "22",
        "distribution_release": "jammy",
        "architecture": "x86_64",
        "kernel": "5.15.0-126-generic",
    },
    "ubuntu2404": {
        "distribution": "Ubuntu",
        "distribution_version": "24.04",
        "distribution_major_version": "24",
        "distribution_release": "noble",
        "architecture": "x86_64",
        "kernel": "6.8.0-49-generic",
    },
    "debian12": {
        "distribution": "Debian",
        # what setup reports on Debian 12: the point release (/etc/debian_version)
        "distribution_version": "12.11",
        "distribution_major_version": "12",
        "distribution_release": "bookworm",
        "architecture": "x86_64",
        "kernel": "6.1.0-28-amd64",
    },
    "ubuntu2404-arm": {
        "distribution": "Ubuntu",
        "distribution_version": "24.04",
        "distribution_major_version": "24",
        "distribution_release": "noble",
        "architecture": "aarch64",
        "kernel": "6.8.0-1021-nvidia-64k",
    },
}

# A module used only by these tests: returns its argument as ansible_facts, so a play can
# stand in for a host of another distribution without touching this one.
INJECT_FACTS_MODULE = """\
#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule

def main():
    module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}},
                           supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts=module.params["facts"])

main()
"""


def ansible_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        # replace profile_tasks (it writes to stdout) with a callback that writes files only
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.junit",
        JUNIT_OUTPUT_DIR=str(tmp_path / "junit"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_NOCOLOR="1",
    )
    env.update(extra)
    return env


def run_playbook(
    tmp_path: Path,
    playbook: str,
    *args: str,
    inventory: str = "localhost,",
    env_extra: dict[str, str] | None = None,
) -> tuple[int, dict, str]:
    """Run ansible-playbook with the json callback; returns (rc, result, stderr)."""
    play_file = tmp_path / "play.yml"
    play_file.write_text(textwrap.dedent(playbook))
    cmd = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        inventory,
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        str(play_file),
        *args,
    ]
    if inventory == "localhost,":
        cmd[1:1] = ["-c", "local"]
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env=ansible_env(tmp_path, **(env_extra or {})),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout[start:]), proc.stderr


def task_results(result: dict, host: str = "localhost") -> list[tuple[str, dict]]:
    """(task name, host result) for every task the host ran, in order."""
    out = []
    for play in result["plays"]:
        for task in play["tasks"]:
            if host in task["hosts"]:
                name = task["task"]["name"].split(" : ", 1)[-1]  # drop the "role : " prefix
                out.append((name, task["hosts"][host]))
    return out


ROLE_PLAY = """\
- name: Apply nvidia_gpu
  hosts: all
  gather_facts: false
  roles:
    - role: nvidia_gpu
"""


# --- static checks --------------------------------------------------------------------


def test_ansible_lint_production_profile(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--profile", "production", "roles/nvidia_gpu"],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_HOME=str(tmp_path / "ansible-home")),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_syntax_check(tmp_path: Path) -> None:
    play_file = tmp_path / "play.yml"
    play_file.write_text(ROLE_PLAY)
    proc = subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "--syntax-check",
            str(play_file),
        ],
        cwd=REPO,
        env=dict(ansible_env(tmp_path), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def load_yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text())


def test_defaults_documented_and_declared() -> None:
    defaults = load_yaml(ROLE / "defaults" / "main.yml")
    assert isinstance(defaults, dict)
    specs = load_yaml(ROLE / "meta" / "argument_specs.yml")
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert all(name.startswith("nvidia_gpu_") for name in defaults)
    lines = (ROLE / "defaults" / "main.yml").read_text().splitlines()
    readme = (ROLE / "README.md").read_text()
    for name in defaults:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
        assert lines[index - 1].startswith("#"), f"{name} has no comment above it"
        assert f"`{name}`" in readme, f"{name} missing from README"
    # declared defaults equal the real ones, where the real one is not a template
    for name, value in defaults.items():
        if isinstance(value, str) and "{{" in value:
            continue
        if "default" in options[name]:
            assert options[name]["default"] == value, name


def test_meta_platforms() -> None:
    meta = load_yaml(ROLE / "meta" / "main.yml")
    platforms = {p["name"]: set(p["versions"]) for p in meta["galaxy_info"]["platforms"]}
    assert platforms == {"Ubuntu": {"jammy", "noble"}, "Debian": {"bookworm"}}


def iter_tasks(items: list[dict]) -> list[dict]:
    tasks = []
    for item in items:
        tasks.append(item)
        for key in ("block", "rescue", "always"):
            tasks.extend(iter_tasks(item.get(key, [])))
    return tasks


TASK_KEYS = {
    "name",
    "when",
    "block",
    "rescue",
    "always",
    "register",
    "notify",
    "loop",
    "listen",
    "changed_when",
    "failed_when",
    "tags",
    "vars",
    "check_mode",
}


def test_fqcn_and_changed_when_everywhere() -> None:
    files = [*sorted((ROLE / "tasks").glob("*.yml")), ROLE / "handlers" / "main.yml"]
    for path in files:
        for task in iter_tasks(load_yaml(path)):
            actions = [key for key in task if key not in TASK_KEYS]
            if "block" in task:
                continue
            assert len(actions) == 1, (path.name, task)
            action = actions[0]
            ours = action == "specfleet.fleet.nvidia_gpu_facts"
            assert action.startswith("ansible.builtin.") or ours, action
            if action in ("ansible.builtin.command", "ansible.builtin.shell"):
                assert "changed_when" in task, (path.name, task["name"])
            if action == "ansible.builtin.systemd_service" and path.parent.name == "tasks":
                assert task[action].get("state") not in ("restarted", "reloaded"), task["name"]


# --- templates rendered by Ansible, per distribution ----------------------------------

RENDER_PLAY = """\
- name: Render the nvidia_gpu templates with the role's defaults and vars
  hosts: all
  gather_facts: false
  tasks:
    - name: Inject the platform facts (test-only module)
      inject_facts:
        facts: "{{{{ platform_facts }}}}"

    - name: Load the role's defaults and vars at their own precedence (variable checks only)
      ansible.builtin.import_role:
        name: nvidia_gpu
        tasks_from: variables.yml

    - name: Output directory
      ansible.builtin.file:
        path: "{out}/{{{{ inventory_hostname }}}}"
        state: directory
        mode: "0755"

    - name: Render
      ansible.builtin.template:
        src: "{role}/templates/{{{{ item.src }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}/{{{{ item.dest }}}}"
        mode: "0644"
      loop:
        - {{src: cuda.sources.j2, dest: cuda.sources}}
        - {{src: nvidia-driver.pref.j2, dest: nvidia-driver.pref}}
        - {{src: blacklist-nouveau.conf.j2, dest: blacklist-nouveau.conf}}
        - {{src: specfleet-nvidia-devices.service.j2, dest: specfleet-nvidia-devices.service}}
        - {{src: specfleet-nvidia-modules.conf.j2, dest: specfleet-nvidia-modules.conf}}
        - {{src: nvidia-persistenced-override.conf.j2, dest: nvidia-persistenced-override.conf}}

    - name: Resolved internal values
      ansible.builtin.copy:
        dest: "{out}/{{{{ inventory_hostname }}}}/values.json"
        mode: "0644"
        content: "{{{{ values | to_nice_json }}}}"
      vars:
        values:
          distro: "{{{{ __nvidia_gpu_distro }}}}"
          arch: "{{{{ __nvidia_gpu_arch }}}}"
          repo_url: "{{{{ __nvidia_gpu_repo_url }}}}"
          keyring_url: "{{{{ __nvidia_gpu_repo_url }}}}{{{{ __nvidia_gpu_keyring_deb }}}}"
          driver_packages: "{{{{ __nvidia_gpu_driver_package_names }}}}"
          toolkit_package: "{{{{ __nvidia_gpu_cuda_toolkit_package }}}}"
          headers_package: "linux-headers-{{{{ ansible_facts.kernel }}}}"
          pin_version: "{{{{ __nvidia_gpu_pin_version }}}}"
          device_nodes_script: "{{{{ __nvidia_gpu_device_nodes_script }}}}"
          held_packages: "{{{{ __nvidia_gpu_held_packages }}}}"
          pinning_package: "{{{{ __nvidia_gpu_pinning_package }}}}"
          driver_version_installed: "{{{{ __nvidia_gpu_driver_version_installed }}}}"
          fabricmanager_package: "{{{{ __nvidia_gpu_fabricmanager_package }}}}"
          open_modules_required: "{{{{ __nvidia_gpu_open_modules_required }}}}"
          headers_meta_package: "{{{{ __nvidia_gpu_kernel_headers_meta_package }}}}"
          build_packages: "{{{{ __nvidia_gpu_build_packages }}}}"
          device_nodes_unit: "{{{{ __nvidia_gpu_device_nodes_unit }}}}"
          persistenced_dropin: "{{{{ __nvidia_gpu_persistenced_dropin }}}}"
"""


def dpkg(version: str, *names: str) -> dict[str, list[dict[str, str]]]:
    """package_facts entries (apt manager) for packages of one version."""
    return {name: [{"name": name, "version": version, "source": "apt"}] for name in names}


# What package_facts reports on an Ubuntu 24.04 HGX host after the 580 driver, the
# fabric manager and the CUDA toolkit were installed from NVIDIA's repository.
INSTALLED_UBUNTU_580 = {
    **dpkg("580.95.05-0ubuntu1", "nvidia-open", "nvidia-driver-580-open", "nvidia-dkms-580-open",
           "nvidia-kernel-source-580-open", "nvidia-kernel-common-580", "nvidia-firmware-580",
           "libnvidia-compute-580", "libnvidia-cfg1-580", "libnvidia-gl-580",
           "libnvidia-common-580", "libnvidia-decode-580", "libnvidia-encode-580",
           "libnvidia-extra-580", "libnvidia-fbc1-580", "nvidia-utils-580",
           "nvidia-compute-utils-580", "xserver-xorg-video-nvidia-580", "nvidia-modprobe",
           "nvidia-settings", "libxnvctrl0"),
    **dpkg("580.95.05-1", "nvidia-fabricmanager-580", "libnvidia-nscq-580"),
    # not the driver: other versions, or other packages that match the name patterns
    **dpkg("580-1ubuntu1", "nvidia-driver-pinning-580"),
    **dpkg("1.17.8-1", "nvidia-container-toolkit", "libnvidia-container1"),
    **dpkg("1:1.1.13-1build1", "libnvidia-egl-wayland1"),
    **dpkg("13.0.88-1", "libnvjitlink-13-0", "cuda-nvcc-13-0"),
    **dpkg("1.8-3build1", "libnvme1"),
    **dpkg("2.39-0ubuntu8.4", "libc6"),
}  # fmt: skip

# `apt-cache policy nvidia-driver-pinning-580.95.05 nvidia-driver-pinning-580` where the
# repository has no package for the exact version.
APT_POLICY_PINNING = """\
nvidia-driver-pinning-580.95.05:
  Installed: (none)
  Candidate: (none)
  Version table:
nvidia-driver-pinning-580:
  Installed: (none)
  Candidate: 580-1ubuntu1
  Version table:
     580-1ubuntu1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64  Packages
"""

VARIANTS: dict[str, dict[str, object]] = {
    # host name: (platform, extra host vars)
    "ubuntu2204": {"platform": "ubuntu2204"},
    "ubuntu2404": {"platform": "ubuntu2404"},
    "debian12": {"platform": "debian12"},
    "ubuntu2404-arm": {"platform": "ubuntu2404-arm"},
    "ubuntu2404-installed": {
        "platform": "ubuntu2404",
        "facts": {"packages": INSTALLED_UBUNTU_580},
        # what `apt-cache policy` printed (driver.yml): the repository has the branch's
        # pinning package only
        "__nvidia_gpu_pinning_policy": {"stdout": APT_POLICY_PINNING},
    },
    # NVIDIA renamed the packages at 590: no branch in the name any more
    "ubuntu2404-installed-590": {
        "platform": "ubuntu2404",
        "facts": {"packages": dpkg("590.44.01-1ubuntu1", "nvidia-open", "libnvidia-compute")},
        "nvidia_gpu_driver_branch": "590",
    },
    # a driver package list of the operator's own, not installed under that name: the
    # version of the loaded kernel module is what there is
    "debian12-loaded-575": {
        "platform": "debian12",
        "facts": {"nvidia_gpu": {"kernel_module_version": "575.57.08"}},
        "nvidia_gpu_driver_branch": "575",
        "nvidia_gpu_driver_packages": ["nvidia-driver"],
        "nvidia_gpu_cuda_toolkit_version": "12.9",
    },
    # Blackwell before any driver (PCI only): B200 is device 0x2901
    "ubuntu2404-b200": {
        "platform": "ubuntu2404",
        "facts": {
            "nvidia_gpu": {
                "gpus": [],
                "pci_gpus": [
                    {"pci_bus_id": "0000:18:00.0", "device_id": "0x2901", "class": "0x030200"}
                ],
            }
        },
    },
    # Blackwell seen by a running driver (compute capability 12.0), PCI id unknown to the table
    "debian12-rtx-pro-6000": {
        "platform": "debian12",
        "facts": {
            "nvidia_gpu": {
                "pci_gpus": [],
                "gpus": [
                    {
                        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                        "compute_capability": "12.0",
                    }
                ],
            }
        },
    },
    "ubuntu2404-h200-loaded": {
        "platform": "ubuntu2404",
        "facts": {
            "nvidia_gpu": {
                "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}],
                "pci_gpus": [
                    {"pci_bus_id": "0000:18:00.0", "device_id": "0x2335", "class": "0x030200"}
                ],
            }
        },
    },
    "ubuntu2204-hwe": {
        "platform": "ubuntu2204",
        "facts": {"kernel": "6.8.0-49-generic"},
    },
    "debian12-cloud": {
        "platform": "debian12",
        "facts": {"kernel": "6.1.0-28-cloud-amd64"},
    },
    "debian12-proprietary-exact": {
        "platform": "debian12",
        "nvidia_gpu_kernel_modules": "proprietary",
        "nvidia_gpu_driver_version": "580.95.05",
        "nvidia_gpu_cuda_toolkit_version": "12.9",
    },
}


# Hosts whose NVIDIA repository is the local test repository of apt_repos (an HTTP
# server on 127.0.0.1), so that apt itself can resolve their pins.
MIRROR_VARIANTS: dict[str, dict[str, object]] = {
    "ubuntu2204-mirror": {"platform": "ubuntu2204"},
    "ubuntu2204-mirror-exact": {"platform": "ubuntu2204", "nvidia_gpu_driver_version": "580.82.07"},
}


def build_deb(out: Path, name: str, version: str, source: str) -> None:
    """An empty .deb with the given control fields (apt only reads its metadata here)."""
    root = out.parent / "build" / f"{name}_{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nSource: {source}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: specfleet tests <tests@example.invalid>\nDescription: test package\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["dpkg-deb", "--build", "-Zgzip", str(root), str(out / f"{name}_{version}_all.deb")],
        check=True,
        capture_output=True,
    )


def flat_repo(path: Path, origin: str, packages: list[tuple[str, str, str]]) -> None:
    """A flat apt repository ("Suites: /") whose Release names its origin."""
    for name, version, source in packages:
        build_deb(path, name, version, source)
    index = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (path / "Packages").write_text(index)
    (path / "Release").write_text(
        f"Origin: {origin}\nLabel: {origin}\nSuite: test\nCodename: test\n"
        "Date: Thu, 01 Jan 2026 00:00:00 UTC\nArchitectures: all amd64\n"
    )


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def apt_repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """NVIDIA's repository over HTTP on 127.0.0.1, Ubuntu's archive as a file: repository.

    Package names, versions and source packages as both publish them: Ubuntu's archive
    builds the same 580 driver (nvidia-graphics-drivers-580) under the same names, and
    ships helpers such as egl-wayland that NVIDIA's driver packages depend on.
    """
    if shutil.which("dpkg-deb") is None or shutil.which("dpkg-scanpackages") is None:
        yield {}
        return
    root = tmp_path_factory.mktemp("apt-repos")
    nvidia = root / "cuda" / "repos" / "ubuntu2204" / "x86_64"
    flat_repo(
        nvidia,
        "NVIDIA",
        [
            ("nvidia-open", "580.82.07-0ubuntu1", "nvidia-open"),
            ("nvidia-open", "580.95.05-0ubuntu1", "nvidia-open"),
            ("nvidia-open", "590.44.01-0ubuntu1", "nvidia-open"),
            ("libnvidia-compute-580", "580.82.07-0ubuntu1", "nvidia-graphics-drivers-580"),
            ("libnvidia-compute-580", "580.95.05-0ubuntu1", "nvidia-graphics-drivers-580"),
            ("cuda-toolkit-13-0", "13.0.2-1", "cuda-toolkit-13-0"),
        ],
    )
    ubuntu = root / "ubuntu"
    flat_repo(
        ubuntu,
        "Ubuntu",
        [
            ("libnvidia-compute-580", "580.105.08-0ubuntu0.22.04.1", "nvidia-graphics-drivers-580"),
            ("libnvidia-egl-wayland1", "1:1.1.9-1.1", "egl-wayland"),
            ("libnvme1", "1.0-1", "libnvme"),
        ],
    )
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"base_url": f"http://127.0.0.1:{server.server_port}/cuda/repos", "ubuntu": ubuntu}
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, apt_repos: dict[str, object]) -> Path:
    tmp_path = tmp_path_factory.mktemp("render")
    out = tmp_path / "out"
    library = tmp_path / "library"
    library.mkdir()
    (library / "inject_facts.py").write_text(INJECT_FACTS_MODULE)
    hosts = {}
    variants = dict(VARIANTS)
    if apt_repos:
        for host, variant in MIRROR_VARIANTS.items():
            variants[host] = {**variant, "nvidia_gpu_cuda_repo_base_url": apt_repos["base_url"]}
    for host, variant in variants.items():
        host_vars = {k: v for k, v in variant.items() if k not in ("platform", "facts")}
        hosts[host] = {
            "ansible_connection": "local",
            "platform_facts": {**PLATFORMS[str(variant["platform"])], **variant.get("facts", {})},
            **host_vars,
        }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    rc, result, stderr = run_playbook(
        tmp_path,
        RENDER_PLAY.format(role=ROLE, out=out),
        inventory=str(inventory),
        env_extra={"ANSIBLE_LIBRARY": str(library)},
    )
    assert rc == 0, json.dumps(result["stats"]) + stderr
    return out


@pytest.mark.parametrize(
    ("host", "distro", "arch"),
    [
        ("ubuntu2204", "ubuntu2204", "x86_64"),
        ("ubuntu2404", "ubuntu2404", "x86_64"),
        ("debian12", "debian12", "x86_64"),
        ("ubuntu2404-arm", "ubuntu2404", "sbsa"),
    ],
)
def test_deb822_source_rendered_per_distro(rendered: Path, host: str, distro: str, arch: str):
    url = f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/"
    text = (rendered / host / "cuda.sources").read_text()
    fields = dict(
        line.split(": ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert fields == {
        "Types": "deb",
        "URIs": url,
        "Suites": "/",
        "Signed-By": "/usr/share/keyrings/cuda-archive-keyring.gpg",
    }
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["keyring_url"] == url + "cuda-keyring_1.1-1_all.deb"
    assert values["driver_packages"] == ["nvidia-open"]
    # the stack's CUDA: torch 2.13.0 from PyPI is a CUDA 13.0 build
    assert values["toolkit_package"] == "cuda-toolkit-13-0"
    assert values["headers_package"] == "linux-headers-" + PLATFORMS[host]["kernel"]


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get to parse sources")
@pytest.mark.parametrize("host", ["ubuntu2204", "ubuntu2404", "debian12", "ubuntu2404-arm"])
def test_deb822_source_parsed_by_apt(rendered: Path, host: str, tmp_path: Path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    shutil.copy(rendered / host / "cuda.sources", parts / "cuda.sources")
    proc = subprocess.run(
        [
            "apt-get",
            "-o",
            "Dir::Etc::SourceList=/dev/null",
            "-o",
            f"Dir::Etc::SourceParts={parts}",
            "indextargets",
            "--no-release-info",
            "--format",
            "$(URI)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "E:" not in proc.stderr, proc.stderr
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["repo_url"] + "Packages" in proc.stdout.split()


def parse_preferences(text: str) -> list[dict[str, str]]:
    stanzas = []
    for chunk in re.split(r"\n\s*\n", text):
        fields = dict(
            line.split(": ", 1)
            for line in chunk.splitlines()
            if line.strip() and not line.startswith("#")
        )
        if fields:
            stanzas.append(fields)
    return stanzas


def stanza(stanzas: list[dict[str, str]], pin_kind: str) -> dict[str, str]:
    """The first stanza whose Pin starts with pin_kind ("origin", "version", "release")."""
    return next(st for st in stanzas if st["Pin"].startswith(pin_kind))


@pytest.mark.parametrize("host", ["ubuntu2204", "ubuntu2404", "debian12"])
def test_driver_branch_pin_rendered(rendered: Path, host: str):
    stanzas = parse_preferences((rendered / host / "nvidia-driver.pref").read_text())
    assert stanza(stanzas, "origin") == {
        "Package": "*",
        "Pin": 'origin "developer.download.nvidia.com"',
        "Pin-Priority": "600",
    }
    branch = stanza(stanzas, "version")
    assert branch["Pin"] == "version /^([0-9]+:)?580[.]/"
    assert branch["Pin-Priority"] == "1000"
    patterns = branch["Package"].split()
    pin = re.compile(branch["Pin"].removeprefix("version /").removesuffix("/"))
    package_re = [re.compile(p.strip("/")) for p in patterns]
    for package in ("nvidia-open", "nvidia-driver-580-open", "libnvidia-compute-580"):
        assert any(r.search(package) for r in package_re), package
    for package in ("cuda-drivers", "libcuda1", "nvidia-fabricmanager"):
        assert any(r.search(package) for r in package_re), package
    assert not any(r.search("cuda-toolkit-12-8") for r in package_re)
    # the version regex takes the branch and nothing else
    assert pin.search("580.95.05-1")
    assert pin.search("580.95.05-0ubuntu1")
    assert pin.search("1:580.65.06-1")
    assert not pin.search("590.44.01-1")
    assert not pin.search("5800.1-1")


def apt_policy(rendered: Path, apt_repos: dict[str, object], host: str, tmp_path: Path) -> str:
    """`apt-cache policy` of the test packages with the host's rendered source and pins."""
    etc = tmp_path / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "preferences.d").mkdir()
    (tmp_path / "state" / "lists" / "partial").mkdir(parents=True)
    (tmp_path / "cache" / "archives" / "partial").mkdir(parents=True)
    # the rendered deb822 source, trusted instead of signed (the test repository has no key)
    source = (rendered / host / "cuda.sources").read_text()
    source = re.sub(r"(?m)^Signed-By: .*$", "Trusted: yes", source)
    (etc / "sources.list.d" / "cuda.sources").write_text(source)
    (etc / "sources.list").write_text(f"deb [trusted=yes] file:{apt_repos['ubuntu']} ./\n")
    shutil.copy(rendered / host / "nvidia-driver.pref", etc / "preferences.d" / "nvidia.pref")
    options = [
        f"-oDir::Etc={etc}",
        f"-oDir::State={tmp_path / 'state'}",
        f"-oDir::Cache={tmp_path / 'cache'}",
        "-oDir::State::status=/dev/null",
        "-oDebug::NoLocking=1",
        "-oAPT::Sandbox::User=root",
    ]
    update = subprocess.run(
        ["apt-get", *options, "update"], capture_output=True, text=True, timeout=120, check=False
    )
    assert update.returncode == 0, update.stdout + update.stderr
    return subprocess.run(
        ["apt-cache", *options, "policy", "nvidia-open", "libnvidia-compute-580",
         "libnvidia-egl-wayland1", "libnvme1", "cuda-toolkit-13-0"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def candidates(policy: str) -> dict[str, str]:
    """package -> candidate version, from `apt-cache policy` output."""
    return dict(re.findall(r"(?m)^(\S+):\n\s+Installed: .*\n\s+Candidate: (\S+)", policy))


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt to resolve the pins")
def test_driver_pin_takes_the_branch_from_nvidia_only(
    rendered: Path, apt_repos: dict[str, object], tmp_path: Path
):
    if not apt_repos:
        pytest.skip("needs dpkg-deb and dpkg-scanpackages to build the test repositories")
    policy = apt_policy(rendered, apt_repos, "ubuntu2204-mirror", tmp_path)
    assert candidates(policy) == {
        # Ubuntu's archive has a newer build of the same branch under the same name: the
        # pin must not take it (it would mix Ubuntu's and NVIDIA's driver packages).
        "libnvidia-compute-580": "580.95.05-0ubuntu1",
        # NVIDIA's own newer branch stays out
        "nvidia-open": "580.95.05-0ubuntu1",
        # what only the archive has, and what is not the driver, is untouched
        "libnvidia-egl-wayland1": "1:1.1.9-1.1",
        "libnvme1": "1.0-1",
        "cuda-toolkit-13-0": "13.0.2-1",
    }, policy


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt to resolve the pins")
def test_exact_driver_version_pin_holds_a_fleet_on_one_version(
    rendered: Path, apt_repos: dict[str, object], tmp_path: Path
):
    if not apt_repos:
        pytest.skip("needs dpkg-deb and dpkg-scanpackages to build the test repositories")
    policy = apt_policy(rendered, apt_repos, "ubuntu2204-mirror-exact", tmp_path)
    found = candidates(policy)
    assert found["libnvidia-compute-580"] == "580.82.07-0ubuntu1", policy
    assert found["nvidia-open"] == "580.82.07-0ubuntu1", policy


def test_every_installed_driver_package_is_held(rendered: Path):
    values = json.loads((rendered / "ubuntu2404-installed" / "values.json").read_text())
    # every package of the driver, not only the meta package the role asked for
    assert sorted(values["held_packages"]) == sorted(
        name
        for name, entries in INSTALLED_UBUNTU_580.items()
        if entries[0]["version"].startswith("580.")
    )
    assert "libnvidia-compute-580" in values["held_packages"]
    assert "nvidia-fabricmanager-580" in values["held_packages"]
    for other in ("nvidia-container-toolkit", "libnvjitlink-13-0", "libnvme1", "libc6"):
        assert other not in values["held_packages"]
    # before anything is installed there is nothing to hold
    fresh = json.loads((rendered / "ubuntu2404" / "values.json").read_text())
    assert fresh["held_packages"] == []


def test_pinning_package_chosen_from_apt_cache_policy(rendered: Path):
    values = json.loads((rendered / "ubuntu2404-installed" / "values.json").read_text())
    assert values["pinning_package"] == "nvidia-driver-pinning-580"
    # no policy output (a repository without pinning packages): nothing to install
    fresh = json.loads((rendered / "ubuntu2404" / "values.json").read_text())
    assert fresh["pinning_package"] == ""


@pytest.mark.parametrize(
    ("host", "version", "package"),
    [
        ("ubuntu2404-installed", "580.95.05", "nvidia-fabricmanager-580"),
        ("ubuntu2404-installed-590", "590.44.01", "nvidia-fabricmanager"),
        ("debian12-loaded-575", "575.57.08", "nvidia-fabricmanager-575"),
    ],
)
def test_fabricmanager_package_follows_the_installed_driver(
    rendered: Path, host: str, version: str, package: str
):
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["driver_version_installed"] == version
    # branches below 590 name the package nvidia-fabricmanager-<branch>
    assert values["fabricmanager_package"] == package


def test_exact_version_and_proprietary_rendered(rendered: Path):
    host = "debian12-proprietary-exact"
    stanzas = parse_preferences((rendered / host / "nvidia-driver.pref").read_text())
    assert stanza(stanzas, "version")["Pin"] == r"version /^([0-9]+:)?580\.95\.05-/"
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["driver_packages"] == ["cuda-drivers"]
    assert values["toolkit_package"] == "cuda-toolkit-12-9"


@pytest.mark.parametrize("host", list(VARIANTS))
def test_nouveau_blacklist_rendered(rendered: Path, host: str):
    lines = [
        line
        for line in (rendered / host / "blacklist-nouveau.conf").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines == ["blacklist nouveau", "options nouveau modeset=0"]


# --- device nodes for sandboxed services ----------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROC_580 = FIXTURES / "proc-nvidia-580-hgx-h200"
DEVICE_NODES_SCRIPT = ROLE / "files" / "specfleet-nvidia-device-nodes"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file as {section: {key: [values, in order]}}."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


@pytest.mark.parametrize("host", list(VARIANTS))
def test_device_node_unit_rendered(rendered: Path, host: str):
    values = json.loads((rendered / host / "values.json").read_text())
    # main's server and training units Require= and order After= exactly this name.
    assert values["device_nodes_unit"] == "specfleet-nvidia-devices.service"
    unit = parse_unit((rendered / host / "specfleet-nvidia-devices.service").read_text())
    assert unit["Service"]["Type"] == ["oneshot"]
    assert unit["Service"]["RemainAfterExit"] == ["yes"]
    assert unit["Service"]["ExecStart"] == [values["device_nodes_script"]]
    after = " ".join(unit["Unit"]["After"]).split()
    assert "systemd-modules-load.service" in after
    assert "nvidia-persistenced.service" in " ".join(unit["Unit"]["Before"]).split()
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # nothing in it may depend on the sandbox it serves
    assert not any(
        key.startswith(("Device", "NoNewPrivileges", "Private")) for key in unit["Service"]
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_device_node_unit_verified_by_systemd(rendered: Path, tmp_path: Path):
    text = (rendered / "ubuntu2404" / "specfleet-nvidia-devices.service").read_text()
    values = json.loads((rendered / "ubuntu2404" / "values.json").read_text())
    # systemd-analyze checks that ExecStart's program exists: point it at the real script
    text = text.replace(values["device_nodes_script"], str(DEVICE_NODES_SCRIPT))
    unit = tmp_path / "specfleet-nvidia-devices.service"
    unit.write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [
        line
        for line in proc.stderr.splitlines()
        # units this one names but which this machine lacks (no NVIDIA driver here)
        if "nvidia-persistenced.service" not in line
    ]
    assert proc.returncode == 0 or not problems, proc.stderr
    assert not problems, proc.stderr


@pytest.mark.parametrize("host", list(VARIANTS))
def test_nvidia_uvm_loaded_at_boot(rendered: Path, host: str):
    lines = [
        line.strip()
        for line in (rendered / host / "specfleet-nvidia-modules.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines == ["nvidia-uvm"]


def run_device_nodes(
    tmp_path: Path,
    proc: Path,
    *,
    modprobe_rc: int = 0,
    nvidia_modprobe: bool = False,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the device-node script against a /proc fixture and an empty /dev.

    Loading a kernel module cannot happen here: `modprobe` (and `nvidia-modprobe`) are
    FAKES on PATH that log their arguments. mknod is real.
    """
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    fake = f'#!/bin/sh\necho "$(basename "$0") $*" >> {log}\nexit {{rc}}\n'
    (bin_dir / "modprobe").write_text(fake.format(rc=modprobe_rc))
    (bin_dir / "modprobe").chmod(0o755)
    if nvidia_modprobe:
        (bin_dir / "nvidia-modprobe").write_text(fake.format(rc=0))
        (bin_dir / "nvidia-modprobe").chmod(0o755)
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    proc_run = subprocess.run(
        [str(DEVICE_NODES_SCRIPT)],
        env={
            "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
            "NVIDIA_DEVICE_NODES_PROC": str(proc),
            "NVIDIA_DEVICE_NODES_DEV": str(dev),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc_run, dev


def char_nodes(dev: Path) -> dict[str, tuple[int, int, int]]:
    """name -> (major, minor, permission bits) of the character devices in dev."""
    nodes = {}
    for path in dev.iterdir():
        st = path.lstat()
        if os.path.stat.S_ISCHR(st.st_mode):
            nodes[path.name] = (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777)
    return nodes


def can_mknod(tmp_path: Path) -> bool:
    try:
        os.mknod(tmp_path / "probe", 0o600 | os.path.stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        return False
    (tmp_path / "probe").unlink()
    return True


@pytest.fixture
def mknod_allowed(tmp_path: Path) -> None:
    if not can_mknod(tmp_path):
        pytest.skip("creating device nodes needs root (CAP_MKNOD)")


def test_device_nodes_from_a_580_proc_fixture(tmp_path: Path, mknod_allowed: None):
    result, dev = run_device_nodes(tmp_path, PROC_580)
    assert result.returncode == 0, result.stdout + result.stderr
    nodes = char_nodes(dev)
    assert nodes == {
        **{f"nvidia{i}": (195, i, 0o666) for i in range(8)},
        "nvidiactl": (195, 255, 0o666),
        "nvidia-uvm": (238, 0, 0o666),
        "nvidia-uvm-tools": (238, 1, 0o666),
    }
    assert (tmp_path / "calls.log").read_text() == "modprobe nvidia-uvm\n"
    # a second run changes nothing
    again, _ = run_device_nodes(tmp_path, PROC_580)
    assert again.returncode == 0
    assert "created" not in again.stdout
    assert char_nodes(dev) == nodes


def test_device_nodes_replace_a_stale_uvm_node(tmp_path: Path, mknod_allowed: None):
    dev = tmp_path / "dev"
    dev.mkdir()
    # nvidia-uvm was reloaded under another dynamic major since this node was made
    os.mknod(dev / "nvidia-uvm", 0o666 | os.path.stat.S_IFCHR, os.makedev(511, 0))
    result, dev = run_device_nodes(tmp_path, PROC_580)
    assert result.returncode == 0, result.stderr
    assert "replacing" in result.stdout
    assert char_nodes(dev)["nvidia-uvm"] == (238, 0, 0o666)


def test_device_nodes_with_an_older_driver_and_nvidia_modprobe(tmp_path: Path, mknod_allowed: None):
    proc = tmp_path / "proc"
    shutil.copytree(PROC_580, proc)
    # drivers before 550 name major 195 "nvidia-frontend"
    shutil.copy(FIXTURES / "proc-devices-nvidia-535.txt", proc / "devices")
    result, dev = run_device_nodes(tmp_path, proc, nvidia_modprobe=True)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "modprobe nvidia-uvm"
    assert calls[1:] == [f"nvidia-modprobe -c {i} -u" for i in range(8)]
    nodes = char_nodes(dev)
    assert nodes["nvidiactl"] == (195, 255, 0o666)
    assert nodes["nvidia-uvm"] == (238, 0, 0o666)


def test_device_nodes_fail_clearly_without_the_module(tmp_path: Path):
    result, dev = run_device_nodes(tmp_path, PROC_580, modprobe_rc=1)
    assert result.returncode == 1
    assert "cannot load nvidia-uvm" in result.stderr
    assert list(dev.iterdir()) == []


def test_device_nodes_fail_clearly_when_uvm_has_no_major(tmp_path: Path):
    proc = tmp_path / "proc"
    shutil.copytree(PROC_580, proc)
    devices = (proc / "devices").read_text().replace("238 nvidia-uvm\n", "")
    (proc / "devices").write_text(devices)
    result, _ = run_device_nodes(tmp_path, proc)
    assert result.returncode == 1
    assert "no nvidia-uvm character device" in result.stderr


# What Ubuntu's nvidia-compute-utils-<branch> ships as nvidia-persistenced.service: it
# starts the daemon with persistence mode off.
UBUNTU_PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""


@pytest.mark.parametrize("host", list(VARIANTS))
def test_persistenced_dropin_turns_persistence_mode_on(rendered: Path, host: str):
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["persistenced_dropin"].startswith(
        "/etc/systemd/system/nvidia-persistenced.service.d/"
    )
    dropin = parse_unit((rendered / host / "nvidia-persistenced-override.conf").read_text())
    # The empty ExecStart= clears the packaged one; the next replaces it (as the drop-in
    # of NVIDIA's own Ansible role does).
    assert dropin["Service"]["ExecStart"] == [
        "",
        "/usr/bin/nvidia-persistenced --user root --persistence-mode --verbose",
    ]
    merged = parse_unit(UBUNTU_PERSISTENCED_UNIT)
    for key, values_ in dropin["Service"].items():
        for value in values_:
            merged["Service"][key] = [] if value == "" else [*merged["Service"][key], value]
    assert merged["Service"]["ExecStart"] == [
        "/usr/bin/nvidia-persistenced --user root --persistence-mode --verbose"
    ]


# --- runs of the role on localhost that must change nothing ---------------------------


def assert_nothing_changed(result: dict) -> None:
    for host, stats in result["stats"].items():
        assert stats["changed"] == 0, (host, stats)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"nvidia_gpu_kernel_modules": "closed"}, "nvidia_gpu_kernel_modules"),
        ({"nvidia_gpu_fabricmanager": "maybe"}, "nvidia_gpu_fabricmanager"),
        ({"nvidia_gpu_reboot_allowed": "perhaps"}, "nvidia_gpu_reboot_allowed"),
        ({"nvidia_gpu_reboot_timeout": "soon"}, "nvidia_gpu_reboot_timeout"),
        ({"specfleet_accelerator": "tpu"}, "specfleet_accelerator"),
    ],
)
def test_argument_spec_rejects_bad_values(tmp_path: Path, extra: dict, message: str):
    rc, result, _ = run_playbook(tmp_path, ROLE_PLAY, "-e", json.dumps(extra))
    assert rc != 0
    tasks = task_results(result)
    # The project settings' spec (role specfleet) first, then the role's: nothing else ran.
    assert all(name.startswith("Validating arguments") for name, _ in tasks), tasks
    name, host_result = tasks[-1]
    assert name.startswith("Validating arguments against arg spec 'main'")
    assert host_result["failed"] is True
    assert message in host_result["msg"]
    assert_nothing_changed(result)


VERSION_CHECK = "Check the version variables and that the driver branch supports the CUDA toolkit"


@pytest.mark.parametrize(
    "extra",
    [
        {"nvidia_gpu_driver_branch": "58O"},
        {"nvidia_gpu_driver_version": "575.57.08"},
        {"nvidia_gpu_cuda_toolkit_version": "12"},
    ],
)
def test_version_variables_checked_first(tmp_path: Path, extra: dict):
    # even with accelerator cpu: a bad version is a configuration error
    rc, result, _ = run_playbook(
        tmp_path, ROLE_PLAY, "-e", json.dumps({"specfleet_accelerator": "cpu", **extra})
    )
    assert rc != 0
    names = [name for name, _ in task_results(result)]
    assert names[-1] == VERSION_CHECK
    assert "Say why the role is skipped (profile without NVIDIA GPUs)" not in names
    failed = task_results(result)[-1][1]
    assert failed["failed"] is True
    assert "nvidia_gpu_driver_branch must be digits" in failed["msg"]
    assert_nothing_changed(result)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # CUDA 13.x needs a 580 driver at least, 12.8 a 570
        ({"nvidia_gpu_driver_branch": "570"}, "CUDA 13.0 needs driver branch 580 or later"),
        (
            {"nvidia_gpu_driver_branch": "565", "nvidia_gpu_cuda_toolkit_version": "12.8"},
            "CUDA 12.8 needs driver branch 570 or later",
        ),
        # a version the table does not know is refused, not guessed
        ({"nvidia_gpu_cuda_toolkit_version": "12.7"}, "no minimum driver is known for CUDA 12.7"),
    ],
)
def test_toolkit_needs_a_driver_branch_that_supports_it(tmp_path: Path, extra: dict, message: str):
    rc, result, _ = run_playbook(
        tmp_path, ROLE_PLAY, "-e", json.dumps({"specfleet_accelerator": "cpu", **extra})
    )
    assert rc != 0
    name, failed = task_results(result)[-1]
    assert name == VERSION_CHECK
    assert message in failed["msg"]
    assert_nothing_changed(result)


@pytest.mark.parametrize(
    "extra",
    [
        {"nvidia_gpu_driver_branch": "570", "nvidia_gpu_cuda_toolkit_version": "12.8"},
        {"nvidia_gpu_driver_branch": "590", "nvidia_gpu_cuda_toolkit_version": "13.1"},
        {"nvidia_gpu_driver_branch": "580", "nvidia_gpu_cuda_toolkit_version": "12.4"},
    ],
)
def test_supported_toolkit_and_branch_pass_the_check(tmp_path: Path, extra: dict):
    rc, result, stderr = run_playbook(
        tmp_path, ROLE_PLAY, "-e", json.dumps({"specfleet_accelerator": "cpu", **extra})
    )
    assert rc == 0, stderr
    skipped = "Say why the role is skipped (profile without NVIDIA GPUs)"
    assert task_results(result)[-1][0] == skipped


def test_cpu_profile_skips_with_message(tmp_path: Path):
    rc, result, _ = run_playbook(tmp_path, ROLE_PLAY, "-e", "specfleet_accelerator=cpu")
    assert rc == 0
    tasks = task_results(result)
    names = [name for name, _ in tasks]
    # meta tasks are not reported; nothing after the message ran
    assert names[-1] == "Say why the role is skipped (profile without NVIDIA GPUs)"
    assert "accelerator is 'cpu'" in tasks[-1][1]["msg"]
    assert not any("Gather the facts" in name for name in names)
    assert_nothing_changed(result)


def test_container_override_skips_with_message(tmp_path: Path):
    # nvidia_gpu_container_detected is the role's documented override of the detection
    rc, result, _ = run_playbook(
        tmp_path, ROLE_PLAY, "-e", json.dumps({"nvidia_gpu_container_detected": True})
    )
    assert rc == 0
    tasks = task_results(result)
    names = [name for name, _ in tasks]
    assert names[-1] == "Say why the role is skipped (container)"
    assert "it is a container" in tasks[-1][1]["msg"]
    assert not any(name.startswith("Check that the distribution") for name in names)
    assert_nothing_changed(result)


def host_is_container() -> bool:
    """What setup says about this machine (read-only)."""
    with tempfile.TemporaryDirectory() as folder:
        proc = Ansible(Path(folder)).adhoc(
            "ansible.builtin.setup", "gather_subset=!all,virtual", "-o"
        )
    facts = json.loads(proc.stdout.split("=>", 1)[1])["ansible_facts"]
    return facts.get("ansible_virtualization_role") == "guest" and facts.get(
        "ansible_virtualization_type"
    ) in {"docker", "container", "containerd", "podman", "lxc", "systemd-nspawn"}


def test_real_container_detection_skips(tmp_path: Path):
    if not host_is_container():
        pytest.skip("this machine is not a container: nothing to detect")
    rc, result, _ = run_playbook(tmp_path, ROLE_PLAY)
    assert rc == 0
    names = [name for name, _ in task_results(result)]
    assert names[-1] == "Say why the role is skipped (container)"
    assert_nothing_changed(result)


def test_host_without_gpu_fails_before_any_change(tmp_path: Path):
    pci = Path("/sys/bus/pci/devices")
    if any((d / "vendor").read_text().strip() == "0x10de" for d in pci.iterdir()):
        pytest.skip("this machine has NVIDIA devices")
    # not a container (override), no GPU on the bus: the role must stop at its checks;
    # --check as a second guard.
    rc, result, _ = run_playbook(
        tmp_path,
        ROLE_PLAY,
        "--check",
        "-e",
        json.dumps({"nvidia_gpu_container_detected": False}),
    )
    assert rc != 0
    tasks = task_results(result)
    name, failed = tasks[-1]
    assert failed["failed"] is True
    assert name in (
        "Check that the host has an NVIDIA GPU",
        "Check that the distribution is supported",
    )
    if name == "Check that the host has an NVIDIA GPU":
        assert "No NVIDIA GPU on the PCI bus" in failed["msg"]
    assert not any(n.startswith(("Install", "Download", "Add NVIDIA")) for n, _ in tasks)
    assert_nothing_changed(result)


# --- first-host checks: Secure Boot, open kernel modules for Blackwell ----------------

SECURE_BOOT_PLAY = """\
- name: The Secure Boot check of nvidia_gpu
  hosts: all
  gather_facts: false
  tasks:
    - name: Inject the platform facts (test-only module)
      inject_facts:
        facts: "{{ platform_facts }}"

    - name: Load the role's defaults and vars (its variable checks only)
      ansible.builtin.import_role:
        name: nvidia_gpu
        tasks_from: variables.yml

    - name: The check
      ansible.builtin.import_role:
        name: nvidia_gpu
        tasks_from: secure_boot.yml
"""

FAKE_MOKUTIL = """\
#!/bin/sh
# A FAKE mokutil: Secure Boot cannot be on in this test machine. It answers as mokutil
# does, from files beside it: sb-state (what --sb-state prints), enrolled (enrolled keys).
here=$(dirname "$0")
echo "$*" >> "$here/calls.log"
case "$1" in
  --sb-state) cat "$here/sb-state" ;;
  --test-key)
    if grep -qxF "$2" "$here/enrolled" 2>/dev/null; then echo "$2 is already enrolled"
    else echo "$2 is not enrolled"; fi ;;
  *) echo "fake mokutil: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


def run_secure_boot_check(
    tmp_path: Path,
    *,
    efi: bool,
    sb_state: str = "SecureBoot disabled",
    cert: bool = True,
    enrolled: bool = False,
    extra: dict[str, object] | None = None,
) -> tuple[int, list[tuple[str, dict]], Path]:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "mokutil").write_text(FAKE_MOKUTIL)
    (bin_dir / "mokutil").chmod(0o755)
    (bin_dir / "sb-state").write_text(sb_state + "\n")
    efi_dir = tmp_path / "efi"
    if efi:
        efi_dir.mkdir()
    key = tmp_path / "MOK.der"
    if cert:
        key.write_bytes(b"0\x82 a DER certificate")
    if enrolled:
        (bin_dir / "enrolled").write_text(f"{key}\n")
    library = tmp_path / "library"
    library.mkdir()
    (library / "inject_facts.py").write_text(INJECT_FACTS_MODULE)
    variables = {
        "platform_facts": PLATFORMS["ubuntu2404"],
        "__nvidia_gpu_efi_dir": str(efi_dir),
        "nvidia_gpu_secure_boot_mok_cert": str(key),
        **(extra or {}),
    }
    rc, result, _ = run_playbook(
        tmp_path,
        SECURE_BOOT_PLAY,
        "-e",
        json.dumps(variables),
        env_extra={
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "ANSIBLE_LIBRARY": str(library),
        },
    )
    assert_nothing_changed(result)
    return rc, task_results(result), bin_dir / "calls.log"


def test_secure_boot_without_efi_passes(tmp_path: Path):
    rc, _tasks, calls = run_secure_boot_check(tmp_path, efi=False)
    assert rc == 0
    assert not calls.exists()  # a BIOS boot has no Secure Boot to ask about


def test_secure_boot_off_passes_with_fake_mokutil(tmp_path: Path):
    rc, _tasks, calls = run_secure_boot_check(tmp_path, efi=True, sb_state="SecureBoot disabled")
    assert rc == 0
    assert calls.read_text() == "--sb-state\n"


@pytest.mark.parametrize("cert", [False, True])
def test_secure_boot_on_without_enrolled_key_fails_with_fake_mokutil(tmp_path: Path, cert: bool):
    rc, tasks, _ = run_secure_boot_check(
        tmp_path, efi=True, sb_state="SecureBoot enabled", cert=cert, enrolled=False
    )
    assert rc != 0
    name, failed = tasks[-1]
    assert name == "Fail when Secure Boot is on and the DKMS signing key is not enrolled"
    assert "Secure Boot is on" in failed["msg"]
    # the message says how to enroll a key, and how to take the decision oneself
    assert "mokutil --import" in failed["msg"]
    assert "nvidia_gpu_secure_boot_check" in failed["msg"]


def test_secure_boot_on_with_enrolled_key_passes_with_fake_mokutil(tmp_path: Path):
    rc, _tasks, calls = run_secure_boot_check(
        tmp_path, efi=True, sb_state="SecureBoot enabled", enrolled=True
    )
    assert rc == 0
    assert calls.read_text().splitlines() == ["--sb-state", f"--test-key {tmp_path / 'MOK.der'}"]


def test_secure_boot_check_can_be_turned_off(tmp_path: Path):
    rc, _tasks, calls = run_secure_boot_check(
        tmp_path,
        efi=True,
        sb_state="SecureBoot enabled",
        cert=False,
        extra={"nvidia_gpu_secure_boot_check": False},
    )
    assert rc == 0
    assert not calls.exists()


def blackwell_sysfs(directory: Path, device_id: str) -> Path:
    root = directory / "pci"
    for i in range(2):
        device = root / f"0000:{0x18 + i:02x}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
        (device / "device").write_text(device_id + "\n")
    return root


def test_blackwell_requires_open_kernel_modules_before_any_change(tmp_path: Path):
    # Two B200 (PCI device 0x2901) before any driver: the proprietary modules cannot
    # drive them, so the role stops at its checks. --check as a second guard.
    sysfs = blackwell_sysfs(tmp_path, "0x2901")
    rc, result, _ = run_playbook(
        tmp_path,
        ROLE_PLAY,
        "--check",
        "-e",
        json.dumps(
            {
                "nvidia_gpu_container_detected": False,
                "nvidia_gpu_kernel_modules": "proprietary",
                "__nvidia_gpu_sysfs_pci_path": str(sysfs),
                "__nvidia_gpu_efi_dir": str(tmp_path / "no-efi"),
            }
        ),
    )
    assert rc != 0
    tasks = task_results(result)
    name, failed = tasks[-1]
    if name == "Check that the distribution is supported":
        pytest.skip("this machine is not a supported distribution")
    assert name == "Check that the kernel modules can drive these GPUs"
    assert "open kernel modules" in failed["msg"]
    assert "0x2901" in failed["msg"]
    assert not any(n.startswith(("Install", "Download", "Add NVIDIA")) for n, _ in tasks)
    assert_nothing_changed(result)


@pytest.mark.parametrize(
    ("host", "required"),
    [
        ("ubuntu2404", False),
        ("ubuntu2404-b200", True),
        ("debian12-rtx-pro-6000", True),
        ("ubuntu2404-h200-loaded", False),
    ],
)
def test_open_modules_required_for_blackwell(rendered: Path, host: str, required: bool):
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["open_modules_required"] is required


@pytest.mark.parametrize(
    ("host", "package"),
    [
        ("ubuntu2204", "linux-headers-generic"),
        ("ubuntu2404", "linux-headers-generic"),
        ("debian12", "linux-headers-amd64"),
        ("ubuntu2404-arm", "linux-headers-nvidia-64k"),
        ("ubuntu2204-hwe", "linux-headers-generic-hwe-22.04"),
        ("debian12-cloud", "linux-headers-cloud-amd64"),
    ],
)
def test_kernel_headers_meta_package_follows_the_running_flavour(
    rendered: Path, host: str, package: str
):
    # DKMS builds the driver for every future kernel only if their headers come too
    values = json.loads((rendered / host / "values.json").read_text())
    assert values["headers_meta_package"] == package


@pytest.mark.parametrize("host", list(VARIANTS))
def test_compiler_and_python_headers_for_triton(rendered: Path, host: str):
    # Triton compiles its launcher with the system compiler on first use
    values = json.loads((rendered / host / "values.json").read_text())
    assert {"build-essential", "python3-dev"} <= set(values["build_packages"])


def test_python_headers_of_the_stack_python_on_ubuntu_2204(rendered: Path):
    # the cuda-ubuntu2204 lock runs on python3.11 (jammy's python3 is 3.10, too old for vLLM)
    values = json.loads((rendered / "ubuntu2204" / "values.json").read_text())
    assert "python3.11-dev" in values["build_packages"]


# --- reboot handlers ------------------------------------------------------------------

HANDLER_PLAY = """\
- name: Notify the driver-changed handlers of nvidia_gpu
  hosts: all
  gather_facts: false
  tasks:
    - name: Load the role's defaults, vars and handlers (its variable checks only)
      ansible.builtin.import_role:
        name: nvidia_gpu
        tasks_from: variables.yml

    - name: Pretend the driver changed
      ansible.builtin.debug:
        msg: driver changed
      changed_when: true
      notify: nvidia_gpu driver changed

    - name: Flush
      ansible.builtin.meta: flush_handlers

    - name: Report
      ansible.builtin.debug:
        msg: "pending={{ __nvidia_gpu_reboot_pending | default(false) }}"
"""


@pytest.mark.parametrize(
    ("connection", "address", "allowed", "rebooted", "pending"),
    [
        ("local", "192.0.2.1", True, False, True),  # never reboot the controller
        ("local", "192.0.2.1", False, False, True),
        ("ssh", "127.0.0.1", True, False, True),  # the controller over ssh: neither
        ("ssh", "192.0.2.1", False, False, True),  # forbidden by the variable
        ("ssh", "192.0.2.1", True, True, False),  # check mode: reported, no reboot
    ],
)
def test_reboot_handlers_in_check_mode(
    tmp_path: Path, connection: str, address: str, allowed: bool, rebooted: bool, pending: bool
):
    inventory = tmp_path / "inventory.yml"
    host = {
        "ansible_connection": connection,
        "ansible_host": address,  # 192.0.2.1 is TEST-NET-1: never reached (check mode)
        "nvidia_gpu_reboot_allowed": allowed,
    }
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpuhost": host}}}))
    rc, result, stderr = run_playbook(tmp_path, HANDLER_PLAY, "--check", inventory=str(inventory))
    assert rc == 0, stderr
    tasks = dict(task_results(result, "gpuhost"))
    reboot = tasks["Reboot after the driver changed"]
    assert bool(reboot.get("rebooted")) is rebooted
    assert reboot.get("skipped", False) is not rebooted
    assert tasks["Report"]["msg"] == f"pending={pending}"
