"""roles/vllm_eagle3_patch's EAGLE-3 preflight through ansible-playbook, on the real vLLM
0.32 of the cpu stack venv: a drafter that fits is recorded once (the server's restart
reads the record) and a re-run changes nothing; one that does not fit fails the play with
the mismatch and the way out, and leaves the record as it was; publication's entry point
judges a candidate without recording it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, recap
from test_eagle3_preflight import eagle3_drafter, make_target, speculators_drafter

pytestmark = pytest.mark.slow


def play(tasks_from: str = "main") -> list[dict]:
    return [
        {
            "name": "The EAGLE-3 preflight",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run vllm_eagle3_patch",
                    "ansible.builtin.include_role": {
                        "name": "vllm_eagle3_patch",
                        "tasks_from": tasks_from,
                    },
                }
            ],
        }
    ]


@pytest.fixture
def host(tmp_path: Path) -> dict[str, object]:
    from specfleet.controller.stackvenv import stack_python

    target = make_target(tmp_path / "target")
    return {
        "vllm_eagle3_patch_python": str(stack_python("cpu")),
        "specfleet_accelerator": "cpu",
        "specfleet_model": str(target),
        "specfleet_drafter": str(speculators_drafter(tmp_path / "drafter", target)),
        "specfleet_pythonpath": str(ROOT / "src"),
        "specfleet_whitelist_record": str(tmp_path / "eagle3-whitelist.json"),
        "specfleet_eagle3_preflight_record": str(tmp_path / "eagle3-preflight.json"),
    }


def test_a_fitting_drafter_is_recorded_once(ansible, host) -> None:
    first = ansible.playbook(play(), host)
    assert first.returncode == 0, first.stdout + first.stderr
    verdict = json.loads(Path(str(host["specfleet_eagle3_preflight_record"])).read_text())
    assert verdict["verdict"] == "ok" and verdict["vllm"] == "0.32.0"
    again = ansible.playbook(play(), host)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recap(again)["changed"] == 0


def test_a_drafter_on_other_layers_fails_the_play_and_keeps_the_record(
    ansible, host, tmp_path
) -> None:
    assert ansible.playbook(play(), host).returncode == 0
    record = Path(str(host["specfleet_eagle3_preflight_record"]))
    before = record.read_bytes()
    target = Path(str(host["specfleet_model"]))
    moved = speculators_drafter(tmp_path / "moved", target, aux=[1, 3, 6], trained_aux=[2, 4, 5])
    run = ansible.playbook(play(), {**host, "specfleet_drafter": str(moved)})
    assert run.returncode != 0
    assert "EAGLE-3 preflight on localhost refused vLLM 0.32.0" in run.stdout
    assert "aux layers: the drafter names aux layers [1, 3, 6]; it was trained on [2, 4, 5]" in (
        run.stdout
    )
    assert "nothing was restarted" in run.stdout
    assert record.read_bytes() == before


def test_publication_judges_a_candidate_without_recording_it(ansible, host, tmp_path) -> None:
    assert ansible.playbook(play(), host).returncode == 0
    record = Path(str(host["specfleet_eagle3_preflight_record"]))
    before = record.read_bytes()
    # The whitelist comes from the host's record on this entry point (0.32: none).
    Path(str(host["specfleet_whitelist_record"])).write_text(
        json.dumps({"vllm_version": "0.32.0", "whitelist": "absent", "entries": []})
    )
    candidate = {
        **host,
        "vllm_eagle3_patch_drafter": str(eagle3_drafter(tmp_path / "candidate")),
        "vllm_eagle3_patch_record": False,
    }
    run = ansible.playbook(play("preflight"), candidate)
    assert run.returncode == 0, run.stdout + run.stderr
    assert recap(run)["changed"] == 0
    assert record.read_bytes() == before
    wide = eagle3_drafter(tmp_path / "wide", target_hidden_size=256)
    refused = ansible.playbook(
        play("preflight"), {**candidate, "vllm_eagle3_patch_drafter": str(wide)}
    )
    assert refused.returncode != 0
    assert "hidden size: the drafter reads hidden states of size 256" in refused.stdout
