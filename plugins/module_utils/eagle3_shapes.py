# Copyright: specfleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The shapes of vLLM's EAGLE-3 target check, and the edit of them: pure syntax-tree logic.

The whitelist module (plugins/modules/vllm_eagle3_whitelist.py) edits the check in
``SpeculativeConfig._verify_args`` of an installed vLLM. Everything it knows about that check
is here, apart from Ansible: where it has lived (CANDIDATES), how each known shape looks in
Python's ``ast`` (the single ``"llama" not in ...model_type`` compare, the list of strings or
``+`` chain of lists named ``eagle3_target_supported`` or ``aux_hidden_states_supported``),
what counts as specfleet's part of it (exactly what render() writes, each addition marked
MARK), the byte-exact edit (edit(), replacement_span()), the proof that the edit changed
nothing else (confirm()), the traces of a check left in a release known to have removed it
(eagle3_traces(), removes_the_check()), and the records of one run (Target, Plan).

Nothing here reads or writes a file, runs a process or imports Ansible: the module does that.
Standard library only; the module may run under the target's interpreter (Python 3.9+).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

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
