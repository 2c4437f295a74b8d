"""What openssl s_client printed of a TLS handshake, read alike on Debian 12 and 13 (OpenSSL
3.0 prints ``depth=0 CN = lab-1``, 3.5 ``depth=0 CN=lab-1``)."""

from __future__ import annotations

import re

_SERVER_VERIFIED = re.compile(r"^depth=0 .*\bCN ?= ?\S.*\nverify return:1$", re.MULTILINE)
# A client certificate the server will not take: Go's TLS stack answers "bad certificate" or,
# for one whose key usage is not for clients, "unsupported certificate".
_CLIENT_REFUSED = re.compile(r"alert (bad|unsupported) certificate")


def server_certificate_verified(stderr: str) -> bool:
    """The server's own certificate was verified against the CA file given (its depth 0)."""
    return bool(_SERVER_VERIFIED.search(stderr)) and "verify error" not in stderr


def client_certificate_refused(stderr: str) -> bool:
    return bool(_CLIENT_REFUSED.search(stderr))
