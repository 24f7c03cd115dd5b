"""vLLM's CPU engine bound to different cores: the plain SmolLM2 server's tokens/s under each.

One command, from the repository, with the controller's venv::

    .venv/bin/python benchmarks/engine_binding.py [--bindings all,auto,nobind,0]

Why ``benchmarks/real_model.py`` gives every measured server the machine's cores
(``--engine-cores all``): the CPU build's default (``auto``) leaves cores to its API
process, which on a small machine handicaps the baseline every speedup is a ratio to. For
each binding (``VLLM_CPU_OMP_THREADS_BIND``; ``all`` is 0..N-1, ``unset`` leaves the
variable out) it starts the plain server on the same converted SmolLM2 and sends the same
general chat prompts (MT-Bench's first turns), one at a time and ``--concurrency`` at a
time, ``--repeats`` times. Its inputs are real_model's, cached under the same ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import real_model  # noqa: E402  (beside this file)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=real_model._parse([]).work)
    parser.add_argument("--bindings", default="all,auto,nobind,0")
    parser.add_argument("--prompts", type=int, default=12, help="requests a cell")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens a request")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    # Internal: the measuring half, run by the stack's interpreter.
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def environment(binding: str) -> dict[str, str]:
    """The server's environment for one binding ('unset': vLLM's own choice, no variable)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    if binding != "unset":
        env["VLLM_CPU_OMP_THREADS_BIND"] = real_model.engine_binding(binding)
    return env


def measure(given: dict[str, Any]) -> list[dict[str, Any]]:
    from specfleet.host.drafter import server as servers
    from specfleet.host.drafter.config import RunConfig
    from specfleet.host.drafter.inputs import read_rows

    chats = [row["messages"] for row in read_rows(Path(given["chat"]))][: given["prompts"]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-binding-") as tmp:
        for binding in given["bindings"]:
            config = RunConfig.from_dict(
                {
                    "target": given["model"],
                    "dataset": given["chat"],
                    "work_dir": f"{tmp}/work",
                    "store_dir": f"{tmp}/store",
                    "cpu_compat": True,
                    "server": {"args": ["--enforce-eager"], "environment": environment(binding)},
                }
            )
            log = Path(given["logs"]) / f"server-bind-{binding}.log"
            with servers.serve(config, servers.plain(), log) as server:
                cells = {
                    f"x{load}": real_model._cell(
                        server, chats, given["tokens"], load, given["repeats"]
                    )
                    for load in (1, given["concurrency"])
                }
            rows.append(
                {"binding": binding, "engine_threads": real_model._omp_threads(log), **cells}
            )
            print(json.dumps(rows[-1]["binding"]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure.read_text()))))
        return 0
    sys.path.insert(0, str(real_model.SRC))
    python = real_model._stack_python()
    given = {
        "model": str(real_model.smollm2(python, args.work)),
        "chat": str(real_model.chat_set(python, args.work)),
        "logs": str(args.work / "logs"),
        "bindings": args.bindings.split(","),
        "prompts": args.prompts,
        "tokens": args.tokens,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
    }
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    request = args.work / "engine-binding-input.json"
    request.write_text(json.dumps(given))
    env = dict(os.environ, PYTHONPATH=str(real_model.SRC), HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [str(python), str(Path(__file__)), "--measure", str(request)],
        env=env, check=True, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    rows = json.loads(done.stdout.splitlines()[-1])
    print(f"plain SmolLM2 server, {args.prompts} chat prompts x {args.tokens} tokens, "
          f"{os.cpu_count()} cores; tok/s median of {args.repeats} (min-max)")  # fmt: skip
    print(f"{'binding':<10} {'threads':>7} {'one at a time':>20} "
          f"{f'{args.concurrency} at a time':>20}")  # fmt: skip
    for row in rows:
        cells = [row[f"x{load}"]["tokens_per_s"] for load in (1, args.concurrency)]
        text = [f"{c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f})" for c in cells]
        print(f"{row['binding']:<10} {row['engine_threads'] or '?':>7} {text[0]:>20} {text[1]:>20}")
    (args.work / "engine-binding.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
