"""Membership while serving: add, drain and remove backends (`/admin/backends`).

    GET  /admin/backends                               -> {"backends": [{address, healthy,
                                                           draining, inflight, outstanding_tokens}]}
    POST /admin/backends {"action": "add",    "address": "tcp://10.0.0.7:5555"}
    POST /admin/backends {"action": "drain",  "address": ...}   no new requests; it leaves when
                                                                its last one finishes
    POST /admin/backends {"action": "remove", "address": ...}   out now: requests not yet
                                                                started there go elsewhere

Authenticated by its own key (`--admin-key`, or TIDEGATE_ADMIN_KEY): `Authorization: Bearer KEY`.
Without a key configured the endpoint does not exist (404): membership changes are an operator's
act, never a client's. Changes show in `/metrics` (tidegate_backend_healthy / _draining per backend,
a removed backend's series disappear).
"""
from __future__ import annotations

import hmac

from aiohttp import web

from gateway.app_keys import CONFIG_KEY, GATEWAY_KEY
from gateway.errors import APIError, bad_request

ADMIN_PREFIX = "/admin/"


def _check(request: web.Request) -> None:
    key = request.app[CONFIG_KEY].admin_key
    if not key:
        raise APIError(404, "Not found.", code="not_found")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise APIError(401, "Admin key missing or wrong.", code="invalid_admin_key")


def _describe(pool) -> list[dict]:
    return [{"address": b.address, "healthy": b.healthy, "draining": b.draining,
             "inflight": b.num_inflight, "outstanding_tokens": b.outstanding_tokens}
            for b in pool.backends]


async def list_backends(request: web.Request) -> web.Response:
    _check(request)
    return web.json_response({"backends": _describe(request.app[GATEWAY_KEY].pool)})


async def change_backends(request: web.Request) -> web.Response:
    _check(request)
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("The body is not JSON.", None) from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.", None)
    action, address = body.get("action"), body.get("address")
    if action not in ("add", "drain", "remove"):
        raise bad_request("action must be one of add, drain, remove.", "action")
    if not isinstance(address, str) or not address.startswith(("tcp://", "ipc://", "http://",
                                                                  "https://")):
        raise bad_request("address must be a tcp://, ipc://, http:// or https:// address.",
                          "address")
    pool = request.app[GATEWAY_KEY].pool
    try:
        if action == "add":
            pool.add_backend(address)
        elif action == "drain":
            pool.drain_backend(address)
        else:
            pool.remove_backend(address)
    except ValueError as exc:
        raise APIError(409, str(exc), code="conflict") from None
    except KeyError:
        raise APIError(404, f"No backend {address} in the pool.", code="not_found") from None
    return web.json_response({"backends": _describe(pool)})


def add_admin_routes(app: web.Application) -> None:
    app.router.add_get("/admin/backends", list_backends)
    app.router.add_post("/admin/backends", change_backends)
