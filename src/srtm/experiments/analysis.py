"""A run's traces, analysed in process (pandas): the join of broker-side and subscriber-side
rows on (broker, msg_id), latency percentiles, the DRL penalty's share, and the
published = delivered accounting.

Quantiles are ``srtm.quantiles``' (numpy's default: linear interpolation between
the closest ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from srtm.quantiles import quantiles

#: How a summary says its figures were computed here (``spark_analysis`` says otherwise).
ENGINE = {"engine": "in-process (pandas)"}


@dataclass(frozen=True)
class MeasuredWindow:
    """Messages sent in [start_ns, end_ns) are the measured ones."""

    start_ns: int
    end_ns: int


def _read(directory: Path, columns: list[str]) -> pd.DataFrame:
    files = sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    return pq.read_table(files, columns=columns).to_pandas()


def load(traces: Path, run: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(broker rows, subscriber rows) of ``run``."""
    broker = _read(
        traces / "broker" / f"run={run}",
        ["broker", "topic", "msg_id", "publisher", "t_arrive_ns", "t_release_ns", "t_dispatch_ns"],
    )
    sub = _read(
        traces / "subscriber" / f"run={run}",
        ["broker", "topic", "msg_id", "publisher", "group", "seq", "t_send_ns", "t_recv_ns"],
    )
    return broker, sub


def _quantiles_ms(values_ns: np.ndarray[Any, Any]) -> dict[str, float]:
    """The reported quantiles of nanosecond values, in ms (NaN when there are none)."""
    return quantiles(values_ns, scale=1e6)


#: A correlation group's sends no further apart than this are one burst (``group_bursts``):
#: a group's members fire within the scenario's spread (67 µs apart over the demo's 2 ms),
#: its events a period apart (100 ms at 10 msg/s).
BURST_GAP_NS = 2_000_000


def group_bursts(sub: pd.DataFrame, window: MeasuredWindow) -> dict[str, Any]:
    """How a correlation group's bursts go through, from the subscriber's rows sent in
    ``window``: how many bursts (a group's sends at most ``BURST_GAP_NS`` apart), their
    size, over how long the load generator sent one (``send_spread_ms``: its last send −
    its first; the scenario's ``spread_ms`` and the generator's own lateness), and how
    long after its first send the subscriber had all of it (``done_ms``)."""
    rows = sub[(sub["t_send_ns"] >= window.start_ns) & (sub["t_send_ns"] < window.end_ns)]
    rows = rows[rows["group"].notna()].drop_duplicates(["publisher", "seq"])
    if rows.empty:
        return {"bursts": 0}
    rows = rows.sort_values(["group", "t_send_ns"])
    gap = rows.groupby("group")["t_send_ns"].diff()
    burst = (gap.isna() | (gap > BURST_GAP_NS)).cumsum()
    per = rows.groupby(burst).agg(
        size=("t_send_ns", "size"),
        first=("t_send_ns", "min"),
        last=("t_send_ns", "max"),
        done=("t_recv_ns", "max"),
    )
    return {
        "bursts": len(per),
        "size_p50": float(per["size"].median()),
        "send_spread_ms": _quantiles_ms((per["last"] - per["first"]).to_numpy(np.float64)),
        "done_ms": _quantiles_ms((per["done"] - per["first"]).to_numpy(np.float64)),
    }


def accounting(sub: pd.DataFrame, published: Mapping[str, int]) -> dict[str, int]:
    """Published (per publisher, sequence numbers 0..n-1 acknowledged) against delivered
    (distinct (publisher, seq) the subscriber saw)."""
    pairs = sub[["publisher", "seq"]].drop_duplicates()
    sent = sum(published.values())
    n_pub = pairs["publisher"].map(published).fillna(0).to_numpy()
    expected = pairs["seq"].to_numpy() < n_pub
    delivered_expected = int(expected.sum())
    return {
        "published": sent,
        "delivered": len(pairs),
        "lost": sent - delivered_expected,
        "unexpected": len(pairs) - delivered_expected,
        "duplicates": int(len(sub) - len(pairs)),
    }


def summarize(
    broker: pd.DataFrame, sub: pd.DataFrame, window: MeasuredWindow, slo_ms: float
) -> dict[str, Any]:
    """Latency of the measured messages, end to end and split into token wait and the
    rest; per broker; with how much of the tail the token bucket accounts for."""
    measured = sub[(sub["t_send_ns"] >= window.start_ns) & (sub["t_send_ns"] < window.end_ns)]
    measured = measured.drop_duplicates(["broker", "msg_id"])
    joined = measured.merge(
        broker[["broker", "msg_id", "t_arrive_ns", "t_release_ns", "t_dispatch_ns"]],
        on=["broker", "msg_id"],
        how="left",
    )
    e2e = (joined["t_recv_ns"] - joined["t_send_ns"]).to_numpy(np.int64)
    has_broker = joined["t_arrive_ns"].notna().to_numpy()
    token = (joined["t_release_ns"] - joined["t_arrive_ns"]).to_numpy(np.float64)
    processing = (joined["t_dispatch_ns"] - joined["t_release_ns"]).to_numpy(np.float64)
    out: dict[str, Any] = {"messages": len(joined), "joined": int(has_broker.sum())}
    out["e2e_ms"] = _quantiles_ms(e2e)
    out["token_wait_ms"] = _quantiles_ms(token[has_broker])
    out["processing_ms"] = _quantiles_ms(processing[has_broker])
    # The rest: publisher to broker, and broker to subscriber (sockets, both clients' loops).
    transit = e2e - (joined["t_dispatch_ns"] - joined["t_arrive_ns"]).to_numpy(np.float64)
    out["transit_ms"] = _quantiles_ms(transit[has_broker])
    to_broker = (joined["t_arrive_ns"] - joined["t_send_ns"]).to_numpy(np.float64)
    to_subscriber = (joined["t_recv_ns"] - joined["t_dispatch_ns"]).to_numpy(np.float64)
    out["to_broker_ms"] = _quantiles_ms(to_broker[has_broker])
    out["to_subscriber_ms"] = _quantiles_ms(to_subscriber[has_broker])
    out["slo_violations"] = float((e2e > slo_ms * 1e6).mean()) if e2e.size else 0.0
    out["token_share"] = _share(token[has_broker], e2e[has_broker])
    if e2e.size:
        tail = has_broker & (e2e >= np.percentile(e2e, 99))
        out["token_share_tail"] = _share(token[tail], e2e[tail])
    else:
        out["token_share_tail"] = 0.0
    per_broker = {}
    for b, rows in joined.groupby("broker", sort=True):
        lat = (rows["t_recv_ns"] - rows["t_send_ns"]).to_numpy(np.int64)
        per_broker[str(b)] = {"messages": len(rows)} | _quantiles_ms(lat)
    out["per_broker"] = per_broker
    out["brokers_used"] = len(per_broker)
    return out


def _share(part: np.ndarray[Any, Any], whole: np.ndarray[Any, Any]) -> float:
    total = float(np.sum(whole))
    return float(np.sum(part)) / total if total > 0 else 0.0


def cdf(
    values_ms: np.ndarray[Any, Any], points: int = 400
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """An empirical CDF thinned to about ``points`` points (for plots)."""
    x = np.sort(values_ms)
    if x.size == 0:
        return x, x
    idx = np.unique(np.linspace(0, x.size - 1, min(points, x.size)).astype(int))
    return x[idx], (idx + 1) / x.size


def e2e_ms(sub: pd.DataFrame, window: MeasuredWindow) -> np.ndarray[Any, Any]:
    """End-to-end latencies (ms) of the measured messages (for plots)."""
    m = sub[(sub["t_send_ns"] >= window.start_ns) & (sub["t_send_ns"] < window.end_ns)]
    m = m.drop_duplicates(["broker", "msg_id"])
    lat: np.ndarray[Any, Any] = (m["t_recv_ns"] - m["t_send_ns"]).to_numpy(np.int64) / 1e6
    return lat
