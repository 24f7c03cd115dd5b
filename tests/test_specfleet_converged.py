"""site.yml's fast path, without a lab: plugins/modules/specfleet_converged.py run by Ansible on
this machine (record, then check: nothing changed is converged; each kind of change is named
and sets the record aside; a tree changed in place is never recorded as the new normal),
the controller's digest of the inputs (plugins/action/specfleet_converged_inputs.py) and
the filters that pick the hosts that end at once (plugins/filter/converged.py). The lab's
test (tests/test_converge_fast_path.py) drifts a real host, one thing at a time."""

from __future__ import annotations

import grp
import json
import os
import pwd
from pathlib import Path
from typing import Any

import pytest
from conftest import Ansible, json_result, load_plugin

INPUTS = "a" * 64
OTHER_INPUTS = "b" * 64
converged_filters = load_plugin("plugins/filter/converged.py", "converged_filters")


def converged(ansible: Ansible, **options: Any) -> dict:
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [{"name": "converged", "specfleet.fleet.specfleet_converged": options}],
    }
    document = json_result(ansible.playbook([play], json_output=True))
    return document["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    """A host's managed things in a folder of the test's: files, a link, a venv-like tree
    with a managed source and its bytecode inside, an account and a package of this
    machine."""
    root = tmp_path / "host"
    venv = root / "venvs" / "ab12"
    (venv / "lib" / "vllm" / "__pycache__").mkdir(parents=True)
    (venv / "lib" / "vllm" / "speculative.py").write_text("WHITELIST = ['llama']\n")
    (venv / "lib" / "vllm" / "__pycache__" / "speculative.cpython-311.pyc").write_bytes(b"pyc")
    (venv / "lib" / "vllm" / "other.py").write_text("VALUE = 1\n")
    (root / "current").symlink_to(venv)
    (root / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    (root / "etc").mkdir(mode=0o755)
    record = root / "etc" / "converged.json"
    marker = root / "etc" / "converged-rebuild.json"
    manages = {
        "files": [
            str(root / "unit.service"),
            str(root / "current"),
            str(venv / "lib" / "vllm" / "speculative.py"),
        ],
        "trees": [str(root / "current")],
        "users": [pwd.getpwuid(os.geteuid()).pw_name],
        "groups": [grp.getgrgid(os.getegid()).gr_name],
        "packages": ["bash"],
    }
    return {
        "root": root,
        "venv": venv,
        "record": str(record),
        "marker": str(marker),
        "manages": manages,
    }


def record_attempt(ansible: Ansible, host: dict[str, Any], **extra: Any) -> dict:
    options = {"manages": host["manages"], "rebuild_marker": host["marker"], **extra}
    return converged(ansible, state="record", inputs=INPUTS, record=host["record"], **options)


def recorded(ansible: Ansible, host: dict[str, Any], **extra: Any) -> dict:
    result = record_attempt(ansible, host, **extra)
    assert not result.get("failed"), result
    return result


def checked(
    ansible: Ansible, host: dict[str, Any], inputs: str = INPUTS, state: str = "check"
) -> dict:
    options = {"record": host["record"], "rebuild_marker": host["marker"]}
    result = converged(ansible, state=state, inputs=inputs, **options)
    assert not result.get("failed"), result
    return result


def marked(host: dict[str, Any]) -> list[str]:
    path = Path(host["marker"])
    return list(json.loads(path.read_text())["trees"]) if path.exists() else []


def test_a_host_unchanged_since_its_record_is_converged(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    assert recorded(ansible, host)["recorded"] == 7
    record = json.loads(Path(host["record"]).read_text())
    assert record["inputs"] == INPUTS and os.stat(host["record"]).st_mode & 0o777 == 0o600
    assert checked(ansible, host) == checked(ansible, host)
    assert checked(ansible, host)["converged"] is True
    assert checked(ansible, host)["drift"] == []


CHANGES = {
    "a unit file edited": (
        lambda host: (host["root"] / "unit.service").write_text("[Service]\nExecStart=/bin/sh\n"),
        "files {root}/unit.service",
    ),
    "a file in the venv changed": (
        lambda host: (host["venv"] / "lib" / "vllm" / "other.py").write_text("VALUE = 2\n"),
        "trees {root}/current",
    ),
    "a file added to the venv": (
        lambda host: (host["venv"] / "lib" / "planted.pth").write_text("import os\n"),
        "trees {root}/current",
    ),
    "the whitelist reverted": (
        lambda host: (host["venv"] / "lib" / "vllm" / "speculative.py").write_text(
            "WHITELIST = []\n"
        ),
        "files {venv}/lib/vllm/speculative.py",
    ),
    "the link moved": (
        lambda host: (
            (host["root"] / "current").unlink(),
            (host["root"] / "current").symlink_to(host["root"]),
        ),
        "files {root}/current",
    ),
    "a file's mode changed": (
        lambda host: (host["root"] / "unit.service").chmod(0o666),
        "files {root}/unit.service",
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_change_is_named_and_sets_the_record_aside(
    ansible: Ansible, host: dict[str, Any], change: str
) -> None:
    recorded(ansible, host)
    make, key = CHANGES[change]
    make(host)
    result = checked(ansible, host)
    expected = key.format(root=host["root"], venv=host["venv"])
    assert result["converged"] is False
    assert [line.split(": ")[0] for line in result["drift"]][:1] == [expected], result["drift"]
    # Set aside, never trusted again: only a full converge that ends records the host anew.
    assert not Path(host["record"]).exists() and Path(host["record"] + ".drifted").exists()
    assert checked(ansible, host)["drift"] == ["no record of a full converge on this host"]


def test_the_managed_source_and_bytecode_caches_are_left_out_of_their_tree(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    """Its own role rewrites the whitelist's source: the tree must not see that rewrite, or
    the record would refuse a repair as a change in place. Bytecode caches change when a
    root process imports a module first (a preflight, a gate)."""
    recorded(ansible, host)
    (host["venv"] / "lib" / "vllm" / "__pycache__" / "speculative.cpython-311.pyc").unlink()
    (host["venv"] / "lib" / "vllm" / "__pycache__" / "other.cpython-311.pyc").write_bytes(b"x")
    (host["venv"] / "lib" / "__pycache__").mkdir()
    assert checked(ansible, host)["converged"] is True


def test_changed_inputs_are_drift(ansible: Ansible, host: dict[str, Any]) -> None:
    recorded(ansible, host)
    result = checked(ansible, host, inputs=OTHER_INPUTS)
    assert result["converged"] is False
    assert result["drift"][0].startswith("inputs: ")


def test_a_record_others_could_write_is_not_trusted(ansible: Ansible, host: dict[str, Any]) -> None:
    recorded(ansible, host)
    Path(host["record"]).parent.chmod(0o777)
    assert checked(ansible, host)["drift"] == ["the record's folder is not root's alone"]


def test_a_tree_changed_in_place_is_marked_for_its_role_to_build_anew(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    recorded(ansible, host)
    (host["venv"] / "lib" / "vllm" / "other.py").write_text("VALUE = 2\n")
    result = checked(ansible, host)
    assert result["converged"] is False and result["rebuild"] == [str(host["venv"])]
    assert marked(host) == [str(host["venv"])]
    # No role built it anew in this run: the change is refused as the new normal, and the
    # mark stays for the next converge.
    refused = record_attempt(ansible, host)
    assert refused["failed"] and refused["changed_trees"] == [str(host["venv"])]
    assert "changed in place" in refused["msg"]
    assert not Path(host["record"]).exists() and marked(host) == [str(host["venv"])]
    # Built anew by its role in this run: its new content is the baseline; the mark and the
    # record set aside are gone.
    manages = {**host["manages"], "rebuilt": [str(host["venv"])]}
    assert recorded(ansible, {**host, "manages": manages})["recorded"] == 7
    assert not Path(host["record"] + ".drifted").exists() and marked(host) == []
    assert checked(ansible, host)["converged"] is True


def test_a_tree_inside_one_built_anew_was_built_with_it(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    """The lab's drafter lives in its models' folder: generated again with them."""
    inner = str(host["venv"] / "lib")
    host = {**host, "manages": {**host["manages"], "trees": [str(host["root"] / "current"), inner]}}
    recorded(ansible, host)
    (host["venv"] / "lib" / "vllm" / "other.py").write_text("VALUE = 2\n")
    assert checked(ansible, host)["rebuild"] == sorted([str(host["venv"]), inner])
    manages = {**host["manages"], "rebuilt": [str(host["venv"])]}
    recorded(ansible, {**host, "manages": manages})


def test_full_sets_the_record_aside_and_still_marks_what_changed_in_place(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    recorded(ansible, host)
    unchanged = checked(ansible, host, state="absent")
    assert unchanged["converged"] is False and unchanged["drift"] == []
    assert not Path(host["record"]).exists() and marked(host) == []
    recorded(ansible, host)
    (host["venv"] / "lib" / "vllm" / "other.py").write_text("VALUE = 2\n")
    assert checked(ansible, host, state="absent")["rebuild"] == [str(host["venv"])]
    assert marked(host) == [str(host["venv"])]


def test_a_tree_at_a_new_path_is_a_new_baseline(ansible: Ansible, host: dict[str, Any]) -> None:
    """A new venv (an upgrade), a new drafter (a publication): the link moves."""
    recorded(ansible, host)
    other = host["root"] / "venvs" / "cd34"
    other.mkdir()
    (host["root"] / "current").unlink()
    (host["root"] / "current").symlink_to(other)
    recorded(ansible, host)
    assert checked(ansible, host)["converged"] is True


def test_a_role_that_cannot_be_read_in_one_call_always_takes_the_full_converge(
    ansible: Ansible, host: dict[str, Any]
) -> None:
    recorded(ansible, host, manages={**host["manages"], "full_only": ["nvidia_gpu: why"]})
    assert checked(ansible, host)["drift"] == ["nvidia_gpu: why"]


def test_bad_input_records_nothing(ansible: Ansible, host: dict[str, Any]) -> None:
    result = record_attempt(ansible, host, manages={"files": ["/etc/hostname"], "sockets": ["x"]})
    assert result["failed"] and "unknown kinds ['sockets']" in result["msg"]
    result = converged(ansible, state="check", inputs="short", record=host["record"])
    assert result["failed"] and "64 hex digits" in result["msg"]
    assert not Path(host["record"]).exists()


def test_a_removed_package_and_account_are_drift(ansible: Ansible, host: dict[str, Any]) -> None:
    manages = {**host["manages"], "packages": ["bash", "no-such-package"], "users": ["nobody"]}
    recorded(ansible, host, manages=manages)
    record = json.loads(Path(host["record"]).read_text())
    assert record["state"]["packages no-such-package"] == "absent"
    assert record["state"]["packages bash"] != "absent"
    assert record["state"]["users nobody"].startswith(f"{pwd.getpwnam('nobody').pw_uid}:")


# ---------------------------------------------------------------- the filters


def results(**converged_by_host: bool) -> dict[str, dict]:
    return {
        host: {"__specfleet_converged": {"converged": value}}
        for host, value in converged_by_host.items()
    }


GROUPS = {"gpu_hosts": ["s1", "s2"], "loadbalancers": ["lb"], "monitoring": ["mon"]}


@pytest.mark.parametrize(
    ("state", "fast"),
    [
        ({"s1": True, "s2": True, "lb": True, "mon": True}, ["lb", "mon", "s1", "s2"]),
        # A server that drifted: the balancer and Prometheus take the full converge with it.
        ({"s1": False, "s2": True, "lb": True, "mon": True}, ["s2"]),
        # A balancer that drifted (a server left out of rotation): every host does.
        ({"s1": True, "s2": True, "lb": False, "mon": True}, []),
        ({"s1": True, "s2": True, "lb": True, "mon": False}, ["lb", "s1", "s2"]),
    ],
)
def test_which_hosts_end_at_once(state: dict[str, bool], fast: list[str]) -> None:
    report = converged_filters.fast_path_report(results(**state), list(state), GROUPS)
    assert sorted(host for host, row in report.items() if row["ends_here"]) == fast
    for row in report.values():
        assert row["ends_here"] == (row["why"] == [])


def test_the_report_says_why_a_host_does_not_end_here() -> None:
    hostvars = {
        "s1": {"__specfleet_converged": {"converged": False, "drift": ["units x: a -> b"]}},
        "s2": results(s2=True)["s2"],
        "lb": results(lb=True)["lb"],
        "ghost": {},
    }
    report = converged_filters.fast_path_report(hostvars, list(hostvars), GROUPS)
    assert report["s1"] == {"ends_here": False, "why": ["units x: a -> b"]}
    assert report["s2"] == {"ends_here": True, "why": []}
    assert report["lb"] == {"ends_here": False, "why": ["s1 takes the full converge"]}
    assert report["ghost"]["why"] == ["no check (unreachable or failed)"]


def test_the_roles_declarations_are_merged() -> None:
    merged = converged_filters.merged_manages(
        [{"files": ["/b", "/a"], "units": ["x.service"]}, {"files": ["/a", "/c"]}]
    )
    assert merged == {"files": ["/a", "/b", "/c"], "units": ["x.service"]}
    with pytest.raises(Exception, match="a list, not the text"):
        converged_filters.merged_manages([{"files": "/a"}])


# ---------------------------------------------------------------- the inputs


def inputs_digest(ansible: Ansible, tmp_path: Path, inventory: str, *args: str) -> str:
    (tmp_path / "inventory.yml").write_text(inventory)
    play = {
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {
                "name": "inputs",
                "specfleet.fleet.specfleet_converged_inputs": {
                    "ignore": ["specfleet_full"],
                    "controller_files": ["manifest"],
                },
                "run_once": True,
            }
        ],
    }
    process = ansible.playbook(
        [play], None, *args, inventory=str(tmp_path / "inventory.yml"), json_output=True
    )
    document = json_result(process)
    result = next(iter(document["plays"][0]["tasks"][0]["hosts"].values()))
    assert not result.get("failed"), result
    return str(result["digest"])


INVENTORY = """
all:
  vars: {{ansible_connection: local}}
  children:
    gpu_hosts:
      hosts:
        s1: {{key: "{{{{ lookup('file', '{key}') }}}}", port: 8000}}
        s2: {{port: {port}}}
"""


def test_the_inputs_digest_follows_every_host_s_variables_as_they_template(
    ansible: Ansible, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("first")
    first = inputs_digest(ansible, tmp_path, INVENTORY.format(key=key, port=8000))
    assert inputs_digest(ansible, tmp_path, INVENTORY.format(key=key, port=8000)) == first
    # What a run says about itself is left out: verbosity, forks, the fast path's switch.
    inventory = INVENTORY.format(key=key, port=8000)
    assert inputs_digest(ansible, tmp_path, inventory, "-v", "-f", "3") == first
    assert inputs_digest(ansible, tmp_path, inventory, "-e", "specfleet_full=true") == first
    # Another host's port (the balancer names every server), a key read through a lookup,
    # an extra var: each is a new digest.
    assert inputs_digest(ansible, tmp_path, INVENTORY.format(key=key, port=8001)) != first
    assert inputs_digest(ansible, tmp_path, inventory, "-e", "specfleet_x=1") != first
    key.write_text("rotated")
    assert inputs_digest(ansible, tmp_path, inventory) != first


def test_a_controller_file_named_by_a_variable_counts_by_its_content(
    ansible: Ansible, tmp_path: Path
) -> None:
    """A model pinned again at the same path (the role reads the manifest on the
    controller) is a new digest, though no variable's value changed."""
    manifest = tmp_path / "model.json"
    inventory = INVENTORY.format(key=tmp_path / "key", port=8000).replace(
        "s2: {port: 8000}", f"s2: {{port: 8000, manifest: {manifest}}}"
    )
    (tmp_path / "key").write_text("k")
    absent = inputs_digest(ansible, tmp_path, inventory)
    manifest.write_text('{"revision": "a"}')
    first = inputs_digest(ansible, tmp_path, inventory)
    assert first != absent
    assert inputs_digest(ansible, tmp_path, inventory) == first
    manifest.write_text('{"revision": "b"}')
    assert inputs_digest(ansible, tmp_path, inventory) != first


# ------------------------------------------- the whitelist, on a vLLM that has one


def test_a_reverted_whitelist_is_named_and_the_role_s_next_run_edits_it_again(
    ansible: Ansible, tmp_path: Path
) -> None:
    """The lab's vLLMs (0.31, 0.32) have no whitelist; this one (0.21.0, its real files)
    does: the role edits it, says it manages the source by its content, and the venv's tree
    leaves the source out. Reverted to vLLM's own bytes, the host's one call names the
    source; the role's next run (the full converge) edits it again, and the record holds."""
    from vllm_releases import FakeVllm

    vllm = FakeVllm(tmp_path / "vllm", "0.21.0")
    assert vllm.source is not None
    original = vllm.source.read_bytes()
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    record, marker = etc / "converged.json", etc / "converged-rebuild.json"
    role_vars = {
        "vllm_eagle3_patch_python": str(vllm.python),
        "specfleet_model": str(model),
        "specfleet_whitelist_record": str(etc / "eagle3-whitelist.json"),
        "vllm_eagle3_patch_preflight": False,
    }
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "roles": [{"role": "vllm_eagle3_patch"}],
        "tasks": [
            {
                "name": "record",
                "specfleet.fleet.specfleet_converged": {
                    "state": "record",
                    "inputs": INPUTS,
                    "record": str(record),
                    "rebuild_marker": str(marker),
                    "manages": "{{ __vllm_eagle3_patch_manages"
                    f" | combine({{'trees': ['{vllm.site}']}}) }}}}",
                },
            }
        ],
    }
    host = {"record": str(record), "marker": str(marker)}
    first = ansible.playbook([play], role_vars)
    assert first.returncode == 0, first.stdout + first.stderr
    assert vllm.source.read_bytes() != original
    assert checked(ansible, host)["converged"] is True

    vllm.source.write_bytes(original)
    result = checked(ansible, host)
    assert [line.split(": ")[0] for line in result["drift"]] == [f"files {vllm.source}"]
    assert result["rebuild"] == []

    again = ansible.playbook([play], role_vars)
    assert again.returncode == 0, again.stdout + again.stderr
    assert vllm.source.read_bytes() != original
    assert checked(ansible, host)["converged"] is True
