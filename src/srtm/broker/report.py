"""The /stats document: nsqd's shape (so nsqadmin-style tools read it) plus an ``srtm`` section."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from srtm.analysis.quantiles import REPORTED
from srtm.broker.stats import Recorder

if TYPE_CHECKING:
    from srtm.broker.broker import Broker
    from srtm.broker.state import Channel, Topic
    from srtm.broker.tcp import Client

_CLIENT_STATE = {"init": 1, "subscribed": 3, "closing": 4, "closed": 5}


def _percentiles(rec: Recorder) -> dict[str, Any]:
    s = rec.summary()
    if not s["count"]:
        return {"count": 0, "percentiles": None}
    return {
        "count": int(s["count"]),
        "percentiles": [{"quantile": q, "value": int(s[key])} for key, q in REPORTED],
    }


def latency_summary(rec: Recorder) -> dict[str, int]:
    """count, mean, p50, p95, p99, p999 in ns."""
    s = rec.summary()
    return {"count": int(s["count"]), "mean": int(s["mean"])} | {
        key: int(s[key]) for key, _ in REPORTED
    }


def security_doc(c: Client) -> dict[str, Any]:
    """nsqd's TLS and AUTH fields of a client's stats."""
    tls, gate = c.tls, c.gate
    auth = gate.state if gate is not None else None
    return {
        "tls": tls is not None and tls.established,
        "tls_version": (tls.version if tls is not None else None) or "",
        "tls_cipher_suite": (tls.cipher if tls is not None else None) or "",
        "authed": auth is not None,
        "auth_identity": auth.identity if auth is not None else "",
        "auth_identity_url": auth.identity_url if auth is not None else "",
    }


def client_doc(c: Client) -> dict[str, Any]:
    ident = c.identity
    return {
        "client_id": str(ident.get("client_id", "")),
        "hostname": str(ident.get("hostname", "")),
        "version": "V2",
        "remote_address": c.remote,
        "state": _CLIENT_STATE[c.state.value],
        "ready_count": c.rdy,
        "in_flight_count": c.in_flight,
        "message_count": c.message_count,
        "finish_count": c.finish_count,
        "requeue_count": c.requeue_count,
        "connect_ts": c.connected_ns // 1_000_000_000,
        "sample_rate": 0,
        "deflate": False,
        "snappy": False,
        "user_agent": str(ident.get("user_agent", "")),
        **security_doc(c),
        "pub_counts": [{"topic": t, "count": n} for t, n in c.pub_counts.items()],
    }


def channel_doc(broker: Broker, topic: Topic, ch: Channel, clients: bool) -> dict[str, Any]:
    cs = broker.stats.topic(topic.name).channel(ch.name)
    return {
        "channel_name": ch.name,
        "depth": ch.depth,
        "backend_depth": ch.queue.backend_depth,
        "in_flight_count": len(ch.in_flight),
        "deferred_count": ch.deferred_count,
        "message_count": ch.message_count,
        "requeue_count": ch.requeue_count,
        "timeout_count": ch.timeout_count,
        "client_count": len(ch.consumers),
        "clients": [client_doc(c) for c in ch.consumers] if clients else [],  # type: ignore[arg-type]
        "paused": ch.paused,
        "e2e_processing_latency": _percentiles(cs.latency),
    }


def stats_document(
    broker: Broker, topic: str | None = None, channel: str | None = None, clients: bool = True
) -> dict[str, Any]:
    now = time.time_ns()
    topics = []
    srtm_topics = []
    for t in broker.topics.values():
        if topic is not None and t.name != topic:
            continue
        ts = broker.stats.topic(t.name)
        chans = [
            channel_doc(broker, t, ch, clients)
            for ch in t.channels.values()
            if channel is None or ch.name == channel
        ]
        topics.append(
            {
                "topic_name": t.name,
                "channels": chans,
                "depth": t.depth,
                "backend_depth": t.backend_depth,
                "message_count": t.message_count,
                "message_bytes": t.message_bytes,
                "paused": t.paused,
                "e2e_processing_latency": _percentiles(ts.latency),
            }
        )
        bucket = t.bucket
        srtm_topics.append(
            {
                "topic": t.name,
                "bucket": None
                if bucket is None
                else {"rate": bucket.rate, "burst": bucket.burst, "tokens": bucket.tokens()},
                "shaping_depth": len(t.shaping),
                "rate_1s": ts.window.rate_1s(now),
                "window": {
                    "seconds": ts.window.seconds,
                    "average_rate": ts.window.average_rate(now),
                    "max_backlog": ts.window.max_backlog(now),
                },
                "token_wait_ns": latency_summary(ts.token_wait),
                "latency_ns": latency_summary(ts.latency),
                "release_lateness_ns": latency_summary(ts.lateness),
                "dropped": t.shaping.dropped
                + t.held.dropped
                + sum(ch.queue.dropped for ch in t.channels.values()),
                "channels": [
                    {
                        "channel": name,
                        "rate_1s": cs.window.rate_1s(now),
                        "token_wait_ns": latency_summary(cs.token_wait),
                        "latency_ns": latency_summary(cs.latency),
                    }
                    for name, cs in ts.channels.items()
                    if channel is None or name == channel
                ],
            }
        )
    producers = [client_doc(c) for c in broker.clients if c.pub_counts] if clients else []
    return {
        "version": broker.version,
        "health": "OK",
        "start_time": broker.started_ns // 1_000_000_000,
        "topics": topics,
        "producers": producers,
        "srtm": {
            "broker_id": broker.options.broker_id,
            "arrival_stamps": {
                "kernel": broker.options.kernel_timestamps,
                "gap_ns": latency_summary(broker.stats.stamp_gaps),
            },
            "topics": srtm_topics,
        },
    }
