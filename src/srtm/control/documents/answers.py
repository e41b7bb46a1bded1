"""The documents the controller's HTTP API answers with. The controller's state builds
them as plain dicts; these models describe them for the OpenAPI document, and tests check
real answers against them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, RootModel

from srtm.control.documents.base import MAX_WAIT_HELP, OVERFLOW_HELP, UTILITY_HELP, Answer
from srtm.placement import Policy
from srtm.placement.fitting import FitOutcome, Verdict
from srtm.ratelimit.overflow import OverflowName


class Taken(Answer):
    ok: bool


class Bucket(Answer):
    rate: float
    burst: float = Field(ge=1)


class BrokerBucket(Bucket):
    """A sub-bucket as a broker is given it: with its topic's bound, which it polices by."""

    max_wait_ms: float = Field(description=MAX_WAIT_HELP)
    overflow: OverflowName = Field(description=OVERFLOW_HELP)


class Registered(Answer):
    """The broker's lease (s) and what it carries: its sub-bucket per topic, and the
    other managed topics, which it holds (docs/controller.md, "No holes in (r, b)")."""

    id: str
    registered: bool
    lease_s: float
    buckets: dict[str, BrokerBucket]
    held: list[str]
    live_prefix: str | None = Field(
        None,
        description="With etcd: where the controller watches brokers' liveness keys "
        "(PREFIX/live/); a broker with --etcd-endpoints takes no share from a controller "
        "that does not watch its key (docs/broker.md, 'Liveness in etcd').",
    )
    order: tuple[int, int] = Field(
        description="[epoch, number]: the answer's place among the controller's orders "
        "(X-SRTM-Epoch, X-SRTM-Order); the broker refuses a share change sent before it "
        "(409 STALE_PUSH), such as one held up on a cut link (docs/broker.md, 'Stale "
        "pushes').",
    )


class PlanBroker(Answer):
    id: str
    tcp_address: str
    http_address: str
    publishers: list[str]
    bucket: Bucket | None


class Plan(Answer):
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


class FittingStep(Answer):
    """One broker's measurement in a fitting round."""

    iteration: int
    round: int
    broker: str
    publishers: int
    p99_ms: float | None
    samples: int
    verdict: Verdict


class FittingStatus(Answer):
    """Online fitting's progress (only ``state`` until the first round is set up)."""

    state: Literal["running", "done", "failed", "interrupted"]
    iteration: int = 0
    round: int = 0
    # pydantic copies these defaults per instance (ruff cannot see that Answer is a model)
    rounds: list[int] = []  # noqa: RUF012
    steps: list[FittingStep] = []  # noqa: RUF012
    full: list[str] = []  # noqa: RUF012
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
    max_wait_ms: float = Field(description=MAX_WAIT_HELP)
    overflow: OverflowName = Field(description=OVERFLOW_HELP)
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


class FlowAllocation(Answer):
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


class RunFlow(FlowAllocation):
    """A flow of ``GET /utility``'s run, with the ``r_max`` the run used: the spec's,
    capped for a persisted topic by its storage latency (docs/utility.md)."""

    r_max: float


class UtilityRun(Answer):
    """``GET /utility``: the optimizer's last run (``t_s`` null: none yet)."""

    t_s: float | None
    feasible: bool
    total_utility: float
    flows: list[RunFlow]


class PublisherAssignment(Answer):
    """The broker a publisher should use, and the plan version that says so."""

    topic: str
    publisher: str
    broker: str
    tcp_address: str
    version: int


class Producer(Answer):
    """A broker as nsqlookupd describes one."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str


class Lookup(Answer):
    channels: list[str]
    producers: list[Producer]


class Node(Producer):
    """A broker in nsqlookupd's /nodes: its topics, and whether each is tombstoned."""

    tombstones: list[bool]
    topics: list[str]


class Nodes(Answer):
    producers: list[Node]


class ChannelList(Answer):
    channels: list[str]


class DebugEntry(Answer):
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


class Deregistered(Answer):
    id: str
    registered: Literal[False]


class BrokerLoad(Answer):
    """A registered broker and its capacity ledger (msg/s)."""

    id: str
    #: The host it runs on: brokers sharing it are processes of one host (``srtm node``).
    host: str
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


class Brokers(Answer):
    brokers: list[BrokerLoad]


class Deleted(Answer):
    """``DELETE /topics/{name}``: no longer managed; its accepted messages drain."""

    topic: str
    deleted: bool


class TopicList(Answer):
    topics: list[str]


class Info(Answer):
    """Version; ticks run, the controller's own stalls and their total length (s);
    whether TLS and the cluster token are on; whether this controller leads (with etcd:
    holds the leader key and acts; SQLite: always), the leader's ``host:port`` (null:
    none now, plan changes wait for one) and its epoch (null: SQLite, or not leading),
    and in words where plan changes are made now (here, by the leader at an address, or
    they wait for a leader); with ``--rebalance``, ``elastic``: brokers being spawned
    and despawned, counts, the last events."""

    version: str
    ticks: int
    stalls: int
    stalled_s: float
    tls: bool
    auth: bool
    leader: bool
    leader_http_address: str | None
    epoch: int | None
    plan_changes: str
    elastic: ElasticInfo | None = None


class ElasticInfo(Answer):
    spawning: list[str]
    despawning: list[str]
    spawned: int
    despawned: int
    failures: int
    events: list[str]


class Error(Answer):
    """A refusal; ``message`` names the failing field or says why."""

    message: str
