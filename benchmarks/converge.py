"""Re-provisioning speed: a no-op `site.yml`, through its fast path and through the full
converge, next to a facts-only play, on a lab of its own.

Run it on a controller (after `bin/bootstrap`, with Docker; nothing else running)::

    .venv/bin/python benchmarks/converge.py [--servers 4] [--rounds 3] [--mitogen] [--keep] [--json]
    .venv/bin/python benchmarks/converge.py --reuse /tmp/specfleet-converge-XXXX/hosts.yml

It brings up a lab of ``--servers`` vLLM servers behind a balancer (its own names,
``bench-lab-*``, network and key, so a running lab is left alone) with `specfleet lab up`,
timing that first converge; then, in one run, over the same SSH connections, it measures
(each figure the median of ``--rounds``):

* facts only: ``ansible HOSTS -m setup`` (what the issue's 1.52 s was);
* a no-op ``ansible-playbook playbooks/site.yml`` on every lab host (it must report
  changed=0), and its ratio to facts only: through the full converge
  (``-e specfleet_converge_full=true``, what ``specfleet provision --full`` runs) and through
  the fast path (every host's last full converge still holds: one call each);
* the same no-op converges limited to one server and to all servers (fork scaling, in wall
  time and in the controller's CPU seconds), beside the same ratio for facts only
  (Ansible's one-task play: the best this machine allows);
* the tasks each host ran and the ten slowest tasks of the no-op converge
  (ansible.posix.profile_tasks);
* for each no-op converge, the CPU seconds the controller used and the whole machine's
  busy CPU seconds (/proc/stat) against its cores' wall time: on a small machine that runs
  the controller and every lab host, fork scaling ends where the cores are all busy;
* with ``--mitogen``, the facts-only and the no-op figures again under Mitogen's strategy
  (``ANSIBLE_STRATEGY=mitogen_linear``, plugins/strategy/), side by side.

Before measuring it waits (up to 10 min) until the machine's cores are less than 15 % busy:
servers that `lab up` just started compile and warm up for minutes. The lab is removed at
the end unless ``--keep``; ``--reuse`` measures a kept lab again (no `lab up`) and keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
PREFIX = "bench-lab-"
SUBNET = "172.30.243"
CORES = os.cpu_count() or 1


def _inventory(folder: Path, servers: int) -> Path:
    """The lab inventory with ``servers`` servers of the benchmark's own."""
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", folder / "group_vars")
    hosts = {
        f"{PREFIX}{index:02d}": {"ansible_host": f"{SUBNET}.{10 + index}"}
        for index in range(1, servers + 1)
    }
    inventory = {
        "all": {
            "children": {
                "lab": {
                    "vars": {"lab_network": f"{PREFIX}net", "lab_subnet": f"{SUBNET}.0/24"},
                    "children": {
                        "lab_servers": {"hosts": hosts},
                        "loadbalancers": {
                            "hosts": {f"{PREFIX}lb": {"ansible_host": f"{SUBNET}.10"}}
                        },
                    },
                },
                "gpu_hosts": {"children": {"lab_servers": {}}},
                "drafter_trainers": {"hosts": {f"{PREFIX}01": {}}},
            }
        }
    }
    path = folder / "hosts.yml"
    path.write_text(json.dumps(inventory, indent=1))  # JSON is YAML
    return path


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{BIN}:{os.environ['PATH']}",
        # Enough for the ten slowest tasks in profile_tasks' recap.
        "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "10",
        **extra,
    }


def _machine_busy_s() -> float:
    """CPU seconds this machine's cores have been busy (every process: the controller, the
    containers' sshd, Python and vLLM servers), from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _controller_cpu_s() -> float:
    """CPU seconds of the finished child processes (ansible-playbook and its workers, ssh)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait_until_quiet(limit_s: float = 600, share: float = 0.15) -> float:
    """Wait until the machine's cores are busy less than ``share`` of 5 s (at most
    ``limit_s``); return that share. Servers just (re)started by `lab up` compile and warm up
    for minutes: a converge measured beside them measures them."""
    deadline = time.monotonic() + limit_s
    while True:
        busy = _machine_busy_s()
        time.sleep(5)
        measured = (_machine_busy_s() - busy) / (5 * CORES)
        if measured < share or time.monotonic() > deadline:
            return round(measured, 2)


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str, float, float]:
    """Wall seconds, stdout, the controller's CPU seconds and the whole machine's busy CPU
    seconds of one run: on a machine whose cores are all busy, more forks cannot help."""
    busy, controller = _machine_busy_s(), _controller_cpu_s()
    start = time.perf_counter()
    run = subprocess.run(
        argv, cwd=ROOT, env=_env(**env), capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    if run.returncode != 0:
        sys.exit(
            f"{' '.join(argv)} failed (rc {run.returncode}):\n{run.stdout[-4000:]}{run.stderr}"
        )
    return elapsed, run.stdout, _controller_cpu_s() - controller, _machine_busy_s() - busy


_RECAP = re.compile(
    r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
)
_PROFILE = re.compile(r"^(.+?) -{2,} (\d+\.\d+)s$")


def _recap(output: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for line in output.splitlines():
        match = _RECAP.match(line)
        if match:
            ok, changed, unreachable, failed, skipped = map(int, match.groups()[1:])
            hosts[match[1]] = {
                "tasks": ok + failed + skipped,
                "changed": changed,
                "failed": failed + unreachable,
            }
    return hosts


def _slowest(output: str) -> list[tuple[str, float]]:
    tail = output.split("TASKS RECAP", 1)[-1]
    return [(m[1].strip(), float(m[2])) for m in map(_PROFILE.match, tail.splitlines()) if m]


def _median(argv: list[str], rounds: int, env: dict[str, str]) -> dict[str, Any]:
    """The medians of wall time, controller CPU and machine CPU; the last round's output."""
    runs = [_timed(argv, env) for _ in range(rounds)]
    return {
        "seconds": round(statistics.median(run[0] for run in runs), 2),
        "output": runs[-1][1],
        "controller_cpu_s": round(statistics.median(run[2] for run in runs), 2),
        "machine_cpu_s": round(statistics.median(run[3] for run in runs), 2),
    }


def _no_op(
    inventory: Path, limit: str, rounds: int, env: dict[str, str], full: bool = False
) -> dict[str, Any]:
    """A converge that must change nothing: by default each host's fast path (its last full
    converge still holds), with ``full`` the whole converge (`specfleet provision --full`),
    which records each host again at its end."""
    argv = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        "playbooks/site.yml",
        "--limit",
        limit,
        *(["-e", "specfleet_converge_full=true"] if full else []),
    ]
    run = _median(argv, rounds, env)
    output = run.pop("output")
    hosts = _recap(output)
    changed = {host: tally["changed"] for host, tally in hosts.items() if tally["changed"]}
    if changed or any(tally["failed"] for tally in hosts.values()):
        sys.exit(f"the converge on {limit} was not a no-op: {hosts}\n{output[-4000:]}")
    return {**run, "hosts": hosts, "slowest": _slowest(output)}


def _facts(inventory: Path, limit: str, rounds: int, env: dict[str, str]) -> float:
    argv = [str(BIN / "ansible"), limit, "-i", str(inventory), "-m", "ansible.builtin.setup"]
    return float(_median(argv, rounds, env)["seconds"])


def _lab(inventory: Path, action: str) -> float:
    start = time.perf_counter()
    argv = [str(BIN / "specfleet"), "lab", action, "-i", str(inventory), "--json"]
    run = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"specfleet lab {action} failed (rc {run.returncode}): {run.stdout[-3000:]}")
    return round(time.perf_counter() - start, 1)


def _cpu(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "controller_cpu_s": run["controller_cpu_s"],
        "machine_cpu_s": run["machine_cpu_s"],
        "machine_busy_share": round(run["machine_cpu_s"] / (run["seconds"] * CORES), 2),
    }


def _figures(inventory: Path, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    """Facts only, and no-op converges through the full converge and through the fast path,
    over one connection setting, in one go. The full runs come first: each records the
    hosts again, so the fast runs after them find every record in force."""
    one = f"{PREFIX}01"
    figures: dict[str, Any] = {
        "facts_all_s": _facts(inventory, "lab", rounds, env),
        "facts_one_s": _facts(inventory, one, rounds, env),
        "facts_all_servers_s": _facts(inventory, "lab_servers", rounds, env),
    }
    runs = {
        "full_every_host": _no_op(inventory, "lab", rounds, env, full=True),
        "full_one_server": _no_op(inventory, one, rounds, env, full=True),
        "full_all_servers": _no_op(inventory, "lab_servers", rounds, env, full=True),
        "fast_every_host": _no_op(inventory, "lab", rounds, env),
        "fast_one_server": _no_op(inventory, one, rounds, env),
        "fast_all_servers": _no_op(inventory, "lab_servers", rounds, env),
    }
    for name, run in runs.items():
        figures[f"no_op_{name}_s"] = run["seconds"]
    # Where fork scaling stops here: the cores' busy time against wall time x cores.
    figures["cpu"] = {name: _cpu(run) for name, run in runs.items()}
    for path in ("full", "fast"):
        every, one_server, servers = (
            runs[f"{path}_every_host"],
            runs[f"{path}_one_server"],
            runs[f"{path}_all_servers"],
        )
        figures[f"{path}_ratio_to_facts"] = round(every["seconds"] / figures["facts_all_s"], 2)
        figures[f"{path}_fork_scaling"] = round(servers["seconds"] / one_server["seconds"], 2)
        # In the controller's CPU seconds: a measure the shared cores do not distort.
        figures[f"{path}_fork_scaling_controller_cpu"] = round(
            servers["controller_cpu_s"] / one_server["controller_cpu_s"], 2
        )
        figures[f"{path}_tasks_per_host"] = {h: t["tasks"] for h, t in every["hosts"].items()}
        figures[f"{path}_slowest_tasks"] = every["slowest"]
    # The same ratio for Ansible's own one-task play: what this machine allows at best.
    figures["facts_fork_scaling"] = round(
        figures["facts_all_servers_s"] / figures["facts_one_s"], 2
    )
    return figures


def measure(
    servers: int, rounds: int, keep: bool, mitogen: bool, reuse: Path | None = None
) -> dict[str, Any]:
    """The figures on a new lab of ``servers`` servers, or on the kept lab of ``reuse`` (an
    inventory an earlier ``--keep`` printed), which is kept."""
    folder = reuse.parent if reuse else Path(tempfile.mkdtemp(prefix="specfleet-converge-"))
    inventory = reuse or _inventory(folder, servers)
    keep = keep or reuse is not None
    report: dict[str, Any] = {"servers": servers, "rounds": rounds, "first_lab_up_s": None}
    try:
        if not reuse:
            report["first_lab_up_s"] = _lab(inventory, "up")
        report["idle_share_before"] = _wait_until_quiet()
        report["ssh"] = _figures(inventory, rounds, {})
        if mitogen:
            # Mitogen checks host keys itself and ignores the lab inventory's ssh options
            # that turn the check off; the lab's containers have no known host keys.
            mitogen_env = {
                "ANSIBLE_STRATEGY": "mitogen_linear",
                "ANSIBLE_HOST_KEY_CHECKING": "False",
            }
            report["mitogen"] = _figures(inventory, rounds, mitogen_env)
    finally:
        if keep:
            report["inventory"] = str(inventory)  # `specfleet lab down -i` it when done
        else:
            _lab(inventory, "down")
            shutil.rmtree(folder, ignore_errors=True)
    return report


def _print(report: dict[str, Any]) -> None:
    servers = report["servers"]
    print(f"lab: {servers} servers + 1 balancer over SSH; medians of {report['rounds']} rounds")
    if report["first_lab_up_s"] is not None:
        print(f"  first `specfleet lab up`                 {report['first_lab_up_s']:8.1f} s")
    print(f"  cores busy before measuring (idle lab)   {report['idle_share_before']:8.0%}")
    if "inventory" in report:
        print(f"  kept: `specfleet lab down -i {report['inventory']}` removes it")
    for strategy in ("ssh", "mitogen"):
        figures = report.get(strategy)
        if not figures:
            continue
        print(f"{strategy}:")
        print(f"  facts only (setup), every host           {figures['facts_all_s']:8.2f} s")
        print(f"  facts only, one server                   {figures['facts_one_s']:8.2f} s")
        print(
            f"  facts only, {servers} servers                  "
            f"{figures['facts_all_servers_s']:8.2f} s   {figures['facts_fork_scaling']}x one server"
        )
        for path, title in (("full", "full converge (--full)"), ("fast", "fast path")):
            print(f"  no-op site.yml, {title}:")
            print(
                f"    every host                             "
                f"{figures[f'no_op_{path}_every_host_s']:8.2f} s"
                f"   {figures[f'{path}_ratio_to_facts']}x facts only"
            )
            print(
                f"    one server                             "
                f"{figures[f'no_op_{path}_one_server_s']:8.2f} s"
            )
            print(
                f"    {servers} servers                              "
                f"{figures[f'no_op_{path}_all_servers_s']:8.2f} s"
                f"   {figures[f'{path}_fork_scaling']}x one server in wall time,"
                f" {figures[f'{path}_fork_scaling_controller_cpu']}x in controller CPU"
            )
            for where in ("every_host", "one_server", "all_servers"):
                cpu = figures["cpu"][f"{path}_{where}"]
                print(
                    f"    CPU, {where.replace('_', ' '):<12}"
                    f" controller {cpu['controller_cpu_s']:6.2f} s,"
                    f" whole machine {cpu['machine_cpu_s']:6.2f} s"
                    f" ({cpu['machine_busy_share']:.0%} of {CORES} cores' wall time)"
                )
            tasks = ", ".join(f"{h} {n}" for h, n in figures[f"{path}_tasks_per_host"].items())
            print(f"    tasks per host: {tasks}")
            print("    ten slowest tasks (profile_tasks, last round):")
            for name, seconds in figures[f"{path}_slowest_tasks"]:
                print(f"      {seconds:6.2f} s  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=4, help="vLLM servers in the lab (4)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per figure; the median (3)")
    parser.add_argument("--keep", action="store_true", help="leave the lab running")
    parser.add_argument(
        "--mitogen", action="store_true", help="measure under Mitogen's strategy too"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        metavar="INVENTORY",
        help="measure the lab an earlier --keep left (its hosts.yml), without `lab up`",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)
    servers = args.servers
    if args.reuse:
        hosts = json.loads(args.reuse.read_text())["all"]["children"]["lab"]["children"]
        servers = len(hosts["lab_servers"]["hosts"])
    report = measure(servers, args.rounds, args.keep, args.mitogen, args.reuse)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
