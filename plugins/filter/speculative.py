"""Jinja2 filter ``speculative_config``: a dict to vLLM's ``--speculative-config`` JSON.

The validation and its bounds live in ``specfleet.host.speculative`` (shared with the drafter
pipeline); this file only adapts its errors to Ansible's.

Example::

    {{ {'method': 'eagle3', 'model': '/srv/drafter', 'num_speculative_tokens': 3}
       | speculative_config }}
    -> {"method":"eagle3","model":"/srv/drafter","num_speculative_tokens":3}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from specfleet.host import speculative


def speculative_config(settings: Mapping[str, Any]) -> str:
    """Validate ``settings`` and return the JSON for ``--speculative-config``."""
    try:
        return speculative.speculative_config(settings)
    except speculative.SpeculativeConfigError as error:
        raise AnsibleFilterError(str(error)) from error


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., str]]:
        return {"speculative_config": speculative_config}
