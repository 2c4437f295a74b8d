"""What the validated model means on a node: the files gpunode writes and the settings and
packages they must produce there, rendered from ``gpunode.model`` alone.

Both sides of the project need this knowledge: the roles (``roles/``) write it to a node, and
the drift check (``gpunode/drift``) compares a node's facts with it. Keeping it here lets
neither import the other. Modules here import only ``gpunode.model`` and the standard
library: no pyinfra, no host state, nothing from ``roles/``, ``facts/`` or ``gpunode.drift``
(the facts take the node names they share with the renderers from here).

* ``sshd``: the whole sshd_config and what ``sshd -T`` must print for it.
* ``firewall``: the nftables ruleset of table inet gpunode.
* ``packages``: the NVIDIA driver's and the container toolkit's apt packages.
* ``slurm``: slurm.conf, gres.conf (from the node's GPUs), cgroup.conf and slurmd's arguments.
"""
