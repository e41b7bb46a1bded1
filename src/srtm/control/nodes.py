"""Idle cores before new hosts: with ``--nodes URL[,URL...]`` (``srtm node``'s
``--node-address``), a broker the elastic loop spawns is first asked of a node that runs
fewer processes than it may (``POST /node/brokers?id=ID``); only when no node has an idle
core does the provisioner behind (``--provision-cmd``, else local child brokers) start a
new host's broker.

``NodeRoom`` and ``pick_node`` are the pure decision: the node with the most idle cores
(ties: the first URL given), none when every node is full. ``NodeProvisioner`` is the
edge: it reads each node's ``GET /node`` at every start (a node that does not answer is
left out, logged), and remembers the brokers it added so that a despawn gives the core
back to the node (``DELETE /node/brokers?id=ID``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from srtm.control.options import ControllerOptions
from srtm.control.provision import (
    CommandProvisioner,
    LocalProvisioner,
    Provisioner,
    ProvisionError,
)

__all__ = [
    "NodeProvisioner",
    "NodeRoom",
    "node_room",
    "node_urls",
    "pick_node",
    "provisioner_for",
]

log = logging.getLogger("srtm.controller.nodes")


def node_urls(value: str) -> tuple[str, ...]:
    """``--nodes URL[,URL...]``: ValueError naming the flag and the bad part."""
    urls: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        split = urlsplit(part)
        try:
            split.port  # noqa: B018 - parsing the port is the check
        except ValueError:
            raise ValueError(f"--nodes: {part!r} has a bad port") from None
        if split.scheme not in ("http", "https") or not split.hostname or split.query:
            raise ValueError(f"--nodes: {part!r} is not an http:// or https:// base URL")
        if part.rstrip("/") not in urls:
            urls.append(part.rstrip("/"))
    return tuple(urls)


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """What one node said of itself: its host, the processes it runs and may run."""

    url: str
    host: str
    processes: int
    max_processes: int

    @property
    def idle(self) -> int:
        """Cores the node may still give a process."""
        return max(0, self.max_processes - self.processes)


def node_room(url: str, doc: object) -> NodeRoom:
    """A node's ``GET /node`` document as a ``NodeRoom``; ValueError naming the field."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{url}/node: not a JSON object")
    host = doc.get("host")
    if not isinstance(host, str) or not host:
        raise ValueError(f"{url}/node: 'host' must be a non-empty string, got {host!r}")
    counts = []
    for key in ("processes", "max_processes"):
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{url}/node: {key!r} must be a count, got {value!r}")
        counts.append(value)
    return NodeRoom(url, host, counts[0], counts[1])


def pick_node(rooms: Sequence[NodeRoom]) -> NodeRoom | None:
    """The node to add a process to: the most idle cores, ties to the first given (the
    operator's order); None when none has an idle core (then: a new host)."""
    best: NodeRoom | None = None
    for room in rooms:
        if room.idle > 0 and (best is None or room.idle > best.idle):
            best = room
    return best


class NodeProvisioner:
    """A ``Provisioner`` that adds a process to a node with idle cores (``pick_node``)
    before it hands the start to ``new_host`` (None: no new host; the start fails)."""

    def __init__(
        self,
        urls: Sequence[str],
        token: str | None,
        new_host: Provisioner | None,
        *,
        timeout_s: float = 60.0,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.new_host = new_host
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        #: Brokers added to a node here -> that node's URL.
        self.added: dict[str, str] = {}
        #: Starts handed to ``new_host``, in order (for /info and tests).
        self.new_hosts: list[str] = []

    async def _rooms(self, session: aiohttp.ClientSession) -> list[NodeRoom]:
        async def one(url: str) -> NodeRoom | None:
            try:
                async with session.get(f"{url}/node") as resp:
                    resp.raise_for_status()
                    return node_room(url, await resp.json())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("node %s left out: %s", url, exc)
                return None

        return [r for r in await asyncio.gather(*(one(u) for u in self.urls)) if r is not None]

    def _session(self) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        return aiohttp.ClientSession(timeout=timeout, headers=self._headers)

    async def start(self, broker_id: str) -> None:
        async with self._session() as session:
            rooms = await self._rooms(session)
            while (room := pick_node(rooms)) is not None:
                if await self._add(session, room, broker_id):
                    self.added[broker_id] = room.url
                    log.info("broker %s added to node %s (host %s, %d of %d processes)",
                             broker_id, room.url, room.host, room.processes + 1,
                             room.max_processes)  # fmt: skip
                    return
                rooms = [r for r in rooms if r is not room]  # full meanwhile: the next one
        if self.new_host is None:
            raise ProvisionError(f"broker {broker_id}: no node has an idle core")
        self.new_hosts.append(broker_id)
        await self.new_host.start(broker_id)

    async def _add(self, session: aiohttp.ClientSession, room: NodeRoom, broker_id: str) -> bool:
        """Whether ``room``'s node started ``broker_id`` (False: it was full by then);
        ProvisionError for any other refusal."""
        url = f"{room.url}/node/brokers"
        try:
            async with session.post(url, params={"id": broker_id}) as resp:
                if resp.status == 409:
                    return False
                if resp.status != 200:
                    text = (await resp.text())[:500]
                    raise ProvisionError(f"{url}?id={broker_id}: {resp.status} {text}")
                return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProvisionError(f"{url}?id={broker_id}: {exc}") from exc

    async def stop(self, broker_id: str) -> None:
        url = self.added.get(broker_id)
        if url is None:
            if self.new_host is None:
                raise ProvisionError(f"broker {broker_id} was not added to a node here")
            await self.new_host.stop(broker_id)
            return
        async with self._session() as session:
            try:
                async with session.delete(f"{url}/node/brokers", params={"id": broker_id}) as r:
                    if r.status not in (200, 404):  # 404: gone already, as wanted
                        raise ProvisionError(f"{url}: stop of {broker_id}: {r.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ProvisionError(f"{url}: stop of {broker_id}: {exc}") from exc
        del self.added[broker_id]
        log.info("broker %s removed from node %s", broker_id, url)

    def can_stop(self, broker_id: str) -> bool:
        if broker_id in self.added:
            return True
        return self.new_host is not None and self.new_host.can_stop(broker_id)

    async def close(self) -> None:
        # A node's processes belong to the node (they outlive the controller, as a
        # node's first processes do); what the new-host provisioner started is its own.
        if self.new_host is not None:
            await self.new_host.close()


def provisioner_for(opts: ControllerOptions, controller_url: str) -> Provisioner:
    """The controller's provisioner: new hosts by ``--provision-cmd``, else local child
    brokers registering at ``controller_url``; with ``--nodes``, a node's idle cores first."""
    new_host: Provisioner
    if opts.provision_cmd:
        new_host = CommandProvisioner(opts.provision_cmd, timeout_s=opts.provision_timeout_s)
    else:
        new_host = LocalProvisioner(
            controller_url,
            opts.spawn_dir or opts.db.with_name(opts.db.name + "-brokers"),
            token=opts.token,
            mcap=opts.spawn_mcap,
            timeout_s=opts.provision_timeout_s,
        )
    if not opts.nodes:
        return new_host
    urls = node_urls(opts.nodes)
    return NodeProvisioner(urls, opts.token, new_host, timeout_s=opts.provision_timeout_s)
