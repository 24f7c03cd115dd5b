"""Model transfer speed: `specfleet.host.model_fetch` against a plain copy of the same files,
hashing included, measured side by side in one run.

Run it on a controller after `bin/bootstrap` (it needs Debian's nginx, which bootstrap
installs; no containers)::

    .venv/bin/python benchmarks/model_transfer.py [--size-mib 1024] [--files 4] [--rounds 3]

It writes a model of ``--files`` files of random bytes (``--size-mib`` in all) and pins it
(`specfleet model pin`'s manifest: every file's size and sha256), then, in each round, for
each source a fleet uses, into a fresh models folder on the same disk:

* an HTTP mirror (Debian's nginx on loopback, as the ``model_mirror`` role serves one):
  ``model_fetch`` (streamed, hashed as it is written, checked against the manifest, renamed)
  against ``curl -o`` of every file followed by ``sha256sum`` of them (what an operator
  would run by hand to get the same assurance);
* a shared folder (as an NFS mount is read): ``model_fetch`` against ``cp`` then
  ``sha256sum``.

The two of each pair run back to back in alternating order, from the same page cache, and
the figure is the median of ``--rounds`` with the ratio model_fetch / plain (1.0: as fast as
the plain copy; below 1: faster, since model_fetch hashes while it writes rather than
reading the file again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from webmirror import nginx_serving  # noqa: E402

from specfleet.controller.modelpin import pin_folder  # noqa: E402

CHUNK = 1 << 20


def write_model(folder: Path, size_mib: int, files: int) -> None:
    folder.mkdir(parents=True)
    per_file = size_mib // files
    for index in range(files):
        with open(folder / f"model-{index + 1:05d}-of-{files:05d}.safetensors", "wb") as out:
            for _ in range(per_file):
                out.write(os.urandom(CHUNK))


def timed(argv: list[str], **kwargs: Any) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kwargs)
    return time.monotonic() - started


def with_model_fetch(manifest: Path, source: str, models_dir: Path) -> float:
    argv = [sys.executable, "-m", "specfleet.host.model_fetch", "--manifest", str(manifest)]
    models_dir.mkdir(parents=True)  # a host's models folder exists (the role makes it)
    seconds = timed(
        [*argv, "--models-dir", str(models_dir), "--source", source],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    shutil.rmtree(models_dir)
    return seconds


def with_plain_copy(copy: Callable[[str, Path], list[str]], names: list[str], into: Path) -> float:
    """``copy`` (curl or cp) each file, then sha256sum them all; seconds for both."""
    into.mkdir(parents=True)
    started = time.monotonic()
    for name in names:
        subprocess.run(copy(name, into / name), check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["sha256sum", *names], cwd=into, check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    shutil.rmtree(into)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specfleet-transfer-", dir="/var/tmp"))
    try:
        model = work / "mirror" / "model"
        write_model(model, args.size_mib, args.files)
        names = sorted(path.name for path in model.iterdir())
        manifest = work / "model.json"
        manifest.write_text(pin_folder(model, "bench", str(model)).dumps())
        figures: dict[str, dict[str, list[float]]] = {"http": {}, "folder": {}}
        with nginx_serving(work / "mirror", work / "nginx") as base:
            url = f"{base}model/"
            pairs = {
                "http": (
                    lambda into: with_model_fetch(manifest, url, into),
                    lambda into: with_plain_copy(
                        lambda name, to: ["curl", "-sfo", str(to), url + name], names, into
                    ),
                ),
                "folder": (
                    lambda into: with_model_fetch(manifest, str(model), into),
                    lambda into: with_plain_copy(
                        lambda name, to: ["cp", str(model / name), str(to)], names, into
                    ),
                ),
            }
            for round_ in range(args.rounds):
                for source, (fetched, plain) in pairs.items():
                    runs = [("model_fetch", fetched), ("plain", plain)]
                    for label, run in runs if round_ % 2 == 0 else runs[::-1]:
                        seconds = run(work / "into")
                        figures[source].setdefault(label, []).append(seconds)
        report = {
            "size_mib": args.size_mib,
            "files": args.files,
            "rounds": args.rounds,
            "sources": {
                source: {
                    "model_fetch_s": statistics.median(runs["model_fetch"]),
                    "plain_s": statistics.median(runs["plain"]),
                    "ratio": statistics.median(runs["model_fetch"])
                    / statistics.median(runs["plain"]),
                    "model_fetch_mib_s": args.size_mib / statistics.median(runs["model_fetch"]),
                    "all": runs,
                }
                for source, runs in figures.items()
            },
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.size_mib} MiB in {args.files} files, median of {args.rounds} rounds")
    print("source  model_fetch  plain (copy + sha256sum)  ratio  model_fetch MiB/s")
    plain = {"http": "curl", "folder": "cp"}
    for source, row in report["sources"].items():
        print(
            f"{source:<7} {row['model_fetch_s']:>9.2f} s  {row['plain_s']:>7.2f} s"
            f" ({plain[source]}){'':>13}{row['ratio']:>5.2f}  {row['model_fetch_mib_s']:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
