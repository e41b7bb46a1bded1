"""The OpenAPI 3.1 document of the controller's SRTM endpoints (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "description": "Refused; the message names the field or the reason",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
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
        "status": {"type": "string", "enum": ["placed", "short"]},
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
    "info": {"title": "SRTM controller", "version": "0.1.0"},
    "paths": {
        "/brokers": {
            "post": {
                "summary": "Register a broker (again after a restart)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["id", "tcp_address", "http_address", "mcap"],
                    "properties": {
                        "id": {"type": "string"},
                        "tcp_address": {"type": "string", "examples": ["127.0.0.1:4150"]},
                        "http_address": {"type": "string"},
                        "mcap": {"type": "number", "exclusiveMinimum": 0,
                                 "description": "messages/s it can process"},
                    },
                }}}},
                "responses": {"200": {"description": "Registered"}, "400": _ERROR},
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
                        "load": {"type": "number"},
                        "topics": {"type": "object", "additionalProperties": {
                            "type": "object",
                            "properties": {"rate": {"type": "number"},
                                           "backlog": {"type": "number"}},
                        }},
                    },
                }}}},
                "responses": {"200": {"description": "Taken"}, "400": _ERROR,
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
                        "name": {"type": "string"},
                        "slo_p99_ms": {"type": "number", "exclusiveMinimum": 0},
                        "burst": {"oneOf": [{"type": "number", "minimum": 1},
                                            {"const": "profile"}]},
                        "rate": {"type": "number", "description": "default 1.1 x publishers"},
                        "arrivals_ns": {"type": "array", "items": {"type": "integer"},
                                        "description": "trace for burst = profile"},
                        "policy": {"enum": ["lb", "conc", "maxmin", "srtm"]},
                        "fit": {"description": "run online fitting (true, or window_s, "
                                               "min_samples, settle_s, and model: 'paper' "
                                               "or a calibrated model file for "
                                               "model-assisted fitting)",
                                "oneOf": [{"type": "boolean"}, {"type": "object"}]},
                        "publishers": {"type": "array", "items": {
                            "type": "object", "required": ["id", "rate"],
                            "properties": {"id": {"type": "string"}, "rate": {"type": "number"},
                                           "group": {"type": "string"}},
                        }},
                    },
                }}}},
                "responses": {"201": {"description": "Placed",
                                      "content": {"application/json": {"schema": _PLAN}}},
                              "400": _ERROR, "409": _ERROR, "503": _ERROR},
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
    "components": {"schemas": {"Error": {"type": "object", "required": ["message"],
                                         "properties": {"message": {"type": "string"}}}}},
}  # fmt: skip
