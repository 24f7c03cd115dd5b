"""library/specfleet_checksums.py, run by Ansible here, against what ansible.builtin.stat and
find report for the same files: the served record it feeds must read the same either way
(else every server would restart once after an upgrade of specfleet)."""

from __future__ import annotations

from pathlib import Path

from conftest import Ansible, json_result


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


def test_the_same_checksums_as_stat_and_find(ansible: Ansible, tmp_path: Path) -> None:
    files, current, record = _tree(tmp_path)
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "ours",
                "specfleet_checksums": {
                    "files": files,
                    "folders": [str(current), str(tmp_path / "no-drafter")],
                    "record": str(record),
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
                        "ours.files | map(attribute='checksum') | map('default', 'absent', true)"
                        " | list == stats.results | map(attribute='stat')"
                        " | map(attribute='checksum', default='absent') | list",
                        "ours.files | map(attribute='path') | list == files",
                        "ours.folder_files | map(attribute='path') | list"
                        " == found.files | map(attribute='path') | sort | list",
                        "ours.folder_files | map(attribute='checksum') | list == found.files"
                        " | sort(attribute='path') | map(attribute='checksum') | list",
                        "ours.folder_files | length == 3",
                        "ours.record == '# the record\\n'",
                        "ours is not changed",
                    ]
                },
            },
        ],
    }
    run = ansible.playbook([play], {"files": files})
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_absent_record_reads_as_none(ansible: Ansible, tmp_path: Path) -> None:
    run = ansible.playbook(
        [
            {
                "hosts": "localhost",
                "gather_facts": False,
                "tasks": [{"specfleet_checksums": {"record": str(tmp_path / "none")}}],
            }
        ],
        json_output=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json_result(run)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["record"] is None and result["files"] == [] and result["folder_files"] == []
