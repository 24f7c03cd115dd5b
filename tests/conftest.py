"""What every test shares: the repository root, and one way to run Ansible.

``ansible`` (a fixture) runs playbooks and ad-hoc modules the way an operator does, with the
project's ansible.cfg, against localhost over the local connection, with the controller's own
interpreter as the target's (a broken system Python or pyenv shim on the test machine cannot
change the result), each test in its own temporary Ansible folders.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from specfleet.controller.paths import ensure_collection_link, repo_root

ROOT = repo_root()
# The roles name the project's plugins specfleet.fleet.*: ansible.cfg finds the checkout so.
ensure_collection_link(ROOT)


def load_plugin(relative: str, name: str) -> ModuleType:
    """A plugin file of the project (``plugins/filter/lab.py``) as a module of its own, for
    tests that call its functions directly."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BIN = Path(sys.executable).parent


class Ansible:
    """ansible-playbook and ansible, run in a test's temporary folder."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LOCAL_TEMP": str(self.tmp_path / "ansible-local"),
            "ANSIBLE_HOME": str(self.tmp_path / "ansible-home"),
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            "ANSIBLE_NOCOLOR": "1",
            **extra,
        }

    def playbook(
        self,
        plays: Sequence[Mapping[str, Any]] | str | Path,
        extra_vars: Mapping[str, Any] | None = None,
        *args: str,
        inventory: str = "localhost,",
        json_output: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """Run plays (a list of dicts, YAML text, or a playbook path) with extra variables.

        With ``json_output`` the ansible.builtin.json callback writes the results to stdout
        (read them with :func:`json_result`).
        """
        if isinstance(plays, Path):
            book = plays
        else:
            book = self.tmp_path / "play.yml"
            text = plays if isinstance(plays, str) else yaml.safe_dump(list(plays), sort_keys=False)
            book.write_text(text)
        extra_file = self.tmp_path / "extra-vars.json"
        extra_file.write_text(json.dumps(dict(extra_vars or {})))
        argv = [str(BIN / "ansible-playbook"), "-i", inventory]
        if inventory == "localhost,":
            argv += ["-c", "local"]
        argv += ["-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{extra_file}"]
        settings = dict(env or {})
        if json_output:
            settings["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
        return subprocess.run(
            [*argv, *args, str(book)],
            cwd=ROOT,
            env=self.env(**settings),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def adhoc(
        self,
        module: str,
        args: str,
        *options: str,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`ansible localhost -c local -m MODULE -a ARGS`."""
        return subprocess.run(
            [
                str(BIN / "ansible"),
                "localhost",
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
                "-m",
                module,
                "-a",
                args,
                *options,
            ],
            cwd=ROOT,
            env=self.env(**dict(env or {})),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def json_result(process: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The json callback's document from a playbook run's stdout."""
    start = process.stdout.find("{")
    assert start >= 0, process.stdout + process.stderr
    # raw_decode: ansible.cfg's profile_tasks callback may print its recap after it.
    result: dict[str, Any] = json.JSONDecoder().raw_decode(process.stdout[start:])[0]
    return result


def recap(process: subprocess.CompletedProcess[str], host: str = "localhost") -> dict[str, int]:
    """The PLAY RECAP counters of a host (default callback)."""
    line = next(line for line in process.stdout.splitlines() if line.startswith(host))
    return {
        key: int(value)
        for key, value in (item.split("=") for item in line.split(":", 1)[1].split())
    }


def role_vars_files(role: str, *, profile: bool = True) -> list[str]:
    """What a role's tasks and templates see, for a test play that uses them outside the
    role: the project's defaults, the role's defaults and vars, and (with ``profile``) its
    profile's vars, chosen by specfleet_accelerator as the role chooses them."""
    base = ROOT / "roles" / role
    files = [
        str(ROOT / "roles" / "specfleet" / "defaults" / "main.yml"),
        str(base / "defaults" / "main.yml"),
        str(base / "vars" / "main.yml"),
    ]
    return files + ([str(base / "vars") + "/{{ specfleet_accelerator }}.yml"] if profile else [])


@pytest.fixture
def ansible(tmp_path: Path) -> Ansible:
    return Ansible(tmp_path)


def systemd_verify(folder: Path, name: str, unit: str, needs: Sequence[str] = ()) -> float:
    """Check a rendered unit with systemd itself; return its exposure score.

    `systemd-analyze verify` must find nothing wrong but what this machine lacks (the
    venv, the helpers); the units in `needs` (what it Requires=) are stood in for by empty
    oneshot units. Returns `systemd-analyze security`'s overall exposure (0 best, 10 worst).
    """
    path = folder / name
    path.write_text(unit)
    for needed in needs:
        (folder / needed).write_text("[Service]\nType=oneshot\nExecStart=/bin/true\n")
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{folder}:"},
    )
    problems = [
        line
        for line in (verify.stdout + verify.stderr).splitlines()
        if line.strip()
        and "is not executable" not in line
        and "No such file or directory" not in line
        and "Command " not in line
    ]
    assert not problems, problems
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    [overall] = [line for line in security.stdout.splitlines() if "Overall exposure" in line]
    print(f"{name}: {overall.strip()}")
    return float(overall.split("service:")[1].split()[0])


@pytest.fixture(scope="session")
def cli_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The tests' lab (cli-lab-01 and cli-lab-02 behind their balancer, cli-lab-lb, with
    the lab's Prometheus, cli-lab-mon, on a network of their own), brought up once with
    `specfleet lab up --json` as `bin/lab` runs it, shared by every module that needs a
    running lab (the fleet's upgrades last), and removed at the end (`lab down` must leave no
    container). Two servers: a rolling upgrade needs a canary and another host to serve."""
    from labs import containers, lab_inventory_with, remove_stale_containers, specfleet_json

    inventory = lab_inventory_with(
        tmp_path_factory.mktemp("cli-lab"), "cli-lab-", "172.30.242", servers=2
    )
    data = yaml.safe_load(inventory.read_text())
    data["all"]["children"]["lab"]["vars"] |= {
        # Two servers, the load and the controller share two cores, and vLLM's CPU worker
        # spins while it serves (its message queue busy-polls for a second after each
        # request): a server starting beside one that serves can take minutes.
        "vllm_server_health_timeout": 1500,
    }
    inventory.write_text(yaml.safe_dump(data))
    stale = remove_stale_containers("cli-lab-")
    if stale:
        print(f"removed containers an earlier run left: {', '.join(stale)}")
    try:
        rc, up = specfleet_json("lab", "up", "-i", str(inventory))
        assert rc == 0, up
        yield inventory, up
    finally:
        rc, down = specfleet_json("lab", "down", "-i", str(inventory))
        assert rc == 0, down
        assert not containers("cli-lab-")


@pytest.fixture(scope="session")
def lab_under_test(request: pytest.FixtureRequest) -> Any:
    """The lab the front door's tests attack: SPECFLEET_TEST_LAB's inventory when it names a
    running lab (left running), else the tests' own (cli_lab)."""
    from labs import LabUnderTest

    named = os.environ.get("SPECFLEET_TEST_LAB")
    if named:
        return LabUnderTest(Path(named).resolve())
    inventory, _ = request.getfixturevalue("cli_lab")
    return LabUnderTest(inventory)


# --------------------------------------------------------------- the lab's order
# Every module that uses the shared lab (conftest.cli_lab) runs before the Molecule
# scenarios, and the modules that switch the lab's stack run last among them, so every other
# lab test meets the lab as `lab up` left it.
LAB_FIXTURE_USE = re.compile(r"\b(?:cli_lab|lab_under_test)\s*[:,)]")


@functools.cache
def stream_of(module: Path) -> str:
    """ "lab", "molecule", or "rest" (anything else) for a test module."""
    if module.name == "test_molecule_scenarios.py":
        return "molecule"
    source = module.read_text() if module.is_file() else ""
    return "lab" if LAB_FIXTURE_USE.search(source) else "rest"


_ORDER = {"lab": 0, "molecule": 1, "rest": 2}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stream",
        choices=sorted(_ORDER),
        help="only this stream's tests: lab (the modules on the shared lab), molecule (the "
        "scenarios) or rest (everything else); bin/test runs molecule and rest side by side, "
        "then lab (write --stream=NAME: a bare `molecule` would be read as the folder)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --stream, only that stream's tests. The lab's modules first (the longest
    stream), then the scenarios, then the rest; in the lab, the modules that switch its stack
    (`changes_lab_stack`) last, so every other lab test meets the lab as `lab up` left it
    (those modules in the order their marks give)."""
    chosen = config.getoption("--stream")
    if chosen is not None:
        deselected = [item for item in items if stream_of(item.path) != chosen]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if stream_of(item.path) == chosen]
    items.sort(key=lambda item: (_ORDER[stream_of(item.path)], _stack_rank(item)))


def _stack_rank(item: pytest.Item) -> int:
    """0 for a test that leaves the lab's stack alone, else its `changes_lab_stack(N)`."""
    mark = item.get_closest_marker("changes_lab_stack")
    return 0 if mark is None else int(mark.args[0])
