"""The broker HTTP API's JSON documents, declared once: what it accepts (query parameters,
the measurement body), what it answers (/info, /stats, /srtm/*, errors) and the orders it
sends publishers. The OpenAPI document is generated from these (``srtm.openapi``).

Queries are validated by their model, except /pub's and /mpub's: those are parsed by hand
per message in ``srtm.broker.http_requests`` (a test holds both to the same answers). Answers are
built as these models and dumped in their field order, which is nsqd's where nsqd has the
field (NSQ's tools read /stats).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from srtm.broker.measurement import MAX_MEASURE_NS, MIN_MEASURE_NS
from srtm.protocol import is_valid_name
from srtm.protocol.names import MAX_NAME_LENGTH, is_valid_token
from srtm.protocol.session import MAX_CLASS_LENGTH, is_valid_class
from srtm.ratelimit.overflow import MAX_MAX_WAIT_MS, OverflowName

NAME_RULE = f"1-{MAX_NAME_LENGTH} characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral"
MAX_VERSION = 2**63 - 1
CLASS_RULE = f"1-{MAX_CLASS_LENGTH} characters of [.a-zA-Z0-9_-]"
TOKEN_RULE = "1-64 characters of [0-9A-Za-z_-]"
#: Bounds of /srtm/admission's body: classes per topic, and any one admitted count.
MAX_CLASSES, MAX_ADMITTED = 256, 2**31 - 1


# -- the rules parameters follow (NAME_RULE and flag are /pub's and /mpub's too) -----------
def _absent() -> PydanticCustomError:
    """An empty value where one is needed: answered as a missing one (MISSING_ARG_*)."""
    return PydanticCustomError("missing", "is empty")


def _name(value: str) -> str:
    if not value:
        raise _absent()
    if not is_valid_name(value):
        raise PydanticCustomError("invalid_name", "must be " + NAME_RULE)
    return value


def _class_name(value: str) -> str:
    if not is_valid_class(value):
        raise PydanticCustomError("invalid_class", "a consumer class must be " + CLASS_RULE)
    return value


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise PydanticCustomError("duplicate", "lists a class more than once")
    return values


def _present(value: str) -> str:
    if not value:
        raise _absent()
    return value


def _ascii_digits(value: object) -> object:
    """A decimal integer in ASCII digits: int() also takes "²", "४", "1_000" and " 1"."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise PydanticCustomError("not_digits", "must be a decimal integer in ASCII digits")
    return value


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")  # fmt: skip


def valid_host_port(value: str) -> bool:
    """``HOST:PORT`` with a host name or IP address and a port 1..65535 (what a publisher
    can connect to, and nothing else: no path, query, user or spaces)."""
    host, sep, port = value.rpartition(":")
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    if not sep or not digits or not 0 < int(port) < 65536:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(host) is not None


def _host_port(value: str) -> str:
    if not valid_host_port(value):
        raise PydanticCustomError("host_port", "must be HOST:PORT with a port 1-65535")
    return value


def _token(value: str) -> str:
    if not value:
        raise _absent()
    if not is_valid_token(value):
        raise PydanticCustomError("invalid_token", "must be " + TOKEN_RULE)
    return value


def flag(value: object) -> bool:
    """/mpub's ``binary``: true or 1 (any case); anything else is false, as in nsqd."""
    return str(value).lower() in ("true", "1")


def _empty_is_none(value: object) -> object:
    return value or None


Name = Annotated[
    str,
    AfterValidator(_name),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH}),
]
# Constraints before validators: after one, pydantic leaves them out of the JSON schema.
Whole = Annotated[int, Field(ge=0), BeforeValidator(_ascii_digits)]
Version = Annotated[int, Field(ge=0, le=MAX_VERSION), BeforeValidator(_ascii_digits)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
HostPort = Annotated[str, AfterValidator(_host_port), Field(examples=["broker-2.local:4150"])]
Flag = Annotated[bool, BeforeValidator(flag)]
Token = Annotated[
    str,
    AfterValidator(_token),
    WithJsonSchema({"type": "string", "pattern": "^[0-9A-Za-z_-]{1,64}$"}),
]
_HANDOFF_TO = (
    "After this change, the broker at this TCP address takes its armed share (a HANDOFF "
    "on the relay link, after all this broker relayed to it before)"
)
_HANDOFF_TOKEN = "The token the destination was armed with (with handoff)"


# -- requests ----------------------------------------------------------------------------
class Query(BaseModel):
    """Query parameters. A refused one is answered nsqd's way, ``{"message": CODE}``:
    MISSING_ARG_<NAME> when absent (or empty where a name is needed), INVALID_<NAME>
    otherwise; the detail names the parameter and the rule."""

    model_config = ConfigDict(frozen=True)
    #: Parameters whose absence is INVALID_<NAME> (the answer the broker has always given).
    absent_is_invalid: ClassVar[frozenset[str]] = frozenset()
    #: False where every value is read somehow and nothing is refused.
    refuses: ClassVar[bool] = True


def query_refusals(query: type[BaseModel]) -> dict[int, str]:
    """What a ``Query`` refuses with, for the OpenAPI document: 400 and its codes,
    MISSING_ARG_<NAME> (required ones) and INVALID_<NAME>."""
    if not (issubclass(query, Query) and query.refuses):
        return {}
    codes = []
    for name, info in query.model_fields.items():
        if info.is_required() and name not in query.absent_is_invalid:
            codes.append(f"MISSING_ARG_{name.upper()}")
        codes.append(f"INVALID_{name.upper()}")
    return {400: ", ".join(codes)}


class TopicQuery(Query):
    topic: Annotated[Name, Field(description="The topic: " + NAME_RULE)]


class ChannelQuery(TopicQuery):
    channel: Annotated[Name, Field(description="The channel: " + NAME_RULE)]


class PubQuery(TopicQuery):
    """/pub's query (parsed by hand per message; this declares it)."""

    defer: Annotated[
        Whole | None, Field(description="Deliver after this many ms (at most --max-req-timeout)")
    ] = None
    publisher: Annotated[str, Field(description="Whose message, for measurement rounds")] = ""


class MpubQuery(TopicQuery):
    """/mpub's query (parsed by hand per request; this declares it)."""

    binary: Annotated[
        Flag, Field(description="true: [count]([size][body])*; else one message per line")
    ] = False
    publisher: Annotated[str, Field(description="Whose messages, for measurement rounds")] = ""


class StatsQuery(Query):
    """As nsqd: every value is read somehow, none is refused."""

    refuses = False

    format: Annotated[
        Literal["text", "json"],
        BeforeValidator(lambda v: "json" if v == "json" else "text"),
        Field(description="json, or text (anything else)"),
    ] = "text"
    topic: Annotated[
        str | None, BeforeValidator(_empty_is_none), Field(description="Only this topic")
    ] = None
    channel: Annotated[
        str | None, BeforeValidator(_empty_is_none), Field(description="Only this channel")
    ] = None
    include_clients: Annotated[
        bool,
        BeforeValidator(lambda v: v != "false"),
        Field(description="false leaves the clients out"),
    ] = True
    include_mem: Annotated[
        bool,
        BeforeValidator(lambda v: v != "false"),
        Field(description="false leaves the memory block out"),
    ] = True


class BucketQuery(TopicQuery):
    rate: Annotated[Finite, Field(description="Tokens per second")]
    burst: Annotated[Finite, Field(description="Bucket size in tokens")]


class ArmQuery(BucketQuery):
    token: Annotated[Token, Field(description="The one-time token a HANDOFF must carry")]


HandoffTo = Annotated[
    HostPort | None, BeforeValidator(_empty_is_none), Field(description=_HANDOFF_TO)
]
HandoffToken = Annotated[
    Token | None, BeforeValidator(_empty_is_none), Field(description=_HANDOFF_TOKEN)
]


class BucketSetQuery(BucketQuery):
    """A sub-bucket, its topic's bound and overflow policy (absent: as they are), and
    where a decrease hands the share over (both or neither)."""

    handoff: HandoffTo = None
    token: HandoffToken = None
    max_wait_ms: Annotated[
        Finite | None,
        Field(gt=0, le=MAX_MAX_WAIT_MS, description="Longest a message may wait behind the "
              "sub-bucket before the overflow policy acts"),
    ] = None  # fmt: skip
    overflow: Annotated[OverflowName | None, Field(description="What happens over the bound")] = (
        None
    )


class HoldQuery(TopicQuery):
    """A hold, and where it hands the share over (both or neither)."""

    handoff: HandoffTo = None
    token: HandoffToken = None


class MigrateQuery(TopicQuery):
    absent_is_invalid = frozenset({"to"})

    publisher: Annotated[str, AfterValidator(_present), Field(description="Who is to move")]
    to: Annotated[HostPort, Field(description="The broker to move to (its TCP address)")]
    version: Annotated[Version, Field(description="The plan's version, echoed in the order")] = 0


class MeasureQuery(TopicQuery):
    window_ms: Annotated[
        Finite,
        Field(
            ge=MIN_MEASURE_NS / 1e6,
            le=MAX_MEASURE_NS / 1e6,
            description="How long the round measures; answered when it ends",
        ),
    ]


class MeasureBody(BaseModel):
    """The body of /srtm/measure (optional): whose messages the round measures."""

    model_config = ConfigDict(frozen=True)

    publishers: Annotated[
        list[str] | None, Field(description="Publisher names; absent or null: all")
    ] = None


ClassName = Annotated[str, AfterValidator(_class_name)]


class AdmissionBody(BaseModel):
    """The body of POST /srtm/admission: the topic's admitted consumers per class (a class
    not listed, ``default`` included, is unlimited; ``{}`` lifts every limit) and the
    classes' importance, most important first (classes not listed rank below, by name)."""

    model_config = ConfigDict(frozen=True)

    classes: Annotated[
        dict[ClassName, Annotated[int, Field(strict=True, ge=0, le=MAX_ADMITTED)]],
        Field(max_length=MAX_CLASSES, description="Admitted consumers per class: n_alloc(j)"),
    ]
    order: Annotated[
        list[ClassName],
        AfterValidator(_distinct),
        Field(max_length=MAX_CLASSES, description="Classes, most important first"),
    ] = []


BrokerName = Annotated[str, AfterValidator(_present), Field(max_length=256)]
#: Bounds of /srtm/route's body: publishers forwarded, peers, homed channels; the grace.
MAX_ROUTE_ENTRIES, MAX_GRACE_S = 10_000, 86_400.0


class ForwardBody(BaseModel):
    """Where this broker forwards the topic's messages (lazy plan propagation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: Annotated[
        HostPort | None,
        Field(description="TCP address for every publisher not listed; null: only those"),
    ] = None
    publishers: Annotated[
        dict[str, HostPort],
        Field(max_length=MAX_ROUTE_ENTRIES, description="Per publisher id: its new broker"),
    ] = {}
    grace_s: Annotated[
        Finite,
        Field(gt=0, le=MAX_GRACE_S, description="Forwarding ends after this long without any"),
    ] = 10.0


class ReplicasBody(BaseModel):
    """ALL_PUBLISHERS replication of the topic among brokers (this one included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peers: Annotated[
        dict[BrokerName, HostPort],
        Field(max_length=MAX_ROUTE_ENTRIES, description="Replica id: TCP address (self skipped)"),
    ]
    primary: Annotated[BrokerName, Field(description="Home of every channel not in homes")]
    homes: Annotated[
        dict[Name, BrokerName],
        Field(max_length=MAX_ROUTE_ENTRIES, description="Channel: the replica that serves it"),
    ] = {}


class RouteBody(BaseModel):
    """The body of POST /srtm/route: the topic's route on this broker, replacing any."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: Name
    self: Annotated[BrokerName, Field(description="This broker's id in the controller")]
    forward: ForwardBody | None = None
    replicas: ReplicasBody | None = None


# -- answers -----------------------------------------------------------------------------
class Doc(BaseModel):
    """An answer; dumped with its fields in declaration order."""

    model_config = ConfigDict(frozen=True)


class ErrorDoc(Doc):
    """nsqd's error answer; ``detail`` (SRTM's) names the field or the reason."""

    message: str
    detail: str | None = None


class InfoSrtmDoc(Doc):
    broker_id: int


class InfoDoc(Doc):
    version: str
    broadcast_address: str
    hostname: str
    tcp_port: int
    http_port: int
    start_time: int
    max_heartbeat_interval: int = Field(description="ns, as nsqd's")
    max_output_buffer_size: int = Field(description="bytes")
    max_output_buffer_timeout: int = Field(description="ns, as nsqd's")
    max_deflate_level: int
    srtm: InfoSrtmDoc


class MemoryDoc(Doc):
    """nsqd's memory block, from CPython: heap_objects is the allocator's live blocks
    (sys.getallocatedblocks), heap_in_use_bytes the resident set, the GC pauses and runs
    the collector's own; heap_idle_bytes, heap_released_bytes and next_gc_bytes have no
    CPython counterpart and are 0."""

    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


class ConfigValue(RootModel[list[str] | int | None]):
    """nsqd's /config/:opt answers the option's value itself: the address list, or the
    log level's number (1 debug, 2 info, 3 warn, 4 error, 5 fatal)."""


class BucketDoc(Doc):
    rate: float
    burst: float


class BucketNowDoc(BucketDoc):
    tokens: float = Field(description="Tokens in the bucket now; negative while owed")


class BucketAnswer(Doc):
    """The bucket a POST or DELETE left (null: none), and whether the topic is held."""

    topic: str
    bucket: BucketDoc | None
    held: bool = Field(default=False, description="Managed with no share here: nothing is released")
    handoff: bool = Field(
        default=False, description="A HANDOFF to the destination was queued after this change"
    )


class BoundSetDoc(Doc):
    max_wait_ms: float = Field(description="Longest a message may wait behind the sub-bucket")
    overflow: OverflowName = Field(description="What happens over the bound")


class BucketSetAnswer(BucketAnswer):
    """POST /srtm/bucket's answer: the bucket, and the topic's bound (null: none)."""

    bound: BoundSetDoc | None


class ArmAnswer(Doc):
    """The share armed for a handoff (applied only when a relay link hands it over)."""

    topic: str
    bucket: BucketDoc
    expires_in_s: float = Field(description="How long it waits for its handoff")


class BucketReading(Doc):
    topic: str
    bucket: BucketNowDoc | None


class MigrateAnswer(Doc):
    notified: int = Field(description="Connections of the publisher that took the order")


class MeasureAnswer(Doc):
    topic: str
    window_ms: float
    samples: int
    p99_ms: float | None = Field(description="null without samples")
    p50_ms: float | None = Field(description="null without samples")
    loop_lag_p99_ms: float | None = Field(
        None,
        description="p99 of how late the broker's event loop woke for its 10 ms ticks "
        "during the round: a starved loop adds this to what the round measured",
    )
    settle_ms: float = Field(
        0.0,
        description="how long the round waited, before it started, until none of the "
        "topic's messages waited for tokens (what a move left)",
    )
    settled: bool = Field(
        True, description="false: some still waited after 5 s, and the round started anyway"
    )


class AdmissionClassDoc(Doc):
    name: str = Field(description="The consumer class (IDENTIFY srtm_class; else default)")
    admitted: int | None = Field(description="Admitted consumers; null: unlimited")
    connected: int = Field(description="Consumers of the class subscribed to the topic now")


class AdmissionDoc(Doc):
    """A topic's admission control: its classes, most important first."""

    topic: str
    order: list[str]
    classes: list[AdmissionClassDoc]


class AdmissionAnswer(AdmissionDoc):
    disconnected: int = Field(description="Consumers beyond their class's new count, closed")


class MigrateDoc(Doc):
    topic: str
    to: str
    version: int


class RouteCountersDoc(Doc):
    forwarded: int = Field(description="Messages forwarded and acknowledged by their target")
    relayed: int = Field(description="Copies acknowledged by replicas")
    fallback_local: int = Field(
        description="Messages a target or replica could not take, accepted here instead"
    )


class RouteStatsDoc(RouteCountersDoc):
    last_forward_age_s: float = Field(
        description="Since the last forwarded message (or since the route was set)"
    )


class ForwardDoc(Doc):
    to: str | None
    publishers: dict[str, str]
    grace_s: float


class ReplicasDoc(Doc):
    peers: dict[str, str]
    primary: str
    homes: dict[str, str]


class RouteDoc(Doc):
    """A topic's route: its forward part is null once its grace ran out."""

    topic: str
    self: str
    forward: ForwardDoc | None
    replicas: ReplicasDoc | None
    counters: RouteStatsDoc


class OrderDoc(Doc):
    """An SRTM order, sent to a publisher's connections that take orders."""

    migrate: MigrateDoc


# -- /stats: nsqd's shape, then the srtm section ------------------------------------------
class QuantileDoc(Doc):
    quantile: float
    value: int


class E2eLatencyDoc(Doc):
    count: int
    percentiles: list[QuantileDoc] | None


class PubCountDoc(Doc):
    topic: str
    count: int


class ClientDoc(Doc):
    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: bool
    tls_version: str
    tls_cipher_suite: str
    authed: bool
    auth_identity: str
    auth_identity_url: str
    pub_counts: list[PubCountDoc]


class ChannelDoc(Doc):
    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: list[ClientDoc]
    paused: bool
    e2e_processing_latency: E2eLatencyDoc


class TopicDoc(Doc):
    topic_name: str
    channels: list[ChannelDoc]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    e2e_processing_latency: E2eLatencyDoc


class LatencySummaryDoc(Doc):
    """In ns."""

    count: int
    mean: int
    p50: int
    p95: int
    p99: int
    p999: int


class WindowDoc(Doc):
    """The TB Adaptor's inputs over the last ``seconds`` complete seconds."""

    seconds: int
    average_rate: float
    max_backlog: float


class SrtmChannelDoc(Doc):
    channel: str
    rate_1s: float
    token_wait_ns: LatencySummaryDoc
    latency_ns: LatencySummaryDoc


class SenderDoc(Doc):
    publisher: str = Field(description="IDENTIFY srtm_publisher, else client_id")
    remote_address: str
    count: int = Field(description="Messages it published to the topic since it connected")
    blocked: bool = Field(description="Not read now: the topic is over its bound (block)")


class BoundDoc(Doc):
    """The topic's bound on what waits behind its sub-bucket (srtm.ratelimit.overflow)."""

    max_wait_ms: float
    overflow: OverflowName
    wait_ms: float = Field(
        description="How long a message arriving now would wait behind the sub-bucket "
        "(0 unshaped or held: nothing bounds those)"
    )
    over: bool = Field(description="wait_ms is over max_wait_ms: the policy acts")
    dropped: int = Field(description="Waiting messages dropped over the bound (drop-oldest)")
    refused: int = Field(description="Messages refused over the bound (refuse)")
    blocked_connections: int = Field(description="Connections not read now (block)")
    senders: list[SenderDoc] = Field(
        description="While over (or a connection is blocked): the connections that "
        "published the most to it"
    )


class SrtmTopicDoc(Doc):
    topic: str
    bucket: BucketNowDoc | None
    bound: BoundDoc | None = Field(description="null: no bound (none was given)")
    held: bool = Field(
        description="Managed by the controller with no share on this broker: what arrives "
        "waits (shaping_depth) until a sub-bucket or unmanaging releases it"
    )
    shaping_depth: int
    rate_1s: float
    window: WindowDoc
    token_wait_ns: LatencySummaryDoc
    latency_ns: LatencySummaryDoc = Field(
        description="Dispatch − arrival of first attempts on its first channel since the "
        "broker started, waits for a subscriber included (nsqd's e2e_processing_latency)"
    )
    release_lateness_ns: LatencySummaryDoc
    release_lateness_held_ns: LatencySummaryDoc = Field(
        description="release_lateness_ns of the releases held for a token only (token "
        "wait > 0): the release loop's timing. A release due on arrival is as late as the "
        "read that took it, from the kernel's stamp (the wake-up of a sleeping broker). "
        "Empty with --capacity, whose lateness is the emulated server's"
    )
    delivery_window_s: float = Field(
        description="delivery_ns and subscriber_wait_ns cover the last this many seconds "
        "(the current 10 s step and the five before it)"
    )
    delivery_ns: LatencySummaryDoc = Field(
        description="Dispatch − arrival of first attempts on every channel, over the "
        "window, of the messages that arrived while their channel had a subscriber and "
        "kept one until dispatched: what the controller judges the SLO on"
    )
    subscriber_wait_ns: LatencySummaryDoc = Field(
        description="The same of every other first attempt: messages that waited for a "
        "subscriber (arrived before their channel had one, or it had none for a while)"
    )
    backlog_age_ns: int = Field(
        description="Age of the oldest message waiting to be delivered (shaping, held for "
        "a first channel, or queued on a channel; of the queues' heads in memory; "
        "deferred ones not counted); 0: none"
    )
    dropped: int
    channels: list[SrtmChannelDoc]
    admission: list[AdmissionClassDoc] = Field(
        default=[],
        description="Consumers per class, admitted and connected (empty: no class has any "
        "and no count is set)",
    )
    route: RouteCountersDoc | None = Field(
        default=None, description="The topic's relay route's counters (null: no route)"
    )


class ArrivalStampsDoc(Doc):
    kernel: bool
    gap_ns: LatencySummaryDoc


class SrtmStatsDoc(Doc):
    broker_id: int
    arrival_stamps: ArrivalStampsDoc
    release_lateness_ns: LatencySummaryDoc = Field(
        description="The release lateness of the topics listed, together: each release "
        "counted once (many topics at a low rate give a p99 that none has releases enough "
        "for alone)"
    )
    release_lateness_held_ns: LatencySummaryDoc = Field(
        description="The same, of the releases held for a token only"
    )
    topics: list[SrtmTopicDoc]


class StatsDoc(Doc):
    version: str
    health: str
    start_time: int
    topics: list[TopicDoc]
    memory: MemoryDoc | None = Field(default=None, description="absent with include_mem=false")
    producers: list[ClientDoc]
    srtm: SrtmStatsDoc
