"""Parse and validate OpenAI request bodies into the frozen records of `openai_schema`.

Every failure is an `APIError(400)` naming the offending parameter; nothing here raises
anything else for bad input, whatever the bytes are. Which endpoint takes which field, and each
scalar's type, bounds and meaning, come from `gateway.request_fields` (the table GET
/openapi.json is generated from too).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from gateway.body_checks import (  # noqa: F401 -- re-exported: the names other modules use
    LIMITS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    RequestLimits,
    check_text,
    get_bool,
    get_str,
    is_token_list,
    json_type,
    parse_json_body,
    scalar,
    type_error,
)
from gateway.errors import bad_request
from gateway.openai_schema import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    Prompt,
    ServingOptions,
    TokenizeRequest,
)
from gateway.prediction_fields import parse_prediction, parse_speculation
from gateway.request_fields import (  # noqa: F401 -- re-exported: the names other modules use
    CHAT_FIELDS,
    CHAT_LOGPROBS,
    COMMON_FIELDS,
    COMPLETION_FIELDS,
    COMPLETION_LOGPROBS,
    DETOKENIZE_FIELDS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAX_LOGPROBS,
    SCALARS,
    TOKENIZE_FIELDS,
    UNSUPPORTED_FIELDS,
    Scalar,
)
from gateway.sampling_fields import parse_sampling
from gateway.sessions import check_prompt_cache_key
from gateway.structured import parse_request_structured
from gateway.tools import parse_message_tool_calls

log = logging.getLogger("tidegate.gateway.validation")

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
              "tool": "tool"}


def _parse_options(body: dict, limits: RequestLimits) -> ServingOptions:
    stream = scalar(body, "stream", False, limits)
    include_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise type_error("stream_options", "an object", stream_options)
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                              "stream_options")
        include_usage = get_bool(stream_options, "include_usage", False)
    return ServingOptions(
        stream=stream,
        include_usage=include_usage,
        user=scalar(body, "user", None, limits),
        priority=scalar(body, "priority", 0, limits),
        deadline_ms=scalar(body, "deadline_ms", None, limits),
        return_token_ids=scalar(body, "return_token_ids", False, limits),
        speculation=parse_speculation(body, limits),
        slo_ttft_ms=scalar(body, "slo_ttft_ms", None, limits),
        slo_tpot_ms=scalar(body, "slo_tpot_ms", None, limits),
    )


def _parse_prompts(body: dict, limits: RequestLimits) -> tuple[Prompt, ...]:
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required.", "prompt", "missing_required_parameter")
    value = body["prompt"]
    if isinstance(value, str):
        prompts: list[Prompt] = [value]
    elif isinstance(value, list) and value and is_token_list(value):
        prompts = [tuple(value)]
    elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        prompts = list(value)
    elif isinstance(value, list) and value and all(is_token_list(p) for p in value):
        prompts = [tuple(p) for p in value]
    elif isinstance(value, list) and not value:
        raise bad_request("'prompt' must not be empty.", "prompt")
    else:
        raise type_error("prompt", "a string, an array of strings, an array of token ids or an "
                          "array of token-id arrays", value)
    if len(prompts) > limits.max_prompts:
        raise bad_request(f"'prompt' has {len(prompts)} prompts; at most {limits.max_prompts} "
                          "are allowed in one request.", "prompt")
    for p in prompts:
        if len(p) == 0:
            raise bad_request("'prompt' must not be empty.", "prompt")
        if isinstance(p, str):
            check_text(p, "prompt")
        elif any(not 0 <= t <= INT32_MAX for t in p):
            raise bad_request(f"Token ids in 'prompt' must be in [0, {INT32_MAX}].", "prompt")
    return tuple(prompts)


def parse_completion_request(body: dict[str, Any],
                             limits: RequestLimits = LIMITS) -> CompletionRequest:
    check_fields(body, COMPLETION_FIELDS, limits, "/v1/completions")
    check_prompt_cache_key(body)
    logprobs = scalar(body, "logprobs", None, limits, COMPLETION_LOGPROBS)
    sampling = parse_sampling(body, logprobs, max_tokens_default=16, limits=limits)
    structured = parse_request_structured(body, chat=False)
    if structured is not None:
        sampling = replace(sampling, grammar=structured.grammar)
    return CompletionRequest(
        model=scalar(body, "model", None, limits),
        prompts=_parse_prompts(body, limits),
        sampling=sampling,
        options=_parse_options(body, limits),
        echo=scalar(body, "echo", False, limits),
        suffix=scalar(body, "suffix", None, limits) or None,
        add_special_tokens=scalar(body, "add_special_tokens", True, limits),
        structured=structured,
        request_id=scalar(body, "request_id", None, limits),
        prediction=parse_prediction(body, limits, sampling.n),
    )


def _message_content(msg: dict, i: int) -> str:
    param = f"messages[{i}].content"
    content = msg.get("content")
    if content is None:
        if msg.get("role") == "assistant":
            return ""
        raise bad_request(f"'{param}' is required.", param, "missing_required_parameter")
    if isinstance(content, str):
        return check_text(content, param)  # a lone surrogate is a 400, not the tokenizer's 500
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise bad_request(f"'{param}[{j}]' must be a text part "
                                  "({\"type\": \"text\", \"text\": ...}).", f"{param}[{j}]")
            parts.append(check_text(part["text"], f"{param}[{j}].text"))
        return "".join(parts)
    raise type_error(param, "a string or an array of text parts", content)


def _parse_messages(body: dict) -> tuple[ChatMessage, ...]:
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise type_error("messages", "an array", messages)
    if not messages:
        raise bad_request("'messages' must not be empty.", "messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise type_error(f"messages[{i}]", "an object", msg)
        role = msg.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:  # a list or object: unhashable
            got = repr(role)[:40] if isinstance(role, str) else json_type(role)
            raise bad_request(f"'messages[{i}].role' must be one of system, user, assistant, "
                              f"tool; got {got}.", f"messages[{i}].role")
        calls = parse_message_tool_calls(msg, i) if role == "assistant" else ()
        call_id = msg.get("tool_call_id") if role == "tool" else None
        if call_id is not None and not isinstance(call_id, str):
            raise type_error(f"messages[{i}].tool_call_id", "a string", call_id)
        out.append(ChatMessage(CHAT_ROLES[role], _message_content(msg, i), calls, call_id))
    return tuple(out)


def parse_chat_request(body: dict[str, Any], limits: RequestLimits = LIMITS) -> ChatRequest:
    check_fields(body, CHAT_FIELDS, limits, "/v1/chat/completions")
    check_prompt_cache_key(body)
    want_logprobs = scalar(body, "logprobs", False, limits, CHAT_LOGPROBS)
    top_logprobs = scalar(body, "top_logprobs", None, limits)
    if top_logprobs is not None and not want_logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    structured = parse_request_structured(body, chat=True)
    logprobs = (top_logprobs or 0) if want_logprobs else None
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    sampling = parse_sampling(body, logprobs, max_tokens_default=None, max_tokens_name=name,
                              limits=limits)
    if structured is not None and structured.grammar is not None:
        sampling = replace(sampling, grammar=structured.grammar)
    return ChatRequest(
        model=scalar(body, "model", None, limits),
        messages=_parse_messages(body),
        sampling=sampling,
        options=_parse_options(body, limits),
        add_generation_prompt=scalar(body, "add_generation_prompt", True, limits),
        top_logprobs_requested=want_logprobs,
        echo=scalar(body, "echo", False, limits),
        add_special_tokens=scalar(body, "add_special_tokens", False, limits),
        structured=structured,
        request_id=scalar(body, "request_id", None, limits),
        prediction=parse_prediction(body, limits, sampling.n),
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


def _is_neutral(value: Any, neutral: Any) -> bool:
    if value is None:
        return True
    if callable(neutral):
        return neutral(value)
    return value == neutral


_warned_unknown: set[str] = set()


def check_fields(body: dict, known: frozenset, limits: RequestLimits, endpoint: str) -> None:
    """400 for a known field we do not implement set to a non-neutral value; unknown fields are
    logged once per name (400 under `strict_api`); 400 for the values of the fields we accept
    only in part (no tools, no structured output)."""
    _check_unknown(body, known, limits, endpoint)
    if scalar(body, "spaces_between_special_tokens", True, limits) is False:
        raise bad_request("'spaces_between_special_tokens' = false is not supported.",
                          "spaces_between_special_tokens", "unsupported_value")


def _check_unknown(body: dict, known: frozenset, limits: RequestLimits, endpoint: str) -> None:
    for name, value in body.items():
        if name in UNSUPPORTED_FIELDS:
            if not _is_neutral(value, UNSUPPORTED_FIELDS[name]):
                raise bad_request(f"'{name}' is not supported by this server.", name,
                                  "unsupported_parameter")
        elif name not in known:
            if limits.strict_api:
                raise bad_request(f"Unknown parameter '{name}' for {endpoint} (--strict-api).",
                                  name, "unknown_parameter")
            if name not in _warned_unknown and len(_warned_unknown) < 1024:
                _warned_unknown.add(name)
                log.warning("%s: ignoring unknown request field %r (logged once per name)",
                            endpoint, name)


# --- /tokenize, /detokenize (vLLM's request shapes) ------------------------------------------
def parse_tokenize_request(body: dict[str, Any], limits: RequestLimits = LIMITS
                           ) -> TokenizeRequest:
    _check_unknown(body, TOKENIZE_FIELDS, limits, "/tokenize")
    chat = "messages" in body
    if chat:
        messages, prompt = _parse_messages(body), None
    else:
        prompt = get_str(body, "prompt")
        if prompt is None:
            raise bad_request("'prompt' (or 'messages') is required.", "prompt",
                              "missing_required_parameter")
        messages = None
        check_text(prompt, "prompt")
    return TokenizeRequest(
        model=scalar(body, "model", None, limits), prompt=prompt, messages=messages,
        add_special_tokens=scalar(body, "add_special_tokens", not chat, limits),
        add_generation_prompt=scalar(body, "add_generation_prompt", True, limits),
        return_token_strs=scalar(body, "return_token_strs", False, limits))


def parse_detokenize_request(body: dict[str, Any], limits: RequestLimits = LIMITS
                             ) -> tuple[str | None, tuple[int, ...]]:
    """(model, token ids)."""
    _check_unknown(body, DETOKENIZE_FIELDS, limits, "/detokenize")
    tokens = body.get("tokens")
    if tokens is None:
        raise bad_request("'tokens' is required.", "tokens", "missing_required_parameter")
    if not is_token_list(tokens) or any(not 0 <= t <= INT32_MAX for t in tokens):
        raise type_error("tokens", "an array of token ids", tokens)
    return scalar(body, "model", None, limits), tuple(tokens)
