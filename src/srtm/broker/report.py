"""The /stats document: nsqd's shape (so nsqadmin-style tools read it) plus an ``srtm``
section, in the shape ``srtm.broker.documents.StatsDoc`` declares.

Built as plain dicts, not as the models: validating the broker's own state, thousands of
topics' and channels' documents, tripled the time /stats held the event loop (tests check
the answers against the models instead)."""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from srtm.broker.relay import counters_of
from srtm.broker.stats import Recorder, WindowRecorder, summarise_many
from srtm.quantiles import REPORTED

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram

    from srtm.broker.admission import Admission
    from srtm.broker.broker import Broker
    from srtm.broker.state import Channel, Topic
    from srtm.broker.tcp import Client
    from srtm.ratelimit import TokenBucket

#: A document as JSON will carry it.
Doc = dict[str, Any]
#: How long building /stats may hold the loop before it lets the loop run (and a shaped
#: release due soon go): about two topics' summaries.
STATS_SLICE_NS = 1_000_000

_CLIENT_STATE = {"init": 1, "subscribed": 3, "closing": 4, "closed": 5}


def _percentiles(rec: Recorder) -> Doc:
    s = rec.summary()
    if not s["count"]:
        return dict(count=0, percentiles=None)
    return dict(
        count=int(s["count"]),
        percentiles=[dict(quantile=q, value=int(s[key])) for key, q in REPORTED],
    )


def latency_summary(rec: Recorder) -> Doc:
    """count, mean, p50, p95, p99, p999 in ns."""
    return _summary_doc(rec.summary())


def window_summary(rec: WindowRecorder, now: int) -> Doc:
    """``latency_summary`` of the values in ``rec``'s window at ``now``."""
    return _summary_doc(rec.summary(now))


def _summary_doc(s: dict[str, float]) -> Doc:
    return dict(
        count=int(s["count"]),
        mean=int(s["mean"]),
        p50=int(s["p50"]),
        p95=int(s["p95"]),
        p99=int(s["p99"]),
        p999=int(s["p999"]),
    )


def bucket_now(bucket: TokenBucket | None) -> Doc | None:
    if bucket is None:
        return None
    return dict(rate=bucket.rate, burst=bucket.burst, tokens=bucket.tokens())


def client_doc(c: Client) -> Doc:
    """nsqd's client stats, its TLS and AUTH fields included."""
    ident, tls, gate = c.identity, c.tls, c.gate
    auth = gate.state if gate is not None else None
    return dict(
        client_id=str(ident.get("client_id", "")),
        hostname=str(ident.get("hostname", "")),
        version="V2",
        remote_address=c.remote,
        state=_CLIENT_STATE[c.state.value],
        ready_count=c.rdy,
        in_flight_count=c.in_flight,
        message_count=c.message_count,
        finish_count=c.finish_count,
        requeue_count=c.requeue_count,
        connect_ts=c.connected_ns // 1_000_000_000,
        sample_rate=c.session.sample_rate,
        deflate=c.session.deflate_level > 0,
        snappy=c.session.snappy,
        user_agent=str(ident.get("user_agent", "")),
        tls=tls is not None and tls.established,
        tls_version=(tls.version if tls is not None else None) or "",
        tls_cipher_suite=(tls.cipher if tls is not None else None) or "",
        authed=auth is not None,
        auth_identity=auth.identity if auth is not None else "",
        auth_identity_url=auth.identity_url if auth is not None else "",
        pub_counts=[dict(topic=t, count=n) for t, n in c.pub_counts.items()],
    )


def _topic_deferred(topic: Topic, ch: Channel) -> int:
    homing = topic.homing
    return topic.deferred_count if homing is None or homing.keeps(ch.name) else 0


def channel_doc(broker: Broker, topic: Topic, ch: Channel, clients: bool) -> Doc:
    cs = broker.stats.topic(topic.name).channel(ch.name)
    return dict(
        channel_name=ch.name,
        depth=ch.depth,
        backend_depth=ch.queue.backend_depth,
        in_flight_count=len(ch.in_flight),
        # DPUB'd messages wait in the topic until due (then shaped); each is this
        # channel's once released, so it counts them as nsqd's channel does.
        deferred_count=ch.deferred_count + _topic_deferred(topic, ch),
        message_count=ch.message_count,
        requeue_count=ch.requeue_count,
        timeout_count=ch.timeout_count,
        client_count=len(ch.consumers),
        clients=[client_doc(c) for c in ch.consumers] if clients else [],  # type: ignore[arg-type]
        paused=ch.paused,
        e2e_processing_latency=_percentiles(cs.latency),
    )


def admission_rows(adm: Admission | None) -> list[Doc]:
    """A topic's consumer classes, most important first (AdmissionClassDoc's shape)."""
    if adm is None:
        return []
    return [dict(name=k, admitted=n, connected=c) for k, n, c in adm.counts()]


def bound_doc(broker: Broker, t: Topic, now: int) -> Doc | None:
    """``BoundDoc``: the topic's bound, how long a message would wait now, what acted
    (None: it has no bound)."""
    bound = t.bound
    if bound is None:
        return None
    over = t.over_bound_ns(now)
    wait_ns = over + bound.max_wait_ns if t.meter is not None and not t.on_hold else 0
    return dict(
        max_wait_ms=bound.max_wait_ms,
        overflow=bound.overflow.value,
        wait_ms=max(0, wait_ns) / 1e6,
        over=over > 0,
        dropped=t.dropped_over_bound,
        refused=t.refused_over_bound,
        blocked_connections=len(blocked := broker.policing.blocked.get(t.name, ())),
        senders=_senders(broker, t.name) if over > 0 or blocked else [],
    )


#: Senders a topic over its bound names (those that published the most to it).
MAX_SENDERS = 5


def _senders(broker: Broker, topic: str) -> list[Doc]:
    """Who sends ``topic`` (over its bound: only then, the clients are walked): its
    connections' publishers, by messages published to it since they connected."""
    counts = [(n, c) for c in list(broker.clients) if (n := c.pub_counts.get(topic, 0))]
    counts.sort(key=lambda nc: -nc[0])
    return [
        dict(publisher=c.publisher, remote_address=c.remote, count=n, blocked=c.blocked)
        for n, c in counts[:MAX_SENDERS]
    ]


def _srtm_topic(broker: Broker, t: Topic, channel: str | None, now: int) -> Doc:
    ts = broker.stats.topic(t.name)
    return dict(
        topic=t.name,
        bucket=bucket_now(t.bucket),
        bound=bound_doc(broker, t, now),
        held=t.on_hold,
        shaping_depth=len(t.shaping),
        rate_1s=ts.window.rate_1s(now),
        window=dict(
            seconds=ts.window.seconds,
            average_rate=ts.window.average_rate(now),
            max_backlog=ts.window.max_backlog(now),
        ),
        token_wait_ns=latency_summary(ts.token_wait),
        latency_ns=latency_summary(ts.latency),
        release_lateness_ns=latency_summary(ts.lateness),
        release_lateness_held_ns=latency_summary(ts.lateness_held),
        delivery_window_s=ts.delivery.seconds,
        delivery_ns=window_summary(ts.delivery, now),
        subscriber_wait_ns=window_summary(ts.subscriber_wait, now),
        backlog_age_ns=0 if (oldest := t.oldest_arrival_ns()) is None else max(0, now - oldest),
        dropped=t.shaping.dropped
        + t.held.dropped
        + t.deferred.spill.dropped
        + sum(ch.queue.dropped for ch in t.channels.values()),
        channels=[
            dict(
                channel=name,
                rate_1s=cs.window.rate_1s(now),
                token_wait_ns=latency_summary(cs.token_wait),
                latency_ns=latency_summary(cs.latency),
            )
            for name, cs in ts.channels.items()
            if channel is None or name == channel
        ],
        admission=admission_rows(broker.admission.get(t.name)),
        route=None if (r := broker.relay.table.get(t.name)) is None else counters_of(r),
    )


def stats_document(
    broker: Broker, topic: str | None = None, channel: str | None = None, clients: bool = True
) -> Doc:
    """The /stats document, built in one go (``stats_parts``)."""
    parts = stats_parts(broker, topic, channel, clients)
    while True:
        try:
            next(parts)
        except StopIteration as built:
            return built.value  # type: ignore[no-any-return]


async def stats_sliced(
    broker: Broker, topic: str | None = None, channel: str | None = None, clients: bool = True
) -> Doc:
    """``stats_parts``' document, the loop let run between topics once building it has
    held the loop ``STATS_SLICE_NS``, and a shaped release due soon gone first (/stats)."""
    parts = stats_parts(broker, topic, channel, clients)
    since = time.perf_counter_ns()
    while True:
        try:
            next(parts)
        except StopIteration as built:
            return built.value  # type: ignore[no-any-return]
        if time.perf_counter_ns() - since >= STATS_SLICE_NS:
            await broker.releaser.clear()
            await asyncio.sleep(0)
            since = time.perf_counter_ns()


def stats_parts(
    broker: Broker, topic: str | None = None, channel: str | None = None, clients: bool = True
) -> Generator[None, None, Doc]:
    """The /stats document, a topic at a time: it pauses after each topic (the caller may
    let the loop run meanwhile: a topic's summaries take about 0.5 ms, and 40 shaped
    topics held releases back by 147-176 ms), and returns the document. A topic deleted
    before its turn is left out."""
    now = time.time_ns()
    topics = []
    srtm_topics = []
    lateness: list[HdrHistogram] = []
    held: list[HdrHistogram] = []
    for name, t in sorted(broker.topics.items()):  # by name, as nsqd
        if topic is not None and name != topic:
            continue
        if broker.topics.get(name) is not t:
            continue  # deleted (or made anew) while the loop ran: no stats made for it
        broker.shares.lease_ok()  # a lapsed lease shows as held, never as a stale bucket
        ts = broker.stats.topic(t.name)
        chans = [
            channel_doc(broker, t, ch, clients)
            for _, ch in sorted(t.channels.items())  # by name, as nsqd
            if channel is None or ch.name == channel
        ]
        topics.append(
            dict(
                topic_name=t.name,
                channels=chans,
                depth=t.depth,
                backend_depth=t.backend_depth,
                message_count=t.message_count,
                message_bytes=t.message_bytes,
                paused=t.paused,
                e2e_processing_latency=_percentiles(ts.latency),
            )
        )
        srtm_topics.append(_srtm_topic(broker, t, channel, now))
        if (late := ts.lateness.recorded()) is not None:
            lateness.append(late)
        if (late := ts.lateness_held.recorded()) is not None:
            held.append(late)
        yield
    producers = [client_doc(c) for c in list(broker.clients) if c.pub_counts] if clients else []
    return dict(
        version=broker.version,
        health="OK",
        start_time=broker.started_ns // 1_000_000_000,
        topics=topics,
        producers=producers,
        srtm=dict(
            broker_id=broker.options.broker_id,
            arrival_stamps=dict(
                kernel=broker.options.kernel_timestamps,
                gap_ns=latency_summary(broker.stats.stamp_gaps),
            ),
            release_lateness_ns=_summary_doc(summarise_many(lateness)),
            release_lateness_held_ns=_summary_doc(summarise_many(held)),
            topics=srtm_topics,
        ),
    )


#: The last GC pauses (µs), as nsqd's percentiles read Go's last 256; filled by a gc
#: callback installed with the first /stats that asks for memory.
_GC_PAUSES_US: collections.deque[int] = collections.deque(maxlen=256)
_gc_started_ns = 0


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    global _gc_started_ns
    if phase == "start":
        _gc_started_ns = time.perf_counter_ns()
    elif _gc_started_ns:
        _GC_PAUSES_US.append((time.perf_counter_ns() - _gc_started_ns) // 1_000)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _pause_percentile(pauses: list[int], q: float) -> int:
    if not pauses:
        return 0
    return pauses[min(len(pauses) - 1, int(q * len(pauses)))]


def memory_document() -> Doc:
    """nsqd's memory block from CPython (srtm.broker.documents.MemoryDoc says which are
    approximations and which have no counterpart)."""
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)
    pauses = sorted(_GC_PAUSES_US)
    return dict(
        heap_objects=sys.getallocatedblocks(),
        heap_idle_bytes=0,
        heap_in_use_bytes=_resident_bytes(),
        heap_released_bytes=0,
        gc_pause_usec_100=pauses[-1] if pauses else 0,
        gc_pause_usec_99=_pause_percentile(pauses, 0.99),
        gc_pause_usec_95=_pause_percentile(pauses, 0.95),
        next_gc_bytes=0,
        gc_total_runs=sum(int(g["collections"]) for g in gc.get_stats()),
    )
