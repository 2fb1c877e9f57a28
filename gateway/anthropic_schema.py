"""Anthropic Messages request bodies -> the records the chat path already serves.

    system            str | [text blocks]                  -> a system message
    messages[].content str | [text | tool_use | tool_result | thinking blocks]
                      user text -> user, tool_result -> a `tool` message, assistant text and
                      tool_use -> an assistant message with `tool_calls`
    tools             [{name, description, input_schema}]  -> gateway.tools.Tool
    tool_choice       auto | any | tool(name) | none, disable_parallel_tool_use
    stop_sequences, max_tokens (required), temperature, top_p, top_k, metadata.user_id
    output_format     {"type": "json_schema", "schema": ...} (Anthropic's structured outputs)

`cache_control` is accepted on every block and on tools (the prefix cache needs no hint).
Images, documents and server tools are a 400 naming the block. A final assistant message is a
prefill: the reply continues it. Every failure is an APIError(400) naming the parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gateway.body_checks import LIMITS, RequestLimits, check_text, get_bool, scalar
from gateway.errors import APIError, bad_request
from gateway.openai_schema import ChatMessage, SamplingParams, ServingOptions
from gateway.sampling_fields import parse_sampling
from gateway.structured import Structured
from gateway.tools import ToolConfig, check_tool_name, make_tool, tool_grammar
from tokenizer.grammar import GrammarSpec

MESSAGES_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "tools", "tool_choice", "metadata", "thinking", "service_tier",
    "output_format", "container", "mcp_servers", "context_management"})
COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    model: str | None
    messages: tuple[ChatMessage, ...]  # system first when given
    prefill: str  # a final assistant message's text: the reply continues it
    sampling: SamplingParams
    options: ServingOptions
    structured: Structured | None


def _text_of(value: Any, param: str) -> str:
    """A string, or text blocks (other block kinds: 400)."""
    if isinstance(value, str):
        return check_text(value, param)
    if not isinstance(value, list):
        raise bad_request(f"'{param}' must be a string or an array of text blocks.", param)
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            raise bad_request(f"'{param}[{j}]' must be a text block.", f"{param}[{j}]")
        parts.append(check_text(block["text"], f"{param}[{j}].text"))
    return "".join(parts)


def _blocks(content: Any, param: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{param}' must be a string or an array of content blocks.", param)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"'{param}[{j}]' must be a content block object.", f"{param}[{j}]")
    return content


def _user_messages(content: Any, param: str) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    text: list[str] = []
    for j, block in enumerate(_blocks(content, param)):
        p, kind = f"{param}[{j}]", block["type"]
        if kind == "text":
            text.append(_text_of([block], param))
        elif kind == "tool_result":
            use_id = block.get("tool_use_id")
            if not isinstance(use_id, str):
                raise bad_request(f"'{p}.tool_use_id' is required.", f"{p}.tool_use_id")
            result = _text_of(block.get("content") or "", f"{p}.content")
            if block.get("is_error"):
                result = "Error: " + result
            out.append(ChatMessage("tool", result, (), use_id))
        else:
            raise bad_request(f"'{p}' is a {kind!r} block; user messages take text and "
                              "tool_result blocks here.", f"{p}.type", "unsupported_parameter")
    if text or not out:
        out.append(ChatMessage("user", "".join(text)))
    return out


def _assistant_message(content: Any, param: str) -> ChatMessage:
    text: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(_blocks(content, param)):
        p, kind = f"{param}[{j}]", block["type"]
        if kind == "text":
            text.append(_text_of([block], param))
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise bad_request(f"'{p}' needs a name and an input object.", p)
            calls.append({"id": str(block.get("id") or ""), "name": name, "arguments": args})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # no reasoning here to continue; dropped as Anthropic drops old ones
        else:
            raise bad_request(f"'{p}' is a {kind!r} block; assistant messages take text and "
                              "tool_use blocks here.", f"{p}.type", "unsupported_parameter")
    return ChatMessage("assistant", "".join(text), tuple(calls))


def parse_conversation(body: dict) -> tuple[list[ChatMessage], str]:
    """(messages, prefill) of a Messages body."""
    out: list[ChatMessage] = []
    if body.get("system") is not None:
        out.append(ChatMessage("system", _text_of(body["system"], "system")))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages")
    prefill = ""
    for i, msg in enumerate(messages):
        param = f"messages.{i}"
        if not isinstance(msg, dict):
            raise bad_request(f"'{param}' must be an object.", param)
        role, content = msg.get("role"), msg.get("content")
        if content is None:
            raise bad_request(f"'{param}.content' is required.", f"{param}.content")
        if role == "user":
            out.extend(_user_messages(content, f"{param}.content"))
        elif role == "assistant":
            m = _assistant_message(content, f"{param}.content")
            if i == len(messages) - 1 and not m.tool_calls:
                prefill = m.content.rstrip()  # Anthropic: trailing whitespace is refused
            else:
                out.append(m)
        else:
            raise bad_request(f"'{param}.role' must be user or assistant.", f"{param}.role")
    return out, prefill


def parse_tools(body: dict) -> ToolConfig | None:
    tools_value, choice_value = body.get("tools"), body.get("tool_choice")
    if tools_value is None and choice_value is None:
        return None
    tools = []
    if tools_value is not None:
        if not isinstance(tools_value, list):
            raise bad_request("'tools' must be an array.", "tools")
        for i, t in enumerate(tools_value):
            if not isinstance(t, dict):
                raise bad_request(f"'tools.{i}' must be an object.", f"tools.{i}")
            if t.get("type") not in (None, "custom"):
                raise bad_request(f"'tools.{i}' is a server tool ({t.get('type')!r}); only "
                                  "client tools (name, input_schema) are served.",
                                  f"tools.{i}.type", "unsupported_parameter")
            tools.append(make_tool(t.get("name"), t.get("description"), t.get("input_schema"),
                                   f"tools.{i}"))
        if len({t.name for t in tools}) != len(tools):
            raise bad_request("'tools' names a tool twice.", "tools")
    choice = choice_value or {"type": "auto"}
    if not isinstance(choice, dict):
        raise bad_request("'tool_choice' must be an object.", "tool_choice")
    parallel = not get_bool(choice, "disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise bad_request("'tool_choice.name' is required.", "tool_choice.name")
        return ToolConfig(tuple(tools), "function", check_tool_name(name, tools,
                                                                     "tool_choice.name"), False)
    mapping = {"auto": "auto", "any": "required", "none": "none"}
    if not isinstance(kind, str) or kind not in mapping:  # (a list or object: unhashable)
        raise bad_request("'tool_choice.type' must be auto, any, tool or none.",
                          "tool_choice.type")
    if kind == "any" and not tools:
        raise bad_request("'tool_choice' is 'any' but 'tools' is empty.", "tool_choice")
    return ToolConfig(tuple(tools), mapping[kind] if tools else "none", None, parallel)


def _structured(body: dict, tools: ToolConfig | None) -> Structured | None:
    spec, param = None, None
    fmt = body.get("output_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or \
                not isinstance(fmt.get("schema"), dict):
            raise bad_request("'output_format' must be {\"type\": \"json_schema\", \"schema\": "
                              "{...}}.", "output_format")
        spec, param = GrammarSpec.json_schema(fmt["schema"]), "output_format.schema"
    if tools is not None and tools.forced:
        if spec is not None:
            raise bad_request("'output_format' cannot be combined with a forced tool_choice.",
                              "output_format")
        spec, param = tool_grammar(tools), "tools"
    if spec is None and tools is None:
        return None
    return Structured(spec, param, tools)


def _sampling(body: dict, limits: RequestLimits) -> SamplingParams:
    if body.get("max_tokens") is None:
        raise bad_request("'max_tokens' is required.", "max_tokens", "missing_required_parameter")
    stop = body.get("stop_sequences")
    fields = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k") if k in body}
    if stop is not None:
        fields["stop"] = stop
    if isinstance(body.get("temperature"), (int, float)) and not isinstance(
            body.get("temperature"), bool) and body["temperature"] > 1:
        raise bad_request("'temperature' must be in [0, 1].", "temperature")
    try:
        sampling = parse_sampling(fields, None, max_tokens_default=None, limits=limits)
    except APIError as err:
        if err.param == "stop":
            err.param = "stop_sequences"
            err.args = (err.message.replace("'stop'", "'stop_sequences'"),)
            err.message = err.args[0]
        raise
    # the matched sequence is kept in the text here so the reply can name it (stop_sequence);
    # gateway.anthropic strips it before anything is shown
    return replace(sampling, include_stop_str_in_output=True)


def parse_messages_request(body: dict, limits: RequestLimits = LIMITS) -> MessagesRequest:
    _check_fields(body, MESSAGES_FIELDS)
    if body.get("thinking") not in (None, {"type": "disabled"}):
        raise bad_request("'thinking' is not supported by this model.", "thinking",
                          "unsupported_parameter")
    messages, prefill = parse_conversation(body)
    tools = parse_tools(body)
    structured = _structured(body, tools)
    sampling = _sampling(body, limits)
    if structured is not None and structured.grammar is not None:
        sampling = replace(sampling, grammar=structured.grammar)
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    options = ServingOptions(stream=scalar(body, "stream", False, limits),
                             user=user if isinstance(user, str) else None)
    return MessagesRequest(scalar(body, "model", None, limits), tuple(messages), prefill,
                           sampling, options, structured)


def parse_count_request(body: dict) -> tuple[str | None, list[ChatMessage], str,
                                             ToolConfig | None]:
    _check_fields(body, COUNT_FIELDS)
    messages, prefill = parse_conversation(body)
    return scalar(body, "model", None), messages, prefill, parse_tools(body)


def _check_fields(body: dict, known: frozenset) -> None:
    for name in body:
        if name not in known:
            raise bad_request(f"{name}: Extra inputs are not permitted", name,
                              "unknown_parameter")


def messages_body_schema(count_tokens: bool = False) -> dict:
    """The JSON Schema of a /v1/messages (or count_tokens) body, for GET /openapi.json."""
    text_block = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"const": "text"}, "text": {"type": "string"}, "cache_control": {"type": "object"}}}
    block = {"anyOf": [
        text_block,
        {"type": "object", "required": ["type", "id", "name", "input"], "properties": {
            "type": {"const": "tool_use"}, "id": {"type": "string"}, "name": {"type": "string"},
            "input": {"type": "object"}}},
        {"type": "object", "required": ["type", "tool_use_id"], "properties": {
            "type": {"const": "tool_result"}, "tool_use_id": {"type": "string"},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": text_block}]},
            "is_error": {"type": "boolean"}}}]}
    text = {"anyOf": [{"type": "string"}, {"type": "array", "items": text_block}]}
    props = {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"], "properties": {
                "role": {"enum": ["user", "assistant"]},
                "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": block}]}}}},
        "system": text,
        "tools": {"type": "array", "items": {"type": "object", "required": ["name"],
                                             "properties": {"name": {"type": "string"},
                                                            "description": {"type": "string"},
                                                            "input_schema": {"type": "object"}}}},
        "tool_choice": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
            "disable_parallel_tool_use": {"type": "boolean"}}},
    }
    if not count_tokens:
        props.update({
            "max_tokens": {"type": "integer", "minimum": 1},
            "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "stream": {"type": "boolean"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "top_k": {"type": "integer", "minimum": -1},
            "metadata": {"type": "object", "properties": {"user_id": {"type": "string"}}},
            "output_format": {"type": "object", "required": ["type", "schema"], "properties": {
                "type": {"const": "json_schema"}, "schema": {"type": "object"}}}})
    required = ["model", "messages"] if count_tokens else ["model", "messages", "max_tokens"]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}
