"""The HTTP routes the installed vLLM's server answers, from vLLM's own application builder.

``python -m specfleet.host.routes --pid PID`` (in the stack venv, as root on a server host) reads
the served arguments from the running server's command line (``python -m specfleet.host.serve
ARGS``), builds the application the way vLLM's server does (vLLM's ``build_app`` over its own
argument parser) without starting an engine, and prints its route table as JSON: one
``{"path", "methods", "kind"}`` per route, ``kind`` one of ``http``, ``websocket``, ``mount``.
``--every-task`` builds it once more for each task vLLM knows (generate, pooling, speech,
render) and with vLLM's development routes on, adds every router of vLLM's ``*api_router``
modules (the pooling and scoring ones need a model to be registered), and prints the union:
every route this vLLM release could answer in any configuration, not only the served one.

The front door's attack test (tests/test_front_door.py) sends each of these through the
balancer, so a route a new vLLM release adds is attacked without anyone listing it; an
operator reads the same table to decide which routes to let through
(``loadbalancer_extra_routes``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
import typing
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SERVE_MODULE = "specfleet.host.serve"
#: One route: {"path", "methods", "kind"}.
RouteEntry = dict[str, Any]
# Where each release keeps its argument parser and FlexibleArgumentParser (vLLM moved both).
_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
_FLEXIBLE_PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")


def served_argv(pid: int) -> list[str]:
    """The vLLM arguments of the running server ``pid`` (after ``-m specfleet.host.serve``)."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    argv = [word.decode() for word in words if word]
    for index in range(len(argv) - 1):
        if argv[index] == "-m" and argv[index + 1] == SERVE_MODULE:
            return argv[index + 2 :]
    raise SystemExit(
        f"specfleet.host.routes: process {pid} does not run {SERVE_MODULE}: {argv[:4]}"
    )


def _first_attribute(modules: Iterable[str], name: str) -> Any:
    for module_name in modules:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                return getattr(module, name)
    raise SystemExit(f"specfleet.host.routes: this vLLM has no {name} in {', '.join(modules)}")


def parse_server_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by vLLM's own server parser, as ``vllm serve`` parses it."""
    parser_class = _first_attribute(_FLEXIBLE_PARSER_MODULES, "FlexibleArgumentParser")
    make_arg_parser = _first_attribute(_PARSER_MODULES, "make_arg_parser")
    parser = make_arg_parser(parser_class(description="vLLM server"))
    return parser.parse_args(list(argv))


def every_task() -> tuple[str, ...]:
    """Every task vLLM knows (its ``SupportedTask`` literal), in its order."""
    from vllm import tasks

    names: list[str] = []
    pending = [tasks.SupportedTask]
    while pending:
        for arg in typing.get_args(pending.pop(0)):
            if isinstance(arg, str):
                names.append(arg)
            else:
                pending.append(arg)
    return tuple(dict.fromkeys(names))


def route_table(app: Any) -> list[RouteEntry]:
    """The routes of a Starlette/FastAPI app, each as path, methods and kind."""
    from starlette.routing import Mount, Route, WebSocketRoute

    table = []
    for route in app.routes:
        if isinstance(route, WebSocketRoute):
            table.append({"path": route.path, "methods": ["GET"], "kind": "websocket"})
        elif isinstance(route, Mount):
            table.append({"path": route.path or "/", "methods": ["GET"], "kind": "mount"})
        elif isinstance(route, Route):
            methods = sorted(route.methods or {"GET"})
            table.append({"path": route.path, "methods": methods, "kind": "http"})
    return table


def build_routes(args: argparse.Namespace, supported_tasks: tuple[str, ...]) -> list[RouteEntry]:
    """The route table of vLLM's app for these arguments and tasks (no engine is started)."""
    build_app = _first_attribute(("vllm.entrypoints.openai.api_server",), "build_app")
    # vLLM warns about deprecated modules and prints as it registers routes; only JSON is ours.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        app = build_app(args, supported_tasks)
    return route_table(app)


def router_routes() -> list[RouteEntry]:
    """The routes of every APIRouter defined in vLLM's ``*api_router`` modules, including
    those ``build_app`` registers only for a model it knows (pooling, scoring)."""
    import pkgutil

    import vllm.entrypoints
    from fastapi import APIRouter

    table: list[RouteEntry] = []
    prefix = vllm.entrypoints.__name__ + "."
    for info in pkgutil.walk_packages(vllm.entrypoints.__path__, prefix):
        if not info.name.endswith("api_router"):
            continue
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                module = importlib.import_module(info.name)
        except Exception:
            continue
        for value in vars(module).values():
            if isinstance(value, APIRouter):
                table.extend(route_table(value))
    return table


def union(tables: Iterable[list[RouteEntry]]) -> list[RouteEntry]:
    merged: dict[tuple[str, str], set[str]] = {}
    for table in tables:
        for route in table:
            merged.setdefault((route["path"], route["kind"]), set()).update(route["methods"])
    return [
        {"path": path, "methods": sorted(methods), "kind": kind}
        for (path, kind), methods in sorted(merged.items())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specfleet.host.routes", description=__doc__)
    parser.add_argument("--pid", type=int, help="the running server whose arguments to use")
    parser.add_argument(
        "--every-task",
        action="store_true",
        help="also every task and vLLM's development routes: every route this vLLM has",
    )
    parser.add_argument("server_args", nargs="*", help="vLLM server arguments (without --pid)")
    options = parser.parse_args(argv)
    if options.every_task:
        # Read by vllm.envs when the routers are registered (development routes).
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    server_args = served_argv(options.pid) if options.pid else list(options.server_args)
    args = parse_server_args(server_args)
    tables = [build_routes(args, ("generate",))]
    if options.every_task:
        with contextlib.suppress(AttributeError):
            args.enable_fault_tolerance = True
        tasks = every_task()
        tables.append(build_routes(args, tasks))
        tables.extend(build_routes(args, (task,)) for task in tasks)
        tables.append(router_routes())
    json.dump(union(tables), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
