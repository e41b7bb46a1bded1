"""The broker's HTTP requests read, and refused nsqd's way (``srtm.broker.http``).

A query or body is read into its document (``srtm.broker.documents``); its first fault is
``MISSING_ARG_<NAME>`` or ``INVALID_<NAME>`` with a detail naming the field. /pub's and
/mpub's queries are checked by hand (no model per message), by the rules their models
declare; /mpub's body is cut into messages; bodies are bounded before they are read.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from srtm.broker.documents import NAME_RULE, Query
from srtm.httpkit import HttpError, arg, query_model
from srtm.jsondoc import parse_object
from srtm.protocol import is_valid_name
from srtm.protocol.parser import same_size_bodies

Q = TypeVar("Q", bound=Query)
B = TypeVar("B", bound=BaseModel)


def refusal(err: ValidationError, absent_is_invalid: frozenset[str] = frozenset()) -> HttpError:
    """A document's first fault, nsqd's way: MISSING_ARG_<NAME> or INVALID_<NAME>, the
    detail naming the field; a body that is not the document at all is INVALID_BODY."""
    first = err.errors(include_url=False)[0]
    loc = first["loc"]
    if not loc:
        return HttpError(400, "INVALID_BODY", f"body: {first['msg']}")
    name = str(loc[0])
    where = name + "".join(f"[{i}]" for i in loc[1:])
    missing = first["type"] == "missing" and name not in absent_is_invalid
    code = f"MISSING_ARG_{name.upper()}" if missing else f"INVALID_{name.upper()}"
    return HttpError(400, code, f"{where}: {first['msg']}")


def parse_query(model: type[Q], query: Mapping[str, str]) -> Q:
    """``query`` (the first value of each parameter) as ``model``, or the refusal."""
    values = {k: query[k] for k in query}
    return query_model(model, values, lambda err: refusal(err, model.absent_is_invalid))


def parse_body(model: type[B], body: bytes) -> B:
    """``body`` as ``model``: INVALID_BODY where it is not JSON (the detail naming the line
    and column) or not an object, then the model's refusal naming the field."""
    try:
        doc = parse_object(body)
    except ValueError as exc:
        raise HttpError(400, "INVALID_BODY", str(exc)) from None
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        raise refusal(err) from None


# -- /pub and /mpub: their queries checked by hand (no model per message), by the rules
# their models declare (PubQuery, MpubQuery); tests hold both to the same answers.
def topic_param(query: Mapping[str, str]) -> str:
    name = arg(query, "topic", "topic: Field required")
    if not name:
        raise HttpError(400, "MISSING_ARG_TOPIC", "topic: is empty")
    if not is_valid_name(name):
        raise HttpError(400, "INVALID_TOPIC", "topic: must be " + NAME_RULE)
    return name


def defer_param(raw: str, most: int) -> int:
    """A decimal integer 0..most (ASCII digits only: ``str.isdigit`` takes "²" and "४")."""
    digits = raw.isascii() and raw.isdigit() and len(raw) <= len(str(most))  # int() caps
    if not digits or int(raw) > most:  # strings at 4,300 digits with a ValueError
        raise HttpError(400, "INVALID_DEFER", f"defer: must be an integer 0..{most}")
    return int(raw)


async def bounded_body(request: web.Request, most: int) -> bytes:
    """The body, refused with 413 beyond ``most`` bytes before it is read when declared."""
    if request.content_length is not None and request.content_length > most:
        raise HttpError(413, "BODY_TOO_BIG", f"{request.content_length} > {most} bytes")
    body = await request.read()
    if len(body) > most:
        raise HttpError(413, "BODY_TOO_BIG", f"{len(body)} > {most} bytes")
    return body


#: Binary /mpub messages of different sizes cut per loop turn (about 5 ms).
_CUT_PER_TURN = 16384


async def split_mpub(body: bytes, binary: bool, max_msg: int) -> list[bytes]:
    """/mpub bodies: newline-separated text, or nsqd's binary ``[count]([size][body])*``."""
    # Cut and checked in C where it can be (a million messages in milliseconds, not a
    # second of the event loop's time): the loop below runs only for what C does not
    # take, and lets the loop turn between pieces.
    if not binary:
        msgs = list(filter(None, body.split(b"\n")))
    elif len(body) < 4:
        raise HttpError(400, "INVALID_BODY", "binary body shorter than its count")
    elif (same := same_size_bodies(body, struct.unpack_from(">I", body)[0], max_msg)) is not None:
        return same  # one size, within max_msg: checked as cut (a loop over a million: 20 ms)
    else:
        (count,) = struct.unpack_from(">I", body)
        msgs, pos = [], 4
        for i in range(count):
            if i % _CUT_PER_TURN == _CUT_PER_TURN - 1:
                await asyncio.sleep(0)
            if pos + 4 > len(body):
                raise HttpError(400, "INVALID_BODY", f"message {i}: size missing")
            (size,) = struct.unpack_from(">I", body, pos)
            pos += 4
            if size == 0 or pos + size > len(body):
                raise HttpError(400, "INVALID_BODY", f"message {i}: bad size {size}")
            msgs.append(body[pos : pos + size])
            pos += size
        if pos != len(body):
            raise HttpError(400, "INVALID_BODY", "bytes left after the last message")
    if not msgs:
        raise HttpError(400, "MSG_EMPTY")
    if max(map(len, msgs)) > max_msg:
        too_big = next(len(m) for m in msgs if len(m) > max_msg)
        raise HttpError(413, "MSG_TOO_BIG", f"{too_big} > {max_msg} bytes")
    return msgs
