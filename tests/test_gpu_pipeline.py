"""benchmarks/gpu_pipeline.py: the drafter pipeline's GPU path, run here on the CPU.

What only a GPU can show (CUDA's figures) needs the GPU machine; everything else runs here:
the parts a device call carries and returns, and the whole command, on the lab's tiny
target in the cached stack venv (the path its GPU run takes, on ``--devices cpu``), ending
with the returned drafter's acceptance measured by vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, load_plugin

pipeline = load_plugin("benchmarks/gpu_pipeline.py", "gpu_pipeline")


def test_a_file_split_for_a_device_call_joins_back_whole(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(2500))
    record = pipeline.split_file(source, tmp_path / "parts", "model.gguf", 1000)
    assert [part["bytes"] for part in record["parts"]] == [1000, 1000, 500]
    # The parts may travel in different calls: each is looked for in every folder given.
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (tmp_path / "parts" / "model.gguf.02").rename(elsewhere / "model.gguf.02")
    joined = pipeline.join_parts(record, [tmp_path / "parts", elsewhere], tmp_path / "joined")
    assert joined.read_bytes() == source.read_bytes()


def test_a_missing_part_is_named_with_the_way_out(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"x" * 30)
    record = pipeline.split_file(source, tmp_path / "parts", "model.gguf", 10)
    (tmp_path / "parts" / "model.gguf.01").unlink()
    with pytest.raises(pipeline.PartsError, match=r"model.gguf.01 of model.gguf .* carry it"):
        pipeline.join_parts(record, [tmp_path / "parts"], tmp_path / "joined")
    assert not list(tmp_path.glob("*joined*"))


def test_a_changed_part_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(b"x" * 30)
    record = pipeline.split_file(source, tmp_path / "parts", "model.gguf", 10)
    (tmp_path / "parts" / "model.gguf.01").write_bytes(b"y" * 10)
    with pytest.raises(pipeline.PartsError, match="sha256 differs"):
        pipeline.join_parts(record, [tmp_path / "parts"], tmp_path / "joined")
    assert not list(tmp_path.glob("*joined*"))


def test_cuda_over_cpu_ratios() -> None:
    def figures(generation: float, steps: float) -> dict[str, dict[str, float | None]]:
        return {
            "generation": {"tokens_per_s": generation},
            "extraction": {"tokens_per_s": None},
            "training": {"steps_per_s": steps, "tokens_per_s": steps * 100},
        }

    ratios = pipeline.ratios({"cuda": figures(900.0, 30.0), "cpu": figures(30.0, 0.5)})
    assert ratios == {
        "generation_tokens_per_s": 30.0,
        "extraction_tokens_per_s": None,
        "training_steps_per_s": 60.0,
        "training_tokens_per_s": 60.0,
    }
    assert pipeline.ratios({"cpu": figures(30.0, 0.5)}) == {}


def test_the_machines_package_list_is_names() -> None:
    names = pipeline.read_names(pipeline.DEVICE_PACKAGES)
    assert {"torch", "transformers", "accelerate", "pyarrow"} <= set(names)
    # What the pipeline needs beyond the machine's image travels: it must not be listed.
    assert not {"speculators", "datasets", "gguf", "pydantic"} & set(names)


@pytest.mark.slow
def test_the_command_runs_on_a_cpu_and_its_drafter_is_measured_by_vllm(
    tmp_path: Path,
) -> None:
    from specfleet.controller.stackvenv import generate_tiny_models, stack_python

    python = stack_python("cpu")
    models = tmp_path / "models"
    generate_tiny_models(python, models)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((models / "prompts.jsonl").read_text().splitlines(True)[:40]))
    out = tmp_path / "out"
    # No PYTHONPATH: the command finds the project itself, as it must on the GPU machine.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    script = str(ROOT / "benchmarks" / "gpu_pipeline.py")
    subprocess.run(
        [str(python), script, "run", "--target", str(models / "target"),
         "--prompts-file", str(prompts), "--out", str(out), "--work", str(tmp_path / "work"),
         "--heldout", "8", "--response-tokens", "24", "--epochs", "1",
         "--draft-vocab", "256", "--seq-length", "256", "--json"],
        env=env, check=True, timeout=900,
    )  # fmt: skip
    result = json.loads((out / "figures.json").read_text())
    assert result["devices"] == ["cpu"]
    # gpu-check ran first: here torch imports and every GPU check skips, saying why.
    checks = {check["check"]: check["status"] for check in result["gpu_check"]}
    assert checks["torch-import"] == "PASS" and checks["torch-bf16-matmul"] == "SKIP"
    cpu = result["figures"]["cpu"]
    assert cpu["generation"]["new_tokens"] > 0 and cpu["generation"]["tokens_per_s"] > 0
    assert cpu["extraction"]["tokens"] > 0 and cpu["extraction"]["tokens_per_s"] > 0
    assert cpu["training"]["steps"] > 0 and cpu["training"]["steps_per_s"] > 0
    assert cpu["generation"]["peak_gpu_mib"] is None  # no GPU here: none, not zero
    # What comes back from a device call: a few files, none over 15 MiB.
    returned = sorted(path.name for path in out.iterdir())
    assert returned[:3] == ["drafter.json", "drafter.tar.00", "figures.json"]
    assert "heldout.jsonl" in returned and len(returned) <= 8
    assert all(path.stat().st_size <= pipeline.RETURN_PART for path in out.iterdir())
    assert result["drafter"]["embeddings_shared_with_target"]
    # Held-out prompts are whole topics the drafter never trained on.
    assert len((out / "heldout.jsonl").read_text().splitlines()) >= 8

    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), script, "accept", str(out),
         "--target", str(models / "target"), "--speed-prompts", "2"],
        env=dict(os.environ, HF_HUB_OFFLINE="1"), check=True, timeout=900,
    )  # fmt: skip
    accepted = json.loads((out / "accept.json").read_text())["accept"]
    # vLLM served the target with the returned drafter (its embeddings the target's) and
    # drafted with it: its counters grew.
    assert accepted["drafts"] > 0 and accepted["draft_tokens"] == 3 * accepted["drafts"]
    assert accepted["mean_acceptance_length"] >= 1.0
    assert accepted["output_tokens_per_s"]["plain"] > 0
