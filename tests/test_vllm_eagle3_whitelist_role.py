"""roles/vllm_eagle3_patch through ansible-playbook: reads the target model, rewrites the
edit record the server's restart follows, changes nothing on a second run, rejects bad
variables up front. Runs without the vllm_server role in the play (no handler needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import recap
from vllm_releases import FakeVllm

PLAYBOOK = [
    {
        "name": "Apply vllm_eagle3_patch",
        "hosts": "localhost",
        "gather_facts": False,
        "roles": [{"role": "vllm_eagle3_patch"}],
    }
]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[FakeVllm, dict[str, object]]:
    vllm = FakeVllm(tmp_path / "vllm", "0.21.0")
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    return vllm, {
        "vllm_eagle3_patch_python": str(vllm.python),
        "specfleet_model": str(model),
        "specfleet_whitelist_record": str(tmp_path / "eagle3-whitelist.json"),
        # The whitelist alone: these vLLMs are a release's config files, no models (the
        # preflight has tests/test_eagle3_preflight_role.py).
        "vllm_eagle3_patch_preflight": False,
    }


def test_role_patches_records_and_is_idempotent(ansible, setup) -> None:
    vllm, extra = setup
    original = vllm.source.read_bytes()
    record = Path(str(extra["specfleet_whitelist_record"]))
    first = ansible.playbook(PLAYBOOK, extra)
    assert first.returncode == 0, first.stdout + first.stderr
    assert b'"mistral",  # specfleet' in vllm.source.read_bytes()
    assert recap(first)["changed"] == 1  # the edit and its record, in one call
    edit = json.loads(record.read_text())
    assert edit["vllm_version"] == "0.21.0"
    assert edit["path"] == str(vllm.source)
    assert "mistral" in json.dumps(edit["entries"])

    second = ansible.playbook(PLAYBOOK, extra)
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap(second)["changed"] == 0
    assert json.loads(record.read_text()) == edit  # the server is not restarted

    third = ansible.playbook(PLAYBOOK, {**extra, "vllm_eagle3_patch_state": "absent"})
    assert third.returncode == 0, third.stdout + third.stderr
    assert vllm.source.read_bytes() == original
    assert recap(third)["changed"] == 1
    assert json.loads(record.read_text()) != edit  # the removal reaches the server too


def test_another_vllm_rewrites_the_record_without_an_edit(ansible, setup, tmp_path) -> None:
    """A stack switch: the record follows the vLLM the host serves, even when nothing is
    edited (a vLLM without the check), so it never names the vLLM of a venv left behind."""
    _, extra = setup
    assert ansible.playbook(PLAYBOOK, extra).returncode == 0
    newer = FakeVllm(tmp_path / "vllm-newer", "0.32.0")
    switched = ansible.playbook(PLAYBOOK, {**extra, "vllm_eagle3_patch_python": str(newer.python)})
    assert switched.returncode == 0, switched.stdout + switched.stderr
    assert recap(switched)["changed"] == 1  # the record only (the module reports it)
    record = json.loads(Path(str(extra["specfleet_whitelist_record"])).read_text())
    assert record["vllm_version"] == "0.32.0" and record["whitelist"] == "absent"


def test_check_mode_reports_the_record_and_writes_nothing(ansible, setup) -> None:
    vllm, extra = setup
    original = vllm.source.read_bytes()
    checked = ansible.playbook(PLAYBOOK, extra, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert recap(checked)["changed"] == 1
    assert not Path(str(extra["specfleet_whitelist_record"])).exists()
    assert vllm.source.read_bytes() == original


def test_the_record_keeps_the_bytes_the_role_wrote_before(ansible, setup, tmp_path) -> None:
    """The record used to be written by a template of the module's result (to_nice_json
    and a newline); the module writes the same bytes, so a host converged before keeps its
    record and its server is not restarted by an upgrade of specfleet."""
    vllm, extra = setup
    assert ansible.playbook(PLAYBOOK, extra).returncode == 0
    former = tmp_path / "former.json"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "the module's result, without a record",
                "specfleet.fleet.vllm_eagle3_whitelist": {
                    "python": str(vllm.python),
                    "model_types": ["mistral"],
                },
                "register": "found",
            },
            {
                "name": "the record as the role's template wrote it",
                "ansible.builtin.copy": {
                    "dest": str(former),
                    "content": "{{ {'vllm_version': found.vllm_version, 'path': found.path,"
                    " 'whitelist': found.whitelist, 'entries': found.entries}"
                    " | to_nice_json }}\n",
                },
            },
        ],
    }
    rendered = ansible.playbook([play])
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert Path(str(extra["specfleet_whitelist_record"])).read_bytes() == former.read_bytes()


def test_role_rejects_bad_variables(ansible, setup) -> None:
    vllm, extra = setup
    before = vllm.snapshot()
    bad = ansible.playbook(PLAYBOOK, {**extra, "vllm_eagle3_patch_state": "removed"})
    assert bad.returncode != 0
    assert "vllm_eagle3_patch_state" in bad.stdout and "removed" in bad.stdout
    assert vllm.snapshot() == before
