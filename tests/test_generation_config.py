"""A model's generation_config.json as its sampling defaults (issue 36), as vLLM's
`--generation-config auto`: read by the backend (`backend.model.generation_config`), announced in
BackendInfo.generation_defaults, applied by the gateway to the fields a request leaves out
(`gateway.generation_defaults`); through the HTTP API against the fake backend, and end to end
through `tidegate serve`."""
from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest
from serve_helpers import start_serve
from test_gateway_fakes import DEFAULT_TEXT, EOS, FakeBackend
from test_gateway_http import ipc_address, make_config, post

from backend.errors import ModelLoadError
from backend.model.generation_config import load_generation_defaults, sampling_defaults
from gateway.app import create_app

ROOT = Path(__file__).resolve().parents[1]


# ---- the file --------------------------------------------------------------------------------------

def _model_dir(tmp_path: Path, config: dict | str) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (d / "generation_config.json").write_text(text)
    return d


def test_auto_reads_the_sampling_fields_of_the_models_file(tmp_path):
    d = _model_dir(tmp_path, {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False,
                              "temperature": 0.0, "top_p": 0.9, "top_k": 40,
                              "repetition_penalty": 1.15, "max_new_tokens": 128,
                              "transformers_version": "5.0"})
    assert load_generation_defaults("auto", str(d)) == {
        "temperature": 0.0, "top_p": 0.9, "top_k": 40.0, "repetition_penalty": 1.15,
        "max_tokens": 128.0}
    assert load_generation_defaults("none", str(d)) == {}
    assert load_generation_defaults("vllm", str(d)) == {}  # vLLM's name for "off"
    # a preset (no directory) or a directory without the file: no defaults
    assert load_generation_defaults("auto", "tiny") == {}
    assert load_generation_defaults("auto", str(tmp_path)) == {}
    # another directory's file, or the file itself
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text('{"frequency_penalty": 0.5}')
    assert load_generation_defaults(str(other), str(d)) == {"frequency_penalty": 0.5}
    assert load_generation_defaults(str(other / "generation_config.json"), "tiny") == \
        {"frequency_penalty": 0.5}


@pytest.mark.parametrize("bad", [{"temperature": 3}, {"temperature": "0.2"}, {"top_p": 0},
                                 {"top_k": 2.5}, {"repetition_penalty": 0},
                                 {"presence_penalty": -3}, {"max_new_tokens": 0},
                                 {"temperature": True}, {"min_p": float("nan")}])
def test_a_value_a_request_could_not_carry_is_refused_at_start(bad):
    with pytest.raises(ModelLoadError, match="generation_config.json"):
        sampling_defaults(bad)


def test_a_missing_directory_or_broken_file_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no generation_config.json"):
        load_generation_defaults(str(tmp_path / "nowhere"), "tiny")
    d = _model_dir(tmp_path, "{not json")
    with pytest.raises(ModelLoadError, match="not a JSON"):
        load_generation_defaults("auto", str(d))


def test_the_shipped_tiny_coder_file_is_valid_and_greedy():
    model = ROOT / "models" / "tiny-coder"
    if not (model / "generation_config.json").is_file():
        pytest.skip("models/tiny-coder is not in this checkout")
    d = load_generation_defaults("auto", str(model))
    assert d.get("temperature") == 0.0  # code completion: greedy unless the request says not
    # No repetition penalty by default (issue 36, v4): it divides the logits of every prompt
    # token, and a FIM prompt is the code around the hole, whose names the middle must reuse
    # (validation: 14 of 160 FIM middles exact with repetition 1.1 + frequency 0.4, 17 with
    # frequency 0.8 alone). The frequency penalty counts output tokens only.
    assert d.get("repetition_penalty", 1.0) == 1.0
    assert d.get("frequency_penalty", 0.0) > 0.0  # what ends loops of varying lines


# ---- the gateway: defaults for what a request leaves out --------------------------------------------

DEFAULTS = {"temperature": 0.0, "top_p": 0.8, "top_k": 20.0, "repetition_penalty": 1.3,
            "frequency_penalty": 0.25, "max_tokens": 8.0}


@pytest.fixture
async def backend_of():
    started = []

    async def start(defaults: dict | None):
        seen = []

        def script(prompt_ids, sampling):
            seen.append(sampling)
            return list(DEFAULT_TEXT.encode()) + [EOS]

        extra = {"generation_defaults": defaults} if defaults is not None else {}
        b = await FakeBackend(ipc_address(), script=script, info_extra=extra).start()
        b.seen = seen
        started.append(b)
        return b

    yield start
    for b in started:
        await b.stop()


async def _client(aiohttp_client, backend):
    return await aiohttp_client(create_app(make_config(backend.address), startup_wait_s=5.0))


async def test_the_models_defaults_fill_the_fields_a_request_leaves_out(aiohttp_client, backend_of):
    backend = await backend_of(DEFAULTS)
    client = await _client(aiohttp_client, backend)
    status, body = await post(client, "/v1/completions", {"prompt": "x"})
    assert status == 200, body
    s = backend.seen[-1]
    assert s.temperature == 0.0 and s.top_p == pytest.approx(0.8) and s.top_k == 20
    assert s.repetition_penalty == pytest.approx(1.3) and s.frequency_penalty == 0.25
    assert s.presence_penalty == 0.0 and s.min_p == 0.0  # not in the file: the API's defaults
    assert s.max_tokens == 8  # completions' default 16, capped by max_new_tokens
    # chat: no max_tokens fills the context, capped too
    status, body = await post(client, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    s = backend.seen[-1]
    assert s.max_tokens == 8 and s.temperature == 0.0 and s.repetition_penalty == pytest.approx(1.3)


async def test_a_field_the_request_gives_wins(aiohttp_client, backend_of):
    backend = await backend_of(DEFAULTS)
    client = await _client(aiohttp_client, backend)
    status, body = await post(client, "/v1/completions", {
        "prompt": "x", "temperature": 0.7, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
        "frequency_penalty": 0.0, "max_tokens": 4})
    assert status == 200, body
    s = backend.seen[-1]
    assert s.temperature == pytest.approx(0.7) and s.top_p == 1.0 and s.top_k <= 0
    assert s.repetition_penalty in (0.0, 1.0)  # the wire reads 0 as 1 (off)
    assert s.frequency_penalty == 0.0 and s.max_tokens == 4
    # null is "left out", as in vLLM's request models
    status, body = await post(client, "/v1/completions", {"prompt": "x", "temperature": None})
    assert status == 200, body
    assert backend.seen[-1].temperature == 0.0
    # max_new_tokens caps an explicit max_tokens too (vLLM's get_max_tokens)
    status, body = await post(client, "/v1/completions", {"prompt": "x", "max_tokens": 100})
    assert status == 200, body
    assert backend.seen[-1].max_tokens == 8
    # a min_tokens the cap cannot hold is the client's error, in the OpenAI shape
    status, body = await post(client, "/v1/completions", {"prompt": "x", "min_tokens": 9})
    assert status == 400 and body["error"]["param"] == "min_tokens", body


async def test_without_a_generation_config_the_api_defaults_stay(aiohttp_client, backend_of):
    backend = await backend_of(None)
    client = await _client(aiohttp_client, backend)
    status, body = await post(client, "/v1/completions", {"prompt": "x"})
    assert status == 200, body
    s = backend.seen[-1]
    assert s.temperature == 1.0 and s.repetition_penalty in (0.0, 1.0) and s.max_tokens == 16


# ---- end to end: tidegate serve --generation-config ----------------------------------------------

def _serve(*args: str):
    proc, _, url = start_serve("--model", "tiny", *args)
    return proc, url


def _complete(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_serve_honours_the_generation_config_and_turns_it_off(tmp_path):
    d = _model_dir(tmp_path, {"temperature": 0.0, "repetition_penalty": 1.5,
                              "max_new_tokens": 5})
    prompt = {"prompt": "def fib(n):", "ignore_eos": True}
    proc, url = _serve("--generation-config", str(d))
    try:
        # no sampling field: greedy with the file's penalty, at most max_new_tokens
        a = _complete(url, {**prompt, "seed": 1})
        b = _complete(url, {**prompt, "seed": 2})
        explicit = _complete(url, {**prompt, "temperature": 0, "repetition_penalty": 1.5,
                                   "max_tokens": 5})
        assert a["usage"]["completion_tokens"] == 5
        assert a["choices"][0]["text"] == b["choices"][0]["text"] == explicit["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    proc, url = _serve("--generation-config", "none")
    try:  # the API's own defaults: 16 tokens, sampled at temperature 1
        outs = [_complete(url, {**prompt, "seed": s}) for s in (1, 2, 3)]
        assert all(o["usage"]["completion_tokens"] == 16 for o in outs)
        assert len({o["choices"][0]["text"] for o in outs}) > 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


# ---- the evaluation decodes as the server would -----------------------------------------------------

def test_eval_decodes_with_the_generation_configs_penalty_like_a_reference(tmp_path):
    """`tidegate eval code --generation-config`: greedy_decode with a repetition and frequency
    penalty equals a step-by-step reference (full-sequence logits, the penalties written out
    here: CTRL's division/multiplication over prompt and output tokens, minus frequency x count
    over the output), and differs from plain greedy on this prompt."""
    torch = pytest.importorskip("torch")
    from evals.code import decoding_params
    from evals.engine import (
        EngineSettings,
        EngineShape,
        build_engine,
        greedy_decode,
        sequence_logits,
    )

    d = _model_dir(tmp_path, {"temperature": 0.0, "repetition_penalty": 1.8,
                              "frequency_penalty": 0.7, "max_new_tokens": 3})
    params, described = decoding_params(str(d), "tiny")
    assert described["repetition_penalty"] == 1.8 and "max_tokens" not in described
    assert decoding_params("none", "tiny") == (None, {"generation_config": "none",
                                                      "sampling": "greedy"})
    engine, _ = build_engine("tiny", EngineSettings(), EngineShape(max_model_len=256))
    prompt = [5, 9, 5, 9, 5, 9, 5, 9, 17, 17]
    got = greedy_decode(engine, [prompt], 12, params=params)[0]
    plain = greedy_decode(engine, [prompt], 12)[0]
    seq, ref = list(prompt), []
    for t in range(12):
        logits = sequence_logits(engine, seq, f"ref{t}")[-1].double()
        seen = set(seq)
        for tok in seen:
            v = logits[tok]
            logits[tok] = v / 1.8 if v > 0 else v * 1.8
        for tok in set(ref):
            logits[tok] -= 0.7 * ref.count(tok)
        nxt = int(torch.argmax(logits))
        ref.append(nxt)
        seq.append(nxt)
    assert got == ref
    assert got != plain
