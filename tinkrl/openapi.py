"""The OpenAPI description a tinkrl HTTP server publishes of itself, built from the request types it reads.

`tinkrl serve tinker` reads the official `tinker` SDK's pydantic request types, `tinkrl serve openai` the
`openai` package's request parameters; the description says so route by route, with the statuses a route
answers on bad input (4xx) documented, so that a client generator or a schema-driven fuzzer
(schemathesis) knows every route, its body and what a refusal looks like. A 5xx is never documented: a
server that answers one has a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

OPENAPI_VERSION = "3.1.0"


@dataclass(frozen=True)
class Route:
    """One route: method and path (`{name}` for a path parameter), what it does, its body (a type pydantic
    reads, such as a model or a TypedDict, or a JSON schema as a dict; None for no body), the body's media
    type, and the 4xx statuses it answers."""

    method: str
    path: str
    summary: str
    body: Any = None
    media_type: str = "application/json"
    refusals: tuple[int, ...] = (400,)


def _schema(body: Any, components: dict[str, Any]) -> dict[str, Any]:
    """`body`'s JSON schema, its definitions hoisted into the document's components."""
    if isinstance(body, dict):
        return body
    schema = TypeAdapter(body).json_schema(ref_template="#/components/schemas/{model}")
    components.update(schema.pop("$defs", {}))
    return schema


_REASONS = {
    400: "the request is malformed or asks for what this server does not do",
    401: "no key, or the wrong one",
    403: "the key may not use this route",
    404: "no such session, model, sampler, rollout or path",
    409: "the request conflicts with the server's state",
    410: "the session has finished, or the request id is unknown to this server process",
    413: "the body is too large",
    415: "the body's media type is not the route's",
}


def document(title: str, version: str, routes: list[Route], keyed: bool = True) -> dict:
    """The OpenAPI 3.1 document of `routes`; `keyed`: the routes take a bearer key (when the server has one)."""
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{route.path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
            "responses": {"200": {"description": "done"}}
            | {str(code): {"description": _REASONS.get(code, "refused")} for code in sorted(route.refusals)},
        }
        names = [part[1:-1] for part in route.path.split("/") if part.startswith("{") and part.endswith("}")]
        parameters = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            if route.media_type == "application/json":
                schema = _schema(route.body, components)
            else:
                schema = {"type": "string", "format": "binary"}
            operation["requestBody"] = {"required": True, "content": {route.media_type: {"schema": schema}}}
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": components},
    }
    if keyed:
        doc["components"]["securitySchemes"] = {"key": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"key": []}]
    return doc
