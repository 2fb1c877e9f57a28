"""Structured output through the ZMQ front door and the client library (issue 29): the HTTP API's
fields reach the backend as the same wire grammar an HTTP request sends, and a bad one is the
same 400 (message and param) as an Error on the wire, nothing queued. Against the fake backend;
tests/test_structured_e2e.py runs the client against tiny-coder."""
from __future__ import annotations

import asyncio

import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import ipc_address, make_config, post
from test_structured_gateway import Recorder

from gateway.app import create_app
from gateway.client import AsyncClient, InvalidRequestError
from gateway.frontdoor import FRONTDOOR_KEY, frontdoor_ctx
from proto import codec
from proto import tidegate_pb2 as pb

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
GOOD = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": SCHEMA}}},
    {"guided_json": {"type": "array", "items": {"type": "string"}}},
    {"guided_json": '{"type": "object"}'},
    {"guided_regex": "[0-9]{3}-[a-z]+"},
    {"guided_choice": ["yes", "no", "it \"depends\""]},
    {"guided_grammar": 'root ::= "a" | "b"'},
    {"structured_outputs": {"regex": "x+"}},
    {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
    {"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar"},
]
BAD = [
    {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"$ref": "http://example.com/x.json"}}}}}},
    {"response_format": {"type": "yaml"}},
    {"response_format": {"type": "json_schema"}},
    {"guided_regex": "(unclosed"},
    {"guided_json": "{not json"},
    {"guided_choice": []},
    {"guided_grammar": "start: undefined_rule"},
    {"guided_json": {"type": "object"}, "guided_regex": "x"},
    {"structured_outputs": {"regex": "a", "choice": ["b"]}},
    {"structured_outputs": {"structural_tag": {}}},
    {"guided_whitespace_pattern": " "},
    {"guided_decoding_backend": "mine"},
]


@pytest.fixture
async def door(aiohttp_client):
    """(HTTP test client, front-door address, the backend's Recorder)."""
    rec = Recorder("plain text")
    backend = await FakeBackend(ipc_address(), script=rec).start()
    address = ipc_address()
    app = create_app(make_config(backend.address), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(address)])
    yield await aiohttp_client(app), address, rec
    await backend.stop()


@pytest.mark.parametrize("fields", GOOD)
async def test_client_fields_reach_the_backend_as_http_sends_them(door, fields):
    http, address, rec = door
    status, out = await post(http, "/v1/completions", {"prompt": "q", "max_tokens": 20, **fields})
    assert status == 200, out
    over_http = rec.samplings[-1].grammar
    assert over_http.kind != pb.Grammar.NONE
    async with AsyncClient(address) as client:
        result = await client.generate("q", max_tokens=20, **fields)
    assert result.text == "plain text"
    assert rec.samplings[-1].grammar == over_http  # the same kind and text


@pytest.mark.parametrize("fields", BAD)
async def test_bad_fields_are_the_http_400_as_an_error_on_the_wire(door, fields):
    http, address, rec = door
    status, out = await post(http, "/v1/completions", {"prompt": "q", **fields})
    assert status == 400, out
    async with AsyncClient(address) as client:
        with pytest.raises(InvalidRequestError) as err:
            await client.generate("q", max_tokens=20, **fields)
    assert str(err.value) == out["error"]["message"]
    assert err.value.param == out["error"]["param"] and err.value.code == "INVALID_REQUEST"
    assert rec.samplings == []  # nothing was queued, over either door


async def _raw(address: str, req: pb.GenerateRequest) -> pb.Envelope:
    """Send one request over a bare DEALER; the first reply."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(address)
    try:
        await sock.send_multipart(codec.encode(pb.Envelope(batch=pb.Batch(requests=[req]))))
        frames = await asyncio.wait_for(sock.recv_multipart(), 10)
        return codec.decode(frames).envelope
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("kind,text,ok", [
    (pb.Grammar.JSON_SCHEMA, '{"type": "object"}', True),
    (pb.Grammar.CHOICE, '["a", "b"]', True),
    (pb.Grammar.REGEX, "a+", True),
    (pb.Grammar.JSON_SCHEMA, '{"type": "strin"}', False),
    (pb.Grammar.JSON_SCHEMA, "{not json", False),
    (pb.Grammar.CHOICE, "a, b", False),
    (pb.Grammar.REGEX, "(unclosed", False),
    (pb.Grammar.GRAMMAR, "", False),
])
async def test_the_wire_grammar_is_checked_with_param_grammar(door, kind, text, ok):
    _, address, rec = door
    req = pb.GenerateRequest(request_id="r1", prompt_text="q", prompt_frame=codec.NO_FRAME,
                             sampling=pb.SamplingParams(max_tokens=4))
    req.sampling.grammar.kind, req.sampling.grammar.text = kind, text
    env = await _raw(address, req)
    if ok:
        assert env.WhichOneof("body") == "step_output", env
        assert rec.samplings[-1].grammar == req.sampling.grammar
    else:
        assert env.error.code == pb.Error.INVALID_REQUEST and env.error.param == "grammar", env
        assert env.error.request_id == "r1" and rec.samplings == []


async def test_fields_and_a_wire_grammar_together_are_refused(door):
    _, address, rec = door
    req = pb.GenerateRequest(request_id="r2", prompt_text="q", prompt_frame=codec.NO_FRAME,
                             structured_fields='{"guided_regex": "a"}',
                             sampling=pb.SamplingParams(max_tokens=4))
    req.sampling.grammar.kind, req.sampling.grammar.text = pb.Grammar.REGEX, "b"
    env = await _raw(address, req)
    assert env.error.code == pb.Error.INVALID_REQUEST
    assert env.error.param == "structured_fields" and rec.samplings == []
    req.ClearField("sampling")
    req.sampling.max_tokens = 4
    req.structured_fields = '{"prompt": "x"}'  # only structured-output fields belong here
    env = await _raw(address, req)
    assert env.error.param == "prompt" and rec.samplings == []


async def test_an_abort_while_the_grammar_compiles_leaves_nothing_behind(door):
    http, address, _ = door
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(address)
    req = pb.GenerateRequest(request_id="r3", prompt_text="q", prompt_frame=codec.NO_FRAME,
                             structured_fields='{"guided_json": {"type": "object", "properties": '
                                               '{"zz_abort": {"type": "string"}}}}',
                             sampling=pb.SamplingParams(max_tokens=500, ignore_eos=True))
    await sock.send_multipart(codec.encode(pb.Envelope(batch=pb.Batch(requests=[req]))))
    await sock.send_multipart(codec.encode(codec.make_abort(["r3"])))
    front = http.app[FRONTDOOR_KEY]
    for _ in range(200):  # aborted while compiling (never queued) or once queued
        if not front._compiling and not front._handles:
            break
        await asyncio.sleep(0.01)
    sock.close(linger=0)
    ctx.term()
    assert not front._compiling and not front._handles
