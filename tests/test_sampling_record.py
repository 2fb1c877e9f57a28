"""One sampling record end to end (proto.sampling): one check, whichever way a request comes in,
and one conversion each way across the wire.

The cross-entry test sends the same bad value over HTTP, through the ZMQ front door (the client
library) and straight to a backend worker (a DEALER socket, no gateway), and asserts the three
refusals carry the same words: before the record was shared, the worker had its own checks
(temperature had no upper bound there, min_p/penalties were the engine's with other messages).
"""
from __future__ import annotations

import pytest
from backend_helpers import DealerClient, WorkerProcess
from test_gateway_http import ipc_address, make_config, post

from gateway.app import create_app
from gateway.client import AsyncClient, InvalidRequestError
from gateway.frontdoor import frontdoor_ctx
from gateway.sampling_fields import HTTP_DEFAULTS, parse_sampling
from proto import tidegate_pb2 as pb
from proto.sampling import SamplingParams, check_sampling, from_wire, to_wire
from tokenizer.grammar import GrammarSpec

MAX_TOKENS = 4
# one bad value per case, each refused by check_sampling (proto.sampling)
BAD = [
    {"temperature": 3.0},
    {"top_p": 1.5},
    {"min_p": 2.0},
    {"repetition_penalty": 11.0},
    {"presence_penalty": -3.0},
    {"frequency_penalty": 2.5},
    {"min_tokens": MAX_TOKENS + 5},
    {"logit_bias": {5: 150.0}},
    {"stop_token_ids": [100000]},  # past the model's vocabulary
]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path = tmp_path_factory.mktemp("w")
    w = WorkerProcess(["--model", "echo", "--max-model-len", "256", "--num-blocks", "512"],
                      f"ipc://{path}/w.sock")
    yield w
    w.kill()


def _to_worker(client: DealerClient, rid: str, fields: dict) -> str:
    env = pb.Envelope(batch=pb.Batch())
    r = env.batch.requests.add(request_id=rid, prompt_frame=0)
    r.sampling.max_tokens = MAX_TOKENS
    for name, value in fields.items():
        if name == "logit_bias":
            r.sampling.logit_bias.update(value)
        elif name == "stop_token_ids":
            r.sampling.stop_token_ids.extend(value)
        else:
            setattr(r.sampling, name, value)
    client.send(env, [[104, 105]])
    _, finals, _ = client.collect([rid], timeout_s=30)
    assert rid not in finals, f"the worker served {fields}"
    return client.errors[-1].message


async def test_the_same_bad_value_gets_the_same_words_everywhere(aiohttp_client, worker):
    door = ipc_address()
    http = await aiohttp_client(create_app(make_config(worker.endpoint), startup_wait_s=10.0,
                                           extra_cleanup_ctx=[frontdoor_ctx(door)]))
    direct = DealerClient(worker.endpoint)
    try:
        async with AsyncClient(door) as client:
            for i, fields in enumerate(BAD):
                body = {"prompt": "hi", "max_tokens": MAX_TOKENS, **fields}
                status, answer = await post(http, "/v1/completions", body)
                assert status == 400, (fields, answer)
                over_http = answer["error"]["message"]
                with pytest.raises(InvalidRequestError) as refused:
                    await client.generate("hi", max_tokens=MAX_TOKENS, **fields)
                at_worker = _to_worker(direct, f"r{i}", fields)
                assert str(refused.value) == over_http == at_worker, fields
                param = next(iter(fields))
                assert answer["error"]["param"] == param and f"'{param}'" in over_http
    finally:
        direct.close()


def test_a_good_request_still_runs_on_the_worker(worker):
    client = DealerClient(worker.endpoint)
    try:
        client.batch({"ok": [104, 105]}, max_tokens=3, temperature=0.5, top_p=0.9)
        tokens, finals, _ = client.collect(["ok"], timeout_s=30)
        assert finals["ok"].finish_reason and len(tokens["ok"]) == 3
    finally:
        client.close()


def test_the_wire_round_trip_keeps_every_field():
    p = SamplingParams(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=3, seed=-5, stop_token_ids=(9, 4),
        ignore_eos=True, logprobs=2, min_p=0.05, repetition_penalty=1.25, presence_penalty=0.5,
        frequency_penalty=-0.25, logit_bias=((3, 1.5), (8, -2.0)), min_tokens=2,
        grammar=GrammarSpec("regex", "[0-9]+"), stop=("x", "yz"), skip_special_tokens=False,
        include_stop_str_in_output=True)
    wire = pb.SamplingParams.FromString(to_wire(p, output_options=True).SerializeToString())
    assert from_wire(wire, GrammarSpec) == p
    assert from_wire(wire).grammar is None  # a reader that serves no grammar leaves it out
    # to a backend, the gateway's output options stay at the gateway
    to_backend = from_wire(to_wire(p), GrammarSpec)
    assert (to_backend.stop, to_backend.include_stop_str_in_output) == ((), False)


def test_unset_wire_fields_and_defaults():
    # the record's defaults are the wire's: an empty message reads as the default record
    assert from_wire(pb.SamplingParams(max_tokens=16)) == SamplingParams()
    assert SamplingParams().greedy and SamplingParams().max_tokens == 16
    # the HTTP API's defaults are OpenAI's (temperature 1.0), applied where a body is read
    http = parse_sampling({}, None, max_tokens_default=16)
    assert http.temperature == HTTP_DEFAULTS["temperature"] == 1.0 and not http.greedy
    assert to_wire(http).top_k == 0  # -1 (the API's "off") is the wire's 0
    # chat's "fill the context" crosses as the resolved count
    assert to_wire(SamplingParams(max_tokens=None), max_tokens=100).max_tokens == 100


def test_the_backend_needs_a_number_of_tokens():
    assert check_sampling(SamplingParams(max_tokens=None)) is None  # the gateway resolves it
    assert check_sampling(SamplingParams(max_tokens=None), backend=True).param == "max_tokens"
    assert check_sampling(SamplingParams(logprobs=65), max_logprobs=64).param == "logprobs"
    err = check_sampling(SamplingParams(temperature=float("nan")))
    assert err.message == "'temperature' must be a finite number, not nan."
