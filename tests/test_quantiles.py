"""The one quantile helper and its spellings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from srtm.quantiles import REPORTED, key, label, quantiles
from support import MakeBroker


@pytest.mark.parametrize(
    ("q", "ident", "text"),
    [(0.5, "p50", "p50"), (0.99, "p99", "p99"), (0.999, "p999", "p99.9"), (1.0, "p100", "p100")],
)
def test_spellings(q: float, ident: str, text: str) -> None:
    assert key(q) == ident and label(q) == text


def test_reported_keys_are_their_spelling() -> None:
    assert [name for name, _ in REPORTED] == [key(q) for _, q in REPORTED]


def test_a_quantile_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"in \[0, 1\], got 99\.9"):
        key(99.9)


def test_quantiles_are_numpys_scaled_and_named() -> None:
    values = np.random.default_rng(3).lognormal(10, 2, 10_001)
    got = quantiles(values, (0.5, 0.999), scale=1e3, suffix="_us")
    assert list(got) == ["p50_us", "p999_us"]
    assert got["p50_us"] == pytest.approx(np.median(values) / 1e3, rel=1e-12)
    assert got["p999_us"] == pytest.approx(np.percentile(values, 99.9) / 1e3, rel=1e-12)
    assert list(quantiles(values)) == [name for name, _ in REPORTED]


def test_no_values_give_the_empty_value() -> None:
    assert quantiles([], (0.99,), empty=0.0) == {"p99": 0.0}
    assert all(math.isnan(v) for v in quantiles(np.zeros(0)).values())


async def test_the_broker_shows_the_reported_quantiles(make_broker: MakeBroker) -> None:
    """/stats (nsqd's quantiles), its srtm section (keys) and /metrics (labels)."""
    from srtm.broker.documents import StatsDoc
    from srtm.broker.metrics import BrokerCollector
    from srtm.broker.report import stats_document

    broker = await make_broker()
    broker.topic("q")
    stats = broker.stats.topic("q")
    for v in range(1, 2_001):
        stats.token_wait.add(v * 1_000)
        stats.latency.add(v * 1_000)
    doc = StatsDoc.model_validate(stats_document(broker, "q")).model_dump(mode="json")
    nsqd = doc["topics"][0]["e2e_processing_latency"]["percentiles"]
    assert [p["quantile"] for p in nsqd] == [0.5, 0.95, 0.99, 0.999]
    assert nsqd[-1]["value"] == pytest.approx(1_998_000, rel=1e-3)
    ours = doc["srtm"]["topics"][0]["token_wait_ns"]
    assert list(ours) == ["count", "mean", "p50", "p95", "p99", "p999"]
    assert ours["p999"] == nsqd[-1]["value"]
    (family,) = (
        m for m in BrokerCollector(broker).collect() if m.name == "srtm_topic_token_wait_seconds"
    )
    labels = [s.labels["quantile"] for s in family.samples if s.labels["topic"] == "q"]
    assert labels == ["0.5", "0.95", "0.99", "0.999"]
