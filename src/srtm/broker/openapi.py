"""The broker HTTP API's route rows and the OpenAPI 3.1 document generated from them.

A ``BrokerRoute`` is one row of ``srtm.broker.http.ROUTES`` (nsqd's http.go table: method, path,
handler) with the documents the route takes and gives, so that the document served at
``/srtm/openapi.json`` is built from the same table the app is, never written by hand.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from srtm import __version__
from srtm.broker.documents import ErrorDoc, OpenApiDoc, Query

#: A handler as the table holds it: a method of the handlers' class, not yet bound.
HandlerMethod = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]

#: Methods that change nothing: open even when the broker has a token.
READS = frozenset({"GET", "HEAD", "OPTIONS"})

_REF = "#/components/schemas/{model}"


def needs_token(method: str, path: str) -> bool:
    """Mutating ``/srtm/*`` requests need the token; nsqd's own endpoints stay open, as in
    nsqd, for NSQ's tools. (The auth middleware and the document both ask this.)"""
    return path.startswith("/srtm/") and method not in READS


@dataclass(frozen=True)
class BrokerRoute:
    """One route: ``method path -> handler``, and what it takes and answers."""

    method: str
    path: str
    handler: HandlerMethod
    #: Its query parameters (validated by the model, or by hand where noted there).
    query: type[Query] | None = None
    #: Its body: a JSON document's model, or the media type of raw bytes.
    body: type[BaseModel] | str | None = None
    #: Its JSON answer's model, and/or the media type of a text answer.
    answer: type[BaseModel] | None = None
    text: str | None = None
    #: Error answers ``{"message": CODE}`` beyond the query's own: status -> codes.
    errors: Mapping[int, str] = field(default_factory=dict)


def openapi_document(routes: Iterable[BrokerRoute], title: str) -> OpenApiDoc:
    """The OpenAPI 3.1 document of ``routes``: one operation per route, named for its
    handler; query parameters from the query models, schemas from the documents."""
    routes = list(routes)
    models: list[type[BaseModel]] = [ErrorDoc]
    for r in routes:
        models += [m for m in (r.answer, r.body) if isinstance(m, type) and m not in models]
    modes = [(m, _mode(m, routes)) for m in models]
    refs, defs = models_json_schema(modes, ref_template=_REF)
    schema = {m: refs[(m, mode)] for m, mode in modes}
    paths: dict[str, Any] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, schema)
    return OpenApiDoc(
        openapi="3.1.0",
        info={"title": title, "version": __version__},
        paths=paths,
        components={
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    )


def _mode(model: type[BaseModel], routes: list[BrokerRoute]) -> JsonSchemaMode:
    """Bodies are described as they are read, answers as they are written."""
    return "validation" if any(r.body is model for r in routes) else "serialization"


def _operation(r: BrokerRoute, schema: Mapping[type[BaseModel], Any]) -> dict[str, Any]:
    doc = (r.handler.__doc__ or r.handler.__name__).strip()
    summary, _, description = doc.partition("\n\n")
    op: dict[str, Any] = {"operationId": r.handler.__name__, "summary": " ".join(summary.split())}
    if description:
        op["description"] = " ".join(description.split())
    if r.query is not None:
        op["parameters"] = _parameters(r.query)
    if isinstance(r.body, str):
        op["requestBody"] = {"required": True, "content": {r.body: {}}}
    elif r.body is not None:
        json = {"application/json": {"schema": schema[r.body]}}
        op["requestBody"] = {"required": False, "content": json}
    content: dict[str, Any] = {}
    if r.answer is not None:
        content["application/json"] = {"schema": schema[r.answer]}
    if r.text is not None:
        content[r.text] = {"schema": {"type": "string"}}
    responses: dict[str, Any] = {"200": {"description": "Done", "content": content}}
    errors = dict(r.errors)
    if r.query is not None and r.query.refuses:
        errors[400] = ", ".join(filter(None, [_query_codes(r.query), errors.get(400)]))
    if needs_token(r.method, r.path):
        op["security"] = [{"token": []}]
        errors[401] = "E_UNAUTHORIZED"
    refusal = {"application/json": {"schema": schema[ErrorDoc]}}
    for status, codes in sorted(errors.items()):
        responses[str(status)] = {"description": codes, "content": refusal}
    op["responses"] = responses
    return op


def _parameters(query: type[Query]) -> list[dict[str, Any]]:
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


def _query_codes(query: type[Query]) -> str:
    """The codes a query's refusals carry: MISSING_ARG_<NAME> (required ones), INVALID_<NAME>."""
    codes = []
    for name, info in query.model_fields.items():
        if info.is_required() and name not in query.absent_is_invalid:
            codes.append(f"MISSING_ARG_{name.upper()}")
        codes.append(f"INVALID_{name.upper()}")
    return ", ".join(codes)
