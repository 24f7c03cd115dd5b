"""The drafter pipeline's bookkeeping, without torch: settings, preflight, stage keys,
progress. The pipeline itself runs for real in the Molecule scenario
``drafter_training``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from specfleet.host.drafter.config import ConfigError, RunConfig
from specfleet.host.drafter.inputs import TargetFacts, default_layer_ids, preflight
from specfleet.host.drafter.progress import Progress
from specfleet.host.drafter.stages import STAGES, Context, latest_checkpoint, plan


def make_target(root: Path, layers: int = 8, vocab: int = 785, hidden: int = 128) -> Path:
    target = root / "target"
    target.mkdir(parents=True)
    config = {"num_hidden_layers": layers, "hidden_size": hidden, "vocab_size": vocab}
    (target / "config.json").write_text(json.dumps(config))
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    return target


def make_dataset(root: Path, rows: int = 60) -> Path:
    dataset = root / "prompts.jsonl"
    with dataset.open("w") as handle:
        for index in range(rows):
            row = {"messages": [{"role": "user", "content": f"Say something about {index}."}]}
            handle.write(json.dumps(row) + "\n")
    return dataset


def settings(tmp_path: Path, **overrides: Any) -> RunConfig:
    data: dict[str, Any] = {
        "target": str(make_target(tmp_path)),
        "dataset": str(make_dataset(tmp_path)),
        "cpu_compat": True,
        "work_dir": str(tmp_path / "work"),
        "store_dir": str(tmp_path / "store"),
        **overrides,
    }
    return RunConfig.from_dict(data)


PATHS = {"target": "/t", "dataset": "/d", "work_dir": "/w", "store_dir": "/s"}


def test_settings_reject_unknown_and_out_of_range_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        settings(tmp_path, epoch=3)
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        RunConfig.from_dict({**PATHS, "num_speculative_tokens": 0})
    with pytest.raises(ConfigError, match="'dataset' must be set"):
        RunConfig.from_dict({**PATHS, "dataset": ""})
    with pytest.raises(ConfigError, match="'work_dir' must be set"):
        RunConfig.from_dict({**PATHS, "work_dir": ""})


def test_good_input_passes_preflight(tmp_path: Path) -> None:
    report = preflight(settings(tmp_path))
    assert report.problems == []
    assert report.rows == 60 and report.hidden_states_bytes


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("missing dataset", "does not exist"),
        ("empty dataset", "is empty"),
        ("shallow target", "too few for the default taps"),
        ("large draft vocabulary", "larger than the target's vocabulary"),
    ],
)
def test_bad_input_is_named(tmp_path: Path, change: str, expected: str) -> None:
    config = settings(tmp_path)
    if change == "missing dataset":
        Path(config.dataset).unlink()
    elif change == "empty dataset":
        Path(config.dataset).write_text("\n")
    elif change == "shallow target":
        shutil.rmtree(config.target)
        make_target(tmp_path, layers=4)
    else:
        config = settings(tmp_path / "other", draft_vocab_size=4096)
    problems = preflight(config).problems
    assert len(problems) == 1 and expected in problems[0], problems


def test_too_little_disk_is_named_with_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = settings(tmp_path)
    free = shutil.disk_usage(tmp_path)._replace(free=1 << 20)
    monkeypatch.setattr("specfleet.host.drafter.inputs.shutil.disk_usage", lambda _path: free)
    (problem,) = preflight(config, count_tokens=lambda _text: 10).problems
    # 60 rows x (10 prompt + 128 response tokens) x 4 layers x 128 x 2 bytes = 8.1 MiB
    assert "too little disk" in problem and "8.1 MiB needed" in problem, problem


def test_default_taps_are_vllms() -> None:
    assert default_layer_ids(8) == [2, 4, 5]
    assert default_layer_ids(61) == [2, 30, 58]


def context(config: RunConfig) -> Context:
    facts = TargetFacts.read(Path(config.target))
    progress = Progress(Path(config.work_dir) / "progress.json", "", [s.name for s in STAGES])
    return Context(config, facts, progress)


def test_run_id_is_stable_and_only_changed_stages_get_new_keys(tmp_path: Path) -> None:
    base = settings(tmp_path)
    first, again = context(base), context(base)
    assert plan(first) == plan(again)
    longer = context(RunConfig.from_dict({**base.as_dict(), "epochs": 12}))
    assert plan(longer) != plan(first)
    for stage in ("prompts", "responses", "prepare", "hidden_states"):
        assert longer.keys[stage] == first.keys[stage], stage
    for stage in ("train", "evaluate", "export"):
        assert longer.keys[stage] != first.keys[stage], stage


def test_one_process_per_gpu_trains_under_torchrun_as_another_run(tmp_path: Path) -> None:
    from specfleet.host.drafter.stages import trainer_command

    single = settings(tmp_path, cpu_compat=False)
    eight = RunConfig.from_dict({**single.as_dict(), "train_processes": 8})
    assert trainer_command(single)[1:] == ["-m", "specfleet.host.drafter.train_entry"]
    command = trainer_command(eight)
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    assert command[5:] == ["8", "-m", "specfleet.host.drafter.train_entry"]
    # Splitting the batches across processes is another training run; the default keeps
    # the key every run trained before this setting had.
    first, split = context(single), context(eight)
    plan(first), plan(split)
    assert split.keys["hidden_states"] == first.keys["hidden_states"]
    assert split.keys["train"] != first.keys["train"]
    assert "processes" not in first.inputs["train"]["settings"]


def test_several_training_processes_are_refused_on_a_cpu_host(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train_processes=2 needs GPUs"):
        settings(tmp_path, train_processes=2)


def test_a_changed_dataset_changes_every_stage(tmp_path: Path) -> None:
    config = settings(tmp_path)
    before = context(config)
    plan(before)
    with Path(config.dataset).open("a") as handle:
        handle.write(json.dumps({"prompt": "one more"}) + "\n")
    after = context(config)
    plan(after)
    assert all(after.keys[s.name] != before.keys[s.name] for s in STAGES)


def test_latest_checkpoint_is_what_a_restart_resumes_from(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    for epoch, step in ((0, 76), (1, 152), (10, 836)):
        (tmp_path / str(epoch)).mkdir()
        state = {"epoch": epoch, "local_step": 0, "global_step": step}
        (tmp_path / str(epoch) / "training_state.json").write_text(json.dumps(state))
    (tmp_path / "checkpoint_best").symlink_to("1")
    assert latest_checkpoint(tmp_path) == {
        "epoch": 10,
        "local_step": 0,
        "global_step": 836,
        "dir": "10",
    }


def test_progress_estimates_time_left(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "progress.json", "run", ["train"])
    progress.stage("train")
    progress.step(10, 100, loss=0.5, tokens_per_s=1000.0)
    progress.step(20, 100, loss=0.4, tokens_per_s=1000.0)
    state = json.loads((tmp_path / "progress.json").read_text())
    assert state["stage"] == "train" and state["step"] == 20 and state["total"] == 100
    assert state["eta_s"] is not None and state["eta_s"] >= 0
    assert Progress.attach(tmp_path / "progress.json").state["run_id"] == "run"


def test_the_exported_drafter_asks_for_no_code(tmp_path: Path) -> None:
    """speculators saves an auto_map with its checkpoints; publication refuses one."""
    from specfleet.host.drafter.stages import data_only
    from specfleet.host.drafter_store import config_problems

    config = tmp_path / "config.json"
    saved = {"speculators_model_type": "eagle3", "auto_map": {"": "config.Eagle3Config"}}
    config.write_text(json.dumps(saved))
    assert config_problems(json.loads(config.read_text()))
    data_only(config)
    assert json.loads(config.read_text()) == {"speculators_model_type": "eagle3"}
    assert config_problems(json.loads(config.read_text())) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epochs": "5"}, 'epochs must be int, got "5" (str)'),
        ({"cpu_compat": 1}, "cpu_compat must be bool, got 1 (int)"),
        ({"layer_ids": [2, "4"]}, "layer_ids must be list[int]"),
        ({"server": {"port": "8390"}}, 'server.port must be int, got "8390" (str)'),
    ],
)
def test_a_setting_of_the_wrong_type_is_named(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    settings = {"target": "t", "dataset": "d", "work_dir": "w", "store_dir": "s"} | change
    with pytest.raises(ConfigError, match=re.escape(message)):
        RunConfig.from_dict(settings)


def grouped_dataset(root: Path, topics: dict[str, int]) -> Path:
    """Rows named by topic, as the documentation prompts are: ``{"group": topic}``."""
    root.mkdir(parents=True, exist_ok=True)
    dataset = root / "grouped.jsonl"
    with dataset.open("w") as handle:
        for topic, count in topics.items():
            for index in range(count):
                content = f"Tell me about {topic}, part {index}."
                row = {"messages": [{"role": "user", "content": content}], "group": topic}
                handle.write(json.dumps(row) + "\n")
    return dataset


def test_fixed_heldout_groups_are_held_out_whole_and_nothing_else(tmp_path: Path) -> None:
    from specfleet.host.drafter.stages import _prompts_run

    topics = {"for": 5, "while": 7, "with": 4, "try": 6}
    dataset = grouped_dataset(tmp_path / "data", topics)
    config = settings(tmp_path, dataset=str(dataset), heldout_groups=["with", "for"])
    assert preflight(config).problems == []
    out = tmp_path / "prompts"
    out.mkdir()
    summary = _prompts_run(context(config), out)
    assert summary == {"train_rows": 13, "heldout_rows": 9, "heldout_groups": ["for", "with"]}
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert {row["messages"][0]["content"].split(",")[0] for row in held} == {
        "Tell me about for",
        "Tell me about with",
    }
    # The split is a stage's input: other groups are another run of every stage.
    other = RunConfig.from_dict({**config.as_dict(), "heldout_groups": ["try"]})
    first, second = context(config), context(other)
    plan(first), plan(second)
    assert first.keys["prompts"] != second.keys["prompts"]


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        (["while", "never"], "heldout_groups ['never'] are not groups of dataset"),
        (["for", "while"], "hold every row of"),
    ],
)
def test_unusable_heldout_groups_are_named_before_anything_runs(
    tmp_path: Path, groups: list[str], expected: str
) -> None:
    dataset = grouped_dataset(tmp_path / "data", {"for": 3, "while": 2})
    config = settings(tmp_path, dataset=str(dataset), heldout_groups=groups)
    (problem,) = preflight(config).problems
    assert expected in problem, problem
