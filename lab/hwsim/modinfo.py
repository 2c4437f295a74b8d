"""``modinfo`` for a lab node's stand-in NVIDIA kernel module: a shell script this module writes.

A lab node is a container: it loads no kernel module, and the stand-in driver packages build
none. They record instead what a reboot would load (``hwstate.INSTALLED_DRIVER_VERSION_FILE``
and its flavour); this double answers ``modinfo [-F field] nvidia`` from that record, as the
real ``modinfo`` answers from the module a real package builds, so the product reads a lab
node exactly as a real one. Every other call goes to the real ``modinfo``.

It is shell, not Python: the real modinfo is a small C program, and every no-op deploy and
drift check asks it, so a Python start-up here would make the lab's node-side cost a
fiction. It sits at ``/usr/local/sbin/modinfo``, ahead of ``/usr/sbin`` in sudo's secure_path
and root's PATH; nothing of the real kmod package is replaced.
"""

from __future__ import annotations

from . import hwstate

REAL_MODINFO = ("/usr/sbin/modinfo", "/sbin/modinfo")
MODULE = "nvidia"
FLAVOUR_FILE = "installed-kernel-module-flavour"
# modinfo -F license of NVIDIA's modules: the open ones are dual-licensed.
LICENSES = {"open": "Dual MIT/GPL", "proprietary": "NVIDIA"}
DESCRIPTION = "NVIDIA kernel module (gpunode lab stand-in)"
# The fields the double knows, in the order ``modinfo nvidia`` prints them.
FIELDS = ("filename", "version", "license", "description")


def _listing_format() -> str:
    """printf format of the whole listing: kmod pads "field:" to 16 columns."""
    return "".join(f"{name}:{' ' * max(1, 16 - len(name))}%s\\n" for name in FIELDS)


def script() -> str:
    """The double: /usr/local/sbin/modinfo."""
    reals = " ".join(REAL_MODINFO)
    state_dir = f'"${{{hwstate.STATE_ENV}:-{hwstate.DEFAULT_STATE_PATH}}}"'
    values = " ".join(f'"${name}"' for name in FIELDS)
    fields = "\n".join(f"    {name}) printf '%s\\n' \"${name}\" ;;" for name in FIELDS)
    return f"""#!/bin/sh
# gpunode lab double of modinfo, from lab.hwsim.modinfo: the stand-in NVIDIA module's fields
# from what its package recorded; any other call, or none recorded, goes to the real modinfo.
real() {{
    for real in {reals}; do [ -x "$real" ] && exec "$real" "$@"; done
    for module in "$@"; do :; done
    echo "modinfo: ERROR: Module $module not found." >&2
    exit 1
}}
field=
case "$#:$1:$3" in
    1:{MODULE}:) ;;
    3:-F:{MODULE}) field=$2 ;;
    *) real "$@" ;;
esac
state={state_dir}
record=${{state%/*}}
version=$(cat "$record/{hwstate.INSTALLED_DRIVER_VERSION_FILE}" 2>/dev/null)
[ -n "$version" ] || real "$@"
case "$(cat "$record/{FLAVOUR_FILE}" 2>/dev/null)" in
    proprietary) license='{LICENSES["proprietary"]}' ;;
    *) license='{LICENSES["open"]}' ;;
esac
filename="/lib/modules/$(uname -r)/updates/dkms/{MODULE}.ko"
description='{DESCRIPTION}'
case "$field" in
    '') printf '{_listing_format()}' {values} ;;
{fields}
esac
exit 0
"""
