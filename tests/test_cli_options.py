"""The command line: ansible-playbook's options as specfleet takes them, checked before anything
runs, and bad input reported as such (exit 2; in JSON with --json)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from specfleet.controller.cli import build_parser, main
from specfleet.controller.runopts import (
    VAULT_PROMPT,
    BadInput,
    RunOptions,
    merge_extra_vars,
    parse_extra_vars,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ml_stack_lock=cpu", {"ml_stack_lock": "cpu"}),
        ("a=1 b='two words'", {"a": "1", "b": "two words"}),
        ('{"port": 8001, "flags": [1, 2]}', {"port": 8001, "flags": [1, 2]}),
        ("{vllm_server_port: 8001}", {"vllm_server_port": 8001}),
    ],
    ids=["key=value", "several, quoted", "json", "inline yaml"],
)
def test_extra_vars_forms(value: str, expected: dict[str, object]) -> None:
    assert parse_extra_vars(value) == expected


def test_extra_vars_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "vars.yml").write_text("drafter_training_wait_timeout: 60\nlist: [a]\n")
    (tmp_path / "vars.json").write_text('{"x": {"y": 1}}')
    assert parse_extra_vars(f"@{tmp_path}/vars.yml") == {
        "drafter_training_wait_timeout": 60,
        "list": ["a"],
    }
    assert parse_extra_vars(f"@{tmp_path}/vars.json") == {"x": {"y": 1}}


def test_a_vault_encrypted_file_is_left_to_ansible(tmp_path: Path) -> None:
    (tmp_path / "secret.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    assert parse_extra_vars(f"@{tmp_path}/secret.yml") == {}


def test_inline_vaulted_values_are_left_to_ansible(tmp_path: Path) -> None:
    # `ansible-vault encrypt_string --name api_key` writes this form.
    (tmp_path / "vars.yml").write_text(
        "api_key: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\nname: !unsafe '{{ x }}'\n"
    )
    data = parse_extra_vars(f"@{tmp_path}/vars.yml")
    assert set(data) == {"api_key", "name"} and data["name"] == "{{ x }}"


def test_later_extra_vars_win() -> None:
    assert merge_extra_vars(["a=1 b=1", '{"b": 2}', "a=3"]) == {"a": "3", "b": 2}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("", "needs a value"),
        ("justaword", "expected key=value"),
        ("a='unbalanced", "failed at splitting"),
        ("@/nonexistent/vars.yml", "no such file"),
        ("/etc/vars.yml", "needs a leading @"),
        ("[1, 2]", "must be a mapping"),
        ("{a: [", "not valid YAML/JSON"),
    ],
)
def test_bad_extra_vars_are_refused(value: str, error: str) -> None:
    with pytest.raises(BadInput, match=error):
        parse_extra_vars(value)


def test_options_reach_ansible_playbook_as_the_operator_wrote_them(tmp_path: Path) -> None:
    vault = tmp_path / "vault-pass"
    vault.write_text("x\n")
    args = build_parser().parse_args(
        [
            "provision",
            "-i",
            "inventory/example",
            "-i",
            "extra,",
            "-l",
            "gpu-0*",
            "-e",
            "a=1",
            "--extra-vars",
            "@vars.yml",
            "--check",
            "--diff",
            "--vault-password-file",
            str(vault),
            "-vv",
        ]
    )
    assert args.inventory == ["inventory/example", "extra,"]
    assert args.limit == "gpu-0*"
    assert args.extra_vars == ["a=1", "@vars.yml"]
    assert args.verbose == 2
    options = RunOptions(
        inventories=tuple(args.inventory),
        extra_vars=tuple(args.extra_vars),
        check=args.check,
        diff=args.diff,
        vault_password_file=args.vault_password_file,
    )
    assert shlex.split(options.cmdline({"ml_stack_lock": "cpu"})) == [
        "-e",
        "a=1",
        "-e",
        "@vars.yml",
        "-e",
        '{"ml_stack_lock": "cpu"}',
        "--check",
        "--diff",
        "--vault-password-file",
        str(vault),
    ]


def test_ask_vault_pass_answers_ansible_playbooks_prompt() -> None:
    options = RunOptions(ask_vault_pass=True, vault_password="s3cret")
    assert "--ask-vault-pass" in options.cmdline()
    assert "s3cret" not in options.cmdline()
    assert options.passwords() == {VAULT_PROMPT: "s3cret"}


def test_the_default_inventory_is_the_lab() -> None:
    assert RunOptions().inventory_sources()[0].endswith("inventory/lab/hosts.yml")


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["provision", "-i", "/nonexistent/hosts.yml"], "inventory not found"),
        (["provision", "-e", "oops"], "expected key=value"),
        (["train", "--vault-password-file", "/nonexistent"], "vault password file not found"),
        (["upgrade", "--lock", "no-such-lock"], "locks/no-such-lock.txt"),
        (["provision", "--no-such-option"], "unrecognized arguments"),
        (["lab", "sideways"], "invalid choice"),
        (["status", "--json", "--quiet"], "not allowed with"),
    ],
)
def test_bad_input_is_exit_2_and_one_json_document(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*argv, "--json"] if "--json" not in argv else argv)
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 2
    assert doc["rc"] == 2 and doc["result"] == "bad_input"
    assert error in doc["error"]
    assert doc["runs"] == [] and doc["hosts"] == {}


def test_bad_input_without_json_says_why_on_one_screen(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["provision", "-i", "/nonexistent/hosts.yml"]) == 2
    out, _ = capsys.readouterr()
    assert "inventory not found: /nonexistent/hosts.yml" in out
    assert "bad input (exit 2)" in out


def test_help_lists_the_commands_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out, _ = capsys.readouterr()
    for word in ("provision", "upgrade", "train", "status", "lab", "exit codes:", "130"):
        assert word in out


def test_upgrade_checks_its_lock_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A checkout that has playbooks/upgrade.yml (main is writing it) but not the lock.
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "upgrade.yml").write_text("---\n")
    (tmp_path / "locks").mkdir()
    monkeypatch.setenv("SPECFLEET_ROOT", str(tmp_path))
    assert main(["upgrade", "--lock", "cpu-next", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "--lock cpu-next" in doc["error"] and "locks/cpu-next.txt" in doc["error"]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["lock", "nosuch"], "no stack spec"),
        (["wheelhouse", "nosuch"], "no stack spec"),
        (["key", "new", "no spaces"], "key name 'no spaces'"),
    ],
)
def test_every_command_reports_bad_input_as_exit_2_without_a_traceback(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert error in err and "Traceback" not in out + err
    assert f"specfleet {argv[0]}: " in err
    # The same with --json: one document, as the playbook commands give.
    assert main([*argv, "--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["rc"], doc["result"], doc["command"]) == (2, "bad_input", argv[0])
    assert error in doc["error"] and "Traceback" not in err


def test_a_local_command_that_succeeds_answers_with_what_it_made(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["key", "new", "team-search", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["rc"], doc["result"], doc["name"]) == (0, "ok", "team-search")
    assert doc["entry"] == {"name": "team-search", "sha256": doc["sha256"]}


def test_upgrade_checks_its_model_manifest_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--model's manifest is read by the hosts' own parser first: a missing one, or one that
    names a path outside the model's folder, is bad input and nothing runs."""
    assert main(["upgrade", "--model", str(tmp_path / "none.json"), "--json"]) == 2
    assert "--model: " in json.loads(capsys.readouterr().out)["error"]
    bad = tmp_path / "bad.json"
    entry = {"path": "../etc/x", "size": 1, "sha256": "0" * 64}
    document = {"format": 1, "name": "tiny", "source": "/m", "revision": "", "files": [entry]}
    bad.write_text(json.dumps(document))
    assert main(["upgrade", "--model", str(bad), "--json"]) == 2
    assert "no '.', '..'" in json.loads(capsys.readouterr().out)["error"]
