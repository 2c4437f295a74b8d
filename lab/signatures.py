"""The lab's ClamAV signature mirror: a tiny custom database that detects the EICAR test file.

Lab nodes cannot reach database.clamav.net, as at an air-gapped site. The lab's HTTP server
(``lab.aptrepo``, the one serving the stand-in repositories) serves ``clamav/`` beside them;
the lab inventory points audit.malware_scan.signatures there (a private mirror that holds
only this custom database: ClamAV's official ones are excluded).

The database is one MD5 hash signature in ClamAV's ``.hdb`` format, ``MD5:FileSize:Name``
(ClamAV's documentation, "File hash signatures", docs.clamav.net/manual/Signatures/
HashSignatures.html, read 2026-12-02). ClamAV adds ``.UNOFFICIAL`` to the names of signatures
that are not its own (seen in clamscan 1.4.6's output on a lab node, 2026-12-02).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# The EICAR test file (eicar.org): 68 bytes every scanner detects, harmless by design.
EICAR = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
SIGNATURE_NAME = "Gpunode.Lab.EICAR"
# As clamscan reports it.
REPORTED_NAME = f"{SIGNATURE_NAME}.UNOFFICIAL"
DIRECTORY = "clamav"
DATABASE = "gpunode-lab.hdb"


def hdb_line(content: bytes, name: str) -> str:
    return f"{hashlib.md5(content).hexdigest()}:{len(content)}:{name}\n"


def write_database(served_root: Path) -> Path:
    """Write the database under ``served_root``/clamav (only when its text changed, so that
    freshclam's If-Modified-Since finds it unchanged); returns its path."""
    path = served_root / DIRECTORY / DATABASE
    text = hdb_line(EICAR, SIGNATURE_NAME)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path
