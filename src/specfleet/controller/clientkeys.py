"""Client keys for the front door: made here, on the controller, and given to the balancer by
their sha256 only (the loadbalancer role's ``loadbalancer_api_keys``).

A key is 256 random bits, URL-safe base64 with a ``sf-`` prefix: a bearer token (RFC 6750)
that needs no quoting in a header, a shell or YAML. Its sha256 is what the balancer looks up,
so the key itself is never in an inventory, on a balancer or in a log: the operator hands it
to the client once.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from specfleet.controller.runopts import BadInput

#: The balancer's log shows this name (roles/loadbalancer/vars/main.yml has the same rule).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class ClientKey:
    name: str
    key: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.key.encode()).hexdigest()

    def entry(self) -> dict[str, str]:
        """The item for the inventory's loadbalancer_api_keys."""
        return {"name": self.name, "sha256": self.sha256}


def new_key(name: str) -> ClientKey:
    if not NAME_PATTERN.fullmatch(name):
        raise BadInput(
            f"key name {name!r}: letters, digits, '.', '_' and '-' (starting with a letter or "
            "digit, at most 64): the balancer's log shows it"
        )
    return ClientKey(name, "sf-" + secrets.token_urlsafe(32))
