"""specfleet.host.drafter.hidden_states_hf against transformers itself, on the real tiny target.

The pytest process has no torch, so one script runs in the cached stack venv: it builds a
small prepared dataset from the tiny target's prompts, extracts hidden states, computes
the references with a plain transformers forward and prints what it found as JSON.
"""

from __future__ import annotations

import json

import pytest

LAYER_IDS = [2, 4, 5, 8]
HIDDEN = 128

SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from specfleet.host.drafter.hidden_states_hf import bare_forward_tokens_per_s, extract
from specfleet.host.drafter.progress import Progress

# One thread: torch's default spin-waits against other work on a shared machine.
torch.set_num_threads(1)
root, work = Path(sys.argv[1]), Path(sys.argv[2])
layer_ids = json.loads(sys.argv[3])
target = root / "target"
tok = AutoTokenizer.from_pretrained(target)
prompts = [json.loads(line)["messages"][0]["content"]
           for line in (root / "prompts.jsonl").read_text().splitlines()[:12]]
input_ids = [tok(text)["input_ids"] for text in prompts]
prepared = work / "prepared"
Dataset.from_dict({"input_ids": input_ids}).save_to_disk(str(prepared))

hidden = work / "hidden"
progress = Progress(work / "progress.json", "test", ["hidden_states"])
progress.stage("hidden_states")
out = {"tokens_first": extract(target, prepared, hidden, layer_ids, progress)}
out["progress"] = {k: json.loads((work / "progress.json").read_text())[k]
                   for k in ("step", "total", "tokens_per_s")}
files = sorted(hidden.iterdir())
out["files"] = [p.name for p in files]
mtimes = {p.name: p.stat().st_mtime_ns for p in files}

model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
captured = []
model.model.layers[-1].register_forward_hook(
    lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
checks = []
for index, ids in enumerate(input_ids):
    saved = load_file(hidden / f"hs_{index}.safetensors")
    captured.clear()
    with torch.inference_mode():
        ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        normed = model.model.norm(captured[0])
    hs = saved["hidden_states"]
    last = hs[:, -1].float()
    checks.append({
        "keys": sorted(saved),
        "shape": list(hs.shape),
        "dtype": str(hs.dtype),
        "token_dtype": str(saved["token_ids"].dtype),
        "token_ids_equal": saved["token_ids"].tolist() == ids,
        "middle_match": all(
            torch.allclose(hs[:, j].float(), ref[k][0].float(), atol=1e-2)
            for j, k in enumerate(layer_ids[:-1])),
        "last_matches_hook": torch.allclose(last, captured[0][0].float(), atol=1e-2),
        "last_differs_post_norm": not torch.allclose(last, ref[-1][0].float(), atol=1e-2),
        "hook_is_pre_norm": torch.allclose(normed[0].float(), ref[-1][0].float(), atol=1e-2),
    })
out["checks"] = checks

# Resumable: nothing new the second time; a truncated file is redone, a stale temp dropped.
out["tokens_again"] = extract(target, prepared, hidden, layer_ids)
out["unchanged"] = all(p.stat().st_mtime_ns == mtimes[p.name] for p in hidden.iterdir())
(hidden / "hs_1.safetensors").write_bytes(b"\0" * 10)
(hidden / ".hs_3.abc.tmp").write_bytes(b"half")
out["tokens_redo"] = extract(target, prepared, hidden, layer_ids)
out["len_1"] = len(input_ids[1])
out["redone_equal"] = checks[1]["shape"] == list(
    load_file(hidden / "hs_1.safetensors")["hidden_states"].shape)
out["files_after"] = sorted(p.name for p in hidden.iterdir())
out["total_tokens"] = sum(map(len, input_ids))
out["bare"] = bare_forward_tokens_per_s(target, prepared, limit=4)
out["bare_tokens_4"] = sum(map(len, input_ids[:4]))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from specfleet.controller.stackvenv import generate_tiny_models, run_json, stack_python

    python = stack_python("cpu")
    models = tmp_path_factory.mktemp("tiny")
    generate_tiny_models(python, models)
    work = tmp_path_factory.mktemp("hidden")
    return run_json(
        python, "-c", SCRIPT, str(models), str(work), json.dumps(LAYER_IDS), timeout=300
    )


@pytest.mark.slow
def test_extract_writes_vllm_layout_and_numbering(result):
    checks = result["checks"]
    assert len(checks) == 12
    assert result["files"] == sorted(f"hs_{i}.safetensors" for i in range(12))
    assert result["tokens_first"] == result["total_tokens"]
    assert result["progress"]["step"] == result["progress"]["total"] == 12
    assert result["progress"]["tokens_per_s"] > 0
    for check in checks:
        assert check["keys"] == ["hidden_states", "token_ids"]
        assert check["shape"][1:] == [len(LAYER_IDS), HIDDEN]
        assert check["dtype"] == "torch.bfloat16"
        assert check["token_dtype"] == "torch.int64"
        assert check["token_ids_equal"]
        # id k is transformers' output_hidden_states[k] (the input of decoder layer k) ...
        assert check["middle_match"]
        # ... but the last id is the last layer's output before the final norm.
        assert check["last_matches_hook"]
        assert check["last_differs_post_norm"]
        assert check["hook_is_pre_norm"]


@pytest.mark.slow
def test_extract_resumes(result):
    assert result["tokens_again"] == 0
    assert result["unchanged"]
    assert result["tokens_redo"] == result["len_1"]
    assert result["redone_equal"]
    assert result["files_after"] == result["files"]


@pytest.mark.slow
def test_bare_forward_tokens_per_s(result):
    bare = result["bare"]
    assert bare["tokens"] == result["bare_tokens_4"] > 0
    assert bare["seconds"] > 0
    assert bare["tokens_per_s"] > 0
