"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP API, generated from the tables the
validation reads (`gateway.request_fields`) with the gateway's configured limits, and from the
app's own routes, so it cannot drift from what the server accepts. The HTTP fuzzer
(tests/test_fuzz_http.py) generates its bodies from it.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.anthropic_schema import messages_body_schema
from gateway.app_keys import CONFIG_KEY
from gateway.request_fields import (
    CHAT_FIELDS,
    CHAT_LOGPROBS,
    COMPLETION_FIELDS,
    COMPLETION_LOGPROBS,
    DETOKENIZE_FIELDS,
    SCALARS,
    TOKENIZE_FIELDS,
    UNSUPPORTED_FIELDS,
    Scalar,
    composite_schemas,
)

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

# path -> (operation summary, fields its JSON body takes, fields it requires, per-route scalars)
BODIES: dict[str, tuple[str, frozenset, list[str], dict[str, Scalar]]] = {
    "/v1/completions": ("Text completion (OpenAI / vLLM).", COMPLETION_FIELDS, ["prompt"],
                        {"logprobs": COMPLETION_LOGPROBS}),
    "/v1/chat/completions": ("Chat completion (OpenAI / vLLM).", CHAT_FIELDS, ["messages"],
                             {"logprobs": CHAT_LOGPROBS}),
    "/tokenize": ("Token ids of a prompt, or of chat messages rendered by the template.",
                  TOKENIZE_FIELDS, [], {}),
    "/detokenize": ("Text of token ids.", DETOKENIZE_FIELDS, ["tokens"], {}),
}
UNSUPPORTED_NOTE = "Not supported: accepted only at its neutral value (absent, null, or the default)."


def scalar_schema(spec: Scalar, limits: Any) -> dict:
    schema: dict[str, Any] = {"type": spec.kind, "description": spec.doc}
    if spec.kind in ("integer", "number"):
        lo, hi = spec.bounds(limits)
        if lo is not None:
            schema["exclusiveMinimum" if spec.exclusive_minimum else "minimum"] = lo
        if hi is not None:
            schema["maximum"] = hi
    return schema


def body_schema(path: str, limits: Any) -> dict:
    _, fields, required, own = BODIES[path]
    composite = composite_schemas(limits)
    props: dict[str, dict] = {}
    for name in sorted(fields):
        spec = own.get(name) or SCALARS.get(name)
        props[name] = scalar_schema(spec, limits) if spec is not None else composite[name]
    if path in ("/v1/completions", "/v1/chat/completions"):
        for name in sorted(UNSUPPORTED_FIELDS):
            props[name] = {"description": UNSUPPORTED_NOTE, "deprecated": True}
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": not limits.strict_api}


def openapi_document(limits: Any, routes: list[tuple[str, str]], version: str,
                     api_key: bool) -> dict:
    """The document for `routes` ([(method, path)]) with the request limits in force."""
    errors = {"description": "An error in the OpenAI shape.",
              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    paths: dict[str, dict] = {}
    for method, path in sorted(routes):
        op: dict[str, Any] = {"responses": {"200": {"description": "Success."},
                                            "4XX": errors, "5XX": errors}}
        if path in BODIES and method == "POST":
            op["summary"] = BODIES[path][0]
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": body_schema(path, limits)}}}
        elif path.startswith("/v1/messages") and method == "POST":  # Anthropic's Messages API
            count = path.endswith("/count_tokens")
            op["summary"] = "Prompt tokens of a message." if count else \
                "Anthropic Messages: text, tool_use, streaming events; errors in its shape."
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": messages_body_schema(count)}}}
        paths.setdefault(path, {})[method.lower()] = op
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "tidegate", "version": version,
                 "description": "OpenAI-compatible serving gateway. Request fields, their types "
                                "and bounds are generated from the gateway's validation tables "
                                "with its configured limits."},
        "paths": paths,
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def app_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves (HEAD, added by aiohttp for GET, left out)."""
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path and route.method not in ("HEAD", "*"):
            out.add((route.method, path))
    return sorted(out)


def openapi_handler(version: str):
    """The GET /openapi.json handler (the app passes its version: no import back into it)."""
    async def openapi_json(request: web.Request) -> web.Response:
        config = request.app[CONFIG_KEY]
        return web.json_response(openapi_document(config.limits, app_routes(request.app),
                                                  version, bool(config.api_key)))
    return openapi_json
