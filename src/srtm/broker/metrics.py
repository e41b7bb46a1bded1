"""Prometheus exposition of the broker's state, read at scrape time (no hot-path cost)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from srtm.broker.report import bound_doc
from srtm.quantiles import REPORTED

if TYPE_CHECKING:
    from srtm.broker.broker import Broker


class BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        now = time.time_ns()
        t_labels = ["topic"]
        c_labels = ["topic", "channel"]
        msgs = CounterMetricFamily("srtm_topic_messages", "Messages published", labels=t_labels)
        depth = GaugeMetricFamily("srtm_topic_depth", "Messages the topic holds", labels=t_labels)
        rate = GaugeMetricFamily("srtm_topic_rate", "Arrivals in the last second", labels=t_labels)
        avg = GaugeMetricFamily(
            "srtm_topic_window_rate", "Mean arrival rate over the adaptor window", labels=t_labels
        )
        backlog = GaugeMetricFamily(
            "srtm_topic_window_max_backlog",
            "Largest virtual backlog (tokens) over the adaptor window",
            labels=t_labels,
        )
        b_rate = GaugeMetricFamily("srtm_bucket_rate", "Sub-bucket rate (1/s)", labels=t_labels)
        b_burst = GaugeMetricFamily("srtm_bucket_burst", "Sub-bucket depth", labels=t_labels)
        wait = GaugeMetricFamily(
            "srtm_topic_token_wait_seconds", "Token wait quantiles", labels=[*t_labels, "quantile"]
        )
        lat = GaugeMetricFamily(
            "srtm_topic_latency_seconds",
            "In-broker latency (dispatch − arrival) quantiles since start",
            labels=[*t_labels, "quantile"],
        )
        served = GaugeMetricFamily(
            "srtm_topic_delivery_seconds",
            "In-broker latency of deliveries to subscribers that were there, over the "
            "delivery window: the SLO's figure",
            labels=[*t_labels, "quantile"],
        )
        waited = GaugeMetricFamily(
            "srtm_topic_subscriber_wait_seconds",
            "In-broker latency of deliveries that waited for a subscriber, over the window",
            labels=[*t_labels, "quantile"],
        )
        age = GaugeMetricFamily(
            "srtm_topic_backlog_age_seconds",
            "Age of the oldest message waiting to be delivered",
            labels=t_labels,
        )
        bound_wait = GaugeMetricFamily(
            "srtm_topic_bound_wait_seconds",
            "How long a message arriving now would wait behind the sub-bucket",
            labels=t_labels,
        )
        bound_max = GaugeMetricFamily(
            "srtm_topic_bound_max_wait_seconds", "The topic's bound on that wait", labels=t_labels
        )
        dropped = CounterMetricFamily(
            "srtm_topic_over_bound_dropped", "Waiting messages dropped over the bound",
            labels=t_labels,
        )  # fmt: skip
        refused = CounterMetricFamily(
            "srtm_topic_over_bound_refused", "Messages refused over the bound", labels=t_labels
        )
        blocked = GaugeMetricFamily(
            "srtm_topic_blocked_connections", "Connections not read: topic over its bound",
            labels=t_labels,
        )  # fmt: skip
        c_depth = GaugeMetricFamily("srtm_channel_depth", "Queued messages", labels=c_labels)
        c_flight = GaugeMetricFamily("srtm_channel_in_flight", "In flight", labels=c_labels)
        c_msgs = CounterMetricFamily("srtm_channel_messages", "Messages queued", labels=c_labels)
        c_req = CounterMetricFamily("srtm_channel_requeues", "Requeues", labels=c_labels)
        c_to = CounterMetricFamily("srtm_channel_timeouts", "Timeouts", labels=c_labels)
        c_cli = GaugeMetricFamily("srtm_channel_clients", "Subscribed clients", labels=c_labels)
        for t in list(b.topics.values()):
            ts = b.stats.topic(t.name)
            msgs.add_metric([t.name], t.message_count)
            depth.add_metric([t.name], t.depth)
            rate.add_metric([t.name], ts.window.rate_1s(now))
            avg.add_metric([t.name], ts.window.average_rate(now))
            backlog.add_metric([t.name], ts.window.max_backlog(now))
            if t.bucket is not None:
                b_rate.add_metric([t.name], t.bucket.rate)
                b_burst.add_metric([t.name], t.bucket.burst)
            _quantiles(wait, [t.name], ts.token_wait.summary())
            _quantiles(lat, [t.name], ts.latency.summary())
            _quantiles(served, [t.name], ts.delivery.summary(now))
            _quantiles(waited, [t.name], ts.subscriber_wait.summary(now))
            oldest = t.oldest_arrival_ns()
            age.add_metric([t.name], 0.0 if oldest is None else max(0, now - oldest) / 1e9)
            bd = bound_doc(b, t, now)
            if bd is None:
                continue
            bound_wait.add_metric([t.name], bd["wait_ms"] / 1e3)
            bound_max.add_metric([t.name], bd["max_wait_ms"] / 1e3)
            dropped.add_metric([t.name], bd["dropped"])
            refused.add_metric([t.name], bd["refused"])
            blocked.add_metric([t.name], bd["blocked_connections"])
            for ch in list(t.channels.values()):
                lv = [t.name, ch.name]
                c_depth.add_metric(lv, ch.depth)
                c_flight.add_metric(lv, len(ch.in_flight))
                c_msgs.add_metric(lv, ch.message_count)
                c_req.add_metric(lv, ch.requeue_count)
                c_to.add_metric(lv, ch.timeout_count)
                c_cli.add_metric(lv, len(ch.consumers))
        clients = GaugeMetricFamily("srtm_clients", "Connected clients")
        clients.add_metric([], len(b.clients))
        inline = CounterMetricFamily(
            "srtm_disk_inline_writes", "Publishes' writes to disk run on the event loop"
        )
        slow = CounterMetricFamily(
            "srtm_disk_slow_inline_writes",
            "Inline writes over 0.5 ms that waited in the kernel (each pauses them: 50 ms, "
            "doubled while they keep coming, up to 5 s)",
        )
        busy = CounterMetricFamily(
            "srtm_disk_busy_inline_writes",
            "Inline writes over 0.5 ms that never waited in the kernel (CPU, or a core "
            "taken away: no pause)",
        )
        if (io := b.persistence.io) is not None:
            inline.add_metric([], io.inline_writes)
            slow.add_metric([], io.slow_inline_writes)
            busy.add_metric([], io.busy_inline_writes)
        yield from (msgs, depth, rate, avg, backlog, b_rate, b_burst, wait, lat, served, waited)
        yield from (age, bound_wait, bound_max, dropped, refused, blocked)
        yield from (c_depth, c_flight, c_msgs, c_req, c_to, c_cli, clients, inline, slow, busy)


def _quantiles(family: GaugeMetricFamily, labels: list[str], s: dict[str, float]) -> None:
    if not s["count"]:
        return
    for key, q in REPORTED:
        family.add_metric([*labels, str(q)], s[key] / 1e9)
