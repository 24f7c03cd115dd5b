"""`specfleet status`: playbooks/status.yml's rows, as one table and as JSON.

The playbook hands its findings over as set_stats data (see playbooks/status.yml):
``specfleet_status`` maps each serving host to its row, ``specfleet_loadbalancer`` holds
the first balancer's view of each server, by inventory name. A host the run could not
read (unreachable, failed) has no row: it is listed with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from specfleet.controller.events import PlayResult

ABSENT = "absent"


def fleet_status(result: PlayResult) -> dict[str, Any]:
    """``{"servers": {host: row}, "loadbalancer": {...} | None}`` from the status run."""
    fleet: Mapping[str, Any] = result.data.get("specfleet_fleet") or {}
    rows: Mapping[str, Any] = result.data.get("specfleet_status") or {}
    balancer_host = fleet.get("balancer")
    balancer: Mapping[str, Any] | None = result.data.get("specfleet_loadbalancer")
    backends: Mapping[str, Any] = (balancer or {}).get("backends") or {}
    servers: dict[str, Any] = {}
    for host in fleet.get("servers") or sorted(rows):
        if host in rows:
            row = {"reachable": True, **rows[host]}
        else:
            row = {"reachable": False, "error": _unread(result, host)}
        if balancer_host:
            row["loadbalancer"] = backends.get(host, ABSENT) if balancer else "unknown"
        servers[host] = row
    loadbalancer = None
    if balancer_host:
        loadbalancer = {"host": balancer_host, "reachable": balancer is not None}
        if balancer is None:
            loadbalancer["error"] = _unread(result, balancer_host)
        else:
            loadbalancer |= {k: v for k, v in balancer.items() if k != "backends"}
    return {"servers": servers, "loadbalancer": loadbalancer}


def _unread(result: PlayResult, host: str) -> str:
    tally = result.hosts.get(host)
    if tally and tally.unreachable:
        return "unreachable"
    if tally and tally.failed:
        return "failed"
    return "not read"


def _stack(value: Any) -> str:
    if not isinstance(value, Mapping):
        return str(value)
    digest = str(value.get("hash") or "")[:12]
    return f"{value.get('lock')} {digest} · vLLM {value.get('vllm')}"


def _whitelist(value: Any) -> str:
    if not isinstance(value, Mapping):
        return str(value)
    entries = value.get("entries") or []
    return f"{value.get('shape')}, {len(entries)} entries" if entries else str(value.get("shape"))


def _unit(value: Any, stack: Any = None) -> Text:
    if not isinstance(value, Mapping):
        return Text(str(value), style="red")
    text = f"{value.get('active')}/{value.get('sub')}"
    if value.get("main_pid"):
        text += f" pid {value['main_pid']}"
    text += f", {value.get('restarts', 0)} restarts"
    # What its processes run, when it is not the one venv the stack manifest names.
    runs = value.get("runs_from")
    expected = [str(stack.get("hash"))] if isinstance(stack, Mapping) else None
    mixed = runs is not None and value.get("main_pid") and runs != expected
    if mixed:
        text += f", runs code from {', '.join(runs) or 'no venv'}"
    healthy = value.get("active") == "active" and not mixed
    return Text(text, style="green" if healthy else "red")


def _acceptance(value: Any) -> str:
    if not isinstance(value, Mapping):
        return str(value)
    length = value.get("mean_acceptance_length")
    if length is None:
        return "no drafts yet"
    return f"{length:.2f} ({value.get('drafts')} drafts)"


def _balancer(value: Any) -> str:
    if not isinstance(value, Mapping):
        return str(value)
    sessions, queued = value.get("sessions", 0), value.get("queued", 0)
    return f"{value.get('status')}, {sessions} sessions, {queued} queued"


def status_table(status: Mapping[str, Any]) -> Table:
    """One row per serving host; "absent" where a part is missing."""
    balancer = status.get("loadbalancer")
    table = Table(title="specfleet status", title_justify="left")
    table.add_column("host", no_wrap=True)
    for column in ("stack", "whitelist", "drafter", "unit", "health", "acceptance"):
        table.add_column(column, overflow="fold")
    if balancer:
        table.add_column(f"balancer ({balancer.get('host')})", overflow="fold")
    for host, row in status.get("servers", {}).items():
        if not row.get("reachable"):
            cells: list[Any] = [Text(str(row.get("error")), style="bold red"), *[""] * 5]
        else:
            health = str(row.get("health"))
            cells = [
                _stack(row.get("stack")),
                _whitelist(row.get("whitelist")),
                str(row.get("drafter"))[:12],
                _unit(row.get("unit"), row.get("stack")),
                Text(health, style="green" if health == "ok" else "red"),
                _acceptance(row.get("acceptance")),
            ]
        if balancer:
            cells.append(_balancer(row.get("loadbalancer")))
        table.add_row(host, *cells)
    if not status.get("servers"):
        table.caption = "no serving hosts (the inventory's gpu_hosts group is empty)"
    elif balancer and balancer.get("reachable"):
        table.caption = _refusals(balancer.get("refusals") or {})
    return table


def _refusals(counts: Mapping[str, int]) -> str:
    """What the front door refused since HAProxy started, by reason."""
    if not counts:
        return "front door: nothing refused since the balancer started"
    by_reason = ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))
    return f"front door refused, since the balancer started: {by_reason}"
