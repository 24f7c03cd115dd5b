"""roles/vllm_eagle3_patch through ansible-playbook: reads the target model, rewrites the
edit record the server's restart follows, changes nothing on a second run, rejects bad
variables up front. Runs without the vllm_server role in the play (no handler needed)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_releases import REPO, FakeVllm

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: {controller}
  roles:
    - role: vllm_eagle3_patch
"""


def play(tmp_path: Path, extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(controller=REPO / ".venv" / "bin" / "python"))
    return subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            str(playbook),
            "-i",
            "localhost,",
            "-e",
            json.dumps(extra),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        env={
            **os.environ,
            "ANSIBLE_LOCAL_TEMP": str(tmp_path),
            "ANSIBLE_REMOTE_TEMP": str(tmp_path),
        },
    )


def recap_changed(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("localhost"))
    return int(line.split("changed=")[1].split()[0])


@pytest.fixture
def setup(tmp_path: Path) -> tuple[FakeVllm, dict[str, object]]:
    vllm = FakeVllm(tmp_path / "vllm", "0.21.0")
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    return vllm, {
        "vllm_eagle3_patch_python": str(vllm.python),
        "vllm_eagle3_patch_target_model": str(model),
        "vllm_eagle3_patch_record": str(tmp_path / "eagle3-whitelist.json"),
    }


def test_role_patches_records_and_is_idempotent(tmp_path: Path, setup) -> None:
    vllm, extra = setup
    original = vllm.source.read_bytes()
    record = Path(str(extra["vllm_eagle3_patch_record"]))
    first = play(tmp_path, extra)
    assert first.returncode == 0, first.stdout + first.stderr
    assert b'"mistral",  # specfleet' in vllm.source.read_bytes()
    assert recap_changed(first.stdout) == 2  # the edit and its record
    edit = json.loads(record.read_text())
    assert edit["vllm_version"] == "0.21.0"
    assert edit["edited_at"]
    assert "mistral" in json.dumps(edit["entries"])

    second = play(tmp_path, extra)
    assert second.returncode == 0, second.stdout + second.stderr
    assert recap_changed(second.stdout) == 0
    assert json.loads(record.read_text()) == edit  # the server is not restarted

    third = play(tmp_path, {**extra, "vllm_eagle3_patch_state": "absent"})
    assert third.returncode == 0, third.stdout + third.stderr
    assert vllm.source.read_bytes() == original
    assert json.loads(record.read_text())["edited_at"] != edit["edited_at"]


def test_role_rejects_bad_variables(tmp_path: Path, setup) -> None:
    vllm, extra = setup
    before = vllm.snapshot()
    bad = play(tmp_path, {**extra, "vllm_eagle3_patch_state": "removed"})
    assert bad.returncode != 0
    assert "vllm_eagle3_patch_state" in bad.stdout and "removed" in bad.stdout
    assert vllm.snapshot() == before
