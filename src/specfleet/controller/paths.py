"""Where specfleet finds its checkout and keeps its content-addressed caches."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def repo_root() -> Path:
    """The checkout holding ansible.cfg (the CLI runs playbooks from there)."""
    override = os.environ.get("SPECFLEET_ROOT")
    if override:
        return Path(override).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "ansible.cfg").is_file() and (parent / "playbooks").is_dir():
            return parent
    return Path.cwd()


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root, created on demand.

    The cache lives outside the checkout so that a fresh clone (CI) reuses
    the debootstrap image, the wheelhouse and fetched vLLM releases.
    """
    root = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the cache's lock ``name`` (an exclusive flock on ``<cache>/locks/<name>.lock``).

    Two commands that would build the same cached thing at once (a test run beside
    `bin/lab up`, two operators on one controller) build it once: the second waits, then
    finds it built. The kernel releases the lock when its holder exits, even killed."""
    path = cache_dir("locks") / f"{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


#: Where ansible.cfg (collections_path) finds this checkout as the collection specfleet.fleet.
COLLECTION_LINK = Path(".ansible", "collections", "ansible_collections", "specfleet", "fleet")


def ensure_collection_link(root: Path | None = None) -> Path:
    """Link ``<root>/.ansible/collections/ansible_collections/specfleet/fleet`` to the
    checkout, so that the roles' fully qualified names (specfleet.fleet.*) resolve to its own
    files. Relative, so a moved checkout keeps it; a stale copy of the collection installed
    there is replaced. Cheap and idempotent: bin/bootstrap, the CLI and the tests call it."""
    root = root or repo_root()
    link = root / COLLECTION_LINK
    target = Path(*([".."] * (len(COLLECTION_LINK.parts) - 1)))
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return link
    link.parent.mkdir(parents=True, exist_ok=True)
    # os.replace below swaps a link or file atomically; only a folder (a copy) must go first.
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    partial = link.with_name(f".{link.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    partial.symlink_to(target)
    os.replace(partial, link)
    return link
