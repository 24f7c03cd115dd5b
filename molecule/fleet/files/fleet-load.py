"""Constant load through the balancer with vLLM's own benchmark client (`vllm bench serve`).

Runs back-to-back benchmark runs of RUN_PROMPTS requests at RATE per second until the file
STOP exists or MAX_RUNS runs are done (bounded in count and time), and appends one JSON
line per run to OUT: when it started and ended, requests completed and failed, their errors,
and the median and 99th-percentile end-to-end latency. The benchmark is vLLM's; this file
only repeats it and keeps its figures. It runs on a fleet host, with the interpreter of a
stack venv (which has vLLM's benchmark client), against the balancer's address only.

Usage: python fleet-load.py BASE_URL MODEL TOKENIZER OUT STOP [MAX_RUNS]
(the API key comes in the environment variable OPENAI_API_KEY, as vLLM's client reads it)
"""

import json
import sys
import time
from pathlib import Path

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

# Light enough that the servers, the load and a venv build share two cores
# (at 2/s the servers were saturated: p99 of 10-20 s, restarts of 8 minutes).
RUN_PROMPTS = 30
RATE = 1


def one_run(base_url: str, model: str, tokenizer: str, index: int) -> dict:
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "16",
            "--ignore-eos", "--num-prompts", str(RUN_PROMPTS), "--request-rate", str(RATE),
            "--max-concurrency", "2", "--seed", str(index), "--disable-tqdm",
            "--percentile-metrics", "e2el", "--metric-percentiles", "50,99",
            # Keeps each request's error in the result (only the figures otherwise).
            "--save-detailed",
        ]
    )  # fmt: skip
    return main(args)


def main_loop(argv: list[str]) -> int:
    base_url, model, tokenizer, out, stop = argv[:5]
    max_runs = int(argv[5]) if len(argv) > 5 else 60
    for index in range(max_runs):
        if Path(stop).exists():
            break
        started = time.time()
        try:
            result = one_run(base_url, model, tokenizer, index)
            record = {
                "completed": result["completed"],
                "failed": result.get("failed", RUN_PROMPTS - result["completed"]),
                "errors": [error for error in result.get("errors", []) if error][:5],
                "median_e2el_ms": result.get("median_e2el_ms"),
                "p99_e2el_ms": result.get("p99_e2el_ms"),
            }
        except Exception as error:  # a run that could not even start counts as all failed
            record = {"completed": 0, "failed": RUN_PROMPTS, "errors": [repr(error)]}
        record |= {"run": index, "started": started, "ended": time.time()}
        with open(out, "a") as handle:
            handle.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main_loop(sys.argv[1:]))
