"""plugins/modules/specfleet_files.py, run by Ansible on this machine: a role's files in one call.

What it replaces must not be seen to change: content rendered with lookup('template') and
lookup('file', rstrip=false) is byte for byte what the template and copy modules wrote, so a
host converged before it changes nothing (else every server would restart once after an
upgrade of specfleet). And a bad file leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from conftest import ROOT, Ansible, json_result, role_vars_files

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sets root ownership")

SERVER = ROOT / "roles" / "vllm_server"


def run(ansible: Ansible, files: list[dict], *args: str, vars_files=(), extra=None) -> dict:
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": list(vars_files),
        "tasks": [{"name": "files", "specfleet.fleet.specfleet_files": {"files": files}}],
    }
    document = json_result(ansible.playbook([play], extra, *args, json_output=True))
    return document["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_same_bytes_as_the_template_and_copy_modules(ansible: Ansible, tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    # What validate.yml's read of a host would give the unit's template (its venv, its
    # host package's folder).
    from test_vllm_server_render import HOST_READ

    extra = {"specfleet_accelerator": "cpu", "__vllm_server_host": HOST_READ}
    sources = {
        "unit": ("template", SERVER / "templates" / "vllm-server.service.j2"),
        "env": ("template", SERVER / "templates" / "vllm-server.env.j2"),
        "shm-clean": ("copy", SERVER / "files" / "vllm-server-shm-clean"),
    }
    modules = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars_files": role_vars_files("vllm_server"),
        "tasks": [
            {
                "name": f"the {module} module",
                f"ansible.builtin.{module}": {
                    "src": str(src),
                    "dest": str(old / name),
                    "mode": "0644",
                },
            }
            for name, (module, src) in sources.items()
        ],
    }
    process = ansible.playbook([modules], extra)
    assert process.returncode == 0, process.stdout + process.stderr
    lookups = {"template": "ansible.builtin.template", "copy": "ansible.builtin.file"}
    files = [
        {
            "path": str(new / name),
            "content": f"{{{{ lookup('{lookups[module]}', '{src}'"
            + (", rstrip=false" if module == "copy" else "")
            + ") }}",
            "mode": "0644",
        }
        for name, (module, src) in sources.items()
    ]
    first = run(ansible, files, vars_files=role_vars_files("vllm_server"), extra=extra)
    assert first["changed"] and not first.get("failed"), first
    for name in sources:
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    again = run(ansible, files, vars_files=role_vars_files("vllm_server"), extra=extra)
    assert again["changed"] is False and again["changed_paths"] == []


def test_writes_owner_and_mode_then_fixes_only_the_mode(ansible: Ansible, tmp_path: Path):
    target = tmp_path / "app.env"
    first = run(ansible, [{"path": str(target), "content": "A=1\n", "mode": "0600"}])
    assert first["changed_paths"] == [str(target)]
    assert target.read_text() == "A=1\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    target.chmod(0o644)
    inode = target.stat().st_ino
    fixed = run(ansible, [{"path": str(target), "content": "A=1\n", "mode": "0600"}])
    assert fixed["changed"] and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.stat().st_ino == inode  # the content was the same: not rewritten


def test_a_failed_validation_changes_no_file(ansible: Ansible, tmp_path: Path):
    good, checked = tmp_path / "good.cfg", tmp_path / "checked.cfg"
    good.write_text("old\n")
    checked.write_text("old\n")
    result = run(
        ansible,
        [
            {"path": str(good), "content": "new\n", "mode": "0644"},
            {"path": str(checked), "content": "bad\n", "mode": "0644", "validate": "grep -q ok %s"},
        ],
    )
    assert result["failed"] and "failed `grep -q ok %s`" in result["msg"]
    assert good.read_text() == "old\n" and checked.read_text() == "old\n"
    staged = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert staged == []


def test_a_planted_link_is_replaced_not_followed(ansible: Ansible, tmp_path: Path):
    """The attack: the destination made a link to a file root must not write through."""
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    planted = tmp_path / "unit.service"
    planted.symlink_to(victim)
    result = run(ansible, [{"path": str(planted), "content": "[Unit]\n", "mode": "0644"}])
    assert result["changed"] and not planted.is_symlink()
    assert planted.read_text() == "[Unit]\n" and victim.read_text() == "root:secret\n"


def test_bad_input_fails_before_any_change(ansible: Ansible, tmp_path: Path):
    kept = tmp_path / "kept"
    kept.write_text("old\n")
    new = {"path": str(tmp_path / "x"), "content": "", "mode": "0644"}
    for bad, message in (
        ({**new, "owner": "no-such-user-sf"}, "no user"),
        ({**new, "path": str(tmp_path / "no" / "x")}, "folder does not exist"),
        ({**new, "mode": "rw"}, "not octal"),
    ):
        result = run(ansible, [{"path": str(kept), "content": "new\n", "mode": "0644"}, bad])
        assert result["failed"] and message in result["msg"], result
        assert kept.read_text() == "old\n" and not (tmp_path / "x").exists()


def test_check_mode_reports_and_writes_nothing(ansible: Ansible, tmp_path: Path):
    target = tmp_path / "new.conf"
    result = run(ansible, [{"path": str(target), "content": "x\n", "mode": "0644"}], "--check")
    assert result["changed"] and result["changed_paths"] == [str(target)]
    assert not target.exists()


def test_the_text_is_in_the_result_only_under_diff(ansible: Ansible, tmp_path: Path):
    target = tmp_path / "app.env"
    target.write_text("HF_HOME=/var/cache/hf\n")
    files = [
        {"path": str(target), "content": "HF_HOME=/var/cache/hf\nHF_TOKEN=x\n", "mode": "0600"}
    ]
    quiet = run(ansible, files, "--check")
    assert "diff" not in quiet and "HF_TOKEN" not in str(quiet)  # not in the invocation either
    shown = run(ansible, files, "--check", "--diff")
    assert "+HF_TOKEN=x\n" in shown["diff"][0]["prepared"]
    assert " HF_HOME=/var/cache/hf\n" in shown["diff"][0]["prepared"]


def test_a_secret_is_written_then_removed_and_never_in_a_diff(ansible: Ansible, tmp_path: Path):
    key, unit = tmp_path / "server.api-key", tmp_path / "server.env"
    secret = {"path": str(key), "content": "sk-lab-123", "mode": "0440", "diff": False}
    env = {"path": str(unit), "content": "A=1\n", "mode": "0600"}
    written = run(ansible, [env, secret], "--diff")
    assert written["changed_paths"] == [str(unit), str(key)]
    assert key.read_text() == "sk-lab-123" and stat.S_IMODE(key.stat().st_mode) == 0o440
    assert "sk-lab-123" not in str(written)  # not in the diff, not in the invocation
    # Only the environment file's diff (its whole content is no_log, so Ansible masks it).
    assert len(written["diff"]) == 1 and f"+++ {unit}\n" in written["diff"][0]["prepared"]
    again = run(ansible, [env, secret])
    assert again["changed"] is False
    absent = {"path": str(key), "state": "absent"}
    removed = run(ansible, [env, absent])
    assert removed["changed_paths"] == [str(key)] and not key.exists() and unit.exists()
    assert run(ansible, [env, absent])["changed"] is False


def test_a_removal_waits_for_every_new_file(ansible: Ansible, tmp_path: Path):
    """A bad new file fails the call before the absent one is removed."""
    old = tmp_path / "old.api-key"
    old.write_text("sk-old")
    bad = {"path": str(tmp_path / "x"), "content": "bad\n", "mode": "0644", "validate": "false %s"}
    result = run(ansible, [{"path": str(old), "state": "absent"}, bad])
    assert result["failed"] and old.read_text() == "sk-old"


def test_content_is_required_unless_absent(ansible: Ansible, tmp_path: Path):
    result = run(ansible, [{"path": str(tmp_path / "x"), "mode": "0644"}])
    assert result["failed"] and "content is required unless state is absent" in result["msg"]


def test_checksums_are_what_stat_reports_next(ansible: Ansible, tmp_path: Path):
    """vllm_server's restart record takes its own files' checksums from this call (no stat
    afterwards): they must be the files' sha1 as written, and in check mode as they would be."""
    unit, gone = tmp_path / "server.service", tmp_path / "server.api-key"
    gone.write_text("sk-old")
    files = [
        {"path": str(unit), "content": "[Service]\nExecStart=/bin/true\n", "mode": "0644"},
        {"path": str(gone), "state": "absent"},
    ]
    checked = run(ansible, files, "--check")
    sha1 = hashlib.sha1(b"[Service]\nExecStart=/bin/true\n").hexdigest()
    assert checked["checksums"] == {str(unit): sha1, str(gone): None}
    assert not unit.exists() and gone.exists()
    written = run(ansible, files)
    assert written["checksums"] == checked["checksums"]
    assert hashlib.sha1(unit.read_bytes()).hexdigest() == sha1 and not gone.exists()
    assert run(ansible, files)["checksums"] == checked["checksums"]
