"""What the controller's handler classes (``srtm.control.api``, ``srtm.control.topics_api``,
``srtm.control.lookupd``) share: the process they ask (``Service``) and how they read a
request, refused as a ``ControlError`` naming the field."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel

from srtm.control.documents import describe
from srtm.control.validate import ControlError
from srtm.httpkit import query_model
from srtm.jsondoc import parse_object

if TYPE_CHECKING:
    from srtm.control.actions import Action
    from srtm.control.documents import FitSettings
    from srtm.control.state import Controller
    from srtm.sim.model import BrokerModel

Q = TypeVar("Q", bound=BaseModel)

#: Request bodies above this are decoded on a thread, not on the event loop.
_THREADED_JSON_BYTES = 256 << 10


class Service(Protocol):
    """What the handlers ask of the controller process (``ControllerService``)."""

    ctrl: Controller

    def execute(self, actions: list[Action]) -> None: ...

    def save_state(self) -> asyncio.Future[None]: ...

    def save_topic(self, name: str) -> asyncio.Future[None]: ...

    def start_fitting(self, topic: str, fit: FitSettings, model: BrokerModel | None) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def repair(self, actions: list[Action]) -> None: ...

    def utility_doc(self) -> dict[str, Any]: ...

    def in_place(self, topic: str) -> bool: ...


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
