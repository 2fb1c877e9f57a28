"""/v1/messages and /v1/messages/count_tokens through Anthropic's own SDK, unchanged, against the
fake backend: text, stop sequences, tool_use blocks (forced and parsed), the two-turn tool loop,
streaming events, and errors in Anthropic's shape."""
from __future__ import annotations

import anthropic
import pytest
from test_gateway_fakes import FakeBackend
from test_gateway_http import make_config, post
from test_structured_gateway import CALL, Recorder, ipc_address

from gateway.app import create_app
from proto import tidegate_pb2 as pb

WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
async def messages_client(aiohttp_client):
    backends = []

    async def make(text: str = "Hello there.", **config):
        rec = Recorder(text)
        b = await FakeBackend(ipc_address(), script=rec).start()
        backends.append(b)
        app = create_app(make_config(b.address, **config), startup_wait_s=5.0)
        client = await aiohttp_client(app)
        api = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="k",
                                       max_retries=0)
        return client, api, rec
    yield make
    for b in backends:
        await b.stop()


async def test_text_reply_and_usage(messages_client):
    _, api, rec = await messages_client()
    msg = await api.messages.create(model="tiny", max_tokens=50, system="Be brief.",
                                    messages=USER)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello there."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens == len(rec.prompts[-1])
    assert msg.usage.output_tokens == len("Hello there.") + 1  # EOS counts
    prompt = rec.prompt_text()
    assert "Be brief." in prompt and "Weather in Paris?" in prompt


async def test_stop_sequence_is_named_and_cut(messages_client):
    _, api, _ = await messages_client("one two STOP three")
    msg = await api.messages.create(model="tiny", max_tokens=50, messages=USER,
                                    stop_sequences=["STOP", "zzz"])
    assert msg.content[0].text == "one two "
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"


async def test_max_tokens_stop_reason(messages_client):
    _, api, _ = await messages_client()
    msg = await api.messages.create(model="tiny", max_tokens=3, messages=USER)
    assert msg.stop_reason == "max_tokens" and msg.content[0].text == "Hel"


async def test_forced_tool_gives_tool_use_block(messages_client):
    _, api, rec = await messages_client(CALL)
    msg = await api.messages.create(model="tiny", max_tokens=100, messages=USER,
                                    tools=[WEATHER], tool_choice={"type": "any"})
    assert rec.samplings[-1].grammar.kind == pb.Grammar.GRAMMAR
    (block,) = msg.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.name == "get_weather" and block.input == {"city": "Paris"}
    assert msg.stop_reason == "tool_use"


async def test_two_turn_tool_loop(messages_client):
    _, api, rec = await messages_client("Sunny.")
    msg = await api.messages.create(model="tiny", max_tokens=50, tools=[WEATHER], messages=[
        *USER,
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21C",
             "cache_control": {"type": "ephemeral"}}]}])
    prompt = rec.prompt_text()
    assert 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
        in prompt
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt
    assert msg.content[0].text == "Sunny." and msg.stop_reason == "end_turn"


async def test_streaming_events_through_the_sdk(messages_client):
    _, api, _ = await messages_client("Let me look.\n" + CALL)
    names = []
    async with api.messages.stream(model="tiny", max_tokens=200, messages=USER,
                                   tools=[WEATHER]) as stream:
        async for event in stream:
            names.append(event.type)
        final = await stream.get_final_message()
    assert names[0] == "message_start"
    assert "content_block_start" in names and "content_block_stop" in names
    assert names[-1] == "message_stop"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me look.\n"
    assert final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


async def test_streaming_text_with_stop_sequence(messages_client):
    _, api, _ = await messages_client("abc END def")
    async with api.messages.stream(model="tiny", max_tokens=50, messages=USER,
                                   stop_sequences=["END"]) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "abc " and final.stop_sequence == "END"


async def test_count_tokens_matches_the_prompt(messages_client):
    _, api, rec = await messages_client()
    counted = await api.messages.count_tokens(model="tiny", messages=USER, tools=[WEATHER])
    await api.messages.create(model="tiny", max_tokens=5, messages=USER, tools=[WEATHER])
    assert counted.input_tokens == len(rec.prompts[-1])


@pytest.mark.parametrize("body,param_word", [
    ({"messages": USER}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "image"),
    ({"max_tokens": 5, "messages": USER, "tools": [WEATHER],
      "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
    ({"max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 5, "messages": USER, "frobnicate": 1}, "frobnicate"),
    ({"max_tokens": 5, "messages": USER, "output_format": {
        "type": "json_schema", "schema": {"type": "strin"}}}, "output_format"),
])
async def test_errors_are_anthropic_shaped(messages_client, body, param_word):
    client, api, rec = await messages_client()
    status, out = await post(client, "/v1/messages", {"model": "tiny", **body})
    assert status == 400 and out["type"] == "error", out
    assert out["error"]["type"] == "invalid_request_error" and param_word in out["error"]["message"]
    if "max_tokens" in body:  # (the SDK itself refuses a call without it)
        extra = {k: v for k, v in body.items() if k not in ("max_tokens", "messages")}
        with pytest.raises(anthropic.BadRequestError) as err:
            await api.messages.create(model="tiny", max_tokens=body["max_tokens"],
                                      messages=body["messages"], extra_body=extra)
        assert err.value.body["error"]["type"] == "invalid_request_error"
    assert rec.samplings == []


async def test_auth_and_unknown_model_through_the_sdk(messages_client):
    client, api, _ = await messages_client(api_key="secret")
    with pytest.raises(anthropic.AuthenticationError):
        await api.messages.create(model="tiny", max_tokens=5, messages=USER)
    good = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="secret",
                                    max_retries=0)
    assert (await good.messages.create(model="tiny", max_tokens=5, messages=USER)).content
    with pytest.raises(anthropic.NotFoundError) as err:
        await good.messages.create(model="gpt-9", max_tokens=5, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"


async def test_lone_surrogate_in_a_tool_input_is_a_400(messages_client):
    """Found by the HTTP fuzzer: a tool_use block's input holding "\\ud800" reached the tokenizer
    through the rendered chat (the field checks do not walk an input object): a 500 before."""
    client, _, _ = await messages_client()
    body = ('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", '
            '"input": {"a": "x\\ud800y"}}]}, {"role": "user", "content": [{"type": "tool_result", '
            '"tool_use_id": "t1", "content": "ok"}]}]}')
    for path in ("/v1/messages/count_tokens", "/v1/messages"):
        data = body if path.endswith("count_tokens") else body[:-1] + ', "max_tokens": 5}'
        resp = await client.post(path, data=data, headers={"content-type": "application/json"})
        assert resp.status == 400, (path, await resp.text())
        assert "not valid Unicode" in (await resp.json())["error"]["message"]
