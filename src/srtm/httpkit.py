"""What the two HTTP servers, the broker's (``srtm.broker.http``) and the controller's
(``srtm.control.api``), do alike around their handlers (aiohttp both).

Refusals are ``{"message": ...}`` (with ``detail`` where there is one), answered by one
middleware; the cluster token is checked by one middleware; query parameters are read into
pydantic models; a route table (``srtm.openapi.Route``) is bound to the app. Where the two
servers differ (which requests need the token, how a bad query is refused, the ``Allow``
header's spelling, whether a 401 carries a challenge) each passes its own rule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel, ValidationError

from srtm.openapi import Route
from srtm.security import E_UNAUTHORIZED, bearer_matches

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
E = TypeVar("E", bound=Exception)

#: RFC 6750's challenge, for a server that sends one with its 401.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="srtm"'}


class HttpError(Exception):
    """A refusal: ``status``, and ``{"message": code}`` with ``detail`` where there is one
    (``code`` is nsqd's code, or the controller's words)."""

    def __init__(self, status: int, code: str, detail: str = "") -> None:
        super().__init__(code)
        self.status, self.code, self.detail = status, code, detail


def error_response(
    status: int, code: str, detail: str = "", headers: Mapping[str, str] | None = None
) -> web.Response:
    """A refusal's answer: ``{"message": code}``, and ``"detail"`` when there is one."""
    doc = {"message": code, "detail": detail} if detail else {"message": code}
    return web.json_response(doc, status=status, headers=headers)


def error_middleware(
    own: type[E], translate: Callable[[E], HttpError], allow_separator: str
) -> Middleware:
    """Answers what a handler raises: an ``HttpError``; the server's ``own`` exceptions,
    as ``translate`` makes them one; and aiohttp's 404 and 405 as nsqd's ``NOT_FOUND`` and
    ``METHOD_NOT_ALLOWED``, the ``Allow`` header's methods joined by ``allow_separator``."""

    @web.middleware
    async def refuse(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except HttpError as err:
            return error_response(err.status, err.code, err.detail)
        except web.HTTPMethodNotAllowed as err:
            allow = allow_separator.join(sorted(err.allowed_methods))
            return error_response(405, "METHOD_NOT_ALLOWED", headers={"Allow": allow})
        except web.HTTPNotFound:
            return error_response(404, "NOT_FOUND")
        except own as exc:
            refusal = translate(exc)
            return error_response(refusal.status, refusal.code, refusal.detail)

    return refuse


def has_token(request: web.Request, token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (constant-time)."""
    return bearer_matches(request.headers.get("Authorization"), token)


def unauthorized(detail: str = "", challenge: bool = False) -> web.Response:
    """401 ``E_UNAUTHORIZED``, with RFC 6750's challenge where the server sends one."""
    return error_response(401, E_UNAUTHORIZED, detail, headers=CHALLENGE if challenge else None)


def token_required(
    token: str | None, needs_token: Callable[[str, str], bool], challenge: bool
) -> Middleware:
    """Refuses (401) a request ``needs_token(method, path)`` names that comes without the
    cluster token; without a token, lets everything through."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            token is not None
            and needs_token(request.method, request.path)
            and not has_token(request, token)
        ):
            return unauthorized(challenge=challenge)
        return await handler(request)

    return auth


def query_model(
    model: type[M], values: Mapping[str, str], refuse: Callable[[ValidationError], Exception]
) -> M:
    """Query parameters as ``model`` (numbers parsed from their text), or the server's
    refusal of the first fault, ``refuse(err)``, raised."""
    try:
        return model.model_validate(values, strict=False)
    except ValidationError as err:
        raise refuse(err) from None


def arg(query: Mapping[str, str], key: str, detail: str = "") -> str:
    """nsqd's and nsqlookupd's query argument: absent is 400 ``MISSING_ARG_<KEY>`` (empty is
    given)."""
    value = query.get(key)
    if value is None:
        raise HttpError(400, f"MISSING_ARG_{key.upper()}", detail)
    return value


def ok() -> web.Response:
    """nsqd's and nsqlookupd's "OK" (/ping, /pub, /mpub)."""
    return web.Response(text="OK")


def empty() -> web.Response:
    """nsqd's and nsqlookupd's answer to a topic or channel action: 200, an empty body."""
    return web.Response()  # no body, so aiohttp adds no Content-Type either


def add_routes(app: web.Application, routes: Iterable[Route], *handlers: object) -> None:
    """Serves each route by its handler, bound to the one of ``handlers`` whose class has
    it; a GET route answers HEAD as GET does."""
    for route in routes:
        name = route.handler.__name__
        owner = next(h for h in handlers if getattr(type(h), name, None) is route.handler)
        handler: Handler = getattr(owner, name)
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # and HEAD
        else:
            app.router.add_route(route.method, route.path, handler)


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``: ``HOST:PORT``, an IPv6 host in brackets (how nsqlookupd
    names a node, and how the controller parses a broker's address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: The header a leading controller sends its epoch in (``srtm.control.leadership``).
EPOCH_HEADER = "X-SRTM-Epoch"


class EpochFence:
    """The highest controller epoch a broker has seen: a request with a lower one comes
    from a deposed leader (resumed after SIGSTOP, cut off from etcd) and is refused. A
    request without the header (a controller on SQLite, a tool) is not a leader's."""

    def __init__(self) -> None:
        self.highest = 0

    def admits(self, header: str | None) -> bool:
        """Whether a request with this header may go on (raises HttpError 400 when it is
        not an epoch)."""
        if header is None:
            return True
        try:
            epoch = int(header)
        except ValueError:
            raise HttpError(400, "BAD_EPOCH", f"{EPOCH_HEADER}: {header[:40]!r}") from None
        if epoch < self.highest:
            return False
        self.highest = epoch
        return True


#: The header a controller numbers its orders to brokers in (``push_order``).
ORDER_HEADER = "X-SRTM-Order"


def push_order(request: web.Request) -> tuple[int, int] | None:
    """A controller's order as ``(epoch, number)``, comparable with the others: its
    ``X-SRTM-Epoch`` (0 without: one controller, on SQLite) and ``X-SRTM-Order``, which
    each controller numbers upwards. None without the number (a tool's request: not in
    any order). HttpError 400 naming the header that is not a number."""
    number = request.headers.get(ORDER_HEADER)
    if number is None:
        return None
    epoch = request.headers.get(EPOCH_HEADER, "0")
    try:
        return int(epoch), int(number)
    except ValueError:
        detail = f"{ORDER_HEADER}: {number[:40]!r}, {EPOCH_HEADER}: {epoch[:40]!r}"
        raise HttpError(400, "BAD_ORDER", detail) from None


def epoch_fenced(fence: EpochFence) -> Middleware:
    """409 ``STALE_LEADER`` to a request whose epoch is below the highest seen."""

    @web.middleware
    async def fenced(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get(EPOCH_HEADER)
        if not fence.admits(header):
            detail = f"epoch {header} < {fence.highest}: another controller leads now"
            return error_response(409, "STALE_LEADER", detail)
        return await handler(request)

    return fenced
