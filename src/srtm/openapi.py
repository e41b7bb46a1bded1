"""Route rows and the OpenAPI 3.1 document generated from them, for both HTTP APIs.

A ``Route`` is one row of a server's route table (nsqd's http.go: method, path, handler)
with the documents the route takes and gives, so that the broker's
``srtm.broker.http.ROUTES`` and the controller's ``srtm.control.api.ROUTES`` build both the
app and its OpenAPI document, never written by hand. What differs between the two servers
(title, which requests need the token, the error document, what a query refuses) is passed
to ``document``. Only pydantic and the standard library: both servers import this.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from srtm.version import __version__

_REF = "#/components/schemas/{model}"
_PATH_PARAMETER = re.compile(r"\{(\w+)\}")
#: Both servers take the one cluster token.
_TOKEN = {"type": "http", "scheme": "bearer",
          "description": "the cluster token (--token, SRTM_TOKEN)"}  # fmt: skip
_UNAUTHORIZED = "E_UNAUTHORIZED: no or a wrong cluster token"


@dataclass(frozen=True)
class Route:
    """One route: ``method path -> handler``, and what it takes and answers. The handler's
    docstring is the operation's summary (first paragraph) and description (the rest)."""

    method: str
    path: str
    #: As the table holds it: a method of the handlers' class, not yet bound.
    handler: Callable[..., Awaitable[Any]]
    #: Its query parameters (path parameters are read from ``path``).
    query: type[BaseModel] | None = None
    #: Its body: a JSON document's model, or the media type of raw bytes.
    body: type[BaseModel] | str | None = None
    #: False where the body may be left out (a JSON body only).
    body_required: bool = True
    #: Its JSON answer's model, and/or the media type of a text answer.
    answer: type[BaseModel] | None = None
    text: str | None = None
    status: int = 200
    #: Refusals beyond the query's own and the token's: status -> what they say.
    errors: Mapping[int, str] = field(default_factory=dict)


class OpenApiDoc(BaseModel):
    """The OpenAPI 3.1 document of this API."""

    model_config = ConfigDict(frozen=True)

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]


def _no_refusals(query: type[BaseModel]) -> Mapping[int, str]:
    return {}


def document(
    routes: Iterable[Route],
    *,
    title: str,
    needs_token: Callable[[str, str], bool],
    error: type[BaseModel],
    query_refusals: Callable[[type[BaseModel]], Mapping[int, str]] = _no_refusals,
) -> OpenApiDoc:
    """The OpenAPI 3.1 document of ``routes``: one operation per route, named for its
    handler; schemas from the documents. ``needs_token(method, path)`` is the server's
    token rule, ``error`` its refusals' document, ``query_refusals`` what a query model
    refuses with (status -> what it says)."""
    routes = list(routes)
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(error, "serialization"): None}
    for r in routes:
        if isinstance(r.body, type):
            wanted[(r.body, "validation")] = None  # as it is read
        if r.answer is not None:
            wanted[(r.answer, "serialization")] = None  # as it is written
    refs, defs = models_json_schema(list(wanted), ref_template=_REF)
    paths: dict[str, Any] = {}
    for r in routes:
        errors = dict(r.errors)
        for status, says in (query_refusals(r.query) if r.query else {}).items():
            errors[status] = ", ".join(filter(None, [says, errors.get(status)]))
        token = needs_token(r.method, r.path)
        if token:
            errors[401] = _UNAUTHORIZED
        op = _operation(r, refs, errors, refs[(error, "serialization")])
        if token:
            op["security"] = [{"token": []}]
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return OpenApiDoc(
        openapi="3.1.0",
        info={"title": title, "version": __version__},
        paths=paths,
        components={"schemas": defs.get("$defs", {}), "securitySchemes": {"token": _TOKEN}},
    )


Refs = Mapping[tuple[Any, JsonSchemaMode], dict[str, Any]]


def _operation(
    r: Route, refs: Refs, errors: Mapping[int, str], refusal: dict[str, Any]
) -> dict[str, Any]:
    doc = inspect.getdoc(r.handler) or r.handler.__name__
    summary, _, description = doc.partition("\n\n")
    op: dict[str, Any] = {"operationId": r.handler.__name__, "summary": " ".join(summary.split())}
    if description:
        op["description"] = " ".join(description.split())
    params = [_path_parameter(name) for name in _PATH_PARAMETER.findall(r.path)]
    params += _query_parameters(r.query) if r.query is not None else []
    if params:
        op["parameters"] = params
    if isinstance(r.body, str):
        op["requestBody"] = {"required": r.body_required, "content": {r.body: {}}}
    elif r.body is not None:
        json = {"application/json": {"schema": refs[(r.body, "validation")]}}
        op["requestBody"] = {"required": r.body_required, "content": json}
    content: dict[str, Any] = {}
    if r.answer is not None:
        content["application/json"] = {"schema": refs[(r.answer, "serialization")]}
    if r.text is not None:
        content[r.text] = {"schema": {"type": "string"}}
    responses: dict[str, Any] = {str(r.status): {"description": "OK", "content": content}}
    for status, says in sorted(errors.items()):
        responses[str(status)] = {"description": says,
                                  "content": {"application/json": {"schema": refusal}}}  # fmt: skip
    op["responses"] = responses
    return op


def _path_parameter(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _query_parameters(query: type[BaseModel]) -> list[dict[str, Any]]:
    js = query.model_json_schema(mode="validation")
    required = set(js.get("required", ()))
    out = []
    for name, prop in js["properties"].items():
        prop = _present(prop)
        description = prop.pop("description", None)
        param = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if description:
            param["description"] = description
        out.append(param)
    return out


def _present(prop: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema: an optional one is absent, never null."""
    prop = {k: v for k, v in prop.items() if k != "title"}
    options = prop.pop("anyOf", None)
    if options is not None:
        kept = [o for o in options if o != {"type": "null"}]
        prop = kept[0] | prop if len(kept) == 1 else {"anyOf": kept} | prop
    if prop.get("default", ...) is None:
        del prop["default"]
    return prop
