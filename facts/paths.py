"""Whether a node path passes through a symbolic link.

Commands given a path from data (``mkdir -p``, ``mount``, a file written there) follow every
symbolic link on the way: a mount point ``/raid`` that is a link to ``/etc`` would mount the
cache over ``/etc``. The model only accepts paths in their normal form; what they are on the
node is read here.

mount(8) resolves its path arguments to their canonical form unless told
``--no-canonicalize`` (util-linux; as quoted in openzfs/zfs#6437, "By default the mount(8)
command ... will try to resolve any path parameter in its canonical form"; read 2026-12-07).
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode.sanitize import clean_text

SEPARATOR = "\t"


def parse_symlink_on_path(lines: list[str]) -> dict[str, str] | None:
    """``link<TAB>path<TAB>target`` -> the first link and where it points; None: no link."""
    for line in lines:
        kind, _, rest = line.partition(SEPARATOR)
        path, _, target = rest.partition(SEPARATOR)
        if kind == "link" and path.startswith("/"):
            return {"path": clean_text(path), "target": clean_text(target)}
    return None


class SymlinkOnPath(FactBase[dict[str, str] | None]):
    """
    The first component of ``path`` (from ``/`` down) that is a symbolic link, and its target;
    None when none is (components that do not exist yet end the walk: they are created as
    directories).

    .. code:: python

        {"path": "/raid", "target": "/etc"}
    """

    def command(self, path: str) -> str:
        # set -f: no globbing of the components; the path is one of the model's (letters,
        # digits and ._+@-), quoted all the same.
        return (
            f"set -f; path={shlex.quote(path)}; walked=; IFS=/; "
            'for part in ${path#/}; do walked="$walked/$part"; '
            'if [ -L "$walked" ]; then '
            'printf \'link\\t%s\\t%s\\n\' "$walked" "$(readlink "$walked")"; break; fi; '
            '[ -e "$walked" ] || break; done; true'
        )

    def process(self, output: list[str]) -> dict[str, Any] | None:  # type: ignore[override]
        return parse_symlink_on_path(list(output))

    @staticmethod
    def default() -> dict[str, str] | None:
        return None
