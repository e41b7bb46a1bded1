"""Checks on what reaches the controller from the network, with no I/O: broker addresses,
broker reports, topic names. Each refusal is a ``ControlError`` naming the field."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srtm.protocol import is_valid_name


class ControlError(ValueError):
    """A request the controller refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: One DNS label: letters, digits and inner hyphens, at most 63 characters.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
#: Topics one report may carry (a broker with more is refused, not truncated).
MAX_REPORT_TOPICS = 100_000


def parse_address(value: Any, field: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) with an IP or DNS hostname and a port in
    1–65535; anything else (paths, user info, schemes, a missing port) is refused, so
    that a URL built from it can only name that host and port."""
    if not isinstance(value, str) or not value:
        raise ControlError(400, f"{field} must be a non-empty HOST:PORT string")
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii():
        raise ControlError(400, f"{field} must be HOST:PORT with a port, got {value!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ControlError(400, f"{field}: port must be 1-65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ControlError(400, f"{field}: {host!r} is not an IPv6 address") from None
        return host[1:-1], port
    if _is_ipv4(host) or _is_hostname(host):
        return host, port
    raise ControlError(400, f"{field}: {host!r} is not an IP address or a hostname")


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


def finite(value: Any, field: str, *, minimum: float = 0.0) -> float:
    """A JSON number (not a boolean), finite and >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ControlError(400, f"{field} must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < minimum:
        raise ControlError(400, f"{field} must be a finite number >= {minimum:g}, got {value!r}")
    return x


@dataclass(frozen=True, slots=True)
class ParsedReport:
    load: float
    #: topic -> (average rate, max backlog) for the TB Adaptor
    windows: dict[str, tuple[float, float]]
    #: topic -> messages still held there (queued, deferred, in flight)
    depths: dict[str, int]


def parse_report(doc: Mapping[str, Any]) -> ParsedReport:
    """A broker's report: ``{"load", "topics": {name: {"rate", "backlog", "depth"?}}}``.
    NaN, infinities, negatives, wrong types and invalid names are refused whole (a
    report is never half stored)."""
    load = finite(doc.get("load", 0.0), "load")
    topics = doc.get("topics", {})
    if not isinstance(topics, dict):
        raise ControlError(400, "topics must be an object")
    if len(topics) > MAX_REPORT_TOPICS:
        raise ControlError(400, f"topics: more than {MAX_REPORT_TOPICS} in one report")
    windows: dict[str, tuple[float, float]] = {}
    depths: dict[str, int] = {}
    for name, t in topics.items():
        topic_name(name, "topics")
        where = f"topics.{name}"
        if not isinstance(t, dict):
            raise ControlError(400, f"{where} must be an object")
        rate = finite(t.get("rate", 0.0), f"{where}.rate")
        backlog = finite(t.get("backlog", 0.0), f"{where}.backlog")
        windows[name] = (rate, backlog)
        depth = t.get("depth", 0)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ControlError(400, f"{where}.depth must be an integer >= 0, got {depth!r}")
        depths[name] = depth
    return ParsedReport(load, windows, depths)
