"""Predicted Outputs and per-request speculation: the `prediction` and `speculation` fields of
/v1/completions and /v1/chat/completions (and the ZMQ front door's same fields).

`prediction` is OpenAI's: `{"type": "content", "content": str | [{"type": "text", "text": ...}]}`,
the text the caller expects the output to be (a file before an edit); `content` may also be an
array of token ids (ours, as `prompt` takes ids: a prediction exact to the token, which an
oracle benchmark needs where text would tokenize otherwise than the model generated it). The
gateway tokenizes text and sends the ids as a raw int32 frame (`GenerateRequest.
prediction_frame`); the engine drafts from it and verifies the drafts in one step. The usage's
accepted / rejected prediction tokens are counted by the gateway (`scheduler.prediction_usage.
prediction_overlap`, the engine's count too). As in OpenAI's API, `n` > 1 is refused with a
prediction. Unlike OpenAI's, logprobs, penalties and `max_completion_tokens` are served with it:
the engine keeps them exact across accepted drafts (issue 28).

`speculation` is ours (an extension field, as vLLM adds its own): `"off"` (never draft for this
request), `"auto"` (the server's policy, as when absent), or `{"max_draft_tokens": k}` (at most
k draft tokens a step; 0 is the same as "off").
"""
from __future__ import annotations

from typing import Any

from gateway.body_checks import RequestLimits, check_text, is_token_list, json_type, type_error
from gateway.errors import bad_request
from gateway.openai_schema import SpeculationControl
from gateway.request_fields import INT32_MAX, SPECULATION_MODES


def parse_prediction(body: dict, limits: RequestLimits, n: int = 1
                     ) -> str | tuple[int, ...] | None:
    """The prediction's text (or token ids: `content` as an array of ids, an extension as
    `prompt` has it), or None when the body has none. 400 (OpenAI's shape, naming
    the sub-field) for a wrong type, a type other than "content", bad content parts, a text
    over `limits.max_prediction_chars`, or `n` > 1."""
    value = body.get("prediction")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise type_error("prediction", "an object ({\"type\": \"content\", \"content\": ...})",
                         value)
    kind = value.get("type")
    if kind is None:
        raise bad_request("'prediction.type' is required.", "prediction.type",
                          "missing_required_parameter")
    if kind != "content":
        shown = kind if isinstance(kind, str) else json_type(kind)
        raise bad_request(f"Invalid value for 'prediction.type': {shown!r}. Supported values "
                          "are: 'content'.", "prediction.type", "invalid_value")
    content = value.get("content")
    if content is None:
        raise bad_request("'prediction.content' is required.", "prediction.content",
                          "missing_required_parameter")
    if isinstance(content, str):
        text = content
    elif is_token_list(content) and content:  # our extension (as `prompt` takes ids): token ids
        if len(content) > limits.max_prediction_chars:
            raise bad_request(f"'prediction.content' has {len(content)} token ids; at most "
                              f"{limits.max_prediction_chars} are allowed.", "prediction.content",
                              "prediction_too_long")
        if any(not 0 <= t <= INT32_MAX for t in content):
            raise bad_request(f"Token ids in 'prediction.content' must be in [0, {INT32_MAX}].",
                              "prediction.content")
        if n > 1:
            raise _n_error()
        return tuple(content)
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad_request(f"'prediction.content[{j}]' must be a text part "
                                  "({\"type\": \"text\", \"text\": ...}).",
                                  f"prediction.content[{j}]")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise type_error("prediction.content", "a string or an array of text parts", content)
    if len(text) > limits.max_prediction_chars:
        raise bad_request(f"'prediction.content' has {len(text)} characters; at most "
                          f"{limits.max_prediction_chars} are allowed.", "prediction.content",
                          "prediction_too_long")
    check_text(text, "prediction.content")
    if n > 1:  # as OpenAI: "n: values higher than 1 are not supported" with Predicted Outputs
        raise _n_error()
    return text


def _n_error():
    return bad_request("'n' > 1 is not supported with 'prediction' (as in OpenAI's Predicted "
                       "Outputs); send one request per choice.", "n", "unsupported_value")


def check_prediction_tokens(num_tokens: int, max_model_len: int) -> None:
    """400 when the tokenized prediction is longer than any output this model can give."""
    if max_model_len and num_tokens > max_model_len:
        raise bad_request(f"'prediction.content' has {num_tokens} tokens; this model's context "
                          f"holds {max_model_len} tokens.", "prediction.content",
                          "prediction_too_long")


def parse_speculation(body: dict, limits: RequestLimits) -> SpeculationControl | None:
    """The `speculation` field; None when absent, null or "auto" (the server's default)."""
    value = body.get("speculation")
    if value is None:
        return None
    if isinstance(value, str):
        if value not in SPECULATION_MODES:
            raise bad_request(f"Invalid value for 'speculation': {value!r}. Supported values are "
                              "'off', 'auto' or an object {\"max_draft_tokens\": k}.",
                              "speculation")
        return SpeculationControl(off=True) if value == "off" else None
    if not isinstance(value, dict):
        raise type_error("speculation", "'off', 'auto' or an object {\"max_draft_tokens\": k}",
                         value)
    unknown = sorted(set(value) - {"max_draft_tokens"})
    if unknown:
        raise bad_request(f"Unknown field 'speculation.{unknown[0]}'; 'speculation' takes "
                          "'max_draft_tokens'.", f"speculation.{unknown[0]}", "unknown_parameter")
    k: Any = value.get("max_draft_tokens")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int):
        raise type_error("speculation.max_draft_tokens", "an integer", k)
    if not 0 <= k <= limits.max_draft_tokens:
        raise bad_request(f"'speculation.max_draft_tokens' must be in [0, "
                          f"{limits.max_draft_tokens}], got {k}.", "speculation.max_draft_tokens")
    return SpeculationControl(off=True) if k == 0 else SpeculationControl(max_draft_tokens=k)
