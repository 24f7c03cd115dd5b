"""Jinja2 filter ``model_manifest``: a pinned model's manifest (`specfleet model pin`) read on
the controller with the hosts' own parser (``specfleet.host.model_manifest``), so the folder
the controller expects and the one a host fetches into are named by the same digest, and a
bad manifest stops the play before any host is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError

from specfleet.host.model_manifest import ManifestError, from_document


def model_manifest(document: Any) -> dict[str, Any]:
    """What the pinned_model role needs of a parsed manifest: its canonical text (what the
    hosts get), name, source, revision, digest, folder name, total size and file count."""
    try:
        manifest = from_document(document)
    except ManifestError as error:
        raise AnsibleFilterError(f"model_manifest: {error}") from error
    return {
        "name": manifest.name,
        "source": manifest.source,
        "revision": manifest.revision,
        "digest": manifest.digest,
        "folder": manifest.folder_name,
        "size": manifest.size,
        "files": len(manifest.files),
        "text": manifest.dumps(),
    }


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"model_manifest": model_manifest}
