"""Every host of every inventory here: the fleet's NVIDIA stack, pinned in this one place.

Production, the lab and the Vagrant boxes converge the same pins, so what the lab certifies is
what production runs. An inventory that tries the next stack first (staging) overrides these
keys in its own group data; pyinfra gives group data precedence over ``all``.
"""

nvidia_driver = {
    "source": "nvidia",
    "branch": "570",
    "version": "570.195.03-1",
    "flavour": "open",
    "reboot": "if-needed",
}
# Held at exactly the driver's version (Fabric Manager refuses to start otherwise).
fabric_manager = {"version": "570.195.03-1"}
cuda = {"versions": ["12.4", "12.8"], "default": "12.8"}
container_runtime = {"engines": ["docker"], "toolkit_version": "1.17.8-1"}
