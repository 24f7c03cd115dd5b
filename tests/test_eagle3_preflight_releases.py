"""The EAGLE-3 preflight's release matrix: eleven vLLM releases, 0.8.5 to 0.32.0, from their
own files (tests/vllm_releases.py keeps the few the preflight reads out of each real wheel).

Each release is judged the way a host's run judges it: the whitelist module first edits the
release's check for the target's model type (vllm_eagle3_patch), then the preflight reads
the edited whitelist, the model registry, the target's class and the drafter readers. Three
targets: the lab's tiny target with the lab's drafter (tiny_models: the EAGLE-3 checkpoint
layout, ``LlamaForCausalLMEagle3``), SmolLM2-135M-Instruct with a drafter the training job
exports (speculators' format, with its training record), and GPT-2, a class vLLM serves but
cannot speculate for. What vLLM does when started is shown by the lab for the releases it
can start (0.31.0 and 0.32.0, the tiny target and its drafter: molecule/vllm_server and the
fleet's upgrade); the role's README sets the two side by side.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_eagle3_preflight import eagle3_drafter, make_target, speculators_drafter
from vllm_releases import RELEASES, FakeVllm, fetch_release

from specfleet.host.eagle3_preflight import VllmSource, preflight

pytestmark = pytest.mark.slow

# SmolLM2-135M-Instruct's shape (its config.json): what a drafter for it must fit.
SMOLLM2 = {"hidden_size": 576, "vocab_size": 49152, "num_hidden_layers": 30}

# Release: (tiny target with the lab's drafter, SmolLM2 with the job's drafter). Refusals are
# "refused: <check>". Why, from each release's source:
# - 0.8.5 reads no speculators checkpoint (no speculators reader), and builds
#   Eagle3LlamaForCausalLM for any EAGLE-3 drafter (its EAGLE config names no class);
# - 0.10.0 renames LlamaForCausalLMEagle3 to Eagle3LlamaForCausalLMEagle3, which it does not
#   register, and reads no speculators checkpoint;
# - 0.10.1.1 keeps LlamaForCausalLMEagle3 but leaves it out of its registry (commented out),
#   and reads speculators' eagle3 as Eagle3LlamaForCausalLM.
MATRIX = {
    "0.8.5": ("ok", "refused: drafter architecture"),
    "0.10.0": ("refused: drafter architecture", "refused: drafter architecture"),
    "0.10.1.1": ("refused: drafter architecture", "ok"),
    **{release: ("ok", "ok") for release in RELEASES[3:]},
}


def test_the_matrix_covers_every_release() -> None:
    assert list(MATRIX) == list(RELEASES)


def summary(verdict: dict) -> str:
    refused = sorted({c["name"] for c in verdict["checks"] if c["outcome"] == "refused"})
    return "ok" if not refused else "refused: " + ", ".join(refused)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("models")
    tiny = make_target(root / "tiny")
    smollm2 = make_target(root / "smollm2", **SMOLLM2)
    (smollm2 / "model.safetensors").unlink()  # its shape is in config.json; no weights read
    aux = [2, 15, 27]
    shapes = {"d2t": [8192], "fc.weight": [576, 3 * 576], "lm_head.weight": [8192, 576]}
    job = speculators_drafter(root / "smollm2-drafter", smollm2, aux=aux, shapes=shapes)
    config = (job / "config.json").read_text()
    # The drafter's own layer and vocabulary are SmolLM2's.
    config = config.replace('"hidden_size": 128', '"hidden_size": 576')
    config = config.replace('"vocab_size": 785', '"vocab_size": 49152')
    config = config.replace('"draft_vocab_size": 512', '"draft_vocab_size": 8192')
    (job / "config.json").write_text(config)
    gpt2 = make_target(root / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    return {
        "tiny": (tiny, eagle3_drafter(root / "tiny-drafter")),
        "smollm2": (smollm2, job),
        "gpt2": (gpt2, eagle3_drafter(root / "gpt2-drafter")),
    }


def judge(release: str, tmp_path: Path, target: Path, drafter: Path) -> dict:
    """Edit the release's whitelist for the target as the role does, then judge."""
    edit = FakeVllm(tmp_path / release, release).run(from_model=str(target))
    source = VllmSource(fetch_release(release) / "vllm", "cuda")
    return preflight(source, target, drafter, 3, str(edit["whitelist"]), list(edit["entries"]))


@pytest.mark.parametrize("release", RELEASES)
def test_release_matrix(release: str, models, tmp_path: Path) -> None:
    tiny = judge(release, tmp_path / "tiny", *models["tiny"])
    smollm2 = judge(release, tmp_path / "smollm2", *models["smollm2"])
    assert (summary(tiny), summary(smollm2)) == MATRIX[release], (tiny, smollm2)
    assert tiny["vllm"] == smollm2["vllm"] == release


@pytest.mark.parametrize("release", RELEASES)
def test_gpt2_is_refused_on_every_release_with_the_release_and_the_reason(
    release: str, models, tmp_path: Path
) -> None:
    verdict = judge(release, tmp_path, *models["gpt2"])
    (reason,) = [line for line in verdict["refused"] if line.startswith("target architecture")]
    assert f"vLLM {release} serves GPT2LMHeadModel with gpt2.GPT2LMHeadModel" in reason
    # The edit admits gpt2 to a release's whitelist; the class still cannot speculate.
    assert "target whitelist" not in summary(verdict)


def test_the_labs_previous_stack_0_31(models) -> None:
    """0.31.0, the lab's previous stack, which the fleet's upgrade tests switch to and back
    (no whitelist from 0.22 on)."""
    source = VllmSource(fetch_release("0.31.0") / "vllm", "cuda")
    verdicts = [preflight(source, *models[name], 3) for name in ("tiny", "smollm2", "gpt2")]
    assert [summary(v) for v in verdicts] == ["ok", "ok", "refused: target architecture"]
    assert verdicts[0]["vllm"] == "0.31.0"
