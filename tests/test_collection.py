"""galaxy.yml: this tree is also the Ansible collection specfleet.fleet.

The collection is built with ``ansible-galaxy collection build``, installed into a fresh
folder, and used from a playbook that lives outside the checkout, with an ansible.cfg of its
own that knows nothing of the repository's plugin folders: every role, module, filter and
lookup is reached by its fully qualified name, so a path of this repository that the content
still depended on would fail here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

BIN = Path(sys.executable).parent
COLLECTION = "specfleet.fleet"


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("collection-build")
    proc = _run([str(BIN / "ansible-galaxy"), "collection", "build", str(ROOT), "--output-path",
                 str(out)])  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = out.glob("specfleet-fleet-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def outside(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the checkout: the collection installed under collections/, and an
    ansible.cfg that names only that (no roles_path, library or plugin folders)."""
    home = tmp_path_factory.mktemp("outside")
    assert ROOT not in home.parents
    collections = home / "collections"
    # --force: a copy installed elsewhere (~/.ansible) must not make this one a no-op.
    proc = _run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
                 "--force", "-p", str(collections), str(built)], cwd=home)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (home / "ansible.cfg").write_text(
        "[defaults]\n"
        f"collections_path = {collections}\n"
        "interpreter_python = auto_silent\n"
        "retry_files_enabled = False\n"
    )
    return home


def outside_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {
        **env,
        "ANSIBLE_CONFIG": str(home / "ansible.cfg"),
        "ANSIBLE_HOME": str(home / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(home / "ansible-local"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        # The SPECFLEET_ROOT of a test run would point the Python package at the checkout.
        "SPECFLEET_ROOT": "",
    }


def play(home: Path, playbook: list[dict[str, object]], inventory: str, *extra: str) -> str:
    path = home / f"play-{uuid.uuid4().hex[:8]}.yml"
    path.write_text(yaml.safe_dump(playbook, sort_keys=False))
    proc = _run([str(BIN / "ansible-playbook"), "-i", inventory, str(path), *extra],
                cwd=home, env=outside_env(home))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout


def recap_changed(output: str) -> int:
    lines = [line for line in output.splitlines() if " changed=" in line and " : ok=" in line]
    assert lines, output[-2000:]
    return sum(int(line.split(" changed=")[1].split()[0]) for line in lines)


def test_the_collection_holds_the_content_and_none_of_the_checkout(built: Path) -> None:
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
        manifest_file = tar.extractfile("MANIFEST.json")
        assert manifest_file is not None
        manifest = json.load(manifest_file)["collection_info"]
    for wanted in (
        "MANIFEST.json",
        "roles/vllm_server/tasks/main.yml",
        "roles/specfleet/defaults/main.yml",
        "plugins/modules/vllm_eagle3_whitelist.py",
        "plugins/filter/ml_stack.py",
        "plugins/lookup/specfleet_project.py",
        "playbooks/site.yml",
        "src/specfleet/host/gate.py",
        "locks/cpu.toml",
    ):
        assert wanted in names, wanted
    tops = {name.split("/")[0] for name in names}
    assert not tops & {"tests", "molecule", ".venv", ".git", ".cache", "benchmarks", "bin"}
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert not [name for name in names if ".lab-ssh" in name]
    assert (manifest["namespace"], manifest["name"]) == ("specfleet", "fleet")


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("module", "vllm_eagle3_whitelist"),
        ("module", "nvidia_gpu_facts"),
        ("module", "specfleet_inspect"),
        ("lookup", "specfleet_project"),
    ],
)
def test_ansible_doc_finds_the_plugins_by_fqcn(outside: Path, kind: str, name: str) -> None:
    proc = _run([str(BIN / "ansible-doc"), "-t", kind, "-j", f"{COLLECTION}.{name}"],
                cwd=outside, env=outside_env(outside))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"{COLLECTION}.{name}" in json.loads(proc.stdout)


def test_filters_and_lookups_by_fqcn_answer_from_the_collection(outside: Path) -> None:
    """The filters call the specfleet Python package; the lookup finds the collection's own
    locks/ and builds the host package from the collection's src/, not the checkout's."""
    installed = outside / "collections" / "ansible_collections" / "specfleet" / "fleet"
    checks = [
        "lookup('specfleet.fleet.specfleet_project', 'locks') == installed ~ '/locks'",
        "lookup('specfleet.fleet.specfleet_project', 'host_package')"
        " is match('.*/specfleet-[0-9a-f]{16}[.]tar$')",
        "({'method': 'eagle3', 'model': '/m', 'num_speculative_tokens': 3}"
        " | specfleet.fleet.speculative_config | from_json).num_speculative_tokens == 3",
        "{'torch': '2.9.0'} | specfleet.fleet.stack_digest | length == 16",
    ]
    playbook = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
                 "vars": {"installed": str(installed)},
                 "tasks": [{"ansible.builtin.assert": {"that": checks}}]}]  # fmt: skip
    play(outside, playbook, "localhost,", "-e", f"ansible_python_interpreter={sys.executable}")


@pytest.mark.slow
def test_the_whitelist_module_by_fqcn_edits_a_real_release_once(outside: Path) -> None:
    """The module and its module_utils, as the collection ships them, on a real vLLM
    release's files (tests/vllm_releases.py): an edit, then nothing to do."""
    from vllm_releases import EXPECTED_FILE, FakeVllm

    version = next(v for v, relative in EXPECTED_FILE.items() if relative)
    vllm = FakeVllm(outside / f"vllm-{version}", version)
    task = {
        "name": "Allow the target for EAGLE-3",
        f"{COLLECTION}.vllm_eagle3_whitelist": {"python": str(vllm.python),
                                                 "model_types": ["mistral"]},
        "register": "edit",
    }  # fmt: skip
    verified = {"ansible.builtin.assert": {"that": ["edit.verified"]}}
    playbook = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
                 "tasks": [task, verified]}]  # fmt: skip
    interpreter = f"ansible_python_interpreter={sys.executable}"
    first = play(outside, playbook, "localhost,", "-e", interpreter)
    assert recap_changed(first) == 1
    second = play(outside, playbook, "localhost,", "-e", interpreter)
    assert recap_changed(second) == 0
    assert b"mistral" in vllm.source.read_bytes()


@pytest.fixture
def lab_host() -> Iterator[str]:
    """One systemd container from the lab's image, as Molecule starts its hosts."""
    from specfleet.controller.image import ensure_image

    name = f"sf-collection-{uuid.uuid4().hex[:6]}"
    proc = _run(["docker", "run", "-d", "--name", name, "--cap-add", "SYS_ADMIN",
                 "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
                 "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
                 "--stop-signal", "SIGRTMIN+3",
                 ensure_image(), "/lib/systemd/systemd"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    try:
        yield name
    finally:
        _run(["docker", "rm", "-f", name])


@pytest.mark.docker
def test_roles_and_modules_by_fqcn_from_outside_converge_a_lab_host(
    outside: Path, lab_host: str
) -> None:
    """The common role (account, layout, the host package the collection's lookup builds
    from its own src/) and the project's modules, by FQCN, on a real systemd host; the
    second run changes nothing."""
    inventory = outside / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {lab_host: {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "specfleet_accelerator": "cpu"}}}}))  # fmt: skip
    playbook = [
        {
            "name": "Wait for systemd",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{
                "ansible.builtin.command": "systemctl is-system-running",
                "register": "state", "changed_when": False,
                "until": "state.stdout in ['running', 'degraded']",
                "failed_when": "state.stdout not in ['running', 'degraded']",
                "retries": 60, "delay": 1}],
        },
        {
            "name": "Converge with the collection's content",
            "hosts": "all",
            "become": True,
            "gather_facts": False,
            "roles": [{"role": f"{COLLECTION}.common"}],
            "tasks": [
                {f"{COLLECTION}.nvidia_gpu_facts": {"fail_on_missing": False}},
                {"ansible.builtin.assert": {"that": ["not ansible_facts.nvidia_gpu.present"]}},
                {
                    f"{COLLECTION}.specfleet_inspect": {"paths": [
                        "/opt/specfleet/lib/current/specfleet/host/gate.py",
                        "/opt/specfleet/lib/current/specfleet/host/lab"]},
                    "register": "found",
                },
                {"ansible.builtin.assert": {"that": [
                    "found.paths['/opt/specfleet/lib/current/specfleet/host/gate.py'].exists",
                    # A fleet host's package has none of the lab's generators.
                    "not found.paths['/opt/specfleet/lib/current/specfleet/host/lab'].exists",
                ]}},
            ],
        },
    ]  # fmt: skip
    first = play(outside, playbook, str(inventory))
    assert recap_changed(first) > 0
    second = play(outside, playbook, str(inventory))
    assert recap_changed(second) == 0, second[-4000:]
