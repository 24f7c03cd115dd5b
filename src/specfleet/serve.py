"""Start vLLM's OpenAI-compatible server with its API key from a systemd credential.

``python -m specfleet.serve <vLLM server arguments>`` is the vllm_server unit's ExecStart. The
unit loads the key with ``LoadCredential=api-key:<root-only file>``; systemd places it in
``$CREDENTIALS_DIRECTORY/api-key``, readable by this service alone. vLLM takes its key from
``--api-key`` (visible in /proc/<pid>/cmdline to every process of the account, and logged
with the non-default arguments) or from the environment variable ``VLLM_API_KEY`` (visible in
/proc/<pid>/environ of the server and of every engine process it spawns). Neither is used:
the key is handed to vLLM's settings module in this process only, then vLLM runs here as
``python -m vllm.entrypoints.openai.api_server`` would.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CREDENTIAL = "api-key"


def read_api_key() -> str | None:
    """The key systemd loaded for this service, if any."""
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    path = Path(folder) / CREDENTIAL
    if not path.is_file():
        return None
    key = path.read_text().strip()
    return key or None


def hand_key_to_vllm(key: str) -> None:
    """Make vLLM's ``envs.VLLM_API_KEY`` answer ``key`` without putting it in os.environ.

    vllm.envs reads each setting through a callable in ``environment_variables`` (every
    release from 0.8 to 0.32); replacing that one callable changes nothing else.
    """
    import vllm.envs as envs

    if "VLLM_API_KEY" not in envs.environment_variables:
        raise SystemExit("specfleet.serve: this vLLM has no VLLM_API_KEY setting")
    envs.environment_variables["VLLM_API_KEY"] = lambda: key


def main(argv: list[str]) -> None:
    if "VLLM_API_KEY" in os.environ or any(arg.startswith("--api-key") for arg in argv):
        raise SystemExit("specfleet.serve: the key comes from the credential only")
    key = read_api_key()
    if key:
        hand_key_to_vllm(key)
    sys.argv = [SERVER_MODULE, *argv]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
