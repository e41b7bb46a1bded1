"""The commands a client sends, as parsed values.

Values compared and hashed by their fields, never changed once made; not ``frozen``
dataclasses all the same, since a frozen one costs twice the time to make (its
``__init__`` sets each field through ``object.__setattr__``) and the parser makes one
per command, a FIN or PUB per message (the broker's makes one ``Fins`` per run of FINs,
and its reads one ``Pubs`` per run of PUBs to a topic).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, unsafe_hash=True)
class Identify:
    config: dict[str, Any]


@dataclass(slots=True, unsafe_hash=True)
class Auth:
    secret: bytes


@dataclass(slots=True, unsafe_hash=True)
class Sub:
    topic: str
    channel: str


@dataclass(slots=True, unsafe_hash=True)
class Pub:
    topic: str
    body: bytes


@dataclass(slots=True)
class Pubs:
    """PUB of each of ``bodies`` to ``topic``, in order: a run of PUBs to one topic read
    together, as one value (the broker makes one of a read's consecutive ``Pub``s, as a
    pipelining publisher sends them). Not hashable (its bodies are a list)."""

    topic: str
    bodies: list[bytes]


@dataclass(slots=True, unsafe_hash=True)
class Mpub:
    topic: str
    bodies: list[bytes]


@dataclass(slots=True, unsafe_hash=True)
class Dpub:
    topic: str
    defer_ms: int
    body: bytes


@dataclass(slots=True, unsafe_hash=True)
class Rdy:
    count: int


@dataclass(slots=True, unsafe_hash=True)
class Fin:
    message_id: bytes


@dataclass(slots=True)
class Fins:
    """FIN of each of ``message_ids``, in order: a run of FIN lines read together, as one
    value (a ``Parser(batch_fins=True)`` makes one where it would make a ``Fin`` per line,
    as consumers send one per message). Not hashable (its ids are a list)."""

    message_ids: list[bytes]


@dataclass(slots=True, unsafe_hash=True)
class Req:
    message_id: bytes
    timeout_ms: int


@dataclass(slots=True, unsafe_hash=True)
class Touch:
    message_id: bytes


@dataclass(slots=True, unsafe_hash=True)
class Cls:
    pass


@dataclass(slots=True, unsafe_hash=True)
class Nop:
    pass


@dataclass(slots=True, unsafe_hash=True)
class Handoff:
    """SRTM's, relay links only: the sending broker gave up its share of ``topic``; the
    receiver applies the sub-bucket it was armed with under ``token``, after everything
    this link sent before (docs/broker.md, "Handoff")."""

    topic: str
    token: str


Command = (
    Identify
    | Auth
    | Sub
    | Pub
    | Pubs
    | Mpub
    | Dpub
    | Rdy
    | Fin
    | Fins
    | Req
    | Touch
    | Cls
    | Nop
    | Handoff
)


def encode_command(cmd: Command) -> bytes:
    """Client side: the bytes a client sends for ``cmd`` (used by tests and the SRTM client)."""

    def sized(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    match cmd:
        case Identify(config):
            return b"IDENTIFY\n" + sized(json.dumps(config).encode())
        case Auth(secret):
            return b"AUTH\n" + sized(secret)
        case Sub(topic, channel):
            return f"SUB {topic} {channel}\n".encode()
        case Pub(topic, body):
            return f"PUB {topic}\n".encode() + sized(body)
        case Pubs(topic, bodies):
            return b"".join(f"PUB {topic}\n".encode() + sized(b) for b in bodies)
        case Mpub(topic, bodies):
            payload = struct.pack(">I", len(bodies)) + b"".join(sized(b) for b in bodies)
            return f"MPUB {topic}\n".encode() + sized(payload)
        case Dpub(topic, defer_ms, body):
            return f"DPUB {topic} {defer_ms}\n".encode() + sized(body)
        case Rdy(count):
            return f"RDY {count}\n".encode()
        case Fin(message_id):
            return b"FIN " + message_id + b"\n"
        case Fins(message_ids):
            return b"".join(b"FIN " + mid + b"\n" for mid in message_ids)
        case Req(message_id, timeout_ms):
            return b"REQ " + message_id + f" {timeout_ms}\n".encode()
        case Touch(message_id):
            return b"TOUCH " + message_id + b"\n"
        case Cls():
            return b"CLS\n"
        case Nop():
            return b"NOP\n"
        case Handoff(topic, token):
            return f"HANDOFF {topic} {token}\n".encode()
    raise TypeError(f"not a command: {cmd!r}")
