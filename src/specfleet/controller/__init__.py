"""Code that runs on the controller: the CLI, the runner, the lab, locks and wheelhouses.

It may import ``specfleet.host`` (the shared facts: hashing, the speculative config), never
the other way round.
"""
