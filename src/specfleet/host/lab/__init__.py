"""What only lab hosts get: the tiny models' and the packaged model's generators.

Installed with ``specfleet.host`` where ``specfleet_host_package_lab`` is true (the lab
inventories set it); a fleet host's package has no ``lab`` folder.
"""
