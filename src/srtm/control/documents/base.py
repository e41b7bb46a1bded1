"""What every controller document shares: the limits, the field help, the value types
(addresses, names, ids, bursts), the strict request and closed answer models, and ``parse``,
which turns a ``ValidationError`` into a ``ControlError`` naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import ErrorDetails

from srtm.control.validate import (
    MAX_PUBLISHER_ID,
    MIN_JOIN_SECRET,
    PUBLISHER_ID_PATTERN,
    ControlError,
    split_address,
)
from srtm.protocol.names import MAX_NAME_LENGTH
from srtm.ratelimit import MAX_BURST, MAX_RATE

#: What the ``utility`` field of a topic is.
UTILITY_HELP = (
    "the topic's utility spec: one flow of `srtm utility optimize`'s FLOWS.json without "
    "name and brokers (kind, r_min, r_max, utility, classes, rr, cost; costs cpu in "
    "core-seconds and network in bytes, per message and per consumer); docs/utility.md"
)

#: What the ``max_publisher_rate`` field of a topic is.
MAX_PUBLISHER_RATE_HELP = (
    "the most msg/s an unknown publisher may declare to join this open topic by GET "
    "/assign (400 naming rate beyond); default: the topic's rate, or with a rate that "
    "follows the publishers 1e9 (a broker's limit; the topic's resulting rate is checked "
    "too)"
)

#: A broker's largest ``mcap``, and the largest rate or backlog a report may tell: far
#: beyond any machine, small enough that sums over a fleet stay finite.
MAX_MCAP = 1e15
#: The longest p99 SLO a topic may have (ms): a day.
MAX_SLO_MS = 86_400_000.0
#: The largest count a report may tell (nsqd's counters are 64-bit).
MAX_COUNT = 2**63 - 1

#: Topics one report may carry (a broker with more is refused, not truncated).
MAX_REPORT_TOPICS = 100_000

#: What the ``max_wait_ms`` field of a topic is.
MAX_WAIT_HELP = (
    "the longest a message may wait behind a broker's sub-bucket (ms); over it, overflow acts"
)
#: What the ``overflow`` field of a topic is.
OVERFLOW_HELP = (
    "over max_wait_ms: block (the publisher's connection is not read until it drains), "
    "refuse (E_PUB_FAILED naming the limit; HTTP 503) or drop-oldest (the oldest waiting go)"
)

STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class Request(BaseModel):
    """A request document: JSON types as they are, numbers finite."""

    model_config = STRICT


class Answer(BaseModel):
    """An answer document: no field beyond those declared."""

    # A field the state adds that no model declares fails tests/test_controller_api.py.
    model_config = ConfigDict(extra="forbid")


# -- values ----------------------------------------------------------------------------------
def _address(value: str) -> str:
    split_address(value)
    return value


def _burst(value: Any) -> float | str:
    if value == "profile":
        return "profile"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and 1 <= value <= MAX_BURST):  # no float(): 10**400 has none
        raise ValueError(
            f"must be a number from 1 (a bucket holds one token) to {MAX_BURST:g}, or "
            f'"profile", got {value!r}'
        )
    return float(value)


#: ``HOST:PORT`` (``[V6]:PORT``): an IP or a DNS name, port 1-65535, nothing else.
HostPort = Annotated[
    str,
    AfterValidator(_address),
    Field(examples=["127.0.0.1:4150"], description="HOST:PORT ([V6]:PORT), port 1-65535"),
]
#: NSQ's rule for topic names, as ``srtm.protocol.is_valid_name`` has it (a test checks
#: that they agree); checked by pydantic itself, as a report may name 100,000 topics.
TopicName = Annotated[
    str, StringConstraints(pattern=r"^[.a-zA-Z0-9_-]+(#ephemeral)?$", max_length=MAX_NAME_LENGTH)
]
#: A publisher's id: a topic name's characters and ``: @ / + =`` (host:port, user@host,
#: base64), at most ``MAX_PUBLISHER_ID`` of them; it is logged, shown by the console and
#: kept in every plan, so nothing else (no spaces, no markup, no control characters).
PublisherId = Annotated[
    str,
    StringConstraints(pattern=PUBLISHER_ID_PATTERN, max_length=MAX_PUBLISHER_ID),
    Field(description=f"1-{MAX_PUBLISHER_ID} of [.a-zA-Z0-9_:@/+=-]"),
]
#: A publisher's rate (msg/s): no more than a bucket may have.
PublisherRate = Annotated[float, Field(gt=0, le=MAX_RATE)]
#: A topic's join secret: what an unknown publisher gives to join it (never answered).
JoinSecret = Annotated[
    str,
    StringConstraints(pattern=r"^[\x21-\x7e]+$", min_length=MIN_JOIN_SECRET, max_length=256),
    Field(
        description=f"{MIN_JOIN_SECRET}-256 printable ASCII characters: an unknown publisher "
        "joins this open topic only with it (X-SRTM-Join-Secret header or join_secret "
        "query parameter of GET /assign) or the cluster token; never shown by any GET"
    ),
]
#: The topic's bucket depth, or ``"profile"``: derived from ``arrivals_ns``.
Burst = Annotated[
    float | Literal["profile"],
    PlainValidator(_burst),
    WithJsonSchema(
        {"anyOf": [{"type": "number", "minimum": 1, "maximum": MAX_BURST}, {"const": "profile"}]}
    ),
]


# -- validation ------------------------------------------------------------------------------
M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], doc: Any, **context: Any) -> M:
    """``doc`` as a ``model``; a ``ControlError`` (400) naming the first failing field."""
    try:
        return model.model_validate(doc, context=context)
    except ValidationError as exc:
        raise ControlError(400, describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """``field.path[i]: why`` for the first error, and how many more there are."""
    errors = exc.errors(include_url=False)
    text = _one(errors[0])
    return text if len(errors) == 1 else f"{text} (and {len(errors) - 1} more)"


def _one(error: ErrorDetails) -> str:
    where = ""
    for part in error["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif part != "[key]":  # a bad key of a mapping: the key is the part before
            where += f".{part}" if where else part
    if error["type"] == "value_error":
        why = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        why = error["msg"]
        given = error.get("input")
        if given is None or isinstance(given, bool | int | float | str):
            why += f", got {given!r:.80}"
    return f"{where}: {why}" if where else why
