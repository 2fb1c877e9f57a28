"""GET /openapi.json (issue 13): the gateway describes its own API, generated from the tables its
validation reads, so the description and the 400s cannot disagree: every bound the document
states is the bound the parser enforces (a value on it passes, one past it is a 400 naming the
field), every route the app serves is listed, and the configured limits show."""
from __future__ import annotations

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config

from gateway.app import create_app
from gateway.errors import APIError
from gateway.openapi import app_routes, openapi_document
from gateway.request_fields import CHAT_FIELDS, COMPLETION_FIELDS, UINT32_MAX
from gateway.validation import (
    LIMITS,
    RequestLimits,
    parse_chat_request,
    parse_completion_request,
)


@pytest.fixture
async def backend():
    b = await FakeBackend(ipc_address()).start()
    yield b
    await b.stop()


def body_schema(doc: dict, path: str) -> dict:
    return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


async def test_the_gateway_serves_a_description_of_every_route(aiohttp_client, backend):
    limits = RequestLimits(max_n=3, max_prompts=5, max_stop_strings=2, strict_api=True)
    app = create_app(make_config(backend.address, limits=limits), startup_wait_s=5.0)
    client = await aiohttp_client(app)
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["openapi"].startswith("3.1")
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == set(app_routes(app)) and ("GET", "/openapi.json") in listed
    completions = body_schema(doc, "/v1/completions")
    chat = body_schema(doc, "/v1/chat/completions")
    assert COMPLETION_FIELDS <= set(completions["properties"]) and completions["required"] == [
        "prompt"]
    assert CHAT_FIELDS <= set(chat["properties"]) and chat["required"] == ["messages"]
    # the limits in force, not the defaults
    assert completions["properties"]["n"]["maximum"] == 3
    prompt_lists = [s for s in completions["properties"]["prompt"]["anyOf"]
                    if s.get("items", {}).get("type") == "string"]
    assert prompt_lists[0]["maxItems"] == 5
    assert completions["additionalProperties"] is False  # --strict-api
    assert body_schema(doc, "/detokenize")["required"] == ["tokens"]


async def test_the_description_is_behind_the_api_key(aiohttp_client, backend):
    app = create_app(make_config(backend.address, api_key="sekrit"), startup_wait_s=5.0)
    client = await aiohttp_client(app)
    assert (await client.get("/openapi.json")).status == 401
    resp = await client.get("/openapi.json", headers={"Authorization": "Bearer sekrit"})
    assert resp.status == 200 and (await resp.json())["security"] == [{"bearer": []}]


DOC = openapi_document(LIMITS, [("POST", "/v1/completions"), ("POST", "/v1/chat/completions")],
                       "test", False)
PARSERS = {"/v1/completions": (parse_completion_request, {"prompt": "a"}),
           "/v1/chat/completions": (parse_chat_request, {
               "messages": [{"role": "user", "content": "a"}], "logprobs": True})}
BOUNDED = [(path, name, spec) for path in PARSERS
           for name, spec in sorted(body_schema(DOC, path)["properties"].items())
           if spec.get("type") in ("integer", "number")]


def problem(path: str, name: str, value) -> str | None:
    """The parameter the parser complains about for `name` = value (None: accepted)."""
    parse, base = PARSERS[path]
    body = {**base, "max_tokens": UINT32_MAX, name: value}  # room for min_tokens up to its top
    if name == "best_of" and isinstance(value, int) and 1 <= value <= LIMITS.max_n:
        body["n"] = value  # only best_of = n is accepted
    if name == "max_completion_tokens":
        del body["max_tokens"]
    try:
        parse(body, LIMITS)
    except APIError as err:
        return err.param
    return None


@pytest.mark.parametrize("path,name,spec", BOUNDED, ids=[f"{p}:{n}" for p, n, _ in BOUNDED])
def test_every_bound_in_the_description_is_the_one_enforced(path, name, spec):
    step = 1 if spec["type"] == "integer" else 1e-6
    if "minimum" in spec:
        assert problem(path, name, spec["minimum"]) is None
        assert problem(path, name, spec["minimum"] - step) == name
    if "exclusiveMinimum" in spec:
        assert problem(path, name, spec["exclusiveMinimum"]) == name
        assert problem(path, name, spec["exclusiveMinimum"] + step) is None
    if "maximum" in spec:
        assert problem(path, name, spec["maximum"]) is None
        assert problem(path, name, spec["maximum"] + step) == name
    assert problem(path, name, "1") == name  # a string where a number goes


@pytest.mark.parametrize("path", list(PARSERS))
def test_every_boolean_and_string_field_is_type_checked(path):
    props = body_schema(DOC, path)["properties"]
    for name, spec in props.items():
        if spec.get("type") == "boolean":
            assert problem(path, name, True) is None, name
            assert problem(path, name, "yes") == name
        elif spec.get("type") == "string":
            assert problem(path, name, "x") is None, name
            assert problem(path, name, 5) == name
