"""Typed keys of the aiohttp application's and requests' state, shared by the app factory
(`gateway.app`), the route handlers (`gateway.routes`) and the frontdoor; in their own module so
that the handlers need not import the factory that registers them."""
from __future__ import annotations

from aiohttp import web

from gateway.core import Gateway, GatewayConfig

CONFIG_KEY = web.AppKey("config", GatewayConfig)
GATEWAY_KEY = web.AppKey("gateway", Gateway)
ACTIVE_KEY = web.AppKey("active_handles", set)  # set[RequestHandle] being served
STARTUP_WAIT_KEY = web.AppKey("startup_wait_s", float)
STARTED_KEY = web.AppKey("started", float)
QUEUE_CLASS_KEY = web.RequestKey("queue_class", str)  # for the metrics of a refused request
