"""plugins/modules/specfleet_inspect.py, run by Ansible on this machine: one call answers what a
role's re-run asks (paths, small files, accounts, packages, units, globs), and the answers
are the ones the builtin modules it replaces give."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Ansible, json_result, load_plugin


def inspect(ansible: Ansible, **options) -> dict:
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [{"name": "inspect", "specfleet.fleet.specfleet_inspect": options}],
    }
    process = ansible.playbook([play], json_output=True)
    document = json_result(process)
    return document["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_paths_links_and_small_files(ansible: Ansible, tmp_path: Path) -> None:
    venv = tmp_path / "venvs" / "ab12"
    venv.mkdir(parents=True)
    (venv / "specfleet-stack.json").write_text('{"vllm": "0.32.0"}\n')
    current = tmp_path / "current"
    current.symlink_to(venv)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    result = inspect(
        ansible,
        paths=[str(current), str(dangling), str(tmp_path / "missing"), str(venv)],
        read=[str(venv / "specfleet-stack.json"), str(tmp_path / "missing.json")],
    )
    assert not result.get("failed") and result["changed"] is False
    paths = result["paths"]
    # When what it names last changed (a link's target): a process started before that
    # runs what it was given before.
    assert paths[str(current)]["mtime"] == os.stat(venv).st_mtime
    assert paths[str(current)] | {"mode": None, "mtime": None} == {
        "exists": True,
        "isfile": False,
        "isdir": True,
        "islink": True,
        "target": str(venv),
        "mode": None,  # a link's own mode is the system's (0777 on Linux)
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mtime": None,
    }
    assert paths[str(dangling)]["islink"] and not paths[str(dangling)]["exists"]
    assert paths[str(tmp_path / "missing")] == {
        "exists": False,
        "isfile": False,
        "isdir": False,
        "islink": False,
        "target": None,
        "mode": None,
        "uid": None,
        "gid": None,
        "mtime": None,
    }
    assert paths[str(venv)]["isdir"] and not paths[str(venv)]["islink"]
    venv.chmod(0o750)
    assert inspect(ansible, paths=[str(venv)])["paths"][str(venv)]["mode"] == "0750"
    assert result["read"] == {
        str(venv / "specfleet-stack.json"): '{"vllm": "0.32.0"}\n',
        str(tmp_path / "missing.json"): None,
    }


def test_a_large_file_is_refused_not_read(ansible: Ansible, tmp_path: Path) -> None:
    big = tmp_path / "weights.bin"
    big.write_bytes(b"x" * ((1 << 20) + 1))
    result = inspect(ansible, read=[str(big)])
    assert result["failed"] and "larger than" in result["msg"]


def test_a_relative_path_is_refused(ansible: Ansible) -> None:
    result = inspect(ansible, paths=["etc/passwd"])
    assert result["failed"] and "absolute" in result["msg"]


def test_accounts_as_the_databases_have_them(ansible: Ansible) -> None:
    root = pwd.getpwnam("root")
    result = inspect(
        ansible, users=["root", "no-such-user-sf"], groups=["root", "no-such-group-sf"]
    )
    assert result["users"]["root"] == {
        "uid": 0,
        "gid": root.pw_gid,
        "group": grp.getgrgid(root.pw_gid).gr_name,
        "home": root.pw_dir,
        "shell": root.pw_shell,
        "comment": root.pw_gecos,
    }
    assert result["users"]["no-such-user-sf"] is None
    assert result["groups"] == {"root": {"gid": 0}, "no-such-group-sf": None}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg (Debian, Ubuntu)")
def test_packages_installed_or_not(ansible: Ansible) -> None:
    result = inspect(ansible, packages=["dpkg", "no-such-package-sf"])
    assert result["packages"] == {"dpkg": True, "no-such-package-sf": False}


def test_units_read_as_systemd_has_them_or_empty_without_it(ansible: Ansible) -> None:
    # Without systemd as PID 1 (this test machine, a host being built) every property reads
    # empty; the Molecule scenarios read real units (vllm_server, loadbalancer).
    result = inspect(ansible, units=["no-such-unit-sf.service"])
    state = result["units"]["no-such-unit-sf.service"]
    assert set(state) == {"ActiveState", "SubState", "UnitFileState", "NeedDaemonReload", "MainPID"}
    assert state["ActiveState"] in ("", "inactive")


def test_globs_newest_first(ansible: Ansible, tmp_path: Path) -> None:
    for index, name in enumerate(("old", "new")):
        manifest = tmp_path / name / "specfleet-stack.json"
        manifest.parent.mkdir()
        manifest.write_text("{}")
        os.utime(manifest, (1_000_000 + index, 1_000_000 + index))
    pattern = f"{tmp_path}/*/specfleet-stack.json"
    result = inspect(ansible, globs=[pattern])
    assert [match["path"] for match in result["globs"][pattern]] == [
        str(tmp_path / "new" / "specfleet-stack.json"),
        str(tmp_path / "old" / "specfleet-stack.json"),
    ]


# Checksums: the served record they feed must read the same as when ansible.builtin.stat
# and find made it (else every server would restart once after an upgrade of specfleet).


def _tree(tmp_path: Path) -> tuple[list[str], Path, Path]:
    unit = tmp_path / "specfleet-vllm.service"
    unit.write_text("[Service]\n")
    env = tmp_path / "vllm.env"
    env.write_text("A=1\n")
    published = tmp_path / "drafters" / "ab12"
    (published / "sub").mkdir(parents=True)
    (published / "config.json").write_text("{}")
    (published / ".hidden").write_text("h")
    (published / "sub" / "model.safetensors").write_bytes(b"\0" * 4096)
    current = tmp_path / "drafters" / "current"
    current.symlink_to(published)
    record = tmp_path / "served.sha1"
    record.write_text("# the record\n")
    return [str(unit), str(env), str(tmp_path / "missing.key")], current, record


def test_checksums_are_the_ones_stat_and_find_report(ansible: Ansible, tmp_path: Path) -> None:
    files, current, record = _tree(tmp_path)
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "ours",
                "specfleet.fleet.specfleet_inspect": {
                    "checksums": files,
                    "checksum_folders": [str(current), str(tmp_path / "no-drafter")],
                    "read": [str(record)],
                },
                "register": "ours",
            },
            {
                "name": "stat",
                "ansible.builtin.stat": {"path": "{{ item }}", "get_checksum": True},
                "loop": files,
                "register": "stats",
            },
            {
                "name": "find",
                "ansible.builtin.find": {
                    "paths": str(current),
                    "recurse": True,
                    "follow": True,
                    "hidden": True,
                    "file_type": "file",
                    "get_checksum": True,
                },
                "register": "found",
            },
            {
                "name": "compare",
                "ansible.builtin.assert": {
                    "that": [
                        "files | map('extract', ours.checksums) | map('default', 'absent', true)"
                        " | list == stats.results | map(attribute='stat')"
                        " | map(attribute='checksum', default='absent') | list",
                        "ours.checksums.keys() | list == files",
                        "ours.folder_checksums | map(attribute='path') | list"
                        " == found.files | map(attribute='path') | sort | list",
                        "ours.folder_checksums | map(attribute='checksum') | list == found.files"
                        " | sort(attribute='path') | map(attribute='checksum') | list",
                        "ours.folder_checksums | length == 3",
                        "ours.read[record] == '# the record\\n'",
                        "ours is not changed",
                    ]
                },
            },
        ],
    }
    run = ansible.playbook([play], {"files": files, "record": str(record)})
    assert run.returncode == 0, run.stdout + run.stderr


def test_which_venvs_a_process_tree_runs_from(tmp_path: Path) -> None:
    """What a server runs is its processes: a child that maps a file of another venv shows."""

    inspect_module = load_plugin(
        "plugins/modules/specfleet_inspect.py", "specfleet_inspect_under_test"
    )
    other = tmp_path / "venvs" / "bbbb" / "lib.so"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"\0" * 4096)
    child = (
        "import mmap, sys, time\n"
        "handle = open(sys.argv[1], 'rb')\n"
        "mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('mapped', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run([sys.executable, '-c', *sys.argv[1:]])",
            child,
            str(other),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "mapped"
        pids = inspect_module._descendants(parent.pid)
        assert len(pids) == 2 and pids[0] == parent.pid
        files = set().union(*(inspect_module._files_of(pid) for pid in pids))
        assert str(other) in files
        # Gone from disk (a venv built anew under the process): the kernel says so.
        other.unlink()
        files = set().union(*(inspect_module._files_of(pid) for pid in pids))
        assert f"{other} (deleted)" in files
        started = inspect_module._boot_time() + int(
            inspect_module._stat_fields(parent.pid)[19]
        ) / os.sysconf("SC_CLK_TCK")
        assert abs(started - time.time()) < 60
    finally:
        for pid in inspect_module._descendants(parent.pid)[::-1]:
            os.kill(pid, 9)
        parent.wait()
