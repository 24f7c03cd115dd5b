"""Jinja2 filters of site.yml's fast path (plugins/modules/specfleet_converged.py).

``fast_path_report``: which hosts of the play end at once, from each host's check, and why
the others do not. A host
whose own check found nothing changed still takes the full converge when a host it works
with does:

- a server, when a balancer does (the servers' rollout reads the balancer's state, and a
  server an interrupted rollout left out of rotation is put back by its own play);
- a balancer or Prometheus, when a server or a balancer does (their configuration names
  every server, and a server's restart drains and enables it at the balancer).

``merged_manages``: what the roles that ran on a host manage, as one mapping of lists
(each role says so in a fact of its own, ``__<role>_manages``).

Example::

    {{ hostvars | fast_path_report(ansible_play_hosts_all, groups) }}
    {{ query('ansible.builtin.varnames', '^__[a-z0-9_]+_manages$')
       | map('extract', hostvars[inventory_hostname]) | merged_manages }}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def fast_path_report(
    hostvars: Mapping[str, Any],
    play_hosts: Iterable[str],
    groups: Mapping[str, Iterable[str]],
    result: str = "__specfleet_converged",
) -> dict[str, dict[str, Any]]:
    """For each host of the play: whether it ends here, and why not (its own check's
    drift, or the hosts it works with that take the full converge)."""
    hosts = list(play_hosts)
    checks = {host: hostvars[host].get(result) or {} for host in hosts}
    converged = {host for host, check in checks.items() if check.get("converged") is True}
    servers = set(groups.get("gpu_hosts", [])) & set(hosts)
    balancers = set(groups.get("loadbalancers", [])) & set(hosts)
    report = {}
    for host in sorted(hosts):
        if host not in converged:
            why = list(checks[host].get("drift") or ["no check (unreachable or failed)"])
        else:
            waits_for = (balancers if host in servers else balancers | servers) - converged
            why = [f"{other} takes the full converge" for other in sorted(waits_for)]
        report[host] = {"ends_here": not why, "why": why}
    return report


def merged_manages(declarations: Iterable[Mapping[str, Iterable[str]]]) -> dict[str, list[str]]:
    merged: dict[str, set[str]] = {}
    for declaration in declarations:
        if not isinstance(declaration, Mapping):
            raise AnsibleFilterError(f"a role's manages must be a mapping, got {declaration!r}")
        for kind, values in declaration.items():
            if isinstance(values, str):
                raise AnsibleFilterError(f"manages {kind}: a list, not the text {values!r}")
            merged.setdefault(kind, set()).update(str(value) for value in values)
    return {kind: sorted(values) for kind, values in sorted(merged.items())}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"fast_path_report": fast_path_report, "merged_manages": merged_manages}
