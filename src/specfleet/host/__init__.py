"""Code that runs on the hosts, inside the stack venv (standard library plus what vLLM brings).

The ``common`` role installs this folder, and nothing else of ``specfleet``, on every host
(``specfleet.controller.hostpackage``). Nothing here may import ``specfleet.controller``.
"""
