"""A broker's settings: one field per setting, which ``srtm broker``'s flags, ``SRTM_*``
variables and ``--config`` file all fill (see :mod:`srtm.config`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from srtm.config import setting
from srtm.protocol import Limits
from srtm.version import NSQD_VERSION

VERSION = NSQD_VERSION
#: ``SRTM_`` and the setting's name in capitals: ``SRTM_MAX_OUTPUT_BUFFER_BYTES``.
ENV_PREFIX = "SRTM_"


class ArrivalStamps(enum.StrEnum):
    """Where a message's arrival time comes from."""

    KERNEL = "kernel"  # SO_TIMESTAMPNS receive stamps
    USER = "user"  # a clock read after each read


class ReleaseTimer(enum.StrEnum):
    """What ends the wait for a shaped release."""

    TIMERFD = "timerfd"
    ASYNCIO = "asyncio"


class TlsRequired(enum.StrEnum):
    """nsqd's --tls-required."""

    FALSE = "false"
    TRUE = "true"
    TCP_HTTPS = "tcp-https"


class TlsClientAuthPolicy(enum.StrEnum):
    """nsqd's --tls-client-auth-policy (both ask for and verify a client certificate here)."""

    NONE = ""
    REQUIRE = "require"
    REQUIRE_VERIFY = "require-verify"


class RelayTls(enum.StrEnum):
    """Whether the relay's links to other brokers use TLS (IDENTIFY ``tls_v1``)."""

    FALSE = "false"
    TRUE = "true"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    """Everything a broker is told at start; each field is one setting (``setting()``'s
    help is what ``srtm broker --help`` shows)."""

    tcp_host: str = setting(
        "127.0.0.1",
        "HOST:PORT for NSQ's TCP protocol (port 0: any free port, printed at start).",
        address="tcp_address",
    )
    tcp_port: int = setting(4150, address="tcp_address")
    http_host: str = setting(
        "127.0.0.1", "HOST:PORT for the HTTP API (port 0: any).", address="http_address"
    )
    http_port: int = setting(4151, address="http_address")
    broker_id: int = setting(
        0, "0..4095; the first 3 hex digits of message ids.", minimum=0, maximum=4095
    )
    data_dir: Path = setting(
        Path("srtm-data"),
        "Where queues overflow to disk and where a graceful stop (SIGTERM) leaves every "
        "message still owed; the next start delivers them.",
    )
    trace_dir: Path | None = setting(
        None, "Write broker-side trace rows as Parquet under DIR/broker/run=RUN/."
    )
    run: str = setting("default", "Trace partition (run) name.")
    trace_sample: float = setting(
        1.0, "Share of messages traced, in (0, 1].", minimum=0.0, maximum=1.0
    )
    mem_queue_size: int = setting(
        10_000,
        "Messages each queue keeps in memory before overflowing to disk (ephemeral queues "
        "drop beyond it, counted in /stats).",
        minimum=0,
    )
    msg_timeout_ms: int = setting(
        60_000, "Default in-flight timeout before a message is requeued (ms)."
    )
    heartbeat_interval_ms: int = setting(
        30_000,
        "Default heartbeat interval (ms); clients may negotiate theirs.",
        aliases=("heartbeat_ms",),
    )
    arrival_stamps: ArrivalStamps = setting(
        ArrivalStamps.KERNEL,
        "'kernel': SO_TIMESTAMPNS receive stamps (falls back where unsupported); 'user': a "
        "clock read after each read.",
    )
    release_timer: ReleaseTimer = setting(
        ReleaseTimer.TIMERFD,
        "What ends the wait for a shaped release: 'timerfd' (Linux, ns-precise) or "
        "'asyncio' (~1 ms coarse; the spin is then at least 1.5 ms).",
    )
    release_spin_us: int = setting(
        200,
        "Yield to the loop for at least this long (µs) before each shaped release instead "
        "of sleeping, to absorb the timer's wake-up latency; longer (up to "
        "--release-spin-max-us) where the timer is measured to wake later. 0: never spin.",
        minimum=0,
    )
    release_spin_max_us: int = setting(
        1000,
        "The longest the spin before a shaped release grows to where the timer wakes late "
        "(µs): spinning costs CPU while the loop waits. At most --release-spin-us: it "
        "never grows.",
        minimum=0,
    )
    nice: int = setting(
        0,
        "This process's nice value, set at start (-20 runs first; below 0 needs "
        "CAP_SYS_NICE or an RLIMIT_NICE that allows it), and its session's where Linux "
        "groups tasks by session (autogroup; run it in a session of its own, as a service "
        "is): a broker that shares its cores with busy programs then wakes on time for "
        "shaped releases and reads. Below 0, with fewer than two usable CPUs, it does not "
        "spin before releases (it would take the only CPU from the programs beside it). "
        "0: as started.",
        minimum=-20,
        maximum=19,
    )
    busy_poll_us: int = setting(
        100,
        "While most of a connection's reads come within this long (µs) of its read before, "
        "poll the sockets for this long after each of them instead of sleeping: a "
        "synchronous publisher's next PUB is then read without waking the thread "
        "(docs/broker.md, 'Busy polling'). Costs CPU only while some connection's reads "
        "are this close; never with less than two usable CPUs (affinity or cgroup quota). "
        "0: never poll.",
        minimum=0,
    )
    scan_interval_ms: int = setting(
        10, "How often deferred messages and in-flight timeouts are checked (ms).", minimum=1
    )
    window_seconds: int = setting(
        10,
        "TB Adaptor window: average rate and max backlog over this many seconds.",
        aliases=("window_s",),
        minimum=1,
    )
    controller: str | None = setting(
        None,
        "Controller URLs, URL[,URL...] (http://HOST:PORT): register with the leader and "
        "report load and each topic's window every --report-interval-s; a controller that "
        "is away is passed over and a standby's redirect followed to the leader.",
    )
    host_id: str | None = setting(
        None,
        "The host this broker runs on, told to the controller (default: this machine's "
        "hostname): brokers sharing a host id are processes of one host (``srtm node``), "
        "which placement spreads a topic over last.",
    )
    mcap: float = setting(
        110_000.0, "Messages/s this broker can process, told to the controller.", minimum=1
    )
    shared_fd: int | None = setting(
        None,
        "Set by srtm node --shared-address: the Unix socket on which the node passes this "
        "process the connections it accepted there (they refuse SUB).",
    )
    etcd_endpoints: str | None = setting(
        None,
        "With --controller: keep this broker's liveness lease in etcd, HOST:PORT[,HOST:PORT...] "
        "(its members' client addresses). Its shares then hold while the lease does, with "
        "every controller down; a controller gives them away only once the lease is gone.",
    )
    etcd_prefix: str = setting(
        "/srtm",
        "With --etcd-endpoints: the liveness key is PREFIX/live/BROKER_ID (the controller's "
        "--etcd-prefix).",
    )
    etcd_lease_s: int = setting(
        5,
        "With --etcd-endpoints: the liveness lease's TTL (whole s), kept alive every "
        "quarter of it; shares are held once no keepalive succeeded for 0.6 of it.",
        minimum=1,
    )
    capacity: float = setting(
        0.0,
        "Emulate a smaller instance: process at most this many messages/s, each taking "
        "1/CAPACITY s of one broker-wide server after its topic's bucket releases it "
        "(0: no limit).",
        minimum=0,
    )
    report_interval_s: float = setting(
        1.0, "How often a broker with --controller reports to it (s).", minimum=0.01
    )
    cpu_congested: float = setting(
        0.85,
        "Its reports call the CPU congested above this fraction of one core used by the "
        "broker process over the report interval (the controller's rate control).",
        minimum=0,
    )
    egress_max: float = setting(
        125e6,
        "Its reports call the network congested above this many bytes/s written to "
        "clients over the report interval.",
        minimum=0,
    )
    max_output_buffer_bytes: int = setting(
        4 * 1024 * 1024,
        "Bytes queued for one client beyond which its socket is not read and it gets no "
        "messages until half of that has drained (0: no limit).",
        aliases=("max_output_buffer",),
        env_aliases=("SRTM_MAX_OUTPUT_BUFFER",),
        minimum=0,
    )
    write_timeout_ms: int = setting(
        30_000,
        "Close a client whose pending output made no progress for this long (ms; 0: never).",
        minimum=0,
    )
    read_timeout_ms: int = setting(
        30_000,
        "A command must arrive whole within this long of its first byte, else E_INVALID "
        "and the connection is closed (ms; 0: no limit).",
        minimum=0,
    )
    max_connections: int = setting(
        10_000,
        "Client connections beyond this many get E_TOO_MANY_CONNECTIONS and are closed "
        "(0: no limit but the open-files limit).",
        minimum=0,
    )
    max_bytes_per_file: int = setting(
        16 << 20, "Size of each disk queue segment file (bytes).", minimum=1024
    )
    disk_inline_write_bytes: int = setting(
        64 << 10,
        "A publish's overflow to disk up to this size is written on the event loop, not "
        "the disk thread, when its segment is open and idle (bytes; 0: always the thread). "
        "One slower than 0.5 ms sends writes to the thread for 50 ms, doubled for each "
        "slow one in a row, up to 5 s.",
        minimum=0,
    )
    disk_reserve_bytes: int = setting(
        32 << 20,
        "Disk space (bytes) claimed at start and given back at a graceful stop, so that "
        "what memory holds is saved even when the disk is full (0: none).",
        minimum=0,
    )
    tls_cert: Path | None = setting(
        None, "PEM certificate (chain): clients may upgrade with IDENTIFY tls_v1 (nsqd's)."
    )
    tls_key: Path | None = setting(None, "PEM private key of --tls-cert.")
    tls_root_ca_file: Path | None = setting(
        None, "PEM CA bundle that client certificates must chain to."
    )
    tls_required: TlsRequired = setting(
        TlsRequired.FALSE,
        "'true': TCP commands only after the TLS upgrade, plain HTTP refused "
        "(TLS_REQUIRED); 'tcp-https': TCP only; 'false': optional.",
    )
    tls_client_auth_policy: TlsClientAuthPolicy = setting(
        TlsClientAuthPolicy.NONE,
        "'require' or 'require-verify': clients must present a certificate that verifies "
        "against --tls-root-ca-file (implies --tls-required); '': none asked for.",
    )
    tls_handshake_timeout_ms: int = setting(
        5_000, "A TLS handshake not done this long after IDENTIFY closes the connection (ms).",
        minimum=1,
    )  # fmt: skip
    https_host: str = setting(
        "127.0.0.1",
        "HOST:PORT for the HTTP API over TLS, with --tls-cert (port 0: any); none by default.",
        address="https_address",
    )
    https_port: int | None = setting(None, address="https_address")
    auth_http_address: tuple[str, ...] = setting(
        (),
        "nsqd's AUTH: auth server (HOST:PORT or http(s)://HOST:PORT) asked GET /auth for "
        "each AUTH secret; repeat for fallbacks (the variable: space-separated).",
    )
    relay_tls: RelayTls = setting(
        RelayTls.TRUE,
        "TLS on the relay's links to other brokers (forwarding, replication): 'true': "
        "ask every peer for TLS (IDENTIFY tls_v1) and upgrade where it has a certificate, "
        "plain text where it has none; 'required': a peer without TLS is not relayed to "
        "(kept here); 'false': never ask (a peer with --tls-required then takes nothing).",
    )
    relay_tls_root_ca_file: Path | None = setting(
        None,
        "PEM CA bundle that peers' certificates must chain to (default: the system's); "
        "a peer whose certificate does not verify is not relayed to.",
    )
    relay_tls_cert: Path | None = setting(
        None,
        "PEM client certificate (chain) the relay presents to peers that ask for one "
        "(their --tls-client-auth-policy).",
    )
    relay_tls_key: Path | None = setting(None, "PEM private key of --relay-tls-cert.")
    relay_auth_secret: str | None = setting(
        None,
        "Secret the relay sends as AUTH to peers that answer auth_required (their "
        "--auth-http-address); prefer the variable or --relay-auth-secret-file, as a "
        "command line is visible to every local user.",
    )
    relay_auth_secret_file: Path | None = setting(
        None,
        "File holding --relay-auth-secret (read at start; a trailing newline is dropped).",
    )
    class_secret: tuple[str, ...] = setting(
        (),
        "CLASS=SECRET: a consumer class above 'default' is served only with its secret "
        "(IDENTIFY srtm_class_secret, or AUTH) or the token; repeat per class (the "
        "variable, preferred as a command line is visible to every local user: "
        "space-separated).",
    )
    max_topics: int = setting(
        10_000,
        "Topics this broker holds at most; creating one more fails (PUB: E_PUB_FAILED, "
        "SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_TOPICS).",
        minimum=1,
    )
    max_channels_per_topic: int = setting(
        100,
        "Channels per topic at most (SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_CHANNELS).",
        minimum=1,
    )
    token: str | None = setting(
        None,
        "Cluster token: mutating /srtm/* HTTP requests must carry 'Authorization: Bearer "
        "TOKEN' (nsqd's own endpoints stay open, but see --protect-managed). Required by "
        "srtm broker unless --insecure-loopback.",
    )
    protect_managed: bool = setting(
        True,
        "nsqd's destructive HTTP endpoints (/topic/delete, /topic/empty, /topic/pause, "
        "/topic/unpause and their /channel/ ones) need the cluster token on a managed "
        "topic (a sub-bucket, a hold or a relay route here): 401 E_UNAUTHORIZED without "
        "it. Unmanaged topics, and every topic of a broker without a token, answer as "
        "nsqd's do; --no-protect-managed: nsqd's behaviour on every topic.",
    )
    insecure_loopback: bool = setting(
        False,
        "Run without a token: allowed only when every bind address is loopback (checked "
        "by srtm broker; an embedded broker without a token needs a loopback HTTP bind).",
    )
    #: nsqd's protocol limits (fixed: not a setting).
    limits: Limits = field(default_factory=Limits, init=False)

    @property
    def kernel_timestamps(self) -> bool:
        return self.arrival_stamps == ArrivalStamps.KERNEL

    @property
    def release_spin_ns(self) -> int:
        return self.release_spin_us * 1000

    @property
    def release_spin_max_ns(self) -> int:
        return self.release_spin_max_us * 1000
