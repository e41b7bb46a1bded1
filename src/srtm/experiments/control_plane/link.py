"""Cuttable links: how one broker is partitioned without root (no network namespaces).

Each broker's links to etcd go through ``CutLink``s (TCP, ``127.0.0.1:A`` →
``127.0.0.1:B``), its links to the controllers through ``CutHttpLink``s (HTTP, so that a
standby's 307 naming the leader's address is rewritten to the leader's link: the broker
never learns a way around the cut); the broker is given its links' addresses instead of
the servers'. ``cut`` makes every link of one broker stall silently, as a partition does:
nothing more is read or forwarded either way, and a connection or request made meanwhile
is accepted but answered nothing (no reset, no refusal: the broker sees time-outs).
``heal`` lets what waited through. The broker's clients (publishers, subscribers, the
poller) reach it directly and are not cut; the controllers' pushes to it are not cut
either (the broker advertises one HTTP address): a controller pushes nothing to a broker
whose live key is gone, and a broker past its lease refuses pushes (409 LEASE_EXPIRED).

The links run on their own event loop in a thread (``CutLinks``), so that a busy run loop
never delays a broker's keepalives.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp import web

T = TypeVar("T")
_CHUNK = 65_536


class _Switch:
    """What both forwarders share: the port they listen on, and the switch ``cut`` turns
    off (what passes then waits) and ``heal`` turns on again."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()


class CutLink(_Switch):
    """One forwarder: listens on 127.0.0.1 (ephemeral port), each connection piped to
    ``target``; open until ``cut``. Lives on the ``CutLinks`` loop."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__()
        self.target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()  # cut: accepted, then silence
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return  # the server is down: the client sees the connection close
            self._writers.add(up_writer)
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                self._writers.discard(up_writer)
                up_writer.close()
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._open.wait()
                data = await src.read(_CHUNK)
                if not data:
                    break
                await self._open.wait()  # cut while the read waited: hold it
                dst.write(data)
                await dst.drain()
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        self._open.set()  # let waiting pipes see their closed streams and end


#: Request headers an CutHttpLink passes on (hop-by-hop ones are the link's own).
_PASSED = ("authorization", "content-type", "accept", "user-agent")
_HOP_BY_HOP = ("content-length", "transfer-encoding", "connection", "keep-alive", "date", "server")


class CutHttpLink(_Switch):
    """One HTTP forwarder to the controller at ``target`` (``host:port``): each request
    sent on as it came; a redirect's ``Location`` naming a controller that has a link in
    ``rewrite`` (``host:port`` -> the link's) names that link instead."""

    def __init__(self, target: str, rewrite: dict[str, str]) -> None:
        super().__init__()
        self.target, self.rewrite = target, rewrite
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False

    async def listen(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # A request still held by a cut link at the end is not waited for.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # aiohttp gives the bound port no other way
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        await self._open.wait()  # cut: the request waits, answered nothing
        if self._closing:
            raise web.HTTPServiceUnavailable()
        try:
            body = await request.read()
        except (ConnectionError, aiohttp.ClientPayloadError):
            return web.Response(status=400)  # the client gave up meanwhile: no one to answer
        headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
        headers.update({k: v for k, v in request.headers.items() if k.lower().startswith("x-")})
        assert self._session is not None
        try:
            async with self._session.request(
                request.method, f"http://{self.target}{request.path_qs}", data=body,
                headers=headers, allow_redirects=False,
            ) as r:  # fmt: skip
                answer = await r.read()
                out = {k: v for k, v in r.headers.items() if k.lower() not in _HOP_BY_HOP}
        except (aiohttp.ClientError, TimeoutError):
            await self._open.wait()
            # The controller is down: 503, which a client passes over for the next
            # controller as it would a refused connection.
            raise web.HTTPServiceUnavailable() from None
        await self._open.wait()  # cut while the request was out: hold its answer
        if self._closing:
            raise web.HTTPServiceUnavailable()
        if "Location" in out:
            out["Location"] = self._rewritten(out["Location"])
        return web.Response(status=r.status, body=answer, headers=out)

    def _rewritten(self, location: str) -> str:
        parts = urlsplit(location)
        link = self.rewrite.get(parts.netloc)
        return urlunsplit(parts._replace(netloc=link)) if link else location

    async def close(self) -> None:
        self._closing = True
        self._open.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


class CutLinks:
    """The links of one run, in groups (one per broker: cut together), on an event loop of
    their own in a daemon thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.groups: dict[str, list[CutLink | CutHttpLink]] = {}
        #: Per group: a controller's ``host:port`` -> its CutHttpLink's, for redirects.
        self.rewrite: dict[str, dict[str, str]] = {}

    @property
    def native_id(self) -> int | None:
        """The links' thread's id (for its scheduling priority)."""
        return self._thread.native_id

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def add(self, group: str, host: str, port: int) -> CutLink:
        """A new TCP link of ``group`` to ``host:port``, listening when this returns."""

        async def make() -> CutLink:
            link = CutLink((host, port))
            await link.listen()
            return link

        link = self._call(make())
        self.groups.setdefault(group, []).append(link)
        return link

    def add_http(self, group: str, target: str) -> CutHttpLink:
        """A new HTTP link of ``group`` to the controller at ``target`` (``host:port``)."""
        rewrite = self.rewrite.setdefault(group, {})

        async def make() -> CutHttpLink:
            link = CutHttpLink(target, rewrite)
            await link.listen()
            return link

        link = self._call(make())
        rewrite[target] = link.address
        self.groups.setdefault(group, []).append(link)
        return link

    def cut(self, group: str) -> None:
        for link in self.groups.get(group, []):
            self._loop.call_soon_threadsafe(link.cut)

    def heal(self, group: str) -> None:
        for link in self.groups.get(group, []):
            self._loop.call_soon_threadsafe(link.heal)

    def close(self) -> None:
        async def close_all() -> None:
            for links in self.groups.values():
                for link in links:
                    await link.close()
            # The pipes of connections still open end here, not with the loop.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
