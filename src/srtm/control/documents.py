"""Every JSON document the controller's HTTP API takes or answers with, declared once.

Requests (``Registration``, ``BrokerReport``, ``NewTopic``, ``Move``) are validated by
``parse``: JSON types as they are (no ``"1"`` for 1, no ``true`` for 1), numbers finite,
unknown fields ignored (except in ``fit``); a refusal is a ``ControlError`` (400) whose
message names the failing field, as ``publishers[2].rate: ...``. Answers are built by
the controller's state as plain dicts; the models here describe them for the OpenAPI
document, and tests check real answers against them. No I/O here.
"""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    RootModel,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
    with_config,
)
from pydantic_core import ErrorDetails
from typing_extensions import TypedDict

from srtm.analysis import profile_bucket
from srtm.control.actions import HELD, Share
from srtm.control.validate import (
    MAX_PUBLISHER_ID,
    MIN_JOIN_SECRET,
    PUBLISHER_ID_PATTERN,
    ControlError,
    split_address,
)
from srtm.placement import Policy, PublisherLoad, TopicSpec, topic_bucket
from srtm.placement.fitting import FitOutcome, Verdict
from srtm.placement.model import RATE_MARGIN
from srtm.protocol.names import MAX_NAME_LENGTH
from srtm.ratelimit import MAX_BURST, MAX_RATE, BucketParams, check_bucket
from srtm.ratelimit.overflow import (
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_OVERFLOW,
    MAX_MAX_WAIT_MS,
    Bound,
    OverflowName,
    check_bound,
)
from srtm.utility.cluster import parse_topic_utility

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

_STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class _Request(BaseModel):
    model_config = _STRICT


class _Answer(BaseModel):
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


# -- requests --------------------------------------------------------------------------------
class Registration(_Request):
    """``POST /brokers``: a broker registers (again after a restart)."""

    id: str = Field(min_length=1, max_length=256)
    tcp_address: HostPort
    http_address: HostPort
    mcap: float = Field(gt=0, le=MAX_MCAP, description="messages/s it can process")


# TypedDicts, not models, where a document may hold 100,000 entries (a report's topics,
# a topic's publishers): pydantic checks dicts about four times faster than it builds as
# many model instances, and reports are checked on the event loop.
@with_config(_STRICT)
class TopicWindow(TypedDict):
    """One topic's TB Adaptor window in a broker's report (each field defaults to 0);
    ``depth``: messages it still holds (queued, deferred, in flight), listed by /lookup
    while > 0; ``waiting``: those waiting for tokens (its shaping queue); ``arrived``:
    messages accepted since the broker started (none new between two reports, and none
    waiting: a draining broker has settled)."""

    rate: NotRequired[Annotated[float, Field(ge=0, le=MAX_MCAP)]]
    backlog: NotRequired[Annotated[float, Field(ge=0, le=MAX_MCAP)]]
    depth: NotRequired[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    waiting: NotRequired[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    arrived: NotRequired[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    #: Its channels (the registry's: /lookup, /channels); absent from an older broker.
    channels: NotRequired[list[TopicName]]
    #: Its share here: the sub-bucket, or none; ``held``: managed, no share here.
    bucket: NotRequired[ShareBucket | None]
    held: NotRequired[bool]
    #: Bytes of the messages counted by ``arrived`` (their mean size: network costs).
    arrived_bytes: NotRequired[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    #: Consumers per class that asked for it: connected, and refused ones still waiting
    #: (admission control's demand, the optimizer's ``available``).
    demand: NotRequired[dict[str, Annotated[int, Field(ge=0, le=MAX_COUNT)]]]


@with_config(_STRICT)
class Congestion(TypedDict):
    """Whether a broker's CPU and egress are over its thresholds (``--cpu-congested``,
    ``--egress-max``)."""

    cpu: bool
    network: bool


@with_config(_STRICT)
class BrokerResources(TypedDict):
    """A broker's use of its resources over its last report interval: ``cpu`` the
    fraction of one core its process used, ``egress_bps`` bytes/s written to clients."""

    cpu: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    egress_bps: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    congested: Congestion


@with_config(_STRICT)
class ShareBucket(TypedDict):
    """A topic's sub-bucket on a broker, as its report tells it."""

    rate: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    burst: Annotated[float, Field(ge=0, le=MAX_MCAP)]


class BrokerReport(_Request):
    """``POST /brokers/{id}/report``, every second: load and each topic's window. A bad
    report is refused whole (never half stored)."""

    load: float = Field(0.0, ge=0, le=MAX_MCAP)
    topics: dict[TopicName, TopicWindow] = Field(default_factory=dict, max_length=MAX_REPORT_TOPICS)
    #: 2: each topic tells its ``channels``, ``bucket`` and ``held`` (1: an older broker).
    version: int = Field(1, ge=1, le=1000)
    resources: BrokerResources | None = None

    def demand(self) -> dict[str, dict[str, int]]:
        """Per topic that tells it: consumers per class that asked."""
        return {name: dict(w["demand"]) for name, w in self.topics.items() if "demand" in w}

    def arrived_bytes(self) -> dict[str, int]:
        return {n: w["arrived_bytes"] for n, w in self.topics.items() if "arrived_bytes" in w}

    def windows(self) -> dict[str, tuple[float, float]]:
        """Topic -> (average rate, max backlog), the TB Adaptor's inputs."""
        return {n: (w.get("rate", 0.0), w.get("backlog", 0.0)) for n, w in self.topics.items()}

    def depths(self) -> dict[str, int]:
        return {name: w.get("depth", 0) for name, w in self.topics.items()}

    def waiting(self) -> dict[str, int]:
        return {name: w.get("waiting", 0) for name, w in self.topics.items()}

    def arrived(self) -> dict[str, int]:
        """Only the topics that tell it (an older broker's report: none)."""
        return {name: w["arrived"] for name, w in self.topics.items() if "arrived" in w}

    def carried(self) -> dict[str, frozenset[str]] | None:
        """Every topic with its channels; None from an older broker (it tells none)."""
        if self.version < 2:
            return None
        return {name: frozenset(w.get("channels", ())) for name, w in self.topics.items()}

    def seen(self) -> dict[str, Share] | None:
        """Each topic's share on the broker; None from an older broker (it tells none)."""
        if self.version < 2:
            return None
        out: dict[str, Share] = {}
        for name, w in self.topics.items():
            b = w.get("bucket")
            out[name] = (
                HELD
                if w.get("held")
                else None
                if b is None
                else BucketParams(b["rate"], b["burst"])
            )
        return out


@with_config(_STRICT)
class PublisherDoc(TypedDict):
    """A publisher of a new topic; publishers of one ``group`` fire together."""

    id: PublisherId
    rate: PublisherRate
    group: NotRequired[Annotated[str, Field(min_length=1, max_length=256)] | None]


class FitSettings(_Request):
    """Online fitting (``"fit": true`` takes the defaults); ``model`` (``"paper"`` or a
    model file from ``srtm calibrate`` under the controller's ``--models-dir``, at most
    1 MiB) makes it model-assisted."""

    model_config = ConfigDict(extra="forbid")

    window_s: float = Field(60.0, ge=0)
    min_samples: float = Field(100, ge=0)
    settle_s: float = Field(1.0, ge=0)
    model: str | None = Field(None, min_length=1)

    @field_validator("model")
    @classmethod
    def _model_choice(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A built-in model's name, or the resolved path of a file under ``models_dir``
        (``parse``'s context); no other path, so that a request cannot make the
        controller read /dev/zero or a FIFO. Reads no file."""
        from srtm.sim.model import BUILTIN  # the simulator only when fitting is asked for

        if value is None or value in BUILTIN:
            return value
        models_dir: Path | None = (info.context or {}).get("models_dir")
        if models_dir is None:
            raise ValueError(
                f"{value!r} is not a built-in model ({', '.join(BUILTIN)}); "
                "model files need the controller's --models-dir"
            )
        base = models_dir.resolve()
        path = (base / value).resolve()
        if not path.is_relative_to(base) or path == base:
            raise ValueError(f"{value!r} is not a file under --models-dir")
        return str(path)


def _fit_shorthand(value: Any) -> Any:
    """``true``: fitting with the defaults; ``false``: none."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


def _or_boolean(schema: dict[str, Any]) -> None:
    schema["anyOf"] = [{"type": "boolean"}, *schema.get("anyOf", [])]


_MAX_WAIT_HELP = (
    "the longest a message may wait behind a broker's sub-bucket (ms); over it, overflow acts"
)
_OVERFLOW_HELP = (
    "over max_wait_ms: block (the publisher's connection is not read until it drains), "
    "refuse (E_PUB_FAILED naming the limit; HTTP 503) or drop-oldest (the oldest waiting go)"
)


class NewTopic(_Request):
    """``POST /topics``: a topic, its SLO, its publishers and how to place it."""

    name: TopicName
    slo_p99_ms: float = Field(gt=0, le=MAX_SLO_MS)
    burst: Burst
    rate: float | None = Field(
        None, gt=0, description=f"the topic's token rate (default {RATE_MARGIN} × the "
        "publishers' total)",
    )  # fmt: skip
    arrivals_ns: list[int] | None = Field(None, description='a trace, for burst "profile"')
    policy: Policy = "srtm"
    fit: Annotated[
        FitSettings | None, BeforeValidator(_fit_shorthand), Field(json_schema_extra=_or_boolean)
    ] = None
    publishers: list[PublisherDoc] = Field(
        default_factory=list,
        description="at least one unless open; at most the controller's --max-publishers (413)",
    )
    open: bool = Field(
        False, description="unknown publishers may join by GET /assign with their rate"
    )
    max_publisher_rate: float | None = Field(
        None, gt=0, le=MAX_RATE, description=MAX_PUBLISHER_RATE_HELP
    )
    join_secret: JoinSecret | None = None
    utility: dict[str, Any] | None = Field(None, description=UTILITY_HELP)
    max_wait_ms: float | None = Field(
        None,
        gt=0,
        le=MAX_MAX_WAIT_MS,
        description=_MAX_WAIT_HELP + f" (default {DEFAULT_MAX_WAIT_MS:g})",
    )
    overflow: OverflowName | None = Field(
        None, description=_OVERFLOW_HELP + f" (default {DEFAULT_OVERFLOW.value})"
    )

    _bucket: tuple[float, float] = PrivateAttr()

    @model_validator(mode="after")
    def _whole(self) -> NewTopic:
        """Ids unique (counted once, not searched per id), and a bucket (given, default or
        profiled) that a broker can schedule."""
        ids = collections.Counter(p["id"] for p in self.publishers)
        dup = sorted(i for i, n in ids.items() if n > 1)[:5]
        if dup:
            raise ValueError(f"publishers: duplicate ids {dup}")
        if not self.publishers and not self.open:
            raise ValueError('publishers: at least one (or "open": true)')
        # A bucket that no broker could schedule is refused here, not by every broker; the
        # refusal quotes what was sent, and what was derived from it, as derived.
        if self.burst == "profile":
            if self.arrivals_ns is None or len(self.arrivals_ns) < 2:
                raise ValueError('arrivals_ns: burst "profile" needs a list of >= 2 timestamps')
            params = profile_bucket(self.arrivals_ns)
            rate, burst = params.rate, max(1.0, math.ceil(params.burst))
            try:
                check_bucket(rate, burst)
            except ValueError as exc:
                raise ValueError(
                    f"arrivals_ns: the bucket profiled from its {len(self.arrivals_ns)} "
                    f"timestamps (rate {rate:g} msg/s, burst {burst:g}) cannot be a "
                    f"broker's: {exc}"
                ) from None
            self._bucket = (rate, burst)
            return self
        if self.rate is None and not self.publishers:
            # open, no publishers yet, rate following them: no bucket to check
            self._bucket = (0.0, self.burst)
            return self
        loads = [PublisherLoad(p["id"], p["rate"]) for p in self.publishers]
        try:
            bucket = topic_bucket(loads, self.rate, self.burst)
        except ValueError as exc:
            raise ValueError(f"topic: {exc}") from None
        self._bucket = (bucket.rate, bucket.burst)
        return self

    @model_validator(mode="after")
    def _utility(self) -> NewTopic:
        if self.utility is not None:
            parse_topic_utility(self.utility, self.name)
        return self

    @property
    def bound(self) -> Bound:
        return check_bound(self.max_wait_ms, self.overflow)

    @property
    def rate_auto(self) -> bool:
        """No rate given (nor profiled): it follows the publishers as they join and leave."""
        return self.rate is None and self.burst != "profile"

    def to_topic(self) -> TopicSpec:
        rate, burst = self._bucket
        pubs = tuple(PublisherLoad(p["id"], p["rate"], p.get("group")) for p in self.publishers)
        return TopicSpec(self.name, pubs, burst, self.slo_p99_ms, rate)


class ReplicaCount(_Request):
    """``POST /topics/{name}/replicas``: ALL_PUBLISHERS with this many replicas (1: none)."""

    count: int = Field(ge=1, description="replicas, the primary included")


class Move(_Request):
    """``POST /topics/{name}/move``: move publishers to a broker."""

    publishers: list[PublisherId]
    to: str = Field(min_length=1, max_length=256, description="a broker id")


class NewPublishers(_Request):
    """``POST /topics/{name}/publishers``: publishers joining a topic."""

    publishers: list[PublisherDoc] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> NewPublishers:
        ids = collections.Counter(p["id"] for p in self.publishers)
        dup = sorted(i for i, n in ids.items() if n > 1)[:5]
        if dup:
            raise ValueError(f"publishers: duplicate ids {dup}")
        return self

    def loads(self) -> list[PublisherLoad]:
        return [PublisherLoad(p["id"], p["rate"], p.get("group")) for p in self.publishers]


class TopicChange(_Request):
    """``PATCH /topics/{name}``: any of these, at least one. A rate or burst re-splits the
    bucket; a policy places the topic again."""

    model_config = ConfigDict(extra="forbid")

    slo_p99_ms: float | None = Field(None, gt=0, le=MAX_SLO_MS)
    rate: float | None = Field(None, gt=0)
    burst: float | None = Field(None, ge=1, le=MAX_BURST)
    policy: Policy | None = None
    utility: dict[str, Any] | None = Field(None, description=UTILITY_HELP + "; null removes it")
    max_publisher_rate: float | None = Field(
        None, gt=0, le=MAX_RATE, description=MAX_PUBLISHER_RATE_HELP + "; null: the default"
    )
    join_secret: JoinSecret | None = Field(None, description="the join secret; null removes it")
    max_wait_ms: float | None = Field(None, gt=0, le=MAX_MAX_WAIT_MS, description=_MAX_WAIT_HELP)
    overflow: OverflowName | None = Field(None, description=_OVERFLOW_HELP)

    @model_validator(mode="after")
    def _some(self) -> TopicChange:
        if not self.model_fields_set:
            raise ValueError(
                "give at least one of slo_p99_ms, rate, burst, policy, utility, "
                "max_publisher_rate, join_secret, max_wait_ms, overflow"
            )
        if self.utility is not None:
            parse_topic_utility(self.utility, "topic")
        return self


class TopicParam(_Request):
    """``GET /plan``, ``GET /lookup``: the topic asked about."""

    topic: str = Field(min_length=1, description="topic name")


class ChannelParams(TopicParam):
    """nsqlookupd's /channel/create and /channel/delete."""

    channel: str = Field(min_length=1, description="channel name")


class TombstoneParams(TopicParam):
    """nsqlookupd's /topic/tombstone: the broker as ``HOST:HTTP_PORT`` (/nodes')."""

    node: str = Field(min_length=1, description="HOST:HTTP_PORT of the broker")


class AssignQuery(TopicParam):
    """``GET /assign``: the publisher asking which broker to use."""

    publisher: PublisherId
    rate: float | None = Field(
        None, gt=0, le=MAX_RATE,
        description="msg/s it sends: needed to join an open topic (at most the topic's "
        "max_publisher_rate)",
    )  # fmt: skip
    group: str | None = Field(
        None, min_length=1, max_length=256, description="its correlation group, if any"
    )
    join_secret: JoinSecret | None = Field(
        None,
        description="the open topic's join secret, if it has one (or the X-SRTM-Join-Secret "
        "header, which keeps it out of access logs)",
    )


# -- answers ---------------------------------------------------------------------------------
class Taken(_Answer):
    ok: bool


class Bucket(_Answer):
    rate: float
    burst: float = Field(ge=1)


class BrokerBucket(Bucket):
    """A sub-bucket as a broker is given it: with its topic's bound, which it polices by."""

    max_wait_ms: float = Field(description=_MAX_WAIT_HELP)
    overflow: OverflowName = Field(description=_OVERFLOW_HELP)


class Registered(_Answer):
    """The broker's lease (s) and what it carries: its sub-bucket per topic, and the
    other managed topics, which it holds (docs/controller.md, "No holes in (r, b)")."""

    id: str
    registered: bool
    lease_s: float
    buckets: dict[str, BrokerBucket]
    held: list[str]


class PlanBroker(_Answer):
    id: str
    tcp_address: str
    http_address: str
    publishers: list[str]
    bucket: Bucket | None


class Plan(_Answer):
    """A topic's plan: its brokers, their publishers and sub-buckets, and a version."""

    topic: str
    version: int
    policy: Policy
    status: Literal["placed", "short", "fitting"]
    brokers: list[PlanBroker]
    unassigned: list[str]
    #: False while the controller still pushes this version's share changes to the
    #: brokers: a client that moves by the plan waits for True (make before break).
    in_place: bool


class FittingStep(_Answer):
    """One broker's measurement in a fitting round."""

    iteration: int
    round: int
    broker: str
    publishers: int
    p99_ms: float | None
    samples: int
    verdict: Verdict


class FittingStatus(_Answer):
    """Online fitting's progress (only ``state`` until the first round is set up)."""

    state: Literal["running", "done", "failed", "interrupted"]
    iteration: int = 0
    round: int = 0
    rounds: list[int] = []
    steps: list[FittingStep] = []
    full: list[str] = []
    iteration_brokers: list[str] | None = None
    outcome: FitOutcome | None = Field(
        None,
        description="once done: 'fitted' (the searches settled), 'taken back' (adding "
        "brokers did not lower the p99: back to the best plan measured), 'best' (the "
        "settled plan measured worse than an earlier one, which is kept), 'disturbed' "
        "(rounds kept measuring a busy machine: stopped at the best plan)",
    )
    note: str = Field("", description="why fitting ended as it did, in words")


class TopicStatus(Plan):
    """A topic: its plan, SLO, bucket, events and fitting."""

    slo_p99_ms: float
    rate: float
    burst: float
    max_wait_ms: float = Field(description=_MAX_WAIT_HELP)
    overflow: OverflowName = Field(description=_OVERFLOW_HELP)
    publishers: int = Field(description="how many publishers it has")
    events: list[str]
    fitting: FittingStatus | None
    open: bool = Field(description="unknown publishers may join by GET /assign")
    max_publisher_rate: float | None = Field(
        description="the most msg/s an unknown publisher may declare to join (null: not open)"
    )
    join_secret_set: bool = Field(
        description="joining needs the topic's join secret (the secret itself is never shown)"
    )
    replicas: list[str] = Field(
        description="ALL_PUBLISHERS replica set, primary first (empty: not replicated)"
    )
    homes: dict[str, str] = Field(description="channel -> the replica that delivers it")
    forwarding: dict[str, list[str]] = Field(
        description="broker -> publishers that moved off it (it forwards their messages)"
    )
    utility: dict[str, Any] | None = Field(description=UTILITY_HELP)
    allocation: TopicAllocation | None = Field(
        description="its part of the optimizer's last run (null: none yet); its rate is "
        "what rate control made of it since"
    )


class FlowAllocation(_Answer):
    """One flow of the optimizer's run: its rate, admitted consumers per class and
    utility."""

    name: str
    rate: float
    admitted: dict[str, int]
    utility: float


class TopicAllocation(FlowAllocation):
    """A topic's part of the optimizer's last run, when it ran (controller's monotonic
    s) and the rate rate control gave it since."""

    t_s: float
    feasible: bool
    current_rate: float


class UtilityRun(_Answer):
    """``GET /utility``: the optimizer's last run (``t_s`` null: none yet)."""

    t_s: float | None
    feasible: bool
    total_utility: float
    flows: list[FlowAllocation]


class PublisherAssignment(_Answer):
    """The broker a publisher should use, and the plan version that says so."""

    topic: str
    publisher: str
    broker: str
    tcp_address: str
    version: int


class Producer(_Answer):
    """A broker as nsqlookupd describes one."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str


class Lookup(_Answer):
    channels: list[str]
    producers: list[Producer]


class Node(Producer):
    """A broker in nsqlookupd's /nodes: its topics, and whether each is tombstoned."""

    tombstones: list[bool]
    topics: list[str]


class Nodes(_Answer):
    producers: list[Node]


class ChannelList(_Answer):
    channels: list[str]


class DebugEntry(_Answer):
    """One broker registered for a key in nsqlookupd's /debug."""

    id: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    last_update: int
    tombstoned: bool
    tombstoned_at: int


class Debug(RootModel[dict[str, list[DebugEntry]]]):
    """nsqlookupd's /debug: ``topic:T:`` and ``channel:T:C`` -> the brokers registered."""


class Deregistered(_Answer):
    id: str
    registered: Literal[False]


class BrokerLoad(_Answer):
    """A registered broker and its capacity ledger (msg/s)."""

    id: str
    tcp_address: str
    http_address: str
    mcap: float
    #: The sum of the sub-bucket rates of every plan it carries: what is promised.
    allocated: float
    #: Messages per second over all its topics, as its last report measured them.
    measured: float
    #: ``mcap - max(allocated, measured)``, never negative: what placement may still use.
    rcap: float
    down: bool
    #: ``allocated > mcap``: promised more than it can take (a warning; a PATCH raised a
    #: rate, say).
    over: bool


class Brokers(_Answer):
    brokers: list[BrokerLoad]


class Deleted(_Answer):
    """``DELETE /topics/{name}``: no longer managed; its accepted messages drain."""

    topic: str
    deleted: bool


class TopicList(_Answer):
    topics: list[str]


class Info(_Answer):
    """Version; ticks run, the controller's own stalls and their total length (s);
    whether TLS and the cluster token are on; with ``--rebalance``, ``elastic``: brokers
    being spawned and despawned, counts, the last events."""

    version: str
    ticks: int
    stalls: int
    stalled_s: float
    tls: bool
    auth: bool
    elastic: ElasticInfo | None = None


class ElasticInfo(_Answer):
    spawning: list[str]
    despawning: list[str]
    spawned: int
    despawned: int
    failures: int
    events: list[str]


class Error(_Answer):
    """A refusal; ``message`` names the failing field or says why."""

    message: str


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
