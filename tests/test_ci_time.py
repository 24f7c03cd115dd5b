"""benchmarks/ci_time.py: the seconds of each test file, Molecule phase and task, read back
from logs in the formats pytest and profile_tasks write them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("ci_time", ROOT / "benchmarks" / "ci_time.py")
assert spec and spec.loader
ci_time = importlib.util.module_from_spec(spec)
sys.modules["ci_time"] = ci_time  # its dataclass looks itself up there
spec.loader.exec_module(ci_time)

# Two phases of one scenario, as Molecule and profile_tasks log them: each task's header is
# stamped with the previous task's seconds; the stamp after the recap closes the last task.
MOLECULE_LOG = """\
INFO     [demo > converge] Executing

PLAY [Converge] *****************************************************************

TASK [Gathering Facts] *********************************************************
Tuesday 01 December 2026  17:04:46 +0000 (0:00:00.250)       0:00:00.250 ******
ok: [sf-demo]

TASK [ml_stack : Build the venv] ***********************************************
Tuesday 01 December 2026  17:04:48 +0000 (0:00:02.000)       0:00:02.250 ******
changed: [sf-demo]

TASK [vllm_server : Run the health gate] ***************************************
Tuesday 01 December 2026  17:06:28 +0000 (0:01:40.500)       0:01:42.750 ******
ok: [sf-demo]

PLAY RECAP *********************************************************************
sf-demo                    : ok=3    changed=1    unreachable=0    failed=0

Tuesday 01 December 2026  17:07:00 +0000 (0:00:31.250)       0:02:14.000 ******
===============================================================================
vllm_server : Run the health gate -------------------------------------- 31.25s
INFO     [demo > converge] Executed: Successful
INFO     [demo > idempotence] Executing

TASK [vllm_server : Run the health gate] ***************************************
Tuesday 01 December 2026  17:08:00 +0000 (0:00:00.100)       0:00:00.100 ******
ok: [sf-demo]

PLAY RECAP *********************************************************************
Tuesday 01 December 2026  17:08:04 +0000 (0:00:04.000)       0:00:04.100 ******
"""

PYTEST_LOG = """\
============================= slowest durations ==============================
1203.51s call     tests/test_molecule_scenarios.py::test_scenario[fleet]
2.00s setup    tests/test_molecule_scenarios.py::test_scenario[fleet]
10.25s call     tests/test_gate.py::test_one
0.01s teardown tests/test_gate.py::test_one
"""


def test_each_task_gets_the_seconds_the_next_stamp_reports(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    log.write_text(MOLECULE_LOG)
    scenario = ci_time.read_scenario(log)
    assert scenario.tasks == pytest.approx({
        "Gathering Facts": 2.0,
        "ml_stack : Build the venv": 100.5,
        "vllm_server : Run the health gate": 31.25 + 4.0,
    })  # fmt: skip
    assert scenario.phases == pytest.approx({"converge": 2.0 + 100.5 + 31.25, "idempotence": 4.0})


def test_durations_are_summed_per_test_file(tmp_path: Path) -> None:
    log = tmp_path / "pytest.log"
    log.write_text(PYTEST_LOG)
    assert ci_time.read_durations(log) == pytest.approx(
        {"tests/test_molecule_scenarios.py": 1205.51, "tests/test_gate.py": 10.26}
    )
