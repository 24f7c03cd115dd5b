"""``python -m specfleet.host.drafter {check,status,run} --config RUN.json`` and ``... settings``.

* ``check``: every reason the run cannot start (exit 2), or its id and estimates (exit 0);
  changes nothing.
* ``status``: the run id, whether it is complete, its result and the progress file;
  changes nothing. The role reads this to decide whether to start the job.
* ``run``: the pipeline, skipping finished stages; what the systemd job runs.
* ``settings``: every setting of a run, its default and what it means (no ``--config``).

Exit codes: 0 done, 1 a stage failed (a restart may help), 2 bad input (it will not).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from specfleet.host.drafter.config import ConfigError, RunConfig, describe
from specfleet.host.drafter.inputs import TargetFacts, preflight
from specfleet.host.drafter.progress import Progress, write_json
from specfleet.host.drafter.stages import STAGES, Context, is_done, plan, run_all

BAD_INPUT = 2


def _token_counter(target: str) -> Any:
    """Count prompt tokens with the target's own tokenizer, when it loads."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target)
    except Exception:  # an estimate is still useful without it
        return None
    return lambda text: len(tokenizer(text)["input_ids"])


def _progress_path(config: RunConfig) -> Path:
    return Path(config.work_dir) / "progress.json"


def _context(config: RunConfig) -> tuple[Context, str, Path]:
    """The planned run: its context, its id and where its result is written."""
    facts = TargetFacts.read(Path(config.target))
    stages = [stage.name for stage in STAGES]
    ctx = Context(config, facts, Progress(_progress_path(config), "", stages))
    run_id = plan(ctx)
    ctx.progress.state["run_id"] = run_id
    return ctx, run_id, ctx.work / "runs" / f"{run_id}.json"


def check(config: RunConfig) -> int:
    report = preflight(config, _token_counter(config.target))
    if report.problems:
        print(json.dumps({"ok": False, "problems": report.problems}, indent=2))
        return BAD_INPUT
    _, run_id, _ = _context(config)
    answer = {
        "ok": True,
        "run_id": run_id,
        "rows": report.rows,
        "hidden_states_bytes_estimate": report.hidden_states_bytes,
    }
    print(json.dumps(answer, indent=2))
    return 0


def status(config: RunConfig) -> int:
    progress_path = _progress_path(config)
    ctx, run_id, result_path = _context(config)
    progress = json.loads(progress_path.read_text()) if progress_path.is_file() else None
    answer = {
        "run_id": run_id,
        "complete": result_path.is_file(),
        "result": json.loads(result_path.read_text()) if result_path.is_file() else None,
        "stages_done": [stage.name for stage in STAGES if is_done(ctx, stage.name)],
        "keys": ctx.keys,
        "progress": progress if progress and progress.get("run_id") == run_id else None,
    }
    print(json.dumps(answer, indent=2))
    return 0


def run(config: RunConfig) -> int:
    problems = preflight(config, _token_counter(config.target)).problems
    if problems:
        print("bad input, nothing started:\n- " + "\n- ".join(problems), file=sys.stderr)
        return BAD_INPUT
    ctx, run_id, result_path = _context(config)
    print(f"run {run_id}: stages under {ctx.work / 'stages'}", flush=True)
    try:
        result = run_all(ctx)
    except Exception as error:
        traceback.print_exc()
        ctx.progress.finish("failed", f"{ctx.progress.state.get('stage')}: {error}")
        return 1
    write_json(result_path, {"run_id": run_id, **result})
    ctx.progress.finish("done", f"drafter {result['drafter']}", result=str(result_path))
    print(json.dumps({"run_id": run_id, **result}, indent=2))
    return 0


COMMANDS = {"check": check, "status": status, "run": run}


def print_settings() -> int:
    rows = describe()
    width = max(len(name) for name, _, _ in rows)
    for name, default, text in rows:
        print(f"{name:<{width}}  {default:<40}  {text}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.drafter", description=__doc__)
    parser.add_argument("command", choices=[*sorted(COMMANDS), "settings"])
    parser.add_argument("--config", type=Path, help="the run's settings (JSON)")
    args = parser.parse_args(argv)
    if args.command == "settings":
        return print_settings()
    if args.config is None:
        parser.error(f"{args.command} needs --config")
    try:
        config = RunConfig.load(args.config)
    except ConfigError as error:
        print(f"bad input, nothing started: {error}", file=sys.stderr)
        return BAD_INPUT
    return COMMANDS[args.command](config)


if __name__ == "__main__":
    raise SystemExit(main())
