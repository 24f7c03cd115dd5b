"""benchmarks/acceptance_curve.py's arithmetic: the fit of acceptance against ln(prompts)
and the prompts it predicts for a goal; engine_binding.py's server settings (the curve's and
the bindings' runs themselves are the benchmarks)."""

from __future__ import annotations

import math
import sys

import pytest

from specfleet.controller.paths import repo_root

sys.path.insert(0, str(repo_root() / "benchmarks"))
import acceptance_curve


def points(*pairs: tuple[int, float]) -> list[dict]:
    return [{"train_prompts": n, "mean_acceptance_length": al} for n, al in pairs]


def test_the_fit_is_a_line_in_ln_prompts_and_predicts_where_it_meets_the_goal():
    a, b = 0.5, 0.25
    line = acceptance_curve.fit(points(*((n, a + b * math.log(n)) for n in (300, 600, 1200))))
    assert line == pytest.approx((a, b))
    predicted = acceptance_curve.prompts_for(3.0, line)
    assert predicted == round(math.exp((3.0 - a) / b))
    assert a + b * math.log(predicted) == pytest.approx(3.0, abs=1e-3)


def test_no_prediction_from_one_size_or_a_curve_that_does_not_rise():
    assert acceptance_curve.fit(points((600, 2.0), (600, 2.1))) is None
    flat = acceptance_curve.fit(points((300, 2.2), (1200, 2.0)))
    assert flat is not None and acceptance_curve.prompts_for(3.0, flat) is None


def test_an_engine_binding_is_every_core_named_by_vllm_or_left_to_vllm(monkeypatch):
    import engine_binding

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert engine_binding.environment("all")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert engine_binding.environment("0")["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_binding.environment("unset")
