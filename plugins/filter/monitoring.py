"""Jinja2 filter ``monitoring_targets``: what the fleet's Prometheus scrapes, and where.

The monitoring role gives it the servers' and the balancers' host variables. Behind a
balancer, every server's ``/metrics`` is read through the first balancer's metrics listener
(``/servers/<name>/metrics`` on ``specfleet_metrics_port``): the servers admit only the
balancer, and the listener answers the monitoring addresses for metrics alone. Each
balancer's own exporter (``/metrics`` there) is a target too. Without a balancer the servers
are scraped at their own address and port.

Each target: ``{"job": "vllm" | "haproxy", "instance": <inventory name>, "address":
"host:port", "metrics_path": "/..."}``; ``instance`` is the inventory name, so rules,
alerts and ``specfleet status`` speak of hosts as the inventory does.

Example::

    {{ [hostvars['gpu-01']] | monitoring_targets([hostvars['lb']], '127.0.0.1', 8000, 8405) }}
    -> [{'job': 'vllm', 'instance': 'gpu-01', 'address': '10.0.0.10:8405',
         'metrics_path': '/servers/gpu-01/metrics'},
        {'job': 'haproxy', 'instance': 'lb', 'address': '10.0.0.10:8405',
         'metrics_path': '/metrics'}]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from specfleet.host.metrics import finite


def _dialled(host: Mapping[str, Any]) -> str:
    """The address the controller's inventory reaches a host at."""
    return str(host.get("ansible_host") or host["inventory_hostname"])


def _joined(address: str, port: Any) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def monitoring_targets(
    servers: Sequence[Mapping[str, Any]],
    balancers: Sequence[Mapping[str, Any]],
    server_address: str,
    server_port: int,
    metrics_port: int,
) -> list[dict[str, str]]:
    """The scrape targets (see the module's docstring); the defaults stand for the project's
    settings where a host's inventory does not set its own."""
    if not servers:
        raise AnsibleFilterError("monitoring: the server group has no hosts: nothing to scrape")
    targets: list[dict[str, str]] = []
    if balancers:
        door = balancers[0]
        door_address = _joined(_dialled(door), door.get("specfleet_metrics_port", metrics_port))
        for server in servers:
            name = str(server["inventory_hostname"])
            targets.append(
                {
                    "job": "vllm",
                    "instance": name,
                    "address": door_address,
                    "metrics_path": f"/servers/{name}/metrics",
                }
            )
    else:
        for server in servers:
            address = str(server.get("specfleet_server_address", server_address))
            if address in ("0.0.0.0", "::", ""):
                address = _dialled(server)
            port = server.get("specfleet_server_port", server_port)
            targets.append(
                {
                    "job": "vllm",
                    "instance": str(server["inventory_hostname"]),
                    "address": _joined(address, port),
                    "metrics_path": "/metrics",
                }
            )
    for balancer in balancers:
        targets.append(
            {
                "job": "haproxy",
                "instance": str(balancer["inventory_hostname"]),
                "address": _joined(
                    _dialled(balancer), balancer.get("specfleet_metrics_port", metrics_port)
                ),
                "metrics_path": "/metrics",
            }
        )
    return targets


def monitoring_status(answers: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """`specfleet status`'s view of Prometheus from the results of three instant queries, in
    order: ``up{job="vllm"}``, each server's mean acceptance length, its acceptance by
    position (roles/monitoring/tasks/status.yml)."""
    up, lengths, positions = answers
    by_position: dict[str, dict[int, float | None]] = {}
    for sample in positions:
        labels = sample["metric"]
        by_position.setdefault(labels["instance"], {})[int(labels["position"])] = finite(
            sample["value"][1]
        )
    return {
        "ready": True,
        "up": {s["metric"]["instance"]: int(float(s["value"][1])) for s in up},
        "acceptance": {s["metric"]["instance"]: finite(s["value"][1]) for s in lengths},
        "by_position": {
            host: [values[position] for position in sorted(values)]
            for host, values in sorted(by_position.items())
        },
    }


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"monitoring_targets": monitoring_targets, "monitoring_status": monitoring_status}
