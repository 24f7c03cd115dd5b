"""Lookup ``specfleet_run``: who this run is, as a lock it takes on a host records it
(src/specfleet/controller/runlock.py): the controller, the ansible-playbook process and its
start."""

from __future__ import annotations

from typing import Any

from ansible.plugins.lookup import LookupBase

from specfleet.controller.runlock import this_run

DOCUMENTATION = r"""
name: specfleet_run
short_description: This run's identity, for the owner of a lock it takes on a host
description:
  - Returns one dict, C(controller) (host name), C(pid) (the ansible-playbook process),
    C(pid_started) (its start, in clock ticks since boot) and C(since) (now).
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[Any]:
        return [this_run()]
