"""Predicted Outputs and per-request speculation through the gateway (issue 28): the
`prediction` / `speculation` fields' validation (OpenAI's 400s), the prediction's ids on the
wire as their own raw frame, `usage.completion_tokens_details` in JSON and in the final stream
chunk, /metrics under vLLM's spec-decode names, the ZMQ front door and its client library.

The backend is a fake that speculates the way the engine does: each step it takes up to k
tokens of the prediction (k = the request's max_draft_tokens, else 4) as the draft, accepts the
prefix that matches its scripted output, and emits the accepted tokens plus one, reporting the
cumulative counters of RequestOutput 9-12."""
from __future__ import annotations

import asyncio
import re

import openai
import pytest
from test_gateway_fakes import DEFAULT_TEXT, EOS, FakeBackend
from test_gateway_http import ipc_address, make_config, post, read_sse

from gateway.app import create_app
from gateway.body_checks import RequestLimits
from gateway.client import AsyncClient
from gateway.errors import APIError
from gateway.frontdoor import frontdoor_ctx
from gateway.prediction_fields import parse_prediction, parse_speculation
from proto import codec
from proto import tidegate_pb2 as pb

SCRIPT = list(DEFAULT_TEXT.encode()) + [EOS]  # what the fake generates
DEFAULT_K = 4


class SpeculatingBackend(FakeBackend):
    """FakeBackend whose requests draft from their prediction frame."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.requests: dict[str, pb.GenerateRequest] = {}  # as received
        self.predictions: dict[str, list[int]] = {}
        self.spec: dict[str, dict[str, int]] = {}

    def _admit(self, peer, r, prompt) -> None:
        super()._admit(peer, r, prompt)
        self.requests[r.request_id] = r
        self.spec[r.request_id] = {"drafts": 0, "accepted": 0, "steps": 0}

    async def _recv_loop(self) -> None:  # FakeBackend's, keeping the prediction frames
        while True:
            peer, *frames = await self.sock.recv_multipart()
            try:
                decoded = codec.decode(frames)
            except codec.DecodeError as exc:
                self.num_bad_messages += 1
                self._send(peer, codec.error_for(exc))
                continue
            env = decoded.envelope
            if decoded.kind == "hello":
                self._peers.add(peer)
                self._send(peer, pb.Envelope(backend_info=self.info()))
            elif decoded.kind == "batch":
                self.batch_sizes.append(len(env.batch.requests))
                for r in env.batch.requests:
                    if r.HasField("prediction_frame"):
                        self.predictions[r.request_id] = \
                            codec.array_of(decoded, r.prediction_frame).tolist()
                    self._admit(peer, r, codec.array_of(decoded, r.prompt_frame))
            elif decoded.kind == "abort":
                for rid in env.abort.request_ids:
                    req = self.running.pop(rid, None)
                    if req is not None:
                        self.aborted.append(rid)
                        self.num_free_blocks += req.num_blocks

    def _one_step(self) -> None:
        self._step += 1
        per_peer: dict[bytes, tuple[pb.StepOutput, list]] = {}
        for rid, req in list(self.running.items()):
            step, arrays = per_peer.setdefault(req.peer, (pb.StepOutput(step=self._step), []))
            wire = self.requests[rid]
            prediction = self.predictions.get(rid, [])
            k = 0 if wire.speculation.off else (wire.speculation.max_draft_tokens or DEFAULT_K)
            draft = prediction[req.pos:req.pos + k]
            spec = self.spec[rid]
            def token_at(pos: int, req=req) -> int:  # FakeBackend's output (EOS unless ignored)
                tok = req.script[pos % len(req.script)]
                return ord(" ") if tok == EOS and req.ignore_eos else tok

            accepted = 0
            for i, t in enumerate(draft):
                if token_at(req.pos + i) != t:
                    break
                accepted += 1
            if draft:
                spec["drafts"] += len(draft)
                spec["accepted"] += accepted
                spec["steps"] += 1
            tokens, finish = [], pb.RequestOutput.NONE
            for _ in range(accepted + 1):
                token = token_at(req.pos)
                req.pos += 1
                tokens.append(token)
                if token == EOS:
                    finish = pb.RequestOutput.STOP
                elif req.pos >= req.max_tokens:
                    finish = pb.RequestOutput.LENGTH
                if finish != pb.RequestOutput.NONE:
                    break
            # OpenAI's count: the prediction's tokens that the output used (aligned here; none
            # without speculation)
            used = sum(1 for i, t in enumerate(prediction[:req.pos]) if token_at(i) == t) \
                if k else 0
            out = step.outputs.add(
                request_id=rid, tokens_frame=len(arrays), finish_reason=finish,
                num_prompt_tokens=req.prompt_len, num_completion_tokens=req.pos,
                num_draft_tokens=spec["drafts"], num_accepted_draft_tokens=spec["accepted"],
                num_accepted_prediction_tokens=used,
                num_rejected_prediction_tokens=len(prediction) - used
                if finish != pb.RequestOutput.NONE else 0)
            for token in tokens if req.num_logprobs else ():  # one per token, as the engine
                out.logprobs.add(logprob=-token / 1000, top_ids=[token],
                                 top_logprobs=[-token / 1000])
            arrays.append(tokens)
            if finish != pb.RequestOutput.NONE:
                del self.running[rid]
                self.num_free_blocks += req.num_blocks
        for peer, (step, arrays) in per_peer.items():
            self._send(peer, pb.Envelope(step_output=step), arrays)


@pytest.fixture
async def backend():
    b = await SpeculatingBackend(ipc_address()).start()
    yield b
    await b.stop()


@pytest.fixture
def door():
    return ipc_address()


@pytest.fixture
async def client(aiohttp_client, backend, door):
    app = create_app(make_config(backend.address), startup_wait_s=5.0,
                     extra_cleanup_ctx=[frontdoor_ctx(door)])
    return await aiohttp_client(app)


@pytest.fixture
async def sdk(client):
    c = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused",
                           max_retries=0)
    yield c
    await c.close()


def only(backend: SpeculatingBackend) -> str:
    (rid,) = backend.requests
    return rid


# --- validation ------------------------------------------------------------------------------
LIMITS = RequestLimits(max_prediction_chars=10, max_draft_tokens=8)


@pytest.mark.parametrize("value, param, code", [
    ("text", "prediction", "invalid_type"),
    ({"content": "x"}, "prediction.type", "missing_required_parameter"),
    ({"type": "text", "content": "x"}, "prediction.type", "invalid_value"),
    ({"type": "content"}, "prediction.content", "missing_required_parameter"),
    ({"type": "content", "content": 3}, "prediction.content", "invalid_type"),
    ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content[0]",
     "invalid_value"),
    ({"type": "content", "content": "x" * 11}, "prediction.content", "prediction_too_long"),
    ({"type": "content", "content": [{"type": "text", "text": "x" * 6}] * 2},
     "prediction.content", "prediction_too_long"),
    ({"type": "content", "content": "\ud800"}, "prediction.content", "invalid_encoding"),
])
def test_bad_prediction_is_a_400_naming_the_field(value, param, code):
    with pytest.raises(APIError) as info:
        parse_prediction({"prediction": value}, LIMITS)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_prediction_text_and_parts():
    assert parse_prediction({}, LIMITS) is None
    assert parse_prediction({"prediction": None}, LIMITS) is None
    assert parse_prediction({"prediction": {"type": "content", "content": "abc"}}, LIMITS) == "abc"
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
    assert parse_prediction({"prediction": {"type": "content", "content": parts}},
                            LIMITS) == "abcd"
    assert parse_prediction({"prediction": {"type": "content", "content": ""}}, LIMITS) == ""


def test_n_above_one_is_refused_with_a_prediction_as_openai_does():
    with pytest.raises(APIError) as info:
        parse_prediction({"prediction": {"type": "content", "content": "a"}}, LIMITS, n=2)
    assert (info.value.param, info.value.code) == ("n", "unsupported_value")


@pytest.mark.parametrize("value, param", [
    ("sometimes", "speculation"), (True, "speculation"), (3, "speculation"),
    ({"max_draft_tokens": -1}, "speculation.max_draft_tokens"),
    ({"max_draft_tokens": 9}, "speculation.max_draft_tokens"),
    ({"max_draft_tokens": 2.5}, "speculation.max_draft_tokens"),
    ({"max_draft_tokens": True}, "speculation.max_draft_tokens"),
    ({"k": 2}, "speculation.k"),
])
def test_bad_speculation_is_a_400(value, param):
    with pytest.raises(APIError) as info:
        parse_speculation({"speculation": value}, LIMITS)
    assert (info.value.status, info.value.param) == (400, param)


def test_speculation_values():
    assert parse_speculation({}, LIMITS) is None
    assert parse_speculation({"speculation": "auto"}, LIMITS) is None
    assert parse_speculation({"speculation": "off"}, LIMITS).off
    assert parse_speculation({"speculation": {"max_draft_tokens": 0}}, LIMITS).off
    got = parse_speculation({"speculation": {"max_draft_tokens": 8}}, LIMITS)
    assert not got.off and got.max_draft_tokens == 8


# --- through the openai SDK ------------------------------------------------------------------
async def test_chat_prediction_end_to_end(sdk, backend):
    expected = DEFAULT_TEXT
    prediction = expected[:10] + "XX" + expected[12:]  # two bytes (tokens) wrong
    out = await sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "rewrite"}], max_tokens=100,
        temperature=0, prediction={"type": "content", "content": prediction})
    assert out.choices[0].message.content == expected  # the prediction never changes the output
    rid = only(backend)
    # the prediction's ids travel as their own raw frame, no special tokens (no BOS)
    assert backend.predictions[rid] == list(prediction.encode())
    assert not backend.requests[rid].HasField("speculation")  # the server's default
    details = out.usage.completion_tokens_details
    # what the backend counted: all but the two wrong bytes used
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (28, 2)
    assert out.usage.completion_tokens == len(SCRIPT)


async def test_completions_prediction_and_stream_usage(sdk, backend, client):
    prediction = DEFAULT_TEXT
    stream = await sdk.completions.create(
        model="tiny", prompt="def f():", max_tokens=100, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"prediction": {"type": "content", "content": prediction}})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == DEFAULT_TEXT
    final = chunks[-1]
    assert final.choices == []
    details = final.usage.completion_tokens_details
    n = len(prediction.encode())
    # a perfect prediction: every token accepted (the fake drafts until EOS), none rejected
    assert details.accepted_prediction_tokens == n and details.rejected_prediction_tokens == 0
    # fewer, larger deltas than tokens: k + 1 tokens a step
    assert len([c for c in chunks if c.choices]) < len(SCRIPT) // 2
    metrics = await (await client.get("/metrics")).text()

    def value(name: str, labels: str = "") -> float:
        m = re.search(rf"^{re.escape(name)}{{{labels}[^}}]*}} (\S+)$", metrics, re.MULTILINE)
        assert m, f"{name} missing from /metrics"
        return float(m.group(1))

    spec = backend.spec[only(backend)]
    assert value("vllm:spec_decode_num_draft_tokens_total") == spec["drafts"]
    assert value("vllm:spec_decode_num_accepted_tokens_total") == spec["accepted"]
    assert value("vllm:spec_decode_num_drafts_total") == spec["steps"] > 1
    assert value("tidegate_spec_decode_num_draft_tokens_total",
                 'source="prediction"') == spec["drafts"]
    assert value("tidegate_prediction_tokens_total", 'outcome="accepted"') == n


async def test_stop_string_inside_an_accepted_run_ends_the_output_there(client, backend):
    """A step brings k + 1 tokens; a stop string completed by its third token ends the output
    at that token, as decoding one token a step does: the same text, completion_tokens and
    logprobs (none for the tokens after it), finish "stop", and the request aborted on its
    backend (its blocks back in the pool) instead of running to its end."""
    free_before = backend.num_free_blocks
    got = {}
    for mode in ("off", "auto"):
        body = {"model": "tiny", "prompt": "x", "max_tokens": 100, "temperature": 0,
                "logprobs": 1, "stop": ["ld"], "speculation": mode,
                "prediction": {"type": "content", "content": DEFAULT_TEXT}}
        status, got[mode] = await post(client, "/v1/completions", body)
        assert status == 200, got[mode]
    off, spec = got["off"]["choices"][0], got["auto"]["choices"][0]
    num = len("Hello, wörld".encode())  # the stop's last token included, as decoding has it
    assert spec["text"] == off["text"] == "Hello, wör"
    assert spec["finish_reason"] == off["finish_reason"] == "stop"
    assert got["auto"]["usage"]["completion_tokens"] == got["off"]["usage"]["completion_tokens"] \
        == num
    assert spec["logprobs"] == off["logprobs"] and len(spec["logprobs"]["tokens"]) == num
    spec_rid = list(backend.requests)[-1]
    assert backend.spec[spec_rid]["accepted"] > 0  # it did take several tokens a step
    for _ in range(200):  # (the abort crosses the socket after the reply)
        if spec_rid in backend.aborted:
            break
        await asyncio.sleep(0.01)
    assert spec_rid in backend.aborted and not backend.running
    assert backend.num_free_blocks == free_before


async def test_per_request_speculation_off_and_cap(sdk, backend):
    body = {"prediction": {"type": "content", "content": DEFAULT_TEXT}, "speculation": "off"}
    out = await sdk.completions.create(model="tiny", prompt="x", max_tokens=100,
                                       temperature=0, extra_body=body)
    assert out.choices[0].text == DEFAULT_TEXT
    rid = only(backend)
    assert backend.requests[rid].speculation.off
    assert backend.spec[rid]["drafts"] == 0
    # the usage counts the prediction's tokens found in the output, drafted or not
    assert out.usage.completion_tokens_details.accepted_prediction_tokens == \
        len(DEFAULT_TEXT.encode())
    assert out.usage.completion_tokens_details.rejected_prediction_tokens == 0
    backend.requests.clear()
    body["speculation"] = {"max_draft_tokens": 2}
    out = await sdk.completions.create(model="tiny", prompt="x", max_tokens=100,
                                       temperature=0, extra_body=body)
    wire = backend.requests[only(backend)].speculation
    assert not wire.off and wire.max_draft_tokens == 2
    assert backend.spec[only(backend)]["drafts"] <= 2 * len(SCRIPT) // 3 + 2


async def test_no_prediction_keeps_usage_as_before(sdk, backend):
    out = await sdk.completions.create(model="tiny", prompt="x", max_tokens=5)
    assert out.usage.completion_tokens_details is None
    assert only(backend) not in backend.predictions


async def test_sdk_sees_the_400s(sdk, backend):
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}],
            prediction={"type": "file", "content": "x"})
    assert info.value.body["param"] == "prediction.type"
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
            prediction={"type": "content", "content": "x"})
    assert info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.completions.create(model="tiny", prompt="x",
                                     extra_body={"speculation": {"max_draft_tokens": 10**6}})
    assert info.value.body["param"] == "speculation.max_draft_tokens"
    assert not backend.requests  # nothing reached the backend


async def test_prediction_longer_than_the_context_is_a_400(client, backend):
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "prediction": {"type": "content", "content": "y" * 3000}})
    assert status == 400 and body["error"]["code"] == "prediction_too_long"


async def test_raw_sse_final_usage_chunk_has_details(client, backend):
    resp = await client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 100,
        "stream_options": {"include_usage": True},
        "prediction": {"type": "content", "content": [{"type": "text", "text": DEFAULT_TEXT}]}})
    events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["completion_tokens_details"] == {
        "accepted_prediction_tokens": len(DEFAULT_TEXT.encode()),
        "rejected_prediction_tokens": 0}


# --- the ZMQ front door and its client library -----------------------------------------------
async def test_client_library_prediction(client, backend, door):
    async with AsyncClient(door) as c:
        got = await c.generate("hi", max_tokens=100, prediction=DEFAULT_TEXT[:20])
        assert got.text == DEFAULT_TEXT
        rid = only(backend)
        predicted = list(DEFAULT_TEXT[:20].encode())
        assert backend.predictions[rid] == predicted
        assert got.accepted_prediction_tokens == len(predicted)
        assert got.rejected_prediction_tokens == 0
        assert got.num_draft_tokens == backend.spec[rid]["drafts"]
        assert got.num_accepted_draft_tokens == backend.spec[rid]["accepted"]
        backend.requests.clear()
        # ids instead of text, OpenAI's dict, and per-request off
        got = await c.generate("hi", max_tokens=100, prediction=list(b"Hello"),
                               speculation="off")
        wire = backend.requests[only(backend)]
        assert wire.speculation.off and backend.predictions[only(backend)] == list(b"Hello")
        assert got.num_draft_tokens == 0
        assert got.accepted_prediction_tokens == 5 and got.rejected_prediction_tokens == 0
        backend.requests.clear()
        got = await c.generate("hi", max_tokens=100, speculation={"max_draft_tokens": 3},
                               prediction={"type": "content", "content": "Hello"})
        assert backend.requests[only(backend)].speculation.max_draft_tokens == 3
        assert got.accepted_prediction_tokens == 5


async def test_front_door_refuses_bad_predictions(client, backend, door):
    from gateway.client import InvalidRequestError

    async with AsyncClient(door) as c:
        with pytest.raises(InvalidRequestError, match="out of range"):
            await c.generate("hi", max_tokens=4, prediction=[1, 2, 10**6])
        with pytest.raises(InvalidRequestError, match="max_draft_tokens"):
            await c.generate("hi", max_tokens=4, speculation={"max_draft_tokens": 1000})
    assert not backend.requests


async def test_prediction_as_token_ids(client, backend):
    """Our extension: `content` as token ids reaches the backend as they are (an oracle
    benchmark needs a prediction exact to the token)."""
    ids = list(DEFAULT_TEXT.encode())[:12]
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "max_tokens": 100, "prediction": {"type": "content", "content": ids}})
    assert status == 200, body
    assert backend.predictions[only(backend)] == ids
    assert body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 12
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "prediction": {"type": "content", "content": [1, 2, 100000]}})
    assert status == 400 and body["error"]["param"] == "prediction.content"
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "prediction": {"type": "content", "content": [1, -2]}})
    assert status == 400 and body["error"]["param"] == "prediction.content"


# --- the usage count (scheduler.prediction_usage.prediction_overlap) ------------------------------
def lcs(a: list[int], b: list[int]) -> int:
    import difflib

    return sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False)
               .get_matching_blocks())


def test_overlap_exact_unrelated_and_edges():
    from scheduler.prediction_usage import prediction_overlap

    seq = list(range(100))
    assert prediction_overlap(seq, seq) == 100
    assert prediction_overlap(seq, list(range(100, 200))) == 0
    assert prediction_overlap([], seq) == 0 and prediction_overlap(seq, []) == 0
    assert prediction_overlap(seq, seq[:40]) == 40  # output stopped early
    assert prediction_overlap(seq[:40], seq) == 40
    # a line replaced: its tokens are rejected, everything after it is found again
    edited = seq[:30] + [900 + t for t in range(12)] + seq[42:]
    assert prediction_overlap(edited, seq) == 88
    # a line inserted in the output, one deleted from it
    assert prediction_overlap(seq, seq[:50] + [999] * 7 + seq[50:]) == 100
    assert prediction_overlap(seq, seq[:50] + seq[60:]) == 90


@pytest.mark.parametrize("keep", [0.9, 0.75, 0.5, 0.0])
def test_overlap_is_close_to_a_longest_common_subsequence_on_code_edits(keep):
    import sysconfig
    from pathlib import Path

    from tokenizers import Tokenizer

    from scheduler.prediction_usage import prediction_overlap
    from sims.edit_workload import alter_text
    from tokenizer.byte_level import build_byte_level_tokenizer_json

    tok = Tokenizer.from_str(build_byte_level_tokenizer_json())
    text = Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text()[:3000]
    out = tok.encode(text).ids
    pred = tok.encode(alter_text(text, keep, seed=1)[0]).ids
    got, best = prediction_overlap(pred, out), lcs(pred, out)
    assert 0.9 * best <= got <= best


async def test_bench_zmq_load_passes_the_speculation_field(client, backend, door):
    from bench.serving.loadgen import run_zmq

    records, _, _ = await run_zmq(door, [0.0, 0.0], [[1, 2, 3], [4, 5]], [4, 4],
                                  speculation={"max_draft_tokens": 3})
    assert all(r.ok for r in records)
    assert [r.speculation.max_draft_tokens for r in backend.requests.values()] == [3, 3]


def test_client_takes_the_prediction_usage_of_the_finishing_record():
    """Straight from a backend, the engine's running count while decoding may be above the
    exact count its finishing record carries: the Completion takes the latter (not the max)."""
    from gateway.client import Delta, _Base

    deltas = [Delta("a", [1, 2], None, "r", 3, None, 4, 3, 2, 0),
              Delta("b", [3], "stop", "r", 3, None, 4, 3, 1, 5)]
    done = _Base._completion(None, [9, 9, 9], {}, deltas)
    assert (done.accepted_prediction_tokens, done.rejected_prediction_tokens) == (1, 5)
    assert (done.num_draft_tokens, done.num_accepted_draft_tokens) == (4, 3)
