"""plugins/filter/lab.py: the lab's host addresses are checked before a container is made."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from conftest import load_plugin

_lab = load_plugin("plugins/filter/lab.py", "specfleet_lab_filter")
problems = _lab.lab_address_problems

SUBNET = "172.30.240.0/24"
RESERVED = "(network, gateway or broadcast)"


def test_the_lab_inventory_addresses_are_sound() -> None:
    lab = {
        "gpu-lab-01": "172.30.240.11",
        "gpu-lab-02": "172.30.240.12",
        "gpu-lab-lb": "172.30.240.10",
    }
    assert problems(lab, SUBNET) == []


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("", "gpu-lab-02: ansible_host '' is not an IP address"),
        ("gpu-lab-02", "gpu-lab-02: ansible_host 'gpu-lab-02' is not an IP address"),
        ("172.30.241.12", "gpu-lab-02: 172.30.241.12 is outside lab_subnet 172.30.240.0/24"),
        (
            "172.30.240.1",
            "gpu-lab-02: 172.30.240.1 is reserved in 172.30.240.0/24 " + RESERVED,
        ),
        (
            "172.30.240.255",
            "gpu-lab-02: 172.30.240.255 is reserved in 172.30.240.0/24 " + RESERVED,
        ),
        ("172.30.240.11", "gpu-lab-02: 172.30.240.11 is also gpu-lab-01's address"),
    ],
)
def test_each_bad_address_is_named(address: str, expected: str) -> None:
    assert problems({"gpu-lab-01": "172.30.240.11", "gpu-lab-02": address}, SUBNET) == [expected]


def test_a_bad_subnet_is_an_error() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"lab_subnet '172\.30\.240\.0/33' is not a network"
    ):
        problems({}, "172.30.240.0/33")
