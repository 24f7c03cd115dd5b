"""The end of a command for a person: what it found, what went wrong, where the log is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specfleet.controller.lab_tour import NEXT_COMMANDS
from specfleet.controller.status import status_table
from specfleet.controller.summary import ExitCode, Outcome, host_totals

#: Lines of a failed task's message shown here (the log has all of it).
MESSAGE_LINES = 12


def recap_table(outcome: Outcome) -> Table | None:
    hosts = host_totals(outcome.results)
    if not hosts:
        return None
    table = Table(box=None, pad_edge=False)
    table.add_column("host")
    for column in ("ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="right")
    for host, tally in hosts.items():
        table.add_row(
            host,
            str(tally.ok),
            Text(str(tally.changed), style="yellow" if tally.changed else ""),
            Text(str(tally.failed), style="bold red" if tally.failed else ""),
            Text(str(tally.unreachable), style="bold red" if tally.unreachable else ""),
            str(tally.skipped),
        )
    return table


def render_tour(console: Console, lab: Mapping[str, Any]) -> None:
    """What `lab up` leaves the user with, and what to try next."""
    console.print()
    console.print(Text("Your lab serves:", style="bold"))
    for server in lab.get("servers", []):
        console.print(
            f"  {server['host']}: {server.get('endpoint')} (inside the container), "
            f"model {server.get('model')}, drafter {str(server.get('drafter'))[:12]}, "
            f"health {server.get('health')}",
            markup=False,
            highlight=False,
        )
    completion = lab.get("completion") or {}
    if "error" in completion:
        console.print(Text(f"A test completion failed: {completion['error']}", style="red"))
    elif completion:
        console.print(
            f"A completion through {completion['via']} ({completion['url']}, "
            f"{completion['completion_tokens']} tokens):",
            markup=False,
            highlight=False,
        )
        console.print(
            Text(f"  {completion['prompt']}", style="dim")
            + Text(str(completion["text"]).replace("\n", " ")[:300])
        )
        length = completion.get("mean_acceptance_length")
        console.print(
            f"  speculative decoding: {completion['drafts']} drafts, "
            f"{completion['draft_tokens']} draft tokens, "
            f"{completion['accepted_tokens']} accepted"
            + (f" (mean acceptance length {length})" if length is not None else ""),
            markup=False,
            highlight=False,
        )
        if completion.get("curl"):
            console.print("  the same from your shell:", markup=False, highlight=False)
            console.print(f"  {completion['curl']}", markup=False, highlight=False, soft_wrap=True)
    prometheus = lab.get("prometheus")
    if prometheus:
        state = "" if prometheus.get("ready") else " (not answering yet)"
        console.print(
            f"Prometheus{state}: {prometheus['url']}; acceptance by draft position: "
            f"{prometheus['graph']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print("Next:")
    comments = [command.partition("#")[2].strip() for command in NEXT_COMMANDS]
    for command, comment in zip(lab.get("next", []), comments, strict=False):
        console.print(f"  {command:<32} # {comment}", markup=False, highlight=False)


def render_outcome(console: Console, outcome: Outcome) -> None:
    """The command's findings, its recap and failures, then the log's path on the last line."""
    status = outcome.details.get("status")
    if status is not None:
        console.print(status_table(status))
    lab = outcome.details.get("lab")
    if lab:
        render_tour(console, lab)
    recap = recap_table(outcome)
    # `status` is its table (also when a host is unhealthy: the table says why); other
    # commands show what they did on each host.
    quiet_recap = outcome.code in (ExitCode.OK, ExitCode.UNHEALTHY)
    if recap is not None and (not quiet_recap or status is None or lab):
        console.print()
        console.print(recap)
    for result in outcome.results:
        for failure in result.failures:
            where = f"{failure.role} : {failure.task}" if failure.role else failure.task
            kind = "UNREACHABLE" if failure.unreachable else "FAILED"
            console.print(Text(f"{kind} {failure.host}: {where}", style="bold red"))
            lines = failure.message.splitlines()
            for line in lines[:MESSAGE_LINES]:
                console.print(f"    {line}", markup=False, highlight=False)
            if len(lines) > MESSAGE_LINES:
                console.print(f"    ... ({len(lines) - MESSAGE_LINES} more lines in the log)")
    if outcome.error_text:
        console.print(Text(f"error: {outcome.error_text}", style="bold red"))
    verdict = outcome.code.name.lower().replace("_", " ")
    console.print(
        Text(
            f"specfleet {outcome.command}: {verdict} (exit {int(outcome.code)}) "
            f"in {outcome.seconds:.0f} s",
            style="bold green" if outcome.code == ExitCode.OK else "bold red",
        )
    )
    if outcome.log:
        console.print(f"log: {outcome.log}", markup=False, highlight=False, soft_wrap=True)
