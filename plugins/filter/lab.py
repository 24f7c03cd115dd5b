"""Jinja2 filter ``lab_address_problems``: what is wrong with the lab's host addresses.

playbooks/lab.yml gives each lab container its inventory address (``ansible_host``) on a
Docker network for ``lab_subnet``. Docker would refuse a bad address only after earlier
containers were made; this check runs before anything is made and names every problem.

Example::

    {{ {'gpu-lab-01': '172.30.240.11', 'gpu-lab-lb': '172.30.240.11'}
       | lab_address_problems('172.30.240.0/24') }}
    -> ['gpu-lab-lb: 172.30.240.11 is also gpu-lab-01\\'s address']
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def lab_address_problems(addresses: Mapping[str, Any], subnet: str) -> list[str]:
    """One line per host whose address is missing, malformed, outside ``subnet``, reserved
    (the network, its gateway, its broadcast) or another host's."""
    try:
        network = ipaddress.ip_network(str(subnet))
    except ValueError as error:
        raise AnsibleFilterError(f"lab_subnet {subnet!r} is not a network: {error}") from error
    # Docker's bridge takes the subnet's first usable address as the gateway.
    reserved = {network.network_address, network.broadcast_address, network.network_address + 1}
    problems: list[str] = []
    owner: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, str] = {}
    for host, text in addresses.items():
        try:
            address = ipaddress.ip_address(str(text or ""))
        except ValueError:
            problems.append(f"{host}: ansible_host {text!r} is not an IP address")
            continue
        if address not in network:
            problems.append(f"{host}: {address} is outside lab_subnet {network}")
        elif address in reserved:
            problems.append(
                f"{host}: {address} is reserved in {network} (network, gateway or broadcast)"
            )
        elif address in owner:
            problems.append(f"{host}: {address} is also {owner[address]}'s address")
        else:
            owner[address] = host
    return problems


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Callable[..., list[str]]]:
        return {"lab_address_problems": lab_address_problems}
