"""specfleet's command line: the lab, the test hosts' image, stack locks and wheelhouses."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specfleet.image import ensure_image
from specfleet.lab import lab_down, lab_up
from specfleet.playbook import PlayResult
from specfleet.stacklock import StackLock, StackSpec, resolve
from specfleet.wheelhouse import ensure_wheelhouse


def _report(results: list[PlayResult]) -> int:
    for result in results:
        changed = ", ".join(f"{host}={n}" for host, n in sorted(result.changed.items()))
        print(f"specfleet: {result.playbook}: rc={result.rc} changed: {changed or 'none'}")
        if result.failed_hosts:
            print(f"specfleet: failed hosts: {', '.join(result.failed_hosts)}", file=sys.stderr)
    return 0 if all(result.ok for result in results) else 1


def _cmd_lab(args: argparse.Namespace) -> int:
    inventory = Path(args.inventory) if args.inventory else None
    return _report(lab_up(inventory) if args.action == "up" else lab_down(inventory))


def _cmd_image(args: argparse.Namespace) -> int:
    print(ensure_image(rebuild=args.rebuild))
    return 0


def _cmd_lock(args: argparse.Namespace) -> int:
    lock = resolve(StackSpec.load(args.stack))
    path = lock.write()
    print(f"{path}: {len(lock.pins)} pins, digest {lock.digest}")
    return 0


def _cmd_wheelhouse(args: argparse.Namespace) -> int:
    house = ensure_wheelhouse(StackSpec.load(args.stack), StackLock.read(args.stack))
    how = "reused" if house.reused else f"built in {house.seconds:.0f} s"
    print(f"{house.path}: {house.wheels} wheels, {house.size_bytes / 2**20:.0f} MiB, {how}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specfleet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    lab = commands.add_parser("lab", help="bring the local lab up (and converge it) or down")
    lab.add_argument("action", choices=["up", "down"])
    lab.add_argument("-i", "--inventory", help="lab inventory (default: inventory/lab)")
    lab.set_defaults(func=_cmd_lab)

    image = commands.add_parser("image", help="build or reuse the Debian 12 systemd host image")
    image.add_argument("--rebuild", action="store_true", help="rebuild even when cached")
    image.set_defaults(func=_cmd_image)

    lock = commands.add_parser("lock", help="resolve locks/STACK.toml into locks/STACK.txt")
    lock.add_argument("stack", help="stack name, e.g. cpu")
    lock.set_defaults(func=_cmd_lock)

    wheelhouse = commands.add_parser("wheelhouse", help="download a stack's wheels for the hosts")
    wheelhouse.add_argument("stack", help="stack name, e.g. cpu")
    wheelhouse.set_defaults(func=_cmd_wheelhouse)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
