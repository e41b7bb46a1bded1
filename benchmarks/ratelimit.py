"""Our token bucket beside other Python rate limiters: call cost, pacing accuracy, trace speed.

Run with ``.venv/bin/python benchmarks/ratelimit.py`` (``--help`` for options). Prints one
table; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from srtm.analysis import required_burst, token_delays
from srtm.quantiles import quantiles
from srtm.ratelimit import NS_PER_S, OK, Rtlim, RtlimMode, TokenBucket

TryFn = Callable[[], object]
#: Per-call ns, one sample per repetition.
Sampler = Callable[["Config"], list[float]]
#: (rate, burst, duration_s) -> (start_ns, release times in ns)
Trace = tuple[int, list[int]]
Pacer = Callable[[float, int, float], Trace]

#: A rate no benchmark run can exhaust, so every non-blocking call succeeds.
HUGE = 10**9  # the largest rate srtm.ratelimit accepts (check_bucket)
PACE_RATES = (1_000, 50_000)
PACE_BURST = 1
#: Calls between clock reads in the timing loops: the read costs < 1 ns per call.
CHUNK = 200
KEY = "bench"

TARGET_TRY_NS = 500.0
TARGET_BLOCKING_PCT = {1_000: 0.2, 50_000: 1.0}
TARGET_ASYNC_PCT = 2.0
TARGET_DELAYS_MPS = 50e6

DELAYS_RATE = 1e5
DELAYS_BURST = 20
DELAYS_LOAD = 0.8


@dataclass(frozen=True, slots=True)
class Config:
    duration_s: float
    rep_s: float
    reps: int
    contended_rep_s: float
    contended_reps: int
    arrivals: int
    delay_reps: int


def make_config(duration: float | None, quick: bool) -> Config:
    if quick:
        return Config(0.25 if duration is None else duration, 0.02, 3, 0.05, 3, 1_000_000, 2)
    return Config(2.0 if duration is None else duration, 0.05, 7, 0.2, 5, 10_000_000, 3)


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pacing:
    releases: int
    contract: float
    error_pct: float
    late_p50_us: float
    late_p99_us: float
    burst_seen: float


@dataclass(slots=True)
class Row:
    name: str
    note: str = ""  # footnote mark shown after the name
    try_ns: float | None = None
    contended_ns: float | None = None
    try_samples: list[float] = field(default_factory=list)
    contended_samples: list[float] = field(default_factory=list)
    pacing: dict[int, Pacing] = field(default_factory=dict)
    delays_mps: float | None = None
    status: str | None = None  # "not installed", shown in place of numbers


# -- timing primitives ---------------------------------------------------------------------


@contextmanager
def gc_paused() -> Iterator[None]:
    # Collections triggered by the libraries' own allocations would land on whichever
    # call happens to cross the threshold; timeit pauses gc for the same reason.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def per_call_ns(fn: TryFn, seconds: float) -> float:
    """Wall ns per call of ``fn`` over about ``seconds`` (a fixed time, not a fixed count)."""
    clock = time.perf_counter_ns
    calls = 0
    start = now = clock()
    deadline = start + int(seconds * NS_PER_S)
    while now < deadline:
        for _ in repeat(None, CHUNK):
            fn()
        calls += CHUNK
        now = clock()
    return (now - start) / calls


@dataclass(frozen=True, slots=True)
class TrySetup:
    call: TryFn
    ok: Callable[[object], bool] = bool


TryFactory = Callable[[], AbstractContextManager[TrySetup]]


def checked(setup: TrySetup, name: str) -> TryFn:
    if not all(setup.ok(setup.call()) for _ in range(100)):
        raise RuntimeError(f"{name}: a non-blocking call was denied at a rate of {HUGE}/s")
    return setup.call


def time_alone(make: TryFactory, cfg: Config) -> list[float]:
    samples = []
    for _ in range(cfg.reps):
        # A fresh limiter per repetition: some keep one entry per call (see footnotes).
        with make() as setup, gc_paused():
            samples.append(per_call_ns(checked(setup, "try"), cfg.rep_s))
    return samples


def hammer(fn: TryFn, started: threading.Event, stop: threading.Event) -> None:
    started.set()
    while not stop.is_set():
        for _ in repeat(None, CHUNK):
            fn()


def time_contended(make: TryFactory, cfg: Config) -> list[float]:
    samples = []
    for _ in range(cfg.contended_reps):
        with make() as setup, gc_paused():
            fn = checked(setup, "try")
            started, stop = threading.Event(), threading.Event()
            other = threading.Thread(target=hammer, args=(fn, started, stop), daemon=True)
            other.start()
            started.wait()
            try:
                samples.append(per_call_ns(fn, cfg.contended_rep_s))
            finally:
                stop.set()
                other.join()
    return samples


def try_samplers(make: TryFactory) -> tuple[Sampler, Sampler]:
    return partial(time_alone, make), partial(time_contended, make)


# -- pacing --------------------------------------------------------------------------------


def pace_blocking(acquire: TryFn, duration_s: float) -> Trace:
    clock = time.monotonic_ns
    releases: list[int] = []
    append = releases.append
    start = clock()
    end = start + int(duration_s * NS_PER_S)
    while True:
        acquire()
        t = clock()
        if t > end:
            return start, releases
        append(t)


def pace_polling(try_acquire: Callable[[], bool], duration_s: float) -> Trace:
    def spin_until_granted() -> None:
        while not try_acquire():
            pass

    return pace_blocking(spin_until_granted, duration_s)


async def pace_async(acquire: Callable[[], Awaitable[object]], duration_s: float) -> Trace:
    clock = time.monotonic_ns
    releases: list[int] = []
    start = clock()
    end = start + int(duration_s * NS_PER_S)
    while True:
        await acquire()
        t = clock()
        if t > end:
            return start, releases
        releases.append(t)


def pacing_stats(trace: Trace, rate: float, burst: int) -> Pacing:
    start, releases = trace
    times = np.asarray(releases, dtype=np.int64)
    # Up to the last release rather than the loop's end: a release due exactly at the
    # end, observed a hair later, would otherwise count as a missed token.
    elapsed_s = (int(times[-1]) - start) / NS_PER_S if times.size else 0.0
    contract = burst + rate * elapsed_s
    ideal = start + np.arange(times.size) * (NS_PER_S / rate)
    late_us = (times - ideal) / 1e3
    late = quantiles(late_us, (0.5, 0.99))
    seen = required_burst(times, rate, 1.0) if times.size else float("nan")
    return Pacing(
        releases=int(times.size),
        contract=contract,
        error_pct=100 * (times.size - contract) / contract,
        late_p50_us=late["p50"],
        late_p99_us=late["p99"],
        burst_seen=seen,
    )


# -- our limiters --------------------------------------------------------------------------


@contextmanager
def srtm_bucket_try() -> Iterator[TrySetup]:
    yield TrySetup(TokenBucket(HUGE, HUGE).try_acquire)


@contextmanager
def srtm_rtlim_try() -> Iterator[TrySetup]:
    rtlim = Rtlim(NS_PER_S, HUGE)
    yield TrySetup(partial(rtlim.take, 1, RtlimMode.NON_BLOCK), lambda r: r == OK)


def srtm_bucket_pace(rate: float, burst: int, duration_s: float) -> Trace:
    return pace_blocking(TokenBucket(rate, burst).acquire, duration_s)


def srtm_bucket_pace_async(rate: float, burst: int, duration_s: float) -> Trace:
    return asyncio.run(pace_async(TokenBucket(rate, burst).acquire_async, duration_s))


def srtm_rtlim_pace(mode: RtlimMode, rate: float, burst: int, duration_s: float) -> Trace:
    rtlim = Rtlim(round(burst * NS_PER_S / rate), burst)
    return pace_blocking(partial(rtlim.take, 1, mode), duration_s)


def srtm_delays(cfg: Config) -> float:
    rng = np.random.default_rng(20240611)
    gaps_ns = rng.exponential(NS_PER_S / (DELAYS_LOAD * DELAYS_RATE), cfg.arrivals)
    arrivals = np.cumsum(gaps_ns).astype(np.int64)
    samples = []
    for _ in range(cfg.delay_reps):
        t0 = time.perf_counter()
        token_delays(arrivals, DELAYS_RATE, DELAYS_BURST)
        samples.append(cfg.arrivals / (time.perf_counter() - t0))
    return statistics.median(samples)


# -- other libraries (imported lazily so a missing one costs only its row) ------------------


def aiolimiter_try(cfg: Config) -> list[float]:
    from aiolimiter import AsyncLimiter

    async def one_rep() -> float:
        limiter = AsyncLimiter(HUGE, 1)
        if not limiter.has_capacity():
            raise RuntimeError("aiolimiter: no capacity at a huge rate")
        clock = time.perf_counter_ns
        calls = 0
        start = now = clock()
        deadline = start + int(cfg.rep_s * NS_PER_S)
        while now < deadline:
            for _ in repeat(None, CHUNK):
                # acquire() returns without suspending when there is capacity, so this is
                # the closest it has to a non-blocking try.
                if limiter.has_capacity():
                    await limiter.acquire()
            calls += CHUNK
            now = clock()
        return (now - start) / calls

    with gc_paused():
        return [asyncio.run(one_rep()) for _ in range(cfg.reps)]


def aiolimiter_pace(rate: float, burst: int, duration_s: float) -> Trace:
    from aiolimiter import AsyncLimiter

    # max_rate is both the bucket size and the amount leaked per time_period.
    return asyncio.run(pace_async(AsyncLimiter(burst, burst / rate).acquire, duration_s))


@contextmanager
def pyrate_try() -> Iterator[TrySetup]:
    from pyrate_limiter import Duration, Limiter, Rate

    limiter = Limiter(Rate(HUGE, Duration.SECOND))
    try:
        yield TrySetup(partial(limiter.try_acquire, KEY, blocking=False))
    finally:
        # Only flags its leaker thread; that exits at its next wake-up (within 10 s).
        limiter.close()


def pyrate_pace(rate: float, burst: int, duration_s: float) -> Trace:
    from pyrate_limiter import Duration, Limiter, Rate, StateBucket
    from pyrate_limiter import TokenBucket as PyrateTokenBucket

    bucket = StateBucket([Rate(int(rate), Duration.SECOND, burst=burst)], PyrateTokenBucket())
    limiter = Limiter(bucket, buffer_ms=0)
    try:
        return pace_blocking(partial(limiter.try_acquire, KEY), duration_s)
    finally:
        limiter.close()


@contextmanager
def limits_try() -> Iterator[TrySetup]:
    from limits import parse
    from limits.storage import MemoryStorage
    from limits.strategies import MovingWindowRateLimiter

    storage = MemoryStorage()
    try:
        limiter = MovingWindowRateLimiter(storage)
        yield TrySetup(partial(limiter.hit, parse(f"{HUGE} per 1 second")))
    finally:
        storage.reset()
        storage.timer.cancel()  # its expiry timer is not a daemon thread


def limits_pace(rate: float, burst: int, duration_s: float) -> Trace:
    from limits import parse
    from limits.storage import MemoryStorage
    from limits.strategies import MovingWindowRateLimiter

    # One second is its finest window, so this is a burst of `rate`, not `burst`.
    storage = MemoryStorage()
    try:
        limiter = MovingWindowRateLimiter(storage)
        return pace_polling(partial(limiter.hit, parse(f"{int(rate)} per 1 second")), duration_s)
    finally:
        storage.reset()
        storage.timer.cancel()


@contextmanager
def token_bucket_try() -> Iterator[TrySetup]:
    import token_bucket

    limiter = token_bucket.Limiter(HUGE, HUGE, token_bucket.MemoryStorage())
    yield TrySetup(partial(limiter.consume, KEY))


def token_bucket_pace(rate: float, burst: int, duration_s: float) -> Trace:
    import token_bucket

    limiter = token_bucket.Limiter(rate, burst, token_bucket.MemoryStorage())
    return pace_polling(partial(limiter.consume, KEY), duration_s)


# -- the line-up ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    note: str = ""
    alone: Sampler | None = None
    contended: Sampler | None = None
    pace: Pacer | None = None
    delays: Callable[[Config], float] | None = None


BUCKET = "srtm TokenBucket"
BUCKET_ASYNC = "srtm TokenBucket (async)"
RTLIM_SPIN = "srtm Rtlim BLOCK_SPIN"
RTLIM_SLEEP = "srtm Rtlim BLOCK_SLEEP"


def contenders() -> list[Contender]:
    rtlim_spin = partial(srtm_rtlim_pace, RtlimMode.BLOCK_SPIN)
    rtlim_sleep = partial(srtm_rtlim_pace, RtlimMode.BLOCK_SLEEP)
    return [
        Contender(BUCKET, "", *try_samplers(srtm_bucket_try), srtm_bucket_pace, srtm_delays),
        Contender(BUCKET_ASYNC, pace=srtm_bucket_pace_async),
        Contender(RTLIM_SPIN, "⁶", *try_samplers(srtm_rtlim_try), rtlim_spin),
        Contender(RTLIM_SLEEP, "⁶", pace=rtlim_sleep),
        Contender("aiolimiter", "²", aiolimiter_try, None, aiolimiter_pace),
        Contender("pyrate-limiter", "³", *try_samplers(pyrate_try), pyrate_pace),
        Contender("limits", "⁴", *try_samplers(limits_try), limits_pace),
        Contender("token-bucket", "⁵", *try_samplers(token_bucket_try), token_bucket_pace),
    ]


def measure(contender: Contender, cfg: Config, log: Console) -> Row:
    row = Row(contender.name, contender.note)
    log.log(f"measuring {contender.name}")
    try:
        if contender.alone:
            row.try_samples = contender.alone(cfg)
            row.try_ns = statistics.median(row.try_samples)
        if contender.contended:
            row.contended_samples = contender.contended(cfg)
            row.contended_ns = statistics.median(row.contended_samples)
        if contender.pace:
            for rate in PACE_RATES:
                trace = contender.pace(rate, PACE_BURST, cfg.duration_s)
                row.pacing[rate] = pacing_stats(trace, rate, PACE_BURST)
        if contender.delays:
            row.delays_mps = contender.delays(cfg)
    except ImportError:
        row.status = "not installed"
    return row


# -- the machine -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Machine:
    """What this machine lets any Python limiter achieve, to read the table against."""

    clock_call_ns: float
    sleep_overshoot_us: tuple[float, float, float]  # p50, p99, max
    spin_stall_pct: dict[int, float]


def clock_call_ns(cfg: Config) -> float:
    with gc_paused():
        return statistics.median(per_call_ns(time.monotonic_ns, cfg.rep_s) for _ in range(cfg.reps))


def sleep_overshoot_us(sleeps: int = 300, seconds: float = 0.0008) -> tuple[float, float, float]:
    clock = time.monotonic_ns
    over = []
    for _ in range(sleeps):
        t0 = clock()
        time.sleep(seconds)
        over.append((clock() - t0) / 1e3 - seconds * 1e6)
    q = quantiles(over, (0.5, 0.99))
    return q["p50"], q["p99"], max(over)


def spin_stall_pct(seconds: float) -> dict[int, float]:
    """Per pacing rate r, the share of a bare clock-reading spin lost in gaps beyond 1/r.

    A burst-1 bucket holds one token, so nothing can make up for a stall longer than 1/r:
    this is the floor for any limiter's pacing error here.
    """
    clock = time.monotonic_ns
    periods = {rate: NS_PER_S // rate for rate in PACE_RATES}
    shortest = min(periods.values())
    long_gaps = []
    start = prev = clock()
    end = start + int(seconds * NS_PER_S)
    while prev < end:
        now = clock()
        if now - prev > shortest:
            long_gaps.append(now - prev)
        prev = now
    return {
        rate: 100 * sum(g - period for g in long_gaps if g > period) / (prev - start)
        for rate, period in periods.items()
    }


def measure_machine(cfg: Config) -> Machine:
    return Machine(clock_call_ns(cfg), sleep_overshoot_us(), spin_stall_pct(cfg.duration_s))


# -- report --------------------------------------------------------------------------------

DASH = "—"


def fmt(value: float | None, spec: str) -> str:
    return DASH if value is None else format(value, spec)


def pacing_cells(p: Pacing | None) -> list[str]:
    if p is None:
        return [DASH] * 3
    late = f"{p.late_p50_us:,.0f} / {p.late_p99_us:,.0f}"
    return [f"{p.error_pct:+.2f}", late, f"{p.burst_seen:.3g}"]


def build_table(rows: list[Row], cfg: Config) -> Table:
    table = Table(
        title=f"Rate limiters, one run ({platform.python_implementation()} "
        f"{platform.python_version()}, {cfg.duration_s:g} s pacing)"
    )
    table.add_column("limiter")
    table.add_column("try ns ¹", justify="right")
    table.add_column("try ns, 2 thr ¹", justify="right")
    for rate in PACE_RATES:
        label = f"{rate // 1000}k/s"
        table.add_column(f"{label} err % ⁷", justify="right")
        table.add_column(f"{label} late p50 / p99 µs", justify="right")
        table.add_column(f"{label} b seen", justify="right")
    table.add_column("token_delays M msg/s", justify="right")
    for row in rows:
        label = f"{row.name} {row.note}".rstrip()
        if row.status:
            table.add_row(label, row.status, *[""] * (len(table.columns) - 2))
            continue
        pace = [cell for rate in PACE_RATES for cell in pacing_cells(row.pacing.get(rate))]
        delays = None if row.delays_mps is None else row.delays_mps / 1e6
        table.add_row(
            label,
            fmt(row.try_ns, ",.0f"),
            fmt(row.contended_ns, ",.0f"),
            *pace,
            fmt(delays, ",.1f"),
        )
    return table


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def target_lines(rows: list[Row]) -> list[str]:
    by_name = {row.name: row for row in rows}
    bucket = by_name[BUCKET]
    lines = []
    for row in (bucket, by_name[RTLIM_SPIN]):
        if row.try_ns is not None and row.contended_ns is not None:
            lines.append(
                f"{row.name} try_acquire ≤ {TARGET_TRY_NS:.0f} ns: alone {row.try_ns:,.0f} ns "
                f"{verdict(row.try_ns <= TARGET_TRY_NS)}; 2 threads {row.contended_ns:,.0f} ns "
                f"{verdict(row.contended_ns <= TARGET_TRY_NS)} (per call in one thread: under "
                "the GIL at least 2× alone)"
            )
    for row in (bucket, by_name[RTLIM_SPIN], by_name[RTLIM_SLEEP]):
        for rate, limit in TARGET_BLOCKING_PCT.items():
            if (p := row.pacing.get(rate)) is not None:
                lines.append(
                    f"{row.name} blocking |err| at {rate:,}/s ≤ {limit:g} %: "
                    f"{p.error_pct:+.3f} % {verdict(abs(p.error_pct) <= limit)}"
                )
    if (p := by_name[BUCKET_ASYNC].pacing.get(1_000)) is not None:
        lines.append(
            f"{BUCKET_ASYNC} |err| at 1,000/s ≤ {TARGET_ASYNC_PCT:g} %: "
            f"{p.error_pct:+.3f} % {verdict(abs(p.error_pct) <= TARGET_ASYNC_PCT)}"
        )
    if bucket.delays_mps is not None:
        lines.append(
            f"token_delays ≥ {TARGET_DELAYS_MPS / 1e6:.0f} M msg/s: "
            f"{bucket.delays_mps / 1e6:,.1f} M msg/s "
            f"{verdict(bucket.delays_mps >= TARGET_DELAYS_MPS)}"
        )
    return lines


def machine_lines(machine: Machine, ours_ns: float | None) -> list[str]:
    anchor = machine.clock_call_ns
    ratio = f"; srtm TokenBucket.try_acquire = {ours_ns / anchor:.1f}× that" if ours_ns else ""
    p50, p99, worst = machine.sleep_overshoot_us
    floors = " / ".join(
        f"{pct:.2f} % (gaps > {1e6 / rate:g} µs)" for rate, pct in machine.spin_stall_pct.items()
    )
    return [
        f"anchor: time.monotonic_ns() costs {anchor:.1f} ns per call{ratio}",
        f"machine: time.sleep(0.8 ms) overshoots p50 {p50:,.0f} / p99 {p99:,.0f} / max "
        f"{worst:,.0f} µs; a bare clock spin loses {floors}, the floor for |err| at "
        + " / ".join(f"{rate:,}/s" for rate in machine.spin_stall_pct),
    ]


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


LIBRARIES = ("aiolimiter", "pyrate-limiter", "limits", "token-bucket")


def footnotes(cfg: Config) -> list[str]:
    return [
        f"¹ wall ns per call over {cfg.rep_s * 1e3:g} ms repetitions (median of {cfg.reps}; "
        f"2 thr: {cfg.contended_rep_s * 1e3:g} ms × {cfg.contended_reps}), fresh limiter at "
        f"{HUGE:.0e}/s each, gc paused, loop included (as for the anchor). 2 thr: a second "
        "thread calls the same limiter non-stop; time per call in the measuring thread, GIL "
        "turns included.",
        "² has_capacity() then await acquire() inside one coroutine (no sync try exists; "
        "acquire does not suspend when there is capacity); asyncio-only, so no 2-thread "
        "figure. Paced by await acquire() on AsyncLimiter(1, 1/r), timers on the loop.",
        "³ try: Limiter(Rate(1e9/s)).try_acquire(name, blocking=False), default "
        "InMemoryBucket (a sliding-window log). Paced by blocking try_acquire on "
        "StateBucket(TokenBucket(), burst=1) with buffer_ms=0: the default log with "
        "Rate(1, 1 ms) gives 500/s and buffer_ms=50 sleeps ≥ 50 ms per denial. Its clock is "
        "whole milliseconds, so at b=1 it admits at most one per ms.",
        "⁴ MovingWindowRateLimiter(MemoryStorage()).hit(); its finest window is 1 s, so it "
        "is paced as 'r per 1 second' (a burst of r, not 1) by polling hit() — there is no "
        "blocking call. Each hit is inserted at the front of a list, so hit() slows as hits "
        "accumulate in the window.",
        "⁵ Limiter(r, 1, MemoryStorage()).consume(key), paced by polling (no blocking call); "
        "its storage takes no lock.",
        "⁶ Rtlim(refill_interval_ns=1e9/r, amount=1); try: take(1, NON_BLOCK).",
        f"⁷ rate r, burst 1, from a full bucket, acquiring as fast as allowed for "
        f"{cfg.duration_s:g} s, blocking calls unless noted. Release time = monotonic_ns() "
        "read as the call returns (every row, ours too, not the reservation's time). "
        "err = (releases − c) / c, c = 1 + r·T, T = start to last release; lateness of "
        "release k = its time − (start + k/r); b seen = least burst with which the observed "
        "releases conform to (r, b) (srtm.analysis.required_burst at quantile 1): bursts "
        "that err hides.",
        "versions: " + ", ".join(f"{lib} {version(lib)}" for lib in LIBRARIES),
    ]


def write_json(path: Path, rows: list[Row], cfg: Config, machine: Machine) -> None:
    doc = {
        "python": sys.version,
        "platform": platform.platform(),
        "config": asdict(cfg),
        "machine": asdict(machine),
        "versions": {lib: version(lib) for lib in LIBRARIES},
        "rows": [asdict(row) for row in rows],
    }
    path.write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n")


app = typer.Typer(add_completion=False)


@app.command()
def main(
    duration: Annotated[
        float | None,
        typer.Option(help="Pacing seconds per limiter and rate (default 2; 0.25 with --quick)."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke run: short repetitions, 1 M arrivals.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the results to this JSON file.")
    ] = None,
) -> None:
    """Compare srtm's TokenBucket and Rtlim with aiolimiter, pyrate-limiter, limits and
    token-bucket: try_acquire cost, pacing accuracy at 1,000/s and 50,000/s, token_delays speed.
    """
    cfg = make_config(duration, quick)
    console = Console(width=max(Console().width, 200), stderr=False)
    log = Console(stderr=True, log_path=False)
    machine = measure_machine(cfg)
    with Progress(console=log, transient=True) as progress:
        rows = [measure(c, cfg, log) for c in progress.track(contenders(), description="limiters")]
    console.print(build_table(rows, cfg))
    for line in target_lines(rows):
        console.print("target: " + line, highlight=False)
    for line in machine_lines(machine, rows[0].try_ns):
        console.print(line, highlight=False)
    for note in footnotes(cfg):
        console.print(note, highlight=False)
    if json_path is not None:
        write_json(json_path, rows, cfg, machine)


if __name__ == "__main__":
    app()
