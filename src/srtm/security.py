"""The cluster token: who may change SRTM state, and when running without one is allowed.

One shared secret (``--token`` / ``SRTM_TOKEN``) guards every mutating SRTM endpoint of
brokers and the controller as ``Authorization: Bearer <token>``. Running without it is an
explicit choice (``--insecure-loopback``) and only for loopback binds.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

#: The error code of a refused request (HTTP 401).
E_UNAUTHORIZED = "E_UNAUTHORIZED"


def is_loopback(host: str) -> bool:
    """A bind address only this machine can reach (``localhost``, 127.0.0.0/8, ``::1``).
    An empty host binds every interface: not loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_token(token: str | None) -> None:
    """A token, when given, must be usable in a header and not blank."""
    if token is None:
        return
    if not token.strip():
        raise ValueError("the token is empty")
    if not token.isprintable() or not token.isascii() or token != token.strip():
        raise ValueError("the token must be printable ASCII without surrounding spaces")


def require_auth_choice(token: str | None, insecure: bool, hosts: Iterable[str]) -> None:
    """For the command line: refuse to serve without a token unless ``insecure``
    (--insecure-loopback) was given and every bind address in ``hosts`` is loopback."""
    check_token(token)
    if token is not None:
        return
    if not insecure:
        raise ValueError(
            "no token: give --token (or SRTM_TOKEN), or --insecure-loopback "
            "(SRTM_INSECURE_LOOPBACK=1) for a loopback-only setup without one"
        )
    require_loopback_without_token(None, hosts)


def require_loopback_without_token(token: str | None, hosts: Iterable[str]) -> None:
    """For the library: without a token, only loopback binds (the API is then open to
    this machine only)."""
    if token is not None:
        return
    exposed = [h or "*" for h in hosts if not is_loopback(h)]
    if exposed:
        raise ValueError(
            f"binding {', '.join(exposed)} without a token would let anyone who reaches it "
            "change SRTM state; give a token or bind a loopback address (127.0.0.1)"
        )


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>`` (constant-time)."""
    if header is None:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return same_secret(given.strip(), token)


def same_secret(given: str, secret: str) -> bool:
    """Compared in constant time: the answer's timing tells nothing of the secret."""
    return hmac.compare_digest(given.encode(), secret.encode())


def bearer_header(token: str | None) -> dict[str, str]:
    """The request header that carries ``token`` (none without one)."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}
