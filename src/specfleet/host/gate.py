"""The health gate of a vLLM unit: it serves, it completes, it speculates.

``python -m specfleet.host.gate --unit U --base-url URL --model NAME [...]``, run on the host
(by the vllm_server role, after every restart) with the stack's interpreter:

1. wait until ``/health`` answers 200, ending early when the unit fails, stops or restarts
   (a model that crashes while loading does not make the gate wait its whole timeout);
2. read the speculative counters, run a real greedy completion of each ``--prompt`` (one
   by default; publication gives a held-out set), read them again;
3. with ``--speculative``: the drafter must have drafted (the draft-token counter grew),
   and with ``--min-mean-acceptance-length`` its acceptance over the gate's requests must
   reach that value (a 200 OK does not prove that speculation works);
4. run a sampled completion (temperature 1, no seed: what clients send by default), and
   ``/health`` must still answer 200 after it. Sampling takes other code than greedy
   decoding: on the CPU build, vLLM 0.31 compiles its sampler with torch's inductor on the
   first sampled request, and without a C++ compiler that killed the engine while every
   greedy request still passed.

The API key, if any, is read from standard input (never from the command line). Prints one
JSON object; exit 0 when the gate passed, 1 when it failed (with the step, the reason and
the unit's last journal lines), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from specfleet.host import metrics
from specfleet.host.journal import cause_lines

UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "ExecMainStartTimestampMonotonic")


class GateFailed(Exception):
    def __init__(self, step: str, reason: str) -> None:
        super().__init__(reason)
        self.step = step
        self.reason = reason


def unit_state(unit: str) -> dict[str, str]:
    argv = ["systemctl", "show", unit, *(f"--property={name}" for name in UNIT_PROPERTIES)]
    output = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def journal_tail(unit: str, lines: int = 40, window: int = 1000) -> list[str]:
    """The unit's last lines that say why it failed (specfleet.host.journal: its last traceback
    in front when that scrolled out, vLLM's exit noise left out)."""
    argv = ["journalctl", "--unit", unit, "--lines", str(window), "--no-pager", "--output", "cat"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    return cause_lines(result.stdout.splitlines(), lines)


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(unit: str, base_url: str, timeout: float) -> float | None:
    """Seconds from the unit's process start to a 200 from /health."""
    restarts = int(unit_state(unit).get("NRestarts", "0") or 0)
    deadline = time.monotonic() + timeout
    while True:
        state = unit_state(unit)
        if state.get("ActiveState") in ("failed", "inactive"):
            raise GateFailed("health", f"the unit is {state.get('ActiveState')}")
        if int(state.get("NRestarts", "0") or 0) > restarts:
            raise GateFailed("health", "the server crashed while starting")
        if state.get("ActiveState") == "active" and answers_200(f"{base_url}/health"):
            started_us = int(state.get("ExecMainStartTimestampMonotonic", "0") or 0)
            return round(time.monotonic() - started_us / 1e6, 1) if started_us else None
        if time.monotonic() > deadline:
            raise GateFailed("health", f"no 200 from {base_url}/health in {timeout:.0f} s")
        time.sleep(2)


GREEDY = {"temperature": 0}
DEFAULT_PROMPT = "The operator checks the service"
# No seed: a seeded request takes vLLM's per-request generator path, not the batch's one.
SAMPLED = {"temperature": 1.0, "top_p": 0.95}


def complete(
    args: argparse.Namespace, api_key: str, sampling: dict[str, float], step: str, prompt: str
) -> dict[str, Any]:
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        **sampling,
        # A random or young model may end at once; the gate wants tokens.
        "ignore_eos": True,
    }
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        f"{args.base_url}/v1/completions", json.dumps(body).encode(), headers
    )
    try:
        with urllib.request.urlopen(request, timeout=args.request_timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise GateFailed(step, f"HTTP {error.code}: {error.read()[:300]!r}") from error
    except (urllib.error.URLError, OSError) as error:
        raise GateFailed(step, str(error)) from error
    tokens = int(answer.get("usage", {}).get("completion_tokens", 0))
    choices = answer.get("choices") or [{}]
    if tokens <= 0 or not isinstance(choices[0].get("text"), str):
        raise GateFailed(step, f"the {step} returned no tokens")
    return {"completion": choices[0]["text"], "completion_tokens": tokens}


def sample(args: argparse.Namespace, api_key: str) -> dict[str, Any]:
    """A sampled completion, then /health: the engine must have survived it."""
    tokens = complete(args, api_key, SAMPLED, "sampling", args.prompts[0])["completion_tokens"]
    if not answers_200(f"{args.base_url}/health"):
        raise GateFailed("sampling", "/health stopped answering 200 after a sampled completion")
    return {"sampled_completion_tokens": tokens}


def run_gate(args: argparse.Namespace, api_key: str) -> dict[str, Any]:
    report: dict[str, Any] = {
        "seconds_from_start": wait_healthy(args.unit, args.base_url, args.health_timeout)
    }
    before = metrics.spec_decode_counters(metrics.fetch(f"{args.base_url}/metrics"))
    completions = [complete(args, api_key, GREEDY, "completion", p) for p in args.prompts]
    report |= completions[0]
    report["prompts"] = len(completions)
    report["completion_tokens"] = sum(c["completion_tokens"] for c in completions)
    after = metrics.spec_decode_counters(metrics.fetch(f"{args.base_url}/metrics"))
    report |= sample(args, api_key)
    if not args.speculative:
        return report
    drafted = metrics.delta(before, after, metrics.DRAFT_TOKENS)
    if drafted <= 0:
        raise GateFailed(
            "speculation",
            f"{metrics.DRAFT_TOKENS}_total did not grow: the server runs without "
            "speculative decoding",
        )
    figures = metrics.acceptance(before, after, positions=0)
    report |= {key: figures[key] for key in ("draft_tokens", "accepted_tokens", "drafts")}
    report["mean_acceptance_length"] = figures["mean_acceptance_length"]
    floor = args.min_mean_acceptance_length
    if floor is not None and figures["mean_acceptance_length"] < floor:
        raise GateFailed(
            "acceptance",
            f"mean acceptance length {figures['mean_acceptance_length']} is below {floor}",
        )
    return report


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.gate", description=__doc__)
    parser.add_argument("--unit", required=True, help="systemd unit, e.g. specfleet-vllm.service")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="model name clients use")
    parser.add_argument("--health-timeout", type=float, default=1800)
    parser.add_argument(
        "--prompt",
        dest="prompts",
        action="append",
        help="a prompt to complete greedily (repeat for several; default: one of the gate's)",
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--request-timeout", type=float, default=300)
    parser.add_argument("--speculative", action="store_true", help="require drafted tokens")
    parser.add_argument("--min-mean-acceptance-length", type=float, default=None)
    parser.add_argument(
        "--api-key-stdin", action="store_true", help="read the API key from standard input"
    )
    args = parser.parse_args(argv)
    args.prompts = args.prompts or [DEFAULT_PROMPT]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    api_key = sys.stdin.read().strip() if args.api_key_stdin else ""
    try:
        report = run_gate(args, api_key)
    except GateFailed as failure:
        print(
            json.dumps(
                {
                    "passed": False,
                    "step": failure.step,
                    "reason": failure.reason,
                    "unit": unit_state(args.unit),
                    "journal": journal_tail(args.unit),
                }
            )
        )
        return 1
    print(json.dumps({"passed": True, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
