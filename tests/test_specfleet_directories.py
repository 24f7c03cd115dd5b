"""plugins/modules/specfleet_directories.py, run by Ansible on this machine: the layout in one call,
and a planted link (or a file) where a folder belongs fails the run before anything changes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import Ansible

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sets root ownership")


def run(ansible: Ansible, paths: list[Path], *options: str, mode: str = "0755") -> dict:
    args = json.dumps({"paths": [str(p) for p in paths], "mode": mode})
    process = ansible.adhoc(
        "specfleet.fleet.specfleet_directories",
        args,
        *options,
        env={
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        },
    )
    document, _ = json.JSONDecoder().raw_decode(process.stdout[process.stdout.index("{") :])
    result = document["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return {"rc": process.returncode, **result}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_makes_the_missing_folders_then_changes_nothing(ansible: Ansible, tmp_path: Path):
    layout = [tmp_path / "opt", tmp_path / "opt" / "venvs", tmp_path / "var" / "lib" / "sf"]
    first = run(ansible, layout)
    assert first["rc"] == 0 and first["changed"] and first["created"] == [str(p) for p in layout]
    assert all(p.is_dir() and mode_of(p) == 0o755 and p.stat().st_uid == 0 for p in layout)
    again = run(ansible, layout)
    assert again["rc"] == 0 and not again["changed"]
    assert again["created"] == [] and again["fixed"] == []


def test_sets_the_mode_of_an_existing_folder(ansible: Ansible, tmp_path: Path):
    loose = tmp_path / "etc"
    loose.mkdir()
    loose.chmod(0o777)
    result = run(ansible, [loose])
    assert result["changed"] and result["fixed"] == [str(loose)]
    assert mode_of(loose) == 0o755


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_planted_link_or_file_fails_before_anything_changes(
    ansible: Ansible, tmp_path: Path, planted: str
):
    """The attack: a folder of the layout replaced by a link to a folder root must not touch."""
    victim = tmp_path / "etc-systemd-system"
    victim.mkdir()
    victim.chmod(0o700)
    missing = tmp_path / "opt"
    drafters = tmp_path / "drafters"
    if planted == "link":
        drafters.symlink_to(victim)
    else:
        drafters.write_text("not a folder")
    result = run(ansible, [missing, drafters])
    assert result["rc"] != 0 and not result.get("changed")
    expected = "is a symbolic link, not a folder" if planted == "link" else "is not a folder"
    assert f"{drafters} {expected}" in result["msg"] and "Nothing was changed." in result["msg"]
    assert not missing.exists(), "nothing is made when one folder is wrong"
    assert mode_of(victim) == 0o700 and victim.stat().st_uid == 0
    assert drafters.is_symlink() == (planted == "link")


def test_check_mode_reports_and_makes_nothing(ansible: Ansible, tmp_path: Path):
    missing = tmp_path / "opt"
    result = run(ansible, [missing], "--check")
    assert result["changed"] and result["created"] == [str(missing)]
    assert not missing.exists()


def test_a_relative_path_is_refused(ansible: Ansible, tmp_path: Path):
    result = run(ansible, [Path("relative/folder")])
    assert result["rc"] != 0 and "relative/folder is not an absolute path" in result["msg"]
