"""The EAGLE-3 drafter pipeline: prompts → responses → prepared data → hidden states →
training → evaluation → export, each stage skipped when its manifest matches.

Runs on the training host in the stack's virtualenv (``python -m specfleet.host.drafter``),
with the vLLM project's ``speculators`` as the engine. Nothing here imports the
controller's dependencies.
"""

#: Loaded by vLLM through ``kv_connector_module_path`` when the run's ``cpu_compat`` is on.
CPU_COMPAT_MODULE = "specfleet.host.drafter.cpu_compat"
CPU_COMPAT_CONNECTOR = "CpuHiddenStatesConnector"
