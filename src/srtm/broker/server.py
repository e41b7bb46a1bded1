"""Run a broker as a process: TCP and HTTP on one loop, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import sys
from collections.abc import Callable

from srtm.broker.broker import Broker
from srtm.broker.http import serve_http
from srtm.broker.options import BrokerOptions
from srtm.broker.timer import set_nice
from srtm.controllers import Controllers

log = logging.getLogger("srtm.broker")
#: fds a broker needs beside its clients: listeners, HTTP, timers, a few queue files.
_FD_ROOM = 256
#: How long a stop waits for the reporter's deregistration (s).
REPORTER_STOP_S = 3.0


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (each client is an fd, each durable
    queue one or two): a distribution's default soft 1,024 is hit long before memory.
    Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard


async def serve(options: BrokerOptions, on_ready: Callable[[Broker], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT; then persist what is owed to ``data_dir`` and return."""
    # --controller URL[,URL...] is checked before anything starts: a bad URL is an error.
    controllers = (
        Controllers(options.controller, what="--controller", log=log)
        if options.controller
        else None
    )
    if options.nice:
        set_nice(options.nice)  # first: every thread the broker starts inherits it
    fds = raise_fd_limit()
    if options.max_connections and fds < options.max_connections + _FD_ROOM:
        log.warning(
            "open-files limit %d leaves less than %d fds beside --max-connections %d: "
            "past it, new connections wait unaccepted (EMFILE) instead of getting "
            "E_TOO_MANY_CONNECTIONS",
            fds,
            _FD_ROOM,
            options.max_connections,
        )
    broker = Broker(options)
    await broker.start()
    runner, _ = await serve_http(broker)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reporter = None
    if controllers is not None:
        from srtm.broker.reporter import report_loop

        reporter = asyncio.create_task(
            report_loop(broker, controllers, options.mcap, options.report_interval_s)
        )
    liveness = None
    if broker.shares.liveness is not None:
        from srtm.broker.liveness import LivenessKeeper

        liveness = LivenessKeeper(broker, broker.shares.liveness)
        liveness.start()
    # Imports and start-up leave ~10^5 long-lived objects; a full collection walks them
    # all (tens of ms, stalling releases). Frozen, they are never traversed again.
    gc.collect()
    gc.freeze()
    if on_ready is not None:
        on_ready(broker)
    try:
        await stop.wait()
    finally:
        broker.shares.stop()  # before deregistering: see ``Shares.stop``
        if reporter is not None:
            reporter.cancel()
            # Deregistering takes a second at most; past a few, the stop goes on without.
            done, _ = await asyncio.wait({reporter}, timeout=REPORTER_STOP_S)
            if not done:
                log.warning("the reporter did not stop within %.0f s", REPORTER_STOP_S)
            elif not reporter.cancelled() and reporter.exception() is not None:
                log.error("the reporter failed", exc_info=reporter.exception())
        if liveness is not None:  # after deregistering: the key then goes at once
            await liveness.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        await broker.stop()


def run(options: BrokerOptions, on_ready: Callable[[Broker], None] | None = None) -> None:
    """``serve`` on uvloop when it is installed, plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(options, on_ready))
        return
    with contextlib.suppress(KeyboardInterrupt):
        if sys.version_info >= (3, 12):
            uvloop.run(serve(options, on_ready))
        else:
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            asyncio.run(serve(options, on_ready))
