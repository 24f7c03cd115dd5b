"""The end of `lab up`: what the lab serves, one real completion through it (through its
balancer when it has one) and the speculative counters that completion moved."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ansible_runner
from ansible_runner.exceptions import AnsibleRunnerException

from specfleet.controller.playbook import runner_env
from specfleet.controller.runopts import RunOptions
from specfleet.host import metrics

PROMPT = "A speculative decoder drafts a few tokens, and the target model"
MAX_TOKENS = 32
#: What the lab's Prometheus graph link shows: acceptance by draft position, per server.
GRAPH = "instance:vllm_spec_decode_acceptance_by_position:ratio_rate"

NEXT_COMMANDS = (
    "specfleet status                 # what each host serves, its health and acceptance",
    "specfleet train                  # train a drafter on the lab and publish it",
    "specfleet lab down               # remove the lab",
)

# Lab hosts are containers on this machine, on a network it reaches. With a
# balancer the request goes from here to its front door, as a user's would,
# with the lab's client key. Without one the server admits only its own host
# (IPAddressAllow=), so the request is sent from inside its container with
# `docker exec`: a fraction of a second, where an ad-hoc Ansible call costs
# seconds of startup and would carry the API key in its module arguments
# (event data, the log). Either way the key goes over standard input, never
# on a command line.
_COMPLETE = """\
import json, ssl, sys, urllib.request
url, model, prompt, max_tokens = sys.argv[1:5]
key = sys.stdin.read().strip()
body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens),
        "temperature": 0, "ignore_eos": True}
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
# The lab balancer's certificate is self-signed.
context = ssl._create_unverified_context()
request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
with urllib.request.urlopen(request, timeout=300, context=context) as response:
    print(response.read().decode())
"""
_COUNTED = (metrics.DRAFTS, metrics.DRAFT_TOKENS, metrics.ACCEPTED)


class TourError(Exception):
    pass


#: Runs argv in a lab host's container: (container, argv, stdin, timeout) -> stdout.
ExecIn = Callable[[str, list[str], str, float], str]


def docker_exec(container: str, argv: list[str], stdin: str = "", timeout: float = 330) -> str:
    result = subprocess.run(
        ["docker", "exec", "-i", container, *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise TourError(f"docker exec {container}: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def _hostvars(options: RunOptions) -> dict[str, dict[str, Any]]:
    """Each host's inventory variables as Ansible resolves them (group_vars included)."""
    env = runner_env()
    # get_inventory looks ansible-inventory up on this process's PATH (run() uses envvars'):
    # make it the project venv's, as for ansible-playbook.
    # Its artifacts hold the whole inventory (the API key, decrypted vault values): a
    # private folder removed at once, not ansible-runner's default one left in /tmp.
    with (
        _environ_path(env["PATH"]),
        tempfile.TemporaryDirectory(prefix="specfleet-inventory-") as private,
    ):
        response, error = ansible_runner.get_inventory(
            action="list",
            inventories=options.inventory_sources(),
            response_format="json",
            vault_password_file=options.vault_password_file,
            envvars=env,
            private_data_dir=private,
            quiet=True,
        )
    if not isinstance(response, dict):
        raise TourError(f"ansible-inventory --list: {error or response}")
    return dict((response.get("_meta") or {}).get("hostvars") or {})


@contextlib.contextmanager
def _environ_path(path: str) -> Iterator[None]:
    previous = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = previous


def _counters(exec_in: ExecIn, container: str, row: Mapping[str, Any]) -> dict[str, float]:
    stack = row["stack"]
    argv = [
        "env",
        f"PYTHONPATH={stack['pythonpath']}",
        stack["python"],
        "-m",
        "specfleet.host.metrics",
        f"{row['endpoint']}/metrics",
    ]
    values = json.loads(exec_in(container, argv, "", 60))
    return {name: float(values.get(name, 0)) for name in _COUNTED}


def tour(
    options: RunOptions, status: Mapping[str, Any], exec_in: ExecIn = docker_exec
) -> dict[str, Any]:
    """What the lab serves, and one real completion through it with its counters."""
    servers = {
        host: row
        for host, row in status.get("servers", {}).items()
        if row.get("reachable") and row.get("health") == "ok"
    }
    summary: dict[str, Any] = {
        "servers": [
            {
                "host": host,
                "endpoint": row.get("endpoint"),
                "model": row.get("model"),
                "drafter": row.get("drafter"),
                "health": row.get("health"),
            }
            for host, row in status.get("servers", {}).items()
        ],
        # With the lab's own inventory when it is not the default (inventory/lab-smollm2).
        "next": [
            command.split("#")[0].strip()
            + "".join(f" -i {shlex.quote(source)}" for source in options.inventories)
            for command in NEXT_COMMANDS
        ],
    }
    # The lab's Prometheus (its `monitoring` host), as status read it.
    prometheus = status.get("prometheus") or {}
    if prometheus.get("url"):
        summary["prometheus"] = {
            "url": prometheus["url"],
            "ready": bool(prometheus.get("ready")),
            "graph": f"{prometheus['url']}/graph?" + urllib.parse.urlencode({"g0.expr": GRAPH}),
        }
    if not servers:
        summary["completion"] = {"error": "no server answers its health check"}
        return summary
    try:
        summary["completion"] = _complete(options, servers, status.get("loadbalancer"), exec_in)
    except (
        TourError,
        AnsibleRunnerException,
        KeyError,
        ValueError,
        OSError,
        subprocess.TimeoutExpired,
    ) as error:
        summary["completion"] = {"error": str(error)}
    return summary


def _complete(
    options: RunOptions,
    servers: Mapping[str, Mapping[str, Any]],
    balancer: Mapping[str, Any] | None,
    exec_in: ExecIn,
) -> dict[str, Any]:
    hostvars = _hostvars(options)
    # playbooks/lab.yml names each container after its inventory host.
    first = next(iter(servers))
    model = str(servers[first]["model"])
    request = ["-c", _COMPLETE]
    if balancer and balancer.get("reachable"):
        # The front door, from here: the address and client key a user of the lab has.
        via = str(balancer["host"])
        scheme = "https" if balancer.get("tls") else "http"
        url = f"{scheme}://{balancer.get('address') or via}:{balancer.get('port')}"
        api_key = str((hostvars.get(via) or {}).get("lab_client_api_key") or "")
        send: ExecIn = run_here
        argv = [sys.executable, *request]
    else:
        # No balancer: the server admits only its own host, so ask from inside it.
        via, url = first, str(servers[first]["endpoint"])
        api_key = str((hostvars.get(first) or {}).get("specfleet_server_api_key") or "")
        send, argv = exec_in, ["python3", *request]
    before = {h: _counters(exec_in, h, row) for h, row in servers.items()}
    answer = json.loads(send(via, [*argv, url, model, PROMPT, str(MAX_TOKENS)], api_key, 330))
    after = {h: _counters(exec_in, h, row) for h, row in servers.items()}
    moved = {
        name: int(sum(after[host][name] - before[host][name] for host in servers))
        for name in _COUNTED
    }
    drafts = moved[metrics.DRAFTS]
    accepted = moved[metrics.ACCEPTED]
    return {
        "via": via,
        "url": url,
        "model": model,
        "prompt": PROMPT,
        "text": (answer.get("choices") or [{}])[0].get("text", ""),
        "completion_tokens": int((answer.get("usage") or {}).get("completion_tokens", 0)),
        "drafts": drafts,
        "draft_tokens": moved[metrics.DRAFT_TOKENS],
        "accepted_tokens": accepted,
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
        "curl": curl_line(url, model, api_key) if send is run_here else None,
    }


def curl_line(url: str, model: str, api_key: str) -> str:
    """The same request as a command to paste (-k: the lab's certificate is self-signed)."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS})
    words = ["curl", "-sk", f"{url}/v1/completions", "-H", "Content-Type: application/json"]
    if api_key:
        words += ["-H", f"Authorization: Bearer {api_key}"]
    return shlex.join([*words, "-d", body])


def run_here(_host: str, argv: list[str], stdin: str = "", timeout: float = 330) -> str:
    """``argv`` on this machine (the controller reaches the lab's front door)."""
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise TourError(f"{' '.join(argv[:2])}: {(result.stderr or result.stdout).strip()}")
    return result.stdout
