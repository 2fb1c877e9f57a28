"""Predicted Outputs end to end (issue 28): `tidegate serve` with its embedded tiny engine,
driven by the openai SDK and the ZMQ client library. The prediction never changes the output
(greedy identity), the usage details count what the engine used of it, `speculation: "off"`
drafts nothing, and /metrics counts the drafts under vLLM's names."""
from __future__ import annotations

import re
import time
import urllib.request

import openai
import pytest
from serve_helpers import serving
from test_gateway_http import ipc_address

from gateway.client import Client

pytestmark = pytest.mark.slow
PROMPT = "def fib(n):"
N = 40


@pytest.fixture(scope="module")
def server():
    door = ipc_address()
    with serving("--model", "tiny", "--zmq-listen", door) as s:
        yield {**s, "door": door}


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def baseline(sdk):
    out = sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=0,
                                 extra_body={"return_token_ids": True, "ignore_eos": True,
                                             "speculation": "off"})
    assert out.usage.completion_tokens_details is None  # no prediction: usage as before
    return out.choices[0]


def spec_counter(server, name: str) -> float:
    """The counter summed over engines and draft sources, once settled: the backend reports
    speculation by source in its LoadReports, the one of its busy -> idle edge right after a
    request's last output, which a scrape at once may still beat (reads 0.2 s apart agree)."""
    def read() -> float:
        text = urllib.request.urlopen(server["url"] + "/metrics").read().decode()
        return sum(float(m.group(1)) for m in re.finditer(
            rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.MULTILINE))

    last = read()
    for _ in range(15):
        time.sleep(0.2)
        now = read()
        if now == last:
            return now
        last = now
    return last


def create(sdk, **extra):
    return sdk.completions.create(model="tiny", prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True,
                                              **extra})


def test_exact_prediction_is_all_accepted_and_changes_nothing(sdk, server, baseline):
    # The module's first requests with a prediction: the load policy has not measured its knee
    # yet (it needs three steps of two sizes), so it drafts. On this CPU it then measures a knee
    # of about one token (a verify costs more than a decode) and stops drafting: by design,
    # which is why only this test asserts drafts.
    drafted = spec_counter(server, "vllm:spec_decode_num_draft_tokens_total")
    for content in (baseline.token_ids, baseline.text):  # ids (our extension) and text
        out = create(sdk, prediction={"type": "content", "content": content})
        assert out.choices[0].token_ids == baseline.token_ids
        details = out.usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (N, 0)
    assert spec_counter(server, "vllm:spec_decode_num_draft_tokens_total") > drafted
    assert spec_counter(server, "vllm:spec_decode_num_accepted_tokens_total") > 0


def wrong_prediction(ids: list[int]) -> list[int]:
    """Tokens 10..19 replaced by ids the output never holds."""
    return ids[:10] + [(t + 1) % 256 for t in ids[10:20]] + ids[20:]


def test_wrong_lines_leave_the_output_unchanged(sdk, baseline):
    wrong = wrong_prediction(list(baseline.token_ids))
    out = create(sdk, prediction={"type": "content", "content": wrong})
    assert out.choices[0].token_ids == baseline.token_ids  # greedy identity
    details = out.usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == N


def test_rejected_counts_predicted_tokens_missing_from_the_output(sdk, baseline):
    """Counted by the gateway: the engine's count (its drafting's re-alignment) called all 40
    accepted here, on the tiny model's repetitive output ('nnnn...')."""
    wrong = wrong_prediction(list(baseline.token_ids))
    out = create(sdk, prediction={"type": "content", "content": wrong})
    missing = sum(1 for t in wrong if t not in set(baseline.token_ids))
    assert out.usage.completion_tokens_details.rejected_prediction_tokens >= missing > 0


def test_speculation_off_drafts_nothing(sdk, server, baseline):
    drafted = spec_counter(server, "vllm:spec_decode_num_draft_tokens_total")
    out = create(sdk, prediction={"type": "content", "content": baseline.token_ids},
                 speculation="off")
    assert out.choices[0].token_ids == baseline.token_ids
    assert spec_counter(server, "vllm:spec_decode_num_draft_tokens_total") == drafted
    assert out.usage.completion_tokens_details is not None


def test_chat_stream_final_usage_has_the_details(sdk, baseline):
    chunks = list(sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True},
        prediction={"type": "content", "content": "hello there"}))
    usage = chunks[-1].usage
    assert usage.completion_tokens == 12
    details = usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens >= 0
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                    prediction={"type": "content", "content": "x"}, n=2)
    assert info.value.body["param"] == "n"


def test_zmq_client_prediction(server, baseline):
    with Client(server["door"]) as c:
        got = c.generate(PROMPT, max_tokens=N, temperature=0, ignore_eos=True,
                         prediction=list(baseline.token_ids))
    assert got.token_ids == baseline.token_ids
    assert got.accepted_prediction_tokens == N and got.rejected_prediction_tokens == 0
    assert got.num_draft_tokens >= got.num_accepted_draft_tokens  # drafts: the policy's call
