"""Bytes in, commands out: the server side of NSQ's TCP protocol V2 (sans-I/O)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from srtm.protocol import errors as e
from srtm.protocol.commands import (
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    Fins,
    Handoff,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
)
from srtm.protocol.errors import ProtocolError
from srtm.protocol.limits import Limits
from srtm.protocol.names import is_valid_name, is_valid_token

MAGIC_V2 = b"  V2"
MESSAGE_ID_LENGTH = 16
_SIZE = struct.Struct(">i")
_INTEGER = re.compile(rb"-?[0-9]{1,18}")
#: Well-formed FIN lines back to back (what ``_fin`` accepts, without a "\r"), each 21 bytes.
_FIN_RUN = re.compile(rb"(?:FIN [^ \r\n]{16}\n)+")
_FIN_LINE = 21
#: The ids of 32 FIN lines, and of one (``fin_ids``).
_FIN_IDS_32 = struct.Struct("4x16sx" * 32)
_FIN_ID = struct.Struct("4x16sx")
#: Deepest nesting of arrays and objects accepted in an IDENTIFY body (the body itself is
#: one level). Real clients send a flat object; deeper JSON is refused before decoding,
#: since the decoder recurses (RecursionError) and so would anything printing it later.
MAX_JSON_DEPTH = 32

Event = Command | ProtocolError
#: A command with a body, split in two: ``head`` checks the line and the announced size
#: (so an oversize body is refused before it is read) and returns what ``build`` needs.
_Head = Callable[["Parser", list[bytes], int], Any]
_Build = Callable[["Parser", Any, memoryview], Command]


class Parser:
    """Feed it what the socket read; it returns the commands (or errors) completed.

    After a fatal error it returns nothing more: the server must close the connection.
    With ``batch_fins``, each run of well-formed FIN lines that one ``feed`` completes is
    one ``Fins`` (the broker's: one value per run, not one per message); without, a
    ``Fin`` per line. Expanded, the commands are the same either way.
    """

    def __init__(self, limits: Limits | None = None, batch_fins: bool = False) -> None:
        self.limits = limits or Limits()
        self.batch_fins = batch_fins
        self._buf = bytearray()
        self._magic_seen = False
        self._failed = False
        # A line whose body has not fully arrived yet: its builder, head and body size.
        self._pending: tuple[_Build, Any, int] | None = None
        #: Whether FIN runs are still checked in C in this read (see ``_fin_run``).
        self._quick = True

    @property
    def failed(self) -> bool:
        return self._failed

    @property
    def incomplete(self) -> bool:
        """Whether it holds part of a command: a line, or a body still arriving."""
        return bool(self._buf) or self._pending is not None

    def one(self, data: bytes) -> Pub | Mpub | None:
        """``data`` as one whole publish (``one_publish``: a sensor's read), where nothing
        of an earlier read waits: what ``feed`` would give as its only event, and nothing
        kept. None elsewhere (``feed`` then reads it)."""
        if self._failed or self._buf or self._pending is not None or not self._magic_seen:
            return None
        return one_publish(data, self.limits) if type(data) is bytes else None

    def feed(self, data: bytes) -> list[Event]:
        if self._failed:
            return []
        events: list[Event] = []
        if not self._buf and self._pending is None and self._magic_seen and type(data) is bytes:
            # A sensor's read (one whole publish), a pipelining publisher's (a run of PUBs
            # to one topic) or a consumer's (whole FIN lines), parsed without the buffer;
            # only what follows a run is buffered (a PUB cut at the read's end, say).
            one = one_publish(data, self.limits)
            if one is not None:
                return [one]
            if (pubs := self._pubs(data, 0)) is not None:
                events, end = pubs
                if end == len(data):
                    return events
                data = data[end:]
            elif (
                not len(data) % _FIN_LINE and data.startswith(b"FIN ") and whole_fin_lines(data, 0)
            ):
                ids = fin_ids(data)
                return [Fins(ids)] if self.batch_fins else [Fin(i) for i in ids]
        self._buf += data
        try:
            self._parse(events)
        except ProtocolError as err:
            # Kept as an event without its traceback: its frames hold ``events``, a cycle.
            events.append(err.with_traceback(None))
            if err.fatal:
                self._failed = True
                self._buf.clear()
        return events

    def _parse(self, events: list[Event]) -> None:
        buf = self._buf
        self._quick = True
        if not self._magic_seen:
            if len(buf) < 4:
                return
            magic = bytes(buf[:4])
            if magic != MAGIC_V2:
                raise ProtocolError("E_BAD_PROTOCOL", "")  # nsqd says no more
            del buf[:4]
            self._magic_seen = True
        pos = 0
        try:
            while True:
                if self._pending is not None:
                    build, head, size = self._pending
                    if len(buf) - pos < size:
                        return
                    body = memoryview(buf)[pos : pos + size]
                    try:
                        events.append(build(self, head, body))
                    finally:
                        body.release()
                    pos += size
                    self._pending = None
                    continue
                if (pubs := self._pubs(buf, pos)) is not None:
                    events += pubs[0]
                    pos = pubs[1]
                    continue
                if buf.startswith(b"FIN ", pos) and (fins := self._fin_run(buf, pos)):
                    # Consumers send a FIN per message, back to back: the run at once.
                    ids = fin_ids(fins)
                    if self.batch_fins:
                        events.append(Fins(ids))
                    else:
                        events += map(Fin, ids)
                    pos += len(fins)
                    continue
                end = buf.find(b"\n", pos)
                # The same bound whether or not the newline has arrived yet, so the
                # events do not depend on how the stream was split into reads.
                if (len(buf) if end < 0 else end) - pos > self.limits.max_line:
                    raise ProtocolError(e.E_INVALID, "command line too long")
                if end < 0:
                    return
                line = bytes(buf[pos:end]).rstrip(b"\r")
                rest = self._line(line, events, buf, end + 1)
                if rest < 0:
                    # The line needs a size prefix that has not arrived: re-read it later.
                    return
                pos = rest
        finally:
            del buf[:pos]

    def _pubs(self, buf: bytes | bytearray, pos: int) -> tuple[list[Event], int] | None:
        """The PUBs of the run to one topic at ``pos`` (``pub_run``) and where it ends;
        None where there is none, or its topic has not been found valid yet (the general
        path checks it, and the next PUB to it takes this one)."""
        if not buf.startswith(b"PUB ", pos):
            return None
        limits = self.limits
        run = pub_run(buf, pos, limits.max_line, limits.max_msg_size)
        if run is None or (topic := _VALID_TOPICS.get(run[0])) is None:
            return None
        return [Pub(topic, body) for body in run[1]], run[2]

    def _fin_run(self, buf: bytearray, pos: int) -> bytes:
        """The well-formed FIN lines back to back from ``pos`` (b"": none): checked in C
        (``whole_fin_lines``), else found by the regex. Once that check failed, the rest of
        this read is left to the regex: each check reads what is left, so a read of FINs
        mixed with other commands would cost one per FIN."""
        if self._quick:
            fins = whole_fin_lines(buf, pos)
            if fins is not None:
                return fins
            self._quick = False
        run = _FIN_RUN.match(buf, pos)
        return run.group() if run else b""

    def _line(self, line: bytes, events: list[Event], buf: bytearray, after: int) -> int:
        """Handle one command line; returns where parsing continues, or -1 to wait."""
        parts = line.split(b" ")
        name = parts[0]
        simple = _SIMPLE.get(name)
        if simple is not None:
            try:
                events.append(simple(self, parts))
            except ProtocolError as err:
                if err.fatal:
                    raise
                events.append(err.with_traceback(None))
            return after
        body = _WITH_BODY.get(name)
        if body is None:
            shown = name.decode("utf-8", "replace")
            raise ProtocolError(e.E_INVALID, f"invalid command {shown}")
        head, build = body
        if len(buf) - after < 4:
            return -1
        (size,) = _SIZE.unpack_from(buf, after)
        self._pending = (build, head(self, parts, size), size)
        return after + 4


def one_publish_py(data: bytes, limits: Limits) -> Pub | Mpub | None:
    """``data`` parsed when it is exactly one well-formed PUB, or MPUB of one message,
    to a topic name already seen valid (what a sensor sends per read); None otherwise,
    and the general parser then gives the same command, or the error, from it."""
    if data.startswith(b"PUB "):
        start = 4
    elif data.startswith(b"MPUB "):
        start = 5
    else:
        return None
    end = data.find(b"\n", start, limits.max_line + 1)
    topic = _VALID_TOPICS.get(data[start:end]) if end > 0 else None
    if topic is None or len(data) < end + 5:
        return None
    (size,) = _SIZE.unpack_from(data, end + 1)
    if len(data) != end + 5 + size:
        return None
    if start == 4:
        return Pub(topic, data[end + 5 :]) if 0 < size <= limits.max_msg_size else None
    if size < 9 or size > limits.max_body_size:
        return None
    count, msg = _ONE_MESSAGE.unpack_from(data, end + 5)
    if count != 1 or msg != size - 8 or msg > limits.max_msg_size:
        return None
    return Mpub(topic, [data[end + 13 :]])


def pub_run_py(
    buf: bytes | bytearray, pos: int, max_line: int, max_size: int
) -> tuple[bytes, list[bytes], int] | None:
    """The whole PUBs to one topic back to back from ``pos``: (the topic as read, the
    bodies, where the run ends); None where not even the first is one. Only the plain
    form counts: "PUB <topic>\\n" (the line at most ``max_line`` bytes, the topic without
    spaces or carriage returns), a size in 1..``max_size``, the whole body. The run stops
    at anything else, which the general parser reads (and refuses where it is wrong), so
    a run holds the PUBs the general parser would give for the same bytes."""
    n, p = len(buf), pos
    topic: bytes | None = None
    bodies: list[bytes] = []
    while buf.startswith(b"PUB ", p):
        nl = buf.find(b"\n", p + 4, p + max_line + 1)
        if nl < 0:
            break
        name = bytes(buf[p + 4 : nl])
        if not name or b" " in name or b"\r" in name or (topic is not None and name != topic):
            break
        if n - (nl + 1) < 4:
            break
        (size,) = _SIZE.unpack_from(buf, nl + 1)
        if size <= 0 or size > max_size or n - (nl + 5) < size:
            break
        topic = name
        bodies.append(bytes(buf[nl + 5 : nl + 5 + size]))
        p = nl + 5 + size
    return (topic, bodies, p) if topic is not None else None


_PubRun = Callable[[bytes | bytearray, int, int, int], tuple[bytes, list[bytes], int] | None]
_c_pub_run: _PubRun | None
try:
    from srtm.protocol._pubrun import pub_run as _c_pub_run
except ImportError:  # not built
    _c_pub_run = None
#: ``pub_run_py``, in C where ``srtm.protocol._pubrun`` was built (at install).
pub_run: _PubRun = _c_pub_run or pub_run_py


#: An MPUB body's count and its first message's size.
_ONE_MESSAGE = struct.Struct(">ii")


def whole_fin_lines(buf: bytes | bytearray, pos: int) -> bytes | None:
    """Every whole 21-byte line from ``pos`` on, where all are well-formed FIN lines (what
    ``_FIN_RUN`` matches there; b"": not one whole line), else None. A read of a consumer's
    FINs is nothing else, up to a line cut at its end; this checks it in a few passes in
    C, four times faster than the regex."""
    n = (len(buf) - pos) // _FIN_LINE
    whole = bytes(buf[pos : pos + n * _FIN_LINE])
    if (
        whole.count(b" ") == n  # one per line, at 3: none in an id
        and whole.count(b"\n") == n  # one per line, at 20: none in an id
        and b"\r" not in whole
        and whole[3::_FIN_LINE] == b" " * n
        and whole[20::_FIN_LINE] == b"\n" * n
        and whole[0::_FIN_LINE] == b"F" * n
        and whole[1::_FIN_LINE] == b"I" * n
        and whole[2::_FIN_LINE] == b"N" * n
    ):
        return whole
    return None


def fin_ids(fins: bytes) -> list[bytes]:
    """The ids of well-formed FIN lines back to back, cut in C (32 lines a struct)."""
    cut = len(fins) - len(fins) % (32 * _FIN_LINE)
    ids: list[bytes] = []
    for chunk in _FIN_IDS_32.iter_unpack(memoryview(fins)[:cut]):
        ids += chunk
    ids += [mid for (mid,) in _FIN_ID.iter_unpack(memoryview(fins)[cut:])]
    return ids


# -- commands without a body --------------------------------------------------------------


def _sub(p: Parser, parts: list[bytes]) -> Command:
    # The name goes into the table of valid ones (``_topic``): a consumer's topic is
    # usually published to, and its first PUB then takes the quick path too.
    topic = _topic(parts, "SUB", 3)
    channel = _text(parts[2])
    if not is_valid_name(channel):
        raise ProtocolError(e.E_BAD_CHANNEL, f"SUB channel name {channel!r} is not valid")
    return Sub(topic, channel)


def _rdy(p: Parser, parts: list[bytes]) -> Command:
    if len(parts) < 2:
        return Rdy(1)  # nsqd: a bare RDY means 1
    count = _int(parts[1], "RDY could not parse count")
    if not 0 <= count <= p.limits.max_rdy_count:
        raise ProtocolError(
            e.E_INVALID, f"RDY count {count} out of range 0-{p.limits.max_rdy_count}"
        )
    return Rdy(count)


def _message_id(parts: list[bytes], command: str) -> bytes:
    if len(parts) < 2:
        raise ProtocolError(e.E_INVALID, f"{command} insufficient number of parameters")
    mid = parts[1]
    if len(mid) != MESSAGE_ID_LENGTH:
        raise ProtocolError(e.E_INVALID, f"{command} invalid message ID {_text(mid)!r}")
    return mid


def _fin(p: Parser, parts: list[bytes]) -> Command:
    return Fin(_message_id(parts, "FIN"))


def _req(p: Parser, parts: list[bytes]) -> Command:
    if len(parts) < 3:
        raise ProtocolError(e.E_INVALID, "REQ insufficient number of parameters")
    mid = _message_id(parts, "REQ")
    timeout = _int(parts[2], "REQ could not parse timeout")
    # nsqd clamps an out-of-range requeue delay instead of refusing it.
    return Req(mid, min(max(timeout, 0), p.limits.max_req_timeout_ms))


def _touch(p: Parser, parts: list[bytes]) -> Command:
    return Touch(_message_id(parts, "TOUCH"))


def _handoff(p: Parser, parts: list[bytes]) -> Command:
    if len(parts) < 3:
        raise ProtocolError(e.E_INVALID, "HANDOFF insufficient number of parameters")
    topic, token = _text(parts[1]), _text(parts[2])
    if not is_valid_name(topic):
        raise ProtocolError(e.E_BAD_TOPIC, f"HANDOFF topic name {topic!r} is not valid")
    if not is_valid_token(token):
        raise ProtocolError(e.E_INVALID, "HANDOFF invalid token")
    return Handoff(topic, token)


_SIMPLE: dict[bytes, Callable[[Parser, list[bytes]], Command]] = {
    b"SUB": _sub,
    b"RDY": _rdy,
    b"FIN": _fin,
    b"REQ": _req,
    b"TOUCH": _touch,
    b"CLS": lambda p, parts: Cls(),
    b"NOP": lambda p, parts: Nop(),
    b"HANDOFF": _handoff,
}


# -- commands with a body -----------------------------------------------------------------


#: Topic names already found valid, as read (a publisher names the same topic in every
#: PUB): emptied when full, so no client can make it hold more.
_VALID_TOPICS: dict[bytes, str] = {}
_VALID_TOPICS_MAX = 4096

_OnePublish = Callable[[bytes, Limits], Pub | Mpub | None]
_c_one_publish: _OnePublish | None
try:
    from srtm.protocol._pubrun import configure as _c_configure
    from srtm.protocol._pubrun import one_publish as _c_one_publish
except ImportError:  # not built, or built before it had one_publish
    _c_one_publish = None
else:
    _c_configure(_VALID_TOPICS, Pub, Mpub)  # the table it reads names from (cleared, kept)
#: ``one_publish_py``, in C where ``srtm.protocol._pubrun`` was built (at install).
one_publish: _OnePublish = _c_one_publish or one_publish_py


def _topic(parts: list[bytes], command: str, min_params: int = 2) -> str:
    if len(parts) < min_params:
        raise ProtocolError(e.E_INVALID, f"{command} insufficient number of parameters")
    raw = parts[1]
    topic = _VALID_TOPICS.get(raw)
    if topic is not None:
        return topic
    topic = _text(raw)
    if not is_valid_name(topic):
        raise ProtocolError(e.E_BAD_TOPIC, f"{command} topic name {topic!r} is not valid")
    if len(_VALID_TOPICS) >= _VALID_TOPICS_MAX:
        _VALID_TOPICS.clear()
    _VALID_TOPICS[raw] = topic
    return topic


def _check_message_size(p: Parser, command: str, size: int) -> None:
    if size <= 0:
        raise ProtocolError(e.E_BAD_MESSAGE, f"{command} invalid message body size {size}")
    if size > p.limits.max_msg_size:
        raise ProtocolError(
            e.E_BAD_MESSAGE, f"{command} message too big {size} > {p.limits.max_msg_size}"
        )


def _check_body_size(p: Parser, command: str, size: int) -> None:
    if size <= 0:
        raise ProtocolError(e.E_BAD_BODY, f"{command} invalid body size {size}")
    if size > p.limits.max_body_size:
        raise ProtocolError(
            e.E_BAD_BODY, f"{command} body too big {size} > {p.limits.max_body_size}"
        )


def _pub_head(p: Parser, parts: list[bytes], size: int) -> str:
    topic = _topic(parts, "PUB")
    _check_message_size(p, "PUB", size)
    return topic


def _pub(p: Parser, topic: str, body: memoryview) -> Command:
    return Pub(topic, bytes(body))


def _dpub_head(p: Parser, parts: list[bytes], size: int) -> tuple[str, int]:
    topic = _topic(parts, "DPUB", 3)
    defer = _int(parts[2], "DPUB could not parse timeout")
    if not 0 <= defer <= p.limits.max_req_timeout_ms:
        raise ProtocolError(
            e.E_INVALID, f"DPUB timeout {defer} out of range 0-{p.limits.max_req_timeout_ms}"
        )
    _check_message_size(p, "DPUB", size)
    return topic, defer


def _dpub(p: Parser, head: tuple[str, int], body: memoryview) -> Command:
    return Dpub(head[0], head[1], bytes(body))


def _mpub_head(p: Parser, parts: list[bytes], size: int) -> str:
    topic = _topic(parts, "MPUB")
    _check_body_size(p, "MPUB", size)
    return topic


def _mpub(p: Parser, topic: str, body: memoryview) -> Command:
    if len(body) < 4:
        raise ProtocolError(e.E_BAD_BODY, "MPUB failed to read message count")
    (count,) = _SIZE.unpack_from(body, 0)
    # As nsqd 1.3.0, no upper bound here: a count the body cannot hold fails where the body
    # ends (each message takes at least 4 bytes, so the loop is bounded by the body), and an
    # empty message is E_BAD_MESSAGE wherever it is.
    if count <= 0:
        raise ProtocolError(e.E_BAD_BODY, f"MPUB invalid message count {count}")
    raw = body.tobytes()  # one copy; each message is then one slice of it
    end = len(raw)
    max_size = p.limits.max_msg_size
    if (bodies := same_size_bodies(raw, count, max_size)) is not None:
        return Mpub(topic, bodies)
    unpack = _SIZE.unpack_from
    bodies = []
    pos = 4
    for i in range(count):
        if pos + 4 > end:
            raise ProtocolError(e.E_BAD_MESSAGE, f"MPUB failed to read message({i}) body size")
        (size,) = unpack(raw, pos)
        pos += 4
        if size <= 0:
            raise ProtocolError(e.E_BAD_MESSAGE, f"MPUB invalid message({i}) body size {size}")
        if size > max_size:
            raise ProtocolError(e.E_BAD_MESSAGE, f"MPUB message too big {size} > {max_size}")
        nxt = pos + size
        if nxt > end:
            raise ProtocolError(e.E_BAD_MESSAGE, f"MPUB failed to read message({i}) body")
        bodies.append(raw[pos:nxt])
        pos = nxt
    return Mpub(topic, bodies)


def same_size_bodies(raw: bytes, count: int, max_size: int) -> list[bytes] | None:
    """The messages of an MPUB whose messages all have the size of its first (as load
    tools send them), checked and cut without a loop per message in Python: byte j of
    every size field is a slice with the fields' stride. None: not such a body (the
    general loop then finds what, if anything, is wrong)."""
    if len(raw) < 8:
        return None
    (size,) = _SIZE.unpack_from(raw, 4)
    stride = size + 4
    if not 0 < size <= max_size or len(raw) != 4 + count * stride:
        return None
    field = raw[4:8]
    for j in range(4):
        if raw[4 + j :: stride] != field[j : j + 1] * count:
            return None
    # Cut _CUT at a time: a Struct per MPUB's count took longer to make than to use
    # (40 ms for a million), and one kept per count held as much memory.
    bodies: list[bytes] = []
    whole, rest = divmod(count, _CUT)
    cut = _cutter(size, _CUT).unpack_from
    for k in range(whole):
        bodies += cut(raw, 4 + k * _CUT * stride)
    if rest:
        bodies += _cutter(size, rest).unpack_from(raw, 4 + whole * _CUT * stride)
    return bodies


#: Messages of one size cut per call (``same_size_bodies``).
_CUT = 1024


@lru_cache(maxsize=64)
def _cutter(size: int, count: int) -> struct.Struct:
    """Cuts ``count`` messages of ``size`` bytes, each after its size field, in one call
    (a quarter of a slice per message)."""
    return struct.Struct(f"4x{size}s" * count)


def _identify_head(p: Parser, parts: list[bytes], size: int) -> None:
    _check_body_size(p, "IDENTIFY", size)


def _identify(p: Parser, head: None, body: memoryview) -> Command:
    raw = bytes(body)
    if _json_nests_deeper(raw, MAX_JSON_DEPTH):
        raise ProtocolError(
            e.E_BAD_BODY, f"IDENTIFY JSON body nested deeper than {MAX_JSON_DEPTH} levels"
        )
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(e.E_BAD_BODY, "IDENTIFY failed to decode JSON body") from exc
    if not isinstance(config, dict):
        raise ProtocolError(e.E_BAD_BODY, "IDENTIFY failed to decode JSON body")
    return Identify(config)


#: A JSON string literal (escapes included); brackets inside one do not nest.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Openers to "(", closers to ")"; everything else is deleted (see ``_BRACKETS_ONLY``).
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_BRACKETS_ONLY = bytes(c for c in range(256) if c not in b"[]{}")


def _json_nests_deeper(raw: bytes, limit: int) -> bool:
    """Whether arrays and objects in ``raw`` nest deeper than ``limit``: without recursion,
    in C-speed passes (string literals removed, then innermost pairs, one level a pass).
    Exact for valid JSON; whatever it says of invalid JSON, the decoder refuses that."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # the common case: a flat object
    pairs = _JSON_STRING.sub(b"", raw).translate(_BRACKETS, _BRACKETS_ONLY)
    if b"(" * (limit + 1) in pairs:
        return True
    for _ in range(limit):
        if not pairs:
            return False
        pairs = pairs.replace(b"()", b"")
    return bool(pairs)


def _auth_head(p: Parser, parts: list[bytes], size: int) -> None:
    _check_body_size(p, "AUTH", size)


def _auth(p: Parser, head: None, body: memoryview) -> Command:
    return Auth(bytes(body))


_WITH_BODY: dict[bytes, tuple[_Head, _Build]] = {
    b"PUB": (_pub_head, _pub),
    b"MPUB": (_mpub_head, _mpub),
    b"DPUB": (_dpub_head, _dpub),
    b"IDENTIFY": (_identify_head, _identify),
    b"AUTH": (_auth_head, _auth),
}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _int(raw: bytes, what: str) -> int:
    # Stricter than int(), which would take "1_000" or " 7".
    if _INTEGER.fullmatch(raw) is None:
        raise ProtocolError(e.E_INVALID, f"{what} {_text(raw)}")
    return int(raw)
