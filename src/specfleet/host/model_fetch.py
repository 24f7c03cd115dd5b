"""Fetch a pinned model onto this host: free disk checked first, transfers resumed, every
file checked against the manifest before the folder counts, the folder switched into place
by one rename, older models pruned.

``python -m specfleet.host.model_fetch --manifest M --models-dir D [--source S] [--keep N]
[--protect FOLDER ...] [--margin-bytes B]`` prints one JSON object and exits 0, or 1 with
``{"error": ...}``. Run as root; D is root's (the layout's models folder).

- **Where from.** ``--source`` (default: the manifest's own): an absolute folder (a shared
  NFS export, as for the wheelhouse), an ``http://`` or ``https://`` mirror's base URL (each
  file at ``BASE/PATH``, fetched with ``Range`` requests), or ``hf://OWNER/NAME``, the Hugging
  Face Hub at the manifest's revision through ``huggingface_hub`` (``HF_ENDPOINT`` names an
  organisation's own mirror of it).
- **Where to.** ``D/<name>-<digest16>``, named by the manifest's digest. It only ever comes
  into being by the rename of ``D/.incoming-<name>-<digest16>``, after every file there
  was checked; so a folder under that name is complete. A file being fetched is
  ``PATH.part`` in the incoming folder; only a checked file has its own name there. A killed
  run leaves both, and the next one hashes the part's bytes and asks for the rest.
- **Disk.** What is still to fetch plus ``--margin-bytes`` must be free on D's file system
  before the first byte is asked for; otherwise nothing is fetched.
- **Bad bytes.** A file whose size or sha256 is not the manifest's is deleted and the run
  fails, naming it: nothing switches, and what serves is untouched.
- **Changed in place.** ``--recheck`` hashes a complete folder's files again (its record
  and sizes cannot show a file rewritten in place). Only the changed files are fetched
  again, each checked in the incoming folder and renamed over the changed one, so the
  folder stays where a server may serve it.
- **Pruning.** After the switch, complete models beyond the ``--keep`` newest (this one
  among them) are removed, except ``--protect``'s (the one a server serves), and so are
  the incoming folders of other manifests (superseded partial fetches).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specfleet.host.hashing import CHUNK, sha256_file
from specfleet.host.model_manifest import Manifest, ManifestError, ModelFile, load

#: In a complete model's folder: the manifest it was checked against (canonical text).
RECORD = ".specfleet-model.json"
INCOMING = ".incoming-"
PART = ".part"
DEFAULT_MARGIN = 1 << 30
HTTP_TIMEOUT = 60


class FetchError(Exception):
    """The model cannot be fetched; the message says why and what was left."""


@dataclass
class Tally:
    """What one run moved: bytes received, and bytes of earlier runs' parts resumed."""

    fetched: int = 0
    resumed: int = 0
    files: list[str] = field(default_factory=list)


# ----------------------------------------------------------------- sources
class Source:
    """Where a manifest's files are read from, each from an offset."""

    def open_from(self, path: str, offset: int) -> tuple[IO[bytes], int]:
        """A stream of ``path``'s bytes and the offset it starts at (``offset``, or 0 where
        the source cannot resume)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class FolderSource(Source):
    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise FetchError(f"source {root}: a folder source must be an absolute path")
        self.root = root

    def open_from(self, path: str, offset: int) -> tuple[IO[bytes], int]:
        handle = open(self.root / path, "rb")  # noqa: SIM115 (returned to the caller)
        handle.seek(offset)
        return handle, offset

    def describe(self) -> str:
        return str(self.root)


class HttpSource(Source):
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/") + "/"

    def url(self, path: str) -> str:
        return self.base + urllib.parse.quote(path)

    def open_from(self, path: str, offset: int) -> tuple[IO[bytes], int]:
        request = urllib.request.Request(self.url(path))
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        try:
            answer = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)
        except urllib.error.HTTPError as error:
            if error.code == 416 and offset:
                # The part already holds every byte there is: nothing more to ask for.
                return _Empty(), offset
            raise FetchError(f"{self.url(path)}: HTTP {error.code} {error.reason}") from error
        except (urllib.error.URLError, OSError) as error:
            raise FetchError(f"{self.url(path)}: {error}") from error
        if answer.status == 206:
            start = _content_range_start(answer.headers.get("Content-Range", ""))
            if start != offset:
                answer.close()
                raise FetchError(f"{self.url(path)}: asked from byte {offset}, got {start}")
            return answer, offset
        return answer, 0  # 200: the server sent the whole file

    def describe(self) -> str:
        return self.base


class _Empty:
    def read(self, _size: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass


def _content_range_start(value: str) -> int | None:
    # "bytes START-END/TOTAL"
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def source_of(text: str) -> Source | HubSource:
    if text.startswith(("http://", "https://")):
        return HttpSource(text)
    if text.startswith("hf://"):
        return HubSource(text.removeprefix("hf://"))
    return FolderSource(Path(text.removeprefix("file://")))


class HubSource:
    """The Hugging Face Hub at a pinned commit. huggingface_hub fetches (and resumes) each
    file into the incoming folder; this module then checks it as it checks any other."""

    def __init__(self, repo_id: str, hf_hub_download: Callable[..., str] | None = None) -> None:
        self.repo_id = repo_id
        self.hf_hub_download = hf_hub_download

    def download(self, entry: ModelFile, revision: str, into: Path) -> Path:
        download = self.hf_hub_download
        if download is None:
            try:  # only hosts that fetch from the Hub need it (vLLM's venv has it)
                from huggingface_hub import hf_hub_download as download
            except ImportError as error:
                raise FetchError(
                    f"{self.describe()}: fetching from the Hub needs huggingface_hub"
                ) from error
        return Path(
            download(
                repo_id=self.repo_id,
                filename=entry.path,
                revision=revision,
                local_dir=into / ".hub",
            )
        )

    def describe(self) -> str:
        return f"hf://{self.repo_id}"


# ----------------------------------------------------------------- checks
def complete(folder: Path, manifest: Manifest) -> bool:
    """Whether ``folder`` is this manifest's complete model: its record is the manifest and
    every file has its size (hashes were checked before the folder got its name)."""
    try:
        if (folder / RECORD).read_text() != manifest.dumps():
            return False
    except OSError:
        return False
    return all(_size(folder / entry.path) == entry.size for entry in manifest.files)


def changed_files(folder: Path, manifest: Manifest) -> list[str]:
    """The manifest's files whose bytes in ``folder`` are not what it pins (hashed: what a
    size and a record cannot show, a file changed in place)."""
    changed = []
    for entry in manifest.files:
        path = folder / entry.path
        if _size(path) != entry.size or sha256_file(path) != entry.sha256:
            changed.append(entry.path)
    return changed


def _size(path: Path) -> int | None:
    try:
        return path.lstat().st_size if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def still_to_fetch(incoming: Path, manifest: Manifest) -> int:
    """Bytes not yet in the incoming folder: files not checked yet, less their parts."""
    missing = 0
    for entry in manifest.files:
        if _size(incoming / entry.path) == entry.size:
            continue
        part = _size(incoming / (entry.path + PART)) or 0
        missing += max(entry.size - part, 0) if part <= entry.size else entry.size
    return missing


def check_free_disk(models_dir: Path, needed: int, margin: int) -> None:
    stats = os.statvfs(models_dir)
    free = stats.f_bavail * stats.f_frsize
    if free < needed + margin:
        raise FetchError(
            f"{models_dir}: {free} bytes free, the model needs {needed} more and a margin of"
            f" {margin}: nothing was fetched"
        )


# ----------------------------------------------------------------- transfer
def _hash_prefix(path: Path, digest: Any) -> int:
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return path.stat().st_size


def fetch_file(source: Source, entry: ModelFile, incoming: Path, tally: Tally) -> None:
    """Bring one file into ``incoming`` and give it its name once its bytes are checked."""
    final = incoming / entry.path
    part = incoming / (entry.path + PART)
    final.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    have = _hash_prefix(part, digest) if _size(part) is not None else 0
    if have > entry.size:
        part.unlink()
        have, digest = 0, hashlib.sha256()
    stream, start = source.open_from(entry.path, have)
    try:
        if start != have:  # the source could not resume: start again
            digest, have = hashlib.sha256(), 0
        else:
            tally.resumed += have
        with open(part, "ab" if have else "wb") as out:
            out.truncate(have)
            while block := stream.read(CHUNK):
                have += len(block)
                if have > entry.size:
                    break
                out.write(block)
                digest.update(block)
                tally.fetched += len(block)
            out.flush()
            os.fsync(out.fileno())
    finally:
        stream.close()
    _settle(part, final, entry, have, digest.hexdigest(), source.describe())
    tally.files.append(entry.path)


def fetch_file_from_hub(
    source: HubSource, entry: ModelFile, revision: str, incoming: Path, tally: Tally
) -> None:
    final = incoming / entry.path
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        downloaded = source.download(entry, revision, incoming)
    except FetchError:
        raise
    except Exception as error:  # huggingface_hub's errors are many; each says why
        raise FetchError(f"{source.describe()}@{revision}: {entry.path}: {error}") from error
    digest = hashlib.sha256()
    size = _hash_prefix(downloaded, digest)
    tally.fetched += size
    part = incoming / (entry.path + PART)
    os.replace(downloaded, part)
    _settle(part, final, entry, size, digest.hexdigest(), source.describe())
    tally.files.append(entry.path)


def _settle(part: Path, final: Path, entry: ModelFile, size: int, sha256: str, where: str) -> None:
    if size != entry.size or sha256 != entry.sha256:
        part.unlink(missing_ok=True)
        raise FetchError(
            f"{entry.path} from {where}: {size} bytes with sha256 {sha256}, the manifest pins"
            f" {entry.size} bytes with sha256 {entry.sha256}; the file was removed, nothing"
            " switched"
        )
    os.replace(part, final)


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# ----------------------------------------------------------------- the model
def models_in(models_dir: Path) -> Iterator[Path]:
    """Complete model folders (those with a record) in ``models_dir``."""
    for child in models_dir.iterdir():
        if not child.name.startswith(".") and not child.is_symlink() and (child / RECORD).is_file():
            yield child


def prune(models_dir: Path, keep: int, current: Path, protect: list[Path]) -> list[str]:
    """Remove complete models beyond the ``keep`` newest (``current`` first, then by when
    each was completed) and other manifests' incoming folders; never a protected one."""
    kept = {current.resolve()} | {path.resolve() for path in protect}
    others = sorted(
        (path for path in models_in(models_dir) if path.resolve() != current.resolve()),
        key=lambda path: (path / RECORD).stat().st_mtime,
        reverse=True,
    )
    kept |= {path.resolve() for path in others[: max(keep - 1, 0)]}
    removed = []
    for path in others:
        if path.resolve() not in kept:
            shutil.rmtree(path)
            removed.append(path.name)
    for path in models_dir.iterdir():
        if path.name.startswith(INCOMING) and path.name != INCOMING + current.name:
            shutil.rmtree(path)
            removed.append(path.name)
    return removed


def fetch(
    manifest: Manifest,
    models_dir: Path,
    source: Source | HubSource,
    *,
    keep: int = 2,
    protect: list[Path] | None = None,
    margin: int = DEFAULT_MARGIN,
    recheck: bool = False,
) -> dict[str, Any]:
    protect = protect or []
    started = time.monotonic()
    target = models_dir / manifest.folder_name
    incoming = models_dir / (INCOMING + manifest.folder_name)
    if recheck and complete(target, manifest) and (changed := changed_files(target, manifest)):
        return repair_in_place(manifest, models_dir, source, changed, margin, started)
    if complete(target, manifest):
        return {
            "folder": str(target),
            "digest": manifest.digest,
            "changed": False,
            "fetched_bytes": 0,
            "resumed_bytes": 0,
            "pruned": prune(models_dir, keep, target, protect),
        }
    if target.exists() or target.is_symlink():
        if any(target.resolve() == path.resolve() for path in protect):
            raise FetchError(
                f"{target}: the served model's folder is not what its manifest pins; it is"
                " left as it is: serve another model, or remove the folder, then run again"
            )
        # Only a rename ever makes this folder; not complete now, it was changed in place.
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    check_free_disk(models_dir, still_to_fetch(incoming, manifest), margin)
    incoming.mkdir(mode=0o755, exist_ok=True)
    tally = Tally()
    for entry in manifest.files:
        if _size(incoming / entry.path) == entry.size:
            continue  # checked by an earlier run
        if isinstance(source, HubSource):
            fetch_file_from_hub(source, entry, manifest.revision, incoming, tally)
        else:
            fetch_file(source, entry, incoming, tally)
    shutil.rmtree(incoming / ".hub", ignore_errors=True)
    (incoming / RECORD).write_text(manifest.dumps())
    _fsync_dir(incoming)
    os.rename(incoming, target)
    _fsync_dir(models_dir)
    seconds = time.monotonic() - started
    return {
        "folder": str(target),
        "digest": manifest.digest,
        "changed": True,
        "fetched_bytes": tally.fetched,
        "resumed_bytes": tally.resumed,
        "files_fetched": len(tally.files),
        "seconds": round(seconds, 3),
        "pruned": prune(models_dir, keep, target, protect),
    }


def repair_in_place(
    manifest: Manifest,
    models_dir: Path,
    source: Source | HubSource,
    changed: list[str],
    margin: int,
    started: float,
) -> dict[str, Any]:
    """Fetch a complete folder's changed files again, each into the incoming folder and, once
    checked, renamed over the changed one: the folder stays where it is (a server may serve
    it), and each file is either the changed one or the pinned one, never a mix."""
    target = models_dir / manifest.folder_name
    incoming = models_dir / (INCOMING + manifest.folder_name)
    entries = [entry for entry in manifest.files if entry.path in changed]
    check_free_disk(
        models_dir,
        still_to_fetch(
            incoming, Manifest(manifest.name, manifest.source, manifest.revision, tuple(entries))
        ),
        margin,
    )
    incoming.mkdir(mode=0o755, exist_ok=True)
    tally = Tally()
    for entry in entries:
        if isinstance(source, HubSource):
            fetch_file_from_hub(source, entry, manifest.revision, incoming, tally)
        else:
            fetch_file(source, entry, incoming, tally)
        os.replace(incoming / entry.path, target / entry.path)
    shutil.rmtree(incoming)
    _fsync_dir(target)
    return {
        "folder": str(target),
        "digest": manifest.digest,
        "changed": True,
        "changed_in_place": changed,
        "fetched_bytes": tally.fetched,
        "resumed_bytes": tally.resumed,
        "files_fetched": len(tally.files),
        "seconds": round(time.monotonic() - started, 3),
        "pruned": [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.model_fetch")
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--models-dir", required=True, type=Path)
    parser.add_argument("--source", help="where from (default: the manifest's source)")
    parser.add_argument("--keep", type=int, default=2, help="complete models to keep (2)")
    parser.add_argument("--protect", type=Path, action="append", default=[])
    parser.add_argument("--margin-bytes", type=int, default=DEFAULT_MARGIN)
    parser.add_argument(
        "--recheck", action="store_true", help="hash a complete folder's files again first"
    )
    args = parser.parse_args(argv)
    try:
        if args.keep < 1:
            raise FetchError(f"--keep {args.keep}: at least the model being fetched is kept")
        manifest = load(args.manifest)
        source = source_of(args.source or manifest.source)
        result = fetch(
            manifest,
            args.models_dir,
            source,
            keep=args.keep,
            protect=args.protect,
            margin=args.margin_bytes,
            recheck=args.recheck,
        )
    except (FetchError, ManifestError, OSError) as error:
        print(json.dumps({"error": str(error)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
