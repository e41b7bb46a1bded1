"""Broker settings (command-line flags map onto these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from srtm.protocol import Limits
from srtm.version import NSQD_VERSION

VERSION = NSQD_VERSION


@dataclass(frozen=True, slots=True)
class BrokerOptions:
    tcp_host: str = "127.0.0.1"
    tcp_port: int = 4150
    http_host: str = "127.0.0.1"
    http_port: int = 4151
    broker_id: int = 0
    data_dir: Path = Path("srtm-data")
    trace_dir: Path | None = None
    #: Trace partition name (``broker/run=<run>/``).
    run: str = "default"
    #: Share of messages that get a trace row (1.0: all).
    trace_sample: float = 1.0
    limits: Limits = field(default_factory=Limits)
    #: Messages a queue keeps in memory before overflowing to disk (nsqd's mem-queue-size).
    mem_queue_size: int = 10_000
    msg_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 30_000
    #: Kernel receive timestamps (SO_TIMESTAMPNS) for arrival times; else a clock read.
    kernel_timestamps: bool = True
    #: How the wait for a shaped release ends: "timerfd" (ns-precise, Linux) or "asyncio"
    #: (~1 ms coarse); either way the last ``release_spin_ns`` are spent yielding to the
    #: loop. Without a timerfd the spin must cover asyncio's lateness (1.5 ms).
    release_timer: str = "timerfd"
    release_spin_ns: int = 200_000
    #: How often deferred messages and in-flight timeouts are checked.
    scan_interval_ms: int = 10
    #: The TB Adaptor's window: average rate and maximum backlog over this many seconds.
    window_seconds: int = 10
    #: Controller URL to register with and report to every ``report_interval_s``.
    controller: str | None = None
    #: Messages per second this broker can process (told to the controller).
    mcap: float = 110_000.0
    #: Emulate a smaller instance: every message released by its topic's bucket then
    #: takes 1/capacity s of a single broker-wide server, in release order (0: off).
    capacity: float = 0.0
    report_interval_s: float = 1.0
    #: Bytes queued for one client beyond which the broker stops reading its socket and
    #: sends it no more messages, until the backlog drains to half of this.
    max_output_buffer_bytes: int = 4 * 1024 * 1024
    #: A connection whose pending output makes no progress for this long is closed (0: never).
    write_timeout_ms: int = 30_000
    #: A command must arrive whole within this long of its first byte, else the connection
    #: is closed with E_INVALID (0: no limit).
    read_timeout_ms: int = 30_000
    #: Open client connections beyond which new ones get E_TOO_MANY_CONNECTIONS and are
    #: closed (0: no limit but the fd limit).
    max_connections: int = 10_000
    #: Size of a disk queue's segment files (nsqd's max-bytes-per-file).
    max_bytes_per_file: int = 16 << 20
    #: Disk space claimed at start and given back at a graceful stop, so that what memory
    #: holds is saved even on a full disk (0: none). See docs/durability.md.
    disk_reserve_bytes: int = 32 << 20
    #: TLS (nsqd's --tls-cert/--tls-key): clients upgrade with IDENTIFY ``tls_v1``.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: CA bundle for client certificates (nsqd's --tls-root-ca-file).
    tls_root_ca_file: Path | None = None
    #: "false", "true" (TCP only after the upgrade; plain HTTP refused) or "tcp-https".
    tls_required: str = "false"
    #: "", "require" or "require-verify" (both verify here); set, it implies tls_required.
    tls_client_auth_policy: str = ""
    #: A TLS handshake not done this long after IDENTIFY closes the connection.
    tls_handshake_timeout_ms: int = 5_000
    #: HTTPS API with the same certificate (nsqd's --https-address); None: none.
    https_host: str = "127.0.0.1"
    https_port: int | None = None
    #: nsqd's --auth-http-address: auth servers (HOST:PORT or http(s)://...) for AUTH.
    auth_http_address: tuple[str, ...] = ()
    #: Topics this broker holds at most; a command that would create one more fails
    #: (PUB: E_PUB_FAILED, SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_TOPICS).
    max_topics: int = 10_000
    #: Channels per topic at most (SUB: E_SUB_FAILED, HTTP: 403 TOO_MANY_CHANNELS).
    max_channels_per_topic: int = 100
    #: The cluster token: mutating ``/srtm/*`` HTTP endpoints then require
    #: ``Authorization: Bearer <token>``. None: open, allowed on a loopback HTTP bind only.
    token: str | None = None
