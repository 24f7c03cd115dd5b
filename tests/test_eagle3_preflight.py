"""The EAGLE-3 preflight (specfleet.host.eagle3_preflight) against the real vLLM 0.32 source.

The vLLM side is read from the cpu stack venv's own vllm package (the release the lab
serves); the models are the lab's tiny target and drafter as config.json and safetensors
headers, with the drafter in both checkpoint formats vLLM reads: the EAGLE-3 layout
(``LlamaForCausalLMEagle3``, what ``tiny_models`` writes) and speculators' (what the
training job exports). Each bad drafter is the tiny one with one thing changed, the change
a real mismatch makes: the layers it reads, the size of its hidden states, its vocabulary,
the target it was trained for.

That the source reading answers as vLLM itself does is checked on every architecture the
release registers (``test_source_reading_agrees_with_vllm``, in the stack venv).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specfleet.host import eagle3_preflight as preflight

pytestmark = pytest.mark.slow

HIDDEN, VOCAB, LAYERS, DRAFT_VOCAB = 128, 785, 8, 512
TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
}


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file with these tensors' shapes (bf16, zeros): what the preflight reads."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def make_target(folder: Path, **changes: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TARGET, **changes}))
    write_safetensors(
        folder / "model.safetensors",
        {"model.embed_tokens.weight": [changes.get("vocab_size", VOCAB), HIDDEN]},
    )
    return folder


def drafter_shapes(hidden: int = HIDDEN, aux: int = 3, draft_vocab: int = DRAFT_VOCAB) -> dict:
    return {
        "d2t": [draft_vocab],
        "fc.weight": [HIDDEN, aux * hidden],
        "lm_head.weight": [draft_vocab, HIDDEN],
    }


def eagle3_drafter(folder: Path, shapes: dict | None = None, **changes: Any) -> Path:
    """The tiny_models drafter: the EAGLE-3 checkpoint layout, no aux ids, no record."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "target_hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "num_hidden_layers": 1,
    }
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    write_safetensors(folder / "model.safetensors", shapes or drafter_shapes())
    return folder


def speculators_drafter(
    folder: Path,
    target: Path,
    aux: list[int] | None = None,
    trained_aux: list[int] | None = None,
    k: int = 3,
    shapes: dict | None = None,
    identity: str | None = None,
) -> Path:
    """What the training job exports: speculators' format with specfleet's training record."""
    folder.mkdir(parents=True, exist_ok=True)
    aux = [2, 4, 5] if aux is None else aux
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": aux,
        "target_hidden_size": None,
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": HIDDEN,
            "vocab_size": VOCAB,
            "num_hidden_layers": 1,
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "verifier": {"architectures": ["LlamaForCausalLM"]},
        },
        preflight.TRAINING_KEY: {
            "target_identity": identity or preflight.target_identity(target),
            "aux_layer_ids": trained_aux if trained_aux is not None else aux,
            "num_speculative_tokens": k,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", shapes or drafter_shapes(aux=len(aux)))
    return folder


@pytest.fixture(scope="module")
def vllm() -> preflight.VllmSource:
    from specfleet.controller.stackvenv import site_packages, stack_python

    return preflight.VllmSource(site_packages(stack_python("cpu")) / "vllm", "cpu")


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return make_target(tmp_path / "target")


def outcomes(verdict: dict) -> dict[str, str]:
    return {check["name"]: check["outcome"] for check in verdict["checks"]}


def refusal(verdict: dict, name: str) -> str:
    (text,) = [line for line in verdict["refused"] if line.startswith(name + ":")]
    return text


def test_the_lab_drafter_may_serve_and_says_what_it_cannot_prove(vllm, target, tmp_path):
    verdict = preflight.preflight(vllm, target, eagle3_drafter(tmp_path / "d"), 3)
    assert verdict["verdict"] == "ok", verdict["refused"]
    assert verdict["vllm"] == "0.32.0"
    assert outcomes(verdict) == {
        "target architecture": "ok",
        "target whitelist": "ok",
        "drafter architecture": "ok",
        "hidden size": "ok",
        "vocabulary": "ok",
        "aux layers": "unverified",
        "num_speculative_tokens": "unverified",
        "provenance": "unverified",
    }


def test_a_trained_drafter_passes_every_check(vllm, target, tmp_path):
    verdict = preflight.preflight(vllm, target, speculators_drafter(tmp_path / "d", target), 3)
    assert verdict["verdict"] == "ok", verdict["refused"]
    assert set(outcomes(verdict).values()) == {"ok"}


def test_aux_layers_outside_the_target_are_refused(vllm, target, tmp_path):
    drafter = speculators_drafter(tmp_path / "d", target, aux=[2, 4, 11])
    verdict = preflight.preflight(vllm, target, drafter, 3)
    assert verdict["verdict"] == "refused"
    assert "not distinct layers of the target's 8 (0..7)" in refusal(verdict, "aux layers")


def test_aux_layers_other_than_trained_are_refused(vllm, target, tmp_path):
    """The silent case: vLLM serves it on these layers and acceptance falls."""
    drafter = speculators_drafter(tmp_path / "d", target, aux=[1, 3, 6], trained_aux=[2, 4, 5])
    verdict = preflight.preflight(vllm, target, drafter, 3)
    assert "it was trained on [2, 4, 5]" in refusal(verdict, "aux layers")


def test_a_drafter_for_another_hidden_size_is_refused(vllm, target, tmp_path):
    drafter = eagle3_drafter(
        tmp_path / "d", shapes=drafter_shapes(hidden=256), target_hidden_size=256
    )
    verdict = preflight.preflight(vllm, target, drafter, 3)
    assert "of size 256; the target's are 128" in refusal(verdict, "hidden size")


def test_a_drafter_for_another_vocabulary_is_refused(vllm, target, tmp_path):
    drafter = eagle3_drafter(tmp_path / "d", vocab_size=VOCAB + 1)
    verdict = preflight.preflight(vllm, target, drafter, 3)
    assert "the drafter's vocabulary is 786, the target's 785" in refusal(verdict, "vocabulary")


def test_draft_vocabulary_maps_must_match(vllm, target, tmp_path):
    shapes = {**drafter_shapes(), "d2t": [DRAFT_VOCAB - 1]}
    verdict = preflight.preflight(vllm, target, eagle3_drafter(tmp_path / "d", shapes), 3)
    assert "d2t has 511 rows where 512 are read" in refusal(verdict, "vocabulary")


def test_a_drafter_trained_for_another_target_is_refused(vllm, target, tmp_path):
    other = make_target(tmp_path / "other", num_hidden_layers=LAYERS + 4)
    drafter = speculators_drafter(tmp_path / "d", other)
    verdict = preflight.preflight(vllm, target, drafter, 3)
    assert "the drafter was trained for target" in refusal(verdict, "provenance")


def test_more_tokens_than_trained_for_are_refused(vllm, target, tmp_path):
    verdict = preflight.preflight(vllm, target, speculators_drafter(tmp_path / "d", target), 5)
    text = refusal(verdict, "num_speculative_tokens")
    assert "trained and evaluated for up to 3" in text
    assert "specfleet_num_speculative_tokens: 3 or less" in text


def test_a_target_class_without_the_eagle3_interface_is_refused(vllm, tmp_path):
    target = make_target(tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    verdict = preflight.preflight(vllm, target, eagle3_drafter(tmp_path / "d"), 3)
    text = refusal(verdict, "target architecture")
    assert "vLLM 0.32.0 serves GPT2LMHeadModel with gpt2.GPT2LMHeadModel" in text
    assert "does not implement SupportsEagle3" in text


def test_an_unknown_target_architecture_is_refused(vllm, tmp_path):
    target = make_target(tmp_path / "t", architectures=["NoSuchForCausalLM"])
    verdict = preflight.preflight(vllm, target, eagle3_drafter(tmp_path / "d"), 3)
    assert "has no model class for the target's architecture" in refusal(
        verdict, "target architecture"
    )


@pytest.mark.parametrize(
    ("model_type", "entries", "outcome"),
    [
        ("llama", ["llama", "qwen"], "ok"),
        ("qwen3_moe", ["llama", "qwen"], "ok"),  # vLLM matches entries as substrings
        ("mistral", ["llama", "qwen"], "refused"),
    ],
)
def test_a_whitelist_release_reads_the_list_as_vllm_does(
    vllm, tmp_path, model_type, entries, outcome
):
    target = make_target(tmp_path / "t", model_type=model_type)
    verdict = preflight.preflight(vllm, target, eagle3_drafter(tmp_path / "d"), 3, "list", entries)
    assert outcomes(verdict)["target whitelist"] == outcome


def run_cli(*args: str) -> tuple[int, dict]:
    env_path = str(Path(preflight.__file__).parents[2])
    result = subprocess.run(
        [sys.executable, "-m", "specfleet.host.eagle3_preflight", *args],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path},
        check=False,
    )
    return result.returncode, json.loads(result.stdout)


def test_the_record_holds_a_passing_verdict_and_is_written_once(vllm, target, tmp_path):
    record = tmp_path / "eagle3-preflight.json"
    drafter = speculators_drafter(tmp_path / "d", target)
    args = ["--vllm", str(vllm.package), "--platform", "cpu", "--target", str(target)]
    args += ["--drafter", str(drafter)]
    rc, first = run_cli(*args, "--num-speculative-tokens", "3", "--record", str(record))
    assert (rc, first["record_changed"]) == (0, True)
    assert json.loads(record.read_text())["verdict"] == "ok"
    rc, again = run_cli(*args, "--num-speculative-tokens", "3", "--record", str(record))
    assert (rc, again["record_changed"]) == (0, False)
    written = record.read_bytes()
    rc, refused = run_cli(*args, "--num-speculative-tokens", "5", "--record", str(record))
    assert (rc, refused["verdict"], refused["record_changed"]) == (1, "refused", False)
    assert record.read_bytes() == written


def test_unreadable_input_is_an_error_not_a_verdict(vllm, target, tmp_path):
    rc, out = run_cli(
        "--vllm", str(vllm.package), "--target", str(target), "--drafter", str(tmp_path),
        "--num-speculative-tokens", "3",
    )  # fmt: skip
    assert rc == 2 and out["verdict"] == "error"
    assert "config.json is not readable JSON" in out["refused"][0]


# Runs in the stack venv: vLLM's own answer for every architecture it registers, by
# importing each model class (no weights): (architecture, supports EAGLE-3) or an error.
AGREE = r"""
import json, sys
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.model_executor.models import registry

# The architectures a target can have: text generation and multimodal (Kimi-K2.5 is one).
models = {**registry._TEXT_GENERATION_MODELS, **registry._MULTIMODAL_MODELS}
answers = {}
for arch, (module, name) in sorted(models.items()):
    try:
        absolute = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        cls = __import__(absolute, fromlist=[name])
        answers[arch] = bool(supports_eagle3(getattr(cls, name)))
    except Exception as error:  # a model whose optional dependency is missing
        answers[arch] = f"error: {type(error).__name__}"
print(json.dumps(answers))
"""


def test_source_reading_agrees_with_vllm(vllm) -> None:
    from specfleet.controller.stackvenv import run_json, stack_python

    answers = run_json(stack_python("cpu"), "-c", AGREE, timeout=600)
    compared = {arch: yes for arch, yes in answers.items() if isinstance(yes, bool)}
    assert len(compared) > 150, answers  # the rest need torchvision or a GPU to import
    ours = {arch: vllm.implements_eagle3(*vllm.registry()[arch]) for arch in compared}
    disagree = {arch: (ours[arch], yes) for arch, yes in compared.items() if ours[arch] != yes}
    assert not disagree, f"(source, vLLM) differ: {disagree}"
    assert compared["LlamaForCausalLM"] is True
    assert compared["KimiK25ForConditionalGeneration"] is True
    assert compared["GPT2LMHeadModel"] is False
