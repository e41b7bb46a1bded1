"""Rules for values that reach the controller from the network, with no I/O: broker
addresses, topic names and publisher ids. The documents (``srtm.control.documents``) apply them to
requests; the state applies them again to what it stores and what it reads back from an
old state file. ``ControlError`` is what the controller answers a refused request with."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from srtm.protocol import is_valid_name


class ControlError(ValueError):
    """A request the controller refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: One DNS label: letters, digits and inner hyphens, at most 63 characters.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def split_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) with an IP or DNS hostname and a port in
    1–65535; anything else (paths, user info, schemes, a missing port) is a ValueError
    saying why, so that a URL built from it can only name that host and port."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"must be HOST:PORT with a port, got {value!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be 1-65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
        return host[1:-1], port
    if _is_ipv4(host) or _is_hostname(host):
        return host, port
    raise ValueError(f"{host!r} is not an IP address or a hostname")


def parse_address(value: Any, field: str) -> tuple[str, int]:
    """``split_address`` for a value of unknown type; a refusal names ``field``."""
    if not isinstance(value, str) or not value:
        raise ControlError(400, f"{field} must be a non-empty HOST:PORT string")
    try:
        return split_address(value)
    except ValueError as exc:
        raise ControlError(400, f"{field}: {exc}") from None


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _is_hostname(host: str) -> bool:
    labels = host.removesuffix(".").split(".")
    return 0 < len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def topic_name(value: Any, field: str = "name") -> str:
    """A topic name every broker accepts (NSQ's rule: 1–64 of ``[.a-zA-Z0-9_-]``)."""
    if not isinstance(value, str) or not is_valid_name(value):
        raise ControlError(400, f"{field}: {value!r} is not a valid topic name")
    return value


#: A publisher id's longest (characters).
MAX_PUBLISHER_ID = 128
#: A topic name's characters (NSQ's) and ``: @ / + =``: room for ``host:port``,
#: ``user@host`` and base64, none for spaces, markup or control characters.
PUBLISHER_ID_PATTERN = r"^[.a-zA-Z0-9_:@/+=-]+$"
_PUBLISHER_ID = re.compile(PUBLISHER_ID_PATTERN)
#: A join secret's shortest (characters): guessing one is not a way in.
MIN_JOIN_SECRET = 16


def publisher_id(value: Any, field: str = "publisher") -> str:
    """A publisher id by ``PUBLISHER_ID_PATTERN``, 1–``MAX_PUBLISHER_ID`` characters."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_PUBLISHER_ID
        or not _PUBLISHER_ID.fullmatch(value)
    ):
        shown = repr(value)[:80]
        raise ControlError(
            400,
            f"{field}: {shown} is not a valid publisher id (1-{MAX_PUBLISHER_ID} of "
            "[.a-zA-Z0-9_:@/+=-])",
        )
    return value
