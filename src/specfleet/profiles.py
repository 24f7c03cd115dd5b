"""The accelerator profiles, in one place for the Python side.

Ansible's side lists the same names as the choices of ``specfleet_accelerator``
(``roles/specfleet/meta/argument_specs.yml``); tests/test_role_policy.py keeps the two equal
and checks that every role with per-profile data has a ``vars/<profile>.yml`` for each.
"""

from __future__ import annotations

PROFILES: tuple[str, ...] = ("cuda", "cpu")
