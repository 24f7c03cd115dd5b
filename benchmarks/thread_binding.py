"""How the lab's vLLM servers should bind their threads: each setting of
``VLLM_CPU_OMP_THREADS_BIND`` measured side by side, on the same lab, in one run.

Run it on a lab that is up (``bin/lab up``: two servers, nothing else running)::

    .venv/bin/python benchmarks/thread_binding.py [--inventory inventory/lab/hosts.yml] [--rounds 2]

Settings (the env file's line on both servers, both restarted):

* ``auto``: vLLM's own choice, one OpenMP thread on the first core of each server and the
  other core left to its scheduler, the same core on every server of a shared machine;
* ``nobind``: no binding, the kernel places the threads (OpenMP starts one a core);
* ``a core each``: server *i* bound to core *i mod cores* (``0`` and ``1`` on two cores).

For each, in rounds that take the settings in turn (so that the machine's drift falls on
all of them alike), three figures:

* ``alone``: output tokens a second of one server answering requests one at a time;
* ``both``: the two servers' tokens a second together, each answering its own client;
* ``restart``: seconds until the second server answers ``/health`` after its restart
  (``systemctl restart`` returned: the old process stopped, the new one started), while
  the first answers a request a second (what a rolling upgrade does on a shared machine),
  waited for up to ``RESTART_CAP_S``.

It prints each figure's median over the rounds and its ratio to ``auto``. At the end it
puts back each server's env file as it found it and restarts the servers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from specfleet.controller.lab_tour import docker_exec

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = "/etc/specfleet/specfleet-vllm.env"
UNIT = "specfleet-vllm.service"
SETTING = "VLLM_CPU_OMP_THREADS_BIND"
REQUESTS = 16
TOKENS = 32
# The longest a restart is waited for: left to vLLM, two servers on one core took minutes
# (a figure at this cap reads "at least").
RESTART_CAP_S = 240

# Runs inside a server's container: its own server is the only one it may reach
# (the unit admits the host itself), with the server's own key.
CLIENT = r"""
import json, sys, threading, time, urllib.request
mode, url, count, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
STOP = "/run/thread-binding.stop"
key = open("/etc/specfleet/specfleet-vllm.api-key").read().strip()

def complete(prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(url + "/v1/completions", body,
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.load(answer)["usage"]["completion_tokens"]

def health(timeout):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return time.monotonic() - start
        except Exception:
            time.sleep(0.3)
    return -1.0

if mode == "serve":
    start, made = time.monotonic(), 0
    for index in range(count):
        made += complete(f"Request {index}: the operator checks the fleet and")
    print(json.dumps({"tokens": made, "seconds": time.monotonic() - start}))
elif mode == "trickle":
    import os
    end = time.monotonic() + count
    while time.monotonic() < end and not os.path.exists(STOP):
        try:  # an answer that failed is still load; the trickle must outlive it
            complete("The operator checks")
        except OSError:
            pass
        time.sleep(1)
elif mode == "health":
    print(json.dumps({"seconds": health(count)}))
"""


def sh(host: str, *argv: str, stdin: str = "") -> str:
    """Run argv in a lab host's container, as the lab's tour does: its stdout."""
    return docker_exec(host, list(argv), stdin, timeout=900)


def start_client(host: str, address: str, mode: str, count: int) -> subprocess.Popen[str]:
    """CLIENT in ``host``'s container against its own server, in the background."""
    argv = ["docker", "exec", "-i", host, "python3", "-", mode, f"http://{address}:8000"]
    process = subprocess.Popen(
        [*argv, str(count), str(TOKENS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin is not None
    process.stdin.write(CLIENT)
    process.stdin.close()
    process.stdin = None  # written and closed: communicate() must not flush it
    return process


def run_client(host: str, address: str, mode: str, count: int) -> dict[str, float]:
    """CLIENT in ``host``'s container, waited for: what it printed."""
    process = start_client(host, address, mode, count)
    out, _ = process.communicate()
    assert process.returncode == 0, f"{host}: the client failed ({mode})"
    figures: dict[str, float] = json.loads(out)
    return figures


def restart(host: str) -> None:
    """Restart the server; its start limit (restarts within a window) counts manual
    restarts too, and the benchmark makes many: forget them first."""
    sh(host, "systemctl", "reset-failed", UNIT)
    sh(host, "systemctl", "restart", UNIT)


def apply(servers: dict[str, str], originals: dict[str, str], binds: dict[str, str]) -> None:
    """Write each server's setting into its env file and restart it, one after the other,
    each answering before the next restarts."""
    for host, address in servers.items():
        kept = [line for line in originals[host].splitlines() if not line.startswith(SETTING)]
        text = "\n".join([*kept, f"{SETTING}={binds[host]}"]) + "\n"
        sh(host, "sh", "-c", f"cat > {ENV_FILE}", stdin=text)
        restart(host)
        waited = run_client(host, address, "health", 900)["seconds"]
        assert waited >= 0, f"{host} never answered /health with {SETTING}={binds[host]}"


def measure(servers: dict[str, str]) -> dict[str, float]:
    (first, first_address), (second, second_address) = list(servers.items())[:2]
    alone = run_client(first, first_address, "serve", REQUESTS)
    both_started = time.monotonic()
    other = start_client(second, second_address, "serve", REQUESTS)
    mine = run_client(first, first_address, "serve", REQUESTS)
    theirs = json.loads(other.communicate()[0])
    both_seconds = time.monotonic() - both_started
    # The trickle stops at a file, not a signal: docker exec does not pass one on.
    sh(first, "rm", "-f", "/run/thread-binding.stop")
    trickle = start_client(first, first_address, "trickle", 900)
    time.sleep(3)
    restart(second)
    waited = run_client(second, second_address, "health", RESTART_CAP_S)["seconds"]
    waited = RESTART_CAP_S if waited < 0 else waited
    sh(first, "touch", "/run/thread-binding.stop")
    trickle.wait(timeout=120)
    if waited >= RESTART_CAP_S:  # let it come up before the next figure
        run_client(second, second_address, "health", 900)
    return {
        "alone": alone["tokens"] / alone["seconds"],
        "both": (mine["tokens"] + theirs["tokens"]) / both_seconds,
        "restart": waited,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", type=Path, default=ROOT / "inventory" / "lab" / "hosts.yml")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    inventory = yaml.safe_load(args.inventory.read_text())
    hosts = inventory["all"]["children"]["lab"]["children"]["lab_servers"]["hosts"]
    servers = {name: row["ansible_host"] for name, row in sorted(hosts.items())}
    if len(servers) < 2:
        sys.exit("thread_binding: the lab needs two servers")
    cores = int(sh(next(iter(servers)), "nproc").strip())
    settings = {
        "auto": {host: "auto" for host in servers},
        "nobind": {host: "nobind" for host in servers},
        "a core each": {host: str(index % cores) for index, host in enumerate(servers)},
    }
    originals = {host: sh(host, "cat", ENV_FILE) for host in servers}
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    try:
        for round_number in range(1, args.rounds + 1):
            for name, binds in settings.items():
                apply(servers, originals, binds)
                figures[name].append(measure(servers))
                print(f"round {round_number}, {name}: {figures[name][-1]}", file=sys.stderr)
    finally:
        for host, address in servers.items():
            sh(host, "sh", "-c", f"cat > {ENV_FILE}", stdin=originals[host])
            restart(host)
            run_client(host, address, "health", 900)

    print(f"{len(servers)} servers on {cores} cores, {args.rounds} rounds, median of each:\n")
    print("| setting | alone (tok/s) | both (tok/s) | restart beside a serving server (s) |")
    print("|---|---|---|---|")
    keys = ("alone", "both", "restart")
    base = {key: statistics.median(row[key] for row in figures["auto"]) for key in keys}
    for name, rows in figures.items():
        median = {key: statistics.median(row[key] for row in rows) for key in base}
        cells = [f"{median[key]:.1f} ({median[key] / base[key]:.2f} of auto)" for key in base]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
