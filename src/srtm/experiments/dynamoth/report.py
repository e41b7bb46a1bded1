"""The Dynamoth analogues' tables (terminal and Markdown) and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments.figures.common import pyplot

REPLICATION_COLUMNS = (
    "replicas",
    "subscribers",
    "expected msg/s",
    "published msg/s × subscribers",
    "egress msg/s",
    "per broker msg/s",
    "p50 ms",
    "p99 ms",
    "duplicates",
)
CLIENTS_COLUMNS = (
    "brokers",
    "clients",
    "offered msg/s",
    "sent msg/s",
    "delivered msg/s",
    "per broker msg/s",
    "mean ms",
    "p50 ms",
    "p99 ms",
    "not received",
)
MOVE_COLUMNS = (
    "run",
    "topic",
    "messages",
    "held",
    "longest hold ms",
    "of it: no share ms",
    "of it: no subscriber ms",
    "first arrival ms",
    "subscriber in ms",
    "p99 ms",
    "held next window",
)


def _per(per: dict[str, float]) -> str:
    return " / ".join(f"{b}: {v:,.0f}" for b, v in sorted(per.items())) or "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _nan(value: float | None) -> float:
    """A figure for a plot: None (nothing measured) is a gap."""
    return float("nan") if value is None else value


def replication_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(s["replicas"]),
            str(s["subscribers"]),
            f"{s['expected_msg_s']:,.0f}",
            f"{s['sent_msg_s'] * s['subscribers']:,.0f}",
            f"{s['egress_msg_s']:,.0f}",
            _per(s["per_broker"]),
            f"{s['p50_ms']:.1f}",
            f"{s['p99_ms']:.1f}",
            str(s["duplicates"]),
        )
        for r in doc["runs"]
        for s in r["steps"]
    ]


def clients_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(s["brokers"]),
            str(s["clients"]),
            f"{s['offered_msg_s']:,.0f}",
            f"{s['sent_msg_s']:,.0f}",
            f"{s['delivered_msg_s']:,.0f}",
            _per(s["per_broker"]),
            _ms(s["mean_ms"]),
            _ms(s["p50_ms"]),
            _ms(s["p99_ms"]),
            f"{s['unreceived']:,}",
        )
        for r in doc["runs"]
        for s in r["steps"]
    ]


def move_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            name,
            m["topic"],
            str(m["messages"]),
            str(m["held"]),
            f"{m['hold_max_ms']:.1f}",
            f"{m['wait_release_ms']:.1f}",
            f"{m['wait_subscriber_ms']:.1f}",
            f"{m['first_arrival_ms']:.0f}",
            f"{m['subscriber_joined_ms']:.0f}",
            f"{m['e2e_p99_ms']:.1f}",
            f"{m['steady_held']} of {m['steady_messages']}",
        )
        for name, r in doc["runs"].items()
        for m in r["moves"]
    ]


def verdicts(doc: dict[str, Any]) -> dict[str, str | None]:
    """Each run's disturbed verdict (None: not disturbed)."""
    runs = doc["runs"]
    items = (
        runs.items()
        if isinstance(runs, dict)
        else ((str(r.get("replicas", r.get("brokers"))), r) for r in runs)
    )
    return {name: r["disturbed"] for name, r in items}


def show(
    title: str,
    columns: tuple[str, ...],
    rows: list[tuple[str, ...]],
    doc: dict[str, Any],
    out: Console,
) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for name, why in verdicts(doc).items():
        out.print(
            f"run {name}: " + (f"DISTURBED ({why})" if why else "not disturbed"), highlight=False
        )


def markdown(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_replication(doc: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, (egress, latency) = plt.subplots(1, 2, figsize=(10.4, 3.8))
    for r in doc["runs"]:
        n = [s["subscribers"] for s in r["steps"]]
        label = "no replication" if r["replicas"] == 1 else f"{r['replicas']} replicas"
        egress.plot(n, [s["egress_msg_s"] for s in r["steps"]], "o-", label=label)
        latency.plot(n, [s["p99_ms"] for s in r["steps"]], "o-", label=f"{label}, p99")
        latency.plot(n, [s["p50_ms"] for s in r["steps"]], "s--", label=f"{label}, p50")
    first = doc["runs"][0]["steps"]
    egress.plot(
        [s["subscribers"] for s in first],
        [s["expected_msg_s"] for s in first],
        "k:",
        label="expected (rate × subscribers)",
    )
    egress.set(xlabel="subscribers (one channel each)", ylabel="egress, msg/s delivered")
    latency.set(xlabel="subscribers (one channel each)", ylabel="latency, ms", yscale="log")
    egress.legend(fontsize=7)
    latency.legend(fontsize=7)
    fig.suptitle("Replication scalability (Dynamoth's 'too many subscribers'), live", fontsize=10)
    fig.tight_layout()
    path = out / "dynamoth-replication.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_clients(doc: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, (resp, load) = plt.subplots(1, 2, figsize=(10.4, 3.8))
    for r in doc["runs"]:
        n = [s["clients"] for s in r["steps"]]
        label = f"{r['brokers']} broker" + ("s" if r["brokers"] > 1 else "")
        resp.plot(n, [_nan(s["mean_ms"]) for s in r["steps"]], "o-", label=f"{label}, mean")
        resp.plot(n, [_nan(s["p99_ms"]) for s in r["steps"]], "s--", label=f"{label}, p99")
        load.plot(n, [s["delivered_msg_s"] for s in r["steps"]], "o-", label=label)
    first = doc["runs"][0]["steps"]
    load.plot(
        [s["clients"] for s in first], [s["offered_msg_s"] for s in first], "k:", label="offered"
    )
    resp.set(xlabel="clients", ylabel="response time, ms", yscale="log")
    load.set(xlabel="clients", ylabel="msg/s delivered")
    resp.legend(fontsize=7)
    load.legend(fontsize=7)
    fig.suptitle(
        "Response time against the number of clients (Dynamoth's scalability), live", fontsize=10
    )
    fig.tight_layout()
    path = out / "dynamoth-clients.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_move(doc: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, (hold, held) = plt.subplots(1, 2, figsize=(10.4, 3.6))
    names = list(doc["runs"])
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        moves = doc["runs"][name]["moves"]
        x = [i + k * width for i in range(len(moves))]
        hold.bar(x, [m["hold_max_ms"] for m in moves], width, label=name)
        held.bar(x, [m["held"] for m in moves], width, label=name)
    hold.set(xlabel="move", ylabel="longest wait at the destination, ms")
    held.set(xlabel="move", ylabel=f"messages held over {doc['hold_ms']:g} ms")
    hold.legend(fontsize=7)
    held.legend(fontsize=7)
    fig.suptitle(
        "A move to a broker its subscribers do not read yet: before and after the fix", fontsize=10
    )
    fig.tight_layout()
    path = out / "dynamoth-move.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
