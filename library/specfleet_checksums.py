#!/usr/bin/python
"""Ansible module specfleet_checksums: the sha1 of files and of every file in folders, and a
record's text, in one call.

Why a module: deciding whether a server must restart compares what it runs now (its unit,
environment, key, helper, stack manifest, whitelist record and drafter files) with the
record written when its gate last passed. As ``stat`` in a loop, ``find`` and ``slurp``
that was a round trip per file, the slowest part of a re-run that changes nothing. The
checksums are the ones ``ansible.builtin.stat`` and ``find`` report (sha1), so a record
written by either reads the same.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: specfleet_checksums
short_description: sha1 of files and of folders' files, and a record's text, in one call
description:
  - Reads only; changes nothing.
options:
  files:
    description: Files to checksum; a missing or unreadable one has no checksum.
    type: list
    elements: path
    default: []
  folders:
    description:
      - Folders whose regular files (hidden ones too, links followed, as
        C(ansible.builtin.find) with C(recurse), C(follow) and C(hidden)) are checksummed.
      - A missing folder has no files.
    type: list
    elements: path
    default: []
  record:
    description: A text file to read back (the record of the last comparison).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Checksum what the server runs and read the record of what it last ran
  specfleet_checksums:
    files: [/etc/systemd/system/specfleet-vllm.service, /etc/specfleet/vllm.env]
    folders: [/var/lib/specfleet/drafters/current]
    record: /var/lib/specfleet/vllm-served.sha1
"""

RETURN = r"""
files:
  description: Each of I(files), in order, with its sha1 (null when missing or unreadable).
  type: list
  elements: dict
  returned: always
folder_files:
  description: Every regular file of I(folders) with its sha1, sorted by path.
  type: list
  elements: dict
  returned: always
record:
  description: The text of I(record); null when it is absent.
  type: str
  returned: always
"""

import hashlib  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _sha1(path: str) -> str | None:
    # stat's and find's checksum (a change detector, not a security boundary).
    digest = hashlib.sha1()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _folder_files(folder: str) -> list[str]:
    found = []
    for parent, _, names in os.walk(folder, followlinks=True):
        found.extend(
            path for path in (os.path.join(parent, name) for name in names) if os.path.isfile(path)
        )
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "list", "elements": "path", "default": []},
            "folders": {"type": "list", "elements": "path", "default": []},
            "record": {"type": "path"},
        },
        supports_check_mode=True,
    )
    files = [{"path": path, "checksum": _sha1(path)} for path in module.params["files"]]
    in_folders = sorted(
        path for folder in module.params["folders"] for path in _folder_files(folder)
    )
    folder_files = [{"path": path, "checksum": _sha1(path)} for path in in_folders]
    record = None
    if module.params["record"]:
        try:
            with open(module.params["record"], encoding="utf-8") as handle:
                record = handle.read()
        except FileNotFoundError:
            pass
        except OSError as error:
            module.fail_json(msg=f"cannot read {module.params['record']}: {error}")
    module.exit_json(changed=False, files=files, folder_files=folder_files, record=record)


if __name__ == "__main__":
    main()
