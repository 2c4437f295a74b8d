"""pyinfra's configuration file, read from the checkout before any host is connected.

gpunode's SSH client must speak the post-quantum key exchange that Debian 13's hardened sshd
insists on (gpunode/ssh_kex.py); it is added to paramiko here because pyinfra connects to
every host before it loads a deploy file.
"""

from gpunode import ssh_kex

ssh_kex.install()
