"""The OpenAPI 3.1 document of the controller's SRTM endpoints (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from srtm.placement import POLICIES
from srtm.version import __version__

_ERROR = {
    "description": "Refused; the message names the field or the reason",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_UNAUTHORIZED = {
    "description": 'No or a wrong cluster token: {"message": "E_UNAUTHORIZED"}',
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
#: Mutating endpoints need the cluster token when the controller has one.
_BEARER: list[dict[str, list[str]]] = [{"token": []}]
_BUCKET = {
    "type": ["object", "null"],
    "properties": {"rate": {"type": "number"}, "burst": {"type": "number", "minimum": 1}},
}
_PLAN = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "version": {"type": "integer"},
        "policy": {"type": "string"},
        "status": {"type": "string", "enum": ["placed", "short", "fitting"]},
        "brokers": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "tcp_address": {"type": "string"},
                    "http_address": {"type": "string"},
                    "publishers": {"type": "array", "items": {"type": "string"}},
                    "bucket": _BUCKET,
                },
            },
        },
        "unassigned": {"type": "array", "items": {"type": "string"}},
    },
}


def _query(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": True, "description": description,
            "schema": {"type": "string"}}  # fmt: skip


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "SRTM controller", "version": __version__},
    "paths": {
        "/brokers": {
            "post": {
                "summary": "Register a broker (again after a restart)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["id", "tcp_address", "http_address", "mcap"],
                    "properties": {
                        "id": {"type": "string"},
                        "tcp_address": {"type": "string", "examples": ["127.0.0.1:4150"],
                                        "description": "HOST:PORT ([V6]:PORT), an IP or a "
                                                       "DNS name, port 1-65535"},
                        "http_address": {"type": "string", "description": "as tcp_address"},
                        "mcap": {"type": "number", "exclusiveMinimum": 0,
                                 "description": "messages/s it can process"},
                    },
                }}}},
                "security": _BEARER,
                "responses": {"200": {"description": "Registered"}, "400": _ERROR,
                              "401": _UNAUTHORIZED,
                              "409": {"description": "The id is registered at another "
                                                     "address and that broker is up"}},
            }
        },
        "/brokers/{id}/report": {
            "post": {
                "summary": "A broker's report (every second): load and per-topic window",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object",
                    "properties": {
                        "load": {"type": "number", "minimum": 0},
                        "topics": {"type": "object", "additionalProperties": {
                            "type": "object",
                            "properties": {
                                "rate": {"type": "number", "minimum": 0},
                                "backlog": {"type": "number", "minimum": 0},
                                "depth": {"type": "integer", "minimum": 0,
                                          "description": "messages it still holds (queued, "
                                                         "deferred, in flight): while > 0 "
                                                         "it is listed by /lookup"},
                            },
                        }},
                    },
                    "description": "numbers finite (no NaN or infinity); a bad report is "
                                   "refused whole with 400 naming the field",
                }}}},
                "security": _BEARER,
                "responses": {"200": {"description": "Taken"}, "400": _ERROR,
                              "401": _UNAUTHORIZED,
                              "404": {"description": "Unknown broker: register first"}},
            }
        },
        "/topics": {
            "post": {
                "summary": "Create a topic: its SLO, publishers and policy; places it",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["name", "slo_p99_ms", "burst", "publishers"],
                    "properties": {
                        "name": {"type": "string", "pattern": "^[.a-zA-Z0-9_-]+(#ephemeral)?$",
                                 "maxLength": 64},
                        "slo_p99_ms": {"type": "number", "exclusiveMinimum": 0},
                        "burst": {"oneOf": [{"type": "number", "minimum": 1},
                                            {"const": "profile"}]},
                        "rate": {"type": "number", "description": "default 1.1 x publishers"},
                        "arrivals_ns": {"type": "array", "items": {"type": "integer"},
                                        "description": "trace for burst = profile"},
                        "policy": {"enum": list(POLICIES)},
                        "fit": {"description": "run online fitting (true, or window_s, "
                                               "min_samples, settle_s, and model: 'paper' "
                                               "or a calibrated model file under the "
                                               "controller's --models-dir, at most 1 MiB, "
                                               "for model-assisted fitting)",
                                "oneOf": [{"type": "boolean"}, {"type": "object"}]},
                        "publishers": {"type": "array", "maxItems": 100000,
                                       "description": "at most --max-publishers (413)",
                                       "items": {
                            "type": "object", "required": ["id", "rate"],
                            "properties": {"id": {"type": "string"}, "rate": {"type": "number"},
                                           "group": {"type": "string"}},
                        }},
                    },
                }}}},
                "security": _BEARER,
                "responses": {"201": {"description": "Placed",
                                      "content": {"application/json": {"schema": _PLAN}}},
                              "400": _ERROR, "401": _UNAUTHORIZED, "409": _ERROR,
                              "413": _ERROR, "503": _ERROR},
            }
        },
        "/topics/{name}/move": {
            "post": {
                "summary": "Move publishers to a broker (a new plan, migration orders)",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["publishers", "to"],
                    "properties": {"publishers": {"type": "array",
                                                  "items": {"type": "string"}},
                                   "to": {"type": "string", "description": "broker id"}},
                }}}},
                "security": _BEARER,
                "responses": {"200": {"description": "The new plan",
                                      "content": {"application/json": {"schema": _PLAN}}},
                              "400": _ERROR, "401": _UNAUTHORIZED, "404": _ERROR},
            }
        },
        "/lookup": {
            "get": {
                "summary": "nsqlookupd's /lookup: the topic's live brokers, then any live "
                           "broker still holding its messages (draining, never a publish "
                           "target)",
                "parameters": [_query("topic", "topic name")],
                "responses": {"200": {"description": "channels and producers"},
                              "400": _ERROR, "404": _ERROR},
            }
        },
        "/info": {
            "get": {
                "summary": "Version; ticks run, stalls of the controller itself and their "
                           "total length (s); whether TLS and the token are on",
                "responses": {"200": {"description": "Info"}},
            }
        },
        "/topics/{name}": {
            "get": {
                "summary": "A topic's plan, SLO and events",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "The topic",
                                      "content": {"application/json": {"schema": _PLAN}}},
                              "404": _ERROR},
            }
        },
        "/plan": {
            "get": {
                "summary": "The whole plan of a topic, with its version",
                "parameters": [_query("topic", "topic name")],
                "responses": {"200": {"description": "The plan",
                                      "content": {"application/json": {"schema": _PLAN}}},
                              "400": _ERROR, "404": _ERROR},
            }
        },
        "/assign": {
            "get": {
                "summary": "The broker a publisher should use",
                "parameters": [_query("topic", "topic name"), _query("publisher", "its id")],
                "responses": {"200": {"description": "Its broker"}, "400": _ERROR,
                              "404": _ERROR, "503": _ERROR},
            }
        },
    },
    "components": {
        "schemas": {"Error": {"type": "object", "required": ["message"],
                              "properties": {"message": {"type": "string"}}}},
        "securitySchemes": {"token": {"type": "http", "scheme": "bearer",
                                      "description": "the cluster token (--token, "
                                                     "SRTM_TOKEN)"}},
    },
}  # fmt: skip
