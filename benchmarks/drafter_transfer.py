"""A drafter's bytes on their way from the training host to a serving host, by size: the two
legs a publication carries them over, with the modules it uses, on a running lab.

    .venv/bin/python benchmarks/drafter_transfer.py -i /path/to/lab/hosts.yml [--sizes-mib 128,1024]

For each size, a file of random bytes on the first server (the training host's collected
copy) is fetched to the controller over the connection's own account (Ansible's ``fetch``
without become, as ``roles/drafter_training/tasks/main.yml`` fetches a published drafter:
streamed) and copied onto the second server as root (Ansible's ``copy``, as
``playbooks/publish_drafter.yml`` and ``place.yml`` carry it: streamed). Each leg is one
``ansible`` call, its start included (about a second here). The publication's other steps
(the host's hash, the EAGLE-3 preflight, the gates) read the file once or not at all.

It needs two servers (``lab_servers``) and leaves nothing behind on them or the controller.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ANSIBLE = str(Path(sys.executable).parent / "ansible")
ON_HOST = "/var/tmp/specfleet-drafter-transfer"
NAME = "model.safetensors"


def servers(inventory: str) -> list[str]:
    listed = subprocess.run(
        [ANSIBLE, "-i", inventory, "lab_servers", "--list-hosts"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line.strip() for line in listed.stdout.splitlines()[1:] if line.strip()]


def ansible(inventory: str, host: str, module: str, args: str, *extra: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [ANSIBLE, "-i", inventory, host, *extra, "-m", module, "-a", args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--sizes-mib", default="128,1024")
    args = parser.parse_args()
    trainer, server = servers(args.inventory)[:2]
    rows = []
    with tempfile.TemporaryDirectory() as controller:
        for mib in [int(size) for size in args.sizes_mib.split(",")]:
            made = (
                f"mkdir -p {ON_HOST} && head -c {mib}M /dev/urandom > {ON_HOST}/model.safetensors"
            )
            ansible(args.inventory, trainer, "ansible.builtin.shell", made, "-b")
            local = Path(controller) / "model.safetensors"
            fetch = ansible(
                args.inventory, trainer, "ansible.builtin.fetch",
                f"src={ON_HOST}/model.safetensors dest={local} flat=yes",
            )  # fmt: skip
            copy = ansible(
                args.inventory, server, "ansible.builtin.copy",
                f"src={local} dest={ON_HOST}/ mode=0644", "-b",
            )  # fmt: skip
            for host in (trainer, server):
                ansible(
                    args.inventory,
                    host,
                    "ansible.builtin.file",
                    f"path={ON_HOST} state=absent",
                    "-b",
                )
            local.unlink()
            rows.append({"mib": mib, "fetch": fetch, "copy": copy})
            print(
                f"{mib} MiB: fetch to the controller {fetch:.2f} s, copy to {server} {copy:.2f} s"
            )
    first, last = rows[0], rows[-1]
    both = {row["mib"]: row["fetch"] + row["copy"] for row in rows}
    print(
        f"{last['mib']} MiB against {first['mib']} MiB:"
        f" {last['mib'] / first['mib']:.1f}x the bytes,"
        f" {both[last['mib']] / both[first['mib']]:.1f}x the time;"
        f" {last['mib'] / both[last['mib']]:.0f} MiB/s over both legs"
    )
    print(yaml.safe_dump({"rows": rows}, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
