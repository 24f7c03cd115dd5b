"""specfleet: one command per operator job.

  provision   converge hosts from a bare OS to serving (playbooks/site.yml)
  upgrade     roll the fleet to a stack lock or a model (playbooks/upgrade.yml, --lock, --model)
  train       train an EAGLE-3 drafter and publish it (playbooks/train_drafter.yml)
  status      what each serving host runs, read only (playbooks/status.yml)
  frontdoor   give the balancers the inventory's client keys and routes (playbooks/frontdoor.yml)
  key new     make a client key for the front door, and its inventory entry
  lab         the local lab: up, down, status

Playbooks run through ansible-runner with ansible-playbook's options (-i, -l, -e, --check,
--diff, --vault-password-file, --ask-vault-pass). On a terminal it draws progress per host;
piped, it prints plain lines; --quiet prints only the summary, --json only one JSON document.
Ansible's full output goes to a log file, named on the last line printed.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import io
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from specfleet.controller.clientkeys import new_key
from specfleet.controller.image import ensure_image
from specfleet.controller.lab import lab_down, lab_up
from specfleet.controller.modelpin import pin_folder, pin_hub, write
from specfleet.controller.paths import repo_root
from specfleet.controller.playbook import Session, playbook_path
from specfleet.controller.progress_view import View, make_view
from specfleet.controller.report import render_outcome
from specfleet.controller.runopts import BadInput, RunOptions
from specfleet.controller.stacklock import StackLock, StackSpec, resolve
from specfleet.controller.status import fleet_status, fleet_unhealthy
from specfleet.controller.summary import EXIT_CODES_HELP, ExitCode, Outcome, document, exit_code
from specfleet.controller.wheelhouse import ensure_wheelhouse
from specfleet.host.model_manifest import ManifestError
from specfleet.host.model_manifest import load as load_manifest

Details = dict[str, Any]


class UsageError(Exception):
    """argparse refused the command line (reported as bad input, in JSON with --json)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


# ----------------------------------------------------------------- jobs
def _provision(session: Session, args: argparse.Namespace, view: View) -> Details:
    # --full: every host through the whole converge, past the fast path (site.yml's first play).
    result = session.run(
        "site.yml", command_vars={"specfleet_converge_full": True} if args.full else None
    )
    fast_path = dict(result.data.get("fast_path") or {})
    for line in fast_path_lines(fast_path, full=args.full):
        view.note(line)
    return {"fast_path": fast_path}


def fast_path_lines(report: Mapping[str, Any], *, full: bool = False) -> list[str]:
    """What site.yml's fast path found: how many hosts ended at once, and why each other
    host took the full converge (its first reason; the JSON has them all)."""
    if not report:
        return []
    ended = sorted(host for host, row in report.items() if row.get("ends_here"))
    lines = [f"fast path: {len(ended)} of {len(report)} hosts had nothing to converge"]
    if full:
        return ["fast path: off (--full), every host took the full converge"]
    for host, row in sorted(report.items()):
        why = list(row.get("why") or [])
        if not row.get("ends_here") and why:
            more = f" (and {len(why) - 1} more)" if len(why) > 1 else ""
            lines.append(f"{host}: full converge: {why[0]}{more}")
    return lines


def _upgrade(session: Session, args: argparse.Namespace, view: View) -> Details:
    # Not ml_stack_lock or pinned_model_manifest: an extra var of that name would also win
    # over the rollback's.
    asked: dict[str, str] = {}
    if args.lock:
        asked["specfleet_upgrade_lock"] = args.lock
    if args.model:
        asked["specfleet_upgrade_model"] = str(Path(args.model).expanduser().resolve())
    session.run("upgrade.yml", command_vars=asked or None)
    return {}


def _train(session: Session, args: argparse.Namespace, view: View) -> Details:
    session.run("train_drafter.yml")
    return {}


def _frontdoor(session: Session, args: argparse.Namespace, view: View) -> Details:
    session.run("frontdoor.yml")
    return {}


def _status(session: Session, args: argparse.Namespace, view: View) -> Details:
    return {"status": fleet_status(session.run("status.yml"))}


def _lab(session: Session, args: argparse.Namespace, view: View) -> Details:
    if args.action == "up":
        return lab_up(session, note=view.note)
    if args.action == "down":
        return lab_down(session)
    return _status(session, args, view)


@dataclass(frozen=True)
class Job:
    run: Callable[[Session, argparse.Namespace, View], Details]
    #: The playbooks it runs (by lab action for `lab`), checked before anything starts.
    playbooks: dict[str | None, tuple[str, ...]]
    #: The actions (None: the command itself) whose exit code also says whether every
    #: serving host is healthy: 5 (unhealthy) in place of 0 when one is not.
    judges_health: tuple[str | None, ...] = ()


JOBS: dict[str, Job] = {
    "provision": Job(_provision, {None: ("site.yml",)}),
    "upgrade": Job(_upgrade, {None: ("upgrade.yml",)}),
    "train": Job(_train, {None: ("train_drafter.yml",)}),
    "status": Job(_status, {None: ("status.yml",)}, judges_health=(None,)),
    "frontdoor": Job(_frontdoor, {None: ("frontdoor.yml",)}),
    "lab": Job(
        _lab,
        {
            "up": ("lab.yml", "site.yml", "status.yml"),
            "down": ("lab.yml",),
            "status": ("status.yml",),
        },
        # Not `lab up`: it succeeds when the lab is made and converged; its status says the rest.
        judges_health=("status",),
    ),
}


def _check_lock(name: str | None) -> None:
    if name is None:
        return
    lock = repo_root() / "locks" / f"{name}.txt"
    if not lock.is_file():
        raise BadInput(f"--lock {name}: no {lock} (`specfleet lock {name}` makes it)")


def _check_model(manifest: str | None) -> None:
    """--model's manifest, read by the hosts' own parser before anything runs."""
    if manifest is None:
        return
    try:
        load_manifest(Path(manifest).expanduser())
    except ManifestError as error:
        raise BadInput(f"--model: {error}") from error


def _options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        inventories=tuple(args.inventory or ()),
        limit=getattr(args, "limit", None),
        extra_vars=tuple(args.extra_vars or ()),
        check=getattr(args, "check", False),
        diff=getattr(args, "diff", False),
        vault_password_file=args.vault_password_file,
        ask_vault_pass=args.ask_vault_pass,
        verbosity=args.verbose,
    )


@contextlib.contextmanager
def final_output_only() -> Iterator[None]:
    """While the command runs, whatever is written to stdout goes to stderr instead: Python's
    prints and subprocesses' output (docker, pip) alike, so that stdout carries only what is
    printed after (the summary, or the one JSON document)."""
    sys.stdout.flush()
    try:
        real = sys.stdout.fileno() == 1
    except (OSError, ValueError, io.UnsupportedOperation):
        real = False
    saved = os.dup(1) if real else None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def make_console() -> Console:
    """rich's console on stdout; piped output (CI logs) is not folded at 80 columns."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=160)
    return console


def run_job(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run a playbook command and report it; returns its exit code."""
    console = console or make_console()
    command = f"lab-{args.action}" if args.command == "lab" else args.command
    job = JOBS[args.command]
    action = getattr(args, "action", None)
    started = time.monotonic()
    session: Session | None = None
    details: Details = {}
    silent = args.quiet or args.json
    attempt = Attempt()
    with final_output_only() if silent else contextlib.nullcontext():
        view = make_view(console, quiet=args.quiet, machine=args.json)
        with one_error_path(attempt):
            options = _options(args)
            options.validate()
            for playbook in job.playbooks[action]:
                playbook_path(playbook)
            _check_lock(getattr(args, "lock", None))
            _check_model(getattr(args, "model", None))
            if options.ask_vault_pass:
                options = _with_vault_password(options)
            session = Session(command, options, observer=view)
            with session, view:
                details = job.run(session, args, view)
    results = session.results if session else []
    code = attempt.code
    if code is None:
        interrupted = attempt.interrupted or bool(session and session.interrupted)
        unhealthy = action in job.judges_health and fleet_unhealthy(details.get("status"))
        code = exit_code(results, interrupted=interrupted, unhealthy=unhealthy)
    outcome = Outcome(
        command=command,
        results=results,
        code=code,
        seconds=time.monotonic() - started,
        log=session.log_path if session else None,
        error=attempt.error,
        details=details,
    )
    if args.json:
        print(json.dumps(document(outcome), indent=2, sort_keys=False))
    else:
        render_outcome(console, outcome)
    return int(code)


@dataclass
class Attempt:
    """How a command ended when it did not end by itself: its error and exit code."""

    error: str | None = None
    code: ExitCode | None = None
    interrupted: bool = False


@contextlib.contextmanager
def one_error_path(attempt: Attempt) -> Iterator[None]:
    """The one path from an exception to an exit code, for every command: bad input is 2
    with its message, Ctrl-C is 130, anything else a bug (1) with its traceback."""
    try:
        yield
    except BadInput as failure:
        attempt.error, attempt.code = str(failure), ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        attempt.interrupted, attempt.code = True, ExitCode.INTERRUPTED
    except Exception as failure:
        # A bug or a broken environment: still one answer, and its traceback on stderr.
        traceback.print_exc()
        attempt.error, attempt.code = f"{type(failure).__name__}: {failure}", ExitCode.ERROR


def run_local(args: argparse.Namespace) -> int:
    """Run a command that needs no playbook (image, lock, wheelhouse, key) through the same
    error path; with --json its one document carries what it made."""
    started = time.monotonic()
    attempt = Attempt()
    details: Details = {}
    with final_output_only() if args.json else contextlib.nullcontext(), one_error_path(attempt):
        details = args.func(args)
    code = attempt.code or ExitCode.OK
    if args.json:
        outcome = Outcome(
            command=args.command,
            results=[],
            code=code,
            seconds=time.monotonic() - started,
            log=None,
            error=attempt.error,
            details=details,
        )
        print(json.dumps(document(outcome), indent=2))
    elif attempt.error:
        print(f"specfleet {args.command}: {attempt.error}", file=sys.stderr)
    return int(code)


def _with_vault_password(options: RunOptions) -> RunOptions:
    """Ask here, once; ansible-runner answers ansible-playbook's prompt with it."""
    try:
        secret = getpass.getpass("Vault password: ")
    except EOFError as error:
        raise BadInput("--ask-vault-pass: no terminal to ask on") from error
    return replace(options, vault_password=secret)


# ----------------------------------------------------------------- other commands
# Each prints what it did for a reader and returns it as data (the --json document's).
def _cmd_image(args: argparse.Namespace) -> Details:
    image = ensure_image(rebuild=args.rebuild)
    print(image)
    return {"image": image}


def _cmd_lock(args: argparse.Namespace) -> Details:
    lock = resolve(StackSpec.load(args.stack))
    path = lock.write()
    print(f"{path}: {len(lock.pins)} pins, digest {lock.digest}")
    return {"lock": str(path), "pins": len(lock.pins), "digest": lock.digest}


def _cmd_wheelhouse(args: argparse.Namespace) -> Details:
    house = ensure_wheelhouse(StackSpec.load(args.stack), StackLock.read(args.stack))
    how = (
        "reused"
        if house.reused
        else f"built in {house.seconds:.0f} s ({house.linked} wheels linked from other wheelhouses)"
    )
    print(f"{house.path}: {house.wheels} wheels, {house.size_bytes / 2**20:.0f} MiB, {how}")
    return {"wheelhouse": str(house.path), "wheels": house.wheels, "reused": house.reused}


def _cmd_model_pin(args: argparse.Namespace) -> Details:
    """A model's manifest from its files (a folder) or from the Hub (hf://OWNER/NAME)."""
    try:
        if args.files.startswith("hf://"):
            manifest = pin_hub(args.files.removeprefix("hf://"), args.revision, args.name)
            if args.source:  # pinned from the Hub's record, fetched from a mirror of it
                manifest = replace(manifest, source=args.source)
        else:
            folder = Path(args.files).expanduser().resolve()
            manifest = pin_folder(folder, args.name, args.source or str(folder), args.revision)
    except ManifestError as error:
        raise BadInput(str(error)) from error
    path = write(manifest, Path(args.output))
    print(
        f"{path}: {manifest.name}, {len(manifest.files)} files, {manifest.size} bytes,"
        f" digest {manifest.digest} (on the hosts: {manifest.folder_name})"
    )
    return {
        "manifest": str(path),
        "digest": manifest.digest,
        "folder": manifest.folder_name,
        "files": len(manifest.files),
        "bytes": manifest.size,
    }


def _cmd_key(args: argparse.Namespace) -> Details:
    made = new_key(args.name)
    print(f"key (give it to the client; it is not kept anywhere): {made.key}")
    print("add to the inventory's loadbalancer_api_keys, then run `specfleet frontdoor`:")
    print(f"  - name: {made.name}\n    sha256: {made.sha256}")
    return {"name": made.name, "key": made.key, "sha256": made.sha256, "entry": made.entry()}


# ----------------------------------------------------------------- parser
def _output_options() -> argparse.ArgumentParser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("output")
    mode = group.add_mutually_exclusive_group()
    mode.add_argument("-q", "--quiet", action="store_true", help="print only the final summary")
    mode.add_argument(
        "--json",
        action="store_true",
        help="print exactly one JSON document on stdout (and nothing else)",
    )
    return parent


def _json_option() -> argparse.ArgumentParser:
    parent = _Parser(add_help=False)
    parent.add_argument(
        "--json", action="store_true", help="print exactly one JSON document on stdout"
    )
    return parent


def _ansible_options(*, limit: bool = True) -> argparse.ArgumentParser:
    parent = _Parser(add_help=False)
    group = parent.add_argument_group("ansible-playbook options")
    group.add_argument(
        "-i",
        "--inventory",
        action="append",
        metavar="INVENTORY",
        help="inventory file, folder or host list (repeatable; default: inventory/lab)",
    )
    if limit:
        group.add_argument("-l", "--limit", metavar="PATTERN", help="limit to these hosts")
        group.add_argument("--check", action="store_true", help="dry run: change nothing")
        group.add_argument("--diff", action="store_true", help="show the changes to files")
    group.add_argument(
        "-e",
        "--extra-vars",
        action="append",
        metavar="VARS",
        help="key=value ..., @FILE (YAML or JSON) or inline JSON; repeatable, later ones win",
    )
    vault = group.add_mutually_exclusive_group()
    vault.add_argument("--vault-password-file", metavar="FILE", help="vault password file")
    vault.add_argument(
        "--ask-vault-pass", action="store_true", help="ask for the vault password first"
    )
    group.add_argument(
        "-v", "--verbose", action="count", default=0, help="Ansible's verbosity (in the log)"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specfleet",
        description=__doc__,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = [_ansible_options(), _output_options()]
    epilog = {"epilog": EXIT_CODES_HELP, "formatter_class": argparse.RawDescriptionHelpFormatter}

    provision = commands.add_parser(
        "provision", parents=parents, help="converge hosts to serving (site.yml)", **epilog
    )
    provision.add_argument(
        "--full",
        action="store_true",
        help=(
            "take every host through the full converge, even one whose last full converge "
            "still holds (extra var specfleet_converge_full)"
        ),
    )
    upgrade = commands.add_parser(
        "upgrade",
        parents=parents,
        help="roll the fleet to a stack lock or a model (upgrade.yml)",
        **epilog,
    )
    upgrade.add_argument(
        "--lock",
        metavar="NAME",
        help=(
            "stack lock locks/NAME.txt (extra var specfleet_upgrade_lock); set ml_stack_lock "
            "in the inventory afterwards"
        ),
    )
    upgrade.add_argument(
        "--model",
        metavar="MANIFEST",
        help=(
            "a pinned model's manifest (`specfleet model pin`; extra var "
            "specfleet_upgrade_model); set pinned_model_manifest in the inventory afterwards"
        ),
    )
    commands.add_parser(
        "train",
        parents=parents,
        help="train a drafter and publish it (train_drafter.yml)",
        **epilog,
    )
    commands.add_parser(
        "status", parents=parents, help="what each serving host runs, read only", **epilog
    )
    commands.add_parser(
        "frontdoor",
        parents=parents,
        help="give the balancers the client keys and routes (frontdoor.yml)",
        **epilog,
    )
    lab = commands.add_parser(
        "lab",
        parents=[_ansible_options(limit=False), _output_options()],
        help="the local lab: up (create and converge), down, status",
        **epilog,
    )
    lab.add_argument("action", choices=["up", "down", "status"])

    local = [_json_option()]
    key = commands.add_parser("key", parents=local, help="make a client key for the front door")
    key.add_argument("action", choices=["new"])
    key.add_argument("name", help="what the balancer's log shows for it, e.g. team-search")
    key.set_defaults(func=_cmd_key)

    image = commands.add_parser(
        "image", parents=local, help="build or reuse the Debian 12 systemd host image"
    )
    image.add_argument("--rebuild", action="store_true", help="rebuild even when cached")
    image.set_defaults(func=_cmd_image)

    lock = commands.add_parser(
        "lock", parents=local, help="resolve locks/STACK.toml into locks/STACK.txt"
    )
    lock.add_argument("stack", help="stack name, e.g. cpu")
    lock.set_defaults(func=_cmd_lock)

    wheelhouse = commands.add_parser(
        "wheelhouse", parents=local, help="download a stack's wheels for the hosts"
    )
    wheelhouse.add_argument("stack", help="stack name, e.g. cpu")
    wheelhouse.set_defaults(func=_cmd_wheelhouse)

    model = commands.add_parser("model", help="served models: pin one in a manifest")
    model_actions = model.add_subparsers(dest="action", required=True, metavar="ACTION")
    pin = model_actions.add_parser(
        "pin", parents=local, help="write a model's manifest: every file's size and sha256"
    )
    pin.add_argument("files", help="the model's folder, or hf://OWNER/NAME for the Hub")
    pin.add_argument("--name", required=True, help="the model's name on the hosts")
    pin.add_argument(
        "--source",
        help="where the hosts fetch it (a folder or an http(s) mirror; default: FILES)",
    )
    pin.add_argument("--revision", default="", help="the revision pinned (the Hub: resolved)")
    pin.add_argument("-o", "--output", required=True, help="the manifest to write")
    pin.set_defaults(func=_cmd_model_pin)
    return parser


def _bad_usage(error: UsageError, argv: Sequence[str], parser: argparse.ArgumentParser) -> int:
    if "--json" in argv:
        command = next((arg for arg in argv if not arg.startswith("-")), None)
        outcome = Outcome(
            command=command or "",
            results=[],
            code=ExitCode.BAD_INPUT,
            seconds=0.0,
            log=None,
            error=str(error),
        )
        print(json.dumps(document(outcome), indent=2))
    else:
        parser.print_usage(sys.stderr)
        print(error, file=sys.stderr)
    return int(ExitCode.BAD_INPUT)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        return _bad_usage(error, argv, parser)
    if args.command in JOBS:
        return run_job(args)
    return run_local(args)


if __name__ == "__main__":
    sys.exit(main())
