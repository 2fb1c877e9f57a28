"""Parse and validate OpenAI request bodies into the frozen records of `openai_schema`.

Every failure is an `APIError(400)` naming the offending parameter; nothing here raises
anything else for bad input, whatever the bytes are.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.errors import APIError, bad_request
from gateway.openai_schema import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    Prompt,
    SamplingParams,
    ServingOptions,
)

MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 20
# Wire-type bounds (proto/tidegate.proto): a value that does not fit its field must be a 400
# here, never an exception while the Batch is built.
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request size limits (each a 400 when exceeded). Stop strings are matched against the
    held-back text after every token, so their number and length bound that cost; prompts per
    request bound the work one body can start (and the event-loop time it takes)."""

    max_stop_strings: int = MAX_STOP_STRINGS
    max_stop_len: int = 256  # characters per stop string
    max_prompts: int = 256  # prompts in one /v1/completions request


LIMITS = RequestLimits()
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Parameters we accept only at their neutral value (the sampler does not implement them).
NEUTRAL_ONLY = {"frequency_penalty": 0, "presence_penalty": 0, "best_of": 1}


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Request body is not valid UTF-8: {exc.reason} at byte {exc.start}.",
                          "body", "invalid_encoding") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"Request body is not valid JSON: {exc.msg} (line {exc.lineno}, "
                          f"column {exc.colno}).", "body", "invalid_json") from None
    except RecursionError:
        raise bad_request("Request body is nested too deeply.", "body", "invalid_json") from None
    except ValueError as exc:  # e.g. an integer literal over sys.get_int_max_str_digits()
        raise bad_request(f"Request body is not valid JSON: {exc}.", "body",
                          "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"Request body must be a JSON object, not {_json_type(body)}.", "body",
                          "invalid_type")
    return body


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _type_error(param: str, expected: str, value: Any) -> APIError:
    return bad_request(f"'{param}' must be {expected}, not {_json_type(value)}.", param,
                       "invalid_type")


def _get_int(body: dict, name: str, default: int | None, lo: int = INT32_MIN,
             hi: int = INT32_MAX) -> int | None:
    """An integer in [lo, hi] (by default the int32 range, the widest most wire fields hold)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if not lo <= value <= hi:
        raise bad_request(f"'{name}' must be in [{lo}, {hi}], got {_short(value)}.", name)
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def _get_float(body: dict, name: str, default: float | None) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(name, "a number", value)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the float range (~1.8e308)
        raise bad_request(f"'{name}' is out of range.", name) from None
    if math.isnan(value) or math.isinf(value):
        raise bad_request(f"'{name}' must be a finite number, not {value}.", name)
    return value


def _get_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _get_str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return _check_text(value, name)


def _check_text(value: str, param: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no UTF-8 tokenizer or writer accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"'{param}' is not valid Unicode (a lone surrogate at character "
                          f"{exc.start}).", param, "invalid_encoding") from None
    return value


def _parse_stop(body: dict, limits: RequestLimits) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _type_error("stop", "a string or an array of strings", value)
    if len(value) > limits.max_stop_strings:
        raise bad_request(f"'stop' has {len(value)} strings; at most {limits.max_stop_strings} "
                          "are allowed.", "stop")
    if any(s == "" for s in value):
        raise bad_request("'stop' strings must not be empty.", "stop")
    if any(len(s) > limits.max_stop_len for s in value):
        raise bad_request(f"'stop' strings must be at most {limits.max_stop_len} characters.",
                          "stop")
    for s in value:
        _check_text(s, "stop")
    return tuple(dict.fromkeys(value))


def _parse_sampling(body: dict, logprobs: int | None, max_tokens_default: int | None,
                    max_tokens_name: str = "max_tokens",
                    limits: RequestLimits = LIMITS) -> SamplingParams:
    max_tokens = _get_int(body, max_tokens_name, max_tokens_default, hi=(1 << 32) - 1)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"'{max_tokens_name}' must be at least 1, got {max_tokens}.",
                          max_tokens_name)
    temperature = _get_float(body, "temperature", 1.0)
    if not 0.0 <= temperature <= 2.0:
        raise bad_request(f"'temperature' must be in [0, 2], got {temperature}.", "temperature")
    top_p = _get_float(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}.", "top_p")
    top_k = _get_int(body, "top_k", -1)
    if top_k < -1:
        raise bad_request(f"'top_k' must be -1 (disabled) or at least 0, got {top_k}.", "top_k")
    n = _get_int(body, "n", 1)
    if n != 1:
        raise bad_request(f"Only 'n' = 1 is supported, got {n}.", "n", "unsupported_value")
    for name, neutral in NEUTRAL_ONLY.items():
        value = _get_float(body, name, neutral)
        if value != neutral:
            raise bad_request(f"'{name}' is not supported (only {neutral}).", name,
                              "unsupported_value")
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported.", "logit_bias", "unsupported_value")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=_get_int(body, "seed", None, INT64_MIN, INT64_MAX),
        stop=_parse_stop(body, limits),
        ignore_eos=_get_bool(body, "ignore_eos", False),
        logprobs=logprobs,
    )


def _parse_options(body: dict) -> ServingOptions:
    stream = _get_bool(body, "stream", False)
    include_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise _type_error("stream_options", "an object", stream_options)
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                              "stream_options")
        include_usage = _get_bool(stream_options, "include_usage", False)
    deadline_ms = _get_float(body, "deadline_ms", None)
    if deadline_ms is not None and deadline_ms <= 0:
        raise bad_request(f"'deadline_ms' must be positive, got {deadline_ms}.", "deadline_ms")
    return ServingOptions(
        stream=stream,
        include_usage=include_usage,
        user=_get_str(body, "user"),
        priority=_get_int(body, "priority", 0),
        deadline_ms=deadline_ms,
        return_token_ids=_get_bool(body, "return_token_ids", False),
    )


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _parse_prompts(body: dict, limits: RequestLimits) -> tuple[Prompt, ...]:
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required.", "prompt", "missing_required_parameter")
    value = body["prompt"]
    if isinstance(value, str):
        prompts: list[Prompt] = [value]
    elif isinstance(value, list) and value and _is_token_list(value):
        prompts = [tuple(value)]
    elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(_is_token_list(p) for p in value):
        prompts = [tuple(p) for p in value]
    elif isinstance(value, list) and not value:
        raise bad_request("'prompt' must not be empty.", "prompt")
    else:
        raise _type_error("prompt", "a string, an array of strings, an array of token ids or an "
                          "array of token-id arrays", value)
    if len(prompts) > limits.max_prompts:
        raise bad_request(f"'prompt' has {len(prompts)} prompts; at most {limits.max_prompts} "
                          "are allowed in one request.", "prompt")
    for p in prompts:
        if len(p) == 0:
            raise bad_request("'prompt' must not be empty.", "prompt")
        if isinstance(p, str):
            _check_text(p, "prompt")
        elif any(not 0 <= t <= INT32_MAX for t in p):
            raise bad_request(f"Token ids in 'prompt' must be in [0, {INT32_MAX}].", "prompt")
    return tuple(prompts)


def parse_completion_request(body: dict[str, Any],
                             limits: RequestLimits = LIMITS) -> CompletionRequest:
    logprobs = _get_int(body, "logprobs", None)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be in [0, {MAX_LOGPROBS}], got {logprobs}.",
                          "logprobs")
    return CompletionRequest(
        model=_get_str(body, "model"),
        prompts=_parse_prompts(body, limits),
        sampling=_parse_sampling(body, logprobs, max_tokens_default=16, limits=limits),
        options=_parse_options(body),
        echo=_get_bool(body, "echo", False),
    )


def _message_content(msg: dict, i: int) -> str:
    param = f"messages[{i}].content"
    content = msg.get("content")
    if content is None:
        if msg.get("role") == "assistant":
            return ""
        raise bad_request(f"'{param}' is required.", param, "missing_required_parameter")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise bad_request(f"'{param}[{j}]' must be a text part "
                                  "({\"type\": \"text\", \"text\": ...}).", f"{param}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise _type_error(param, "a string or an array of text parts", content)


def _parse_messages(body: dict) -> tuple[ChatMessage, ...]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise _type_error("messages", "an array", messages)
    if not messages:
        raise bad_request("'messages' must not be empty.", "messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _type_error(f"messages[{i}]", "an object", msg)
        role = msg.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"'messages[{i}].role' must be one of system, user, assistant; got "
                              f"{role!r}.", f"messages[{i}].role")
        out.append(ChatMessage(CHAT_ROLES[role], _message_content(msg, i)))
    return tuple(out)


def parse_chat_request(body: dict[str, Any], limits: RequestLimits = LIMITS) -> ChatRequest:
    want_logprobs = _get_bool(body, "logprobs", False)
    top_logprobs = _get_int(body, "top_logprobs", None)
    if top_logprobs is not None:
        if not want_logprobs:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
        if not 0 <= top_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}], got "
                              f"{top_logprobs}.", "top_logprobs")
    logprobs = (top_logprobs or 0) if want_logprobs else None
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    return ChatRequest(
        model=_get_str(body, "model"),
        messages=_parse_messages(body),
        sampling=_parse_sampling(body, logprobs, max_tokens_default=None, max_tokens_name=name,
                                 limits=limits),
        options=_parse_options(body),
        add_generation_prompt=_get_bool(body, "add_generation_prompt", True),
        top_logprobs_requested=want_logprobs,
    )


def check_context_length(prompt_len: int, max_tokens: int | None, max_model_len: int,
                         param: str = "max_tokens") -> None:
    """400 when the prompt plus the requested completion does not fit the model's context."""
    if prompt_len >= max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens; the "
                          f"prompt has {prompt_len} tokens.", "prompt", "context_length_exceeded")
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens; you "
                          f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                          f"{max_tokens} for the completion).", param, "context_length_exceeded")
