"""pyinfra's configuration file, read from the checkout before any host is connected.

gpunode's SSH client must speak the post-quantum key exchange that Debian 13's hardened sshd
insists on (gpunode/ssh_kex.py); it is added to paramiko here because pyinfra connects to
every host before it loads a deploy file.
"""

from pyinfra import config

from gpunode import ssh_kex

ssh_kex.install()

# Where pyinfra puts a file it uploads before sudo moves it into place. Without this, pyinfra
# asks the node for $TMPDIR with sudo: on a node with libpam-tmpdir (audit.tools.pam_tmpdir,
# a lynis item gpunode installs) root's sessions get /tmp/user/0, which the SSH login user
# cannot write, and every later run's uploads fail. /tmp is what pyinfra uses otherwise.
config.TEMP_DIR = "/tmp"
