"""Lookup ``specfleet_project``: paths inside this project's checkout, and its host package.

Roles must not reach for project files through ``role_path ~ '/../..'`` (that breaks as soon
as a role is used from another roles path). This plugin knows where the project is from its
own location, once:

- ``lookup('specfleet.fleet.specfleet_project', 'locks')``: the absolute path of
  ``<project>/locks``.
- ``lookup('specfleet.fleet.specfleet_project', 'host_package', lab=false)``: the project's
  host-side Python (``src/specfleet/host``, with ``host/lab`` only when ``lab``) as a tarball
  built on the controller, byte-identical for identical sources and named by their content
  hash, so a host that has it already is not touched. The ``common`` role installs it under
  ``specfleet_lib_dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: specfleet_project
short_description: Paths inside the specfleet checkout, and its host-side Python package
description:
  - Returns the absolute path of a folder or file of the project, or with C(host_package)
    the path of a content-addressed tarball of the project's host-side Python.
options:
  _terms:
    description: Paths relative to the project root, or C(host_package).
    required: true
  lab:
    description: With C(host_package), add C(src/specfleet/host/lab) (lab hosts only).
    type: bool
    default: false
"""

PROJECT = Path(__file__).resolve().parents[2]


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[str]:
        results = []
        for term in terms:
            if term == "host_package":
                from specfleet.controller.hostpackage import build_host_package

                lab = kwargs.get("lab", False)
                if not isinstance(lab, bool):
                    raise AnsibleLookupError(f"specfleet_project: lab must be a bool, got {lab!r}")
                results.append(str(build_host_package(PROJECT / "src", lab=lab)))
                continue
            path = (PROJECT / str(term)).resolve()
            if PROJECT not in path.parents and path != PROJECT:
                raise AnsibleLookupError(f"specfleet_project: {term!r} is outside the project")
            results.append(str(path))
        return results
