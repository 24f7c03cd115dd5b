"""What an operator asks ansible-playbook for: inventories, limit, extra vars, check, vault.

The CLI takes these options as ``ansible-playbook`` spells them and checks them before
anything runs, so that a typo is a clear "bad input" error and never a half-run. The extra
vars are then handed to ansible-playbook as the operator wrote them (``-e`` strings on its
command line), so Ansible applies its own rules to them: later ones win, ``@file`` may be
vault-encrypted, ``key=value`` values are strings.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleError
from ansible.parsing.splitter import parse_kv

from specfleet.controller.errors import BadInput
from specfleet.controller.paths import repo_root

#: ansible-playbook's prompt for --ask-vault-pass (ansible-runner answers it for us).
VAULT_PROMPT = r"Vault password:\s*?$"
_VAULT_HEADER = "$ANSIBLE_VAULT"


def parse_extra_vars(value: str) -> dict[str, Any]:
    """One ``-e`` value as Ansible reads it: ``@file``, inline YAML/JSON, or ``key=value ...``.

    Raises BadInput for what ansible-playbook would refuse or misread. A vault-encrypted
    file reads as ``{}`` here (only ansible-playbook holds the password).
    """
    text = value.strip()
    if not text:
        raise BadInput("-e needs a value (key=value, @file or JSON)")
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        if not path.is_file():
            raise BadInput(f"-e {value}: no such file")
        content = path.read_text()
        if content.startswith(_VAULT_HEADER):
            return {}
        data = _load_yaml(content, f"-e {value}")
    elif text[0] in "[{":
        data = _load_yaml(text, f"-e {value}")
    elif text[0] in "/.":
        # Ansible refuses a bare path too: it is almost always a forgotten @.
        raise BadInput(f"-e {value}: a file needs a leading @ (-e @{text})")
    else:
        try:
            data = parse_kv(text)
        except AnsibleError as error:
            raise BadInput(f"-e {value}: {error.message}") from error
        if "_raw_params" in data or any(not key for key in data):
            raise BadInput(f"-e {value}: expected key=value (or @file, or JSON)")
    if not isinstance(data, dict):
        raise BadInput(f"-e {value}: must be a mapping, not {type(data).__name__}")
    return data


class _AnsibleTagsLoader(yaml.SafeLoader):
    """YAML as Ansible writes it: `!vault` and `!unsafe` values are read as plain nodes (only
    ansible-playbook can decrypt; here the shape of the document is what is checked)."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_AnsibleTagsLoader.add_multi_constructor("!", _any_tag)


def _load_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_AnsibleTagsLoader)
    except yaml.YAMLError as error:
        raise BadInput(f"{where}: not valid YAML/JSON ({error})") from error


def merge_extra_vars(values: Sequence[str]) -> dict[str, Any]:
    """All ``-e`` values, later ones winning (Ansible's default hash_behaviour=replace)."""
    merged: dict[str, Any] = {}
    for value in values:
        merged.update(parse_extra_vars(value))
    return merged


def default_inventory() -> Path:
    """ansible.cfg's inventory: the lab."""
    return repo_root() / "inventory" / "lab" / "hosts.yml"


@dataclass(frozen=True)
class RunOptions:
    """ansible-playbook's options, as the operator gave them."""

    inventories: tuple[str, ...] = ()
    limit: str | None = None
    extra_vars: tuple[str, ...] = ()
    check: bool = False
    diff: bool = False
    vault_password_file: str | None = None
    ask_vault_pass: bool = False
    verbosity: int = 0
    #: The vault password read by the CLI for --ask-vault-pass (never on a command line).
    vault_password: str | None = field(default=None, repr=False)

    def validate(self) -> None:
        """Raise BadInput before anything runs."""
        for inventory in self.inventories:
            # "host1,host2," is a host list, as with ansible-playbook -i.
            if "," not in inventory and not Path(inventory).expanduser().exists():
                raise BadInput(f"inventory not found: {inventory}")
        for value in self.extra_vars:
            parse_extra_vars(value)
        if self.vault_password_file and not Path(self.vault_password_file).expanduser().is_file():
            raise BadInput(f"vault password file not found: {self.vault_password_file}")
        if self.ask_vault_pass and self.vault_password_file:
            raise BadInput("--ask-vault-pass and --vault-password-file exclude each other")

    def inventory_sources(self) -> list[str]:
        return list(self.inventories) or [str(default_inventory())]

    def cmdline(self, more_extra_vars: Mapping[str, Any] | None = None) -> str:
        """The options ansible-runner passes to ansible-playbook as they are (shell-quoted)."""
        args: list[str] = []
        for value in self.extra_vars:
            args += ["-e", value]
        if more_extra_vars:
            # The command's own variables (--lock) come last: they win over -e.
            args += ["-e", json.dumps(dict(more_extra_vars), sort_keys=True)]
        if self.check:
            args.append("--check")
        if self.diff:
            args.append("--diff")
        if self.vault_password_file:
            args += ["--vault-password-file", str(Path(self.vault_password_file).expanduser())]
        if self.ask_vault_pass:
            args.append("--ask-vault-pass")
        return shlex.join(args)

    def passwords(self) -> dict[str, str]:
        """ansible-runner's answers to ansible-playbook's prompts."""
        if self.ask_vault_pass and self.vault_password is not None:
            return {VAULT_PROMPT: self.vault_password}
        return {}
