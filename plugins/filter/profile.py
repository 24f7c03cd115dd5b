"""Jinja2 filter ``profile_vars_file``: the vars file of a role's accelerator profile.

A profile is a vars file: each role that differs by accelerator keeps ``vars/<profile>.yml``
and loads the one ``specfleet_accelerator`` names. The project settings' argument spec
refuses an unknown profile, but it runs once a play (roles/specfleet is a dependency every
role shares, checked the first time a play reaches it): a role included later in the same
play with another profile must still get a message that names the setting, not
include_vars' "Could not find tpu.yml". This filter gives that message at the load itself,
with no task of its own.

Example::

    ansible.builtin.include_vars: "{{ specfleet_accelerator | profile_vars_file(role_path) }}"
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError


def profile_vars_file(profile: Any, role_path: str) -> str:
    """``<role_path>/vars/<profile>.yml``, or an error naming specfleet_accelerator and the
    profiles the role has."""
    folder = Path(str(role_path)) / "vars"
    # vars/main.yml is the role's own; every other file there is a profile. Matching the
    # name against that list also keeps a name with a path in it inside vars/.
    profiles = sorted(path.stem for path in folder.glob("*.yml") if path.stem != "main")
    name = str(profile)
    if name not in profiles:
        raise AnsibleFilterError(
            f"specfleet_accelerator is {name!r}, which is not a profile of role "
            f"{Path(str(role_path)).name} (its profiles: {', '.join(profiles) or 'none'}). "
            "Nothing was changed."
        )
    path = folder / f"{name}.yml"
    return str(path)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"profile_vars_file": profile_vars_file}
