"""src/specfleet/host/drafter_store.py: publication takes nothing on the training account's word.

Each attack of the trust-boundary review is performed here first (a forged digest, a
traversal, a planted link in every position, a config that asks for remote code, bytes that
do not match), then shown refused with nothing copied. The same code runs as root on the
training host (collect) and on every serving host (verify); the drafter_training Molecule
scenario repeats the attacks on a real host as the training account.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specfleet.host.drafter_store import (
    StoreError,
    collect,
    config_problems,
    digest_of_files,
    main,
    verify,
)

CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}


def export(anchor: Path, config: dict | None = None) -> tuple[str, Path]:
    """An exported drafter under anchor/job/export/<digest>, as the pipeline writes it."""
    staging = anchor / "job" / "export" / "staging"
    staging.mkdir(parents=True)
    (staging / "config.json").write_text(json.dumps(config or CONFIG))
    (staging / "model.safetensors").write_bytes(b"weights" * 100)
    from specfleet.host.drafter.inputs import directory_digest

    digest = directory_digest(staging)
    final = staging.with_name(digest)
    staging.rename(final)
    return digest, final


def test_collect_copies_hashes_and_names_by_digest(tmp_path: Path) -> None:
    digest, _ = export(tmp_path / "state")
    result = collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish", digest)
    copied = tmp_path / "publish" / digest
    assert result["digest"] == digest and Path(result["dir"]) == copied
    assert sorted(os.listdir(copied)) == ["config.json", "model.safetensors"]
    assert verify(copied, digest)["digest"] == digest


@pytest.mark.parametrize(
    ("claimed", "message"),
    [
        ("../../../.ssh", "not 64 hexadecimal characters"),
        ("0" * 64, "not to the claimed"),
    ],
)
def test_a_forged_digest_is_refused(tmp_path: Path, claimed: str, message: str) -> None:
    digest, _ = export(tmp_path / "state")
    with pytest.raises(StoreError, match=message):
        collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish", claimed)
    assert not [p for p in (tmp_path / "publish").glob("*") if not p.name.startswith(".")]


def test_a_traversal_in_the_path_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "config.json").write_text(json.dumps(CONFIG))
    (secret / "model.safetensors").write_bytes(b"private key")
    with pytest.raises(StoreError, match=r"without '\.\.'"):
        collect(tmp_path / "state", "../secret", tmp_path / "publish")


@pytest.mark.parametrize("where", ["job", "export", "drafter", "config.json", "model.safetensors"])
def test_a_planted_link_is_never_followed(tmp_path: Path, where: str) -> None:
    anchor = tmp_path / "state"
    digest, drafter = export(anchor)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(CONFIG))
    (target / "model.safetensors").write_bytes(b"not the drafter")
    victim = {
        "job": anchor / "job",
        "export": anchor / "job" / "export",
        "drafter": drafter,
        "config.json": drafter / "config.json",
        "model.safetensors": drafter / "model.safetensors",
    }[where]
    moved = victim.with_name(victim.name + ".moved")
    victim.rename(moved)
    victim.symlink_to(target / victim.name if victim.name in CONFIG_FILES else target)
    with pytest.raises(StoreError, match="link"):
        collect(anchor, f"job/export/{digest}", tmp_path / "publish", digest)
    assert not (tmp_path / "publish" / digest).exists()


CONFIG_FILES = ("config.json", "model.safetensors")


@pytest.mark.parametrize(
    "config",
    [
        {**CONFIG, "auto_map": {"AutoModel": "modeling_evil.Model"}},
        {**CONFIG, "trust_remote_code": True},
        {"speculators_model_type": "eagle3", "transformer_layer_config": {"auto_map": {}}},
    ],
)
def test_a_config_that_asks_for_remote_code_is_refused(tmp_path: Path, config: dict) -> None:
    digest, _ = export(tmp_path / "state", config)
    with pytest.raises(StoreError, match=r"remote code|import its own Python"):
        collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish", digest)
    assert not (tmp_path / "publish" / digest).exists()


def test_a_config_that_is_not_eagle3_is_refused() -> None:
    assert config_problems({"architectures": ["LlamaForCausalLM"]})
    assert not config_problems({"speculators_model_type": "eagle3"})


def test_verify_refuses_bytes_changed_after_the_copy(tmp_path: Path) -> None:
    digest, _ = export(tmp_path / "state")
    collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish", digest)
    copied = tmp_path / "publish" / digest
    (copied / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(StoreError, match="hashes to"):
        verify(copied, digest)


def test_verify_refuses_an_extra_file_and_a_link(tmp_path: Path) -> None:
    digest, _ = export(tmp_path / "state")
    collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish", digest)
    copied = tmp_path / "publish" / digest
    (copied / "modeling_evil.py").write_text("import os")
    with pytest.raises(StoreError, match="holds"):
        verify(copied, digest)
    (copied / "modeling_evil.py").unlink()
    (copied / "config.json").rename(copied / "real.json")
    (copied / "config.json").symlink_to(copied / "real.json")
    with pytest.raises(StoreError):
        verify(copied, digest)


def test_the_digest_is_the_pipelines(tmp_path: Path) -> None:
    digest, drafter = export(tmp_path / "state")
    import hashlib

    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in drafter.iterdir()}
    assert digest_of_files(hashes) == digest


def test_the_command_line_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "state").mkdir()
    code = main(["collect", "--anchor", str(tmp_path / "state"), "--path", "x",
                 "--into", str(tmp_path / "p"), "--expect", "../x"])  # fmt: skip
    answer = json.loads(capsys.readouterr().out)
    assert code == 1 and answer["ok"] is False and "64 hexadecimal" in answer["problem"]


def test_a_drafter_over_the_bound_is_refused_before_any_byte_is_copied(tmp_path: Path) -> None:
    # The attack measured before the bound: a 1 GiB sparse model.safetensors planted by the
    # training account under a correct digest. Its size is read, not its bytes.
    digest, folder = export(tmp_path / "state")
    with open(folder / "model.safetensors", "r+b") as planted:
        planted.truncate(1 << 30)
    publish = tmp_path / "publish"
    over = r"model.safetensors 1073741824\), over the publication bound"
    with pytest.raises(StoreError, match=over):
        collect(tmp_path / "state", f"job/export/{digest}", publish, max_bytes=64 << 20)
    assert list(publish.iterdir()) == []


def test_a_drafter_within_the_bound_is_collected_and_says_its_size(tmp_path: Path) -> None:
    digest, folder = export(tmp_path / "state")
    size = sum(path.stat().st_size for path in folder.iterdir())
    result = collect(tmp_path / "state", f"job/export/{digest}", tmp_path / "publish",
                     digest, max_bytes=size)  # fmt: skip
    assert result["digest"] == digest and result["bytes"] == size
    # Readable by the controller's connection account, so that it fetches without become.
    assert (tmp_path / "publish").stat().st_mode & 0o777 == 0o755


def test_superseded_copies_are_pruned_to_the_newest_kept(tmp_path: Path) -> None:
    publish = tmp_path / "publish"
    digests = []
    for run in range(3):
        digest, _ = export(tmp_path / f"state{run}", {**CONFIG, "run": run})
        result = collect(tmp_path / f"state{run}", f"job/export/{digest}", publish, keep=2)
        os.utime(publish / digest, (1_000 + run, 1_000 + run))
        digests.append(digest)
        assert result["pruned"] == ([digests[0]] if run == 2 else [])
    assert sorted(entry.name for entry in publish.iterdir()) == sorted(digests[1:])


def test_a_store_keeps_what_it_serves_and_served_before_then_the_newest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    names = [f"{n:064x}" for n in range(5)]
    for age, name in enumerate(names):
        (store / name).mkdir(parents=True)
        os.utime(store / name, (1_000 - age, 1_000 - age))  # names[0] the newest
    (store / "current").symlink_to(store / names[4])
    served, before = names[4], str(store / names[3])
    code = main(["prune", "--into", str(store), "--keep", "3", "--protect", served,
                 "--protect", before])  # fmt: skip
    assert code == 0
    assert sorted(entry.name for entry in store.iterdir()) == sorted(
        ["current", names[0], names[3], names[4]]
    )
