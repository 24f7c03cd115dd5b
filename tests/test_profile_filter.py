"""plugins/filter/profile.py: a role's profile vars file, or a message naming the setting."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from conftest import ROOT, load_plugin

profile = load_plugin("plugins/filter/profile.py", "specfleet_profile_filter")

ML_STACK = ROOT / "roles" / "ml_stack"


@pytest.mark.parametrize("name", ["cpu", "cuda"])
def test_a_profile_is_its_vars_file(name: str) -> None:
    assert profile.profile_vars_file(name, str(ML_STACK)) == str(ML_STACK / "vars" / f"{name}.yml")


@pytest.mark.parametrize("name", ["tpu", "main", "../defaults/main", ".hidden", ""])
def test_anything_else_names_the_setting_and_the_profiles(name: str) -> None:
    with pytest.raises(AnsibleFilterError) as error:
        profile.profile_vars_file(name, str(ML_STACK))
    assert str(error.value) == (
        f"specfleet_accelerator is {name!r}, which is not a profile of role ml_stack "
        "(its profiles: cpu, cuda). Nothing was changed."
    )
