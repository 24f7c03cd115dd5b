"""The pipeline's stages, each with declared inputs (upstream stages, settings) and outputs.

A stage's key is the hash of its name, its upstream stages' keys and its settings; its
outputs live in ``<work>/stages/<name>-<key>/`` and its ``manifest.json`` is written last.
A stage whose manifest exists is skipped, so a re-run after a crash continues where it
stopped, and a run that changes only the training settings reuses the responses and
hidden states of an earlier one. The stages that take long resume inside themselves too:
responses and hidden states skip rows already written, training loads its last
checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from specfleet.host.drafter import server as servers
from specfleet.host.drafter.config import RunConfig
from specfleet.host.drafter.inputs import (
    TargetFacts,
    digest_of,
    directory_digest,
    layer_ids,
    model_fingerprint,
    read_rows,
)
from specfleet.host.drafter.progress import Progress, write_json
from specfleet.host.drafter_store import DRAFTER_FILES
from specfleet.host.eagle3_preflight import TRAINING_KEY, target_identity
from specfleet.host.hashing import sha256_file

MANIFEST = "manifest.json"


class StageError(RuntimeError):
    """A stage could not produce its outputs; the message says why."""


@dataclass
class Context:
    """What every stage sees: the settings, the target's facts, the other stages' dirs.

    ``plan`` fills ``inputs`` (what defines each stage), ``keys`` and ``dirs``.
    """

    config: RunConfig
    facts: TargetFacts
    progress: Progress
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)

    @cached_property
    def target_fingerprint(self) -> str:
        """The target's identity, read once: two stages depend on it."""
        return model_fingerprint(Path(self.config.target))

    @property
    def work(self) -> Path:
        return Path(self.config.work_dir)

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    def manifest(self, stage: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dirs[stage] / MANIFEST).read_text())
        return data


@dataclass(frozen=True)
class Stage:
    name: str
    upstream: tuple[str, ...]
    settings: Callable[[Context], dict[str, Any]]
    run: Callable[[Context, Path], dict[str, Any]]


def run_tool(ctx: Context, stage: str, argv: list[str]) -> None:
    """Run a pipeline tool (speculators' CLI, the trainer) with its output in the stage log."""
    log_path = ctx.logs / f"{stage}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with log_path.open("ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise StageError(
            f"{stage}: {Path(argv[2] if argv[1] == '-m' else argv[1]).name} exited with "
            f"{result.returncode}; log {log_path}:\n" + "\n".join(tail)
        )


def speculators(*args: str) -> list[str]:
    return [sys.executable, "-m", "speculators", *args]


# --------------------------------------------------------------------------- prompts


def _prompts_settings(ctx: Context) -> dict[str, Any]:
    return {
        "dataset_sha256": sha256_file(Path(ctx.config.dataset)),
        "heldout_prompts": ctx.config.heldout_prompts,
        "heldout_groups": sorted(ctx.config.heldout_groups),
        "seed": ctx.config.seed,
    }


def heldout_groups(groups: list[str], wanted: int, seed: int) -> set[str]:
    """Whole groups, drawn with ``seed``, until they hold at least ``wanted`` rows.

    A row's group is what it must not share with training (a documentation topic); rows
    without one are each their own group, which makes this a plain seeded draw of rows.
    """
    sizes = Counter(groups)  # in first-appearance order, which the shuffle starts from
    order = list(sizes)
    random.Random(seed).shuffle(order)
    chosen: set[str] = set()
    held = 0
    for group in order:
        if held >= wanted:
            break
        chosen.add(group)
        held += sizes[group]
    return chosen


def _prompts_run(ctx: Context, out: Path) -> dict[str, Any]:
    """Split the dataset: held-out prompts (evaluation only) and training prompts.

    Rows that name a ``group`` are held out a whole group at a time, so the drafter is
    measured on topics it never trained on; the group is dropped from what the tools read.
    """
    rows = list(read_rows(Path(ctx.config.dataset)))
    groups = [str(row.pop("group", f"\0row {index}")) for index, row in enumerate(rows)]
    heldout = set(ctx.config.heldout_groups) or heldout_groups(
        groups, ctx.config.heldout_prompts, ctx.config.seed
    )
    held_rows = 0
    with (out / "train.jsonl").open("w") as train, (out / "heldout.jsonl").open("w") as held:
        for row, group in zip(rows, groups, strict=True):
            is_heldout = group in heldout
            held_rows += is_heldout
            (held if is_heldout else train).write(json.dumps(row) + "\n")
    return {
        "train_rows": len(rows) - held_rows,
        "heldout_rows": held_rows,
        "heldout_groups": sorted(g for g in heldout if not g.startswith("\0")),
    }


# --------------------------------------------------------------------------- responses


def _responses_settings(ctx: Context) -> dict[str, Any]:
    return {
        "target": ctx.target_fingerprint,
        "max_tokens": ctx.config.response_max_tokens,
        "temperature": ctx.config.response_temperature,
        "seed": ctx.config.seed,
    }


def _responses_run(ctx: Context, out: Path) -> dict[str, Any]:
    """The target answers the training prompts itself (on-policy samples)."""
    outfile = out / "responses.jsonl"
    sampling = {"temperature": ctx.config.response_temperature}
    with servers.serve(ctx.config, servers.plain(), ctx.logs / "server-responses.log") as srv:
        run_tool(
            ctx,
            "responses",
            speculators(
                "regenerate-responses",
                "--endpoint",
                f"{srv.base_url}/v1/chat/completions",
                "--model",
                srv.model,
                "--dataset",
                str(ctx.dirs["prompts"] / "train.jsonl"),
                "--sampling-params",
                json.dumps(sampling),
                "--max-tokens",
                str(ctx.config.response_max_tokens),
                "--concurrency",
                str(ctx.config.concurrency),
                "--outfile",
                str(outfile),
                # Rows already in the file are kept: a crash loses only the rows in flight.
                "--resume",
            ),
        )
    rows = sum(1 for _ in read_rows(outfile)) if outfile.exists() else 0
    if rows == 0:
        raise StageError(f"responses: the target answered none of the prompts (see {outfile})")
    return {"responses": rows}


# --------------------------------------------------------------------------- prepare


def _prepare_settings(ctx: Context) -> dict[str, Any]:
    return {"seq_length": ctx.config.seq_length, "seed": ctx.config.seed}


def _prepare_run(ctx: Context, out: Path) -> dict[str, Any]:
    """Tokenised rows with loss masks, and the token statistics for the draft vocabulary."""
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)  # prepare-data refuses a partly written dir
    run_tool(
        ctx,
        "prepare",
        speculators(
            "prepare-data",
            "--model",
            ctx.config.target,
            "--data",
            str(ctx.dirs["responses"] / "responses.jsonl"),
            "--output",
            str(data),
            "--seq-length",
            str(ctx.config.seq_length),
            "--seed",
            str(ctx.config.seed),
            "--num-preprocessing-workers",
            str(min(os.cpu_count() or 1, 4)),
            # The token frequencies are what maps the draft vocabulary (d2t).
            "--no-skip-token-freq",
        ),
    )
    from datasets import load_from_disk

    dataset = load_from_disk(str(data))
    tokens = sum(len(ids) for ids in dataset["input_ids"])
    return {"samples": len(dataset), "tokens": tokens}


# --------------------------------------------------------------------------- hidden states


def _hidden_settings(ctx: Context) -> dict[str, Any]:
    return {
        "layer_ids": layer_ids(ctx.config, ctx.facts),
        "backend": ctx.config.hidden_states_backend,
        "target": ctx.target_fingerprint,
    }


def _hidden_run(ctx: Context, out: Path) -> dict[str, Any]:
    """The target's hidden states at the taps and its last layer, one file per sample."""
    taps = [*layer_ids(ctx.config, ctx.facts), ctx.facts.num_layers]
    prepared = ctx.dirs["prepare"] / "data"
    hidden = out / "hidden"
    tokens = ctx.manifest("prepare")["outputs"]["tokens"]
    started = time.monotonic()
    if ctx.config.hidden_states_backend == "transformers":
        from specfleet.host.drafter.hidden_states_hf import extract

        extract(Path(ctx.config.target), prepared, hidden, taps, ctx.progress)
    else:
        staging = out / "staging"
        spec = servers.hidden_states_extraction(ctx.config, taps, staging)
        with servers.serve(ctx.config, spec, ctx.logs / "server-hidden-states.log") as srv:
            started = time.monotonic()  # the figure is extraction, not server start-up
            run_tool(
                ctx,
                "hidden_states",
                speculators(
                    "generate-offline-data",
                    "--model",
                    srv.model,
                    "--endpoint",
                    f"{srv.base_url}/v1",
                    "--preprocessed-data",
                    str(prepared),
                    "--output",
                    str(hidden),
                    "--concurrency",
                    str(ctx.config.concurrency),
                    "--validate-outputs",
                    "--fail-on-error",
                ),
            )
        shutil.rmtree(staging, ignore_errors=True)
    wall = time.monotonic() - started
    files = len(list(hidden.glob("hs_*.safetensors")))
    return {
        "files": files,
        "tokens": tokens,
        "extraction_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1) if wall else None,
        "bytes": sum(path.stat().st_size for path in hidden.glob("hs_*.safetensors")),
    }


# --------------------------------------------------------------------------- training


def _train_settings(ctx: Context) -> dict[str, Any]:
    config = ctx.config
    settings = {
        "epochs": config.epochs,
        "learning_rate": config.learning_rate,
        "draft_vocab_size": config.draft_vocab_size,
        "seq_length": config.seq_length,
        "seed": config.seed,
        "extra_args": config.train_extra_args,
        "cpu_compat": config.cpu_compat,
    }
    # More processes split each epoch's batches (another training run); one process
    # is what every run before this setting trained with, and keeps its key.
    if config.train_processes != 1:
        settings["processes"] = config.train_processes
    return settings


def trainer_command(config: RunConfig) -> list[str]:
    """How the trainer starts: one process, or torchrun with one process per GPU.

    speculators' trainer is data-parallel under torchrun (it reads LOCAL_RANK and sets
    up torch.distributed itself); ``--standalone`` keeps the rendezvous on this host.
    """
    if config.train_processes == 1:
        return [sys.executable, "-m", "specfleet.host.drafter.train_entry"]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(config.train_processes),
        "-m", "specfleet.host.drafter.train_entry",
    ]  # fmt: skip


def latest_checkpoint(ckpt: Path) -> dict[str, Any] | None:
    """The newest epoch checkpoint speculators wrote (what a restart resumes from)."""
    states = []
    for state in ckpt.glob("*/training_state.json"):
        if state.parent.name.isdigit():
            states.append(json.loads(state.read_text()) | {"dir": state.parent.name})
    return max(states, key=lambda item: int(item["dir"]), default=None)


def _train_run(ctx: Context, out: Path) -> dict[str, Any]:
    """Fine-tune the drafter with speculators; resumes from its last checkpoint."""
    config = ctx.config
    data = out / "data"
    data.mkdir(exist_ok=True)
    # The trainer writes its vocabulary mapping next to the data: link the prepared
    # files into a directory of this stage's own, so the prepare stage stays unchanged.
    for item in (ctx.dirs["prepare"] / "data").iterdir():
        link = data / item.name
        if not link.exists():
            link.symlink_to(item)
    ckpt = out / "ckpt"
    resumed = latest_checkpoint(ckpt)
    if resumed:
        with (out / "resumes.jsonl").open("a") as handle:
            handle.write(json.dumps(resumed | {"at": time.time()}) + "\n")
        ctx.progress.note(
            f"resuming from checkpoint epoch {resumed['epoch']} "
            f"(global step {resumed['global_step']})"
        )
    args = [
        "--verifier-name-or-path",
        config.target,
        "--speculator-type",
        "eagle3",
        "--data-path",
        str(data),
        "--hidden-states-path",
        str(ctx.dirs["hidden_states"] / "hidden"),
        "--draft-vocab-size",
        str(config.draft_vocab_size),
        "--epochs",
        str(config.epochs),
        "--lr",
        str(config.learning_rate),
        "--total-seq-len",
        str(config.seq_length),
        "--seed",
        str(config.seed),
        "--save-path",
        str(ckpt),
        "--log-dir",
        str(out / "logs"),
    ]
    if config.layer_ids:
        args += ["--target-layer-ids", *map(str, config.layer_ids)]
    started = time.monotonic()
    run_tool(
        ctx,
        "train",
        [
            *trainer_command(config),
            *(["--cpu-compat"] if config.cpu_compat else []),
            "--progress",
            str(ctx.progress.path),
            "--loss-log",
            str(out / "loss.jsonl"),
            "--summary",
            str(out / "summary.json"),
            "--",
            *args,
            *config.train_extra_args,
        ],
    )
    wall = time.monotonic() - started
    final = ckpt / str(config.epochs - 1)
    if not (final / "model.safetensors").is_file():
        raise StageError(f"train: no final checkpoint at {final}")
    lines = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    # Training steps; the held-out lines ({"epoch", "val_loss"}) are the report's.
    losses = [item for item in lines if "step" in item]
    held_out = [item for item in lines if "val_loss" in item]
    steps = max(item["step"] for item in losses) + 1 if losses else 0
    rates = [item["tokens_per_s"] for item in losses if item.get("tokens_per_s")]
    return {
        "checkpoint": str(final),
        "steps": steps,
        "resumes": [json.loads(line) for line in _lines(out / "resumes.jsonl")],
        "wall_s": round(wall, 1),
        "tokens_per_s": round(sum(rates) / len(rates), 1) if rates else None,
        "final_loss": losses[-1]["loss"] if losses else None,
        "final_held_out_loss": held_out[-1]["val_loss"] if held_out else None,
        "peak_gpu_mib": _summary(out / "summary.json").get("peak_gpu_mib"),
    }


def _summary(path: Path) -> dict[str, Any]:
    """The trainer's closing figures (none from a trainer that did not write them)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --------------------------------------------------------------------------- evaluation


def _evaluate_settings(ctx: Context) -> dict[str, Any]:
    baseline = ctx.config.baseline_drafter
    return {
        "num_speculative_tokens": ctx.config.num_speculative_tokens,
        "max_tokens": ctx.config.eval_max_tokens,
        "baseline": directory_digest(Path(baseline)) if baseline else None,
        # The candidate's config without remote-code hints (data_only) and with its
        # training record (record_training): a run evaluated before either is evaluated and
        # exported again, its training kept.
        "export": "data-only, training record",
    }


def data_only(config_file: Path) -> None:
    """Drop the remote-code hint from a checkpoint's config.json: the drafter is data.

    speculators saves its config class the transformers way, with an `auto_map` naming a
    Python file it copies beside the weights. vLLM reads a speculators checkpoint by its
    `speculators_model_type` and needs neither; publication refuses any drafter whose
    config asks for code (specfleet.host.drafter_store), so the exported one carries none.
    """
    config = json.loads(config_file.read_text())
    if config.pop("auto_map", None) is not None:
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def record_training(config_file: Path, record: dict[str, Any]) -> None:
    """Write what the drafter was trained for into its config.json (TRAINING_KEY).

    specfleet.host.eagle3_preflight compares it with what a host is about to serve: the
    target (its identity), the layers the drafter reads, the k it was evaluated at. Part of
    config.json, so the drafter's digest covers it and it travels wherever the drafter
    goes; vLLM reads neither format's unknown keys.
    """
    config = json.loads(config_file.read_text())
    config[TRAINING_KEY] = record
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _evaluate_run(ctx: Context, out: Path) -> dict[str, Any]:
    """Serve the target with each drafter; measure acceptance from vLLM's own counters."""
    from specfleet.host.drafter.evaluate import measure
    from specfleet.host.drafter.report import write_report

    candidate = out / "drafter"
    shutil.rmtree(candidate, ignore_errors=True)
    candidate.mkdir()
    checkpoint = Path(ctx.manifest("train")["outputs"]["checkpoint"])
    for name in DRAFTER_FILES:
        shutil.copyfile(checkpoint / name, candidate / name)
        (candidate / name).chmod(0o644)
    data_only(candidate / "config.json")
    record_training(
        candidate / "config.json",
        {
            "target_identity": target_identity(Path(ctx.config.target)),
            "aux_layer_ids": layer_ids(ctx.config, ctx.facts),
            "num_speculative_tokens": ctx.config.num_speculative_tokens,
        },
    )
    prompts = [row["messages"] for row in read_rows(ctx.dirs["prompts"] / "heldout.jsonl")]
    drafters = {"candidate": candidate}
    if ctx.config.baseline_drafter:
        drafters = {"baseline": Path(ctx.config.baseline_drafter), **drafters}
    results = {
        name: measure(ctx.config, drafter, prompts, ctx.logs / f"server-eval-{name}.log")
        for name, drafter in drafters.items()
    }
    report = write_report(
        out,
        results,
        losses=[json.loads(line) for line in _lines(ctx.dirs["train"] / "loss.jsonl")],
        stage_walls={
            name: ctx.manifest(name)["wall_s"]
            for name in ("prompts", "responses", "prepare", "hidden_states", "train")
        },
        figures={
            "hidden_states": ctx.manifest("hidden_states")["outputs"],
            "train": ctx.manifest("train")["outputs"],
        },
        heldout_prompts=len(prompts),
    )
    return {"report": str(report), **results}


# --------------------------------------------------------------------------- export


def _export_run(ctx: Context, out: Path) -> dict[str, Any]:
    """Store the evaluated drafter under its content hash, the report next to it."""
    evaluated = ctx.dirs["evaluate"] / "drafter"
    digest = directory_digest(evaluated)
    store = Path(ctx.config.store_dir)
    store.mkdir(parents=True, exist_ok=True)
    final = store / digest
    if not final.is_dir():
        temp = store / f".{digest}.partial"
        shutil.rmtree(temp, ignore_errors=True)
        shutil.copytree(evaluated, temp)
        temp.chmod(0o755)
        os.replace(temp, final)
    for item in ctx.dirs["evaluate"].iterdir():
        if item.name.startswith("report"):
            shutil.copyfile(item, store / f"{digest}.{item.name}")
    evaluation = ctx.manifest("evaluate")["outputs"]
    return {
        "drafter": str(final),
        "digest": digest,
        "report": str(store / f"{digest}.report.json"),
        "candidate": evaluation["candidate"],
        "baseline": evaluation.get("baseline"),
    }


STAGES: tuple[Stage, ...] = (
    Stage("prompts", (), _prompts_settings, _prompts_run),
    Stage("responses", ("prompts",), _responses_settings, _responses_run),
    Stage("prepare", ("responses",), _prepare_settings, _prepare_run),
    Stage("hidden_states", ("prepare",), _hidden_settings, _hidden_run),
    Stage("train", ("prepare", "hidden_states"), _train_settings, _train_run),
    Stage("evaluate", ("prompts", "train"), _evaluate_settings, _evaluate_run),
    Stage("export", ("evaluate",), lambda _ctx: {}, _export_run),
)


def plan(ctx: Context) -> str:
    """Compute every stage's key and directory; return the run id (the last key)."""
    for stage in STAGES:
        inputs = {
            "stage": stage.name,
            "upstream": {name: ctx.keys[name] for name in stage.upstream},
            "settings": stage.settings(ctx),
        }
        ctx.inputs[stage.name] = inputs
        ctx.keys[stage.name] = digest_of(inputs)
        ctx.dirs[stage.name] = ctx.work / "stages" / f"{stage.name}-{ctx.keys[stage.name]}"
    return ctx.keys[STAGES[-1].name]


def is_done(ctx: Context, stage: str) -> bool:
    manifest = ctx.dirs[stage] / MANIFEST
    if not manifest.is_file():
        return False
    return bool(json.loads(manifest.read_text()).get("key") == ctx.keys[stage])


def run_all(ctx: Context) -> dict[str, Any]:
    """Run every stage whose manifest is missing, in order; return the export's outputs."""
    for stage in STAGES:
        if is_done(ctx, stage.name):
            ctx.progress.stage(stage.name, skipped=True)
            continue
        ctx.progress.stage(stage.name)
        out = ctx.dirs[stage.name]
        out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        outputs = stage.run(ctx, out)
        wall = time.monotonic() - started
        ctx.progress.stage_done(stage.name, wall)
        write_json(
            out / MANIFEST,
            {
                **ctx.inputs[stage.name],
                "key": ctx.keys[stage.name],
                "outputs": outputs,
                "wall_s": round(wall, 1),
                "finished": time.time(),
            },
        )
    return ctx.manifest(STAGES[-1].name)["outputs"]
