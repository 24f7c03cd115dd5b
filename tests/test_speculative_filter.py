"""plugins/filter/speculative.py: the --speculative-config JSON, called directly and by Ansible."""

from __future__ import annotations

import json
import subprocess

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT, load_plugin

PLUGIN = ROOT / "plugins" / "filter" / "speculative.py"

speculative = load_plugin("plugins/filter/speculative.py", "specfleet_speculative_filter")
speculative_config = speculative.speculative_config

BASE = {"method": "eagle3", "model": "/srv/drafter", "num_speculative_tokens": 3}


def test_compact_sorted_json():
    out = speculative_config(BASE)
    assert out == '{"method":"eagle3","model":"/srv/drafter","num_speculative_tokens":3}'
    assert " " not in out
    assert json.loads(out) == BASE


def test_key_order_does_not_change_output():
    reordered = {"num_speculative_tokens": 3, "model": "/srv/drafter", "method": "eagle3"}
    assert speculative_config(reordered) == speculative_config(BASE)


def test_draft_tensor_parallel_size_included_when_set():
    out = json.loads(speculative_config({**BASE, "draft_tensor_parallel_size": 1}))
    assert out["draft_tensor_parallel_size"] == 1


@pytest.mark.parametrize("empty", [None, ""])
def test_draft_tensor_parallel_size_omitted_when_empty(empty):
    out = json.loads(speculative_config({**BASE, "draft_tensor_parallel_size": empty}))
    assert "draft_tensor_parallel_size" not in out


def test_digit_strings_are_accepted_as_integers():
    out = json.loads(speculative_config({**BASE, "num_speculative_tokens": "5"}))
    assert out["num_speculative_tokens"] == 5


def test_trailing_slash_of_model_dropped():
    out = json.loads(speculative_config({**BASE, "model": "/srv/drafter/"}))
    assert out["model"] == "/srv/drafter"


def test_path_with_quotes_stays_valid_json():
    out = speculative_config({**BASE, "model": '/srv/a "quoted" dir'})
    assert json.loads(out)["model"] == '/srv/a "quoted" dir'


@pytest.mark.parametrize("tokens", [1, 16])
def test_token_bounds_inclusive(tokens):
    out = json.loads(speculative_config({**BASE, "num_speculative_tokens": tokens}))
    assert out["num_speculative_tokens"] == tokens


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_speculative_tokens": 0}, "must be in 1..16, got 0"),
        ({"num_speculative_tokens": 17}, "must be in 1..16, got 17"),
        ({"num_speculative_tokens": -2}, "must be in 1..16"),
        ({"num_speculative_tokens": True}, "must be an integer"),
        ({"num_speculative_tokens": "three"}, "must be an integer"),
        ({"num_speculative_tokens": 2.5}, "must be an integer"),
        ({"method": "eagle4"}, "unknown method 'eagle4'"),
        ({"method": ""}, "'method' is required"),
        ({"model": ""}, "method eagle3 needs 'model'"),
        ({"model": "relative/dir"}, "must be an absolute path"),
        ({"draft_tensor_parallel_size": 0}, "draft_tensor_parallel_size must be >= 1"),
        ({"speculative_model": "/x"}, "unknown key(s) speculative_model"),
    ],
)
def test_rejections(change, message):
    with pytest.raises(AnsibleFilterError) as error:
        speculative_config({**BASE, **change})
    assert message in str(error.value)


def test_missing_token_count():
    with pytest.raises(AnsibleFilterError, match="'num_speculative_tokens' is required"):
        speculative_config({"method": "eagle3", "model": "/d"})


def test_not_a_dict():
    with pytest.raises(AnsibleFilterError, match="expects a dict, got str"):
        speculative_config("eagle3")  # type: ignore[arg-type]


def test_methods_without_drafter_need_no_model():
    out = json.loads(speculative_config({"method": "ngram", "num_speculative_tokens": 4}))
    assert out == {"method": "ngram", "num_speculative_tokens": 4}


def test_eagle3_in_known_methods():
    from specfleet.host.speculative import DRAFT_CHECKPOINT_METHODS, VLLM_SPECULATIVE_METHODS

    assert "eagle3" in VLLM_SPECULATIVE_METHODS
    assert DRAFT_CHECKPOINT_METHODS <= VLLM_SPECULATIVE_METHODS


def _ansible_debug(ansible, expression: str) -> subprocess.CompletedProcess[str]:
    return ansible.adhoc(
        "ansible.builtin.debug",
        f"msg={{{{ {expression} }}}}",
        env={"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"},
    )


def test_filter_through_ansible(ansible):
    result = _ansible_debug(
        ansible,
        "{'method': 'eagle3', 'model': '/srv/d', 'num_speculative_tokens': 3}"
        " | specfleet.fleet.speculative_config",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The default callback prints msg as a JSON string: quotes are escaped.
    expected = '{"method":"eagle3","model":"/srv/d","num_speculative_tokens":3}'
    assert json.dumps(expected) in result.stdout


def test_filter_error_through_ansible(ansible):
    result = _ansible_debug(
        ansible,
        "{'method': 'eagle3', 'model': '/srv/d', 'num_speculative_tokens': 40}"
        " | specfleet.fleet.speculative_config",
    )
    assert result.returncode != 0
    assert "num_speculative_tokens must be in 1..16, got 40" in result.stdout + result.stderr
