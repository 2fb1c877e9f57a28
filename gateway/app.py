"""aiohttp application factory: state in typed AppKeys, the gateway core (ZMQ readers, the
batcher timer) started and stopped in `cleanup_ctx`, open streams ended in `on_shutdown`.

Middlewares, outermost first: `error_middleware` (every failure leaves in the OpenAI error
shape, aiohttp's own 4xx included; never a 500 for bad input), then `auth_middleware`
(Bearer key on every route but /health, /ping, /version and, unless --protect-metrics,
/metrics; constant-time compare).
"""
from __future__ import annotations

import asyncio
import hmac
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.admin import ADMIN_PREFIX, add_admin_routes
from gateway.anthropic import anthropic_error, count_tokens
from gateway.anthropic import messages as anthropic_messages
from gateway.app_keys import (
    ACTIVE_KEY,
    CONFIG_KEY,
    GATEWAY_KEY,
    QUEUE_CLASS_KEY,
    STARTED_KEY,
    STARTUP_WAIT_KEY,
)
from gateway.core import Gateway, GatewayConfig
from gateway.errors import APIError, internal_error, shutting_down, too_large, unauthorized
from gateway.openapi import openapi_handler
from gateway.routes import chat_completions, completions
from gateway.tokenize_routes import detokenize, tokenize

log = logging.getLogger("tidegate.gateway.http")

def error_response(err: APIError, path: str = "") -> web.Response:
    body = anthropic_error(err) if path.startswith(MESSAGES_PREFIX) else err.to_dict()
    return web.json_response(body, status=err.status, headers=err.headers)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as err:
        resp_err = err
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:
            resp_err = too_large(request.app[CONFIG_KEY].max_body_bytes)
        elif exc.status == 404:
            resp_err = APIError(404, f"No route {request.method} {request.path}.",
                                code="route_not_found")
        elif exc.status == 405:
            resp_err = APIError(405, f"Method {request.method} is not allowed on {request.path}.",
                                code="method_not_allowed")
        else:
            resp_err = APIError(exc.status, exc.text or exc.reason, param="body",
                                code="bad_request")
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:  # a bug: log it, answer 500 in the usual shape
        log.exception("unhandled error on %s %s", request.method, request.path)
        resp_err = internal_error()
    if request.path.startswith("/v1/") and GATEWAY_KEY in request.app:
        request.app[GATEWAY_KEY].metrics.observe_request(resp_err.status,
                                                         request.get(QUEUE_CLASS_KEY, "none"))
    return error_response(resp_err, request.path)


@web.middleware
async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
    config = request.app[CONFIG_KEY]
    key = config.api_key
    # /admin/ checks its own key (gateway.admin); the clients' key opens nothing there
    if key and request.path not in OPEN_PATHS and not request.path.startswith(ADMIN_PREFIX) and not (
            request.path == "/metrics" and not config.protect_metrics):
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's SDK sends its key as x-api-key
            scheme, given = "bearer", request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise unauthorized()
    return await handler(request)


MESSAGES_PREFIX = "/v1/messages"  # Anthropic's API: its error shape


# Paths that need no API key (as vLLM's: liveness and version); /metrics too unless
# --protect-metrics, because routers and Prometheus scrape it without the clients' key.
OPEN_PATHS = frozenset({"/health", "/ping", "/version"})


def _version() -> str:
    try:
        return importlib.metadata.version("tidegate")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "0+unknown"


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": _version()})


async def health(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    if gw.draining:
        return web.json_response({"status": "draining"}, status=503)
    if not gw.healthy:
        return web.json_response({"status": "no healthy backend"}, status=503)
    return web.json_response({"status": "ok", "backends": len(gw.pool.healthy_backends())})


async def models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    info = gw.info
    return web.json_response({"object": "list", "data": [{
        "id": gw.model_name, "object": "model", "created": int(request.app[STARTED_KEY]),
        "owned_by": "tidegate", "root": info.model, "max_model_len": info.max_model_len}]})


async def metrics(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY_KEY]
    gw.refresh_metrics()
    return web.Response(body=gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def gateway_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = Gateway(app[CONFIG_KEY])
    app[GATEWAY_KEY] = gw
    await gw.start()
    wait = app[STARTUP_WAIT_KEY]
    if wait > 0 and not await gw.pool.wait_ready(wait):
        log.warning("no backend answered within %.1f s; serving 503 until one does", wait)
    yield
    await gw.close()


async def close_streams(app: web.Application) -> None:
    """Server shutdown: whatever is still being served ends with an error event now."""
    gw = app[GATEWAY_KEY]
    gw.draining = True
    for handle in list(app[ACTIVE_KEY]):
        handle.on_error(shutting_down())


async def drain(app: web.Application, timeout_s: float) -> bool:
    """Refuse new requests (503) and wait for the active ones; True if all finished in time."""
    gw = app[GATEWAY_KEY]
    gw.draining = True
    deadline = time.monotonic() + timeout_s
    while app[ACTIVE_KEY] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not app[ACTIVE_KEY]


def create_app(config: GatewayConfig, *, startup_wait_s: float = 0.0,
               extra_cleanup_ctx: list | None = None) -> web.Application:
    app = web.Application(client_max_size=config.max_body_bytes,
                          middlewares=[error_middleware, auth_middleware])
    app[CONFIG_KEY] = config
    app[ACTIVE_KEY] = set()
    app[STARTUP_WAIT_KEY] = float(startup_wait_s)
    app[STARTED_KEY] = time.time()
    app.cleanup_ctx.append(gateway_ctx)
    for ctx in extra_cleanup_ctx or ():
        app.cleanup_ctx.append(ctx)
    app.on_shutdown.append(close_streams)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post(MESSAGES_PREFIX, anthropic_messages)
    app.router.add_post(MESSAGES_PREFIX + "/count_tokens", count_tokens)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)  # SageMaker's and vLLM's name for it
    app.router.add_post("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi_handler(_version()))  # behind the API key
    add_admin_routes(app)
    return app


__all__ = ["create_app", "drain"]
