"""What the controller's handler classes (``srtm.control.api``, ``srtm.control.topics_api``,
``srtm.control.lookupd``) share: the process they ask (``Service``) and how they read a
request, refused as a ``ControlError`` naming the field."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel

from srtm.control.documents import describe
from srtm.control.etcd_store import Fenced
from srtm.control.validate import ControlError
from srtm.httpkit import HttpError, error_response, query_model
from srtm.jsondoc import parse_object

if TYPE_CHECKING:
    from srtm.control.actions import Action
    from srtm.control.documents import FitSettings
    from srtm.control.leadership import Leadership
    from srtm.control.state import Controller
    from srtm.sim.model import BrokerModel

Q = TypeVar("Q", bound=BaseModel)

#: Request bodies above this are decoded on a thread, not on the event loop.
_THREADED_JSON_BYTES = 256 << 10


class Service(Protocol):
    """What the handlers ask of the controller process (``ControllerService``)."""

    ctrl: Controller
    leadership: Leadership

    def execute(self, actions: list[Action]) -> asyncio.Future[None] | None: ...

    def acting(self) -> bool: ...

    def save_state(self) -> asyncio.Future[None]: ...

    def save_topic(self, name: str) -> asyncio.Future[None]: ...

    def start_fitting(self, topic: str, fit: FitSettings, model: BrokerModel | None) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def repair(self, actions: list[Action]) -> None: ...

    def utility_doc(self) -> dict[str, Any]: ...

    def in_place(self, topic: str) -> bool: ...

    def next_order(self) -> tuple[int, int]: ...


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object (refused naming the line and column where it stops being
    JSON); a big one is decoded off the event loop."""
    body = await request.read()
    try:
        if len(body) > _THREADED_JSON_BYTES:
            return await asyncio.to_thread(parse_object, body)
        return parse_object(body)
    except ValueError as exc:
        raise ControlError(400, str(exc)) from None


def read_query(request: web.Request, model: type[Q]) -> Q:
    """The query as ``model``: each required parameter given and not empty; numbers
    parsed from their text (finite only)."""
    values = {}
    for key, info in model.model_fields.items():
        value = request.query.get(key)
        if not value:
            if not info.is_required():
                continue
            raise ControlError(400, f"missing query parameter {key!r}")
        values[key] = value
    return query_model(model, values, lambda exc: ControlError(400, describe(exc)))


async def saved(*writes: Awaitable[None] | None) -> None:
    """Wait until the change's rows are written: a handler acknowledges only what a
    restarted (or the next) controller will have. Not written: 503, ``NOT_LEADER`` when
    another controller leads now (the write was fenced), else ``NOT_SAVED``."""
    for write in writes:
        if write is None:
            continue
        try:
            await write
        except Fenced as e:
            raise HttpError(503, "NOT_LEADER", f"not saved: another controller leads ({e})") from e
        except Exception as e:
            detail = f"the change was not saved (the store failed: {e}); it may be lost"
            raise HttpError(503, "NOT_SAVED", detail) from e


def to_leader(service: Service, path_qs: str) -> web.Response:
    """What a controller that does not act answers a write: 307 to the leader it knows
    of, or 503 ``NO_LEADER`` while there is none (plan changes wait for one)."""
    leader = service.leadership.leader
    if leader is not None and leader != service.leadership.me:
        return web.Response(status=307, headers={"Location": leader.url(path_qs)})
    return error_response(
        503, "NO_LEADER", "no controller leads now: plan changes wait for a leader; try again"
    )
