"""Comparisons of live runs: one row per policy and publisher order (the terminal's
table), PNG plots and an HTML page."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from srtm.experiments import analysis, validity
from srtm.experiments.validity import Finding

#: (heading, how to read it from a run summary, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("policy", "policy", "{}"),
    ("order", "publisher_order", "{}"),
    ("p50 ms", "e2e_ms.p50", "{:.1f}"),
    ("p95 ms", "e2e_ms.p95", "{:.1f}"),
    ("p99 ms", "e2e_ms.p99", "{:.1f}"),
    ("SLO", "slo_met", "{}"),
    ("run", "validity", "{}"),
    ("brokers", "brokers_used", "{}"),
    ("groups", "groups_per_broker", "{}"),
    ("placed", "placed", "{}"),
    ("tokens", "token_share_tail", "{:.0%}"),
    ("rounds", "fitting_rounds", "{}"),
    ("published", "accounting.published", "{:,}"),
    ("delivered", "accounting.delivered", "{:,}"),
)
#: What the short headings mean (printed under the table).
LEGEND = (
    "SLO: p99 within the SLO, on every broker, with every publisher served (a finding under "
    "the table says why not); order: the order the publishers were handed to the "
    "placement policy (block: each correlation group's members one after another; "
    "shuffled: a seeded permutation); brokers: brokers that carried the topic; groups: "
    "correlation groups a broker of the final plan has members of, on average; placed: "
    "publishers "
    "the final plan gave a broker, of the topic's; tokens: share of the "
    "slowest 1 % of messages' latency spent waiting for tokens (the DRL penalty); rounds: "
    "measurement rounds of online fitting (LB is not fitted); run: whether the run's own "
    "checks (send and release lateness, events skipped, CPU waits) found the machine "
    "quiet enough (ok) or not (DISTURBED: its figures are shown, its SLO is not judged)."
)
#: Said instead of a conclusion when a run was disturbed.
RERUN = "Re-run on a quieter machine (close other programs, or run fewer things at once)."


def order_of(summary: dict[str, Any]) -> str:
    """The publisher order of the run ('block' for a summary from before runs said)."""
    return str(summary.get("publisher_order", "block"))


def label(summary: dict[str, Any]) -> str:
    """The run's name in lists and plots: its policy, and its order when not block."""
    order = order_of(summary)
    return summary["policy"] if order == "block" else f"{summary['policy']} ({order})"


def by_order(summaries: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The summaries grouped by publisher order, in the order they first come."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        out.setdefault(order_of(s), []).append(s)
    return out


def status(summary: dict[str, Any]) -> str:
    """'valid', 'disturbed', or 'unchecked' (a summary from before runs checked it)."""
    doc = summary.get("validity")
    return str(doc["status"]) if doc else "unchecked"


def findings(summary: dict[str, Any]) -> tuple[Finding, ...]:
    """What the policy did that the p99 alone does not say (``validity.findings``)."""
    return validity.findings(validity.policy_figures(summary))


def within_slo(summary: dict[str, Any]) -> bool | None:
    """Whether the policy met the SLO: p99 within it, and no finding that rules it out (a
    starved broker, publishers left unserved, an unfinished fitting); None when the run
    was disturbed (not judged)."""
    if status(summary) == "disturbed":
        return None
    met = float(summary["e2e_ms"]["p99"]) <= summary["slo_p99_ms"]
    return met and not any(f.fails_slo for f in findings(summary))


def value(summary: dict[str, Any], path: str) -> Any:
    if path == "slo_met":
        return {None: "n/a", True: "yes", False: "no"}[within_slo(summary)]
    if path == "placed":
        total, unplaced = summary.get("publishers"), summary.get("unplaced_publishers")
        return "-" if total is None or unplaced is None else f"{total - unplaced:,}/{total:,}"
    if path == "validity":
        return {"valid": "ok", "disturbed": "DISTURBED"}.get(status(summary), "-")
    if path == "publisher_order":
        return order_of(summary)
    if path == "groups_per_broker":
        per = summary.get("groups_per_broker") or {}
        return f"{sum(per.values()) / len(per):.1f}" if per else "-"
    if path == "fitting_rounds":
        rounds = summary.get("fitting_rounds") or []
        return sum(rounds) if rounds else "-"
    out: Any = summary
    for key in path.split("."):
        out = out[key]
    return out


def rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [[fmt.format(value(s, path)) for _, path, fmt in COLUMNS] for s in summaries]


def loss_text(summary: dict[str, Any]) -> str:
    """'lost N', or, when the drain after sending ran out before the subscriber had
    everything, how many were still undelivered then (late on a starved machine, or
    lost: the run cannot tell)."""
    lost = summary["accounting"]["lost"]
    if summary.get("drained", True) or lost == 0:
        return f"lost {lost}"
    return f"{lost} undelivered when the drain ended (lost or still late)"


def unsent_text(summary: dict[str, Any]) -> str:
    """'; N never sent: …' when the emulator had messages it could not route: they
    count in neither published nor delivered, so published = delivered does not show them."""
    unrouted = (summary.get("emulator") or {}).get("unrouted", 0)
    return f"; {unrouted:,} never sent: their publishers had no broker" if unrouted else ""


def checks_line(summary: dict[str, Any]) -> str:
    """The run's own checks in a few figures (ms, shares), for the lines under the table."""
    doc = summary.get("validity")
    if not doc:
        return "not checked"
    f = doc["figures"]
    parts = [f"send lateness p99 {f['send_late_p99_ms']:.1f} ms",
             f"p99.9 {f['send_late_p999_ms']:.1f} ms",
             f"skipped {f['skipped_late']:,} of {f['due']:,}"]  # fmt: skip
    if f.get("broker_late_p99_ms") is not None:
        parts.append(f"broker release lateness p99 {f['broker_late_p99_ms']:.1f} ms")
    if f.get("run_queue_wait") is not None:
        parts.append(f"CPU wait up to {f['run_queue_wait']:.0%}")
    if f.get("run_cpus") is not None:
        parts.append(f"the run used {f['run_cpus']:.1f} of {f['cpus']} CPUs")
    if f.get("foreign_cpu") is not None:
        parts.append(f"others {f['foreign_cpu']:.0%} of the CPU time")
    word = "ok" if doc["status"] == "valid" else "DISTURBED"
    return f"{word} ({', '.join(parts)})"


def disturbances(summaries: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Run (``label``) -> the reasons it was disturbed, for the disturbed runs only."""
    return {label(s): list(s["validity"]["reasons"]) for s in summaries if status(s) == "disturbed"}


def failures(summary: dict[str, Any]) -> list[str]:
    """The findings that keep the policy from being within the SLO or compared."""
    return [f.text for f in findings(summary) if f.fails_slo]


def conclusion(summaries: Sequence[dict[str, Any]]) -> str | None:
    """What the comparison shows, in one sentence per publisher order (runs are compared
    within their order); None when any run was disturbed (the figures of a starved
    machine have shown the opposite of the truth). A policy with a failing finding is
    outside the SLO, with the finding said, and its p99 is not ranked: the p99s compared
    are those of runs that served the whole workload on healthy brokers."""
    if not summaries or disturbances(summaries):
        return None
    orders = by_order(summaries)
    if len(orders) == 1:
        return _conclusion(summaries)
    return " ".join(f"{order.capitalize()} order: {_conclusion(g)}" for order, g in orders.items())


def _conclusion(summaries: Sequence[dict[str, Any]]) -> str:
    slo = summaries[0]["slo_p99_ms"]
    p99 = {s["policy"]: float(s["e2e_ms"]["p99"]) for s in summaries}
    failed = {s["policy"]: failures(s) for s in summaries}
    meet = [s["policy"].upper() for s in summaries if within_slo(s)]
    miss = [_named(s["policy"], failed[s["policy"]]) for s in summaries if not within_slo(s)]
    text = (
        f"Within the SLO (p99 ≤ {slo:g} ms): {', '.join(meet) or 'none'}; "
        f"outside it: {', '.join(miss) or 'none'}."
    )
    ranked = {p: v for p, v in p99.items() if not failed[p]}
    if len(ranked) > 1:
        best = min(ranked, key=lambda p: ranked[p])
        others = ", ".join(f"{p.upper()} {v:.1f} ms" for p, v in ranked.items() if p != best)
        text += f" Lowest p99: {best.upper()} {ranked[best]:.1f} ms ({others})."
    unranked = [p.upper() for p in p99 if failed[p]]
    if unranked and len(p99) > 1:
        text += f" Not compared by p99: {', '.join(unranked)}."
    return text


def srtm_gain(summaries: Sequence[dict[str, Any]]) -> float | None:
    """LB's p99 over SRTM's, within one publisher order: how many times lower SRTM's tail
    is. None without both runs, or when either was disturbed (nothing to conclude)."""
    runs = {s["policy"]: s for s in summaries}
    lb, srtm = runs.get("lb"), runs.get("srtm")
    if lb is None or srtm is None or disturbances([lb, srtm]):
        return None
    return float(lb["e2e_ms"]["p99"]) / float(srtm["e2e_ms"]["p99"])


def gain_lines(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Per publisher order, LB's and SRTM's p99 and brokers and what SRTM gains; said
    plainly when a run was disturbed instead."""
    lines = []
    for order, group in by_order(summaries).items():
        runs = {s["policy"]: s for s in group}
        if "lb" not in runs or "srtm" not in runs:
            continue
        lb, srtm = runs["lb"], runs["srtm"]
        gain = srtm_gain(group)
        figures = (
            f"LB p99 {lb['e2e_ms']['p99']:.1f} ms on {lb['brokers_used']} brokers, SRTM "
            f"{srtm['e2e_ms']['p99']:.1f} ms on {srtm['brokers_used']}"
        )
        if gain is None:
            said = "disturbed, no conclusion"
        elif gain >= 1:
            said = f"SRTM's p99 {gain:.1f}x lower"
        else:  # LB did better: said so, not as a gain below one
            said = f"SRTM's p99 {1 / gain:.1f}x higher, on {srtm['brokers_used']} brokers"
        lines.append(f"publishers in {order} order: {figures}: {said}")
    return lines


def _named(policy: str, why: list[str]) -> str:
    return policy.upper() + (f" ({'; '.join(why)})" if why else "")


def findings_lines(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """'policy: finding' for every finding of every run."""
    return [f"{label(s)}: {f.text}" for s in summaries for f in findings(s)]


def disturbed_note(summaries: Sequence[dict[str, Any]]) -> str | None:
    """Said instead of a conclusion: which runs were disturbed and why."""
    found = disturbances(summaries)
    if not found:
        return None
    lines = [
        f"No conclusion: the run{'s' if len(found) > 1 else ''} of "
        f"{', '.join(p.upper() for p in found)} "
        f"{'were' if len(found) > 1 else 'was'} disturbed by the machine, so the latencies "
        "show its CPU queue rather than the placement."
    ]
    for policy, reasons in found.items():
        lines += [f"  {policy}: {r}" for r in reasons]
    lines.append(RERUN)
    return "\n".join(lines)


def compact(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The comparison of runs in one publisher order as one JSON document: the order, per
    policy p50, p95, p99 (ms), brokers used, the groups each broker has members of,
    whether the run was disturbed (and why), whether it met the SLO, its findings and the
    figures they come from; the conclusion, or null if any run was disturbed; LB's p99
    over SRTM's (``srtm_gain``)."""
    orders = list(by_order(summaries))
    if len(orders) > 1:
        raise ValueError(f"one comparison per publisher order, got {', '.join(orders)}")
    found = disturbances(summaries)
    return {
        "scenario": summaries[0]["scenario"] if summaries else None,
        "publisher_order": orders[0] if orders else None,
        "slo_p99_ms": summaries[0]["slo_p99_ms"] if summaries else None,
        "analysis": engine(summaries),
        "disturbed": bool(found),
        "conclusion": conclusion(summaries),
        "srtm_gain": srtm_gain(summaries),
        "policies": {
            s["policy"]: {
                "p50_ms": s["e2e_ms"]["p50"],
                "p95_ms": s["e2e_ms"]["p95"],
                "p99_ms": s["e2e_ms"]["p99"],
                "brokers_used": s["brokers_used"],
                "groups_per_broker": s.get("groups_per_broker"),
                "token_share_tail": s["token_share_tail"],
                "published": s["accounting"]["published"],
                "delivered": s["accounting"]["delivered"],
                "validity": status(s),
                "disturbed_by": found.get(label(s), []),
                "within_slo": within_slo(s),
                "findings": [f.to_json() for f in findings(s)],
                "publishers": s.get("publishers"),
                "unplaced_publishers": s.get("unplaced_publishers"),
                "unrouted_messages": (s.get("emulator") or {}).get("unrouted", 0),
                "brokers_available": s.get("brokers_available"),
                "worst_broker": _worst_json(s),
            }
            for s in summaries
        },
    }


def _worst_json(summary: dict[str, Any]) -> dict[str, Any] | None:
    worst = validity.policy_figures(summary).worst_broker
    if worst is None:
        return None
    return {"broker": worst.broker, "messages": worst.messages, "p99_ms": worst.p99_ms}


def engine(summaries: Sequence[dict[str, Any]]) -> str:
    """Who computed the latency figures ("spark", "in-process (pandas)", or both)."""
    names = sorted({s.get("analysis", {}).get("engine", "?") for s in summaries})
    return " and ".join(names)


def plots(summaries: Sequence[dict[str, Any]], traces: Path, out: Path) -> list[Path]:
    """Latency CDFs per policy and per-broker p99, as PNG files in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s in summaries:
        _, sub = analysis.load(traces, s["run"])
        window = analysis.MeasuredWindow(s["window_start_ns"], s["window_end_ns"])
        x, y = analysis.cdf(analysis.e2e_ms(sub, window))
        ax.plot(x, y, label=f"{label(s)} (p99 {s['e2e_ms']['p99']:.1f} ms)")
    ax.axvline(summaries[0]["slo_p99_ms"], color="grey", linestyle="--", label="SLO (p99)")
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (ms)")
    ax.set_ylabel("share of messages")
    ax.set_title("Latency CDF per policy")
    ax.legend()
    ax.grid(True, alpha=0.3)
    cdf_png = out / "latency_cdf.png"
    fig.tight_layout()
    fig.savefig(cdf_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(1, len(summaries))
    for i, s in enumerate(summaries):
        brokers = sorted(s["per_broker"], key=int)
        xs = [int(b) + (i - (len(summaries) - 1) / 2) * width for b in brokers]
        ax.bar(xs, [s["per_broker"][b]["p99"] for b in brokers], width, label=label(s))
    ax.axhline(summaries[0]["slo_p99_ms"], color="grey", linestyle="--", label="SLO (p99)")
    ax.set_xlabel("broker")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("p99 per broker (a missing bar: the policy did not use it)")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    broker_png = out / "broker_p99.png"
    fig.tight_layout()
    fig.savefig(broker_png, dpi=110)
    plt.close(fig)
    return [cdf_png, broker_png]


def write_html(
    summaries: Sequence[dict[str, Any]], images: Sequence[Path], out: Path, scenario: Any
) -> Path:
    """``report.html`` beside the images: the scenario, the table, the plots."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows(summaries)
    )
    figures = "".join(
        f'<figure><img src="{html.escape(p.name)}" alt="{html.escape(p.stem)}"></figure>'
        for p in images
    )
    accounting = "".join(
        f"<li>{html.escape(label(s))}: published {s['accounting']['published']:,}, "
        f"delivered {s['accounting']['delivered']:,}, {html.escape(loss_text(s))}, "
        f"duplicates {s['accounting']['duplicates']}{html.escape(unsent_text(s))}</li>"
        for s in summaries
    )
    found = findings_lines(summaries)
    found_html = (
        "<h2>Findings</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in found) + "</ul>"
        if found
        else ""
    )
    note = disturbed_note(summaries)
    gains = "".join(f"<li>{html.escape(line)}</li>" for line in gain_lines(summaries))
    verdict = (
        '<p class="disturbed"><strong>Disturbed run.</strong> '
        + "<br>".join(html.escape(line) for line in note.splitlines())
        + "</p>"
        if note is not None
        else f"<p><strong>{html.escape(conclusion(summaries) or '')}</strong></p>"
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SRTM demo: {html.escape(scenario.name)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}
img{{max-width:100%}}
.disturbed{{background:#fee;border:2px solid #c00;padding:.6rem}}</style></head><body>
<h1>SRTM demo: {html.escape(scenario.name)}</h1>
<p>{html.escape(scenario.description)}</p>
<p><em>Scale:</em> {html.escape(scenario.scale)}</p>
<p>SLO: p99 &le; {scenario.slo_p99_ms:g} ms. Measured window: {summaries[0]["duration_s"]:g} s
per policy, after a warm-up in which the controller places (and, except for LB, fits) the
topic. {html.escape(LEGEND)}</p>
<p>Publishers handed to the placement policy in {html.escape(_orders_text(summaries))}.</p>
{verdict}
{f"<ul>{gains}</ul>" if gains else ""}
{found_html}
<table><tr>{head}</tr>{body}</table>
<p>Latency figures computed by: {html.escape(engine(summaries))}.</p>
<h2>Every message accounted for</h2><ul>{accounting}</ul>
{figures}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page)
    return path


def print_table(summaries: Sequence[dict[str, Any]], title: str, out: Console) -> None:
    """The comparison table, what its headings mean, the accounting and findings of each
    run, and the verdict."""
    table = Table(title=title)
    for heading, _, _ in COLUMNS:
        table.add_column(heading, justify="left" if heading == "policy" else "right")
    for row in rows(summaries):
        table.add_row(*row)
    out.print(table)
    out.print(LEGEND, style="dim")
    out.print(f"latency figures computed by: {engine(summaries)}", style="dim")
    for s in summaries:
        acc = s["accounting"]
        same = "=" if acc["published"] == acc["delivered"] and acc["lost"] == 0 else "≠"
        out.print(
            f"{label(s)}: published {acc['published']:,} {same} delivered "
            f"{acc['delivered']:,} ({loss_text(s)}, duplicates {acc['duplicates']}"
            f"{unsent_text(s)}); "
            f"{s['emulator']['skipped_late']:,} events skipped as over "
            f"{s['emulator']['max_late_ms']:g} ms late; measured window: "
            f"{checks_line(s)}",
            highlight=False,
        )
    for line in findings_lines(summaries):
        out.print(line, style="yellow", highlight=False, markup=False)
    _print_verdict(summaries, out)


def _print_verdict(summaries: Sequence[dict[str, Any]], out: Console) -> None:
    """The conclusion, or, when a run was disturbed, that and why instead."""
    note = disturbed_note(summaries)
    if note is not None:
        first, *rest = note.splitlines()
        out.print(f"[bold red]{first}[/bold red]", highlight=False)
        for line in rest:
            out.print(line, highlight=False, markup=False)
        return
    text = conclusion(summaries)
    if text and len(summaries) > 1:
        out.print(f"[bold]{text}[/bold]", highlight=False)
    for line in gain_lines(summaries):
        out.print(line, highlight=False)


def _orders_text(summaries: Sequence[dict[str, Any]]) -> str:
    """'block order', 'shuffled order', or 'block and shuffled order'."""
    return " and ".join(by_order(summaries)) + " order"
