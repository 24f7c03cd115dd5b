"""The error every command reports as bad input (exit 2): nothing was started."""

from __future__ import annotations


class BadInput(Exception):
    """The operator's input cannot be run: nothing was started."""
