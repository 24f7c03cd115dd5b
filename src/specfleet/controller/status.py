"""`specfleet status`: playbooks/status.yml's rows, as one table and as JSON.

The playbook hands its findings over as set_stats data (see playbooks/status.yml):
``specfleet_status`` maps each serving host to its row, ``specfleet_loadbalancer`` holds
the first balancer's view of each server, by inventory name, and, when the inventory has a
``monitoring`` group, ``specfleet_prometheus`` holds the mean acceptance length of each server
over a recent window, from Prometheus. A host the run could not read (unreachable, failed)
has no row: it is listed with that reason.

A serving host is healthy when it was read, its unit is active, its processes run the
stack's venv and its ``/health`` answers ok; ``unhealthy_reasons`` says what is wrong
otherwise, for the table and for the exit code (5, `specfleet status`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table
from rich.text import Text

from specfleet.controller.events import PlayResult
from specfleet.host.metrics import finite

ABSENT = "absent"


def fleet_status(result: PlayResult) -> dict[str, Any]:
    """``{"servers": {host: row}, "loadbalancer": {...} | None, "prometheus": {...} | None,
    "unhealthy_hosts": [host, ...]}`` from the status run."""
    fleet: Mapping[str, Any] = result.data.get("specfleet_fleet") or {}
    rows: Mapping[str, Any] = result.data.get("specfleet_status") or {}
    balancer_host = fleet.get("balancer")
    balancer: Mapping[str, Any] | None = result.data.get("specfleet_loadbalancer")
    backends: Mapping[str, Any] = (balancer or {}).get("backends") or {}
    scraped: Mapping[str, Any] | None = result.data.get("specfleet_prometheus")
    servers: dict[str, Any] = {}
    for host in fleet.get("servers") or sorted(rows):
        if host in rows:
            row = {"reachable": True, **rows[host]}
            window = _acceptance_window(scraped, host)
            if window is not None:
                row["acceptance_window"] = window
            row["unhealthy"] = unhealthy_reasons(row)
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
    return {
        "servers": servers,
        "loadbalancer": loadbalancer,
        "prometheus": _prometheus(scraped),
        "unhealthy_hosts": sorted(host for host, row in servers.items() if unhealthy_reasons(row)),
    }


def fleet_unhealthy(status: Mapping[str, Any] | None) -> bool:
    """Whether a serving host of `fleet_status`'s answer is not healthy (exit code 5)."""
    return bool((status or {}).get("unhealthy_hosts"))


def unhealthy_reasons(row: Mapping[str, Any]) -> list[str]:
    """What keeps a serving host's row from healthy, in words; none when it is healthy:
    read, its unit active, its processes on the stack's venv, and its /health ok."""
    if not row.get("reachable"):
        return [str(row.get("error") or "not read")]
    reasons = _unit_reasons(row.get("unit"), row.get("stack"))
    health = row.get("health")
    if health != "ok":
        reasons.append(f"health {health}")
    return reasons


def _unit_reasons(unit: Any, stack: Any) -> list[str]:
    if not isinstance(unit, Mapping):
        return [f"unit {unit}"]
    reasons = []
    if unit.get("active") != "active":
        reasons.append(f"unit {unit.get('active')}/{unit.get('sub')}")
    foreign = _foreign_venvs(unit, stack)
    if foreign is not None:
        reasons.append(f"runs code from {', '.join(foreign) or 'no venv'}, not the stack's venv")
    return reasons


def _foreign_venvs(unit: Mapping[str, Any], stack: Any) -> list[str] | None:
    """The venvs the unit's processes run code from, when that is not the one venv the stack
    manifest names; None when it is (or when no process runs)."""
    runs = unit.get("runs_from")
    expected = [str(stack.get("hash"))] if isinstance(stack, Mapping) else None
    if runs is None or not unit.get("main_pid") or runs == expected:
        return None
    return [str(venv) for venv in runs]


def _prometheus(scraped: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Where the acceptance window came from, or why it did not (None: no monitoring)."""
    if scraped is None:
        return None
    ready = bool(scraped.get("ready"))
    error = scraped.get("error")
    if not ready and not error:
        error = "not ready"
    return {
        "host": scraped.get("host"),
        "url": scraped.get("url"),
        "ready": ready,
        "window": scraped.get("window"),
        "error": None if ready else str(error),
    }


def _acceptance_window(scraped: Mapping[str, Any] | None, host: str) -> dict[str, Any] | None:
    """The host's mean acceptance length over Prometheus's window, when Prometheus has it."""
    if not scraped or not scraped.get("ready"):
        return None
    lengths: Mapping[str, Any] = scraped.get("acceptance") or {}
    if host not in lengths:
        return None
    window: dict[str, Any] = {
        "mean_acceptance_length": finite(lengths[host]),
        "window": scraped.get("window"),
        "source": "prometheus",
    }
    by_position = (scraped.get("by_position") or {}).get(host)
    if isinstance(by_position, list):
        window["by_position"] = [finite(rate) for rate in by_position]
    up = (scraped.get("up") or {}).get(host)
    if up is not None:
        window["up"] = finite(up) == 1
    return window


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


def _eagle3(whitelist: Any, preflight: Any) -> str:
    """The preflight's verdict on what is served, what it could not check, the whitelist."""
    if not isinstance(preflight, Mapping) and not isinstance(whitelist, Mapping):
        return "absent"
    verdict = "no preflight"
    if isinstance(preflight, Mapping):
        verdict = str(preflight.get("verdict"))
        unverified = preflight.get("unverified") or []
        if unverified:
            verdict += f" (unverified: {', '.join(unverified)})"
    return f"{verdict} · whitelist {_whitelist(whitelist)}"


def _unit(value: Any, stack: Any = None) -> Text:
    if not isinstance(value, Mapping):
        return Text(str(value), style="red")
    text = f"{value.get('active')}/{value.get('sub')}"
    if value.get("main_pid"):
        text += f" pid {value['main_pid']}"
    text += f", {value.get('restarts', 0)} restarts"
    # What its processes run, when it is not the one venv the stack manifest names.
    foreign = _foreign_venvs(value, stack)
    if foreign is not None:
        text += f", runs code from {', '.join(foreign) or 'no venv'}"
    return Text(text, style="red" if _unit_reasons(value, stack) else "green")


def _acceptance(value: Any, window: Any = None) -> str:
    """The window's figure (Prometheus) first, when there is one, then the one since start."""
    if not isinstance(value, Mapping):
        since = str(value)
    elif value.get("mean_acceptance_length") is None:
        since = "no drafts since start"
    else:
        since = f"{value['mean_acceptance_length']:.2f} since start ({value.get('drafts')} drafts)"
    if not isinstance(window, Mapping):
        return since
    span = window.get("window") or "the window"
    source = "Prometheus" if window.get("up", True) else "Prometheus, target down"
    length = window.get("mean_acceptance_length")
    recent = f"no drafts in {span}" if length is None else f"{length:.2f} over {span}"
    return f"{recent} ({source}); {since}"


def _balancer(value: Any) -> str:
    if not isinstance(value, Mapping):
        return str(value)
    sessions, queued = value.get("sessions", 0), value.get("queued", 0)
    return f"{value.get('status')}, {sessions} sessions, {queued} queued"


def status_table(status: Mapping[str, Any]) -> Table:
    """One row per serving host; "absent" where a part is missing."""
    balancer = status.get("loadbalancer")
    table = Table(title="specfleet status", title_justify="left", caption_justify="left")
    table.add_column("host", no_wrap=True)
    for column in ("stack", "EAGLE-3", "drafter", "unit", "health", "acceptance"):
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
                _eagle3(row.get("whitelist"), row.get("preflight")),
                str(row.get("drafter"))[:12],
                _unit(row.get("unit"), row.get("stack")),
                Text(health, style="green" if health == "ok" else "red"),
                _acceptance(row.get("acceptance"), row.get("acceptance_window")),
            ]
        if balancer:
            cells.append(_balancer(row.get("loadbalancer")))
        table.add_row(host, *cells)
    # Text, not a string: an error message's brackets are not markup.
    table.caption = Text("\n").join(_caption(status)) or None
    return table


def _caption(status: Mapping[str, Any]) -> list[Text]:
    """Why a host is not healthy, where the acceptance window comes from, the front door."""
    servers: Mapping[str, Any] = status.get("servers") or {}
    if not servers:
        return [Text("no serving hosts (the inventory's gpu_hosts group is empty)")]
    lines = [
        Text(f"not healthy: {host}: {'; '.join(reasons)}", style="red")
        for host, row in servers.items()
        if row.get("reachable") and (reasons := unhealthy_reasons(row))
    ]
    prometheus = status.get("prometheus")
    if prometheus:
        where = f"Prometheus {prometheus.get('url')} ({prometheus.get('host')})"
        if prometheus.get("ready"):
            span = prometheus.get("window") or "its window"
            lines.append(Text(f"acceptance over {span}: {where}"))
        else:
            lines.append(
                Text(
                    f"{where} could not be read: {prometheus.get('error')}; "
                    "acceptance since each server started only",
                    style="yellow",
                )
            )
    balancer = status.get("loadbalancer")
    if balancer and balancer.get("reachable"):
        lines.append(Text(_refusals(balancer.get("refusals") or {})))
    return lines


def _refusals(counts: Mapping[str, int]) -> str:
    """What the front door refused since HAProxy started, by reason."""
    if not counts:
        return "front door: nothing refused since the balancer started"
    by_reason = ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items()))
    return f"front door refused, since the balancer started: {by_reason}"
