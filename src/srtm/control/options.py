"""The controller's settings: one field per setting, which ``srtm controller``'s flags,
``SRTM_CONTROLLER_*`` variables and ``--config`` file all fill (see :mod:`srtm.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from srtm.config import setting
from srtm.control.model import MAX_PUBLISHERS
from srtm.placement import AdaptorSettings
from srtm.placement.rebalance import RebalanceSettings

#: ``SRTM_CONTROLLER_`` and the setting's name in capitals (the broker's variables are
#: ``SRTM_*``; both read the cluster-wide ``SRTM_TOKEN`` and ``SRTM_INSECURE_LOOPBACK``).
ENV_PREFIX = "SRTM_CONTROLLER_"
_ADAPTOR = AdaptorSettings()
_REBALANCE = RebalanceSettings()


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """Everything the controller is told at start; each field is one setting (``setting()``'s
    help is what ``srtm controller --help`` shows)."""

    http_host: str = setting(
        "127.0.0.1",
        "HOST:PORT of its HTTP API (port 0: any free port, printed at start).",
        address="http_address",
        env_aliases=("SRTM_CONTROLLER_ADDRESS",),
    )
    http_port: int = setting(4161, address="http_address")
    db: Path = setting(
        Path("srtm-controller.db"),
        "SQLite file with brokers, topics, plans and sub-buckets; a restarted controller "
        "resumes from it.",
        env_aliases=("SRTM_DB",),
    )
    etcd_endpoints: str | None = setting(
        None,
        "Keep the state in etcd instead of --db: its members' client addresses, "
        "HOST:PORT[,HOST:PORT...] (spoken to as http://HOST:PORT). Several controllers "
        "on one --etcd-prefix elect one leader; the others answer reads and send writes "
        "to it (307).",
    )
    etcd_prefix: str = setting(
        "/srtm",
        "With --etcd-endpoints: the state's keys are PREFIX/KEY; controllers with different "
        "prefixes keep their states apart.",
    )
    leader_lease_s: int = setting(
        2,
        "With --etcd-endpoints: the leader's etcd lease (whole s). A leader stops acting "
        "when it could not renew it for 0.6 of this; a standby takes over once it expired.",
        minimum=1,
    )
    broker_timeout_s: float = setting(
        5.0, "A broker silent this long is down; its publishers move (s).", minimum=0.1
    )
    probe_after_s: float = setting(
        1.5,
        "A broker silent this long is asked GET /ping; if its address refuses the "
        "connection (its process is gone), it is down at once, before --broker-timeout-s "
        "(s; 0: never ask).",
        minimum=0,
    )
    tombstone_s: float = setting(
        45.0,
        "nsqlookupd's --tombstone-lifetime: /topic/tombstone hides a broker of a topic "
        "from /lookup this long (s).",
        minimum=0,
    )
    tick_s: float = setting(1.0, "How often it checks brokers and runs the TB Adaptor (s).")
    stale_after_s: float = setting(
        _ADAPTOR.stale_after_s, "TB Adaptor: a report older than this keeps its share (s)."
    )
    hysteresis: float = setting(
        _ADAPTOR.hysteresis, "TB Adaptor: ignore changes smaller than this fraction of a share."
    )
    adapt_settle_s: float = setting(
        _ADAPTOR.settle_s,
        "TB Adaptor: after a plan change, wait this long (s) before adapting, until the "
        "brokers' windows hold only traffic placed by the new plan.",
        minimum=0,
    )
    token: str | None = setting(
        None,
        "Cluster token: brokers' registrations and reports and every mutating request need "
        "'Authorization: Bearer TOKEN'; sent to brokers too. Required by srtm controller "
        "unless --insecure-loopback.",
        env="SRTM_TOKEN",
    )
    insecure_loopback: bool = setting(
        False,
        "Run without a token (anyone who reaches the port may change plans); only with a "
        "loopback --http-address.",
        env="SRTM_INSECURE_LOOPBACK",
    )
    joins_need_auth: bool = setting(
        False,
        "Every join of an open topic by GET /assign needs the topic's join_secret or the "
        "cluster token (off: only topics with a join_secret ask for one).",
    )
    tls_cert: Path | None = setting(None, "HTTPS: PEM certificate chain (with --tls-key).")
    tls_key: Path | None = setting(None, "HTTPS: PEM private key.")
    models_dir: Path | None = setting(
        None, "fit.model may name a model file under this directory (else built-in models only)."
    )
    max_publishers: int = setting(
        MAX_PUBLISHERS, "Publishers one topic may have (413 beyond).", minimum=1
    )
    forward_grace_s: float = setting(
        10.0,
        "A broker publishers moved off forwards their messages to their new broker until "
        "none came for this long (s).",
        minimum=0,
    )
    subscriber_wait_s: float = setting(
        2.0,
        "A broker gaining a topic's traffic gets it once its subscribers read it there (each "
        "channel the topic has elsewhere registered by it), or after this long (s); 0: at "
        "once, and what arrives first waits there for them.",
        minimum=0,
    )
    rebalance: bool = setting(
        False,
        "Elasticity: run the rebalancer every --rebalance-interval-s and carry out its "
        "moves, spawns and despawns (off: placement as before).",
    )
    rebalance_interval_s: float = setting(
        2.0, "How often the rebalancer runs, with --rebalance (s).", minimum=0.01
    )
    rebalance_window_s: float = setting(
        _REBALANCE.window_s, "Brokers' loads are averaged over this window (s).", minimum=0.01
    )
    min_plan_interval_s: float = setting(
        _REBALANCE.min_plan_interval_s,
        "The rebalancer changes a topic's plan at most once in this many seconds.",
        minimum=0,
    )
    min_brokers: int = setting(1, "Elasticity: never despawn below this many brokers.", minimum=1)
    max_brokers: int = setting(8, "Elasticity: never spawn beyond this many brokers.", minimum=1)
    provision_cmd: str | None = setting(
        None,
        "Elasticity: start and stop brokers by running 'CMD start ID' / 'CMD stop ID' "
        "(else: local child processes, srtm broker on 127.0.0.1).",
    )
    provision_timeout_s: float = setting(
        60.0,
        "A provisioning command or a local broker's start may take this long (s).",
        minimum=0.1,
    )
    nodes: str | None = setting(
        None,
        "Elasticity: URL[,URL...] of srtm node APIs (their --node-address): a spawned "
        "broker is first added to a node with idle cores, and only when none has one "
        "started on a new host (--provision-cmd, else locally).",
    )
    spawn_mcap: float = setting(
        110_000.0, "The --mcap of brokers the local provisioner starts (msg/s).", minimum=1
    )
    spawn_dir: Path | None = setting(
        None,
        "Data directories of brokers the local provisioner starts (default: "
        "DB-brokers/ID beside --db).",
    )

    utility_interval_s: float = setting(
        20.0,
        "How often the utility optimizer sets the rates and admitted consumers of topics "
        "with a utility spec (s; 0: never).",
        minimum=0,
    )
    rate_control_interval_s: float = setting(
        1.0,
        "How often rate control moves those rates by the brokers' congestion between "
        "optimizer runs (s; 0: never).",
        minimum=0,
    )
    cpu_capacity: float = setting(
        0.8, "The optimizer's CPU capacity per broker (a fraction of one core).", minimum=0
    )
    egress_max: float = setting(
        125e6,
        "A broker's maximum egress (bytes/s): the optimizer's network capacity per broker "
        "and, with --rebalance, the rebalancer's (load ratio, replication; 0: its default).",
        minimum=0,
    )
    cost_model: Path | None = setting(
        None,
        "The brokers' cost model for the optimizer: srtm calibrate --cost --json's "
        "document (default: A 23.7 µs per message, B 6.4 µs per delivery), corrected "
        "online per broker.",
    )

    @property
    def adaptor(self) -> AdaptorSettings:
        return AdaptorSettings(
            stale_after_s=self.stale_after_s,
            hysteresis=self.hysteresis,
            settle_s=self.adapt_settle_s,
        )

    @property
    def rebalance_settings(self) -> RebalanceSettings:
        return RebalanceSettings(
            window_s=self.rebalance_window_s,
            min_plan_interval_s=self.min_plan_interval_s,
            min_brokers=self.min_brokers,
            max_brokers=self.max_brokers,
            egress_max=self.egress_max or _REBALANCE.egress_max,
        )
