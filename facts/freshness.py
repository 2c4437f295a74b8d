"""Whether a change already written has taken effect: state, not events.

A handler that runs only "after a change" is lost when the run that made the change is cut
off (killed, node rebooted) before the handler ran: the next run sees the change as already
made and skips the handler. These facts look at what the node runs instead.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class _YesOrNo(FactBase[bool]):
    """A fact whose command ends by printing yes or no; no output reads as no."""

    abstract = True  # pyinfra's mark for a base: its subclasses are the facts

    def process(self, output: list[str]) -> bool:  # type: ignore[override]
        return output[-1].strip() == "yes"

    @staticmethod
    def default() -> bool:
        return False


class FileNewerThan(_YesOrNo):
    """Whether ``path`` was modified after ``reference`` (False if either is missing).

    .. code:: python

        True  # e.g. /etc/ld.so.conf.d/gpunode-cuda.conf newer than /etc/ld.so.cache
    """

    def command(self, path: str, reference: str) -> str:
        return f"[ {shlex.quote(path)} -nt {shlex.quote(reference)} ] && echo yes || echo no"


class UnitOlderThanFile(_YesOrNo):
    """Whether systemd ``unit`` is running since before ``path`` last changed: it runs with
    an older version of that file (False when the unit or the file is not there).

    .. code:: python

        True  # docker.service started before /etc/docker/daemon.json was written
    """

    def command(self, unit: str, path: str) -> str:
        quoted_unit, quoted_path = shlex.quote(unit), shlex.quote(path)
        return (
            f"started=$(systemctl show -p ActiveEnterTimestamp --value {quoted_unit} "
            "2>/dev/null); "
            f'if [ -z "$started" ] || ! systemctl is-active --quiet {quoted_unit} || '
            f"[ ! -e {quoted_path} ]; then echo no; exit 0; fi; "
            f'[ "$(stat -c %Y {quoted_path})" -gt "$(date -d "$started" +%s)" ] '
            "&& echo yes || echo no"
        )


class UnitsNeedDaemonReload(FactBase[bool]):
    """Whether systemd says any of ``units`` changed on disk since it last loaded them.

    .. code:: python

        False
    """

    def command(self, units: list[str]) -> str:
        names = " ".join(shlex.quote(unit) for unit in units)
        return f"systemctl show -p NeedDaemonReload --value {names} 2>/dev/null || true"

    def process(self, output: list[str]) -> bool:  # type: ignore[override]
        return any(line.strip() == "yes" for line in output)

    @staticmethod
    def default() -> bool:
        return False
