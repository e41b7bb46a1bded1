"""``srtm node --node-address``: the node's own small HTTP API, through which the
controller's elastic loop adds a process to a host with idle cores before it asks for a
new host (``srtm.control.nodes``).

- ``GET /node``: the host id, the processes it runs and may run (``--max-brokers``), each
  one's id and addresses;
- ``POST /node/brokers?id=ID``: one more process, broker ``ID``; 409 ``NODE_FULL`` at
  ``--max-brokers``, 400 naming a bad or taken id;
- ``DELETE /node/brokers?id=ID``: stop that process for good (404 if the node has none).

Every request but ``GET /node`` needs the cluster token (``SRTM_TOKEN``, the one every
process of the node is given); without one the node's API binds loopback only.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web

from srtm.broker.node import NodeFull, NodeSupervisor
from srtm.httpkit import HttpError, arg, error_middleware, token_required

__all__ = ["NodeApi", "serve_node", "start_node_api"]


def _refusal(exc: ValueError) -> HttpError:
    return HttpError(400, "BAD_REQUEST", str(exc))


def _broker_id(request: web.Request) -> int:
    text = arg(request.query, "id", "the broker id of the process, 0..4095")
    try:
        return int(text)
    except ValueError:
        raise HttpError(400, "INVALID_ID", f"id must be an integer, got {text!r}") from None


class NodeApi:
    """The handlers, over one ``NodeSupervisor``."""

    def __init__(self, node: NodeSupervisor) -> None:
        self.node = node

    async def get_node(self, request: web.Request) -> web.Response:
        return web.json_response(self.node.to_json())

    async def add_broker(self, request: web.Request) -> web.Response:
        broker_id = _broker_id(request)
        try:
            child = await self.node.add(broker_id)
        except NodeFull as exc:
            raise HttpError(409, "NODE_FULL", str(exc)) from None
        except RuntimeError as exc:  # it did not start: its reason
            raise HttpError(500, "START_FAILED", str(exc)) from None
        rows = self.node.to_json()["brokers"]
        assert isinstance(rows, list)
        return web.json_response(next(r for r in rows if r["id"] == child.plan.broker_id))

    async def remove_broker(self, request: web.Request) -> web.Response:
        broker_id = _broker_id(request)
        try:
            code = await self.node.remove(broker_id)
        except KeyError:
            raise HttpError(404, "NOT_FOUND", f"broker {broker_id} does not run here") from None
        return web.json_response({"id": broker_id, "exit_code": code})


def _needs_token(method: str, path: str) -> bool:
    return method != "GET"


async def start_node_api(
    node: NodeSupervisor, host: str, port: int, token: str | None
) -> tuple[web.AppRunner, tuple[str, int]]:
    """Serve ``node``'s API on ``host:port`` (0: any); the runner (``cleanup`` stops it)
    and the address it got."""
    app = web.Application(
        middlewares=[
            error_middleware(ValueError, _refusal, ", "),
            token_required(token, _needs_token, challenge=False),
        ]
    )
    api = NodeApi(node)
    app.router.add_get("/node", api.get_node)
    app.router.add_post("/node/brokers", api.add_broker)
    app.router.add_delete("/node/brokers", api.remove_broker)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, (host, int(runner.addresses[0][1]))


async def serve_node(
    node: NodeSupervisor,
    ready: Callable[[NodeSupervisor], None],
    api: tuple[str, int] | None = None,
    token: str | None = None,
) -> None:
    """Start ``node`` (and its HTTP API on ``api``, ``srtm.broker.node_http``), call
    ``ready``, keep it running until SIGTERM or SIGINT, then stop every process."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stopping.set)
    await node.start()
    runner = None
    try:
        if api is not None:
            runner, node.api_address = await start_node_api(node, *api, token)
        ready(node)
        await node.run()
    finally:
        if runner is not None:
            await runner.cleanup()
        await node.stop()
