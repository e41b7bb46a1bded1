"""The OpenAPI 3.1 document of the controller's HTTP API (served at /openapi.json),
written from the route table (``srtm.control.api.ROUTES``) and the documents' JSON
schemas, so that it lists every route the app serves and no other."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from srtm.control.documents import Error

#: What a request may do without the cluster token: read.
READ_METHODS = ("GET", "HEAD")


def needs_token(method: str) -> bool:
    """Every request but a read needs ``Authorization: Bearer <token>`` (when the
    controller has one)."""
    return method not in READ_METHODS


@dataclass(frozen=True, slots=True)
class Route:
    """One route: the handler that serves it, the documents it takes and answers with.
    The handler's docstring (first paragraph) is the operation's summary."""

    method: str
    path: str
    handler: Callable[..., Awaitable[Any]]
    body: type[BaseModel] | None = None
    #: None: a JSON object of no declared shape (or, with ``media``, plain text).
    answer: type[BaseModel] | None = None
    status: int = 200
    #: Required query parameters: (name, description).
    query: tuple[tuple[str, str], ...] = ()
    #: Statuses it refuses with (each an ``Error``); 401 is added where a token is needed.
    errors: tuple[int, ...] = ()
    media: str = "application/json"

    @property
    def needs_token(self) -> bool:
        return needs_token(self.method)

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(self.handler) or ""
        return " ".join(doc.split("\n\n")[0].split())


#: What each refusal means, for every route that can answer it.
_REFUSALS = {
    400: "A malformed request: the message names the field",
    401: 'No or a wrong cluster token: {"message": "E_UNAUTHORIZED"}',
    404: "No such topic, broker or publisher",
    409: "The topic exists, or the broker id is registered at another address and up",
    413: "More publishers than the controller's --max-publishers",
    503: "No broker up, or the publisher is unassigned (capacity is short)",
}
_PATH_PARAMETER = re.compile(r"\{(\w+)\}")


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``: bodies, answers and errors as JSON schemas
    under ``components/schemas``."""
    wanted: set[tuple[type[BaseModel], JsonSchemaMode]] = {(Error, "serialization")}
    for r in routes:
        if r.body is not None:
            wanted.add((r.body, "validation"))
        if r.answer is not None:
            wanted.add((r.answer, "serialization"))
    refs, defs = models_json_schema(
        sorted(wanted, key=lambda m: (m[0].__name__, m[1])),
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "SRTM controller", "version": "0.1.0"},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer",
                          "description": "the cluster token (--token, SRTM_TOKEN)"},
            },
        },
    }  # fmt: skip


Refs = Mapping[tuple[Any, JsonSchemaMode], dict[str, Any]]


def _operation(r: Route, refs: Refs) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": r.handler.__name__, "summary": r.summary}
    params = [_parameter(name, "path") for name in _PATH_PARAMETER.findall(r.path)]
    params += [_parameter(name, "query", text) for name, text in r.query]
    if params:
        op["parameters"] = params
    if r.body is not None:
        op["requestBody"] = {"required": True, "content": _json(refs[(r.body, "validation")])}
    if r.answer is not None:
        answer = {r.media: {"schema": refs[(r.answer, "serialization")]}}
    else:
        answer = {r.media: {"schema": {"type": "object" if "json" in r.media else "string"}}}
    responses: dict[str, Any] = {str(r.status): {"description": "OK", "content": answer}}
    error = _json(refs[(Error, "serialization")])
    for status in sorted({*r.errors, *([401] if r.needs_token else [])}):
        responses[str(status)] = {"description": _REFUSALS[status], "content": error}
    op["responses"] = responses
    if r.needs_token:
        op["security"] = [{"token": []}]
    return op


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _parameter(name: str, where: str, description: str | None = None) -> dict[str, Any]:
    param = {"name": name, "in": where, "required": True, "schema": {"type": "string"}}
    return param if description is None else param | {"description": description}
