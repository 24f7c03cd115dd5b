"""Start vLLM's OpenAI-compatible server with its API key read from a file, in-process.

``python -m specfleet.host.serve <vLLM server arguments>`` is the vllm_server unit's ExecStart. The
key is in a file the unit names with ``SPECFLEET_API_KEY_FILE`` (root-owned, readable by the
server's group alone: not by the training job's account). vLLM takes its key from
``--api-key`` (visible in /proc/<pid>/cmdline to every process of the account, and logged
with the non-default arguments) or from the environment variable ``VLLM_API_KEY`` (visible in
/proc/<pid>/environ of the server and of every engine process it spawns). Neither is used:
the key is handed to vLLM's settings module in this process only, then vLLM runs here as
``python -m vllm.entrypoints.openai.api_server`` would.

(systemd's ``LoadCredential=`` would hand the file over as well; it is not used because it
cannot be shown to work in the systemd containers this project is tested in, where the
service's credential folder stays empty.)
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KEY_FILE_VARIABLE = "SPECFLEET_API_KEY_FILE"


def read_api_key() -> str | None:
    """The key in the file the unit names, if it names one."""
    name = os.environ.get(KEY_FILE_VARIABLE)
    if not name:
        return None
    key = Path(name).read_text().strip()
    if not key:
        raise SystemExit(f"specfleet.host.serve: {name} is empty")
    return key


def hand_key_to_vllm(key: str) -> None:
    """Make vLLM's ``envs.VLLM_API_KEY`` answer ``key`` without putting it in os.environ.

    vllm.envs reads each setting through a callable in ``environment_variables`` (every
    release from 0.8 to 0.32); replacing that one callable changes nothing else.
    """
    import vllm.envs as envs

    if "VLLM_API_KEY" not in envs.environment_variables:
        raise SystemExit("specfleet.host.serve: this vLLM has no VLLM_API_KEY setting")
    envs.environment_variables["VLLM_API_KEY"] = lambda: key


def main(argv: list[str]) -> None:
    if "VLLM_API_KEY" in os.environ or any(arg.startswith("--api-key") for arg in argv):
        raise SystemExit("specfleet.host.serve: the key comes from its file only")
    key = read_api_key()
    if key:
        hand_key_to_vllm(key)
    sys.argv = [SERVER_MODULE, *argv]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
