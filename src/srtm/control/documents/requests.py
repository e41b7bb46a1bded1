"""The documents the controller's HTTP API takes: a broker's registration and report,
a new topic and its changes, moves, joins, and the query parameters of its GETs."""

from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Annotated, Any, NotRequired

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict

from srtm.analysis import profile_bucket
from srtm.control.actions import HELD, Share
from srtm.control.documents.base import (
    MAX_COUNT,
    MAX_MCAP,
    MAX_PUBLISHER_RATE_HELP,
    MAX_REPORT_TOPICS,
    MAX_SLO_MS,
    MAX_WAIT_HELP,
    OVERFLOW_HELP,
    STRICT,
    UTILITY_HELP,
    Burst,
    HostPort,
    JoinSecret,
    PublisherId,
    PublisherRate,
    Request,
    TopicName,
)
from srtm.placement import Policy, PublisherLoad, TopicSpec, topic_bucket
from srtm.placement.model import RATE_MARGIN
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


class Registration(Request):
    """``POST /brokers``: a broker registers (again after a restart)."""

    id: str = Field(min_length=1, max_length=256)
    tcp_address: HostPort
    http_address: HostPort
    mcap: float = Field(gt=0, le=MAX_MCAP, description="messages/s it can process")
    host: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="the host it runs on (brokers of one host share it; absent: its id)",
    )


# TypedDicts, not models, where a document may hold 100,000 entries (a report's topics,
# a topic's publishers): pydantic checks dicts about four times faster than it builds as
# many model instances, and reports are checked on the event loop.
@with_config(STRICT)
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
    #: Mean ms from a publish's arrival to the disk write its OK waited for, over the
    #: report interval (a persisted topic; absent when none waited).
    storage_latency_ms: NotRequired[Annotated[float, Field(ge=0, le=3.6e6, allow_inf_nan=False)]]


@with_config(STRICT)
class Congestion(TypedDict):
    """Whether a broker's CPU and egress are over its thresholds (``--cpu-congested``,
    ``--egress-max``)."""

    cpu: bool
    network: bool


@with_config(STRICT)
class BrokerResources(TypedDict):
    """A broker's use of its resources over its last report interval: ``cpu`` the
    fraction of one core its process used, ``egress_bps`` bytes/s written to clients."""

    cpu: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    egress_bps: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    congested: Congestion


@with_config(STRICT)
class ShareBucket(TypedDict):
    """A topic's sub-bucket on a broker, as its report tells it."""

    rate: Annotated[float, Field(ge=0, le=MAX_MCAP)]
    burst: Annotated[float, Field(ge=0, le=MAX_MCAP)]


class BrokerReport(Request):
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

    def storage_latency_ms(self) -> dict[str, float]:
        return {
            n: w["storage_latency_ms"] for n, w in self.topics.items() if "storage_latency_ms" in w
        }

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


@with_config(STRICT)
class PublisherDoc(TypedDict):
    """A publisher of a new topic; publishers of one ``group`` fire together."""

    id: PublisherId
    rate: PublisherRate
    group: NotRequired[Annotated[str, Field(min_length=1, max_length=256)] | None]


class FitSettings(Request):
    """Online fitting (``"fit": true`` takes the defaults); ``model`` (a built-in model,
    ``"calibrated"`` or ``"paper"``, or a model file from ``srtm calibrate`` under the
    controller's ``--models-dir``, at most 1 MiB) makes it model-assisted."""

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


class NewTopic(Request):
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
        description=MAX_WAIT_HELP + f" (default {DEFAULT_MAX_WAIT_MS:g})",
    )
    overflow: OverflowName | None = Field(
        None, description=OVERFLOW_HELP + f" (default {DEFAULT_OVERFLOW.value})"
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


class ReplicaCount(Request):
    """``POST /topics/{name}/replicas``: ALL_PUBLISHERS with this many replicas (1: none)."""

    count: int = Field(ge=1, description="replicas, the primary included")


class Move(Request):
    """``POST /topics/{name}/move``: move publishers to a broker."""

    publishers: list[PublisherId]
    to: str = Field(min_length=1, max_length=256, description="a broker id")


class NewPublishers(Request):
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


class TopicChange(Request):
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
    max_wait_ms: float | None = Field(None, gt=0, le=MAX_MAX_WAIT_MS, description=MAX_WAIT_HELP)
    overflow: OverflowName | None = Field(None, description=OVERFLOW_HELP)

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


class TopicParam(Request):
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
