"""Parse and validate OpenAI request bodies into the frozen records of `openai_schema`.

Every failure is an `APIError(400)` naming the offending parameter; nothing here raises
anything else for bad input, whatever the bytes are. Which endpoint takes which field, and each
scalar's type, bounds and meaning, come from `gateway.request_fields` (the table GET
/openapi.json is generated from too).
"""
from __future__ import annotations

import json
import logging
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
    TokenizeRequest,
)
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

log = logging.getLogger("tidegate.gateway.validation")

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request size limits (each a 400 when exceeded). Stop strings are matched against the
    held-back text after every token, so their number and length bound that cost; prompts per
    request bound the work one body can start (and the event-loop time it takes)."""

    max_stop_strings: int = MAX_STOP_STRINGS
    max_stop_len: int = MAX_STOP_STRING_CHARS  # characters per stop string
    max_prompts: int = 256  # prompts in one /v1/completions request
    max_n: int = 16  # choices per prompt
    max_logit_bias: int = 1024  # logit_bias entries
    max_stop_token_ids: int = 256
    strict_api: bool = False  # unknown request fields: 400 instead of a warning (--strict-api)


LIMITS = RequestLimits()
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


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


def _scalar(body: dict, name: str, default: Any, limits: RequestLimits = LIMITS,
            spec: Scalar | None = None) -> Any:
    """Field `name` of `body` checked against its row of `request_fields.SCALARS` (type, then
    bounds); `default` when absent or null."""
    if body.get(name) is None:  # absent or null: the default, for every kind (the common case)
        return default
    spec = spec or SCALARS[name]
    if spec.kind == "boolean":
        return _get_bool(body, name, default)
    if spec.kind == "string":
        value = _get_str(body, name)
        return default if value is None else value
    if spec.kind == "integer":
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(name, "an integer", value)
    else:
        value = _get_float(body, name, None)
        if value is None:
            return default
    lo, hi = spec.bounds(limits)
    low_ok = lo is None or (value > lo if spec.exclusive_minimum else value >= lo)
    if not (low_ok and (hi is None or value <= hi)):
        raise bad_request(f"'{name}' must be {_range_text(spec, lo, hi)}, got {_short(value)}.",
                          name)
    return value


def _range_text(spec: Scalar, lo: float | None, hi: float | None) -> str:
    if hi is None:
        return f"{'>' if spec.exclusive_minimum else '>='} {_num(lo)}"
    return f"in {'(' if spec.exclusive_minimum else '['}{_num(lo)}, {_num(hi)}]"


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _short(value: float) -> str:
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
    max_tokens = _scalar(body, max_tokens_name, max_tokens_default, limits)
    processors = _parse_processors(body, max_tokens, limits)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_scalar(body, "temperature", 1.0, limits),
        top_p=_scalar(body, "top_p", 1.0, limits),
        top_k=_scalar(body, "top_k", -1, limits),
        seed=_scalar(body, "seed", None, limits),
        stop=_parse_stop(body, limits),
        ignore_eos=_scalar(body, "ignore_eos", False, limits),
        logprobs=logprobs,
        **processors,
    )


def parse_sampling_fields(body: dict, logprobs: int | None,
                          limits: RequestLimits = LIMITS) -> SamplingParams:
    """Sampling fields given as a request body would give them (the ZMQ front door's path)."""
    return _parse_sampling(body, logprobs, max_tokens_default=16, limits=limits)


def _parse_options(body: dict, limits: RequestLimits) -> ServingOptions:
    stream = _scalar(body, "stream", False, limits)
    include_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict):
            raise _type_error("stream_options", "an object", stream_options)
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                              "stream_options")
        include_usage = _get_bool(stream_options, "include_usage", False)
    return ServingOptions(
        stream=stream,
        include_usage=include_usage,
        user=_scalar(body, "user", None, limits),
        priority=_scalar(body, "priority", 0, limits),
        deadline_ms=_scalar(body, "deadline_ms", None, limits),
        return_token_ids=_scalar(body, "return_token_ids", False, limits),
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
    check_fields(body, COMPLETION_FIELDS, limits, "/v1/completions")
    logprobs = _scalar(body, "logprobs", None, limits, COMPLETION_LOGPROBS)
    return CompletionRequest(
        model=_scalar(body, "model", None, limits),
        prompts=_parse_prompts(body, limits),
        sampling=_parse_sampling(body, logprobs, max_tokens_default=16, limits=limits),
        options=_parse_options(body, limits),
        echo=_scalar(body, "echo", False, limits),
        suffix=_scalar(body, "suffix", None, limits) or None,
        add_special_tokens=_scalar(body, "add_special_tokens", True, limits),
        request_id=_scalar(body, "request_id", None, limits),
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
    check_fields(body, CHAT_FIELDS, limits, "/v1/chat/completions")
    want_logprobs = _scalar(body, "logprobs", False, limits, CHAT_LOGPROBS)
    top_logprobs = _scalar(body, "top_logprobs", None, limits)
    if top_logprobs is not None and not want_logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    _scalar(body, "parallel_tool_calls", None, limits)  # checked, then ignored: no tools
    logprobs = (top_logprobs or 0) if want_logprobs else None
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else \
        "max_tokens"
    return ChatRequest(
        model=_scalar(body, "model", None, limits),
        messages=_parse_messages(body),
        sampling=_parse_sampling(body, logprobs, max_tokens_default=None, max_tokens_name=name,
                                 limits=limits),
        options=_parse_options(body, limits),
        add_generation_prompt=_scalar(body, "add_generation_prompt", True, limits),
        top_logprobs_requested=want_logprobs,
        echo=_scalar(body, "echo", False, limits),
        add_special_tokens=_scalar(body, "add_special_tokens", False, limits),
        request_id=_scalar(body, "request_id", None, limits),
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


# --- sampling processors, n, and the fields of vLLM's requests we do not implement ------------
def _parse_processors(body: dict, max_tokens: int | None, limits: RequestLimits) -> dict[str, Any]:
    """The logit processors and output options beyond OpenAI's basics (as vLLM names them)."""
    out: dict[str, Any] = {}
    for name, default in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0), ("min_p", 0.0)):
        out[name] = _scalar(body, name, default, limits)
    min_tokens = _scalar(body, "min_tokens", 0, limits)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"'min_tokens' must be in [0, max_tokens], got {min_tokens}.",
                          "min_tokens")
    out["min_tokens"] = min_tokens
    out["logit_bias"] = _parse_logit_bias(body, limits)
    out["stop_token_ids"] = _parse_token_ids(body, "stop_token_ids", limits.max_stop_token_ids)
    out["skip_special_tokens"] = _scalar(body, "skip_special_tokens", True, limits)
    out["include_stop_str_in_output"] = _scalar(body, "include_stop_str_in_output", False, limits)
    n = _scalar(body, "n", 1, limits)
    best_of = _scalar(body, "best_of", None, limits)
    # vLLM V1 dropped best_of: only the value that changes nothing (== n) is taken
    if best_of is not None and best_of != n:
        raise bad_request(f"'best_of' is not supported (as in vLLM V1); got {best_of}, only "
                          f"best_of = n ({n}) is accepted.", "best_of", "unsupported_value")
    out["n"] = n
    return out


def _parse_logit_bias(body: dict, limits: RequestLimits) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _type_error("logit_bias", "an object mapping token ids to biases", value)
    if len(value) > limits.max_logit_bias:
        raise bad_request(f"'logit_bias' has {len(value)} entries; at most "
                          f"{limits.max_logit_bias} are allowed.", "logit_bias")
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)  # JSON keys are strings: "50256"
        except ValueError:
            raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}.",
                              "logit_bias") from None
        if not 0 <= token <= INT32_MAX:
            raise bad_request(f"'logit_bias' token ids must be in [0, {INT32_MAX}], got "
                              f"{_short(token)}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise bad_request(f"'logit_bias' values must be finite numbers, got {bias!r}.",
                              "logit_bias")
        if not -100.0 <= bias <= 100.0:
            raise bad_request(f"'logit_bias' values must be in [-100, 100], got {bias}.",
                              "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _parse_token_ids(body: dict, name: str, max_len: int) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not _is_token_list(value):
        raise _type_error(name, "an array of token ids", value)
    if len(value) > max_len:
        raise bad_request(f"'{name}' has {len(value)} ids; at most {max_len} are allowed.", name)
    if any(not 0 <= t <= INT32_MAX for t in value):
        raise bad_request(f"'{name}' ids must be in [0, {INT32_MAX}].", name)
    return tuple(dict.fromkeys(value))


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
    if "response_format" in body:
        fmt = body["response_format"]
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
            raise bad_request("'response_format' other than {\"type\": \"text\"} is not "
                              "supported (no structured output).", "response_format",
                              "unsupported_parameter")
    tools = body.get("tools")
    if tools:
        raise bad_request("'tools' are not supported (no tool calling).", "tools",
                          "unsupported_parameter")
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise bad_request("'tool_choice' is not supported (no tool calling).", "tool_choice",
                          "unsupported_parameter")
    if _scalar(body, "spaces_between_special_tokens", True, limits) is False:
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
        prompt = _get_str(body, "prompt")
        if prompt is None:
            raise bad_request("'prompt' (or 'messages') is required.", "prompt",
                              "missing_required_parameter")
        messages = None
        _check_text(prompt, "prompt")
    return TokenizeRequest(
        model=_scalar(body, "model", None, limits), prompt=prompt, messages=messages,
        add_special_tokens=_scalar(body, "add_special_tokens", not chat, limits),
        add_generation_prompt=_scalar(body, "add_generation_prompt", True, limits),
        return_token_strs=_scalar(body, "return_token_strs", False, limits))


def parse_detokenize_request(body: dict[str, Any], limits: RequestLimits = LIMITS
                             ) -> tuple[str | None, tuple[int, ...]]:
    """(model, token ids)."""
    _check_unknown(body, DETOKENIZE_FIELDS, limits, "/detokenize")
    tokens = body.get("tokens")
    if tokens is None:
        raise bad_request("'tokens' is required.", "tokens", "missing_required_parameter")
    if not _is_token_list(tokens) or any(not 0 <= t <= INT32_MAX for t in tokens):
        raise _type_error("tokens", "an array of token ids", tokens)
    return _scalar(body, "model", None, limits), tuple(tokens)
