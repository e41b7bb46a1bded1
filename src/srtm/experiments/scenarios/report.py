"""Comparisons of live runs: one row per policy (the terminal's table), PNG plots and an
HTML page."""

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
    ("p50 ms", "e2e_ms.p50", "{:.1f}"),
    ("p95 ms", "e2e_ms.p95", "{:.1f}"),
    ("p99 ms", "e2e_ms.p99", "{:.1f}"),
    ("SLO", "slo_met", "{}"),
    ("run", "validity", "{}"),
    ("brokers", "brokers_used", "{}"),
    ("placed", "placed", "{}"),
    ("tokens", "token_share_tail", "{:.0%}"),
    ("rounds", "fitting_rounds", "{}"),
    ("published", "accounting.published", "{:,}"),
    ("delivered", "accounting.delivered", "{:,}"),
)
#: What the short headings mean (printed under the table).
LEGEND = (
    "SLO: p99 within the SLO, on every broker, with every publisher served (a finding under "
    "the table says why not); brokers: brokers that carried the topic; placed: publishers "
    "the final plan gave a broker, of the topic's; tokens: share of the "
    "slowest 1 % of messages' latency spent waiting for tokens (the DRL penalty); rounds: "
    "measurement rounds of online fitting (LB is not fitted); run: whether the run's own "
    "checks (send and release lateness, events skipped, CPU waits) found the machine "
    "quiet enough (ok) or not (DISTURBED: its figures are shown, its SLO is not judged)."
)
#: Said instead of a conclusion when a run was disturbed.
RERUN = "Re-run on a quieter machine (close other programs, or run fewer things at once)."


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
    """Policy -> the reasons its run was disturbed, for the disturbed runs only."""
    return {
        s["policy"]: list(s["validity"]["reasons"]) for s in summaries if status(s) == "disturbed"
    }


def failures(summary: dict[str, Any]) -> list[str]:
    """The findings that keep the policy from being within the SLO or compared."""
    return [f.text for f in findings(summary) if f.fails_slo]


def conclusion(summaries: Sequence[dict[str, Any]]) -> str | None:
    """What the comparison shows, in one sentence; None when any run was disturbed (the
    figures of a starved machine have shown the opposite of the truth). A policy with a
    failing finding is outside the SLO, with the finding said, and its p99 is not ranked:
    the p99s compared are those of runs that served the whole workload on healthy brokers."""
    if not summaries or disturbances(summaries):
        return None
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


def _named(policy: str, why: list[str]) -> str:
    return policy.upper() + (f" ({'; '.join(why)})" if why else "")


def findings_lines(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """'policy: finding' for every finding of every run."""
    return [f"{s['policy']}: {f.text}" for s in summaries for f in findings(s)]


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
    """The comparison as one JSON document: per policy p50, p95, p99 (ms), brokers used,
    whether the run was disturbed (and why), whether it met the SLO, its findings and the
    figures they come from; the conclusion, or null if any run was disturbed."""
    found = disturbances(summaries)
    return {
        "scenario": summaries[0]["scenario"] if summaries else None,
        "slo_p99_ms": summaries[0]["slo_p99_ms"] if summaries else None,
        "analysis": engine(summaries),
        "disturbed": bool(found),
        "conclusion": conclusion(summaries),
        "policies": {
            s["policy"]: {
                "p50_ms": s["e2e_ms"]["p50"],
                "p95_ms": s["e2e_ms"]["p95"],
                "p99_ms": s["e2e_ms"]["p99"],
                "brokers_used": s["brokers_used"],
                "token_share_tail": s["token_share_tail"],
                "published": s["accounting"]["published"],
                "delivered": s["accounting"]["delivered"],
                "validity": status(s),
                "disturbed_by": found.get(s["policy"], []),
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
        ax.plot(x, y, label=f"{s['policy']} (p99 {s['e2e_ms']['p99']:.1f} ms)")
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
        ax.bar(xs, [s["per_broker"][b]["p99"] for b in brokers], width, label=s["policy"])
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
        f"<li>{html.escape(s['policy'])}: published {s['accounting']['published']:,}, "
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
{verdict}
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
            f"{s['policy']}: published {acc['published']:,} {same} delivered "
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
