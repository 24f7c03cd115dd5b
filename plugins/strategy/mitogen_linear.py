"""Mitogen's linear strategy, for `ANSIBLE_STRATEGY=mitogen_linear` (benchmarks/converge.py
--mitogen): one persistent Python per host instead of a module upload and interpreter
start per task. Off by default; see the README's "Re-provisioning speed"."""

import ansible_mitogen.loaders
import ansible_mitogen.strategy

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    pass
