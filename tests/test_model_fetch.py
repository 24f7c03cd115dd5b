"""A pinned model onto a host: src/specfleet/host/model_fetch.py and model_manifest.py, and
the controller's `specfleet model pin` (src/specfleet/controller/modelpin.py).

The mirror is Debian's nginx on loopback (tests/webmirror.py), answering Range requests as
it does for a fleet; the shared folder is a folder. Each bad case is made to happen and
shown refused with nothing switched: a manifest that names a path outside the model's
folder, a tampered file on the mirror, too little disk, a transfer killed halfway (it
resumes: the second run asks only for the bytes the first did not get). The Hub cannot be
reached here: its two paths run against a mocked huggingface_hub, and their tests say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from webmirror import SLOW_RATE, nginx_serving

from specfleet.controller.cli import main as specfleet
from specfleet.controller.modelpin import pin_folder, pin_hub, write
from specfleet.host import model_fetch
from specfleet.host.model_fetch import RECORD, FetchError, FolderSource, HttpSource, fetch
from specfleet.host.model_manifest import Manifest, ManifestError, from_document, load

WEIGHTS = 4 << 20  # 4 MiB: about 8 s on the mirror's /slow/


def make_model(folder: Path, seed: bytes = b"v1") -> Path:
    """A model's files as a mirror holds them: config, tokenizer, weights in a subfolder."""
    (folder / "weights").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed.hex()}))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    block = hashlib.sha256(seed).digest() * (1 << 15)  # 1 MiB
    (folder / "weights" / "model.safetensors").write_bytes(block * (WEIGHTS // len(block)))
    (folder / ".cache").mkdir()
    (folder / ".cache" / "not-part-of-the-model").write_text("x")
    return folder


@pytest.fixture
def mirror(tmp_path: Path) -> Any:
    root = make_model(tmp_path / "mirror" / "tiny")
    with nginx_serving(tmp_path / "mirror", tmp_path / "nginx") as base:
        yield SimpleNamespace(root=root, url=base + "tiny/", slow=base + "slow/tiny/")


def models_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    return folder


# ----------------------------------------------------------------- the manifest
def test_pin_names_every_file_by_size_and_sha256_and_the_folder_by_the_digest(
    tmp_path: Path,
) -> None:
    root = make_model(tmp_path / "tiny")
    manifest = pin_folder(root, "tiny", "https://mirror.example/tiny/", "r1")
    assert [entry.path for entry in manifest.files] == [
        "config.json",
        "tokenizer.json",
        "weights/model.safetensors",
    ]
    weights = manifest.files[2]
    assert weights.size == WEIGHTS
    assert weights.sha256 == hashlib.sha256((root / weights.path).read_bytes()).hexdigest()
    assert manifest.folder_name == f"tiny-{manifest.digest[:16]}"
    # Written and read back: the same canonical text, the same digest.
    path = write(manifest, tmp_path / "manifests" / "tiny.json")
    assert load(path) == manifest and load(path).digest == manifest.digest
    # One byte of one file changed: another digest, another folder.
    (root / "tokenizer.json").write_text('{"version": "1.1"}')
    assert pin_folder(root, "tiny", "https://mirror.example/tiny/", "r1").digest != manifest.digest


def test_specfleet_model_pin_writes_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_model(tmp_path / "tiny")
    out = tmp_path / "tiny.json"
    rc = specfleet(["model", "pin", str(root), "--name", "tiny", "-o", str(out), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert rc == 0, document
    assert document["digest"] == load(out).digest
    assert load(out).source == str(root)
    rc = specfleet(["model", "pin", str(tmp_path / "nothing"), "--name", "x", "-o", str(out)])
    assert rc == 2 and "not a folder" in capsys.readouterr().err


def good_document() -> dict[str, Any]:
    return {
        "format": 1,
        "name": "tiny",
        "source": "/srv/models/tiny",
        "revision": "",
        "files": [{"path": "config.json", "size": 2, "sha256": "0" * 64}],
    }


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../../etc/shadow", "no '.', '..'"),
        ("weights/../../x", "no '.', '..'"),
        ("/etc/shadow", "must be relative"),
        (".ssh/authorized_keys", "hidden"),
        ("weights//x", "no '.', '..'"),
        ("a\\b", "must be relative"),
        ("", "non-empty"),
    ],
)
def test_a_path_outside_the_models_folder_is_refused(path: str, why: str) -> None:
    document = good_document()
    document["files"][0]["path"] = path
    with pytest.raises(ManifestError, match=why):
        from_document(document)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"sha256": "abc"}, "64 hexadecimal"),
        ({"size": -1}, "whole number"),
        ({"size": True}, "whole number"),
        ({"size": "2"}, "whole number"),
    ],
)
def test_a_bad_entry_is_refused(change: dict[str, Any], why: str) -> None:
    document = good_document()
    document["files"][0] |= change
    with pytest.raises(ManifestError, match=why):
        from_document(document)


def test_a_path_named_twice_or_as_file_and_folder_is_refused() -> None:
    for second in ("config.json", "CONFIG.json", "config.json/x"):
        document = good_document()
        document["files"].append({"path": second, "size": 1, "sha256": "1" * 64})
        with pytest.raises(ManifestError, match="named twice"):
            from_document(document)


# ----------------------------------------------------------------- fetching
def test_from_the_mirror_every_file_checked_then_one_rename_and_again_nothing(
    tmp_path: Path, mirror: Any
) -> None:
    manifest = pin_folder(mirror.root, "tiny", mirror.url)
    models = models_dir(tmp_path)
    first = fetch(manifest, models, HttpSource(mirror.url), margin=0)
    folder = models / manifest.folder_name
    assert first["changed"] and first["fetched_bytes"] == manifest.size, first
    assert Path(first["folder"]) == folder
    assert (folder / RECORD).read_text() == manifest.dumps()
    for entry in manifest.files:
        assert (folder / entry.path).read_bytes() == (mirror.root / entry.path).read_bytes()
    assert sorted(os.listdir(models)) == [manifest.folder_name]  # no incoming folder left
    again = fetch(manifest, models, HttpSource(mirror.url), margin=0)
    assert not again["changed"] and again["fetched_bytes"] == 0, again


def test_from_a_shared_folder(tmp_path: Path) -> None:
    root = make_model(tmp_path / "nfs" / "tiny")
    manifest = pin_folder(root, "tiny", str(root))
    result = fetch(manifest, models_dir(tmp_path), FolderSource(root), margin=0)
    assert result["changed"] and result["fetched_bytes"] == manifest.size


def test_a_tampered_file_on_the_mirror_is_refused_and_nothing_switches(
    tmp_path: Path, mirror: Any
) -> None:
    models = models_dir(tmp_path)
    served = fetch(
        pin_folder(mirror.root, "tiny", mirror.url), models, HttpSource(mirror.url), margin=0
    )
    # The operator pins a new revision; then the mirror's copy of one file is tampered with.
    (mirror.root / "config.json").write_text(json.dumps({"model_type": "llama", "rev": 2}))
    manifest = pin_folder(mirror.root, "tiny", mirror.url, "r2")
    with (mirror.root / "weights" / "model.safetensors").open("r+b") as weights:
        weights.seek(WEIGHTS // 2)
        weights.write(b"\0" * 16)
    with pytest.raises(FetchError, match=r"weights/model\.safetensors from .*nothing switched"):
        fetch(
            manifest,
            models,
            HttpSource(mirror.url),
            keep=1,
            protect=[Path(served["folder"])],
            margin=0,
        )
    assert not (models / manifest.folder_name).exists()
    incoming = models / f".incoming-{manifest.folder_name}"
    # The bad file's bytes are gone; the files that were checked stay for the next run.
    assert (
        not list(incoming.rglob("*.part"))
        and not (incoming / "weights" / "model.safetensors").exists()
    )
    assert (incoming / "config.json").is_file()
    # What serves is untouched: same folder, same files, still complete.
    assert model_fetch.complete(Path(served["folder"]), load_manifest_of(served["folder"]))


def load_manifest_of(folder: str) -> Manifest:
    return from_document(json.loads((Path(folder) / RECORD).read_text()))


def test_too_little_disk_is_refused_before_any_byte_is_fetched(tmp_path: Path, mirror: Any) -> None:
    manifest = pin_folder(mirror.root, "tiny", mirror.url)
    models = models_dir(tmp_path)
    free = os.statvfs(models).f_bavail * os.statvfs(models).f_frsize
    # A margin that this file system cannot hold beside the model (its real free space).
    with pytest.raises(FetchError, match="nothing was fetched"):
        fetch(manifest, models, HttpSource(mirror.url), margin=free)
    assert os.listdir(models) == []


def test_a_transfer_killed_halfway_resumes_where_it_stopped(tmp_path: Path, mirror: Any) -> None:
    """The real command, killed (-9) while the mirror's /slow/ sends the weights; run again,
    it hashes the part's bytes and asks only for the rest."""
    manifest = pin_folder(mirror.root, "tiny", mirror.slow)
    path = write(manifest, tmp_path / "tiny.json")
    models = models_dir(tmp_path)
    command = [sys.executable, "-m", "specfleet.host.model_fetch", "--manifest", str(path)]
    command += ["--models-dir", str(models), "--margin-bytes", "0"]
    part = models / f".incoming-{manifest.folder_name}" / "weights" / "model.safetensors.part"
    first = subprocess.Popen(command, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size >= WEIGHTS // 4):
        assert first.poll() is None and time.monotonic() < deadline, "never half way"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    got = part.stat().st_size
    assert 0 < got < WEIGHTS
    second = subprocess.run(command, capture_output=True, text=True, check=False)
    result = json.loads(second.stdout)
    assert second.returncode == 0, result
    print(
        f"\nkilled at {got} of {WEIGHTS} bytes; the second run fetched {result['fetched_bytes']}"
        f" and resumed {result['resumed_bytes']} (rate {SLOW_RATE} B/s)"
    )
    # The config and the tokenizer were checked before the kill: only the weights' rest.
    assert result["resumed_bytes"] == got
    assert result["fetched_bytes"] == WEIGHTS - got
    assert model_fetch.complete(models / manifest.folder_name, manifest)


def test_older_models_are_pruned_but_the_served_one_is_kept(tmp_path: Path) -> None:
    models = models_dir(tmp_path)
    made = []
    for revision in (b"r1", b"r2", b"r3", b"r4"):
        root = make_model(tmp_path / revision.decode())
        manifest = pin_folder(root, "tiny", str(root), revision.decode())
        made.append(fetch(manifest, models, FolderSource(root), keep=2, protect=[], margin=0))
        time.sleep(0.01)  # distinct completion times
    names = [Path(result["folder"]).name for result in made]
    assert sorted(os.listdir(models)) == sorted(names[2:]), os.listdir(models)
    # Serving r3 while r5 and r6 arrive: r3 stays, beside the newest.
    for revision in (b"r5", b"r6"):
        root = make_model(tmp_path / revision.decode())
        manifest = pin_folder(root, "tiny", str(root), revision.decode())
        made.append(
            fetch(
                manifest,
                models,
                FolderSource(root),
                keep=1,
                protect=[Path(made[2]["folder"])],
                margin=0,
            )
        )
    assert sorted(os.listdir(models)) == sorted([names[2], Path(made[-1]["folder"]).name])


def test_a_folder_changed_in_place_is_fetched_again_unless_it_serves(tmp_path: Path) -> None:
    root = make_model(tmp_path / "tiny")
    manifest = pin_folder(root, "tiny", str(root))
    models = models_dir(tmp_path)
    folder = Path(fetch(manifest, models, FolderSource(root), margin=0)["folder"])
    (folder / "tokenizer.json").write_text("{}")  # another size: not complete
    with pytest.raises(FetchError, match="served model's folder is not what its manifest pins"):
        fetch(manifest, models, FolderSource(root), protect=[folder], margin=0)
    assert (folder / "tokenizer.json").read_text() == "{}"
    again = fetch(manifest, models, FolderSource(root), margin=0)
    assert again["changed"] and model_fetch.complete(folder, manifest)


def test_the_command_says_what_is_wrong_in_one_json_line(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.json"
    document = good_document()
    document["files"][0]["path"] = "../x"
    bad.write_text(json.dumps(document))
    rc = model_fetch.main(["--manifest", str(bad), "--models-dir", str(models_dir(tmp_path))])
    assert rc == 1 and "no '.', '..'" in json.loads(capsys.readouterr().out)["error"]
    assert os.listdir(tmp_path / "models") == []


# ----------------------------------------------------------------- the Hub (mocked)
class FakeHub:
    """Stands in for huggingface_hub, which cannot reach the Hub from here."""

    def __init__(self, root: Path, commit: str) -> None:
        self.root, self.commit, self.asked = root, commit, []

    def model_info(self, repo_id: str, revision: str | None, files_metadata: bool) -> Any:
        assert files_metadata
        siblings = []
        for path in sorted(
            p for p in self.root.rglob("*") if p.is_file() and ".cache" not in p.parts
        ):
            name = path.relative_to(self.root).as_posix()
            lfs = None
            if path.suffix == ".safetensors":
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                lfs = SimpleNamespace(size=path.stat().st_size, sha256=digest)
            siblings.append(SimpleNamespace(rfilename=name, lfs=lfs))
        return SimpleNamespace(sha=self.commit, siblings=siblings)

    def download(
        self, repo_id: str, filename: str, revision: str, local_dir: Path | None = None
    ) -> str:
        self.asked.append((filename, revision))
        source = self.root / filename
        if local_dir is None:
            return str(source)
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        return str(target)


def test_hub_pin_resolves_the_commit_and_hashes_the_small_files_mocked_hub(tmp_path: Path) -> None:
    root = make_model(tmp_path / "hub")
    hub = FakeHub(root, "c0ffee" * 6 + "abcd")
    manifest = pin_hub("org/tiny", "main", "tiny", api=hub, download=hub.download)
    assert manifest.revision == hub.commit and manifest.source == "hf://org/tiny"
    assert manifest.files == pin_folder(root, "tiny", "x").files
    # The weights' digest came from the Hub's LFS record; only the small files were fetched.
    assert sorted(name for name, _ in hub.asked) == ["config.json", "tokenizer.json"]
    assert {revision for _, revision in hub.asked} == {hub.commit}


def test_hub_fetch_at_the_pinned_commit_checked_like_any_mocked_hub(tmp_path: Path) -> None:
    root = make_model(tmp_path / "hub")
    hub = FakeHub(root, "1" * 40)
    manifest = pin_hub("org/tiny", "", "tiny", api=hub, download=hub.download)
    hub.asked.clear()
    source = model_fetch.HubSource("org/tiny", hf_hub_download=hub.download)
    models = models_dir(tmp_path)
    result = fetch(manifest, models, source, margin=0)
    assert result["changed"] and model_fetch.complete(Path(result["folder"]), manifest)
    assert {revision for _, revision in hub.asked} == {"1" * 40}
    assert not (Path(result["folder"]) / ".hub").exists()
    # The Hub sends other bytes than it pinned: refused as from any source.
    (root / "tokenizer.json").write_text('{"version": "9"}')
    other = from_document(manifest.document() | {"name": "tiny2"})
    with pytest.raises(FetchError, match=r"tokenizer\.json from hf://org/tiny"):
        fetch(other, models, source, margin=0)


def test_a_part_that_already_holds_every_byte_is_checked_not_fetched(
    tmp_path: Path, mirror: Any
) -> None:
    """A run killed after the last byte, before the rename: the mirror answers the range
    past the end with 416, and the part's bytes are checked as they are."""
    manifest = pin_folder(mirror.root, "tiny", mirror.url)
    models = models_dir(tmp_path)
    incoming = models / f".incoming-{manifest.folder_name}"
    (incoming / "weights").mkdir(parents=True)
    weights = "weights/model.safetensors"
    (incoming / f"{weights}.part").write_bytes((mirror.root / weights).read_bytes())
    result = fetch(manifest, models, HttpSource(mirror.url), margin=0)
    assert result["resumed_bytes"] == WEIGHTS
    assert result["fetched_bytes"] == manifest.size - WEIGHTS
    assert model_fetch.complete(Path(result["folder"]), manifest)


def test_a_file_rewritten_in_place_at_its_size_is_found_by_the_recheck_and_fetched_alone(
    tmp_path: Path,
) -> None:
    """What a size and a record cannot show: the weights' bytes changed, their size kept. A
    plain run sees a complete folder; --recheck hashes it, fetches only that file again and
    renames it over the changed one, in the folder that serves."""
    root = make_model(tmp_path / "tiny")
    manifest = pin_folder(root, "tiny", str(root))
    models = models_dir(tmp_path)
    folder = Path(fetch(manifest, models, FolderSource(root), margin=0)["folder"])
    weights = folder / "weights" / "model.safetensors"
    weights.write_bytes(b"\0" * WEIGHTS)
    assert not fetch(manifest, models, FolderSource(root), protect=[folder], margin=0)["changed"]
    repaired = fetch(manifest, models, FolderSource(root), protect=[folder], margin=0, recheck=True)
    assert repaired["changed_in_place"] == ["weights/model.safetensors"]
    assert repaired["fetched_bytes"] == WEIGHTS and repaired["folder"] == str(folder)
    assert model_fetch.changed_files(folder, manifest) == []
    assert sorted(os.listdir(models)) == [folder.name]  # nothing left in incoming
    again = fetch(manifest, models, FolderSource(root), margin=0, recheck=True)
    assert not again["changed"] and again["fetched_bytes"] == 0
